/*
 * buf.h - what api/ adds to the daemon's text buffer (api_buf, in api.h): the float writer that
 * gives 9 significant digits (exact float32 round trip) without a json_t per number, and a
 * reply writer's failure as an error.
 */
#ifndef ATTND_API_WIRE_BUF_H
#define ATTND_API_WIRE_BUF_H

#include <stddef.h>
#include <stdint.h>

#include "api/core/error.h"

/* Most characters api__float_format writes: "-1.23456789e-38" is 15. */
#define API_FLOAT_MAX_CHARS 16

/* Writes finite `f` as printf("%.9g") would, without its cost: 9 significant digits, which
 * read back (strtof) as exactly `f`. No NUL; returns the length. `f` must be finite. */
size_t api__float_format(float f, char *out);

/* The failure of a reply writer as an error: 503 out of memory, or 500 when the estimate of the
 * reply's size (its maximum) was wrong. */
int api__buf_error(const api_buf *w, api__error *err);

#endif
