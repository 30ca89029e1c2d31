/*
 * grpc_call.c - one gRPC call (an HTTP/2 stream) from its headers to its log line: the checks
 * every call passes (token, content type, method, grpc-timeout, the drain), its messages as
 * they arrive (reserved in the memory budget byte by byte), the cheap methods answered on the
 * gRPC thread, and inferences, which are jobs as HTTP's requests are (job.h: --max-queue,
 * priority, deadline, a sequence's order, the scheduler, an engine worker) running
 * api_grpc_infer. ModelStreamInfer runs its messages one after another, answering each with a
 * message; the other methods take one.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/grpc.h"
#include "server/log.h"

#define HEADER_BYTES_MAX  16384 /* a request's header block, as HPACK decodes it */
#define HEADER_ENTRY_COST 32    /* HTTP/2's per-field overhead in SETTINGS_MAX_HEADER_LIST_SIZE */
#define PREFIX_BYTES      5     /* before each message: a compressed flag and a 4-byte length */

static bool is_stream(const grpc_call *call)
{
    return call->method == API_GRPC_MODEL_STREAM_INFER;
}

/* A reply that is server/'s own outcome `o`, for a message answered on the gRPC thread or a job. */
static void error_reply(api_reply *reply, srv_outcome o, const char *msg)
{
    api_grpc_error(reply, srv__outcome_http(o, API_ERRORS_V2), srv__outcome(o)->reason, msg);
}

grpc_call *srv__grpc_call_new(grpc_conn *conn, int32_t stream_id)
{
    srv_server *s = conn->g->s;
    grpc_call *call = calloc(1, sizeof *call);
    if (!call)
        return NULL;
    call->conn = conn;
    call->stream_id = stream_id;
    call->http_status = 200;
    snprintf(call->id, sizeof call->id, "grpc-%llu-%d", (unsigned long long)conn->number,
             (int)stream_id);
    api_lease_start(&call->lease, s->budget, eng_now_ns(), s->limits.max_timeout_ms);
    call->recv_since_ns = call->lease.start_ns;
    api_grpc_reader_init(&call->reader);
    atomic_fetch_add(&s->active, 1);
    call->counted = true;
    return call;
}

static bool header_is(const uint8_t *name, size_t len, const char *want)
{
    return len == strlen(want) && memcmp(name, want, len) == 0;
}

static void copy_value(char *dst, size_t cap, const uint8_t *value, size_t len)
{
    size_t n = len < cap - 1 ? len : cap - 1;
    memcpy(dst, value, n);
    dst[n] = '\0';
}

int srv__grpc_call_header(grpc_call *call, const uint8_t *name, size_t namelen,
                          const uint8_t *value, size_t valuelen)
{
    srv_server *s = call->conn->g->s;
    char buf[512];
    call->header_bytes += namelen + valuelen + HEADER_ENTRY_COST;
    if (call->header_bytes > HEADER_BYTES_MAX)
        return -1;
    if (header_is(name, namelen, ":path")) {
        if (valuelen >= sizeof call->path)
            valuelen = 0; /* too long for any method: unimplemented */
        copy_value(call->path, sizeof call->path, value, valuelen);
    } else if (header_is(name, namelen, "content-type")) {
        call->bad_content_type = valuelen < 16 || memcmp(value, "application/grpc", 16) != 0;
    } else if (header_is(name, namelen, "grpc-timeout")) {
        copy_value(buf, sizeof buf, value, valuelen < 16 ? valuelen : 16);
        call->timeout_ms = api_grpc_timeout_ms(buf);
    } else if (header_is(name, namelen, "authorization")) {
        call->auth_seen = true;
        copy_value(buf, sizeof buf, value, valuelen < sizeof buf - 1 ? valuelen : 0);
        call->auth_ok = srv__auth_allows(s->auth, buf);
    }
    return 0;
}

void srv__grpc_call_headers_done(grpc_call *call)
{
    srv_server *s = call->conn->g->s;
    char msg[200];
    call->method = api_grpc_method_of(call->path, strlen(call->path));
    if (s->auth && !call->auth_ok) {
        srv__grpc_finish_as(call, SRV_REFUSE_UNAUTHORIZED, srv__auth_refusal(call->auth_seen));
    } else if (atomic_load(&s->draining)) {
        srv__grpc_finish_as(call, SRV_REFUSE_DRAINING, SRV_DRAINING_MSG);
    } else if (call->bad_content_type) {
        srv__grpc_finish_as(call, SRV_REFUSE_MEDIA, "content-type must be application/grpc");
    } else if (call->method == API_GRPC_UNIMPLEMENTED) {
        snprintf(msg, sizeof msg, "method %.120s is not implemented by attnd", call->path);
        srv__grpc_finish_as(call, SRV_REFUSE_NO_METHOD, msg);
    } else if (call->timeout_ms < 0) {
        srv__grpc_finish_as(call, SRV_REFUSE_BAD_HEADER, "grpc-timeout is malformed");
    } else if (is_stream(call)) {
        /* A stream lives as long as its client wants (grpc-timeout aside): --request-timeout-ms
         * bounds each of its inferences instead. */
        call->lease.ctl.deadline_ns =
            call->timeout_ms > 0 ? call->lease.start_ns + call->timeout_ms * 1000000 : 0;
    } else {
        api_lease_shorten(&call->lease, call->timeout_ms);
    }
}

/* ---- Replies ----------------------------------------------------------------------------------
 */

/* Sends reply's body as one length-prefixed message; the body is taken over. */
static void send_message(grpc_call *call, api_reply *reply)
{
    unsigned char prefix[5] = {
        0, (unsigned char)(reply->body_len >> 24), (unsigned char)(reply->body_len >> 16),
        (unsigned char)(reply->body_len >> 8), (unsigned char)reply->body_len};
    srv__grpc_send(call, prefix, sizeof prefix);
    if (reply->body_len)
        srv__grpc_send_owned(call, reply->body, reply->body_len);
    else
        eng_buf_free(reply->body);
    reply->body = NULL;
    reply->body_len = 0;
}

/* A unary call's answer: the message and OK, or the error as its status. */
static void answer(grpc_call *call, api_reply *reply)
{
    if (reply->status == 200) {
        send_message(call, reply);
        srv__grpc_finish_as(call, SRV_ANSWER_OK, NULL);
    } else {
        srv__grpc_finish(call, reply->status, reply->reason, reply->body ? reply->body : "");
    }
    api_reply_free(reply);
}

static void statistics(grpc_call *call, const grpc_msg *m, api_reply *reply)
{
    srv_server *s = call->conn->g->s;
    api_grpc_infer_peek named;
    int slot = -1;
    memset(reply, 0, sizeof *reply);
    /* A ModelStatisticsRequest has its name and version where a ModelInferRequest has its
     * model_name and model_version (fields 1 and 2): the peek reads them. */
    if (!api_grpc_infer_peek_read(m->data, m->len, &named)) {
        error_reply(reply, SRV_REFUSE_FRAMING, "malformed ModelStatisticsRequest");
        return;
    }
    if (named.model[0]) {
        if (!api_v2_model_known(s->models, named.model, named.version[0] ? named.version : NULL)) {
            api_call c = {.body = m->data, .body_len = m->len, .models = s->models};
            api_grpc_unary(API_GRPC_MODEL_READY, true, &c, reply); /* the 404 naming it */
            return;
        }
        slot = srv__metrics_model_slot(s->models, named.model);
    }
    size_t n;
    api_model_stats *st = srv__metrics_model_stats(&s->metrics, s->models, slot, &n);
    if (st)
        api_grpc_statistics(st, n, reply);
    else
        error_reply(reply, SRV_REFUSE_NO_MEMORY, "out of memory");
    free(st);
}

static void free_msg(grpc_call *call, grpc_msg *m)
{
    eng_buf_free(m->data);
    api_lease_give_back(&call->lease, m->held);
    m->data = NULL;
    m->held = 0;
}

/* ---- Inferences, as jobs (job.h) -------------------------------------------------------------
 */

/* The api call of the inference (its message, which the call may move within), no longer
 * pending for the model's metrics. */
static void fill_call(grpc_job *job, api_call *call)
{
    srv_server *s = job->g->s;
    if (job->pending)
        srv__metrics_model_pending(&s->metrics, job->slot, -1);
    job->pending = false;
    *call = (api_call){.body = job->msg.data,
                       .body_len = job->msg.len,
                       .pool = s->pool,
                       .lease = &job->lease,
                       .limits = &s->limits,
                       .models = s->models,
                       .sessions = s->sessions,
                       .body_movable = true};
}

/* After the call: the message's memory back. */
static void job_called(srv_job *sj)
{
    grpc_job *job = sj->owner;
    eng_buf_free(job->msg.data);
    job->msg.data = NULL;
    api_lease_give_back(&job->lease, job->msg.held);
    job->msg.held = 0;
}

static void job_work(srv_job *sj)
{
    grpc_job *job = sj->owner;
    api_call call;
    fill_call(job, &call);
    api_grpc_infer(&call, job->stream, &job->reply);
    job_called(sj);
}

static bool job_batch_call(srv_job *sj, api_batch_member *m)
{
    grpc_job *job = sj->owner;
    fill_call(job, &job->api);
    *m = (api_batch_member){.route = job->stream ? API_BATCH_GRPC_STREAM : API_BATCH_GRPC_INFER,
                            .call = &job->api,
                            .reply = &job->reply};
    return true;
}

static void job_fail(srv_job *sj, srv_outcome o, const char *msg)
{
    grpc_job *job = sj->owner;
    error_reply(&job->reply, o, msg);
}

/* Every job comes back through the completion list: the gRPC thread answers its call. */
static void job_end(srv_job *sj, srv_job_end how)
{
    grpc_job *job = sj->owner;
    srv_grpc *g = job->g;
    (void)how; /* nothing abandons a gRPC job: its call cancels it instead */
    pthread_mutex_lock(&g->done_lock);
    job->next = g->done;
    g->done = job;
    pthread_mutex_unlock(&g->done_lock);
    srv__grpc_wake(g);
}

/* What set the deadline of an inference of `call` (NULL: its stream is gone) whose message names
 * no timeout of its own, for a refusal's message: a unary call's grpc-timeout, else the flag. */
static void call_deadline_origin(const srv_server *s, const grpc_call *call, bool stream, char *buf,
                                 size_t size)
{
    if (call && call->timeout_ms > 0 && !stream)
        snprintf(buf, size, "grpc-timeout of %lld ms", (long long)call->timeout_ms);
    else
        snprintf(buf, size, "--request-timeout-ms %lld",
                 (long long)(s->request_timeout_ns / 1000000));
}

static void job_deadline_origin(const srv_job *sj, char *buf, size_t size)
{
    const grpc_job *job = sj->owner;
    if (job->own_timeout_ms > 0)
        snprintf(buf, size, "the request's timeout of %lld ms", (long long)job->own_timeout_ms);
    else
        call_deadline_origin(job->g->s, job->call, job->stream, buf, size);
}

static const srv_job_ops grpc_job_ops = {.work = job_work,
                                         .fail = job_fail,
                                         .end = job_end,
                                         .deadline_origin = job_deadline_origin,
                                         .batch_call = job_batch_call,
                                         .batch_called = job_called};

/* A job for message m of the call: its own lease (the message's bytes move into it), the
 * deadline the tighter of the call's and the message's own timeout, and its model slot read from
 * the message; *pk gets what the message says of its priority and sequence. NULL when out of
 * memory. */
static grpc_job *job_new(grpc_call *call, grpc_msg *m, api_grpc_infer_peek *pk, bool *peeked)
{
    srv_server *s = call->conn->g->s;
    grpc_job *job = calloc(1, sizeof *job);
    int64_t now = eng_now_ns(), deadline;
    if (!job)
        return NULL;
    job->g = call->conn->g;
    job->call = call;
    job->stream = is_stream(call);
    job->slot = -1;
    srv__job_init(&job->job, s, &grpc_job_ops, job, &job->lease, &job->reply);
    api_lease_start(&job->lease, s->budget, is_stream(call) ? now : call->lease.start_ns,
                    s->limits.max_timeout_ms);
    if (call->lease.ctl.deadline_ns > 0 &&
        (job->lease.ctl.deadline_ns == 0 ||
         call->lease.ctl.deadline_ns < job->lease.ctl.deadline_ns))
        job->lease.ctl.deadline_ns = call->lease.ctl.deadline_ns;
    api_lease_give_back(&call->lease, m->held);
    if (api_lease_reserve(&job->lease, m->held) == API_BUDGET_OK)
        job->msg = *m;
    else
        eng_buf_free(m->data);
    memset(m, 0, sizeof *m);
    *peeked = api_grpc_infer_peek_read(job->msg.data, job->msg.len, pk);
    if (*peeked) {
        deadline = job->lease.ctl.deadline_ns;
        api_lease_shorten(&job->lease, pk->peek.timeout_ms);
        if (job->lease.ctl.deadline_ns != deadline)
            job->own_timeout_ms = pk->peek.timeout_ms;
        if (api_v2_model_known(s->models, pk->model, pk->version[0] ? pk->version : NULL))
            job->slot = srv__metrics_model_slot(s->models, pk->model);
    }
    return job;
}

/* A job refused before it was admitted: its reply is the refusal, answered at once. */
static void job_refuse(grpc_job *job, srv_outcome o, const char *msg)
{
    job_fail(&job->job, o, msg);
    eng_buf_free(job->msg.data);
    job->msg.data = NULL;
    job_end(&job->job, SRV_JOB_ANSWERED);
}

/* The layer the inference runs, when batching is on (api_batch_key): the message's model and
 * its parameter "layer". */
static uint64_t batch_key(const srv_server *s, const grpc_job *job, const api_grpc_infer_peek *pk)
{
    api_call call = {.models = s->models, .model = pk->model};
    if (!s->batcher)
        return 0;
    return api_batch_key(job->stream ? API_BATCH_GRPC_STREAM : API_BATCH_GRPC_INFER, &call,
                         &pk->peek);
}

static void submit(grpc_call *call, grpc_msg *m)
{
    srv_server *s = call->conn->g->s;
    api_grpc_infer_peek pk;
    bool peeked = false;
    srv_job_refusal no;
    grpc_job *job = job_new(call, m, &pk, &peeked);
    if (!job) {
        srv__grpc_finish_as(call, SRV_REFUSE_NO_MEMORY, "out of memory");
        return;
    }
    call->job = job;
    if (!job->msg.data) {
        job_refuse(job, SRV_REFUSE_MEMORY_BUSY,
                   "memory budget (--max-memory-bytes) is full; retry later");
        return;
    }
    /* Never run on the gRPC thread: it writes every stream's frames. */
    srv_job_where where = {.route = SRV_JOB_ROUTE_GRPC,
                           .bytes = job->msg.len,
                           .level = srv__job_level(s, peeked ? pk.peek.priority : 0),
                           .may_run_here = false,
                           .batch_key = peeked ? batch_key(s, job, &pk) : 0};
    if (!srv__job_admit(&job->job, &where, eng_now_ns(), &no)) {
        job_refuse(job, no.outcome, no.msg);
        return;
    }
    if (job->slot >= 0) {
        job->pending = true;
        srv__metrics_model_pending(&s->metrics, job->slot, 1);
    }
    if (peeked && pk.peek.sequence_id) {
        srv_job_order order = {.model = pk.model,
                               .sequence_id = pk.peek.sequence_id,
                               .sequence_id_len = pk.peek.sequence_id_len};
        srv__job_take_turn(&job->job, &order);
    }
    srv__job_start(&job->job, job->job.submit_ns);
}

/* ---- Messages ----------------------------------------------------------------------------------
 */

static bool pop_msg(grpc_call *call, grpc_msg *out)
{
    grpc_msg *m = call->queue;
    if (!m)
        return false;
    call->queue = m->next;
    if (!call->queue)
        call->queue_tail = NULL;
    *out = *m;
    free(m);
    return true;
}

/* The next message of a stream, once the one before it is answered; OK after the last. */
static void stream_next(grpc_call *call)
{
    grpc_msg m;
    if (call->job || call->finished)
        return;
    if (pop_msg(call, &m))
        submit(call, &m);
    else if (call->half_closed)
        srv__grpc_finish_as(call, SRV_ANSWER_OK, NULL);
}

/* A unary call's one message: answered here, or submitted (ModelInfer). */
static void serve_unary(grpc_call *call, grpc_msg *m)
{
    srv_server *s = call->conn->g->s;
    api_reply reply;
    if (call->method == API_GRPC_MODEL_INFER) {
        submit(call, m);
        return;
    }
    if (call->method == API_GRPC_MODEL_STATISTICS) {
        statistics(call, m, &reply);
    } else {
        api_call c = {.body = m->data,
                      .body_len = m->len,
                      .models = s->models,
                      .limits = &s->limits,
                      .sessions = s->sessions};
        api_grpc_unary(call->method, !atomic_load(&s->draining), &c, &reply);
    }
    free_msg(call, m);
    answer(call, &reply);
}

static void queue_msg(grpc_call *call, char *data, size_t len, size_t held)
{
    grpc_msg *m = malloc(sizeof *m);
    if (!m) {
        eng_buf_free(data);
        api_lease_give_back(&call->lease, held);
        srv__grpc_finish_as(call, SRV_REFUSE_NO_MEMORY, "out of memory");
        return;
    }
    *m = (grpc_msg){.data = data, .len = len, .held = held};
    if (call->queue_tail)
        call->queue_tail->next = m;
    else
        call->queue = m;
    call->queue_tail = m;
}

/* Upload admission of an inference's message whose length prefix has just arrived, before any of
 * it is read (srv__job_admit_upload): at the most urgent level the message may name, by the
 * call's deadline, or for a stream's message by --request-timeout-ms from now (each of its
 * inferences has its own). False when refused: the call then ends with the refusal. */
static bool admit_message(grpc_call *call, int64_t now)
{
    srv_server *s = call->conn->g->s;
    int64_t deadline = call->lease.ctl.deadline_ns;
    srv_job_refusal no;
    char origin[64];
    if (call->method != API_GRPC_MODEL_INFER && !is_stream(call))
        return true;
    if (is_stream(call) && s->request_timeout_ns > 0 &&
        (deadline == 0 || now + s->request_timeout_ns < deadline))
        deadline = now + s->request_timeout_ns;
    call_deadline_origin(s, call, is_stream(call), origin, sizeof origin);
    srv_job_upload up = {.route = SRV_JOB_ROUTE_GRPC,
                         .bytes = call->reader.length,
                         .level = 1,
                         .left_ns = deadline > 0 ? deadline - now : INT64_MAX,
                         .deadline_origin = origin};
    if (srv__job_admit_upload(s, &call->upload, &up, now, &no))
        return true;
    srv__metrics_rejected(&s->metrics, srv__outcome(no.outcome)->reason);
    srv__grpc_finish_as(call, no.outcome, no.msg);
    return false;
}

void srv__grpc_call_data(grpc_call *call, const uint8_t *data, size_t len)
{
    srv_server *s = call->conn->g->s;
    call->bytes_in += len;
    while (len > 0 && !call->finished) {
        api_reply err;
        size_t used = 0, n = 0, held = 0;
        const bool reading = call->reader.prefix_len == PREFIX_BYTES;
        /* A prefix is read alone, so that its message is judged before any of it arrives. */
        const size_t offer = reading || len < PREFIX_BYTES - call->reader.prefix_len
                                 ? len
                                 : PREFIX_BYTES - call->reader.prefix_len;
        memset(&err, 0, sizeof err);
        if (call->reader.prefix_len == 0)
            call->recv_since_ns = eng_now_ns();
        api_grpc_read_result r =
            api_grpc_read(&call->reader, data, offer, s->max_body_bytes, &call->lease, &used, &err);
        data += used;
        len -= used;
        if (reading)
            srv__uploads_received(s->uploads, &call->upload, used, eng_now_ns());
        else if (r == API_GRPC_READ_MORE && call->reader.prefix_len == PREFIX_BYTES &&
                 !admit_message(call, eng_now_ns()))
            return;
        if (r == API_GRPC_READ_MESSAGE)
            srv__uploads_end(s->uploads, &call->upload, true, eng_now_ns());
        if (r == API_GRPC_READ_ERROR) {
            srv__uploads_end(s->uploads, &call->upload, false, eng_now_ns());
            api_grpc_reader_free(&call->reader, &call->lease);
            srv__metrics_rejected(&s->metrics, err.reason);
            answer(call, &err);
        } else if (r == API_GRPC_READ_MESSAGE) {
            char *msg = api_grpc_reader_take(&call->reader, &n, &held);
            if (++call->messages > 1 && !is_stream(call)) {
                eng_buf_free(msg);
                api_lease_give_back(&call->lease, held);
                srv__grpc_finish_as(call, SRV_REFUSE_FRAMING,
                                    "a unary method takes one request message");
                return;
            }
            queue_msg(call, msg, n, held);
            if (is_stream(call))
                stream_next(call);
        }
    }
}

void srv__grpc_call_end_stream(grpc_call *call)
{
    grpc_msg m;
    call->half_closed = true;
    if (call->finished)
        return;
    if (call->reader.prefix_len > 0) {
        srv__grpc_finish_as(call, SRV_REFUSE_FRAMING, "the stream ended inside a message");
    } else if (is_stream(call)) {
        stream_next(call);
    } else if (pop_msg(call, &m)) {
        serve_unary(call, &m);
    } else {
        srv__grpc_finish_as(call, SRV_REFUSE_FRAMING, "no request message");
    }
}

/* ---- Completion --------------------------------------------------------------------------------
 */

static void log_call(const grpc_call *call, int64_t now)
{
    api_buf b;
    if (!srv_log_enabled(SRV_LOG_INFO))
        return;
    api_buf_init(&b, 4096);
    srv__log_begin(&b, SRV_LOG_INFO);
    api_buf_cstr(&b, ",\"msg\":\"request\",\"protocol\":\"grpc\",\"request_id\":");
    api_buf_json_string(&b, call->id, strlen(call->id));
    api_buf_printf(&b, ",\"method\":\"POST\",\"route\":\"grpc %s\",\"path\":",
                   api_grpc_method_name(call->method));
    api_buf_json_string(&b, call->path, strlen(call->path));
    api_buf_printf(&b,
                   ",\"status\":%d,\"grpc_status\":%d,\"messages\":%zu,\"bytes_in\":%llu,"
                   "\"bytes_out\":%llu,\"queue_ms\":%.3f,\"decode_ms\":%.3f,\"compute_ms\":%.3f,"
                   "\"encode_ms\":%.3f,\"total_ms\":%.3f",
                   call->http_status, call->grpc_status, call->messages,
                   (unsigned long long)call->bytes_in, (unsigned long long)call->bytes_out,
                   (double)call->queue_ns / 1e6, (double)call->last.decode_ns / 1e6,
                   (double)call->last.compute_ns / 1e6, (double)call->last.encode_ns / 1e6,
                   (double)(now - call->lease.start_ns) / 1e6);
    if (call->reason != API_REASON_NONE)
        api_buf_printf(&b, ",\"reason\":\"%s\"", api_reason_str(call->reason));
    api_buf_cstr(&b, "}\n");
    if (b.state == API_BUF_OK)
        srv__log_write(b.data, b.len);
    api_buf_free(&b);
}

void srv__grpc_call_closed(grpc_call *call, uint32_t error_code)
{
    srv_server *s = call->conn->g->s;
    grpc_msg m;
    int64_t now = eng_now_ns();
    if (call->job) {
        call->job->call = NULL;
        srv__job_cancel(&call->job->job, SRV_REFUSE_CLIENT_GONE);
    }
    if (!call->finished || (error_code != NGHTTP2_NO_ERROR && call->out)) {
        call->http_status = srv__outcome_http(SRV_REFUSE_CLIENT_GONE, API_ERRORS_V2);
        call->reason = srv__outcome(SRV_REFUSE_CLIENT_GONE)->reason;
        call->grpc_status = API_GRPC_CANCELLED;
        srv__metrics_hangup(&s->metrics);
    }
    /* As HTTP's completion does: the scheduler counts a reply's writing against deadlines. */
    if (call->answered_ns > 0 && call->grpc_status == API_GRPC_OK && error_code == NGHTTP2_NO_ERROR)
        srv__sched_sent(s->sched, &call->answered, now - call->answered_ns);
    log_call(call, now);
    srv__metrics_grpc(&s->metrics, call->method, call->grpc_status, now - call->lease.start_ns,
                      call->bytes_in, call->bytes_out);
    while (pop_msg(call, &m))
        free_msg(call, &m);
    api_grpc_reader_free(&call->reader, &call->lease);
    srv__uploads_end(s->uploads, &call->upload, false, now);
    while (call->out) {
        grpc_chunk *c = call->out;
        call->out = c->next;
        srv__grpc_chunk_free(c);
    }
    api_lease_end(&call->lease);
    if (call->counted)
        atomic_fetch_sub(&s->active, 1);
    free(call);
}

static void job_answer(grpc_call *call, grpc_job *job)
{
    call->job = NULL;
    call->queue_ns = job->job.run_ns > 0 ? job->job.run_ns - job->job.submit_ns : 0;
    call->last = job->reply;
    call->last.body = NULL;
    if (!is_stream(call)) {
        if (job->job.run_ns > 0 && job->reply.status == 200) {
            call->answered = job->job.sched;
            call->answered_ns = job->job.done_ns;
        }
        answer(call, &job->reply);
        return;
    }
    if (job->reply.content_type && strcmp(job->reply.content_type, "application/grpc") == 0)
        send_message(call, &job->reply);
    else /* refused before it ran: the stream ends with its status */
        srv__grpc_finish(call, job->reply.status, job->reply.reason,
                         job->reply.body ? job->reply.body : "");
    api_reply_free(&job->reply);
    stream_next(call);
}

void srv__grpc_jobs_done(srv_grpc *g)
{
    srv_server *s = g->s;
    grpc_job *list, *rev = NULL;
    pthread_mutex_lock(&g->done_lock);
    list = g->done;
    g->done = NULL;
    pthread_mutex_unlock(&g->done_lock);
    while (list) { /* oldest first */
        grpc_job *next = list->next;
        list->next = rev;
        rev = list;
        list = next;
    }
    while (rev) {
        grpc_job *job = rev;
        rev = job->next;
        if (job->pending)
            srv__metrics_model_pending(&s->metrics, job->slot, -1);
        srv__metrics_infer(&s->metrics, job->slot, job->reply.status, job->reply.reason,
                           srv__job_handler_ns(&job->job),
                           job->job.run_ns > 0 ? job->job.run_ns - job->job.submit_ns : 0,
                           &job->reply);
        if (job->job.run_ns == 0) /* refused or expired: counted as HTTP's refusals are */
            srv__metrics_rejected(&s->metrics, job->reply.reason);
        if (job->call)
            job_answer(job->call, job);
        api_reply_free(&job->reply);
        api_lease_end(&job->lease);
        free(job);
    }
}

void srv__grpc_cancel_all(srv_grpc *g)
{
    for (grpc_conn *c = g->conns; c; c = c->next)
        for (grpc_call *call = c->calls; call; call = call->next)
            if (call->job)
                srv__job_cancel(&call->job->job, SRV_REFUSE_DRAINING);
}
