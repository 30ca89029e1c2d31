/*
 * gemv_avx512.c - few-row products (kernels.h, eng__gemv) in AVX-512F: gemv_avx2.c's loops
 * with 16 lanes, a mask for the tail of k, and the compiler's lane reduction.
 *
 * Compiled with a target attribute; eng__gemv_variant calls it only where the CPU has
 * AVX-512F and the OS saves its registers.
 */
#include <immintrin.h>
#include <string.h>

#include "engine/kernels/kernels.h"

#define AVX512 __attribute__((target("avx512f")))
#define INLINE AVX512 static inline __attribute__((always_inline))

enum { LANES = 16, FEATURES = 4, ROWS = 2 };

/* Round to the nearest bf16, ties to even; a NaN stays a quiet NaN (eng__bf16_round_floats). */
INLINE __m512 round_bf16(__m512 v)
{
    const __m512i one = _mm512_set1_epi32(1), half = _mm512_set1_epi32(0x7FFF),
                  high = _mm512_set1_epi32((int)0xFFFF0000u), quiet = _mm512_set1_epi32(0x400000);
    __m512i u = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
    __m512i r = _mm512_and_si512(_mm512_add_epi32(_mm512_add_epi32(u, half), lsb), high);
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_and_si512(_mm512_or_si512(u, quiet), high));
    return _mm512_castsi512_ps(r);
}

/* Sixteen 16-bit weights widened exactly: bf16 is the high half of a float. */
INLINE __m512 widen16(__m256i h, eng_dtype dtype)
{
    if (dtype == ENG_DTYPE_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* Weight elements [i, i + 16) of row w. */
INLINE __m512 load_w(const void *w, eng_dtype dtype, int64_t i, bool round)
{
    __m512 v = dtype == ENG_DTYPE_F32
                   ? _mm512_loadu_ps((const float *)w + i)
                   : widen16(_mm256_loadu_si256((const __m256i *)((const uint16_t *)w + i)), dtype);
    return round && dtype != ENG_DTYPE_BF16 ? round_bf16(v) : v;
}

/* The last `left` (1 to 15) weight elements of row w from i, lanes past them 0. */
INLINE __m512 load_w_tail(const void *w, eng_dtype dtype, int64_t i, int64_t left, __mmask16 mask,
                          bool round)
{
    __m512 v;
    if (dtype == ENG_DTYPE_F32) {
        v = _mm512_maskz_loadu_ps(mask, (const float *)w + i);
    } else {
        uint16_t tmp[LANES] = {0};
        memcpy(tmp, (const uint16_t *)w + i, (size_t)left * sizeof *tmp);
        v = widen16(_mm256_loadu_si256((const __m256i *)tmp), dtype);
    }
    return round && dtype != ENG_DTYPE_BF16 ? round_bf16(v) : v;
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
    __m512 acc[ROWS][FEATURES];
#pragma GCC unroll 4
    for (int j = 0; j < FEATURES; j++)
        acc[0][j] = acc[1][j] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + LANES <= g->k; i += LANES) {
        __m512 a0 = _mm512_loadu_ps(x0 + i), a1 = nr > 1 ? _mm512_loadu_ps(x1 + i) : a0;
#pragma GCC unroll 4
        for (int j = 0; j < nf; j++) {
            __m512 b = load_w(w[j], dtype, i, round);
            acc[0][j] = _mm512_fmadd_ps(a0, b, acc[0][j]);
            if (nr > 1)
                acc[1][j] = _mm512_fmadd_ps(a1, b, acc[1][j]);
        }
    }
    if (i < g->k) {
        int64_t left = g->k - i;
        __mmask16 mask = (__mmask16)((1u << left) - 1u);
        __m512 a0 = _mm512_maskz_loadu_ps(mask, x0 + i);
        __m512 a1 = nr > 1 ? _mm512_maskz_loadu_ps(mask, x1 + i) : a0;
#pragma GCC unroll 4
        for (int j = 0; j < nf; j++) {
            __m512 b = load_w_tail(w[j], dtype, i, left, mask, round);
            acc[0][j] = _mm512_fmadd_ps(a0, b, acc[0][j]);
            if (nr > 1)
                acc[1][j] = _mm512_fmadd_ps(a1, b, acc[1][j]);
        }
    }
#pragma GCC unroll 2
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 4
        for (int j = 0; j < nf; j++) {
            float s = _mm512_reduce_add_ps(acc[r][j]);
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
AVX512 static void run_f32(const eng__gemv *g)
{
    run(g, ENG_DTYPE_F32, false);
}

AVX512 static void run_f32_round(const eng__gemv *g)
{
    run(g, ENG_DTYPE_F32, true);
}

AVX512 static void run_bf16(const eng__gemv *g)
{
    run(g, ENG_DTYPE_BF16, false);
}

AVX512 static void run_f16(const eng__gemv *g)
{
    run(g, ENG_DTYPE_F16, false);
}

AVX512 static void run_f16_round(const eng__gemv *g)
{
    run(g, ENG_DTYPE_F16, true);
}

AVX512 void eng__gemv_avx512(const eng__gemv *g)
{
    if (g->dtype == ENG_DTYPE_BF16)
        run_bf16(g);
    else if (g->dtype == ENG_DTYPE_F16)
        (g->round_bf16 ? run_f16_round : run_f16)(g);
    else
        (g->round_bf16 ? run_f32_round : run_f32)(g);
}
