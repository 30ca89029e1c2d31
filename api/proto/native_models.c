/*
 * native_models.c - GET /v1/models and GET /v1/models/{name}: the registered layers described.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "api/proto/native.h"
#include "api/wire/reply.h"

static const char *rope_scaling_name(eng_rope_scaling s)
{
    switch (s) {
    case ENG_ROPE_SCALING_LINEAR:
        return "linear";
    case ENG_ROPE_SCALING_LLAMA3:
        return "llama3";
    case ENG_ROPE_SCALING_YARN:
        return "yarn";
    case ENG_ROPE_SCALING_LONGROPE:
        return "longrope";
    case ENG_ROPE_SCALING_DYNAMIC:
        return "dynamic";
    case ENG_ROPE_SCALING_NONE:
        break;
    }
    return "default";
}

/* What a decoder layer's description calls its family and index: the registry's, or
 * "decoder" and 0 for one registered without a description. */
static const char *family_of(const api_models *models, const eng_layer *l, int64_t *index)
{
    const api_model_about *about = api_models_about(models, l);
    *index = about ? about->layer : 0;
    return about ? about->family : "decoder";
}

void api_layer_summary(const api_models *models, const eng_layer *l, char *buf, size_t len)
{
    const eng_decoder_spec *sp = &l->spec;
    int64_t index = 0;
    const char *family = l->decoder ? family_of(models, l, &index) : "attention";
    char pos[128] = "none", window[32] = "none";
    if (l->decoder && sp->rope.rotary_dim)
        snprintf(pos, sizeof pos, "rope %s theta %g over %lld of %lld channels (%s pairs)",
                 rope_scaling_name(sp->rope.scaling), sp->rope.base, (long long)sp->rope.rotary_dim,
                 (long long)eng_layer_head_dim(l),
                 sp->rope.style == ENG_ROPE_HALF ? "half-split" : "interleaved");
    if (l->decoder && sp->window > 0)
        snprintf(window, sizeof window, "%lld", (long long)sp->window);
    snprintf(buf, len,
             "%s layer %lld, %lld heads (%lld kv) of %lld, positions %s, window %s, %s, %zu bytes "
             "of weights",
             family, (long long)index, (long long)l->num_heads, (long long)l->num_kv_heads,
             (long long)eng_layer_head_dim(l), pos, window, l->dtype, eng_layer_bytes(l));
}

/* The settings a decoder layer carries: "decoder": {family, layer, positional, rope, window,
 * scale, softcap, qk_norm, sinks}. */
static void describe_decoder(api_buf *w, const api_models *models, const eng_layer *l)
{
    const eng_decoder_spec *sp = &l->spec;
    int64_t index;
    const char *family = family_of(models, l, &index);
    api_buf_cstr(w, ",\"decoder\":{\"family\":");
    api_buf_json_string(w, family, strlen(family));
    api_buf_printf(w, ",\"layer\":%lld,\"causal\":true,\"positional\":\"%s\"", (long long)index,
                   sp->rope.rotary_dim ? "rope" : "none");
    if (sp->rope.rotary_dim)
        api_buf_printf(w,
                       ",\"rope\":{\"theta\":%.17g,\"rotary_dim\":%lld,\"style\":\"%s\","
                       "\"scaling\":\"%s\",\"factor\":%.9g,\"attention_factor\":%.9g}",
                       sp->rope.base, (long long)sp->rope.rotary_dim,
                       sp->rope.style == ENG_ROPE_HALF ? "half" : "interleaved",
                       rope_scaling_name(sp->rope.scaling),
                       sp->rope.scaling ? sp->rope.factor : 1.0, (double)l->rope_factor);
    if (sp->window > 0)
        api_buf_printf(w, ",\"sliding_window\":%lld,\"window\":[%lld,0]", (long long)sp->window,
                       (long long)(sp->window - 1));
    else
        api_buf_cstr(w, ",\"sliding_window\":null,\"window\":null");
    api_buf_printf(w, ",\"scale\":%.9g,\"softcap\":%.9g,\"qk_norm\":\"%s\",\"sinks\":%s}",
                   sp->scale_set ? (double)sp->scale : 1.0 / sqrt((double)eng_layer_head_dim(l)),
                   (double)sp->softcap,
                   sp->qk_norm == ENG_QK_NORM_RMS     ? "rms"
                   : sp->qk_norm == ENG_QK_NORM_LAYER ? "layer_norm"
                                                      : "none",
                   l->sinks ? "true" : "false");
}

/* Appends the JSON description of layer `l` (as GET /v1/models/{name} answers). */
static void model_describe(api_buf *w, const api_models *models, const eng_layer *l)
{
    api_buf_cstr(w, "{\"name\":");
    api_buf_json_string(w, l->name, strlen(l->name));
    api_buf_printf(w,
                   ",\"embed_dim\":%lld,\"num_heads\":%lld,\"num_kv_heads\":%lld,"
                   "\"head_dim\":%lld,\"kdim\":%lld,\"vdim\":%lld,\"bias\":%s,\"bias_kv\":%s,"
                   "\"dtype\":",
                   (long long)l->embed_dim, (long long)l->num_heads, (long long)l->num_kv_heads,
                   (long long)eng_layer_head_dim(l), (long long)l->kdim, (long long)l->vdim,
                   l->b_q ? "true" : "false", l->bias_k ? "true" : "false");
    api_buf_json_string(w, l->dtype, strnlen(l->dtype, sizeof l->dtype));
    api_buf_printf(w, ",\"parameters\":%lld", (long long)eng_layer_params(l));
    if (l->decoder)
        describe_decoder(w, models, l);
    api_buf_char(w, '}');
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
        model_describe(&w, models, api_models_at(models, i));
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
    model_describe(&w, models, l);
    api_buf_char(&w, '\n');
    api__reply_json(reply, &w, API_ERRORS_NATIVE);
}
