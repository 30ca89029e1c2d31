/*
 * reply.c - the constructors of srv_reply (reply.h): every reply of the daemon, from a route
 * handler, a refusal or api/, becomes one value with one way to list its headers.
 */
#include "server/reply.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

srv_reply srv__reply_body(srv_outcome o, const char *content_type, char *body, size_t len)
{
    const srv_outcome_info *info = srv__outcome(o);
    return (srv_reply){.status = srv__outcome_http(o, API_ERRORS_NATIVE),
                       .reason = info->reason,
                       .content_type = content_type,
                       .body = body,
                       .len = body ? len : 0,
                       .release = eng_buf_free,
                       .retry_after_s = info->retry_after_s};
}

srv_reply srv__reply_text(srv_outcome o, const char *content_type, const char *text)
{
    size_t n = strlen(text);
    char *body = eng_buf_alloc(n + 1);
    if (!body)
        return (srv_reply){.status = 0};
    memcpy(body, text, n + 1);
    return srv__reply_body(o, content_type, body, n);
}

/* The fields every api/ reply carries over: status, type, body and reason. */
static srv_reply from_api(api_reply *r)
{
    srv_reply out = {.status = r->status > 0
                                   ? r->status
                                   : srv__outcome_http(SRV_REFUSE_NO_STATUS, API_ERRORS_NATIVE),
                     .reason = r->reason,
                     .content_type = r->content_type,
                     .release = eng_buf_free};
    out.body = api_reply_take_body(r, &out.len);
    memcpy(out.location, r->location, sizeof out.location);
    out.location[sizeof out.location - 1] = '\0';
    return out;
}

srv_reply srv__reply_api(api_reply *r)
{
    return from_api(r);
}

/* The Server-Timing value of r's stages, in the order they happen, each apart from the others
 * (decode without the parse it includes), in milliseconds; empty when r has none (it never
 * reached a worker). */
static void timing_format(const api_reply *r, char *out, size_t size)
{
    const struct {
        const char *name;
        int64_t ns;
    } stages[] = {
        {"receive", r->receive_ns},
        {"copy", r->copy_ns},
        {"queue", r->queue_ns},
        {"parse", r->parse_ns},
        {"decode", r->decode_ns > r->parse_ns ? r->decode_ns - r->parse_ns : 0},
        {"compute", r->compute_ns},
        {"encode", r->encode_ns},
    };
    size_t n = sizeof stages / sizeof stages[0], at = 0;
    bool any = false;
    out[0] = '\0';
    for (size_t i = 0; i < n; i++)
        any = any || stages[i].ns > 0;
    for (size_t i = 0; any && i < n && at < size; i++) {
        int w = snprintf(out + at, size - at, "%s%s;dur=%.3f", i ? ", " : "", stages[i].name,
                         stages[i].ns > 0 ? (double)stages[i].ns / 1e6 : 0.0);
        at += w > 0 ? (size_t)w : size;
    }
    if (at >= size)
        out[0] = '\0'; /* defensive: 256 bytes hold seven stages of up to 10^12 ms */
}

srv_reply srv__reply_computed(api_reply *r)
{
    srv_reply out = from_api(r);
    timing_format(r, out.timing, sizeof out.timing);
    out.content_encoding = r->content_encoding;
    out.inference_header_len = r->inference_header_len;
    out.vary_accept_encoding = true;
    out.retry_after_s = r->retry_after_s;
    return out;
}

srv_reply srv__reply_refusal(api_error_style style, srv_outcome o, const char *fmt, ...)
{
    const srv_outcome_info *info = srv__outcome(o);
    char msg[256];
    va_list ap;
    api_reply r;
    srv_reply out;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    api_reply_error_status(&r, style, info->status, info->reason, NULL, "%s", msg);
    out = from_api(&r);
    /* The table's Retry-After, not api/'s: a refusal from the headers tells a client to come
     * back only when waiting can help (a full queue or budget). */
    out.retry_after_s = info->retry_after_s;
    out.refusal = true;
    return out;
}

void srv__reply_free(srv_reply *r)
{
    if (!r || !r->body)
        return;
    r->release(r->body);
    r->body = NULL;
    r->len = 0;
}

bool srv__reply_each_header(const srv_reply *r, char num[24], srv_header_fn fn, void *cls)
{
    if (r->allow && !fn(cls, "Allow", r->allow))
        return false;
    for (const char *const *h = r->headers; h && h[0] && h[1]; h += 2) {
        if (!fn(cls, h[0], h[1]))
            return false;
    }
    if (r->location[0] && !fn(cls, "Location", r->location))
        return false;
    if (r->content_encoding && !fn(cls, "Content-Encoding", r->content_encoding))
        return false;
    if (r->inference_header_len > 0) {
        snprintf(num, 24, "%lld", (long long)r->inference_header_len);
        if (!fn(cls, "Inference-Header-Content-Length", num))
            return false;
    }
    /* The reply depends on Accept-Encoding: caches must key on it. */
    if (r->vary_accept_encoding && !fn(cls, "Vary", "Accept-Encoding"))
        return false;
    if (r->retry_after_s > 0) {
        snprintf(num, 24, "%d", r->retry_after_s);
        if (!fn(cls, "Retry-After", num))
            return false;
    }
    if (r->timing[0] && !fn(cls, "Server-Timing", r->timing))
        return false;
    return true;
}
