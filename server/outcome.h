/*
 * outcome.h - everything server/ decides about a request by itself, as a value: the refusals
 * of a request (framing errors, queue full, draining, deadlines, a client gone) and the two
 * plain answers server/ gives without api/ (200, 304).
 *
 * Server code names an outcome (SRV_REFUSE_QUEUE_FULL) and this one table (outcome.c) says
 * which api/ status (api/status.h), which rejection reason and which Retry-After go with it.
 * server/ picks no HTTP code: api_status_http turns the status into one in the route's protocol
 * style, as it does for the replies api/ builds.
 */
#ifndef ATTND_SERVER_OUTCOME_H
#define ATTND_SERVER_OUTCOME_H

#include "api/api.h"

/* X(name, api status, rejection reason, Retry-After seconds (0: none)).
 * MHD_PARSE: libmicrohttpd refused the request itself; BAD_PARAM: a {param} outside its
 * alphabet; BAD_HEADER: a header value we cannot keep; SLOW_CLIENT: counted in
 * attnd_slow_clients_total; MEMORY_NEVER: more than the whole budget; MEMORY_BUSY: the budget
 * is held by others; MEDIA: Content-Encoding, Content-Type; NO_HANDLER, NO_STATUS: our bugs;
 * NOT_READY: readiness while draining; NO_MEMORY: allocation failed for a body; OVERLOADED:
 * the queued work would make it late (its Retry-After is computed from the queue); NO_METHOD: a
 * gRPC method attnd does not serve. */
#define SRV_OUTCOME_LIST(X)                                                                        \
    X(SRV_ANSWER_OK, API_STATUS_OK, API_REASON_NONE, 0)                                            \
    X(SRV_ANSWER_NOT_MODIFIED, API_STATUS_NOT_MODIFIED, API_REASON_NONE, 0)                        \
    X(SRV_REFUSE_FRAMING, API_STATUS_MALFORMED_REQUEST, API_REASON_BAD_REQUEST, 0)                 \
    X(SRV_REFUSE_MHD_PARSE, API_STATUS_MALFORMED_REQUEST, API_REASON_BAD_REQUEST, 0)               \
    X(SRV_REFUSE_BAD_PARAM, API_STATUS_MALFORMED_REQUEST, API_REASON_BAD_REQUEST, 0)               \
    X(SRV_REFUSE_BAD_HEADER, API_STATUS_MALFORMED_REQUEST, API_REASON_BAD_REQUEST, 0)              \
    X(SRV_REFUSE_UNAUTHORIZED, API_STATUS_UNAUTHENTICATED, API_REASON_UNAUTHORIZED, 0)             \
    X(SRV_REFUSE_NOT_FOUND, API_STATUS_NOT_FOUND, API_REASON_BAD_REQUEST, 0)                       \
    X(SRV_REFUSE_METHOD, API_STATUS_METHOD_NOT_ALLOWED, API_REASON_BAD_REQUEST, 0)                 \
    X(SRV_REFUSE_SLOW_CLIENT, API_STATUS_REQUEST_TIMEOUT, API_REASON_NONE, 0)                      \
    X(SRV_REFUSE_TOO_LARGE, API_STATUS_TOO_LARGE, API_REASON_TOO_LARGE, 0)                         \
    X(SRV_REFUSE_MEMORY_NEVER, API_STATUS_TOO_LARGE, API_REASON_MEMORY, 0)                         \
    X(SRV_REFUSE_MEDIA, API_STATUS_UNSUPPORTED_MEDIA_TYPE, API_REASON_BAD_REQUEST, 0)              \
    X(SRV_REFUSE_QUEUE_FULL, API_STATUS_OVERLOADED, API_REASON_QUEUE_FULL, 1)                      \
    X(SRV_REFUSE_OVERLOADED, API_STATUS_OVERLOADED, API_REASON_QUEUE_FULL, 1)                      \
    X(SRV_REFUSE_MEMORY_BUSY, API_STATUS_OVERLOADED, API_REASON_MEMORY, 1)                         \
    X(SRV_REFUSE_CLIENT_GONE, API_STATUS_CANCELLED, API_REASON_CANCELLED, 0)                       \
    X(SRV_REFUSE_NO_HANDLER, API_STATUS_INTERNAL, API_REASON_INTERNAL, 0)                          \
    X(SRV_REFUSE_NO_STATUS, API_STATUS_INTERNAL, API_REASON_INTERNAL, 0)                           \
    X(SRV_REFUSE_TRANSFER_CODING, API_STATUS_NOT_IMPLEMENTED, API_REASON_BAD_REQUEST, 0)           \
    X(SRV_REFUSE_NO_METHOD, API_STATUS_NOT_IMPLEMENTED, API_REASON_BAD_REQUEST, 0)                 \
    X(SRV_REFUSE_DRAINING, API_STATUS_UNAVAILABLE, API_REASON_DRAINING, 0)                         \
    X(SRV_REFUSE_NOT_READY, API_STATUS_UNAVAILABLE, API_REASON_NONE, 0)                            \
    X(SRV_REFUSE_NO_MEMORY, API_STATUS_UNAVAILABLE, API_REASON_MEMORY, 0)                          \
    X(SRV_REFUSE_INTERNAL, API_STATUS_UNAVAILABLE, API_REASON_INTERNAL, 0)                         \
    X(SRV_REFUSE_DEADLINE, API_STATUS_DEADLINE_EXCEEDED, API_REASON_DEADLINE, 0)

typedef enum {
#define SRV_OUTCOME_ENUM(name, status, reason, retry) name,
    SRV_OUTCOME_LIST(SRV_OUTCOME_ENUM)
#undef SRV_OUTCOME_ENUM
} srv_outcome;

typedef struct {
    api_status status;
    api_reason reason;
    int retry_after_s;
} srv_outcome_info;

/* The row of `o`; never NULL (an out-of-range value is our bug and gets SRV_REFUSE_NO_STATUS's
 * row). Any thread. */
const srv_outcome_info *srv__outcome(srv_outcome o);

/* The HTTP code of `o` in `style` (api_status_http of its status). Any thread. */
int srv__outcome_http(srv_outcome o, api_error_style style);

#endif
