/* vmath_avx512.c - the vector kernels (vmath.h) in AVX-512F + DQ (BF16 for the pair kernels). */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "engine/kernels/vmath.h"

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
 * (the one a query row reading them from memory needs: prefetchers follow sequential lines),
 * chunk by chunk loads each chunk of q once for the eight keys (for rows already in
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

const eng__vec_ops eng__vec_avx512 = {
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
