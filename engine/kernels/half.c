/*
 * half.c - IEEE binary16 (float16) and bfloat16 <-> binary32 conversions.
 *
 * Model files and clients send float16 and bfloat16 to halve their size; the engine computes in
 * float32. Widening is exact (NaN payloads and signed zeros kept); narrowing rounds to nearest,
 * ties to even, as numpy and PyTorch do. Bit manipulation only, so the results do not depend
 * on F16C being there.
 */
#include <string.h>

#include "engine/internal.h"

static uint32_t float_bits(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    return x;
}

static float bits_float(uint32_t x)
{
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

float eng_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
    uint32_t bits;
    if (exp == 0x1F) { /* inf or NaN, payload kept */
        bits = sign | 0x7F800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else { /* subnormal: normalise */
        int shift = 0;
        while (!(man & 0x400u)) {
            man <<= 1;
            shift++;
        }
        bits = sign | ((uint32_t)(113 - shift) << 23) | ((man & 0x3FFu) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

float eng_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

uint16_t eng_f32_to_f16(float f)
{
    uint32_t x = float_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7FFFFFFFu;

    if (ax > 0x7F800000u) /* NaN: stays a NaN (quiet bit set), payload's top bits kept */
        return (uint16_t)(sign | 0x7E00u | ((ax >> 13) & 0x3FFu));
    /* 65520 is halfway between 65504 (the largest half) and 2^16; the tie goes to the even
     * neighbour, infinity. */
    if (ax >= 0x477FF000u)
        return (uint16_t)(sign | 0x7C00u);
    if (ax >= 0x38800000u) {
        /* Normal (>= 2^-14): round the mantissa at bit 13 to nearest even; a carry into the
         * exponent is the right answer too. Then rebias the exponent from 127 to 15. */
        uint32_t r = ax + 0xFFFu + ((ax >> 13) & 1u);
        return (uint16_t)(sign | ((r - (112u << 23)) >> 13));
    }
    /* Subnormal or zero: in [0, 0.5) the spacing of float32 near 0.5 is 2^-24, the subnormal
     * half's unit, so adding 0.5 makes the FPU round to a multiple of 2^-24 (nearest, ties to
     * even) and the low bits of the sum are the half's mantissa (1024 is the smallest normal,
     * which is also right). */
    float t = bits_float(ax) + 0.5f;
    return (uint16_t)(sign | (float_bits(t) - float_bits(0.5f)));
}

uint16_t eng_f32_to_bf16(float f)
{
    uint32_t x = float_bits(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) /* NaN: keep it one, quiet */
        return (uint16_t)((x >> 16) | 0x0040u);
    /* Round to nearest even at bit 16; overflow carries into infinity, as it should. */
    return (uint16_t)((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}
