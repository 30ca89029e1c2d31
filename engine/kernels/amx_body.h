/*
 * amx_body.h - the AMX micro-kernels, written once against five tile operations that the
 * including file defines: TILE_CONFIG(cfg), TILE_ZERO(t), TILE_LOAD(t, base, stride_bytes),
 * TILE_STORE(t, base, stride_bytes), TILE_DPBF16PS(c, a, b), tile numbers as literals. Its
 * function names come from AMX_FN(name). amx_hw.c maps them to the instructions, amx_emu.c to
 * the emulation, so that the same code runs on the hardware and in every test.
 *
 * Tiles (eng__amx_config_fill): tmm0-3 the 2 x 2 blocks of C, 16 x 16 fp32 each; tmm4-5 A's
 * rows 0-15 and 16-31, 32 bf16 each; tmm6-7 B's columns 0-15 and 16-31, 16 pair rows each.
 */

void AMX_FN(config_load)(const eng__amx_config *cfg)
{
    TILE_CONFIG(cfg);
}

void AMX_FN(kernel)(int64_t steps, const uint16_t *a, int64_t lda, const uint16_t *b, float *c)
{
    const long a_stride = (long)(lda * 2), b_stride = 64, c_stride = ENG__AMX_NR * 4;
    TILE_ZERO(0);
    TILE_ZERO(1);
    TILE_ZERO(2);
    TILE_ZERO(3);
    for (int64_t s = 0; s < steps; s++, a += ENG__AMX_DEPTH, b += 1024) {
        TILE_LOAD(4, a, a_stride);
        TILE_LOAD(5, a + 16 * lda, a_stride);
        TILE_LOAD(6, b, b_stride);
        TILE_LOAD(7, b + 512, b_stride);
        TILE_DPBF16PS(0, 4, 6);
        TILE_DPBF16PS(1, 4, 7);
        TILE_DPBF16PS(2, 5, 6);
        TILE_DPBF16PS(3, 5, 7);
    }
    TILE_STORE(0, c, c_stride);
    TILE_STORE(1, c + 16, c_stride);
    TILE_STORE(2, c + 16 * ENG__AMX_NR, c_stride);
    TILE_STORE(3, c + 16 * ENG__AMX_NR + 16, c_stride);
}
