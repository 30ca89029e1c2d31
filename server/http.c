/*
 * http.c - libmicrohttpd's callbacks: routing, header checks, body accumulation, admission,
 * the handoff to an engine worker, replies, and the per-request log line and metrics.
 *
 * Everything here runs on the I/O thread of the request's connection (libmicrohttpd gives each
 * connection to one of --io-threads), except srv_watch_ops (the watcher); the requests of other
 * connections run the same code on other I/O threads at once, so that what they share is the
 * server's (atomic counters, or modules with their own locks: admission, uploads, watcher,
 * metrics, log, budget). Which paths exist, with which methods, and who answers them is the route
 * table (routes.c): the I/O threads answer only cheap things themselves (health, metrics,
 * listings, and refusals found from the headers or the body size); decoding and encoding a request
 * happen on a worker. Handlers and refusals make reply
 * values (reply.h); send_reply below is the one place that queues them with libmicrohttpd.
 *
 * A request (srv_req) and who owns it when: request.h. Admission ends here by starting the
 * request's job (job.h, the same for gRPC's inferences: http_job.c says how an HTTP request
 * runs), which waits with the scheduler (admission.h) and runs on a worker.
 */
#include "server/http.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "server/half_close.h"
#include "server/log.h"
#include "server/reply.h"
#include "server/request.h"

/* First allocation for a chunked body; doubled as it grows, up to --max-body-bytes. A body whose
 * Content-Length is known is allocated whole at its first byte instead (grow_body). */
#define BODY_FIRST_ALLOC ((size_t)64 * 1024)
/* How far ahead of a body's bytes its lease reserves (reserve_arriving): a Content-Length is a
 * promise, not bytes, and an allocation's pages are touched only as bytes are written to it. */
#define BODY_RESERVE_STEP ((size_t)256 * 1024)
/* Once a body is rejected it is read and discarded (so that the client sees the answer
 * instead of a reset), but only for up to this many times --max-body-bytes; past it the
 * connection is closed. The receive timeout bounds the time it may take. */
#define DRAIN_FACTOR 2

/* A refusal from the headers of a body longer than this is answered before the body is read
 * (refuse_admission); a shorter one costs less to read than the connection it would close. */
#define EARLY_ANSWER_BYTES ((size_t)64 * 1024)

/* How much of a long body is in when its own timeout and priority are first read from it
 * (early_admission): past the header block of any JSON a client writes by hand. */
#define EARLY_PEEK_BYTES ((size_t)16 * 1024)

/* Routes the request by its path (routes.c); a path too long to store matches nothing. */
static void route(srv_req *req)
{
    if (req->path_too_long) {
        memset(&req->params, 0, sizeof req->params);
        req->route = SRV_ROUTE_OTHER;
        return;
    }
    req->route = srv__route_find(req->path, &req->params);
}

static api_error_style error_style(const srv_req *req)
{
    return srv__route_style(req->route, req->path);
}

/* ---- Request life cycle ------------------------------------------------------------------- */

/* Arranges refusal `o` to be answered once the body is in (or at once, see
 * refuse_from_headers). */
static void set_refusal(srv_req *req, srv_outcome o, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void set_refusal(srv_req *req, srv_outcome o, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(req->refusal_msg, sizeof req->refusal_msg, fmt, ap);
    va_end(ap);
    req->refused = true;
    req->refusal = o;
    /* What still arrives of a refused body is discarded: it is no longer on its way. */
    srv__uploads_end(req->srv->uploads, &req->upload, false, eng_now_ns());
}

/* ---- What the watcher may do to a suspended request (watch.h) ----------------------------- */

static void watch_ref(void *arg)
{
    srv_req *req = arg;
    atomic_fetch_add(&req->refs, 1);
}

static void watch_unref(void *arg)
{
    srv__req_unref(arg);
}

static bool watch_queued(void *arg)
{
    srv_req *req = arg;
    return atomic_load(&req->job.state) == SRV_JOB_QUEUED;
}

static bool watch_abandon(void *arg, srv_watch_why why)
{
    srv_req *req = arg;
    char origin[64], msg[120];
    switch (why) {
    case SRV_WATCH_HANGUP:
        return srv__job_abandon(&req->job, SRV_REFUSE_CLIENT_GONE,
                                "the client closed the connection while the request was queued");
    case SRV_WATCH_DEADLINE:
        srv__req_deadline_origin(req, origin, sizeof origin);
        snprintf(msg, sizeof msg, "deadline exceeded while waiting for a worker (%s)", origin);
        return srv__job_abandon(&req->job, SRV_REFUSE_DEADLINE, msg);
    case SRV_WATCH_DRAIN:
        return srv__job_abandon(&req->job, SRV_REFUSE_DRAINING,
                                "the server is shutting down (--drain-timeout-s passed)");
    }
    return false;
}

static void watch_cancel(void *arg, srv_watch_why why)
{
    srv_req *req = arg;
    if (why == SRV_WATCH_HANGUP)
        atomic_store(&req->client_gone, true);
    srv__job_cancel(&req->job,
                    why == SRV_WATCH_DRAIN ? SRV_REFUSE_DRAINING : SRV_REFUSE_CLIENT_GONE);
}

static void watch_resume(void *arg)
{
    srv__req_resume(arg);
}

static const srv_watch_ops req_watch_ops = {
    .ref = watch_ref,
    .unref = watch_unref,
    .queued = watch_queued,
    .abandon = watch_abandon,
    .cancel = watch_cancel,
    .resume = watch_resume,
};

/* ---- Request ids ------------------------------------------------------------------------ */

/* An X-Request-Id we echo must be safe in a header and a JSON log line without escaping. */
static bool request_id_ok(const char *id)
{
    size_t n = 0;
    for (; id[n]; n++) {
        unsigned char c = (unsigned char)id[n];
        if (n >= REQUEST_ID_MAX)
            return false;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              strchr("-_.:/+=@", c)))
            return false;
    }
    return n > 0;
}

static void make_request_id(srv_server *s, char *out, size_t outlen)
{
    /* splitmix64 of a per-process random seed plus a counter: unique within the process and
     * unpredictable across restarts, without a lock or a syscall per request. */
    uint64_t x =
        s->id_seed + (uint64_t)atomic_fetch_add(&s->id_counter, 1) * UINT64_C(0x9E3779B97F4A7C15);
    x = (x ^ (x >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    x = (x ^ (x >> 27)) * UINT64_C(0x94D049BB133111EB);
    x ^= x >> 31;
    snprintf(out, outlen, "%016" PRIx64, x);
}

/* ---- Replies ------------------------------------------------------------------------------ */

static bool add_header(void *cls, const char *name, const char *value)
{
    MHD_add_response_header(cls, name, value);
    return true;
}

/* Queues `r` (its body taken over even on failure) as the response: the one place where a
 * reply meets libmicrohttpd. */
static enum MHD_Result send_reply(srv_req *req, srv_reply *r)
{
    struct MHD_Response *resp;
    enum MHD_Result rc;
    char num[24];
    uint64_t bytes_out = r->body ? r->len : 0;
    bool close = r->close;

    if (r->status == 0)
        return MHD_NO; /* no reply could be made: drop the connection */
    if (r->body)
        resp = MHD_create_response_from_buffer_with_free_callback(r->len, r->body, r->release);
    else
        resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!resp) {
        srv__reply_free(r);
        return MHD_NO;
    }
    r->body = NULL; /* libmicrohttpd frees it */
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
                            r->content_type ? r->content_type : "application/json");
    MHD_add_response_header(resp, "X-Request-Id", req->id);
    srv__reply_each_header(r, num, add_header, resp);
    /* Close when the body was not read (a keep-alive connection would parse it as the next
     * request) and while draining (so that clients reconnect to another replica). */
    if (r->refusal && req->body_expected && atomic_load(&req->job.state) == SRV_JOB_NEW &&
        !req->seen_body_end)
        close = true;
    if (close || atomic_load(&req->srv->draining))
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    rc = MHD_queue_response(req->conn, (unsigned)r->status, resp);
    MHD_destroy_response(resp);
    if (rc == MHD_YES && req->srv->send_timeout_s < req->srv->idle_timeout_s) {
        /* libmicrohttpd's timer measures idleness, and a client that stops reading is idle:
         * while its reply is written it gets --send-timeout-s, not --idle-timeout-s, so that a
         * non-reader pins the reply's memory that long at most. Completion restores it. */
        MHD_set_connection_option(req->conn, MHD_CONNECTION_OPTION_TIMEOUT,
                                  req->srv->send_timeout_s);
        req->send_timer = true;
    }
    req->status = r->status;
    req->reason = r->reason;
    req->bytes_out = bytes_out;
    req->responded = true;
    srv__conn_busy(req->srv->watch, &req->watch);
    return rc;
}

/* Answers refusal `o` now, closing the connection when `close`. */
static enum MHD_Result refuse(srv_req *req, srv_outcome o, bool close, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static enum MHD_Result refuse(srv_req *req, srv_outcome o, bool close, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    srv_reply r;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    r = srv__reply_refusal(error_style(req), o, "%s", msg);
    r.close = close;
    return send_reply(req, &r);
}

/* Answers the refusal set_refusal arranged. */
static enum MHD_Result refuse_pending(srv_req *req)
{
    srv_reply r = srv__reply_refusal(error_style(req), req->refusal, "%s", req->refusal_msg);
    if (req->refusal == SRV_REFUSE_UNAUTHORIZED)
        r.headers = srv__auth_challenge;
    if (req->refusal_retry_s > 0)
        r.retry_after_s = req->refusal_retry_s;
    return send_reply(req, &r);
}

/* Answers a request its job's admission refused (job.h). */
static enum MHD_Result refuse_job(srv_req *req, const srv_job_refusal *no)
{
    srv_reply r = srv__reply_refusal(error_style(req), no->outcome, "%s", no->msg);
    if (no->retry_s > 0)
        r.retry_after_s = no->retry_s;
    return send_reply(req, &r);
}

/* The reply a worker (or the watcher) prepared, after the connection was resumed. */
static enum MHD_Result send_computed(srv_req *req)
{
    srv_reply r;
    if (atomic_load(&req->client_gone)) {
        /* Nobody is listening: close instead of writing into a dead socket. */
        api_reply_free(&req->reply);
        req->reason = req->reply.reason;
        req->status = req->reply.status;
        req->responded = true;
        return MHD_NO;
    }
    r = srv__reply_computed(&req->reply);
    return send_reply(req, &r);
}

/* ---- Headers ------------------------------------------------------------------------------ */

/* The client sent "Expect: 100-continue": it waits for a go-ahead before sending its body. */
static bool expects_continue(const srv_req *req)
{
    return api_header_token_is(req->hdr.expect, "100-continue");
}

/* Checks the message framing before any body byte is read: libmicrohttpd 0.9.75 uses the first
 * of two Content-Length headers, lets chunked win over Content-Length, and reads a body with an
 * unknown transfer coding as raw bytes until the connection closes. Each is a way to make a
 * proxy and this server disagree on where a request ends (request smuggling), so each is an
 * error here. Returns MHD_YES with *answered false when the framing is sound. */
static enum MHD_Result check_framing(srv_server *s, srv_req *req, bool *answered)
{
    const srv_headers *h = &req->hdr;
    *answered = true;

    if (h->n_length > 1)
        return refuse(req, SRV_REFUSE_FRAMING, true, "more than one Content-Length header");
    if (h->n_transfer > 0 && h->n_length > 0)
        return refuse(req, SRV_REFUSE_FRAMING, true,
                      "both Transfer-Encoding and Content-Length are set");
    /* libmicrohttpd 0.9.75 frames a body as chunked only when the value is exactly "chunked"
     * (any case): with a trailing blank it reads the body until the connection closes and
     * swallows the requests behind it, so such a value is malformed here, as a Content-Length
     * with one is for libmicrohttpd. */
    if (h->n_transfer == 1 && api_header_token_is(h->transfer_encoding, "chunked") &&
        strcasecmp(h->transfer_encoding, "chunked") != 0)
        return refuse(req, SRV_REFUSE_FRAMING, true,
                      "malformed Transfer-Encoding \"%.64s\": blanks around \"chunked\"",
                      h->transfer_encoding);
    if (h->n_transfer > 1 ||
        (h->n_transfer == 1 && !api_header_token_is(h->transfer_encoding, "chunked")))
        return refuse(req, SRV_REFUSE_TRANSFER_CODING, true,
                      "unsupported Transfer-Encoding \"%.64s\": only chunked is accepted",
                      h->n_transfer == 1 ? h->transfer_encoding : "(several headers)");
    if (h->n_length == 1) {
        /* libmicrohttpd already rejected a value that is not a number. */
        char *end = NULL;
        unsigned long long n = strtoull(h->content_length, &end, 10);
        if (n > 0)
            req->body_expected = true;
        if (n > (unsigned long long)s->max_body_bytes) {
            /* Decided from the header, before a byte is read. A client waiting for "100
             * Continue" gets the answer now and never sends the body; so does one announcing
             * more than we would read. Any other client is already sending: libmicrohttpd
             * closes a connection answered mid-body, and the client would see a reset instead
             * of the 413, so its body is read and discarded first (as for chunked bodies). */
            if (expects_continue(req) || n / DRAIN_FACTOR > s->max_body_bytes)
                return refuse(req, SRV_REFUSE_TOO_LARGE, true,
                              "the body of %llu bytes is larger than --max-body-bytes (%zu)", n,
                              s->max_body_bytes);
            set_refusal(req, SRV_REFUSE_TOO_LARGE,
                        "the body of %llu bytes is larger than --max-body-bytes (%zu)", n,
                        s->max_body_bytes);
        } else {
            req->content_length = (size_t)n;
            req->has_length = true;
        }
    }
    if (h->n_transfer == 1)
        req->body_expected = true;
    /* gzip and deflate are undone on the worker (api_call_encoded); anything else now. */
    if (h->n_encoding > 1 ||
        (h->n_encoding == 1 && !api_content_encoding_known(h->content_encoding)))
        return refuse(req, SRV_REFUSE_MEDIA, false,
                      "unsupported Content-Encoding \"%.64s\": send gzip, deflate or identity",
                      h->n_encoding == 1 && h->content_encoding ? h->content_encoding
                                                                : "(several headers)");
    *answered = false;
    return MHD_YES;
}

/* Arranges a 413 for a body that needs more than the whole budget. */
static void set_never_fits(const srv_server *s, srv_req *req)
{
    set_refusal(req, SRV_REFUSE_MEMORY_NEVER,
                "the request body needs more memory than --max-memory-bytes (%zu) allows",
                s->max_memory_bytes);
}

/* Arranges a 429 for a body that does not fit in the budget while other requests hold it. */
static void set_budget_busy(srv_req *req)
{
    set_refusal(req, SRV_REFUSE_MEMORY_BUSY,
                "the memory budget (--max-memory-bytes) is in use by other requests; retry later");
}

/* Reserves `bytes` of the budget for the body; on failure arranges the refusal and returns
 * false. */
static bool reserve_body(srv_server *s, srv_req *req, size_t bytes)
{
    switch (api_lease_reserve(&req->lease, bytes)) {
    case API_BUDGET_OK:
        req->body_held += bytes;
        return true;
    case API_BUDGET_NEVER:
        set_never_fits(s, req);
        return false;
    case API_BUDGET_NOT_NOW:
        break;
    }
    set_budget_busy(req);
    return false;
}

/* Answers a refusal decided from the headers (set_refusal) as the client allows: one waiting
 * for "100 Continue" gets it now and never sends the body. Any other is already sending it,
 * and libmicrohttpd would close a connection answered mid-body, so that the client sees a
 * reset instead of the answer: its body is read and discarded (on_body_chunk) and the answer
 * waits for its end (on_body_complete). Nothing is reserved or allocated for it. */
static enum MHD_Result refuse_from_headers(srv_req *req)
{
    if (expects_continue(req))
        return refuse_pending(req);
    return MHD_YES;
}

/* Checks of the request line and header block that come before framing (request_check.c):
 * each is a way for a proxy and this server to read a different request. Every refusal
 * closes the connection, since what follows the headers cannot be trusted either. */
static enum MHD_Result check_request(srv_req *req, const char *version, bool *answered)
{
    const srv_headers *h = &req->hdr;

    *answered = true;
    if (req->bad_target)
        return refuse(req, SRV_REFUSE_FRAMING, true, "%s", req->bad_target);
    if (h->bad_name)
        return refuse(req, SRV_REFUSE_FRAMING, true,
                      "malformed header field \"%.64s\": whitespace before the colon, line "
                      "folding and other non-token characters are not accepted",
                      h->bad_name);
    if (h->n_host > 1 || (h->n_host == 0 && version && strcmp(version, "HTTP/1.1") == 0))
        return refuse(req, SRV_REFUSE_FRAMING, true,
                      "an HTTP/1.1 request needs exactly one Host header (it has %d)", h->n_host);
    if (h->n_infer_len > 1)
        return refuse(req, SRV_REFUSE_FRAMING, true,
                      "more than one Inference-Header-Content-Length header");
    *answered = false;
    return MHD_YES;
}

/* First call of the access handler: what every answer needs (id, method, path), then the
 * framing checks, which must come before any body byte is read. *answered tells whether a
 * response was queued. */
static enum MHD_Result on_first_call(srv_server *s, srv_req *req, const char *url,
                                     const char *method, const char *version, bool *answered)
{
    enum MHD_Result rc;
    req->framing_checked = true;
    req->watch.may_probe = version && strcmp(version, MHD_HTTP_VERSION_1_1) == 0;
    snprintf(req->method, sizeof req->method, "%s", method ? method : "");
    srv__headers_read(req->conn, &req->hdr);
    if (req->hdr.request_id && request_id_ok(req->hdr.request_id))
        snprintf(req->id, sizeof req->id, "%s", req->hdr.request_id);
    else
        make_request_id(s, req->id, sizeof req->id);
    if (url)
        url = srv__origin_path(url);
    if (url && strcmp(url, req->path) != 0) {
        size_t n = strlen(url);
        req->path_too_long = n >= sizeof req->path;
        if (req->path_too_long)
            n = sizeof req->path - 1;
        memcpy(req->path, url, n);
        req->path[n] = '\0';
    }
    route(req);
    srv__conn_headers_done(s->watch, &req->watch);
    rc = check_request(req, version, answered);
    if (*answered)
        return rc;
    return check_framing(s, req, answered);
}

/* Copies header value `v` (NULL: absent) into dst; false when it is too long to keep. */
static bool keep_header(const char *v, char *dst, size_t size)
{
    dst[0] = '\0';
    if (!v)
        return true;
    if (strlen(v) >= size)
        return false;
    memcpy(dst, v, strlen(v) + 1);
    return true;
}

/* For a worker route, before the body is read: copies the headers api/ needs for the worker
 * (answering 415 or 400 for values too long to keep) and starts the route's statistics.
 * Returns MHD_YES with *answered false when the request goes on. */
static enum MHD_Result capture_headers(srv_server *s, srv_req *req, const srv_route_def *rd,
                                       bool *answered)
{
    *answered = true;
    if (!keep_header(req->hdr.content_type, req->content_type, sizeof req->content_type))
        return refuse(req, SRV_REFUSE_MEDIA, false, "the Content-Type header is too long");
    req->has_content_type = req->hdr.content_type != NULL;
    if (!keep_header(req->hdr.content_encoding, req->content_encoding,
                     sizeof req->content_encoding))
        return refuse(req, SRV_REFUSE_MEDIA, false,
                      "unsupported Content-Encoding: send gzip, deflate or identity");
    if (!keep_header(req->hdr.infer_header_len, req->infer_header_len,
                     sizeof req->infer_header_len))
        return refuse(req, SRV_REFUSE_BAD_HEADER, false,
                      "Inference-Header-Content-Length is not a byte count");
    /* An Accept-Encoding too long to keep is as good as none: the reply goes uncompressed. */
    if (!keep_header(req->hdr.accept_encoding, req->accept_encoding, sizeof req->accept_encoding))
        req->accept_encoding[0] = '\0';
    if (rd->stats)
        rd->stats->begin(s->models, &req->params, &req->stats);
    *answered = false;
    return MHD_YES;
}

static const char *query_arg(const void *cls, const char *name)
{
    const srv_req *req = cls;
    return MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, name);
}

/* A request to a route (GET, or one without a worker) answered on this thread. */
static enum MHD_Result answer(srv_server *s, srv_req *req, const srv_route_def *rd)
{
    srv_answer_args args = {.params = &req->params,
                            .style = rd->style,
                            .if_none_match = req->hdr.if_none_match,
                            .method = req->method,
                            .query = query_arg,
                            .query_cls = req};
    srv_reply r;
    if (!rd->answer) /* defensive: a row without a handler for this method */
        return refuse(req, SRV_REFUSE_NO_HANDLER, false, "no handler for %.32s %s", req->method,
                      rd->pattern);
    r = rd->answer(s, &args);
    return send_reply(req, &r);
}

/* Answers a refusal decided while the body arrives at once, written to the socket (plain HTTP
 * only: libmicrohttpd 0.9.75 sends no response before the body's end). A client that reads
 * while it sends (libcurl) stops sending and closes; one that does not gets the answer after
 * its last byte, which is read and discarded (the access handler) before the connection
 * closes, so that it never sees a reset. */
static void answer_mid_body(srv_server *s, srv_req *req)
{
    if (s->tls)
        return; /* answered at the body's end (refuse_pending) */
    srv__req_fail(req, req->refusal, "%s", req->refusal_msg);
    req->reply.retry_after_s =
        req->refusal_retry_s > 0 ? req->refusal_retry_s : srv__outcome(req->refusal)->retry_after_s;
    srv__req_send_direct(req);
    req->answered_mid_body = true;
}

/* Answers an admission refusal decided from the headers (set_refusal). The body of a request
 * that announced more than EARLY_ANSWER_BYTES is not read: a client waiting for "100 Continue" is
 * answered and never sends it; on plain HTTP any other gets its answer written at once
 * (answer_mid_body), while what it still sends is discarded, and stops sending if it reads while
 * it sends (libcurl does). Otherwise it waits for the body, as refuse_from_headers says. */
static enum MHD_Result refuse_admission(srv_server *s, srv_req *req)
{
    if (expects_continue(req) || !req->has_length || req->content_length <= EARLY_ANSWER_BYTES)
        return refuse_from_headers(req);
    answer_mid_body(s, req);
    return MHD_YES;
}

/* The most urgent level a request may turn out to have, from its headers: a v2 inference may
 * name its own in its body; any other route runs at the default level. */
static uint32_t level_from_headers(const srv_server *s, const srv_route_def *rd)
{
    return rd && (rd->flags & SRV_ROUTE_SEQUENCE) ? 1 : s->limits.default_priority_level;
}

/* The body of `req` as upload admission judges it (job.h), `left_ns` before its deadline, which
 * `origin` names. */
static srv_job_upload upload_of(const srv_req *req, uint32_t level, int64_t left_ns,
                                const char *origin)
{
    return (srv_job_upload){.route = req->route,
                            .bytes = req->content_length,
                            .level = level,
                            .left_ns = left_ns,
                            .deadline_origin = origin};
}

static void set_upload_refusal(srv_req *req, const srv_job_refusal *no)
{
    set_refusal(req, no->outcome, "%s", no->msg);
    req->refusal_retry_s = no->retry_s;
}

/* Admission of a body of known length from its headers (srv__job_admit_upload), by its deadline
 * from its request line (--request-timeout-ms: its own timeout is in its body). Then it counts
 * from its first byte to its last; refused, it is answered at once (refuse_admission). */
static enum MHD_Result admit_upload(srv_server *s, srv_req *req)
{
    const int64_t now = eng_now_ns(), deadline = req->lease.ctl.deadline_ns;
    char origin[64];
    srv_job_refusal no;
    srv__req_deadline_origin(req, origin, sizeof origin);
    srv_job_upload up = upload_of(req, level_from_headers(s, srv__route_def(req->route)),
                                  deadline > 0 ? deadline - now : INT64_MAX, origin);
    if (srv__job_admit_upload(s, &req->upload, &up, now, &no))
        return MHD_YES;
    set_upload_refusal(req, &no);
    return refuse_admission(s, req);
}

/* Admission refusals that can be decided from the headers: draining, a full queue, a body that
 * cannot fit in the budget, and for a body of known length admit_upload's. */
static enum MHD_Result admit_from_headers(srv_server *s, srv_req *req)
{
    srv_job_refusal no;
    if (atomic_load(&s->draining)) {
        if (!req->body_expected)
            return refuse(req, SRV_REFUSE_DRAINING, true, SRV_DRAINING_MSG);
        set_refusal(req, SRV_REFUSE_DRAINING, SRV_DRAINING_MSG);
        return refuse_admission(s, req);
    }
    if (!srv__job_room(s, &no)) {
        if (!req->body_expected)
            return refuse_job(req, &no);
        set_refusal(req, no.outcome, "%s", no.msg);
        return refuse_admission(s, req);
    }
    if (!req->has_length || req->content_length == 0)
        return MHD_YES;
    /* Nothing is reserved for the announced length: a Content-Length is a promise, not bytes,
     * and reserving it up front let sixteen clients that announce 256 MiB and send nothing
     * hold the whole budget. The reservation grows with the bytes that arrive (on_body_chunk);
     * a body that could never fit, or that does not fit in what is free right now, is
     * refused from the header (checking holds nothing). */
    size_t total = api_budget_total(s->budget), used = api_budget_in_use(s->budget);
    if (req->content_length >= total) {
        set_never_fits(s, req);
        return refuse_admission(s, req);
    }
    if (req->content_length >= total - used) { /* used <= total: reserve checks it */
        set_budget_busy(req);
        return refuse_admission(s, req);
    }
    return admit_upload(s, req);
}

/* Routing and the checks that can be decided from the headers. Runs before the body is read
 * when one is expected; for a request without a body it runs on the handler's second call,
 * because libmicrohttpd 0.9.75 closes a connection whose response was queued before it knew
 * the request was complete, and health checks and scrapes should keep theirs. */
static enum MHD_Result on_headers(srv_server *s, srv_req *req)
{
    const srv_route_def *rd = srv__route_def(req->route);
    bool answered = false;
    enum MHD_Result rc;

    req->seen_headers = true;
    if (req->admin && !(rd && (rd->flags & SRV_ROUTE_ADMIN)))
        return refuse(req, SRV_REFUSE_NOT_FOUND, req->body_expected,
                      "--admin-port serves only /v2/health/live, /v2/health/ready and "
                      "/metrics; %.100s is on --port",
                      req->path);
    /* Before anything that tells routes apart; the admin port (probes, /metrics) needs no
     * token. */
    if (!req->admin && !(rd && (rd->flags & SRV_ROUTE_OPEN)) &&
        !srv__auth_allows(s->auth, req->hdr.authorization)) {
        set_refusal(req, SRV_REFUSE_UNAUTHORIZED, "%s",
                    srv__auth_refusal(req->hdr.authorization != NULL));
        return req->body_expected ? refuse_from_headers(req) : refuse_pending(req);
    }
    if (!rd)
        return refuse(req, SRV_REFUSE_NOT_FOUND, false, "no route %.100s %.100s", req->method,
                      req->path);
    if (!srv__route_allows(rd, req->method)) {
        srv_reply r = srv__reply_refusal(error_style(req), SRV_REFUSE_METHOD,
                                         "method %.32s is not allowed on %s (allowed: %s)",
                                         req->method, rd->pattern, rd->allow);
        r.allow = rd->allow;
        return send_reply(req, &r);
    }
    if (req->params.bad[0])
        return refuse(req, SRV_REFUSE_BAD_PARAM, false,
                      "the {%s} part of the path must be 1 to %d characters from [A-Za-z0-9_.-]",
                      req->params.bad, SRV_PARAM_MAX);
    if (!rd->work || strcmp(req->method, "GET") == 0 || strcmp(req->method, "HEAD") == 0)
        return answer(s, req, rd);
    if (req->refused) /* refused from the headers: discard the body, then answer */
        return MHD_YES;
    rc = capture_headers(s, req, rd, &answered);
    if (answered)
        return rc;
    return admit_from_headers(s, req);
}

/* ---- Body --------------------------------------------------------------------------------- */

/* A long body that is still arriving is judged at each chunk: once its deadline (its lease's:
 * --request-timeout-ms from the request line) has passed, 504; as soon as its own timeout can be
 * read from its start, that shortens the lease, and a request whose rest would arrive, or that
 * would wait and run, past it gets 429 (judged as admit_upload judges from the headers).
 * Refused, its buffer is freed, the answer sent at once and the rest of its body discarded as it
 * arrives. Judged only at its end, every refused body is first copied into fresh memory on the I/O
 * thread, and past capacity that copy starves the uploads of the requests that could still finish;
 * a 504 then came up to a third past the deadline it names. The start is read up to its last comma,
 * so that no number in it is cut short. */
static void early_admission(srv_server *s, srv_req *req)
{
    const srv_route_def *rd = srv__route_def(req->route);
    srv_upload_outlook look;
    srv_job_refusal no;
    api_peek peek;
    char origin[64];
    int64_t now, deadline = req->lease.ctl.deadline_ns;

    if (req->refused || !req->has_length || req->body.len >= req->content_length)
        return;
    if (deadline > 0 && eng_now_ns() >= deadline) {
        srv__req_deadline_origin(req, origin, sizeof origin);
        set_refusal(req, SRV_REFUSE_DEADLINE, "deadline exceeded while receiving the request (%s)",
                    origin);
        srv__req_release_body(req);
        answer_mid_body(s, req);
        return;
    }
    if (req->early_peeked || req->body.len < EARLY_PEEK_BYTES || !rd || !rd->peek ||
        req->content_encoding[0])
        return;
    req->early_peeked = true;
    const char *comma = memrchr(req->body.data, ',', req->body.len);
    if (!comma)
        return;
    api_call call = {.body = req->body.data, .body_len = (size_t)(comma - req->body.data)};
    srv__req_call_headers(req, &call);
    rd->peek(&call, &peek);
    if (peek.timeout_ms > 0 && peek.timeout_ms < s->limits.max_timeout_ms) {
        uint32_t level = srv__job_level(s, peek.priority);
        req->own_timeout_ms = peek.timeout_ms;
        api_lease_shorten(&req->lease, req->own_timeout_ms);
        deadline = req->lease.ctl.deadline_ns;
        now = eng_now_ns();
        if (now < deadline) {
            srv__uploads_look(s->uploads, &req->upload, now, &look);
            srv__req_deadline_origin(req, origin, sizeof origin);
            srv_job_upload up = upload_of(req, level, deadline - now, origin);
            if (!srv__job_upload_in_time(s, &up, &look, now, &no)) {
                set_upload_refusal(req, &no);
                srv__req_release_body(req);
                answer_mid_body(s, req);
            }
        }
    }
    api_peek_free(&peek);
}

/* Makes room for `n` more bytes of the body and its NUL; false, with the refusal arranged, when
 * memory runs out. A body whose Content-Length is known gets all of it at its first byte (not
 * from its headers, where a client that announces a body and sends none would hold the
 * allocation): libmicrohttpd's reads are then copied once, where a worker decodes them, with no
 * growth that copies them again. A chunked body doubles its buffer, up to --max-body-bytes. */
static bool grow_body(srv_server *s, srv_req *req, size_t n)
{
    size_t need = req->body.len + n + 1;
    size_t limit = req->has_length ? req->content_length + 1 : s->max_body_bytes + 1;
    size_t cap = req->body.cap > 0 ? req->body.cap : req->has_length ? limit : BODY_FIRST_ALLOC;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    if (cap > limit)
        cap = limit;
    if (api_buf_grow_to(&req->body, cap))
        return true;
    set_refusal(req, SRV_REFUSE_NO_MEMORY, "out of memory while receiving the body");
    return false;
}

/* Makes the lease hold what the body takes once `n` more bytes are in: those written and their
 * NUL plus BODY_RESERVE_STEP, never more than the allocation. False, with the refusal arranged,
 * when the budget cannot hold them. */
static bool reserve_arriving(srv_server *s, srv_req *req, size_t n)
{
    size_t want = req->body.len + n + 1; /* <= body.cap: the caller made room */
    if (want <= req->body_held)
        return true;
    want = req->body.cap - want > BODY_RESERVE_STEP ? want + BODY_RESERVE_STEP : req->body.cap;
    return reserve_body(s, req, want - req->body_held);
}

static enum MHD_Result on_body_chunk(srv_server *s, srv_req *req, const char *data, size_t n)
{
    req->bytes_in += n;
    srv__conn_received(&req->watch, n); /* the watcher's --min-upload-rate check reads it */
    srv__uploads_received(s->uploads, &req->upload, n, eng_now_ns());
    if (atomic_load(&s->drain_expired)) {
        /* The drain is over and this body is still arriving: answer now, or the client would
         * only see the connection torn down when the daemon stops. A response queued
         * mid-body is never sent by libmicrohttpd 0.9.75 (it closes the connection instead),
         * so the small 503 is written to the socket here, where nothing else is in flight,
         * and MHD_NO closes the connection. */
        srv__req_release_body(req);
        srv__req_fail(req, SRV_REFUSE_DRAINING,
                      "the server is shutting down (--drain-timeout-s passed) while the body was "
                      "arriving; retry on another replica");
        srv__req_send_direct(req);
        return MHD_NO;
    }
    if (req->refused) {
        if (req->bytes_in / DRAIN_FACTOR > s->max_body_bytes)
            return MHD_NO; /* enough draining: close */
        return MHD_YES;
    }
    if (n > s->max_body_bytes - req->body.len) {
        set_refusal(req, SRV_REFUSE_TOO_LARGE, "the body is larger than --max-body-bytes (%zu)",
                    s->max_body_bytes);
        srv__req_release_body(req);
        return MHD_YES;
    }
    int64_t copy_from = eng_now_ns(); /* the body's copy into one buffer: a stage of its own */
    if ((n >= req->body.cap - req->body.len && !grow_body(s, req, n)) ||
        !reserve_arriving(s, req, n)) {
        srv__req_release_body(req);
        return MHD_YES;
    }
    api_buf_mem(&req->body, data, n);
    req->job.copy_ns += eng_now_ns() - copy_from;
    early_admission(s, req);
    return MHD_YES;
}

/* The deadline of a request about to be queued: its lease's (--request-timeout-ms from the
 * arrival), shortened to the body's own timeout when that is tighter (then kept in
 * req->own_timeout_ms). A worker reads the body's timeout only once it reaches the request;
 * read here (cheaply: api/wire/timeout_peek.c), it holds while the request waits behind
 * others, and the watcher answers 504 on time. The same walk gives the request's priority
 * (req->priority): a v2 "priority" of 1 to --priority-levels, else --default-priority-level (0,
 * absent, or one the route will refuse with 400 once a worker reads it).
 *
 * Only a request that will wait needs them now. With nothing admitted and no other request being
 * admitted (`alone`: see admit_body) the request starts at once, its route applies
 * the timeout, and the I/O thread does not scan a long body for nothing (a scan of tens of
 * megabytes holds every other connection); it then runs at the default priority, which
 * orders only the sub-jobs it fans out against requests that arrive while it runs. A v2 inference
 * is read whenever sessions are on, since a step of a sequence needs its place in the sequence's
 * order (on_body_complete) even when nothing is admitted: the next step may arrive while it runs;
 * so is a route whose body may name a session (SRV_ROUTE_BODY_SESSION, POST /v1/mha). Only for
 * those is a compressed body inflated here (up to API_PEEK_INFLATE_MAX; one larger is marked
 * req->body_unread, and its route refuses it if it is a step); for a timeout alone it is not
 * worth the I/O thread's time. *peek gets what the body said (its sequence_id points into
 * req->body or peek->inflated; api_peek_free releases it). */
static int64_t request_deadline(const srv_server *s, srv_req *req, bool alone, api_peek *peek)
{
    const srv_route_def *rd = srv__route_def(req->route);
    api_call call = {.body = req->body.data, .body_len = req->body.len, .lease = &req->lease};
    const bool orders =
        rd && (rd->flags & (SRV_ROUTE_SEQUENCE | SRV_ROUTE_BODY_SESSION)) && s->sessions;
    int64_t ms;

    memset(peek, 0, sizeof *peek);
    if (rd && rd->peek && (orders || (!alone && !req->content_encoding[0]))) {
        srv__req_call_headers(req, &call);
        rd->peek(&call, peek);
        req->body_unread = orders && peek->unread;
    }
    ms = peek->timeout_ms;
    req->priority = srv__job_level(s, peek->priority);
    if (ms > 0 && ms < s->limits.max_timeout_ms) /* else what the body's start said, if read */
        req->own_timeout_ms = ms;
    api_lease_shorten(&req->lease, req->own_timeout_ms);
    return req->lease.ctl.deadline_ns;
}

/* The layer a request of a batching route runs (api_batch_key), when batching is on: from the
 * path's model (v2) or what the peek read (/v1/mha); 0 otherwise. */
static uint64_t batch_key(const srv_server *s, const srv_req *req, const api_peek *peek)
{
    const srv_route_def *rd = srv__route_def(req->route);
    if (!s->batcher || !rd || rd->batch == API_BATCH_NONE)
        return 0;
    api_call call = {
        .models = s->models, .sessions = s->sessions, .model = srv__param(&req->params, "model")};
    return api_batch_key(rd->batch, &call, peek);
}

/* The body is in: answer a refusal decided while it arrived, or admit the request (its deadline,
 * priority and place in a session's or sequence's order read from the body into *peek) and queue
 * it. Requests are admitted on every I/O thread (and gRPC's) at once: s->admitting counts those
 * between this decision and their admission, so that a request skips the peek (`alone`) only
 * when nothing else was admitted or about to be when it looked. */
static enum MHD_Result admit_body(srv_server *s, srv_req *req, api_peek *peek)
{
    const srv_route_def *rd = srv__route_def(req->route);
    srv_job_refusal no;
    int64_t now, deadline;
    bool admitted, alone;

    req->seen_body_end = true;
    srv__conn_busy(s->watch, &req->watch);
    srv__uploads_end(s->uploads, &req->upload, true, eng_now_ns());
    if (req->refused)
        return refuse_pending(req);
    alone = atomic_fetch_add(&s->admitting, 1) == 0 && atomic_load(&s->admitted) == 0;
    deadline = request_deadline(s, req, alone, peek);
    now = eng_now_ns(); /* after the peek, which the queue time should not include */
    srv_job_where where = {.route = req->route,
                           .bytes = req->body.len,
                           .level = req->priority,
                           .may_run_here = true,
                           .batch_key = batch_key(s, req, peek)};
    admitted = srv__job_admit(&req->job, &where, now, &no);
    atomic_fetch_sub(&s->admitting, 1); /* after the admission counts it in s->admitted */
    if (!admitted)
        return refuse_job(req, &no);

    atomic_store(&req->lease.ctl.cancel, false);
    req->watch.deadline_ns = deadline; /* the watcher's copy, read while the request waits */
    if (rd->stats)
        rd->stats->admitted(&s->metrics, &req->stats);
    atomic_fetch_add(&req->refs, 1); /* the job's reference */
    atomic_fetch_add(&s->suspended, 1);
    srv__req_take_turn(req, peek);
    api_peek_free(peek); /* now: once queued, the request's lease is its worker's */
    MHD_suspend_connection(req->conn);
    srv__watch_add(s->watch, &req->watch);
    srv__job_start(&req->job, now);
    return MHD_YES;
}

static enum MHD_Result on_body_complete(srv_server *s, srv_req *req)
{
    api_peek peek = {0};
    enum MHD_Result rc = admit_body(s, req, &peek);
    api_peek_free(&peek); /* a request refused before it was queued */
    return rc;
}

/* ---- libmicrohttpd callbacks --------------------------------------------------------------- */

/* The URI callback of both listeners: a request line arrived on `conn`. */
static void *request_begin(srv_server *s, const char *uri, struct MHD_Connection *conn, bool admin)
{
    srv_req *req = calloc(1, sizeof *req);
    const union MHD_ConnectionInfo *ci;
    size_t n;

    if (!req)
        return NULL;
    atomic_init(&req->refs, 1);
    srv__job_init(&req->job, s, &srv__http_job_ops, req, &req->lease, &req->reply);
    atomic_init(&req->client_gone, false);
    atomic_init(&req->stats.pending, false);
    req->stats.slot = -1; /* counted nowhere until the route's hooks say otherwise */
    req->srv = s;
    req->conn = conn;
    req->watch.ops = &req_watch_ops;
    req->watch.req = req;
    api_lease_start(&req->lease, s->budget, eng_now_ns(), s->limits.max_timeout_ms);
    api_buf_init(&req->body, s->max_body_bytes + 1); /* + its NUL (on_body_chunk) */
    /* The path for logs and routing; the access handler replaces it with the decoded one. */
    req->bad_target = srv__target_check(uri);
    if (uri)
        uri = srv__origin_path(uri);
    n = uri ? strcspn(uri, "?") : 0;
    req->path_too_long = n >= sizeof req->path;
    if (req->path_too_long)
        n = sizeof req->path - 1;
    if (n > 0)
        memcpy(req->path, uri, n);
    req->path[n] = '\0';
    route(req);

    req->admin = admin;
    ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    srv__conn_begin(s->watch, ci ? ci->socket_context : NULL, &req->watch, req->lease.start_ns);
    atomic_fetch_add(&s->active, 1);
    return req;
}

void *srv__mhd_uri(void *cls, const char *uri, struct MHD_Connection *conn)
{
    return request_begin(cls, uri, conn, false);
}

void *srv__mhd_uri_admin(void *cls, const char *uri, struct MHD_Connection *conn)
{
    return request_begin(cls, uri, conn, true);
}

enum MHD_Result srv__mhd_access(void *cls, struct MHD_Connection *conn, const char *url,
                                const char *method, const char *version, const char *upload_data,
                                size_t *upload_data_size, void **con_cls)
{
    srv_server *s = cls;
    srv_req *req = *con_cls;
    (void)conn;

    if (!req)
        return MHD_NO; /* the URI callback ran out of memory: drop the connection */
    if (!req->framing_checked) {
        bool answered = false;
        enum MHD_Result rc = on_first_call(s, req, url, method, version, &answered);
        if (answered || !req->body_expected)
            return rc; /* no body: route on the next call, when the request is complete */
        return on_headers(s, req);
    }
    if (!req->seen_headers) {
        enum MHD_Result rc = on_headers(s, req);
        if (rc == MHD_NO || req->responded)
            return rc;
        /* A POST without a body: it is complete already. */
    }
    if (req->answered_mid_body && *upload_data_size > 0) {
        req->bytes_in += *upload_data_size; /* discarded: the close waits for its end */
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (req->sent_directly)
        return MHD_NO; /* the reply was written (half_close.c): only the close is left */
    if (req->responded) {
        /* Answered early; whatever body libmicrohttpd still hands over is discarded. */
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (atomic_load(&req->job.state) == SRV_JOB_NEW) {
        if (*upload_data_size > 0) {
            enum MHD_Result rc = on_body_chunk(s, req, upload_data, *upload_data_size);
            *upload_data_size = 0;
            return rc;
        }
        return on_body_complete(s, req);
    }
    if (atomic_load(&req->job.state) == SRV_JOB_FINISHED)
        return send_computed(req);
    return MHD_YES; /* defensive: called while the request is with a worker */
}

static double ms(int64_t ns)
{
    return ns > 0 ? (double)ns / 1e6 : 0.0;
}

/* The request's first byte to its last (its admission), 0 when it was answered before. */
static int64_t receive_ns(const srv_req *req)
{
    return req->job.submit_ns > 0 ? req->job.submit_ns - req->lease.start_ns : 0;
}

/* The reply's handoff to the connection until libmicrohttpd has written it all, at `now`. */
static int64_t send_ns(const srv_req *req, int64_t now)
{
    return req->job.done_ns > 0 ? now - req->job.done_ns : 0;
}

static void log_request(const srv_req *req, int status, api_reason reason, int64_t now,
                        int64_t queue_ns)
{
    api_buf b;
    if (!srv_log_enabled(SRV_LOG_INFO))
        return;
    api_buf_init(&b, 8192);
    srv__log_begin(&b, SRV_LOG_INFO);
    api_buf_cstr(&b, ",\"msg\":\"request\",\"request_id\":");
    api_buf_json_string(&b, req->id, strlen(req->id));
    api_buf_cstr(&b, ",\"method\":");
    api_buf_json_string(&b, req->method, strlen(req->method));
    api_buf_printf(&b, ",\"route\":\"%s\",\"path\":", srv__route_names.label(req->route));
    api_buf_json_string(&b, req->path, strlen(req->path));
    api_buf_printf(&b,
                   ",\"status\":%d,\"bytes_in\":%llu,\"bytes_out\":%llu,\"receive_ms\":%.3f,"
                   "\"queue_ms\":%.3f,\"decode_ms\":%.3f,\"compute_ms\":%.3f,"
                   "\"encode_ms\":%.3f,\"send_ms\":%.3f,\"total_ms\":%.3f",
                   status, (unsigned long long)req->bytes_in, (unsigned long long)req->bytes_out,
                   ms(receive_ns(req)), ms(queue_ns), ms(req->reply.decode_ns),
                   ms(req->reply.compute_ns), ms(req->reply.encode_ns), ms(send_ns(req, now)),
                   ms(now - req->lease.start_ns));
    if (reason != API_REASON_NONE)
        api_buf_printf(&b, ",\"reason\":\"%s\"", api_reason_str(reason));
    /* The session a request concerns: the one it stepped, its {id}, or the one it created
     * (Location). */
    const char *session =
        req->reply.session[0]                                    ? req->reply.session
        : strncmp(req->path, "/v1/sessions/", 13) == 0           ? srv__param(&req->params, "id")
        : strncmp(req->reply.location, "/v1/sessions/", 13) == 0 ? req->reply.location + 13
                                                                 : NULL;
    if (session) {
        api_buf_cstr(&b, ",\"session\":");
        api_buf_json_string(&b, session, strlen(session));
    }
    if (req->cut_status > 0)
        api_buf_printf(&b, ",\"reply_cut_off\":true,\"reply_status\":%d", req->cut_status);
    api_buf_cstr(&b, "}\n");
    if (b.state == API_BUF_OK)
        srv__log_write(b.data, b.len);
    api_buf_free(&b);
}

/* Whether a completed request was not answered as queued (its client went away, or its
 * connection was cut or never got as far as a reply), and then *o, the outcome it is logged and
 * counted with. */
static bool unanswered_outcome(srv_req *req, bool slow, enum MHD_RequestTerminationCode toe,
                               srv_outcome *o)
{
    if (atomic_load(&req->client_gone)) {
        *o = SRV_REFUSE_CLIENT_GONE; /* the reply was never delivered */
        return true;
    }
    if (req->responded && !req->sent_directly && toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) {
        /* The reply was queued but not all of it was sent: the client stopped reading (cut at
         * --idle-timeout-s) or went away mid-download. Not a success, and its bytes did not
         * all go out. */
        req->cut_status = req->status;
        req->bytes_out = 0;
        *o = SRV_REFUSE_CLIENT_GONE;
        return true;
    }
    if (req->responded)
        return false;
    if (slow)
        *o = SRV_REFUSE_SLOW_CLIENT;
    else if (!req->framing_checked && toe == MHD_REQUEST_TERMINATED_WITH_ERROR)
        *o = SRV_REFUSE_MHD_PARSE;
    else
        *o = SRV_REFUSE_CLIENT_GONE;
    return true;
}

void srv__mhd_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                        enum MHD_RequestTerminationCode toe)
{
    srv_server *s = cls;
    srv_req *req = *con_cls;
    int64_t now = eng_now_ns(), queue_ns = 0;
    srv_outcome unanswered;
    const srv_route_def *rd;
    int status;
    api_reason reason;

    if (!req)
        return;
    *con_cls = NULL;
    /* Safe here: libmicrohttpd takes a connection off its timeout list only later, in
     * cleanup_connection, by the timeout it has then. */
    if (req->send_timer)
        MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT, s->idle_timeout_s);
    if (!req->id[0])
        make_request_id(s, req->id, sizeof req->id); /* libmicrohttpd answered it itself */
    status = req->status;
    reason = req->reason;
    if (unanswered_outcome(req, srv__conn_end(s->watch, &req->watch, now), toe, &unanswered)) {
        status = srv__outcome_http(unanswered, error_style(req));
        reason = srv__outcome(unanswered)->reason;
    }

    if (req->job.submit_ns > 0) {
        queue_ns = (req->job.run_ns > 0 ? req->job.run_ns : req->job.done_ns) - req->job.submit_ns;
        srv__metrics_stage(&s->metrics, SRV_STAGE_RECEIVE, receive_ns(req));
        srv__metrics_stage(&s->metrics, SRV_STAGE_QUEUE, queue_ns);
        if (req->job.run_ns > 0 && status == 200)
            srv__sched_sent(s->sched, &req->job.sched, now - req->job.done_ns);
        if (req->job.run_ns > 0) {
            srv__metrics_stage(&s->metrics, SRV_STAGE_DECODE, req->reply.decode_ns);
            srv__metrics_stage(&s->metrics, SRV_STAGE_COMPUTE, req->reply.compute_ns);
            srv__metrics_stage(&s->metrics, SRV_STAGE_ENCODE, req->reply.encode_ns);
        }
        if (status == 200)
            srv__metrics_stage(&s->metrics, SRV_STAGE_SEND, send_ns(req, now));
    }
    srv__metrics_request(&s->metrics, req->route, status, now - req->lease.start_ns, req->bytes_in,
                         req->bytes_out);
    srv__metrics_rejected(&s->metrics, reason);
    rd = srv__route_def(req->route);
    if (rd && rd->stats)
        rd->stats->completed(&s->metrics, &req->stats, status, reason,
                             srv__job_handler_ns(&req->job), queue_ns, &req->reply);
    log_request(req, status, reason, now, queue_ns);

    /* No worker touches the request's memory any more (a job that was still queued finds it
     * answered and only drops its reference): the lease returns what the reply held. A body
     * cut off on its way is no longer. */
    srv__uploads_end(s->uploads, &req->upload, false, now);
    srv__req_release_body(req);
    api_lease_end(&req->lease);
    atomic_fetch_sub(&s->active, 1);
    srv__req_unref(req);
}

void srv__mhd_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                         enum MHD_ConnectionNotificationCode code)
{
    srv_server *s = cls;

    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        *socket_context = srv__conn_open(s->watch, ci ? ci->connect_fd : -1);
        return;
    }
    if (*socket_context)
        srv__conn_close(s->watch, *socket_context);
    *socket_context = NULL;
}
