/*
 * gemm_bf16_avx512.c - the AVX512-BF16 micro-kernel: a 12 x 32 tile of C in 24 zmm fp32
 * accumulators, fed by VDPBF16PS, and the vector fp32 -> bf16 conversion.
 *
 * Each step consumes one pair of depths: two zmm of the pair-packed B panel (32 columns x 2
 * depths) and, per row of A, one broadcast 32-bit pair, into 24 VDPBF16PS of 32 products each:
 * twice the work of the fp32 kernel's step for the same instruction count. Compiled with a
 * target attribute; the dispatcher (kernels.c) calls it only when cpuid reports AVX512-BF16
 * and XCR0 has the zmm state.
 *
 * VCVTNE2PS2BF16 rounds to nearest even, as eng_f32_to_bf16 does, except that it treats fp32
 * denormals as zero: values below 1.2e-38, which change no attention output.
 */
#include <immintrin.h>
#include <string.h>

#include "engine/kernels/kernels.h"
#include "engine/kernels/tile_avx512.h"

#define BF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))

enum { MR = ENG__AVX512_MR, NR = ENG__AVX512_NR };

/* One bf16 pair of A as a 32-bit lane pattern (memcpy: A rows need no 4-byte alignment). */
static inline int pair_at(const uint16_t *a)
{
    int x;
    memcpy(&x, a, sizeof x);
    return x;
}

BF16 void eng__tile_bf16_avx512(int64_t kp, const uint16_t *a, int64_t lda, const uint16_t *b,
                                float *c, int64_t ldc, float alpha, float beta, int m, int n)
{
    __m512 c0[MR], c1[MR];
#pragma GCC unroll 12
    for (int r = 0; r < MR; r++)
        c0[r] = c1[r] = _mm512_setzero_ps();
    for (int64_t t = 0; t < kp; t++, b += 2 * NR) {
        __m512bh b0 = (__m512bh)_mm512_load_si512(b), b1 = (__m512bh)_mm512_load_si512(b + NR);
#pragma GCC unroll 12
        for (int r = 0; r < MR; r++) {
            __m512bh av = (__m512bh)_mm512_set1_epi32(pair_at(a + r * lda + 2 * t));
            c0[r] = _mm512_dpbf16_ps(c0[r], av, b0);
            c1[r] = _mm512_dpbf16_ps(c1[r], av, b1);
        }
    }
    __m512 al = _mm512_set1_ps(alpha);
    __mmask16 m0 = eng__lanes16(n), m1 = eng__lanes16(n - 16);
#pragma GCC unroll 12
    for (int r = 0; r < MR; r++)
        if (r < m)
            eng__store_tile_row(c + r * ldc, c0[r], c1[r], al, beta, m0, m1);
}

BF16 void eng__to_bf16_avx512(const float *x, int64_t n, uint16_t *dst)
{
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512bh h = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i));
        _mm512_storeu_si512(dst + i, (__m512i)h);
    }
    if (i < n) {
        int64_t left = n - i;
        __m512 lo = _mm512_maskz_loadu_ps(eng__lanes16((int)left), x + i);
        __m512 hi = _mm512_maskz_loadu_ps(eng__lanes16((int)left - 16), x + i + 16);
        __m512bh h = _mm512_cvtne2ps_pbh(hi, lo);
        /* The odd element's partner becomes the zero the masked load gave. */
        int64_t keep = left + (left & 1);
        __mmask32 mask = (__mmask32)(keep >= 32 ? 0xFFFFFFFFu : (1u << keep) - 1u);
        _mm512_mask_storeu_epi16(dst + i, mask, (__m512i)h);
    }
}
