/*
 * test_job.c - the one life of an inference on both edges (server/job.h), driven by a fake
 * edge: what admission refuses and says, that an admitted job runs on a worker and comes back
 * exactly once, that one answered while it waited (abandoned, cancelled, past its deadline)
 * never runs its work, that the drain turns a cancelled run into the drain's answer, and that the
 * server's counters return to zero. The two real edges are driven to the same outcomes in
 * test_grpc.c (test_same_outcomes_as_http).
 */
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "server/job.h"
#include "tests/support/check.h"

#define MS ((int64_t)1000 * 1000)

/* A request of the fake edge: what the job's operations did to it. */
typedef struct {
    srv_job job;
    api_lease lease;
    api_reply reply;
    bool hold;       /* its work waits for release() */
    int worked;      /* times ops->work ran */
    int ended;       /* times ops->end ran */
    srv_job_end how; /* the last end's */
    srv_outcome failed;
    char msg[256];
} fake;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
static bool released;

static void work(srv_job *job)
{
    fake *f = job->owner;
    pthread_mutex_lock(&lock);
    f->worked++;
    pthread_cond_broadcast(&changed);
    while (f->hold && !released)
        pthread_cond_wait(&changed, &lock);
    pthread_mutex_unlock(&lock);
    /* As api/ does: a run whose lease was cancelled ends 499. */
    f->reply.status = atomic_load(&f->lease.ctl.cancel) ? API_STATUS_CLIENT_CLOSED : 200;
    f->reply.reason = atomic_load(&f->lease.ctl.cancel) ? API_REASON_CANCELLED : API_REASON_NONE;
    f->reply.compute_ns = 7;
}

static void fail(srv_job *job, srv_outcome o, const char *msg)
{
    fake *f = job->owner;
    f->failed = o;
    snprintf(f->msg, sizeof f->msg, "%s", msg);
    f->reply.status = srv__outcome_http(o, API_ERRORS_NATIVE);
    f->reply.reason = srv__outcome(o)->reason;
}

static void end(srv_job *job, srv_job_end how)
{
    fake *f = job->owner;
    pthread_mutex_lock(&lock);
    f->ended++;
    f->how = how;
    pthread_cond_broadcast(&changed);
    pthread_mutex_unlock(&lock);
}

static void deadline_origin(const srv_job *job, char *buf, size_t size)
{
    (void)job;
    snprintf(buf, size, "the fake's deadline");
}

static const srv_job_ops fake_ops = {
    .work = work, .fail = fail, .end = end, .deadline_origin = deadline_origin};

/* A server with what job.c uses: one worker, one scheduler slot, --max-queue 2. */
static srv_server *server(void)
{
    static srv_server s;
    eng_error err;
    memset(&s, 0, sizeof s);
    s.limits = api_limits_default();
    s.max_queue = 2;
    s.request_timeout_ns = 60000 * MS;
    s.pool = eng_pool_new(1, &err);
    s.sched = srv__sched_new(1);
    released = false;
    return &s;
}

static void server_free(srv_server *s)
{
    eng_pool_free(s->pool);
    srv__sched_free(s->sched);
}

/* A fake request whose deadline is `timeout_ms` from now. */
static void fake_init(fake *f, srv_server *s, int64_t timeout_ms)
{
    memset(f, 0, sizeof *f);
    srv__job_init(&f->job, s, &fake_ops, f, &f->lease, &f->reply);
    api_lease_start(&f->lease, NULL, eng_now_ns(), timeout_ms);
}

static bool admit_and_start(fake *f)
{
    srv_job_where w = {.route = 1, .bytes = 100, .level = 1, .may_run_here = false};
    srv_job_refusal no;
    int64_t now = eng_now_ns();
    if (!srv__job_admit(&f->job, &w, now, &no))
        return false;
    srv__job_start(&f->job, now);
    return true;
}

static void wait_worked(fake *f)
{
    pthread_mutex_lock(&lock);
    while (f->worked == 0)
        pthread_cond_wait(&changed, &lock);
    pthread_mutex_unlock(&lock);
}

static void wait_ended(fake *f)
{
    pthread_mutex_lock(&lock);
    while (f->ended == 0)
        pthread_cond_wait(&changed, &lock);
    pthread_mutex_unlock(&lock);
}

static void release(void)
{
    pthread_mutex_lock(&lock);
    released = true;
    pthread_cond_broadcast(&changed);
    pthread_mutex_unlock(&lock);
}

static void check_counters_zero(srv_server *s)
{
    CHECK_EQ_INT(atomic_load(&s->admitted), 0);
    CHECK_EQ_INT(atomic_load(&s->queued), 0);
    CHECK_EQ_INT(atomic_load(&s->running), 0);
}

static void test_an_admitted_job_runs_on_a_worker_and_comes_back_once(void)
{
    srv_server *s = server();
    fake a;
    fake_init(&a, s, 60000);
    CHECK(admit_and_start(&a));
    wait_ended(&a);
    CHECK_EQ_INT(a.worked, 1);
    CHECK_EQ_INT(a.ended, 1);
    CHECK_EQ_INT(a.how, SRV_JOB_ANSWERED);
    CHECK_EQ_INT(a.reply.status, 200);
    CHECK_EQ_INT(atomic_load(&a.job.state), SRV_JOB_FINISHED);
    CHECK(a.job.submit_ns > 0 && a.job.run_ns >= a.job.submit_ns && a.job.done_ns >= a.job.run_ns);
    check_counters_zero(s);
    server_free(s);
}

static void test_admission_refuses_with_an_outcome_and_a_message(void)
{
    srv_server *s = server();
    srv_job_where w = {.route = 1, .bytes = 100, .level = 1};
    srv_job_refusal no;
    fake a, b, c;

    /* The drain's timeout passed: the drain's answer. */
    fake_init(&a, s, 60000);
    atomic_store(&s->drain_expired, true);
    CHECK(!srv__job_admit(&a.job, &w, eng_now_ns(), &no));
    CHECK_EQ_INT(no.outcome, SRV_REFUSE_DRAINING);
    CHECK(strcmp(no.msg, SRV_DRAINING_MSG) == 0);
    atomic_store(&s->drain_expired, false);

    /* Its deadline passed while it was read: 504, naming what set the deadline. */
    fake_init(&a, s, 1);
    CHECK(!srv__job_admit(&a.job, &w, eng_now_ns() + 2 * MS, &no));
    CHECK_EQ_INT(no.outcome, SRV_REFUSE_DEADLINE);
    CHECKF(strstr(no.msg, "while receiving the request (the fake's deadline)") != NULL, "%s",
           no.msg);

    /* --max-queue 2: the third admitted job waits for one of the two to leave. */
    fake_init(&a, s, 60000);
    fake_init(&b, s, 60000);
    fake_init(&c, s, 60000);
    CHECK(srv__job_admit(&a.job, &w, eng_now_ns(), &no));
    CHECK(srv__job_admit(&b.job, &w, eng_now_ns(), &no));
    CHECK(!srv__job_admit(&c.job, &w, eng_now_ns(), &no));
    CHECK_EQ_INT(no.outcome, SRV_REFUSE_QUEUE_FULL);
    CHECKF(strstr(no.msg, "--max-queue 2") != NULL, "%s", no.msg);
    CHECK_EQ_INT(atomic_load(&s->admitted), 2);
    srv__job_start(&a.job, eng_now_ns());
    srv__job_start(&b.job, eng_now_ns());
    wait_ended(&a);
    wait_ended(&b);
    CHECK_EQ_INT(c.worked + c.ended, 0);
    check_counters_zero(s);
    server_free(s);
}

static void test_a_job_abandoned_while_it_waits_never_runs(void)
{
    srv_server *s = server();
    fake a, b;
    fake_init(&a, s, 60000);
    fake_init(&b, s, 60000);
    a.hold = true;
    CHECK(admit_and_start(&a));
    wait_worked(&a); /* the one worker is busy: b waits with the scheduler */
    if (!admit_and_start(&b)) {
        CHECK(false);
        return;
    }
    CHECK_EQ_INT(atomic_load(&s->queued), 1);
    CHECK(srv__job_abandon(&b.job, SRV_REFUSE_CLIENT_GONE, "gone"));
    CHECK_EQ_INT(b.ended, 1);
    CHECK_EQ_INT(b.how, SRV_JOB_DROPPED); /* whoever abandoned it delivers the answer */
    CHECK_EQ_INT(b.failed, SRV_REFUSE_CLIENT_GONE);
    CHECK(strcmp(b.msg, "gone") == 0);
    CHECK_EQ_INT(atomic_load(&s->admitted), 1);
    /* A running job is the worker's: it cannot be abandoned. */
    CHECK(!srv__job_abandon(&a.job, SRV_REFUSE_CLIENT_GONE, "gone"));
    release();
    wait_ended(&a);
    CHECK_EQ_INT(a.how, SRV_JOB_ANSWERED);
    CHECK_EQ_INT(b.worked, 0);
    check_counters_zero(s);
    server_free(s);
}

static void test_a_job_cancelled_or_past_its_deadline_while_it_waits_never_runs(void)
{
    srv_server *s = server();
    fake a, b, c;
    s->max_queue = 3;
    fake_init(&a, s, 60000);
    fake_init(&b, s, 60000);
    fake_init(&c, s, 200);
    a.hold = true;
    CHECK(admit_and_start(&a));
    wait_worked(&a);
    if (!admit_and_start(&b) || !admit_and_start(&c)) {
        CHECK(false);
        return;
    }
    srv__job_cancel(&b.job, SRV_REFUSE_CLIENT_GONE);
    struct timespec past_c = {0, 300 * 1000 * 1000};
    nanosleep(&past_c, NULL); /* c's 200 ms pass while a holds the worker */
    release();
    wait_ended(&b);
    wait_ended(&c);
    CHECK_EQ_INT(b.worked + c.worked, 0);
    CHECK_EQ_INT(b.how, SRV_JOB_ANSWERED);
    CHECK_EQ_INT(b.failed, SRV_REFUSE_CLIENT_GONE);
    CHECK_EQ_INT(c.how, SRV_JOB_ANSWERED);
    CHECK_EQ_INT(c.failed, SRV_REFUSE_DEADLINE);
    CHECKF(strstr(c.msg, "deadline exceeded while waiting for a worker") != NULL &&
               strstr(c.msg, "(the fake's deadline)") != NULL,
           "%s", c.msg);
    wait_ended(&a);
    check_counters_zero(s);
    server_free(s);
}

static void test_the_drain_s_cancel_turns_a_failed_run_into_the_drain_s_answer(void)
{
    srv_server *s = server();
    fake a;
    fake_init(&a, s, 60000);
    a.hold = true;
    CHECK(admit_and_start(&a));
    wait_worked(&a);
    srv__job_cancel(&a.job, SRV_REFUSE_DRAINING);
    srv__job_cancel(&a.job, SRV_REFUSE_CLIENT_GONE); /* the first reason holds */
    release();
    wait_ended(&a);
    CHECK_EQ_INT(a.failed, SRV_REFUSE_DRAINING);
    CHECK_EQ_INT(a.reply.status, 503);
    CHECK_EQ_INT(a.reply.compute_ns, 7); /* the time it ran is still reported */
    CHECK(strstr(a.msg, "--drain-timeout-s") != NULL);
    check_counters_zero(s);
    server_free(s);
}

/* The reply of a job that ran says where its time went before the route: the body's arrival
 * less the edge's copying, the copying, and the wait for a worker (api_reply's stages). */
static void test_a_job_that_ran_reports_the_stages_before_its_route(void)
{
    srv_server *s = server();
    fake a, b;
    fake_init(&a, s, 60000);
    a.lease.start_ns -= 5 * MS; /* its first byte came 5 ms ago */
    a.job.copy_ns = 2 * MS;
    CHECK(admit_and_start(&a));
    wait_ended(&a);
    CHECK_EQ_INT(a.reply.copy_ns, 2 * MS);
    CHECK_EQ_INT(a.reply.receive_ns, a.job.submit_ns - a.lease.start_ns - 2 * MS);
    CHECK(a.reply.receive_ns >= 3 * MS);
    CHECK_EQ_INT(a.reply.queue_ns, a.job.run_ns - a.job.submit_ns);
    CHECK_EQ_INT(a.reply.compute_ns, 7); /* the route's own stages are left as they were */

    /* A copy that a coarse clock makes longer than the whole receive takes all of it. */
    fake_init(&b, s, 60000);
    b.job.copy_ns = 3600000 * MS;
    CHECK(admit_and_start(&b));
    wait_ended(&b);
    CHECK_EQ_INT(b.reply.copy_ns, b.job.submit_ns - b.lease.start_ns);
    CHECK_EQ_INT(b.reply.receive_ns, 0);
    check_counters_zero(s);
    server_free(s);
}

static void test_the_priority_level_is_one_clamp_for_both_edges(void)
{
    srv_server *s = server();
    s->limits.priority_levels = 3;
    s->limits.default_priority_level = 2;
    CHECK_EQ_INT(srv__job_level(s, 0), 2); /* absent */
    CHECK_EQ_INT(srv__job_level(s, 1), 1);
    CHECK_EQ_INT(srv__job_level(s, 3), 3);
    CHECK_EQ_INT(srv__job_level(s, 4), 2); /* the route refuses it with 400 once read */
    server_free(s);
}

int main(void)
{
    RUN_WITHIN(test_an_admitted_job_runs_on_a_worker_and_comes_back_once, 60);
    RUN_WITHIN(test_admission_refuses_with_an_outcome_and_a_message, 60);
    RUN_WITHIN(test_a_job_abandoned_while_it_waits_never_runs, 60);
    RUN_WITHIN(test_a_job_cancelled_or_past_its_deadline_while_it_waits_never_runs, 60);
    RUN_WITHIN(test_the_drain_s_cancel_turns_a_failed_run_into_the_drain_s_answer, 60);
    RUN_WITHIN(test_a_job_that_ran_reports_the_stages_before_its_route, 60);
    RUN_WITHIN(test_the_priority_level_is_one_clamp_for_both_edges, 60);
    return check_report();
}
