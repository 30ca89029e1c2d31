/*
 * outcome.h - every HTTP status that server/ decides by itself, as a value: the refusals of a
 * request (framing errors, queue full, draining, deadlines, a client gone) and the two plain
 * answers server/ gives without api/ (200, 304).
 *
 * Server code names an outcome (SRV_REFUSE_QUEUE_FULL) and this one table (outcome.c) says
 * which status, which rejection reason and which Retry-After go with it, so that the statuses
 * of server/ can be read, and later mapped through api/, in one place. Statuses of replies that
 * api/ builds (a route's own 4xx and 5xx) are not here: api/ chooses those.
 */
#ifndef ATTND_SERVER_OUTCOME_H
#define ATTND_SERVER_OUTCOME_H

#include "api/api.h"

/* X(name, HTTP status, rejection reason, Retry-After seconds (0: none)). */
#define SRV_OUTCOME_LIST(X)                                                                        \
    X(SRV_ANSWER_OK, 200, API_REASON_NONE, 0)                                                      \
    X(SRV_ANSWER_NOT_MODIFIED, 304, API_REASON_NONE, 0)      /* If-None-Match matched */           \
    X(SRV_REFUSE_FRAMING, 400, API_REASON_BAD_REQUEST, 0)    /* request line, headers, framing */  \
    X(SRV_REFUSE_MHD_PARSE, 400, API_REASON_BAD_REQUEST, 0)  /* libmicrohttpd refused it itself */ \
    X(SRV_REFUSE_BAD_PARAM, 400, API_REASON_BAD_REQUEST, 0)  /* a {param} outside its alphabet */  \
    X(SRV_REFUSE_BAD_HEADER, 400, API_REASON_BAD_REQUEST, 0) /* a header value we cannot keep */   \
    X(SRV_REFUSE_UNAUTHORIZED, 401, API_REASON_UNAUTHORIZED, 0)                                    \
    X(SRV_REFUSE_NOT_FOUND, 404, API_REASON_BAD_REQUEST, 0)                                        \
    X(SRV_REFUSE_METHOD, 405, API_REASON_BAD_REQUEST, 0)                                           \
    X(SRV_REFUSE_SLOW_CLIENT, 408, API_REASON_NONE, 0) /* counted in attnd_slow_clients_total */   \
    X(SRV_REFUSE_TOO_LARGE, 413, API_REASON_TOO_LARGE, 0)                                          \
    X(SRV_REFUSE_MEMORY_NEVER, 413, API_REASON_MEMORY, 0) /* more than the whole budget */         \
    X(SRV_REFUSE_MEDIA, 415, API_REASON_BAD_REQUEST, 0)   /* Content-Encoding, Content-Type */     \
    X(SRV_REFUSE_QUEUE_FULL, 429, API_REASON_QUEUE_FULL, 1)                                        \
    X(SRV_REFUSE_MEMORY_BUSY, 429, API_REASON_MEMORY, 1) /* the budget is held by others */        \
    X(SRV_REFUSE_CLIENT_GONE, API_STATUS_CLIENT_CLOSED, API_REASON_CANCELLED, 0)                   \
    X(SRV_REFUSE_NO_HANDLER, 500, API_REASON_INTERNAL, 0) /* our bug */                            \
    X(SRV_REFUSE_NO_STATUS, 500, API_REASON_INTERNAL, 0)  /* a reply without a status: our bug */  \
    X(SRV_REFUSE_TRANSFER_CODING, 501, API_REASON_BAD_REQUEST, 0)                                  \
    X(SRV_REFUSE_DRAINING, 503, API_REASON_DRAINING, 0)                                            \
    X(SRV_REFUSE_NOT_READY, 503, API_REASON_NONE, 0)   /* readiness while draining */              \
    X(SRV_REFUSE_NO_MEMORY, 503, API_REASON_MEMORY, 0) /* allocation failed for a body */          \
    X(SRV_REFUSE_INTERNAL, 503, API_REASON_INTERNAL, 0)                                            \
    X(SRV_REFUSE_DEADLINE, 504, API_REASON_DEADLINE, 0)

typedef enum {
#define SRV_OUTCOME_ENUM(name, status, reason, retry) name,
    SRV_OUTCOME_LIST(SRV_OUTCOME_ENUM)
#undef SRV_OUTCOME_ENUM
} srv_outcome;

typedef struct {
    int status;
    api_reason reason;
    int retry_after_s;
} srv_outcome_info;

/* The row of `o`; never NULL (an out-of-range value is our bug and gets SRV_REFUSE_NO_STATUS's
 * row). Any thread. */
const srv_outcome_info *srv__outcome(srv_outcome o);

#endif
