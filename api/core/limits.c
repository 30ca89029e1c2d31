/*
 * limits.c - the default per-request limits (api_limits, api.h), which the daemon's flags
 * override.
 */
#include "api/api.h"

api_limits api_limits_default(void)
{
    api_limits limits = {
        .max_body_bytes = (size_t)256 << 20,
        /* 2^28 elements: 1 GiB as float32, and more numbers than fit in a 256 MiB JSON body
         * (at least two bytes each), so the element cap never rejects a body the byte cap
         * let in but still stops a small base64 request from asking for a huge reply. */
        .max_elements = (size_t)1 << 28,
        .max_timeout_ms = 60000,
        /* Triton's priority_levels and default_priority_level: one lane above the default for
         * the requests that say "priority": 1. */
        .priority_levels = 2,
        .default_priority_level = 2,
    };
    return limits;
}
