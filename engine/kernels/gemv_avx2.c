/*
 * gemv_avx2.c - few-row products (kernels.h, eng__gemv) in AVX2 + FMA, with F16C for float16
 * weights, which every CPU with AVX2 and FMA has.
 *
 * One or two rows: four weight rows against two input rows at a time, each weight vector
 * loaded (and widened) once for both rows, eight independent FMA chains, enough to keep a
 * one-row product at the memory's pace. More rows (a batch of decode steps): a chunk of four
 * weight rows is widened once into a buffer that stays in L1, and every block of three input
 * rows (two left: one block of two) runs over it with twelve accumulators in registers, saved
 * between chunks; the weights then come from memory once for all rows, and each FMA takes
 * under one load. Each output is one accumulator over k, eight elements a step, reduced by one
 * tree, whichever path and block it is computed in. Compiled with a target attribute;
 * eng__gemv_variant calls it only where the CPU has the instructions.
 */
#include <immintrin.h>
#include <string.h>

#include "engine/kernels/kernels.h"

#define AVX2   __attribute__((target("avx2,fma,f16c")))
#define INLINE AVX2 static inline __attribute__((always_inline))

enum { LANES = 8, FEATURES = 4, ROWS = 2 };

/* The many-row path: rows it takes from (fewer stream the weights as they are), input rows
 * per register block, weight rows widened together (GROUP, a multiple of FEATURES: every chunk
 * of the input rows is read for all of them while it is in cache, and their accumulators for
 * MANY_MAX rows stay in L1 and L2), weight elements per chunk (a multiple of LANES), and rows
 * whose accumulators one pass over the weights keeps. */
enum { MANY_FROM = 3, MANY_ROWS = 3, GROUP = 16, CHUNK = 256, MANY_MAX = 64 };

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

/* Weight elements [i0, i0 + n) of features f .. f + nf - 1 (nf <= GROUP) widened into buf
 * (row j at j * CHUNK), the last vector's lanes past k zero: the vectors block() would load.
 * The rows' next chunks are prefetched: read a chunk at a time, GROUP rows apart, with the
 * products between, they are streams the hardware prefetchers do not follow. */
INLINE void widen_chunk(const eng__gemv *g, int64_t f, int nf, int64_t i0, int64_t n, float *buf,
                        eng_dtype dtype, bool round)
{
    const size_t size = dtype == ENG_DTYPE_F32 ? sizeof(float) : sizeof(uint16_t);
    const int64_t next = g->k - (i0 + n) < CHUNK ? g->k - (i0 + n) : CHUNK;
    for (int j = 0; j < nf; j++) {
        const unsigned char *w = (const unsigned char *)g->w + (size_t)((f + j) * g->ldw) * size;
        for (size_t b = 0; b < (size_t)next * size; b += 64)
            _mm_prefetch((const char *)w + (size_t)(i0 + n) * size + b, _MM_HINT_T0);
        int64_t i = 0;
        for (; i + LANES <= n; i += LANES)
            _mm256_store_ps(buf + j * CHUNK + i, load_w(w, dtype, i0 + i, round));
        if (i < n) {
            int64_t left = n - i;
            __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)left),
                                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
            _mm256_store_ps(buf + j * CHUNK + i, load_w_tail(w, dtype, i0 + i, left, mask, round));
        }
    }
}

/* Rows r0 .. r0 + nr - 1 against the nf widened weight rows of buf over elements [i0, i0 + n)
 * of k, their accumulators (row r, feature j at acc + (r * GROUP + j) * LANES) loaded
 * before and saved after. Constants nr and nf once inlined keep the accumulators in registers;
 * saving them between chunks changes no bit of a sum. */
INLINE void many_block(const eng__gemv *g, const float *buf, int64_t i0, int64_t n, int r0, int nr,
                       int nf, float *acc)
{
    const float *x[MANY_ROWS];
    __m256 s[MANY_ROWS][FEATURES];
#pragma GCC unroll 3
    for (int r = 0; r < nr; r++) {
        x[r] = g->x[r0 + r] + i0;
#pragma GCC unroll 4
        for (int j = 0; j < nf; j++)
            s[r][j] = _mm256_load_ps(acc + ((r0 + r) * GROUP + j) * LANES);
    }
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES) {
        __m256 a[MANY_ROWS];
#pragma GCC unroll 3
        for (int r = 0; r < nr; r++)
            a[r] = _mm256_loadu_ps(x[r] + i);
#pragma GCC unroll 4
        for (int j = 0; j < nf; j++) {
            __m256 b = _mm256_load_ps(buf + j * CHUNK + i);
#pragma GCC unroll 3
            for (int r = 0; r < nr; r++)
                s[r][j] = _mm256_fmadd_ps(a[r], b, s[r][j]);
        }
    }
    if (i < n) {
        __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - i)),
                                          _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        __m256 a[MANY_ROWS];
#pragma GCC unroll 3
        for (int r = 0; r < nr; r++)
            a[r] = _mm256_maskload_ps(x[r] + i, mask);
#pragma GCC unroll 4
        for (int j = 0; j < nf; j++) {
            __m256 b = _mm256_load_ps(buf + j * CHUNK + i);
#pragma GCC unroll 3
            for (int r = 0; r < nr; r++)
                s[r][j] = _mm256_fmadd_ps(a[r], b, s[r][j]);
        }
    }
#pragma GCC unroll 3
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 4
        for (int j = 0; j < nf; j++)
            _mm256_store_ps(acc + ((r0 + r) * GROUP + j) * LANES, s[r][j]);
}

/* many_block with nr and nf as constants, for the weight rows j0 .. j0 + nf - 1 of buf (nf <=
 * FEATURES): full blocks, and the edges' few shapes. */
INLINE void many_blocks(const eng__gemv *g, const float *buf, int64_t i0, int64_t n, int rows,
                        int j0, int nf, float *acc)
{
    buf += j0 * CHUNK;
    acc += j0 * LANES;
    int r = 0;
    if (nf == FEATURES) {
        for (; r + MANY_ROWS <= rows; r += MANY_ROWS)
            many_block(g, buf, i0, n, r, MANY_ROWS, FEATURES, acc);
        /* Two rows left share each weight load (6 loads per 8 FMAs, not 10). */
        if (rows - r == 2) {
            many_block(g, buf, i0, n, r, 2, FEATURES, acc);
            r += 2;
        }
    }
    for (; r < rows; r++) {
        if (nf == FEATURES)
            many_block(g, buf, i0, n, r, 1, FEATURES, acc);
        else if (nf == 3)
            many_block(g, buf, i0, n, r, 1, 3, acc);
        else if (nf == 2)
            many_block(g, buf, i0, n, r, 1, 2, acc);
        else
            many_block(g, buf, i0, n, r, 1, 1, acc);
    }
}

/* Features f .. f + nf - 1 (nf <= GROUP) of rows r0 .. r0 + rows - 1 (rows <= MANY_MAX): the
 * weights chunk by chunk, each chunk widened once for every row. */
INLINE void many(const eng__gemv *g, int64_t f, int nf, int r0, int rows, eng_dtype dtype,
                 bool round)
{
    _Alignas(32) float buf[GROUP * CHUNK];
    _Alignas(32) float acc[MANY_MAX * GROUP * LANES];
    memset(acc, 0, (size_t)(rows * GROUP * LANES) * sizeof(float));
    eng__gemv part = *g;
    part.x = g->x + r0;
    for (int64_t i0 = 0; i0 < g->k; i0 += CHUNK) {
        int64_t n = g->k - i0 < CHUNK ? g->k - i0 : CHUNK;
        widen_chunk(g, f, nf, i0, n, buf, dtype, round);
        for (int j0 = 0; j0 < nf; j0 += FEATURES)
            many_blocks(&part, buf, i0, n, rows, j0, nf - j0 < FEATURES ? nf - j0 : FEATURES, acc);
    }
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < nf; j++) {
            float s = sum_lanes(_mm256_load_ps(acc + (r * GROUP + j) * LANES));
            g->y[r0 + r][f + j] = g->bias ? s + g->bias[f + j] : s;
        }
}

INLINE void run_many(const eng__gemv *g, eng_dtype dtype, bool round)
{
    for (int r0 = 0; r0 < g->rows; r0 += MANY_MAX) {
        int rows = g->rows - r0 < MANY_MAX ? g->rows - r0 : MANY_MAX;
        for (int64_t f = 0; f < g->n; f += GROUP)
            many(g, f, g->n - f < GROUP ? (int)(g->n - f) : GROUP, r0, rows, dtype, round);
    }
}

INLINE void run(const eng__gemv *g, eng_dtype dtype, bool round)
{
    if (g->rows >= MANY_FROM) {
        run_many(g, dtype, round);
        return;
    }
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
