/*
 * test_amx.c - the specification of the AMX bf16 path (engine/kernels/amx.h): the packing of B into
 * tile rows, the 32 x 32 blocks over 2 x 2 tiles with tails in every dimension, and TDPBF16PS
 * as Intel's SDM describes it (two fp32 partial sums per element over a tile's 16 pairs, FMA
 * rounded to nearest even, denormal inputs read as zero, denormal results flushed to zero).
 *
 * The emulated tiles run on every CPU and must give the bits of a plain scalar model of those
 * semantics on the zero-padded operands, and lie within the float64 reference's bound on
 * bf16-rounded inputs. The hardware tiles run only where the CPU and the OS grant them, and
 * must then give the emulation's bits; elsewhere a skip line names what is missing.
 */
#include "engine/kernels/amx.h"
#include "tests/support/check.h"
#include "tests/support/rng.h"
#include "tests/support/util.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- Helpers ------------------------------------------------------------------------------ */

typedef struct {
    int64_t m, n, k;
    float alpha, beta;
    bool b_trans;
} shape;

static float bf16_round(float x)
{
    return eng_bf16_to_f32(eng_f32_to_bf16(x));
}

/* B's element (depth p, column j) of a [k x n] matrix, or of [n x k] rows when b_trans. */
static float b_at(const shape *s, const float *b, int64_t p, int64_t j)
{
    return s->b_trans ? b[j * s->k + p] : b[p * s->n + j];
}

/* c = alpha A B + beta c on the tiles of `mode`. */
static void amx_product(eng__amx_mode mode, const shape *s, const float *a, const float *b,
                        float *c)
{
    uint16_t *bp = xcalloc(eng__amx_panels_elems(s->n, s->k) + 1, sizeof *bp);
    uint16_t *scratch = xcalloc(eng__amx_a_elems(s->k) + 1, sizeof *scratch);
    eng__amx_pack_b(b, ENG_DTYPE_F32, s->b_trans ? s->k : s->n, s->b_trans, s->k, s->n, bp);
    eng__amx_gemm g = {.m = s->m,
                       .n = s->n,
                       .k = s->k,
                       .alpha = s->alpha,
                       .beta = s->beta,
                       .a = a,
                       .lda = s->k,
                       .b = bp,
                       .c = c,
                       .ldc = s->n};
    eng__amx_sgemm(mode, &g, scratch);
    free(bp);
    free(scratch);
}

/* Denormals as zeros of their sign. */
static float flush(float x)
{
    return fpclassify(x) == FP_SUBNORMAL ? copysignf(0.0f, x) : x;
}

/* The scalar model: per element, per 32-depth step, even and odd partial sums from zero, each
 * term an FMA with flushing, then the step's sum added to the element; depths past k are zero. */
static void model_product(const shape *s, const float *a, const float *b, float *c)
{
    const int64_t kp = (s->k + 31) / 32 * 32;
    for (int64_t i = 0; i < s->m; i++) {
        for (int64_t j = 0; j < s->n; j++) {
            float acc = 0.0f;
            for (int64_t p0 = 0; p0 < kp; p0 += 32) {
                float part[2] = {0.0f, 0.0f};
                for (int64_t p = p0; p < p0 + 32; p++) {
                    float x = p < s->k ? flush(bf16_round(a[i * s->k + p])) : 0.0f;
                    float y = p < s->k ? flush(bf16_round(b_at(s, b, p, j))) : 0.0f;
                    part[p % 2] = flush(fmaf(x, y, part[p % 2]));
                }
                acc = flush(acc + flush(part[0] + part[1]));
            }
            float *out = &c[i * s->n + j];
            *out = s->beta == 0.0f ? s->alpha * acc : s->alpha * acc + s->beta * *out;
        }
    }
}

static bool same_bits(float x, float y)
{
    return (isnan(x) && isnan(y)) || memcmp(&x, &y, sizeof x) == 0;
}

static float *random_matrix(uint64_t *rng, int64_t count)
{
    float *x = xcalloc((size_t)count + 1, sizeof *x);
    for (int64_t i = 0; i < count; i++)
        x[i] = rng_sym(rng, 1.0);
    return x;
}

static const shape shapes[] = {
    {1, 1, 1, 1.0f, 0.0f, false},    {32, 32, 32, 1.0f, 0.0f, true},
    {33, 31, 33, 1.0f, 0.0f, true},  {5, 70, 100, 0.5f, 2.0f, false},
    {64, 64, 64, 1.0f, 1.0f, true},  {17, 48, 7, -1.0f, 0.0f, false},
    {40, 96, 200, 1.0f, 0.0f, true}, {31, 1, 65, 2.0f, -0.5f, false},
};
#define N_SHAPES ((int)(sizeof shapes / sizeof shapes[0]))

/* ---- Products ----------------------------------------------------------------------------- */

static void test_emulated_tiles_give_the_scalar_models_bits(void)
{
    uint64_t rng = 32;
    for (int t = 0; t < N_SHAPES; t++) {
        const shape *s = &shapes[t];
        float *a = random_matrix(&rng, s->m * s->k), *b = random_matrix(&rng, s->k * s->n);
        float *c = random_matrix(&rng, s->m * s->n);
        float *want = xcalloc((size_t)(s->m * s->n), sizeof *want);
        memcpy(want, c, (size_t)(s->m * s->n) * sizeof *c);
        amx_product(ENG__AMX_EMULATED, s, a, b, c);
        model_product(s, a, b, want);
        int64_t differ = 0;
        for (int64_t i = 0; i < s->m * s->n; i++)
            differ += !same_bits(c[i], want[i]);
        CHECKF(differ == 0, "%lld x %lld x %lld: %lld elements differ from the model",
               (long long)s->m, (long long)s->n, (long long)s->k, (long long)differ);
        free(a), free(b), free(c), free(want);
    }
}

/* |C - float64 reference| <= (k + 2) eps sum_p |a_p b_p| + eps |ref|, on bf16-rounded inputs
 * whose products are exact in fp32: only the fp32 sums round. */
static void test_emulated_tiles_are_within_the_float64_reference(void)
{
    uint64_t rng = 64;
    for (int t = 0; t < N_SHAPES; t++) {
        const shape *s = &shapes[t];
        float *a = random_matrix(&rng, s->m * s->k), *b = random_matrix(&rng, s->k * s->n);
        float *c = xcalloc((size_t)(s->m * s->n), sizeof *c);
        for (int64_t i = 0; i < s->m * s->k; i++)
            a[i] = bf16_round(a[i]);
        for (int64_t i = 0; i < s->k * s->n; i++)
            b[i] = bf16_round(b[i]);
        shape plain = *s;
        plain.alpha = 1.0f;
        plain.beta = 0.0f;
        amx_product(ENG__AMX_EMULATED, &plain, a, b, c);
        double worst = 0.0;
        for (int64_t i = 0; i < s->m; i++) {
            for (int64_t j = 0; j < s->n; j++) {
                double ref = 0.0, mag = 0.0;
                for (int64_t p = 0; p < s->k; p++) {
                    ref += (double)a[i * s->k + p] * b_at(s, b, p, j);
                    mag += fabs((double)a[i * s->k + p] * b_at(s, b, p, j));
                }
                double tol = (double)(s->k + 2) * FLT_EPSILON * mag + FLT_EPSILON * fabs(ref);
                double err = fabs(c[i * s->n + j] - ref);
                worst = err / (tol + 1e-300) > worst ? err / (tol + 1e-300) : worst;
            }
        }
        CHECKF(worst <= 1.0, "%lld x %lld x %lld: error %.3g of the bound", (long long)s->m,
               (long long)s->n, (long long)s->k, worst);
        free(a), free(b), free(c);
    }
}

/* ---- Special values ----------------------------------------------------------------------- */

/* A is rounded to bf16 as eng_f32_to_bf16 rounds, whatever vector loop does it: ties to even
 * both ways, overflow to infinity, NaN kept, denormals kept (then read as zero by the tiles). */
static void test_a_is_rounded_to_nearest_even_like_the_scalar_conversion(void)
{
    const float finite[] = {1.0f + 0x1p-8f, 1.0f + 0x3p-8f, -1.0f - 0x1p-8f, 0x1.ff8p0f,  0x1p-140f,
                            -0x1p-149f,     0.0f,           -0.0f,           3.0f,        -2.5f,
                            0x1.010p-126f,  0x1.fe8p0f,     -0x1.018p0f,     0x1.7f8p100f};
    const float other[] = {0x1.fffffep127f, -0x1.fffffep127f, INFINITY, -INFINITY, NAN};
    shape s = {3, 9, 40, 1.0f, 0.0f, false};
    uint64_t rng = 256;
    float *a = random_matrix(&rng, s.m * s.k), *b = random_matrix(&rng, s.k * s.n);
    /* Rows 1 and 2 take the finite cases at varied lane positions, row 0 the others (one NaN
     * makes its whole row NaN). */
    for (size_t i = 0; i < sizeof finite / sizeof finite[0]; i++)
        a[40 + (int64_t)i * 5] = finite[i];
    for (size_t i = 0; i < sizeof other / sizeof other[0]; i++)
        a[(int64_t)i * 7] = other[i];
    float *c = xcalloc((size_t)(s.m * s.n), sizeof *c), *want = xcalloc((size_t)(s.m * s.n), 4);
    amx_product(ENG__AMX_EMULATED, &s, a, b, c);
    model_product(&s, a, b, want);
    for (int64_t i = 0; i < s.m * s.n; i++)
        CHECKF(same_bits(c[i], want[i]), "element %lld: %a, model %a", (long long)i, c[i], want[i]);
    free(a), free(b), free(c), free(want);
}

/* One element: the dot product of a and b (k long) on the emulated tiles. */
static float emulated_dot(const float *a, const float *b, int64_t k)
{
    shape s = {1, 1, k, 1.0f, 0.0f, true};
    float c = NAN;
    amx_product(ENG__AMX_EMULATED, &s, a, b, &c);
    return c;
}

static void test_denormal_inputs_count_as_zero(void)
{
    const float big = 0x1p100f;
    float tiny = eng_bf16_to_f32(0x0001);   /* the smallest bf16 denormal */
    float normal = eng_bf16_to_f32(0x0080); /* the smallest normal */
    CHECK(fpclassify(tiny) == FP_SUBNORMAL);
    CHECK(emulated_dot(&tiny, &big, 1) == 0.0f);
    CHECK(emulated_dot(&big, &tiny, 1) == 0.0f);
    CHECK(emulated_dot(&normal, &big, 1) == normal * big);
}

static void test_denormal_results_flush_to_signed_zero(void)
{
    float x = 0x1p-70f, y = 0x1p-70f, neg = -0x1p-70f;
    float pos = emulated_dot(&x, &y, 1), minus = emulated_dot(&neg, &y, 1);
    CHECK(pos == 0.0f && !signbit(pos));
    CHECK(minus == 0.0f);
    /* The partial sum flushed to -0 meets the +0 of the odd depth's sum: +0 + -0 is +0. */
    CHECK(!signbit(minus));
    /* Two normal terms of one partial sum (even depths 0 and 2) whose total is denormal:
     * flushed. */
    float a[3] = {0x1p-63f, 0.0f, -0x1p-63f}, b[3] = {0x1p-63f, 0.0f, 0x1.fcp-64f};
    CHECK(emulated_dot(a, b, 3) == 0.0f);
    /* The same terms at depths 0 and 1 fall into the even and the odd sum: the odd one alone
     * is denormal and flushes, so the even one's 2^-126 remains. */
    CHECK(emulated_dot(a + 1, b + 1, 2) == 0.0f);
    float c[2] = {0x1p-63f, -0x1p-63f}, d[2] = {0x1p-63f, 0x1.fcp-64f};
    CHECK(emulated_dot(c, d, 2) == 0x1p-126f);
}

static void test_nan_and_infinity_propagate(void)
{
    float a[3] = {1.0f, NAN, 2.0f}, b[3] = {1.0f, 1.0f, 1.0f};
    CHECK(isnan(emulated_dot(a, b, 3)));
    float inf[2] = {INFINITY, 1.0f}, ones[2] = {1.0f, 1.0f};
    CHECK(emulated_dot(inf, ones, 2) == INFINITY);
    float zero[2] = {0.0f, 0.0f};
    CHECK(isnan(emulated_dot(inf, zero, 2)));
    float big[2] = {0x1p127f, 0x1p127f}, twos[2] = {2.0f, 2.0f};
    CHECK(emulated_dot(big, twos, 2) == INFINITY); /* fp32 overflow, not a wrap */
}

static void test_zero_sizes(void)
{
    float a[4] = {1, 2, 3, 4}, b[4] = {1, 2, 3, 4}, c[4] = {NAN, 7.0f, 7.0f, 7.0f};
    shape none = {0, 2, 2, 1.0f, 0.0f, false};
    amx_product(ENG__AMX_EMULATED, &none, a, b, c);
    CHECK(isnan(c[0]) && c[1] == 7.0f); /* no rows: C untouched */
    none = (shape){2, 0, 2, 1.0f, 0.0f, false};
    amx_product(ENG__AMX_EMULATED, &none, a, b, c);
    CHECK(isnan(c[0]) && c[1] == 7.0f);
    /* No depth: the product is 0, so beta == 0 writes zeros over NaN and beta scales C. */
    shape depthless = {2, 2, 0, 1.0f, 0.0f, false};
    amx_product(ENG__AMX_EMULATED, &depthless, a, b, c);
    CHECK(c[0] == 0.0f && c[3] == 0.0f);
    c[1] = 3.0f;
    depthless.beta = 2.0f;
    amx_product(ENG__AMX_EMULATED, &depthless, a, b, c);
    CHECK(c[1] == 6.0f);
}

/* ---- The tile instruction ----------------------------------------------------------------- */

/* A random bf16 around 2^(center - 127): mostly normals within 2^+-3 of it, and signed zeros,
 * denormals and (rarely) infinities, so that products overflow, underflow and cancel. */
static uint16_t random_bf16(uint64_t *rng, int center)
{
    const uint16_t sign = (uint16_t)(rng_below(rng, 2) << 15);
    const uint64_t kind = rng_below(rng, 256);
    if (kind < 16)
        return sign; /* +-0 */
    if (kind < 32)
        return (uint16_t)(sign | rng_int(rng, 1, 0x7f)); /* a denormal */
    if (kind < 33)
        return (uint16_t)(sign | 0x7f80); /* an infinity */
    int64_t biased = center + rng_int(rng, -3, 3);
    biased = biased < 1 ? 1 : biased > 254 ? 254 : biased;
    return (uint16_t)(sign | biased << 7 | (int64_t)rng_below(rng, 128));
}

/* A bf16 as the tiles read it: a denormal is a zero of its sign. */
static float bf16_flushed(uint16_t h)
{
    return flush(eng_bf16_to_f32(h));
}

/* TDPBF16PS as the SDM defines it, on operands in memory: c[m][n] (row stride ldc) for m <
 * rows, n < cols, over `pairs` bf16 pairs of a's rows (stride lda) and of b's pair rows (32
 * bf16, a tile row of 64 bytes). */
static void model_dpbf16ps(float *c, int ldc, const uint16_t *a, int64_t lda, const uint16_t *b,
                           int rows, int cols, int pairs)
{
    for (int m = 0; m < rows; m++) {
        for (int n = 0; n < cols; n++) {
            float even = 0.0f, odd = 0.0f;
            for (int k = 0; k < pairs; k++) {
                const uint16_t *ap = a + m * lda + 2 * k, *bp = b + k * 32 + 2 * n;
                even = flush(fmaf(bf16_flushed(ap[0]), bf16_flushed(bp[0]), even));
                odd = flush(fmaf(bf16_flushed(ap[1]), bf16_flushed(bp[1]), odd));
            }
            float *out = &c[m * ldc + n];
            *out = flush(flush(*out) + flush(even + odd));
        }
    }
}

/* eng__amx_kernel_emu on configurations of partial tiles (the first of each kind full): A's two
 * tiles of rows[0] and rows[1] rows and `pairs` pairs, B's two of `pairs` pair rows and cols[0]
 * and cols[1] columns, C's four of the matching rows and columns, over `steps` steps, against
 * the model on the same memory. What the stores leave alone must stay as it was. */
static void test_emulated_tdpbf16ps_on_partial_tiles_gives_the_definitions_bits(void)
{
    /* The operands' scales (biased exponents): around 1, products near the denormal range,
     * products near overflow, and the two mixed. */
    const int centers[][2] = {{127, 127}, {64, 63}, {190, 189}, {64, 190}};
    uint64_t rng = 512;
    int64_t cases = 0, failed = 0;
    for (int ci = 0; ci < 4; ci++) {
        for (int t = 0; t < 60; t++, cases++) {
            int rows[2] = {(int)rng_int(&rng, 1, 16), (int)rng_int(&rng, 1, 16)};
            int cols[2] = {(int)rng_int(&rng, 1, 16), (int)rng_int(&rng, 1, 16)};
            int pairs = (int)rng_int(&rng, 1, 16);
            if (t == 0)
                rows[0] = rows[1] = cols[0] = cols[1] = pairs = 16;
            const int steps = (int)rng_int(&rng, 1, 3);
            const int64_t lda = 32 * steps;
            eng__amx_config cfg;
            eng__amx_config_fill(&cfg);
            for (int i = 0; i < 4; i++) { /* C: tmm0-3 */
                cfg.rows[i] = (uint8_t)rows[i / 2];
                cfg.colsb[i] = (uint16_t)(4 * cols[i % 2]);
            }
            for (int i = 0; i < 2; i++) {
                cfg.rows[4 + i] = (uint8_t)rows[i]; /* A: tmm4-5 */
                cfg.colsb[4 + i] = (uint16_t)(4 * pairs);
                cfg.rows[6 + i] = (uint8_t)pairs; /* B: tmm6-7 */
                cfg.colsb[6 + i] = (uint16_t)(4 * cols[i]);
            }
            uint16_t *a = xcalloc((size_t)(32 * lda), sizeof *a);
            uint16_t *b = xcalloc((size_t)(1024 * steps), sizeof *b);
            for (int64_t i = 0; i < 32 * lda; i++)
                a[i] = random_bf16(&rng, centers[ci][0]);
            for (int64_t i = 0; i < 1024 * steps; i++)
                b[i] = random_bf16(&rng, centers[ci][1]);
            float c[32 * 32], want[32 * 32], acc[32 * 32] = {0};
            for (int i = 0; i < 32 * 32; i++)
                c[i] = want[i] = rng_sym(&rng, 1.0);
            eng__amx_config_load_emu(&cfg);
            eng__amx_kernel_emu(steps, a, lda, b, c);
            /* C tile q = (i, j): A's tile i times B's tile j, stored at rows 16 i, columns 16 j. */
            for (int s = 0; s < steps; s++)
                for (int q = 0; q < 4; q++)
                    model_dpbf16ps(acc + q / 2 * 16 * 32 + q % 2 * 16, 32,
                                   a + q / 2 * 16 * lda + 32 * s, lda, b + 1024 * s + q % 2 * 512,
                                   rows[q / 2], cols[q % 2], pairs);
            for (int q = 0; q < 4; q++)
                for (int m = 0; m < rows[q / 2]; m++)
                    for (int n = 0; n < cols[q % 2]; n++) {
                        const int at = (q / 2 * 16 + m) * 32 + q % 2 * 16 + n;
                        want[at] = acc[at];
                    }
            failed += memcmp(c, want, sizeof c) != 0;
            free(a), free(b);
        }
    }
    CHECKF(failed == 0, "%lld of %lld cases differ from the model", (long long)failed,
           (long long)cases);
    /* Back to the configuration eng__amx_sgemm believes this thread holds. */
    eng__amx_config cfg;
    eng__amx_config_fill(&cfg);
    eng__amx_config_load_emu(&cfg);
}

/* ---- Packing ------------------------------------------------------------------------------ */

static void test_packing_places_pairs_in_tile_rows_and_pads_with_zeros(void)
{
    const int64_t k = 37, n = 35; /* a tail in depth and in columns */
    float *b = xcalloc((size_t)(k * n), sizeof *b);
    for (int64_t p = 0; p < k; p++)
        for (int64_t j = 0; j < n; j++)
            b[p * n + j] = (float)(1 + p * n + j); /* exact in bf16 up to 256 */
    size_t elems = eng__amx_panels_elems(n, k);
    CHECK_EQ_INT(elems, 2 * 64 * 32); /* two panels of depth 64 */
    uint16_t *dst = xcalloc(elems, sizeof *dst);
    eng__amx_pack_b(b, ENG_DTYPE_F32, n, false, k, n, dst);
    int64_t wrong = 0, nonzero_pad = 0;
    for (int64_t p = 0; p < 64; p++) {
        for (int64_t j = 0; j < 64; j++) {
            size_t at = (size_t)(j / 32 * 64 * 32 + p / 32 * 1024 + (j % 32) / 16 * 512 +
                                 p % 32 / 2 * 32 + j % 16 * 2 + p % 2);
            if (p < k && j < n)
                wrong += dst[at] != eng_f32_to_bf16(b[p * n + j]);
            else
                nonzero_pad += dst[at] != 0;
        }
    }
    CHECK_EQ_INT(wrong, 0);
    CHECK_EQ_INT(nonzero_pad, 0);
    /* B^T rows and bf16 bits give the same packing. */
    float *bt = xcalloc((size_t)(k * n), sizeof *bt);
    uint16_t *bits = xcalloc((size_t)(k * n), sizeof *bits);
    for (int64_t p = 0; p < k; p++)
        for (int64_t j = 0; j < n; j++) {
            bt[j * k + p] = b[p * n + j];
            bits[j * k + p] = eng_f32_to_bf16(b[p * n + j]);
        }
    uint16_t *again = xcalloc(elems, sizeof *again);
    eng__amx_pack_b(bt, ENG_DTYPE_F32, k, true, k, n, again);
    CHECK(memcmp(again, dst, elems * sizeof *dst) == 0);
    eng__amx_pack_b(bits, ENG_DTYPE_BF16, k, true, k, n, again);
    CHECK(memcmp(again, dst, elems * sizeof *dst) == 0);
    free(b), free(dst), free(bt), free(bits), free(again);
}

static void test_configuration_is_palette_one_with_full_tiles(void)
{
    eng__amx_config cfg;
    eng__amx_config_fill(&cfg);
    CHECK_EQ_INT(sizeof cfg, 64);
    CHECK_EQ_INT(cfg.palette, 1);
    for (int t = 0; t < 8; t++)
        CHECK(cfg.rows[t] == 16 && cfg.colsb[t] == 64);
    for (int t = 8; t < 16; t++)
        CHECK(cfg.rows[t] == 0 && cfg.colsb[t] == 0);
}

/* ---- Modes -------------------------------------------------------------------------------- */

/* The mode each bf16 path gives, for calls that start after eng_init takes it. */
static void test_mode_follows_the_bf16_path_and_the_cpu(void)
{
    eng_options before;
    eng_options_get(&before);
    for (int p = 0; p < ENG_BF16_PATH_COUNT; p++) {
        eng_options opts = {before.kernels, (eng_bf16_path)p};
        CHECK_EQ_INT(eng_init(&opts, NULL), ENG_OK);
        eng__amx_mode mode = eng__amx_active();
        if (p == ENG_BF16_AMX_EMULATED)
            CHECK_EQ_INT(mode, ENG__AMX_EMULATED);
        else if (p == ENG_BF16_AMX)
            CHECK_EQ_INT(mode, eng__amx_hw_available() ? ENG__AMX_HW : ENG__AMX_OFF);
        else /* the hardware tiles only when asked for */
            CHECK_EQ_INT(mode, ENG__AMX_OFF);
        /* Anything but the hardware says why. */
        CHECKF((mode == ENG__AMX_HW) == (eng__amx_reason()[0] == '\0'), "path %d: reason '%s'", p,
               eng__amx_reason());
    }
    CHECK_EQ_INT(eng_init(&before, NULL), ENG_OK);
}

static void test_engine_info_names_the_tiles_and_why_not(void)
{
    eng_engine_info info;
    eng_engine_info_get(&info);
    const char *want = eng__amx_active() == ENG__AMX_HW         ? "amx"
                       : eng__amx_active() == ENG__AMX_EMULATED ? "amx-emulated ("
                                                                : "off (";
    CHECKF(strncmp(info.amx, want, strlen(want)) == 0, "info.amx '%s'", info.amx);
    CHECK(strstr(info.amx, eng__amx_reason()) != NULL);
    printf("  projections' tiles: %s\n", info.amx);
}

static void test_hardware_tiles_give_the_emulations_bits(void)
{
    if (!eng__amx_hw_available()) {
        printf("skip: AMX hardware tiles: %s\n", eng__amx_reason());
        return;
    }
    uint64_t rng = 128;
    for (int t = 0; t < N_SHAPES; t++) {
        const shape *s = &shapes[t];
        float *a = random_matrix(&rng, s->m * s->k), *b = random_matrix(&rng, s->k * s->n);
        float *hw = random_matrix(&rng, s->m * s->n);
        float *emu = xcalloc((size_t)(s->m * s->n), sizeof *emu);
        memcpy(emu, hw, (size_t)(s->m * s->n) * sizeof *hw);
        amx_product(ENG__AMX_HW, s, a, b, hw);
        amx_product(ENG__AMX_EMULATED, s, a, b, emu);
        int64_t differ = 0;
        for (int64_t i = 0; i < s->m * s->n; i++)
            differ += !same_bits(hw[i], emu[i]);
        CHECKF(differ == 0,
               "%lld x %lld x %lld: %lld elements differ between hardware and "
               "emulation",
               (long long)s->m, (long long)s->n, (long long)s->k, (long long)differ);
        free(a), free(b), free(hw), free(emu);
    }
}

int main(void)
{
    if (test_kernels_skip())
        return 0;
    RUN(test_emulated_tiles_give_the_scalar_models_bits);
    RUN(test_emulated_tiles_are_within_the_float64_reference);
    RUN(test_a_is_rounded_to_nearest_even_like_the_scalar_conversion);
    RUN(test_denormal_inputs_count_as_zero);
    RUN(test_denormal_results_flush_to_signed_zero);
    RUN(test_nan_and_infinity_propagate);
    RUN(test_zero_sizes);
    RUN(test_emulated_tdpbf16ps_on_partial_tiles_gives_the_definitions_bits);
    RUN(test_packing_places_pairs_in_tile_rows_and_pads_with_zeros);
    RUN(test_configuration_is_palette_one_with_full_tiles);
    RUN(test_mode_follows_the_bf16_path_and_the_cpu);
    RUN(test_engine_info_names_the_tiles_and_why_not);
    RUN(test_hardware_tiles_give_the_emulations_bits);
    return check_report();
}
