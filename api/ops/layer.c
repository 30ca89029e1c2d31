/*
 * layer.c - one path from a decoded layer request to eng_mha, for both wire formats.
 *
 * POST /v1/mha (native JSON) and POST /v2/models/{layer}/infer (KServe v2, JSON or binary
 * tensors) parse their own formats into the same api__layer_req: tensors probed but not
 * decoded, options with their defaults. From there everything is here, so both routes
 * validate, budget, decode and compute a layer request identically:
 *
 *   check         the options that conflict, the element limit over the inputs, the
 *                 deadline, the layer (registered, or built from inline weights), every
 *                 tensor against it, and the output shapes with the element limit over
 *                 inputs and outputs;
 *   bytes         what decoding and computing will allocate, for the budget (reserved by
 *                 the route together with its reply);
 *   decode        allocate and decode the inputs (raw float32 and bool tensors of the v2
 *                 binary extension are used where they lie in the body when aligned), and
 *                 allocate the outputs a route did not place in its reply;
 *   run           eng_mha, with the deadline and cancellation.
 *
 * A step of a session (r.session) goes the same way, with the session acquired at check and
 * its cache given to eng_mha (kv_cache): the new tokens' keys and values join it and the
 * queries attend over all of it.
 *
 * Messages name the request's fields (input, memory, key, value, attn_mask, key_padding_mask,
 * weights.*), which both formats share.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/core/memory.h"
#include "api/models/models.h"
#include "api/models/weights.h"
#include "api/ops/layer.h"
#include "api/ops/masks.h"
#include "api/wire/timeout.h"

/* ---- Sizes ------------------------------------------------------------------------------- */

static size_t weights_count(const api__layer_req *r, bool *overflow)
{
    size_t n = 0;
    for (size_t i = 0; i < r->n_weights; i++)
        *overflow |= !api__size_add(&n, r->wt[i].count);
    return n;
}

/* Elements of every input tensor, inline weights included. */
static size_t input_count(const api__layer_req *r, bool *overflow)
{
    size_t n = weights_count(r, overflow);
    const api__tensor *in[] = {&r->input, &r->memory, &r->key, &r->value, &r->mask, &r->kpm};
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++)
        *overflow |= !api__size_add(&n, in[i]->count); /* absent tensors count 0 */
    return n;
}

static int too_many(const api__layer *s, size_t in, size_t out, bool overflow, api__error *err)
{
    return api__error_set(err, API_STATUS_TOO_LARGE, API_REASON_TOO_LARGE, NULL,
                          "the request has %zu input (inline weights included) and %s%zu output "
                          "elements, more than the %zu that --max-elements allows",
                          in, overflow ? "over " : "", overflow ? SIZE_MAX : out,
                          s->rq->limits.max_elements);
}

/* ---- Options ----------------------------------------------------------------------------- */

/* The options that exclude each other, whatever the wire format. */
static int check_options(const api__layer_req *r, api__error *err)
{
    if (r->memory.present && (r->key.present || r->value.present))
        return api__error_invalid(err, r->key.present ? "key" : "value",
                                  "give memory (keys and values from the same tokens) or key and "
                                  "value, not both");
    if (r->key.present != r->value.present)
        return api__error_invalid(err, r->key.present ? "value" : "key",
                                  "key and value come together (or use memory)");
    if (r->offset_set && (r->causal == API_CAUSAL_TOP_LEFT || r->causal == API_CAUSAL_BOTTOM_RIGHT))
        return api__error_invalid(err, "query_offset",
                                  "query_offset conflicts with causal \"%s\", which sets the "
                                  "alignment itself; use causal: true with query_offset",
                                  r->causal == API_CAUSAL_TOP_LEFT ? "top_left" : "bottom_right");
    if ((r->rope_base_set || r->rope_style_set) && r->positional != ENG_POSITIONAL_ROPE)
        return api__error_invalid(err, r->rope_base_set ? "rope_base" : "rope_style",
                                  "%s applies only with positional \"rope\"",
                                  r->rope_base_set ? "rope_base" : "rope_style");
    return 0;
}

/* ---- The layer --------------------------------------------------------------------------- */

static int layer_error(eng_status st, const eng_error *e, api__error *err)
{
    char field[128];
    if (e->cause == ENG_CAUSE_HEAD_COUNT)
        snprintf(field, sizeof field, "%s", e->field);
    else if (e->field[0])
        snprintf(field, sizeof field, "weights.%s", e->field);
    else
        snprintf(field, sizeof field, "weights");
    /* The engine read the request's own weights: a malformed one is the client's. */
    return api__error_engine(err, st, e, field, API_ENGINE_INPUT_REQUEST);
}

/* Decodes the inline weights to float32 and builds the layer from them (their names give the
 * roles, models/weights.c; the engine checks that the shapes make one layer). */
static int build_inline_layer(api__layer *s, api__error *err)
{
    const api__layer_req *r = &s->r;
    eng_weight refs[API_LAYER_MAX_WEIGHTS];
    float *bufs[API_LAYER_MAX_WEIGHTS] = {0};
    bool overflow = false;
    size_t total = weights_count(r, &overflow), bytes = 0;
    char what[96];
    int rc = -1;

    if (r->num_heads == 0)
        return api__error_invalid(err, "num_heads",
                                  "num_heads is required with inline weights (the shapes do not "
                                  "say how many heads there are)");
    /* The decoded tensors, then the layer's own fp32 copy of them. */
    overflow |= __builtin_mul_overflow(total, (size_t)8, &bytes);
    bytes = overflow ? SIZE_MAX : bytes + (size_t)64 * r->n_weights;
    snprintf(what, sizeof what, "%.1f MiB of inline weights", (double)bytes / (1024.0 * 1024.0));
    if (api__req_reserve(s->rq, bytes, false, what, err) != 0)
        return -1;
    for (size_t i = 0; i < r->n_weights; i++) {
        const api__tensor *t = &r->wt[i];
        bufs[i] = api__aligned_alloc(t->count * sizeof(float));
        if (!bufs[i]) {
            api__error_set(err, API_STATUS_UNAVAILABLE, API_REASON_MEMORY, NULL,
                           "out of memory for %s", r->wt_field[i]);
            goto done;
        }
        if (api__tensor_decode(&s->rq->body, t, API_ELEM_FLOAT, 0, bufs[i], r->wt_field[i],
                               s->rq->call->pool, err) != 0)
            goto done;
        refs[i].label = r->wt_name[i];
        refs[i].dtype = ENG_DTYPE_F32;
        refs[i].data = bufs[i];
        refs[i].rank = t->rank;
        for (int d = 0; d < 4; d++)
            refs[i].shape[d] = d < t->rank ? t->shape[d] : 0;
    }
    eng_error e;
    eng_layer_weights roles;
    memset(&e, 0, sizeof e);
    if (api__weights_by_name(refs, r->n_weights, &roles, &e) == ENG_OK)
        s->inline_layer = eng_layer_new("inline", &roles, r->num_heads, r->num_kv_heads, false, &e);
    if (!s->inline_layer) {
        layer_error(e.status, &e, err);
        goto done;
    }
    s->layer = s->inline_layer;
    rc = 0;
done:
    for (size_t i = 0; i < r->n_weights; i++)
        free(bufs[i]);
    return rc;
}

/* Which of model m's layers the request runs: r.layer, which a model of several layers needs. */
static int pick_layer(api__layer *s, const api_model *m, api__error *err)
{
    const api__layer_req *r = &s->r;
    if (!r->layer_set && m->layers > 1)
        return api__error_invalid(err, "layer",
                                  "model \"%s\" has %lld layers: name the one to run with layer "
                                  "(0 to %lld)",
                                  m->name, (long long)m->layers, (long long)(m->layers - 1));
    if (r->layer_set && r->layer >= m->layers)
        return api__error_invalid(err, "layer",
                                  "layer is %lld but model \"%s\" has %lld layer%s (0 to %lld)",
                                  (long long)r->layer, m->name, (long long)m->layers,
                                  m->layers == 1 ? "" : "s", (long long)(m->layers - 1));
    s->index = r->layer_set ? r->layer : 0;
    s->layer = m->layer[s->index];
    return 0;
}

static int find_layer(api__layer *s, api__error *err)
{
    const api__layer_req *r = &s->r;
    const api_model *m = s->model;
    if (r->has_weights) {
        if (r->layer_set && r->layer > 0)
            return api__error_invalid(err, "layer",
                                      "layer is %lld but inline weights are one layer (0)",
                                      (long long)r->layer);
        return build_inline_layer(s, err);
    }
    if (!m) {
        /* A session made for a model names it when the step does not. */
        const char *name = r->model ? r->model : s->sess ? s->sess->model : "";
        if (!name[0] && s->sess)
            return api__error_invalid(err, "model",
                                      "session %s was created by its shape, not for a model: "
                                      "name the model (or give weights)",
                                      s->sess->id);
        m = s->rq->call->models ? api_models_find(s->rq->call->models, name) : NULL;
        if (!m)
            return api__error_set(err, API_STATUS_NOT_FOUND, API_REASON_BAD_REQUEST, "model",
                                  "no model \"%.64s\"; GET /v1/models lists them", name);
    }
    const eng_layer *l = m->layer[0]; /* the shape every layer shares */
    if (r->num_heads && r->num_heads != l->num_heads)
        return api__error_invalid(err, "num_heads",
                                  "num_heads is %lld but model \"%s\" has %lld heads; leave it out",
                                  (long long)r->num_heads, m->name, (long long)l->num_heads);
    if (r->num_kv_heads && r->num_kv_heads != l->num_kv_heads)
        return api__error_invalid(err, "num_kv_heads",
                                  "num_kv_heads is %lld but model \"%s\" has %lld; leave it out",
                                  (long long)r->num_kv_heads, m->name, (long long)l->num_kv_heads);
    s->model = m;
    return pick_layer(s, m, err);
}

/* A decoder layer (from a checkpoint) carries its positions, window and causality: a request
 * may restate them but not contradict them, and attends over its own tokens. */
static int decoder_fits(const api__layer *s, api__error *err)
{
    const api__layer_req *r = &s->r;
    const eng_layer *l = s->layer;
    if (!l->decoder)
        return 0;
    const char *field = r->positional_set && r->positional != ENG_POSITIONAL_NONE ? "positional"
                        : r->rope_base_set                                        ? "rope_base"
                        : r->rope_style_set                                       ? "rope_style"
                                                                                  : NULL;
    const api_model_about *about = s->model ? s->model->about : NULL;
    if (field)
        return api__error_invalid(err, field,
                                  "model \"%s\" runs layer %lld of a %s checkpoint, which has its "
                                  "own positions (%s): leave %s out",
                                  l->name, (long long)((about ? about->layer : 0) + s->index),
                                  about ? about->family : "decoder",
                                  l->spec.rope.rotary_dim ? "rope" : "none", field);
    /* Not given: a session's default (causal_default), which must not be false either. */
    bool off = r->causal == API_CAUSAL_OFF ||
               (r->causal == API_CAUSAL_UNSET && s->sess && s->sess->opts.causal_set &&
                s->sess->opts.causal == API_CAUSAL_OFF);
    if (off)
        return api__error_invalid(err, "causal",
                                  "model \"%s\" is a causal decoder layer: causal cannot be false",
                                  l->name);
    /* A session's window is its steps' unless a step gives its own (build_args). */
    const api__window *w =
        r->window.left_set || r->window.right_set || !s->sess ? &r->window : &s->sess->opts.window;
    int64_t left = l->spec.window > 0 ? l->spec.window - 1 : -1;
    bool differs = (w->left_set && w->left != left) ||
                   (!w->left_set && w->right_set && left >= 0) || (w->right_set && w->right != 0);
    if ((w->left_set || w->right_set) && differs)
        return api__error_invalid(err, "window",
                                  "model \"%s\" has %s%lld%s: a request cannot change its window",
                                  l->name, left >= 0 ? "window [" : "no window (",
                                  (long long)(left >= 0 ? left : 0), left >= 0 ? ", 0]" : ")");
    if (r->memory.present || r->key.present || r->add_zero_attn)
        return api__error_invalid(err,
                                  r->memory.present ? "memory"
                                  : r->key.present  ? "key"
                                                    : "add_zero_attn",
                                  "model \"%s\" is a decoder layer: it attends over its own "
                                  "input tokens",
                                  l->name);
    return 0;
}

/* ---- Shapes ------------------------------------------------------------------------------ */

/* A token tensor `t` ([n, width] or [B, n, width] after the input's rank) with the given
 * width; *n gets its length. */
static int check_tokens(const api__layer_req *r, const api__tensor *t, const char *name,
                        int64_t width, const char *width_name, int64_t *n, api__error *err)
{
    char ts[96], is[96];
    int rank = r->input.rank;
    api__tensor_shape_str(t, ts, sizeof ts);
    api__tensor_shape_str(&r->input, is, sizeof is);
    if (t->rank != rank)
        return api__error_invalid(err, name, "%s has shape %s but input has rank %d (%s)", name, ts,
                                  rank, is);
    if (rank == 3 && t->shape[0] != r->input.shape[0])
        return api__error_invalid(
            err, name, "%s %s and input %s differ in batch size (dimension 0)", name, ts, is);
    if (t->shape[rank - 1] != width)
        return api__error_invalid(err, name,
                                  "%s has shape %s; its last dimension must be the layer's %s "
                                  "(%lld)",
                                  name, ts, width_name, (long long)width);
    *n = t->shape[rank - 2];
    return 0;
}

static int check_shapes(api__layer *s, api__error *err)
{
    const api__layer_req *r = &s->r;
    const eng_layer *l = s->layer;
    const api__tensor *in = &r->input;
    char is[96];
    int64_t H = l->num_heads;
    api__tensor_shape_str(in, is, sizeof is);
    if (in->rank != 2 && in->rank != 3)
        return api__error_invalid(err, "input",
                                  "input has shape %s; it must be [L, E] or [B, L, E]", is);
    if (in->dtype == API_DTYPE_BOOL)
        return api__error_invalid(err, "input", "input must hold numbers");
    s->B = in->rank == 3 ? in->shape[0] : 1;
    s->L = in->shape[in->rank - 2];
    if (in->shape[in->rank - 1] != l->embed_dim)
        return api__error_invalid(err, "input",
                                  "input has shape %s; its last dimension must be the layer's "
                                  "embed_dim (%lld)",
                                  is, (long long)l->embed_dim);
    if (r->memory.present) {
        if (l->kdim != l->vdim)
            return api__error_invalid(err, "memory",
                                      "the layer has kdim %lld and vdim %lld: give key and value "
                                      "separately instead of memory",
                                      (long long)l->kdim, (long long)l->vdim);
        if (check_tokens(r, &r->memory, "memory", l->kdim, "kdim", &s->S, err) != 0)
            return -1;
    } else if (r->key.present) {
        int64_t Sv = 0;
        if (check_tokens(r, &r->key, "key", l->kdim, "kdim", &s->S, err) != 0 ||
            check_tokens(r, &r->value, "value", l->vdim, "vdim", &Sv, err) != 0)
            return -1;
        if (Sv != s->S)
            return api__error_invalid(err, "value", "value has %lld tokens but key %lld",
                                      (long long)Sv, (long long)s->S);
    } else {
        if (l->kdim != l->embed_dim || l->vdim != l->embed_dim)
            return api__error_invalid(err, "memory",
                                      "the layer has kdim %lld and vdim %lld (embed_dim %lld): it "
                                      "attends over other tokens; give memory (or key and value)",
                                      (long long)l->kdim, (long long)l->vdim,
                                      (long long)l->embed_dim);
        s->S = s->L;
    }
    if (r->memory.present || r->key.present) {
        const api__tensor *m = r->memory.present ? &r->memory : &r->key;
        const api__tensor *ts[2] = {m, r->key.present ? &r->value : NULL};
        for (int i = 0; i < 2; i++)
            if (ts[i] && ts[i]->dtype == API_DTYPE_BOOL)
                return api__error_invalid(
                    err, i == 0 ? (r->memory.present ? "memory" : "key") : "value",
                    "%s must hold numbers",
                    i == 0 ? (r->memory.present ? "memory" : "key") : "value");
    }
    if (r->mask.present && api__mask_check_attn(&r->mask, s->B, H, s->L, s->S, err) != 0)
        return -1;
    if (r->kpm.present && api__mask_check_key_padding(&r->kpm, s->B, s->S, err) != 0)
        return -1;
    return 0;
}

/* ---- A step of a session ------------------------------------------------------------------ */

/* The session against the layer: made for it, or of its shape, and with no step default that
 * a layer does not take. */
static int session_fits_layer(const api__layer *s, api__error *err)
{
    const api__session *ss = s->sess;
    const eng_layer *l = s->layer;
    int64_t D = eng_layer_head_dim(l);
    if (ss->model[0] && (s->inline_layer || strcmp(ss->model, l->name) != 0))
        return api__error_invalid(
            err, "session", "session %s is the KV cache of model \"%s\", not of %s%s%s", ss->id,
            ss->model, s->inline_layer ? "inline weights" : "model \"",
            s->inline_layer ? "" : l->name, s->inline_layer ? "" : "\"");
    if (ss->layers != (s->model ? s->model->layers : 1))
        return api__error_invalid(
            err, "session",
            "session %s holds the caches of %lld layer%s, but model \"%s\" has %lld: create the "
            "session with \"model\"",
            ss->id, (long long)ss->layers, ss->layers == 1 ? "" : "s", l->name,
            (long long)(s->model ? s->model->layers : 1));
    if (ss->num_heads != l->num_heads || ss->shape.num_kv_heads != l->num_kv_heads ||
        ss->shape.head_dim != D || ss->shape.value_head_dim != D)
        return api__error_invalid(
            err, "session",
            "session %s has %lld heads over %lld kv heads of %lld (values of %lld), but the "
            "layer has %lld over %lld of %lld: create the session with \"model\"",
            ss->id, (long long)ss->num_heads, (long long)ss->shape.num_kv_heads,
            (long long)ss->shape.head_dim, (long long)ss->shape.value_head_dim,
            (long long)l->num_heads, (long long)l->num_kv_heads, (long long)D);
    const char *opt = ss->opts.scale_set     ? "scale"
                      : ss->opts.softcap > 0 ? "softcap"
                      : ss->opts.alibi       ? "alibi"
                                             : NULL;
    if (opt)
        return api__error_invalid(err, "session",
                                  "session %s gives its steps a %s, which a layer step does not "
                                  "take",
                                  ss->id, opt);
    return api__layer_cache_check(l, "model", err);
}

/* A session's keys were cached with its first step's positions: a step that gives no positional
 * settings takes them, one that gives others is refused (its keys would be turned otherwise
 * than the cached ones, and its queries would meet those at the wrong angles). */
static int session_positions(api__layer *s, api__error *err)
{
    api__layer_req *r = &s->r;
    const api__session_positions *p = &s->sess->positions;
    if (!p->set)
        return 0;
    if (!r->positional_set && !r->rope_base_set && !r->rope_style_set) {
        r->positional = p->positional;
        r->rope_base_set = p->rope_base > 0;
        r->rope_base = p->rope_base;
        r->rope_style = p->rope_style;
        return 0;
    }
    bool rope = p->positional == ENG_POSITIONAL_ROPE;
    const char *other = r->positional != p->positional ? "positional"
                        : rope && (r->rope_base_set ? r->rope_base : 0) != p->rope_base
                            ? "rope_base"
                        : rope && r->rope_style != p->rope_style ? "rope_style"
                                                                 : NULL;
    if (other)
        return api__error_invalid(err, other,
                                  "session %s holds keys with positional \"%s\" (from its first "
                                  "step); a step cannot change its session's positions: give "
                                  "the same ones or none",
                                  s->sess->id, api__layer_positional_name(p->positional));
    return 0;
}

/* After a session's first successful step: the positions its keys were cached with. */
static void session_positions_keep(api__layer *s)
{
    api__session_positions *p = &s->sess->positions;
    if (p->set)
        return;
    p->positional = s->r.positional;
    p->rope_base = s->r.rope_base_set ? s->r.rope_base : 0;
    p->rope_style = s->r.rope_style;
    p->set = true;
}

/* What a step of one sequence over its cache cannot take, then the session's length: 409
 * expect_length, 413 max_tokens. Sets S to the keys the queries attend (cache and new). */
static int session_check(api__layer *s, api__error *err)
{
    const api__layer_req *r = &s->r;
    const api__session *ss = s->sess;
    const char *none = r->memory.present ? "memory"
                       : r->key.present  ? "key"
                       : r->mask.present ? "attn_mask"
                       : r->kpm.present  ? "key_padding_mask"
                       : r->offset_set   ? "query_offset"
                                         : NULL;
    if (session_fits_layer(s, err) != 0)
        return -1;
    if (s->B != 1)
        return api__error_invalid(err, "input",
                                  "a session is one sequence: input must be [L, E] or [1, L, E], "
                                  "not a batch of %lld",
                                  (long long)s->B);
    if (none)
        return api__error_invalid(err, none,
                                  "a step of session %s takes no %s: its tokens attend to "
                                  "themselves and the session's cache, at its end",
                                  ss->id, none);
    if (r->add_zero_attn)
        return api__error_invalid(err, "add_zero_attn",
                                  "add_zero_attn appends a key to every step's inputs, which a "
                                  "step of a KV cache cannot");
    if (r->causal == API_CAUSAL_TOP_LEFT)
        return api__error_invalid(err, "causal",
                                  "the new tokens of a session step are its last positions: "
                                  "causal is bottom_right (true) or false, not top_left");
    int64_t length;
    if (api__session_check_append(ss, s->index, r->expect_set, r->expect_length, s->L, "input",
                                  &length, err) != 0)
        return -1;
    s->S = length + s->L;
    return 0;
}

/* ---- Options ---------------------------------------------------------------------------- */

static int o_layer(void *req, const json_t *v, const char *name, api__error *err)
{
    api__layer_req *r = req;
    r->layer_set = true;
    return api__option_int(v, name, 0, API_LAYER_MAX, &r->layer, err);
}

static int o_causal(void *req, const json_t *v, const char *name, api__error *err)
{
    return api__option_causal(v, name, &((api__layer_req *)req)->causal, err);
}

static int o_query_offset(void *req, const json_t *v, const char *name, api__error *err)
{
    api__layer_req *r = req;
    r->offset_set = true;
    return api__option_int(v, name, -API_QUERY_OFFSET_MAX, API_QUERY_OFFSET_MAX, &r->query_offset,
                           err);
}

static int o_positional(void *req, const json_t *v, const char *name, api__error *err)
{
    api__layer_req *r = req;
    r->positional_set = !json_is_null(v);
    return api__option_positional(v, name, &r->positional, err);
}

static int o_rope_base(void *req, const json_t *v, const char *name, api__error *err)
{
    api__layer_req *r = req;
    return api__option_rope_base(v, name, &r->rope_base_set, &r->rope_base, err);
}

static int o_rope_style(void *req, const json_t *v, const char *name, api__error *err)
{
    api__layer_req *r = req;
    return api__option_rope_style(v, name, &r->rope_style_set, &r->rope_style, err);
}

static int o_add_zero_attn(void *req, const json_t *v, const char *name, api__error *err)
{
    return api__option_bool(v, name, &((api__layer_req *)req)->add_zero_attn, err);
}

static int o_precision(void *req, const json_t *v, const char *name, api__error *err)
{
    api__layer_req *r = req;
    r->precision_set = true;
    return api__option_precision(v, name, &r->precision, err);
}

static int o_timeout_ms(void *req, const json_t *v, const char *name, api__error *err)
{
    return api__option_int(v, name, 1, API_TIMEOUT_MS_MAX, &((api__layer_req *)req)->timeout_ms,
                           err);
}

const api__option_def api__layer_options[] = {
    {"layer", o_layer},
    {"causal", o_causal},
    {"query_offset", o_query_offset},
    {"positional", o_positional},
    {"rope_base", o_rope_base},
    {"rope_style", o_rope_style},
    {"add_zero_attn", o_add_zero_attn},
    {"precision", o_precision},
    {"timeout_ms", o_timeout_ms},
};
const size_t api__layer_n_options = sizeof api__layer_options / sizeof api__layer_options[0];

/* Fills s->args from the checked request, once, with a placeholder for every buffer (enough
 * for eng_mha_scratch_bytes and eng_mha_extra_keys); bind_buffers points them at the decoded
 * buffers. */
static void build_args(api__layer *s)
{
    const api__layer_req *r = &s->r;
    eng_mha_args *a = &s->args;
    float *ph = &s->placeholder;
    bool cross = r->memory.present || r->key.present;
    memset(a, 0, sizeof *a);
    a->layer = s->layer;
    a->B = s->B;
    a->L = s->L;
    a->x = ph;
    a->S = s->S;
    if (cross) {
        a->key_in = ph;
        a->value_in = ph;
    }
    a->out = ph;
    a->causal = r->causal != API_CAUSAL_OFF;
    if (r->offset_set) {
        a->align = ENG_ALIGN_OFFSET;
        a->query_offset = r->query_offset;
    } else {
        a->align = r->causal == API_CAUSAL_BOTTOM_RIGHT || s->sess ? ENG_ALIGN_BOTTOM_RIGHT
                                                                   : ENG_ALIGN_TOP_LEFT;
    }
    /* A session's window and precision are its steps' unless a step gives its own. */
    const api__window *w =
        r->window.left_set || r->window.right_set || !s->sess ? &r->window : &s->sess->opts.window;
    a->window_left_set = w->left_set;
    a->window_left = w->left;
    a->window_right_set = w->right_set;
    a->window_right = w->right;
    if (r->kpm.present) {
        a->key_padding = (const uint8_t *)ph;
        a->key_padding_stride = r->kpm.rank == 2 ? s->S : 0;
    }
    if (r->mask.present)
        a->attn_mask = api__mask_view(&r->mask, ph);
    a->add_zero_attn = r->add_zero_attn;
    a->positional = r->positional;
    a->rope_base = r->rope_base_set ? r->rope_base : 0.0f;
    a->rope_style = r->rope_style;
    a->weights_mode = r->weights;
    a->weights = r->weights != ENG_WEIGHTS_NONE ? ph : NULL;
    a->precision = r->precision_set                         ? r->precision
                   : s->sess && s->sess->opts.precision_set ? s->sess->opts.precision
                                                            : s->rq->limits.default_precision;
    a->kv_cache = s->sess ? s->sess->cache[s->index].seq : NULL;
}

/* Points the engine arguments at the decoded buffers in place of build_args' placeholders. */
static void bind_buffers(api__layer *s)
{
    const api__layer_req *r = &s->r;
    eng_mha_args *a = &s->args;
    a->x = s->x;
    if (a->key_in) {
        a->key_in = s->k_in;
        a->value_in = s->v_in;
    }
    a->out = s->out;
    if (r->kpm.present)
        a->key_padding = s->kpm;
    if (r->mask.present)
        a->attn_mask.data =
            r->mask.dtype == API_DTYPE_BOOL ? (const void *)s->mask_b : (const void *)s->mask_f;
    if (a->weights)
        a->weights = s->weights;
}

/* The output shapes (rank after the input's; a rank-2 input drops B) and the element limit
 * over inputs and outputs. */
static int out_shapes(api__layer *s, api__error *err)
{
    const api__layer_req *r = &s->r;
    const eng_layer *l = s->layer;
    bool overflow = false, drop = r->input.rank == 2;
    size_t in = input_count(r, &overflow), out = 0;
    int64_t H = l->num_heads;
    build_args(s);
    s->Sx = s->S + eng_mha_extra_keys(&s->args);
    s->os = (api__out_shape){3, {s->B, s->L, l->embed_dim}, 0};
    if (r->weights == ENG_WEIGHTS_PER_HEAD)
        s->ws = (api__out_shape){4, {s->B, H, s->L, s->Sx}, 0};
    else
        s->ws = (api__out_shape){3, {s->B, s->L, s->Sx}, 0};
    api__out_shape *all[2] = {&s->os, &s->ws};
    for (int i = 0; i < 2; i++) {
        api__out_shape *o = all[i];
        size_t c = 1;
        if (drop) {
            o->rank--;
            memmove(o->shape, o->shape + 1, sizeof o->shape - sizeof o->shape[0]);
        }
        for (int d = 0; d < o->rank; d++)
            overflow |= __builtin_mul_overflow(c, (size_t)o->shape[d], &c);
        o->count = c;
    }
    overflow |= !api__size_add(&out, s->os.count);
    if (r->weights != ENG_WEIGHTS_NONE)
        overflow |= !api__size_add(&out, s->ws.count);
    size_t total = in;
    overflow |= !api__size_add(&total, out);
    if (overflow || total > s->rq->limits.max_elements)
        return too_many(s, in, out, overflow, err);
    return 0;
}

/* Not given: off (causal for a decoder layer), or over a session its default (bottom-right
 * unless it says otherwise). */
static api__causal causal_default(const api__layer *s)
{
    if (!s->sess)
        return s->layer && s->layer->decoder ? API_CAUSAL_ON : API_CAUSAL_OFF;
    return s->sess->opts.causal_set ? s->sess->opts.causal : API_CAUSAL_ON;
}

static int layer_check(void *op, api__error *err)
{
    api__layer *s = op;
    bool overflow = false;
    if (check_options(&s->r, err) != 0)
        return -1;
    size_t in = input_count(&s->r, &overflow);
    if (overflow || in > s->rq->limits.max_elements)
        return too_many(s, in, 0, overflow, err);
    api__req_set_deadline(s->rq, s->r.timeout_ms);
    if (s->r.session &&
        (api__session_acquire(s->rq->call->sessions, s->r.session, &s->sess, err) != 0 ||
         session_positions(s, err) != 0))
        return -1;
    if (find_layer(s, err) != 0 || decoder_fits(s, err) != 0)
        return -1;
    if (s->r.causal == API_CAUSAL_UNSET)
        s->r.causal = causal_default(s);
    if (check_shapes(s, err) != 0 || (s->sess && session_check(s, err) != 0) ||
        out_shapes(s, err) != 0)
        return -1;
    return 0;
}

/* ---- Memory and decoding ----------------------------------------------------------------- */

enum { N_INPUTS = 6 };

/* Every input a request may have, in decoding order: what it decodes to, and where. */
static void input_defs(api__layer *s, api__input in[N_INPUTS])
{
    api__layer_req *r = &s->r;
    bool mask_bool = r->mask.dtype == API_DTYPE_BOOL;
    const api__input defs[N_INPUTS] = {
        {&r->input, true, API_ELEM_FLOAT, 0, (void **)&s->x, "input"},
        {&r->memory, r->memory.present, API_ELEM_FLOAT, 0, (void **)&s->k_in, "memory"},
        {&r->key, r->key.present, API_ELEM_FLOAT, 0, (void **)&s->k_in, "key"},
        {&r->value, r->value.present, API_ELEM_FLOAT, 0, (void **)&s->v_in, "value"},
        {&r->mask, r->mask.present, mask_bool ? API_ELEM_BOOL : API_ELEM_FLOAT,
         mask_bool ? 0 : API_DECODE_NEG_INF, mask_bool ? (void **)&s->mask_b : (void **)&s->mask_f,
         "attn_mask"},
        {&r->kpm, r->kpm.present, API_ELEM_BOOL, 0, (void **)&s->kpm, "key_padding_mask"},
    };
    memcpy(in, defs, sizeof defs);
}

static bool layer_size(void *op, api__sizes *sz)
{
    api__layer *s = op;
    api__input in[N_INPUTS];
    input_defs(s, in);
    bool ok = api__input_bytes(in, N_INPUTS, &sz->tensors);
    return ok && api__size_add(&sz->scratch, eng_mha_scratch_bytes(
                                                 &s->args, eng_pool_threads(s->rq->call->pool)));
}

static int layer_decode(void *op, api__error *err)
{
    api__layer *s = op;
    api__input in[N_INPUTS];
    input_defs(s, in);
    for (size_t i = 0; i < N_INPUTS; i++)
        if (in[i].present && api__req_decode_input(s->rq, &in[i], err) != 0)
            return -1;
    if (s->r.memory.present)
        s->v_in = s->k_in; /* keys and values from the same tokens */
    if (api__req_alloc_output(s->rq, &s->out, s->os.count, err) != 0 ||
        (s->r.weights != ENG_WEIGHTS_NONE &&
         api__req_alloc_output(s->rq, &s->weights, s->ws.count, err) != 0))
        return -1;
    /* The tree is no longer needed: give its memory back before the long part. */
    api__req_parse_done(s->rq);
    bind_buffers(s);
    return 0;
}

/* ---- The call ---------------------------------------------------------------------------- */

/* The engine's argument names, in the request's words. */
static const char *request_field(const api__layer_req *r, const char *engine_field)
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
        {"kv_cache", "session"},
        {"align", "causal"},
    };
    if (!engine_field[0])
        return NULL;
    if (strcmp(engine_field, "memory") == 0 || strcmp(engine_field, "k") == 0 ||
        strcmp(engine_field, "v") == 0)
        return r->key.present ? "key" : r->memory.present ? "memory" : "input";
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (strcmp(engine_field, map[i][0]) == 0)
            return map[i][1];
    return engine_field;
}

static eng_status layer_engine(void *op, eng_error *e)
{
    api__layer *s = op;
    return eng_mha(s->rq->call->pool, &s->args, &s->rq->lease->ctl, e);
}

/* The end of a run whose engine call returned `st`: a session's new length and positions, or
 * the error in the request's words. */
static int run_result(api__layer *s, eng_status st, const eng_error *e, api__error *err)
{
    api_sessions *reg = s->rq->call->sessions;
    if (s->sess)
        s->length = eng_kv_seq_length(s->args.kv_cache);
    if (st == ENG_OK && s->sess)
        session_positions_keep(s);
    if (st == ENG_OK)
        return 0;
    if (s->sess && api__session_too_long(reg, s->sess, st, e, "input", err))
        return -1;
    return api__req_engine_error(s->rq, st, e, request_field(&s->r, e->field), err);
}

static int layer_run(void *op, int64_t *compute_ns, api__error *err)
{
    api__layer *s = op;
    api_sessions *reg = s->rq->call->sessions;
    eng_error e;
    eng_status st;
    if (api__req_check_ctl(s->rq, err) != 0)
        return -1;
    memset(&e, 0, sizeof e);
    int64_t t0 = eng_now_ns();
    int fail = 0;
    if (s->sess) /* the pool may need room for the new tokens' keys and values */
        fail = api__session_with_room(reg, s->sess, eng_kv_seq_append_bytes(s->args.kv_cache, s->L),
                                      layer_engine, s, &st, &e, err);
    else
        st = layer_engine(s, &e);
    *compute_ns = eng_now_ns() - t0;
    if (fail)
        return -1;
    return run_result(s, st, &e, err);
}

/* A pass that may share an engine call: one over a registered layer (an inline one is the
 * request's own). */
static const void *layer_batch_key(const void *op, int64_t *rows)
{
    const api__layer *s = op;
    *rows = s->B * s->L;
    return s->inline_layer ? NULL : s->layer;
}

/* Whether session `sess` already steps in members[0..n) (a step of it must see the one before
 * it: the later one runs alone, after the batch). */
static bool steps_already(api__layer *const *members, int n, const api__session *sess)
{
    for (int i = 0; sess && i < n; i++)
        if (members[i]->sess == sess)
            return true;
    return false;
}

/* The passes of one layer as one engine call. A member whose cache pool was full runs again
 * alone, where api__session_with_room can make room for it. */
static void layer_run_batch(void *const *ops, int n, int64_t *compute_ns, int *rc, api__error *errs)
{
    api__layer **in = calloc((size_t)n, sizeof *in);
    eng_mha_member *m = calloc((size_t)n, sizeof *m);
    eng_error *e = calloc((size_t)n, sizeof *e);
    int *at = calloc((size_t)n, sizeof *at), k = 0;
    bool *alone = calloc((size_t)n, sizeof *alone);
    if (!in || !m || !e || !at || !alone) {
        for (int i = 0; i < n; i++)
            rc[i] = layer_run(ops[i], &compute_ns[i], &errs[i]);
        goto done;
    }
    for (int i = 0; i < n; i++) {
        api__layer *s = ops[i];
        rc[i] = api__req_check_ctl(s->rq, &errs[i]);
        alone[i] = rc[i] == 0 && steps_already(in, k, s->sess);
        if (rc[i] != 0 || alone[i])
            continue;
        in[k] = s;
        at[k] = i;
        m[k] = (eng_mha_member){.args = &s->args, .ctl = &s->rq->lease->ctl, .err = &e[k]};
        k++;
    }
    int64_t t0 = eng_now_ns();
    if (k > 0)
        eng_mha_batch(in[0]->rq->call->pool, m, k);
    int64_t took = eng_now_ns() - t0;
    for (int j = 0; j < k; j++) {
        int i = at[j];
        compute_ns[i] = took;
        alone[i] =
            in[j]->sess && m[j].status == ENG_ENOMEM && e[j].cause == ENG_CAUSE_KV_CACHE_FULL;
        if (!alone[i])
            rc[i] = run_result(in[j], m[j].status, &e[j], &errs[i]);
    }
    for (int i = 0; i < n; i++)
        if (alone[i])
            rc[i] = layer_run(ops[i], &compute_ns[i], &errs[i]);
done:
    free(in);
    free(m);
    free(e);
    free(at);
    free(alone);
}

static void layer_free(void *op)
{
    api__layer *s = op;
    eng_layer_free(s->inline_layer);
    s->inline_layer = NULL;
    if (s->sess)
        api__session_release(s->rq->call->sessions, s->sess);
    s->sess = NULL;
}

bool api__layer_steps_a_cache(const eng_layer *l)
{
    return l->kdim == l->embed_dim && l->vdim == l->embed_dim && !l->bias_k;
}

int api__layer_cache_check(const eng_layer *l, const char *field, api__error *err)
{
    if (api__layer_steps_a_cache(l))
        return 0;
    if (l->bias_k)
        return api__error_invalid(err, field,
                                  "model \"%s\" cannot keep a KV cache of its own tokens: it "
                                  "appends bias_k/bias_v keys (add_bias_kv) to every input",
                                  l->name);
    return api__error_invalid(err, field,
                              "model \"%s\" cannot keep a KV cache of its own tokens: it attends "
                              "over other tokens (kdim %lld, vdim %lld, embed_dim %lld)",
                              l->name, (long long)l->kdim, (long long)l->vdim,
                              (long long)l->embed_dim);
}

const char *api__layer_positional_name(eng_positional p)
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

/* ---- The operation ------------------------------------------------------------------------ */

static const api__out_shape *layer_output(void *op, int o, float ***slot)
{
    api__layer *s = op;
    float **data = NULL;
    const api__out_shape *shape = NULL;
    if (o == API__OUT_OUTPUT) {
        data = &s->out;
        shape = &s->os;
    } else if (o == API__OUT_WEIGHTS && s->r.weights != ENG_WEIGHTS_NONE) {
        data = &s->weights;
        shape = &s->ws;
    }
    if (slot)
        *slot = data;
    return shape;
}

static int64_t layer_batch(const void *op)
{
    return ((const api__layer *)op)->B;
}

static eng_precision layer_precision(const void *op)
{
    return eng_mha_precision(&((const api__layer *)op)->args);
}

const api__op api__layer_op = {
    .steps = {.check = layer_check,
              .size = layer_size,
              .decode = layer_decode,
              .run = layer_run,
              .batch = layer_batch,
              .free = layer_free},
    .output = layer_output,
    .precision = layer_precision,
    .batch_key = layer_batch_key,
    .run_batch = layer_run_batch,
};
