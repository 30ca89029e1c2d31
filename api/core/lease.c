/*
 * lease.c - one request's hold on the daemon: its bytes in the memory budget and its deadline.
 *
 * Every layer that allocates for a request (the server's body buffer, the parse tree, decoded
 * tensors, engine scratch, the reply text, a gzip buffer) reserves through the request's one
 * lease, so that "could this request ever fit?" is asked of everything it holds, and one call
 * at completion returns whatever is left however the request ended.
 */
#include <assert.h>
#include <string.h>

#include "api/api.h"

void api_lease_start(api_lease *lease, api_budget *budget, int64_t start_ns, int64_t timeout_ms)
{
    memset(lease, 0, sizeof *lease);
    lease->budget = budget;
    lease->start_ns = start_ns;
    atomic_init(&lease->ctl.cancel, false);
    lease->ctl.deadline_ns = 0;
    api_lease_shorten(lease, timeout_ms);
}

api_budget_result api_lease_reserve(api_lease *lease, size_t bytes)
{
    if (!lease->budget)
        return API_BUDGET_OK;
    size_t total = api_budget_total(lease->budget);
    /* With what it holds already, more than the whole budget: no retry could cure it. */
    if (bytes > total || lease->held > total - bytes)
        return API_BUDGET_NEVER;
    api_budget_result r = api_budget_reserve(lease->budget, bytes);
    if (r == API_BUDGET_OK)
        lease->held += bytes;
    return r;
}

void api_lease_give_back(api_lease *lease, size_t bytes)
{
    if (!lease->budget || bytes == 0)
        return;
    /* Giving back more than was reserved is a bug in the caller's bookkeeping. */
    assert(bytes <= lease->held);
    api_budget_release(lease->budget, bytes);
    lease->held -= bytes;
}

void api_lease_shorten(api_lease *lease, int64_t timeout_ms)
{
    if (timeout_ms <= 0)
        return;
    int64_t deadline = timeout_ms > (INT64_MAX - lease->start_ns) / 1000000
                           ? INT64_MAX
                           : lease->start_ns + timeout_ms * 1000000;
    if (lease->ctl.deadline_ns == 0 || deadline < lease->ctl.deadline_ns)
        lease->ctl.deadline_ns = deadline;
}

void api_lease_end(api_lease *lease)
{
    api_lease_give_back(lease, lease->held);
}
