/*
 * kernels.h - the engine's own compute kernels: packed single-precision GEMM micro-kernels per
 * instruction set, the GEMM driver around them, and the choice of one set for the process.
 *
 * Only engine/ includes this header. A kernel set bundles a register-tile micro-kernel (C[MR x
 * NR] += A[MR x k] B[k x NR], A read in place with a row stride, B packed), the softmax's vector
 * kernels of the same instruction set, and the cache blocking derived from the sizes cpuid
 * reports. The `openblas` set has no micro-kernel: eng__sgemm hands its products to
 * cblas_sgemm, which keeps OpenBLAS available as fallback, test reference and baseline.
 *
 * The set is the one eng_init's options name (auto until then: the best the CPU and the OS
 * support); every engine call reads it once at its start, so a call in flight keeps the set it
 * began with.
 */
#ifndef ATTND_ENGINE_KERNELS_H
#define ATTND_ENGINE_KERNELS_H

#include "engine/internal.h"

/* C[m x n] = alpha * A[MR x k] * B[k x NR] + beta * C, for the top-left m x n of the tile
 * (1 <= m <= MR, 1 <= n <= NR). A is row-major with row stride lda and all MR rows readable;
 * B is a packed panel, k rows of NR floats, 64-byte aligned. beta == 0 never reads C (it may
 * hold NaN); any other beta scales it. No alignment of A or C is needed. */
typedef void (*eng__tile_fn)(int64_t k, const float *a, int64_t lda, const float *b, float *c,
                             int64_t ldc, float alpha, float beta, int m, int n);

/* The bf16 micro-kernel: C[m x n] = alpha * A B + beta * C as eng__tile_fn, with A [MR x 2 kp]
 * bf16 row-major (row stride lda elements, even; all MR rows readable) and B a bf16 pair panel
 * (eng__bf16_pack_panels), fp32 products and sums. */
typedef void (*eng__tile_bf16_fn)(int64_t kp, const uint16_t *a, int64_t lda, const uint16_t *b,
                                  float *c, int64_t ldc, float alpha, float beta, int m, int n);

/* n fp32 values to bf16 (round to nearest even); dst[n] is set to 0 when n is odd, so that the
 * row may be read in pairs. */
typedef void (*eng__to_bf16_fn)(const float *x, int64_t n, uint16_t *dst);

/* A wide register tile over pairs of the set's packed panels (2 NR columns, at most `mr`
 * rows), which reads only the rows it computes: `packed` takes B as two panels (the second at
 * b + b_panel_stride; 0 when n <= NR), `rows` takes B's rows where they lie (row stride ldb).
 * C = alpha A B + beta C for the top-left m x n; beta == 0 never reads C. */
typedef struct {
    int mr;
    void (*packed)(int64_t k, const float *a, int64_t lda, const float *b, int64_t b_panel_stride,
                   float *c, int64_t ldc, float alpha, float beta, int m, int n);
    void (*rows)(int64_t k, const float *a, int64_t lda, const float *b, int64_t ldb, float *c,
                 int64_t ldc, float alpha, float beta, int m, int n);
} eng__wide_tile;

/* One packed panel from B^T rows: dst[p NR + j] = b[j ldb + p] for j < cols, zero past. */
typedef void (*eng__pack_trans_fn)(const float *b, int64_t ldb, int64_t k, int cols, float *dst);

typedef struct {
    const char *name;  /* "avx512", "avx2", "generic" or "openblas" */
    eng__tile_fn tile; /* NULL for openblas */
    /* fp32 products run on the wide tile instead of `tile` (wide.packed NULL: none). */
    eng__wide_tile wide;
    eng__pack_trans_fn pack_trans; /* NULL: B^T rows are packed element by element */
    /* bf16 products (VDPBF16PS), NULL where the CPU lacks them or they are slow: bf16
     * requests then round their operands for `tile`. Same MR and NR as `tile`. */
    eng__tile_bf16_fn tile_bf16;
    eng__to_bf16_fn to_bf16;
    void (*round_bf16)(float *x, int64_t n); /* eng__bf16_round_floats in this set's vectors */
    int mr, nr;                              /* the micro-kernel's register tile */
    int panel_rows;          /* query rows per panel of the flash loop: mr, or 32 for cblas */
    const eng__vec_ops *vec; /* the softmax's vector kernels */
    int64_t kc, nc;          /* blocking: depth per packed panel, columns per packed block */
} eng__kernels;

/* Bytes of a core's L1 data and L2 caches; 0 where unknown. */
typedef struct {
    size_t l1d, l2;
} eng__cache_sizes;

/* Fills the sizes still 0 in `sizes` from `from` (the next source). */
void eng__cache_fill(eng__cache_sizes *sizes, const eng__cache_sizes *from);

/* A set's blocking (kc, nc) for its tile (mr x nr) and the caches; an unknown (0) size counts
 * as a typical one, never as 0. */
void eng__blocking(const eng__cache_sizes *caches, int mr, int nr, int64_t *kc, int64_t *nc);

/* The set every engine call of this process uses now (never NULL). */
const eng__kernels *eng__kernels_current(void);

/* The named set with its blocking, or NULL when the name is unknown or the CPU lacks it. */
const eng__kernels *eng__kernels_named(const char *name);

/* One product C = alpha * A op(B) + beta * C, all row-major with positive row strides:
 * A is [m x k]; B is [k x n], or [n x k] when b_trans (rows of B^T: keys for Q K^T). beta == 0
 * never reads C. B may instead come packed already (b_packed, for operands that several
 * products share): panel q, columns [q NR, q NR + NR), at b_packed + q * b_panel_stride, its
 * row p (depth p of this product) at + p * NR, zero past column n; b is then unused. */
typedef struct {
    int64_t m, n, k;
    float alpha, beta;
    const float *a;
    int64_t lda;
    const float *b;
    int64_t ldb;
    bool b_trans;
    float *c;
    int64_t ldc;
    const float *b_packed;
    int64_t b_panel_stride;
    bool b_round_bf16; /* B rounded to bf16 as it is packed (not with b_packed) */
} eng__gemm;

/* Packs all of B ([k x n], or [n x k] when b_trans) into the b_packed layout with panel stride
 * k * NR, zero-padded to a whole panel: eng__sgemm_panels_floats(ks, n, k) floats at dst,
 * 64-byte aligned. Not for openblas. */
void eng__sgemm_pack_panels(const eng__kernels *ks, const float *b, int64_t ldb, bool b_trans,
                            int64_t k, int64_t n, float *dst);

/* The same from B's bf16 bits, widened to fp32 (exactly) as they are packed. */
void eng__sgemm_pack_panels16(const eng__kernels *ks, const uint16_t *b, int64_t ldb, bool b_trans,
                              int64_t k, int64_t n, float *dst);

/* Floats of eng__sgemm_pack_panels's output for B of n columns and depth k. */
size_t eng__sgemm_panels_floats(const eng__kernels *ks, int64_t n, int64_t k);

/* Floats of packing space eng__sgemm needs for products of at most n columns and depth k. */
size_t eng__sgemm_pack_floats(const eng__kernels *ks, int64_t n, int64_t k);

/* Computes g on the calling thread with the set's micro-kernel (or cblas_sgemm for openblas,
 * which never takes b_packed). `pack` is caller memory of eng__sgemm_pack_floats(ks, g->n,
 * g->k) floats, 64-byte aligned (unused by openblas). Every dimension must be positive and,
 * for openblas, below 2^31. */
void eng__sgemm(const eng__kernels *ks, const eng__gemm *g, float *pack);

/* ---- bf16 products (gemm_bf16.c, gemm_bf16_avx512.c) ---------------------------------------
 *
 * B operands are packed into the pair layout VDPBF16PS reads: panel q holds columns
 * [q NR, q NR + NR) of B; its pair row t (depths 2t and 2t+1) is 2 NR bf16 at + t * 2 NR,
 * element (depth 2t + e, column j) at + 2 j + e; zero past depth k and column n. A panel is
 * eng__bf16_panel_stride(nr, k) elements long. */
int64_t eng__bf16_panel_stride(int64_t nr, int64_t k);

/* Elements of eng__bf16_pack_panels's output for B of n columns and depth k. */
size_t eng__bf16_panels_elems(int64_t nr, int64_t n, int64_t k);

/* Packs B ([k x n], or [n x k] when b_trans: rows of B^T) rounded to bf16 into pair panels at
 * dst (64-byte aligned). */
void eng__bf16_pack_panels(int64_t nr, const float *b, int64_t ldb, bool b_trans, int64_t k,
                           int64_t n, uint16_t *dst);

/* The same from B's bf16 bits, copied: what rounding their exact fp32 widening gives. */
void eng__bf16_pack_panels16(int64_t nr, const uint16_t *b, int64_t ldb, bool b_trans, int64_t k,
                             int64_t n, uint16_t *dst);

/* C[m x n] = alpha * A B + beta * C with the set's bf16 micro-kernel: A is [m x 2 kp] bf16 with
 * row stride lda (even) and MR readable rows past every row it starts a tile at (the caller
 * pads to whole tiles); B is pair-packed, panel q at b + q * b_panel_stride. */
typedef struct {
    int64_t m, n, kp;
    float alpha, beta;
    const uint16_t *a;
    int64_t lda;
    const uint16_t *b;
    int64_t b_panel_stride;
    float *c;
    int64_t ldc;
} eng__gemm_bf16;

void eng__sgemm_bf16(const eng__kernels *ks, const eng__gemm_bf16 *g);

/* x[0..n) rounded to bf16 values (nearest even, NaN kept), in place: the operands of the
 * emulated bf16 products. */
void eng__bf16_round_floats(float *x, int64_t n);
void eng__bf16_round_floats_avx512(float *x, int64_t n);
void eng__bf16_round_floats_avx2(float *x, int64_t n);

void eng__tile_bf16_avx512(int64_t kp, const uint16_t *a, int64_t lda, const uint16_t *b, float *c,
                           int64_t ldc, float alpha, float beta, int m, int n);
void eng__to_bf16_avx512(const float *x, int64_t n, uint16_t *dst);

/* ---- Few-row products (gemv.c, gemv_avx2.c, gemv_avx512.c) ----------------------------------
 *
 * y[r][f] = x[r] . w_f (+ bias[f]) for a handful of rows x[r] against the weight rows w_f
 * where they lie ([out_features, in_features] row-major, fp32 or 16-bit), each 16-bit weight
 * widened in registers: a decode step streams its weights once instead of packing them. Each
 * y[r][f] is one chain of vector partial sums over k, reduced by one fixed tree, so its bits
 * do not depend on `rows`, on the other rows, on n or on which features share the call, and
 * 16-bit weights give the bits of fp32 weights of the same values (exact widening, the same
 * sums in the same order). The variants differ from each other and from the blocked product
 * in that order, and the portable one also rounds each product before adding it (no FMA). */
typedef struct {
    const float *const *x; /* rows of k floats */
    float *const *y;       /* rows of n floats: y[r][f] for features 0..n-1 of this call */
    int rows;              /* 1 or more */
    const void *w;         /* n rows of k elements of `dtype`, row stride ldw elements */
    eng_dtype dtype;       /* F32, BF16 or F16 */
    int64_t ldw, k, n;     /* k, n >= 1 */
    const float *bias;     /* n floats added to the products, or NULL */
    bool round_bf16;       /* weights rounded to bf16 (nearest even) as they are read */
} eng__gemv;

typedef void (*eng__gemv_fn)(const eng__gemv *g);

void eng__gemv_avx2(const eng__gemv *g);
void eng__gemv_avx512(const eng__gemv *g);

/* The named variant ("avx512", "avx2", "scalar"), or NULL when this CPU lacks it (tests). */
eng__gemv_fn eng__gemv_variant(const char *name);

/* The variant kernel set `ks` computes few-row products with: its own instruction set, and
 * for openblas the best this CPU has (cblas would widen 16-bit weights on every call). */
eng__gemv_fn eng__gemv_of(const eng__kernels *ks);

/* The micro-kernels, one per file and instruction set (gemm_avx512.c, gemm_avx2.c, gemm.c). */
#define ENG__AVX512_MR  12
#define ENG__AVX512_NR  32
#define ENG__AVX2_MR    6
#define ENG__AVX2_NR    16
#define ENG__GENERIC_MR 4
#define ENG__GENERIC_NR 16
void eng__tile_avx512(int64_t k, const float *a, int64_t lda, const float *b, float *c, int64_t ldc,
                      float alpha, float beta, int m, int n);
void eng__tile_avx2(int64_t k, const float *a, int64_t lda, const float *b, float *c, int64_t ldc,
                    float alpha, float beta, int m, int n);
void eng__tile_generic(int64_t k, const float *a, int64_t lda, const float *b, float *c,
                       int64_t ldc, float alpha, float beta, int m, int n);

#endif
