/*
 * api.h - the wire contract of attnd: request bodies in, engine calls, response bodies out.
 *
 * api/ turns the bytes of a request into validated engine arguments, runs the engine, and turns
 * the result (or the failure) into the bytes and HTTP status of the reply. It is pure functions
 * on byte buffers: no sockets, so every path is testable without a server. Only api/ includes
 * <jansson.h>, and only api/ maps statuses to HTTP codes. Semantics: ../shared/DESIGN.md
 * sections 3 to 5.
 *
 * Usage (what the daemon does on an engine worker for POST /v1/attention):
 *
 *     api_budget *budget = api_budget_new(8u << 30);        // once, at start-up
 *     api_limits limits = api_limits_default();
 *
 *     api_call call = {.body = body, .body_len = len, .content_type = "application/json",
 *                      .pool = pool, .ctl = &ctl, .limits = &limits, .budget = budget};
 *     api_reply reply;
 *     api_attention(&call, &reply);     // always fills reply, success or not
 *     send(reply.status, reply.content_type, reply.body, reply.body_len);
 *     api_reply_free(&reply);
 *
 * Threads: every function is safe to call from any thread; api_budget is shared and
 * internally synchronised. Ownership: an api_call borrows everything it points to for the
 * call; an api_reply owns its body until api_reply_free (or api_reply_take_body).
 */
#ifndef ATTND_API_H
#define ATTND_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"

/* ---- Limits and the memory budget --------------------------------------------------------- */

/* Per-request limits. Each message that reports a violation names the flag that sets it. */
typedef struct {
    size_t max_body_bytes;   /* --max-body-bytes */
    size_t max_elements;     /* --max-elements: total tensor elements in one request */
    int64_t max_timeout_ms;  /* --request-timeout-ms: caps a request's "timeout_ms" */
} api_limits;

/* Defaults matching the daemon's flag defaults. */
api_limits api_limits_default(void);

/* A global byte budget shared by all requests (--max-memory-bytes). */
typedef struct api_budget api_budget;

typedef enum {
    API_BUDGET_OK = 0,  /* reserved; release it when the request ends */
    API_BUDGET_NEVER,   /* larger than the whole budget: 413 */
    API_BUDGET_NOT_NOW, /* would fit in an idle daemon, not now: 429 + Retry-After */
} api_budget_result;

api_budget *api_budget_new(size_t total_bytes); /* NULL on allocation failure */
void api_budget_free(api_budget *budget);       /* NULL is a no-op */
api_budget_result api_budget_reserve(api_budget *budget, size_t bytes);
void api_budget_release(api_budget *budget, size_t bytes);
size_t api_budget_in_use(api_budget *budget);

/* ---- One call ------------------------------------------------------------------------------ */

typedef struct {
    const char *body; /* the request body, not NUL-terminated */
    size_t body_len;
    const char *content_type; /* the Content-Type header value; NULL if absent */
    eng_pool *pool;
    eng_ctl *ctl;             /* the request's cancel flag; its deadline is set by the call */
    int64_t start_ns;         /* eng_now_ns() when the request arrived: deadlines count from it */
    const api_limits *limits;
    api_budget *budget;
} api_call;

/* Why a request failed, for the attnd_rejected_total{reason} metric. */
#define API_REASON_LIST(X)                                                                     \
    X(API_REASON_NONE, "none")                                                                 \
    X(API_REASON_QUEUE_FULL, "queue_full")                                                     \
    X(API_REASON_MEMORY, "memory")                                                             \
    X(API_REASON_DEADLINE, "deadline")                                                         \
    X(API_REASON_CANCELLED, "cancelled")                                                       \
    X(API_REASON_DRAINING, "draining")                                                         \
    X(API_REASON_TOO_LARGE, "too_large")                                                       \
    X(API_REASON_BAD_REQUEST, "bad_request")                                                   \
    X(API_REASON_INTERNAL, "internal")

typedef enum {
#define API_REASON_ENUM(name, text) name,
    API_REASON_LIST(API_REASON_ENUM)
#undef API_REASON_ENUM
} api_reason;

const char *api_reason_str(api_reason reason);

/* A finished reply: the HTTP status and an owned body ready to send. */
typedef struct {
    int status;               /* HTTP status code */
    const char *content_type; /* static string */
    char *body;               /* malloc'd; owned by the reply */
    size_t body_len;
    int retry_after_s;        /* > 0: send Retry-After with this value */
    api_reason reason;        /* API_REASON_NONE on success */
    int64_t decode_ns, compute_ns, encode_ns; /* stage timings */
} api_reply;

void api_reply_free(api_reply *reply);

/* POST /v1/attention: decodes, validates, reserves memory, runs eng_sdpa and encodes the
 * reply. Always fills `reply` (an error reply is {"error": {"code", "message", "field"}}). */
void api_attention(const api_call *call, api_reply *reply);

/* Fills `reply` with a native error body for failures found outside api_attention (unknown
 * route, wrong method, body over the cap, queue full...). `field` may be NULL. */
void api_reply_error(api_reply *reply, int status, api_reason reason, const char *field,
                     const char *fmt, ...) __attribute__((format(printf, 5, 6)));

#endif
