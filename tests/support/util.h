/*
 * util.h - small helpers every test binary wants: allocation that cannot fail quietly, the
 * kernel-set skip, and (through rng.h, included here) the fixed-seed random generator.
 *
 *     uint64_t rng = 42;
 *     float *x = xcalloc(n, sizeof *x);
 *     for (size_t i = 0; i < n; i++)
 *         x[i] = rng_sym(&rng, 1.0);      // uniform in [-1, 1)
 */
#ifndef ATTND_TESTS_UTIL_H
#define ATTND_TESTS_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tests/support/rng.h"

/* For the engine suites, which the Makefile runs once per kernel set with ATTND_KERNELS set
 * (and some with ATTND_BF16): passes both to the engine (test_engine_init, engine_env.h), then
 * true (after printing a skip line naming the set and "0 passed, 0 failed") when this CPU or
 * OS cannot run the set, so that the binary ends at once; otherwise prints the set in use. A
 * value that is none of its variable's names ends the process with a FAIL line (exit 1). */
bool test_kernels_skip(void);

/* True when ATTND_TEST_QUICK is set to anything but "" or "0" (the sanitizer builds): suites
 * then use smaller sizes. */
bool test_quick(void);

typedef struct eng_pool eng_pool;

/* The start of an engine suite's main, after which it RUNs its tests:
 *
 *     int status;
 *     if (test_engine_start(&pool, &status))
 *         return status;   // 0: the kernel set is skipped here; 1: no pool (printed)
 *
 * test_kernels_skip, then *pool, a pool of a worker per core. */
bool test_engine_start(eng_pool **pool, int *status);

/* calloc that aborts with a message when memory runs out (a test cannot go on without it). */
void *xcalloc(size_t n, size_t size);

/* Memory whose last byte is followed by an inaccessible page, so that a read past it faults
 * in every build (the sanitizers do not see masked vector loads); free with guarded_free. */
typedef struct {
    void *map;
    size_t len;
} guarded;

/* `bytes` bytes (zeroed) that end where the inaccessible page begins. Aborts on failure. */
void *guarded_alloc(size_t bytes, guarded *g);
void guarded_free(guarded *g);

/* src[0..n) compressed by zlib at level 6 into a malloc'd buffer (*out_len bytes), windowBits
 * `wbits`: 15 the zlib format (HTTP's deflate), -15 raw deflate, 31 gzip. Aborts on failure. */
char *zlib_pack(const char *src, size_t n, int wbits, size_t *out_len);

#endif
