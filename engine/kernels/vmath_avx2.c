/* vmath_avx2.c - the vector kernels (vmath.h) in AVX2 + FMA (and F16C for f16 rows). */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "engine/kernels/vmath.h"

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

/* One vector of exp_sum_max_avx2: v's NaNs and maximum noted, exp(v - s) returned. */
AVX2 static inline __m256 exp_max8(__m256 v, __m256 s, __m256 *m, __m256 *nan)
{
    *nan = _mm256_or_ps(*nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    *m = _mm256_max_ps(*m, v);
    return exp8(_mm256_sub_ps(v, s));
}

/* Whole vectors load and store plainly; only the tail is masked, since AMD's cores run masked
 * stores as microcode. */
AVX2 static float exp_sum_max_avx2(float *x, int64_t n, float shift, float *max)
{
    __m256 s = _mm256_set1_ps(shift), acc = _mm256_setzero_ps();
    __m256 m = _mm256_set1_ps(-INFINITY), nan = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp_max8(_mm256_loadu_ps(x + i), s, &m, &nan);
        _mm256_storeu_ps(x + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    if (i < n) {
        __m256i mask = tail_mask8(n - i);
        __m256 v = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_maskload_ps(x + i, mask),
                                    _mm256_castsi256_ps(mask));
        __m256 e = exp_max8(v, s, &m, &nan); /* -inf in the tail lanes gives 0 */
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
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = _mm256_mul_ps(exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), s)), m);
        if (accumulate)
            e = _mm256_add_ps(e, _mm256_loadu_ps(dst + i));
        _mm256_storeu_ps(dst + i, e);
    }
    if (i < n) {
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
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i,
                         _mm256_mul_ps(c, tanh8(_mm256_mul_ps(_mm256_loadu_ps(x + i), inv))));
    if (i < n) {
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
            if (keys == KEY_GROUP) /* a plain store: Zen runs masked ones as microcode */
                _mm256_storeu_ps(s + r * lds + c0, sums);
            else
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

const eng__vec_ops eng__vec_avx2 = {
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
