/*
 * buf.h - the daemon's one growable byte buffer (buf.c): request bodies, metrics text, the
 * statistics JSON and log lines all go through it.
 *
 * The cap is given at init (as curl's dynbuf does), so no caller can forget to bound a buffer
 * that grows with client input. A failed append sets `failed` and leaves the buffer as it was,
 * so a series of appends can be checked once at the end. Any thread; a buffer belongs to one
 * thread at a time.
 */
#ifndef ATTND_SERVER_BUF_H
#define ATTND_SERVER_BUF_H

#include "server/server.h"

typedef struct {
    char *data;
    size_t len, cap, limit;
    bool failed;
    bool pooled; /* data is from eng_buf_alloc (request bodies, see srv__buf_grow_to) */
} srv_buf;

void srv__buf_init(srv_buf *b, size_t limit);
void srv__buf_free(srv_buf *b);
/* Ensures room for `extra` more bytes: SRV_OK, SRV_ETOOBIG (past the limit) or SRV_ENOMEM. */
srv_status srv__buf_reserve(srv_buf *b, size_t extra);
/* Grows the allocation to exactly `cap` bytes (data plus the NUL), for callers that account
 * for every allocated byte (request bodies against the memory budget). The storage comes from
 * eng_buf_alloc, whose cache keeps the pages of big bodies for the next request; such a buffer
 * is never taken (srv__buf_take). */
srv_status srv__buf_grow_to(srv_buf *b, size_t cap);
srv_status srv__buf_append(srv_buf *b, const void *data, size_t n);
srv_status srv__buf_puts(srv_buf *b, const char *s);
srv_status srv__buf_printf(srv_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends `s` (n bytes) as a JSON string literal with quotes; bytes that are not printable
 * ASCII are escaped as \u00XX, so the output is ASCII whatever the input. */
srv_status srv__buf_json_str(srv_buf *b, const char *s, size_t n);
/* Hands the data (NUL-terminated, malloc'd) to the caller and resets the buffer; NULL if the
 * buffer failed or allocation failed. */
char *srv__buf_take(srv_buf *b, size_t *len);

#endif
