/*
 * mha.c - POST /v1/mha: a multi-head attention layer on token embeddings (DESIGN.md section
 * 6), with the weights of a registered model or given inline: request body -> validated
 * eng_mha call -> reply body.
 *
 * The request is a JSON object with these fields; any other is refused with 422 naming it:
 *
 *   model               the name of a registered layer (GET /v1/models lists them: "demo" and
 *                       every --model), or
 *   weights             the layer inline: an object of tensors under the names a model file
 *                       uses (in_proj_weight, in_proj_bias, out_proj.weight, out_proj.bias,
 *                       q_proj_weight, k_proj_weight, v_proj_weight, bias_k, bias_v;
 *                       q_proj.weight ... o_proj.bias; W_Q.weight ... W_O.weight), at most 16,
 *                       in any wire form; their elements count toward --max-elements.
 *   num_heads           required with weights; with a model, if given, it must match.
 *   num_kv_heads        likewise (default: num_heads): grouped-query layers.
 *   input               the queries' tokens [L, E] or [B, L, E] (E = the layer's embed_dim).
 *   memory              cross-attention: the tokens keys and values come from, [S, kdim] or
 *                       [B, S, kdim], same rank and batch as input (the layer's kdim must
 *                       equal its vdim). Without it the layer attends over `input` itself.
 *   key, value          cross-attention with different key and value tokens (needed when the
 *                       layer's kdim differs from its vdim): [.., S, kdim] and [.., S, vdim],
 *                       both or neither, never with memory.
 *   causal              false | true | "top_left" | "bottom_right" (S - L), as /v1/attention.
 *   query_offset        integer: query i sits at position i + query_offset.
 *   window              [left, right], each a non-negative integer or null.
 *   key_padding_mask    booleans [B, S] or [S]: true = padding, ignored (PyTorch polarity).
 *   attn_mask           booleans (true = MAY attend: the polarity of /v1/attention and PyTorch
 *                       SDPA, the opposite of nn.MultiheadAttention's boolean mask) or numbers
 *                       added to the scores (-inf as null), broadcast to [B, H, L, S] from
 *                       [L, S] or [B|1, H|1, L|1, S|1]. S counts the input keys only: keys the
 *                       layer appends (bias_kv, add_zero_attn) are visible to every query.
 *   positional          "sinusoidal" (added to the layer inputs) | "rope" (q and k per head) |
 *                       "alibi" | "none" | null.
 *   rope_base           > 0 (default 10000), with positional "rope" only.
 *   rope_style          "half" (default; GPT-NeoX / Hugging Face) | "interleaved", rope only.
 *   add_zero_attn       boolean: append a zero key and value, as torch does.
 *   return_weights      "mean" | "per_head" | false.
 *   output_encoding     "nested" | "flat" | "base64"; default: the input's form.
 *   timeout_ms          positive integer, capped by --request-timeout-ms.
 * Every optional field may also be null, meaning its default.
 *
 * The reply is {"output": T, "weights"?: T, "meta": {...}}: output [B, L, E] (or [L, E] for a
 * rank-2 input), weights [B, H, L, S'] per head or [B, L, S'] as the head mean (B dropped
 * likewise), where S' = S plus the appended keys.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/internal.h"

#define MHA_MAX_WEIGHTS 16

typedef struct {
    api_req rq;
    const api_call *call;

    /* The fields as parsed: tensors probed, not yet decoded. */
    const char *model; /* points into the body tree */
    bool has_weights;
    size_t n_weights;
    api_tensor wt[MHA_MAX_WEIGHTS];
    char wt_name[MHA_MAX_WEIGHTS][80];
    char wt_field[MHA_MAX_WEIGHTS][96];
    int64_t num_heads, num_kv_heads; /* 0: not given */
    api_tensor input, memory, key, value, mask, kpm;
    bool has_input, has_memory, has_key, has_value, has_mask, has_kpm;
    api_causal causal;
    bool offset_set;
    int64_t query_offset;
    api_field_window_t window;
    eng_positional positional;
    bool rope_base_set, rope_style_set;
    float rope_base;
    eng_rope_style rope_style;
    bool add_zero_attn;
    eng_weights_mode weights;
    bool encoding_set;
    api_form encoding;
    int64_t timeout_ms;

    /* Derived. */
    const eng_layer *layer;
    eng_layer *inline_layer; /* owned */
    int64_t B, L, S, Sx;
    api_out_shape os, ws;
    float *x, *k_in, *v_in, *out, *w_out, *mask_f;
    uint8_t *mask_b, *kpm_b;
    eng_mha_args args;
    api_jsonw w;
} mha_job;

/* ---- Field parsers ----------------------------------------------------------------------- */

typedef int (*mha_parser)(mha_job *job, const json_t *v, const char *name, api_error *err);

static int probe(mha_job *job, const json_t *v, const char *name, api_tensor *t, bool *has,
                 api_error *err)
{
    if (json_is_null(v))
        return 0;
    *has = true;
    return api_tensor_probe(&job->rq.body, v, name, job->rq.limits.max_elements, t, err);
}

static int f_model(mha_job *job, const json_t *v, const char *name, api_error *err)
{
    if (json_is_null(v))
        return 0;
    if (!json_is_string(v))
        return api_field_invalid(err, name, "%s must be the name of a model (GET /v1/models)",
                                 name);
    job->model = json_string_value(v);
    return 0;
}

static int f_weights(mha_job *job, const json_t *v, const char *name, api_error *err)
{
    const char *key;
    json_t *val;
    if (json_is_null(v))
        return 0;
    if (!json_is_object(v) || json_object_size(v) == 0)
        return api_field_invalid(err, name,
                                 "%s must be an object of tensors named as in a model file "
                                 "(in_proj_weight, out_proj.weight, ...)",
                                 name);
    if (json_object_size(v) > MHA_MAX_WEIGHTS)
        return api_field_invalid(err, name, "%s has %zu tensors; a layer has at most %d", name,
                                 json_object_size(v), MHA_MAX_WEIGHTS);
    job->has_weights = true;
    json_object_foreach((json_t *)v, key, val)
    {
        size_t i = job->n_weights++;
        bool has = false;
        snprintf(job->wt_name[i], sizeof job->wt_name[i], "%.60s", key);
        snprintf(job->wt_field[i], sizeof job->wt_field[i], "%s.%.60s", name, key);
        if (json_is_null(val))
            return api_field_invalid(err, job->wt_field[i], "%s must be a tensor",
                                     job->wt_field[i]);
        if (probe(job, val, job->wt_field[i], &job->wt[i], &has, err) != 0)
            return -1;
        if (job->wt[i].dtype == API_DTYPE_BOOL || job->wt[i].rank > 4)
            return api_field_invalid(err, job->wt_field[i], "%s must hold numbers, of rank 1 to 4",
                                     job->wt_field[i]);
    }
    return 0;
}

static int f_num_heads(mha_job *job, const json_t *v, const char *name, api_error *err)
{
    if (json_is_null(v))
        return 0;
    return api_field_int(v, name, 1, INT32_MAX, &job->num_heads, err);
}

static int f_num_kv_heads(mha_job *job, const json_t *v, const char *name, api_error *err)
{
    if (json_is_null(v))
        return 0;
    return api_field_int(v, name, 1, INT32_MAX, &job->num_kv_heads, err);
}

static int f_input(mha_job *job, const json_t *v, const char *name, api_error *err)
{
    return probe(job, v, name, &job->input, &job->has_input, err);
}

static int f_memory(mha_job *job, const json_t *v, const char *name, api_error *err)
{
    return probe(job, v, name, &job->memory, &job->has_memory, err);
}

static int f_key(mha_job *job, const json_t *v, const char *name, api_error *err)
{
    return probe(job, v, name, &job->key, &job->has_key, err);
}

static int f_value(mha_job *job, const json_t *v, const char *name, api_error *err)
{
    return probe(job, v, name, &job->value, &job->has_value, err);
}

static int f_attn_mask(mha_job *job, const json_t *v, const char *name, api_error *err)
{
    return probe(job, v, name, &job->mask, &job->has_mask, err);
}

static int f_key_padding_mask(mha_job *job, const json_t *v, const char *name, api_error *err)
{
    return probe(job, v, name, &job->kpm, &job->has_kpm, err);
}

static int f_causal(mha_job *job, const json_t *v, const char *name, api_error *err)
{
    return api_field_causal(v, name, &job->causal, err);
}

static int f_query_offset(mha_job *job, const json_t *v, const char *name, api_error *err)
{
    if (json_is_null(v))
        return 0;
    job->offset_set = true;
    return api_field_int(v, name, -API_QUERY_OFFSET_MAX, API_QUERY_OFFSET_MAX, &job->query_offset,
                         err);
}

static int f_window(mha_job *job, const json_t *v, const char *name, api_error *err)
{
    return api_field_window(v, name, &job->window, err);
}

static int f_positional(mha_job *job, const json_t *v, const char *name, api_error *err)
{
    static const struct {
        const char *name;
        eng_positional p;
    } kinds[] = {{"none", ENG_POSITIONAL_NONE},
                 {"sinusoidal", ENG_POSITIONAL_SINUSOIDAL},
                 {"rope", ENG_POSITIONAL_ROPE},
                 {"alibi", ENG_POSITIONAL_ALIBI}};
    const char *s = json_string_value(v);
    if (json_is_null(v))
        return 0;
    for (size_t i = 0; s && i < sizeof kinds / sizeof kinds[0]; i++) {
        if (strcmp(s, kinds[i].name) == 0) {
            job->positional = kinds[i].p;
            return 0;
        }
    }
    return api_field_invalid(err, name,
                             "%s must be \"sinusoidal\", \"rope\", \"alibi\" or \"none\"", name);
}

static int f_rope_base(mha_job *job, const json_t *v, const char *name, api_error *err)
{
    if (json_is_null(v))
        return 0;
    if (api_field_float(v, name, &job->rope_base, err) != 0)
        return -1;
    if (!(job->rope_base > 0.0f))
        return api_field_invalid(err, name, "%s must be > 0, found %g", name,
                                 (double)job->rope_base);
    job->rope_base_set = true;
    return 0;
}

static int f_rope_style(mha_job *job, const json_t *v, const char *name, api_error *err)
{
    const char *s = json_string_value(v);
    if (json_is_null(v))
        return 0;
    if (s && strcmp(s, "half") == 0)
        job->rope_style = ENG_ROPE_HALF;
    else if (s && strcmp(s, "interleaved") == 0)
        job->rope_style = ENG_ROPE_INTERLEAVED;
    else
        return api_field_invalid(err, name, "%s must be \"half\" or \"interleaved\"", name);
    job->rope_style_set = true;
    return 0;
}

static int f_add_zero_attn(mha_job *job, const json_t *v, const char *name, api_error *err)
{
    if (json_is_null(v))
        return 0;
    if (!json_is_boolean(v))
        return api_field_invalid(err, name, "%s must be true or false", name);
    job->add_zero_attn = json_is_true(v);
    return 0;
}

static int f_return_weights(mha_job *job, const json_t *v, const char *name, api_error *err)
{
    return api_field_weights(v, name, &job->weights, err);
}

static int f_output_encoding(mha_job *job, const json_t *v, const char *name, api_error *err)
{
    return api_field_encoding(v, name, &job->encoding_set, &job->encoding, err);
}

static int f_timeout_ms(mha_job *job, const json_t *v, const char *name, api_error *err)
{
    if (json_is_null(v))
        return 0;
    return api_field_int(v, name, 1, (int64_t)1 << 40, &job->timeout_ms, err);
}

static const struct {
    const char *name;
    mha_parser parse;
} mha_fields[] = {
    {"model", f_model},
    {"weights", f_weights},
    {"num_heads", f_num_heads},
    {"num_kv_heads", f_num_kv_heads},
    {"input", f_input},
    {"memory", f_memory},
    {"key", f_key},
    {"value", f_value},
    {"causal", f_causal},
    {"query_offset", f_query_offset},
    {"window", f_window},
    {"key_padding_mask", f_key_padding_mask},
    {"attn_mask", f_attn_mask},
    {"positional", f_positional},
    {"rope_base", f_rope_base},
    {"rope_style", f_rope_style},
    {"add_zero_attn", f_add_zero_attn},
    {"return_weights", f_return_weights},
    {"output_encoding", f_output_encoding},
    {"timeout_ms", f_timeout_ms},
};

#define N_FIELDS (sizeof mha_fields / sizeof mha_fields[0])

static int parse_fields(mha_job *job, api_error *err)
{
    const char *key;
    json_t *val;
    json_object_foreach(job->rq.body.root, key, val)
    {
        size_t i = 0;
        while (i < N_FIELDS && strcmp(mha_fields[i].name, key) != 0)
            i++;
        if (i == N_FIELDS) {
            const char *names[N_FIELDS];
            for (size_t j = 0; j < N_FIELDS; j++)
                names[j] = mha_fields[j].name;
            const char *best = api_closest_name(key, names, N_FIELDS);
            if (best)
                return api_field_invalid(err, key, "unknown field \"%.60s\"; did you mean \"%s\"?",
                                         key, best);
            return api_field_invalid(
                err, key,
                "unknown field \"%.60s\"; /v1/mha takes model, weights, num_heads, num_kv_heads, "
                "input, memory, key, value, causal, query_offset, window, key_padding_mask, "
                "attn_mask, positional, rope_base, rope_style, add_zero_attn, return_weights, "
                "output_encoding and timeout_ms",
                key);
        }
        if (mha_fields[i].parse(job, val, key, err) != 0)
            return -1;
    }
    if (!job->has_input)
        return api_field_invalid(err, "input", "input is required");
    if (job->model && job->has_weights)
        return api_field_invalid(err, "weights",
                                 "give either model (a registered layer) or weights (inline), "
                                 "not both");
    if (!job->model && !job->has_weights)
        return api_field_invalid(err, "model",
                                 "model (a registered layer, see GET /v1/models) or weights "
                                 "(inline tensors) is required");
    if (job->has_memory && (job->has_key || job->has_value))
        return api_field_invalid(err, job->has_key ? "key" : "value",
                                 "give memory (keys and values from the same tokens) or key and "
                                 "value, not both");
    if (job->has_key != job->has_value)
        return api_field_invalid(err, job->has_key ? "value" : "key",
                                 "key and value come together (or use memory)");
    if (job->offset_set &&
        (job->causal == API_CAUSAL_TOP_LEFT || job->causal == API_CAUSAL_BOTTOM_RIGHT))
        return api_field_invalid(err, "query_offset",
                                 "query_offset conflicts with causal \"%s\", which sets the "
                                 "alignment itself; use causal: true with query_offset",
                                 job->causal == API_CAUSAL_TOP_LEFT ? "top_left" : "bottom_right");
    if ((job->rope_base_set || job->rope_style_set) && job->positional != ENG_POSITIONAL_ROPE)
        return api_field_invalid(err, job->rope_base_set ? "rope_base" : "rope_style",
                                 "%s applies only with positional \"rope\"",
                                 job->rope_base_set ? "rope_base" : "rope_style");
    return 0;
}

/* ---- Sizes ------------------------------------------------------------------------------- */

static bool add_size(size_t *acc, size_t n)
{
    return !__builtin_add_overflow(*acc, n, acc);
}

static size_t weights_count(const mha_job *job, bool *overflow)
{
    size_t n = 0;
    for (size_t i = 0; i < job->n_weights; i++)
        *overflow |= !add_size(&n, job->wt[i].count);
    return n;
}

/* Elements of every input tensor, inline weights included. */
static size_t input_count(const mha_job *job, bool *overflow)
{
    size_t n = weights_count(job, overflow);
    const api_tensor *in[] = {&job->input, &job->memory, &job->key,
                              &job->value, &job->mask,   &job->kpm};
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++)
        *overflow |= !add_size(&n, in[i]->count); /* absent tensors count 0 */
    return n;
}

static int too_many(const mha_job *job, size_t in, size_t out, bool overflow, api_error *err)
{
    return api_error_set(err, 413, API_REASON_TOO_LARGE, NULL,
                         "the request has %zu input (inline weights included) and %s%zu output "
                         "elements, more than the %zu that --max-elements allows",
                         in, overflow ? "over " : "", overflow ? SIZE_MAX : out,
                         job->rq.limits.max_elements);
}

/* ---- The layer --------------------------------------------------------------------------- */

static int layer_error(eng_status st, const eng_error *e, api_error *err)
{
    char field[128];
    if (strcmp(e->field, "num_heads") == 0 || strcmp(e->field, "num_kv_heads") == 0)
        snprintf(field, sizeof field, "%s", e->field);
    else if (e->field[0])
        snprintf(field, sizeof field, "weights.%s", e->field);
    else
        snprintf(field, sizeof field, "weights");
    switch (st) {
    case ENG_ETOOBIG:
        return api_error_set(err, 413, API_REASON_TOO_LARGE, field, "%s", e->message);
    case ENG_ENOMEM:
        return api_error_set(err, 503, API_REASON_MEMORY, NULL, "out of memory: %s", e->message);
    default:
        return api_error_set(err, 422, API_REASON_BAD_REQUEST, field, "%s", e->message);
    }
}

/* Decodes the inline weights to float32 and builds the layer from them (the engine checks the
 * names, that each is used once, and that the shapes make one layer). */
static int build_inline_layer(mha_job *job, api_error *err)
{
    eng_tensor_ref refs[MHA_MAX_WEIGHTS];
    float *bufs[MHA_MAX_WEIGHTS] = {0};
    bool overflow = false;
    size_t total = weights_count(job, &overflow), bytes = 0;
    char what[96];
    int rc = -1;

    if (job->num_heads == 0)
        return api_field_invalid(err, "num_heads",
                                 "num_heads is required with inline weights (the shapes do not "
                                 "say how many heads there are)");
    /* The decoded tensors, then the layer's own fp32 copy of them. */
    overflow |= __builtin_mul_overflow(total, (size_t)8, &bytes);
    bytes = overflow ? SIZE_MAX : bytes + (size_t)64 * job->n_weights;
    snprintf(what, sizeof what, "%.1f MiB of inline weights", (double)bytes / (1024.0 * 1024.0));
    if (api_req_reserve(&job->rq, bytes, false, what, err) != 0)
        return -1;
    for (size_t i = 0; i < job->n_weights; i++) {
        const api_tensor *t = &job->wt[i];
        bufs[i] = api_aligned_alloc(t->count * sizeof(float));
        if (!bufs[i]) {
            api_error_set(err, 503, API_REASON_MEMORY, NULL, "out of memory for %s",
                          job->wt_field[i]);
            goto done;
        }
        if (api_tensor_decode(&job->rq.body, t, API_ELEM_FLOAT, 0, bufs[i], job->wt_field[i],
                              job->call->pool, err) != 0)
            goto done;
        refs[i].name = job->wt_name[i];
        refs[i].dtype = ENG_DTYPE_F32;
        refs[i].data = bufs[i];
        refs[i].rank = t->rank;
        for (int d = 0; d < 4; d++)
            refs[i].shape[d] = d < t->rank ? t->shape[d] : 0;
    }
    eng_error e;
    memset(&e, 0, sizeof e);
    job->inline_layer = eng_layer_from_tensors("inline", refs, job->n_weights, job->num_heads,
                                               job->num_kv_heads, &e);
    if (!job->inline_layer) {
        layer_error(e.status, &e, err);
        goto done;
    }
    job->layer = job->inline_layer;
    rc = 0;
done:
    for (size_t i = 0; i < job->n_weights; i++)
        free(bufs[i]);
    return rc;
}

static int find_layer(mha_job *job, api_error *err)
{
    const eng_layer *l;
    if (job->has_weights)
        return build_inline_layer(job, err);
    l = api_models_find(job->call->models, job->model);
    if (!l)
        return api_error_set(err, 404, API_REASON_BAD_REQUEST, "model",
                             "no model \"%.64s\"; GET /v1/models lists them", job->model);
    if (job->num_heads && job->num_heads != l->num_heads)
        return api_field_invalid(err, "num_heads",
                                 "num_heads is %lld but model \"%s\" has %lld heads; leave it out",
                                 (long long)job->num_heads, l->name, (long long)l->num_heads);
    if (job->num_kv_heads && job->num_kv_heads != l->num_kv_heads)
        return api_field_invalid(err, "num_kv_heads",
                                 "num_kv_heads is %lld but model \"%s\" has %lld; leave it out",
                                 (long long)job->num_kv_heads, l->name, (long long)l->num_kv_heads);
    job->layer = l;
    return 0;
}

/* ---- Shapes ------------------------------------------------------------------------------ */

/* A token tensor `t` ([n, width] or [B, n, width] after the input's rank) with the given
 * width; *n gets its length. */
static int check_tokens(const mha_job *job, const api_tensor *t, const char *name, int64_t width,
                        const char *width_name, int64_t *n, api_error *err)
{
    char ts[96], is[96];
    int rank = job->input.rank;
    api_field_shape_str(t, ts, sizeof ts);
    api_field_shape_str(&job->input, is, sizeof is);
    if (t->rank != rank)
        return api_field_invalid(err, name, "%s has shape %s but input has rank %d (%s)", name, ts,
                                 rank, is);
    if (rank == 3 && t->shape[0] != job->input.shape[0])
        return api_field_invalid(err, name, "%s %s and input %s differ in batch size (dimension 0)",
                                 name, ts, is);
    if (t->shape[rank - 1] != width)
        return api_field_invalid(err, name,
                                 "%s has shape %s; its last dimension must be the layer's %s "
                                 "(%lld)",
                                 name, ts, width_name, (long long)width);
    *n = t->shape[rank - 2];
    return 0;
}

static int check_shapes(mha_job *job, api_error *err)
{
    const eng_layer *l = job->layer;
    const api_tensor *in = &job->input;
    char is[96];
    int64_t H = l->num_heads;
    api_field_shape_str(in, is, sizeof is);
    if (in->rank != 2 && in->rank != 3)
        return api_field_invalid(err, "input", "input has shape %s; it must be [L, E] or [B, L, E]",
                                 is);
    if (in->dtype == API_DTYPE_BOOL)
        return api_field_invalid(err, "input", "input must hold numbers");
    job->B = in->rank == 3 ? in->shape[0] : 1;
    job->L = in->shape[in->rank - 2];
    if (in->shape[in->rank - 1] != l->embed_dim)
        return api_field_invalid(err, "input",
                                 "input has shape %s; its last dimension must be the layer's "
                                 "embed_dim (%lld)",
                                 is, (long long)l->embed_dim);
    if (job->has_memory) {
        if (l->kdim != l->vdim)
            return api_field_invalid(err, "memory",
                                     "the layer has kdim %lld and vdim %lld: give key and value "
                                     "separately instead of memory",
                                     (long long)l->kdim, (long long)l->vdim);
        if (check_tokens(job, &job->memory, "memory", l->kdim, "kdim", &job->S, err) != 0)
            return -1;
    } else if (job->has_key) {
        int64_t Sv = 0;
        if (check_tokens(job, &job->key, "key", l->kdim, "kdim", &job->S, err) != 0 ||
            check_tokens(job, &job->value, "value", l->vdim, "vdim", &Sv, err) != 0)
            return -1;
        if (Sv != job->S)
            return api_field_invalid(err, "value", "value has %lld tokens but key %lld",
                                     (long long)Sv, (long long)job->S);
    } else {
        if (l->kdim != l->embed_dim || l->vdim != l->embed_dim)
            return api_field_invalid(err, "memory",
                                     "the layer has kdim %lld and vdim %lld (embed_dim %lld): it "
                                     "attends over other tokens; give memory (or key and value)",
                                     (long long)l->kdim, (long long)l->vdim,
                                     (long long)l->embed_dim);
        job->S = job->L;
    }
    if (job->has_memory || job->has_key) {
        const api_tensor *m = job->has_memory ? &job->memory : &job->key;
        const api_tensor *ts[2] = {m, job->has_key ? &job->value : NULL};
        for (int i = 0; i < 2; i++)
            if (ts[i] && ts[i]->dtype == API_DTYPE_BOOL)
                return api_field_invalid(err,
                                         i == 0 ? (job->has_memory ? "memory" : "key") : "value",
                                         "%s must hold numbers",
                                         i == 0 ? (job->has_memory ? "memory" : "key") : "value");
    }
    if (job->has_mask && api_field_attn_mask(&job->mask, job->B, H, job->L, job->S, err) != 0)
        return -1;
    if (job->has_kpm && api_field_key_padding(&job->kpm, job->B, job->S, err) != 0)
        return -1;
    return 0;
}

/* Fills job->args from the request, with the job's buffers (placeholders before they exist,
 * enough for eng_mha_scratch_bytes and eng_mha_extra_keys). */
static void build_args(mha_job *job, float *placeholder)
{
    eng_mha_args *a = &job->args;
    bool cross = job->has_memory || job->has_key;
    memset(a, 0, sizeof *a);
    a->layer = job->layer;
    a->B = job->B;
    a->L = job->L;
    a->x = job->x ? job->x : placeholder;
    a->S = job->S;
    if (cross) {
        a->key_in = job->k_in ? job->k_in : placeholder;
        a->value_in = job->v_in ? job->v_in : placeholder;
    }
    a->out = job->out ? job->out : placeholder;
    a->causal = job->causal != API_CAUSAL_OFF;
    if (job->offset_set) {
        a->align = ENG_ALIGN_OFFSET;
        a->query_offset = job->query_offset;
    } else {
        a->align =
            job->causal == API_CAUSAL_BOTTOM_RIGHT ? ENG_ALIGN_BOTTOM_RIGHT : ENG_ALIGN_TOP_LEFT;
    }
    a->window_left_set = job->window.left_set;
    a->window_left = job->window.left;
    a->window_right_set = job->window.right_set;
    a->window_right = job->window.right;
    if (job->has_kpm) {
        a->key_padding = job->kpm_b ? job->kpm_b : (const uint8_t *)placeholder;
        a->key_padding_stride = job->kpm.rank == 2 ? job->S : 0;
    }
    if (job->has_mask) {
        const void *data = job->mask.dtype == API_DTYPE_BOOL ? (const void *)job->mask_b
                                                             : (const void *)job->mask_f;
        a->attn_mask = api_field_mask_view(&job->mask, data ? data : placeholder);
    }
    a->add_zero_attn = job->add_zero_attn;
    a->positional = job->positional;
    a->rope_base = job->rope_base_set ? job->rope_base : 0.0f;
    a->rope_style = job->rope_style;
    a->weights_mode = job->weights;
    a->weights = job->weights != ENG_WEIGHTS_NONE ? (job->w_out ? job->w_out : placeholder) : NULL;
}

/* The reply's shapes (rank after the input's; a rank-2 input drops B) and the element limit
 * over inputs and outputs. */
static int out_shapes(mha_job *job, api_error *err)
{
    const eng_layer *l = job->layer;
    bool overflow = false, drop = job->input.rank == 2;
    size_t in = input_count(job, &overflow), out = 0;
    int64_t H = l->num_heads;
    float placeholder = 0;
    build_args(job, &placeholder);
    job->Sx = job->S + eng_mha_extra_keys(&job->args);
    job->os = (api_out_shape){3, {job->B, job->L, l->embed_dim}, 0};
    if (job->weights == ENG_WEIGHTS_PER_HEAD)
        job->ws = (api_out_shape){4, {job->B, H, job->L, job->Sx}, 0};
    else
        job->ws = (api_out_shape){3, {job->B, job->L, job->Sx}, 0};
    api_out_shape *all[2] = {&job->os, &job->ws};
    for (int i = 0; i < 2; i++) {
        api_out_shape *s = all[i];
        size_t c = 1;
        if (drop) {
            s->rank--;
            memmove(s->shape, s->shape + 1, sizeof s->shape - sizeof s->shape[0]);
        }
        for (int d = 0; d < s->rank; d++)
            overflow |= __builtin_mul_overflow(c, (size_t)s->shape[d], &c);
        s->count = c;
    }
    overflow |= !add_size(&out, job->os.count);
    if (job->weights != ENG_WEIGHTS_NONE)
        overflow |= !add_size(&out, job->ws.count);
    size_t total = in;
    overflow |= !add_size(&total, out);
    if (overflow || total > job->rq.limits.max_elements)
        return too_many(job, in, out, overflow, err);
    return 0;
}

/* ---- Memory, decoding, the call ---------------------------------------------------------- */

static api_form reply_form(const mha_job *job)
{
    return job->encoding_set ? job->encoding : job->input.form;
}

static size_t tensor_bytes(const api_tensor *t, size_t esize)
{
    return t->count ? api_aligned_size(t->count * esize) : 0; /* count <= max_elements */
}

/* Decoded inputs and outputs (*tensors) and the reply text (*text, also the writer's maximum).
 * False when a sum overflows. */
static bool estimate(const mha_job *job, size_t *tensors, size_t *text)
{
    const struct {
        const api_tensor *t;
        size_t esize;
    } in[] = {{&job->input, 4}, {&job->memory, 4},
              {&job->key, 4},   {&job->value, 4},
              {&job->kpm, 1},   {&job->mask, job->mask.dtype == API_DTYPE_BOOL ? 1 : 4}};
    const api_out_shape *outs[2] = {&job->os, job->weights != ENG_WEIGHTS_NONE ? &job->ws : NULL};
    api_form form = reply_form(job);
    bool ok = true;
    *tensors = 0;
    *text = 1024; /* braces, keys and meta */
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++)
        ok = ok && add_size(tensors, tensor_bytes(in[i].t, in[i].esize));
    for (int i = 0; i < 2; i++)
        if (outs[i])
            ok = ok && add_size(tensors, api_aligned_size(outs[i]->count * 4)) &&
                 add_size(text, api_tensor_encoded_bound(form, outs[i]->rank, outs[i]->shape,
                                                         outs[i]->count));
    return ok;
}

static int decode(mha_job *job, const api_tensor *t, api_elem elem, unsigned flags, void **dst,
                  const char *field, api_error *err)
{
    size_t esize = elem == API_ELEM_BOOL ? 1 : 4;
    *dst = api_req_alloc(&job->rq, t->count * esize, err);
    if (!*dst)
        return -1;
    return api_tensor_decode(&job->rq.body, t, elem, flags, *dst, field, job->call->pool, err);
}

static int decode_inputs(mha_job *job, api_error *err)
{
    if (decode(job, &job->input, API_ELEM_FLOAT, 0, (void **)&job->x, "input", err) != 0)
        return -1;
    if (job->has_memory) {
        if (decode(job, &job->memory, API_ELEM_FLOAT, 0, (void **)&job->k_in, "memory", err) != 0)
            return -1;
        job->v_in = job->k_in;
    } else if (job->has_key) {
        if (decode(job, &job->key, API_ELEM_FLOAT, 0, (void **)&job->k_in, "key", err) != 0 ||
            decode(job, &job->value, API_ELEM_FLOAT, 0, (void **)&job->v_in, "value", err) != 0)
            return -1;
    }
    if (job->has_mask) {
        bool is_bool = job->mask.dtype == API_DTYPE_BOOL;
        if (decode(job, &job->mask, is_bool ? API_ELEM_BOOL : API_ELEM_FLOAT,
                   is_bool ? 0 : API_DECODE_NEG_INF,
                   is_bool ? (void **)&job->mask_b : (void **)&job->mask_f, "attn_mask", err) != 0)
            return -1;
    }
    if (job->has_kpm && decode(job, &job->kpm, API_ELEM_BOOL, 0, (void **)&job->kpm_b,
                               "key_padding_mask", err) != 0)
        return -1;
    job->out = api_req_alloc(&job->rq, job->os.count * sizeof(float), err);
    if (!job->out)
        return -1;
    if (job->weights != ENG_WEIGHTS_NONE) {
        job->w_out = api_req_alloc(&job->rq, job->ws.count * sizeof(float), err);
        if (!job->w_out)
            return -1;
    }
    return 0;
}

/* The engine's argument names, in the request's words. */
static const char *request_field(const mha_job *job, const char *engine_field)
{
    static const char *const map[][2] = {
        {"key_padding", "key_padding_mask"},
        {"window_left", "window"},
        {"window_right", "window"},
        {"weights_mode", "return_weights"},
        {"alibi_slopes", "positional"},
        {"alibi", "positional"},
        {"out", "output"},
        {"q", "input"},
    };
    if (!engine_field[0])
        return NULL;
    if (strcmp(engine_field, "memory") == 0 || strcmp(engine_field, "k") == 0 ||
        strcmp(engine_field, "v") == 0)
        return job->has_key ? "key" : job->has_memory ? "memory" : "input";
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (strcmp(engine_field, map[i][0]) == 0)
            return map[i][1];
    return engine_field;
}

static const char *positional_name(eng_positional p)
{
    switch (p) {
    case ENG_POSITIONAL_SINUSOIDAL:
        return "sinusoidal";
    case ENG_POSITIONAL_ROPE:
        return "rope";
    case ENG_POSITIONAL_ALIBI:
        return "alibi";
    case ENG_POSITIONAL_NONE:
        break;
    }
    return "none";
}

static int encode_reply(mha_job *job, int64_t decode_ns, int64_t compute_ns, api_error *err)
{
    const eng_layer *l = job->layer;
    api_jsonw *w = &job->w;
    api_form form = reply_form(job);
    api_jsonw_char(w, '{');
    if (api_field_encode(w, "output", job->out, job->os.rank, job->os.shape, form, 0,
                         job->call->pool, err) != 0)
        return -1;
    if (job->weights != ENG_WEIGHTS_NONE) {
        api_jsonw_char(w, ',');
        if (api_field_encode(w, "weights", job->w_out, job->ws.rank, job->ws.shape, form, 0,
                             job->call->pool, err) != 0)
            return -1;
    }
    api_jsonw_cstr(w, ",\"meta\":{\"model\":");
    if (job->inline_layer)
        api_jsonw_cstr(w, "null");
    else
        api_jsonw_string(w, l->name, strlen(l->name));
    api_jsonw_printf(w,
                     ",\"batch\":%lld,\"query_len\":%lld,\"key_len\":%lld,\"keys_appended\":%lld,"
                     "\"embed_dim\":%lld,\"num_heads\":%lld,\"num_kv_heads\":%lld,"
                     "\"head_dim\":%lld,\"positional\":\"%s\",\"decode_ms\":%.3f,"
                     "\"compute_ms\":%.3f}}\n",
                     (long long)job->B, (long long)job->L, (long long)job->S,
                     (long long)(job->Sx - job->S), (long long)l->embed_dim,
                     (long long)l->num_heads, (long long)l->num_kv_heads,
                     (long long)(l->embed_dim / l->num_heads), positional_name(job->positional),
                     (double)decode_ns / 1e6, (double)compute_ns / 1e6);
    if (w->state != API_JSONW_OK)
        return api_field_writer_error(w, err);
    return 0;
}

static int run(mha_job *job, api_reply *reply, api_error *err)
{
    const api_call *call = job->call;
    api_req *rq = &job->rq;
    bool overflow = false;

    if (api_req_check_ctl(rq, err) != 0)
        return -1;
    if (!api_field_json_type(call->content_type))
        return api_error_set(err, 415, API_REASON_BAD_REQUEST, NULL,
                             "Content-Type \"%.80s\" is not supported; send application/json",
                             call->content_type);
    if (call->body_len > rq->limits.max_body_bytes)
        return api_error_set(err, 413, API_REASON_TOO_LARGE, NULL,
                             "the body has %zu bytes, more than the %zu that --max-body-bytes "
                             "allows",
                             call->body_len, rq->limits.max_body_bytes);
    if (api_req_parse(rq, call->body ? call->body : "", call->body_len, err) != 0 ||
        parse_fields(job, err) != 0)
        return -1;
    size_t in = input_count(job, &overflow);
    if (overflow || in > rq->limits.max_elements)
        return too_many(job, in, 0, overflow, err);
    api_req_set_deadline(rq, job->timeout_ms);
    if (find_layer(job, err) != 0 || check_shapes(job, err) != 0 || out_shapes(job, err) != 0)
        return -1;

    /* Size everything, reserve it, then allocate and decode. */
    float placeholder = 0;
    build_args(job, &placeholder);
    size_t tensors, text, need,
        scratch = eng_mha_scratch_bytes(&job->args, eng_pool_threads(call->pool));
    bool ok = estimate(job, &tensors, &text);
    need = tensors;
    ok = ok && add_size(&need, text) && add_size(&need, scratch);
    char what[160];
    snprintf(what, sizeof what, "%.1f MiB of tensors, %.1f MiB of reply, %.1f MiB of scratch",
             (double)tensors / 1048576.0, (double)text / 1048576.0, (double)scratch / 1048576.0);
    if (api_req_reserve(rq, ok ? need : SIZE_MAX, false, what, err) != 0)
        return -1;
    api_jsonw_init(&job->w, text);
    if (decode_inputs(job, err) != 0)
        return -1;
    api_req_parse_done(rq); /* the tree is no longer needed: give its memory back */
    build_args(job, &placeholder);
    int64_t t_decoded = eng_now_ns();
    reply->decode_ns = t_decoded - rq->call_ns;

    if (api_req_check_ctl(rq, err) != 0)
        return -1;
    eng_error e;
    memset(&e, 0, sizeof e);
    eng_status st = eng_mha(call->pool, &job->args, rq->ctl, &e);
    int64_t t_computed = eng_now_ns();
    reply->compute_ns = t_computed - t_decoded;
    if (st != ENG_OK)
        return api_req_engine_error(rq, st, &e, request_field(job, e.field), err);

    if (encode_reply(job, reply->decode_ns, reply->compute_ns, err) != 0)
        return -1;
    api_reply *r = reply;
    r->status = 200;
    r->content_type = "application/json";
    r->reason = API_REASON_NONE;
    r->body = job->w.data;
    r->body_len = job->w.len;
    job->w.data = NULL;
    r->encode_ns = eng_now_ns() - t_computed;
    return 0;
}

void api_mha(const api_call *call, api_reply *reply)
{
    mha_job *job = calloc(1, sizeof *job);
    api_error err;
    memset(&err, 0, sizeof err);
    memset(reply, 0, sizeof *reply);
    if (!job) {
        api_error_set(&err, 503, API_REASON_MEMORY, NULL, "out of memory");
        api_reply_from_error(reply, &err);
        return;
    }
    job->call = call;
    api_req_init(&job->rq, call);
    api_jsonw_init(&job->w, 0);

    if (run(job, reply, &err) != 0) {
        api_reply_from_error(reply, &err);
        if (reply->decode_ns == 0)
            reply->decode_ns = eng_now_ns() - job->rq.call_ns;
    }
    api_jsonw_free(&job->w);
    eng_layer_free(job->inline_layer);
    api_req_free(&job->rq);
    free(job);
}
