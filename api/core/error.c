/*
 * error.c - failures as values (api__error), the status table of status.h, and the names of
 * the rejection metric's reasons.
 *
 * Every failure the API reports carries a status, a reason, a message (one sentence for a
 * person, naming the flag when a limit was hit) and a field (the JSON path of the offending
 * part of the request). wire/reply.c turns it into a reply; the HTTP code and the native
 * "code" word come from the status table here, and nowhere else; so does the status an engine
 * failure becomes (api__error_engine).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/core/error.h"

const char *api_reason_str(api_reason reason)
{
    switch (reason) {
#define API_REASON_CASE(name, text)                                                                \
    case name:                                                                                     \
        return text;
        API_REASON_LIST(API_REASON_CASE)
#undef API_REASON_CASE
    }
    return "unknown";
}

static const struct {
    int http[2]; /* by api_error_style */
    const char *name;
    bool retry;
} statuses[] = {
#define API_STATUS_ROW(name, native, v2, code, retry) {{native, v2}, code, retry},
    API_STATUS_LIST(API_STATUS_ROW)
#undef API_STATUS_ROW
};

int api_status_http(api_error_style style, api_status status)
{
    return statuses[status].http[style != API_ERRORS_NATIVE];
}

const char *api_status_name(api_status status)
{
    return statuses[status].name;
}

/* Whether a reply with `status` carries Retry-After (429 and 503). */
static bool status_retry(api_status status)
{
    return statuses[status].retry;
}

int api__error_vset(api__error *err, api_status status, api_reason reason, const char *field,
                    const char *fmt, va_list ap)
{
    if (err->status != API_STATUS_OK)
        return -1;
    err->status = status;
    err->reason = reason;
    err->retry_after_s = status_retry(status) ? 1 : 0;
    err->code[0] = '\0';
    snprintf(err->field, sizeof err->field, "%s", field ? field : "");
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    return -1;
}

int api__error_set(api__error *err, api_status status, api_reason reason, const char *field,
                   const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    api__error_vset(err, status, reason, field, fmt, ap);
    va_end(ap);
    return -1;
}

int api__error_invalid(api__error *err, const char *field, const char *fmt, ...)
{
    char msg[sizeof err->message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, field, "%s",
                          msg);
}

int api__error_code(api__error *err, api_status status, const char *code, const char *field,
                    const char *fmt, ...)
{
    if (err->status != API_STATUS_OK)
        return -1;
    va_list ap;
    va_start(ap, fmt);
    api__error_vset(err, status, API_REASON_BAD_REQUEST, field, fmt, ap);
    va_end(ap);
    snprintf(err->code, sizeof err->code, "%s", code);
    return -1;
}

const char *api__error_code_word(const api__error *err)
{
    return err->code[0] ? err->code : api_status_name(err->status);
}

int api__error_engine(api__error *err, eng_status st, const eng_error *e, const char *field,
                      api__engine_input input)
{
    switch (st) {
    case ENG_OK:
        return 0;
    case ENG_EINVAL:
        return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, field, "%s",
                              e->message);
    case ENG_ENONFINITE:
        return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST,
                              field ? field : "output",
                              "%s (inputs too large for float32 arithmetic?)", e->message);
    case ENG_ETOOBIG:
        return api__error_set(err, API_STATUS_TOO_LARGE, API_REASON_TOO_LARGE, field, "%s",
                              e->message);
    case ENG_ENOMEM:
        return api__error_set(err, API_STATUS_UNAVAILABLE, API_REASON_MEMORY, NULL,
                              "out of memory: %s", e->message);
    case ENG_ECANCELLED:
        return api__error_set(err, API_STATUS_CANCELLED, API_REASON_CANCELLED, NULL,
                              "the request was cancelled");
    case ENG_EDEADLINE:
        return api__error_set(err, API_STATUS_DEADLINE_EXCEEDED, API_REASON_DEADLINE, NULL,
                              "the request did not finish within its deadline");
    case ENG_EIO:
    case ENG_EFORMAT:
        if (input == API_ENGINE_INPUT_REQUEST)
            return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, field,
                                  "%s", e->message);
        break;
    }
    return api__error_set(err, API_STATUS_INTERNAL, API_REASON_INTERNAL, field, "engine: %s: %s",
                          eng_status_str(st), e->message);
}
