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
#include <math.h>
#include <string.h>

#include "engine/amx.h"

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

/* A denormal as zero of the same sign: both the inputs' DAZ and the results' FTZ. */
static float flush(float x)
{
    return fpclassify(x) == FP_SUBNORMAL ? copysignf(0.0f, x) : x;
}

static float bf16_at(const unsigned char *row, int i)
{
    uint16_t h;
    memcpy(&h, row + 2 * i, sizeof h);
    return flush(eng_bf16_to_f32(h));
}

static float f32_at(const unsigned char *row, int i)
{
    float x;
    memcpy(&x, row + 4 * i, sizeof x);
    return x;
}

static void emu_dpbf16ps(int tc, int ta, int tb)
{
    const int rows = emu.cfg.rows[tc], cols = emu.cfg.colsb[tc] / 4, pairs = emu.cfg.colsb[ta] / 4;
    for (int m = 0; m < rows; m++) {
        for (int n = 0; n < cols; n++) {
            float even = 0.0f, odd = 0.0f;
            for (int k = 0; k < pairs; k++) {
                const unsigned char *ar = emu.tile[ta][m], *br = emu.tile[tb][k];
                even = flush(fmaf(bf16_at(ar, 2 * k), bf16_at(br, 2 * n), even));
                odd = flush(fmaf(bf16_at(ar, 2 * k + 1), bf16_at(br, 2 * n + 1), odd));
            }
            float sum = flush(flush(f32_at(emu.tile[tc][m], n)) + flush(even + odd));
            memcpy(emu.tile[tc][m] + 4 * n, &sum, sizeof sum);
        }
    }
}

#define TILE_CONFIG(cfg)            emu_config(cfg)
#define TILE_ZERO(t)                emu_zero(t)
#define TILE_LOAD(t, base, stride)  emu_load(t, base, stride)
#define TILE_STORE(t, base, stride) emu_store(t, base, stride)
#define TILE_DPBF16PS(c, a, b)      emu_dpbf16ps(c, a, b)
#define AMX_FN(name)                eng__amx_##name##_emu

#include "engine/amx_body.h"
