/* rng.c - splitmix64 and the helpers over it (see rng.h). */
#include "rng.h"

#include <assert.h>
#include <string.h>

uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

uint32_t rng_u32(uint64_t *s)
{
    return (uint32_t)(rng_next(s) >> 32);
}

double rng_unit(uint64_t *s)
{
    return (double)(rng_next(s) >> 11) * 0x1.0p-53;
}

float rng_sym(uint64_t *s, double amp)
{
    return (float)((2.0 * rng_unit(s) - 1.0) * amp);
}

void rng_fill(uint64_t *s, float *x, size_t n, double amp)
{
    for (size_t i = 0; i < n; i++)
        x[i] = rng_sym(s, amp);
}

double rng_range(uint64_t *s, double lo, double hi)
{
    return lo + (hi - lo) * rng_unit(s);
}

int64_t rng_int(uint64_t *s, int64_t lo, int64_t hi)
{
    assert(lo <= hi);
    return lo + (int64_t)(rng_next(s) % ((uint64_t)(hi - lo) + 1));
}

uint64_t rng_below(uint64_t *s, uint64_t n)
{
    assert(n > 0);
    return rng_next(s) % n;
}

void rng_bytes(uint64_t *s, void *dst, size_t n)
{
    unsigned char *p = dst;
    while (n > 0) {
        uint64_t x = rng_next(s);
        size_t k = n < sizeof x ? n : sizeof x;
        memcpy(p, &x, k);
        p += k;
        n -= k;
    }
}
