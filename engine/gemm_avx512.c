/*
 * gemm_avx512.c - the AVX-512F micro-kernel: a 12 x 32 tile of C in 24 zmm accumulators.
 *
 * Each step of k loads one row of the packed B panel (two zmm) and broadcasts twelve
 * elements of A, one per row, into 24 independent FMAs. Skylake-class cores retire two
 * 512-bit FMAs per cycle with a latency of four: 24 chains keep both ports busy with room to
 * spare, and 24 + 2 + 1 registers fit in the 32 zmm. Loads are 2 + 12 per 24 FMAs (the
 * broadcasts fold into the FMAs), within the two load ports. Ragged edges use masked stores.
 *
 * Compiled with a target attribute, not a file-wide -mavx512f, so the one binary runs on CPUs
 * without AVX-512: the dispatcher (kernels.c) calls this only when cpuid and XCR0 allow.
 */
#include <immintrin.h>

#include "engine/kernels.h"
#include "engine/tile_avx512.h"

#define AVX512 __attribute__((target("avx512f")))

enum { MR = ENG__AVX512_MR, NR = ENG__AVX512_NR };

AVX512 void eng__tile_avx512(int64_t k, const float *a, int64_t lda, const float *b, float *c,
                             int64_t ldc, float alpha, float beta, int m, int n)
{
    __m512 c0[MR], c1[MR];
#pragma GCC unroll 12
    for (int r = 0; r < MR; r++)
        c0[r] = c1[r] = _mm512_setzero_ps();
    for (int64_t p = 0; p < k; p++, b += NR) {
        __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
#pragma GCC unroll 12
        for (int r = 0; r < MR; r++) {
            __m512 av = _mm512_set1_ps(a[r * lda + p]);
            c0[r] = _mm512_fmadd_ps(av, b0, c0[r]);
            c1[r] = _mm512_fmadd_ps(av, b1, c1[r]);
        }
    }
    __m512 al = _mm512_set1_ps(alpha);
    __mmask16 m0 = eng__lanes16(n), m1 = eng__lanes16(n - 16);
    /* Constant indices after unrolling keep the accumulators in registers. */
#pragma GCC unroll 12
    for (int r = 0; r < MR; r++)
        if (r < m)
            eng__store_tile_row(c + r * ldc, c0[r], c1[r], al, beta, m0, m1);
}
