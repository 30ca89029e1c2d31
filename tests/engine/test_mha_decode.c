/*
 * test_mha_decode.c - the specification of few-row products (engine/kernels/kernels.h, eng__gemv),
 * which eng_mha's projections take for products of few rows (a decode step, a speculative
 * verification, a short prompt), reading fp32 and 16-bit weights where they lie.
 *
 * Each variant (scalar, AVX2, AVX-512; one this CPU lacks is skipped with a line saying so):
 *
 * - with fp32 weights, is within (k + 2) 2^-24 (sum |x_i w_i| + |b|) of a float64 reference,
 *   the bound of any order of summing k products with fp32 rounding, and so within twice that
 *   of the blocked product (eng__sgemm); one element missed or read twice moves a result by
 *   about |x_i w_i|, far more;
 * - with BF16 and F16 weights gives the bits of the same call on their exact fp32 widening,
 *   and with bf16 rounding the bits of the call on weights rounded beforehand;
 * - gives a row the same bits whatever rows and features share its call.
 *
 * Then eng_mha over few rows (1, 2, 3, 7 and 16, grouped-query heads, out-feature counts that
 * are no multiple of a vector): within test_mha.c's 1e-4 x max|out| of the float64 reference;
 * a 16-bit layer bit for bit what an fp32 layer of the same values gives; and a one-token call
 * gives the bits of the set's few-row kernel, which shows the path is the one taken.
 */
#include "engine/kernels/kernels.h"
#include "tests/support/check.h"
#include "tests/support/named_layer.h"
#include "tests/support/ref_mha.h"
#include "tests/support/util.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static eng_pool *pool;

static const char *const variants[] = {"scalar", "avx2", "avx512"};
#define NVARIANTS ((int)(sizeof variants / sizeof variants[0]))
static const int row_counts[] = {1, 2, 3, 7, 16};
#define NROWS ((int)(sizeof row_counts / sizeof row_counts[0]))
/* The kernels' calls also take a batch of decode steps' rows, more than a row block of a
 * variant's and more than one pass over the weights keeps (70), row counts that end in a
 * block of two rows (5, 32), and depths past a chunk of widened weights (1100). */
static const int kernel_rows[] = {1, 2, 3, 5, 7, 16, 32, 70};
#define NKERNEL_ROWS ((int)(sizeof kernel_rows / sizeof kernel_rows[0]))
static const int64_t depths[] = {1, 7, 16, 67, 300, 1100};
#define NDEPTHS ((int)(sizeof depths / sizeof depths[0]))
static const int64_t widths[] = {1, 5, 13, 37};
#define NWIDTHS ((int)(sizeof widths / sizeof widths[0]))

enum { MAX_ROWS = 70 };

/* ---- The kernels ---------------------------------------------------------------------------- */

/* x [rows, k], fp32 weights [n, k] and their 16-bit forms, bias [n]. */
typedef struct {
    int rows;
    int64_t k, n;
    float *x, *w, *bias;
    uint16_t *bf16, *f16;
    float *w_bf16, *w_f16; /* the 16-bit weights widened */
} operands;

static operands operands_make(int rows, int64_t k, int64_t n, uint64_t seed)
{
    uint64_t rng = seed;
    operands o = {rows, k, n, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    size_t nw = (size_t)(n * k);
    o.x = xcalloc((size_t)(rows * k), sizeof(float));
    o.w = xcalloc(nw, sizeof(float));
    o.bias = xcalloc((size_t)n, sizeof(float));
    o.bf16 = xcalloc(nw, sizeof(uint16_t));
    o.f16 = xcalloc(nw, sizeof(uint16_t));
    o.w_bf16 = xcalloc(nw, sizeof(float));
    o.w_f16 = xcalloc(nw, sizeof(float));
    for (int64_t i = 0; i < rows * k; i++)
        o.x[i] = rng_sym(&rng, 1.0);
    for (size_t i = 0; i < nw; i++) {
        o.w[i] = rng_sym(&rng, 1.0 / sqrt((double)k));
        o.bf16[i] = eng_f32_to_bf16(o.w[i]);
        o.f16[i] = eng_f32_to_f16(o.w[i]);
        o.w_bf16[i] = eng_bf16_to_f32(o.bf16[i]);
        o.w_f16[i] = eng_f16_to_f32(o.f16[i]);
    }
    for (int64_t f = 0; f < n; f++)
        o.bias[f] = rng_sym(&rng, 0.5);
    return o;
}

static void operands_free(operands *o)
{
    free(o->x), free(o->w), free(o->bias), free(o->bf16), free(o->f16), free(o->w_bf16);
    free(o->w_f16);
}

/* y [rows, n] (row stride ldy) = rows r0.. of x against weight rows f0 .. f0 + n - 1. */
typedef struct {
    int r0, rows;
    int64_t f0, n;
    const void *w;
    eng_dtype dtype;
    bool round;
} call;

static void run(eng__gemv_fn fn, const operands *o, const call *c, float *y, int64_t ldy)
{
    const float *x[MAX_ROWS];
    float *yr[MAX_ROWS];
    for (int r = 0; r < c->rows; r++) {
        x[r] = o->x + (c->r0 + r) * o->k;
        yr[r] = y + r * ldy;
    }
    size_t size = c->dtype == ENG_DTYPE_F32 ? sizeof(float) : sizeof(uint16_t);
    eng__gemv g = {.x = x,
                   .y = yr,
                   .rows = c->rows,
                   .w = (const unsigned char *)c->w + (size_t)(c->f0 * o->k) * size,
                   .dtype = c->dtype,
                   .ldw = o->k,
                   .k = o->k,
                   .n = c->n,
                   .bias = o->bias + c->f0,
                   .round_bf16 = c->round};
    fn(&g);
}

static bool same_bits(const float *a, const float *b, size_t n)
{
    return memcmp(a, b, n * sizeof(float)) == 0;
}

/* The blocked product of the current kernel set: y = x w^T + bias. */
static void blocked(const operands *o, float *y)
{
    const eng__kernels *ks = eng__kernels_current();
    size_t floats = eng__sgemm_pack_floats(ks, o->n, o->k);
    float *pack = aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64 + 64);
    for (int r = 0; r < o->rows; r++)
        memcpy(y + r * o->n, o->bias, (size_t)o->n * sizeof(float));
    eng__gemm g = {.m = o->rows,
                   .n = o->n,
                   .k = o->k,
                   .alpha = 1.0f,
                   .beta = 1.0f,
                   .a = o->x,
                   .lda = o->k,
                   .b = o->w,
                   .ldb = o->k,
                   .b_trans = true,
                   .c = y,
                   .ldc = o->n};
    eng__sgemm(ks, &g, pack);
    free(pack);
}

static void test_fp32_weights_are_within_rounding_of_float64_and_the_blocked_product(void)
{
    for (int v = 0; v < NVARIANTS; v++) {
        eng__gemv_fn fn = eng__gemv_variant(variants[v]);
        if (!fn) {
            printf("skip: few-row products %s: this CPU does not support it\n", variants[v]);
            continue;
        }
        double worst = 0;
        for (int ri = 0; ri < NKERNEL_ROWS; ri++)
            for (int di = 0; di < NDEPTHS; di++)
                for (int wi = 0; wi < NWIDTHS; wi++) {
                    int rows = kernel_rows[ri];
                    int64_t k = depths[di], n = widths[wi];
                    operands o = operands_make(rows, k, n, (uint64_t)(ri * 100 + di * 10 + wi));
                    float *y = xcalloc((size_t)(rows * n), sizeof(float));
                    float *yb = xcalloc((size_t)(rows * n), sizeof(float));
                    run(fn, &o, &(call){0, rows, 0, n, o.w, ENG_DTYPE_F32, false}, y, n);
                    blocked(&o, yb);
                    int bad = 0;
                    for (int r = 0; r < rows; r++)
                        for (int64_t f = 0; f < n; f++) {
                            double sum = o.bias[f], mag = fabs(o.bias[f]);
                            for (int64_t i = 0; i < k; i++) {
                                double p = (double)o.x[r * k + i] * (double)o.w[f * k + i];
                                sum += p;
                                mag += fabs(p);
                            }
                            double bound = (double)(k + 2) * 0x1p-24 * mag;
                            double e = fabs(y[r * n + f] - sum);
                            worst = fmax(worst, e / bound);
                            bad +=
                                !(e <= bound) || !(fabs(y[r * n + f] - yb[r * n + f]) <= 2 * bound);
                        }
                    CHECKF(bad == 0, "%s: rows %d, k %lld, n %lld: %d results off", variants[v],
                           rows, (long long)k, (long long)n, bad);
                    free(y), free(yb);
                    operands_free(&o);
                }
        printf("  %s: worst error %.3f of the bound\n", variants[v], worst);
    }
}

static void test_16bit_weights_give_the_bits_of_their_fp32_values(void)
{
    for (int v = 0; v < NVARIANTS; v++) {
        eng__gemv_fn fn = eng__gemv_variant(variants[v]);
        if (!fn) {
            printf("skip: few-row products %s: this CPU does not support it\n", variants[v]);
            continue;
        }
        for (int ri = 0; ri < NKERNEL_ROWS; ri++)
            for (int di = 0; di < NDEPTHS; di++) {
                int rows = kernel_rows[ri];
                int64_t k = depths[di], n = 37;
                operands o = operands_make(rows, k, n, (uint64_t)(7 + ri * 10 + di));
                size_t count = (size_t)(rows * n);
                float *want = xcalloc(count, sizeof(float)), *got = xcalloc(count, sizeof(float));
                float *rounded = xcalloc((size_t)(n * k), sizeof(float));
                const struct {
                    const char *name;
                    const void *bits;
                    eng_dtype dtype;
                    const float *wide;
                } kinds[] = {{"f32", o.w, ENG_DTYPE_F32, o.w},
                             {"bf16", o.bf16, ENG_DTYPE_BF16, o.w_bf16},
                             {"f16", o.f16, ENG_DTYPE_F16, o.w_f16}};
                for (int t = 0; t < 3; t++) {
                    run(fn, &o, &(call){0, rows, 0, n, kinds[t].wide, ENG_DTYPE_F32, false}, want,
                        n);
                    run(fn, &o, &(call){0, rows, 0, n, kinds[t].bits, kinds[t].dtype, false}, got,
                        n);
                    CHECKF(same_bits(want, got, count),
                           "%s %s: rows %d, k %lld: not the bits of "
                           "fp32 weights",
                           variants[v], kinds[t].name, rows, (long long)k);
                    /* Rounded to bf16 as read: the bits of weights rounded beforehand. */
                    memcpy(rounded, kinds[t].wide, (size_t)(n * k) * sizeof(float));
                    eng__bf16_round_floats(rounded, n * k);
                    run(fn, &o, &(call){0, rows, 0, n, rounded, ENG_DTYPE_F32, false}, want, n);
                    run(fn, &o, &(call){0, rows, 0, n, kinds[t].bits, kinds[t].dtype, true}, got,
                        n);
                    CHECKF(same_bits(want, got, count),
                           "%s %s: rows %d, k %lld: rounding to "
                           "bf16 differs",
                           variants[v], kinds[t].name, rows, (long long)k);
                }
                free(want), free(got), free(rounded);
                operands_free(&o);
            }
    }
}

static void test_a_rows_bits_do_not_depend_on_what_shares_its_call(void)
{
    for (int v = 0; v < NVARIANTS; v++) {
        eng__gemv_fn fn = eng__gemv_variant(variants[v]);
        if (!fn) {
            printf("skip: few-row products %s: this CPU does not support it\n", variants[v]);
            continue;
        }
        for (int di = 0; di < NDEPTHS; di++) {
            int64_t k = depths[di], n = 37;
            operands o = operands_make(MAX_ROWS, k, n, (uint64_t)(50 + di));
            float *all = xcalloc((size_t)(MAX_ROWS * n), sizeof(float));
            float *part = xcalloc((size_t)(MAX_ROWS * n), sizeof(float));
            for (int d = 0; d < 2; d++) {
                const void *w = d ? (const void *)o.bf16 : (const void *)o.w;
                eng_dtype dt = d ? ENG_DTYPE_BF16 : ENG_DTYPE_F32;
                run(fn, &o, &(call){0, MAX_ROWS, 0, n, w, dt, false}, all, n);
                /* Each row alone, and in calls of 3 rows from an odd row. */
                for (int r = 0; r < MAX_ROWS; r++)
                    run(fn, &o, &(call){r, 1, 0, n, w, dt, false}, part + r * n, n);
                CHECKF(same_bits(all, part, (size_t)(MAX_ROWS * n)), "%s k %lld: rows alone",
                       variants[v], (long long)k);
                for (int r = 1; r + 3 <= MAX_ROWS; r += 3)
                    run(fn, &o, &(call){r, 3, 0, n, w, dt, false}, part + r * n, n);
                CHECKF(same_bits(all, part, (size_t)(MAX_ROWS * n)), "%s k %lld: rows by 3",
                       variants[v], (long long)k);
                for (int r = 0; r + 5 <= MAX_ROWS; r += 5)
                    run(fn, &o, &(call){r, 5, 0, n, w, dt, false}, part + r * n, n);
                CHECKF(same_bits(all, part, (size_t)(MAX_ROWS * n)), "%s k %lld: rows by 5",
                       variants[v], (long long)k);
                /* Features split at 1, 6 and 19: the halves in calls of their own. */
                const int64_t splits[] = {1, 6, 19};
                for (int s = 0; s < 3; s++) {
                    run(fn, &o, &(call){0, MAX_ROWS, 0, splits[s], w, dt, false}, part, n);
                    run(fn, &o, &(call){0, MAX_ROWS, splits[s], n - splits[s], w, dt, false},
                        part + splits[s], n);
                    CHECKF(same_bits(all, part, (size_t)(MAX_ROWS * n)),
                           "%s k %lld: features split at %lld", variants[v], (long long)k,
                           (long long)splits[s]);
                }
            }
            free(all), free(part);
            operands_free(&o);
        }
    }
}

/* ---- Layers ------------------------------------------------------------------------------- */

typedef struct {
    int64_t E, H, Hkv;
} shape;

/* Separate q/k/v/o projections with biases, the matrices of `dtype` (their values those of
 * *fp32, a layer of the same values in fp32, when asked). */
static eng_layer *layer_make(const shape *s, eng_dtype dtype, uint64_t seed, eng_layer **fp32)
{
    uint64_t rng = seed;
    int64_t E = s->E, W = s->Hkv * (E / s->H);
    const struct {
        const char *name;
        int64_t rows, cols;
    } parts[8] = {{"q_proj.weight", E, E}, {"k_proj.weight", W, E}, {"v_proj.weight", W, E},
                  {"o_proj.weight", E, E}, {"q_proj.bias", E, 0},   {"k_proj.bias", W, 0},
                  {"v_proj.bias", W, 0},   {"o_proj.bias", E, 0}};
    eng_weight half[8], full[8];
    void *data[8];
    float *values[8];
    for (int i = 0; i < 8; i++) {
        bool matrix = parts[i].cols > 0;
        int64_t count = parts[i].rows * (matrix ? parts[i].cols : 1);
        values[i] = xcalloc((size_t)count, sizeof(float));
        data[i] =
            matrix && dtype != ENG_DTYPE_F32 ? xcalloc((size_t)count, sizeof(uint16_t)) : NULL;
        for (int64_t j = 0; j < count; j++) {
            float f = rng_sym(&rng, matrix ? 1.0 / sqrt((double)E) : 0.5);
            if (data[i] && dtype == ENG_DTYPE_BF16) {
                ((uint16_t *)data[i])[j] = eng_f32_to_bf16(f);
                f = eng_bf16_to_f32(((uint16_t *)data[i])[j]);
            } else if (data[i]) {
                ((uint16_t *)data[i])[j] = eng_f32_to_f16(f);
                f = eng_f16_to_f32(((uint16_t *)data[i])[j]);
            }
            values[i][j] = f;
        }
        eng_weight t = {parts[i].name,
                        ENG_DTYPE_F32,
                        values[i],
                        matrix ? 2 : 1,
                        {parts[i].rows, parts[i].cols, 0, 0}};
        full[i] = t;
        if (data[i]) {
            t.dtype = dtype;
            t.data = data[i];
        }
        half[i] = t;
    }
    eng_error err;
    eng_layer *l = named_layer16("few", half, 8, s->H, s->Hkv, &err);
    CHECKF(l != NULL, "layer: %s", l ? "" : err.message);
    if (fp32) {
        *fp32 = named_layer("fp32", full, 8, s->H, s->Hkv, &err);
        CHECKF(*fp32 != NULL, "fp32 layer: %s", *fp32 ? "" : err.message);
    }
    for (int i = 0; i < 8; i++)
        free(values[i]), free(data[i]);
    return l;
}

static float *inputs(int64_t n, uint64_t seed)
{
    uint64_t rng = seed;
    float *x = xcalloc((size_t)n, sizeof(float));
    for (int64_t i = 0; i < n; i++)
        x[i] = rng_sym(&rng, 1.0);
    return x;
}

static eng_mha_args args_of(const eng_layer *l, int64_t B, int64_t L, const float *x, float *out,
                            eng_positional pos)
{
    eng_mha_args a;
    memset(&a, 0, sizeof a);
    a.layer = l;
    a.B = B;
    a.L = L;
    a.x = x;
    a.out = out;
    a.causal = true;
    a.positional = pos;
    return a;
}

/* Hidden sizes whose q, k and v widths (36, 18; 40; 64, 16) are no multiple of 16 or of 8. */
static const shape shapes[] = {{36, 4, 2}, {40, 4, 4}, {64, 8, 2}};
#define NSHAPES ((int)(sizeof shapes / sizeof shapes[0]))

static void test_few_row_layers_match_the_float64_reference(void)
{
    for (int s = 0; s < NSHAPES; s++)
        for (int ri = 0; ri < NROWS; ri++)
            for (int64_t B = 1; B <= 2; B++) {
                int64_t L = row_counts[ri], E = shapes[s].E;
                eng_layer *l = layer_make(&shapes[s], ENG_DTYPE_F32, 3, NULL);
                float *x = inputs(B * L * E, 9);
                float *out = xcalloc((size_t)(B * L * E), sizeof(float));
                eng_positional pos =
                    E % (2 * shapes[s].H) == 0 ? ENG_POSITIONAL_ROPE : ENG_POSITIONAL_NONE;
                eng_mha_args a = args_of(l, B, L, x, out, pos);
                eng_error err;
                CHECKF(eng_mha(pool, &a, NULL, &err) == ENG_OK, "eng_mha: %s", err.message);
                ref_mha_weights w = ref_mha_weights_of_layer(l);
                ref_mha_result r;
                CHECK(ref_mha(&w, &a, &r));
                double scale = 1e-3, worst = 0;
                for (int64_t i = 0; i < B * L * E; i++)
                    scale = fmax(scale, fabs(r.out[i]));
                for (int64_t i = 0; i < B * L * E; i++)
                    worst = fmax(worst, isnan(out[i]) ? INFINITY : fabs(out[i] - r.out[i]));
                CHECKF(worst <= 1e-4 * scale,
                       "E %lld, Hkv %lld, B %lld, L %lld: error %.3g x "
                       "max|out|",
                       (long long)E, (long long)shapes[s].Hkv, (long long)B, (long long)L,
                       worst / scale);
                ref_mha_result_free(&r);
                free(x), free(out);
                eng_layer_free(l);
            }
}

static void test_16bit_layers_at_few_rows_compute_what_fp32_layers_do(void)
{
    const eng_dtype dts[2] = {ENG_DTYPE_BF16, ENG_DTYPE_F16};
    const eng_precision precisions[2] = {ENG_PRECISION_FLOAT32, ENG_PRECISION_BFLOAT16};
    for (int s = 0; s < NSHAPES; s++)
        for (int d = 0; d < 2; d++) {
            eng_layer *fp32 = NULL, *half = layer_make(&shapes[s], dts[d], 4, &fp32);
            CHECK(half && half->params16 && fp32 && !fp32->params16);
            for (int ri = 0; half && fp32 && ri < NROWS; ri++)
                for (int p = 0; p < 2; p++) {
                    int64_t L = row_counts[ri], n = L * shapes[s].E;
                    float *x = inputs(n, 10);
                    float *o16 = xcalloc((size_t)n, sizeof(float));
                    float *o32 = xcalloc((size_t)n, sizeof(float));
                    eng_positional pos = shapes[s].E % (2 * shapes[s].H) == 0
                                             ? ENG_POSITIONAL_ROPE
                                             : ENG_POSITIONAL_SINUSOIDAL;
                    eng_mha_args a = args_of(half, 1, L, x, o16, pos);
                    a.precision = precisions[p];
                    eng_error err;
                    CHECKF(eng_mha(pool, &a, NULL, &err) == ENG_OK, "16-bit: %s", err.message);
                    a.layer = fp32;
                    a.out = o32;
                    CHECKF(eng_mha(pool, &a, NULL, &err) == ENG_OK, "fp32: %s", err.message);
                    CHECKF(same_bits(o16, o32, (size_t)n),
                           "E %lld, %s, L %lld, precision %d: "
                           "16-bit weights differ from fp32 ones",
                           (long long)shapes[s].E, d ? "f16" : "bf16", (long long)L, p);
                    free(x), free(o16), free(o32);
                }
            eng_layer_free(half);
            eng_layer_free(fp32);
        }
}

/* One token attends to itself alone: its attention output is its v row (each query head that
 * of its kv head), and the layer's output is two few-row products, which the set's kernel
 * reproduces bit for bit. The blocked product sums in another order. */
static void test_one_token_takes_the_few_row_kernel(void)
{
    const shape s = {36, 4, 2};
    const int64_t E = s.E, D = E / s.H, W = s.Hkv * D, group = s.H / s.Hkv;
    eng_layer *l = layer_make(&s, ENG_DTYPE_BF16, 5, NULL);
    if (!l)
        return;
    float *x = inputs(E, 11), *out = xcalloc((size_t)E, sizeof(float));
    eng_mha_args a = args_of(l, 1, 1, x, out, ENG_POSITIONAL_NONE);
    eng_error err;
    CHECKF(eng_mha(pool, &a, NULL, &err) == ENG_OK, "eng_mha: %s", err.message);

    eng__gemv_fn fn = eng__gemv_of(eng__kernels_current());
    float *v = xcalloc((size_t)W, sizeof(float)), *o = xcalloc((size_t)E, sizeof(float));
    float *want = xcalloc((size_t)E, sizeof(float));
    const float *xr[1] = {x}, *orow[1] = {o};
    float *vr[1] = {v}, *wr[1] = {want};
    fn(&(eng__gemv){xr, vr, 1, l->w16_v, l->w16_dtype, E, E, W, l->b_v, false});
    for (int64_t h = 0; h < s.H; h++)
        memcpy(o + h * D, v + h / group * D, (size_t)D * sizeof(float));
    fn(&(eng__gemv){orow, wr, 1, l->w16_o, l->w16_dtype, E, E, E, l->b_o, false});
    CHECKF(same_bits(out, want, (size_t)E),
           "a one-token layer is not the few-row products' "
           "bits (kernels %s)",
           eng_kernels_name());
    free(x), free(out), free(v), free(o), free(want);
    eng_layer_free(l);
}

int main(void)
{
    int status;
    if (test_engine_start(&pool, &status))
        return status;
    RUN_WITHIN(test_fp32_weights_are_within_rounding_of_float64_and_the_blocked_product, 120);
    RUN_WITHIN(test_16bit_weights_give_the_bits_of_their_fp32_values, 60);
    RUN_WITHIN(test_a_rows_bits_do_not_depend_on_what_shares_its_call, 60);
    RUN_WITHIN(test_few_row_layers_match_the_float64_reference, 60);
    RUN_WITHIN(test_16bit_layers_at_few_rows_compute_what_fp32_layers_do, 60);
    RUN_WITHIN(test_one_token_takes_the_few_row_kernel, 60);
    eng_pool_free(pool);
    return check_report();
}
