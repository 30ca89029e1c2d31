/*
 * gemm.c - the GEMM driver around the micro-kernels, the packing of B, and the portable C
 * micro-kernel (the reference the vector ones are tested against).
 *
 * Blocking (after Goto and van de Geijn, "Anatomy of high-performance matrix multiplication"):
 * B is packed kc x nc at a time into panels of NR columns, which then stay in L2 while every
 * MR-row tile of A passes over them. A is not packed: the micro-kernel broadcasts its elements
 * straight from the row-major rows, so the attention's P block is read where the softmax
 * wrote it and Q where the caller keeps it. Only a last tile of fewer than MR rows is copied
 * into zero-padded rows, so that the kernel may always read MR rows. A set with a wide tile
 * (eng__kernels.wide) runs it over pairs of panels instead, which reads only the rows it
 * computes.
 */
#include <cblas.h>
#include <string.h>

#include "engine/kernels/kernels.h"

static int64_t round_up(int64_t x, int64_t m)
{
    return (x + m - 1) / m * m;
}

static int64_t min64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

static int64_t ceil_div(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

size_t eng__sgemm_pack_floats(const eng__kernels *ks, int64_t n, int64_t k)
{
    if (!ks->tile)
        return 0;
    int64_t kc = min64(k, ks->kc), nc = round_up(min64(n, ks->nc), ks->nr);
    /* B panels, then the zero-padded rows of a ragged last tile of A. */
    return (size_t)(kc * nc + ks->mr * kc);
}

/* B's element at offset `at`: fp32, or bf16 bits widened (exactly) when `bits`; and n of them
 * from `at` on into dst (fp32 rows copied whole). */
static inline float b_element(const void *b, bool bits, int64_t at)
{
    return bits ? eng_bf16_to_f32(((const uint16_t *)b)[at]) : ((const float *)b)[at];
}

static inline void b_row(float *dst, const void *b, bool bits, int64_t at, int64_t n)
{
    if (!bits) {
        memcpy(dst, (const float *)b + at, (size_t)n * sizeof(float));
        return;
    }
    for (int64_t i = 0; i < n; i++)
        dst[i] = b_element(b, bits, at + i);
}

/* Packs B[p0..p0+kc) x [j0..j0+nc) (row stride ldb; [n x k] rows of B^T when b_trans) into
 * panels of set ks's NR columns: panel q holds rows p of NR consecutive columns, zero past
 * column n. B's elements are fp32, or bf16 bits when `bits`: the element fetch (b_element,
 * b_row) is all that differs between the GEMM's packing and that of bf16 views. Inlined at
 * each call (forced: gcc declines three copies), so that the constant `bits` picks the loop
 * there and the GEMM's own packing stays a plain fp32 copy, with no test per element. A set
 * with a transposing packer (pack_trans) packs fp32 B^T rows with it. */
static inline __attribute__((always_inline)) void pack_b(const eng__kernels *ks, const void *b,
                                                         bool bits, int64_t ldb, bool b_trans,
                                                         int64_t p0, int64_t kc, int64_t j0,
                                                         int64_t nc, float *dst)
{
    const int64_t nr = ks->nr;
    const bool trans_fast = b_trans && !bits && ks->pack_trans;
    for (int64_t q = 0; q < nc; q += nr, dst += kc * nr) {
        int64_t cols = min64(nr, nc - q);
        if (trans_fast) {
            ks->pack_trans((const float *)b + (j0 + q) * ldb + p0, ldb, kc, (int)cols, dst);
        } else if (b_trans) {
            /* B^T rows: column j of B is row j of the input, read along its length. */
            if (cols < nr)
                memset(dst, 0, (size_t)(kc * nr) * sizeof(float));
            for (int64_t j = 0; j < cols; j++) {
                const int64_t at = (j0 + q + j) * ldb + p0;
                for (int64_t p = 0; p < kc; p++)
                    dst[p * nr + j] = b_element(b, bits, at + p);
            }
        } else {
            for (int64_t p = 0; p < kc; p++) {
                b_row(dst + p * nr, b, bits, (p0 + p) * ldb + j0 + q, cols);
                if (cols < nr)
                    memset(dst + p * nr + cols, 0, (size_t)(nr - cols) * sizeof(float));
            }
        }
    }
}

/* A set's wide tile over pairs of panels instead of its `tile`: one broadcast of A feeds four
 * FMAs, and the tile reads only the rows it computes, so a ragged last tile needs no
 * zero-padded copy. Row-outer: the 6-row tile reads A's rows from L1 either way. */
static void tiles_wide(const eng__kernels *ks, const eng__gemm *g, int64_t p0, int64_t kc,
                       int64_t j0, int64_t nc, float beta, const float *packed,
                       int64_t panel_stride)
{
    const int64_t nr = ks->nr, wide = 2 * nr;
    for (int64_t i = 0; i < g->m; i += ks->wide.mr) {
        int rows = (int)min64(ks->wide.mr, g->m - i);
        for (int64_t q = 0; q < nc; q += wide) {
            int cols = (int)min64(wide, nc - q);
            /* A last single panel has no second one: stride 0 keeps the read inside it. */
            ks->wide.packed(kc, g->a + i * g->lda + p0, g->lda, packed + q / nr * panel_stride,
                            cols > nr ? panel_stride : 0, g->c + i * g->ldc + j0 + q, g->ldc,
                            g->alpha, beta, rows, cols);
        }
    }
}

/* The micro-kernel over every tile of rows x the packed block (panel q at packed + q/NR *
 * panel_stride). */
static void tiles(const eng__kernels *ks, const eng__gemm *g, int64_t p0, int64_t kc, int64_t j0,
                  int64_t nc, float beta, const float *packed, int64_t panel_stride, float *edge)
{
    if (ks->wide.packed) {
        tiles_wide(ks, g, p0, kc, j0, nc, beta, packed, panel_stride);
        return;
    }
    const int64_t mr = ks->mr, nr = ks->nr;
    for (int64_t i = 0; i < g->m; i += mr) {
        int rows = (int)min64(mr, g->m - i);
        const float *a = g->a + i * g->lda + p0;
        int64_t lda = g->lda;
        if (rows < mr) {
            memset(edge, 0, (size_t)(mr * kc) * sizeof(float));
            for (int r = 0; r < rows; r++)
                memcpy(edge + r * kc, a + r * g->lda, (size_t)kc * sizeof(float));
            a = edge;
            lda = kc;
        }
        for (int64_t q = 0; q < nc; q += nr) {
            int cols = (int)min64(nr, nc - q);
            ks->tile(kc, a, lda, packed + q / nr * panel_stride, g->c + i * g->ldc + j0 + q, g->ldc,
                     g->alpha, beta, rows, cols);
        }
    }
}

size_t eng__sgemm_panels_floats(const eng__kernels *ks, int64_t n, int64_t k)
{
    return (size_t)(round_up(n, ks->nr) * k);
}

void eng__sgemm_pack_panels(const eng__kernels *ks, const float *b, int64_t ldb, bool b_trans,
                            int64_t k, int64_t n, float *dst)
{
    pack_b(ks, b, false, ldb, b_trans, 0, k, 0, n, dst);
}

void eng__sgemm_pack_panels16(const eng__kernels *ks, const uint16_t *b, int64_t ldb, bool b_trans,
                              int64_t k, int64_t n, float *dst)
{
    pack_b(ks, b, true, ldb, b_trans, 0, k, 0, n, dst);
}

static void sgemm_blas(const eng__gemm *g)
{
    cblas_sgemm(CblasRowMajor, CblasNoTrans, g->b_trans ? CblasTrans : CblasNoTrans, (int)g->m,
                (int)g->n, (int)g->k, g->alpha, g->a, (int)g->lda, g->b, (int)g->ldb, g->beta, g->c,
                (int)g->ldc);
}

void eng__sgemm(const eng__kernels *ks, const eng__gemm *g, float *pack)
{
    if (!ks->tile) {
        sgemm_blas(g);
        return;
    }
    /* Depth blocks of even size: k = 512 as 4 x 128, not 160 + 160 + 160 + 32, whose last
     * block would pay a whole pass over C for a fifth of the work. */
    const int64_t kc_max = ceil_div(g->k, ceil_div(g->k, ks->kc));
    const int64_t nc_max = round_up(min64(g->n, ks->nc), ks->nr);
    float *edge = g->b_packed ? pack : pack + kc_max * nc_max;
    for (int64_t j0 = 0; j0 < g->n; j0 += ks->nc) {
        int64_t nc = min64(ks->nc, g->n - j0);
        for (int64_t p0 = 0; p0 < g->k; p0 += kc_max) {
            int64_t kc = min64(kc_max, g->k - p0);
            /* Later depth blocks add to what the first one wrote. */
            float beta = p0 == 0 ? g->beta : 1.0f;
            if (g->b_packed) {
                const float *block = g->b_packed + j0 / ks->nr * g->b_panel_stride + p0 * ks->nr;
                tiles(ks, g, p0, kc, j0, nc, beta, block, g->b_panel_stride, edge);
            } else {
                pack_b(ks, g->b, false, g->ldb, g->b_trans, p0, kc, j0, nc, pack);
                if (g->b_round_bf16)
                    ks->round_bf16(pack, kc * round_up(nc, ks->nr));
                tiles(ks, g, p0, kc, j0, nc, beta, pack, kc * ks->nr, edge);
            }
        }
    }
}

/* ---- Portable micro-kernel -------------------------------------------------------------- */

void eng__tile_generic(int64_t k, const float *a, int64_t lda, const float *b, float *c,
                       int64_t ldc, float alpha, float beta, int m, int n)
{
    enum { MR = ENG__GENERIC_MR, NR = ENG__GENERIC_NR };
    float acc[MR][NR] = {{0}};
    for (int64_t p = 0; p < k; p++) {
        const float *bp = b + p * NR;
        for (int r = 0; r < MR; r++) {
            float av = a[r * lda + p];
            for (int j = 0; j < NR; j++)
                acc[r][j] += av * bp[j];
        }
    }
    for (int r = 0; r < m; r++) {
        float *cr = c + r * ldc;
        for (int j = 0; j < n; j++)
            cr[j] = beta == 0.0f ? alpha * acc[r][j] : alpha * acc[r][j] + beta * cr[j];
    }
}
