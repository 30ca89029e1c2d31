/*
 * test_admission.c - the scheduler between admission and the engine pool (server/admission.h):
 * what it learns a request costs, the wait it expects in front of a request, and which waiting
 * request it starts next. Time is passed in, so every case is exact.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "server/admission.h"
#include "tests/support/check.h"

#define MS        ((int64_t)1000 * 1000)
#define ROUTE     3
#define BYTES     ((uint64_t)1 << 20)
#define MAX_SEEN  16
#define NO_DEADLN 0

/* What the scheduler did, in order: each start and each expiry, by entry. */
typedef struct {
    srv_sched_entry *started[MAX_SEEN], *expired[MAX_SEEN];
    uint32_t priority[MAX_SEEN];
    srv_sched_where where[MAX_SEEN];
    int n_started, n_expired;
} seen_t;

static seen_t seen;

static void on_start(void *req, uint32_t pool_priority, srv_sched_where where)
{
    if (seen.n_started < MAX_SEEN) {
        seen.priority[seen.n_started] = pool_priority;
        seen.where[seen.n_started] = where;
        seen.started[seen.n_started++] = req;
    }
}

static void on_expire(void *req)
{
    if (seen.n_expired < MAX_SEEN)
        seen.expired[seen.n_expired++] = req;
}

static const srv_sched_ops ops = {.start = on_start, .expire = on_expire};

static srv_sched *fresh(int slots)
{
    memset(&seen, 0, sizeof seen);
    return srv__sched_new(slots);
}

/* An entry whose req is itself, so that the ops see which one they got. */
static void entry(srv_sched_entry *e, uint64_t bytes, uint32_t level, int64_t deadline,
                  int64_t cost)
{
    memset(e, 0, sizeof *e);
    e->ops = &ops;
    e->req = e;
    e->route = ROUTE;
    e->bytes = bytes;
    e->level = level;
    e->deadline_ns = deadline;
    e->cost_ns = cost;
}

/* Runs one request of `bytes` alone from t0 for `took`: the scheduler learns its cost. */
static void teach(srv_sched *s, uint64_t bytes, int64_t t0, int64_t took)
{
    srv_sched_entry e;
    entry(&e, bytes, 1, NO_DEADLN, 0);
    srv__sched_enqueue(s, &e, t0);
    srv__sched_done(s, &e, SRV_SCHED_LEARN_COST, t0 + took);
}

static void test_cost_is_learned_per_route_and_size(void)
{
    srv_sched *s = fresh(2);
    CHECK_EQ_INT(srv__sched_cost(s, ROUTE, BYTES, NULL), 0); /* nothing known yet */
    teach(s, BYTES, 0, 100 * MS);
    CHECK_EQ_INT(srv__sched_cost(s, ROUTE, BYTES, NULL), 100 * MS);
    /* A quarter octave and an octave up, linearly; two octaves away, unknown; another route,
     * unknown. */
    CHECK_EQ_INT(srv__sched_cost(s, ROUTE, BYTES + BYTES / 4, NULL),
                 (int64_t)(100 * MS * exp2(0.25)));
    CHECK_EQ_INT(srv__sched_cost(s, ROUTE, 2 * BYTES, NULL), 200 * MS);
    CHECK_EQ_INT(srv__sched_cost(s, ROUTE, 4 * BYTES, NULL), 0);
    CHECK_EQ_INT(srv__sched_cost(s, ROUTE + 1, BYTES, NULL), 0);
    /* A slower run moves the estimate half of the way, and the deviation grows; a faster one
     * an eighth (too low an estimate wastes work, too high one only refuses). */
    int64_t margin0 = 0, margin1 = 0;
    srv__sched_cost(s, ROUTE, BYTES, &margin0);
    teach(s, BYTES, 1000 * MS, 200 * MS);
    CHECK_EQ_INT(srv__sched_cost(s, ROUTE, BYTES, &margin1), 150 * MS);
    CHECKF(margin1 > margin0, "margin %lld after a slower run, %lld before", (long long)margin1,
           (long long)margin0);
    teach(s, BYTES, 2000 * MS, 70 * MS);
    CHECK_EQ_INT(srv__sched_cost(s, ROUTE, BYTES, NULL), 140 * MS);
    srv__sched_free(s);
}

/* Admission from what is learned: nothing known admits; a request whose queued work plus its
 * own cost ends past its deadline is refused, told when to retry and why. */
static void test_overloaded_when_wait_and_cost_pass_the_deadline(void)
{
    srv_sched *s = fresh(1);
    srv_sched_refusal r;
    srv_sched_ask ask = {.route = ROUTE, .bytes = BYTES, .level = 1, .left_ns = 50 * MS};
    CHECK(!srv__sched_overloaded(s, &ask, 0, &r)); /* nothing learned yet */
    teach(s, BYTES, 0, 100 * MS);
    CHECK(srv__sched_overloaded(s, &ask, 1000 * MS, &r));
    CHECK_EQ_INT(r.retry_s, 1);
    CHECKF(strstr(r.msg, "100 ms for this request") && strstr(r.msg, "50 ms left"), "%s", r.msg);
    ask.left_ns = 150 * MS;
    CHECK(!srv__sched_overloaded(s, &ask, 1000 * MS, &r));
    /* One running on the only slot since 1000 ms: 100 ms of it left ahead of this one. */
    srv_sched_entry busy;
    entry(&busy, BYTES, 1, NO_DEADLN, 100 * MS);
    srv__sched_enqueue(s, &busy, 1000 * MS);
    CHECK(srv__sched_overloaded(s, &ask, 1000 * MS, &r));
    CHECKF(strstr(r.msg, "about 100 ms of queued work") != NULL, "%s", r.msg);
    srv__sched_done(s, &busy, SRV_SCHED_LEARN_NOTHING, 1100 * MS);
    srv__sched_free(s);
}

/* A request judged from its headers starts once its body has arrived and the work ahead of it is
 * done, whichever is later: the work still uploading counts as queued ahead of it, and its own
 * arrival as a wait of its own, each named in the refusal. An idle pool leaves no margin. */
static void test_overloaded_counts_the_body_s_arrival_and_the_work_still_uploading(void)
{
    srv_sched *s = fresh(1);
    srv_sched_refusal r;
    srv_sched_ask ask = {.route = ROUTE, .bytes = BYTES, .level = 1, .left_ns = 150 * MS};
    teach(s, BYTES, 0, 100 * MS);
    CHECK(!srv__sched_overloaded(s, &ask, 1000 * MS, &r));
    ask.arrive_ns = 40 * MS;
    CHECK(!srv__sched_overloaded(s, &ask, 1000 * MS, &r)); /* 40 + 100 <= 150 */
    ask.arrive_ns = 60 * MS;
    CHECK(srv__sched_overloaded(s, &ask, 1000 * MS, &r));
    CHECKF(strstr(r.msg, "body would take about 60 ms to arrive") != NULL, "%s", r.msg);
    ask.arrive_ns = 0;
    ask.ahead_ns = 60 * MS;
    CHECK(srv__sched_overloaded(s, &ask, 1000 * MS, &r));
    CHECKF(strstr(r.msg, "about 60 ms of queued work (60 ms of it still uploading)") != NULL, "%s",
           r.msg);
    /* Its body arrives while the work ahead runs: the later of the two counts, not their sum. */
    ask.left_ns = 400 * MS;
    ask.arrive_ns = 200 * MS;
    ask.ahead_ns = 150 * MS;
    CHECK(!srv__sched_overloaded(s, &ask, 1000 * MS, &r));
    ask.arrive_ns = 310 * MS;
    CHECK(srv__sched_overloaded(s, &ask, 1000 * MS, &r));
    srv__sched_free(s);
}

static void test_time_shared_with_others_is_divided(void)
{
    srv_sched *s = fresh(2);
    srv_sched_entry a, b;
    /* Two small requests side by side for 100 ms each: each cost half the pool's time. */
    entry(&a, BYTES, 1, NO_DEADLN, 0);
    entry(&b, BYTES, 1, NO_DEADLN, 0);
    srv__sched_enqueue(s, &a, 0);
    srv__sched_enqueue(s, &b, 0);
    CHECK_EQ_INT(seen.n_started, 2);
    srv__sched_done(s, &a, SRV_SCHED_LEARN_COST, 100 * MS);
    CHECK_EQ_INT(srv__sched_cost(s, ROUTE, BYTES, NULL), 50 * MS);
    srv__sched_done(s, &b, SRV_SCHED_LEARN_NOTHING, 100 * MS);
    srv__sched_free(s);
}

static void test_time_waiting_in_the_pool_is_not_cost(void)
{
    srv_sched *s = fresh(2);
    srv_sched_entry e;
    /* Started at 0, behind a long request's task in the pool until 90 ms, done at 100 ms. */
    entry(&e, BYTES, 1, NO_DEADLN, 0);
    srv__sched_enqueue(s, &e, 0);
    srv__sched_begin(s, &e, 90 * MS);
    srv__sched_done(s, &e, SRV_SCHED_LEARN_COST, 100 * MS);
    CHECK_EQ_INT(srv__sched_cost(s, ROUTE, BYTES, NULL), 10 * MS);
    srv__sched_free(s);
}

static void test_at_most_slots_run_and_a_free_slot_starts_the_next(void)
{
    srv_sched *s = fresh(2);
    srv_sched_entry e[3];
    for (int i = 0; i < 3; i++) {
        entry(&e[i], BYTES, 1, NO_DEADLN, 1 * MS);
        srv__sched_enqueue(s, &e[i], i);
    }
    CHECK_EQ_INT(seen.n_started, 2);
    srv__sched_done(s, &e[0], SRV_SCHED_LEARN_NOTHING, 10);
    CHECK_EQ_INT(seen.n_started, 3);
    CHECK(seen.started[2] == &e[2]);
    srv__sched_done(s, &e[1], SRV_SCHED_LEARN_NOTHING, 11);
    srv__sched_done(s, &e[2], SRV_SCHED_LEARN_NOTHING, 12);
    srv__sched_free(s);
}

static void test_one_long_at_a_time_and_short_ones_first(void)
{
    srv_sched *s = fresh(4);
    srv_sched_entry l1, l2, sh;
    entry(&l1, BYTES, 2, NO_DEADLN, 100 * MS);
    entry(&l2, BYTES, 2, NO_DEADLN, 100 * MS);
    entry(&sh, BYTES, 2, NO_DEADLN, 1 * MS);
    srv__sched_enqueue(s, &l1, 0);
    srv__sched_enqueue(s, &l2, 1);
    CHECK_EQ_INT(seen.n_started, 1); /* the second long waits, though slots are free */
    srv__sched_enqueue(s, &sh, 2);
    CHECK_EQ_INT(seen.n_started, 2);
    CHECK(seen.started[1] == &sh);
    /* In the pool, the short request of a level runs before the long one's tasks. */
    CHECKF(seen.priority[1] < seen.priority[0], "short at %u, long at %u", seen.priority[1],
           seen.priority[0]);
    srv__sched_done(s, &l1, SRV_SCHED_LEARN_NOTHING, 100 * MS);
    CHECK_EQ_INT(seen.n_started, 3);
    CHECK(seen.started[2] == &l2);
    srv__sched_done(s, &sh, SRV_SCHED_LEARN_NOTHING, 100 * MS);
    srv__sched_done(s, &l2, SRV_SCHED_LEARN_NOTHING, 200 * MS);
    srv__sched_free(s);
}

/* One worker: a long request holds it, and a short one still starts at once, on the pool's spare
 * thread; one short beside it at most, and the next long waits for a worker of its own. */
static void test_a_short_request_runs_beside_a_long_one(void)
{
    srv_sched *s = fresh(1);
    srv_sched_entry lng, next_lng, sh1, sh2;
    entry(&lng, BYTES, 2, NO_DEADLN, 100 * MS);
    entry(&next_lng, BYTES, 2, NO_DEADLN, 100 * MS);
    entry(&sh1, BYTES, 2, NO_DEADLN, 1 * MS);
    entry(&sh2, BYTES, 2, NO_DEADLN, 1 * MS);
    srv__sched_enqueue(s, &lng, 0);
    CHECK_EQ_INT(srv__sched_wait(s, 1 * MS, 2, 0), 0); /* the spare is free */
    srv__sched_enqueue(s, &sh1, 1 * MS);
    CHECK_EQ_INT(seen.n_started, 2);
    CHECK(seen.started[1] == &sh1);
    /* Both places taken: a short one waits for the sooner to end (sh1, at 2 ms). */
    CHECK_EQ_INT(srv__sched_wait(s, 1 * MS, 2, 1 * MS), 1 * MS);
    srv__sched_enqueue(s, &sh2, 1 * MS);
    srv__sched_enqueue(s, &next_lng, 1 * MS);
    CHECK_EQ_INT(seen.n_started, 2);
    srv__sched_done(s, &sh1, SRV_SCHED_LEARN_NOTHING, 2 * MS);
    CHECK_EQ_INT(seen.n_started, 3);
    CHECK(seen.started[2] == &sh2);
    /* The long one ends while sh2 runs: sh2 holds the one worker, so next_lng waits for it. */
    srv__sched_done(s, &lng, SRV_SCHED_LEARN_NOTHING, 100 * MS);
    CHECK_EQ_INT(seen.n_started, 3);
    srv__sched_done(s, &sh2, SRV_SCHED_LEARN_NOTHING, 101 * MS);
    CHECK_EQ_INT(seen.n_started, 4);
    CHECK(seen.started[3] == &next_lng);
    srv__sched_done(s, &next_lng, SRV_SCHED_LEARN_NOTHING, 201 * MS);
    srv__sched_free(s);
}

/* Where the last request started ran. */
static srv_sched_where last_where(void)
{
    return seen.n_started > 0 ? seen.where[seen.n_started - 1] : SRV_SCHED_ON_POOL;
}

/* Beside a long request, a tiny one that allows it runs on the thread that queues it, since
 * every worker thread is busy; anything else goes to the pool: one whose cost is unknown or
 * more than SRV_SCHED_HERE_NS, one that may not, one queued while no long one runs, and one
 * that waited and is started by the thread that ended another. */
static void test_a_tiny_request_beside_a_long_one_runs_where_it_is_queued(void)
{
    const int64_t tiny = SRV_SCHED_HERE_NS / 5;
    srv_sched *s = fresh(1);
    srv_sched_entry lng, e, unknown, big, held, waits;
    entry(&e, BYTES, 2, NO_DEADLN, tiny);
    e.may_run_here = true;
    srv__sched_enqueue(s, &e, 0);
    CHECK(seen.started[0] == &e && last_where() == SRV_SCHED_ON_POOL); /* no long one runs */
    srv__sched_done(s, &e, SRV_SCHED_LEARN_NOTHING, 1 * MS);

    entry(&lng, BYTES, 2, NO_DEADLN, 100 * MS);
    lng.may_run_here = true;
    srv__sched_enqueue(s, &lng, 1 * MS);
    CHECK(seen.started[1] == &lng && last_where() == SRV_SCHED_ON_POOL); /* long: never here */
    entry(&e, BYTES, 2, NO_DEADLN, tiny);
    e.may_run_here = true;
    srv__sched_enqueue(s, &e, 2 * MS);
    CHECK(seen.started[2] == &e && last_where() == SRV_SCHED_HERE);
    srv__sched_done(s, &e, SRV_SCHED_LEARN_NOTHING, 2 * MS + tiny);

    entry(&unknown, BYTES, 2, NO_DEADLN, 0);
    unknown.may_run_here = true;
    srv__sched_enqueue(s, &unknown, 3 * MS);
    CHECK(seen.started[3] == &unknown && last_where() == SRV_SCHED_ON_POOL);
    srv__sched_done(s, &unknown, SRV_SCHED_LEARN_NOTHING, 4 * MS);
    entry(&big, BYTES, 2, NO_DEADLN, SRV_SCHED_HERE_NS + 1);
    big.may_run_here = true;
    srv__sched_enqueue(s, &big, 5 * MS);
    CHECK(seen.started[4] == &big && last_where() == SRV_SCHED_ON_POOL);
    srv__sched_done(s, &big, SRV_SCHED_LEARN_NOTHING, 6 * MS);
    entry(&held, BYTES, 2, NO_DEADLN, tiny); /* a step of a session, say */
    srv__sched_enqueue(s, &held, 7 * MS);
    CHECK(seen.started[5] == &held && last_where() == SRV_SCHED_ON_POOL);

    /* The long one and `held` fill both places: `waits` is started later, by the thread that
     * ends `held`, and that thread hands it to the pool. */
    entry(&waits, BYTES, 2, NO_DEADLN, tiny);
    waits.may_run_here = true;
    srv__sched_enqueue(s, &waits, 7 * MS);
    CHECK_EQ_INT(seen.n_started, 6);
    srv__sched_done(s, &held, SRV_SCHED_LEARN_NOTHING, 8 * MS);
    CHECK(seen.n_started == 7 && seen.started[6] == &waits && last_where() == SRV_SCHED_ON_POOL);
    srv__sched_done(s, &waits, SRV_SCHED_LEARN_NOTHING, 9 * MS);
    srv__sched_done(s, &lng, SRV_SCHED_LEARN_NOTHING, 101 * MS);
    srv__sched_free(s);
}

static void test_urgent_level_first_then_oldest(void)
{
    srv_sched *s = fresh(1);
    srv_sched_entry busy, old2, new2, new1;
    entry(&busy, BYTES, 2, NO_DEADLN, 1 * MS);
    entry(&old2, BYTES, 2, NO_DEADLN, 1 * MS);
    entry(&new2, BYTES, 2, NO_DEADLN, 1 * MS);
    entry(&new1, BYTES, 1, NO_DEADLN, 1 * MS);
    srv__sched_enqueue(s, &busy, 0);
    srv__sched_enqueue(s, &old2, 1);
    srv__sched_enqueue(s, &new2, 2);
    srv__sched_enqueue(s, &new1, 3);
    srv__sched_done(s, &busy, SRV_SCHED_LEARN_NOTHING, 10);
    srv__sched_done(s, &new1, SRV_SCHED_LEARN_NOTHING, 20);
    srv__sched_done(s, &old2, SRV_SCHED_LEARN_NOTHING, 30);
    CHECK_EQ_INT(seen.n_started, 4);
    CHECK(seen.started[1] == &new1 && seen.started[2] == &old2 && seen.started[3] == &new2);
    srv__sched_done(s, &new2, SRV_SCHED_LEARN_NOTHING, 40);
    srv__sched_free(s);
}

static void test_newest_first_once_the_oldest_waited_half_its_deadline(void)
{
    srv_sched *s = fresh(1);
    srv_sched_entry busy, old, young;
    entry(&busy, BYTES, 1, NO_DEADLN, 1 * MS);
    entry(&old, BYTES, 1, 1000 * MS, 1 * MS);
    entry(&young, BYTES, 1, 1500 * MS, 1 * MS);
    srv__sched_enqueue(s, &busy, 0);
    srv__sched_enqueue(s, &old, 0);
    srv__sched_enqueue(s, &young, 500 * MS);
    srv__sched_done(s, &busy, SRV_SCHED_LEARN_NOTHING, 600 * MS); /* old waited 600 of 1000 */
    CHECK(seen.started[1] == &young);
    srv__sched_done(s, &young, SRV_SCHED_LEARN_NOTHING, 601 * MS);
    CHECK(seen.started[2] == &old);
    srv__sched_done(s, &old, SRV_SCHED_LEARN_NOTHING, 602 * MS);
    srv__sched_free(s);
}

static void test_a_request_that_cannot_finish_is_never_started(void)
{
    srv_sched *s = fresh(1);
    srv_sched_entry busy, late, fits;
    entry(&busy, BYTES, 1, NO_DEADLN, 100 * MS);
    entry(&late, BYTES, 1, 150 * MS, 100 * MS);
    entry(&fits, BYTES, 1, 300 * MS, 100 * MS);
    srv__sched_enqueue(s, &busy, 0);
    srv__sched_enqueue(s, &late, 0);
    srv__sched_enqueue(s, &fits, 0);
    /* At 100 ms `late` would end at 200, past its deadline of 150: answered, not started. */
    srv__sched_done(s, &busy, SRV_SCHED_LEARN_NOTHING, 100 * MS);
    CHECK_EQ_INT(seen.n_expired, 1);
    CHECK(seen.expired[0] == &late);
    CHECK_EQ_INT(seen.n_started, 2);
    CHECK(seen.started[1] == &fits);
    srv__sched_done(s, &fits, SRV_SCHED_LEARN_NOTHING, 200 * MS);
    srv__sched_free(s);
}

/* A deadline is met when the reply is written, not when the worker ends: the time replies of a
 * size took to be written after their worker counts in both judgements. */
static void test_the_reply_s_writing_time_counts_against_the_deadline(void)
{
    srv_sched *s = fresh(1);
    srv_sched_refusal r;
    srv_sched_ask ask = {.route = ROUTE, .bytes = BYTES, .level = 1, .left_ns = 110 * MS};
    srv_sched_entry sent, fits_worker;
    teach(s, BYTES, 0, 100 * MS);
    CHECK(!srv__sched_overloaded(s, &ask, 1000 * MS, &r));
    entry(&sent, BYTES, 1, NO_DEADLN, 0);
    srv__sched_sent(s, &sent, 20 * MS);
    CHECK(srv__sched_overloaded(s, &ask, 1000 * MS, &r));
    /* Its worker would end at 1100 ms, before its deadline of 1110, but not its reply. */
    entry(&fits_worker, BYTES, 1, 1110 * MS, 100 * MS);
    srv__sched_enqueue(s, &fits_worker, 1000 * MS);
    CHECK_EQ_INT(seen.n_started, 1); /* the one teach ran */
    CHECK_EQ_INT(seen.n_expired, 1);
    CHECK(seen.expired[0] == &fits_worker);
    srv__sched_free(s);
}

/* With others running, a request must end with a twentieth of its time to spare, for its client's
 * own part (connecting, receiving the reply); on an idle pool it starts if its cost fits. Costs
 * of 4 ms, learned forty times alike, so that their deviation is next to nothing. */
static void test_the_client_s_slack_counts_against_the_deadline_of_a_busy_pool(void)
{
    const int64_t us = 1000, cost = 4 * MS, t0 = 1000 * MS;
    srv_sched *s = fresh(2);
    srv_sched_refusal r;
    srv_sched_ask ask = {.route = ROUTE, .bytes = BYTES, .level = 1, .left_ns = 8100 * us};
    srv_sched_entry busy, tight, alone, roomy;
    for (int i = 0; i < 40; i++)
        teach(s, BYTES, i * 10 * MS, cost);
    memset(&seen, 0, sizeof seen);
    entry(&alone, BYTES, 1, t0 + cost + 50 * us, cost);
    srv__sched_enqueue(s, &alone, t0); /* idle pool: 4 ms fit in 4.05 */
    CHECK(seen.n_started == 1 && seen.started[0] == &alone);
    srv__sched_done(s, &alone, SRV_SCHED_LEARN_NOTHING, t0 + cost);

    entry(&busy, BYTES, 1, NO_DEADLN, cost);
    srv__sched_enqueue(s, &busy, 2 * t0);
    /* Beside `busy`, 4 ms of work and a twentieth of 4.05 ms pass 4.05 ms... */
    entry(&tight, BYTES, 1, 2 * t0 + cost + 50 * us, cost);
    srv__sched_enqueue(s, &tight, 2 * t0);
    CHECK(seen.n_expired == 1 && seen.expired[0] == &tight);
    /* ... and fit in 4.25 ms. */
    entry(&roomy, BYTES, 1, 2 * t0 + cost + 250 * us, cost);
    srv__sched_enqueue(s, &roomy, 2 * t0);
    CHECK(seen.n_started == 3 && seen.started[2] == &roomy);
    /* Admission from the headers with both slots taken: 4 ms of wait, 4 of work and a twentieth
     * of the time left pass 8.1 ms, and fit in 8.5. */
    CHECK(srv__sched_overloaded(s, &ask, 2 * t0, &r));
    ask.left_ns = 8500 * us;
    CHECK(!srv__sched_overloaded(s, &ask, 2 * t0, &r));
    srv__sched_done(s, &busy, SRV_SCHED_LEARN_NOTHING, 2 * t0 + cost);
    srv__sched_done(s, &roomy, SRV_SCHED_LEARN_NOTHING, 2 * t0 + cost);
    srv__sched_free(s);
}

static void test_expected_wait_counts_the_work_ahead(void)
{
    srv_sched *s = fresh(1);
    srv_sched_entry run, q1, q2;
    entry(&run, BYTES, 2, NO_DEADLN, 100 * MS);
    entry(&q1, BYTES, 2, NO_DEADLN, 100 * MS);
    entry(&q2, BYTES, 1, NO_DEADLN, 50 * MS);
    CHECK_EQ_INT(srv__sched_wait(s, 100 * MS, 2, 0), 0); /* an idle pool */
    srv__sched_enqueue(s, &run, 0);
    srv__sched_enqueue(s, &q1, 0);
    srv__sched_enqueue(s, &q2, 0);
    /* At 40 ms: 60 ms left of the running one, 100 + 50 queued at level 2 or better. */
    CHECK_EQ_INT(srv__sched_wait(s, 100 * MS, 2, 40 * MS), 210 * MS);
    /* At level 1 only the level-1 request and the running one are ahead. */
    CHECK_EQ_INT(srv__sched_wait(s, 100 * MS, 1, 40 * MS), 110 * MS);
    CHECK(srv__sched_remove(s, &q1));  /* answered while it waited */
    CHECK(!srv__sched_remove(s, &q1)); /* only once */
    CHECK_EQ_INT(srv__sched_wait(s, 100 * MS, 2, 40 * MS), 110 * MS);
    srv__sched_done(s, &run, SRV_SCHED_LEARN_NOTHING, 100 * MS);
    srv__sched_done(s, &q2, SRV_SCHED_LEARN_NOTHING, 150 * MS);
    srv__sched_free(s);
}

int main(void)
{
    RUN(test_cost_is_learned_per_route_and_size);
    RUN(test_overloaded_when_wait_and_cost_pass_the_deadline);
    RUN(test_overloaded_counts_the_body_s_arrival_and_the_work_still_uploading);
    RUN(test_time_shared_with_others_is_divided);
    RUN(test_time_waiting_in_the_pool_is_not_cost);
    RUN(test_at_most_slots_run_and_a_free_slot_starts_the_next);
    RUN(test_one_long_at_a_time_and_short_ones_first);
    RUN(test_a_short_request_runs_beside_a_long_one);
    RUN(test_a_tiny_request_beside_a_long_one_runs_where_it_is_queued);
    RUN(test_urgent_level_first_then_oldest);
    RUN(test_newest_first_once_the_oldest_waited_half_its_deadline);
    RUN(test_a_request_that_cannot_finish_is_never_started);
    RUN(test_expected_wait_counts_the_work_ahead);
    RUN(test_the_reply_s_writing_time_counts_against_the_deadline);
    RUN(test_the_client_s_slack_counts_against_the_deadline_of_a_busy_pool);
    return check_report();
}
