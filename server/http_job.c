/*
 * http_job.c - an HTTP request as a job (job.h): how a worker runs its route's work function,
 * how its errors are written (the route's protocol style), and how a finished job goes back to
 * libmicrohttpd (its connection resumed, or its reply written at once to a client that
 * half-closed); also the place in a session's or sequence's order its route asks for.
 */
#include <string.h>

#include "server/half_close.h"
#include "server/request.h"

/* The api call of req's route (its body and headers, its lease, the server's limits, layers
 * and sessions, and the path's parameters), counted as started in the route's statistics. */
static void fill_call(srv_req *req, api_call *call)
{
    srv_server *s = req->srv;
    memset(call, 0, sizeof *call);
    call->body = req->body.data ? req->body.data : "";
    call->body_len = req->body.len;
    call->pool = s->pool;
    call->lease = &req->lease;
    call->limits = &s->limits;
    call->models = s->models;
    call->sessions = s->sessions;
    call->session = srv__param(&req->params, "id");
    call->model = srv__param(&req->params, "model");
    call->version = srv__param(&req->params, "version");
    call->body_unread = req->body_unread;
    srv__req_call_headers(req, call);
    const srv_route_def *rd = srv__route_def(req->route);
    if (rd->stats)
        rd->stats->started(&s->metrics, &req->stats);
}

/* What follows the call: a session step's metric, and the body's memory back. */
static void called(srv_job *job)
{
    srv_req *req = job->owner;
    srv_server *s = req->srv;
    if (req->reply.session[0] && req->reply.status >= 200 && req->reply.status < 300)
        srv__metrics_session_step(&s->metrics, req->reply.compute_ns);
    srv__req_release_body(req);
}

static void work(srv_job *job)
{
    srv_req *req = job->owner;
    api_call call;
    fill_call(req, &call);
    srv__route_def(req->route)->work(&req->params, &call, &req->reply);
    called(job);
}

static bool batch_call(srv_job *job, api_batch_member *m)
{
    srv_req *req = job->owner;
    const srv_route_def *rd = srv__route_def(req->route);
    if (rd->batch == API_BATCH_NONE)
        return false;
    fill_call(req, &req->call);
    *m = (api_batch_member){.route = rd->batch, .call = &req->call, .reply = &req->reply};
    return true;
}

static void fail(srv_job *job, srv_outcome o, const char *msg)
{
    srv__req_fail(job->owner, o, "%s", msg);
}

/* The worker time of a request that ran counts as busy; its reply goes back to the MHD thread,
 * or straight to the socket of a client that half-closed, which would lose it on resume
 * (half_close.c), once the watcher can no longer write its probe (watch.c) there. */
static void end(srv_job *job, srv_job_end how)
{
    srv_req *req = job->owner;
    srv_server *s = req->srv;
    if (how == SRV_JOB_ANSWERED) {
        srv__watch_remove(s->watch, &req->watch);
        if (srv__peer_sent_fin(srv__conn_fd(s->watch, &req->watch)))
            srv__req_send_direct(req);
        srv__req_resume(req);
    }
    srv__req_unref(req);
}

static void deadline_origin(const srv_job *job, char *buf, size_t size)
{
    srv__req_deadline_origin(job->owner, buf, size);
}

const srv_job_ops srv__http_job_ops = {.work = work,
                                       .fail = fail,
                                       .end = end,
                                       .deadline_origin = deadline_origin,
                                       .batch_call = batch_call,
                                       .batch_called = called};

/* A SRV_ROUTE_SESSION request's session is its {id}; a SRV_ROUTE_BODY_SESSION one's the body's
 * "session"; a SRV_ROUTE_SEQUENCE one's place is its model's v2 sequence. */
void srv__req_take_turn(srv_req *req, const api_peek *peek)
{
    const srv_route_def *rd = srv__route_def(req->route);
    srv_job_order order = {0};
    if (rd->flags & SRV_ROUTE_SESSION)
        order.session = srv__param(&req->params, "id");
    else if (rd->flags & SRV_ROUTE_BODY_SESSION)
        order.session = peek->session;
    if ((rd->flags & SRV_ROUTE_SEQUENCE) && peek->sequence_id) {
        order.model = srv__param(&req->params, "model");
        order.sequence_id = peek->sequence_id;
        order.sequence_id_len = peek->sequence_id_len;
    }
    srv__job_take_turn(&req->job, &order);
}
