/*
 * tile_avx512.h - what the AVX-512 micro-kernels (gemm_avx512.c, gemm_bf16_avx512.c) share:
 * the lane mask of a ragged tile edge and the store of one row of the 12 x 32 tile; and the
 * wide 6 x 64 tile and transposing packer, which kernels.c offers as the avx512 set's
 * capabilities (eng__kernels.wide, .pack_trans).
 *
 *     __mmask16 m0 = eng__lanes16(n), m1 = eng__lanes16(n - 16);
 *     eng__store_tile_row(c + r * ldc, acc0[r], acc1[r], _mm512_set1_ps(alpha), beta, m0, m1);
 *
 * Only they and kernels.c include it; the functions carry the avx512f target, so that they inline
 * into kernels compiled for AVX-512F (or a superset) in a binary built for any x86-64.
 */
#ifndef ATTND_ENGINE_KERNELS_TILE_AVX512_H
#define ATTND_ENGINE_KERNELS_TILE_AVX512_H

#include <immintrin.h>
#include <stdint.h>

/* The rows of the wide tile: 6 x 64 in 24 zmm accumulators. */
#define ENG__AVX512_WIDE_MR 6

/* C[m x n] = alpha * A[m x k] B[k x 64] + beta * C with a 6 x 64 register tile (1 <= m <= 6,
 * 1 <= n <= 64), for products with B in the avx512 set's packed panels of 32
 * columns: B's columns [0, 32) are the panel at b (row p at b + 32 p, 64-byte aligned) and
 * [32, 64) the panel at b + b_panel_stride (0 when n <= 32 and no second panel exists), both
 * readable for k rows. A is row-major with row stride lda; only its first m rows are read.
 * beta == 0 never reads C; columns past n are not stored. Only call it where AVX-512F runs
 * (the avx512 kernel set). */
void eng__tile_avx512_wide(int64_t k, const float *a, int64_t lda, const float *b,
                           int64_t b_panel_stride, float *c, int64_t ldc, float alpha, float beta,
                           int m, int n);

/* The same with B's k rows where they lie: row p at b + p ldb, its first n columns read and
 * none past them. Any alignment is correct; rows on 64-byte boundaries run fastest (no load
 * splits a cache line), so O += P V takes V in place only when its rows are. */
void eng__tile_avx512_wide_rows(int64_t k, const float *a, int64_t lda, const float *b, int64_t ldb,
                                float *c, int64_t ldc, float alpha, float beta, int m, int n);

/* One packed panel of the avx512 set from B^T rows: dst[p * 32 + j] = b[j * ldb + p] for the
 * first `cols` (1..32) rows j of b and depths p < k, zero in the columns past cols. dst is
 * 64-byte aligned; b needs no alignment and only its first cols rows, k floats each, are
 * read. 16 x 16 blocks transposed in registers, where the scalar packing wrote one float per
 * element 128 bytes apart. Only call it where AVX-512F runs. */
void eng__pack_trans_avx512(const float *b, int64_t ldb, int64_t k, int cols, float *dst);

/* The first n of 16 lanes (none for n <= 0, all for n >= 16). */
__attribute__((target("avx512f"))) static inline __mmask16 eng__lanes16(int n)
{
    unsigned bits = n >= 16 ? 0xFFFFu : n <= 0 ? 0u : (1u << n) - 1u;
    return (__mmask16)bits;
}

/* c[0..32) = alpha * (x0, x1) + beta * c, masked to the lanes m0, m1; beta == 0 never reads c
 * (it may hold NaN). */
__attribute__((target("avx512f"))) static inline void eng__store_tile_row(float *c, __m512 x0,
                                                                          __m512 x1, __m512 alpha,
                                                                          float beta, __mmask16 m0,
                                                                          __mmask16 m1)
{
    x0 = _mm512_mul_ps(alpha, x0);
    x1 = _mm512_mul_ps(alpha, x1);
    if (beta != 0.0f) {
        __m512 b = _mm512_set1_ps(beta);
        x0 = _mm512_fmadd_ps(b, _mm512_maskz_loadu_ps(m0, c), x0);
        x1 = _mm512_fmadd_ps(b, _mm512_maskz_loadu_ps(m1, c + 16), x1);
    }
    _mm512_mask_storeu_ps(c, m0, x0);
    _mm512_mask_storeu_ps(c + 16, m1, x1);
}

#endif
