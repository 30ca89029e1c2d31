/*
 * test_decoder.c - the specification of decoder layers (eng_layer_decoder, engine.h): what a
 * layer of a Hugging Face checkpoint adds to the attention.
 *
 * The reference is a float64 forward pass written from the definitions: projections with
 * biases, q/k RMSNorm or LayerNorm (per head or over the whole projection, Gemma's 1 + w),
 * RoPE over the first rotary_dim channels of each head in either pair layout with the
 * layer's inverse frequencies and attention factor, the scale, the logit softcap, a causal
 * sliding window of W keys, and attention sinks taken as an extra logit per head in the
 * softmax (so the output is the attention's times 1 / (1 + exp(sink - lse))). eng_mha over
 * the whole sequence, and a prefill plus single-token steps over a KV cache, must agree with
 * it within 1e-5 x max|out|; one position off, a norm over the wrong group or a sink ignored
 * moves the outputs by percents. Then the inverse frequencies of each RoPE scaling against
 * their formulas, and what eng_layer_decoder and eng_mha refuse.
 */
#include "engine/engine.h"
#include "tests/support/check.h"
#include "tests/support/named_layer.h"
#include "tests/support/rng.h"
#include "tests/support/util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define RTOL  1e-5
#define NE    32
#define NH    4
#define NKV   2
#define MAXHD 16
#define QW    (NH * HD)  /* the width of q */
#define KW    (NKV * HD) /* the width of k and v */
#define MAXQ  (NH * MAXHD)
#define MAXKW (NKV * MAXHD)

/* The head size: NE / NH, or wider (q then wider than the hidden size, as in Qwen 3). */
static int64_t HD = NE / NH;
#define NL 11

static eng_pool *pool;

/* ---- The layer and its reference ---------------------------------------------------------- */

typedef struct {
    float wq[MAXQ * NE], wk[MAXKW * NE], wv[MAXKW * NE], wo[NE * MAXQ];
    float bq[MAXQ], bk[MAXKW], bv[MAXKW], bo[NE];
    float qn[MAXQ], kn[MAXKW], qb[MAXQ], kb[MAXKW]; /* norm weights (per head: the first HD) */
    float sinks[NH];
    eng_decoder_spec spec;
    bool has_sinks;
} params;

static void fill(float *x, int64_t n, double amp, double offset, uint64_t *rng)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)(offset + rng_sym(rng, amp));
}

static void params_init(params *p, const eng_decoder_spec *spec, bool sinks, uint64_t seed)
{
    uint64_t rng = seed;
    memset(p, 0, sizeof *p);
    fill(p->wq, QW * NE, 0.4, 0, &rng);
    fill(p->wk, KW * NE, 0.4, 0, &rng);
    fill(p->wv, KW * NE, 0.4, 0, &rng);
    fill(p->wo, NE * QW, 0.4, 0, &rng);
    fill(p->bq, QW, 0.3, 0, &rng);
    fill(p->bk, KW, 0.3, 0, &rng);
    fill(p->bv, KW, 0.3, 0, &rng);
    fill(p->bo, NE, 0.3, 0, &rng);
    fill(p->qn, QW, 0.3, 1.0, &rng);
    fill(p->kn, KW, 0.3, 1.0, &rng);
    fill(p->qb, QW, 0.3, 0, &rng);
    fill(p->kb, KW, 0.3, 0, &rng);
    fill(p->sinks, NH, 1.0, 0.5, &rng);
    p->spec = *spec;
    p->spec.head_dim = HD == NE / NH ? 0 : HD;
    p->has_sinks = sinks;
}

static eng_weight ref1(const char *name, const float *data, int64_t n)
{
    return (eng_weight){name, ENG_DTYPE_F32, data, 1, {n}};
}

static eng_weight ref2(const char *name, const float *data, int64_t r, int64_t c)
{
    return (eng_weight){name, ENG_DTYPE_F32, data, 2, {r, c}};
}

static eng_layer *build(const params *p, eng_error *err)
{
    eng_weight t[16];
    size_t n = 0;
    t[n++] = ref2("q_proj.weight", p->wq, QW, NE);
    t[n++] = ref2("k_proj.weight", p->wk, KW, NE);
    t[n++] = ref2("v_proj.weight", p->wv, KW, NE);
    t[n++] = ref2("o_proj.weight", p->wo, NE, QW);
    t[n++] = ref1("q_proj.bias", p->bq, QW);
    t[n++] = ref1("k_proj.bias", p->bk, KW);
    t[n++] = ref1("v_proj.bias", p->bv, KW);
    t[n++] = ref1("o_proj.bias", p->bo, NE);
    if (p->spec.qk_norm) {
        /* Per head: one head's HD weights, shared (the tensors of Qwen 3 and Gemma). */
        bool whole = p->spec.qk_norm_whole;
        t[n++] = ref1("q_norm.weight", p->qn, whole ? QW : HD);
        t[n++] = ref1("k_norm.weight", p->kn, whole ? KW : HD);
        if (p->spec.qk_norm == ENG_QK_NORM_LAYER) {
            t[n++] = ref1("q_norm.bias", p->qb, whole ? QW : HD);
            t[n++] = ref1("k_norm.bias", p->kb, whole ? KW : HD);
        }
    }
    if (p->has_sinks)
        t[n++] = ref1("sinks", p->sinks, NH);
    return named_decoder("dec", t, n, NH, NKV, &p->spec, err);
}

/* y[rows] = W x + b in float64. */
static void linear(const float *w, const float *b, const double *x, int64_t rows, int64_t cols,
                   double *y)
{
    for (int64_t r = 0; r < rows; r++) {
        double s = b[r];
        for (int64_t c = 0; c < cols; c++)
            s += (double)w[r * cols + c] * x[c];
        y[r] = s;
    }
}

/* Normalises x[n] with weights w (the weight of channel i is w[i % wn]) and bias b. */
static void norm(const eng_decoder_spec *sp, double *x, int64_t n, const float *w, const float *b,
                 int64_t wn)
{
    double mean = 0, var = 0;
    if (sp->qk_norm == ENG_QK_NORM_LAYER) {
        for (int64_t i = 0; i < n; i++)
            mean += x[i];
        mean /= (double)n;
    }
    for (int64_t i = 0; i < n; i++)
        var += (x[i] - mean) * (x[i] - mean);
    double inv = 1.0 / sqrt(var / (double)n + sp->qk_norm_eps);
    for (int64_t i = 0; i < n; i++) {
        double g = (sp->qk_norm_plus_one ? 1.0 : 0.0) + w[i % wn];
        x[i] = (x[i] - mean) * inv * g + (sp->qk_norm == ENG_QK_NORM_LAYER ? b[i % wn] : 0.0);
    }
}

static void qk_norm(const eng_decoder_spec *sp, double *x, int64_t heads, const float *w,
                    const float *b)
{
    if (sp->qk_norm == ENG_QK_NORM_NONE)
        return;
    if (sp->qk_norm_whole)
        norm(sp, x, heads * HD, w, b, heads * HD);
    else
        for (int64_t h = 0; h < heads; h++)
            norm(sp, x + h * HD, HD, w, b, HD);
}

static void rope(const eng_decoder_spec *sp, const float *inv, double factor, double *x,
                 int64_t heads, int64_t pos)
{
    int64_t half = sp->rope.rotary_dim / 2;
    for (int64_t h = 0; h < heads; h++)
        for (int64_t i = 0; i < half; i++) {
            bool halves = sp->rope.style == ENG_ROPE_HALF;
            int64_t a = h * HD + (halves ? i : 2 * i), b = h * HD + (halves ? i + half : 2 * i + 1);
            double c = cos((double)pos * inv[i]) * factor, s = sin((double)pos * inv[i]) * factor;
            double u = x[a], v = x[b];
            x[a] = u * c - v * s;
            x[b] = v * c + u * s;
        }
}

/* The layer over x [NL, NE] at positions 0..L-1, causal, in float64. */
static void reference(const params *p, const float *x, double *out)
{
    const eng_decoder_spec *sp = &p->spec;
    static double q[NL][MAXQ], k[NL][MAXKW], v[NL][MAXKW], o[NL][MAXQ];
    float inv[MAXHD / 2 + 1];
    float factor = 1.0f;
    eng_error err;
    if (sp->rope.rotary_dim)
        CHECK(eng_rope_inv_freq(&sp->rope, inv, &factor, &err) == ENG_OK);
    for (int64_t t = 0; t < NL; t++) {
        double xt[NE];
        for (int64_t c = 0; c < NE; c++)
            xt[c] = x[t * NE + c];
        linear(p->wq, p->bq, xt, QW, NE, q[t]);
        linear(p->wk, p->bk, xt, KW, NE, k[t]);
        linear(p->wv, p->bv, xt, KW, NE, v[t]);
        qk_norm(sp, q[t], NH, p->qn, p->qb);
        qk_norm(sp, k[t], NKV, p->kn, p->kb);
        if (sp->rope.rotary_dim) {
            rope(sp, inv, factor, q[t], NH, t);
            rope(sp, inv, factor, k[t], NKV, t);
        }
    }
    double scale = sp->scale_set ? sp->scale : 1.0 / sqrt((double)HD);
    for (int64_t t = 0; t < NL; t++)
        for (int64_t h = 0; h < NH; h++) {
            int64_t g = h / (NH / NKV), first = sp->window > 0 ? t - sp->window + 1 : 0;
            double s[NL], m = p->has_sinks ? p->sinks[h] : -INFINITY, z = 0;
            first = first > 0 ? first : 0;
            for (int64_t j = first; j <= t; j++) {
                double d = 0;
                for (int64_t c = 0; c < HD; c++)
                    d += q[t][h * HD + c] * k[j][g * HD + c];
                d *= scale;
                if (sp->softcap > 0)
                    d = sp->softcap * tanh(d / sp->softcap);
                s[j] = d;
                m = fmax(m, d);
            }
            for (int64_t j = first; j <= t; j++)
                z += exp(s[j] - m);
            if (p->has_sinks)
                z += exp(p->sinks[h] - m);
            for (int64_t c = 0; c < HD; c++) {
                double acc = 0;
                for (int64_t j = first; j <= t; j++)
                    acc += exp(s[j] - m) / z * v[j][g * HD + c];
                o[t][h * HD + c] = acc;
            }
        }
    for (int64_t t = 0; t < NL; t++)
        linear(p->wo, p->bo, o[t], NE, QW, out + t * NE);
}

static double rel_error(const float *got, const double *want, int64_t n)
{
    double worst = 0, scale = 0;
    for (int64_t i = 0; i < n; i++) {
        scale = fmax(scale, fabs(want[i]));
        worst = fmax(worst, fabs((double)got[i] - want[i]));
    }
    return worst / scale;
}

/* The layer over the whole sequence, and through a cache (a prefill of 5, then one token per
 * step), against the reference. */
static void check_layer(const char *what, const eng_decoder_spec *spec, bool sinks)
{
    params *p = xcalloc(1, sizeof *p);
    params_init(p, spec, sinks, 77);
    eng_error err;
    eng_layer *l = build(p, &err);
    CHECKF(l != NULL, "%s: %s", what, l ? "" : err.message);
    float x[NL * NE], out[NL * NE];
    double want[NL * NE];
    uint64_t rng = 5;
    fill(x, NL * NE, 1.0, 0, &rng);
    reference(p, x, want);
    if (l) {
        eng_mha_args a = {.layer = l, .B = 1, .L = NL, .x = x, .out = out, .causal = true};
        CHECKF(eng_mha(pool, &a, NULL, &err) == ENG_OK, "%s: %s", what, err.message);
        double e = rel_error(out, want, NL * NE);
        CHECKF(e <= RTOL, "%s: whole sequence %.3g x max|out|", what, e);

        eng_kv_pool *kvp = eng_kv_pool_new((size_t)1 << 20, 4, &err);
        eng_kv_shape shape = {.num_kv_heads = NKV, .head_dim = HD, .dtype = ENG_DTYPE_F32};
        eng_kv_seq *seq = kvp ? eng_kv_seq_new(kvp, &shape, &err) : NULL;
        CHECK(seq != NULL);
        for (int64_t t0 = 0; seq && t0 < NL;) {
            int64_t n = t0 == 0 ? 5 : 1;
            eng_mha_args s = {.layer = l,
                              .B = 1,
                              .L = n,
                              .x = x + t0 * NE,
                              .out = out + t0 * NE,
                              .causal = true,
                              .align = ENG_ALIGN_BOTTOM_RIGHT,
                              .kv_cache = seq};
            CHECKF(eng_mha(pool, &s, NULL, &err) == ENG_OK, "%s step: %s", what, err.message);
            t0 += n;
        }
        e = rel_error(out, want, NL * NE);
        CHECKF(e <= RTOL, "%s: steps %.3g x max|out|", what, e);
        eng_kv_seq_free(seq);
        eng_kv_pool_free(kvp);
    }
    eng_layer_free(l);
    free(p);
}

static eng_decoder_spec rope_spec(int64_t rotary_dim, eng_rope_style style)
{
    eng_decoder_spec s;
    memset(&s, 0, sizeof s);
    s.rope.rotary_dim = rotary_dim;
    s.rope.style = style;
    s.rope.base = 10000.0;
    return s;
}

static void test_rope_over_part_of_each_head_in_both_layouts(void)
{
    eng_decoder_spec s = rope_spec(HD, ENG_ROPE_HALF);
    check_layer("full half-split", &s, false);
    s = rope_spec(HD / 2, ENG_ROPE_HALF);
    check_layer("partial half-split", &s, false);
    s = rope_spec(HD / 2, ENG_ROPE_INTERLEAVED);
    check_layer("partial interleaved", &s, false);
    s = rope_spec(0, ENG_ROPE_HALF);
    check_layer("no rope", &s, false);
}

static void test_qk_norms_per_head_and_over_the_projection(void)
{
    eng_decoder_spec s = rope_spec(HD, ENG_ROPE_HALF);
    s.qk_norm = ENG_QK_NORM_RMS;
    s.qk_norm_eps = 1e-6;
    check_layer("rms per head", &s, false);
    s.qk_norm_plus_one = true;
    check_layer("rms per head, 1 + w", &s, false);
    s.qk_norm_plus_one = false;
    s.qk_norm_whole = true;
    check_layer("rms over the projection", &s, false);
    s.qk_norm = ENG_QK_NORM_LAYER;
    s.qk_norm_whole = false;
    s.rope.rotary_dim = HD / 4 * 2;
    check_layer("layer norm per head", &s, false);
}

static void test_scale_softcap_window_and_sinks(void)
{
    eng_decoder_spec s = rope_spec(HD, ENG_ROPE_HALF);
    s.scale_set = true;
    s.scale = 0.3f;
    check_layer("scale", &s, false);
    s.softcap = 2.0f;
    check_layer("softcap", &s, false);
    s.softcap = 0;
    s.window = 4;
    check_layer("window", &s, false);
    s.scale_set = false;
    check_layer("sinks", &s, true);
    s.window = 0;
    s.rope.scaling = ENG_ROPE_SCALING_YARN;
    s.rope.factor = 8;
    s.rope.original_max_positions = 64;
    s.rope.truncate = true;
    check_layer("yarn and sinks", &s, true);
}

/* Heads of their own size: q and the attention's output H D = 2E wide (Qwen 3 and Gemma have
 * such layers), with norms, partial RoPE, a window and sinks. */
static void test_heads_wider_than_the_hidden_size(void)
{
    HD = 2 * NE / NH;
    eng_decoder_spec s = rope_spec(HD, ENG_ROPE_HALF);
    check_layer("wide heads", &s, false);
    s.qk_norm = ENG_QK_NORM_RMS;
    s.qk_norm_eps = 1e-6;
    s.qk_norm_plus_one = true;
    s.window = 3;
    check_layer("wide heads, norms, window", &s, true);
    s.qk_norm_whole = true;
    s.rope.rotary_dim = HD / 2;
    check_layer("wide heads, whole norm, partial rope", &s, false);
    HD = NE / NH;
}

/* ---- RoPE frequencies --------------------------------------------------------------------- */

static void test_inverse_frequencies_of_each_scaling(void)
{
    eng_rope_params r = {.rotary_dim = 64, .base = 500000.0};
    float plain[32], got[32], factor;
    eng_error err;
    CHECK(eng_rope_inv_freq(&r, plain, &factor, &err) == ENG_OK);
    CHECK(factor == 1.0f);
    for (int i = 0; i < 32; i++)
        CHECKF(fabs(plain[i] - pow(500000.0, -2.0 * i / 64)) <= 1e-6 * plain[i], "default %d", i);
    r.scaling = ENG_ROPE_SCALING_LINEAR;
    r.factor = 4;
    CHECK(eng_rope_inv_freq(&r, got, &factor, &err) == ENG_OK);
    for (int i = 0; i < 32; i++)
        CHECKF(fabs(got[i] - plain[i] / 4) <= 1e-6 * plain[i], "linear %d", i);
    /* llama3: wavelengths past original/low_freq_factor are divided by the factor, those
     * under original/high_freq_factor kept, the band between interpolated. */
    r.scaling = ENG_ROPE_SCALING_LLAMA3;
    r.factor = 8;
    r.low_freq_factor = 1;
    r.high_freq_factor = 4;
    r.original_max_positions = 8192;
    CHECK(eng_rope_inv_freq(&r, got, &factor, &err) == ENG_OK);
    for (int i = 0; i < 32; i++) {
        double wavelen = 2 * M_PI / plain[i];
        if (wavelen < 8192 / 4.0)
            CHECKF(got[i] == plain[i], "llama3 high %d", i);
        else if (wavelen > 8192 / 1.0)
            CHECKF(fabs(got[i] - plain[i] / 8) <= 1e-6 * plain[i], "llama3 low %d", i);
        else
            CHECKF(got[i] < plain[i] && got[i] > plain[i] / 8, "llama3 band %d", i);
    }
    /* yarn: the highest frequencies extrapolated (kept), the lowest interpolated (/ factor),
     * cos and sin times 0.1 ln(factor) + 1. */
    r.scaling = ENG_ROPE_SCALING_YARN;
    r.factor = 32;
    r.original_max_positions = 4096;
    r.truncate = false;
    CHECK(eng_rope_inv_freq(&r, got, &factor, &err) == ENG_OK);
    CHECK(fabs(factor - (0.1 * log(32.0) + 1.0)) < 1e-6);
    CHECK(fabs(got[0] - plain[0]) <= 1e-6 * plain[0]);
    CHECK(fabs(got[31] - plain[31] / 32) <= 1e-6 * plain[31]);
    r.attention_factor = 1.5;
    CHECK(eng_rope_inv_freq(&r, got, &factor, &err) == ENG_OK);
    CHECK(factor == 1.5f);
    /* longrope: each frequency divided by its short factor, cos and sin times
     * sqrt(1 + ln factor / ln original). */
    float shorts[32];
    for (int i = 0; i < 32; i++)
        shorts[i] = 1.0f + 0.25f * (float)i;
    r = (eng_rope_params){.rotary_dim = 64,
                          .base = 500000.0,
                          .scaling = ENG_ROPE_SCALING_LONGROPE,
                          .factor = 32,
                          .original_max_positions = 4096,
                          .short_factor = shorts,
                          .max_positions = 4096};
    CHECK(eng_rope_inv_freq(&r, got, &factor, &err) == ENG_OK);
    CHECK(fabs(factor - sqrt(1.0 + log(32.0) / log(4096.0))) < 1e-6);
    for (int i = 0; i < 32; i++)
        CHECKF(fabs(got[i] - plain[i] / shorts[i]) <= 1e-6 * plain[i], "longrope %d", i);
    r.short_factor = NULL;
    CHECK(eng_rope_inv_freq(&r, got, &factor, &err) == ENG_EINVAL &&
          strcmp(err.field, "short_factor") == 0);
}

/* A LongRoPE layer serves the positions below its original context, where transformers uses
 * the short factors; a call or a cache step past them is refused, naming the input. */
static void test_longrope_positions_stop_at_the_original_context(void)
{
    float shorts[MAXHD / 2];
    for (int i = 0; i < HD / 2; i++)
        shorts[i] = 1.0f + 0.5f * (float)i;
    eng_decoder_spec s = rope_spec(HD, ENG_ROPE_HALF);
    s.rope.scaling = ENG_ROPE_SCALING_LONGROPE;
    s.rope.factor = 4;
    s.rope.original_max_positions = NL + 1;
    s.rope.max_positions = NL + 1;
    s.rope.short_factor = shorts;
    check_layer("longrope", &s, false);
    params *p = xcalloc(1, sizeof *p);
    eng_error err;
    params_init(p, &s, false, 9);
    eng_layer *l = build(p, &err);
    CHECK(l != NULL && l->spec.rope.short_factor == NULL);
    float x[NL * NE] = {0}, out[NL * NE];
    eng_mha_args a = {.layer = l,
                      .B = 1,
                      .L = NL,
                      .x = x,
                      .out = out,
                      .causal = true,
                      .align = ENG_ALIGN_OFFSET,
                      .query_offset = 2};
    CHECK(l && eng_mha(pool, &a, NULL, &err) == ENG_EINVAL && strcmp(err.field, "input") == 0);
    eng_kv_pool *kvp = eng_kv_pool_new((size_t)1 << 20, 4, &err);
    eng_kv_shape shape = {.num_kv_heads = NKV, .head_dim = HD, .dtype = ENG_DTYPE_F32};
    eng_kv_seq *seq = eng_kv_seq_new(kvp, &shape, &err);
    eng_mha_args step = {.layer = l,
                         .B = 1,
                         .L = NL,
                         .x = x,
                         .out = out,
                         .causal = true,
                         .align = ENG_ALIGN_BOTTOM_RIGHT,
                         .kv_cache = seq};
    CHECK(l && eng_mha(pool, &step, NULL, &err) == ENG_OK);
    step.L = 2;
    CHECK(l && eng_mha(pool, &step, NULL, &err) == ENG_EINVAL);
    CHECK_EQ_INT(eng_kv_seq_length(seq), NL);
    eng_kv_seq_free(seq);
    eng_kv_pool_free(kvp);
    eng_layer_free(l);
    free(p);
}

/* ---- Refusals ----------------------------------------------------------------------------- */

static void test_refusals_name_the_field(void)
{
    params *p = xcalloc(1, sizeof *p);
    eng_error err;
    eng_decoder_spec s = rope_spec(HD + 2, ENG_ROPE_HALF);
    params_init(p, &s, false, 3);
    CHECK(build(p, &err) == NULL && strcmp(err.field, "rotary_dim") == 0);
    p->spec.rope.rotary_dim = 3;
    CHECK(build(p, &err) == NULL && strcmp(err.field, "rotary_dim") == 0);
    p->spec = rope_spec(HD, ENG_ROPE_HALF);
    p->spec.rope.scaling = ENG_ROPE_SCALING_LLAMA3;
    p->spec.rope.factor = 8;
    CHECK(build(p, &err) == NULL && strcmp(err.field, "original_max_position_embeddings") == 0);
    p->spec = rope_spec(HD, ENG_ROPE_HALF);
    p->spec.qk_norm = ENG_QK_NORM_RMS;
    p->spec.qk_norm_whole = true;
    eng_weight t[3] = {ref2("q_proj.weight", p->wq, QW, NE), ref2("k_proj.weight", p->wk, KW, NE),
                       ref2("v_proj.weight", p->wv, KW, NE)};
    eng_weight all[6] = {t[0],
                         t[1],
                         t[2],
                         ref2("o_proj.weight", p->wo, NE, QW),
                         ref1("q_norm.weight", p->qn, HD),
                         ref1("k_norm.weight", p->kn, KW)};
    /* Over the whole projection the q norm needs NE weights, not one head's. */
    CHECK(named_decoder("d", all, 6, NH, NKV, &p->spec, &err) == NULL &&
          strcmp(err.field, "q_norm.weight") == 0);
    all[4] = ref1("sinks", p->sinks, NH - 1);
    p->spec.qk_norm = ENG_QK_NORM_NONE;
    CHECK(named_decoder("d", all, 5, NH, NKV, &p->spec, &err) == NULL &&
          strcmp(err.field, "sinks") == 0);
    /* eng_mha: a decoder layer has its own positions, and a sinks layer returns no weights. */
    p->spec = rope_spec(HD, ENG_ROPE_HALF);
    p->has_sinks = true;
    eng_layer *l = build(p, &err);
    CHECK(l != NULL);
    float x[NL * NE] = {0}, out[NL * NE], wts[NH * NL * NL];
    eng_mha_args a = {.layer = l,
                      .B = 1,
                      .L = NL,
                      .x = x,
                      .out = out,
                      .causal = true,
                      .positional = ENG_POSITIONAL_ROPE};
    CHECK(eng_mha(pool, &a, NULL, &err) == ENG_EINVAL && strcmp(err.field, "positional") == 0);
    a.positional = ENG_POSITIONAL_NONE;
    a.weights_mode = ENG_WEIGHTS_PER_HEAD;
    a.weights = wts;
    CHECK(eng_mha(pool, &a, NULL, &err) == ENG_EINVAL && strcmp(err.field, "weights_mode") == 0);
    eng_layer_free(l);
    free(p);
}

int main(void)
{
    int status;
    if (test_engine_start(&pool, &status))
        return status;
    RUN(test_rope_over_part_of_each_head_in_both_layouts);
    RUN(test_qk_norms_per_head_and_over_the_projection);
    RUN(test_scale_softcap_window_and_sinks);
    RUN(test_heads_wider_than_the_hidden_size);
    RUN(test_inverse_frequencies_of_each_scaling);
    RUN(test_longrope_positions_stop_at_the_original_context);
    RUN(test_refusals_name_the_field);
    eng_pool_free(pool);
    return check_report();
}
