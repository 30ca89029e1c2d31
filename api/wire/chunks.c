/*
 * chunks.c - a codec's work in pieces on the engine's pool (chunks.h).
 */
#include "api/wire/chunks.h"

#include <stdatomic.h>

typedef struct {
    api__chunk_fn fn;
    void *ctx;
    size_t n, grain;
    atomic_bool failed;
} chunk_job;

static void chunk_task(void *arg, int64_t index)
{
    chunk_job *job = arg;
    size_t from = (size_t)index * job->grain;
    size_t to = job->n - from < job->grain ? job->n : from + job->grain;
    if (!atomic_load(&job->failed) && !job->fn(job->ctx, from, to))
        atomic_store(&job->failed, true);
}

bool api__chunks_run(eng_pool *pool, size_t n, size_t grain, api__chunk_fn fn, void *ctx)
{
    if (!pool || grain == 0 || n <= grain)
        return false;
    chunk_job job = {.fn = fn, .ctx = ctx, .n = n, .grain = grain};
    atomic_init(&job.failed, false);
    int64_t tasks = (int64_t)((n - 1) / grain + 1);
    return eng_pool_run(pool, chunk_task, &job, tasks, NULL) == ENG_OK && !atomic_load(&job.failed);
}
