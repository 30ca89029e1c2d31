/*
 * reply.c - filling an api_reply: error bodies in each protocol's style, JSON bodies from a
 * writer, and handing a body over.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "api/wire/reply.h"

/* Builds the body of `err` into `reply`, sent as `http` with the native code word `code`. When
 * even that allocation fails the body stays NULL (the server then sends the status with an
 * empty body): there is nothing better left to do. */
static void reply_write(api_reply *reply, api_error_style style, int http, const char *code,
                        const api__error *err)
{
    api_buf w;
    api_buf_init(&w, 4096);
    if (style == API_ERRORS_GRPC) {
        /* NUL-terminated (not counted), as api_grpc_error's: the gRPC edge reads it as text. */
        api_buf_cstr(&w, err->message);
        api_buf_char(&w, '\0');
    } else if (style == API_ERRORS_V2) {
        api_buf_cstr(&w, "{\"error\":");
        api_buf_json_string(&w, err->message, strlen(err->message));
        api_buf_cstr(&w, "}\n");
    } else {
        api_buf_cstr(&w, "{\"error\":{\"code\":");
        api_buf_json_string(&w, code, strlen(code));
        api_buf_cstr(&w, ",\"message\":");
        api_buf_json_string(&w, err->message, strlen(err->message));
        api_buf_cstr(&w, ",\"field\":");
        if (err->field[0])
            api_buf_json_string(&w, err->field, strlen(err->field));
        else
            api_buf_cstr(&w, "null");
        api_buf_cstr(&w, "}}\n");
    }

    eng_buf_free(reply->body);
    reply->status = http;
    reply->content_type = style == API_ERRORS_GRPC ? API_ERRORS_GRPC_TYPE : "application/json";
    reply->retry_after_s = err->retry_after_s;
    reply->reason = err->reason;
    reply->inference_header_len = 0;
    if (w.state == API_BUF_OK) {
        reply->body = w.data;
        reply->body_len = style == API_ERRORS_GRPC ? w.len - 1 : w.len;
    } else {
        api_buf_free(&w);
        reply->body = NULL;
        reply->body_len = 0;
    }
}

void api__reply_from_error(api_reply *reply, api_error_style style, const api__error *err)
{
    reply_write(reply, style, api_status_http(style, err->status), api__error_code_word(err), err);
}

void api_reply_error_status(api_reply *reply, api_error_style style, api_status status,
                            api_reason reason, const char *field, const char *fmt, ...)
{
    api__error err = {0};
    va_list ap;
    va_start(ap, fmt);
    api__error_vset(&err, status, reason, field, fmt, ap);
    va_end(ap);
    /* The reply may be uninitialised: the caller hands us a fresh struct. */
    memset(reply, 0, sizeof *reply);
    api__reply_from_error(reply, style, &err);
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

void api__reply_json(api_reply *reply, api_buf *w, api_error_style style)
{
    if (w->state != API_BUF_OK) {
        api__error err = {0};
        api__error_set(&err, API_STATUS_UNAVAILABLE, API_REASON_MEMORY, NULL,
                       "out of memory for the reply");
        api__reply_from_error(reply, style, &err);
        api_buf_free(w);
        return;
    }
    reply->status = api_status_http(style, API_STATUS_OK);
    reply->content_type = "application/json";
    reply->reason = API_REASON_NONE;
    reply->body = w->data;
    reply->body_len = w->len;
    w->data = NULL;
}
