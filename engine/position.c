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
