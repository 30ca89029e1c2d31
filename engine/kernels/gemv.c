/*
 * gemv.c - few-row products y = x W^T + b that read the weights where they lie (kernels.h,
 * eng__gemv): the portable variant, and which variant a kernel set uses.
 *
 * The portable variant keeps eight partial sums per output, element i going to sum i mod 8,
 * reduced by the tree the AVX2 variant uses; without FMA its bits are its own. It widens a
 * chunk of a weight row at a time into a buffer that all rows then read.
 */
#include <string.h>

#include "engine/kernels/kernels.h"

enum {
    LANES = 8,     /* partial sums per output */
    ROW_GROUP = 4, /* rows that share one widened chunk */
    CHUNK = 64,    /* weight elements widened at a time: a multiple of LANES */
};

/* Weight elements [i, i + n) of row w widened to fp32 (exact), rounded to bf16 if asked. */
static void widen_chunk(const eng__gemv *g, const void *w, int64_t i, int64_t n, float *dst)
{
    if (g->dtype == ENG_DTYPE_F32) {
        memcpy(dst, (const float *)w + i, (size_t)n * sizeof(float));
    } else {
        const uint16_t *h = (const uint16_t *)w + i;
        for (int64_t e = 0; e < n; e++)
            dst[e] = g->dtype == ENG_DTYPE_F16 ? eng_f16_to_f32(h[e]) : eng_bf16_to_f32(h[e]);
    }
    if (g->round_bf16 && g->dtype != ENG_DTYPE_BF16) /* a bf16 weight is its own rounding */
        eng__bf16_round_floats(dst, n);
}

static float sum_lanes(const float acc[LANES])
{
    float s[4], t[2];
    for (int l = 0; l < 4; l++)
        s[l] = acc[l] + acc[l + 4];
    for (int l = 0; l < 2; l++)
        t[l] = s[l] + s[l + 2];
    return t[0] + t[1];
}

/* Feature f for rows r0 .. r0 + nr - 1 (nr <= ROW_GROUP). */
static void feature_rows(const eng__gemv *g, int64_t f, int r0, int nr)
{
    const void *w = g->dtype == ENG_DTYPE_F32 ? (const void *)((const float *)g->w + f * g->ldw)
                                              : (const void *)((const uint16_t *)g->w + f * g->ldw);
    float acc[ROW_GROUP][LANES] = {{0}};
    float chunk[CHUNK];
    for (int64_t i0 = 0; i0 < g->k; i0 += CHUNK) {
        int64_t n = g->k - i0 < CHUNK ? g->k - i0 : CHUNK;
        widen_chunk(g, w, i0, n, chunk);
        for (int r = 0; r < nr; r++) {
            const float *x = g->x[r0 + r] + i0;
            for (int64_t e = 0; e < n; e++)
                acc[r][e % LANES] += x[e] * chunk[e];
        }
    }
    for (int r = 0; r < nr; r++) {
        float s = sum_lanes(acc[r]);
        g->y[r0 + r][f] = g->bias ? s + g->bias[f] : s;
    }
}

static void gemv_scalar(const eng__gemv *g)
{
    for (int64_t f = 0; f < g->n; f++)
        for (int r0 = 0; r0 < g->rows; r0 += ROW_GROUP)
            feature_rows(g, f, r0, g->rows - r0 < ROW_GROUP ? g->rows - r0 : ROW_GROUP);
}

eng__gemv_fn eng__gemv_variant(const char *name)
{
    if (strcmp(name, "scalar") == 0)
        return gemv_scalar;
    /* The sets' own check (cpuid and the OS's XCR0); F16C comes with every CPU that has AVX2
     * and FMA, as vmath_avx2.c assumes too. */
    if (strcmp(name, "avx2") == 0)
        return eng__kernels_named("avx2") ? eng__gemv_avx2 : NULL;
    if (strcmp(name, "avx512") == 0)
        return eng__kernels_named("avx512") ? eng__gemv_avx512 : NULL;
    return NULL;
}

eng__gemv_fn eng__gemv_of(const eng__kernels *ks)
{
    if (strcmp(ks->name, "generic") == 0)
        return gemv_scalar;
    eng__gemv_fn own = NULL;
    if (strcmp(ks->name, "avx512") == 0 || strcmp(ks->name, "avx2") == 0)
        own = eng__gemv_variant(ks->name);
    else if (!(own = eng__gemv_variant("avx512")))
        own = eng__gemv_variant("avx2");
    return own ? own : gemv_scalar;
}
