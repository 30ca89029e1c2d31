/*
 * timeout.h - the ranges of a request's own timeout, which the routes apply once they decode a
 * body and api_timeout_peek (api.h) reads before: "timeout_ms" on every route, and Triton's
 * "timeout" in microseconds on KServe v2 (where 0 means none).
 */
#ifndef ATTND_API_WIRE_TIMEOUT_H
#define ATTND_API_WIRE_TIMEOUT_H

#include <stdint.h>

#define API_TIMEOUT_MS_MAX ((int64_t)1 << 40)
#define API_TIMEOUT_US_MAX ((int64_t)1 << 50)

/* The timeout a v2 inference asks for: the tighter of "timeout_ms" and Triton's "timeout"
 * (microseconds, rounded up to whole milliseconds), where 0 means not given; 0 when neither is. */
int64_t api__v2_timeout_ms(int64_t timeout_ms, int64_t timeout_us);

#endif
