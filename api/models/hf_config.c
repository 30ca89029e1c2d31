/*
 * hf_config.c - config.json of a Hugging Face checkpoint read into one layer's description:
 * the family (model_type), the sizes, the biases, the RoPE (transformers 5's rope_parameters
 * and 4's rope_theta / rotary_emb_base / rope_scaling / partial_rotary_factor / rotary_pct /
 * rotary_dim, Gemma 3's rope_local_base_freq), the q/k norms, the scale, the logit softcap
 * and whether this layer slides a window (layer_types, or the family's older keys). A Gemma 3
 * text config (gemma3_text, or gemma3's text_config) is read over Gemma3TextConfig's defaults.
 *
 * Everything the layer cannot be served without is checked here and refused with the field
 * that stops it: an unknown model_type, an unsupported rope_type, a layer past
 * num_hidden_layers, heads too many to map (num_attention_heads times head_dim over 2^24).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "api/models/hf.h"
#include "api/models/models.h"

int api__hf_fail(hf_error *e, const char *field, const char *fmt, ...)
{
    if (e->message[0])
        return -1;
    snprintf(e->field, sizeof e->field, "%s", field ? field : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    if (!e->message[0])
        snprintf(e->message, sizeof e->message, "checkpoint error");
    return -1;
}

/* Positions a config may name (max_position_embeddings and the like): far below int64. */
#define MAX_POSITIONS 1099511627776.0

#define LAYERS_PREFIX "model.layers.%lld.self_attn."
/* The names most families took from Llama, and its optional attention_bias. */
#define LLAMA_PROJECTIONS .q = "q_proj", .k = "k_proj", .v = "v_proj", .o = "o_proj"
#define LLAMA_NAMES       .prefix = {LAYERS_PREFIX}, LLAMA_PROJECTIONS
#define ATTENTION_BIAS_KEY                                                                         \
    .bias_qkv = {"attention_bias", false}, .bias_o = {"attention_bias", false}
#define ALWAYS                                                                                     \
    {                                                                                              \
        NULL, true                                                                                 \
    }
#define NEVER                                                                                      \
    {                                                                                              \
        NULL, false                                                                                \
    }

static const hf_family families[] = {
    {.model_type = "llama", LLAMA_NAMES, ATTENTION_BIAS_KEY, .rope = true},
    {.model_type = "mistral",
     LLAMA_NAMES,
     .bias_qkv = NEVER,
     .bias_o = NEVER,
     .rope = true,
     .window = HF_WINDOW_ALL},
    {.model_type = "qwen2",
     LLAMA_NAMES,
     .bias_qkv = ALWAYS,
     .bias_o = NEVER,
     .rope = true,
     .window = HF_WINDOW_QWEN},
    {.model_type = "qwen3",
     LLAMA_NAMES,
     ATTENTION_BIAS_KEY,
     .rope = true,
     .norm = ENG_QK_NORM_RMS,
     .norm_q = "q_norm",
     .norm_k = "k_norm",
     .window = HF_WINDOW_QWEN},
    {.model_type = "gemma2",
     LLAMA_NAMES,
     ATTENTION_BIAS_KEY,
     .rope = true,
     .window = HF_WINDOW_ALTERNATE,
     .scale = HF_SCALE_PRE_ATTN},
    {.model_type = "gemma3_text",
     LLAMA_NAMES,
     ATTENTION_BIAS_KEY,
     .rope = true,
     .norm = ENG_QK_NORM_RMS,
     .norm_plus_one = true,
     .norm_q = "q_norm",
     .norm_k = "k_norm",
     .window = HF_WINDOW_PATTERN,
     .scale = HF_SCALE_PRE_ATTN},
    {.model_type = "gemma3", /* Gemma3ForConditionalGeneration: text_config's layers */
     .prefix = {"model.language_model.layers.%lld.self_attn.",
                "language_model.model.layers.%lld.self_attn."},
     LLAMA_PROJECTIONS,
     ATTENTION_BIAS_KEY,
     .rope = true,
     .norm = ENG_QK_NORM_RMS,
     .norm_plus_one = true,
     .norm_q = "q_norm",
     .norm_k = "k_norm",
     .window = HF_WINDOW_PATTERN,
     .scale = HF_SCALE_PRE_ATTN},
    {.model_type = "phi3",
     .prefix = {LAYERS_PREFIX},
     .qkv = HF_QKV_SPLIT,
     .q = "qkv_proj",
     .o = "o_proj",
     .bias_qkv = NEVER,
     .bias_o = NEVER,
     .rope = true,
     .window = HF_WINDOW_ALL},
    {.model_type = "phi",
     .prefix = {LAYERS_PREFIX},
     .q = "q_proj",
     .k = "k_proj",
     .v = "v_proj",
     .o = "dense",
     .bias_qkv = ALWAYS,
     .bias_o = ALWAYS,
     .rope = true,
     .norm = ENG_QK_NORM_LAYER,
     .norm_flag = "qk_layernorm",
     .norm_q = "q_layernorm",
     .norm_k = "k_layernorm"},
    {.model_type = "gpt2",
     .prefix = {"transformer.h.%lld.attn.", "h.%lld.attn."},
     .qkv = HF_QKV_CONV1D,
     .q = "c_attn",
     .o = "c_proj",
     .bias_qkv = ALWAYS,
     .bias_o = ALWAYS,
     .scale = HF_SCALE_GPT2},
    {.model_type = "gpt_neox",
     .prefix = {"gpt_neox.layers.%lld.attention."},
     .qkv = HF_QKV_GROUPED,
     .q = "query_key_value",
     .o = "dense",
     .bias_qkv = {"attention_bias", true},
     .bias_o = {"attention_bias", true},
     .rope = true},
    {.model_type = "falcon",
     .prefix = {"transformer.h.%lld.self_attention."},
     .qkv = HF_QKV_GROUPED,
     .q = "query_key_value",
     .o = "dense",
     .bias_qkv = {"bias", false},
     .bias_o = {"bias", false},
     .rope = true},
    {.model_type = "olmo2",
     LLAMA_NAMES,
     ATTENTION_BIAS_KEY,
     .rope = true,
     .norm = ENG_QK_NORM_RMS,
     .norm_whole = true,
     .norm_q = "q_norm",
     .norm_k = "k_norm"},
    {.model_type = "starcoder2",
     LLAMA_NAMES,
     .bias_qkv = {"use_bias", true},
     .bias_o = {"use_bias", true},
     .rope = true,
     .window = HF_WINDOW_ALL},
    {.model_type = "gptj",
     .prefix = {"transformer.h.%lld.attn."},
     .q = "q_proj",
     .k = "k_proj",
     .v = "v_proj",
     .o = "out_proj",
     .bias_qkv = NEVER,
     .bias_o = NEVER,
     .rope = true,
     .rope_style = ENG_ROPE_INTERLEAVED},
    {.model_type = "gpt_oss",
     LLAMA_NAMES,
     .bias_qkv = {"attention_bias", true},
     .bias_o = {"attention_bias", true},
     .rope = true,
     .sinks = true},
    {.model_type = "granite",
     LLAMA_NAMES,
     ATTENTION_BIAS_KEY,
     .rope = true,
     .scale = HF_SCALE_MULTIPLIER},
    {.model_type = "stablelm",
     LLAMA_NAMES,
     .bias_qkv = {"use_qkv_bias", false},
     .bias_o = NEVER,
     .rope = true,
     .norm = ENG_QK_NORM_LAYER,
     .norm_flag = "qk_layernorm",
     .norm_q = "q_layernorm",
     .norm_k = "k_layernorm"},
};

/* The family of `model_type`, or NULL. */
static const hf_family *family_find(const char *model_type)
{
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        if (strcmp(families[i].model_type, model_type) == 0)
            return &families[i];
    return NULL;
}

/* ---- Fields ------------------------------------------------------------------------------- */

/* The first of `keys` (NULL-terminated) that is present and not null, or NULL. */
static const json_t *first_of(const json_t *obj, const char *const *keys, const char **found)
{
    for (size_t i = 0; keys[i]; i++) {
        const json_t *v = json_object_get(obj, keys[i]);
        if (v && !json_is_null(v)) {
            *found = keys[i];
            return v;
        }
    }
    return NULL;
}

/* A positive integer from the first present key; `fallback` (0: required) when none is. */
static int get_count(const json_t *cfg, const char *const *keys, int64_t fallback, int64_t max,
                     int64_t *out, hf_error *e)
{
    const char *key = keys[0];
    const json_t *v = first_of(cfg, keys, &key);
    if (!v) {
        if (fallback > 0) {
            *out = fallback;
            return 0;
        }
        return api__hf_fail(e, keys[0], "config.json has no %s", keys[0]);
    }
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > max)
        return api__hf_fail(e, key, "config.json: %s must be an integer in [1, %lld]", key,
                            (long long)max);
    *out = json_integer_value(v);
    return 0;
}

/* A finite number at `key` of `obj` (absent or null: `fallback`). */
static int get_number(const json_t *obj, const char *key, double fallback, double *out, hf_error *e)
{
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = fallback;
        return 0;
    }
    if (!json_is_number(v) || !isfinite(json_number_value(v)))
        return api__hf_fail(e, key, "config.json: %s must be a number", key);
    *out = json_number_value(v);
    return 0;
}

static int get_bool(const json_t *obj, const char *key, bool fallback, bool *out, hf_error *e)
{
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = fallback;
        return 0;
    }
    if (!json_is_boolean(v))
        return api__hf_fail(e, key, "config.json: %s must be true or false", key);
    *out = json_is_true(v);
    return 0;
}

static int bias_of(const json_t *cfg, hf_bias_rule rule, bool *out, hf_error *e)
{
    if (!rule.key) {
        *out = rule.fixed;
        return 0;
    }
    return get_bool(cfg, rule.key, rule.fixed, out, e);
}

/* ---- Sizes -------------------------------------------------------------------------------- */

static int read_sizes(const json_t *cfg, hf_config *c, hf_error *e)
{
    static const char *const k_e[] = {"hidden_size", "n_embd", "d_model", NULL};
    static const char *const k_h[] = {"num_attention_heads", "n_head", NULL};
    static const char *const k_layers[] = {"num_hidden_layers", "n_layer", NULL};
    static const char *const k_kv[] = {"num_key_value_heads", NULL};
    static const char *const k_d[] = {"head_dim", NULL};
    if (get_count(cfg, k_e, 0, 1 << 20, &c->E, e) || get_count(cfg, k_h, 0, 1 << 16, &c->H, e) ||
        get_count(cfg, k_layers, 0, API_MODEL_LAYERS_MAX, &c->layers, e) ||
        get_count(cfg, k_kv, c->H, 1 << 16, &c->Hkv, e))
        return -1;
    if (get_count(cfg, k_d, c->E / c->H, 1 << 16, &c->D, e))
        return -1;
    if (!json_integer_value(json_object_get(cfg, "head_dim")) && c->E % c->H != 0)
        return api__hf_fail(e, "num_attention_heads",
                            "config.json: hidden size %lld is not a multiple of %lld heads (and no "
                            "head_dim says the head size)",
                            (long long)c->E, (long long)c->H);
    if (c->D * c->H > (int64_t)1 << 24)
        return api__hf_fail(e, "head_dim",
                            "config.json: head_dim %lld times %lld heads is over 2^24",
                            (long long)c->D, (long long)c->H);
    if (c->D * c->H != c->E)
        c->spec.head_dim = c->D;
    if (c->layer >= c->layers)
        return api__hf_fail(e, "num_hidden_layers",
                            "layer %lld is past the model's num_hidden_layers = %lld",
                            (long long)c->layer, (long long)c->layers);
    c->qkv = c->family->qkv;
    c->groups = c->H;
    if (strcmp(c->family->model_type, "falcon") == 0) {
        bool alibi = false, new_arch = false, multi_query = true;
        static const char *const k_falcon_kv[] = {"num_kv_heads", NULL};
        if (get_bool(cfg, "alibi", false, &alibi, e) ||
            get_bool(cfg, "new_decoder_architecture", false, &new_arch, e) ||
            get_bool(cfg, "multi_query", true, &multi_query, e))
            return -1;
        if (alibi)
            return api__hf_fail(e, "alibi", "config.json: Falcon with alibi is not supported");
        if (new_arch) {
            if (get_count(cfg, k_falcon_kv, c->H, 1 << 16, &c->Hkv, e))
                return -1;
            c->groups = c->Hkv;
        } else if (multi_query) {
            c->qkv = HF_QKV_SPLIT;
            c->Hkv = 1;
        } else {
            c->Hkv = c->H;
        }
    }
    if (c->H % c->Hkv != 0)
        return api__hf_fail(e, "num_key_value_heads",
                            "config.json: %lld heads are not a multiple of %lld key/value heads",
                            (long long)c->H, (long long)c->Hkv);
    return bias_of(cfg, c->family->bias_qkv, &c->bias_qkv, e) ||
                   bias_of(cfg, c->family->bias_o, &c->bias_o, e)
               ? -1
               : 0;
}

/* ---- Windows ------------------------------------------------------------------------------ */

/* Whether this layer slides a window: layer_types when the config has it, else the family's
 * rule over sliding_window and its companions. */
static int layer_slides(const json_t *cfg, const hf_config *c, bool *slides, hf_error *e)
{
    const json_t *types = json_object_get(cfg, "layer_types");
    *slides = false;
    if (types && !json_is_null(types)) {
        const json_t *t = json_array_get(types, (size_t)c->layer);
        if (!json_is_array(types) || (int64_t)json_array_size(types) != c->layers || !t ||
            !json_is_string(t))
            return api__hf_fail(
                e, "layer_types",
                "config.json: layer_types must list num_hidden_layers = %lld strings",
                (long long)c->layers);
        const char *s = json_string_value(t);
        if (strcmp(s, "sliding_attention") != 0 && strcmp(s, "full_attention") != 0)
            return api__hf_fail(e, "layer_types",
                                "config.json: layer_types[%lld] is \"%.40s\"; attnd serves "
                                "\"full_attention\" and \"sliding_attention\"",
                                (long long)c->layer, s);
        *slides = strcmp(s, "sliding_attention") == 0;
        return 0;
    }
    bool use = true;
    double pattern = 0, first = 0;
    switch (c->family->window) {
    case HF_WINDOW_NONE:
        return 0;
    case HF_WINDOW_ALL:
        *slides = true;
        return 0;
    case HF_WINDOW_QWEN:
        if (get_bool(cfg, "use_sliding_window", false, &use, e) ||
            get_number(cfg, "max_window_layers", 0, &first, e))
            return -1;
        *slides = use && (double)c->layer >= first;
        return 0;
    case HF_WINDOW_ALTERNATE:
        *slides = c->layer % 2 == 0;
        return 0;
    case HF_WINDOW_PATTERN:
        if (get_number(cfg, "sliding_window_pattern", 6, &pattern, e))
            return -1;
        if (pattern < 1 || pattern > 1e6)
            return api__hf_fail(e, "sliding_window_pattern",
                                "config.json: sliding_window_pattern "
                                "must be a positive integer");
        *slides = (c->layer + 1) % (int64_t)pattern != 0;
        return 0;
    }
    return 0;
}

static int read_window(const json_t *cfg, hf_config *c, hf_error *e)
{
    bool slides;
    const json_t *w = json_object_get(cfg, "sliding_window");
    if (layer_slides(cfg, c, &slides, e) != 0)
        return -1;
    if (!slides || !w || json_is_null(w))
        return 0;
    if (!json_is_integer(w) || json_integer_value(w) < 1 || json_integer_value(w) > INT32_MAX)
        return api__hf_fail(e, "sliding_window",
                            "config.json: sliding_window must be a positive integer below 2^31");
    c->spec.window = json_integer_value(w);
    return 0;
}

/* ---- RoPE --------------------------------------------------------------------------------- */

/* The object holding this layer's RoPE settings: rope_parameters (per layer type when it is
 * keyed so, as Gemma 3's), or rope_scaling (4.x), or NULL for the top-level keys alone. */
static const json_t *rope_object(const json_t *cfg, bool slides, hf_error *e, int *rc)
{
    const json_t *p = json_object_get(cfg, "rope_parameters");
    *rc = 0;
    if (p && !json_is_null(p)) {
        const json_t *by_type = json_object_get(p, slides ? "sliding_attention" : "full_attention");
        if (by_type)
            p = by_type;
        if (!json_is_object(p))
            *rc = api__hf_fail(e, "rope_parameters",
                               "config.json: rope_parameters must be an object");
        return p;
    }
    /* Gemma 3 (4.x): local layers turn at rope_local_base_freq, unscaled. */
    if (slides && json_object_get(cfg, "rope_local_base_freq"))
        return NULL;
    p = json_object_get(cfg, "rope_scaling");
    if (p && !json_is_null(p) && !json_is_object(p))
        *rc =
            api__hf_fail(e, "rope_scaling", "config.json: rope_scaling must be an object or null");
    return p && json_is_object(p) ? p : NULL;
}

static int rope_type(const json_t *p, eng_rope_params *r, hf_error *e)
{
    const json_t *t = p ? json_object_get(p, "rope_type") : NULL;
    if (p && (!t || json_is_null(t)))
        t = json_object_get(p, "type");
    const char *s = t && json_is_string(t) ? json_string_value(t) : "default";
    if (t && !json_is_null(t) && !json_is_string(t))
        return api__hf_fail(e, "rope_type", "config.json: rope_type must be a string");
    static const struct {
        const char *name;
        eng_rope_scaling scaling;
    } types[] = {{"default", ENG_ROPE_SCALING_NONE},      {"linear", ENG_ROPE_SCALING_LINEAR},
                 {"llama3", ENG_ROPE_SCALING_LLAMA3},     {"yarn", ENG_ROPE_SCALING_YARN},
                 {"longrope", ENG_ROPE_SCALING_LONGROPE}, {"dynamic", ENG_ROPE_SCALING_DYNAMIC}};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (strcmp(s, types[i].name) == 0) {
            r->scaling = types[i].scaling;
            return 0;
        }
    return api__hf_fail(
        e, "rope_type",
        "config.json: rope_type \"%.40s\" is not supported (default, linear, llama3, "
        "yarn, longrope and dynamic are)",
        s);
}

/* The base: the rope object's rope_theta, else the top level's (Gemma 3 4.x: its
 * rope_local_base_freq on sliding layers), else 10000. */
static int rope_base(const json_t *cfg, const json_t *p, bool slides, double *base, hf_error *e)
{
    double top, neox;
    if (get_number(cfg, "rotary_emb_base", 10000.0, &neox, e) != 0 || /* GPT-NeoX, 4.x */
        get_number(cfg, "rope_theta", neox, &top, e) != 0)
        return -1;
    if (slides && json_object_get(cfg, "rope_local_base_freq") &&
        !(json_object_get(cfg, "rope_parameters") &&
          json_object_get(json_object_get(cfg, "rope_parameters"), "sliding_attention")))
        return get_number(cfg, "rope_local_base_freq", top, base, e);
    return get_number(p ? p : cfg, "rope_theta", top, base, e);
}

/* Channels turned per head: partial_rotary_factor (rope object, then top level), rotary_pct
 * (GPT-NeoX) or rotary_dim (GPT-J); the whole head otherwise. */
static int rotary_dim(const json_t *cfg, const json_t *p, int64_t D, int64_t *out, hf_error *e)
{
    double f = 1.0, pct;
    const json_t *rd = json_object_get(cfg, "rotary_dim");
    if (get_number(cfg, "partial_rotary_factor", 1.0, &f, e) ||
        (p && get_number(p, "partial_rotary_factor", f, &f, e)) ||
        get_number(cfg, "rotary_pct", -1.0, &pct, e))
        return -1;
    if (pct >= 0 && !(p && json_object_get(p, "partial_rotary_factor")))
        f = pct;
    if (!(f > 0 && f <= 1))
        return api__hf_fail(e, "partial_rotary_factor",
                            "config.json: partial_rotary_factor must be in (0, 1]");
    *out = (int64_t)((double)D * f);
    if (rd && !json_is_null(rd)) {
        if (!json_is_integer(rd) || json_integer_value(rd) < 2 || json_integer_value(rd) > D)
            return api__hf_fail(e, "rotary_dim",
                                "config.json: rotary_dim must be in [2, head size]");
        *out = json_integer_value(rd);
    }
    if (*out % 2 != 0)
        return api__hf_fail(e, "partial_rotary_factor",
                            "config.json: the rotary part of a head (%lld channels) must be even",
                            (long long)*out);
    return 0;
}

/* LongRoPE (Phi-3): its short factors, and the context's growth max_position_embeddings /
 * original_max_position_embeddings (the top level's, as transformers reads it) as the factor. */
static int read_longrope(const json_t *cfg, const json_t *p, hf_config *c, double max_pos,
                         hf_error *e)
{
    eng_rope_params *r = &c->spec.rope;
    const json_t *f = json_object_get(p, "short_factor");
    size_t half = (size_t)(r->rotary_dim / 2);
    if (!json_is_array(f) || json_array_size(f) != half || half > 2048)
        return api__hf_fail(
            e, "short_factor",
            "config.json: longrope needs short_factor, %zu numbers (one per rotated "
            "pair)",
            half);
    for (size_t i = 0; i < half; i++) {
        const json_t *v = json_array_get(f, i);
        if (!json_is_number(v) || !(json_number_value(v) > 0) || !isfinite(json_number_value(v)))
            return api__hf_fail(e, "short_factor", "config.json: short_factor[%zu] must be > 0", i);
        c->short_factor[i] = (float)json_number_value(v);
    }
    r->short_factor = c->short_factor;
    double original;
    if (get_number(cfg, "original_max_position_embeddings", 0, &original, e))
        return -1;
    if (original > MAX_POSITIONS)
        return api__hf_fail(e, "original_max_position_embeddings",
                            "config.json: original_max_position_embeddings is over 2^40");
    if (original > 0) {
        r->original_max_positions = original;
        r->factor = max_pos / original;
    } else if (!(r->factor > 0)) {
        r->factor = 1.0;
    }
    r->max_positions = (int64_t)r->original_max_positions;
    return 0;
}

static int read_rope(const json_t *cfg, hf_config *c, hf_error *e)
{
    eng_rope_params *r = &c->spec.rope;
    if (!c->family->rope)
        return 0;
    bool slides = c->spec.window > 0;
    int rc;
    const json_t *p = rope_object(cfg, slides, e, &rc);
    double max_pos;
    if (rc || rope_type(p, r, e) || rope_base(cfg, p, slides, &r->base, e) ||
        rotary_dim(cfg, p, c->D, &r->rotary_dim, e) ||
        get_number(cfg, "max_position_embeddings", 2048, &max_pos, e))
        return -1;
    if (!(max_pos >= 1 && max_pos <= MAX_POSITIONS))
        return api__hf_fail(e, "max_position_embeddings",
                            "config.json: max_position_embeddings must be in [1, 2^40]");
    r->style = c->family->rope_style;
    if (r->scaling == ENG_ROPE_SCALING_NONE)
        return 0;
    if (get_number(p, "factor", 0, &r->factor, e) ||
        get_number(p, "original_max_position_embeddings", max_pos, &r->original_max_positions, e) ||
        get_number(p, "low_freq_factor", 0, &r->low_freq_factor, e) ||
        get_number(p, "high_freq_factor", 0, &r->high_freq_factor, e) ||
        get_number(p, "beta_fast", 32, &r->beta_fast, e) ||
        get_number(p, "beta_slow", 1, &r->beta_slow, e) ||
        get_number(p, "attention_factor", 0, &r->attention_factor, e) ||
        get_number(p, "mscale", 0, &r->mscale, e) ||
        get_number(p, "mscale_all_dim", 0, &r->mscale_all_dim, e) ||
        get_bool(p, "truncate", true, &r->truncate, e))
        return -1;
    if (r->original_max_positions > MAX_POSITIONS)
        return api__hf_fail(e, "original_max_position_embeddings",
                            "config.json: original_max_position_embeddings is over 2^40");
    /* dynamic NTK keeps the default frequencies up to max_position_embeddings */
    if (r->scaling == ENG_ROPE_SCALING_DYNAMIC)
        r->max_positions = (int64_t)max_pos;
    return r->scaling == ENG_ROPE_SCALING_LONGROPE ? read_longrope(cfg, p, c, max_pos, e) : 0;
}

/* ---- Scale, norms, softcap ---------------------------------------------------------------- */

static int read_scale(const json_t *cfg, hf_config *c, hf_error *e)
{
    eng_decoder_spec *s = &c->spec;
    double v;
    bool weights = true, by_layer = false;
    switch (c->family->scale) {
    case HF_SCALE_HEAD:
        return 0;
    case HF_SCALE_PRE_ATTN:
        if (get_number(cfg, "query_pre_attn_scalar", (double)c->D, &v, e))
            return -1;
        if (!(v > 0))
            return api__hf_fail(e, "query_pre_attn_scalar",
                                "config.json: query_pre_attn_scalar must be positive");
        s->scale = (float)pow(v, -0.5);
        break;
    case HF_SCALE_MULTIPLIER:
        if (get_number(cfg, "attention_multiplier", 1.0 / sqrt((double)c->D), &v, e))
            return -1;
        s->scale = (float)v;
        break;
    case HF_SCALE_GPT2:
        if (get_bool(cfg, "scale_attn_weights", true, &weights, e) ||
            get_bool(cfg, "scale_attn_by_inverse_layer_idx", false, &by_layer, e))
            return -1;
        s->scale = (float)((weights ? 1.0 / sqrt((double)c->D) : 1.0) /
                           (by_layer ? (double)(c->layer + 1) : 1.0));
        break;
    }
    s->scale_set = true;
    return 0;
}

static int read_norm(const json_t *cfg, hf_config *c, hf_error *e)
{
    const hf_family *f = c->family;
    bool on = f->norm != ENG_QK_NORM_NONE;
    if (on && f->norm_flag && get_bool(cfg, f->norm_flag, false, &on, e))
        return -1;
    if (!on)
        return 0;
    eng_decoder_spec *s = &c->spec;
    static const char *const eps_keys[] = {"rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon",
                                           NULL};
    const char *key = eps_keys[0];
    const json_t *v = first_of(cfg, eps_keys, &key);
    s->qk_norm_eps = f->norm == ENG_QK_NORM_RMS ? 1e-6 : 1e-5;
    if (v && (!json_is_number(v) || !(json_number_value(v) >= 0)))
        return api__hf_fail(e, key, "config.json: %s must be a number >= 0", key);
    if (v)
        s->qk_norm_eps = json_number_value(v);
    s->qk_norm = f->norm;
    s->qk_norm_whole = f->norm_whole;
    s->qk_norm_plus_one = f->norm_plus_one;
    c->qk_norm_per_head_tensors = strcmp(f->model_type, "stablelm") == 0;
    return 0;
}

static int read_softcap(const json_t *cfg, hf_config *c, hf_error *e)
{
    double cap;
    if (get_number(cfg, "attn_logit_softcapping", 0, &cap, e))
        return -1;
    if (cap < 0)
        return api__hf_fail(e, "attn_logit_softcapping",
                            "config.json: attn_logit_softcapping must be positive or null");
    c->spec.softcap = (float)cap;
    return 0;
}

/* ---- Gemma 3 ------------------------------------------------------------------------------ */

/* What transformers' Gemma3TextConfig takes for the attention's keys a config leaves out (it
 * saves only those that differ): a Gemma 3 text config is read over these. */
static json_t *gemma3_text_defaults(void)
{
    return json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:f, s:b, s:i, s:i, s:i}",
                     "hidden_size", 2304, "num_hidden_layers", 26, "num_attention_heads", 8,
                     "num_key_value_heads", 4, "head_dim", 256, "max_position_embeddings", 131072,
                     "rms_norm_eps", 1e-6, "rope_theta", 1e6, "rope_local_base_freq", 1e4,
                     "attention_bias", 0, "query_pre_attn_scalar", 256, "sliding_window", 4096,
                     "sliding_window_pattern", 6);
}

/* The text config of a Gemma 3 checkpoint (gemma3: its text_config; gemma3_text: itself) over
 * the defaults; a new reference, or NULL with e set. */
static json_t *gemma3_text_config(const json_t *cfg, bool nested, hf_error *e)
{
    const json_t *text = nested ? json_object_get(cfg, "text_config") : cfg;
    if (nested && text && !json_is_null(text) && !json_is_object(text)) {
        api__hf_fail(e, "text_config", "config.json: text_config must be an object");
        return NULL;
    }
    json_t *merged = gemma3_text_defaults();
    if (!merged || (text && json_is_object(text) && json_object_update(merged, (json_t *)text))) {
        json_decref(merged);
        api__hf_fail(e, "config.json", "out of memory reading config.json");
        return NULL;
    }
    return merged;
}

static int read_layer(const json_t *cfg, hf_config *c, hf_error *e)
{
    if (read_sizes(cfg, c, e) || read_window(cfg, c, e) || read_rope(cfg, c, e) ||
        read_scale(cfg, c, e) || read_norm(cfg, c, e) || read_softcap(cfg, c, e))
        return -1;
    return 0;
}

int api__hf_config_read(const json_t *cfg, int64_t layer, hf_config *c, hf_error *e)
{
    memset(c, 0, sizeof *c);
    if (!json_is_object(cfg))
        return api__hf_fail(e, "config.json", "config.json is not a JSON object");
    const json_t *mt = json_object_get(cfg, "model_type");
    if (!json_is_string(mt))
        return api__hf_fail(e, "model_type", "config.json has no model_type string");
    c->family = family_find(json_string_value(mt));
    if (!c->family)
        return api__hf_fail(
            e, "model_type",
            "config.json: model_type \"%.40s\" is not a family attnd serves (llama, "
            "mistral, qwen2, qwen3, gemma2, gemma3_text, gemma3, phi3, phi, gpt2, "
            "gpt_neox, falcon, olmo2, starcoder2, gptj, gpt_oss, granite, stablelm)",
            json_string_value(mt));
    c->layer = layer > 0 ? layer : 0;
    c->sinks = c->family->sinks;
    bool nested = strcmp(c->family->model_type, "gemma3") == 0;
    if (!nested && strcmp(c->family->model_type, "gemma3_text") != 0)
        return read_layer(cfg, c, e);
    json_t *text = gemma3_text_config(cfg, nested, e);
    int rc = text ? read_layer(text, c, e) : -1;
    json_decref(text);
    return rc;
}
