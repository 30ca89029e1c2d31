/*
 * error.h - api/'s failures as values: a status of status.h with a metric reason, the field it
 * names and a message, filled by the function that finds the problem and turned into a reply
 * by wire/reply.h. The bottom tier of api/: every other part includes it.
 *
 * Functions that can fail return 0, or -1 with an api__error filled; the first error wins.
 * Any thread; nothing here allocates.
 */
#ifndef ATTND_API_CORE_ERROR_H
#define ATTND_API_CORE_ERROR_H

#include <stdarg.h>

#include "api/api.h"

typedef struct {
    api_status status; /* API_STATUS_OK while there is no error */
    api_reason reason; /* for the rejection metric */
    int retry_after_s; /* > 0: the reply carries Retry-After */
    char code[32];     /* the native "code" word when it is more specific than the status's
                          ("session_not_found" for a 404); "": api_status_name(status) */
    char field[128];   /* JSON-path-like name of the offending field, "" for none */
    char message[400]; /* one sentence; names the limit or flag where one applies */
} api__error;

/* Fills `err` and returns -1, so that a check reads `return api__error_set(err, ...)`. `field`
 * may be NULL. The first error wins: a second call on a filled `err` changes nothing. */
int api__error_set(api__error *err, api_status status, api_reason reason, const char *field,
                   const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* api__error_set with a va_list. */
int api__error_vset(api__error *err, api_status status, api_reason reason, const char *field,
                    const char *fmt, va_list ap) __attribute__((format(printf, 5, 0)));

/* Fills `err` with an invalid_argument (422 natively) naming `field` and returns -1. */
int api__error_invalid(api__error *err, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* api__error_set with a code word of its own (`code`, at most 31 bytes of [a-z_]) in place of
 * the status's default, for a failure a client must tell apart from others of the same status:
 * 404 session_not_found and session_evicted. The HTTP code still comes from the status. */
int api__error_code(api__error *err, api_status status, const char *code, const char *field,
                    const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Whose bytes an engine call read, which decides whether a malformed one (ENG_EFORMAT, ENG_EIO)
 * is the client's fault or the server's. */
typedef enum {
    API_ENGINE_INPUT_SERVER = 0, /* the server's own files and models: 500 */
    API_ENGINE_INPUT_REQUEST,    /* the request's data (inline weights): 400 */
} api__engine_input;

/* The one mapping of an engine status to an api status: fills `err` from st and e (its
 * message), naming `field` (may be NULL) where the failure is the request's, and returns -1;
 * returns 0 for ENG_OK. ENG_ECANCELLED and ENG_EDEADLINE get the generic message (callers that
 * know the deadline say more first: api__req_engine_error). */
int api__error_engine(api__error *err, eng_status st, const eng_error *e, const char *field,
                      api__engine_input input);

/* The native "code" word of `err`: its own, else its status's. */
const char *api__error_code_word(const api__error *err);

#endif
