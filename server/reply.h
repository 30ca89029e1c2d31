/*
 * reply.h - a reply as a value (reply.c): what a route handler, a refusal or a worker's api/
 * reply becomes before http.c, the one place that queues replies with libmicrohttpd, sends it
 * (or half_close.c writes it to a socket that is about to close).
 *
 * Ownership: a srv_reply owns its body until it is sent or srv__reply_free'd; `release` says
 * how to free it. Header strings are static or outlive the reply. Any thread.
 */
#ifndef ATTND_SERVER_REPLY_H
#define ATTND_SERVER_REPLY_H

#include "api/api.h"
#include "server/outcome.h"

typedef struct {
    int status;               /* HTTP status; 0: no reply could be made (out of memory), so the
                                 connection is dropped */
    api_reason reason;        /* for attnd_rejected_total and the log line */
    const char *content_type; /* static; NULL: application/json */
    char *body;               /* NULL: empty */
    size_t len;
    void (*release)(void *body); /* frees `body` */
    bool close;                  /* Connection: close */
    bool refusal;                /* from srv__reply_refusal: when sent before the request's body
                                    was read, the connection closes (http.c) */
    /* Response headers (zero / NULL: none), sent in this order: */
    const char *allow;            /* Allow, for a 405 */
    const char *const *headers;   /* more: name, value, ..., NULL (static) */
    const char *content_encoding; /* Content-Encoding of a compressed body */
    int64_t inference_header_len; /* > 0: Inference-Header-Content-Length */
    bool vary_accept_encoding;    /* Vary: Accept-Encoding (worker replies) */
    int retry_after_s;            /* > 0: Retry-After */
    char location[96];            /* non-empty: Location (a session created: 201) */
    char timing[256];             /* non-empty: Server-Timing (a request that reached a worker) */
} srv_reply;

/* `body` (from eng_buf_alloc, taken over; NULL: empty) with the status of `o`. */
srv_reply srv__reply_body(srv_outcome o, const char *content_type, char *body, size_t len);
/* A copy of the NUL-terminated `text` with the status of `o`. */
srv_reply srv__reply_text(srv_outcome o, const char *content_type, const char *text);
/* The error body of refusal `o` in `style`: {"error": {"code", "message"}} natively,
 * {"error": "message"} on /v2/ routes; the status, reason and Retry-After of `o`. */
srv_reply srv__reply_refusal(api_error_style style, srv_outcome o, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A reply api/ built on the MHD thread (listings, metadata), taking over its body. */
srv_reply srv__reply_api(api_reply *r);
/* A reply a worker computed (or the watcher failed) through api/, taking over its body: also
 * its content coding, Inference-Header-Content-Length, Retry-After, Vary: Accept-Encoding,
 * since the body depends on that header, and its stage timings as Server-Timing (receive,
 * copy, queue, parse, decode, compute, encode, in milliseconds) when it has any. */
srv_reply srv__reply_computed(api_reply *r);
/* Frees the body, if the reply still has one; NULL is a no-op. */
void srv__reply_free(srv_reply *r);

/* Calls `fn` with each response header of `r` but Content-Type, Content-Length,
 * X-Request-Id and Connection (which each sender writes its own way), in the order of the
 * fields above, with `num` (24 bytes) holding formatted numbers. Stops at and returns the
 * first false. */
typedef bool (*srv_header_fn)(void *cls, const char *name, const char *value);
bool srv__reply_each_header(const srv_reply *r, char num[24], srv_header_fn fn, void *cls);

#endif
