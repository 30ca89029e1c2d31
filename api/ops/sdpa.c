/*
 * sdpa.c - one path from a decoded attention request to eng_sdpa, for both wire formats.
 *
 * POST /v1/attention (native JSON) and POST /v2/models/sdpa/infer (KServe v2, JSON or binary
 * tensors) parse their own formats into the same api__sdpa_req: tensors probed but not decoded,
 * options with their defaults. From there everything is here, so both routes validate, budget,
 * decode and compute a request identically:
 *
 *   check        derive B, H, Hkv, L, S, D, Dv from the ranks (docs/semantics.md, "Shapes
 *                and heads"), check every tensor against them, the element limit over
 *                inputs and outputs, the deadline, and the output shapes;
 *   bytes        what decoding and computing will allocate, for the budget (reserved by
 *                the route together with its reply);
 *   decode       allocate and decode the inputs (raw float32 and bool tensors of the v2
 *                binary extension are used where they lie in the body when aligned), and
 *                allocate the outputs a route did not place in its reply;
 *                with bfloat16 precision, bfloat16 query, key and value (base64 dtype
 *                "bfloat16", v2 BF16 binary) stay bfloat16: raw ones are used where they lie,
 *                base64 ones decoded into 2-byte buffers, and eng_sdpa reads them as they are
 *                (bit for bit what their float32 copy gave). A float32-precision request, an
 *                additive one or one on the openblas set (both compute float32) keeps the
 *                float32 copy, as does key/value when only one of the two is bfloat16;
 *   run          eng_sdpa, with the deadline and cancellation.
 *
 * Rank 2 and 3 tensors are handed to the engine as strided views of the decoded buffers
 * ([B, L, H, D] memory seen as [B, H, L, D]): no head is ever copied.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/core/memory.h"
#include "api/ops/masks.h"
#include "api/ops/sdpa.h"
#include "api/wire/timeout.h"

/* ---- Shapes ------------------------------------------------------------------------------ */

/* Splits a width E into `heads` heads: D = E / heads, or an error naming both fields. */
static int split_heads(int64_t width, int64_t heads, const char *tensor, const char *heads_name,
                       int64_t *d, api__error *err)
{
    if (width % heads != 0)
        return api__error_invalid(err, heads_name,
                                  "the width of %s (%lld) is not a multiple of %s (%lld)", tensor,
                                  (long long)width, heads_name, (long long)heads);
    *d = width / heads;
    return 0;
}

/* Derives B, H, Hkv, L, S, D, Dv and checks that every tensor fits them. */
static int check_shapes(api__sdpa_req *r, api__error *err)
{
    char qs[96], ks[96], vs[96], ms[96];
    const api__tensor *q = &r->q, *k = &r->k, *v = &r->v;
    int rank = q->rank;
    if (rank < 2 || rank > 4)
        return api__error_invalid(
            err, "query", "query has shape %s; it must be [L, E], [B, L, E] or [B, H, L, D]",
            api__tensor_shape_str(q, qs, sizeof qs));
    if (k->rank != rank || v->rank != rank) {
        const char *which = k->rank != rank ? "key" : "value";
        return api__error_invalid(err, which,
                                  "%s has rank %d but query has rank %d; query, key and value "
                                  "share one layout",
                                  which, (k->rank != rank ? k : v)->rank, rank);
    }
    api__tensor_shape_str(q, qs, sizeof qs);
    api__tensor_shape_str(k, ks, sizeof ks);
    api__tensor_shape_str(v, vs, sizeof vs);

    int64_t Dk = 0;
    if (rank == 4) {
        r->B = q->shape[0];
        r->H = q->shape[1];
        r->L = q->shape[2];
        r->D = q->shape[3];
        r->Hkv = k->shape[1];
        r->S = k->shape[2];
        Dk = k->shape[3];
        r->Dv = v->shape[3];
        if (r->num_heads && r->num_heads != r->H)
            return api__error_invalid(err, "num_heads",
                                      "num_heads is %lld but query %s has %lld heads (dimension 1)",
                                      (long long)r->num_heads, qs, (long long)r->H);
        if (r->num_kv_heads && r->num_kv_heads != r->Hkv)
            return api__error_invalid(
                err, "num_kv_heads", "num_kv_heads is %lld but key %s has %lld heads (dimension 1)",
                (long long)r->num_kv_heads, ks, (long long)r->Hkv);
        if (v->shape[1] != r->Hkv)
            return api__error_invalid(err, "value",
                                      "value %s and key %s differ in heads (dimension 1)", vs, ks);
    } else {
        r->B = rank == 3 ? q->shape[0] : 1;
        r->L = q->shape[rank - 2];
        r->S = k->shape[rank - 2];
        r->H = r->num_heads ? r->num_heads : 1;
        r->Hkv = r->num_kv_heads ? r->num_kv_heads : r->H;
        if (split_heads(q->shape[rank - 1], r->H, "query", "num_heads", &r->D, err) != 0 ||
            split_heads(k->shape[rank - 1], r->Hkv, "key", "num_kv_heads", &Dk, err) != 0 ||
            split_heads(v->shape[rank - 1], r->Hkv, "value", "num_kv_heads", &r->Dv, err) != 0)
            return -1;
    }
    if (k->shape[0] != q->shape[0] && rank >= 3)
        return api__error_invalid(err, "key",
                                  "key %s and query %s differ in batch size (dimension 0)", ks, qs);
    if (v->shape[0] != q->shape[0] && rank >= 3)
        return api__error_invalid(
            err, "value", "value %s and query %s differ in batch size (dimension 0)", vs, qs);
    if (v->shape[rank - 2] != r->S)
        return api__error_invalid(
            err, "value", "value %s and key %s differ in length (dimension %d)", vs, ks, rank - 2);
    if (r->H % r->Hkv != 0)
        return api__error_invalid(err, rank == 4 ? "key" : "num_kv_heads",
                                  "%lld query heads cannot be shared among %lld key/value heads: "
                                  "H must be a multiple of Hkv",
                                  (long long)r->H, (long long)r->Hkv);
    if (Dk != r->D)
        return api__error_invalid(err, "key",
                                  "key heads have size %lld but query heads %lld (key %s, query "
                                  "%s)",
                                  (long long)Dk, (long long)r->D, ks, qs);

    if (r->mask.present && api__mask_check_attn(&r->mask, r->B, r->H, r->L, r->S, err) != 0)
        return -1;
    if (r->kpm.present && api__mask_check_key_padding(&r->kpm, r->B, r->S, err) != 0)
        return -1;
    if (r->kvlen.present && !(r->kvlen.rank == 1 && r->kvlen.shape[0] == r->B))
        return api__error_invalid(err, "kv_lengths",
                                  "kv_lengths has shape %s; it must be [B] = [%lld]",
                                  api__tensor_shape_str(&r->kvlen, ms, sizeof ms), (long long)r->B);
    if (r->slopes.present && !(r->slopes.rank == 1 && r->slopes.shape[0] == r->H))
        return api__error_invalid(err, "alibi",
                                  "alibi has shape %s; explicit slopes are one per query head: "
                                  "[%lld]",
                                  api__tensor_shape_str(&r->slopes, ms, sizeof ms),
                                  (long long)r->H);
    if (r->sinks.present && api__sinks_check(&r->sinks, r->H, r->weights, err) != 0)
        return -1;
    if (r->additive != r->has_additive_weights)
        return api__error_invalid(err, "additive_weights", "%s",
                                  r->additive
                                      ? "score \"additive\" needs additive_weights {\"w_q\": [A, "
                                        "D], \"w_k\": [A, D], \"w\": [A]}"
                                      : "additive_weights are given but score is not \"additive\"");
    if (r->additive) {
        int64_t A = r->ww.shape[0];
        if (r->scale_set)
            return api__error_invalid(err, "scale",
                                      "additive scoring applies no scale; leave scale out");
        if (r->ww.rank != 1)
            return api__error_invalid(err, "additive_weights.w",
                                      "additive_weights.w has shape %s; it must be [A]",
                                      api__tensor_shape_str(&r->ww, ms, sizeof ms));
        const api__tensor *w2[2] = {&r->wq, &r->wk};
        const char *w2name[2] = {"additive_weights.w_q", "additive_weights.w_k"};
        for (int i = 0; i < 2; i++)
            if (!(w2[i]->rank == 2 && w2[i]->shape[0] == A && w2[i]->shape[1] == r->D))
                return api__error_invalid(
                    err, w2name[i], "%s has shape %s; it must be [A, D] = [%lld, %lld]", w2name[i],
                    api__tensor_shape_str(w2[i], ms, sizeof ms), (long long)A, (long long)r->D);
    }
    if (r->offset_set && (r->causal == API_CAUSAL_TOP_LEFT || r->causal == API_CAUSAL_BOTTOM_RIGHT))
        return api__error_invalid(err, "query_offset",
                                  "query_offset conflicts with causal \"%s\", which sets the "
                                  "alignment itself; use causal: true with query_offset",
                                  r->causal == API_CAUSAL_TOP_LEFT ? "top_left" : "bottom_right");
    return 0;
}

/* ---- Sizes ------------------------------------------------------------------------------- */

static size_t count_product(int64_t a, int64_t b, int64_t c, int64_t d, bool *overflow)
{
    size_t r = 1;
    const int64_t dims[4] = {a, b, c, d};
    for (int i = 0; i < 4; i++)
        *overflow |= __builtin_mul_overflow(r, (size_t)dims[i], &r);
    return r;
}

/* The element limit over inputs and outputs together. */
static int check_elements(const api__sdpa *s, api__error *err)
{
    const api__sdpa_req *r = &s->r;
    size_t max = s->rq->limits.max_elements, in = 0, out;
    bool overflow = false;
    const api__tensor *inputs[] = {&r->q,      &r->k,  &r->v,  &r->mask, &r->kpm,  &r->kvlen,
                                   &r->slopes, &r->wq, &r->wk, &r->ww,   &r->sinks};
    for (size_t i = 0; i < sizeof inputs / sizeof inputs[0]; i++)
        overflow |= !api__size_add(&in, inputs[i]->count); /* absent tensors count 0 */
    out = count_product(r->B, r->H, r->L, r->Dv, &overflow);
    if (r->weights == ENG_WEIGHTS_PER_HEAD)
        overflow |= !api__size_add(&out, count_product(r->B, r->H, r->L, r->S, &overflow));
    else if (r->weights == ENG_WEIGHTS_MEAN)
        overflow |= !api__size_add(&out, count_product(r->B, 1, r->L, r->S, &overflow));
    if (r->return_lse || r->sinks.present)
        overflow |= !api__size_add(&out, count_product(r->B, r->H, r->L, 1, &overflow));
    size_t total = in;
    overflow |= !api__size_add(&total, out);
    if (overflow || total > max)
        return api__error_set(err, API_STATUS_TOO_LARGE, API_REASON_TOO_LARGE, NULL,
                              "the request has %zu input and %s%zu output elements (weights "
                              "included), more than the %zu that --max-elements allows",
                              in, overflow ? "over " : "", overflow ? SIZE_MAX : out, max);
    return 0;
}

/* The shapes of the outputs: rank follows the query; rank 2 drops the batch axis. */
static void out_shapes(const api__sdpa_req *r, api__out_shape *out, api__out_shape *weights,
                       api__out_shape *lse)
{
    int rank = r->q.rank;
    if (rank == 4)
        *out = (api__out_shape){4, {r->B, r->H, r->L, r->Dv}, 0};
    else if (rank == 3)
        *out = (api__out_shape){3, {r->B, r->L, r->H * r->Dv}, 0};
    else
        *out = (api__out_shape){2, {r->L, r->H * r->Dv}, 0};
    if (r->weights == ENG_WEIGHTS_PER_HEAD)
        *weights = (api__out_shape){4, {r->B, r->H, r->L, r->S}, 0};
    else
        *weights = (api__out_shape){3, {r->B, r->L, r->S}, 0};
    *lse = (api__out_shape){3, {r->B, r->H, r->L}, 0};
    if (rank == 2) {
        weights->rank--;
        memmove(weights->shape, weights->shape + 1, sizeof weights->shape - sizeof(int64_t));
        lse->rank--;
        memmove(lse->shape, lse->shape + 1, sizeof lse->shape - sizeof(int64_t));
    }
    api__out_shape *all[3] = {out, weights, lse};
    for (int i = 0; i < 3; i++) {
        size_t c = 1;
        for (int d = 0; d < all[i]->rank; d++)
            c *= (size_t)all[i]->shape[d]; /* checked by check_elements first */
        all[i]->count = c;
    }
}

/* ---- Options ---------------------------------------------------------------------------- */

static int o_num_heads(void *req, const json_t *v, const char *name, api__error *err)
{
    return api__option_int(v, name, 1, INT32_MAX, &((api__sdpa_req *)req)->num_heads, err);
}

static int o_num_kv_heads(void *req, const json_t *v, const char *name, api__error *err)
{
    return api__option_int(v, name, 1, INT32_MAX, &((api__sdpa_req *)req)->num_kv_heads, err);
}

static int o_scale(void *req, const json_t *v, const char *name, api__error *err)
{
    api__sdpa_req *r = req;
    r->scale_set = true;
    return api__option_float(v, name, &r->scale, err);
}

static int o_softcap(void *req, const json_t *v, const char *name, api__error *err)
{
    return api__option_softcap(v, name, &((api__sdpa_req *)req)->softcap, err);
}

static int o_precision(void *req, const json_t *v, const char *name, api__error *err)
{
    api__sdpa_req *r = req;
    r->precision_set = true;
    return api__option_precision(v, name, &r->precision, err);
}

static int o_causal(void *req, const json_t *v, const char *name, api__error *err)
{
    return api__option_causal(v, name, &((api__sdpa_req *)req)->causal, err);
}

static int o_query_offset(void *req, const json_t *v, const char *name, api__error *err)
{
    api__sdpa_req *r = req;
    r->offset_set = true;
    return api__option_int(v, name, -API_QUERY_OFFSET_MAX, API_QUERY_OFFSET_MAX, &r->query_offset,
                           err);
}

static int o_timeout_ms(void *req, const json_t *v, const char *name, api__error *err)
{
    return api__option_int(v, name, 1, API_TIMEOUT_MS_MAX, &((api__sdpa_req *)req)->timeout_ms,
                           err);
}

const api__option_def api__sdpa_options[] = {
    {"num_heads", o_num_heads},       {"num_kv_heads", o_num_kv_heads}, {"scale", o_scale},
    {"softcap", o_softcap},           {"precision", o_precision},       {"causal", o_causal},
    {"query_offset", o_query_offset}, {"timeout_ms", o_timeout_ms},
};
const size_t api__sdpa_n_options = sizeof api__sdpa_options / sizeof api__sdpa_options[0];

/* ---- Engine arguments -------------------------------------------------------------------- */

/* A [B, L, heads * d] buffer (rank 2 or 3) seen as [B, heads, L, d]. */
static eng_view view_bld(float *data, int64_t B, int64_t heads, int64_t L, int64_t d)
{
    eng_view v = {data, {B, heads, L, d}, {L * heads * d, d, heads * d, 1}};
    return v;
}

/* A tensor whose bfloat16 bits can feed the engine as sent: base64 or raw bfloat16. */
static bool bf16_as_sent(const api__tensor *t)
{
    return t->dtype == API_DTYPE_BFLOAT16 &&
           (t->form == API_FORM_BASE64 || t->form == API_FORM_RAW);
}

/* Fills s->args from the checked request, once: shapes, strides and options, with the data
 * pointers of the buffers that do not exist yet left NULL (enough for eng_sdpa_scratch_bytes);
 * bind_buffers sets them after decoding. */
static void build_args(api__sdpa *s)
{
    const api__sdpa_req *r = &s->r;
    eng_sdpa_args *a = &s->args;
    memset(a, 0, sizeof *a);
    if (r->q.rank == 4) {
        a->q = eng_view_contiguous(s->q, r->B, r->H, r->L, r->D);
        a->k = eng_view_contiguous(s->k, r->B, r->Hkv, r->S, r->D);
        a->v = eng_view_contiguous(s->v, r->B, r->Hkv, r->S, r->Dv);
        a->out = eng_view_contiguous(s->out, r->B, r->H, r->L, r->Dv);
    } else {
        a->q = view_bld(s->q, r->B, r->H, r->L, r->D);
        a->k = view_bld(s->k, r->B, r->Hkv, r->S, r->D);
        a->v = view_bld(s->v, r->B, r->Hkv, r->S, r->Dv);
        a->out = view_bld(s->out, r->B, r->H, r->L, r->Dv);
    }
    a->scale_set = r->scale_set;
    a->scale = r->scale;
    a->softcap = r->softcap;
    a->precision = r->precision_set ? r->precision : s->rq->limits.default_precision;
    a->causal = r->causal != API_CAUSAL_OFF;
    if (r->offset_set) {
        a->align = ENG_ALIGN_OFFSET;
        a->query_offset = r->query_offset;
    } else {
        a->align =
            r->causal == API_CAUSAL_BOTTOM_RIGHT ? ENG_ALIGN_BOTTOM_RIGHT : ENG_ALIGN_TOP_LEFT;
    }
    a->window_left_set = r->window.left_set;
    a->window_left = r->window.left;
    a->window_right_set = r->window.right_set;
    a->window_right = r->window.right;
    if (r->kpm.present) {
        a->key_padding = s->kpm;
        a->key_padding_stride = r->kpm.rank == 2 ? r->S : 0;
    }
    a->kv_lengths = s->kvlen;
    if (r->mask.present)
        a->attn_mask =
            api__mask_view(&r->mask, r->mask.dtype == API_DTYPE_BOOL ? (const void *)s->mask_b
                                                                     : (const void *)s->mask_f);
    a->alibi = r->alibi;
    a->alibi_slopes = s->slopes;
    if (r->additive) {
        a->additive_w_q = s->wq;
        a->additive_w_k = s->wk;
        a->additive_v = s->ww;
        a->additive_dim = r->ww.shape[0];
    }
    a->weights_mode = r->weights;
    a->weights = s->weights;
    a->lse = s->lse;
    /* bfloat16 inputs stay so only for bfloat16 products: float32 ones read fp32 in place. */
    bool bf16 = eng_sdpa_precision(a) == ENG_PRECISION_BFLOAT16;
    s->q_bf16 = bf16 && bf16_as_sent(&r->q);
    s->kv_bf16 = bf16 && bf16_as_sent(&r->k) && bf16_as_sent(&r->v);
    a->q_dtype = s->q_bf16 ? ENG_DTYPE_BF16 : ENG_DTYPE_F32;
    a->kv_dtype = s->kv_bf16 ? ENG_DTYPE_BF16 : ENG_DTYPE_F32;
}

static int sdpa_check(void *op, api__error *err)
{
    api__sdpa *s = op;
    if (check_shapes(&s->r, err) != 0 || check_elements(s, err) != 0)
        return -1;
    api__req_set_deadline(s->rq, s->r.timeout_ms);
    out_shapes(&s->r, &s->os, &s->ws, &s->ls);
    build_args(s);
    return 0;
}

/* Points the engine arguments that build_args left without data at the decoded buffers. */
static void bind_buffers(api__sdpa *s)
{
    const api__sdpa_req *r = &s->r;
    eng_sdpa_args *a = &s->args;
    a->q.data = s->q;
    a->k.data = s->k;
    a->v.data = s->v;
    a->q16 = s->q16;
    a->k16 = s->k16;
    a->v16 = s->v16;
    a->out.data = s->out;
    if (r->kpm.present)
        a->key_padding = s->kpm;
    a->kv_lengths = s->kvlen;
    if (r->mask.present)
        a->attn_mask.data =
            r->mask.dtype == API_DTYPE_BOOL ? (const void *)s->mask_b : (const void *)s->mask_f;
    a->alibi_slopes = s->slopes;
    if (r->additive) {
        a->additive_w_q = s->wq;
        a->additive_w_k = s->wk;
        a->additive_v = s->ww;
    }
    a->weights = s->weights;
    a->lse = s->lse;
}

/* ---- Memory ------------------------------------------------------------------------------ */

enum { N_INPUTS = 11 };

/* Every input a request may have, in decoding order: what it decodes to, and where. */
static void input_defs(api__sdpa *s, api__input in[N_INPUTS])
{
    api__sdpa_req *r = &s->r;
    bool mask_bool = r->mask.dtype == API_DTYPE_BOOL;
    const api__input defs[N_INPUTS] = {
        {&r->q, r->q.present, s->q_bf16 ? API_ELEM_BF16 : API_ELEM_FLOAT, 0,
         s->q_bf16 ? (void **)&s->q16 : (void **)&s->q, "query"},
        {&r->k, r->k.present, s->kv_bf16 ? API_ELEM_BF16 : API_ELEM_FLOAT, 0,
         s->kv_bf16 ? (void **)&s->k16 : (void **)&s->k, "key"},
        {&r->v, r->v.present, s->kv_bf16 ? API_ELEM_BF16 : API_ELEM_FLOAT, 0,
         s->kv_bf16 ? (void **)&s->v16 : (void **)&s->v, "value"},
        {&r->mask, r->mask.present, mask_bool ? API_ELEM_BOOL : API_ELEM_FLOAT,
         mask_bool ? 0 : API_DECODE_NEG_INF, mask_bool ? (void **)&s->mask_b : (void **)&s->mask_f,
         "attn_mask"},
        {&r->kpm, r->kpm.present, API_ELEM_BOOL, 0, (void **)&s->kpm, "key_padding_mask"},
        {&r->kvlen, r->kvlen.present, API_ELEM_INT64, 0, (void **)&s->kvlen, "kv_lengths"},
        {&r->slopes, r->slopes.present, API_ELEM_FLOAT, 0, (void **)&s->slopes, "alibi"},
        {&r->wq, r->additive, API_ELEM_FLOAT, 0, (void **)&s->wq, "additive_weights.w_q"},
        {&r->wk, r->additive, API_ELEM_FLOAT, 0, (void **)&s->wk, "additive_weights.w_k"},
        {&r->ww, r->additive, API_ELEM_FLOAT, 0, (void **)&s->ww, "additive_weights.w"},
        {&r->sinks, r->sinks.present, API_ELEM_FLOAT, 0, (void **)&s->sinks, "sinks"},
    };
    memcpy(in, defs, sizeof defs);
}

/* The inputs, the log-sum-exp that sinks need when it is not an output, and the scratch. */
static bool sdpa_size(void *op, api__sizes *sz)
{
    api__sdpa *s = op;
    const api__sdpa_req *r = &s->r;
    api__input in[N_INPUTS];
    input_defs(s, in);
    bool ok = api__input_bytes(in, N_INPUTS, &sz->tensors);
    if (r->sinks.present && !r->return_lse)
        ok = ok && api__req_output_bytes(s->ls.count, &sz->tensors);
    return ok && api__size_add(&sz->scratch, eng_sdpa_scratch_bytes(
                                                 &s->args, eng_pool_threads(s->rq->call->pool)));
}

/* ---- Decoding ---------------------------------------------------------------------------- */

static int sdpa_decode(void *op, api__error *err)
{
    api__sdpa *s = op;
    api__sdpa_req *r = &s->r;
    api__input in[N_INPUTS];
    input_defs(s, in);
    for (size_t i = 0; i < N_INPUTS; i++) {
        if (!in[i].present)
            continue;
        if (api__req_decode_input(s->rq, &in[i], err) != 0)
            return -1;
        if (in[i].dst == (void **)&s->sinks && api__sinks_check_values(s->sinks, r->H, err) != 0)
            return -1;
        for (size_t j = 0; in[i].dst == (void **)&s->kvlen && j < r->kvlen.count; j++) {
            if (s->kvlen[j] < 0 || s->kvlen[j] > r->S) {
                char name[48];
                snprintf(name, sizeof name, "kv_lengths[%zu]", j);
                return api__error_invalid(err, name, "%s is %lld; it must be in [0, S] = [0, %lld]",
                                          name, (long long)s->kvlen[j], (long long)r->S);
            }
        }
    }
    if (api__req_alloc_output(s->rq, &s->out, s->os.count, err) != 0 ||
        (r->weights != ENG_WEIGHTS_NONE &&
         api__req_alloc_output(s->rq, &s->weights, s->ws.count, err) != 0) ||
        ((r->return_lse || r->sinks.present) &&
         api__req_alloc_output(s->rq, &s->lse, s->ls.count, err) != 0))
        return -1;
    /* The tree is no longer needed: give its memory back before the long part. */
    api__req_parse_done(s->rq);
    bind_buffers(s);
    return 0;
}

/* ---- The call ---------------------------------------------------------------------------- */

/* The engine's argument names, in the request's words. */
static const char *request_field(const char *engine_field)
{
    static const char *const map[][2] = {
        {"q", "query"},
        {"k", "key"},
        {"v", "value"},
        {"out", "output"},
        {"key_padding", "key_padding_mask"},
        {"alibi_slopes", "alibi"},
        {"window_left", "window"},
        {"window_right", "window"},
        {"weights_mode", "return_weights"},
        {"additive", "additive_weights"},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (strcmp(engine_field, map[i][0]) == 0)
            return map[i][1];
    return engine_field;
}

int api__sinks_check(const api__tensor *sinks, int64_t H, eng_weights_mode weights, api__error *err)
{
    char ms[64];
    if (!(sinks->rank == 1 && sinks->shape[0] == H))
        return api__error_invalid(err, "sinks",
                                  "sinks has shape %s; there is one sink logit per query head: "
                                  "[%lld]",
                                  api__tensor_shape_str(sinks, ms, sizeof ms), (long long)H);
    if (weights != ENG_WEIGHTS_NONE)
        return api__error_invalid(err, "sinks",
                                  "sinks take a share of each softmax that the weights would not "
                                  "show: leave return_weights out");
    return 0;
}

int api__sinks_check_values(const float *sinks, int64_t H, api__error *err)
{
    for (int64_t h = 0; h < H; h++)
        if (!isfinite(sinks[h]))
            return api__error_invalid(err, "sinks",
                                      "sinks[%lld] is %g; a sink logit must be finite",
                                      (long long)h, (double)sinks[h]);
    return 0;
}

/* The rows scaled by Z / (Z + e^sink) = 1 / (1 + exp(sink - lse)), exactly. */
void api__sinks_apply(const float *sinks, const eng_view *o, float *lse)
{
    int64_t B = o->ne[0], H = o->ne[1], L = o->ne[2];
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < L; i++) {
                float *l = &lse[(b * H + h) * L + i];
                double sink = sinks[h], m = *l;
                double keep = isinf(m) ? 0.0 : 1.0 / (1.0 + exp(sink - m));
                float *row = o->data + b * o->stride[0] + h * o->stride[1] + i * o->stride[2];
                for (int64_t d = 0; d < o->ne[3]; d++)
                    row[d] = (float)(row[d] * keep);
                *l = (float)(isinf(m) ? sink : fmax(m, sink) + log1p(exp(-fabs(m - sink))));
            }
}

static int sdpa_run(void *op, int64_t *compute_ns, api__error *err)
{
    api__sdpa *s = op;
    eng_error eerr;
    if (api__req_check_ctl(s->rq, err) != 0)
        return -1;
    memset(&eerr, 0, sizeof eerr);
    int64_t t0 = eng_now_ns();
    eng_status st = eng_sdpa(s->rq->call->pool, &s->args, &s->rq->lease->ctl, &eerr);
    if (st == ENG_OK && s->r.sinks.present)
        api__sinks_apply(s->sinks, &s->args.out, s->lse);
    *compute_ns = eng_now_ns() - t0;
    if (st != ENG_OK)
        return api__req_engine_error(s->rq, st, &eerr,
                                     eerr.field[0] ? request_field(eerr.field) : NULL, err);
    return 0;
}

/* ---- The operation ------------------------------------------------------------------------ */

static const api__out_shape *sdpa_output(void *op, int o, float ***slot)
{
    api__sdpa *s = op;
    float **data = NULL;
    const api__out_shape *shape = NULL;
    if (o == API__OUT_OUTPUT) {
        data = &s->out;
        shape = &s->os;
    } else if (o == API__OUT_WEIGHTS && s->r.weights != ENG_WEIGHTS_NONE) {
        data = &s->weights;
        shape = &s->ws;
    } else if (o == API__OUT_LSE && s->r.return_lse) {
        data = &s->lse;
        shape = &s->ls;
    }
    if (slot)
        *slot = data;
    return shape;
}

static int64_t sdpa_batch(const void *op)
{
    return ((const api__sdpa *)op)->r.B;
}

static eng_precision sdpa_precision(const void *op)
{
    return eng_sdpa_precision(&((const api__sdpa *)op)->args);
}

const api__op api__sdpa_op = {
    .steps = {.check = sdpa_check,
              .size = sdpa_size,
              .decode = sdpa_decode,
              .run = sdpa_run,
              .batch = sdpa_batch},
    .output = sdpa_output,
    .precision = sdpa_precision,
};
