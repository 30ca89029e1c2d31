/*
 * test_sdpa_bf16_views.c - eng_sdpa over bfloat16 inputs (eng_sdpa_args q_dtype, kv_dtype).
 *
 * bf16 inputs are read as they are, without an fp32 copy: Q rows copied into each task's bf16
 * rows (or widened for fp32 products), K and V packed a block at a time from their bits. The
 * promise is exactness: the output, the log-sum-exp and the weights are bit for bit those of
 * fp32 views of the same values, in either precision, with every option (masks, windows,
 * ALiBi, softcap, GQA, key padding, kv_lengths, weights, lse, the decode split, prepacked and
 * per-block K/V, strided [B, L, H, D] layouts, odd depths, denormals, open tail keys). Each case
 * runs with Q alone, K/V alone and all three in bf16.
 *
 * The Makefile runs this binary once per kernel set, and once more with ATTND_BF16=native
 * (the VDPBF16PS path, where the CPU has AVX512-BF16).
 */
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "tests/support/check.h"
#include "tests/support/util.h"

typedef struct {
    const char *name;
    int64_t B, H, Hkv, L, S, D, Dv;
    bool causal;
    bool masks;     /* a bool mask, key padding, a window, ALiBi and softcap */
    bool fmask;     /* a float mask broadcast over heads, and kv_lengths */
    int weights;    /* 0 none, 1 per head, 2 mean */
    bool blhd;      /* [B, L, H, D] memory seen as [B, H, L, D] (row stride H D) */
    bool subnormal; /* some inputs are bf16 denormals */
    int64_t tail;   /* open_tail_keys */
} view_case;

/* bf16 values (as bits) and their exact fp32 widening, in the case's memory layout. */
typedef struct {
    uint16_t *h;
    float *f;
    size_t n;
} pair_tensor;

static void pair_init(pair_tensor *t, size_t n, uint64_t *rng, double amp, bool subnormal)
{
    t->n = n;
    t->h = xcalloc(n, sizeof *t->h);
    t->f = xcalloc(n, sizeof *t->f);
    for (size_t i = 0; i < n; i++) {
        uint16_t h = eng_f32_to_bf16(rng_sym(rng, amp));
        if (subnormal && rng_unit(rng) < 0.05)
            h = (uint16_t)((rng_unit(rng) < 0.5 ? 0x8000u : 0u) | (1u + rng_below(rng, 0x7F)));
        t->h[i] = h;
        t->f[i] = eng_bf16_to_f32(h);
    }
}

static void pair_free(pair_tensor *t)
{
    free(t->h);
    free(t->f);
}

/* A view of [B, heads, T, d] over contiguous memory, or [B, T, heads, d] memory. */
static eng_view view_of(float *data, const view_case *c, int64_t heads, int64_t T, int64_t d)
{
    if (!c->blhd)
        return eng_view_contiguous(data, c->B, heads, T, d);
    eng_view v = {data, {c->B, heads, T, d}, {T * heads * d, d, heads * d, 1}};
    return v;
}

typedef struct {
    pair_tensor q, k, v;
    uint8_t *mask, *padding;
    float *fmask;
    int64_t lengths[2];
} case_inputs;

static void inputs_init(const view_case *c, case_inputs *in, uint64_t seed)
{
    uint64_t rng = seed;
    memset(in, 0, sizeof *in);
    pair_init(&in->q, (size_t)(c->B * c->H * c->L * c->D), &rng, 2.0, c->subnormal);
    pair_init(&in->k, (size_t)(c->B * c->Hkv * c->S * c->D), &rng, 1.0, c->subnormal);
    pair_init(&in->v, (size_t)(c->B * c->Hkv * c->S * c->Dv), &rng, 1.0, c->subnormal);
    if (c->masks) {
        size_t nm = (size_t)(c->B * c->H * c->L * c->S);
        in->mask = xcalloc(nm, 1);
        for (size_t i = 0; i < nm; i++)
            in->mask[i] = rng_unit(&rng) < 0.9;
        in->padding = xcalloc((size_t)(c->B * c->S), 1);
        for (int64_t i = 0; i < c->B * c->S; i++)
            in->padding[i] = rng_unit(&rng) < 0.1;
    }
    if (c->fmask) {
        size_t nm = (size_t)(c->B * c->L * c->S);
        in->fmask = xcalloc(nm, sizeof(float));
        for (size_t i = 0; i < nm; i++)
            in->fmask[i] = rng_unit(&rng) < 0.1 ? -INFINITY : rng_sym(&rng, 2.0);
    }
    in->lengths[0] = c->S * 2 / 3;
    in->lengths[1] = c->S;
}

static void inputs_free(case_inputs *in)
{
    pair_free(&in->q);
    pair_free(&in->k);
    pair_free(&in->v);
    free(in->mask);
    free(in->padding);
    free(in->fmask);
}

typedef struct {
    float *out, *lse, *weights;
} case_outputs;

static size_t weights_count(const view_case *c)
{
    return (size_t)(c->B * (c->weights == 1 ? c->H : 1) * c->L * c->S);
}

static void outputs_init(const view_case *c, case_outputs *o)
{
    o->out = xcalloc((size_t)(c->B * c->H * c->L * c->Dv), sizeof(float));
    o->lse = xcalloc((size_t)(c->B * c->H * c->L), sizeof(float));
    o->weights = c->weights ? xcalloc(weights_count(c), sizeof(float)) : NULL;
}

static void outputs_free(case_outputs *o)
{
    free(o->out);
    free(o->lse);
    free(o->weights);
}

/* The arguments of case c: Q (K and V) from their bf16 bits when q16 (kv16), else fp32. */
static eng_sdpa_args case_args(const view_case *c, case_inputs *in, case_outputs *o,
                               eng_precision precision, bool q16, bool kv16)
{
    eng_sdpa_args a = {0};
    a.q = view_of(q16 ? NULL : in->q.f, c, c->H, c->L, c->D);
    a.k = view_of(kv16 ? NULL : in->k.f, c, c->Hkv, c->S, c->D);
    a.v = view_of(kv16 ? NULL : in->v.f, c, c->Hkv, c->S, c->Dv);
    a.out = view_of(o->out, c, c->H, c->L, c->Dv);
    if (q16) {
        a.q_dtype = ENG_DTYPE_BF16;
        a.q16 = in->q.h;
    }
    if (kv16) {
        a.kv_dtype = ENG_DTYPE_BF16;
        a.k16 = in->k.h;
        a.v16 = in->v.h;
    }
    a.precision = precision;
    a.causal = c->causal;
    a.lse = o->lse;
    if (c->weights) {
        a.weights_mode = c->weights == 1 ? ENG_WEIGHTS_PER_HEAD : ENG_WEIGHTS_MEAN;
        a.weights = o->weights;
    }
    if (c->masks) {
        a.attn_mask = (eng_mask){ENG_MASK_BOOL,
                                 in->mask,
                                 {c->B, c->H, c->L, c->S},
                                 {c->H * c->L * c->S, c->L * c->S, c->S, 1}};
        a.key_padding = in->padding;
        a.key_padding_stride = c->S;
        a.window_left_set = true;
        a.window_left = c->S / 2;
        a.alibi = true;
        a.softcap = 20.0f;
    }
    a.open_tail_keys = c->tail;
    if (c->fmask) {
        a.attn_mask =
            (eng_mask){ENG_MASK_FLOAT, in->fmask, {c->B, 1, c->L, c->S}, {c->L * c->S, 0, c->S, 1}};
        if (c->B == 2)
            a.kv_lengths = in->lengths;
    }
    return a;
}

/* The first index where a and b differ as bits, or -1. */
static int64_t first_difference(const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof a[i]) != 0)
            return (int64_t)i;
    return -1;
}

/* Case c with fp32 views, then with bf16 Q, bf16 K/V and both: bit-identical outputs. */
static void check_case(eng_pool *pool, const view_case *c, eng_precision precision, uint64_t seed)
{
    case_inputs in;
    inputs_init(c, &in, seed);
    case_outputs want, got;
    outputs_init(c, &want);
    outputs_init(c, &got);
    eng_error err;
    eng_sdpa_args a = case_args(c, &in, &want, precision, false, false);
    CHECKF(eng_sdpa(pool, &a, NULL, &err) == ENG_OK, "[%s] fp32 views: %s", c->name, err.message);
    const char *kinds[3] = {"bf16 q", "bf16 k/v", "bf16 q, k, v"};
    const char *prec = precision == ENG_PRECISION_BFLOAT16 ? "bfloat16" : "float32";
    for (int kind = 0; kind < 3; kind++) {
        eng_sdpa_args b = case_args(c, &in, &got, precision, kind != 1, kind != 0);
        CHECK_EQ_INT(eng_sdpa_precision(&b), eng_sdpa_precision(&a));
        eng_status st = eng_sdpa(pool, &b, NULL, &err);
        CHECKF(st == ENG_OK, "[%s, %s, %s]: %s", c->name, prec, kinds[kind], err.message);
        if (st != ENG_OK)
            continue;
        size_t no = (size_t)(c->B * c->H * c->L * c->Dv), nl = (size_t)(c->B * c->H * c->L);
        int64_t d = first_difference(want.out, got.out, no);
        CHECKF(d < 0, "[%s, %s, %s] output[%lld]: %a with bf16 views, %a with fp32 views", c->name,
               prec, kinds[kind], (long long)d, d < 0 ? 0.0 : (double)got.out[d],
               d < 0 ? 0.0 : (double)want.out[d]);
        d = first_difference(want.lse, got.lse, nl);
        CHECKF(d < 0, "[%s, %s, %s] lse[%lld] differs", c->name, prec, kinds[kind], (long long)d);
        if (c->weights) {
            d = first_difference(want.weights, got.weights, weights_count(c));
            CHECKF(d < 0, "[%s, %s, %s] weights[%lld] differ", c->name, prec, kinds[kind],
                   (long long)d);
        }
    }
    outputs_free(&want);
    outputs_free(&got);
    inputs_free(&in);
}

static const view_case cases[] = {
    {"D=64 L=S=256", 1, 2, 2, 256, 256, 64, 64, false, false, false, 0, false, false, 0},
    {"D=80 causal GQA ragged", 2, 4, 2, 301, 301, 80, 80, true, false, false, 0, false, false, 0},
    {"D=128 causal [B,L,H,D] layout", 1, 4, 2, 200, 200, 128, 128, true, false, false, 0, true,
     false, 0},
    {"masks, window, ALiBi, softcap, weights", 2, 2, 2, 100, 333, 64, 64, false, true, false, 1,
     false, false, 0},
    {"float mask, kv_lengths, mean weights", 2, 4, 2, 70, 150, 32, 48, true, false, true, 2, true,
     false, 0},
    {"D=33 Dv=17 odd depths", 1, 2, 1, 77, 131, 33, 17, true, false, false, 1, false, false, 0},
    {"decode L=1 S=4096 (split keys)", 2, 4, 4, 1, 4096, 128, 128, false, false, false, 0, false,
     false, 0},
    {"decode L=2 S=2048 GQA [B,L,H,D]", 1, 8, 2, 2, 2048, 64, 64, false, false, false, 0, true,
     false, 0},
    {"GQA decode L=5 g=4 masks, weights", 1, 8, 2, 5, 1000, 64, 64, false, true, false, 1, false,
     false, 0},
    {"GQA decode L=1 g=8 float mask, mean weights", 2, 8, 1, 1, 1000, 64, 32, false, false, true, 2,
     false, false, 0},
    {"denormal inputs", 1, 2, 2, 64, 96, 64, 64, false, false, false, 0, false, true, 0},
    {"causal, 7 open tail keys", 1, 4, 1, 150, 157, 64, 64, true, false, false, 1, false, false, 7},
};

static void test_bf16_views_match_fp32_views(void)
{
    eng_error err;
    eng_pool *pool = eng_pool_new(2, &err);
    CHECK(pool != NULL);
    if (!pool)
        return;
    eng_engine_info info;
    eng_engine_info_get(&info);
    printf("bf16 products: %s\n", info.bf16);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        check_case(pool, &cases[i], ENG_PRECISION_BFLOAT16, 300 + i);
        check_case(pool, &cases[i], ENG_PRECISION_FLOAT32, 400 + i);
    }
    eng_pool_free(pool);
}

/* What the views may not be: another dtype, a missing pointer, bf16 with additive scoring. */
static void test_bf16_views_are_checked(void)
{
    uint16_t h[8] = {0};
    float x[8] = {0}, out[8];
    eng_error err;
    eng_pool *pool = eng_pool_new(1, &err);
    eng_sdpa_args a = {0};
    a.q = eng_view_contiguous(NULL, 1, 1, 2, 4);
    a.k = eng_view_contiguous(x, 1, 1, 2, 4);
    a.v = eng_view_contiguous(x, 1, 1, 2, 4);
    a.out = eng_view_contiguous(out, 1, 1, 2, 4);
    a.q_dtype = ENG_DTYPE_BF16;
    CHECK_EQ_INT(eng_sdpa(pool, &a, NULL, &err), ENG_EINVAL); /* no q16 */
    CHECK(strcmp(err.field, "q") == 0);
    a.q16 = h;
    CHECK_EQ_INT(eng_sdpa(pool, &a, NULL, &err), ENG_OK);
    a.kv_dtype = ENG_DTYPE_F16;
    CHECK_EQ_INT(eng_sdpa(pool, &a, NULL, &err), ENG_EINVAL);
    CHECK(strcmp(err.field, "k") == 0);
    a.kv_dtype = ENG_DTYPE_BF16;
    a.k16 = h;
    CHECK_EQ_INT(eng_sdpa(pool, &a, NULL, &err), ENG_EINVAL); /* no v16 */
    CHECK(strcmp(err.field, "v") == 0);
    a.v16 = h;
    CHECK_EQ_INT(eng_sdpa(pool, &a, NULL, &err), ENG_OK);
    float w[16] = {0}, wv[4] = {0};
    a.additive_w_q = a.additive_w_k = w;
    a.additive_v = wv;
    a.additive_dim = 4;
    CHECK_EQ_INT(eng_sdpa(pool, &a, NULL, &err), ENG_EINVAL);
    CHECK(strcmp(err.field, "additive") == 0);
    eng_pool_free(pool);
}

int main(void)
{
    if (test_kernels_skip())
        return 0;
    RUN_WITHIN(test_bf16_views_match_fp32_views, 300);
    RUN(test_bf16_views_are_checked);
    return check_report();
}
