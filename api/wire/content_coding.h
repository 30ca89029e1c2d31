/*
 * content_coding.h - HTTP content codings (gzip, deflate) of request bodies and replies: the
 * header values that name them, and the inflater and deflater behind api_call_encoded (api.h).
 * Any thread.
 */
#ifndef ATTND_API_WIRE_CONTENT_CODING_H
#define ATTND_API_WIRE_CONTENT_CODING_H

#include <stdbool.h>
#include <stddef.h>

#include "api/core/error.h"

typedef enum {
    API_CODING_IDENTITY = 0,
    API_CODING_GZIP,    /* RFC 1952 (one or more members) */
    API_CODING_DEFLATE, /* HTTP's "deflate": a zlib stream (RFC 1950); raw RFC 1951 accepted */
    API_CODING_UNKNOWN,
} api__coding;

/* The coding a Content-Encoding value names (NULL or empty: identity). One coding only: a list
 * ("gzip, gzip") is UNKNOWN. */
api__coding api__coding_parse(const char *value);

/* The coding to answer with under an Accept-Encoding value (RFC 9110 section 12.5.3): gzip or
 * deflate when its q (or that of "*") is above 0, the higher q winning and gzip on a tie;
 * identity when neither is acceptable, the header is absent (NULL) or unparsable. */
api__coding api__accept_encoding_pick(const char *value);

/* A compressed body to inflate: src[0..n) of `coding` (gzip or deflate), to at most `max`
 * bytes, every growth reserved through the request's `lease` first. */
typedef struct {
    api__coding coding;
    const char *src;
    size_t n, max;
    api_lease *lease;
} api__inflate_job;

/* Decompresses job->src into a malloc'd buffer (*out, *out_len, NUL-terminated past its end),
 * never growing it beyond job->max bytes: 413 naming --max-body-bytes past it. *reserved gets
 * the total reserved through job->lease, to give back once the buffer is freed, also on
 * failure. 400 for a corrupt or truncated stream, 429/413 from the budget, 503 out of memory. */
int api__inflate(const api__inflate_job *job, char **out, size_t *out_len, size_t *reserved,
                 api__error *err);

/* Compresses src[0..n) as `coding` (gzip or deflate, zlib's fastest level) into a buffer from
 * eng_buf_alloc (it becomes a reply body); false when memory runs out. */
bool api__deflate(api__coding coding, const char *src, size_t n, char **out, size_t *out_len);

/* Compresses a 200 reply in the coding call->accept_encoding prefers (gzip or deflate) when
 * that makes it smaller, reserving the worst case through call->lease (not NULL) first; the
 * reply stays as it is otherwise. reply->encode_ns grows by the time taken. */
void api__reply_compress(const api_call *call, api_error_style style, api_reply *reply);

#endif
