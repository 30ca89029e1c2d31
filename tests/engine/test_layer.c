/*
 * test_layer.c - the specification of layer assembly: eng_layer_new from the roles each
 * naming scheme docs/layers.md lists gives (the names through api/models/weights.c, as a file
 * or a request names its tensors: tests/support/named_layer.c), its refusals, eng_layer_params
 * and the built-in demo layer.
 *
 * A scheme is right when the assembled layer computes what the tensors mean: every case runs
 * eng_mha on the layer and compares with the float64 reference (tests/support/ref_mha.c) fed
 * from the test's own arrays, never from the layer's copies. Tolerance: max |engine -
 * reference| <= 1e-4 * max |reference| (the fp32 error budget is explained in test_mha.c; a
 * swapped or misplaced projection is off by the whole output scale). The copies themselves
 * are compared bit for bit, since F32 assembly is a copy and F16/BF16 conversion is exact.
 *
 * Refusals: NULL, a status of ENG_EFORMAT (a tensor is wrong) or ENG_EINVAL (a head count is
 * wrong), and err.field naming the tensor or argument at fault.
 */
#include "engine/engine.h"
#include "tests/support/check.h"
#include "tests/support/named_layer.h"
#include "tests/support/ref_mha.h"
#include "tests/support/safetensors_writer.h"
#include "tests/support/util.h"

#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define GOLDEN_PATH "tests/engine/cases/seed_cases.json"

static eng_pool *pool;

/* ---- Helpers ------------------------------------------------------------------------------ */

/* Uniform in [-amp, amp), on a grid of amp/128 so that F16 and BF16 hold every value exactly. */
static float rng_grid(uint64_t *s, double amp)
{
    int64_t k = (int64_t)(rng_next(s) % 255) - 127;
    return (float)((double)k / 128.0 * amp);
}

static float *random_array(int64_t n, double amp, uint64_t *rng)
{
    float *p = xcalloc((size_t)n, sizeof(float));
    for (int64_t i = 0; i < n; i++)
        p[i] = rng_grid(rng, amp);
    return p;
}

/* A layer's tensors as the test holds them, plus the packed forms torch would store. */
typedef struct {
    int64_t E, H, Hkv, W, kdim, vdim;
    bool bias, bias_kv;
    float *wq, *wk, *wv, *wo;
    float *bq, *bk, *bv, *bo; /* NULL without biases */
    float *bias_k, *bias_v;   /* NULL without add_bias_kv */
    float *in_w, *in_b;       /* [E + 2W, E] and [E + 2W] when kdim = vdim = E */
} raw_layer;

static raw_layer raw_make(int64_t E, int64_t H, int64_t Hkv, int64_t kdim, int64_t vdim, bool bias,
                          bool bias_kv, uint64_t seed)
{
    uint64_t rng = seed;
    raw_layer r;
    memset(&r, 0, sizeof r);
    r.E = E, r.H = H, r.Hkv = Hkv ? Hkv : H;
    r.W = r.Hkv * (E / H);
    r.kdim = kdim ? kdim : E, r.vdim = vdim ? vdim : E;
    r.bias = bias, r.bias_kv = bias_kv;
    r.wq = random_array(E * E, 1.0 / sqrt((double)E), &rng);
    r.wk = random_array(r.W * r.kdim, 1.0 / sqrt((double)r.kdim), &rng);
    r.wv = random_array(r.W * r.vdim, 1.0 / sqrt((double)r.vdim), &rng);
    r.wo = random_array(E * E, 1.0 / sqrt((double)E), &rng);
    if (bias) {
        r.bq = random_array(E, 0.5, &rng);
        r.bk = random_array(r.W, 0.5, &rng);
        r.bv = random_array(r.W, 0.5, &rng);
        r.bo = random_array(E, 0.5, &rng);
    }
    if (bias_kv) {
        r.bias_k = random_array(r.W, 1.0, &rng);
        r.bias_v = random_array(r.W, 1.0, &rng);
    }
    if (r.kdim == E && r.vdim == E) {
        r.in_w = xcalloc((size_t)((E + 2 * r.W) * E), sizeof(float));
        memcpy(r.in_w, r.wq, (size_t)(E * E) * sizeof(float));
        memcpy(r.in_w + E * E, r.wk, (size_t)(r.W * E) * sizeof(float));
        memcpy(r.in_w + (E + r.W) * E, r.wv, (size_t)(r.W * E) * sizeof(float));
        if (bias) {
            r.in_b = xcalloc((size_t)(E + 2 * r.W), sizeof(float));
            memcpy(r.in_b, r.bq, (size_t)E * sizeof(float));
            memcpy(r.in_b + E, r.bk, (size_t)r.W * sizeof(float));
            memcpy(r.in_b + E + r.W, r.bv, (size_t)r.W * sizeof(float));
        }
    }
    return r;
}

static void raw_free(raw_layer *r)
{
    float *all[] = {r->wq, r->wk, r->wv,     r->wo,     r->bq,   r->bk,
                    r->bv, r->bo, r->bias_k, r->bias_v, r->in_w, r->in_b};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
    memset(r, 0, sizeof *r);
}

static ref_mha_weights raw_weights(const raw_layer *r)
{
    ref_mha_weights w = {.embed_dim = r->E,
                         .num_heads = r->H,
                         .num_kv_heads = r->Hkv,
                         .kdim = r->kdim,
                         .vdim = r->vdim,
                         .w_q = r->wq,
                         .w_k = r->wk,
                         .w_v = r->wv,
                         .w_o = r->wo,
                         .b_q = r->bq,
                         .b_k = r->bk,
                         .b_v = r->bv,
                         .b_o = r->bo,
                         .bias_k = r->bias_k,
                         .bias_v = r->bias_v};
    return w;
}

static eng_weight tref(const char *name, const float *data, int rank, int64_t d0, int64_t d1,
                       int64_t d2)
{
    eng_weight t = {name, ENG_DTYPE_F32, data, rank, {d0, d1, d2, 0}};
    return t;
}

/* The tensors of `r` under one naming scheme. */
typedef enum { SCHEME_TORCH_PACKED, SCHEME_TORCH_SEPARATE, SCHEME_HF, SCHEME_TUTORIAL } scheme;

static const char *scheme_name(scheme s)
{
    static const char *const names[] = {"torch in_proj_weight", "torch q/k/v_proj_weight",
                                        "HF q_proj/k_proj/v_proj/o_proj", "W_Q/W_K/W_V/W_O"};
    return names[s];
}

static size_t scheme_tensors(const raw_layer *r, scheme s, eng_weight *t)
{
    size_t n = 0;
    int64_t E = r->E, W = r->W;
    switch (s) {
    case SCHEME_TORCH_PACKED:
        t[n++] = tref("in_proj_weight", r->in_w, 2, E + 2 * W, E, 0);
        if (r->bias)
            t[n++] = tref("in_proj_bias", r->in_b, 1, E + 2 * W, 0, 0);
        t[n++] = tref("out_proj.weight", r->wo, 2, E, E, 0);
        if (r->bias)
            t[n++] = tref("out_proj.bias", r->bo, 1, E, 0, 0);
        break;
    case SCHEME_TORCH_SEPARATE:
        /* torch with kdim/vdim: separate weights but one packed in_proj_bias [3E]. */
        t[n++] = tref("q_proj_weight", r->wq, 2, E, E, 0);
        t[n++] = tref("k_proj_weight", r->wk, 2, W, r->kdim, 0);
        t[n++] = tref("v_proj_weight", r->wv, 2, W, r->vdim, 0);
        if (r->bias)
            t[n++] = tref("in_proj_bias", r->in_b, 1, E + 2 * W, 0, 0);
        t[n++] = tref("out_proj.weight", r->wo, 2, E, E, 0);
        if (r->bias)
            t[n++] = tref("out_proj.bias", r->bo, 1, E, 0, 0);
        break;
    case SCHEME_HF:
    case SCHEME_TUTORIAL: {
        bool hf = s == SCHEME_HF;
        t[n++] = tref(hf ? "q_proj.weight" : "W_Q.weight", r->wq, 2, E, E, 0);
        t[n++] = tref(hf ? "k_proj.weight" : "W_K.weight", r->wk, 2, W, r->kdim, 0);
        t[n++] = tref(hf ? "v_proj.weight" : "W_V.weight", r->wv, 2, W, r->vdim, 0);
        t[n++] = tref(hf ? "o_proj.weight" : "W_O.weight", r->wo, 2, E, E, 0);
        if (r->bias) {
            t[n++] = tref(hf ? "q_proj.bias" : "W_Q.bias", r->bq, 1, E, 0, 0);
            t[n++] = tref(hf ? "k_proj.bias" : "W_K.bias", r->bk, 1, W, 0, 0);
            t[n++] = tref(hf ? "v_proj.bias" : "W_V.bias", r->bv, 1, W, 0, 0);
            t[n++] = tref(hf ? "o_proj.bias" : "W_O.bias", r->bo, 1, E, 0, 0);
        }
        break;
    }
    }
    if (r->bias_kv) { /* torch stores them as [1, 1, E] */
        t[n++] = tref("bias_k", r->bias_k, 3, 1, 1, W);
        t[n++] = tref("bias_v", r->bias_v, 3, 1, 1, W);
    }
    return n;
}

static bool same_floats(const float *a, const float *b, int64_t n)
{
    if (!a || !b)
        return a == b;
    return memcmp(a, b, (size_t)n * sizeof(float)) == 0;
}

/* The layer holds exactly the test's arrays, in the roles the names give them. */
static void expect_layer_holds(const eng_layer *l, const raw_layer *r, const char *note)
{
    int64_t E = r->E, W = r->W;
    CHECKF(l->embed_dim == E && l->num_heads == r->H && l->num_kv_heads == r->Hkv &&
               l->kdim == r->kdim && l->vdim == r->vdim,
           "%s: E %lld H %lld Hkv %lld kdim %lld vdim %lld, expected %lld %lld %lld %lld %lld",
           note, (long long)l->embed_dim, (long long)l->num_heads, (long long)l->num_kv_heads,
           (long long)l->kdim, (long long)l->vdim, (long long)E, (long long)r->H, (long long)r->Hkv,
           (long long)r->kdim, (long long)r->vdim);
    CHECKF(same_floats(l->w_q, r->wq, E * E), "%s: w_q differs", note);
    CHECKF(same_floats(l->w_k, r->wk, W * r->kdim), "%s: w_k differs", note);
    CHECKF(same_floats(l->w_v, r->wv, W * r->vdim), "%s: w_v differs", note);
    CHECKF(same_floats(l->w_o, r->wo, E * E), "%s: w_o differs", note);
    CHECKF(same_floats(l->b_q, r->bq, E), "%s: b_q differs or is missing", note);
    CHECKF(same_floats(l->b_k, r->bk, W), "%s: b_k differs or is missing", note);
    CHECKF(same_floats(l->b_v, r->bv, W), "%s: b_v differs or is missing", note);
    CHECKF(same_floats(l->b_o, r->bo, E), "%s: b_o differs or is missing", note);
    CHECKF(same_floats(l->bias_k, r->bias_k, W), "%s: bias_k differs or is missing", note);
    CHECKF(same_floats(l->bias_v, r->bias_v, W), "%s: bias_v differs or is missing", note);
}

/* eng_mha on the layer against the reference on the raw arrays: causal, key padding, add_zero_attn
 * and per-head weights on, so that every parameter shows in the output. */
static void expect_forward_matches(const eng_layer *l, const raw_layer *r, const char *note)
{
    uint64_t rng = 77;
    int64_t B = 2, L = 6, S = r->kdim == r->E && r->vdim == r->E ? L : 8, E = r->E;
    bool cross = !(r->kdim == E && r->vdim == E);
    float *x = random_array(B * L * E, 1.0, &rng);
    float *mk = cross ? random_array(B * S * r->kdim, 1.0, &rng) : NULL;
    float *mv = cross ? random_array(B * S * r->vdim, 1.0, &rng) : NULL;
    float *out = xcalloc((size_t)(B * L * E), sizeof(float));
    uint8_t pad[2 * 8] = {0};
    pad[S - 1] = 1; /* batch 0 ignores its last key */
    eng_mha_args a;
    memset(&a, 0, sizeof a);
    a.layer = l;
    a.B = B;
    a.L = L;
    a.x = x;
    a.S = cross ? S : 0;
    a.key_in = mk;
    a.value_in = mv;
    a.out = out;
    a.causal = !cross;
    a.key_padding = pad;
    a.key_padding_stride = S;
    a.add_zero_attn = true;
    eng_error err;
    eng_status st = eng_mha(pool, &a, NULL, &err);
    CHECKF(st == ENG_OK, "%s: eng_mha: %s (%s)", note, err.message, err.field);
    ref_mha_weights w = raw_weights(r);
    ref_mha_result res;
    if (!ref_mha(&w, &a, &res))
        abort();
    double scale = 0, worst = 0;
    for (int64_t i = 0; i < B * L * E; i++) {
        scale = fmax(scale, fabs(res.out[i]));
        double e = fabs((double)out[i] - res.out[i]);
        worst = isnan(e) ? INFINITY : fmax(worst, e);
    }
    CHECKF(st == ENG_OK && worst <= 1e-4 * fmax(scale, 1e-3),
           "%s: forward differs from the reference by %.3g (output scale %.3g)", note, worst,
           scale);
    ref_mha_result_free(&res);
    free(x);
    free(mk);
    free(mv);
    free(out);
}

/* Assembles r under scheme s and checks contents, parameter count and forward pass. */
static void expect_scheme_works(const raw_layer *r, scheme s)
{
    eng_weight t[16];
    size_t n = scheme_tensors(r, s, t);
    char note[160];
    snprintf(note, sizeof note, "%s (E %lld, H %lld, Hkv %lld, kdim %lld, vdim %lld%s%s)",
             scheme_name(s), (long long)r->E, (long long)r->H, (long long)r->Hkv,
             (long long)r->kdim, (long long)r->vdim, r->bias ? ", biases" : "",
             r->bias_kv ? ", bias_kv" : "");
    eng_error err;
    memset(&err, 0, sizeof err);
    eng_layer *l = named_layer("scheme", t, n, r->H, r->Hkv == r->H ? 0 : r->Hkv, &err);
    CHECKF(l != NULL, "%s: refused: %s (%s, field '%s')", note, err.message,
           eng_status_str(err.status), err.field);
    if (!l)
        return;
    CHECKF(strcmp(l->name, "scheme") == 0, "%s: name '%s'", note, l->name);
    CHECKF(strcmp(l->dtype, "F32") == 0, "%s: dtype '%s'", note, l->dtype);
    expect_layer_holds(l, r, note);
    int64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t k = 1;
        for (int d = 0; d < t[i].rank; d++)
            k *= t[i].shape[d];
        total += k;
    }
    CHECKF(eng_layer_params(l) == total, "%s: eng_layer_params %lld, the tensors hold %lld", note,
           (long long)eng_layer_params(l), (long long)total);
    expect_forward_matches(l, r, note);
    eng_layer_free(l);
}

/* ---- Naming schemes ------------------------------------------------------------------------ */

static void test_torch_state_dict_with_packed_in_proj(void)
{
    for (int variant = 0; variant < 3; variant++) {
        raw_layer r = raw_make(32, 4, 0, 0, 0, variant != 1, variant == 2, 300 + (uint64_t)variant);
        expect_scheme_works(&r, SCHEME_TORCH_PACKED);
        raw_free(&r);
    }
}

/* nn.MultiheadAttention(E, H, kdim=.., vdim=.., bias=False): q/k/v_proj_weight alone. */
static void test_torch_state_dict_with_separate_proj_weights(void)
{
    raw_layer r = raw_make(32, 4, 0, 20, 28, false, false, 310);
    expect_scheme_works(&r, SCHEME_TORCH_SEPARATE);
    raw_free(&r);
}

/* nn.MultiheadAttention(E, H, kdim=.., vdim=..) with bias=True (the default) stores
 * q/k/v_proj_weight and one packed in_proj_bias [3E] (torch creates in_proj_bias whenever
 * bias is set, whatever the weights): that is its state dict, and it must load unchanged. */
static void test_torch_state_dict_with_separate_proj_weights_and_in_proj_bias(void)
{
    raw_layer r = raw_make(32, 4, 0, 20, 28, true, true, 311);
    r.in_b = xcalloc((size_t)(3 * 32), sizeof(float));
    memcpy(r.in_b, r.bq, 32 * sizeof(float));
    memcpy(r.in_b + 32, r.bk, 32 * sizeof(float));
    memcpy(r.in_b + 64, r.bv, 32 * sizeof(float));
    expect_scheme_works(&r, SCHEME_TORCH_SEPARATE);
    raw_free(&r);
}

static void test_hf_projections_with_and_without_biases(void)
{
    raw_layer r = raw_make(32, 4, 0, 0, 0, true, false, 320);
    expect_scheme_works(&r, SCHEME_HF);
    raw_free(&r);
    r = raw_make(32, 4, 0, 0, 0, false, false, 321);
    expect_scheme_works(&r, SCHEME_HF);
    raw_free(&r);
    /* Grouped-query (Llama-style): k/v_proj.weight [Hkv * D, E]. */
    r = raw_make(64, 8, 2, 0, 0, false, false, 322);
    expect_scheme_works(&r, SCHEME_HF);
    raw_free(&r);
    /* Cross-attention widths. */
    r = raw_make(32, 4, 0, 12, 20, true, false, 323);
    expect_scheme_works(&r, SCHEME_HF);
    raw_free(&r);
}

static void test_tutorial_w_q_w_k_w_v_w_o_names(void)
{
    raw_layer r = raw_make(32, 4, 0, 0, 0, false, false, 330);
    expect_scheme_works(&r, SCHEME_TUTORIAL);
    raw_free(&r);
    r = raw_make(32, 4, 0, 0, 0, true, true, 331);
    expect_scheme_works(&r, SCHEME_TUTORIAL);
    raw_free(&r);
}

/* F16 and BF16 tensors are converted exactly (the values are on a grid both formats hold). */
static void test_f16_and_bf16_tensors_are_converted_exactly(void)
{
    raw_layer r = raw_make(16, 2, 0, 0, 0, true, false, 340);
    for (int d = 0; d < 2; d++) {
        eng_weight t[16];
        size_t n = scheme_tensors(&r, SCHEME_HF, t);
        uint16_t *halves[16];
        for (size_t i = 0; i < n; i++) {
            int64_t k = 1;
            for (int j = 0; j < t[i].rank; j++)
                k *= t[i].shape[j];
            halves[i] = xcalloc((size_t)k, sizeof(uint16_t));
            const float *src = t[i].data;
            for (int64_t j = 0; j < k; j++)
                halves[i][j] = d == 0 ? stw_f32_to_f16(src[j]) : stw_f32_to_bf16(src[j]);
            t[i].data = halves[i];
            t[i].dtype = d == 0 ? ENG_DTYPE_F16 : ENG_DTYPE_BF16;
        }
        eng_error err;
        eng_layer *l = named_layer("half", t, n, 2, 0, &err);
        const char *note = d == 0 ? "F16 tensors" : "BF16 tensors";
        CHECKF(l != NULL, "%s refused: %s", note, err.message);
        if (l) {
            CHECKF(strcmp(l->dtype, d == 0 ? "F16" : "BF16") == 0, "%s: dtype '%s'", note,
                   l->dtype);
            expect_layer_holds(l, &r, note);
            eng_layer_free(l);
        }
        for (size_t i = 0; i < n; i++)
            free(halves[i]);
    }
    raw_free(&r);
}

/* ---- Refusals ------------------------------------------------------------------------------ */

/* Expects NULL with `status` and err.field equal to one of the '|'-separated names. */
static void expect_refused(const eng_weight *t, size_t n, int64_t heads, int64_t kv_heads,
                           eng_status status, const char *fields, const char *note)
{
    eng_error err;
    memset(&err, 0, sizeof err);
    eng_layer *l = named_layer("bad", t, n, heads, kv_heads, &err);
    CHECKF(l == NULL, "%s: accepted", note);
    eng_layer_free(l);
    if (l)
        return;
    CHECKF(err.status == status, "%s: status %s, expected %s (%s)", note,
           eng_status_str(err.status), eng_status_str(status), err.message);
    /* Head counts are the call's arguments, every other field one of the tensors. */
    const bool counts = strcmp(fields, "num_heads") == 0 || strcmp(fields, "num_kv_heads") == 0;
    CHECKF((err.cause == ENG_CAUSE_HEAD_COUNT) == counts, "%s: cause %d on '%s'", note,
           (int)err.cause, err.field);
    bool named = false;
    const char *p = fields;
    while (*p) {
        size_t len = strcspn(p, "|");
        if (strlen(err.field) == len && strncmp(err.field, p, len) == 0)
            named = true;
        p += len + (p[len] == '|');
    }
    CHECKF(named, "%s: err.field is '%s', expected %s (message: %s)", note, err.field, fields,
           err.message);
    CHECKF(err.message[0] != '\0', "%s: no message", note);
}

static void test_rejects_unknown_tensor_name(void)
{
    raw_layer r = raw_make(8, 2, 0, 0, 0, true, false, 400);
    eng_weight t[16];
    size_t n = scheme_tensors(&r, SCHEME_HF, t);
    t[n++] = tref("q_proj.scale", r.bq, 1, 8, 0, 0);
    expect_refused(t, n, 2, 0, ENG_EFORMAT, "q_proj.scale", "an extra unknown tensor");
    n = scheme_tensors(&r, SCHEME_TORCH_PACKED, t);
    t[0].label = "in_proj.weight"; /* a typo of in_proj_weight */
    expect_refused(t, n, 2, 0, ENG_EFORMAT, "in_proj.weight", "a misspelt name");
    raw_free(&r);
}

static void test_rejects_a_role_given_twice(void)
{
    raw_layer r = raw_make(8, 2, 0, 0, 0, true, false, 401);
    eng_weight t[16];
    size_t n = scheme_tensors(&r, SCHEME_HF, t);
    t[n++] = tref("W_Q.weight", r.wq, 2, 8, 8, 0);
    expect_refused(t, n, 2, 0, ENG_EFORMAT, "W_Q.weight|q_proj.weight",
                   "q_proj.weight and W_Q.weight");
    n = scheme_tensors(&r, SCHEME_TORCH_PACKED, t);
    t[n++] = tref("o_proj.weight", r.wo, 2, 8, 8, 0);
    expect_refused(t, n, 2, 0, ENG_EFORMAT, "o_proj.weight|out_proj.weight",
                   "out_proj.weight and o_proj.weight");
    n = scheme_tensors(&r, SCHEME_HF, t);
    t[n] = t[0]; /* the very same name twice */
    n++;
    expect_refused(t, n, 2, 0, ENG_EFORMAT, "q_proj.weight", "q_proj.weight twice");
    raw_free(&r);
}

static void test_rejects_packed_and_separate_projections_mixed(void)
{
    raw_layer r = raw_make(8, 2, 0, 0, 0, true, false, 402);
    eng_weight t[16];
    size_t n = scheme_tensors(&r, SCHEME_TORCH_PACKED, t);
    t[n++] = tref("k_proj.weight", r.wk, 2, 8, 8, 0);
    expect_refused(t, n, 2, 0, ENG_EFORMAT, "in_proj_weight|k_proj.weight",
                   "in_proj_weight with k_proj.weight");
    n = scheme_tensors(&r, SCHEME_TORCH_PACKED, t);
    t[n++] = tref("q_proj_weight", r.wq, 2, 8, 8, 0);
    expect_refused(t, n, 2, 0, ENG_EFORMAT, "in_proj_weight|q_proj_weight",
                   "in_proj_weight with q_proj_weight");
    raw_free(&r);
}

static void test_rejects_missing_output_projection(void)
{
    raw_layer r = raw_make(8, 2, 0, 0, 0, false, false, 403);
    const scheme schemes[] = {SCHEME_TORCH_PACKED, SCHEME_HF, SCHEME_TUTORIAL};
    for (size_t s = 0; s < 3; s++) {
        eng_weight t[16], kept[16];
        size_t n = scheme_tensors(&r, schemes[s], t), m = 0;
        for (size_t i = 0; i < n; i++)
            if (!strstr(t[i].label, "out_proj") && !strstr(t[i].label, "o_proj") &&
                !strstr(t[i].label, "W_O"))
                kept[m++] = t[i];
        char note[96];
        snprintf(note, sizeof note, "%s without its output projection", scheme_name(schemes[s]));
        expect_refused(kept, m, 2, 0, ENG_EFORMAT, "out_proj.weight|o_proj.weight|W_O.weight",
                       note);
    }
    expect_refused(NULL, 0, 2, 0, ENG_EFORMAT, "out_proj.weight|o_proj.weight|W_O.weight",
                   "no tensors at all");
    raw_free(&r);
}

/* The error names the missing key projection, in the scheme's own spelling. */
static void test_rejects_missing_key_projection(void)
{
    raw_layer r = raw_make(8, 2, 0, 0, 0, false, false, 404);
    const struct {
        scheme s;
        const char *k;
    } cases[] = {{SCHEME_HF, "k_proj.weight"},
                 {SCHEME_TUTORIAL, "W_K.weight"},
                 {SCHEME_TORCH_SEPARATE, "k_proj_weight"}};
    for (size_t c = 0; c < 3; c++) {
        eng_weight t[16], kept[16];
        size_t n = scheme_tensors(&r, cases[c].s, t), m = 0;
        for (size_t i = 0; i < n; i++)
            if (strcmp(t[i].label, cases[c].k) != 0)
                kept[m++] = t[i];
        char note[96];
        snprintf(note, sizeof note, "%s without %s", scheme_name(cases[c].s), cases[c].k);
        expect_refused(kept, m, 2, 0, ENG_EFORMAT, cases[c].k, note);
    }
    raw_free(&r);
}

static void test_rejects_wrong_shapes(void)
{
    enum { E = 8 };
    raw_layer r = raw_make(E, 2, 0, 0, 0, true, true, 405);
    float *big = xcalloc(4 * E * E, sizeof(float));
    const struct {
        scheme s;
        const char *name;
        int rank;
        int64_t d0, d1;
    } cases[] = {
        {SCHEME_TORCH_PACKED, "in_proj_weight", 2, 3 * E, E + 1},
        {SCHEME_TORCH_PACKED, "in_proj_weight", 2, 3 * E - 1, E},
        {SCHEME_TORCH_PACKED, "in_proj_weight", 1, 3 * E * E, 0},
        {SCHEME_TORCH_PACKED, "out_proj.weight", 2, E, E + 1},
        {SCHEME_HF, "q_proj.weight", 2, E, E + 2},
        {SCHEME_HF, "k_proj.weight", 2, E + 2, E},
        {SCHEME_HF, "v_proj.weight", 2, E - 2, E},
        {SCHEME_HF, "v_proj.weight", 1, E * E, 0},
        {SCHEME_TUTORIAL, "W_O.weight", 2, 2 * E, E / 2},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        eng_weight t[16];
        size_t n = scheme_tensors(&r, cases[c].s, t);
        for (size_t i = 0; i < n; i++)
            if (strcmp(t[i].label, cases[c].name) == 0)
                t[i] = tref(cases[c].name, big, cases[c].rank, cases[c].d0, cases[c].d1, 0);
        char note[96];
        snprintf(note, sizeof note, "%s of shape [%lld, %lld] (rank %d)", cases[c].name,
                 (long long)cases[c].d0, (long long)cases[c].d1, cases[c].rank);
        expect_refused(t, n, 2, 0, ENG_EFORMAT, cases[c].name, note);
    }
    /* Degenerate shapes: a zero dimension, rank 0, rank 5. */
    eng_weight t[16];
    size_t n = scheme_tensors(&r, SCHEME_HF, t);
    t[1] = tref("k_proj.weight", big, 2, 0, E, 0);
    expect_refused(t, n, 2, 0, ENG_EFORMAT, "k_proj.weight", "k_proj.weight [0, E]");
    n = scheme_tensors(&r, SCHEME_HF, t);
    t[1].rank = 0;
    expect_refused(t, n, 2, 0, ENG_EFORMAT, "k_proj.weight", "k_proj.weight of rank 0");
    n = scheme_tensors(&r, SCHEME_HF, t);
    t[1].rank = 5;
    expect_refused(t, n, 2, 0, ENG_EFORMAT, "k_proj.weight", "k_proj.weight of rank 5");
    free(big);
    raw_free(&r);
}

static void test_rejects_bias_of_wrong_length(void)
{
    enum { E = 8 };
    raw_layer r = raw_make(E, 2, 0, 0, 0, true, true, 406);
    float *big = xcalloc(4 * E, sizeof(float));
    const struct {
        scheme s;
        const char *name;
        int64_t len;
    } cases[] = {
        {SCHEME_TORCH_PACKED, "in_proj_bias", 3 * E - 1},
        {SCHEME_TORCH_PACKED, "out_proj.bias", E + 1},
        {SCHEME_HF, "q_proj.bias", E - 1},
        {SCHEME_HF, "k_proj.bias", E + 1},
        {SCHEME_HF, "v_proj.bias", 2 * E},
        {SCHEME_TUTORIAL, "W_O.bias", 1},
        {SCHEME_HF, "bias_k", E + 1},
        {SCHEME_HF, "bias_v", E - 1},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        eng_weight t[16];
        size_t n = scheme_tensors(&r, cases[c].s, t);
        for (size_t i = 0; i < n; i++)
            if (strcmp(t[i].label, cases[c].name) == 0)
                t[i] = tref(cases[c].name, big, 1, cases[c].len, 0, 0);
        char note[96];
        snprintf(note, sizeof note, "%s of length %lld", cases[c].name, (long long)cases[c].len);
        expect_refused(t, n, 2, 0, ENG_EFORMAT, cases[c].name, note);
    }
    /* Grouped-query: k_proj.bias must be Hkv * D long, not E. */
    raw_layer g = raw_make(16, 4, 2, 0, 0, true, false, 407);
    eng_weight t[16];
    size_t n = scheme_tensors(&g, SCHEME_HF, t);
    float *wide = xcalloc(16, sizeof(float));
    for (size_t i = 0; i < n; i++)
        if (strcmp(t[i].label, "k_proj.bias") == 0)
            t[i] = tref("k_proj.bias", wide, 1, 16, 0, 0);
    expect_refused(t, n, 4, 2, ENG_EFORMAT, "k_proj.bias", "GQA k_proj.bias of length E");
    free(wide);
    raw_free(&g);
    free(big);
    raw_free(&r);
}

static void test_rejects_num_heads_not_dividing_embed_dim(void)
{
    raw_layer r = raw_make(12, 4, 0, 0, 0, true, false, 408);
    eng_weight t[16];
    size_t n = scheme_tensors(&r, SCHEME_TORCH_PACKED, t);
    const int64_t heads[] = {5, 8, 24, 0, -4};
    for (size_t i = 0; i < sizeof heads / sizeof heads[0]; i++) {
        char note[64];
        snprintf(note, sizeof note, "E 12 with num_heads %lld", (long long)heads[i]);
        expect_refused(t, n, heads[i], 0, ENG_EINVAL, "num_heads", note);
    }
    raw_free(&r);
}

static void test_rejects_num_kv_heads_not_dividing_num_heads(void)
{
    raw_layer r = raw_make(24, 6, 0, 0, 0, true, false, 409);
    eng_weight t[16];
    size_t n = scheme_tensors(&r, SCHEME_HF, t);
    const int64_t kv[] = {4, 5, 12};
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++) {
        char note[64];
        snprintf(note, sizeof note, "6 heads with num_kv_heads %lld", (long long)kv[i]);
        expect_refused(t, n, 6, kv[i], ENG_EINVAL, "num_kv_heads", note);
    }
    /* A valid group count whose k/v widths do not match the tensors names the tensor. */
    expect_refused(t, n, 6, 3, ENG_EFORMAT, "k_proj.weight", "num_kv_heads 3 with full-width k");
    raw_free(&r);
}

static void test_rejects_bias_k_without_bias_v(void)
{
    raw_layer r = raw_make(8, 2, 0, 0, 0, true, true, 410);
    eng_weight t[16];
    size_t n = scheme_tensors(&r, SCHEME_TORCH_PACKED, t);
    /* bias_k and bias_v are the last two. */
    expect_refused(t, n - 1, 2, 0, ENG_EFORMAT, "bias_v", "bias_k without bias_v");
    t[n - 2] = t[n - 1];
    expect_refused(t, n - 1, 2, 0, ENG_EFORMAT, "bias_k", "bias_v without bias_k");
    raw_free(&r);
}

/* ---- Parameter count, demo layer, golden ----------------------------------------------------- */

/* Checked for every scheme above by expect_scheme_works; here the formula itself for the
 * shapes torch documents. */
static void test_parameter_count_equals_sum_of_tensor_sizes(void)
{
    raw_layer r = raw_make(16, 4, 0, 0, 0, true, true, 420);
    eng_weight t[16];
    size_t n = scheme_tensors(&r, SCHEME_TORCH_PACKED, t);
    eng_error err;
    eng_layer *l = named_layer("count", t, n, 4, 0, &err);
    CHECK(l != NULL);
    /* in_proj 3E*E + 3E, out_proj E*E + E, bias_k/v 2E. */
    if (l)
        CHECK_EQ_INT(eng_layer_params(l), 3 * 256 + 48 + 256 + 16 + 32);
    eng_layer_free(l);
    raw_free(&r);

    r = raw_make(32, 8, 2, 0, 0, false, false, 421); /* W = 8 */
    n = scheme_tensors(&r, SCHEME_HF, t);
    l = named_layer("count", t, n, 8, 2, &err);
    CHECK(l != NULL);
    if (l)
        CHECK_EQ_INT(eng_layer_params(l), 32 * 32 * 2 + 8 * 32 * 2);
    eng_layer_free(l);
    raw_free(&r);

    r = raw_make(16, 2, 0, 5, 7, true, false, 422);
    n = scheme_tensors(&r, SCHEME_HF, t);
    l = named_layer("count", t, n, 2, 0, &err);
    CHECK(l != NULL);
    if (l)
        CHECK_EQ_INT(eng_layer_params(l), 16 * 16 * 2 + 16 * 5 + 16 * 7 + 16 * 4);
    eng_layer_free(l);
    raw_free(&r);
    eng_layer_free(NULL); /* a no-op */
}

/* The built-in layer: E 64, 4 heads, biases, the same weights on every call, in +-1/sqrt(E). */
static void test_demo_layer_is_present_and_deterministic(void)
{
    eng_layer *a = eng_layer_demo(), *b = eng_layer_demo();
    CHECK(a != NULL && b != NULL);
    if (a && b) {
        CHECKF(strcmp(a->name, "demo") == 0, "demo layer named '%s'", a->name);
        CHECK_EQ_INT(a->embed_dim, 64);
        CHECK_EQ_INT(a->num_heads, 4);
        CHECK_EQ_INT(a->num_kv_heads, 4);
        CHECK_EQ_INT(a->kdim, 64);
        CHECK_EQ_INT(a->vdim, 64);
        CHECK(a->b_q && a->b_k && a->b_v && a->b_o);
        CHECK(!a->bias_k && !a->bias_v);
        int64_t n = eng_layer_params(a);
        CHECK_EQ_INT(n, 4 * 64 * 64 + 4 * 64);
        CHECK_EQ_INT(eng_layer_params(b), n);
        const float *pa[] = {a->w_q, a->w_k, a->w_v, a->w_o, a->b_q, a->b_k, a->b_v, a->b_o};
        const float *pb[] = {b->w_q, b->w_k, b->w_v, b->w_o, b->b_q, b->b_k, b->b_v, b->b_o};
        const int64_t len[] = {4096, 4096, 4096, 4096, 64, 64, 64, 64};
        double bound = 1.0 / 8.0, biggest = 0;
        for (int i = 0; i < 8; i++) {
            CHECKF(same_floats(pa[i], pb[i], len[i]),
                   "demo parameter group %d differs between calls", i);
            for (int64_t k = 0; k < len[i] && pa[i]; k++) {
                CHECKF(fabs((double)pa[i][k]) <= bound, "demo group %d element %lld is %.9g", i,
                       (long long)k, (double)pa[i][k]);
                biggest = fmax(biggest, fabs((double)pa[i][k]));
            }
        }
        CHECKF(biggest > 0.1, "demo weights look degenerate (max |w| %g)", biggest);
        CHECK(!same_floats(a->w_q, a->w_k, 4096)); /* distinct draws per role */
        raw_layer r;
        memset(&r, 0, sizeof r);
        r.E = 64, r.H = 4, r.Hkv = 4, r.W = 64, r.kdim = 64, r.vdim = 64;
        r.wq = a->w_q, r.wk = a->w_k, r.wv = a->w_v, r.wo = a->w_o;
        r.bq = a->b_q, r.bk = a->b_k, r.bv = a->b_v, r.bo = a->b_o;
        expect_forward_matches(a, &r, "demo layer");
    }
    eng_layer_free(a);
    eng_layer_free(b);
}

static json_t *load_golden(void)
{
    return json_load_file(GOLDEN_PATH, 0, NULL);
}

/* seed_cases.json "multi-head arithmetic": embed_dim 512 with 8 heads gives head_dim 64. */
static void test_golden_multi_head_arithmetic(void)
{
    json_t *root = load_golden();
    CHECKF(root != NULL, "cannot read %s", GOLDEN_PATH);
    if (!root)
        return;
    int found = 0;
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(root, "cases"), i, c)
    {
        if (!json_object_get(c, "head_dim"))
            continue;
        found++;
        int64_t E = (int64_t)json_integer_value(json_object_get(c, "embed_dim"));
        int64_t H = (int64_t)json_integer_value(json_object_get(c, "num_heads"));
        int64_t D = (int64_t)json_integer_value(json_object_get(c, "head_dim"));
        CHECK(E == 512 && H == 8 && D == 64);
        if (E <= 0 || E > 4096 || H <= 0)
            continue;
        raw_layer r = raw_make(E, H, 0, 0, 0, false, false, 430);
        eng_weight t[16];
        size_t n = scheme_tensors(&r, SCHEME_TUTORIAL, t);
        eng_error err;
        eng_layer *l = named_layer("golden", t, n, H, 0, &err);
        CHECKF(l != NULL, "golden layer refused: %s", err.message);
        if (l) {
            CHECK_EQ_INT(l->embed_dim, E);
            CHECK_EQ_INT(l->num_heads, H);
            CHECK_EQ_INT(l->embed_dim / l->num_heads, D);
            CHECK_EQ_INT(l->num_kv_heads * (l->embed_dim / l->num_heads), E);
        }
        eng_layer_free(l);
        raw_free(&r);
    }
    CHECKF(found == 1, "expected one multi-head arithmetic case, found %d", found);
    json_decref(root);
}

int main(void)
{
    int status;
    if (test_engine_start(&pool, &status))
        return status;
    RUN(test_torch_state_dict_with_packed_in_proj);
    RUN(test_torch_state_dict_with_separate_proj_weights);
    RUN(test_torch_state_dict_with_separate_proj_weights_and_in_proj_bias);
    RUN(test_hf_projections_with_and_without_biases);
    RUN(test_tutorial_w_q_w_k_w_v_w_o_names);
    RUN(test_f16_and_bf16_tensors_are_converted_exactly);
    RUN(test_rejects_unknown_tensor_name);
    RUN(test_rejects_a_role_given_twice);
    RUN(test_rejects_packed_and_separate_projections_mixed);
    RUN(test_rejects_missing_output_projection);
    RUN(test_rejects_missing_key_projection);
    RUN(test_rejects_wrong_shapes);
    RUN(test_rejects_bias_of_wrong_length);
    RUN(test_rejects_num_heads_not_dividing_embed_dim);
    RUN(test_rejects_num_kv_heads_not_dividing_num_heads);
    RUN(test_rejects_bias_k_without_bias_v);
    RUN(test_parameter_count_equals_sum_of_tensor_sizes);
    RUN(test_demo_layer_is_present_and_deterministic);
    RUN(test_golden_multi_head_arithmetic);
    eng_pool_free(pool);
    return check_report();
}
