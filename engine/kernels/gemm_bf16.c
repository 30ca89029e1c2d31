/*
 * gemm_bf16.c - bf16 products with fp32 accumulation: the pair packing of B and the driver
 * around the bf16 micro-kernel (gemm_bf16_avx512.c).
 *
 * VDPBF16PS multiplies pairs: lane j of the accumulator gains a[2i] b[2i][j] + a[2i+1]
 * b[2i+1][j]. So B is packed with two consecutive depths of one column side by side, and A
 * (row-major bf16, the attention's Q block or P panel, converted by the caller) is read as one
 * 32-bit pair per broadcast. The products are short (depth D for the scores, at most one key
 * block for P V), so there is no depth blocking: a panel of B is at most a block's keys deep.
 */
#include <immintrin.h>
#include <string.h>

#include "engine/kernels/kernels.h"

int64_t eng__bf16_panel_stride(int64_t nr, int64_t k)
{
    return (k + 1) / 2 * 2 * nr;
}

size_t eng__bf16_panels_elems(int64_t nr, int64_t n, int64_t k)
{
    return (size_t)((n + nr - 1) / nr * eng__bf16_panel_stride(nr, k));
}

/* The pair packing of both entry points below, B's elements fp32 rounded to bf16, or bf16
 * bits copied when `bits`: the element fetch is all that differs. Inlined into each (forced,
 * as pack_b in gemm.c), so that the constant `bits` picks its loop with no test per element. */
static inline __attribute__((always_inline)) void pack_pairs(int64_t nr, const void *b, bool bits,
                                                             int64_t ldb, bool b_trans, int64_t k,
                                                             int64_t n, uint16_t *dst)
{
    const int64_t stride = eng__bf16_panel_stride(nr, k);
    for (int64_t q = 0; q < n; q += nr, dst += stride) {
        int64_t cols = n - q < nr ? n - q : nr;
        if (cols < nr || k % 2)
            memset(dst, 0, (size_t)stride * sizeof *dst);
        for (int64_t p = 0; p < k; p++) {
            uint16_t *row = dst + p / 2 * 2 * nr + p % 2;
            for (int64_t j = 0; j < cols; j++) {
                int64_t at = b_trans ? (q + j) * ldb + p : p * ldb + q + j;
                row[2 * j] =
                    bits ? ((const uint16_t *)b)[at] : eng_f32_to_bf16(((const float *)b)[at]);
            }
        }
    }
}

void eng__bf16_pack_panels(int64_t nr, const float *b, int64_t ldb, bool b_trans, int64_t k,
                           int64_t n, uint16_t *dst)
{
    pack_pairs(nr, b, false, ldb, b_trans, k, n, dst);
}

void eng__bf16_pack_panels16(int64_t nr, const uint16_t *b, int64_t ldb, bool b_trans, int64_t k,
                             int64_t n, uint16_t *dst)
{
    pack_pairs(nr, b, true, ldb, b_trans, k, n, dst);
}

void eng__sgemm_bf16(const eng__kernels *ks, const eng__gemm_bf16 *g)
{
    const int64_t mr = ks->mr, nr = ks->nr;
    for (int64_t i = 0; i < g->m; i += mr) {
        int rows = (int)(g->m - i < mr ? g->m - i : mr);
        for (int64_t q = 0; q < g->n; q += nr) {
            int cols = (int)(g->n - q < nr ? g->n - q : nr);
            ks->tile_bf16(g->kp, g->a + i * g->lda, g->lda, g->b + q / nr * g->b_panel_stride,
                          g->c + i * g->ldc + q, g->ldc, g->alpha, g->beta, rows, cols);
        }
    }
}

/* Bit operations only: add half an ulp of bf16 (less one, plus the kept lowest bit, for ties
 * to even) and cut the low half; a NaN stays a quiet NaN. The emulated path rounds every
 * probability it multiplies, so each instruction set has its own loop. */
void eng__bf16_round_floats(float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof u);
        uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
        uint32_t nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
        u = nan ? (u | 0x00400000u) & 0xFFFF0000u : rounded;
        memcpy(&x[i], &u, sizeof u);
    }
}

__attribute__((target("avx512f"))) void eng__bf16_round_floats_avx512(float *x, int64_t n)
{
    const __m512i one = _mm512_set1_epi32(1), half = _mm512_set1_epi32(0x7FFF),
                  high = _mm512_set1_epi32((int)0xFFFF0000u), quiet = _mm512_set1_epi32(0x400000);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 lanes = (__mmask16)(n - i >= 16 ? 0xFFFFu : (1u << (n - i)) - 1u);
        __m512 v = _mm512_maskz_loadu_ps(lanes, x + i);
        __m512i u = _mm512_castps_si512(v);
        __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
        __m512i r = _mm512_and_si512(_mm512_add_epi32(_mm512_add_epi32(u, half), lsb), high);
        __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        r = _mm512_mask_mov_epi32(r, nan, _mm512_and_si512(_mm512_or_si512(u, quiet), high));
        _mm512_mask_storeu_ps(x + i, lanes, _mm512_castsi512_ps(r));
    }
}

__attribute__((target("avx2"))) void eng__bf16_round_floats_avx2(float *x, int64_t n)
{
    const __m256i one = _mm256_set1_epi32(1), half = _mm256_set1_epi32(0x7FFF),
                  high = _mm256_set1_epi32((int)0xFFFF0000u), quiet = _mm256_set1_epi32(0x400000);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256i u = _mm256_castps_si256(v);
        __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
        __m256i r = _mm256_and_si256(_mm256_add_epi32(_mm256_add_epi32(u, half), lsb), high);
        __m256i q = _mm256_and_si256(_mm256_or_si256(u, quiet), high);
        __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
        r = _mm256_castps_si256(
            _mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(q), nan));
        _mm256_storeu_ps(x + i, _mm256_castsi256_ps(r));
    }
    eng__bf16_round_floats(x + i, n - i);
}
