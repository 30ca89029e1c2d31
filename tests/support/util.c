/* util.c - allocation and the kernel-set skip for the tests (see util.h). */
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
