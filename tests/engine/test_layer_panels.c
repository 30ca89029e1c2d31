/*
 * test_layer_panels.c - a layer packs its four projection matrices once, when it is made, into
 * the panels its long inputs' products read (engine.h eng_layer: panels_*), and those panels
 * change nothing but the time.
 *
 * Packing is a copy (16-bit weights widened exactly), and the micro-kernels sum each column of
 * a product alone, so a prefill on the layer's panels must give the bits of the same prefill
 * packing as it goes: the layer's struct copied without its panels takes that path. So must a
 * call on another kernel set than the one the panels were packed for, which ignores them.
 * eng_layer_bytes counts the panels. Layers of fp32, BF16 and F16 weights; a packed in_proj
 * and separate projections with grouped-query heads, widths that are no multiple of any NR
 * and more rows than a widening step; self- and cross-attention, RoPE, a decoder layer, a
 * batch of two passes, bfloat16 requests. The Makefile runs it once per kernel set.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/kernels.h"
#include "tests/support/check.h"
#include "tests/support/engine_env.h"
#include "tests/support/util.h"

static eng_pool *pool;

typedef struct {
    const char *name;
    int64_t E, H, Hkv, kdim, vdim;
    bool packed_in; /* one in_proj_w (kdim = vdim = E) */
    bool decoder;   /* eng_layer_decoder with RoPE and q/k norms */
} layer_case;

static const layer_case cases[] = {
    {"packed in_proj, E 72 (D 18)", 72, 4, 4, 72, 72, true, false},
    {"separate projections, GQA, E 200, W 50, cross widths 40 and 88", 200, 8, 2, 40, 88, false,
     false},
    {"decoder, GQA, E 160, RoPE, RMS q/k norms", 160, 4, 2, 160, 160, false, true},
};

/* n values of `dtype` (as raw bits for F16 and BF16), uniform in +-amp. */
static void *values(size_t n, eng_dtype dtype, uint64_t *rng, double amp)
{
    if (dtype == ENG_DTYPE_F32) {
        float *x = xcalloc(n, sizeof *x);
        for (size_t i = 0; i < n; i++)
            x[i] = rng_sym(rng, amp);
        return x;
    }
    uint16_t *h = xcalloc(n, sizeof *h);
    for (size_t i = 0; i < n; i++) {
        float f = rng_sym(rng, amp);
        h[i] = dtype == ENG_DTYPE_F16 ? eng_f32_to_f16(f) : eng_f32_to_bf16(f);
    }
    return h;
}

/* Case c's layer, its matrices of `dtype` (kept in 16 bits), fp32 biases. */
static eng_layer *make_layer(const layer_case *c, eng_dtype dtype)
{
    uint64_t rng = 91 + (uint64_t)dtype;
    int64_t E = c->E, D = E / c->H, W = c->Hkv * D;
    eng_layer_weights w;
    memset(&w, 0, sizeof w);
    void *held[12] = {0};
    int n = 0;
    double amp = 1.0 / 8.0;
    if (c->packed_in) {
        w.in_proj_w = (eng_weight){
            NULL, dtype, held[n++] = values((size_t)(3 * E * E), dtype, &rng, amp), 2, {3 * E, E}};
        w.in_proj_b = (eng_weight){NULL,
                                   ENG_DTYPE_F32,
                                   held[n++] = values((size_t)(3 * E), ENG_DTYPE_F32, &rng, amp),
                                   1,
                                   {3 * E}};
    } else {
        w.q_w = (eng_weight){
            NULL, dtype, held[n++] = values((size_t)(E * E), dtype, &rng, amp), 2, {E, E}};
        w.k_w = (eng_weight){NULL,
                             dtype,
                             held[n++] = values((size_t)(W * c->kdim), dtype, &rng, amp),
                             2,
                             {W, c->kdim}};
        w.v_w = (eng_weight){NULL,
                             dtype,
                             held[n++] = values((size_t)(W * c->vdim), dtype, &rng, amp),
                             2,
                             {W, c->vdim}};
        w.k_b = (eng_weight){
            NULL, ENG_DTYPE_F32, held[n++] = values((size_t)W, ENG_DTYPE_F32, &rng, amp), 1, {W}};
    }
    w.o_w =
        (eng_weight){NULL, dtype, held[n++] = values((size_t)(E * E), dtype, &rng, amp), 2, {E, E}};
    w.o_b = (eng_weight){
        NULL, ENG_DTYPE_F32, held[n++] = values((size_t)E, ENG_DTYPE_F32, &rng, amp), 1, {E}};
    eng_error err;
    eng_layer *l;
    if (c->decoder) {
        float *qn = values((size_t)D, ENG_DTYPE_F32, &rng, 1.0);
        float *kn = values((size_t)D, ENG_DTYPE_F32, &rng, 1.0);
        held[n++] = qn;
        held[n++] = kn;
        w.q_norm_w = (eng_weight){NULL, ENG_DTYPE_F32, qn, 1, {D}};
        w.k_norm_w = (eng_weight){NULL, ENG_DTYPE_F32, kn, 1, {D}};
        eng_decoder_spec spec = {.rope = {.rotary_dim = D, .base = 10000.0},
                                 .qk_norm = ENG_QK_NORM_RMS,
                                 .qk_norm_eps = 1e-6};
        l = eng_layer_decoder("panels", &w, c->H, c->Hkv, &spec, &err);
    } else {
        l = eng_layer_new("panels", &w, c->H, c->Hkv, true, &err);
    }
    CHECKF(l != NULL, "[%s] layer: %s", c->name, l ? "" : err.message);
    for (int i = 0; i < n; i++)
        free(held[i]);
    return l;
}

/* The layer as it is, without its panels: its calls pack as they go. */
static eng_layer without_panels(const eng_layer *l)
{
    eng_layer plain = *l;
    plain.panels_q = plain.panels_k = plain.panels_v = plain.panels_o = NULL;
    plain.panels = NULL;
    plain.panels_floats = 0;
    plain.panels_kernels = NULL;
    return plain;
}

static int64_t round_up(int64_t x, int64_t m)
{
    return (x + m - 1) / m * m;
}

/* The panels are there on a set with micro-kernels (none on openblas), NR-wide panels of
 * every matrix, and eng_layer_bytes counts them. */
static void check_panels(const layer_case *c, const eng_layer *l, const char *dtype)
{
    const eng__kernels *ks = eng__kernels_current();
    int64_t E = c->E, W = c->Hkv * (E / c->H), nr = ks->nr;
    size_t floats = ks->tile ? (size_t)(round_up(E, nr) * E + round_up(W, nr) * c->kdim +
                                        round_up(W, nr) * c->vdim + round_up(E, nr) * E)
                             : 0;
    CHECKF(l->panels_floats == floats, "[%s, %s] %zu floats of panels, expected %zu", c->name,
           dtype, l->panels_floats, floats);
    CHECKF((l->panels != NULL) == (ks->tile != NULL) && (!ks->tile || l->panels_kernels == ks),
           "[%s, %s] panels %p for set %s", c->name, dtype, (void *)l->panels, ks->name);
    eng_layer plain = without_panels(l);
    CHECK_EQ_INT(eng_layer_bytes(l) - eng_layer_bytes(&plain), floats * sizeof(float));
}

static int64_t first_difference(const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof a[i]) != 0)
            return (int64_t)i;
    return -1;
}

/* The inputs of a prefill of B x L rows (cross-attention for separate k/v widths). */
typedef struct {
    int64_t B, L, S;
    float *x, *kin, *vin;
} prefill;

static prefill prefill_new(const layer_case *c, int64_t B, int64_t L)
{
    uint64_t rng = 7;
    bool cross = c->kdim != c->E || c->vdim != c->E;
    prefill p = {B, L, cross ? L - 9 : L, NULL, NULL, NULL};
    p.x = values((size_t)(B * L * c->E), ENG_DTYPE_F32, &rng, 1.0);
    if (cross) {
        p.kin = values((size_t)(B * p.S * c->kdim), ENG_DTYPE_F32, &rng, 1.0);
        p.vin = values((size_t)(B * p.S * c->vdim), ENG_DTYPE_F32, &rng, 1.0);
    }
    return p;
}

static void prefill_free(prefill *p)
{
    free(p->x), free(p->kin), free(p->vin);
}

/* Member k of a prefill (k < 2): batch row k of its inputs, or all of them for k < 0. */
static eng_mha_args prefill_args(const layer_case *c, const eng_layer *l, const prefill *p, int k,
                                 eng_precision precision, float *out)
{
    eng_mha_args a = {0};
    int64_t first = k < 0 ? 0 : k;
    a.layer = l;
    a.B = k < 0 ? p->B : 1;
    a.L = p->L;
    a.x = p->x + first * p->L * c->E;
    if (p->kin) {
        a.S = p->S;
        a.key_in = p->kin + first * p->S * c->kdim;
        a.value_in = p->vin + first * p->S * c->vdim;
    } else {
        a.causal = true;
        a.positional = c->decoder ? ENG_POSITIONAL_NONE : ENG_POSITIONAL_ROPE;
    }
    a.precision = precision;
    a.out = out;
    return a;
}

/* The prefill through layer l: one eng_mha call, or (batch) its two rows of the batch as two
 * members of one eng_mha_batch call. */
static float *run_prefill(const layer_case *c, const eng_layer *l, const prefill *p, bool batch,
                          eng_precision precision, const char *about)
{
    size_t n = (size_t)(p->B * p->L * c->E);
    float *out = xcalloc(n, sizeof *out);
    if (!batch) {
        eng_mha_args a = prefill_args(c, l, p, -1, precision, out);
        eng_error err;
        eng_status st = eng_mha(pool, &a, NULL, &err);
        CHECKF(st == ENG_OK, "[%s, %s] eng_mha: %s", c->name, about, err.message);
        return out;
    }
    eng_mha_args a[2];
    eng_mha_member m[2];
    eng_error err[2];
    for (int k = 0; k < 2; k++) {
        a[k] = prefill_args(c, l, p, k, precision, out + k * p->L * c->E);
        m[k] = (eng_mha_member){&a[k], NULL, &err[k], ENG_OK};
    }
    eng_status st = eng_mha_batch(pool, m, 2);
    CHECKF(st == ENG_OK && m[0].status == ENG_OK && m[1].status == ENG_OK,
           "[%s, %s] eng_mha_batch: %s", c->name, about, eng_status_str(st));
    return out;
}

/* The prefill on l's panels and packing as it goes: the same bits. */
static void check_same_bits(const layer_case *c, const eng_layer *l, const prefill *p, bool batch,
                            eng_precision precision, const char *about)
{
    eng_layer plain = without_panels(l);
    float *with = run_prefill(c, l, p, batch, precision, about);
    float *per_call = run_prefill(c, &plain, p, batch, precision, about);
    size_t n = (size_t)(p->B * p->L * c->E);
    int64_t d = first_difference(with, per_call, n);
    CHECKF(d < 0, "[%s, %s] out[%lld]: %a on the panels, %a packing per call", c->name, about,
           (long long)d, d < 0 ? 0.0 : (double)with[d], d < 0 ? 0.0 : (double)per_call[d]);
    free(with);
    free(per_call);
}

static const eng_dtype dtypes[3] = {ENG_DTYPE_F32, ENG_DTYPE_BF16, ENG_DTYPE_F16};
static const char *dtype_names[3] = {"F32", "BF16", "F16"};

static void test_prefill_on_panels_gives_the_bits_of_packing_per_call(void)
{
    /* 2 x 67 rows: chunks that span both batches; 1 x 150 rows: more than the few-row
     * products take, in one pass. */
    const int64_t shapes[2][2] = {{2, 67}, {1, 150}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int d = 0; d < 3; d++) {
            const layer_case *c = &cases[i];
            eng_layer *l = make_layer(c, dtypes[d]);
            if (!l)
                continue;
            check_panels(c, l, dtype_names[d]);
            for (int s = 0; s < 2; s++) {
                prefill p = prefill_new(c, shapes[s][0], shapes[s][1]);
                char about[64];
                snprintf(about, sizeof about, "%s, %lld x %lld rows", dtype_names[d],
                         (long long)p.B, (long long)p.L);
                check_same_bits(c, l, &p, false, ENG_PRECISION_FLOAT32, about);
                check_same_bits(c, l, &p, false, ENG_PRECISION_BFLOAT16, about);
                if (p.B == 2)
                    check_same_bits(c, l, &p, true, ENG_PRECISION_FLOAT32, about);
                prefill_free(&p);
            }
            eng_layer_free(l);
        }
}

/* A layer packed under one kernel set and called under another: the call ignores the panels
 * and computes what that set computes without them. The other set is generic (or, under
 * generic, openblas, which has no micro-kernels: the panels would crash it). */
static void test_another_kernel_set_packs_as_it_goes(void)
{
    const char *other =
        strcmp(eng__kernels_current()->name, "generic") == 0 ? "openblas" : "generic";
    eng_options opts = {.kernels = strcmp(other, "generic") == 0 ? ENG_KERNELS_GENERIC
                                                                 : ENG_KERNELS_OPENBLAS};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int d = 0; d < 3; d += 1) {
            const layer_case *c = &cases[i];
            eng_layer *l = make_layer(c, dtypes[d]);
            if (!l)
                continue;
            CHECK(eng_init(&opts, NULL) == ENG_OK);
            prefill p = prefill_new(c, 2, 67);
            char about[64];
            snprintf(about, sizeof about, "%s, packed for %s, run on %s", dtype_names[d],
                     l->panels_kernels ? ((const eng__kernels *)l->panels_kernels)->name : "none",
                     other);
            check_same_bits(c, l, &p, false, ENG_PRECISION_FLOAT32, about);
            prefill_free(&p);
            char why[320];
            CHECK(test_engine_init(why, sizeof why) == TEST_ENGINE_READY);
            eng_layer_free(l);
        }
}

int main(void)
{
    int status;
    if (test_engine_start(&pool, &status))
        return status;
    RUN_WITHIN(test_prefill_on_panels_gives_the_bits_of_packing_per_call, 300);
    RUN_WITHIN(test_another_kernel_set_packs_as_it_goes, 300);
    eng_pool_free(pool);
    return check_report();
}
