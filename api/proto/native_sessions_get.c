/*
 * native_sessions_get.c - the routes of KV-cache sessions that carry no body (api.h: GET one, the
 * list, DELETE) and the JSON description of a session that every session route replies with.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/ops/session_registry.h"
#include "api/wire/buf.h"
#include "api/wire/reply.h"

static const char *dtype_name(eng_dtype d)
{
    return d == ENG_DTYPE_BF16 ? "bfloat16" : d == ENG_DTYPE_F16 ? "float16" : "float32";
}

static void time_iso(api_buf *w, int64_t t)
{
    struct tm tm;
    char text[32];
    time_t tt = (time_t)t;
    gmtime_r(&tt, &tm);
    strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
    api_buf_char(w, '"');
    api_buf_cstr(w, text);
    api_buf_char(w, '"');
}

void api__session_describe(api_buf *w, const api__session *s, int64_t length, size_t bytes)
{
    api_buf_printf(w,
                   "{\"id\":\"%s\",\"length\":%lld,\"bytes\":%zu,\"cache_dtype\":\"%s\","
                   "\"num_heads\":%lld,\"num_kv_heads\":%lld,\"head_dim\":%lld,"
                   "\"value_head_dim\":%lld,\"max_tokens\":",
                   s->id, (long long)length, bytes, dtype_name(s->shape.dtype),
                   (long long)s->num_heads, (long long)s->shape.num_kv_heads,
                   (long long)s->shape.head_dim, (long long)s->shape.value_head_dim);
    if (s->shape.max_tokens > 0)
        api_buf_int(w, s->shape.max_tokens);
    else
        api_buf_cstr(w, "null");
    api_buf_cstr(w, ",\"model\":");
    if (s->model[0])
        api_buf_json_string(w, s->model, strlen(s->model));
    else
        api_buf_cstr(w, "null");
    api_buf_printf(w, ",\"ttl_s\":%lld,\"created\":", (long long)s->ttl_s);
    time_iso(w, s->created_s);
    api_buf_cstr(w, ",\"last_used\":");
    time_iso(w, s->last_used_s);
    api_buf_char(w, '}');
}

/* ---- The cheap routes -------------------------------------------------------------------- */

void api_sessions_get(api_sessions *reg, const char *id, api_reply *reply)
{
    api__error err = {0};
    api_buf w;
    memset(reply, 0, sizeof *reply);
    if (!reg) {
        api__sessions_off(&err);
        api__reply_from_error(reply, API_ERRORS_NATIVE, &err);
        return;
    }
    api_buf_init(&w, 4096);
    pthread_mutex_lock(&reg->lock);
    api__sessions_expire_locked(reg);
    api__session *s = api__sessions_find_locked(reg, id ? id : "");
    if (s) {
        api__session_describe(&w, s, s->length, s->bytes);
        api_buf_char(&w, '\n');
    } else {
        api__sessions_not_found_locked(reg, id, &err);
    }
    pthread_mutex_unlock(&reg->lock);
    if (!s) {
        api_buf_free(&w);
        api__reply_from_error(reply, API_ERRORS_NATIVE, &err);
        return;
    }
    api__reply_json(reply, &w, API_ERRORS_NATIVE);
}

void api_sessions_list(api_sessions *reg, const char *limit, const char *after, api_reply *reply)
{
    api__error err = {0};
    api_buf w;
    long long n = 100;
    memset(reply, 0, sizeof *reply);
    if (!reg) {
        api__sessions_off(&err);
        api__reply_from_error(reply, API_ERRORS_NATIVE, &err);
        return;
    }
    if (limit) {
        char *end = NULL;
        errno = 0;
        n = strtoll(limit, &end, 10);
        if (errno || end == limit || *end || n < 1 || n > 1000) {
            api__error_invalid(&err, "limit", "limit must be an integer in [1, 1000]");
            api__reply_from_error(reply, API_ERRORS_NATIVE, &err);
            return;
        }
    }
    api_buf_init(&w, (size_t)n * 512 + 256);
    api_buf_cstr(&w, "{\"sessions\":[");
    pthread_mutex_lock(&reg->lock);
    api__sessions_expire_locked(reg);
    api__session *s = reg->first;
    if (after && after[0]) {
        api__session *a = api__sessions_find_locked(reg, after);
        if (!a) {
            pthread_mutex_unlock(&reg->lock);
            api_buf_free(&w);
            api__error_invalid(&err, "after",
                               "after must be the id of a live session (the \"next\" of the "
                               "page before)");
            api__reply_from_error(reply, API_ERRORS_NATIVE, &err);
            return;
        }
        s = a->next;
    }
    for (long long i = 0; s && i < n; i++, s = s->next) {
        if (i)
            api_buf_char(&w, ',');
        api__session_describe(&w, s, s->length, s->bytes);
        if (i == n - 1)
            break;
    }
    /* s is the last one written (or NULL): there is a next page when it has a successor. */
    api_buf_cstr(&w, "],\"next\":");
    if (s && s->next)
        api_buf_printf(&w, "\"%s\"", s->id);
    else
        api_buf_cstr(&w, "null");
    api_buf_printf(&w, ",\"live\":%lld}\n", (long long)reg->live);
    pthread_mutex_unlock(&reg->lock);
    api__reply_json(reply, &w, API_ERRORS_NATIVE);
}

void api_sessions_delete(api_sessions *reg, const char *id, api_reply *reply)
{
    api__error err = {0};
    memset(reply, 0, sizeof *reply);
    if (!reg) {
        api__sessions_off(&err);
        api__reply_from_error(reply, API_ERRORS_NATIVE, &err);
        return;
    }
    pthread_mutex_lock(&reg->lock);
    api__session *s = api__sessions_find_locked(reg, id ? id : "");
    if (s) {
        reg->deleted++;
        api__sessions_unlink_locked(reg, s);
    } else {
        api__sessions_not_found_locked(reg, id, &err);
    }
    pthread_mutex_unlock(&reg->lock);
    if (!s) {
        api__reply_from_error(reply, API_ERRORS_NATIVE, &err);
        return;
    }
    reply->status = api_status_http(API_ERRORS_NATIVE, API_STATUS_NO_CONTENT);
    reply->content_type = "application/json";
}

/* ---- The step ---------------------------------------------------------------------------- */
