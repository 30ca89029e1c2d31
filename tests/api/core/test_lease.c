/* test_lease.c - api/core/lease.c: one request's hold on the memory budget and its deadline. */
#include <stdint.h>

#include "api/api.h"
#include "tests/support/check.h"

static void test_a_new_lease_holds_nothing_and_is_not_cancelled(void)
{
    api_budget *b = api_budget_new(1000);
    api_lease l;
    api_lease_start(&l, b, 5000000000, 0);
    CHECK_EQ_INT(l.held, 0);
    CHECK(l.start_ns == 5000000000);
    CHECK(l.ctl.deadline_ns == 0); /* no timeout: no deadline */
    CHECK_EQ_INT(eng_ctl_check(&l.ctl), ENG_OK);
    CHECK_EQ_INT(api_budget_in_use(b), 0);
    api_budget_free(b);
}

static void test_reservations_add_up_and_end_returns_them_once(void)
{
    api_budget *b = api_budget_new(1000);
    api_lease l;
    api_lease_start(&l, b, eng_now_ns(), 0);
    CHECK_EQ_INT(api_lease_reserve(&l, 300), API_BUDGET_OK);
    CHECK_EQ_INT(api_lease_reserve(&l, 200), API_BUDGET_OK);
    CHECK_EQ_INT(l.held, 500);
    CHECK_EQ_INT(api_budget_in_use(b), 500);
    api_lease_give_back(&l, 200); /* freed early */
    CHECK_EQ_INT(l.held, 300);
    CHECK_EQ_INT(api_budget_in_use(b), 300);
    api_lease_end(&l);
    CHECK_EQ_INT(api_budget_in_use(b), 0);
    api_lease_end(&l); /* a second end gives back nothing more */
    CHECK_EQ_INT(api_budget_in_use(b), 0);
    api_budget_free(b);
}

/* What the lease holds counts: a request whose next part could never fit beside what it holds
 * is told so (413), while one that only waits on others is told to retry (429). */
static void test_never_counts_what_the_lease_holds(void)
{
    api_budget *b = api_budget_new(1000);
    api_lease l, other;
    api_lease_start(&l, b, eng_now_ns(), 0);
    api_lease_start(&other, b, eng_now_ns(), 0);
    CHECK_EQ_INT(api_lease_reserve(&l, 1001), API_BUDGET_NEVER);
    CHECK_EQ_INT(api_lease_reserve(&l, 600), API_BUDGET_OK);
    CHECK_EQ_INT(api_lease_reserve(&l, 401), API_BUDGET_NEVER);
    CHECK_EQ_INT(l.held, 600);
    CHECK_EQ_INT(api_lease_reserve(&other, 401), API_BUDGET_NOT_NOW);
    CHECK_EQ_INT(api_lease_reserve(&other, 400), API_BUDGET_OK);
    CHECK_EQ_INT(api_budget_in_use(b), 1000);
    api_lease_end(&l);
    api_lease_end(&other);
    CHECK_EQ_INT(api_budget_in_use(b), 0);
    api_budget_free(b);
}

static void test_without_a_budget_everything_fits(void)
{
    api_lease l;
    api_lease_start(&l, NULL, eng_now_ns(), 0);
    CHECK_EQ_INT(api_lease_reserve(&l, SIZE_MAX), API_BUDGET_OK);
    CHECK_EQ_INT(l.held, 0);
    api_lease_give_back(&l, 100);
    api_lease_end(&l);
    CHECK_EQ_INT(l.held, 0);
}

/* The deadline is set at the start; the layers below may only bring it forward. */
static void test_the_deadline_only_moves_earlier(void)
{
    api_lease l;
    const int64_t t0 = 1000000000;
    api_lease_start(&l, NULL, t0, 500);
    CHECK(l.ctl.deadline_ns == t0 + 500 * INT64_C(1000000));
    api_lease_shorten(&l, 800); /* later: ignored */
    CHECK(l.ctl.deadline_ns == t0 + 500 * INT64_C(1000000));
    api_lease_shorten(&l, 0); /* none given: ignored */
    api_lease_shorten(&l, -5);
    CHECK(l.ctl.deadline_ns == t0 + 500 * INT64_C(1000000));
    api_lease_shorten(&l, 20);
    CHECK(l.ctl.deadline_ns == t0 + 20 * INT64_C(1000000));

    /* Without a deadline the first timeout sets one; a huge one saturates. */
    api_lease_start(&l, NULL, t0, 0);
    api_lease_shorten(&l, INT64_MAX);
    CHECK(l.ctl.deadline_ns == INT64_MAX);
    api_lease_shorten(&l, 1);
    CHECK(l.ctl.deadline_ns == t0 + INT64_C(1000000));
}

static void test_a_passed_deadline_and_a_cancel_reach_the_engine(void)
{
    api_lease l;
    api_lease_start(&l, NULL, eng_now_ns() - 2000000000, 1000);
    CHECK_EQ_INT(eng_ctl_check(&l.ctl), ENG_EDEADLINE);
    api_lease_start(&l, NULL, eng_now_ns(), 60000);
    CHECK_EQ_INT(eng_ctl_check(&l.ctl), ENG_OK);
    atomic_store(&l.ctl.cancel, true);
    CHECK_EQ_INT(eng_ctl_check(&l.ctl), ENG_ECANCELLED);
}

int main(void)
{
    RUN(test_a_new_lease_holds_nothing_and_is_not_cancelled);
    RUN(test_reservations_add_up_and_end_returns_them_once);
    RUN(test_never_counts_what_the_lease_holds);
    RUN(test_without_a_budget_everything_fits);
    RUN(test_the_deadline_only_moves_earlier);
    RUN(test_a_passed_deadline_and_a_cancel_reach_the_engine);
    return check_report();
}
