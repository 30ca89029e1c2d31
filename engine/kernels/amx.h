/*
 * amx.h - bf16 products on Intel AMX tiles (TDPBF16PS), for engine/ only.
 *
 * One micro-kernel body (amx_body.h) is compiled twice: against the real tile instructions
 * (amx_hw.c, gcc's _tile_* intrinsics under a target attribute) and against a portable
 * emulation of them with the semantics Intel documents (amx_emu.c). The hardware build runs
 * where cpuid, XCR0 and the kernel grant the tile state; the emulated one runs anywhere and
 * is what tests (and the bf16 path amx-emulated) use on CPUs without AMX, so that the packing,
 * the tiling and the tails are exercised on every machine.
 *
 *     eng__amx_mode mode = eng__amx_active();          // once per call, like the kernel set
 *     uint16_t *bp = ...eng__amx_panels_elems(n, k)... // B packed once (a weight, a key block)
 *     eng__amx_pack_b(b, ENG_DTYPE_F32, ldb, true, k, n, bp);
 *     eng__amx_gemm g = {.m = m, .n = n, .k = k, .alpha = 1, .a = a, .lda = lda, .b = bp,
 *                        .c = c, .ldc = ldc};
 *     eng__amx_sgemm(mode, &g, a_scratch);               // eng__amx_a_elems(k) bf16
 *
 * Tiles: C in 2 x 2 tiles of 16 x 16 fp32 (tmm0-3), A in two 16 x 32 bf16 tiles (tmm4-5), B in
 * two tiles of 16 pair rows x 16 columns (tmm6-7): one step is a 32 x 32 block of C over 32
 * depths, four TDPBF16PS. Depth is zero-padded to a multiple of 32, rows and columns to 32.
 */
#ifndef ATTND_ENGINE_KERNELS_AMX_H
#define ATTND_ENGINE_KERNELS_AMX_H

#include "engine/internal.h"

/* The block of C one micro-kernel call computes, and the depth of one tile step. */
#define ENG__AMX_MR    32
#define ENG__AMX_NR    32
#define ENG__AMX_DEPTH 32

/* Which tile instructions run the bf16 products: none (the other bf16 paths), the hardware's,
 * or the emulation. */
typedef enum { ENG__AMX_OFF = 0, ENG__AMX_HW, ENG__AMX_EMULATED } eng__amx_mode;

/* The 64-byte operand of LDTILECFG: palette 1, then per tile its bytes per row and rows. */
typedef struct {
    uint8_t palette;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} eng__amx_config;

/* Takes the mode of bf16 path `path` for the engine calls that start after it (eng_init):
 * amx-emulated runs the emulation; amx the hardware, where the CPU has AMX-TILE and AMX-BF16,
 * the OS enables the tile state in XCR0 and arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)
 * grants it, else nothing; every other path runs no tiles. Until it is called the mode is
 * auto's. Not concurrently with itself. */
void eng__amx_configure(eng_bf16_path path);

/* The mode engine calls starting now use (read it once per call, like the kernel set). Any
 * thread. */
eng__amx_mode eng__amx_active(void);

/* Why the hardware tiles do not run in that mode (for the start-up log: what the CPU, the OS or
 * the kernel lacks, or the bf16 path that chose otherwise), or "" when they do. */
const char *eng__amx_reason(void);

/* Whether this CPU and OS grant the tiles, whatever the bf16 path (for tests and benches). */
bool eng__amx_hw_available(void);

/* The shared tile configuration of every kernel above. */
void eng__amx_config_fill(eng__amx_config *cfg);

/* Depth k rounded up to whole tile steps. */
int64_t eng__amx_depth(int64_t k);

/* bf16 elements of a packed B of n columns and depth k: ceil(n / 32) panels of
 * eng__amx_depth(k) * 32 each. Panel q, step s holds two tiles (columns [0,16) and [16,32) of
 * the panel), each 16 pair rows of 16 columns x 2 depths: element (depth 32 s + 2 r + e,
 * column 16 t + j) at q * panel + s * 1024 + t * 512 + r * 32 + 2 j + e; zero past k and n. */
size_t eng__amx_panels_elems(int64_t n, int64_t k);

/* Packs B ([k x n] with row stride ldb, or [n x k] rows of B^T when b_trans) into that layout
 * at dst: fp32 elements rounded to bf16 (nearest even), bf16 bits copied, f16 widened then
 * rounded. Any thread; dst is the caller's. */
void eng__amx_pack_b(const void *b, eng_dtype dtype, int64_t ldb, bool b_trans, int64_t k,
                     int64_t n, uint16_t *dst);

/* bf16 elements of the A scratch eng__amx_sgemm needs for depth k (32 zero-padded rows). */
size_t eng__amx_a_elems(int64_t k);

/* C[m x n] = alpha * A B + beta * C: A fp32 [m x k] (row stride lda), rounded to bf16 as it is
 * copied into the tiles' rows; B packed by eng__amx_pack_b for this n and k. beta == 0 never
 * reads C. m, n, k >= 0: no rows or columns leave C untouched; depth 0 gives C = beta C (0 when
 * beta == 0). The sums follow TDPBF16PS (amx_emu.c): per 32 depths, even and odd partial sums,
 * then added to the element; depth past k is zero. b_panel_stride: elements from one panel of
 * B to the next, 0 for eng__amx_depth(k) * 32 (a B packed deeper than k, read from a tile step
 * on, sets it to its own). */
typedef struct {
    int64_t m, n, k;
    float alpha, beta;
    const float *a;
    int64_t lda;
    const uint16_t *b;
    int64_t b_panel_stride;
    float *c;
    int64_t ldc;
} eng__amx_gemm;

/* Computes g on the calling thread with `mode`'s tile instructions (not ENG__AMX_OFF), loading
 * the tile configuration on this thread first if it has not yet. a_scratch: eng__amx_a_elems
 * (g->k) bf16, 64-byte aligned. */
void eng__amx_sgemm(eng__amx_mode mode, const eng__amx_gemm *g, uint16_t *a_scratch);

/* The micro-kernel: the 32 x 32 fp32 block c (row stride 32) = A B over `steps` tile steps; A
 * is 32 rows of bf16 with row stride lda elements (a multiple of 32), B one packed panel.
 * Only after the configuration is loaded on this thread. */
void eng__amx_kernel_hw(int64_t steps, const uint16_t *a, int64_t lda, const uint16_t *b, float *c);
void eng__amx_kernel_emu(int64_t steps, const uint16_t *a, int64_t lda, const uint16_t *b,
                         float *c);

/* Loads the configuration into this thread's tile state (LDTILECFG, or the emulation's). */
void eng__amx_config_load_hw(const eng__amx_config *cfg);
void eng__amx_config_load_emu(const eng__amx_config *cfg);

#endif
