/*
 * error.c - failures as values (api_error) and as native error replies.
 *
 * Every failure the API reports becomes {"error": {"code", "message", "field"}} (v2:
 * {"error": "message"}), sent with the HTTP code its status (status.h) has in the protocol's
 * style: "code" is the status's stable machine-readable word, "message" one sentence for a
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
    return statuses[status].http[style == API_ERRORS_V2];
}

const char *api_status_name(api_status status)
{
    return statuses[status].name;
}

bool api_status_retry(api_status status)
{
    return statuses[status].retry;
}

bool api_status_from_http(int http, api_status *out)
{
    for (size_t i = 0; i < sizeof statuses / sizeof statuses[0]; i++)
        if (statuses[i].http[API_ERRORS_NATIVE] == http) {
            *out = (api_status)i;
            return true;
        }
    return false;
}

static int error_vset(api_error *err, api_status status, api_reason reason, const char *field,
                      const char *fmt, va_list ap) __attribute__((format(printf, 5, 0)));

static int error_vset(api_error *err, api_status status, api_reason reason, const char *field,
                      const char *fmt, va_list ap)
{
    if (err->status != API_STATUS_OK)
        return -1;
    err->status = status;
    err->reason = reason;
    err->retry_after_s = api_status_retry(status) ? 1 : 0;
    snprintf(err->field, sizeof err->field, "%s", field ? field : "");
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    return -1;
}

int api_error_set(api_error *err, api_status status, api_reason reason, const char *field,
                  const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    error_vset(err, status, reason, field, fmt, ap);
    va_end(ap);
    return -1;
}

/* Builds the body of `err` into `reply`, sent as `http` with the native code word `code`. When
 * even that allocation fails the body stays NULL (the server then sends the status with an
 * empty body): there is nothing better left to do. */
static void reply_write(api_reply *reply, api_error_style style, int http, const char *code,
                        const api_error *err)
{
    api_jsonw w;
    api_jsonw_init(&w, 4096);
    if (style == API_ERRORS_V2) {
        api_jsonw_cstr(&w, "{\"error\":");
        api_jsonw_string(&w, err->message, strlen(err->message));
        api_jsonw_cstr(&w, "}\n");
    } else {
        api_jsonw_cstr(&w, "{\"error\":{\"code\":");
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
    reply->status = http;
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

void api_reply_from_error(api_reply *reply, api_error_style style, const api_error *err)
{
    reply_write(reply, style, api_status_http(style, err->status), api_status_name(err->status),
                err);
}

void api_reply_error_status(api_reply *reply, api_error_style style, api_status status,
                            api_reason reason, const char *field, const char *fmt, ...)
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

void api_reply_error(api_reply *reply, api_error_style style, int http, api_reason reason,
                     const char *field, const char *fmt, ...)
{
    /* A code outside the list keeps its number and gets the code word of its class; the status
     * stored for it (no Retry-After) is a placeholder that only marks `err` as filled. */
    api_status status = API_STATUS_INTERNAL;
    bool known = api_status_from_http(http, &status);
    api_error err = {0};
    va_list ap;
    va_start(ap, fmt);
    error_vset(&err, status, reason, field, fmt, ap);
    va_end(ap);
    memset(reply, 0, sizeof *reply);
    if (known)
        api_reply_from_error(reply, style, &err);
    else
        reply_write(reply, style, http, http >= 500 ? "internal" : "bad_request", &err);
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
