/*
 * gemv_avx2.c - few-row products (kernels.h, eng__gemv) in AVX2 + FMA, with F16C for float16
 * weights, which every CPU with AVX2 and FMA has.
 *
 * Four weight rows against two input rows at a time: each weight vector is loaded (and
 * widened) once for both rows, and the eight accumulators are independent FMA chains, enough
 * to keep a one-row product at the memory's pace. Each output is one accumulator over k, eight
 * elements a step, reduced by one tree, whichever block it is computed in. Compiled with a
 * target attribute; eng__gemv_variant calls it only where the CPU has the instructions.
 */
#include <immintrin.h>
#include <string.h>

#include "engine/kernels/kernels.h"

#define AVX2   __attribute__((target("avx2,fma,f16c")))
#define INLINE AVX2 static inline __attribute__((always_inline))

enum { LANES = 8, FEATURES = 4, ROWS = 2 };

/* Round to the nearest bf16, ties to even; a NaN stays a quiet NaN (eng__bf16_round_floats). */
INLINE __m256 round_bf16(__m256 v)
{
    const __m256i one = _mm256_set1_epi32(1), half = _mm256_set1_epi32(0x7FFF),
                  high = _mm256_set1_epi32((int)0xFFFF0000u), quiet = _mm256_set1_epi32(0x400000);
    __m256i u = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
    __m256i r = _mm256_and_si256(_mm256_add_epi32(_mm256_add_epi32(u, half), lsb), high);
    __m256i q = _mm256_and_si256(_mm256_or_si256(u, quiet), high);
    __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    return _mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(q), nan);
}

/* Eight 16-bit weights widened exactly: bf16 is the high half of a float. */
INLINE __m256 widen8(__m128i h, eng_dtype dtype)
{
    if (dtype == ENG_DTYPE_F16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* Weight elements [i, i + 8) of row w. */
INLINE __m256 load_w(const void *w, eng_dtype dtype, int64_t i, bool round)
{
    __m256 v = dtype == ENG_DTYPE_F32
                   ? _mm256_loadu_ps((const float *)w + i)
                   : widen8(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + i)), dtype);
    return round && dtype != ENG_DTYPE_BF16 ? round_bf16(v) : v;
}

/* The last `left` (1 to 7) weight elements of row w from i, lanes past them 0. */
INLINE __m256 load_w_tail(const void *w, eng_dtype dtype, int64_t i, int64_t left, __m256i mask,
                          bool round)
{
    __m256 v;
    if (dtype == ENG_DTYPE_F32) {
        v = _mm256_maskload_ps((const float *)w + i, mask);
    } else {
        uint16_t tmp[LANES] = {0};
        memcpy(tmp, (const uint16_t *)w + i, (size_t)left * sizeof *tmp);
        v = widen8(_mm_loadu_si128((const __m128i *)tmp), dtype);
    }
    return round && dtype != ENG_DTYPE_BF16 ? round_bf16(v) : v;
}

/* Lanes l and l + 4, then l and l + 2, then the two left: the tree of gemv.c. */
INLINE float sum_lanes(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* Features f .. f + nf - 1 for rows r0 .. r0 + nr - 1 (nf <= FEATURES, nr <= ROWS; constants
 * once inlined, so the accumulators stay in registers). */
INLINE void block(const eng__gemv *g, int64_t f, int r0, int nf, int nr, eng_dtype dtype,
                  bool round)
{
    const size_t size = dtype == ENG_DTYPE_F32 ? sizeof(float) : sizeof(uint16_t);
    const unsigned char *w[FEATURES];
    for (int j = 0; j < nf; j++)
        w[j] = (const unsigned char *)g->w + (size_t)((f + j) * g->ldw) * size;
    const float *x0 = g->x[r0], *x1 = nr > 1 ? g->x[r0 + 1] : x0;
    __m256 acc[ROWS][FEATURES];
#pragma GCC unroll 4
    for (int j = 0; j < FEATURES; j++)
        acc[0][j] = acc[1][j] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + LANES <= g->k; i += LANES) {
        __m256 a0 = _mm256_loadu_ps(x0 + i), a1 = nr > 1 ? _mm256_loadu_ps(x1 + i) : a0;
#pragma GCC unroll 4
        for (int j = 0; j < nf; j++) {
            __m256 b = load_w(w[j], dtype, i, round);
            acc[0][j] = _mm256_fmadd_ps(a0, b, acc[0][j]);
            if (nr > 1)
                acc[1][j] = _mm256_fmadd_ps(a1, b, acc[1][j]);
        }
    }
    if (i < g->k) {
        int64_t left = g->k - i;
        __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)left),
                                          _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        __m256 a0 = _mm256_maskload_ps(x0 + i, mask);
        __m256 a1 = nr > 1 ? _mm256_maskload_ps(x1 + i, mask) : a0;
#pragma GCC unroll 4
        for (int j = 0; j < nf; j++) {
            __m256 b = load_w_tail(w[j], dtype, i, left, mask, round);
            acc[0][j] = _mm256_fmadd_ps(a0, b, acc[0][j]);
            if (nr > 1)
                acc[1][j] = _mm256_fmadd_ps(a1, b, acc[1][j]);
        }
    }
#pragma GCC unroll 2
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 4
        for (int j = 0; j < nf; j++) {
            float s = sum_lanes(acc[r][j]);
            g->y[r0 + r][f + j] = g->bias ? s + g->bias[f + j] : s;
        }
}

INLINE void run(const eng__gemv *g, eng_dtype dtype, bool round)
{
    int64_t f = 0;
    for (; f + FEATURES <= g->n; f += FEATURES) {
        int r = 0;
        for (; r + ROWS <= g->rows; r += ROWS)
            block(g, f, r, FEATURES, ROWS, dtype, round);
        if (r < g->rows)
            block(g, f, r, FEATURES, 1, dtype, round);
    }
    for (; f < g->n; f++) {
        int r = 0;
        for (; r + ROWS <= g->rows; r += ROWS)
            block(g, f, r, 1, ROWS, dtype, round);
        if (r < g->rows)
            block(g, f, r, 1, 1, dtype, round);
    }
}

/* One copy of the loops per weight type and rounding, each with its loads inlined. */
AVX2 static void run_f32(const eng__gemv *g)
{
    run(g, ENG_DTYPE_F32, false);
}

AVX2 static void run_f32_round(const eng__gemv *g)
{
    run(g, ENG_DTYPE_F32, true);
}

AVX2 static void run_bf16(const eng__gemv *g)
{
    run(g, ENG_DTYPE_BF16, false);
}

AVX2 static void run_f16(const eng__gemv *g)
{
    run(g, ENG_DTYPE_F16, false);
}

AVX2 static void run_f16_round(const eng__gemv *g)
{
    run(g, ENG_DTYPE_F16, true);
}

AVX2 void eng__gemv_avx2(const eng__gemv *g)
{
    if (g->dtype == ENG_DTYPE_BF16)
        run_bf16(g);
    else if (g->dtype == ENG_DTYPE_F16)
        (g->round_bf16 ? run_f16_round : run_f16)(g);
    else
        (g->round_bf16 ? run_f32_round : run_f32)(g);
}
