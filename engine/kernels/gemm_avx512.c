/*
 * gemm_avx512.c - the AVX-512F micro-kernel: a 12 x 32 tile of C in 24 zmm accumulators.
 *
 * Each step of k loads one row of the packed B panel (two zmm) and broadcasts twelve
 * elements of A, one per row, into 24 independent FMAs. Skylake-class cores retire two
 * 512-bit FMAs per cycle with a latency of four: 24 chains keep both ports busy with room to
 * spare, and 24 + 2 + 1 registers fit in the 32 zmm. Loads are 2 + 12 per 24 FMAs (the
 * broadcasts fold into the FMAs), within the two load ports. Ragged edges use masked stores.
 *
 * The wide tile (6 x 64) serves the flash loop's two products (engine/sdpa/sdpa_products.c): S = Q
 * K^T over two K^T panels at once, and O += P V over two V panels or over V's rows where they lie
 * (wide_rows: any row stride, masked loads that stop at column n), whole key range in one
 * depth; and the GEMM driver (gemm.c) runs every other product of the set on it, over pairs of
 * panels. One broadcast of A then feeds four FMAs instead of two, so a step loads 4 + 6 per 24
 * FMAs, each row of A is read once per 64 columns instead of once per 32, and a tile of one or
 * two rows (a ragged panel, a decode row) computes 6 rows, not 12.
 *
 * Compiled with a target attribute, not a file-wide -mavx512f, so the one binary runs on CPUs
 * without AVX-512: the dispatcher (kernels.c) calls this only when cpuid and XCR0 allow.
 */
#include <immintrin.h>

#include "engine/kernels/kernels.h"
#include "engine/kernels/tile_avx512.h"

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

enum { WIDE_MR = ENG__AVX512_WIDE_MR, WIDE_VECS = 4 };

/* The wide tile: B's columns [0, 32) of row p at b + p ldb, [32, 64) at b + b_half + p ldb.
 * `masked` (a constant at each call) loads B with masks that read no column past n, for rows in
 * place; whole panels load without them (gcc would otherwise reload the masks from the stack
 * at every step: four more uops per 24 FMAs). */
AVX512 static inline __attribute__((always_inline)) void
wide_tile(int64_t k, const float *a, int64_t lda, const float *b, int64_t ldb, int64_t b_half,
          bool masked, float *c, int64_t ldc, float alpha, float beta, int m, int n)
{
    /* Rows past m read row m - 1 again (never stored), so that A needs only m rows. */
    const float *row[WIDE_MR];
#pragma GCC unroll 6
    for (int r = 0; r < WIDE_MR; r++)
        row[r] = a + (r < m ? r : m - 1) * lda;
    const __mmask16 mask[WIDE_VECS] = {eng__lanes16(n), eng__lanes16(n - 16), eng__lanes16(n - 32),
                                       eng__lanes16(n - 48)};
    __m512 acc[WIDE_MR][WIDE_VECS];
#pragma GCC unroll 6
    for (int r = 0; r < WIDE_MR; r++)
#pragma GCC unroll 4
        for (int v = 0; v < WIDE_VECS; v++)
            acc[r][v] = _mm512_setzero_ps();
    const float *b2 = b + b_half;
    for (int64_t p = 0; p < k; p++, b += ldb, b2 += ldb) {
        const float *at[WIDE_VECS] = {b, b + 16, b2, b2 + 16};
        __m512 bv[WIDE_VECS];
#pragma GCC unroll 4
        for (int v = 0; v < WIDE_VECS; v++)
            bv[v] = masked ? _mm512_maskz_loadu_ps(mask[v], at[v]) : _mm512_loadu_ps(at[v]);
#pragma GCC unroll 6
        for (int r = 0; r < WIDE_MR; r++) {
            __m512 av = _mm512_set1_ps(row[r][p]);
#pragma GCC unroll 4
            for (int v = 0; v < WIDE_VECS; v++)
                acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
        }
    }
    __m512 al = _mm512_set1_ps(alpha);
#pragma GCC unroll 6
    for (int r = 0; r < WIDE_MR; r++)
        if (r < m) {
            eng__store_tile_row(c + r * ldc, acc[r][0], acc[r][1], al, beta, mask[0], mask[1]);
            eng__store_tile_row(c + r * ldc + NR, acc[r][2], acc[r][3], al, beta, mask[2], mask[3]);
        }
}

AVX512 void eng__tile_avx512_wide(int64_t k, const float *a, int64_t lda, const float *b,
                                  int64_t b_panel_stride, float *c, int64_t ldc, float alpha,
                                  float beta, int m, int n)
{
    wide_tile(k, a, lda, b, NR, b_panel_stride, false, c, ldc, alpha, beta, m, n);
}

AVX512 void eng__tile_avx512_wide_rows(int64_t k, const float *a, int64_t lda, const float *b,
                                       int64_t ldb, float *c, int64_t ldc, float alpha, float beta,
                                       int m, int n)
{
    if (n >= 2 * NR)
        wide_tile(k, a, lda, b, ldb, NR, false, c, ldc, alpha, beta, m, n);
    else
        wide_tile(k, a, lda, b, ldb, NR, true, c, ldc, alpha, beta, m, n);
}

/* r[0..16) transposed in registers: row i of the result is column i of the input. Three
 * rounds of shuffles, each within or across the 128-bit lanes. */
AVX512 static inline void transpose16(__m512 r[16])
{
    __m512 t[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    /* Then r[4 i + c] holds rows 4i..4i+3 at column 4 l + c in its 128-bit lane l. */
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        __m512d t0 = _mm512_castps_pd(t[4 * i]), t1 = _mm512_castps_pd(t[4 * i + 1]);
        __m512d t2 = _mm512_castps_pd(t[4 * i + 2]), t3 = _mm512_castps_pd(t[4 * i + 3]);
        r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
        r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
        r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
        r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
    }
    /* Lane l of the four registers r[c], r[4 + c], r[8 + c], r[12 + c] is column 4 l + c. */
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        __m512 even_lo = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88);
        __m512 odd_lo = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xDD);
        __m512 even_hi = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
        __m512 odd_hi = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xDD);
        t[c] = _mm512_shuffle_f32x4(even_lo, even_hi, 0x88);
        t[4 + c] = _mm512_shuffle_f32x4(odd_lo, odd_hi, 0x88);
        t[8 + c] = _mm512_shuffle_f32x4(even_lo, even_hi, 0xDD);
        t[12 + c] = _mm512_shuffle_f32x4(odd_lo, odd_hi, 0xDD);
    }
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++)
        r[i] = t[i];
}

AVX512 void eng__pack_trans_avx512(const float *b, int64_t ldb, int64_t k, int cols, float *dst)
{
    for (int64_t p0 = 0; p0 < k; p0 += 16) {
        int depth = (int)(k - p0 < 16 ? k - p0 : 16);
        __mmask16 along = eng__lanes16(depth);
        for (int half = 0; half < NR; half += 16) {
            __m512 r[16];
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++)
                r[i] = half + i < cols ? _mm512_maskz_loadu_ps(along, b + (half + i) * ldb + p0)
                                       : _mm512_setzero_ps();
            transpose16(r);
            for (int i = 0; i < depth; i++)
                _mm512_store_ps(dst + (p0 + i) * NR + half, r[i]);
        }
    }
}
