/* test_buffers.c - engine/buffers.c: big buffers keep their pages for the next request, within
 * the cache limit, and go back to the system when nobody needs them. The cache is
 * process-wide, so every test starts by emptying it. */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "engine/engine.h"
#include "tests/support/check.h"
#include "tests/support/util.h"

#define MiB ((size_t)1 << 20)

static void reset(size_t limit)
{
    eng_buf_cache_limit(0);
    eng_buf_cache_limit(limit);
}

static void test_buffers_are_aligned_and_writable_small_and_big(void)
{
    size_t sizes[] = {1, 63, 64, 4096, MiB - 1, MiB, 3 * MiB + 5};
    reset(0);
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        unsigned char *p = eng_buf_alloc(sizes[i]);
        CHECK(p != NULL);
        if (!p)
            continue;
        CHECK_EQ_INT((uintptr_t)p % 64, 0);
        memset(p, 0xA5, sizes[i]);
        CHECK_EQ_INT(p[sizes[i] - 1], 0xA5);
        eng_buf_free(p);
    }
    eng_buf_free(NULL);
    CHECK_EQ_INT(eng_buf_cached(), 0);
}

static void test_a_freed_big_buffer_serves_the_next_similar_request(void)
{
    reset(64 * MiB);
    char *a = eng_buf_alloc(10 * MiB);
    CHECK(a != NULL);
    memset(a, 1, 10 * MiB);
    eng_buf_free(a);
    CHECK(eng_buf_cached() >= 10 * MiB);
    char *b = eng_buf_alloc(10 * MiB - 100); /* same whole MiBs: the same buffer */
    CHECK(b == a);
    CHECK_EQ_INT(eng_buf_cached(), 0);
    eng_buf_free(b);
    reset(0);
}

static void test_small_buffers_and_a_zero_limit_keep_nothing(void)
{
    reset(64 * MiB);
    eng_buf_free(eng_buf_alloc(1000));
    CHECK_EQ_INT(eng_buf_cached(), 0);
    reset(0);
    eng_buf_free(eng_buf_alloc(8 * MiB));
    CHECK_EQ_INT(eng_buf_cached(), 0);
}

static void test_a_much_bigger_cached_buffer_is_not_wasted_on_a_small_request(void)
{
    reset(64 * MiB);
    char *big = eng_buf_alloc(16 * MiB);
    eng_buf_free(big);
    char *small = eng_buf_alloc(2 * MiB);
    CHECK(small != NULL && small != big);
    CHECK(eng_buf_cached() >= 16 * MiB); /* still there for a big request */
    eng_buf_free(small);
    reset(0);
}

static void test_the_cache_never_holds_more_than_its_limit(void)
{
    char *p[6];
    reset(20 * MiB);
    for (int i = 0; i < 6; i++)
        p[i] = eng_buf_alloc(6 * MiB);
    for (int i = 0; i < 6; i++) {
        eng_buf_free(p[i]);
        CHECK(eng_buf_cached() <= 20 * MiB);
    }
    CHECK(eng_buf_cached() >= 14 * MiB);  /* the most recent ones that fit */
    char *huge = eng_buf_alloc(30 * MiB); /* larger than the limit: never cached */
    eng_buf_free(huge);
    CHECK(eng_buf_cached() <= 20 * MiB);
    eng_buf_cache_limit(7 * MiB); /* lowering the limit releases the excess at once */
    CHECK(eng_buf_cached() <= 7 * MiB);
    reset(0);
}

static void test_many_buffers_cycle_through_the_slots(void)
{
    char *p[40];
    reset(1024 * MiB);
    for (int i = 0; i < 40; i++)
        p[i] = eng_buf_alloc(MiB);
    for (int i = 0; i < 40; i++)
        eng_buf_free(p[i]);
    /* A 1 MiB buffer maps 2 MiB (its header tips it over); at most 16 are kept, however many
     * come back and however high the limit. */
    CHECK(eng_buf_cached() >= 2 * MiB);
    CHECK(eng_buf_cached() <= 16 * 2 * MiB);
    reset(0);
}

static void test_trim_gives_back_buffers_idle_for_long_enough(void)
{
    reset(64 * MiB);
    eng_buf_free(eng_buf_alloc(4 * MiB));
    CHECK_EQ_INT(eng_buf_trim(INT64_C(3600000000000)), 0); /* freed just now: kept */
    CHECK(eng_buf_cached() >= 4 * MiB);
    CHECK(eng_buf_trim(0) >= 4 * MiB);
    CHECK_EQ_INT(eng_buf_cached(), 0);
    reset(0);
}

static void test_impossible_sizes_fail_cleanly(void)
{
    CHECK(eng_buf_alloc(SIZE_MAX) == NULL);
    CHECK(eng_buf_alloc(SIZE_MAX - 64) == NULL);
    CHECK(eng_buf_alloc((size_t)1 << 62) == NULL);
}

static void *churn(void *arg)
{
    uint64_t rng = (uint64_t)(uintptr_t)arg;
    for (int i = 0; i < 200; i++) {
        size_t n = (size_t)rng_int(&rng, 1, 4) * MiB;
        unsigned char *p = eng_buf_alloc(n);
        if (!p)
            return (void *)1;
        p[0] = (unsigned char)i;
        p[n - 1] = (unsigned char)i;
        if (p[0] != (unsigned char)i)
            return (void *)1;
        eng_buf_free(p);
    }
    return NULL;
}

/* Under TSan (make tsan) this also proves the locking. */
static void test_threads_share_the_cache_safely(void)
{
    pthread_t t[4];
    void *failed[4];
    reset(16 * MiB);
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, churn, (void *)(uintptr_t)(i + 1));
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], &failed[i]);
        CHECK(failed[i] == NULL);
    }
    CHECK(eng_buf_cached() <= 16 * MiB);
    reset(0);
}

int main(void)
{
    if (test_kernels_skip())
        return 0;
    RUN(test_buffers_are_aligned_and_writable_small_and_big);
    RUN(test_a_freed_big_buffer_serves_the_next_similar_request);
    RUN(test_small_buffers_and_a_zero_limit_keep_nothing);
    RUN(test_a_much_bigger_cached_buffer_is_not_wasted_on_a_small_request);
    RUN(test_the_cache_never_holds_more_than_its_limit);
    RUN(test_many_buffers_cycle_through_the_slots);
    RUN(test_trim_gives_back_buffers_idle_for_long_enough);
    RUN(test_impossible_sizes_fail_cleanly);
    RUN(test_threads_share_the_cache_safely);
    return check_report();
}
