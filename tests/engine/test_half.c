/* test_half.c - engine/kernels/half.c: float16 and bfloat16 conversions, exact where they must be
 * and rounded to nearest even where they narrow. GCC's _Float16 (libgcc's soft conversion) is the
 * independent reference for float16 rounding. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "tests/support/check.h"
#include "tests/support/util.h"

static uint32_t bits(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    return x;
}

static float from_bits(uint32_t x)
{
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static bool quick(void)
{
    const char *q = getenv("ATTND_TEST_QUICK");
    return q && *q && strcmp(q, "0") != 0;
}

static void test_half_widens_known_values_exactly(void)
{
    static const struct {
        uint16_t h;
        float f;
    } known[] = {
        {0x3C00, 1.0f},     {0xC000, -2.0f},    {0x3555, 0.333251953125f}, {0x7BFF, 65504.0f},
        {0x0400, 0x1p-14f}, {0x0001, 0x1p-24f}, {0x03FF, 0x3FFp-24f},      {0x8001, -0x1p-24f},
        {0x0000, 0.0f},     {0x7C00, INFINITY}, {0xFC00, -INFINITY},       {0x4248, 3.140625f},
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        CHECKF(bits(eng_f16_to_f32(known[i].h)) == bits(known[i].f), "half %04x -> %.9g",
               known[i].h, (double)eng_f16_to_f32(known[i].h));
    CHECK(bits(eng_f16_to_f32(0x8000)) == 0x80000000u); /* -0 keeps its sign */
    CHECK(isnan(eng_f16_to_f32(0x7E00)));
    CHECK(isnan(eng_f16_to_f32(0xFC01)));
}

static void test_every_half_survives_a_round_trip(void)
{
    for (uint32_t h = 0; h <= 0xFFFF; h++) {
        float f = eng_f16_to_f32((uint16_t)h);
        uint16_t back = eng_f32_to_f16(f);
        if (isnan(f))
            CHECKF((back & 0x7E00) == 0x7E00 && (back & 0x8000) == (h & 0x8000),
                   "NaN %04x came back as %04x", h, back);
        else
            CHECKF(back == h, "%04x -> %.9g -> %04x", h, (double)f, back);
    }
}

static void test_half_narrowing_rounds_to_nearest_even(void)
{
    static const struct {
        float f;
        uint16_t h;
    } cases[] = {
        {1.0f + 0x1p-11f, 0x3C00}, /* tie between 1 and 1+2^-10: even is 1 */
        {1.0f + 0x3p-11f, 0x3C02}, /* tie between 1+2^-10 and 1+2^-9: even is the latter */
        {1.0f + 0x1p-11f + 0x1p-20f, 0x3C01}, /* just above the tie */
        {65519.0f, 0x7BFF},                   /* below the tie with 2^16 */
        {65520.0f, 0x7C00},                   /* the tie: rounds to even, which is infinity */
        {1e6f, 0x7C00},                       /* overflow */
        {-1e6f, 0xFC00},
        {0x1p-25f, 0x0000},   /* tie between 0 and the smallest subnormal */
        {0x3p-26f, 0x0001},   /* 0.75 of the smallest subnormal */
        {0x3p-25f, 0x0002},   /* tie between subnormals 1 and 2: even is 2 */
        {0x7FFp-25f, 0x0400}, /* tie between the largest subnormal and 2^-14 */
        {1e-8f, 0x0000},
        {-1e-8f, 0x8000},
        {INFINITY, 0x7C00},
        {-INFINITY, 0xFC00},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        CHECKF(eng_f32_to_f16(cases[i].f) == cases[i].h, "%.9g -> %04x, want %04x",
               (double)cases[i].f, eng_f32_to_f16(cases[i].f), cases[i].h);
    CHECK((eng_f32_to_f16(NAN) & 0x7E00) == 0x7E00);
}

static void test_half_narrowing_matches_the_compiler_over_a_sweep(void)
{
    /* Every 331st float32 bit pattern (every 9973rd when quick), NaNs excluded. */
    uint32_t step = quick() ? 9973 : 331;
    for (uint64_t x = 0; x <= 0xFFFFFFFFu; x += step) {
        float f = from_bits((uint32_t)x);
        if (isnan(f))
            continue;
        _Float16 ref = (_Float16)f;
        uint16_t want;
        memcpy(&want, &ref, 2);
        uint16_t got = eng_f32_to_f16(f);
        CHECKF(got == want, "%08x (%.9g) -> %04x, compiler says %04x", (uint32_t)x, (double)f, got,
               want);
        if (check__failures_in_test > 5)
            return;
    }
}

static void test_bfloat16_widens_and_rounds(void)
{
    CHECK(bits(eng_bf16_to_f32(0x3F80)) == bits(1.0f));
    CHECK(bits(eng_bf16_to_f32(0xC040)) == bits(-3.0f));
    CHECK(bits(eng_bf16_to_f32(0x0001)) == 0x00010000u); /* a subnormal, exactly */
    CHECK(eng_bf16_to_f32(0x7F80) == INFINITY);
    CHECK(isnan(eng_bf16_to_f32(0x7FC0)));
    CHECK_EQ_INT(eng_f32_to_bf16(1.0f), 0x3F80);
    CHECK_EQ_INT(eng_f32_to_bf16(1.0f + 0x1p-8f), 0x3F80); /* tie: even is 1 */
    CHECK_EQ_INT(eng_f32_to_bf16(1.0f + 0x3p-8f), 0x3F82); /* tie: even is 1+2^-6 */
    CHECK_EQ_INT(eng_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81);
    CHECK_EQ_INT(eng_f32_to_bf16(3.40282347e38f), 0x7F80); /* FLT_MAX rounds up to inf */
    CHECK_EQ_INT(eng_f32_to_bf16(-0.0f), 0x8000);
    uint16_t nan = eng_f32_to_bf16(from_bits(0x7F800001u)); /* a NaN that truncates to inf */
    CHECKF((nan & 0x7F80) == 0x7F80 && (nan & 0x7F) != 0, "NaN -> %04x", nan);
    for (uint32_t b = 0; b <= 0xFFFF; b++) {
        float f = eng_bf16_to_f32((uint16_t)b);
        if (!isnan(f))
            CHECKF(eng_f32_to_bf16(f) == b, "bf16 %04x does not round-trip", b);
    }
}

int main(void)
{
    if (test_kernels_skip())
        return 0;
    RUN(test_half_widens_known_values_exactly);
    RUN(test_every_half_survives_a_round_trip);
    RUN(test_half_narrowing_rounds_to_nearest_even);
    RUN(test_half_narrowing_matches_the_compiler_over_a_sweep);
    RUN(test_bfloat16_widens_and_rounds);
    return check_report();
}
