/*
 * test_pool.c - the specification of the engine's thread pool, its cancellation control and
 * its status strings (engine.h): every index of a job runs exactly once, nested jobs cannot
 * deadlock, submitted tasks run, requests are served first come first served, cancelled and
 * late jobs skip what has not started, and the pool sizes itself from the CPUs it may use.
 *
 * A test that hangs is stopped by a watchdog that names it. Timing appears only as generous
 * bounds ("returns within a second or two"), never as a speed. Ordering is checked per thread
 * (what one thread ran after what), which no preemption can reorder, so these tests do not
 * flake on a loaded machine.
 */
#include "engine/engine.h"
#include "tests/support/check.h"
#include "tests/support/util.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static bool quick;

static void sleep_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static double seconds_since(int64_t start_ns)
{
    return (double)(eng_now_ns() - start_ns) / 1e9;
}

static eng_pool *new_pool(int threads)
{
    eng_error err;
    memset(&err, 0, sizeof err);
    eng_pool *p = eng_pool_new(threads, &err);
    CHECKF(p != NULL, "eng_pool_new(%d): %s", threads, err.message);
    return p;
}

/* A gate: a submitted task that holds a worker until released. */
typedef struct {
    atomic_bool started, release;
} gate;

static void gate_task(void *arg, int64_t index)
{
    (void)index;
    gate *g = arg;
    atomic_store(&g->started, true);
    while (!atomic_load(&g->release))
        sleep_us(200);
}

static void gate_init(gate *g)
{
    atomic_init(&g->started, false);
    atomic_init(&g->release, false);
}

static void wait_flag(atomic_bool *flag)
{
    while (!atomic_load(flag))
        sleep_us(200);
}

/* ---- Statuses and control ------------------------------------------------------------------ */

static void test_status_strings_are_distinct(void)
{
    const eng_status all[] = {ENG_OK,         ENG_EINVAL,     ENG_ETOOBIG,
                              ENG_ENOMEM,     ENG_ECANCELLED, ENG_EDEADLINE,
                              ENG_ENONFINITE, ENG_EIO,        ENG_EFORMAT};
    size_t n = sizeof all / sizeof all[0];
    CHECK(strcmp(eng_status_str(ENG_OK), "ok") == 0);
    for (size_t i = 0; i < n; i++) {
        const char *s = eng_status_str(all[i]);
        CHECKF(s != NULL && s[0] != '\0', "status %d has no string", (int)all[i]);
        for (size_t j = 0; s && j < i; j++)
            CHECKF(strcmp(s, eng_status_str(all[j])) != 0, "statuses %d and %d share '%s'",
                   (int)all[i], (int)all[j], s);
    }
    CHECK(eng_status_str((eng_status)999) != NULL); /* never NULL, even for garbage */
}

static void test_ctl_check_reports_cancel_and_deadline(void)
{
    CHECK(eng_ctl_check(NULL) == ENG_OK);
    eng_ctl ctl;
    atomic_init(&ctl.cancel, false);
    ctl.deadline_ns = 0;
    CHECK(eng_ctl_check(&ctl) == ENG_OK);
    ctl.deadline_ns = eng_now_ns() + 60 * INT64_C(1000000000);
    CHECK(eng_ctl_check(&ctl) == ENG_OK);
    ctl.deadline_ns = eng_now_ns() - 1;
    CHECK(eng_ctl_check(&ctl) == ENG_EDEADLINE);
    ctl.deadline_ns = 0;
    atomic_store(&ctl.cancel, true);
    CHECK(eng_ctl_check(&ctl) == ENG_ECANCELLED);
}

static void test_now_is_monotonic_nanoseconds(void)
{
    int64_t a = eng_now_ns();
    sleep_us(20000);
    int64_t b = eng_now_ns();
    CHECK(a > 0);
    CHECKF(b - a >= 15000000 && b - a < 10 * INT64_C(1000000000), "20 ms sleep measured as %lld ns",
           (long long)(b - a));
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    int64_t mono = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    CHECKF(llabs(mono - eng_now_ns()) < 1000000000, "eng_now_ns is not CLOCK_MONOTONIC");
}

/* ---- Sizing ------------------------------------------------------------------------------ */

static void test_cpu_count_follows_affinity(void)
{
    int n = eng_cpu_count();
    CHECK(n >= 1);
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        CHECKF(n <= CPU_COUNT(&set), "eng_cpu_count %d > %d CPUs in the affinity mask", n,
               CPU_COUNT(&set));
    eng_pool *p = new_pool(0);
    if (p)
        CHECK_EQ_INT(eng_pool_threads(p), n);
    eng_pool_free(p);
    p = new_pool(3);
    if (p)
        CHECK_EQ_INT(eng_pool_threads(p), 3);
    eng_pool_free(p);
}

static void test_pool_new_rejects_negative_threads(void)
{
    eng_error err;
    memset(&err, 0, sizeof err);
    eng_pool *p = eng_pool_new(-1, &err);
    CHECK(p == NULL);
    CHECK(err.status == ENG_EINVAL);
    CHECK(err.message[0] != '\0');
    eng_pool_free(p);
    eng_pool_free(NULL); /* a no-op */
}

/* ---- eng_pool_run ------------------------------------------------------------------------- */

typedef struct {
    atomic_int *hits;
    atomic_long calls;
} count_job;

static void count_task(void *arg, int64_t index)
{
    count_job *j = arg;
    atomic_fetch_add(&j->hits[index], 1);
    atomic_fetch_add(&j->calls, 1);
}

/* Runs a counting job of `count` tasks and checks that each index ran exactly once. */
static void check_exactly_once(eng_pool *p, int64_t count)
{
    count_job j;
    j.hits = xcalloc((size_t)(count > 0 ? count : 1), sizeof(atomic_int));
    for (int64_t i = 0; i < count; i++)
        atomic_init(&j.hits[i], 0);
    atomic_init(&j.calls, 0);
    eng_status st = eng_pool_run(p, count_task, &j, count, NULL);
    CHECKF(st == ENG_OK, "count %lld: %s", (long long)count, eng_status_str(st));
    int64_t wrong = 0, first = -1;
    for (int64_t i = 0; i < count; i++)
        if (atomic_load(&j.hits[i]) != 1) {
            wrong++;
            if (first < 0)
                first = i;
        }
    CHECKF(wrong == 0, "count %lld: %lld indices ran other than once (first %lld ran %d times)",
           (long long)count, (long long)wrong, (long long)first,
           first >= 0 ? atomic_load(&j.hits[first]) : 0);
    CHECK_EQ_INT(atomic_load(&j.calls), count);
    free(j.hits);
}

static void test_run_executes_every_index_exactly_once(void)
{
    const int threads[] = {1, 2, 0};
    const int64_t counts[] = {1, 2, 3, 7, 64, 1000, 100003};
    for (int t = 0; t < 3; t++) {
        eng_pool *p = new_pool(threads[t]);
        if (!p)
            continue;
        for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
            check_exactly_once(p, quick && counts[c] > 10000 ? 20011 : counts[c]);
        eng_pool_free(p);
    }
}

static void test_run_with_count_zero_runs_nothing(void)
{
    eng_pool *p = new_pool(2);
    if (!p)
        return;
    count_job j;
    atomic_int one;
    atomic_init(&one, 0);
    j.hits = &one;
    atomic_init(&j.calls, 0);
    CHECK(eng_pool_run(p, count_task, &j, 0, NULL) == ENG_OK);
    CHECK_EQ_INT(atomic_load(&j.calls), 0);
    /* A negative count is an empty range (the contract names no error for it): nothing runs,
     * and the answer is OK or EINVAL, never a crash or a hang. */
    eng_status st = eng_pool_run(p, count_task, &j, -5, NULL);
    CHECK(st == ENG_OK || st == ENG_EINVAL);
    CHECK_EQ_INT(atomic_load(&j.calls), 0);
    eng_pool_free(p);
}

typedef struct {
    eng_pool *pool;
    int64_t count;
    int rounds;
    int failures;
} many_callers_arg;

static void *many_callers_thread(void *arg)
{
    many_callers_arg *m = arg;
    for (int r = 0; r < m->rounds; r++) {
        count_job j;
        j.hits = xcalloc((size_t)m->count, sizeof(atomic_int));
        for (int64_t i = 0; i < m->count; i++)
            atomic_init(&j.hits[i], 0);
        atomic_init(&j.calls, 0);
        if (eng_pool_run(m->pool, count_task, &j, m->count, NULL) != ENG_OK)
            m->failures++;
        for (int64_t i = 0; i < m->count; i++)
            if (atomic_load(&j.hits[i]) != 1)
                m->failures++;
        free(j.hits);
    }
    return NULL;
}

/* Jobs from several threads at once stay separate: each runs its own indices exactly once. */
static void test_concurrent_jobs_stay_separate(void)
{
    eng_pool *p = new_pool(2);
    if (!p)
        return;
    pthread_t th[4];
    many_callers_arg args[4];
    for (int t = 0; t < 4; t++) {
        args[t] = (many_callers_arg){p, 500 + 977 * t, quick ? 5 : 20, 0};
        CHECK(pthread_create(&th[t], NULL, many_callers_thread, &args[t]) == 0);
    }
    for (int t = 0; t < 4; t++) {
        pthread_join(th[t], NULL);
        CHECKF(args[t].failures == 0, "caller %d: %d wrong counts or statuses", t,
               args[t].failures);
    }
    eng_pool_free(p);
}

/* ---- Nesting ------------------------------------------------------------------------------- */

typedef struct {
    eng_pool *pool;
    int depth; /* levels still to nest below this one */
    int64_t fanout;
    atomic_long leaves;
    atomic_int errors;
} nest_job;

static void nest_task(void *arg, int64_t index)
{
    (void)index;
    nest_job *j = arg;
    if (j->depth == 0) {
        atomic_fetch_add(&j->leaves, 1);
        return;
    }
    nest_job child;
    child.pool = j->pool;
    child.depth = j->depth - 1;
    child.fanout = j->fanout;
    atomic_init(&child.leaves, 0);
    atomic_init(&child.errors, 0);
    if (eng_pool_run(j->pool, nest_task, &child, j->fanout, NULL) != ENG_OK)
        atomic_fetch_add(&j->errors, 1);
    atomic_fetch_add(&j->leaves, atomic_load(&child.leaves));
    atomic_fetch_add(&j->errors, atomic_load(&child.errors));
}

/* Three levels of eng_pool_run, each called from inside a task of the level above. */
static void check_nesting(int threads)
{
    eng_pool *p = new_pool(threads);
    if (!p)
        return;
    nest_job top;
    top.pool = p;
    top.depth = 2;
    top.fanout = 6;
    atomic_init(&top.leaves, 0);
    atomic_init(&top.errors, 0);
    CHECK(eng_pool_run(p, nest_task, &top, 6, NULL) == ENG_OK);
    CHECK_EQ_INT(atomic_load(&top.leaves), 6 * 6 * 6);
    CHECK_EQ_INT(atomic_load(&top.errors), 0);
    eng_pool_free(p);
}

static void test_nested_run_on_one_worker_does_not_deadlock(void)
{
    check_nesting(1);
}

static void test_nested_run_on_two_workers_does_not_deadlock(void)
{
    check_nesting(2);
}

/* The daemon's pattern: a submitted task (on the only worker) fans out a job of its own. */
typedef struct {
    nest_job job;
    eng_status status;
    atomic_bool done;
} submitted_nest;

static void submitted_nest_task(void *arg, int64_t index)
{
    (void)index;
    submitted_nest *s = arg;
    s->status = eng_pool_run(s->job.pool, nest_task, &s->job, s->job.fanout, NULL);
    atomic_store(&s->done, true);
}

static void test_run_from_a_submitted_task_does_not_deadlock(void)
{
    const int threads[] = {1, 2};
    for (int t = 0; t < 2; t++) {
        eng_pool *p = new_pool(threads[t]);
        if (!p)
            continue;
        /* As many requests as workers and more, all fanning out at once. */
        submitted_nest s[3];
        for (int i = 0; i < 3; i++) {
            s[i].job.pool = p;
            s[i].job.depth = 1;
            s[i].job.fanout = 16;
            atomic_init(&s[i].job.leaves, 0);
            atomic_init(&s[i].job.errors, 0);
            s[i].status = ENG_EINVAL;
            atomic_init(&s[i].done, false);
            CHECK(eng_pool_submit(p, submitted_nest_task, &s[i]) == ENG_OK);
        }
        for (int i = 0; i < 3; i++) {
            wait_flag(&s[i].done);
            CHECK(s[i].status == ENG_OK);
            CHECK_EQ_INT(atomic_load(&s[i].job.leaves), 16 * 16);
        }
        eng_pool_free(p);
    }
}

/* ---- eng_pool_submit, FIFO order and pending counts ---------------------------------------- */

typedef struct {
    atomic_int ran;
    atomic_int order_next;
    int order[64];
    pthread_t thread;
    atomic_bool done;
} submit_log;

typedef struct {
    submit_log *log;
    int id;
} submit_item;

static void submit_task(void *arg, int64_t index)
{
    (void)index;
    submit_item *it = arg;
    submit_log *log = it->log;
    int slot = atomic_fetch_add(&log->order_next, 1);
    if (slot < 64)
        log->order[slot] = it->id;
    if (slot == 0) /* the first task alone says where it ran: the others would race here */
        log->thread = pthread_self();
    atomic_fetch_add(&log->ran, 1);
}

static void submit_log_init(submit_log *log)
{
    memset(log, 0, sizeof *log);
    atomic_init(&log->ran, 0);
    atomic_init(&log->order_next, 0);
    atomic_init(&log->done, false);
}

static void wait_count(atomic_int *n, int want)
{
    while (atomic_load(n) < want)
        sleep_us(200);
}

static void test_submit_runs_the_task_on_a_worker(void)
{
    eng_pool *p = new_pool(2);
    if (!p)
        return;
    submit_log log;
    submit_log_init(&log);
    submit_item it = {&log, 7};
    CHECK(eng_pool_submit(p, submit_task, &it) == ENG_OK);
    wait_count(&log.ran, 1);
    CHECK_EQ_INT(log.order[0], 7);
    CHECK(!pthread_equal(log.thread, pthread_self())); /* submit never runs it inline */

    /* Many submissions: each runs exactly once. */
    submit_log many;
    submit_log_init(&many);
    submit_item items[40];
    for (int i = 0; i < 40; i++) {
        items[i] = (submit_item){&many, i};
        CHECK(eng_pool_submit(p, submit_task, &items[i]) == ENG_OK);
    }
    wait_count(&many.ran, 40);
    int seen[40] = {0};
    for (int i = 0; i < 40; i++)
        if (many.order[i] >= 0 && many.order[i] < 40)
            seen[many.order[i]]++;
    for (int i = 0; i < 40; i++)
        CHECKF(seen[i] == 1, "submitted task %d ran %d times", i, seen[i]);
    eng_pool_free(p);
    CHECK_EQ_INT(atomic_load(&many.ran), 40);
}

/* Submissions queued behind a busy worker run in the order they were submitted, and count as
 * pending until they start. */
static void test_submissions_run_in_fifo_order_and_count_as_pending(void)
{
    eng_pool *p = new_pool(1);
    if (!p)
        return;
    CHECK_EQ_INT(eng_pool_pending(p), 0);
    gate g;
    gate_init(&g);
    CHECK(eng_pool_submit(p, gate_task, &g) == ENG_OK);
    wait_flag(&g.started);
    submit_log log;
    submit_log_init(&log);
    submit_item items[10];
    for (int i = 0; i < 10; i++) {
        items[i] = (submit_item){&log, i};
        CHECK(eng_pool_submit(p, submit_task, &items[i]) == ENG_OK);
    }
    CHECK_EQ_INT(eng_pool_pending(p), 10);
    CHECK_EQ_INT(atomic_load(&log.ran), 0);
    atomic_store(&g.release, true);
    wait_count(&log.ran, 10);
    for (int i = 0; i < 10; i++)
        CHECKF(log.order[i] == i, "position %d ran task %d (FIFO order broken)", i, log.order[i]);
    /* Every task has started (and finished) now. */
    CHECK_EQ_INT(eng_pool_pending(p), 0);
    eng_pool_free(p);
}

/* With the one worker blocked, submissions of mixed priority run most urgent first, and in the
 * order they were submitted within a priority (eng_pool_submit being priority 0). */
static void test_submissions_run_by_priority_then_fifo(void)
{
    eng_pool *p = new_pool(1);
    if (!p)
        return;
    gate g;
    gate_init(&g);
    CHECK(eng_pool_submit_at(p, 2, gate_task, &g) == ENG_OK);
    wait_flag(&g.started);
    /* id = 10 * priority + rank within the priority; submitted interleaved. */
    static const uint32_t prio[] = {3, 1, 2, 1, 3, 0, 2, 1, 0, 3};
    submit_log log;
    submit_log_init(&log);
    submit_item items[10];
    int rank[4] = {0};
    for (int i = 0; i < 10; i++) {
        items[i] = (submit_item){&log, (int)prio[i] * 10 + rank[prio[i]]++};
        if (prio[i] == 0)
            CHECK(eng_pool_submit(p, submit_task, &items[i]) == ENG_OK);
        else
            CHECK(eng_pool_submit_at(p, prio[i], submit_task, &items[i]) == ENG_OK);
    }
    CHECK_EQ_INT(eng_pool_pending(p), 10);
    atomic_store(&g.release, true);
    wait_count(&log.ran, 10);
    static const int want[] = {0, 1, 10, 11, 12, 20, 21, 30, 31, 32};
    for (int i = 0; i < 10; i++)
        CHECKF(log.order[i] == want[i], "position %d ran task %d, want %d", i, log.order[i],
               want[i]);
    eng_pool_free(p);
}

/* A request's fan-out keeps its priority. Two workers: one held by a gate, the other runs a
 * priority-1 request whose eng_pool_run job has two indices; it keeps index 0 (held too) and
 * index 1 waits in the queue. Then a priority-0 and a priority-2 request arrive. Released, the
 * first worker takes the priority-0 request, then the fan-out's index 1, then the priority-2
 * one: the sub-job sits at its request's priority, not at the front (its ticket is older) nor
 * at the back. */
typedef struct {
    eng_pool *pool;
    submit_log *log;
    gate hold; /* index 0 of the fan-out waits here */
} fan_arg;

static void fan_child(void *arg, int64_t index)
{
    fan_arg *f = arg;
    if (index == 0) {
        gate_task(&f->hold, 0);
        return;
    }
    int slot = atomic_fetch_add(&f->log->order_next, 1);
    if (slot < 64)
        f->log->order[slot] = 1;
    atomic_fetch_add(&f->log->ran, 1);
}

static void fan_parent(void *arg, int64_t index)
{
    (void)index;
    fan_arg *f = arg;
    CHECK(eng_pool_run(f->pool, fan_child, f, 2, NULL) == ENG_OK);
}

static void test_nested_jobs_keep_their_priority(void)
{
    eng_pool *p = new_pool(2);
    if (!p)
        return;
    gate g;
    gate_init(&g);
    CHECK(eng_pool_submit_at(p, 0, gate_task, &g) == ENG_OK);
    wait_flag(&g.started);
    submit_log log;
    submit_log_init(&log);
    fan_arg fan = {.pool = p, .log = &log};
    gate_init(&fan.hold);
    CHECK(eng_pool_submit_at(p, 1, fan_parent, &fan) == ENG_OK);
    wait_flag(&fan.hold.started); /* index 1 is queued now */
    submit_item urgent = {&log, 0}, late = {&log, 2};
    CHECK(eng_pool_submit_at(p, 2, submit_task, &late) == ENG_OK);
    CHECK(eng_pool_submit_at(p, 0, submit_task, &urgent) == ENG_OK);
    CHECK_EQ_INT(eng_pool_pending(p), 3);
    atomic_store(&g.release, true);
    wait_count(&log.ran, 3);
    static const int want[] = {0, 1, 2};
    for (int k = 0; k < 3; k++)
        CHECKF(log.order[k] == want[k], "position %d ran task %d, want %d", k, log.order[k],
               want[k]);
    atomic_store(&fan.hold.release, true);
    eng_pool_free(p);
}

/* A thread helping with its own job takes a more urgent one first. One worker runs a
 * priority-2 request whose fan-out has three indices; index 0 submits a priority-1 request.
 * With no other worker, only the helping thread can run it: it does, before index 1, instead
 * of leaving it waiting until the whole fan-out is done. */
typedef struct {
    eng_pool *pool;
    submit_log *log;
    submit_item self[3], urgent;
} helper_arg;

static void helper_child(void *arg, int64_t index)
{
    helper_arg *h = arg;
    submit_task(&h->self[index], 0);
    if (index == 0)
        CHECK(eng_pool_submit_at(h->pool, 1, submit_task, &h->urgent) == ENG_OK);
}

static void helper_parent(void *arg, int64_t index)
{
    (void)index;
    helper_arg *h = arg;
    CHECK(eng_pool_run(h->pool, helper_child, h, 3, NULL) == ENG_OK);
}

static void test_a_helping_thread_runs_more_urgent_jobs_first(void)
{
    eng_pool *p = new_pool(1);
    if (!p)
        return;
    submit_log log;
    submit_log_init(&log);
    helper_arg h = {.pool = p, .log = &log, .urgent = {&log, 9}};
    for (int i = 0; i < 3; i++)
        h.self[i] = (submit_item){&log, i};
    CHECK(eng_pool_submit_at(p, 2, helper_parent, &h) == ENG_OK);
    wait_count(&log.ran, 4);
    static const int want[] = {0, 9, 1, 2};
    for (int k = 0; k < 4; k++)
        CHECKF(log.order[k] == want[k], "position %d ran task %d, want %d", k, log.order[k],
               want[k]);
    eng_pool_free(p);
}

/* ---- Background work ------------------------------------------------------------------------ */

static bool odd_is_background(uint32_t priority)
{
    return priority % 2 == 1;
}

typedef struct {
    eng_pool *pool;
    atomic_int policy, nested_policy;
} policy_probe;

static void nested_policy_task(void *arg, int64_t index)
{
    (void)index;
    atomic_store(&((policy_probe *)arg)->nested_policy, sched_getscheduler(0));
}

/* Records the policy it runs at, and that of a job it starts (which keeps its priority). */
static void policy_task(void *arg, int64_t index)
{
    policy_probe *pp = arg;
    (void)index;
    atomic_store(&pp->policy, sched_getscheduler(0));
    eng_pool_run(pp->pool, nested_policy_task, pp, 1, NULL);
}

static int policy_of_a_job(eng_pool *p, uint32_t priority, int *nested)
{
    policy_probe pp = {.pool = p};
    atomic_init(&pp.policy, -1);
    atomic_init(&pp.nested_policy, -1);
    CHECK(eng_pool_submit_at(p, priority, policy_task, &pp) == ENG_OK);
    while (atomic_load(&pp.nested_policy) < 0)
        sleep_us(1000);
    *nested = atomic_load(&pp.nested_policy);
    return atomic_load(&pp.policy);
}

/* The jobs that tasks of background jobs start run at SCHED_IDLE; the task itself (a request's
 * serial part) and other work keep the worker's own policy. Where the process may not leave
 * SCHED_IDLE, the pool says why and changes nothing. */
static void test_background_fan_out_runs_at_sched_idle(void)
{
    eng_pool *p = new_pool(1);
    char why[160] = "";
    int nested;
    if (!p)
        return;
    if (!eng_pool_set_background(p, odd_is_background, why, sizeof why)) {
        CHECKF(strstr(why, "SCHED_IDLE") != NULL, "why: %s", why);
        printf("skip: background work at SCHED_IDLE: %s\n", why);
        CHECK_EQ_INT(policy_of_a_job(p, 1, &nested), SCHED_OTHER);
        eng_pool_free(p);
        return;
    }
    CHECK_EQ_INT(policy_of_a_job(p, 0, &nested), SCHED_OTHER);
    CHECK_EQ_INT(nested, SCHED_OTHER);
    CHECK_EQ_INT(policy_of_a_job(p, 1, &nested), SCHED_OTHER);
    CHECK_EQ_INT(nested, SCHED_IDLE);
    CHECK_EQ_INT(policy_of_a_job(p, 2, &nested), SCHED_OTHER);
    CHECK_EQ_INT(nested, SCHED_OTHER);
    eng_pool_free(p);
}

/* An unprivileged process (here root turned into nobody, in a child) cannot return from
 * SCHED_IDLE, so the pool refuses background work and says why. */
static void test_background_work_is_refused_without_a_way_back(void)
{
    if (geteuid() != 0) {
        printf("skip: not root, so no child can drop the privilege to leave SCHED_IDLE (the "
               "case above ran as this user)\n");
        return;
    }
    pid_t pid = fork();
    if (pid == 0) {
        struct rlimit none = {0, 0};
        char why[160] = "";
        if (setrlimit(RLIMIT_NICE, &none) != 0 || setgid(65534) != 0 || setuid(65534) != 0)
            _exit(3);
        eng_error err;
        eng_pool *p = eng_pool_new(1, &err);
        bool on = p && eng_pool_set_background(p, odd_is_background, why, sizeof why);
        eng_pool_free(p);
        _exit(on ? 1 : strstr(why, "CAP_SYS_NICE") ? 0 : 2);
    }
    int status = -1;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
}

/* ---- The spare thread ------------------------------------------------------------------------ */

/* With the one worker held by a priority-1 job, a spare runs a priority-0 submission at once,
 * but leaves one of priority 1 queued: it takes only work more urgent than the workers'. */
static void test_spare_runs_only_more_urgent_work_while_workers_are_busy(void)
{
    eng_pool *p = new_pool(1);
    if (!p)
        return;
    eng_error err;
    memset(&err, 0, sizeof err);
    CHECKF(eng_pool_add_spare(p, &err) == ENG_OK, "eng_pool_add_spare: %s", err.message);
    CHECK(eng_pool_add_spare(p, &err) == ENG_OK);
    CHECK_EQ_INT(eng_pool_threads(p), 1);
    gate g;
    gate_init(&g);
    CHECK(eng_pool_submit_at(p, 1, gate_task, &g) == ENG_OK);
    wait_flag(&g.started);
    submit_log log;
    submit_log_init(&log);
    submit_item same = {&log, 1}, urgent = {&log, 0};
    CHECK(eng_pool_submit_at(p, 1, submit_task, &same) == ENG_OK);
    CHECK(eng_pool_submit_at(p, 0, submit_task, &urgent) == ENG_OK);
    wait_count(&log.ran, 1);
    CHECK_EQ_INT(log.order[0], 0);
    sleep_us(50 * 1000);
    CHECK_EQ_INT(atomic_load(&log.ran), 1);
    CHECK_EQ_INT(eng_pool_pending(p), 1);
    atomic_store(&g.release, true);
    wait_count(&log.ran, 2);
    CHECK_EQ_INT(log.order[1], 1);
    eng_pool_free(p);
}

/* Short requests among long ones: a long request (priority 1) fans out over every worker in
 * tasks of long_ms each, over and over; short requests (priority 0, short_ms of work) arrive
 * one at a time. Their latency, submission to end, is measured alone and then during the
 * long ones. */
typedef struct {
    eng_pool *pool;
    int64_t long_ns;
    int64_t count; /* tasks per long request */
    atomic_bool stop, stopped;
} flood;

static void spin_ns(int64_t ns)
{
    int64_t end = eng_now_ns() + ns;
    while (eng_now_ns() < end) {
    }
}

static void long_task(void *arg, int64_t index)
{
    (void)index;
    spin_ns(((flood *)arg)->long_ns);
}

static void flood_task(void *arg, int64_t index)
{
    (void)index;
    flood *f = arg;
    while (!atomic_load(&f->stop))
        CHECK(eng_pool_run(f->pool, long_task, f, f->count, NULL) == ENG_OK);
    atomic_store(&f->stopped, true);
}

typedef struct {
    int64_t work_ns, submitted_ns;
    atomic_llong latency_ns; /* -1 until it ran */
} short_req;

static void short_task(void *arg, int64_t index)
{
    (void)index;
    short_req *r = arg;
    spin_ns(r->work_ns);
    atomic_store(&r->latency_ns, eng_now_ns() - r->submitted_ns);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The 95th percentile latency of `n` short requests submitted one after another, each at a
 * different point of whatever else runs. */
static int64_t short_p95_ns(eng_pool *p, int n, int64_t work_ns)
{
    int64_t lat[64];
    for (int i = 0; i < n && i < 64; i++) {
        short_req r = {.work_ns = work_ns};
        atomic_init(&r.latency_ns, -1);
        r.submitted_ns = eng_now_ns();
        CHECK(eng_pool_submit_at(p, 0, short_task, &r) == ENG_OK);
        while (atomic_load(&r.latency_ns) < 0)
            sleep_us(100);
        lat[i] = atomic_load(&r.latency_ns);
        sleep_us(1000 + (i * 3371) % 7000);
    }
    qsort(lat, (size_t)n, sizeof lat[0], cmp_i64);
    return lat[(n * 95 - 1) / 100];
}

/* Without the spare a short request waits for a long task to end (up to long_ms); with it, its
 * tail stays within a generous factor (10, for a loaded machine or a sanitizer) of its tail
 * alone. The long tasks are 100 times the short request's work, so the bound fails without the
 * spare. */
static void test_spare_keeps_short_latency_among_long_tasks(void)
{
    int threads = 2;
    eng_pool *p = new_pool(threads);
    if (!p)
        return;
    eng_error err;
    memset(&err, 0, sizeof err);
    CHECKF(eng_pool_add_spare(p, &err) == ENG_OK, "eng_pool_add_spare: %s", err.message);
    int n = quick ? 30 : 60;
    int64_t work_ns = 2 * 1000 * 1000;
    int64_t alone = short_p95_ns(p, n, work_ns);

    flood f = {.pool = p, .long_ns = 100 * work_ns, .count = 4 * threads};
    atomic_init(&f.stop, false);
    atomic_init(&f.stopped, false);
    CHECK(eng_pool_submit_at(p, 1, flood_task, &f) == ENG_OK);
    sleep_us(20 * 1000);
    int64_t mixed = short_p95_ns(p, n, work_ns);
    atomic_store(&f.stop, true);
    wait_flag(&f.stopped);

    int64_t bound = 10 * alone;
    printf("    short p95 alone %.2f ms, among long tasks of %.0f ms %.2f ms (bound %.2f ms)\n",
           (double)alone / 1e6, (double)f.long_ns / 1e6, (double)mixed / 1e6, (double)bound / 1e6);
    CHECKF(mixed <= bound, "short p95 among long tasks %.2f ms > 10 x alone (%.2f ms)",
           (double)mixed / 1e6, (double)alone / 1e6);
    eng_pool_free(p);
}

/* eng_pool_free lets the tasks already queued run before it stops the workers. */
typedef struct {
    gate *g;
    int delay_us;
} releaser_arg;

static void *release_after(void *arg)
{
    releaser_arg *r = arg;
    sleep_us(r->delay_us);
    atomic_store(&r->g->release, true);
    return NULL;
}

static void test_free_runs_queued_tasks_first(void)
{
    eng_pool *p = new_pool(1);
    if (!p)
        return;
    gate g;
    gate_init(&g);
    CHECK(eng_pool_submit(p, gate_task, &g) == ENG_OK);
    wait_flag(&g.started);
    submit_log log;
    submit_log_init(&log);
    submit_item items[10];
    for (int i = 0; i < 10; i++) {
        items[i] = (submit_item){&log, i};
        CHECK(eng_pool_submit(p, submit_task, &items[i]) == ENG_OK);
    }
    pthread_t th;
    releaser_arg r = {&g, 20000};
    CHECK(pthread_create(&th, NULL, release_after, &r) == 0);
    eng_pool_free(p);
    pthread_join(th, NULL);
    CHECK_EQ_INT(atomic_load(&log.ran), 10);
}

/* ---- Fairness between requests -------------------------------------------------------------- */

typedef struct {
    int64_t seq;      /* global start order */
    pthread_t thread; /* who ran it */
} task_mark;

static atomic_llong start_clock;

typedef struct {
    int64_t count;
    task_mark *marks;
    atomic_bool started;
    atomic_llong first_seq;
    long sleep_us;
} fifo_job;

static void fifo_task(void *arg, int64_t index)
{
    fifo_job *j = arg;
    int64_t seq = atomic_fetch_add(&start_clock, 1);
    j->marks[index].seq = seq;
    j->marks[index].thread = pthread_self();
    long long unset = -1;
    atomic_compare_exchange_strong(&j->first_seq, &unset, seq);
    atomic_store(&j->started, true);
    sleep_us(j->sleep_us);
}

static void fifo_job_init(fifo_job *j, int64_t count, long us)
{
    j->count = count;
    j->marks = xcalloc((size_t)count, sizeof(task_mark));
    atomic_init(&j->started, false);
    atomic_init(&j->first_seq, -1);
    j->sleep_us = us;
}

/* Whether `thread` runs a task of `job` after global start order `seq`. */
static bool runs_later(const fifo_job *job, pthread_t thread, int64_t seq)
{
    for (int64_t a = 0; a < job->count; a++)
        if (pthread_equal(job->marks[a].thread, thread) && job->marks[a].seq > seq)
            return true;
    return false;
}

/* Request-order breaks, per thread: how many tasks of `later` a thread (other than `exempt`,
 * the later job's own caller, which works on its own job) started after `after_seq` and then
 * followed with a task of `earlier`. Such a thread took a task of the later job while the
 * earlier job still had tasks queued (it took one of them afterwards). Returns the worst
 * thread's count. Being per thread, the count cannot be faked by preemption. */
static int64_t order_breaks(const fifo_job *earlier, const fifo_job *later, pthread_t exempt,
                            int64_t after_seq)
{
    int64_t worst = 0;
    for (int64_t t = 0; t < later->count; t++) {
        pthread_t thread = later->marks[t].thread;
        if (pthread_equal(thread, exempt))
            continue;
        int64_t breaks = 0;
        for (int64_t b = 0; b < later->count; b++) {
            const task_mark *m = &later->marks[b];
            if (pthread_equal(m->thread, thread) && m->seq > after_seq &&
                runs_later(earlier, thread, m->seq))
                breaks++;
        }
        if (breaks > worst)
            worst = breaks;
    }
    return worst;
}

typedef struct {
    eng_pool *pool;
    fifo_job *job;
    fifo_job *wait_for; /* start only once this job has started; NULL: at once */
    pthread_t self;
    eng_status status;
} fifo_caller;

static void *fifo_caller_thread(void *arg)
{
    fifo_caller *c = arg;
    c->self = pthread_self();
    if (c->wait_for)
        wait_flag(&c->wait_for->started);
    c->status = eng_pool_run(c->pool, fifo_task, c->job, c->job->count, NULL);
    return NULL;
}

/* Two requests from two threads on a pool of two workers: the workers finish dispatching the
 * earlier request's job before they take tasks of the later one (its caller works on its own
 * job meanwhile). */
static void test_earlier_request_is_served_first(void)
{
    eng_pool *p = new_pool(2);
    if (!p)
        return;
    atomic_init(&start_clock, 0);
    fifo_job a, b;
    fifo_job_init(&a, 200, 300);
    fifo_job_init(&b, 200, 300);
    fifo_caller ca = {.pool = p, .job = &a, .status = ENG_EINVAL};
    fifo_caller cb = {.pool = p, .job = &b, .wait_for = &a, .status = ENG_EINVAL};
    pthread_t ta, tb;
    CHECK(pthread_create(&ta, NULL, fifo_caller_thread, &ca) == 0);
    CHECK(pthread_create(&tb, NULL, fifo_caller_thread, &cb) == 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    CHECK(ca.status == ENG_OK);
    CHECK(cb.status == ENG_OK);
    /* Any thread but B's caller that ran a B task and later an A task took B while A waited. */
    int64_t breaks = order_breaks(&a, &b, cb.self, -1);
    CHECKF(breaks == 0,
           "a worker took %lld tasks of the later request while the earlier one "
           "still had tasks queued",
           (long long)breaks);
    free(a.marks);
    free(b.marks);
    eng_pool_free(p);
}

/* A job started inside a task inherits its request's place: request R1 (submitted first) starts
 * its job A1 only after R2 (submitted second) has started A2, yet idle workers switch to A1 as
 * soon as it appears. */
typedef struct {
    eng_pool *pool;
    fifo_job *job;
    long delay_us;
    pthread_t runner;
    eng_status status;
    atomic_bool done;
} request;

static void request_task(void *arg, int64_t index)
{
    (void)index;
    request *r = arg;
    r->runner = pthread_self();
    sleep_us(r->delay_us);
    r->status = eng_pool_run(r->pool, fifo_task, r->job, r->job->count, NULL);
    atomic_store(&r->done, true);
}

static void test_nested_job_inherits_its_request_place(void)
{
    eng_pool *p = new_pool(3);
    if (!p)
        return;
    atomic_init(&start_clock, 0);
    fifo_job a1, a2;
    fifo_job_init(&a1, 400, 300);
    fifo_job_init(&a2, 400, 300);
    request r1 = {.pool = p, .job = &a1, .delay_us = 20000, .status = ENG_EINVAL};
    request r2 = {.pool = p, .job = &a2, .delay_us = 0, .status = ENG_EINVAL};
    atomic_init(&r1.done, false);
    atomic_init(&r2.done, false);
    CHECK(eng_pool_submit(p, request_task, &r1) == ENG_OK);
    CHECK(eng_pool_submit(p, request_task, &r2) == ENG_OK);
    wait_flag(&r1.done);
    wait_flag(&r2.done);
    CHECK(r1.status == ENG_OK);
    CHECK(r2.status == ENG_OK);
    /* Once A1 has a task running it is queued; a thread (other than R2's own runner) that then
     * takes A2 tasks and only later returns to A1 put the later request first. */
    int64_t breaks = order_breaks(&a1, &a2, r2.runner, atomic_load(&a1.first_seq));
    CHECKF(breaks <= 1,
           "a worker took %lld tasks of the later request's job while the earlier "
           "request's job still had tasks queued",
           (long long)breaks);
    free(a1.marks);
    free(a2.marks);
    eng_pool_free(p);
}

/* ---- Cancellation and deadlines ----------------------------------------------------------- */

typedef struct {
    eng_ctl *ctl;
    atomic_long ran;
    long sleep_us;
    bool cancel_on_first;
} ctl_job;

static void ctl_task(void *arg, int64_t index)
{
    (void)index;
    ctl_job *j = arg;
    if (atomic_fetch_add(&j->ran, 1) == 0 && j->cancel_on_first)
        atomic_store(&j->ctl->cancel, true);
    sleep_us(j->sleep_us);
}

static void ctl_init(eng_ctl *ctl, bool cancel, int64_t deadline)
{
    atomic_init(&ctl->cancel, cancel);
    ctl->deadline_ns = deadline;
}

static void test_cancel_skips_tasks_not_yet_started(void)
{
    eng_pool *p = new_pool(2);
    if (!p)
        return;
    eng_ctl ctl;
    ctl_init(&ctl, false, 0);
    ctl_job j = {.ctl = &ctl, .sleep_us = 100, .cancel_on_first = true};
    atomic_init(&j.ran, 0);
    int64_t start = eng_now_ns();
    eng_status st = eng_pool_run(p, ctl_task, &j, 10000, &ctl);
    CHECKF(st == ENG_ECANCELLED, "cancelled job returned %s", eng_status_str(st));
    /* Only tasks already taken when the flag went up may run: a handful, not 10000. */
    CHECKF(atomic_load(&j.ran) < 50, "%ld of 10000 tasks ran after the cancel",
           atomic_load(&j.ran));
    CHECK(seconds_since(start) < 2.0);
    /* The pool is fine afterwards. */
    check_exactly_once(p, 1000);
    eng_pool_free(p);
}

static void test_cancelled_before_start_runs_nothing(void)
{
    eng_pool *p = new_pool(2);
    if (!p)
        return;
    eng_ctl ctl;
    ctl_init(&ctl, true, 0);
    ctl_job j = {.ctl = &ctl, .sleep_us = 0};
    atomic_init(&j.ran, 0);
    CHECK(eng_pool_run(p, ctl_task, &j, 1000, &ctl) == ENG_ECANCELLED);
    CHECK_EQ_INT(atomic_load(&j.ran), 0);
    ctl_init(&ctl, false, eng_now_ns() - 1000);
    CHECK(eng_pool_run(p, ctl_task, &j, 1000, &ctl) == ENG_EDEADLINE);
    CHECK_EQ_INT(atomic_load(&j.ran), 0);
    eng_pool_free(p);
}

static void test_deadline_stops_a_long_job(void)
{
    eng_pool *p = new_pool(2);
    if (!p)
        return;
    eng_ctl ctl;
    int64_t start = eng_now_ns();
    ctl_init(&ctl, false, start + 30 * INT64_C(1000000));
    ctl_job j = {.ctl = &ctl, .sleep_us = 1000}; /* 10000 x 1 ms: several seconds */
    atomic_init(&j.ran, 0);
    eng_status st = eng_pool_run(p, ctl_task, &j, 10000, &ctl);
    double took = seconds_since(start);
    CHECKF(st == ENG_EDEADLINE, "job past its deadline returned %s", eng_status_str(st));
    CHECKF(atomic_load(&j.ran) < 10000, "all tasks ran despite the deadline");
    CHECKF(took < 2.0, "job with a 30 ms deadline returned after %.3f s", took);
    eng_pool_free(p);
}

typedef struct {
    eng_ctl *ctl;
    long delay_us;
    int64_t at;
} cancel_later_arg;

static void *cancel_later(void *arg)
{
    cancel_later_arg *c = arg;
    sleep_us(c->delay_us);
    c->at = eng_now_ns();
    atomic_store(&c->ctl->cancel, true);
    return NULL;
}

static void test_cancel_from_another_thread_stops_the_job(void)
{
    eng_pool *p = new_pool(2);
    if (!p)
        return;
    eng_ctl ctl;
    ctl_init(&ctl, false, 0);
    ctl_job j = {.ctl = &ctl, .sleep_us = 1000};
    atomic_init(&j.ran, 0);
    cancel_later_arg c = {&ctl, 30000, 0};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, cancel_later, &c) == 0);
    eng_status st = eng_pool_run(p, ctl_task, &j, 10000, &ctl);
    int64_t returned = eng_now_ns();
    pthread_join(th, NULL);
    CHECKF(st == ENG_ECANCELLED, "job cancelled from another thread returned %s",
           eng_status_str(st));
    double lag = (double)(returned - c.at) / 1e9;
    CHECKF(lag < 1.0, "eng_pool_run returned %.3f s after the cancel", lag);
    eng_pool_free(p);
}

/* ---- main --------------------------------------------------------------------------------- */

int main(void)
{
    if (test_kernels_skip())
        return 0;
    const char *q = getenv("ATTND_TEST_QUICK");
    quick = q && strcmp(q, "1") == 0;

    RUN_WITHIN(test_status_strings_are_distinct, 10);
    RUN_WITHIN(test_ctl_check_reports_cancel_and_deadline, 10);
    RUN_WITHIN(test_now_is_monotonic_nanoseconds, 10);
    RUN_WITHIN(test_cpu_count_follows_affinity, 20);
    RUN_WITHIN(test_pool_new_rejects_negative_threads, 10);
    RUN_WITHIN(test_run_executes_every_index_exactly_once, 60);
    RUN_WITHIN(test_run_with_count_zero_runs_nothing, 10);
    RUN_WITHIN(test_concurrent_jobs_stay_separate, 60);
    RUN_WITHIN(test_nested_run_on_one_worker_does_not_deadlock, 20);
    RUN_WITHIN(test_nested_run_on_two_workers_does_not_deadlock, 20);
    RUN_WITHIN(test_run_from_a_submitted_task_does_not_deadlock, 20);
    RUN_WITHIN(test_submit_runs_the_task_on_a_worker, 20);
    RUN_WITHIN(test_submissions_run_in_fifo_order_and_count_as_pending, 20);
    RUN_WITHIN(test_submissions_run_by_priority_then_fifo, 20);
    RUN_WITHIN(test_nested_jobs_keep_their_priority, 20);
    RUN_WITHIN(test_a_helping_thread_runs_more_urgent_jobs_first, 20);
    RUN_WITHIN(test_spare_runs_only_more_urgent_work_while_workers_are_busy, 20);
    RUN_WITHIN(test_spare_keeps_short_latency_among_long_tasks, 60);
    RUN_WITHIN(test_background_fan_out_runs_at_sched_idle, 20);
    RUN_WITHIN(test_background_work_is_refused_without_a_way_back, 20);
    RUN_WITHIN(test_free_runs_queued_tasks_first, 20);
    RUN_WITHIN(test_earlier_request_is_served_first, 30);
    RUN_WITHIN(test_nested_job_inherits_its_request_place, 30);
    RUN_WITHIN(test_cancel_skips_tasks_not_yet_started, 30);
    RUN_WITHIN(test_cancelled_before_start_runs_nothing, 20);
    RUN_WITHIN(test_deadline_stops_a_long_job, 30);
    RUN_WITHIN(test_cancel_from_another_thread_stops_the_job, 30);

    return check_report();
}
