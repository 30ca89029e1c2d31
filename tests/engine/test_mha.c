/*
 * test_mha.c - the specification of eng_mha, the multi-head attention layer
 * (docs/semantics.md#multi-head-attention-layers, engine.h), checked against the float64
 * reference of tests/support/ref_mha.c.
 *
 * Layers here are assembled by hand from test-owned arrays (eng_layer is a public struct), so
 * a failure points at the forward pass, not at eng_layer_new (tests/engine/
 * test_layer.c covers assembly). Each randomised case runs the engine and the reference on one
 * eng_mha_args and compares:
 *
 * - output: max |engine - reference| <= 1e-4 * max |reference output|. The engine's
 *   projections are fp32 sgemm with inner dimensions up to 512: each projected value carries a
 *   relative rounding error of order sqrt(K) 2^-24, about 1e-6. The scores built from those
 *   inherit ~1e-6 relative error, which moves the softmax output by ~1e-6 of max|V| (the SDPA
 *   analysis in test_sdpa.c), and the output projection adds another ~1e-6 relative. Together a
 *   few 1e-6 of the output scale, so 1e-4 leaves more than ten times headroom (measured: the
 *   worst of the 1000 random cases uses under 1% of the tolerance). What the tests
 *   are after is far larger: one key wrongly shown or hidden shifts a weight by >= 1/S' (>= 0.02
 *   here) and the output by about that fraction of its scale; a missing bias, a position off
 *   by one, or a wrong RoPE pair moves outputs by tens of percent.
 * - weights: absolute 2e-5 (weights are at most 1 and carry the ~1e-6 score error), and exactly
 *   0 wherever the reference says the key is invisible.
 * - nothing is NaN.
 *
 * Sizes shrink when ATTND_TEST_QUICK=1 (the sanitizer runs).
 */
#include "engine/engine.h"
#include "tests/support/check.h"
#include "tests/support/named_layer.h"
#include "tests/support/ref_mha.h"
#include "tests/support/util.h"

#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define OUT_RTOL    1e-4
#define WEIGHT_ATOL 2e-5

static eng_pool *pool;
static bool quick;

/* ---- Small helpers ------------------------------------------------------------------------ */

static void fill_sym(float *p, size_t n, double amp, uint64_t *rng)
{
    for (size_t i = 0; i < n; i++)
        p[i] = rng_sym(rng, amp);
}

/* ---- Layers built by hand ------------------------------------------------------------------ */

typedef struct {
    int64_t E, H, Hkv;  /* Hkv 0: H */
    int64_t kdim, vdim; /* 0: E */
    bool bias;          /* b_q, b_k, b_v, b_o */
    bool bias_kv;       /* add_bias_kv */
} layer_spec;

/* An engine layer and the reference's view of the very same arrays. */
typedef struct {
    eng_layer *layer;
    ref_mha_weights w;
} layer_pair;

static float *take(float **at, int64_t n)
{
    float *p = *at;
    *at += n;
    return p;
}

/* Weights uniform in +-1/sqrt(fan_in) as torch initialises them; biases and bias_kv in +-0.5,
 * large enough that leaving one out shows. */
static layer_pair layer_make(const layer_spec *sp, uint64_t seed)
{
    uint64_t rng = seed;
    int64_t E = sp->E, H = sp->H, Hkv = sp->Hkv ? sp->Hkv : sp->H, D = E / H, W = Hkv * D;
    int64_t kdim = sp->kdim ? sp->kdim : E, vdim = sp->vdim ? sp->vdim : E;
    int64_t total =
        2 * E * E + W * (kdim + vdim) + (sp->bias ? 2 * E + 2 * W : 0) + (sp->bias_kv ? 2 * W : 0);
    eng_layer *l = xcalloc(1, sizeof *l);
    snprintf(l->name, sizeof l->name, "test");
    snprintf(l->dtype, sizeof l->dtype, "F32");
    l->embed_dim = E;
    l->num_heads = H;
    l->num_kv_heads = Hkv;
    l->kdim = kdim;
    l->vdim = vdim;
    l->params = xcalloc((size_t)total, sizeof(float));
    float *at = l->params;
    l->w_q = take(&at, E * E);
    l->w_k = take(&at, W * kdim);
    l->w_v = take(&at, W * vdim);
    l->w_o = take(&at, E * E);
    fill_sym(l->w_q, (size_t)(E * E), 1.0 / sqrt((double)E), &rng);
    fill_sym(l->w_k, (size_t)(W * kdim), 1.0 / sqrt((double)kdim), &rng);
    fill_sym(l->w_v, (size_t)(W * vdim), 1.0 / sqrt((double)vdim), &rng);
    fill_sym(l->w_o, (size_t)(E * E), 1.0 / sqrt((double)E), &rng);
    if (sp->bias) {
        l->b_q = take(&at, E);
        l->b_k = take(&at, W);
        l->b_v = take(&at, W);
        l->b_o = take(&at, E);
        fill_sym(l->b_q, (size_t)E, 0.5, &rng);
        fill_sym(l->b_k, (size_t)W, 0.5, &rng);
        fill_sym(l->b_v, (size_t)W, 0.5, &rng);
        fill_sym(l->b_o, (size_t)E, 0.5, &rng);
    }
    if (sp->bias_kv) {
        l->bias_k = take(&at, W);
        l->bias_v = take(&at, W);
        fill_sym(l->bias_k, (size_t)W, 1.0, &rng);
        fill_sym(l->bias_v, (size_t)W, 1.0, &rng);
    }
    layer_pair lp = {l, ref_mha_weights_of_layer(l)};
    return lp;
}

static void layer_pair_free(layer_pair *lp)
{
    eng_layer_free(lp->layer);
    lp->layer = NULL;
}

/* ---- Inputs -------------------------------------------------------------------------------- */

/* Arguments with their input buffers: x [B, L, E] and, for cross-attention, memory. */
typedef struct {
    eng_mha_args a;
    float *x, *mk, *mv;
} io;

/* S == 0: self-attention. shared: one memory tensor for keys and values (kdim == vdim). */
static io io_make(const layer_pair *lp, int64_t B, int64_t L, int64_t S, bool shared, uint64_t *rng)
{
    io c;
    memset(&c, 0, sizeof c);
    const eng_layer *l = lp->layer;
    c.x = xcalloc((size_t)(B * L * l->embed_dim), sizeof(float));
    fill_sym(c.x, (size_t)(B * L * l->embed_dim), 1.0, rng);
    c.a.layer = l;
    c.a.B = B;
    c.a.L = L;
    c.a.x = c.x;
    if (S > 0) {
        c.mk = xcalloc((size_t)(B * S * l->kdim), sizeof(float));
        fill_sym(c.mk, (size_t)(B * S * l->kdim), 1.0, rng);
        if (shared) {
            c.mv = c.mk;
        } else {
            c.mv = xcalloc((size_t)(B * S * l->vdim), sizeof(float));
            fill_sym(c.mv, (size_t)(B * S * l->vdim), 1.0, rng);
        }
        c.a.S = S;
        c.a.key_in = c.mk;
        c.a.value_in = c.mv;
    }
    return c;
}

static void io_free(io *c)
{
    if (c->mv != c->mk)
        free(c->mv);
    free(c->mk);
    free(c->x);
    memset(c, 0, sizeof *c);
}

/* A mask of shape ne (each 1 or the full extent), contiguous strides. Boolean entries are true
 * with probability p_true; float entries uniform in [-2, 2], -inf with probability 1 - p_true. */
static void *mask_make(eng_mask *m, eng_mask_kind kind, int64_t n0, int64_t n1, int64_t n2,
                       int64_t n3, double p_true, uint64_t *rng)
{
    memset(m, 0, sizeof *m);
    m->kind = kind;
    m->ne[0] = n0, m->ne[1] = n1, m->ne[2] = n2, m->ne[3] = n3;
    m->stride[3] = 1;
    m->stride[2] = n3;
    m->stride[1] = n2 * n3;
    m->stride[0] = n1 * n2 * n3;
    size_t n = (size_t)(n0 * n1 * n2 * n3);
    void *data;
    if (kind == ENG_MASK_BOOL) {
        uint8_t *b = xcalloc(n, 1);
        for (size_t i = 0; i < n; i++)
            b[i] = rng_unit(rng) < p_true;
        data = b;
    } else {
        float *f = xcalloc(n, sizeof(float));
        for (size_t i = 0; i < n; i++)
            f[i] = rng_unit(rng) < p_true ? rng_sym(rng, 2.0) : -INFINITY;
        data = f;
    }
    m->data = data;
    return data;
}

/* ---- Engine against reference -------------------------------------------------------------- */

static int64_t keys_of(const eng_mha_args *a)
{
    return a->key_in ? a->S : a->L;
}

/* Runs eng_mha and ref_mha on `a` and compares as the file comment says. When `got` is not
 * NULL it receives the engine's output (caller frees). Returns the worst output error divided
 * by the tolerance (> 1 means failed). */
static double expect_matches_reference(const layer_pair *lp, eng_mha_args *a, const char *note,
                                       float **got)
{
    a->layer = lp->layer;
    int64_t B = a->B, L = a->L, E = lp->layer->embed_dim, H = lp->layer->num_heads;
    int64_t Sx = keys_of(a) + eng_mha_extra_keys(a);
    size_t nout = (size_t)(B * L * E);
    size_t nw = a->weights_mode == ENG_WEIGHTS_PER_HEAD ? (size_t)(B * H * L * Sx)
                : a->weights_mode == ENG_WEIGHTS_MEAN   ? (size_t)(B * L * Sx)
                                                        : 0;
    float *out = xcalloc(nout, sizeof(float));
    float *wts = nw ? xcalloc(nw, sizeof(float)) : NULL;
    for (size_t i = 0; i < nout; i++)
        out[i] = NAN; /* every element must be written */
    for (size_t i = 0; i < nw; i++)
        wts[i] = NAN;
    a->out = out;
    a->weights = wts;

    eng_error err;
    memset(&err, 0, sizeof err);
    eng_status st = eng_mha(pool, a, NULL, &err);
    CHECKF(st == ENG_OK, "%s: eng_mha returned %s (field '%s': %s)", note, eng_status_str(st),
           err.field, err.message);
    double ratio = INFINITY;
    ref_mha_result r;
    if (!ref_mha(&lp->w, a, &r)) {
        fprintf(stderr, "test_mha: the reference ran out of memory\n");
        abort();
    }
    if (st == ENG_OK) {
        double scale = 0;
        for (size_t i = 0; i < nout; i++)
            scale = fmax(scale, fabs(r.out[i]));
        double tol = OUT_RTOL * fmax(scale, 1e-3), worst = 0;
        size_t at = 0, nans = 0;
        for (size_t i = 0; i < nout; i++) {
            double e = fabs((double)out[i] - r.out[i]);
            if (isnan(e))
                nans++;
            else if (e > worst)
                worst = e, at = i;
        }
        ratio = nans ? INFINITY : worst / tol;
        CHECKF(nans == 0 && worst <= tol,
               "%s: output max error %.3g at [b %lld, i %lld, c %lld] (engine %.9g, reference "
               "%.9g), tolerance %.3g; %zu NaN",
               note, worst, (long long)(at / (size_t)(L * E)),
               (long long)(at / (size_t)E % (size_t)L), (long long)(at % (size_t)E),
               (double)out[at], r.out[at], tol, nans);
        if (nw) {
            const double *rw = a->weights_mode == ENG_WEIGHTS_MEAN ? r.weights_mean : r.weights;
            double wworst = 0;
            size_t wat = 0, not_zero = 0, wnans = 0;
            for (size_t i = 0; i < nw; i++) {
                double e = fabs((double)wts[i] - rw[i]);
                if (isnan(e))
                    wnans++;
                else if (e > wworst)
                    wworst = e, wat = i;
                if (rw[i] == 0.0 && wts[i] != 0.0)
                    not_zero++;
            }
            CHECKF(wnans == 0 && wworst <= WEIGHT_ATOL,
                   "%s: %s weights max error %.3g at flat index %zu of [.., %lld keys] (engine "
                   "%.9g, reference %.9g); %zu NaN",
                   note, a->weights_mode == ENG_WEIGHTS_MEAN ? "mean" : "per-head", wworst, wat,
                   (long long)Sx, (double)wts[wat], rw[wat], wnans);
            CHECKF(not_zero == 0, "%s: %zu weights of invisible keys are not exactly 0", note,
                   not_zero);
        }
    }
    ref_mha_result_free(&r);
    free(wts);
    a->weights = NULL;
    a->out = NULL;
    if (got)
        *got = out;
    else
        free(out);
    return ratio;
}

/* ---- Projections, self and cross attention -------------------------------------------------- */

static void test_self_attention_on_unbatched_input_matches_reference(void)
{
    uint64_t rng = 101;
    layer_spec sp = {.E = 32, .H = 4, .bias = true};
    layer_pair lp = layer_make(&sp, 1);
    io c = io_make(&lp, 1, 13, 0, false, &rng); /* [L, E] is B = 1 */
    expect_matches_reference(&lp, &c.a, "[L,E] input, with biases", NULL);
    io_free(&c);
    layer_pair_free(&lp);
}

static void test_self_attention_on_batched_input_matches_reference(void)
{
    uint64_t rng = 102;
    layer_spec sp = {.E = 48, .H = 6, .bias = true};
    layer_pair lp = layer_make(&sp, 2);
    io c = io_make(&lp, 3, 17, 0, false, &rng);
    expect_matches_reference(&lp, &c.a, "[B,L,E] input, B = 3", NULL);
    io_free(&c);
    layer_pair_free(&lp);
}

/* Every batch is independent: batch b of a B = 3 call equals a B = 1 call on batch b alone. */
static void test_batches_are_independent(void)
{
    uint64_t rng = 103;
    layer_spec sp = {.E = 32, .H = 4, .bias = true};
    layer_pair lp = layer_make(&sp, 3);
    io c = io_make(&lp, 3, 9, 0, false, &rng);
    c.a.causal = true;
    float *all = NULL;
    expect_matches_reference(&lp, &c.a, "B = 3, causal", &all);
    for (int64_t b = 0; b < 3 && all; b++) {
        eng_mha_args one = c.a;
        one.B = 1;
        one.x = c.x + b * 9 * 32;
        float *single = NULL;
        expect_matches_reference(&lp, &one, "one batch alone", &single);
        double diff = 0;
        for (int64_t i = 0; single && i < 9 * 32; i++)
            diff = fmax(diff, fabs((double)single[i] - all[b * 9 * 32 + i]));
        CHECKF(diff <= 1e-6, "batch %lld differs by %g between the B = 3 call and a B = 1 call",
               (long long)b, diff);
        free(single);
    }
    free(all);
    io_free(&c);
    layer_pair_free(&lp);
}

static void test_projections_without_biases_match_reference(void)
{
    uint64_t rng = 104;
    layer_spec sp = {.E = 40, .H = 5, .bias = false};
    layer_pair lp = layer_make(&sp, 4);
    io c = io_make(&lp, 2, 11, 0, false, &rng);
    expect_matches_reference(&lp, &c.a, "no biases", NULL);
    io_free(&c);
    layer_pair_free(&lp);
}

/* A torch state dict's packed in_proj_weight [3E, E] (rows W_q; W_k; W_v), with in_proj_bias
 * and without, assembled by eng_layer_new; the reference reads the packed array. */
static void test_packed_in_proj_with_and_without_biases(void)
{
    enum { E = 32, H = 4 };
    uint64_t rng = 109;
    float *in_w = xcalloc(3 * E * E, sizeof(float)), *in_b = xcalloc(3 * E, sizeof(float));
    float *out_w = xcalloc(E * E, sizeof(float)), *out_b = xcalloc(E, sizeof(float));
    fill_sym(in_w, 3 * E * E, 1.0 / sqrt((double)E), &rng);
    fill_sym(in_b, 3 * E, 0.5, &rng);
    fill_sym(out_w, E * E, 1.0 / sqrt((double)E), &rng);
    fill_sym(out_b, E, 0.5, &rng);
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        eng_weight t[4] = {{"in_proj_weight", ENG_DTYPE_F32, in_w, 2, {3 * E, E}},
                           {"out_proj.weight", ENG_DTYPE_F32, out_w, 2, {E, E}},
                           {"in_proj_bias", ENG_DTYPE_F32, in_b, 1, {3 * E}},
                           {"out_proj.bias", ENG_DTYPE_F32, out_b, 1, {E}}};
        eng_error err;
        eng_layer *l = named_layer("packed", t, with_bias ? 4 : 2, H, 0, &err);
        CHECKF(l != NULL, "packed layer refused: %s", l ? "" : err.message);
        if (!l)
            continue;
        ref_mha_weights w = {.embed_dim = E,
                             .num_heads = H,
                             .num_kv_heads = H,
                             .kdim = E,
                             .vdim = E,
                             .w_q = in_w,
                             .w_k = in_w + E * E,
                             .w_v = in_w + 2 * E * E,
                             .w_o = out_w};
        if (with_bias) {
            w.b_q = in_b, w.b_k = in_b + E, w.b_v = in_b + 2 * E, w.b_o = out_b;
        }
        layer_pair lp = {l, w};
        io c = io_make(&lp, 2, 9, 0, false, &rng);
        c.a.causal = true;
        c.a.weights_mode = ENG_WEIGHTS_MEAN;
        expect_matches_reference(
            &lp, &c.a,
            with_bias ? "packed in_proj with in_proj_bias" : "packed in_proj without biases", NULL);
        io_free(&c);
        eng_layer_free(l);
    }
    free(in_w), free(in_b), free(out_w), free(out_b);
}

/* More tokens than one projection task takes (128 rows), so the projections split. */
static void test_long_inputs_span_several_projection_chunks(void)
{
    uint64_t rng = 105;
    layer_spec sp = {.E = 64, .H = 4, .bias = true};
    layer_pair lp = layer_make(&sp, 5);
    io c = io_make(&lp, 2, quick ? 150 : 300, 0, false, &rng);
    c.a.causal = true;
    expect_matches_reference(&lp, &c.a, "L > 128, causal", NULL);
    io_free(&c);
    io c2 = io_make(&lp, 1, 7, quick ? 140 : 333, false, &rng);
    expect_matches_reference(&lp, &c2.a, "cross-attention, S > 128", NULL);
    io_free(&c2);
    layer_pair_free(&lp);
}

/* kdim != vdim != E: separate q/k/v projections, keys and values from two memory tensors. */
static void test_cross_attention_with_separate_key_and_value_inputs(void)
{
    uint64_t rng = 106;
    layer_spec sp = {.E = 32, .H = 4, .kdim = 20, .vdim = 28, .bias = true};
    layer_pair lp = layer_make(&sp, 6);
    io c = io_make(&lp, 2, 9, 14, false, &rng);
    expect_matches_reference(&lp, &c.a, "cross, kdim 20, vdim 28", NULL);
    c.a.L = 1; /* one query against many keys */
    expect_matches_reference(&lp, &c.a, "cross, kdim 20, vdim 28, L = 1", NULL);
    io_free(&c);
    layer_pair_free(&lp);
}

/* With precision bfloat16 every product takes bf16 operands: the output stays within 1e-2 of
 * the float64 reference's largest value (four roundings of about 2^-9 each, relative: the input,
 * the weights, Q/K/V and P, and the attention output), and differs from the float32 layer's,
 * which shows the rounding happened. Where the kernel set computes float32 (openblas), the
 * call must match the float32 tolerance instead. Self and cross attention, causal, GQA. */
static void check_bf16_layer(const layer_pair *lp, eng_mha_args *a, const char *note)
{
    float *fp32 = NULL;
    a->precision = ENG_PRECISION_FLOAT32;
    expect_matches_reference(lp, a, note, &fp32);
    a->precision = ENG_PRECISION_BFLOAT16;
    bool bf16 = eng_mha_precision(a) == ENG_PRECISION_BFLOAT16;
    size_t n = (size_t)(a->B * a->L * lp->layer->embed_dim);
    float *out = xcalloc(n, sizeof(float));
    a->out = out;
    eng_error err;
    CHECK_EQ_INT(eng_mha(pool, a, NULL, &err), ENG_OK);
    ref_mha_result r;
    if (!ref_mha(&lp->w, a, &r)) {
        fprintf(stderr, "test_mha: the reference ran out of memory\n");
        abort();
    }
    double scale = 1e-3, worst = 0, moved = 0;
    for (size_t i = 0; i < n; i++)
        scale = fmax(scale, fabs(r.out[i]));
    for (size_t i = 0; i < n; i++) {
        worst = fmax(worst, fabs((double)out[i] - r.out[i]));
        moved = fmax(moved, fabs((double)out[i] - (double)fp32[i]));
    }
    if (bf16) {
        CHECKF(worst <= 1e-2 * scale, "%s: bf16 layer error %.3g > 1e-2 x %.3g", note, worst,
               scale);
        CHECKF(moved > 1e-6 * scale, "%s: the bf16 layer gave the float32 result (%.3g)", note,
               moved);
        printf("  %s: bf16 layer max error %.2e x max|out|\n", note, worst / scale);
    } else {
        CHECKF(worst <= OUT_RTOL * scale, "%s: float32 fallback error %.3g", note, worst);
    }
    ref_mha_result_free(&r);
    a->out = NULL;
    a->precision = ENG_PRECISION_FLOAT32;
    free(out);
    free(fp32);
}

static void test_bfloat16_layer_rounds_every_product(void)
{
    uint64_t rng = 131;
    layer_spec sp = {.E = 64, .H = 4, .bias = true};
    layer_pair lp = layer_make(&sp, 31);
    io c = io_make(&lp, 2, 40, 0, false, &rng);
    check_bf16_layer(&lp, &c.a, "bf16 self-attention");
    c.a.causal = true;
    check_bf16_layer(&lp, &c.a, "bf16 causal self-attention");
    io_free(&c);
    layer_pair_free(&lp);

    layer_spec cross = {.E = 32, .H = 4, .Hkv = 2, .kdim = 20, .vdim = 28, .bias = true};
    lp = layer_make(&cross, 32);
    c = io_make(&lp, 2, 9, 30, false, &rng);
    check_bf16_layer(&lp, &c.a, "bf16 cross-attention, GQA");
    io_free(&c);
    layer_pair_free(&lp);
}

/* kdim == vdim: one memory tensor serves as both key and value input. */
static void test_cross_attention_with_one_memory_for_keys_and_values(void)
{
    uint64_t rng = 107;
    layer_spec sp = {.E = 32, .H = 2, .kdim = 24, .vdim = 24, .bias = true};
    layer_pair lp = layer_make(&sp, 7);
    io c = io_make(&lp, 2, 6, 10, true, &rng);
    expect_matches_reference(&lp, &c.a, "cross, shared memory, kdim = vdim = 24", NULL);
    io_free(&c);
    layer_pair_free(&lp);

    layer_spec sq = {.E = 32, .H = 4, .bias = false};
    lp = layer_make(&sq, 8);
    c = io_make(&lp, 1, 5, 12, true, &rng);
    expect_matches_reference(&lp, &c.a, "cross, memory of width E (a decoder layer)", NULL);
    io_free(&c);
    layer_pair_free(&lp);
}

/* num_kv_heads < num_heads: k/v widths Hkv * D; query head h reads kv head h / (H / Hkv). */
static void test_grouped_query_heads_match_reference(void)
{
    uint64_t rng = 108;
    const struct {
        int64_t E, H, Hkv, kdim, S;
    } cases[] = {{64, 8, 2, 0, 0}, {64, 8, 1, 0, 0}, {48, 6, 3, 0, 0}, {32, 4, 2, 20, 11}};
    for (size_t n = 0; n < sizeof cases / sizeof cases[0]; n++) {
        layer_spec sp = {.E = cases[n].E,
                         .H = cases[n].H,
                         .Hkv = cases[n].Hkv,
                         .kdim = cases[n].kdim,
                         .vdim = cases[n].kdim,
                         .bias = true};
        layer_pair lp = layer_make(&sp, 10 + n);
        io c = io_make(&lp, 2, 7, cases[n].S, false, &rng);
        c.a.weights_mode = ENG_WEIGHTS_PER_HEAD;
        char note[96];
        snprintf(note, sizeof note, "H %lld, Hkv %lld%s", (long long)cases[n].H,
                 (long long)cases[n].Hkv, cases[n].S ? ", cross" : "");
        expect_matches_reference(&lp, &c.a, note, NULL);
        io_free(&c);
        layer_pair_free(&lp);
    }
}

/* ---- Appended keys ------------------------------------------------------------------------- */

static void test_add_bias_kv_appends_one_key_after_the_inputs(void)
{
    uint64_t rng = 120;
    layer_spec sp = {.E = 32, .H = 4, .bias = true, .bias_kv = true};
    layer_pair lp = layer_make(&sp, 20);
    io c = io_make(&lp, 2, 8, 0, false, &rng);
    CHECK_EQ_INT(eng_mha_extra_keys(&c.a), 1);
    c.a.weights_mode = ENG_WEIGHTS_PER_HEAD;
    expect_matches_reference(&lp, &c.a, "add_bias_kv, self, per-head weights [B,H,L,S+1]", NULL);
    io_free(&c);
    c = io_make(&lp, 1, 5, 9, false, &rng);
    c.a.weights_mode = ENG_WEIGHTS_MEAN;
    expect_matches_reference(&lp, &c.a, "add_bias_kv, cross, mean weights [B,L,S+1]", NULL);
    io_free(&c);
    layer_pair_free(&lp);
}

static void test_add_zero_attn_appends_one_zero_key(void)
{
    uint64_t rng = 121;
    layer_spec sp = {.E = 32, .H = 4, .bias = true};
    layer_pair lp = layer_make(&sp, 21);
    io c = io_make(&lp, 2, 8, 0, false, &rng);
    c.a.add_zero_attn = true;
    CHECK_EQ_INT(eng_mha_extra_keys(&c.a), 1);
    c.a.weights_mode = ENG_WEIGHTS_PER_HEAD;
    expect_matches_reference(&lp, &c.a, "add_zero_attn, per-head weights", NULL);
    c.a.weights_mode = ENG_WEIGHTS_MEAN;
    expect_matches_reference(&lp, &c.a, "add_zero_attn, mean weights", NULL);
    io_free(&c);
    layer_pair_free(&lp);
}

/* bias_k/bias_v at S, then the zero key at S + 1 (torch's order). */
static void test_add_bias_kv_and_zero_attn_together(void)
{
    uint64_t rng = 122;
    layer_spec sp = {.E = 32, .H = 4, .Hkv = 2, .bias = true, .bias_kv = true};
    layer_pair lp = layer_make(&sp, 22);
    io c = io_make(&lp, 2, 6, 0, false, &rng);
    c.a.add_zero_attn = true;
    CHECK_EQ_INT(eng_mha_extra_keys(&c.a), 2);
    c.a.weights_mode = ENG_WEIGHTS_PER_HEAD;
    expect_matches_reference(&lp, &c.a, "bias_kv + zero_attn, GQA, per head", NULL);
    c.a.weights_mode = ENG_WEIGHTS_MEAN;
    expect_matches_reference(&lp, &c.a, "bias_kv + zero_attn, GQA, mean", NULL);
    io_free(&c);
    layer_pair_free(&lp);
}

/* Causal, a window, key padding of every key and an all-false boolean mask: the input keys are
 * all hidden, yet the appended keys stay visible to every query, with no ALiBi term. */
static void test_appended_keys_are_visible_whatever_the_masks(void)
{
    uint64_t rng = 123;
    layer_spec sp = {.E = 32, .H = 4, .bias = true, .bias_kv = true};
    layer_pair lp = layer_make(&sp, 23);
    int64_t B = 2, L = 5;
    io c = io_make(&lp, B, L, 0, false, &rng);
    c.a.add_zero_attn = true;
    uint8_t pad[2 * 5];
    memset(pad, 1, sizeof pad);
    eng_mask m;
    void *mask = mask_make(&m, ENG_MASK_BOOL, 1, 1, L, L, 0.0, &rng);
    c.a.causal = true;
    c.a.window_left_set = true;
    c.a.window_left = 0;
    c.a.key_padding = pad;
    c.a.key_padding_stride = L;
    c.a.attn_mask = m;
    c.a.positional = ENG_POSITIONAL_ALIBI;
    c.a.weights_mode = ENG_WEIGHTS_PER_HEAD;
    expect_matches_reference(&lp, &c.a, "every input key hidden; bias_kv and zero key remain",
                             NULL);
    /* Some input keys visible again: they compete with the appended ones. */
    memset(pad, 0, sizeof pad);
    free(mask);
    mask = mask_make(&m, ENG_MASK_BOOL, B, 1, L, L, 0.5, &rng);
    c.a.attn_mask = m;
    expect_matches_reference(&lp, &c.a, "appended keys with causal, window, mask and ALiBi", NULL);
    free(mask);
    io_free(&c);
    layer_pair_free(&lp);
}

/* ---- Masks and positions ------------------------------------------------------------------- */

static void test_causal_masks_match_reference(void)
{
    uint64_t rng = 130;
    layer_spec sp = {.E = 32, .H = 4, .bias = true};
    layer_pair lp = layer_make(&sp, 30);
    io c = io_make(&lp, 2, 10, 0, false, &rng);
    c.a.causal = true;
    c.a.weights_mode = ENG_WEIGHTS_PER_HEAD;
    expect_matches_reference(&lp, &c.a, "self, causal top-left", NULL);
    io_free(&c);

    c = io_make(&lp, 2, 4, 11, false, &rng);
    c.a.causal = true;
    c.a.align = ENG_ALIGN_BOTTOM_RIGHT;
    c.a.weights_mode = ENG_WEIGHTS_MEAN;
    expect_matches_reference(&lp, &c.a, "cross, causal bottom-right (L 4, S 11)", NULL);
    c.a.align = ENG_ALIGN_OFFSET;
    c.a.query_offset = 3;
    expect_matches_reference(&lp, &c.a, "cross, causal, query_offset 3", NULL);
    c.a.query_offset = -2; /* the first rows see no key: output b_o, weights 0 */
    expect_matches_reference(&lp, &c.a, "cross, causal, query_offset -2", NULL);
    io_free(&c);
    layer_pair_free(&lp);
}

/* With bias_kv or zero attention, "bottom-right" still means p_i = i + S - L with S the input
 * keys (engine.h: "S counts the input keys"), for the causal boundary as for RoPE. */
static void test_bottom_right_alignment_counts_only_input_keys(void)
{
    uint64_t rng = 131;
    layer_spec sp = {.E = 32, .H = 4, .bias = true, .bias_kv = true};
    layer_pair lp = layer_make(&sp, 31);
    io c = io_make(&lp, 1, 6, 0, false, &rng);
    c.a.causal = true;
    c.a.align = ENG_ALIGN_BOTTOM_RIGHT;
    c.a.weights_mode = ENG_WEIGHTS_PER_HEAD;
    expect_matches_reference(&lp, &c.a, "self, causal bottom-right (= top-left), bias_kv", NULL);
    io_free(&c);
    c = io_make(&lp, 1, 4, 9, false, &rng);
    c.a.causal = true;
    c.a.align = ENG_ALIGN_BOTTOM_RIGHT;
    c.a.add_zero_attn = true;
    c.a.weights_mode = ENG_WEIGHTS_PER_HEAD;
    expect_matches_reference(&lp, &c.a, "cross, causal bottom-right, bias_kv + zero_attn", NULL);
    c.a.causal = false;
    c.a.positional = ENG_POSITIONAL_ALIBI;
    expect_matches_reference(&lp, &c.a, "cross, ALiBi bottom-right, bias_kv + zero_attn", NULL);
    c.a.positional = ENG_POSITIONAL_ROPE;
    c.a.window_left_set = c.a.window_right_set = true;
    c.a.window_left = 2;
    c.a.window_right = 0;
    expect_matches_reference(&lp, &c.a, "cross, RoPE + window bottom-right, bias_kv + zero_attn",
                             NULL);
    io_free(&c);
    layer_pair_free(&lp);
}

static void test_key_padding_per_batch_and_shared(void)
{
    uint64_t rng = 132;
    layer_spec sp = {.E = 32, .H = 4, .bias = true};
    layer_pair lp = layer_make(&sp, 32);
    int64_t B = 3, L = 6, S = 9;
    io c = io_make(&lp, B, L, S, false, &rng);
    uint8_t pad[3 * 9];
    for (int64_t i = 0; i < B * S; i++)
        pad[i] = rng_unit(&rng) < 0.4;
    pad[2 * S + 0] = 1; /* batch 2: every key padded (rows see nothing) */
    for (int64_t j = 1; j < S; j++)
        pad[2 * S + j] = 1;
    c.a.key_padding = pad;
    c.a.key_padding_stride = S;
    c.a.weights_mode = ENG_WEIGHTS_PER_HEAD;
    expect_matches_reference(&lp, &c.a, "key padding [B, S]", NULL);
    c.a.key_padding_stride = 0; /* [S]: batch 0's row for every batch */
    expect_matches_reference(&lp, &c.a, "key padding [S], stride 0", NULL);
    io_free(&c);
    layer_pair_free(&lp);
}

static void test_bool_attn_mask_broadcast_shapes(void)
{
    uint64_t rng = 133;
    layer_spec sp = {.E = 32, .H = 4, .bias = true};
    layer_pair lp = layer_make(&sp, 33);
    int64_t B = 2, H = 4, L = 5, S = 7;
    io c = io_make(&lp, B, L, S, false, &rng);
    const int64_t shapes[][4] = {{1, 1, L, S}, {B, 1, L, S}, {1, H, L, S}, {B, H, L, S},
                                 {1, 1, 1, S}, {B, 1, 1, S}, {B, H, 1, S}, {1, 1, L, 1}};
    for (size_t n = 0; n < sizeof shapes / sizeof shapes[0]; n++) {
        eng_mask m;
        void *data = mask_make(&m, ENG_MASK_BOOL, shapes[n][0], shapes[n][1], shapes[n][2],
                               shapes[n][3], 0.7, &rng);
        c.a.attn_mask = m;
        c.a.weights_mode = n % 2 ? ENG_WEIGHTS_MEAN : ENG_WEIGHTS_PER_HEAD;
        char note[96];
        snprintf(note, sizeof note, "bool attn_mask [%lld,%lld,%lld,%lld]", (long long)shapes[n][0],
                 (long long)shapes[n][1], (long long)shapes[n][2], (long long)shapes[n][3]);
        expect_matches_reference(&lp, &c.a, note, NULL);
        free(data);
    }
    io_free(&c);
    layer_pair_free(&lp);
}

static void test_float_attn_mask_broadcast_shapes(void)
{
    uint64_t rng = 134;
    layer_spec sp = {.E = 32, .H = 4, .bias = true, .bias_kv = true};
    layer_pair lp = layer_make(&sp, 34);
    int64_t B = 2, H = 4, L = 6;
    io c = io_make(&lp, B, L, 0, false, &rng);
    const int64_t shapes[][4] = {{1, 1, L, L}, {B, 1, L, L}, {1, H, L, L},
                                 {B, H, L, L}, {1, 1, 1, L}, {B, H, 1, L}};
    for (size_t n = 0; n < sizeof shapes / sizeof shapes[0]; n++) {
        eng_mask m;
        void *data = mask_make(&m, ENG_MASK_FLOAT, shapes[n][0], shapes[n][1], shapes[n][2],
                               shapes[n][3], 0.8, &rng);
        c.a.attn_mask = m;
        c.a.weights_mode = ENG_WEIGHTS_PER_HEAD;
        char note[96];
        snprintf(note, sizeof note, "float attn_mask [%lld,%lld,%lld,%lld], bias_kv",
                 (long long)shapes[n][0], (long long)shapes[n][1], (long long)shapes[n][2],
                 (long long)shapes[n][3]);
        expect_matches_reference(&lp, &c.a, note, NULL);
        free(data);
    }
    io_free(&c);
    layer_pair_free(&lp);
}

static void test_sliding_window_matches_reference(void)
{
    uint64_t rng = 135;
    layer_spec sp = {.E = 32, .H = 4, .bias = true};
    layer_pair lp = layer_make(&sp, 35);
    io c = io_make(&lp, 2, 12, 0, false, &rng);
    const struct {
        bool lset, rset, causal;
        int64_t left, right;
    } w[] = {{true, false, true, 3, 0},
             {true, true, false, 2, 1},
             {false, true, false, 0, 2},
             {true, true, false, 0, 0}};
    for (size_t n = 0; n < sizeof w / sizeof w[0]; n++) {
        c.a.window_left_set = w[n].lset;
        c.a.window_right_set = w[n].rset;
        c.a.window_left = w[n].left;
        c.a.window_right = w[n].right;
        c.a.causal = w[n].causal;
        c.a.weights_mode = ENG_WEIGHTS_PER_HEAD;
        char note[96];
        snprintf(note, sizeof note, "window [%s, %s]%s", w[n].lset ? "set" : "none",
                 w[n].rset ? "set" : "none", w[n].causal ? ", causal" : "");
        expect_matches_reference(&lp, &c.a, note, NULL);
    }
    io_free(&c);
    layer_pair_free(&lp);
}

static void test_alibi_matches_reference(void)
{
    uint64_t rng = 136;
    layer_spec sp = {.E = 48, .H = 12, .bias = true}; /* 12 heads: non-power-of-two slopes */
    layer_pair lp = layer_make(&sp, 36);
    io c = io_make(&lp, 2, 9, 0, false, &rng);
    c.a.positional = ENG_POSITIONAL_ALIBI;
    c.a.weights_mode = ENG_WEIGHTS_PER_HEAD;
    expect_matches_reference(&lp, &c.a, "ALiBi, 12 heads, no mask", NULL);
    c.a.causal = true;
    expect_matches_reference(&lp, &c.a, "ALiBi, 12 heads, causal", NULL);
    io_free(&c);
    layer_pair_free(&lp);

    layer_spec s8 = {.E = 32, .H = 8, .bias = false, .bias_kv = true};
    lp = layer_make(&s8, 37);
    c = io_make(&lp, 1, 4, 10, false, &rng);
    c.a.positional = ENG_POSITIONAL_ALIBI;
    c.a.add_zero_attn = true;
    expect_matches_reference(&lp, &c.a, "ALiBi, 8 heads, cross, appended keys", NULL);
    io_free(&c);
    layer_pair_free(&lp);

    layer_spec s4 = {.E = 32, .H = 4, .bias = true};
    lp = layer_make(&s4, 38);
    c = io_make(&lp, 2, 4, 10, false, &rng);
    c.a.positional = ENG_POSITIONAL_ALIBI;
    c.a.align = ENG_ALIGN_BOTTOM_RIGHT;
    c.a.weights_mode = ENG_WEIGHTS_PER_HEAD;
    expect_matches_reference(&lp, &c.a, "ALiBi, cross, bottom-right", NULL);
    c.a.align = ENG_ALIGN_OFFSET;
    c.a.query_offset = 20; /* queries after every key: |p - j| grows */
    expect_matches_reference(&lp, &c.a, "ALiBi, cross, query_offset 20", NULL);
    io_free(&c);
    layer_pair_free(&lp);
}

/* Everything at once: GQA, bias_kv, zero attention, causal, window, padding, both mask kinds. */
static void test_masks_combined_match_reference(void)
{
    uint64_t rng = 137;
    layer_spec sp = {.E = 64, .H = 8, .Hkv = 4, .bias = true, .bias_kv = true};
    layer_pair lp = layer_make(&sp, 38);
    int64_t B = 2, L = 11;
    io c = io_make(&lp, B, L, 0, false, &rng);
    uint8_t pad[2 * 11];
    for (int64_t i = 0; i < B * L; i++)
        pad[i] = rng_unit(&rng) < 0.2;
    c.a.causal = true;
    c.a.window_left_set = true;
    c.a.window_left = 5;
    c.a.key_padding = pad;
    c.a.key_padding_stride = L;
    c.a.add_zero_attn = true;
    c.a.positional = ENG_POSITIONAL_ALIBI;
    eng_mask m;
    for (int kind = 0; kind < 2; kind++) {
        void *data = mask_make(&m, kind ? ENG_MASK_FLOAT : ENG_MASK_BOOL, B, 1, L, L, 0.8, &rng);
        c.a.attn_mask = m;
        c.a.weights_mode = kind ? ENG_WEIGHTS_MEAN : ENG_WEIGHTS_PER_HEAD;
        expect_matches_reference(&lp, &c.a,
                                 kind ? "all options, float mask" : "all options, bool mask", NULL);
        free(data);
    }
    io_free(&c);
    layer_pair_free(&lp);
}

/* Mean weights are the head average of the per-head weights, both with S' = S + 2 columns. */
static void test_weights_mean_is_the_head_average(void)
{
    uint64_t rng = 138;
    layer_spec sp = {.E = 32, .H = 4, .bias = true, .bias_kv = true};
    layer_pair lp = layer_make(&sp, 39);
    int64_t B = 2, H = 4, L = 5, S = 7, Sx = S + 2;
    io c = io_make(&lp, B, L, S, false, &rng);
    c.a.add_zero_attn = true;
    c.a.causal = true;
    c.a.align = ENG_ALIGN_BOTTOM_RIGHT;
    float *out = xcalloc((size_t)(B * L * 32), sizeof(float));
    float *per = xcalloc((size_t)(B * H * L * Sx), sizeof(float));
    float *mean = xcalloc((size_t)(B * L * Sx), sizeof(float));
    eng_error err;
    c.a.out = out;
    c.a.weights_mode = ENG_WEIGHTS_PER_HEAD;
    c.a.weights = per;
    CHECK_EQ_INT(eng_mha(pool, &c.a, NULL, &err), ENG_OK);
    c.a.weights_mode = ENG_WEIGHTS_MEAN;
    c.a.weights = mean;
    CHECK_EQ_INT(eng_mha(pool, &c.a, NULL, &err), ENG_OK);
    double worst = 0, row_sum_err = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < L; i++) {
            double total = 0;
            for (int64_t j = 0; j < Sx; j++) {
                double avg = 0;
                for (int64_t h = 0; h < H; h++)
                    avg += (double)per[((b * H + h) * L + i) * Sx + j] / (double)H;
                worst = fmax(worst, fabs(avg - (double)mean[(b * L + i) * Sx + j]));
                total += (double)mean[(b * L + i) * Sx + j];
            }
            row_sum_err = fmax(row_sum_err, fabs(total - 1.0));
        }
    CHECKF(worst <= 1e-6, "mean weights differ from the head average by %g", worst);
    CHECKF(row_sum_err <= 1e-5, "a row of mean weights over S' columns sums to 1 +- %g",
           row_sum_err);
    free(out);
    free(per);
    free(mean);
    io_free(&c);
    layer_pair_free(&lp);
}

/* Random layers and options, many at once: head counts and groups, self and cross attention
 * (one or two memories), biases, appended keys, every mask kind and broadcast shape, windows,
 * alignments, encodings and weight modes, each case against the reference. Bottom-right
 * alignment is combined with appended keys only in the dedicated test above, so that one
 * known failure there does not mask others here. */
static void test_random_layers_and_options_match_reference(void)
{
    uint64_t rng = 139;
    int cases = quick ? 200 : 1000, worst_case = -1;
    double worst = 0;
    static const int64_t heads[] = {1, 2, 3, 4, 6, 8};
    for (int n = 0; n < cases; n++) {
        layer_spec sp;
        memset(&sp, 0, sizeof sp);
        sp.H = heads[rng_next(&rng) % 6];
        sp.E = sp.H * 2 * (int64_t)(1 + rng_next(&rng) % 8);
        do
            sp.Hkv = 1 + (int64_t)(rng_next(&rng) % (uint64_t)sp.H);
        while (sp.H % sp.Hkv != 0);
        bool cross = rng_unit(&rng) < 0.4;
        bool shared = cross && rng_unit(&rng) < 0.4;
        if (cross) {
            sp.kdim = 1 + (int64_t)(rng_next(&rng) % 40);
            sp.vdim = shared ? sp.kdim : 1 + (int64_t)(rng_next(&rng) % 40);
        }
        sp.bias = rng_unit(&rng) < 0.7;
        sp.bias_kv = rng_unit(&rng) < 0.3;
        layer_pair lp = layer_make(&sp, 1000 + (uint64_t)n);
        int64_t B = 1 + (int64_t)(rng_next(&rng) % 3), L = 1 + (int64_t)(rng_next(&rng) % 20);
        int64_t S = cross ? 1 + (int64_t)(rng_next(&rng) % 20) : 0, Sk = cross ? S : L;
        io c = io_make(&lp, B, L, S, shared, &rng);
        eng_mha_args *a = &c.a;
        a->add_zero_attn = rng_unit(&rng) < 0.3;
        a->causal = rng_unit(&rng) < 0.4;
        int align = (int)(rng_next(&rng) % 3);
        if (align == 1 && eng_mha_extra_keys(a) > 0)
            align = 0;
        a->align = align == 0   ? ENG_ALIGN_TOP_LEFT
                   : align == 1 ? ENG_ALIGN_BOTTOM_RIGHT
                                : ENG_ALIGN_OFFSET;
        a->query_offset = (int64_t)(rng_next(&rng) % 14) - 3;
        if (rng_unit(&rng) < 0.25) {
            a->window_left_set = rng_unit(&rng) < 0.7;
            a->window_right_set = rng_unit(&rng) < 0.7;
            a->window_left = (int64_t)(rng_next(&rng) % 6);
            a->window_right = (int64_t)(rng_next(&rng) % 6);
        }
        uint8_t *pad = NULL;
        if (rng_unit(&rng) < 0.3) {
            pad = xcalloc((size_t)(B * Sk), 1);
            for (int64_t i = 0; i < B * Sk; i++)
                pad[i] = rng_unit(&rng) < 0.3;
            a->key_padding = pad;
            a->key_padding_stride = rng_unit(&rng) < 0.5 ? Sk : 0;
        }
        void *mask = NULL;
        uint64_t kind = rng_next(&rng) % 3;
        if (kind) {
            int64_t ne[4] = {B, sp.H, L, Sk};
            for (int d = 0; d < 4; d++)
                if (rng_unit(&rng) < 0.5)
                    ne[d] = 1;
            mask = mask_make(&a->attn_mask, kind == 1 ? ENG_MASK_BOOL : ENG_MASK_FLOAT, ne[0],
                             ne[1], ne[2], ne[3], 0.75, &rng);
        }
        a->positional = (eng_positional)(rng_next(&rng) % 4);
        a->rope_style = rng_unit(&rng) < 0.5 ? ENG_ROPE_HALF : ENG_ROPE_INTERLEAVED;
        a->rope_base = rng_unit(&rng) < 0.5 ? 0.0f : (float)(50 + rng_next(&rng) % 5000);
        a->weights_mode = (eng_weights_mode)(rng_next(&rng) % 3);
        char note[256];
        snprintf(note, sizeof note,
                 "case %d: E %lld H %lld Hkv %lld kdim %lld vdim %lld%s bias %d bias_kv %d "
                 "zero %d B %lld L %lld S %lld causal %d align %d off %lld window %d/%d(%lld,%lld) "
                 "pad %d mask %d positional %d style %d base %g weights %d",
                 n, (long long)sp.E, (long long)sp.H, (long long)sp.Hkv, (long long)lp.layer->kdim,
                 (long long)lp.layer->vdim, shared ? " shared" : "", sp.bias, sp.bias_kv,
                 a->add_zero_attn, (long long)B, (long long)L, (long long)Sk, a->causal, align,
                 (long long)a->query_offset, a->window_left_set, a->window_right_set,
                 (long long)a->window_left, (long long)a->window_right, pad != NULL, (int)kind,
                 (int)a->positional, (int)a->rope_style, (double)a->rope_base,
                 (int)a->weights_mode);
        double r = expect_matches_reference(&lp, a, note, NULL);
        if (r > worst)
            worst = r, worst_case = n;
        free(pad);
        free(mask);
        io_free(&c);
        layer_pair_free(&lp);
    }
    /* Visible in the log of a passing run too: how much of the tolerance the worst case used. */
    printf("     random layers: worst output error %.3f of the tolerance (case %d)\n", worst,
           worst_case);
}

/* ---- Positional encodings ------------------------------------------------------------------ */

static void test_rope_half_and_interleaved_with_base_and_query_offset(void)
{
    uint64_t rng = 140;
    for (int st = 0; st < 2; st++) {
        eng_rope_style style = st ? ENG_ROPE_INTERLEAVED : ENG_ROPE_HALF;
        const char *name = st ? "interleaved" : "half";
        layer_spec sp = {.E = 32, .H = 4, .Hkv = 2, .bias = true};
        layer_pair lp = layer_make(&sp, 40);
        io c = io_make(&lp, 2, 6, 0, false, &rng);
        c.a.positional = ENG_POSITIONAL_ROPE;
        c.a.rope_style = style;
        c.a.rope_base = 500.0f;
        c.a.causal = true;
        c.a.align = ENG_ALIGN_OFFSET;
        c.a.query_offset = 5;
        char note[128];
        snprintf(note, sizeof note, "RoPE %s, base 500, self, query_offset 5, GQA", name);
        expect_matches_reference(&lp, &c.a, note, NULL);
        c.a.rope_base = 0.0f; /* the default base, 10000 */
        c.a.query_offset = 0;
        c.a.align = ENG_ALIGN_TOP_LEFT;
        snprintf(note, sizeof note, "RoPE %s, default base, self", name);
        expect_matches_reference(&lp, &c.a, note, NULL);
        io_free(&c);

        c = io_make(&lp, 1, 3, 8, false, &rng);
        c.a.positional = ENG_POSITIONAL_ROPE;
        c.a.rope_style = style;
        c.a.rope_base = 1000.0f;
        c.a.causal = true;
        c.a.align = ENG_ALIGN_BOTTOM_RIGHT;
        snprintf(note, sizeof note, "RoPE %s, base 1000, cross, bottom-right", name);
        expect_matches_reference(&lp, &c.a, note, NULL);
        io_free(&c);
        layer_pair_free(&lp);
    }
}

/* The query offset reaches RoPE: moving the queries two positions further from the keys
 * changes the output (and both placements match the reference). */
static void test_rope_layer_output_depends_on_relative_positions(void)
{
    uint64_t rng = 141;
    layer_spec sp = {.E = 32, .H = 2, .bias = true, .bias_kv = false};
    layer_pair lp = layer_make(&sp, 41);
    io c = io_make(&lp, 1, 5, 0, false, &rng);
    c.a.positional = ENG_POSITIONAL_ROPE;
    c.a.rope_base = 100.0f;
    float *plain = NULL, *shifted = NULL;
    expect_matches_reference(&lp, &c.a, "RoPE, offset 0", &plain);
    c.a.align = ENG_ALIGN_OFFSET;
    c.a.query_offset = 2;
    expect_matches_reference(&lp, &c.a, "RoPE, offset 2", &shifted);
    double diff = 0;
    for (int i = 0; plain && shifted && i < 5 * 32; i++)
        diff = fmax(diff, fabs((double)plain[i] - shifted[i]));
    CHECKF(diff > 1e-3, "moving the queries 2 positions changed nothing (max diff %g)", diff);
    free(plain);
    free(shifted);
    io_free(&c);
    layer_pair_free(&lp);
}

static void test_sinusoidal_encoding_on_self_attention(void)
{
    uint64_t rng = 150;
    layer_spec sp = {.E = 32, .H = 4, .bias = true};
    layer_pair lp = layer_make(&sp, 50);
    io c = io_make(&lp, 2, 7, 0, false, &rng);
    c.a.positional = ENG_POSITIONAL_SINUSOIDAL;
    c.a.causal = true;
    expect_matches_reference(&lp, &c.a, "sinusoid, self, offset 0", NULL);
    c.a.align = ENG_ALIGN_OFFSET;
    c.a.query_offset = 4; /* queries at 4.., keys at 0.. */
    expect_matches_reference(&lp, &c.a, "sinusoid, self, query_offset 4", NULL);
    io_free(&c);
    layer_pair_free(&lp);

    /* An odd head count and width: the last channel is a sine without its cosine. */
    layer_spec odd = {.E = 15, .H = 3, .bias = false};
    lp = layer_make(&odd, 51);
    c = io_make(&lp, 1, 6, 0, false, &rng);
    c.a.positional = ENG_POSITIONAL_SINUSOIDAL;
    expect_matches_reference(&lp, &c.a, "sinusoid, self, E = 15", NULL);
    io_free(&c);
    layer_pair_free(&lp);
}

static void test_sinusoidal_encoding_on_cross_attention(void)
{
    uint64_t rng = 151;
    layer_spec sp = {.E = 32, .H = 4, .bias = true};
    layer_pair lp = layer_make(&sp, 52);
    io c = io_make(&lp, 2, 5, 9, true, &rng);
    c.a.positional = ENG_POSITIONAL_SINUSOIDAL;
    expect_matches_reference(&lp, &c.a, "sinusoid, cross, one memory of width E", NULL);
    c.a.align = ENG_ALIGN_BOTTOM_RIGHT;
    c.a.causal = true;
    expect_matches_reference(&lp, &c.a, "sinusoid, cross, bottom-right causal", NULL);
    io_free(&c);
    layer_pair_free(&lp);

    /* Memories of their own widths get the encoding of their own width. */
    layer_spec kv = {.E = 32, .H = 4, .kdim = 24, .vdim = 20, .bias = true};
    lp = layer_make(&kv, 53);
    c = io_make(&lp, 2, 5, 9, false, &rng);
    c.a.positional = ENG_POSITIONAL_SINUSOIDAL;
    expect_matches_reference(&lp, &c.a, "sinusoid, cross, kdim 24, vdim 20", NULL);
    io_free(&c);
    layer_pair_free(&lp);
}

/* The encoding must reach the output: the same layer and input with and without it differ. */
static void test_sinusoidal_encoding_changes_the_output(void)
{
    uint64_t rng = 152;
    layer_spec sp = {.E = 16, .H = 2, .bias = true};
    layer_pair lp = layer_make(&sp, 54);
    io c = io_make(&lp, 1, 4, 0, false, &rng);
    float *with = NULL, *without = NULL;
    expect_matches_reference(&lp, &c.a, "no encoding", &without);
    c.a.positional = ENG_POSITIONAL_SINUSOIDAL;
    expect_matches_reference(&lp, &c.a, "sinusoid", &with);
    double diff = 0;
    for (int i = 0; with && without && i < 4 * 16; i++)
        diff = fmax(diff, fabs((double)with[i] - without[i]));
    CHECKF(diff > 1e-2, "the sinusoidal encoding did not change the output (%g)", diff);
    free(with);
    free(without);
    io_free(&c);
    layer_pair_free(&lp);
}

/* ---- The tutorial layer -------------------------------------------------------------------- */

/* The classic tutorial MultiHeadAttention: W_Q, W_K, W_V, W_O (nn.Linear(d_model, d_model,
 * bias=False)), d_model 512, 8 heads of 64, loaded by name through named_layer. */
static void test_tutorial_multi_head_attention_d512_8_heads(void)
{
    enum { E = 512, H = 8 };
    int64_t L = 32;
    uint64_t rng = 160;
    float *w[4];
    for (int i = 0; i < 4; i++) {
        w[i] = xcalloc(E * E, sizeof(float));
        fill_sym(w[i], E * E, 1.0 / sqrt((double)E), &rng);
    }
    eng_weight t[4] = {
        {"W_Q.weight", ENG_DTYPE_F32, w[0], 2, {E, E}},
        {"W_K.weight", ENG_DTYPE_F32, w[1], 2, {E, E}},
        {"W_V.weight", ENG_DTYPE_F32, w[2], 2, {E, E}},
        {"W_O.weight", ENG_DTYPE_F32, w[3], 2, {E, E}},
    };
    eng_error err;
    eng_layer *layer = named_layer("tutorial", t, 4, H, 0, &err);
    CHECKF(layer != NULL, "tutorial layer refused: %s (%s)", err.message, err.field);
    if (layer) {
        CHECK_EQ_INT(layer->embed_dim, 512);
        CHECK_EQ_INT(layer->num_heads, 8);
        CHECK_EQ_INT(layer->embed_dim / layer->num_heads, 64);
        CHECK(!layer->b_q && !layer->b_k && !layer->b_v && !layer->b_o);
        /* The reference reads the test's own arrays, not the layer's copies. */
        ref_mha_weights rw = {.embed_dim = E,
                              .num_heads = H,
                              .num_kv_heads = H,
                              .kdim = E,
                              .vdim = E,
                              .w_q = w[0],
                              .w_k = w[1],
                              .w_v = w[2],
                              .w_o = w[3]};
        layer_pair lp = {layer, rw};
        float *x = xcalloc((size_t)(L * E), sizeof(float));
        fill_sym(x, (size_t)(L * E), 1.0, &rng);
        eng_mha_args a;
        memset(&a, 0, sizeof a);
        a.B = 1;
        a.L = L;
        a.x = x;
        a.weights_mode = ENG_WEIGHTS_MEAN;
        expect_matches_reference(&lp, &a, "tutorial MHA, 32 tokens", NULL);
        a.causal = true; /* the tutorial decoder's look-ahead mask */
        a.weights_mode = ENG_WEIGHTS_PER_HEAD;
        expect_matches_reference(&lp, &a, "tutorial MHA, 32 tokens, look-ahead mask", NULL);
        free(x);
        eng_layer_free(layer);
    }
    for (int i = 0; i < 4; i++)
        free(w[i]);
}

/* ---- Mask polarity, pinned without the reference ------------------------------------------- */

/* out_i = W_o (W_v x_j + b_v) + b_o for every i: what a layer gives when only key j is seen. */
static void value_of_key_through_wo(const eng_layer *l, const float *x, int64_t j, double *out)
{
    int64_t E = l->embed_dim;
    double v[64];
    for (int64_t f = 0; f < E; f++) {
        double acc = l->b_v ? (double)l->b_v[f] : 0.0;
        for (int64_t c = 0; c < E; c++)
            acc += (double)l->w_v[f * E + c] * x[j * E + c];
        v[f] = acc;
    }
    for (int64_t f = 0; f < E; f++) {
        double acc = l->b_o ? (double)l->b_o[f] : 0.0;
        for (int64_t c = 0; c < E; c++)
            acc += (double)l->w_o[f * E + c] * v[c];
        out[f] = acc;
    }
}

/* Runs the layer and returns its output (caller frees) and per-head weights into *weights. */
static float *run_layer(eng_mha_args *a, float **weights)
{
    int64_t E = a->layer->embed_dim, H = a->layer->num_heads;
    int64_t Sx = keys_of(a) + eng_mha_extra_keys(a);
    float *out = xcalloc((size_t)(a->B * a->L * E), sizeof(float));
    *weights = xcalloc((size_t)(a->B * H * a->L * Sx), sizeof(float));
    a->out = out;
    a->weights = *weights;
    a->weights_mode = ENG_WEIGHTS_PER_HEAD;
    eng_error err;
    eng_status st = eng_mha(pool, a, NULL, &err);
    CHECKF(st == ENG_OK, "eng_mha: %s (%s)", err.message, err.field);
    return out;
}

/* docs/semantics.md: a boolean attn_mask entry true means "may attend" (PyTorch SDPA polarity, not
 * nn.MultiheadAttention's). A mask allowing only key 0 makes every output row W_o v_0 + b_o. */
static void test_bool_attn_mask_true_means_attend(void)
{
    uint64_t rng = 170;
    enum { E = 16, H = 2, L = 5 };
    layer_spec sp = {.E = E, .H = H, .bias = true};
    layer_pair lp = layer_make(&sp, 70);
    io c = io_make(&lp, 1, L, 0, false, &rng);
    uint8_t only_key0[L * L] = {0};
    for (int i = 0; i < L; i++)
        only_key0[i * L] = 1;
    c.a.attn_mask = (eng_mask){ENG_MASK_BOOL, only_key0, {1, 1, L, L}, {0, 0, L, 1}};
    float *w = NULL;
    float *out = run_layer(&c.a, &w);
    double want[E];
    value_of_key_through_wo(lp.layer, c.x, 0, want);
    for (int i = 0; i < L; i++) {
        for (int f = 0; f < E; f++)
            CHECKF(fabs((double)out[i * E + f] - want[f]) <= 1e-5,
                   "only key 0 allowed: row %d channel %d is %.9g, W_o v_0 + b_o is %.9g", i, f,
                   (double)out[i * E + f], want[f]);
        for (int h = 0; h < H; h++)
            CHECKF(w[(h * L + i) * L] == 1.0f, "row %d head %d: weight of key 0 is %.9g, not 1", i,
                   h, (double)w[(h * L + i) * L]);
    }
    free(out);
    free(w);

    /* The inverse mask hides exactly key 0. */
    uint8_t all_but_key0[L * L];
    for (int i = 0; i < L * L; i++)
        all_but_key0[i] = !only_key0[i];
    c.a.attn_mask.data = all_but_key0;
    out = run_layer(&c.a, &w);
    for (int i = 0; i < L; i++)
        for (int h = 0; h < H; h++)
            CHECKF(w[(h * L + i) * L] == 0.0f, "mask false at key 0: row %d head %d weight %.9g", i,
                   h, (double)w[(h * L + i) * L]);
    free(out);
    free(w);
    io_free(&c);
    layer_pair_free(&lp);
}

/* key_padding_mask true means padding, ignore (nn.MultiheadAttention polarity). */
static void test_key_padding_true_means_ignore(void)
{
    uint64_t rng = 171;
    enum { E = 16, H = 2, L = 5 };
    layer_spec sp = {.E = E, .H = H, .bias = true};
    layer_pair lp = layer_make(&sp, 71);
    io c = io_make(&lp, 1, L, 0, false, &rng);
    uint8_t pad[L] = {0, 1, 1, 1, 1}; /* everything but key 0 is padding */
    c.a.key_padding = pad;
    float *w = NULL;
    float *out = run_layer(&c.a, &w);
    double want[E];
    value_of_key_through_wo(lp.layer, c.x, 0, want);
    for (int i = 0; i < L; i++)
        for (int f = 0; f < E; f++)
            CHECKF(fabs((double)out[i * E + f] - want[f]) <= 1e-5,
                   "keys 1..4 padded: row %d channel %d is %.9g, W_o v_0 + b_o is %.9g", i, f,
                   (double)out[i * E + f], want[f]);
    free(out);
    free(w);

    uint8_t pad0[L] = {1, 0, 0, 0, 0}; /* only key 0 is padding */
    c.a.key_padding = pad0;
    out = run_layer(&c.a, &w);
    for (int i = 0; i < L; i++)
        for (int h = 0; h < H; h++)
            CHECKF(w[(h * L + i) * L] == 0.0f, "key 0 padded: row %d head %d weight %.9g", i, h,
                   (double)w[(h * L + i) * L]);
    free(out);
    free(w);
    io_free(&c);
    layer_pair_free(&lp);
}

/* A query row that sees no key gives attention output 0, so the layer outputs b_o there, and
 * weights 0 (docs/semantics.md#rows-that-see-no-key: zeros, not torch's NaN). */
static void test_rows_without_visible_keys_give_the_output_bias(void)
{
    uint64_t rng = 172;
    enum { E = 16, H = 2, L = 4 };
    layer_spec sp = {.E = E, .H = H, .bias = true};
    layer_pair lp = layer_make(&sp, 72);
    io c = io_make(&lp, 1, L, 0, false, &rng);
    uint8_t mask[L * L];
    memset(mask, 1, sizeof mask);
    memset(mask + 2 * L, 0, L); /* row 2 sees nothing */
    c.a.attn_mask = (eng_mask){ENG_MASK_BOOL, mask, {1, 1, L, L}, {0, 0, L, 1}};
    float *w = NULL;
    float *out = run_layer(&c.a, &w);
    for (int f = 0; f < E; f++)
        CHECKF(fabs((double)out[2 * E + f] - lp.layer->b_o[f]) <= 1e-6,
               "empty row: channel %d is %.9g, b_o is %.9g", f, (double)out[2 * E + f],
               (double)lp.layer->b_o[f]);
    for (int h = 0; h < H; h++)
        for (int j = 0; j < L; j++)
            CHECKF(w[(h * L + 2) * L + j] == 0.0f, "empty row: weight (%d, %d) is %.9g", h, j,
                   (double)w[(h * L + 2) * L + j]);
    free(out);
    free(w);
    expect_matches_reference(&lp, &c.a, "one empty row", NULL);
    io_free(&c);
    layer_pair_free(&lp);
}

/* ---- Arguments, cancellation --------------------------------------------------------------- */

static void expect_rejected(eng_mha_args *a, eng_status status, const char *field, const char *note)
{
    float out[4096];
    a->out = a->out ? a->out : out;
    eng_error err;
    memset(&err, 0, sizeof err);
    eng_status st = eng_mha(pool, a, NULL, &err);
    CHECKF(st == status, "%s: status %s, expected %s (%s)", note, eng_status_str(st),
           eng_status_str(status), err.message);
    CHECKF(strcmp(err.field, field) == 0, "%s: field '%s', expected '%s'", note, err.field, field);
    a->out = NULL;
}

static void test_rejects_invalid_arguments(void)
{
    uint64_t rng = 180;
    layer_spec sp = {.E = 16, .H = 2, .kdim = 8, .vdim = 8, .bias = true};
    layer_pair kv = layer_make(&sp, 80);
    io c = io_make(&kv, 1, 4, 0, false, &rng);
    expect_rejected(&c.a, ENG_EINVAL, "memory", "self-attention on a layer with kdim 8");
    io_free(&c);
    c = io_make(&kv, 1, 4, 6, false, &rng);
    c.a.value_in = NULL;
    expect_rejected(&c.a, ENG_EINVAL, "memory", "key input without value input");
    io_free(&c);
    layer_pair_free(&kv);

    layer_spec s2 = {.E = 18, .H = 2, .bias = true}; /* D = 9: odd */
    layer_pair lp = layer_make(&s2, 81);
    c = io_make(&lp, 1, 4, 0, false, &rng);
    c.a.positional = ENG_POSITIONAL_ROPE;
    expect_rejected(&c.a, ENG_EINVAL, "positional", "RoPE with an odd head size");
    c.a.positional = ENG_POSITIONAL_NONE;
    uint8_t mask[4 * 5] = {0};
    c.a.attn_mask = (eng_mask){ENG_MASK_BOOL, mask, {1, 1, 4, 5}, {0, 0, 5, 1}};
    expect_rejected(&c.a, ENG_EINVAL, "attn_mask", "attn_mask with S + 1 columns");
    c.a.attn_mask = (eng_mask){0};
    c.a.B = 0;
    expect_rejected(&c.a, ENG_EINVAL, "input", "B = 0");
    c.a.B = 1;
    c.a.layer = NULL;
    expect_rejected(&c.a, ENG_EINVAL, "layer", "no layer");
    io_free(&c);
    layer_pair_free(&lp);
}

static void test_cancelled_call_returns_ecancelled(void)
{
    uint64_t rng = 190;
    layer_spec sp = {.E = 32, .H = 4, .bias = true};
    layer_pair lp = layer_make(&sp, 90);
    io c = io_make(&lp, 2, 64, 0, false, &rng);
    float *out = xcalloc(2 * 64 * 32, sizeof(float));
    c.a.out = out;
    eng_ctl ctl;
    atomic_init(&ctl.cancel, true);
    ctl.deadline_ns = 0;
    eng_error err;
    memset(&err, 0, sizeof err);
    eng_status st = eng_mha(pool, &c.a, &ctl, &err);
    CHECKF(st == ENG_ECANCELLED, "cancel set: %s, expected cancelled", eng_status_str(st));
    CHECKF(err.status == ENG_ECANCELLED, "err.status is %s", eng_status_str(err.status));
    /* The same call without the flag works: the pool and layer are unharmed. */
    atomic_store(&ctl.cancel, false);
    CHECK_EQ_INT(eng_mha(pool, &c.a, &ctl, &err), ENG_OK);
    free(out);
    io_free(&c);
    layer_pair_free(&lp);
}

static void test_past_deadline_returns_edeadline(void)
{
    uint64_t rng = 191;
    layer_spec sp = {.E = 32, .H = 4, .bias = true};
    layer_pair lp = layer_make(&sp, 91);
    io c = io_make(&lp, 2, 64, 0, false, &rng);
    float *out = xcalloc(2 * 64 * 32, sizeof(float));
    c.a.out = out;
    const int64_t deadlines[] = {1, eng_now_ns() - 1000000};
    for (int n = 0; n < 2; n++) {
        eng_ctl ctl;
        atomic_init(&ctl.cancel, false);
        ctl.deadline_ns = deadlines[n];
        eng_error err;
        memset(&err, 0, sizeof err);
        eng_status st = eng_mha(pool, &c.a, &ctl, &err);
        CHECKF(st == ENG_EDEADLINE, "deadline %lld ns (now %lld): %s, expected deadline exceeded",
               (long long)deadlines[n], (long long)eng_now_ns(), eng_status_str(st));
        CHECKF(err.status == ENG_EDEADLINE, "err.status is %s", eng_status_str(err.status));
    }
    free(out);
    io_free(&c);
    layer_pair_free(&lp);
}

int main(void)
{
    int status;
    if (test_engine_start(&pool, &status))
        return status;
    quick = test_quick();

    RUN_WITHIN(test_self_attention_on_unbatched_input_matches_reference, 60);
    RUN_WITHIN(test_self_attention_on_batched_input_matches_reference, 60);
    RUN_WITHIN(test_batches_are_independent, 60);
    RUN_WITHIN(test_projections_without_biases_match_reference, 60);
    RUN_WITHIN(test_packed_in_proj_with_and_without_biases, 60);
    RUN_WITHIN(test_long_inputs_span_several_projection_chunks, 120);
    RUN_WITHIN(test_cross_attention_with_separate_key_and_value_inputs, 60);
    RUN_WITHIN(test_bfloat16_layer_rounds_every_product, 60);
    RUN_WITHIN(test_cross_attention_with_one_memory_for_keys_and_values, 60);
    RUN_WITHIN(test_grouped_query_heads_match_reference, 60);

    RUN_WITHIN(test_add_bias_kv_appends_one_key_after_the_inputs, 60);
    RUN_WITHIN(test_add_zero_attn_appends_one_zero_key, 60);
    RUN_WITHIN(test_add_bias_kv_and_zero_attn_together, 60);
    RUN_WITHIN(test_appended_keys_are_visible_whatever_the_masks, 60);

    RUN_WITHIN(test_causal_masks_match_reference, 60);
    RUN_WITHIN(test_bottom_right_alignment_counts_only_input_keys, 60);
    RUN_WITHIN(test_key_padding_per_batch_and_shared, 60);
    RUN_WITHIN(test_bool_attn_mask_broadcast_shapes, 60);
    RUN_WITHIN(test_float_attn_mask_broadcast_shapes, 60);
    RUN_WITHIN(test_sliding_window_matches_reference, 60);
    RUN_WITHIN(test_alibi_matches_reference, 60);
    RUN_WITHIN(test_masks_combined_match_reference, 60);
    RUN_WITHIN(test_weights_mean_is_the_head_average, 60);
    RUN_WITHIN(test_random_layers_and_options_match_reference, 120);

    RUN_WITHIN(test_rope_half_and_interleaved_with_base_and_query_offset, 60);
    RUN_WITHIN(test_rope_layer_output_depends_on_relative_positions, 60);
    RUN_WITHIN(test_sinusoidal_encoding_on_self_attention, 60);
    RUN_WITHIN(test_sinusoidal_encoding_on_cross_attention, 60);
    RUN_WITHIN(test_sinusoidal_encoding_changes_the_output, 60);

    RUN_WITHIN(test_tutorial_multi_head_attention_d512_8_heads, 120);

    RUN_WITHIN(test_bool_attn_mask_true_means_attend, 60);
    RUN_WITHIN(test_key_padding_true_means_ignore, 60);
    RUN_WITHIN(test_rows_without_visible_keys_give_the_output_bias, 60);

    RUN_WITHIN(test_rejects_invalid_arguments, 60);
    RUN_WITHIN(test_cancelled_call_returns_ecancelled, 60);
    RUN_WITHIN(test_past_deadline_returns_edeadline, 60);

    eng_pool_free(pool);
    return check_report();
}
