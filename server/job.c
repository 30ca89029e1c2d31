/*
 * job.c - the life of an inference from its admission to its answer, for both edges (job.h):
 * admission, the scheduler's operations, the run on a worker, the counters and the outcome of a
 * job that ends without running.
 */
#include "server/job.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/metrics.h"

static void job_run(void *arg, int64_t index);

void srv__job_init(srv_job *job, srv_server *s, const srv_job_ops *ops, void *owner,
                   api_lease *lease, api_reply *reply)
{
    memset(job, 0, sizeof *job);
    job->ops = ops;
    job->owner = owner;
    job->s = s;
    job->lease = lease;
    job->reply = reply;
    atomic_init(&job->state, SRV_JOB_NEW);
    atomic_init(&job->cancelled, SRV_ANSWER_OK);
}

int64_t srv__job_handler_ns(const srv_job *job)
{
    return job->submit_ns > 0 && job->done_ns > job->submit_ns ? job->done_ns - job->submit_ns : 0;
}

uint32_t srv__job_level(const srv_server *s, uint64_t priority)
{
    return priority >= 1 && priority <= s->limits.priority_levels
               ? (uint32_t)priority
               : s->limits.default_priority_level;
}

/* ---- Admission ------------------------------------------------------------------------------ */

static bool refuse(srv_job_refusal *no, srv_outcome o, int retry_s, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static bool refuse(srv_job_refusal *no, srv_outcome o, int retry_s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(no->msg, sizeof no->msg, fmt, ap);
    va_end(ap);
    no->outcome = o;
    no->retry_s = retry_s;
    return false;
}

/* Takes one slot of --max-queue; false when the queue is full. */
static bool take_slot(srv_server *s)
{
    int_fast64_t admitted = atomic_load(&s->admitted);
    do {
        if (admitted >= s->max_queue)
            return false;
    } while (!atomic_compare_exchange_weak(&s->admitted, &admitted, admitted + 1));
    return true;
}

static bool queue_full(const srv_server *s, srv_job_refusal *no)
{
    return refuse(no, SRV_REFUSE_QUEUE_FULL, 0, "the queue is full (--max-queue %lld); retry later",
                  (long long)s->max_queue);
}

bool srv__job_room(srv_server *s, srv_job_refusal *no)
{
    return atomic_load(&s->admitted) < s->max_queue || queue_full(s, no);
}

bool srv__job_upload_in_time(srv_server *s, const srv_job_upload *up,
                             const srv_upload_outlook *look, int64_t now, srv_job_refusal *no)
{
    srv_sched_ask ask = {.route = up->route,
                         .bytes = up->bytes,
                         .level = up->level,
                         .left_ns = up->left_ns,
                         .arrive_ns = look->arrive_ns,
                         .ahead_ns = look->ahead_ns};
    srv_sched_refusal over;
    if (look->arrive_ns > up->left_ns) {
        int64_t over_s = (look->arrive_ns - up->left_ns) / 1000000000 + 1;
        return refuse(no, SRV_REFUSE_OVERLOADED, over_s < 3600 ? (int)over_s : 3600,
                      "the body of %llu bytes would arrive in about %lld ms (%llu bytes to come "
                      "here and %llu on other bodies, at %.2f MiB/s), past its deadline (%lld ms "
                      "left of %s); retry later",
                      (unsigned long long)up->bytes, (long long)(look->arrive_ns / 1000000),
                      (unsigned long long)look->to_come, (unsigned long long)look->in_flight,
                      (double)look->rate / 1048576.0, (long long)(up->left_ns / 1000000),
                      up->deadline_origin);
    }
    if (srv__sched_overloaded(s->sched, &ask, now, &over))
        return refuse(no, SRV_REFUSE_OVERLOADED, over.retry_s, "%s", over.msg);
    return true;
}

bool srv__job_admit_upload(srv_server *s, srv_upload *u, const srv_job_upload *up, int64_t now,
                           srv_job_refusal *no)
{
    srv_upload_outlook look;
    if (up->left_ns <= 0)
        return refuse(no, SRV_REFUSE_DEADLINE, 0,
                      "deadline exceeded while receiving the request (%s)", up->deadline_origin);
    int64_t cost = srv__sched_cost(s->sched, up->route, up->bytes, NULL);
    if (!srv__uploads_begin(s->uploads, u, up->bytes, cost, now, &look))
        return refuse(no, SRV_REFUSE_OVERLOADED, 0,
                      "the bodies on their way (%llu bytes still to arrive) and this one of %llu "
                      "bytes would pass --max-upload-bytes (%llu); retry later",
                      (unsigned long long)look.in_flight, (unsigned long long)up->bytes,
                      (unsigned long long)look.max);
    if (srv__job_upload_in_time(s, up, &look, now, no))
        return true;
    srv__uploads_end(s->uploads, u, false, now);
    return false;
}

bool srv__job_admit(srv_job *job, const srv_job_where *where, int64_t now, srv_job_refusal *no)
{
    srv_server *s = job->s;
    int64_t deadline = job->lease->ctl.deadline_ns;
    srv_sched_entry *e = &job->sched;
    srv_sched_refusal over;
    char origin[64];

    e->route = where->route;
    e->bytes = where->bytes;
    e->level = where->level;
    e->may_run_here = where->may_run_here && !where->batch_key;
    e->deadline_ns = deadline;
    job->batch.key = where->batch_key;
    if (atomic_load(&s->drain_expired))
        return refuse(no, SRV_REFUSE_DRAINING, 0, "%s", SRV_DRAINING_MSG);
    if (deadline > 0 && now >= deadline) {
        job->ops->deadline_origin(job, origin, sizeof origin);
        return refuse(no, SRV_REFUSE_DEADLINE, 0,
                      "deadline exceeded while receiving the request (%s)", origin);
    }
    srv_sched_ask ask = {
        .route = e->route, .bytes = e->bytes, .level = e->level, .left_ns = deadline - now};
    if (deadline > 0 && srv__sched_overloaded(s->sched, &ask, now, &over))
        return refuse(no, SRV_REFUSE_OVERLOADED, over.retry_s, "%s", over.msg);
    if (!take_slot(s))
        return queue_full(s, no);
    job->submit_ns = now;
    /* Queued from here on, before the edge hands it to its watcher: a deadline that passes
     * before the scheduler has it is still answered at once (srv__job_abandon). */
    atomic_store(&job->state, SRV_JOB_QUEUED);
    atomic_fetch_add(&s->queued, 1);
    return true;
}

void srv__job_take_turn(srv_job *job, const srv_job_order *order)
{
    srv_server *s = job->s;
    bool taken = false;
    if (!s->sessions)
        return;
    if (order->session && order->session[0])
        taken = api_session_ticket_take(s->sessions, order->session, &job->ticket);
    else if (order->model && order->sequence_id)
        taken = api_sequence_ticket_take(s->sessions, order->model, order->sequence_id,
                                         order->sequence_id_len, &job->ticket);
    if (taken)
        srv__metrics_session_ticket(&s->metrics);
}

/* ---- Ends --------------------------------------------------------------------------------- */

/* Fills the reply of a job that ends without running with refusal `o`. */
static void fail(srv_job *job, srv_outcome o, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void fail(srv_job *job, srv_outcome o, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    job->ops->fail(job, o, msg);
}

/* A job leaves: its turn goes to the next step of its order, its slot of --max-queue is free
 * (before the edge answers: the client may send the next request at once), and the edge gets it
 * back. */
static void leave(srv_job *job, srv_job_end how)
{
    srv_server *s = job->s;
    api_session_turn_end(s->sessions, &job->ticket);
    atomic_fetch_sub(&s->admitted, 1);
    job->ops->end(job, how);
}

/* Ends a job that waited, if nobody answered it meanwhile, with refusal `o`; true when it did. */
static bool finish_waiting(srv_job *job, srv_outcome o, const char *msg)
{
    int expected = SRV_JOB_QUEUED;
    if (!atomic_compare_exchange_strong(&job->state, &expected, SRV_JOB_FINISHED))
        return false;
    atomic_fetch_sub(&job->s->queued, 1);
    job->ops->fail(job, o, msg);
    job->done_ns = eng_now_ns();
    return true;
}

bool srv__job_abandon(srv_job *job, srv_outcome o, const char *msg)
{
    if (!finish_waiting(job, o, msg))
        return false;
    if (srv__sched_remove(job->s->sched, &job->sched))
        leave(job, SRV_JOB_DROPPED);
    /* else the scheduler is starting it: job_run or sched_start finds it finished and drops it */
    return true;
}

void srv__job_cancel(srv_job *job, srv_outcome why)
{
    int none = SRV_ANSWER_OK;
    atomic_compare_exchange_strong(&job->cancelled, &none, (int)why);
    atomic_store(&job->lease->ctl.cancel, true);
}

/* ---- The run on a worker ------------------------------------------------------------------ */

static void job_resume(void *arg)
{
    srv_job *job = arg;
    if (eng_pool_submit_at(job->s->pool, job->pool_priority, job_run, job) != ENG_OK)
        job_run(job, 0); /* the pool is stopping: run here, in order */
}

/* What a job that gave its slot back teaches the cost model. */
static srv_sched_learn learned(const api_reply *reply)
{
    if (reply->status >= 200 && reply->status < 300)
        return SRV_SCHED_LEARN_COST;
    return reply->reason == API_REASON_DEADLINE ? SRV_SCHED_LEARN_AT_LEAST
                                                : SRV_SCHED_LEARN_NOTHING;
}

/* Whether the job may still run: false, with its reply filled, when it was cancelled or its
 * deadline passed while it waited. */
static bool still_wanted(srv_job *job)
{
    char origin[64];
    srv_outcome why = (srv_outcome)atomic_load(&job->cancelled);
    if (atomic_load(&job->lease->ctl.cancel)) {
        fail(job, why == SRV_REFUSE_DRAINING ? why : SRV_REFUSE_CLIENT_GONE, "%s",
             why == SRV_REFUSE_DRAINING ? "the server is shutting down (--drain-timeout-s passed)"
                                        : "cancelled: the client went away");
        return false;
    }
    if (job->lease->ctl.deadline_ns > 0 && job->run_ns >= job->lease->ctl.deadline_ns) {
        job->ops->deadline_origin(job, origin, sizeof origin);
        fail(job, SRV_REFUSE_DEADLINE, "deadline exceeded while waiting for a worker (%s)", origin);
        return false;
    }
    return true;
}

/* Whether it is the job's turn in its session's or sequence's order (or it has none); false
 * when it is parked, to be resubmitted (job_resume) when the step before it ends. */
static bool turn_now(srv_job *job)
{
    if (!job->ticket.session && !job->ticket.sequence)
        return true;
    return api_session_turn(job->s->sessions, &job->ticket, job_resume, job);
}

/* The job is a worker's now: false when it was answered while it waited (then it is gone). */
static bool begin_running(srv_job *job)
{
    srv_server *s = job->s;
    int expected = SRV_JOB_QUEUED;
    if (!atomic_compare_exchange_strong(&job->state, &expected, SRV_JOB_RUNNING)) {
        srv__sched_done(s->sched, &job->sched, SRV_SCHED_LEARN_NOTHING, eng_now_ns());
        leave(job, SRV_JOB_DROPPED);
        return false;
    }
    atomic_fetch_sub(&s->queued, 1);
    atomic_fetch_add(&s->running, 1);
    job->run_ns = eng_now_ns();
    srv__sched_begin(s->sched, &job->sched, job->run_ns);
    return true;
}

/* The stages before the route into the reply (api_reply's stage timings): the body's arrival
 * less the edge's copying, that copying, and the wait for a worker. */
static void stamp_stages(srv_job *job)
{
    api_reply *r = job->reply;
    int64_t arrival = job->lease->start_ns, received = 0;
    if (arrival > 0 && job->submit_ns > arrival)
        received = job->submit_ns - arrival;
    r->copy_ns = job->copy_ns < received ? job->copy_ns : received;
    r->receive_ns = received - r->copy_ns;
    r->queue_ns = job->run_ns > job->submit_ns ? job->run_ns - job->submit_ns : 0;
}

/* The job's reply is final: the next step of its order may run, what it taught, and back to
 * its edge. */
static void finish_running(srv_job *job)
{
    srv_server *s = job->s;
    api_session_turn_end(s->sessions, &job->ticket); /* the next step may run */
    if (atomic_load(&job->cancelled) == SRV_REFUSE_DRAINING && job->reply->status != 200) {
        int64_t decode = job->reply->decode_ns, compute = job->reply->compute_ns;
        fail(job, SRV_REFUSE_DRAINING, "the server is shutting down (--drain-timeout-s passed)");
        job->reply->decode_ns = decode;
        job->reply->compute_ns = compute;
    }
    stamp_stages(job);
    job->done_ns = eng_now_ns();
    srv__metrics_work(&s->metrics,
                      (job->done_ns - job->run_ns) / (job->sharing > 1 ? job->sharing : 1),
                      job->reply->reason == API_REASON_DEADLINE);
    srv__sched_done(s->sched, &job->sched, learned(job->reply), job->done_ns);
    atomic_store(&job->state, SRV_JOB_FINISHED);
    atomic_fetch_sub(&s->running, 1);
    leave(job, SRV_JOB_ANSWERED);
}

/* Runs a job on an engine worker. A step of a session or sequence first gives its scheduler
 * slot back (the step it waits for may still need one) and waits for its turn without holding
 * the worker; a resumed one that may share an engine call goes to its lane. */
static void job_run(void *arg, int64_t index)
{
    srv_job *job = arg;
    srv_server *s = job->s;
    (void)index;
    if (job->ticket.session || job->ticket.sequence)
        srv__sched_done(s->sched, &job->sched, SRV_SCHED_LEARN_NOTHING, eng_now_ns());
    if (!turn_now(job))
        return; /* parked: the job's reference goes with it */
    if (job->batch.key && s->batcher &&
        srv__batcher_add(s->batcher, &job->batch, job->pool_priority))
        return;
    if (!begin_running(job))
        return;
    if (still_wanted(job))
        job->ops->work(job);
    finish_running(job);
}

/* A group of one lane (batch.h): the jobs still wanted run as one api_call_batch; one whose
 * edge cannot batch runs alone. */
void srv__job_run_group(void *ctx, srv_batch_item **items, int n)
{
    srv_server *s = ctx;
    srv_job **in = calloc((size_t)n, sizeof *in);
    api_batch_member *m = calloc((size_t)n, sizeof *m);
    int k = 0;
    for (int i = 0; i < n; i++) {
        srv_job *job = (srv_job *)((char *)items[i] - offsetof(srv_job, batch));
        if (!begin_running(job))
            continue;
        if (!still_wanted(job)) {
            finish_running(job);
        } else if (in && m && job->ops->batch_call && job->ops->batch_call(job, &m[k])) {
            in[k++] = job;
        } else {
            job->ops->work(job);
            finish_running(job);
        }
    }
    if (k > 0) {
        srv__metrics_batch(&s->metrics, k);
        api_call_batch(m, k, s->max_batch_rows);
    }
    for (int j = 0; j < k; j++) {
        in[j]->sharing = k;
        in[j]->ops->batch_called(in[j]);
        finish_running(in[j]);
    }
    free(in);
    free(m);
}

/* ---- The scheduler's operations ----------------------------------------------------------- */

static void sched_start(void *arg, uint32_t pool_priority, srv_sched_where where)
{
    srv_job *job = arg;
    srv_server *s = job->s;
    job->pool_priority = pool_priority;
    /* A job that may share an engine call waits in its layer's lane (batch.h), not in the pool's
     * queue, and without a slot: its batch is what started meanwhile, which a slot each would
     * have kept waiting. The scheduler goes on to start the next. */
    if (job->batch.key && s->batcher) {
        srv__sched_release(s->sched, &job->sched, eng_now_ns());
        if (!turn_now(job) || srv__batcher_add(s->batcher, &job->batch, pool_priority))
            return;
    }
    if (where == SRV_SCHED_HERE) {
        job_run(job, 0);
        return;
    }
    if (eng_pool_submit_at(s->pool, pool_priority, job_run, job) == ENG_OK)
        return;
    srv__sched_done(s->sched, &job->sched, SRV_SCHED_LEARN_NOTHING, eng_now_ns());
    leave(job, finish_waiting(job, SRV_REFUSE_INTERNAL, "could not queue the request")
                   ? SRV_JOB_ANSWERED
                   : SRV_JOB_DROPPED);
}

/* A job that would finish past its deadline even if it started now: 504 at once, so that no
 * worker time goes to a reply nobody can use. */
static void sched_expire(void *arg)
{
    srv_job *job = arg;
    char msg[200], origin[64];
    int64_t now = eng_now_ns();
    job->ops->deadline_origin(job, origin, sizeof origin);
    snprintf(msg, sizeof msg,
             "deadline exceeded while waiting for a worker: about %lld ms of work, %lld ms left "
             "(%s)",
             (long long)(job->sched.cost_ns / 1000000),
             (long long)((job->sched.deadline_ns - now) / 1000000), origin);
    leave(job, finish_waiting(job, SRV_REFUSE_DEADLINE, msg) ? SRV_JOB_ANSWERED : SRV_JOB_DROPPED);
}

static const srv_sched_ops job_sched_ops = {.start = sched_start, .expire = sched_expire};

void srv__job_start(srv_job *job, int64_t now)
{
    srv_server *s = job->s;
    srv_sched_entry *e = &job->sched;
    e->ops = &job_sched_ops;
    e->req = job;
    e->cost_ns = srv__sched_cost(s->sched, e->route, e->bytes, NULL);
    /* A step that may wait for its turn must not block the thread that starts it. */
    if (job->ticket.session || job->ticket.sequence)
        e->may_run_here = false;
    srv__sched_enqueue(s->sched, e, now);
}
