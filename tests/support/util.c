/* util.c - allocation and the kernel-set skip for the tests (see util.h). */
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <zlib.h>

#include "engine/engine.h"
#include "tests/support/engine_env.h"

void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    if (!p) {
        fprintf(stderr, "out of memory (%zu x %zu bytes)\n", n, size);
        abort();
    }
    return p;
}

char *zlib_pack(const char *src, size_t n, int wbits, size_t *out_len)
{
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    if (deflateInit2(&zs, 6, Z_DEFLATED, wbits, 8, Z_DEFAULT_STRATEGY) != Z_OK)
        abort();
    size_t cap = deflateBound(&zs, (uLong)n) + 64;
    char *out = xcalloc(cap, 1);
    zs.next_in = (Bytef *)(uintptr_t)src;
    zs.avail_in = (uInt)n;
    zs.next_out = (Bytef *)out;
    zs.avail_out = (uInt)cap;
    if (deflate(&zs, Z_FINISH) != Z_STREAM_END)
        abort();
    *out_len = zs.total_out;
    deflateEnd(&zs);
    return out;
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
    char why[320];
    switch (test_engine_init(why, sizeof why)) {
    case TEST_ENGINE_READY:
        printf("kernels: %s\n", eng_kernels_name());
        return false;
    case TEST_ENGINE_UNSUPPORTED:
        printf("skip: %s\n0 passed, 0 failed\n", why);
        return true;
    case TEST_ENGINE_BAD:
        break;
    }
    /* A misspelt variable would otherwise test the defaults under another name. */
    printf("FAIL %s\n0 passed, 1 failed\n", why);
    exit(1);
}

void *guarded_alloc(size_t bytes, guarded *g)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE), data = (bytes + page - 1) / page * page;
    g->len = data + page;
    g->map = mmap(NULL, g->len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (g->map == MAP_FAILED || mprotect((char *)g->map + data, page, PROT_NONE) != 0) {
        fprintf(stderr, "test: cannot map a guarded buffer of %zu bytes\n", bytes);
        abort();
    }
    return (char *)g->map + data - bytes;
}

void guarded_free(guarded *g)
{
    munmap(g->map, g->len);
}
