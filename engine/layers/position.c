/* position.c - positional encodings: the ALiBi slopes (Press et al., "Train Short, Test Long"). */
#include <math.h>

#include "engine/internal.h"

/* Slope h of the geometric sequence for a power-of-two head count n: 2^(-8(h+1)/n). */
static float power_of_two_slope(int64_t n, int64_t h)
{
    return (float)exp2(-8.0 * (double)(h + 1) / (double)n);
}

void eng_alibi_default_slopes(int64_t heads, float *slopes)
{
    int64_t n = 1;
    while (n * 2 <= heads)
        n *= 2;
    for (int64_t h = 0; h < n; h++)
        slopes[h] = power_of_two_slope(n, h);
    /* The rest interleave between those: every other slope of the sequence for 2n heads. */
    for (int64_t h = n; h < heads; h++)
        slopes[h] = power_of_two_slope(2 * n, 2 * (h - n));
}

/* Angle of pair d at position p for a rotation of `dim` channels: p * base^(-2d/dim). Double,
 * so that positions in the tens of thousands keep their precision. */
static double pair_angle(int64_t pos, int64_t d, int64_t dim, double base)
{
    return (double)pos * pow(base, -2.0 * (double)d / (double)dim);
}

void eng_rope_apply(float *x, int64_t tokens, int64_t ld, int64_t heads, int64_t head_dim,
                    int64_t pos0, float base, eng_rope_style style)
{
    int64_t half = head_dim / 2;
    /* Every head of a token turns by the same angles: compute them once per token. */
    double cs[2 * 512];
    for (int64_t t = 0; t < tokens; t++) {
        float *row = x + t * ld;
        for (int64_t d0 = 0; d0 < half; d0 += 512) {
            int64_t n = half - d0 < 512 ? half - d0 : 512;
            for (int64_t d = 0; d < n; d++) {
                double angle = pair_angle(pos0 + t, d0 + d, head_dim, (double)base);
                cs[2 * d] = cos(angle);
                cs[2 * d + 1] = sin(angle);
            }
            for (int64_t h = 0; h < heads; h++) {
                float *v = row + h * head_dim;
                for (int64_t d = 0; d < n; d++) {
                    int64_t i = style == ENG_ROPE_HALF ? d0 + d : 2 * (d0 + d);
                    int64_t j = style == ENG_ROPE_HALF ? d0 + d + half : 2 * (d0 + d) + 1;
                    double c = cs[2 * d], s = cs[2 * d + 1], a = v[i], b = v[j];
                    v[i] = (float)(a * c - b * s);
                    v[j] = (float)(a * s + b * c);
                }
            }
        }
    }
}

void eng_sinusoidal_add(float *x, int64_t tokens, int64_t ld, int64_t dim, int64_t pos0)
{
    for (int64_t t = 0; t < tokens; t++) {
        float *row = x + t * ld;
        for (int64_t i = 0; 2 * i < dim; i++) {
            double angle = pair_angle(pos0 + t, i, dim, 10000.0);
            row[2 * i] += (float)sin(angle);
            if (2 * i + 1 < dim)
                row[2 * i + 1] += (float)cos(angle);
        }
    }
}
