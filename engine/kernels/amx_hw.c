/*
 * amx_hw.c - the AMX micro-kernels on the real tile instructions: amx_body.h with gcc's
 * _tile_* intrinsics, under a target attribute, so that a binary built for any x86-64 carries
 * them. amx.c calls them only after cpuid, XCR0 and arch_prctl have granted the tile state.
 *
 * gcc's intrinsics are volatile asm statements that name no memory, so a compiler barrier on
 * either side of each kernel keeps the packing stores before the loads and the stores to C
 * before the caller reads them.
 */
#include <immintrin.h>

#include "engine/kernels/amx.h"

#define AMX_HW __attribute__((target("amx-tile,amx-bf16")))

#define BARRIER()        __asm__ volatile("" ::: "memory")
#define TILE_CONFIG(cfg) _tile_loadconfig(cfg)
#define TILE_ZERO(t)     _tile_zero(t)
#define TILE_LOAD(t, base, stride)                                                                 \
    do {                                                                                           \
        BARRIER();                                                                                 \
        _tile_loadd(t, base, stride);                                                              \
    } while (0)
#define TILE_STORE(t, base, stride)                                                                \
    do {                                                                                           \
        _tile_stored(t, base, stride);                                                             \
        BARRIER();                                                                                 \
    } while (0)
#define TILE_DPBF16PS(c, a, b) _tile_dpbf16ps(c, a, b)
#define AMX_FN(name)           AMX_HW eng__amx_##name##_hw

#include "engine/kernels/amx_body.h"
