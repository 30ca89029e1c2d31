/*
 * gemm_avx2.c - the AVX2 + FMA micro-kernel: a 6 x 16 tile of C in 12 ymm accumulators.
 *
 * Each step of k loads one row of the packed B panel (two ymm) and broadcasts six elements of
 * A into 12 independent FMAs: two FMA ports with a latency of four or five need at least ten
 * chains, and 12 + 2 + 1 registers fit in the 16 ymm. Ragged edges use masked stores.
 *
 * Compiled with a target attribute, not a file-wide -mavx2, so the one binary runs anywhere;
 * the dispatcher (kernels.c) calls this only when cpuid and XCR0 allow.
 */
#include <immintrin.h>

#include "engine/kernels/kernels.h"

#define AVX2 __attribute__((target("avx2,fma")))

enum { MR = ENG__AVX2_MR, NR = ENG__AVX2_NR };

AVX2 static inline __m256i lanes(int n)
{
    __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx);
}

AVX2 static inline void store_row(float *c, __m256 x0, __m256 x1, __m256 alpha, float beta,
                                  __m256i m0, __m256i m1)
{
    x0 = _mm256_mul_ps(alpha, x0);
    x1 = _mm256_mul_ps(alpha, x1);
    if (beta != 0.0f) {
        __m256 b = _mm256_set1_ps(beta);
        x0 = _mm256_fmadd_ps(b, _mm256_maskload_ps(c, m0), x0);
        x1 = _mm256_fmadd_ps(b, _mm256_maskload_ps(c + 8, m1), x1);
    }
    _mm256_maskstore_ps(c, m0, x0);
    _mm256_maskstore_ps(c + 8, m1, x1);
}

/* store_row for a whole row of the tile: plain loads and stores, which AMD's cores retire at
 * the rate of any other, where the masked ones are microcoded. */
AVX2 static inline void store_full_row(float *c, __m256 x0, __m256 x1, __m256 alpha, float beta)
{
    x0 = _mm256_mul_ps(alpha, x0);
    x1 = _mm256_mul_ps(alpha, x1);
    if (beta != 0.0f) {
        __m256 b = _mm256_set1_ps(beta);
        x0 = _mm256_fmadd_ps(b, _mm256_loadu_ps(c), x0);
        x1 = _mm256_fmadd_ps(b, _mm256_loadu_ps(c + 8), x1);
    }
    _mm256_storeu_ps(c, x0);
    _mm256_storeu_ps(c + 8, x1);
}

AVX2 void eng__tile_avx2(int64_t k, const float *a, int64_t lda, const float *b, float *c,
                         int64_t ldc, float alpha, float beta, int m, int n)
{
    __m256 c0[MR], c1[MR];
#pragma GCC unroll 6
    for (int r = 0; r < MR; r++)
        c0[r] = c1[r] = _mm256_setzero_ps();
    for (int64_t p = 0; p < k; p++, b += NR) {
        __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
#pragma GCC unroll 6
        for (int r = 0; r < MR; r++) {
            __m256 av = _mm256_broadcast_ss(a + r * lda + p);
            c0[r] = _mm256_fmadd_ps(av, b0, c0[r]);
            c1[r] = _mm256_fmadd_ps(av, b1, c1[r]);
        }
    }
    __m256 al = _mm256_set1_ps(alpha);
    /* Constant indices after unrolling keep the accumulators in registers. */
    if (n == NR) {
#pragma GCC unroll 6
        for (int r = 0; r < MR; r++)
            if (r < m)
                store_full_row(c + r * ldc, c0[r], c1[r], al, beta);
        return;
    }
    __m256i m0 = lanes(n), m1 = lanes(n - 8);
#pragma GCC unroll 6
    for (int r = 0; r < MR; r++)
        if (r < m)
            store_row(c + r * ldc, c0[r], c1[r], al, beta, m0, m1);
}
