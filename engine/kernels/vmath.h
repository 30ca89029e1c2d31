/*
 * vmath.h - what the vector-math files share (vmath.c scalar, vmath_avx2.c, vmath_avx512.c):
 * the exponential's constants, the key groups of the decoding kernels, and each file's table.
 * Only those files and kernels.c (which picks one table per kernel set) include it.
 */
#ifndef ATTND_ENGINE_KERNELS_VMATH_H
#define ATTND_ENGINE_KERNELS_VMATH_H

#include "engine/internal.h"

#define EXP_LO (-87.0f) /* below this exp underflows to 0 (FLT_MIN is ~exp(-87.3)) */
/* Arguments are clamped here, above ln(FLT_MAX) = 88.72, so that large ones overflow to +inf
 * like expf while n stays at most 128 (one above the largest finite exponent, 127). */
#define EXP_HI 89.0f
#define LOG2E  1.44269504088896341f
#define LN2_HI 0.693359375f /* ln 2 split so that n * LN2_HI is exact */
#define LN2_LO (-2.12194440e-4f)
/* e^r = 1 + r (C1 + r (C2 + r (C3 + r (C4 + r C5)))) for |r| <= ln2 / 2: a minimax fit of
 * the relative error (9.2e-8 before rounding) with e^0 = 1 exactly, five FMAs: the softmax's
 * exponential is the work per score that is not a product, a tenth or more of attention at
 * D = 64. With the two-part ln 2 the whole exponential stays within 1.4 FLT_EPSILON of exp()
 * over [-87, 88.7] (checked on 4e7 arguments). */
#define EXP_C1 9.999997020e-01f
#define EXP_C2 4.999914765e-01f
#define EXP_C3 1.666763872e-01f
#define EXP_C4 4.189817607e-02f
#define EXP_C5 8.290277794e-03f
/* The same polynomial in f = r / ln 2, for 2^f on |f| <= 1/2: EXP_Ci ln2^i, rounded once. */
#define LN2_D   0.6931471805599453
#define EXP2_C1 ((float)(9.999997020e-01 * LN2_D))
#define EXP2_C2 ((float)(4.999914765e-01 * LN2_D * LN2_D))
#define EXP2_C3 ((float)(1.666763872e-01 * LN2_D * LN2_D * LN2_D))
#define EXP2_C4 ((float)(4.189817607e-02 * LN2_D * LN2_D * LN2_D * LN2_D))
#define EXP2_C5 ((float)(8.290277794e-03 * LN2_D * LN2_D * LN2_D * LN2_D * LN2_D))
/* tanh below this magnitude comes from its Taylor series: 1 - 2/(e^2t + 1) cancels there. */
#define TANH_SERIES_BELOW 0.25f

/* Calls fn(DT, ...) with DT the constant equal to dtype, so that an always_inline body is
 * compiled once per dtype and branches on it only once per call. */
#define BY_KV_DTYPE(dtype, fn, ...)                                                                \
    do {                                                                                           \
        if ((dtype) == ENG_DTYPE_BF16)                                                             \
            fn(ENG_DTYPE_BF16, __VA_ARGS__);                                                       \
        else if ((dtype) == ENG_DTYPE_F16)                                                         \
            fn(ENG_DTYPE_F16, __VA_ARGS__);                                                        \
        else                                                                                       \
            fn(ENG_DTYPE_F32, __VA_ARGS__);                                                        \
    } while (0)

/* Keys per group of the vector decoding kernels: a group's K or V rows stay in L1 while every
 * query row reads them, and its dot products keep eight accumulators in registers. */
#define KEY_GROUP 8

/* The first `keys` row pointers of a key group from key c0 (elements of `size` bytes, row
 * stride ld); the rest repeat the last one, so that a short group runs the same instructions
 * (and so each key's sum takes the same bits in any group). */
static inline void group_rows(const void *x, size_t size, int64_t ld, int64_t c0, int64_t keys,
                              const char *rows[KEY_GROUP])
{
#pragma GCC unroll 8
    for (int j = 0; j < KEY_GROUP; j++)
        rows[j] = (const char *)x + (size_t)((c0 + (j < keys ? j : keys - 1)) * ld) * size;
}

static inline size_t kv_size(eng_dtype dtype)
{
    return dtype == ENG_DTYPE_F32 ? sizeof(float) : sizeof(uint16_t);
}

/* The variants: scalar (any CPU), AVX2 + FMA, AVX-512F + DQ. */
extern const eng__vec_ops eng__vec_scalar, eng__vec_avx2, eng__vec_avx512;

#endif
