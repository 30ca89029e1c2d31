/*
 * test_position.c - the specification of the positional encodings and number conversions the
 * attention layers use: eng_rope_apply, eng_sinusoidal_add, eng_alibi_default_slopes,
 * eng_f16_to_f32 and eng_bf16_to_f32 (docs/semantics.md: "ALiBi" and "Multi-head attention
 * layers").
 *
 * Expectations are the formulas written out in the test, in double:
 * - RoPE: pair d of a head turns by theta = p * base^(-2d/D); the pairs are (d, d + D/2) for the
 *   "half" style and (2d, 2d + 1) for "interleaved"; (a, b) -> (a cos - b sin, a sin + b cos).
 *   The engine computes the angles in double and rounds each result once to float, so results
 *   agree within a few float ulps of the vector's magnitude: 1e-6 here.
 * - Sinusoid: PE(p, 2i) = sin(p / 10000^(2i/E)), PE(p, 2i+1) = cos(...); added, within 1e-6.
 * - ALiBi slopes: exact powers of two for 8 heads; the formula in double for other counts,
 *   within one float rounding (relative 1e-7).
 * - fp16 / bf16: exact, for named bit patterns and for all 65,536 patterns of each.
 */
#include "engine/engine.h"
#include "tests/support/check.h"
#include "tests/support/ref.h"
#include "tests/support/util.h"

#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define GOLDEN_PATH "tests/engine/cases/seed_cases.json"

/* ---- Helpers ------------------------------------------------------------------------------ */

/* The pair partner and pair index of channel c in a head of size D. */
static void rope_pair(eng_rope_style style, int64_t D, int64_t c, int64_t *first, int64_t *second,
                      int64_t *d)
{
    if (style == ENG_ROPE_HALF) {
        *d = c % (D / 2);
        *first = *d;
        *second = *d + D / 2;
    } else {
        *d = c / 2;
        *first = 2 * *d;
        *second = 2 * *d + 1;
    }
}

/* The explicit rotation of one head vector, in double (into out). */
static void rope_formula(const float *in, double *out, int64_t D, int64_t pos, double base,
                         eng_rope_style style)
{
    for (int64_t c = 0; c < D; c++)
        out[c] = in[c];
    for (int64_t d = 0; d < D / 2; d++) {
        int64_t i = style == ENG_ROPE_HALF ? d : 2 * d;
        int64_t j = style == ENG_ROPE_HALF ? d + D / 2 : 2 * d + 1;
        double theta = (double)pos * pow(base, -2.0 * (double)d / (double)D);
        out[i] = (double)in[i] * cos(theta) - (double)in[j] * sin(theta);
        out[j] = (double)in[i] * sin(theta) + (double)in[j] * cos(theta);
    }
}

static const char *style_name(eng_rope_style s)
{
    return s == ENG_ROPE_HALF ? "half" : "interleaved";
}

/* ---- RoPE --------------------------------------------------------------------------------- */

/* A unit vector e_c turns only within its own pair: half pairs (d, d + D/2), interleaved pairs
 * (2d, 2d + 1); the first of a pair goes to (cos, sin), the second to (-sin, cos). */
static void test_rope_rotates_the_documented_pairs(void)
{
    const int64_t D = 8, pos = 3;
    const float base = 500.0f;
    for (int st = 0; st < 2; st++) {
        eng_rope_style style = st ? ENG_ROPE_INTERLEAVED : ENG_ROPE_HALF;
        for (int64_t c = 0; c < D; c++) {
            float v[8] = {0};
            v[c] = 1.0f;
            eng_rope_apply(v, 1, D, 1, D, pos, base, style);
            int64_t first, second, d;
            rope_pair(style, D, c, &first, &second, &d);
            double theta = (double)pos * pow((double)base, -2.0 * (double)d / (double)D);
            double want[8] = {0};
            if (c == first) {
                want[first] = cos(theta);
                want[second] = sin(theta);
            } else {
                want[first] = -sin(theta);
                want[second] = cos(theta);
            }
            for (int64_t k = 0; k < D; k++)
                CHECKF(fabs((double)v[k] - want[k]) <= 1e-6,
                       "%s style, e_%lld at position %lld: channel %lld is %.9g, expected %.9g",
                       style_name(style), (long long)c, (long long)pos, (long long)k, (double)v[k],
                       want[k]);
        }
    }
}

/* Random rows of several heads, a row stride wider than the heads (the gap stays untouched),
 * positions from pos0, several head sizes and bases: every element is the formula's. */
static void test_rope_matches_rotation_formula(void)
{
    uint64_t rng = 11;
    const struct {
        int64_t D, heads, tokens, pos0;
        float base;
    } cases[] = {
        {2, 1, 3, 0, 10000.0f}, {8, 2, 5, 7, 10000.0f},   {16, 3, 4, 100, 500.0f},
        {64, 2, 3, 1000, 1e6f}, {32, 1, 2, -5, 10000.0f},
    };
    for (size_t n = 0; n < sizeof cases / sizeof cases[0]; n++) {
        int64_t D = cases[n].D, H = cases[n].heads, T = cases[n].tokens, ld = H * D + 3;
        for (int st = 0; st < 2; st++) {
            eng_rope_style style = st ? ENG_ROPE_INTERLEAVED : ENG_ROPE_HALF;
            float *x = calloc((size_t)(T * ld), sizeof(float));
            float *x0 = calloc((size_t)(T * ld), sizeof(float));
            double *want = calloc((size_t)D, sizeof(double));
            if (!x || !x0 || !want) {
                CHECK(!"out of memory");
                free(x), free(x0), free(want);
                return;
            }
            for (int64_t i = 0; i < T * ld; i++)
                x[i] = x0[i] = rng_sym(&rng, 1.0);
            eng_rope_apply(x, T, ld, H, D, cases[n].pos0, cases[n].base, style);
            double worst = 0;
            for (int64_t t = 0; t < T; t++) {
                for (int64_t h = 0; h < H; h++) {
                    rope_formula(x0 + t * ld + h * D, want, D, cases[n].pos0 + t,
                                 (double)cases[n].base, style);
                    for (int64_t c = 0; c < D; c++)
                        worst = fmax(worst, fabs((double)x[t * ld + h * D + c] - want[c]));
                }
                for (int64_t c = H * D; c < ld; c++)
                    CHECKF(x[t * ld + c] == x0[t * ld + c],
                           "the gap after the heads of row %lld changed", (long long)t);
            }
            CHECKF(worst <= 1e-6, "%s style, D %lld, %lld heads, pos0 %lld, base %g: max error %g",
                   style_name(style), (long long)D, (long long)H, (long long)cases[n].pos0,
                   (double)cases[n].base, worst);
            free(x);
            free(x0);
            free(want);
        }
    }
}

/* Rotations keep each head's length. */
static void test_rope_preserves_norms(void)
{
    uint64_t rng = 12;
    enum { D = 64, H = 3, T = 9 };
    for (int st = 0; st < 2; st++) {
        eng_rope_style style = st ? ENG_ROPE_INTERLEAVED : ENG_ROPE_HALF;
        static float x[T * H * D], x0[T * H * D];
        for (int i = 0; i < T * H * D; i++)
            x[i] = x0[i] = rng_sym(&rng, 1.0);
        eng_rope_apply(x, T, H * D, H, D, 40, 10000.0f, style);
        double moved = 0;
        for (int r = 0; r < T * H; r++) {
            double n0 = 0, n1 = 0;
            for (int c = 0; c < D; c++) {
                n0 += (double)x0[r * D + c] * x0[r * D + c];
                n1 += (double)x[r * D + c] * x[r * D + c];
                moved = fmax(moved, fabs((double)x[r * D + c] - x0[r * D + c]));
            }
            CHECKF(fabs(sqrt(n1) - sqrt(n0)) <= 1e-5 * sqrt(n0),
                   "%s style: head row %d norm %.9g became %.9g", style_name(style), r, sqrt(n0),
                   sqrt(n1));
        }
        CHECKF(moved > 0.1, "%s style: the rotation barely moved anything (%g)", style_name(style),
               moved);
    }
}

static double dot(const float *a, const float *b, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += (double)a[i] * b[i];
    return s;
}

/* Rotate q to position m and k to n, then both shifted by the same amount: q.k is the same
 * (within 1e-4 for unit vectors); it does change with the distance m - n. */
static void test_rope_scores_depend_only_on_relative_position(void)
{
    uint64_t rng = 13;
    enum { D = 64 };
    const int64_t pairs[][2] = {{0, 0}, {5, 2}, {2, 5}, {17, 3}, {100, 99}, {1000, 1}};
    const int64_t shifts[] = {1, 7, 250, 4096};
    for (int st = 0; st < 2; st++) {
        eng_rope_style style = st ? ENG_ROPE_INTERLEAVED : ENG_ROPE_HALF;
        float q0[D], k0[D];
        for (int c = 0; c < D; c++) {
            q0[c] = rng_sym(&rng, 1.0);
            k0[c] = rng_sym(&rng, 1.0);
        }
        double nq = sqrt(dot(q0, q0, D)), nk = sqrt(dot(k0, k0, D));
        for (int c = 0; c < D; c++) {
            q0[c] = (float)(q0[c] / nq);
            k0[c] = (float)(k0[c] / nk);
        }
        double spread_lo = INFINITY, spread_hi = -INFINITY;
        for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++) {
            float q[D], k[D];
            memcpy(q, q0, sizeof q);
            memcpy(k, k0, sizeof k);
            eng_rope_apply(q, 1, D, 1, D, pairs[p][0], 10000.0f, style);
            eng_rope_apply(k, 1, D, 1, D, pairs[p][1], 10000.0f, style);
            double base_dot = dot(q, k, D);
            spread_lo = fmin(spread_lo, base_dot);
            spread_hi = fmax(spread_hi, base_dot);
            for (size_t s = 0; s < sizeof shifts / sizeof shifts[0]; s++) {
                memcpy(q, q0, sizeof q);
                memcpy(k, k0, sizeof k);
                eng_rope_apply(q, 1, D, 1, D, pairs[p][0] + shifts[s], 10000.0f, style);
                eng_rope_apply(k, 1, D, 1, D, pairs[p][1] + shifts[s], 10000.0f, style);
                double shifted = dot(q, k, D);
                CHECKF(fabs(shifted - base_dot) <= 1e-4,
                       "%s style: q at %lld, k at %lld give %.9g; shifted by %lld: %.9g",
                       style_name(style), (long long)pairs[p][0], (long long)pairs[p][1], base_dot,
                       (long long)shifts[s], shifted);
            }
        }
        /* The relative position must matter, or the check above proves nothing. */
        CHECKF(spread_hi - spread_lo > 0.05, "%s style: q.k hardly depends on m - n (%g..%g)",
               style_name(style), spread_lo, spread_hi);
    }
}

/* ---- Sinusoid ----------------------------------------------------------------------------- */

/* Added (not stored) to rows of a strided buffer, at positions pos0.., even and odd widths. */
static void test_sinusoidal_matches_formula(void)
{
    uint64_t rng = 21;
    const struct {
        int64_t dim, tokens, pos0;
    } cases[] = {{4, 3, 0}, {16, 5, 0}, {16, 5, 7}, {7, 4, 3}, {512, 3, 2000}};
    for (size_t n = 0; n < sizeof cases / sizeof cases[0]; n++) {
        int64_t E = cases[n].dim, T = cases[n].tokens, ld = E + 2;
        float *x = calloc((size_t)(T * ld), sizeof(float));
        float *x0 = calloc((size_t)(T * ld), sizeof(float));
        if (!x || !x0) {
            CHECK(!"out of memory");
            free(x), free(x0);
            return;
        }
        for (int64_t i = 0; i < T * ld; i++)
            x[i] = x0[i] = rng_sym(&rng, 1.0);
        eng_sinusoidal_add(x, T, ld, E, cases[n].pos0);
        double worst = 0;
        for (int64_t t = 0; t < T; t++) {
            double p = (double)(cases[n].pos0 + t);
            for (int64_t c = 0; c < E; c++) {
                double angle = p / pow(10000.0, 2.0 * (double)(c / 2) / (double)E);
                double pe = c % 2 == 0 ? sin(angle) : cos(angle);
                worst = fmax(worst, fabs((double)x[t * ld + c] - ((double)x0[t * ld + c] + pe)));
            }
            for (int64_t c = E; c < ld; c++)
                CHECKF(x[t * ld + c] == x0[t * ld + c], "dim %lld: the row gap changed",
                       (long long)E);
        }
        CHECKF(worst <= 1e-6, "dim %lld, %lld tokens from %lld: max error %g", (long long)E,
               (long long)T, (long long)cases[n].pos0, worst);
        free(x);
        free(x0);
    }
}

static json_t *load_golden(void)
{
    return json_load_file(GOLDEN_PATH, 0, NULL);
}

/* seed_cases.json: "sinusoidal positional encoding, position 1, d=4". */
static void test_golden_sinusoid_position_1_d4(void)
{
    json_t *root = load_golden();
    CHECKF(root != NULL, "cannot read %s", GOLDEN_PATH);
    if (!root)
        return;
    int found = 0;
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(root, "cases"), i, c)
    {
        json_t *enc = json_object_get(c, "encoding");
        if (!enc)
            continue;
        found++;
        int64_t pos = (int64_t)json_integer_value(json_object_get(c, "position"));
        int64_t d = (int64_t)json_integer_value(json_object_get(c, "d"));
        CHECK(d > 0 && d <= 64 && (size_t)d == json_array_size(enc));
        if (!(d > 0 && d <= 64 && (size_t)d == json_array_size(enc)))
            continue;
        float x[64] = {0};
        eng_sinusoidal_add(x, 1, d, d, pos);
        for (int64_t k = 0; k < d; k++) {
            double want = json_number_value(json_array_get(enc, (size_t)k));
            /* Golden values carry 8 decimals; fp32 adds ~6e-8. */
            CHECKF(fabs((double)x[k] - want) <= 1e-6, "PE(%lld, %lld) = %.9g, golden %.8f",
                   (long long)pos, (long long)k, (double)x[k], want);
        }
    }
    CHECKF(found == 1, "expected one sinusoid case in the golden file, found %d", found);
    json_decref(root);
}

/* ---- ALiBi -------------------------------------------------------------------------------- */

static void test_alibi_default_slopes_for_8_heads_are_powers_of_two(void)
{
    float s[8];
    eng_alibi_default_slopes(8, s);
    for (int h = 0; h < 8; h++)
        CHECKF(s[h] == ldexpf(1.0f, -(h + 1)), "head %d: %.9g, expected 2^-%d", h, (double)s[h],
               h + 1);
}

/* 12 heads: 2^-1..2^-8 (the 8-head set), then 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5 (every other slope
 * of the 16-head set); other counts against ref_alibi_default_slopes. */
static void test_alibi_default_slopes_for_other_head_counts(void)
{
    float s[64];
    double want12[12];
    for (int h = 0; h < 8; h++)
        want12[h] = exp2(-(double)(h + 1));
    for (int h = 0; h < 4; h++)
        want12[8 + h] = exp2(-0.5 - (double)h);
    eng_alibi_default_slopes(12, s);
    for (int h = 0; h < 12; h++)
        CHECKF(fabs((double)s[h] - want12[h]) <= 1e-7 * want12[h],
               "12 heads, head %d: %.9g vs %.9g", h, (double)s[h], want12[h]);

    const int64_t counts[] = {1, 2, 3, 5, 6, 7, 12, 16, 20, 24, 48, 64};
    for (size_t n = 0; n < sizeof counts / sizeof counts[0]; n++) {
        double ref[64];
        ref_alibi_default_slopes(counts[n], ref);
        eng_alibi_default_slopes(counts[n], s);
        for (int64_t h = 0; h < counts[n]; h++)
            CHECKF(fabs((double)s[h] - ref[h]) <= 1e-7 * ref[h],
                   "%lld heads, head %lld: %.9g vs %.9g", (long long)counts[n], (long long)h,
                   (double)s[h], ref[h]);
    }
}

/* ---- Half precision ----------------------------------------------------------------------- */

static bool same_float(float a, double want)
{
    if (isnan(want))
        return isnan(a);
    return (double)a == want && !signbit(a) == !signbit(want);
}

static void test_f16_known_bit_patterns(void)
{
    const struct {
        uint16_t bits;
        double value;
    } cases[] = {
        {0x3C00, 1.0},
        {0xC000, -2.0},
        {0x7BFF, 65504.0},
        {0x0001, 0x1.0p-24},        /* the smallest subnormal */
        {0x03FF, 1023 * 0x1.0p-24}, /* the largest subnormal */
        {0x0400, 0x1.0p-14},        /* the smallest normal */
        {0x3555, 0x1.554p-2},       /* 0.333251953125 */
        {0x7C00, INFINITY},
        {0xFC00, -INFINITY},
        {0x0000, 0.0},
        {0x8000, -0.0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        float f = eng_f16_to_f32(cases[i].bits);
        CHECKF(same_float(f, cases[i].value), "f16 0x%04x -> %.9g, expected %.9g",
               (unsigned)cases[i].bits, (double)f, cases[i].value);
    }
    const uint16_t nans[] = {0x7E00, 0x7C01, 0xFE00, 0x7FFF};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++)
        CHECKF(isnan(eng_f16_to_f32(nans[i])), "f16 0x%04x must stay NaN", (unsigned)nans[i]);
}

/* Every pattern: (-1)^s 2^(e-15) (1 + m/1024) for normals, (-1)^s 2^-14 m/1024 for subnormals,
 * infinities and NaNs at e = 31. */
static void test_f16_every_pattern_is_exact(void)
{
    int wrong = 0;
    for (uint32_t h = 0; h <= 0xFFFF; h++) {
        int s = (int)(h >> 15), e = (int)((h >> 10) & 0x1F), m = (int)(h & 0x3FF);
        double v = e == 31  ? (m ? NAN : INFINITY)
                   : e == 0 ? ldexp((double)m, -24)
                            : ldexp(1.0 + (double)m / 1024.0, e - 15);
        if (s)
            v = -v;
        float f = eng_f16_to_f32((uint16_t)h);
        if (!same_float(f, v) && wrong++ < 5)
            CHECKF(false, "f16 0x%04x -> %.9g, expected %.9g", (unsigned)h, (double)f, v);
    }
    CHECKF(wrong == 0, "%d fp16 patterns convert wrongly", wrong);
}

static void test_bf16_known_bit_patterns(void)
{
    const struct {
        uint16_t bits;
        double value;
    } cases[] = {
        {0x3F80, 1.0},        {0xC000, -2.0},
        {0x4780, 65536.0},    {0x477F, 65280.0}, /* the bf16 neighbour below 65504 */
        {0x7F7F, 0x1.FEp127},                    /* the largest finite */
        {0x0001, 0x1.0p-133},                    /* the smallest subnormal */
        {0x0080, 0x1.0p-126},                    /* the smallest normal */
        {0x7F80, INFINITY},   {0xFF80, -INFINITY},
        {0x0000, 0.0},        {0x8000, -0.0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        float f = eng_bf16_to_f32(cases[i].bits);
        CHECKF(same_float(f, cases[i].value), "bf16 0x%04x -> %.9g, expected %.9g",
               (unsigned)cases[i].bits, (double)f, cases[i].value);
    }
    const uint16_t nans[] = {0x7FC0, 0x7F81, 0xFFC0, 0x7FFF};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++)
        CHECKF(isnan(eng_bf16_to_f32(nans[i])), "bf16 0x%04x must stay NaN", (unsigned)nans[i]);
}

/* Every pattern: (-1)^s 2^(e-127) (1 + m/128), subnormals 2^-126 m/128, e = 255 inf/NaN. */
static void test_bf16_every_pattern_is_exact(void)
{
    int wrong = 0;
    for (uint32_t h = 0; h <= 0xFFFF; h++) {
        int s = (int)(h >> 15), e = (int)((h >> 7) & 0xFF), m = (int)(h & 0x7F);
        double v = e == 255 ? (m ? NAN : INFINITY)
                   : e == 0 ? ldexp((double)m, -133)
                            : ldexp(1.0 + (double)m / 128.0, e - 127);
        if (s)
            v = -v;
        float f = eng_bf16_to_f32((uint16_t)h);
        if (!same_float(f, v) && wrong++ < 5)
            CHECKF(false, "bf16 0x%04x -> %.9g, expected %.9g", (unsigned)h, (double)f, v);
    }
    CHECKF(wrong == 0, "%d bf16 patterns convert wrongly", wrong);
}

int main(void)
{
    if (test_kernels_skip())
        return 0;
    RUN(test_rope_rotates_the_documented_pairs);
    RUN(test_rope_matches_rotation_formula);
    RUN(test_rope_preserves_norms);
    RUN(test_rope_scores_depend_only_on_relative_position);
    RUN(test_sinusoidal_matches_formula);
    RUN(test_golden_sinusoid_position_1_d4);
    RUN(test_alibi_default_slopes_for_8_heads_are_powers_of_two);
    RUN(test_alibi_default_slopes_for_other_head_counts);
    RUN(test_f16_known_bit_patterns);
    RUN(test_f16_every_pattern_is_exact);
    RUN(test_bf16_known_bit_patterns);
    RUN(test_bf16_every_pattern_is_exact);
    return check_report();
}
