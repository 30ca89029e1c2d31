/*
 * native_models.c - GET /v1/models and GET /v1/models/{name}: the registered layers described.
 */
#include <stdio.h>
#include <string.h>

#include "api/proto/native.h"
#include "api/wire/reply.h"

void api__model_describe(api_buf *w, const eng_layer *l)
{
    api_buf_cstr(w, "{\"name\":");
    api_buf_json_string(w, l->name, strlen(l->name));
    api_buf_printf(w,
                   ",\"embed_dim\":%lld,\"num_heads\":%lld,\"num_kv_heads\":%lld,"
                   "\"head_dim\":%lld,\"kdim\":%lld,\"vdim\":%lld,\"bias\":%s,\"bias_kv\":%s,"
                   "\"dtype\":",
                   (long long)l->embed_dim, (long long)l->num_heads, (long long)l->num_kv_heads,
                   (long long)(l->embed_dim / l->num_heads), (long long)l->kdim, (long long)l->vdim,
                   l->b_q ? "true" : "false", l->bias_k ? "true" : "false");
    api_buf_json_string(w, l->dtype, strnlen(l->dtype, sizeof l->dtype));
    api_buf_printf(w, ",\"parameters\":%lld}", (long long)eng_layer_params(l));
}

void api_models_list(const api_models *models, api_reply *reply)
{
    api_buf w;
    memset(reply, 0, sizeof *reply);
    api_buf_init(&w, (size_t)16 << 20);
    api_buf_cstr(&w, "{\"models\":[");
    for (size_t i = 0; i < api_models_count(models); i++) {
        if (i > 0)
            api_buf_char(&w, ',');
        api__model_describe(&w, api_models_at(models, i));
    }
    api_buf_cstr(&w, "]}\n");
    api__reply_json(reply, &w, API_ERRORS_NATIVE);
}

void api_models_get(const api_models *models, const char *name, api_reply *reply)
{
    const eng_layer *l = api_models_find(models, name);
    api_buf w;
    memset(reply, 0, sizeof *reply);
    if (!l) {
        api__error err;
        memset(&err, 0, sizeof err);
        api__error_set(&err, API_STATUS_NOT_FOUND, API_REASON_BAD_REQUEST, NULL,
                       "no model \"%.64s\"; GET /v1/models lists them", name ? name : "");
        api__reply_from_error(reply, API_ERRORS_NATIVE, &err);
        return;
    }
    api_buf_init(&w, (size_t)1 << 20);
    api__model_describe(&w, l);
    api_buf_char(&w, '\n');
    api__reply_json(reply, &w, API_ERRORS_NATIVE);
}
