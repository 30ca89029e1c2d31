/*
 * jsonw.h - the JSON writer of every reply: a growable output buffer with a hard maximum, and
 * a float writer that gives 9 significant digits (exact float32 round trip) without a json_t
 * per number. Not thread-safe per writer; any thread may own one.
 */
#ifndef ATTND_API_WIRE_JSONW_H
#define ATTND_API_WIRE_JSONW_H

#include <stddef.h>
#include <stdint.h>

#include "api/core/error.h"

/* Most characters api__float_format writes: "-1.23456789e-38" is 15. */
#define API_FLOAT_MAX_CHARS 16

/* Writes finite `f` as printf("%.9g") would, without its cost: 9 significant digits, which
 * read back (strtof) as exactly `f`. No NUL; returns the length. `f` must be finite. */
size_t api__float_format(float f, char *out);

typedef enum {
    API_JSONW_OK = 0,
    API_JSONW_FULL,  /* a write would have passed the maximum size */
    API_JSONW_NOMEM, /* the allocator failed */
} api__jsonw_state;

/* A growable byte buffer for building a reply. Errors are sticky: once a write fails, later
 * writes do nothing and `state` says why, so a writer checks once at the end. */
typedef struct {
    char *data;
    size_t len, cap, max;
    api__jsonw_state state;
} api__jsonw;

/* An empty buffer that never grows beyond `max` bytes. Allocates nothing yet. */
void api__jsonw_init(api__jsonw *w, size_t max);
void api__jsonw_free(api__jsonw *w);

/* Makes room for n more bytes and returns where they go (then advance w->len yourself), or
 * NULL (state set) when that is impossible. */
char *api__jsonw_reserve(api__jsonw *w, size_t n);

void api__jsonw_mem(api__jsonw *w, const void *src, size_t n);
void api__jsonw_cstr(api__jsonw *w, const char *s); /* raw, not quoted */
void api__jsonw_char(api__jsonw *w, char c);
void api__jsonw_string(api__jsonw *w, const char *s, size_t n); /* quoted and escaped */
void api__jsonw_int(api__jsonw *w, int64_t v);
void api__jsonw_float(api__jsonw *w, float f); /* f must be finite (checked by the caller) */
void api__jsonw_printf(api__jsonw *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The failure of a reply writer as an error: 503 out of memory, or 500 when the estimate of the
 * reply's size (its maximum) was wrong. */
int api__jsonw_error(const api__jsonw *w, api__error *err);

#endif
