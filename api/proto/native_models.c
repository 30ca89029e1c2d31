/*
 * native_models.c - GET /v1/models and GET /v1/models/{name}: the registered models described.
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

/* A decoder layer's family and its index in its checkpoint (layer i of model m): the
 * registry's description, or "decoder" and i for a model registered without one. */
static const char *family_of(const api_model *m, int64_t i, int64_t *index)
{
    *index = (m->about ? m->about->layer : 0) + i;
    return m->about ? m->about->family : "decoder";
}

/* Layer l's positions as the summary says them. */
static void positions_text(const eng_layer *l, char *out, size_t n)
{
    const eng_decoder_spec *sp = &l->spec;
    snprintf(out, n, "none");
    if (l->decoder && sp->rope.rotary_dim)
        snprintf(out, n, "rope %s theta %g over %lld of %lld channels (%s pairs)",
                 rope_scaling_name(sp->rope.scaling), sp->rope.base, (long long)sp->rope.rotary_dim,
                 (long long)eng_layer_head_dim(l),
                 sp->rope.style == ENG_ROPE_HALF ? "half-split" : "interleaved");
}

/* The model's windows as the summary says them: one value when its layers share it, else how
 * many layers slide which window. */
static void windows_text(const api_model *m, char *out, size_t n)
{
    int64_t first = m->layer[0]->decoder ? m->layer[0]->spec.window : 0, sliding = 0;
    bool same = true;
    for (int64_t i = 0; i < m->layers; i++) {
        int64_t w = m->layer[i]->decoder ? m->layer[i]->spec.window : 0;
        same &= w == first;
        sliding += w > 0;
    }
    if (same && first > 0)
        snprintf(out, n, "%lld", (long long)first);
    else if (same)
        snprintf(out, n, "none");
    else
        snprintf(out, n, "sliding on %lld of %lld layers", (long long)sliding,
                 (long long)m->layers);
}

void api_model_summary(const api_model *m, char *buf, size_t len)
{
    const eng_layer *l = m->layer[0];
    int64_t index = 0;
    const char *family = l->decoder ? family_of(m, 0, &index) : "attention";
    char layers[64], pos[192], other[192], window[64];
    if (m->layers == 1)
        snprintf(layers, sizeof layers, "layer %lld", (long long)index);
    else
        snprintf(layers, sizeof layers, "%lld layers (%lld to %lld)", (long long)m->layers,
                 (long long)index, (long long)(index + m->layers - 1));
    positions_text(l, pos, sizeof pos);
    bool differ = false;
    for (int64_t i = 1; i < m->layers && !differ; i++) {
        positions_text(m->layer[i], other, sizeof other);
        differ = strcmp(pos, other) != 0;
    }
    if (differ)
        snprintf(pos + strlen(pos), sizeof pos - strlen(pos), " on the first layer, others differ");
    windows_text(m, window, sizeof window);
    snprintf(buf, len,
             "%s %s, %lld heads (%lld kv) of %lld, positions %s, window %s, %s, %zu bytes of "
             "weights",
             family, layers, (long long)l->num_heads, (long long)l->num_kv_heads,
             (long long)eng_layer_head_dim(l), pos, window, l->dtype, api_model_bytes(m));
}

/* The settings of decoder layer i of model m: {family, layer, causal, positional, rope, window,
 * scale, softcap, qk_norm, sinks}. */
static void describe_decoder(api_buf *w, const api_model *m, int64_t i)
{
    const eng_layer *l = m->layer[i];
    const eng_decoder_spec *sp = &l->spec;
    int64_t index;
    const char *family = family_of(m, i, &index);
    api_buf_cstr(w, "{\"family\":");
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

/* Appends the JSON description of model m (as GET /v1/models/{name} answers): its first layer's
 * shape (which every layer shares), its layers, parameters and bytes over all of them, and a
 * decoder's settings: "decoder" the first layer's, and with several layers "decoder_layers"
 * each one's. */
static void model_describe(api_buf *w, const api_model *m)
{
    const eng_layer *l = m->layer[0];
    api_buf_cstr(w, "{\"name\":");
    api_buf_json_string(w, m->name, strlen(m->name));
    api_buf_printf(w,
                   ",\"embed_dim\":%lld,\"num_heads\":%lld,\"num_kv_heads\":%lld,"
                   "\"head_dim\":%lld,\"kdim\":%lld,\"vdim\":%lld,\"bias\":%s,\"bias_kv\":%s,"
                   "\"dtype\":",
                   (long long)l->embed_dim, (long long)l->num_heads, (long long)l->num_kv_heads,
                   (long long)eng_layer_head_dim(l), (long long)l->kdim, (long long)l->vdim,
                   l->b_q ? "true" : "false", l->bias_k ? "true" : "false");
    api_buf_json_string(w, l->dtype, strnlen(l->dtype, sizeof l->dtype));
    api_buf_printf(w, ",\"layers\":%lld,\"parameters\":%lld,\"bytes\":%zu", (long long)m->layers,
                   (long long)api_model_params(m), api_model_bytes(m));
    if (l->decoder) {
        api_buf_cstr(w, ",\"decoder\":");
        describe_decoder(w, m, 0);
    }
    if (l->decoder && m->layers > 1) {
        api_buf_cstr(w, ",\"decoder_layers\":[");
        for (int64_t i = 0; i < m->layers; i++) {
            if (i > 0)
                api_buf_char(w, ',');
            describe_decoder(w, m, i);
        }
        api_buf_char(w, ']');
    }
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
        model_describe(&w, api_models_at(models, i));
    }
    api_buf_cstr(&w, "]}\n");
    api__reply_json(reply, &w, API_ERRORS_NATIVE);
}

void api_models_get(const api_models *models, const char *name, api_reply *reply)
{
    const api_model *m = api_models_find(models, name);
    api_buf w;
    memset(reply, 0, sizeof *reply);
    if (!m) {
        api__error err;
        memset(&err, 0, sizeof err);
        api__error_set(&err, API_STATUS_NOT_FOUND, API_REASON_BAD_REQUEST, NULL,
                       "no model \"%.64s\"; GET /v1/models lists them", name ? name : "");
        api__reply_from_error(reply, API_ERRORS_NATIVE, &err);
        return;
    }
    api_buf_init(&w, (size_t)1 << 20);
    model_describe(&w, m);
    api_buf_char(&w, '\n');
    api__reply_json(reply, &w, API_ERRORS_NATIVE);
}
