/*
 * dispatch.c - from admission to the engine workers: a request's expected wait against its
 * deadline (the 429 of an overloaded queue), its handoff to the scheduler (admission.h), and
 * its run on a worker (job_run), which hands the reply back to the MHD thread; a tiny request
 * beside a long one runs on the MHD thread itself (SRV_SCHED_HERE).
 */
#include <stdio.h>
#include <string.h>

#include "server/half_close.h"
#include "server/request.h"

static void job_run(void *arg, int64_t index);

/* A session request whose turn came (api_session_turn parked it): back to the pool at its
 * priority, behind what is queued there; run here if the pool takes no more (it is stopping). */
static void job_resume(void *arg)
{
    srv_req *req = arg;
    if (eng_pool_submit_at(req->srv->pool, req->pool_priority, job_run, req) != ENG_OK)
        job_run(req, 0);
}

/* A request answered while it waited gives up its place and its job reference: its ticket
 * ends and it no longer counts against --max-queue. */
static void drop_unstarted(srv_server *s, srv_req *req)
{
    api_session_turn_end(s->sessions, &req->ticket);
    atomic_fetch_sub(&s->admitted, 1);
    srv__req_unref(req);
}

/* The worker time of a request that ran: all of it is busy time, and that of a request that
 * still ended 504 was spent for nothing. */
static void count_work(srv_server *s, const srv_req *req)
{
    srv__metrics_work(&s->metrics, req->done_ns - req->run_ns,
                      req->reply.reason == API_REASON_DEADLINE);
}

/* Runs one request on an engine worker: decode, compute, encode (all inside the route's work
 * function), then hands the reply back to the MHD thread by resuming the connection. A request
 * on a session (or a step of a v2 sequence) first waits for its turn without holding the
 * worker: parked, it returns here and is resubmitted when the request before it ends; it gives
 * its scheduler slot back first, since the step it waits for may still need one. */
static void job_run(void *arg, int64_t index)
{
    srv_req *req = arg;
    srv_server *s = req->srv;
    const srv_route_def *rd = srv__route_def(req->route);
    int expected = REQ_QUEUED;
    bool ok;
    api_call call;
    (void)index;

    if (req->ticket.session || req->ticket.sequence)
        srv__sched_done(s->sched, &req->sched, SRV_SCHED_LEARN_NOTHING, eng_now_ns());
    if (!api_session_turn(s->sessions, &req->ticket, job_resume, req))
        return; /* parked: the job's reference goes with it */
    if (!atomic_compare_exchange_strong(&req->state, &expected, REQ_RUNNING)) {
        /* The watcher answered it while it waited (hang-up, deadline, drain). */
        srv__sched_done(s->sched, &req->sched, SRV_SCHED_LEARN_NOTHING, eng_now_ns());
        drop_unstarted(s, req);
        return;
    }
    atomic_fetch_sub(&s->queued, 1);
    atomic_fetch_add(&s->running, 1);
    req->run_ns = eng_now_ns();
    srv__sched_begin(s->sched, &req->sched, req->run_ns);

    memset(&call, 0, sizeof call);
    call.body = req->body.data ? req->body.data : "";
    call.body_len = req->body.len;
    call.pool = s->pool;
    call.lease = &req->lease;
    call.limits = &s->limits;
    call.models = s->models;
    call.sessions = s->sessions;
    call.session = srv__param(&req->params, "id");
    call.body_unread = req->body_unread;
    srv__req_call_headers(req, &call);
    if (rd->stats)
        rd->stats->started(&s->metrics, &req->stats);
    rd->work(&req->params, &call, &req->reply);
    api_session_turn_end(s->sessions, &req->ticket); /* the next step of the session may run */
    ok = req->reply.status >= 200 && req->reply.status < 300;
    if (req->reply.session[0] && ok)
        srv__metrics_session_step(&s->metrics, req->reply.compute_ns);

    if (atomic_load(&req->drain_cancelled) && req->reply.status != 200) {
        int64_t dec = req->reply.decode_ns, comp = req->reply.compute_ns;
        srv__req_fail(req, SRV_REFUSE_DRAINING,
                      "the server is shutting down (--drain-timeout-s passed)");
        req->reply.decode_ns = dec;
        req->reply.compute_ns = comp;
    }
    req->done_ns = eng_now_ns();
    count_work(s, req);
    srv__sched_done(s->sched, &req->sched,
                    ok                                         ? SRV_SCHED_LEARN_COST
                    : req->reply.reason == API_REASON_DEADLINE ? SRV_SCHED_LEARN_AT_LEAST
                                                               : SRV_SCHED_LEARN_NOTHING,
                    req->done_ns);
    srv__req_release_body(req);
    /* A client that half-closed would lose the reply on resume (half_close.c): write it now,
     * once the watcher can no longer write its probe (watch.c) to the socket. */
    srv__watch_remove(s->watch, &req->watch);
    if (srv__peer_sent_fin(srv__conn_fd(s->watch, &req->watch)))
        srv__req_send_direct(req);
    atomic_store(&req->state, REQ_DONE);
    atomic_fetch_sub(&s->running, 1);
    atomic_fetch_sub(&s->admitted, 1); /* before resuming: the client may send the next at once */
    srv__req_resume(req);
    srv__req_unref(req);
}

/* ---- The scheduler's operations ---------------------------------------------------------------
 */

static void sched_start(void *arg, uint32_t pool_priority, srv_sched_where where)
{
    srv_req *req = arg;
    srv_server *s = req->srv;
    int expected = REQ_QUEUED;
    req->pool_priority = pool_priority;
    if (where == SRV_SCHED_HERE) {
        job_run(req, 0);
        return;
    }
    if (eng_pool_submit_at(s->pool, pool_priority, job_run, req) == ENG_OK)
        return;
    srv__sched_done(s->sched, &req->sched, SRV_SCHED_LEARN_NOTHING, eng_now_ns());
    if (atomic_compare_exchange_strong(&req->state, &expected, REQ_DONE)) {
        atomic_fetch_sub(&s->queued, 1);
        srv__watch_remove(s->watch, &req->watch);
        srv__req_fail(req, SRV_REFUSE_INTERNAL, "could not queue the request");
        srv__req_resume(req);
    }
    drop_unstarted(s, req);
}

/* Answers 504 a request that would finish past its deadline even if it started now: no
 * worker time goes to a reply nobody can use. */
static void sched_expire(void *arg)
{
    srv_req *req = arg;
    srv_server *s = req->srv;
    int expected = REQ_QUEUED;
    char origin[64];
    if (atomic_compare_exchange_strong(&req->state, &expected, REQ_DONE)) {
        int64_t now = eng_now_ns();
        atomic_fetch_sub(&s->queued, 1);
        srv__watch_remove(s->watch, &req->watch);
        srv__req_deadline_origin(req, origin, sizeof origin);
        srv__req_fail(req, SRV_REFUSE_DEADLINE,
                      "deadline exceeded while waiting for a worker: about %lld ms of work, "
                      "%lld ms left (%s)",
                      (long long)(req->sched.cost_ns / 1000000),
                      (long long)((req->sched.deadline_ns - now) / 1000000), origin);
        req->done_ns = now;
        srv__req_resume(req);
    }
    drop_unstarted(s, req);
}

static const srv_sched_ops req_sched_ops = {.start = sched_start, .expire = sched_expire};

/* ---- Admission ------------------------------------------------------------------------------ */

void srv__req_take_ticket(srv_server *s, srv_req *req, const api_peek *peek)
{
    const srv_route_def *rd = srv__route_def(req->route);
    bool taken = false;
    if (!s->sessions)
        return;
    if (rd->flags & SRV_ROUTE_SESSION)
        taken = api_session_ticket_take(s->sessions, srv__param(&req->params, "id"), &req->ticket);
    else if ((rd->flags & SRV_ROUTE_BODY_SESSION) && peek->session[0])
        taken = api_session_ticket_take(s->sessions, peek->session, &req->ticket);
    if ((rd->flags & SRV_ROUTE_SEQUENCE) && peek->sequence_id)
        taken = api_sequence_ticket_take(s->sessions, srv__param(&req->params, "model"),
                                         peek->sequence_id, peek->sequence_id_len, &req->ticket);
    if (taken)
        srv__metrics_session_ticket(&s->metrics);
}

void srv__req_unqueue(srv_server *s, srv_req *req)
{
    if (srv__sched_remove(s->sched, &req->sched))
        drop_unstarted(s, req);
}

bool srv__req_overloaded(srv_server *s, srv_req *req, int64_t left_ns, uint32_t level, char *msg,
                         size_t size, int *retry_s)
{
    srv_sched_ask ask = {.route = req->route,
                         .bytes = req->has_length ? req->content_length : req->body.len,
                         .level = level,
                         .left_ns = left_ns};
    srv_sched_refusal r;
    if (!srv__sched_overloaded(s->sched, &ask, eng_now_ns(), &r))
        return false;
    snprintf(msg, size, "%s", r.msg);
    *retry_s = r.retry_s;
    return true;
}

void srv__req_dispatch(srv_server *s, srv_req *req, int64_t now)
{
    srv_sched_entry *e = &req->sched;
    e->ops = &req_sched_ops;
    e->req = req;
    e->route = req->route;
    e->bytes = req->body.len;
    e->level = req->priority;
    e->deadline_ns = req->watch.deadline_ns;
    e->cost_ns = srv__sched_cost(s->sched, req->route, req->body.len, NULL);
    /* Not a step of a session: it may have to wait for its turn, which the MHD thread must not. */
    e->may_run_here = !req->ticket.session && !req->ticket.sequence;
    srv__sched_enqueue(s->sched, e, now);
}
