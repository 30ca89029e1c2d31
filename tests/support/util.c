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

bool test_quick(void)
{
    const char *q = getenv("ATTND_TEST_QUICK");
    return q && q[0] && strcmp(q, "0") != 0;
}

bool test_engine_start(eng_pool **pool, int *status)
{
    eng_error err;
    *status = 0;
    if (test_kernels_skip())
        return true;
    *pool = eng_pool_new(0, &err);
    if (!*pool) {
        printf("FAIL eng_pool_new: %s\n0 passed, 1 failed\n", err.message);
        *status = 1;
        return true;
    }
    return false;
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
