/*
 * vmath.c - the softmax's vector kernels in portable C, and what every variant computes.
 *
 * After the two GEMMs the exponential is the kernel's hot spot: one per score. All variants
 * evaluate exp the same way (Cody-Waite reduction by ln 2, a degree-5 minimax polynomial on
 * |r| <= ln2/2, within 1.4 FLT_EPSILON), clamp the argument, return exactly 0 below -87 so
 * that a masked score (-inf) contributes nothing, and pass NaN through so that a NaN input
 * surfaces as an error instead of vanishing like a masked key. The one exception is the
 * AVX-512 flash loop's exp_sum and exp_sum_max (softmax_exp16), which trade accuracy far below
 * a row's largest term for two fewer instructions per 16 scores. Vector loops finish with
 * masked loads instead of scalar tails, so every element of a row goes through the same
 * arithmetic. The build never uses -ffast-math: these kernels rely on IEEE -inf.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/vmath.h"

/* ---- Scalar ---------------------------------------------------------------------------------- */

static float exp_scalar(float x)
{
    if (isnan(x)) /* propagates, so that a NaN input is reported, never hidden */
        return x;
    if (x < EXP_LO)
        return 0.0f;
    if (x > EXP_HI)
        x = EXP_HI;
    float n = nearbyintf(x * LOG2E);
    float r = fmaf(-n, LN2_LO, fmaf(-n, LN2_HI, x));
    float p = fmaf(fmaf(fmaf(EXP_C5, r, EXP_C4), r, EXP_C3), r, EXP_C2);
    return ldexpf(fmaf(fmaf(p, r, EXP_C1), r, 1.0f), (int)n);
}

static float tanh_scalar(float t)
{
    float a = fabsf(t);
    if (a < TANH_SERIES_BELOW) {
        float t2 = t * t;
        return t * (1.0f + t2 * (-1.0f / 3 +
                                 t2 * (2.0f / 15 + t2 * (-17.0f / 315 + t2 * (62.0f / 2835)))));
    }
    float y = 1.0f - 2.0f / (exp_scalar(2.0f * a) + 1.0f);
    return t < 0 ? -y : y;
}

static float max_scalar(const float *x, int64_t n)
{
    float m = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(x[i]))
            return x[i];
        m = x[i] > m ? x[i] : m;
    }
    return m;
}

static float exp_sum_scalar(float *x, int64_t n, float shift)
{
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        x[i] = exp_scalar(x[i] - shift);
        sum += x[i];
    }
    return sum;
}

static float exp_sum_max_scalar(float *x, int64_t n, float shift, float *max)
{
    float sum = 0.0f, m = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(x[i]))
            m = NAN;
        else if (x[i] > m)
            m = x[i];
        x[i] = exp_scalar(x[i] - shift);
        sum += x[i];
    }
    *max = m;
    return sum;
}

static void exp_store_scalar(const float *x, float *dst, int64_t n, float shift, float mul,
                             bool accumulate)
{
    for (int64_t i = 0; i < n; i++) {
        float e = exp_scalar(x[i] - shift) * mul;
        dst[i] = accumulate ? dst[i] + e : e;
    }
}

static void softcap_scalar(float *x, int64_t n, float cap)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = cap * tanh_scalar(x[i] / cap);
}

static float tanh_dot_scalar(const float *x, const float *y, const float *v, int64_t n)
{
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++)
        sum += v[i] * tanh_scalar(x[i] + y[i]);
    return sum;
}

/* Element i of a K or V row of `dtype`, widened exactly. */
static inline float kv_elem(const void *x, eng_dtype dtype, int64_t i)
{
    switch (dtype) {
    case ENG_DTYPE_BF16:
        return eng_bf16_to_f32(((const uint16_t *)x)[i]);
    case ENG_DTYPE_F16:
        return eng_f16_to_f32(((const uint16_t *)x)[i]);
    case ENG_DTYPE_F32:
    default:
        return ((const float *)x)[i];
    }
}

/* Key-outer, so that a K or V row is fetched once and then read from L1 by every query row.
 * The bodies are inlined once per dtype (the callers' switch), so no branch runs per element. */
static inline __attribute__((always_inline)) void
dots_rows_generic(eng_dtype dtype, const float *const *q, int rows, const void *k, int64_t ldk,
                  int64_t n, int64_t d, float scale, float *s, int64_t lds)
{
    for (int64_t c = 0; c < n; c++)
        for (int r = 0; r < rows; r++) {
            float sum = 0.0f;
            for (int64_t i = 0; i < d; i++)
                sum += q[r][i] * kv_elem(k, dtype, c * ldk + i);
            s[r * lds + c] = scale * sum;
        }
}

static inline __attribute__((always_inline)) void
axpys_rows_generic(eng_dtype dtype, float *const *o, int rows, const float *p, int64_t ldp,
                   const void *v, int64_t ldv, int64_t n, int64_t d)
{
    for (int64_t c = 0; c < n; c++)
        for (int r = 0; r < rows; r++) {
            const float a = p[r * ldp + c];
            for (int64_t i = 0; i < d; i++)
                o[r][i] += a * kv_elem(v, dtype, c * ldv + i);
        }
}

static void dots_rows_scalar(const float *const *q, int rows, const void *k, eng_dtype dtype,
                             int64_t ldk, int64_t n, int64_t d, float scale, float *s, int64_t lds)
{
    BY_KV_DTYPE(dtype, dots_rows_generic, q, rows, k, ldk, n, d, scale, s, lds);
}

static void axpys_rows_scalar(float *const *o, int rows, const float *p, int64_t ldp, const void *v,
                              eng_dtype dtype, int64_t ldv, int64_t n, int64_t d)
{
    BY_KV_DTYPE(dtype, axpys_rows_generic, o, rows, p, ldp, v, ldv, n, d);
}

const eng__vec_ops eng__vec_scalar = {
    .name = "scalar",
    .max = max_scalar,
    .exp_sum = exp_sum_scalar,
    .exp_sum_max = exp_sum_max_scalar,
    .exp_store = exp_store_scalar,
    .softcap = softcap_scalar,
    .tanh_dot = tanh_dot_scalar,
    .dots_rows = dots_rows_scalar,
    .axpys_rows = axpys_rows_scalar,
};
