/* test_budget.c - api/core/budget.c: reservations never exceed the total, say NEVER for what can
 * never fit and NOT_NOW for what cannot fit yet, and add up exactly under contention. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "tests/support/check.h"

static void test_reserves_up_to_the_total_and_no_further(void)
{
    api_budget *b = api_budget_new(1000);
    CHECK_EQ_INT(api_budget_total(b), 1000);
    CHECK_EQ_INT(api_budget_reserve(b, 600), API_BUDGET_OK);
    CHECK_EQ_INT(api_budget_reserve(b, 400), API_BUDGET_OK);
    CHECK_EQ_INT(api_budget_in_use(b), 1000);
    CHECK_EQ_INT(api_budget_reserve(b, 1), API_BUDGET_NOT_NOW);
    api_budget_release(b, 400);
    CHECK_EQ_INT(api_budget_reserve(b, 401), API_BUDGET_NOT_NOW);
    CHECK_EQ_INT(api_budget_reserve(b, 400), API_BUDGET_OK);
    api_budget_release(b, 1000);
    CHECK_EQ_INT(api_budget_in_use(b), 0);
    api_budget_free(b);
}

static void test_what_can_never_fit_says_so(void)
{
    api_budget *b = api_budget_new(1000);
    CHECK_EQ_INT(api_budget_reserve(b, 1001), API_BUDGET_NEVER);
    CHECK_EQ_INT(api_budget_reserve(b, SIZE_MAX), API_BUDGET_NEVER);
    CHECK_EQ_INT(api_budget_reserve(b, 999), API_BUDGET_OK);
    CHECK_EQ_INT(api_budget_reserve(b, SIZE_MAX - 1), API_BUDGET_NEVER); /* no wrap-around */
    CHECK_EQ_INT(api_budget_reserve(b, 0), API_BUDGET_OK);
    api_budget_release(b, 999);
    api_budget_free(b);
    api_budget_free(NULL);
}

enum { THREADS = 4, ROUNDS = 100000 };

typedef struct {
    api_budget *budget;
    int granted;
} worker_arg;

static void *worker(void *p)
{
    worker_arg *a = p;
    for (int i = 0; i < ROUNDS; i++) {
        size_t n = (size_t)(i % 7 + 1) * 10;
        if (api_budget_reserve(a->budget, n) == API_BUDGET_OK) {
            a->granted++;
            if (api_budget_in_use(a->budget) > api_budget_total(a->budget))
                a->granted = -1000000; /* fails the test below */
            api_budget_release(a->budget, n);
        }
    }
    return NULL;
}

static void test_contended_reservations_add_up(void)
{
    api_budget *b = api_budget_new(150);
    pthread_t t[THREADS];
    worker_arg args[THREADS];
    for (int i = 0; i < THREADS; i++) {
        args[i] = (worker_arg){b, 0};
        pthread_create(&t[i], NULL, worker, &args[i]);
    }
    int granted = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        granted += args[i].granted;
    }
    CHECK(granted > 0);
    CHECK_EQ_INT(api_budget_in_use(b), 0);
    api_budget_free(b);
}

int main(void)
{
    RUN(test_reserves_up_to_the_total_and_no_further);
    RUN(test_what_can_never_fit_says_so);
    RUN(test_contended_reservations_add_up);
    return check_report();
}
