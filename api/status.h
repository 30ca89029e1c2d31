/*
 * status.h - the statuses of api/: why a request failed (or that it did not), as one list.
 *
 * Each row names a status, the HTTP code it is sent with in each protocol style, the stable
 * machine-readable "code" of the native error body, and whether the reply invites a retry
 * (Retry-After: 1). This table is the only place where api/ turns a status into an HTTP code:
 * the native API tells a well-formed but invalid request (422) from one it could not read
 * (400); the Open Inference Protocol has one INVALID_ARG, which Triton and KServe send as 400,
 * and v2 clients expect that. Included by api.h; server/ names its refusals by these statuses
 * too (server/outcome.h), so no HTTP code is chosen outside this table.
 */
#ifndef ATTND_API_STATUS_H
#define ATTND_API_STATUS_H

#include <stdbool.h>

/* X(name, native HTTP code, v2 HTTP code, code word, retry) */
#define API_STATUS_LIST(X)                                                                         \
    X(API_STATUS_OK, 200, 200, "ok", false)                                                        \
    X(API_STATUS_CREATED, 201, 201, "created", false)                                              \
    X(API_STATUS_NO_CONTENT, 204, 204, "no_content", false)                                        \
    X(API_STATUS_NOT_MODIFIED, 304, 304, "not_modified", false)                                    \
    X(API_STATUS_MALFORMED_REQUEST, 400, 400, "malformed_request", false)                          \
    X(API_STATUS_UNAUTHENTICATED, 401, 401, "unauthenticated", false)                              \
    X(API_STATUS_NOT_FOUND, 404, 404, "not_found", false)                                          \
    X(API_STATUS_METHOD_NOT_ALLOWED, 405, 405, "method_not_allowed", false)                        \
    X(API_STATUS_REQUEST_TIMEOUT, 408, 408, "request_timeout", false)                              \
    X(API_STATUS_LENGTH_REQUIRED, 411, 411, "length_required", false)                              \
    X(API_STATUS_CONFLICT, 409, 409, "conflict", false)                                            \
    X(API_STATUS_TOO_LARGE, 413, 413, "too_large", false)                                          \
    X(API_STATUS_UNSUPPORTED_MEDIA_TYPE, 415, 415, "unsupported_media_type", false)                \
    X(API_STATUS_INVALID_ARGUMENT, 422, 400, "invalid_argument", false)                            \
    X(API_STATUS_OVERLOADED, 429, 429, "overloaded", true)                                         \
    X(API_STATUS_CANCELLED, 499, 499, "cancelled", false)                                          \
    X(API_STATUS_INTERNAL, 500, 500, "internal", false)                                            \
    X(API_STATUS_NOT_IMPLEMENTED, 501, 501, "not_implemented", false)                              \
    X(API_STATUS_UNAVAILABLE, 503, 503, "unavailable", true)                                       \
    X(API_STATUS_DEADLINE_EXCEEDED, 504, 504, "deadline_exceeded", false)

/* API_STATUS_OK is 0, so that a zeroed error value holds no error. */
typedef enum {
#define API_STATUS_ENUM(name, native, v2, code, retry) name,
    API_STATUS_LIST(API_STATUS_ENUM)
#undef API_STATUS_ENUM
} api_status;

typedef enum {
    API_ERRORS_NATIVE = 0, /* {"error": {"code", "message", "field"}} */
    API_ERRORS_V2,         /* {"error": "message"}; an invalid request (422 natively) is 400, as
                              Triton and KServe answer INVALID_ARG */
    API_ERRORS_GRPC,       /* v2 over gRPC: the v2 statuses, the message as plain text
                              (API_ERRORS_GRPC_TYPE), which becomes grpc-message */
} api_error_style;

/* The content type of an API_ERRORS_GRPC error reply. */
#define API_ERRORS_GRPC_TYPE "text/plain"

/* The HTTP code of `status` in `style`. */
int api_status_http(api_error_style style, api_status status);

/* The "code" word of the native error body ("invalid_argument"); never NULL. */
const char *api_status_name(api_status status);

#endif
