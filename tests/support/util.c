/* util.c - allocation, random numbers and the kernel-set skip for the tests (see util.h). */
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    if (!p) {
        fprintf(stderr, "out of memory (%zu x %zu bytes)\n", n, size);
        abort();
    }
    return p;
}

uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

double rng_unit(uint64_t *s)
{
    return (double)(rng_next(s) >> 11) * 0x1.0p-53;
}

float rng_sym(uint64_t *s, double amp)
{
    return (float)((2.0 * rng_unit(s) - 1.0) * amp);
}

int64_t rng_int(uint64_t *s, int64_t lo, int64_t hi)
{
    return lo + (int64_t)(rng_next(s) % (uint64_t)(hi - lo + 1));
}

bool test_kernels_skip(void)
{
    const char *name = getenv("ATTND_KERNELS");
    if (name && strcmp(name, "auto") != 0 && !eng_kernels_supported(name)) {
        printf("skip: kernel set %s: this CPU or OS does not support it\n0 passed, 0 failed\n",
               name);
        return true;
    }
    printf("kernels: %s\n", eng_kernels_name());
    return false;
}
