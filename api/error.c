/*
 * error.c - failures as values (api_error) and as native error replies.
 *
 * Every failure the API reports becomes {"error": {"code", "message", "field"}}: "code" is a
 * stable machine-readable word derived from the HTTP status, "message" one sentence for a
 * person (naming the flag when a limit was hit), "field" the JSON path of the offending part
 * of the request, or null. This file is also where the reasons of the rejection metric get
 * their names and where the default limits live.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/internal.h"

api_limits api_limits_default(void)
{
    api_limits limits = {
        .max_body_bytes = (size_t)256 << 20,
        /* 2^28 elements: 1 GiB as float32, and more numbers than fit in a 256 MiB JSON body
         * (at least two bytes each), so the element cap never rejects a body the byte cap
         * let in but still stops a small base64 request from asking for a huge reply. */
        .max_elements = (size_t)1 << 28,
        .max_timeout_ms = 60000,
    };
    return limits;
}

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

/* Status -> the "code" word of the error body. */
static const struct {
    int status;
    const char *code;
} status_codes[] = {
    {400, "malformed_request"},
    {401, "unauthenticated"},
    {404, "not_found"},
    {405, "method_not_allowed"},
    {408, "request_timeout"},
    {411, "length_required"},
    {413, "too_large"},
    {415, "unsupported_media_type"},
    {422, "invalid_argument"},
    {429, "overloaded"},
    {API_STATUS_CLIENT_CLOSED, "cancelled"},
    {500, "internal"},
    {501, "not_implemented"},
    {503, "unavailable"},
    {504, "deadline_exceeded"},
};

const char *api_status_code(int status)
{
    for (size_t i = 0; i < sizeof status_codes / sizeof status_codes[0]; i++)
        if (status_codes[i].status == status)
            return status_codes[i].code;
    return status >= 500 ? "internal" : "bad_request";
}

static int error_vset(api_error *err, int status, api_reason reason, const char *field,
                      const char *fmt, va_list ap) __attribute__((format(printf, 5, 0)));

static int error_vset(api_error *err, int status, api_reason reason, const char *field,
                      const char *fmt, va_list ap)
{
    if (err->status != 0)
        return -1;
    err->status = status;
    err->reason = reason;
    err->retry_after_s = (status == 429 || status == 503) ? 1 : 0;
    snprintf(err->field, sizeof err->field, "%s", field ? field : "");
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    return -1;
}

int api_error_set(api_error *err, int status, api_reason reason, const char *field, const char *fmt,
                  ...)
{
    va_list ap;
    va_start(ap, fmt);
    error_vset(err, status, reason, field, fmt, ap);
    va_end(ap);
    return -1;
}

/* The HTTP status of `status` in a protocol's style: the native API tells a well-formed but
 * invalid request (422) from one it could not read (400); the Open Inference Protocol has
 * one INVALID_ARG, which Triton and KServe send as 400, and v2 clients expect that. */
static int styled_status(api_error_style style, int status)
{
    return style == API_ERRORS_V2 && status == 422 ? 400 : status;
}

/* Builds the body into `reply`. When even that allocation fails the body stays NULL (the
 * server then sends the status with an empty body): there is nothing better left to do. */
void api_reply_from_error(api_reply *reply, api_error_style style, const api_error *err)
{
    api_jsonw w;
    api_jsonw_init(&w, 4096);
    if (style == API_ERRORS_V2) {
        api_jsonw_cstr(&w, "{\"error\":");
        api_jsonw_string(&w, err->message, strlen(err->message));
        api_jsonw_cstr(&w, "}\n");
    } else {
        api_jsonw_cstr(&w, "{\"error\":{\"code\":");
        const char *code = api_status_code(err->status);
        api_jsonw_string(&w, code, strlen(code));
        api_jsonw_cstr(&w, ",\"message\":");
        api_jsonw_string(&w, err->message, strlen(err->message));
        api_jsonw_cstr(&w, ",\"field\":");
        if (err->field[0])
            api_jsonw_string(&w, err->field, strlen(err->field));
        else
            api_jsonw_cstr(&w, "null");
        api_jsonw_cstr(&w, "}}\n");
    }

    eng_buf_free(reply->body);
    reply->status = styled_status(style, err->status);
    reply->content_type = "application/json";
    reply->retry_after_s = err->retry_after_s;
    reply->reason = err->reason;
    reply->inference_header_len = 0;
    if (w.state == API_JSONW_OK) {
        reply->body = w.data;
        reply->body_len = w.len;
    } else {
        api_jsonw_free(&w);
        reply->body = NULL;
        reply->body_len = 0;
    }
}

void api_reply_error(api_reply *reply, api_error_style style, int status, api_reason reason,
                     const char *field, const char *fmt, ...)
{
    api_error err = {0};
    va_list ap;
    va_start(ap, fmt);
    error_vset(&err, status, reason, field, fmt, ap);
    va_end(ap);
    /* The reply may be uninitialised: the caller hands us a fresh struct. */
    memset(reply, 0, sizeof *reply);
    api_reply_from_error(reply, style, &err);
}

void api_reply_free(api_reply *reply)
{
    if (!reply)
        return;
    eng_buf_free(reply->body);
    reply->body = NULL;
    reply->body_len = 0;
}

char *api_reply_take_body(api_reply *reply, size_t *len)
{
    char *body = reply->body;
    if (len)
        *len = reply->body_len;
    reply->body = NULL;
    reply->body_len = 0;
    return body;
}
