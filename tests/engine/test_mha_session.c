/*
 * test_mha_session.c - the specification of eng_mha over a KV cache (eng_mha_args.kv_cache,
 * engine.h): a decoder layer's prefill and its decode steps append the layer's own projected
 * (and rotated) keys and values to a sequence and attend over all of it.
 *
 * The reference is the layer itself: eng_mha over the whole history at once, causal. A prefill
 * of P tokens, then single-token steps (and a chunk of several) through the cache, must give at
 * every step the rows that the full causal layer gives for those tokens: within 1e-5 x max|out|
 * in float32 (the two differ only in the order the attention sums its keys, paged blocks
 * against one contiguous buffer: ~1e-7 relative), and within the 1e-2 x max|out| of the
 * bfloat16 tests (test_mha.c, test_sdpa_bf16.c) for a bf16 layer over a bf16 cache, where the
 * probabilities are rounded after a running maximum that depends on the blocking. One position
 * off, a RoPE turned at the wrong position, a sinusoid added at 0 instead of the cache's length,
 * a key of the wrong kv head, moves outputs by tens of percent: far outside either tolerance.
 *
 * Then what a step refuses (each EINVAL naming the option, the cache unchanged), shapes of the
 * cache that do not match the layer, and failures after the projections (a full pool, a
 * cancelled call, max_tokens) that leave the cache's length as it was.
 */
#include "engine/internal.h"
#include "tests/support/check.h"
#include "tests/support/named_layer.h"
#include "tests/support/util.h"

#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define STEP_RTOL 1e-5
#define BF16_RTOL 1e-2

static eng_pool *pool;

/* ---- Layers ------------------------------------------------------------------------------- */

typedef struct {
    int64_t E, H, Hkv; /* Hkv 0: H */
    bool bias_kv;
} layer_spec;

/* A layer with separate q/k/v/o projections and biases, uniform in +-1/sqrt(E) (biases +-0.5),
 * through named_layer (the api's names, then eng_layer_new) as a model file would give it. */
static eng_layer *layer_new(const layer_spec *sp, uint64_t seed)
{
    uint64_t rng = seed;
    int64_t E = sp->E, Hkv = sp->Hkv ? sp->Hkv : sp->H, W = Hkv * (E / sp->H);
    const struct {
        const char *name;
        int64_t rows, cols; /* cols 0: a vector */
        double amp;
    } parts[] = {{"q_proj.weight", E, E, 1.0 / sqrt((double)E)},
                 {"k_proj.weight", W, E, 1.0 / sqrt((double)E)},
                 {"v_proj.weight", W, E, 1.0 / sqrt((double)E)},
                 {"o_proj.weight", E, E, 1.0 / sqrt((double)E)},
                 {"q_proj.bias", E, 0, 0.5},
                 {"k_proj.bias", W, 0, 0.5},
                 {"v_proj.bias", W, 0, 0.5},
                 {"o_proj.bias", E, 0, 0.5},
                 {"bias_k", W, 0, 1.0},
                 {"bias_v", W, 0, 1.0}};
    size_t n = sp->bias_kv ? 10 : 8;
    eng_weight refs[10];
    float *data[10];
    for (size_t i = 0; i < n; i++) {
        int64_t count = parts[i].rows * (parts[i].cols ? parts[i].cols : 1);
        data[i] = xcalloc((size_t)count, sizeof(float));
        for (int64_t j = 0; j < count; j++)
            data[i][j] = rng_sym(&rng, parts[i].amp);
        refs[i] = (eng_weight){parts[i].name,
                               ENG_DTYPE_F32,
                               data[i],
                               parts[i].cols ? 2 : 1,
                               {parts[i].rows, parts[i].cols, 0, 0}};
    }
    eng_error err;
    memset(&err, 0, sizeof err);
    eng_layer *l = named_layer("test", refs, n, sp->H, sp->Hkv, &err);
    CHECKF(l != NULL, "named_layer: %s: %s", err.field, err.message);
    for (size_t i = 0; i < n; i++)
        free(data[i]);
    return l;
}

/* A pool and an empty sequence with the layer's kv heads and head size. */
typedef struct {
    eng_kv_pool *kvp;
    eng_kv_seq *seq;
} cache;

static cache cache_new(const eng_layer *l, eng_dtype dtype, size_t capacity, int64_t max_tokens)
{
    eng_error err;
    cache c;
    int64_t D = l->embed_dim / l->num_heads;
    eng_kv_shape shape = {.num_kv_heads = l->num_kv_heads,
                          .head_dim = D,
                          .value_head_dim = D,
                          .dtype = dtype,
                          .max_tokens = max_tokens};
    c.kvp = eng_kv_pool_new(capacity, 16, &err);
    CHECKF(c.kvp != NULL, "eng_kv_pool_new: %s", err.message);
    c.seq = c.kvp ? eng_kv_seq_new(c.kvp, &shape, &err) : NULL;
    CHECKF(c.seq != NULL, "eng_kv_seq_new: %s", err.message);
    return c;
}

static void cache_free(cache *c)
{
    eng_kv_seq_free(c->seq);
    eng_kv_pool_free(c->kvp);
    memset(c, 0, sizeof *c);
}

/* ---- Steps against the whole history --------------------------------------------------------- */

/* How a layer runs: its positions and precision (the rest are eng_mha's defaults). */
typedef struct {
    eng_positional positional;
    eng_rope_style rope_style;
    float rope_base;
    eng_precision precision;
    eng_weights_mode weights; /* also compare the attention weights of each step */
} run_opts;

static eng_mha_args args_of(const eng_layer *l, const run_opts *o, const float *x, int64_t L,
                            float *out)
{
    eng_mha_args a;
    memset(&a, 0, sizeof a);
    a.layer = l;
    a.B = 1;
    a.L = L;
    a.x = x;
    a.out = out;
    a.causal = true;
    a.positional = o->positional;
    a.rope_style = o->rope_style;
    a.rope_base = o->rope_base;
    a.precision = o->precision;
    return a;
}

/* The full layer over tokens [0, n) of x, causal: its output rows [n, E] (and weights
 * [H, n, n] when asked). */
static float *full_layer(const eng_layer *l, const run_opts *o, const float *x, int64_t n,
                         float **weights)
{
    float *out = xcalloc((size_t)(n * l->embed_dim), sizeof(float));
    eng_mha_args a = args_of(l, o, x, n, out);
    if (weights) {
        *weights = xcalloc((size_t)(l->num_heads * n * n), sizeof(float));
        a.weights_mode = ENG_WEIGHTS_PER_HEAD;
        a.weights = *weights;
    }
    eng_error err;
    memset(&err, 0, sizeof err);
    eng_status st = eng_mha(pool, &a, NULL, &err);
    CHECKF(st == ENG_OK, "full layer over %lld tokens: %s (%s: %s)", (long long)n,
           eng_status_str(st), err.field, err.message);
    return out;
}

/* The largest |a - b| over `count` values, relative to the largest |b| (at least 1e-3). */
static double rel_diff(const float *a, const float *b, size_t count)
{
    double worst = 0, scale = 1e-3;
    for (size_t i = 0; i < count; i++) {
        scale = fmax(scale, fabs((double)b[i]));
        double e = fabs((double)a[i] - (double)b[i]);
        worst = isnan(e) ? INFINITY : fmax(worst, e);
    }
    return worst / scale;
}

/* One step of L tokens (x's rows [n0, n0 + L)) through the cache, compared with the full layer
 * over [0, n0 + L): the step's rows of its output, and its weights when asked. Returns the
 * worst relative output error. */
static double step_against_full(const eng_layer *l, const run_opts *o, cache *c, const float *x,
                                int64_t n0, int64_t L, const char *note)
{
    int64_t E = l->embed_dim, H = l->num_heads, n = n0 + L;
    float *out = xcalloc((size_t)(L * E), sizeof(float));
    float *wts = o->weights ? xcalloc((size_t)(H * L * n), sizeof(float)) : NULL;
    eng_mha_args a = args_of(l, o, x + n0 * E, L, out);
    a.align = ENG_ALIGN_BOTTOM_RIGHT;
    a.kv_cache = c->seq;
    a.weights_mode = o->weights;
    a.weights = wts;
    eng_error err;
    memset(&err, 0, sizeof err);
    eng_status st = eng_mha(pool, &a, NULL, &err);
    CHECKF(st == ENG_OK, "%s: step of %lld tokens at %lld: %s (%s: %s)", note, (long long)L,
           (long long)n0, eng_status_str(st), err.field, err.message);
    CHECK_EQ_INT(eng_kv_seq_length(c->seq), n);

    float *full_w = NULL;
    float *full = full_layer(l, o, x, n, o->weights ? &full_w : NULL);
    double worst = rel_diff(out, full + n0 * E, (size_t)(L * E));
    if (wts) {
        /* Row i of the step is row n0 + i of the full weights, over the same n keys. */
        double wworst = 0;
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < L; i++)
                for (int64_t j = 0; j < n; j++)
                    wworst = fmax(wworst, fabs((double)wts[(h * L + i) * n + j] -
                                               (double)full_w[(h * n + n0 + i) * n + j]));
        CHECKF(wworst <= 2e-6, "%s: weights of the step at %lld differ by %.3g", note,
               (long long)n0, wworst);
    }
    free(full_w);
    free(full);
    free(wts);
    free(out);
    return worst;
}

/* A prefill of P tokens, then T steps of one token, then one step of three, each against the
 * full layer; the worst error must be within rtol. */
static void steps_match_full(const layer_spec *sp, const run_opts *o, eng_dtype cache_dtype,
                             double rtol, const char *note)
{
    enum { P = 37, T = 9, CHUNK = 3 };
    uint64_t rng = 77;
    eng_layer *l = layer_new(sp, 5);
    if (!l)
        return;
    int64_t E = l->embed_dim, N = P + T + CHUNK;
    float *x = xcalloc((size_t)(N * E), sizeof(float));
    for (int64_t i = 0; i < N * E; i++)
        x[i] = rng_sym(&rng, 1.0);
    cache c = cache_new(l, cache_dtype, (size_t)64 << 20, 0);
    double worst = 0;
    if (c.seq) {
        worst = fmax(worst, step_against_full(l, o, &c, x, 0, P, note));
        for (int64_t t = 0; t < T; t++)
            worst = fmax(worst, step_against_full(l, o, &c, x, P + t, 1, note));
        worst = fmax(worst, step_against_full(l, o, &c, x, P + T, CHUNK, note));
    }
    CHECKF(worst <= rtol, "%s: the steps differ from the full layer by %.3g x max|out| (> %.0e)",
           note, worst, rtol);
    printf("     %s: steps within %.2e x max|out| of the full layer\n", note, worst);
    cache_free(&c);
    free(x);
    eng_layer_free(l);
}

static void test_steps_without_positions_equal_the_full_causal_layer(void)
{
    layer_spec sp = {.E = 32, .H = 4};
    run_opts o = {.positional = ENG_POSITIONAL_NONE};
    steps_match_full(&sp, &o, ENG_DTYPE_F32, STEP_RTOL, "no positions");
}

static void test_steps_with_rope_turn_q_and_k_at_their_positions(void)
{
    layer_spec sp = {.E = 32, .H = 4};
    run_opts half = {.positional = ENG_POSITIONAL_ROPE, .rope_style = ENG_ROPE_HALF};
    run_opts inter = {
        .positional = ENG_POSITIONAL_ROPE, .rope_style = ENG_ROPE_INTERLEAVED, .rope_base = 500.0f};
    steps_match_full(&sp, &half, ENG_DTYPE_F32, STEP_RTOL, "rope half");
    steps_match_full(&sp, &inter, ENG_DTYPE_F32, STEP_RTOL, "rope interleaved, base 500");
}

static void test_steps_add_the_sinusoid_at_their_positions(void)
{
    layer_spec sp = {.E = 32, .H = 4};
    run_opts o = {.positional = ENG_POSITIONAL_SINUSOIDAL};
    steps_match_full(&sp, &o, ENG_DTYPE_F32, STEP_RTOL, "sinusoidal");
}

static void test_steps_with_alibi_bias_distances_over_the_whole_cache(void)
{
    layer_spec sp = {.E = 32, .H = 4};
    run_opts o = {.positional = ENG_POSITIONAL_ALIBI};
    steps_match_full(&sp, &o, ENG_DTYPE_F32, STEP_RTOL, "alibi");
}

static void test_grouped_query_layer_steps_share_kv_heads(void)
{
    layer_spec sp = {.E = 48, .H = 6, .Hkv = 2};
    run_opts rope = {.positional = ENG_POSITIONAL_ROPE};
    steps_match_full(&sp, &rope, ENG_DTYPE_F32, STEP_RTOL, "grouped-query (6 over 2), rope");
}

static void test_step_weights_are_the_full_layers_rows(void)
{
    layer_spec sp = {.E = 32, .H = 4};
    run_opts o = {.positional = ENG_POSITIONAL_ROPE, .weights = ENG_WEIGHTS_PER_HEAD};
    steps_match_full(&sp, &o, ENG_DTYPE_F32, STEP_RTOL, "per-head weights");
}

static void test_bf16_layer_steps_over_a_bf16_cache(void)
{
    layer_spec sp = {.E = 64, .H = 4, .Hkv = 2};
    run_opts o = {.positional = ENG_POSITIONAL_ROPE, .precision = ENG_PRECISION_BFLOAT16};
    eng_mha_args probe = {.precision = ENG_PRECISION_BFLOAT16};
    /* The openblas set computes float32 (eng_mha_precision); the bf16 cache still rounds the
     * keys and values it stores, so the bf16 bound is the one that holds there too. */
    bool bf16 = eng_mha_precision(&probe) == ENG_PRECISION_BFLOAT16;
    steps_match_full(&sp, &o, ENG_DTYPE_BF16, BF16_RTOL,
                     bf16 ? "bf16 layer, bf16 cache" : "bf16 asked, float32 computed, bf16 cache");
}

/* A layer of bf16 matrices kept in 16 bits (as a bf16 model file gives it), of the values of
 * layer_new's fp32 layer `fp32` rounded to bf16, and *twin, an fp32 layer of those values. */
static eng_layer *bf16_layer_new(const eng_layer *fp32, eng_layer **twin)
{
    int64_t E = fp32->embed_dim, W = fp32->num_kv_heads * (E / fp32->num_heads);
    const float *w[4] = {fp32->w_q, fp32->w_k, fp32->w_v, fp32->w_o};
    const int64_t rows[4] = {E, W, W, E};
    const char *names[8] = {"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight",
                            "q_proj.bias",   "k_proj.bias",   "v_proj.bias",   "o_proj.bias"};
    const float *bias[4] = {fp32->b_q, fp32->b_k, fp32->b_v, fp32->b_o};
    eng_weight half[8], full[8];
    uint16_t *bits[4];
    float *values[4];
    for (int i = 0; i < 4; i++) {
        size_t n = (size_t)(rows[i] * E);
        bits[i] = xcalloc(n, sizeof(uint16_t));
        values[i] = xcalloc(n, sizeof(float));
        for (size_t j = 0; j < n; j++) {
            bits[i][j] = eng_f32_to_bf16(w[i][j]);
            values[i][j] = eng_bf16_to_f32(bits[i][j]);
        }
        half[i] = (eng_weight){names[i], ENG_DTYPE_BF16, bits[i], 2, {rows[i], E, 0, 0}};
        full[i] = (eng_weight){names[i], ENG_DTYPE_F32, values[i], 2, {rows[i], E, 0, 0}};
        half[4 + i] = full[4 + i] =
            (eng_weight){names[4 + i], ENG_DTYPE_F32, bias[i], 1, {rows[i], 0, 0, 0}};
    }
    eng_error err;
    int64_t H = fp32->num_heads, Hkv = fp32->num_kv_heads;
    eng_layer *l = named_layer16("bf16", half, 8, H, Hkv, &err);
    CHECKF(l && l->params16, "a bf16 layer: %s", l ? "its matrices are fp32" : err.message);
    *twin = named_layer("twin", full, 8, H, Hkv, &err);
    CHECKF(*twin != NULL, "its fp32 twin: %s", *twin ? "" : err.message);
    for (int i = 0; i < 4; i++)
        free(bits[i]), free(values[i]);
    return l;
}

/* Steps of 1, 2, 7 and 16 tokens (a decode step, speculative verifications, a short chunk) take
 * the few-row products (engine/kernels/kernels.h, eng__gemv), and the prefill the blocked ones:
 * every step within STEP_RTOL of the full layer, and a layer of bf16 weights, which reads them in
 * 16 bits, gives the bits of its fp32 twin at every step. */
static void test_few_row_steps_of_a_16bit_layer_give_its_fp32_twins_bits(void)
{
    enum { P = 21, STEPS = 5 };
    static const int64_t lengths[STEPS] = {1, 1, 2, 7, 16};
    layer_spec sp = {.E = 48, .H = 6, .Hkv = 2};
    run_opts o = {.positional = ENG_POSITIONAL_ROPE};
    eng_layer *base = layer_new(&sp, 6), *twin = NULL;
    eng_layer *half = base ? bf16_layer_new(base, &twin) : NULL;
    if (!half || !twin) {
        eng_layer_free(base), eng_layer_free(half), eng_layer_free(twin);
        return;
    }
    int64_t E = sp.E, N = P + 27;
    uint64_t rng = 78;
    float *x = xcalloc((size_t)(N * E), sizeof(float));
    for (int64_t i = 0; i < N * E; i++)
        x[i] = rng_sym(&rng, 1.0);
    cache c16 = cache_new(half, ENG_DTYPE_F32, (size_t)16 << 20, 0);
    cache c32 = cache_new(twin, ENG_DTYPE_F32, (size_t)16 << 20, 0);
    float *o16 = xcalloc((size_t)(N * E), sizeof(float)),
          *o32 = xcalloc((size_t)(N * E), sizeof(float));
    int64_t n0 = 0;
    double worst = 0;
    for (int s = -1; s < STEPS && c16.seq && c32.seq; s++) {
        int64_t L = s < 0 ? P : lengths[s];
        for (int k = 0; k < 2; k++) {
            eng_mha_args a = args_of(k ? twin : half, &o, x + n0 * E, L, k ? o32 : o16);
            a.align = ENG_ALIGN_BOTTOM_RIGHT;
            a.kv_cache = k ? c32.seq : c16.seq;
            eng_error err;
            CHECKF(eng_mha(pool, &a, NULL, &err) == ENG_OK, "step of %lld at %lld: %s",
                   (long long)L, (long long)n0, err.message);
        }
        CHECKF(memcmp(o16, o32, (size_t)(L * E) * sizeof(float)) == 0,
               "step of %lld at %lld: the bf16 layer's bits are not its fp32 twin's", (long long)L,
               (long long)n0);
        float *full = full_layer(twin, &o, x, n0 + L, NULL);
        worst = fmax(worst, rel_diff(o32, full + n0 * E, (size_t)(L * E)));
        free(full);
        n0 += L;
    }
    CHECKF(worst <= STEP_RTOL, "the steps differ from the full layer by %.3g x max|out|", worst);
    printf("     steps of 1 to 16 tokens within %.2e x max|out| of the full layer\n", worst);
    cache_free(&c16);
    cache_free(&c32);
    free(x), free(o16), free(o32);
    eng_layer_free(base), eng_layer_free(half), eng_layer_free(twin);
}

/* ---- What a step refuses ------------------------------------------------------------------ */

/* eng_mha on `a` must fail with `status`, its field `field` and a message containing `text`,
 * and leave the cache's length at `length`. */
/* The cause of the last refusal expect_refused saw. */
static eng_cause last_cause;

static void expect_refused(eng_mha_args *a, eng_ctl *ctl, eng_status status, const char *field,
                           const char *text, int64_t length)
{
    eng_error err;
    memset(&err, 0, sizeof err);
    eng_status st = eng_mha(pool, a, ctl, &err);
    last_cause = err.cause;
    CHECKF(st == status && strcmp(err.field, field) == 0 && strstr(err.message, text),
           "expected %s on '%s' mentioning '%s'; got %s on '%s': %s", eng_status_str(status), field,
           text, eng_status_str(st), err.field, err.message);
    CHECK_EQ_INT(eng_kv_seq_length(a->kv_cache), length);
}

static void test_options_without_meaning_over_a_cache_are_refused(void)
{
    uint64_t rng = 9;
    layer_spec sp = {.E = 16, .H = 2};
    eng_layer *l = layer_new(&sp, 3);
    layer_spec bsp = {.E = 16, .H = 2, .bias_kv = true};
    eng_layer *lbias = layer_new(&bsp, 4);
    if (!l || !lbias)
        return;
    float x[2 * 4 * 16], out[2 * 4 * 16], wts[2 * 8];
    uint8_t padding[4] = {0};
    for (size_t i = 0; i < sizeof x / sizeof x[0]; i++)
        x[i] = rng_sym(&rng, 1.0);
    cache c = cache_new(l, ENG_DTYPE_F32, (size_t)1 << 20, 0);
    run_opts none = {0};
    eng_mha_args ok = args_of(l, &none, x, 4, out);
    ok.align = ENG_ALIGN_BOTTOM_RIGHT;
    ok.kv_cache = c.seq;
    eng_error err;
    CHECK_EQ_INT(eng_mha(pool, &ok, NULL, &err), ENG_OK); /* the cache holds 4 tokens */

    eng_mha_args a = ok;
    a.layer = lbias;
    expect_refused(&a, NULL, ENG_EINVAL, "layer", "bias_k", 4);
    a = ok;
    a.add_zero_attn = true;
    expect_refused(&a, NULL, ENG_EINVAL, "add_zero_attn", "add_zero_attn", 4);
    a = ok;
    a.key_padding = padding;
    expect_refused(&a, NULL, ENG_EINVAL, "key_padding", "key_padding", 4);
    a = ok;
    a.attn_mask = (eng_mask){ENG_MASK_BOOL, padding, {1, 1, 1, 4}, {0, 0, 0, 1}};
    expect_refused(&a, NULL, ENG_EINVAL, "attn_mask", "attn_mask", 4);
    a = ok;
    a.key_in = a.value_in = x;
    a.S = 4;
    expect_refused(&a, NULL, ENG_EINVAL, "memory", "self-attention", 4);
    a = ok;
    a.B = 2;
    expect_refused(&a, NULL, ENG_EINVAL, "input", "one sequence", 4);
    a = ok;
    a.align = ENG_ALIGN_TOP_LEFT;
    expect_refused(&a, NULL, ENG_EINVAL, "align", "ENG_ALIGN_BOTTOM_RIGHT", 4);
    /* Attention options go through eng_sdpa's checks before anything is projected. */
    a = ok;
    a.window_left_set = true;
    a.window_left = -1;
    expect_refused(&a, NULL, ENG_EINVAL, "window", "window", 4);
    /* Weights over the cache are accepted: [1, H, L, n + L]. */
    a = ok;
    a.L = 1;
    a.weights_mode = ENG_WEIGHTS_MEAN;
    a.weights = wts;
    CHECK_EQ_INT(eng_mha(pool, &a, NULL, &err), ENG_OK);
    CHECK_EQ_INT(eng_kv_seq_length(c.seq), 5);
    double sum = 0;
    for (int j = 0; j < 5; j++)
        sum += wts[j];
    CHECK_NEAR(sum, 1.0, 1e-5);
    cache_free(&c);
    eng_layer_free(lbias);
    eng_layer_free(l);
}

static void test_cache_of_another_shape_is_refused_naming_it(void)
{
    layer_spec sp = {.E = 32, .H = 4, .Hkv = 2};
    eng_layer *l = layer_new(&sp, 6);
    if (!l)
        return;
    float x[32] = {0}, out[32];
    const struct {
        eng_kv_shape shape;
        const char *dim;
    } wrong[] = {{{.num_kv_heads = 4, .head_dim = 8}, "num_kv_heads 4"},
                 {{.num_kv_heads = 2, .head_dim = 16}, "head_dim 16"},
                 {{.num_kv_heads = 2, .head_dim = 8, .value_head_dim = 4}, "value_head_dim 4"}};
    eng_error err;
    eng_kv_pool *kvp = eng_kv_pool_new((size_t)1 << 20, 16, &err);
    for (size_t i = 0; kvp && i < sizeof wrong / sizeof wrong[0]; i++) {
        eng_kv_seq *seq = eng_kv_seq_new(kvp, &wrong[i].shape, &err);
        if (!seq)
            continue;
        run_opts none = {0};
        eng_mha_args a = args_of(l, &none, x, 1, out);
        a.align = ENG_ALIGN_BOTTOM_RIGHT;
        a.kv_cache = seq;
        expect_refused(&a, NULL, ENG_EINVAL, "kv_cache", wrong[i].dim, 0);
        eng_kv_seq_free(seq);
    }
    eng_kv_pool_free(kvp);
    eng_layer_free(l);
}

/* A full pool, a cancelled call and max_tokens each fail the step, leaving the length as it
 * was; the cache then goes on as if they had never been. */
static void test_failed_steps_leave_the_cache_as_it_was(void)
{
    uint64_t rng = 13;
    layer_spec sp = {.E = 16, .H = 2};
    eng_layer *l = layer_new(&sp, 8);
    if (!l)
        return;
    int64_t E = 16, D = 8, N = 20;
    float *x = xcalloc((size_t)(N * E), sizeof(float));
    float *out = xcalloc((size_t)(N * E), sizeof(float));
    for (int64_t i = 0; i < N * E; i++)
        x[i] = rng_sym(&rng, 1.0);
    /* Room for two blocks of 16 tokens (2 kv heads, K and V of D floats each): one for the
     * sequence under test, one for another sequence of the same pool. */
    size_t block = (size_t)16 * 2 * (size_t)(D + D) * sizeof(float);
    cache c = cache_new(l, ENG_DTYPE_F32, 2 * block, 0);
    eng_error err;
    eng_kv_shape shape = eng_kv_seq_shape(c.seq);
    eng_kv_seq *other = eng_kv_seq_new(c.kvp, &shape, &err);
    run_opts none = {0};
    eng_mha_args a = args_of(l, &none, x, 1, out);
    a.align = ENG_ALIGN_BOTTOM_RIGHT;
    a.kv_cache = other;
    CHECK_EQ_INT(eng_mha(pool, &a, NULL, &err), ENG_OK); /* the other block */
    a.kv_cache = c.seq;
    a.L = 15;
    CHECK_EQ_INT(eng_mha(pool, &a, NULL, &err), ENG_OK);
    CHECK_EQ_INT(eng_kv_seq_append_bytes(c.seq, 1), 0);     /* the 16th fits the block */
    CHECK_EQ_INT(eng_kv_seq_append_bytes(c.seq, 2), block); /* the 17th needs a second */

    /* Two more tokens need a third block: the pool is full when the projections are done. */
    a.x = x + 15 * E;
    a.L = 2;
    expect_refused(&a, NULL, ENG_ENOMEM, "kv_cache_bytes", "full", 15);
    CHECK_EQ_INT(last_cause, ENG_CAUSE_KV_CACHE_FULL);
    eng_kv_seq_free(other);

    eng_ctl ctl;
    atomic_init(&ctl.cancel, true);
    ctl.deadline_ns = 0;
    a.L = 1;
    expect_refused(&a, &ctl, ENG_ECANCELLED, "", "cancelled", 15);
    cache_free(&c);

    c = cache_new(l, ENG_DTYPE_F32, (size_t)1 << 20, 16);
    a.kv_cache = c.seq;
    a.x = x;
    a.L = 15;
    CHECK_EQ_INT(eng_mha(pool, &a, NULL, &err), ENG_OK);
    a.x = x + 15 * E;
    a.L = 2;
    expect_refused(&a, NULL, ENG_ETOOBIG, "max_tokens", "max_tokens = 16", 15);
    CHECK_EQ_INT(last_cause, ENG_CAUSE_MAX_TOKENS);

    /* The refused steps left nothing: the next token gives the full layer's row 15. */
    a.L = 1;
    CHECK_EQ_INT(eng_mha(pool, &a, NULL, &err), ENG_OK);
    float *full = full_layer(l, &none, x, 16, NULL);
    CHECKF(rel_diff(out, full + 15 * E, (size_t)E) <= STEP_RTOL,
           "after the failed steps the cache no longer gives the full layer");
    free(full);
    cache_free(&c);
    free(out);
    free(x);
    eng_layer_free(l);
}

/* The memory a step reserves: the projections of its own tokens and the attention's scratch
 * over the cache, not buffers of the whole history, which the full layer needs. */
static void test_step_scratch_counts_the_new_tokens_not_the_history(void)
{
    uint64_t rng = 21;
    layer_spec sp = {.E = 64, .H = 4};
    eng_layer *l = layer_new(&sp, 10);
    if (!l)
        return;
    int64_t E = 64, N = 1024;
    float *x = xcalloc((size_t)(N * E), sizeof(float));
    float *out = xcalloc((size_t)(N * E), sizeof(float));
    for (int64_t i = 0; i < N * E; i++)
        x[i] = rng_sym(&rng, 1.0);
    cache c = cache_new(l, ENG_DTYPE_F32, (size_t)64 << 20, 0);
    run_opts none = {0};
    eng_mha_args a = args_of(l, &none, x, N - 1, out);
    a.align = ENG_ALIGN_BOTTOM_RIGHT;
    a.kv_cache = c.seq;
    eng_error err;
    CHECK_EQ_INT(eng_mha(pool, &a, NULL, &err), ENG_OK);
    a.x = x + (N - 1) * E;
    a.L = 1;
    int threads = eng_pool_threads(pool);
    size_t step = eng_mha_scratch_bytes(&a, threads);
    eng_mha_args whole = args_of(l, &none, x, N, out);
    size_t all = eng_mha_scratch_bytes(&whole, threads);
    /* At least the step's q, its k|v row and its attention output. */
    CHECKF(step >= (size_t)(4 * E) * sizeof(float) && step * 4 < all,
           "a one-token step reserves %zu bytes; the full layer over %lld tokens %zu", step,
           (long long)N, all);
    a.add_zero_attn = true; /* refused: nothing to reserve */
    CHECK_EQ_INT(eng_mha_scratch_bytes(&a, threads), 0);
    cache_free(&c);
    free(out);
    free(x);
    eng_layer_free(l);
}

int main(void)
{
    int status;
    if (test_engine_start(&pool, &status))
        return status;
    RUN_WITHIN(test_steps_without_positions_equal_the_full_causal_layer, 60);
    RUN_WITHIN(test_steps_with_rope_turn_q_and_k_at_their_positions, 60);
    RUN_WITHIN(test_steps_add_the_sinusoid_at_their_positions, 60);
    RUN_WITHIN(test_steps_with_alibi_bias_distances_over_the_whole_cache, 60);
    RUN_WITHIN(test_grouped_query_layer_steps_share_kv_heads, 60);
    RUN_WITHIN(test_step_weights_are_the_full_layers_rows, 60);
    RUN_WITHIN(test_bf16_layer_steps_over_a_bf16_cache, 60);
    RUN_WITHIN(test_few_row_steps_of_a_16bit_layer_give_its_fp32_twins_bits, 60);
    RUN_WITHIN(test_options_without_meaning_over_a_cache_are_refused, 60);
    RUN_WITHIN(test_cache_of_another_shape_is_refused_naming_it, 60);
    RUN_WITHIN(test_failed_steps_leave_the_cache_as_it_was, 60);
    RUN_WITHIN(test_step_scratch_counts_the_new_tokens_not_the_history, 60);
    eng_pool_free(pool);
    return check_report();
}
