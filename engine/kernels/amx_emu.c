/*
 * amx_emu.c - a portable emulation of the AMX tile instructions the kernels use (LDTILECFG,
 * TILEZERO, TILELOADD, TILESTORED, TDPBF16PS), and amx_body.h built against it.
 *
 * The semantics follow the Intel 64 and IA-32 Architectures Software Developer's Manual, vol.
 * 2 (instruction set reference, "TDPBF16PS", as also published at felixcloutier.com/x86/
 * tdpbf16ps) and vol. 1 ch. 3 / the Linux kernel's Documentation/arch/x86/xstate.rst for the
 * tile state: per row m of C and per output column n, TDPBF16PS keeps two fp32 partial sums
 * that start at zero, one for the even and one for the odd element of each bf16 pair, and adds
 * the pair products into them over the pairs k in order, each an FMA rounded to nearest even;
 * then C[m][n] += even + odd. Input denormals are read as zero, denormal results flush to zero
 * (sign kept), MXCSR is neither read nor written. A load or TILEZERO zeroes what lies past a
 * tile's configured rows and bytes per row.
 *
 * The tile registers are thread-local, like the hardware's, so workers may run kernels at once.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "engine/kernels/amx.h"

#define TILES      8
#define TILE_ROWS  16
#define TILE_COLSB 64

typedef struct {
    eng__amx_config cfg;
    unsigned char tile[TILES][TILE_ROWS][TILE_COLSB];
} emu_state;

static _Thread_local emu_state emu;

static void emu_config(const eng__amx_config *cfg)
{
    emu.cfg = *cfg;
    memset(emu.tile, 0, sizeof emu.tile);
}

static void emu_zero(int t)
{
    memset(emu.tile[t], 0, sizeof emu.tile[t]);
}

static void emu_load(int t, const void *base, long stride)
{
    const int rows = emu.cfg.rows[t], colsb = emu.cfg.colsb[t];
    emu_zero(t);
    for (int r = 0; r < rows; r++)
        memcpy(emu.tile[t][r], (const unsigned char *)base + (long)r * stride, (size_t)colsb);
}

static void emu_store(int t, void *base, long stride)
{
    const int rows = emu.cfg.rows[t], colsb = emu.cfg.colsb[t];
    for (int r = 0; r < rows; r++)
        memcpy((unsigned char *)base + (long)r * stride, emu.tile[t][r], (size_t)colsb);
}

/* Element i of a tile row of bf16 as fp32, a denormal read as zero of its sign (DAZ). */
static float bf16_at(const unsigned char *row, int i)
{
    uint16_t h;
    memcpy(&h, row + 2 * i, sizeof h);
    uint32_t bits = (uint32_t)((h & 0x7f80) ? h : h & 0x8000) << 16;
    float x;
    memcpy(&x, &bits, sizeof x);
    return x;
}

/* The operands of one TDPBF16PS converted once, since every element takes part in 16 products:
 * A's rows as pairs, B's pair rows split into the even and the odd element of each column, C as
 * fp32. Past a tile's configured rows and bytes the tile holds zeros, so whole rows of 16
 * columns may be computed and the configured part stored. */
typedef struct {
    float a[TILE_ROWS][TILE_COLSB / 2];
    float b_even[TILE_ROWS][TILE_ROWS], b_odd[TILE_ROWS][TILE_ROWS];
    float c[TILE_ROWS][TILE_ROWS];
} dp_operands;

/* The arithmetic of TDPBF16PS, on a dp_operands private to the thread, over the rows and pairs
 * that emu_dpbf16ps has just written with the sanitizers watching. Their checks in these loops
 * would keep them scalar, and this arithmetic is most of a sanitized run of the emulated
 * kernels. */
#define DP_ARITH     __attribute__((no_sanitize("address", "undefined", "thread")))
#define DP_ARITH_INL static inline __attribute__((always_inline)) DP_ARITH

/* A denormal as zero of the same sign (the results' FTZ), written as a comparison and a select
 * so that the loops vectorize. */
DP_ARITH_INL float flush(float x)
{
    return fabsf(x) < FLT_MIN ? copysignf(0.0f, x) : x;
}

/* C[m][n] += even + odd for m < rows and all 16 columns n, the partial sums over the pairs k in
 * order. k runs outside n, so each (m, n) sees its terms in the order of a loop per element,
 * while a row's 16 independent sums form one vector. */
DP_ARITH_INL void dp_rows(dp_operands *op, int rows, int pairs)
{
    for (int m = 0; m < rows; m++) {
        float even[TILE_ROWS] = {0}, odd[TILE_ROWS] = {0};
        for (int k = 0; k < pairs; k++) {
            const float ae = op->a[m][2 * k], ao = op->a[m][2 * k + 1];
            for (int n = 0; n < TILE_ROWS; n++) {
                even[n] = flush(fmaf(ae, op->b_even[k][n], even[n]));
                odd[n] = flush(fmaf(ao, op->b_odd[k][n], odd[n]));
            }
        }
        for (int n = 0; n < TILE_ROWS; n++)
            op->c[m][n] = flush(flush(op->c[m][n]) + flush(even[n] + odd[n]));
    }
}

/* Without -mfma, fmaf is a call into libm; where the CPU has the instruction this clone inlines
 * it. Both round the exact a * b + c once to nearest even, so they give the same bits. */
__attribute__((target("fma"))) DP_ARITH static void dp_rows_fma(dp_operands *op, int rows,
                                                                int pairs)
{
    dp_rows(op, rows, pairs);
}

DP_ARITH static void dp_rows_libm(dp_operands *op, int rows, int pairs)
{
    dp_rows(op, rows, pairs);
}

static void emu_dpbf16ps(int tc, int ta, int tb)
{
    const int rows = emu.cfg.rows[tc], cols = emu.cfg.colsb[tc] / 4, pairs = emu.cfg.colsb[ta] / 4;
    dp_operands op;
    for (int m = 0; m < rows; m++) {
        for (int i = 0; i < 2 * pairs; i++)
            op.a[m][i] = bf16_at(emu.tile[ta][m], i);
        memcpy(op.c[m], emu.tile[tc][m], sizeof op.c[m]);
    }
    for (int k = 0; k < pairs; k++) {
        for (int n = 0; n < TILE_ROWS; n++) {
            op.b_even[k][n] = bf16_at(emu.tile[tb][k], 2 * n);
            op.b_odd[k][n] = bf16_at(emu.tile[tb][k], 2 * n + 1);
        }
    }
    if (__builtin_cpu_supports("fma"))
        dp_rows_fma(&op, rows, pairs);
    else
        dp_rows_libm(&op, rows, pairs);
    for (int m = 0; m < rows; m++)
        memcpy(emu.tile[tc][m], op.c[m], 4 * (size_t)cols);
}

#define TILE_CONFIG(cfg)            emu_config(cfg)
#define TILE_ZERO(t)                emu_zero(t)
#define TILE_LOAD(t, base, stride)  emu_load(t, base, stride)
#define TILE_STORE(t, base, stride) emu_store(t, base, stride)
#define TILE_DPBF16PS(c, a, b)      emu_dpbf16ps(c, a, b)
#define AMX_FN(name)                eng__amx_##name##_emu

#include "engine/kernels/amx_body.h"
