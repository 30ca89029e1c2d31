/*
 * budget.c - the global memory budget (--max-memory-bytes) shared by all requests.
 *
 * Linux overcommits: malloc returning non-NULL proves nothing, and the OOM killer would take
 * the whole daemon, not the one request that was too big. So each request reserves its
 * estimated peak (inputs, outputs, reply text, engine scratch) before allocating, and gives it
 * back when it ends. One atomic counter; reserve is a compare-and-swap loop that never waits.
 */
#include <assert.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "api/api.h"

struct api_budget {
    size_t total;
    atomic_size_t in_use;
};

api_budget *api_budget_new(size_t total_bytes)
{
    api_budget *budget = malloc(sizeof *budget);
    if (!budget)
        return NULL;
    budget->total = total_bytes;
    atomic_init(&budget->in_use, 0);
    return budget;
}

void api_budget_free(api_budget *budget)
{
    free(budget);
}

api_budget_result api_budget_reserve(api_budget *budget, size_t bytes)
{
    if (bytes > budget->total)
        return API_BUDGET_NEVER;
    size_t used = atomic_load_explicit(&budget->in_use, memory_order_relaxed);
    do {
        if (bytes > budget->total - used)
            return API_BUDGET_NOT_NOW;
    } while (!atomic_compare_exchange_weak_explicit(&budget->in_use, &used, used + bytes,
                                                    memory_order_relaxed, memory_order_relaxed));
    return API_BUDGET_OK;
}

void api_budget_release(api_budget *budget, size_t bytes)
{
    size_t before = atomic_fetch_sub_explicit(&budget->in_use, bytes, memory_order_relaxed);
    /* Releasing more than was reserved is a bug in the caller's bookkeeping. */
    assert(before >= bytes);
    (void)before;
}

size_t api_budget_in_use(api_budget *budget)
{
    return atomic_load_explicit(&budget->in_use, memory_order_relaxed);
}

size_t api_budget_total(const api_budget *budget)
{
    return budget->total;
}
