/*
 * test_sdpa_bf16.c - attention with "precision": bfloat16 (engine.h eng_precision).
 *
 * With bf16 products, Q, K, V and the probabilities P are rounded to bf16 (nearest even) and the
 * products accumulate in fp32. So the output is held to two float64 references:
 *   - the same attention of the bf16-rounded inputs: within 2e-3 x max|V| (only P's rounding
 *     and fp32 sums separate them);
 *   - the attention of the original fp32 inputs: within 1.5e-2 x max|V|.
 * The log-sum-exp and the weights come from fp32 scores of the rounded inputs, so they match
 * the rounded reference closely. The openblas set computes a bf16 request in float32, which
 * must then match the fp32 reference as any call does.
 *
 * The Makefile runs this binary once per kernel set (avx512 rounds the operands for its fp32
 * kernel on CPUs where VDPBF16PS is slow, avx2 and generic always do), and once more with
 * ATTND_BF16=native, which runs the VDPBF16PS path where the CPU has AVX512-BF16.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/kernels/kernels.h"
#include "tests/support/check.h"
#include "tests/support/ref.h"
#include "tests/support/util.h"

/* One case: shapes and the options that matter to the products. */
typedef struct {
    const char *name;
    int64_t B, H, Hkv, L, S, D, Dv;
    bool causal;
    float q_scale; /* > 1: peaked distributions */
    bool masks;    /* a boolean attention mask, key padding, a window, ALiBi and softcap */
    bool weights;  /* per-head weights and the log-sum-exp */
    bool empty;    /* kv_lengths 0 for batch 0: every row of it sees nothing */
} bf16_case;

static float bf16_round(float x)
{
    return eng_bf16_to_f32(eng_f32_to_bf16(x));
}

static float *random_tensor(size_t n, uint64_t *rng, float amp, bool round)
{
    float *x = xcalloc(n, sizeof *x);
    for (size_t i = 0; i < n; i++) {
        x[i] = rng_sym(rng, amp);
        if (round)
            x[i] = bf16_round(x[i]);
    }
    return x;
}

static void round_all(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = bf16_round(x[i]);
}

/* The tensors of one case: the fp32 originals and their bf16-rounded copies. */
typedef struct {
    float *q, *k, *v, *qr, *kr, *vr, *out, *lse, *weights;
    uint8_t *mask, *padding;
    int64_t lengths[2];
    double vmax;
} case_data;

static void case_data_init(const bf16_case *c, case_data *d, uint64_t seed)
{
    uint64_t rng = seed;
    size_t nq = (size_t)(c->B * c->H * c->L * c->D), nk = (size_t)(c->B * c->Hkv * c->S * c->D),
           nv = (size_t)(c->B * c->Hkv * c->S * c->Dv), no = (size_t)(c->B * c->H * c->L * c->Dv);
    memset(d, 0, sizeof *d);
    d->q = random_tensor(nq, &rng, c->q_scale, false);
    d->k = random_tensor(nk, &rng, 1.0f, false);
    d->v = random_tensor(nv, &rng, 1.0f, false);
    d->qr = xcalloc(nq, sizeof(float));
    d->kr = xcalloc(nk, sizeof(float));
    d->vr = xcalloc(nv, sizeof(float));
    memcpy(d->qr, d->q, nq * sizeof(float));
    memcpy(d->kr, d->k, nk * sizeof(float));
    memcpy(d->vr, d->v, nv * sizeof(float));
    round_all(d->qr, nq);
    round_all(d->kr, nk);
    round_all(d->vr, nv);
    for (size_t i = 0; i < nv; i++)
        d->vmax = fabs((double)d->v[i]) > d->vmax ? fabs((double)d->v[i]) : d->vmax;
    d->out = xcalloc(no, sizeof(float));
    d->lse = xcalloc((size_t)(c->B * c->H * c->L), sizeof(float));
    if (c->weights)
        d->weights = xcalloc((size_t)(c->B * c->H * c->L * c->S), sizeof(float));
    if (c->masks) {
        size_t nm = (size_t)(c->B * c->H * c->L * c->S);
        d->mask = xcalloc(nm, 1);
        for (size_t i = 0; i < nm; i++)
            d->mask[i] = rng_unit(&rng) < 0.9;
        d->padding = xcalloc((size_t)(c->B * c->S), 1);
        for (int64_t i = 0; i < c->B * c->S; i++)
            d->padding[i] = rng_unit(&rng) < 0.1;
    }
    d->lengths[0] = c->empty ? 0 : c->S;
    d->lengths[1] = c->S;
}

static void case_data_free(case_data *d)
{
    free(d->q);
    free(d->k);
    free(d->v);
    free(d->qr);
    free(d->kr);
    free(d->vr);
    free(d->out);
    free(d->lse);
    free(d->weights);
    free(d->mask);
    free(d->padding);
}

/* The arguments of case c over q, k, v. */
static eng_sdpa_args case_args(const bf16_case *c, case_data *d, float *q, float *k, float *v)
{
    eng_sdpa_args a = {0};
    a.q = eng_view_contiguous(q, c->B, c->H, c->L, c->D);
    a.k = eng_view_contiguous(k, c->B, c->Hkv, c->S, c->D);
    a.v = eng_view_contiguous(v, c->B, c->Hkv, c->S, c->Dv);
    a.out = eng_view_contiguous(d->out, c->B, c->H, c->L, c->Dv);
    a.causal = c->causal;
    a.precision = ENG_PRECISION_BFLOAT16;
    a.lse = d->lse;
    if (c->weights) {
        a.weights_mode = ENG_WEIGHTS_PER_HEAD;
        a.weights = d->weights;
    }
    if (c->masks) {
        a.attn_mask = (eng_mask){ENG_MASK_BOOL,
                                 d->mask,
                                 {c->B, c->H, c->L, c->S},
                                 {c->H * c->L * c->S, c->L * c->S, c->S, 1}};
        a.key_padding = d->padding;
        a.key_padding_stride = c->S;
        a.window_left_set = true;
        a.window_left = c->S / 2;
        a.alibi = true;
        a.softcap = 20.0f;
    }
    if (c->empty && c->B == 2)
        a.kv_lengths = d->lengths;
    return a;
}

/* Largest |engine - reference| over the output. */
static double max_out_error(const bf16_case *c, const case_data *d, const ref_result *r)
{
    double worst = 0.0;
    for (int64_t i = 0; i < c->B * c->H * c->L * c->Dv; i++) {
        double e = fabs((double)d->out[i] - r->out[i]);
        worst = e > worst ? e : worst;
    }
    return worst;
}

/* Runs case c in bf16 and checks it against both references (or, without bf16 products, the
 * float32 reference at float32's tolerance). */
static void check_case(const bf16_case *c, uint64_t seed)
{
    eng_error err;
    eng_pool *pool = eng_pool_new(2, &err);
    CHECK(pool != NULL);
    if (!pool)
        return;
    case_data d;
    case_data_init(c, &d, seed);
    eng_sdpa_args a = case_args(c, &d, d.q, d.k, d.v);
    bool bf16 = eng_sdpa_precision(&a) == ENG_PRECISION_BFLOAT16;
    CHECK_EQ_INT(eng_sdpa(pool, &a, NULL, &err), ENG_OK);

    ref_result exact = {0}, rounded = {0};
    CHECK(ref_sdpa(&a, &exact));
    eng_sdpa_args ar = case_args(c, &d, d.qr, d.kr, d.vr);
    CHECK(ref_sdpa(&ar, &rounded));
    double err_exact = max_out_error(c, &d, &exact), err_rounded = max_out_error(c, &d, &rounded);
    if (bf16) {
        CHECKF(err_rounded <= 2e-3 * d.vmax,
               "[%s] bf16 output vs rounded-input reference: error %.3g > 2e-3 x max|V| (%.3g)",
               c->name, err_rounded, d.vmax);
        CHECKF(err_exact <= 1.5e-2 * d.vmax,
               "[%s] bf16 output vs fp32-input reference: error %.3g > 1.5e-2 x max|V| (%.3g)",
               c->name, err_exact, d.vmax);
        printf("  %s: max error %.2e x max|V| (rounded inputs), %.2e (fp32 inputs)\n", c->name,
               err_rounded / d.vmax, err_exact / d.vmax);
    } else {
        CHECKF(err_exact <= 1e-5 * d.vmax, "[%s] float32 fallback: error %.3g > 1e-5 x max|V|",
               c->name, err_exact);
    }
    const ref_result *want = bf16 ? &rounded : &exact;
    for (int64_t i = 0; i < c->B * c->H * c->L; i++) {
        double e = want->lse[i], g = d.lse[i];
        if (isinf(e)) {
            CHECKF(isinf(g) && g < 0, "[%s] lse row %lld: %g, want -inf", c->name, (long long)i, g);
            continue;
        }
        CHECKF(fabs(g - e) <= 1e-4 * (1.0 + fabs(e)), "[%s] lse row %lld: %.7g, want %.7g", c->name,
               (long long)i, g, e);
    }
    if (c->weights) {
        double worst = 0.0;
        for (int64_t i = 0; i < c->B * c->H * c->L * c->S; i++) {
            double e = fabs((double)d.weights[i] - want->weights[i]);
            worst = e > worst ? e : worst;
        }
        CHECKF(worst <= 1e-4, "[%s] weights: error %.3g > 1e-4", c->name, worst);
    }
    if (c->empty)
        for (int64_t i = 0; i < c->H * c->L * c->Dv; i++)
            CHECKF(d.out[i] == 0.0f, "[%s] a row that sees no key: output %g, not 0", c->name,
                   (double)d.out[i]);
    ref_result_free(&exact);
    ref_result_free(&rounded);
    case_data_free(&d);
    eng_pool_free(pool);
}

static const bf16_case cases[] = {
    {"D=64 L=S=256", 1, 2, 2, 256, 256, 64, 64, false, 1.0f, false, false, false},
    {"D=80 causal ragged", 2, 2, 1, 301, 301, 80, 80, true, 1.0f, false, false, false},
    {"D=128 GQA causal", 1, 4, 2, 512, 512, 128, 128, true, 1.0f, false, false, false},
    {"D=128 peaked (q x 4)", 1, 2, 2, 1024, 1024, 128, 128, false, 4.0f, false, false, false},
    {"D=64 masks, window, ALiBi, softcap, weights, lse", 2, 2, 2, 100, 333, 64, 64, false, 1.0f,
     true, true, false},
    {"D=33 Dv=17 odd depths", 1, 2, 1, 77, 131, 33, 17, true, 1.0f, false, true, false},
    {"decode L=1 S=2048 D=128", 2, 4, 4, 1, 2048, 128, 128, false, 1.0f, false, false, false},
    /* Grouped-query decoding: one task for a kv group's heads, their Q rows side by side. */
    {"GQA decode L=1 g=4 masks, weights", 1, 8, 2, 1, 1000, 64, 64, false, 1.0f, true, true, false},
    {"GQA decode L=5 g=8 weights", 2, 8, 1, 5, 4097, 128, 128, false, 1.0f, false, true, false},
    {"GQA decode L=2 g=2 masks (split keys)", 1, 2, 1, 2, 4097, 64, 64, false, 1.0f, true, false,
     false},
    {"rows that see no key", 2, 2, 2, 64, 96, 64, 64, true, 1.0f, false, false, true},
    {"D=64 causal L=S=8192", 1, 1, 1, 8192, 8192, 64, 64, true, 1.0f, false, false, false},
};

/* Says which bf16 path this run checks. */
static void print_bf16_path(void)
{
    eng_engine_info info;
    eng_engine_info_get(&info);
    const char *forced = getenv("ATTND_BF16");
    if (forced && strcmp(forced, "native") == 0 && strcmp(info.bf16, "avx512bf16") != 0)
        printf("skip: native bf16 products: this CPU has no AVX512-BF16 (it has: %s); checking "
               "the %s path instead\n",
               info.features, info.bf16);
    if (strcmp(info.bf16, "float32") == 0)
        printf("skip: bf16 products with kernel set %s: bf16 requests run in float32, checked "
               "as such\n",
               info.kernels);
    else
        printf("bf16 products: %s\n", info.bf16);
}

static void test_bf16_attention_against_both_references(void)
{
    print_bf16_path();
    bool quick = getenv("ATTND_TEST_QUICK") != NULL;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (quick && cases[i].L * cases[i].S > 1 << 21)
            continue; /* sanitizer runs: the largest case costs minutes there */
        check_case(&cases[i], 100 + i);
    }
}

/* The bf16 micro-kernel against a double product on ragged sizes and odd strides. */
static void test_bf16_products_on_ragged_sizes(void)
{
    eng_engine_info info;
    eng_engine_info_get(&info);
    if (!strstr(info.features, "avx512bf16")) {
        printf("skip: VDPBF16PS micro-kernel: this CPU has no AVX512-BF16 (it has: %s)\n",
               info.features);
        return;
    }
    /* The micro-kernel whether or not the dispatcher prefers it on this CPU. */
    const eng__kernels kernels = {.name = "avx512",
                                  .mr = ENG__AVX512_MR,
                                  .nr = ENG__AVX512_NR,
                                  .tile_bf16 = eng__tile_bf16_avx512,
                                  .to_bf16 = eng__to_bf16_avx512};
    const eng__kernels *ks = &kernels;
    static const int64_t sizes[] = {1, 7, 15, 16, 17, 63, 65, 257};
    uint64_t rng = 7;
    for (size_t im = 0; im < 8; im++)
        for (size_t in = 0; in < 8; in++)
            for (size_t ik = 0; ik < 8; ik++) {
                int64_t m = sizes[im], n = sizes[in], k = sizes[ik];
                int64_t kp = (k + 1) / 2, lda = 2 * kp + 2, ldc = n + 3;
                int64_t rows = (m + ks->mr - 1) / ks->mr * ks->mr;
                uint16_t *a = xcalloc((size_t)(rows * lda), sizeof *a);
                float *bf = xcalloc((size_t)(k * n), sizeof *bf);
                uint16_t *bp =
                    aligned_alloc(64, (eng__bf16_panels_elems(ks->nr, n, k) * 2 + 63) / 64 * 64);
                float *c = xcalloc((size_t)(m * ldc), sizeof *c);
                for (int64_t i = 0; i < m; i++)
                    for (int64_t p = 0; p < k; p++)
                        a[i * lda + p] = eng_f32_to_bf16(rng_sym(&rng, 1.0));
                for (int64_t i = 0; i < k * n; i++)
                    bf[i] = rng_sym(&rng, 1.0);
                eng__bf16_pack_panels(ks->nr, bf, n, false, k, n, bp);
                eng__gemm_bf16 g = {
                    m, n, kp, 0.5f, 0.0f, a, lda, bp, eng__bf16_panel_stride(ks->nr, k), c, ldc};
                eng__sgemm_bf16(ks, &g);
                double worst = 0.0;
                for (int64_t i = 0; i < m; i++)
                    for (int64_t j = 0; j < n; j++) {
                        double want = 0.0;
                        for (int64_t p = 0; p < k; p++)
                            want += (double)eng_bf16_to_f32(a[i * lda + p]) *
                                    (double)bf16_round(bf[p * n + j]);
                        double e = fabs((double)c[i * ldc + j] - 0.5 * want);
                        worst = e > worst ? e : worst;
                    }
                CHECKF(worst <= 1e-5 * (double)k, "bf16 product m=%lld n=%lld k=%lld: error %.3g",
                       (long long)m, (long long)n, (long long)k, worst);
                free(a);
                free(bf);
                free(bp);
                free(c);
            }
}

/* Each instruction set's rounding loop against eng_f32_to_bf16, bit for bit, on ties, signs,
 * infinities, NaN, denormals, the largest floats and random values, at ragged lengths. */
static void test_vector_rounding_matches_scalar(void)
{
    static const uint32_t edges[] = {0x3F808000u, 0x3F818000u, 0x3F807FFFu, 0x3F808001u,
                                     0x7F7FFFFFu, 0xFF7FFFFFu, 0x7F800000u, 0xFF800000u,
                                     0x7FC00001u, 0xFF812345u, 0x00000001u, 0x807FFFFFu,
                                     0x00000000u, 0x80000000u, 0x3F800000u, 0xC0490FDBu};
    enum { N = 67 };
    struct {
        const char *name;
        void (*round)(float *, int64_t);
        bool ok;
    } variants[] = {{"scalar", eng__bf16_round_floats, true},
                    {"avx2", eng__bf16_round_floats_avx2, eng_kernels_supported("avx2")},
                    {"avx512", eng__bf16_round_floats_avx512, eng_kernels_supported("avx512")}};
    uint64_t rng = 11;
    float x[N], want[N];
    for (int i = 0; i < N; i++) {
        uint32_t u = i < 16 ? edges[i] : (uint32_t)rng_next(&rng);
        memcpy(&x[i], &u, sizeof u);
        want[i] = eng_bf16_to_f32(eng_f32_to_bf16(x[i]));
    }
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        if (!variants[v].ok) {
            printf("skip: bf16 rounding %s: this CPU does not support it\n", variants[v].name);
            continue;
        }
        for (int64_t len = 1; len <= N; len += 11) {
            float got[N];
            memcpy(got, x, sizeof got);
            variants[v].round(got, len);
            for (int64_t i = 0; i < len; i++)
                CHECKF(memcmp(&got[i], &want[i], sizeof got[i]) == 0,
                       "%s rounds %a to %a, eng_f32_to_bf16 to %a (length %lld)", variants[v].name,
                       (double)x[i], (double)got[i], (double)want[i], (long long)len);
        }
    }
}

static void test_unknown_precision_is_refused(void)
{
    float x[4] = {0};
    eng_sdpa_args a = {0};
    a.q = eng_view_contiguous(x, 1, 1, 1, 4);
    a.k = eng_view_contiguous(x, 1, 1, 1, 4);
    a.v = eng_view_contiguous(x, 1, 1, 1, 4);
    float out[4];
    a.out = eng_view_contiguous(out, 1, 1, 1, 4);
    a.precision = (eng_precision)7;
    eng_error err;
    eng_pool *pool = eng_pool_new(1, &err);
    CHECK_EQ_INT(eng_sdpa(pool, &a, NULL, &err), ENG_EINVAL);
    CHECK(strcmp(err.field, "precision") == 0);
    eng_pool_free(pool);
}

static void test_additive_scoring_runs_in_float32(void)
{
    float w[4] = {1, 0, 0, 1}, v[2] = {1, 1}, x[4] = {0};
    eng_sdpa_args a = {0};
    a.q = eng_view_contiguous(x, 1, 1, 2, 2);
    a.k = eng_view_contiguous(x, 1, 1, 2, 2);
    a.v = eng_view_contiguous(x, 1, 1, 2, 2);
    a.additive_w_q = a.additive_w_k = w;
    a.additive_v = v;
    a.additive_dim = 2;
    a.precision = ENG_PRECISION_BFLOAT16;
    CHECK_EQ_INT(eng_sdpa_precision(&a), ENG_PRECISION_FLOAT32);
}

int main(void)
{
    if (test_kernels_skip())
        return 0;
    RUN_WITHIN(test_bf16_attention_against_both_references, 300);
    RUN(test_bf16_products_on_ragged_sizes);
    RUN(test_vector_rounding_matches_scalar);
    RUN(test_unknown_precision_is_refused);
    RUN(test_additive_scoring_runs_in_float32);
    return check_report();
}
