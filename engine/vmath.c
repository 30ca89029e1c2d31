/*
 * vmath.c - the softmax's vector kernels, with runtime dispatch to AVX-512, AVX2 or scalar.
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
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels.h"

#define EXP_LO (-87.0f) /* below this exp underflows to 0 (FLT_MIN is ~exp(-87.3)) */
/* Arguments are clamped here, above ln(FLT_MAX) = 88.72, so that large ones overflow to +inf
 * like expf while n stays at most 128 (one above the largest finite exponent, 127). */
#define EXP_HI 89.0f
#define LOG2E  1.44269504088896341f
#define LN2_HI 0.693359375f /* ln 2 split so that n * LN2_HI is exact */
#define LN2_LO (-2.12194440e-4f)
/* e^r = 1 + r (C1 + r (C2 + r (C3 + r (C4 + r C5)))) for |r| <= ln2 / 2: a minimax fit of
 * the relative error (9.2e-8 before rounding) with e^0 = 1 exactly, five FMAs: the softmax's
 * exponential is the work per score that is not a product, a tenth or more of attention at
 * D = 64. With the two-part ln 2 the whole exponential stays within 1.4 FLT_EPSILON of exp()
 * over [-87, 88.7] (checked on 4e7 arguments). */
#define EXP_C1 9.999997020e-01f
#define EXP_C2 4.999914765e-01f
#define EXP_C3 1.666763872e-01f
#define EXP_C4 4.189817607e-02f
#define EXP_C5 8.290277794e-03f
/* The same polynomial in f = r / ln 2, for 2^f on |f| <= 1/2: EXP_Ci ln2^i, rounded once. */
#define LN2_D   0.6931471805599453
#define EXP2_C1 ((float)(9.999997020e-01 * LN2_D))
#define EXP2_C2 ((float)(4.999914765e-01 * LN2_D * LN2_D))
#define EXP2_C3 ((float)(1.666763872e-01 * LN2_D * LN2_D * LN2_D))
#define EXP2_C4 ((float)(4.189817607e-02 * LN2_D * LN2_D * LN2_D * LN2_D))
#define EXP2_C5 ((float)(8.290277794e-03 * LN2_D * LN2_D * LN2_D * LN2_D * LN2_D))
/* tanh below this magnitude comes from its Taylor series: 1 - 2/(e^2t + 1) cancels there. */
#define TANH_SERIES_BELOW 0.25f

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

/* Calls fn(DT, ...) with DT the constant equal to dtype, so that an always_inline body is
 * compiled once per dtype and branches on it only once per call. */
#define BY_KV_DTYPE(dtype, fn, ...)                                                                \
    do {                                                                                           \
        if ((dtype) == ENG_DTYPE_BF16)                                                             \
            fn(ENG_DTYPE_BF16, __VA_ARGS__);                                                       \
        else if ((dtype) == ENG_DTYPE_F16)                                                         \
            fn(ENG_DTYPE_F16, __VA_ARGS__);                                                        \
        else                                                                                       \
            fn(ENG_DTYPE_F32, __VA_ARGS__);                                                        \
    } while (0)

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

static const eng__vec_ops scalar_ops = {
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

/* Keys per group of the vector decoding kernels: a group's K or V rows stay in L1 while every
 * query row reads them, and its dot products keep eight accumulators in registers. */
#define KEY_GROUP 8

/* The first `keys` row pointers of a key group from key c0 (elements of `size` bytes, row
 * stride ld); the rest repeat the last one, so that a short group runs the same instructions
 * (and so each key's sum takes the same bits in any group). */
static inline void group_rows(const void *x, size_t size, int64_t ld, int64_t c0, int64_t keys,
                              const char *rows[KEY_GROUP])
{
#pragma GCC unroll 8
    for (int j = 0; j < KEY_GROUP; j++)
        rows[j] = (const char *)x + (size_t)((c0 + (j < keys ? j : keys - 1)) * ld) * size;
}

static inline size_t kv_size(eng_dtype dtype)
{
    return dtype == ENG_DTYPE_F32 ? sizeof(float) : sizeof(uint16_t);
}

/* ---- AVX2 + FMA ------------------------------------------------------------------------------ */

#define AVX2 __attribute__((target("avx2,fma")))

AVX2 static inline __m256i tail_mask8(int64_t left)
{
    __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(left < 8 ? left : 8)), lanes);
}

AVX2 static inline __m256 exp8(__m256 x)
{
    __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(EXP_LO), _CMP_LT_OQ);
    /* min/max return their second operand when either is NaN: x second keeps a NaN. */
    x = _mm256_min_ps(_mm256_set1_ps(EXP_HI), x);
    x = _mm256_max_ps(_mm256_set1_ps(EXP_LO), x);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
    __m256 y = _mm256_fmadd_ps(_mm256_set1_ps(EXP_C5), r, _mm256_set1_ps(EXP_C4));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(EXP_C3));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(EXP_C2));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(EXP_C1));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.0f));
    /* 2^n from its bit pattern holds n <= 127; n = 128 (x in [88.38, 89]) scales y by 2 first,
     * so that exp(88.7) stays finite and exp(89) overflows to +inf, as expf does. */
    __m256 top = _mm256_cmp_ps(n, _mm256_set1_ps(127.5f), _CMP_GT_OQ);
    y = _mm256_blendv_ps(y, _mm256_add_ps(y, y), top);
    n = _mm256_min_ps(n, _mm256_set1_ps(127.0f));
    __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(under, y);
}

AVX2 static inline float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AVX2 static float max_avx2(const float *x, int64_t n)
{
    __m256 m = _mm256_set1_ps(-INFINITY), nan = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8) {
        __m256 mask = _mm256_castsi256_ps(tail_mask8(n - i));
        __m256 v = _mm256_maskload_ps(x + i, _mm256_castps_si256(mask));
        v = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), v, mask);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        m = _mm256_max_ps(m, v);
    }
    if (_mm256_movemask_ps(nan))
        return NAN;
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

AVX2 static float exp_sum_avx2(float *x, int64_t n, float shift)
{
    __m256 s = _mm256_set1_ps(shift), acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), s));
        _mm256_storeu_ps(x + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    if (i < n) {
        __m256i mask = tail_mask8(n - i);
        __m256 e = exp8(_mm256_sub_ps(_mm256_maskload_ps(x + i, mask), s));
        e = _mm256_and_ps(e, _mm256_castsi256_ps(mask));
        _mm256_maskstore_ps(x + i, mask, e);
        acc = _mm256_add_ps(acc, e);
    }
    return hsum8(acc);
}

AVX2 static float exp_sum_max_avx2(float *x, int64_t n, float shift, float *max)
{
    __m256 s = _mm256_set1_ps(shift), acc = _mm256_setzero_ps();
    __m256 m = _mm256_set1_ps(-INFINITY), nan = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8) {
        __m256i mask = tail_mask8(n - i);
        __m256 v = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_maskload_ps(x + i, mask),
                                    _mm256_castsi256_ps(mask));
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        m = _mm256_max_ps(m, v);
        __m256 e = exp8(_mm256_sub_ps(v, s)); /* -inf in the tail lanes gives 0 */
        _mm256_maskstore_ps(x + i, mask, e);
        acc = _mm256_add_ps(acc, e);
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    *max = _mm256_movemask_ps(nan) ? NAN : _mm_cvtss_f32(h);
    return hsum8(acc);
}

AVX2 static void exp_store_avx2(const float *x, float *dst, int64_t n, float shift, float mul,
                                bool accumulate)
{
    __m256 s = _mm256_set1_ps(shift), m = _mm256_set1_ps(mul);
    for (int64_t i = 0; i < n; i += 8) {
        __m256i mask = tail_mask8(n - i);
        __m256 e = _mm256_mul_ps(exp8(_mm256_sub_ps(_mm256_maskload_ps(x + i, mask), s)), m);
        if (accumulate)
            e = _mm256_add_ps(e, _mm256_maskload_ps(dst + i, mask));
        _mm256_maskstore_ps(dst + i, mask, e);
    }
}

AVX2 static inline __m256 tanh8(__m256 t)
{
    __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
    __m256 a = _mm256_andnot_ps(sign, t);
    __m256 big = _mm256_sub_ps(
        one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(exp8(_mm256_add_ps(a, a)), one)));
    big = _mm256_or_ps(big, _mm256_and_ps(sign, t));
    __m256 t2 = _mm256_mul_ps(t, t);
    __m256 p = _mm256_fmadd_ps(t2, _mm256_set1_ps(62.0f / 2835), _mm256_set1_ps(-17.0f / 315));
    p = _mm256_fmadd_ps(p, t2, _mm256_set1_ps(2.0f / 15));
    p = _mm256_fmadd_ps(p, t2, _mm256_set1_ps(-1.0f / 3));
    p = _mm256_fmadd_ps(p, t2, one);
    __m256 use_series = _mm256_cmp_ps(a, _mm256_set1_ps(TANH_SERIES_BELOW), _CMP_LT_OQ);
    return _mm256_blendv_ps(big, _mm256_mul_ps(t, p), use_series);
}

AVX2 static void softcap_avx2(float *x, int64_t n, float cap)
{
    __m256 c = _mm256_set1_ps(cap), inv = _mm256_set1_ps(1.0f / cap);
    for (int64_t i = 0; i < n; i += 8) {
        __m256i mask = tail_mask8(n - i);
        __m256 t = _mm256_mul_ps(_mm256_maskload_ps(x + i, mask), inv);
        _mm256_maskstore_ps(x + i, mask, _mm256_mul_ps(c, tanh8(t)));
    }
}

AVX2 static float tanh_dot_avx2(const float *x, const float *y, const float *v, int64_t n)
{
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8) {
        __m256i mask = tail_mask8(n - i);
        __m256 t = _mm256_add_ps(_mm256_maskload_ps(x + i, mask), _mm256_maskload_ps(y + i, mask));
        acc = _mm256_fmadd_ps(_mm256_maskload_ps(v + i, mask), tanh8(t), acc);
    }
    return hsum8(acc);
}

/* 16-bit cache rows, 8 at a time: bf16 is the high half of a float; float16 goes through
 * F16C, which every CPU with AVX2 and FMA has. The tail is masked on the widened floats. */
AVX2 static inline __m256 load8_bf16(const uint16_t *x, int64_t left)
{
    uint16_t tmp[8] = {0};
    const uint16_t *src = x;
    if (left < 8) {
        memcpy(tmp, x, (size_t)left * sizeof *x);
        src = tmp;
    }
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)src));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

__attribute__((target("avx2,fma,f16c"))) static inline __m256 load8_f16(const uint16_t *x,
                                                                        int64_t left)
{
    uint16_t tmp[8] = {0};
    const uint16_t *src = x;
    if (left < 8) {
        memcpy(tmp, x, (size_t)left * sizeof *x);
        src = tmp;
    }
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)src));
}

#define AVX2_F16C __attribute__((target("avx2,fma,f16c")))

/* Elements [i, i + 8) of a K or V row of `dtype`, widened; lanes past `left` are 0. */
AVX2_F16C static inline __m256 load8_kv(const void *x, eng_dtype dtype, int64_t i, int64_t left)
{
    if (dtype == ENG_DTYPE_BF16)
        return load8_bf16((const uint16_t *)x + i, left);
    if (dtype == ENG_DTYPE_F16)
        return load8_f16((const uint16_t *)x + i, left);
    return _mm256_maskload_ps((const float *)x + i, tail_mask8(left));
}

/* Elements [i, i + 8) of a K or V row of `dtype`, all present: a plain load (the masked ones
 * are for a row's tail only). */
AVX2_F16C static inline __m256 load8_kv_full(const void *x, eng_dtype dtype, int64_t i)
{
    if (dtype == ENG_DTYPE_F32)
        return _mm256_loadu_ps((const float *)x + i);
    const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)x + i));
    if (dtype == ENG_DTYPE_F16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* Eight 8-lane sums at once: sums[j] = the sum of acc[j]'s lanes, each by the same tree. */
AVX2 static inline __m256 hsum8x8(const __m256 acc[KEY_GROUP])
{
    __m256 t0 = _mm256_hadd_ps(acc[0], acc[1]), t1 = _mm256_hadd_ps(acc[2], acc[3]);
    __m256 t2 = _mm256_hadd_ps(acc[4], acc[5]), t3 = _mm256_hadd_ps(acc[6], acc[7]);
    __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20),
                         _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* acc[j] = the products of q and key row kr[j], summed over the chunks of d in order: key by
 * key (rows read from memory in the order they lie) or chunk by chunk (rows in L1, each chunk
 * of q loaded once): the same bits, as dots_keys_avx512. */
AVX2_F16C static inline __attribute__((always_inline)) void
dots_keys_avx2(eng_dtype dtype, const float *q, const char *const *kr, int64_t d,
               __m256 acc[KEY_GROUP])
{
    const int64_t full = d / 8 * 8;
#pragma GCC unroll 8
    for (int j = 0; j < KEY_GROUP; j++) {
        acc[j] = _mm256_setzero_ps();
        for (int64_t i = 0; i < full; i += 8)
            acc[j] =
                _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load8_kv_full(kr[j], dtype, i), acc[j]);
        if (full < d)
            acc[j] = _mm256_fmadd_ps(_mm256_maskload_ps(q + full, tail_mask8(d - full)),
                                     load8_kv(kr[j], dtype, full, d - full), acc[j]);
    }
}

AVX2_F16C static inline __attribute__((always_inline)) void
dots_chunks_avx2(eng_dtype dtype, const float *q, const char *const *kr, int64_t d,
                 __m256 acc[KEY_GROUP])
{
#pragma GCC unroll 8
    for (int j = 0; j < KEY_GROUP; j++)
        acc[j] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= d; i += 8) {
        const __m256 qv = _mm256_loadu_ps(q + i);
#pragma GCC unroll 8
        for (int j = 0; j < KEY_GROUP; j++)
            acc[j] = _mm256_fmadd_ps(qv, load8_kv_full(kr[j], dtype, i), acc[j]);
    }
    if (i < d) {
        const __m256 qv = _mm256_maskload_ps(q + i, tail_mask8(d - i));
#pragma GCC unroll 8
        for (int j = 0; j < KEY_GROUP; j++)
            acc[j] = _mm256_fmadd_ps(qv, load8_kv(kr[j], dtype, i, d - i), acc[j]);
    }
}

/* Query row by query row over a key group: the first reads it key by key, from memory, the
 * others chunk by chunk, from L1. */
AVX2_F16C static inline __attribute__((always_inline)) void
dots_rows_avx2_of(eng_dtype dtype, const float *const *q, int rows, const void *k, int64_t ldk,
                  int64_t n, int64_t d, float scale, float *s, int64_t lds)
{
    for (int64_t c0 = 0; c0 < n; c0 += KEY_GROUP) {
        const int64_t keys = n - c0 < KEY_GROUP ? n - c0 : KEY_GROUP;
        const char *kr[KEY_GROUP];
        group_rows(k, kv_size(dtype), ldk, c0, keys, kr);
        for (int r = 0; r < rows; r++) {
            __m256 acc[KEY_GROUP];
            if (r == 0)
                dots_keys_avx2(dtype, q[r], kr, d, acc);
            else
                dots_chunks_avx2(dtype, q[r], kr, d, acc);
            const __m256 sums = _mm256_mul_ps(_mm256_set1_ps(scale), hsum8x8(acc));
            _mm256_maskstore_ps(s + r * lds + c0, tail_mask8(keys), sums);
        }
    }
}

/* y += the first `keys` V rows vr weighted by a, each element taking the keys in order: key
 * by key with y through L1, or chunk by chunk with y's chunk in a register (axpys_keys_avx512). */
AVX2_F16C static inline __attribute__((always_inline)) void
axpys_keys_avx2(eng_dtype dtype, float *y, const __m256 a[KEY_GROUP], const char *const *vr,
                int64_t keys, int64_t d)
{
    const int64_t full = d / 8 * 8;
    const __m256i tail = tail_mask8(d - full);
#pragma GCC unroll 8
    for (int j = 0; j < KEY_GROUP; j++) {
        if (j >= keys)
            break;
        for (int64_t i = 0; i < full; i += 8)
            _mm256_storeu_ps(y + i, _mm256_fmadd_ps(a[j], load8_kv_full(vr[j], dtype, i),
                                                    _mm256_loadu_ps(y + i)));
        if (full < d)
            _mm256_maskstore_ps(y + full, tail,
                                _mm256_fmadd_ps(a[j], load8_kv(vr[j], dtype, full, d - full),
                                                _mm256_maskload_ps(y + full, tail)));
    }
}

AVX2_F16C static inline __attribute__((always_inline)) void
axpys_chunks_avx2(eng_dtype dtype, float *y, const __m256 a[KEY_GROUP], const char *const *vr,
                  int64_t keys, int64_t d)
{
    int64_t i = 0;
    for (; i + 8 <= d; i += 8) {
        __m256 acc = _mm256_loadu_ps(y + i);
#pragma GCC unroll 8
        for (int j = 0; j < keys; j++)
            acc = _mm256_fmadd_ps(a[j], load8_kv_full(vr[j], dtype, i), acc);
        _mm256_storeu_ps(y + i, acc);
    }
    if (i < d) {
        const __m256i mask = tail_mask8(d - i);
        __m256 acc = _mm256_maskload_ps(y + i, mask);
#pragma GCC unroll 8
        for (int j = 0; j < keys; j++)
            acc = _mm256_fmadd_ps(a[j], load8_kv(vr[j], dtype, i, d - i), acc);
        _mm256_maskstore_ps(y + i, mask, acc);
    }
}

/* Query row by query row over a key group: the first reads it key by key, from memory, the
 * others chunk by chunk, from L1. */
AVX2_F16C static inline __attribute__((always_inline)) void
axpys_rows_avx2_of(eng_dtype dtype, float *const *o, int rows, const float *p, int64_t ldp,
                   const void *v, int64_t ldv, int64_t n, int64_t d)
{
    for (int64_t c0 = 0; c0 < n; c0 += KEY_GROUP) {
        const int64_t keys = n - c0 < KEY_GROUP ? n - c0 : KEY_GROUP;
        const char *vr[KEY_GROUP];
        group_rows(v, kv_size(dtype), ldv, c0, keys, vr);
        for (int r = 0; r < rows; r++) {
            __m256 a[KEY_GROUP];
#pragma GCC unroll 8
            for (int j = 0; j < KEY_GROUP; j++)
                a[j] = _mm256_set1_ps(j < keys ? p[r * ldp + c0 + j] : 0.0f);
            if (r == 0)
                axpys_keys_avx2(dtype, o[r], a, vr, keys, d);
            else
                axpys_chunks_avx2(dtype, o[r], a, vr, keys, d);
        }
    }
}

AVX2_F16C static void dots_rows_avx2(const float *const *q, int rows, const void *k,
                                     eng_dtype dtype, int64_t ldk, int64_t n, int64_t d,
                                     float scale, float *s, int64_t lds)
{
    BY_KV_DTYPE(dtype, dots_rows_avx2_of, q, rows, k, ldk, n, d, scale, s, lds);
}

AVX2_F16C static void axpys_rows_avx2(float *const *o, int rows, const float *p, int64_t ldp,
                                      const void *v, eng_dtype dtype, int64_t ldv, int64_t n,
                                      int64_t d)
{
    BY_KV_DTYPE(dtype, axpys_rows_avx2_of, o, rows, p, ldp, v, ldv, n, d);
}

static const eng__vec_ops avx2_ops = {
    .name = "avx2",
    .max = max_avx2,
    .exp_sum = exp_sum_avx2,
    .exp_sum_max = exp_sum_max_avx2,
    .exp_store = exp_store_avx2,
    .softcap = softcap_avx2,
    .tanh_dot = tanh_dot_avx2,
    .dots_rows = dots_rows_avx2,
    .axpys_rows = axpys_rows_avx2,
};

/* ---- AVX-512 --------------------------------------------------------------------------------- */

/* DQ for VREDUCEPS (softmax_exp16); every AVX-512 CPU but the Xeon Phi has it, and the
 * variant is offered only where it does. */
#define AVX512 __attribute__((target("avx512f,avx512dq")))

static inline __mmask16 tail_mask16(int64_t left)
{
    return (__mmask16)(left >= 16 ? 0xFFFFu : (1u << (unsigned)left) - 1u);
}

/* 1 + r (c1 + r (c2 + r (c3 + r (c4 + r c5)))): the exponentials' polynomial, five FMAs. */
AVX512 static inline __m512 poly5_16(__m512 r, float c1, float c2, float c3, float c4, float c5)
{
    __m512 y = _mm512_fmadd_ps(_mm512_set1_ps(c5), r, _mm512_set1_ps(c4));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(c3));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(c2));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(c1));
    return _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f));
}

AVX512 static inline __m512 exp16(__m512 x)
{
    /* scalef saturates to 0 or inf for any n; -inf and values below EXP_LO are zeroed by the
     * mask. The upper clamp keeps +inf from becoming inf - inf = NaN in the reduction; min
     * returns its second operand for a NaN, so NaN flows through as NaN. */
    __mmask16 under = _mm512_cmp_ps_mask(x, _mm512_set1_ps(EXP_LO), _CMP_LT_OQ);
    x = _mm512_min_ps(_mm512_set1_ps(EXP_HI), x);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(LOG2E)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
    __m512 y = poly5_16(r, EXP_C1, EXP_C2, EXP_C3, EXP_C4, EXP_C5);
    return _mm512_maskz_scalef_ps((__mmask16)~under, y, n);
}

/* e^d for the flash loop's exponentials, d = score - the row's reference maximum, in two
 * instructions fewer than exp16, on the ports the products need (at D = 64 they keep both
 * FMA ports busy): t = d log2(e) in one multiply instead of the two-part Cody-Waite
 * reduction, f = t - round(t) by VREDUCEPS where exp16 rounds by VRNDSCALEPS (two uops on
 * Intel cores), and no upper clamp (+inf gives +inf, which the caller reports like NaN). The
 * polynomial is exp16's in f (its coefficients times ln2^i). The rounding of t costs relative
 * accuracy in proportion to |d|: within (2 + 0.75 |d|) FLT_EPSILON of e^d (checked on 2e7
 * arguments over [-87, 10]), so at most 0.3 FLT_EPSILON of the row's largest term, e^0 = 1,
 * for any d <= 0; a row's sum and P V see nothing of it. exp16 stays within 1.4 FLT_EPSILON
 * for the weights that are returned (exp_store). */
AVX512 static inline __m512 softmax_exp16(__m512 d)
{
    __mmask16 under = _mm512_cmp_ps_mask(d, _mm512_set1_ps(EXP_LO), _CMP_LT_OQ);
    __m512 t = _mm512_mul_ps(d, _mm512_set1_ps(LOG2E));
    __m512 f = _mm512_reduce_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 n = _mm512_sub_ps(t, f);
    __m512 y = poly5_16(f, EXP2_C1, EXP2_C2, EXP2_C3, EXP2_C4, EXP2_C5);
    return _mm512_maskz_scalef_ps((__mmask16)~under, y, n);
}

AVX512 static float max_avx512(const float *x, int64_t n)
{
    __m512 m = _mm512_set1_ps(-INFINITY);
    __mmask16 nan = 0;
    for (int64_t i = 0; i < n; i += 16) {
        __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), tail_mask16(n - i), x + i);
        nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        m = _mm512_max_ps(m, v);
    }
    return nan ? NAN : _mm512_reduce_max_ps(m);
}

AVX512 static float exp_sum_avx512(float *x, int64_t n, float shift)
{
    __m512 s = _mm512_set1_ps(shift), acc = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 e = softmax_exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), s));
        _mm512_storeu_ps(x + i, e);
        acc = _mm512_add_ps(acc, e);
    }
    if (i < n) {
        __mmask16 mask = tail_mask16(n - i);
        __m512 e = softmax_exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, x + i), s));
        _mm512_mask_storeu_ps(x + i, mask, e);
        acc = _mm512_mask_add_ps(acc, mask, acc, e);
    }
    return _mm512_reduce_add_ps(acc);
}

/* The block maximum skips NaN (max returns its second operand, m, when v is NaN), and a NaN
 * score makes the sum NaN instead: with a finite shift no other input gives a NaN sum, so one
 * test after the loop replaces a compare per vector. */
AVX512 static float exp_sum_max_avx512(float *x, int64_t n, float shift, float *max)
{
    __m512 s = _mm512_set1_ps(shift), acc = _mm512_setzero_ps(), m = _mm512_set1_ps(-INFINITY);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        m = _mm512_max_ps(v, m);
        __m512 e = softmax_exp16(_mm512_sub_ps(v, s));
        _mm512_storeu_ps(x + i, e);
        acc = _mm512_add_ps(acc, e);
    }
    if (i < n) {
        __mmask16 mask = tail_mask16(n - i);
        __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), mask, x + i);
        m = _mm512_max_ps(v, m);
        __m512 e = softmax_exp16(_mm512_sub_ps(v, s));
        _mm512_mask_storeu_ps(x + i, mask, e);
        acc = _mm512_mask_add_ps(acc, mask, acc, e);
    }
    float sum = _mm512_reduce_add_ps(acc);
    *max = isnan(sum) ? NAN : _mm512_reduce_max_ps(m);
    return sum;
}

AVX512 static void exp_store_avx512(const float *x, float *dst, int64_t n, float shift, float mul,
                                    bool accumulate)
{
    __m512 s = _mm512_set1_ps(shift), m = _mm512_set1_ps(mul);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 mask = tail_mask16(n - i);
        __m512 e = _mm512_mul_ps(exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, x + i), s)), m);
        if (accumulate)
            e = _mm512_add_ps(e, _mm512_maskz_loadu_ps(mask, dst + i));
        _mm512_mask_storeu_ps(dst + i, mask, e);
    }
}

AVX512 static inline __m512 tanh16(__m512 t)
{
    __m512 one = _mm512_set1_ps(1.0f);
    __m512 a = _mm512_abs_ps(t);
    __m512 big = _mm512_sub_ps(
        one, _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(exp16(_mm512_add_ps(a, a)), one)));
    __mmask16 negative = _mm512_cmp_ps_mask(t, _mm512_setzero_ps(), _CMP_LT_OQ);
    big = _mm512_mask_sub_ps(big, negative, _mm512_setzero_ps(), big);
    __m512 t2 = _mm512_mul_ps(t, t);
    __m512 p = _mm512_fmadd_ps(t2, _mm512_set1_ps(62.0f / 2835), _mm512_set1_ps(-17.0f / 315));
    p = _mm512_fmadd_ps(p, t2, _mm512_set1_ps(2.0f / 15));
    p = _mm512_fmadd_ps(p, t2, _mm512_set1_ps(-1.0f / 3));
    p = _mm512_fmadd_ps(p, t2, one);
    __mmask16 series = _mm512_cmp_ps_mask(a, _mm512_set1_ps(TANH_SERIES_BELOW), _CMP_LT_OQ);
    return _mm512_mask_mul_ps(big, series, t, p);
}

AVX512 static void softcap_avx512(float *x, int64_t n, float cap)
{
    __m512 c = _mm512_set1_ps(cap), inv = _mm512_set1_ps(1.0f / cap);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 mask = tail_mask16(n - i);
        __m512 t = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, x + i), inv);
        _mm512_mask_storeu_ps(x + i, mask, _mm512_mul_ps(c, tanh16(t)));
    }
}

AVX512 static float tanh_dot_avx512(const float *x, const float *y, const float *v, int64_t n)
{
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 mask = tail_mask16(n - i);
        __m512 t =
            _mm512_add_ps(_mm512_maskz_loadu_ps(mask, x + i), _mm512_maskz_loadu_ps(mask, y + i));
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, v + i), tanh16(t), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

/* 16-bit cache rows, 16 at a time, widened (AVX-512F alone: a short tail is copied first,
 * since masked 16-bit loads would need AVX512BW). */
AVX512 static inline __m256i load16_halves(const uint16_t *x, int64_t left)
{
    if (left >= 16)
        return _mm256_loadu_si256((const __m256i *)x);
    uint16_t tmp[16] = {0};
    memcpy(tmp, x, (size_t)left * sizeof *x);
    return _mm256_loadu_si256((const __m256i *)tmp);
}

AVX512 static inline __m512 load16_bf16(const uint16_t *x, int64_t left)
{
    __m512i w = _mm512_cvtepu16_epi32(load16_halves(x, left));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

AVX512 static inline __m512 load16_f16(const uint16_t *x, int64_t left)
{
    return _mm512_cvtph_ps(load16_halves(x, left));
}

/* Elements [i, i + 16) of a K or V row of `dtype`, widened; lanes past `left` are 0. */
AVX512 static inline __m512 load16_kv(const void *x, eng_dtype dtype, int64_t i, int64_t left)
{
    if (dtype == ENG_DTYPE_BF16)
        return load16_bf16((const uint16_t *)x + i, left);
    if (dtype == ENG_DTYPE_F16)
        return load16_f16((const uint16_t *)x + i, left);
    return _mm512_maskz_loadu_ps(tail_mask16(left), (const float *)x + i);
}

/* Eight 16-lane sums at once, in the low eight lanes: each acc[j] by the same tree (halves of
 * 256, then of 128 bits, then within 128-bit lanes), whatever its slot. */
AVX512 static inline __m512 hsum16x8(const __m512 acc[KEY_GROUP])
{
    __m512 b[4], c[2];
#pragma GCC unroll 8
    for (int j = 0; j < 4; j++)
        b[j] = _mm512_add_ps(_mm512_shuffle_f32x4(acc[2 * j], acc[2 * j + 1], 0x44),
                             _mm512_shuffle_f32x4(acc[2 * j], acc[2 * j + 1], 0xEE));
#pragma GCC unroll 8
    for (int j = 0; j < 2; j++)
        c[j] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * j], b[2 * j + 1], 0x88),
                             _mm512_shuffle_f32x4(b[2 * j], b[2 * j + 1], 0xDD));
    /* c[0] holds keys 0-3 and c[1] keys 4-7, one per 128-bit lane, four partial sums each. */
    __m512 e = _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(3, 2, 3, 2)));
    __m512 f = _mm512_add_ps(e, _mm512_shuffle_ps(e, e, _MM_SHUFFLE(2, 3, 0, 1)));
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 2, 6, 10, 14, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_permutexvar_ps(order, f);
}

/* Elements [i, i + 16) of a K or V row of `dtype`, all present. */
AVX512 static inline __m512 load16_kv_full(const void *x, eng_dtype dtype, int64_t i)
{
    if (dtype == ENG_DTYPE_F32)
        return _mm512_loadu_ps((const float *)x + i);
    const __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)x + i));
    if (dtype == ENG_DTYPE_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* 16-bit K or V rows of at most this many elements are widened once per key group when several
 * query rows read them (a stack buffer of KEY_GROUP rows), instead of once per query row. */
#define WIDEN_MAX 256

/* The key group's rows widened to fp32 rows of d at dst (row j at dst + j d), rows[] pointed
 * at them. */
AVX512 static inline __attribute__((always_inline)) void
widen_group_avx512(eng_dtype dtype, const char *rows[KEY_GROUP], int64_t d, float *dst)
{
    for (int j = 0; j < KEY_GROUP; j++) {
        float *out = dst + j * d;
        int64_t i = 0;
        for (; i + 16 <= d; i += 16)
            _mm512_storeu_ps(out + i, load16_kv_full(rows[j], dtype, i));
        if (i < d)
            _mm512_mask_storeu_ps(out + i, tail_mask16(d - i), load16_kv(rows[j], dtype, i, d - i));
        rows[j] = (const char *)out;
    }
}

/* acc[j] = the products of q and key row kr[j] (of `dtype`), summed over the chunks of d in
 * order. Two loop orders give the same bits: key by key reads the rows in the order they lie
 * (the one a query row reading them from memory needs: interleaving the eight rows chunk by
 * chunk read them at a third of memory speed on AMD Zen 4, whose prefetchers follow sequential
 * lines), chunk by chunk loads each chunk of q once for the eight keys (for rows already in
 * L1). */
AVX512 static inline __attribute__((always_inline)) void
dots_keys_avx512(eng_dtype dtype, const float *q, const char *const *kr, int64_t d,
                 __m512 acc[KEY_GROUP])
{
    const int64_t full = d / 16 * 16;
#pragma GCC unroll 8
    for (int j = 0; j < KEY_GROUP; j++) {
        acc[j] = _mm512_setzero_ps();
        for (int64_t i = 0; i < full; i += 16)
            acc[j] =
                _mm512_fmadd_ps(_mm512_loadu_ps(q + i), load16_kv_full(kr[j], dtype, i), acc[j]);
        if (full < d)
            acc[j] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail_mask16(d - full), q + full),
                                     load16_kv(kr[j], dtype, full, d - full), acc[j]);
    }
}

AVX512 static inline __attribute__((always_inline)) void
dots_chunks_avx512(eng_dtype dtype, const float *q, const char *const *kr, int64_t d,
                   __m512 acc[KEY_GROUP])
{
#pragma GCC unroll 8
    for (int j = 0; j < KEY_GROUP; j++)
        acc[j] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= d; i += 16) {
        const __m512 qv = _mm512_loadu_ps(q + i);
#pragma GCC unroll 8
        for (int j = 0; j < KEY_GROUP; j++)
            acc[j] = _mm512_fmadd_ps(qv, load16_kv_full(kr[j], dtype, i), acc[j]);
    }
    if (i < d) {
        const __m512 qv = _mm512_maskz_loadu_ps(tail_mask16(d - i), q + i);
#pragma GCC unroll 8
        for (int j = 0; j < KEY_GROUP; j++)
            acc[j] = _mm512_fmadd_ps(qv, load16_kv(kr[j], dtype, i, d - i), acc[j]);
    }
}

/* The scores of `rows` query rows against one key group (rows kr of `dtype`), at s (row
 * stride lds): the first query row reads the group key by key, from memory, the others chunk
 * by chunk, from L1. */
AVX512 static inline __attribute__((always_inline)) void
dots_group_avx512(eng_dtype dtype, const float *const *q, int rows, const char *const *kr,
                  int64_t keys, int64_t d, float scale, float *s, int64_t lds)
{
    for (int r = 0; r < rows; r++) {
        __m512 acc[KEY_GROUP];
        if (r == 0)
            dots_keys_avx512(dtype, q[r], kr, d, acc);
        else
            dots_chunks_avx512(dtype, q[r], kr, d, acc);
        const __m512 sums = _mm512_mul_ps(_mm512_set1_ps(scale), hsum16x8(acc));
        _mm512_mask_storeu_ps(s + r * lds, tail_mask16(keys), sums);
    }
}

/* y += the first `keys` keys' V rows vr (of `dtype`) weighted by a, each element taking the
 * keys in order, one FMA each: key by key with y through L1 (V rows read in the order they
 * lie, see dots_keys_avx512), or chunk by chunk with y's chunk in a register: the same bits. */
AVX512 static inline __attribute__((always_inline)) void
axpys_keys_avx512(eng_dtype dtype, float *y, const __m512 a[KEY_GROUP], const char *const *vr,
                  int64_t keys, int64_t d)
{
    const int64_t full = d / 16 * 16;
    const __mmask16 tail = tail_mask16(d - full);
#pragma GCC unroll 8
    for (int j = 0; j < KEY_GROUP; j++) {
        if (j >= keys)
            break;
        for (int64_t i = 0; i < full; i += 16)
            _mm512_storeu_ps(y + i, _mm512_fmadd_ps(a[j], load16_kv_full(vr[j], dtype, i),
                                                    _mm512_loadu_ps(y + i)));
        if (full < d)
            _mm512_mask_storeu_ps(y + full, tail,
                                  _mm512_fmadd_ps(a[j], load16_kv(vr[j], dtype, full, d - full),
                                                  _mm512_maskz_loadu_ps(tail, y + full)));
    }
}

AVX512 static inline __attribute__((always_inline)) void
axpys_chunks_avx512(eng_dtype dtype, float *y, const __m512 a[KEY_GROUP], const char *const *vr,
                    int64_t keys, int64_t d)
{
    int64_t i = 0;
    for (; i + 16 <= d; i += 16) {
        __m512 acc = _mm512_loadu_ps(y + i);
#pragma GCC unroll 8
        for (int j = 0; j < keys; j++)
            acc = _mm512_fmadd_ps(a[j], load16_kv_full(vr[j], dtype, i), acc);
        _mm512_storeu_ps(y + i, acc);
    }
    if (i < d) {
        const __mmask16 mask = tail_mask16(d - i);
        __m512 acc = _mm512_maskz_loadu_ps(mask, y + i);
#pragma GCC unroll 8
        for (int j = 0; j < keys; j++)
            acc = _mm512_fmadd_ps(a[j], load16_kv(vr[j], dtype, i, d - i), acc);
        _mm512_mask_storeu_ps(y + i, mask, acc);
    }
}

/* o[r] += the group's keys' p-weighted V rows (vr of `dtype`) in order: the first query row
 * reads the group key by key, from memory, the others chunk by chunk, from L1. */
AVX512 static inline __attribute__((always_inline)) void
axpys_group_avx512(eng_dtype dtype, float *const *o, int rows, const float *p, int64_t ldp,
                   const char *const *vr, int64_t keys, int64_t d)
{
    for (int r = 0; r < rows; r++) {
        __m512 a[KEY_GROUP];
#pragma GCC unroll 8
        for (int j = 0; j < KEY_GROUP; j++)
            a[j] = _mm512_set1_ps(j < keys ? p[r * ldp + j] : 0.0f);
        if (r == 0)
            axpys_keys_avx512(dtype, o[r], a, vr, keys, d);
        else
            axpys_chunks_avx512(dtype, o[r], a, vr, keys, d);
    }
}

/* Key group by key group; 16-bit rows read by several query rows are widened once first (the
 * same fp32 values in the same order: the same bits). */
AVX512 static inline __attribute__((always_inline)) void
dots_rows_avx512_of(eng_dtype dtype, const float *const *q, int rows, const void *k, int64_t ldk,
                    int64_t n, int64_t d, float scale, float *s, int64_t lds)
{
    float wide[KEY_GROUP * WIDEN_MAX];
    for (int64_t c0 = 0; c0 < n; c0 += KEY_GROUP) {
        const int64_t keys = n - c0 < KEY_GROUP ? n - c0 : KEY_GROUP;
        const char *kr[KEY_GROUP];
        group_rows(k, kv_size(dtype), ldk, c0, keys, kr);
        if (dtype != ENG_DTYPE_F32 && rows > 1 && d <= WIDEN_MAX) {
            widen_group_avx512(dtype, kr, d, wide);
            dots_group_avx512(ENG_DTYPE_F32, q, rows, kr, keys, d, scale, s + c0, lds);
        } else {
            dots_group_avx512(dtype, q, rows, kr, keys, d, scale, s + c0, lds);
        }
    }
}

AVX512 static inline __attribute__((always_inline)) void
axpys_rows_avx512_of(eng_dtype dtype, float *const *o, int rows, const float *p, int64_t ldp,
                     const void *v, int64_t ldv, int64_t n, int64_t d)
{
    float wide[KEY_GROUP * WIDEN_MAX];
    for (int64_t c0 = 0; c0 < n; c0 += KEY_GROUP) {
        const int64_t keys = n - c0 < KEY_GROUP ? n - c0 : KEY_GROUP;
        const char *vr[KEY_GROUP];
        group_rows(v, kv_size(dtype), ldv, c0, keys, vr);
        if (dtype != ENG_DTYPE_F32 && rows > 1 && d <= WIDEN_MAX) {
            widen_group_avx512(dtype, vr, d, wide);
            axpys_group_avx512(ENG_DTYPE_F32, o, rows, p + c0, ldp, vr, keys, d);
        } else {
            axpys_group_avx512(dtype, o, rows, p + c0, ldp, vr, keys, d);
        }
    }
}

AVX512 static void dots_rows_avx512(const float *const *q, int rows, const void *k, eng_dtype dtype,
                                    int64_t ldk, int64_t n, int64_t d, float scale, float *s,
                                    int64_t lds)
{
    BY_KV_DTYPE(dtype, dots_rows_avx512_of, q, rows, k, ldk, n, d, scale, s, lds);
}

AVX512 static void axpys_rows_avx512(float *const *o, int rows, const float *p, int64_t ldp,
                                     const void *v, eng_dtype dtype, int64_t ldv, int64_t n,
                                     int64_t d)
{
    BY_KV_DTYPE(dtype, axpys_rows_avx512_of, o, rows, p, ldp, v, ldv, n, d);
}

/* A key block of a bf16 cache for one query row, heads of a multiple of 32 (dots_bf16_pairs).
 * 32 bf16 values load as 16 32-bit words: a word shifted left by 16 is the float of its even
 * element, the word with its low half cleared the float of its odd one. So q (and o) are split
 * once per block into even and odd lanes, and each key costs one load and two integer
 * operations per 32 elements, no widening shuffle; a chunk of 128 elements of q (or o) stays
 * in registers over all the keys. */
AVX512 static inline void split_even_odd(const float *x, __m512 *even, __m512 *odd)
{
    const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i io = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    __m512 lo = _mm512_loadu_ps(x), hi = _mm512_loadu_ps(x + 16);
    *even = _mm512_permutex2var_ps(lo, ie, hi);
    *odd = _mm512_permutex2var_ps(lo, io, hi);
}

AVX512 static void dots_bf16_pairs_avx512(const float *q, const uint16_t *k, int64_t ldk, int64_t n,
                                          int64_t d, float scale, float *s)
{
    const __m512i high = _mm512_set1_epi32((int)0xFFFF0000u);
    for (int64_t c = 0; c < n; c++)
        s[c] = 0.0f;
    for (int64_t d0 = 0; d0 < d; d0 += 128) {
        const int pairs = (int)((d - d0 < 128 ? d - d0 : 128) / 32);
        __m512 qe[4], qo[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            qe[j] = qo[j] = _mm512_setzero_ps();
            if (j < pairs)
                split_even_odd(q + d0 + 32 * j, &qe[j], &qo[j]);
        }
        for (int64_t c = 0; c < n; c++) {
            const uint16_t *row = k + c * ldk + d0;
            __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                if (j >= pairs)
                    break;
                __m512i x = _mm512_loadu_si512((const void *)(row + 32 * j));
                acc0 = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(x, 16)), qe[j], acc0);
                acc1 = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(x, high)), qo[j], acc1);
            }
            s[c] += _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
        }
    }
    for (int64_t c = 0; c < n; c++)
        s[c] *= scale;
}

AVX512 static void axpys_bf16_pairs_avx512(float *o, const float *p, const uint16_t *v, int64_t ldv,
                                           int64_t n, int64_t d)
{
    const __m512i high = _mm512_set1_epi32((int)0xFFFF0000u);
    const __m512i lo_idx =
        _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i hi_idx =
        _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    for (int64_t d0 = 0; d0 < d; d0 += 128) {
        const int pairs = (int)((d - d0 < 128 ? d - d0 : 128) / 32);
        __m512 oe[4], oo[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++)
            oe[j] = oo[j] = _mm512_setzero_ps();
        for (int64_t c = 0; c < n; c++) {
            const uint16_t *row = v + c * ldv + d0;
            const __m512 pc = _mm512_set1_ps(p[c]);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                if (j >= pairs)
                    break;
                __m512i x = _mm512_loadu_si512((const void *)(row + 32 * j));
                oe[j] = _mm512_fmadd_ps(pc, _mm512_castsi512_ps(_mm512_slli_epi32(x, 16)), oe[j]);
                oo[j] = _mm512_fmadd_ps(pc, _mm512_castsi512_ps(_mm512_and_si512(x, high)), oo[j]);
            }
        }
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            if (j >= pairs)
                break;
            float *out = o + d0 + 32 * j;
            __m512 lo = _mm512_permutex2var_ps(oe[j], lo_idx, oo[j]);
            __m512 hi = _mm512_permutex2var_ps(oe[j], hi_idx, oo[j]);
            _mm512_storeu_ps(out, _mm512_add_ps(_mm512_loadu_ps(out), lo));
            _mm512_storeu_ps(out + 16, _mm512_add_ps(_mm512_loadu_ps(out + 16), hi));
        }
    }
}

static const eng__vec_ops avx512_ops = {
    .name = "avx512",
    .max = max_avx512,
    .exp_sum = exp_sum_avx512,
    .exp_sum_max = exp_sum_max_avx512,
    .exp_store = exp_store_avx512,
    .softcap = softcap_avx512,
    .tanh_dot = tanh_dot_avx512,
    .dots_rows = dots_rows_avx512,
    .axpys_rows = axpys_rows_avx512,
    .dots_bf16_pairs = dots_bf16_pairs_avx512,
    .axpys_bf16_pairs = axpys_bf16_pairs_avx512,
};

/* ---- Dispatch -------------------------------------------------------------------------------- */

const eng__vec_ops *eng__vec_variant(const char *name)
{
    if (strcmp(name, "scalar") == 0)
        return &scalar_ops;
    if (strcmp(name, "avx2") == 0)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? &avx2_ops : NULL;
    if (strcmp(name, "avx512") == 0)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") ? &avx512_ops
                                                                                       : NULL;
    return NULL;
}

/* The vector kernels of the kernel set in use (kernels.c): one choice for the whole engine. */
const eng__vec_ops *eng__vec(void)
{
    return eng__kernels_current()->vec;
}
