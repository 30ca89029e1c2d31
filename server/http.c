/*
 * http.c - libmicrohttpd's callbacks: routing, header checks, body accumulation, admission,
 * the handoff to an engine worker, replies, and the per-request log line and metrics.
 *
 * Everything here runs on the MHD thread except job_run (an engine worker) and
 * srv__req_unref / srv__req_fail (any thread). Which paths exist, with which methods, and who
 * answers them is the route table in routes.c: the MHD thread answers only cheap things itself
 * (health, metrics, listings, and errors found from the headers or the body size); decoding and
 * encoding a request happen on a worker. See internal.h for who owns a request when.
 */
#include "server/internal.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* First allocation for a chunked body; doubled as it grows, up to --max-body-bytes. */
#define BODY_FIRST_ALLOC ((size_t)64 * 1024)
/* Once a body is rejected it is read and discarded (so that the client sees the answer
 * instead of a reset), but only for up to this many times --max-body-bytes; past it the
 * connection is closed. The receive timeout bounds the time it may take. */
#define DRAIN_FACTOR 2

typedef srv_resp_opts resp_opts;

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

/* ---- Request life cycle ------------------------------------------------------------------- */

/* Frees the body and returns its reservation (and the reply's) to the budget. The thread that
 * owns the request at the time calls it (see internal.h). */
static void release_body(srv_req *req)
{
    srv__buf_free(&req->body);
    if (req->reserved > 0) {
        api_budget_release(req->srv->budget, req->reserved);
        req->reserved = 0;
    }
}

static void release_reply(srv_req *req)
{
    if (req->reply_reserved > 0) {
        api_budget_release(req->srv->budget, req->reply_reserved);
        req->reply_reserved = 0;
    }
}

void srv__req_unref(srv_req *req)
{
    if (!req || atomic_fetch_sub(&req->refs, 1) != 1)
        return;
    release_body(req);
    release_reply(req);
    api_reply_free(&req->reply);
    free(req);
}

/* The Open Inference Protocol's routes answer errors as {"error": "message"}. */
static api_error_style error_style(const srv_req *req)
{
    bool v2 = strncmp(req->path, "/v2/", 4) == 0 || strcmp(req->path, "/v2") == 0;
    return v2 ? API_ERRORS_V2 : API_ERRORS_NATIVE;
}

void srv__req_fail(srv_req *req, int status, api_reason reason, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    api_reply_free(&req->reply);
    api_reply_error(&req->reply, error_style(req), status, reason, NULL, "%s", msg);
}

void srv__deadline_origin(const srv_server *s, const srv_req *req, char *buf, size_t size)
{
    if (req->own_timeout_ms > 0)
        snprintf(buf, size, "the request's timeout of %lld ms", (long long)req->own_timeout_ms);
    else
        snprintf(buf, size, "--request-timeout-ms %lld",
                 (long long)(s->request_timeout_ns / 1000000));
}

/* The headers are in: from here the receive timeout applies, still counted from the request
 * line (--receive-timeout-s covers headers and body). */
static void headers_arrived(srv_req *req)
{
    srv_server *s = req->srv;
    pthread_mutex_lock(&s->watch_mu);
    if (req->sc && req->sc->phase == CONN_HEADERS)
        req->sc->phase = CONN_RECEIVING;
    pthread_mutex_unlock(&s->watch_mu);
}

static void set_phase(srv_req *req, srv_conn_phase phase)
{
    srv_server *s = req->srv;
    pthread_mutex_lock(&s->watch_mu);
    if (req->sc) {
        req->sc->phase = phase;
        req->sc->since_ns = eng_now_ns();
    }
    pthread_mutex_unlock(&s->watch_mu);
}

/* ---- Request ids ------------------------------------------------------------------------ */

/* An X-Request-Id we echo must be safe in a header and a JSON log line without escaping. */
static bool request_id_ok(const char *id)
{
    size_t n = 0;
    for (; id[n]; n++) {
        unsigned char c = (unsigned char)id[n];
        if (n >= SRV_REQUEST_ID_MAX)
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

/* ---- Responses ---------------------------------------------------------------------------- */

/* Queues `body` (taken over even on failure and freed with `release`; NULL: empty) as the
 * response. */
static enum MHD_Result respond_with(srv_req *req, int status, const char *content_type, char *body,
                                    size_t len, MHD_ContentReaderFreeCallback release,
                                    const resp_opts *o)
{
    struct MHD_Response *r;
    enum MHD_Result rc;
    char num[24];

    if (body)
        r = MHD_create_response_from_buffer_with_free_callback(len, body, release);
    else
        r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!r) {
        if (body)
            release(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
                            content_type ? content_type : "application/json");
    MHD_add_response_header(r, "X-Request-Id", req->id);
    if (o && o->allow)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, o->allow);
    for (const char *const *h = o ? o->headers : NULL; h && h[0] && h[1]; h += 2)
        MHD_add_response_header(r, h[0], h[1]);
    if (o && o->retry_after_s > 0) {
        snprintf(num, sizeof num, "%d", o->retry_after_s);
        MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, num);
    }
    /* Close when the body was not read (a keep-alive connection would parse it as the next
     * request) and while draining (so that clients reconnect to another replica). */
    if ((o && o->close) || atomic_load(&req->srv->draining))
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    rc = MHD_queue_response(req->conn, (unsigned)status, r);
    MHD_destroy_response(r);
    if (rc == MHD_YES && req->srv->send_timeout_s < req->srv->idle_timeout_s) {
        /* libmicrohttpd's timer measures idleness, and a client that stops reading is idle:
         * while its reply is written it gets --send-timeout-s, not --idle-timeout-s, so that a
         * non-reader pins the reply's memory that long at most. Completion restores it. */
        MHD_set_connection_option(req->conn, MHD_CONNECTION_OPTION_TIMEOUT,
                                  req->srv->send_timeout_s);
        req->send_timer = true;
    }
    req->status = status;
    req->bytes_out = body ? len : 0;
    req->responded = true;
    set_phase(req, CONN_BUSY);
    return rc;
}

/* Queues `body` (malloc'd, taken over even on failure) as the response. */
static enum MHD_Result respond(srv_req *req, int status, const char *content_type, char *body,
                               size_t len, const resp_opts *o)
{
    return respond_with(req, status, content_type, body, len, free, o);
}

/* Queues an api/ reply as the response: its status, type and body (eng_buf memory, see
 * api_reply_take_body), with `o` (may be NULL). */
static enum MHD_Result respond_api(srv_req *req, api_reply *reply, const resp_opts *o)
{
    size_t len = 0;
    int status = reply->status > 0 ? reply->status : 500;
    const char *content_type = reply->content_type;
    char *body = api_reply_take_body(reply, &len);
    req->reason = reply->reason;
    return respond_with(req, status, content_type, body, len, eng_buf_free, o);
}

static enum MHD_Result respond_error(srv_req *req, int status, api_reason reason,
                                     const resp_opts *o, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static enum MHD_Result respond_error(srv_req *req, int status, api_reason reason,
                                     const resp_opts *o, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    api_reply reply;
    resp_opts opts = o ? *o : (resp_opts){0};

    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    req->reason = reason;
    if (!opts.close && req->body_expected && atomic_load(&req->state) == REQ_RECEIVING &&
        !req->seen_body_end)
        opts.close = true;

    api_reply_error(&reply, error_style(req), status, reason, NULL, "%s", msg);
    return respond_api(req, &reply, &opts);
}

static enum MHD_Result respond_text(srv_req *req, int status, const char *content_type,
                                    const char *text, const resp_opts *o)
{
    size_t n = strlen(text);
    char *body = malloc(n + 1);
    if (!body)
        return MHD_NO;
    memcpy(body, text, n + 1);
    return respond(req, status, content_type, body, n, o);
}

enum MHD_Result srv__respond(srv_req *req, int status, const char *content_type, char *body,
                             size_t len, const srv_resp_opts *o)
{
    return respond(req, status, content_type, body, len, o);
}

enum MHD_Result srv__respond_text(srv_req *req, int status, const char *content_type,
                                  const char *text, const srv_resp_opts *o)
{
    return respond_text(req, status, content_type, text, o);
}

enum MHD_Result srv__respond_error(srv_req *req, int status, api_reason reason,
                                   const srv_resp_opts *o, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return respond_error(req, status, reason, o, "%s", msg);
}

/* The reply a worker (or the watcher) prepared, after the connection was resumed. */
static enum MHD_Result respond_reply(srv_req *req)
{
    api_reply *r = &req->reply;
    const char *headers[8];
    char num[24];
    srv__reply_headers(r, headers, num);
    resp_opts o = {.retry_after_s = r->retry_after_s, .headers = headers};

    if (atomic_load(&req->client_gone)) {
        /* Nobody is listening: close instead of writing into a dead socket. */
        api_reply_free(r);
        req->reason = r->reason;
        req->status = r->status;
        req->responded = true;
        return MHD_NO;
    }
    return respond_api(req, r, &o);
}

enum MHD_Result srv__respond_api(srv_req *req, api_reply *reply)
{
    return respond_api(req, reply, NULL);
}

/* ---- Headers ------------------------------------------------------------------------------ */

typedef struct {
    int n_length, n_transfer, n_encoding;
    const char *length, *transfer, *encoding;
} framing;

static enum MHD_Result collect_framing(void *cls, enum MHD_ValueKind kind, const char *key,
                                       const char *value)
{
    framing *f = cls;
    (void)kind;
    if (!key)
        return MHD_YES;
    if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0) {
        f->n_length++;
        f->length = value;
    } else if (strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING) == 0) {
        f->n_transfer++;
        f->transfer = value;
    } else if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_ENCODING) == 0) {
        f->n_encoding++;
        f->encoding = value;
    }
    return MHD_YES;
}

/* `value` equals `word`, ignoring case and surrounding blanks. */
static bool token_is(const char *value, const char *word)
{
    size_t n = strlen(word);
    if (!value)
        return false;
    while (*value == ' ' || *value == '\t')
        value++;
    if (strncasecmp(value, word, n) != 0)
        return false;
    value += n;
    while (*value == ' ' || *value == '\t')
        value++;
    return *value == '\0';
}

/* The client sent "Expect: 100-continue": it waits for a go-ahead before sending its body. */
static bool expects_continue(const srv_req *req)
{
    return token_is(MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, "Expect"),
                    "100-continue");
}

/* Checks the message framing before any body byte is read: libmicrohttpd 0.9.75 uses the first
 * of two Content-Length headers, lets chunked win over Content-Length, and reads a body with an
 * unknown transfer coding as raw bytes until the connection closes. Each is a way to make a
 * proxy and this server disagree on where a request ends (request smuggling), so each is an
 * error here. Returns MHD_YES with *answered false when the framing is sound. */
static enum MHD_Result check_framing(srv_server *s, srv_req *req, bool *answered)
{
    framing f = {0};
    resp_opts close = {.close = true};
    *answered = true;

    MHD_get_connection_values(req->conn, MHD_HEADER_KIND, collect_framing, &f);
    if (f.n_length > 1)
        return respond_error(req, 400, API_REASON_BAD_REQUEST, &close,
                             "more than one Content-Length header");
    if (f.n_transfer > 0 && f.n_length > 0)
        return respond_error(req, 400, API_REASON_BAD_REQUEST, &close,
                             "both Transfer-Encoding and Content-Length are set");
    /* libmicrohttpd 0.9.75 frames a body as chunked only when the value is exactly "chunked"
     * (any case): with a trailing blank it reads the body until the connection closes and
     * swallows the requests behind it, so such a value is malformed here, as a Content-Length
     * with one is for libmicrohttpd. */
    if (f.n_transfer == 1 && token_is(f.transfer, "chunked") &&
        strcasecmp(f.transfer, "chunked") != 0)
        return respond_error(req, 400, API_REASON_BAD_REQUEST, &close,
                             "malformed Transfer-Encoding \"%.64s\": blanks around \"chunked\"",
                             f.transfer);
    if (f.n_transfer > 1 || (f.n_transfer == 1 && !token_is(f.transfer, "chunked")))
        return respond_error(req, 501, API_REASON_BAD_REQUEST, &close,
                             "unsupported Transfer-Encoding \"%.64s\": only chunked is accepted",
                             f.n_transfer == 1 ? f.transfer : "(several headers)");
    if (f.n_length == 1) {
        /* libmicrohttpd already rejected a value that is not a number. */
        char *end = NULL;
        unsigned long long n = strtoull(f.length, &end, 10);
        if (n > 0)
            req->body_expected = true;
        if (n > (unsigned long long)s->max_body_bytes) {
            /* Decided from the header, before a byte is read. A client waiting for "100
             * Continue" gets the answer now and never sends the body; so does one announcing
             * more than we would read. Any other client is already sending: libmicrohttpd
             * closes a connection answered mid-body, and the client would see a reset instead
             * of the 413, so its body is read and discarded first (as for chunked bodies). */
            if (expects_continue(req) || n / DRAIN_FACTOR > s->max_body_bytes)
                return respond_error(req, 413, API_REASON_TOO_LARGE, &close,
                                     "the body of %llu bytes is larger than --max-body-bytes (%zu)",
                                     n, s->max_body_bytes);
            req->pending_status = 413;
            req->pending_reason = API_REASON_TOO_LARGE;
            snprintf(req->pending_msg, sizeof req->pending_msg,
                     "the body of %llu bytes is larger than --max-body-bytes (%zu)", n,
                     s->max_body_bytes);
        } else {
            req->content_length = (size_t)n;
            req->has_length = true;
        }
    }
    if (f.n_transfer == 1)
        req->body_expected = true;
    /* gzip and deflate are undone on the worker (api_call_encoded); anything else now. */
    if (f.n_encoding > 1 || (f.n_encoding == 1 && !api_content_encoding_known(f.encoding)))
        return respond_error(req, 415, API_REASON_BAD_REQUEST, NULL,
                             "unsupported Content-Encoding \"%.64s\": send gzip, deflate or "
                             "identity",
                             f.n_encoding == 1 && f.encoding ? f.encoding : "(several headers)");
    *answered = false;
    return MHD_YES;
}

/* Arranges a 413 for a body that needs more than the whole budget. */
static void set_never_fits(const srv_server *s, srv_req *req)
{
    req->pending_status = 413;
    req->pending_reason = API_REASON_MEMORY;
    snprintf(req->pending_msg, sizeof req->pending_msg,
             "the request body needs more memory than --max-memory-bytes (%zu) allows",
             s->max_memory_bytes);
}

/* Arranges a 429 for a body that does not fit in the budget while other requests hold it. */
static void set_budget_busy(srv_req *req)
{
    req->pending_status = 429;
    req->pending_reason = API_REASON_MEMORY;
    snprintf(req->pending_msg, sizeof req->pending_msg,
             "the memory budget (--max-memory-bytes) is in use by other requests; retry later");
}

/* Reserves `bytes` of the budget for the body; on failure answers (or arranges to answer once
 * the body is in) and returns false. */
static bool reserve_body(srv_server *s, srv_req *req, size_t bytes)
{
    switch (api_budget_reserve(s->budget, bytes)) {
    case API_BUDGET_OK:
        req->reserved += bytes;
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

static enum MHD_Result respond_pending(srv_req *req)
{
    resp_opts o = {.retry_after_s = req->pending_status == 429 ? 1 : 0,
                   .headers = req->pending_status == 401 ? srv__auth_challenge : NULL};
    return respond_error(req, req->pending_status, req->pending_reason, &o, "%s", req->pending_msg);
}

/* Answers a refusal decided from the headers (pending_* filled) as the client allows: one
 * waiting for "100 Continue" gets it now and never sends the body. Any other is already
 * sending it, and libmicrohttpd would close a connection answered mid-body, so that the client
 * sees a reset instead of the answer: its body is read and discarded (on_body_chunk) and the
 * answer waits for its end (on_body_complete). Nothing is reserved or allocated for it. */
static enum MHD_Result refuse_from_headers(srv_req *req)
{
    if (expects_continue(req))
        return respond_pending(req);
    return MHD_YES;
}

/* Checks of the request line and header block that come before framing (request_check.c):
 * each is a way for a proxy and this server to read a different request. Every refusal
 * closes the connection, since what follows the headers cannot be trusted either. */
static enum MHD_Result check_request(srv_req *req, const char *version, bool *answered)
{
    resp_opts close = {.close = true};
    srv_header_scan scan;

    *answered = true;
    if (req->bad_target)
        return respond_error(req, 400, API_REASON_BAD_REQUEST, &close, "%s", req->bad_target);
    srv__headers_scan(req->conn, &scan);
    if (scan.bad_name)
        return respond_error(req, 400, API_REASON_BAD_REQUEST, &close,
                             "malformed header field \"%.64s\": whitespace before the colon, "
                             "line folding and other non-token characters are not accepted",
                             scan.bad_name);
    if (scan.n_host > 1 || (scan.n_host == 0 && version && strcmp(version, "HTTP/1.1") == 0))
        return respond_error(req, 400, API_REASON_BAD_REQUEST, &close,
                             "an HTTP/1.1 request needs exactly one Host header (it has %d)",
                             scan.n_host);
    if (scan.n_infer_len > 1)
        return respond_error(req, 400, API_REASON_BAD_REQUEST, &close,
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
    const char *hdr;
    enum MHD_Result rc;
    req->framing_checked = true;
    req->http11 = version && strcmp(version, MHD_HTTP_VERSION_1_1) == 0;
    snprintf(req->method, sizeof req->method, "%s", method ? method : "");
    hdr = MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, "X-Request-Id");
    if (hdr && request_id_ok(hdr))
        snprintf(req->id, sizeof req->id, "%s", hdr);
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
    headers_arrived(req);
    rc = check_request(req, version, answered);
    if (*answered)
        return rc;
    return check_framing(s, req, answered);
}

/* The routes --admin-port serves: what probes and scrapers need, all answered on this thread
 * from the headers, so that a saturated --port (or engine) cannot hold them up. */
static bool admin_route(const srv_route_def *rd)
{
    return rd &&
           (strcmp(rd->pattern, "/v2/health/live") == 0 ||
            strcmp(rd->pattern, "/v2/health/ready") == 0 || strcmp(rd->pattern, "/metrics") == 0);
}

/* Routing and the checks that can be decided from the headers. Runs before the body is read
 * when one is expected; for a request without a body it runs on the handler's second call,
 * because libmicrohttpd 0.9.75 closes a connection whose response was queued before it knew
 * the request was complete, and health checks and scrapes should keep theirs. */
static enum MHD_Result on_headers(srv_server *s, srv_req *req)
{
    const srv_route_def *rd = srv__route_def(req->route);
    const char *hdr;
    bool is_get;

    req->seen_headers = true;
    if (req->admin && !admin_route(rd)) {
        resp_opts close = {.close = req->body_expected};
        return respond_error(req, 404, API_REASON_BAD_REQUEST, &close,
                             "--admin-port serves only /v2/health/live, /v2/health/ready and "
                             "/metrics; %.100s is on --port",
                             req->path);
    }
    /* Before anything that tells routes apart; the admin port (probes, /metrics) needs no
     * token. */
    if (!req->admin && !srv__auth_allows(s->auth, req)) {
        srv__auth_refuse(req);
        return req->body_expected ? refuse_from_headers(req) : respond_pending(req);
    }
    if (!rd) {
        return respond_error(req, 404, API_REASON_BAD_REQUEST, NULL, "no route %.100s %.100s",
                             req->method, req->path);
    }
    if (!srv__route_allows(rd, req->method)) {
        resp_opts o = {.allow = rd->allow};
        return respond_error(req, 405, API_REASON_BAD_REQUEST, &o,
                             "method %.32s is not allowed on %s (allowed: %s)", req->method,
                             rd->pattern, rd->allow);
    }
    if (req->params.bad[0]) {
        return respond_error(req, 400, API_REASON_BAD_REQUEST, NULL,
                             "the {%s} part of the path must be 1 to %d characters from "
                             "[A-Za-z0-9_.-]",
                             req->params.bad, SRV_PARAM_MAX);
    }
    is_get = strcmp(req->method, "GET") == 0 || strcmp(req->method, "HEAD") == 0;
    if (!rd->work || is_get) {
        if (!rd->answer) /* defensive: a row without a handler for this method */
            return respond_error(req, 500, API_REASON_INTERNAL, NULL, "no handler for %.32s %s",
                                 req->method, rd->pattern);
        return rd->answer(s, req);
    }
    if (req->pending_status) /* refused from the headers: discard the body, then answer */
        return MHD_YES;

    /* A worker route: everything that can be decided before the body is read. */
    hdr = MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
    if (hdr) {
        if (strlen(hdr) >= sizeof req->content_type)
            return respond_error(req, 415, API_REASON_BAD_REQUEST, NULL,
                                 "the Content-Type header is too long");
        snprintf(req->content_type, sizeof req->content_type, "%s", hdr);
        req->has_content_type = true;
    }
    {
        bool answered = false;
        enum MHD_Result rc = srv__capture_headers(s, req, &answered);
        if (answered)
            return rc;
    }
    /* These refusals wait for a body that is on its way (refuse_from_headers): libmicrohttpd
     * 0.9.75 stops reading a POST body once a response is queued and closes the connection
     * after it, so a client still sending its body (a long sequence) would get a reset instead
     * of the 503 or 429. */
    if (atomic_load(&s->draining)) {
        resp_opts o = {.close = true};
        if (req->body_expected) {
            req->pending_status = 503;
            req->pending_reason = API_REASON_DRAINING;
            snprintf(req->pending_msg, sizeof req->pending_msg,
                     "the server is shutting down; retry on another replica");
            return refuse_from_headers(req);
        }
        return respond_error(req, 503, API_REASON_DRAINING, &o,
                             "the server is shutting down; retry on another replica");
    }
    if (atomic_load(&s->admitted) >= s->max_queue) {
        resp_opts o = {.retry_after_s = 1};
        if (req->body_expected) {
            req->pending_status = 429;
            req->pending_reason = API_REASON_QUEUE_FULL;
            snprintf(req->pending_msg, sizeof req->pending_msg,
                     "the queue is full (--max-queue %lld); retry later", (long long)s->max_queue);
            return refuse_from_headers(req);
        }
        return respond_error(req, 429, API_REASON_QUEUE_FULL, &o,
                             "the queue is full (--max-queue %lld); retry later",
                             (long long)s->max_queue);
    }
    /* Nothing is reserved for the announced length: a Content-Length is a promise, not bytes,
     * and reserving it up front let sixteen clients that announce 256 MiB and send nothing
     * hold the whole budget. The reservation grows with the bytes that arrive (on_body_chunk);
     * a body that could never fit, or that does not fit in what is free right now, is
     * refused from the header (checking holds nothing). */
    if (req->has_length && req->content_length > 0) {
        size_t total = api_budget_total(s->budget), used = api_budget_in_use(s->budget);
        if (req->content_length >= total) {
            set_never_fits(s, req);
            return refuse_from_headers(req);
        }
        if (req->content_length >= total - used) { /* used <= total: reserve checks it */
            set_budget_busy(req);
            return refuse_from_headers(req);
        }
    }
    return MHD_YES;
}

/* ---- Body --------------------------------------------------------------------------------- */

static enum MHD_Result on_body_chunk(srv_server *s, srv_req *req, const char *data, size_t n)
{
    req->bytes_in += n;
    if (req->sc) /* the watcher's --min-upload-rate check reads it */
        atomic_fetch_add_explicit(&req->sc->received, n, memory_order_relaxed);
    if (atomic_load(&s->drain_expired)) {
        /* The drain is over and this body is still arriving: answer now, or the client would
         * only see the connection torn down when the daemon stops. A response queued
         * mid-body is never sent by libmicrohttpd 0.9.75 (it closes the connection instead),
         * so the small 503 is written to the socket here, where nothing else is in flight,
         * and MHD_NO closes the connection. */
        release_body(req);
        srv__req_fail(req, 503, API_REASON_DRAINING,
                      "the server is shutting down (--drain-timeout-s passed) while the body "
                      "was arriving; retry on another replica");
        srv__reply_direct(req);
        return MHD_NO;
    }
    if (req->pending_status) {
        if (req->bytes_in / DRAIN_FACTOR > s->max_body_bytes)
            return MHD_NO; /* enough draining: close */
        return MHD_YES;
    }
    if (n > s->max_body_bytes - req->body.len) {
        req->pending_status = 413;
        req->pending_reason = API_REASON_TOO_LARGE;
        snprintf(req->pending_msg, sizeof req->pending_msg,
                 "the body is larger than --max-body-bytes (%zu)", s->max_body_bytes);
        release_body(req);
        return MHD_YES;
    }
    if (n >= req->body.cap - req->body.len) {
        /* Grow (doubling, capped by the announced length or the body cap) and reserve what the
         * allocation grows by, so that the reservation is never more than about twice the
         * bytes received. */
        size_t need = req->body.len + n + 1;
        size_t limit = req->has_length ? req->content_length + 1 : s->max_body_bytes + 1;
        size_t cap = req->body.cap > 0 ? req->body.cap : BODY_FIRST_ALLOC;
        while (cap < need)
            cap = cap > SIZE_MAX / 2 ? need : cap * 2;
        if (cap > limit)
            cap = limit;
        if (!reserve_body(s, req, cap - req->body.cap)) {
            release_body(req);
            return MHD_YES;
        }
        if (srv__buf_grow_to(&req->body, cap) != SRV_OK) {
            req->pending_status = 503;
            req->pending_reason = API_REASON_MEMORY;
            snprintf(req->pending_msg, sizeof req->pending_msg,
                     "out of memory while receiving the body");
            release_body(req);
            return MHD_YES;
        }
    }
    srv__buf_append(&req->body, data, n);
    return MHD_YES;
}

/* Runs one request on an engine worker: decode, compute, encode (all inside api_attention),
 * then hands the reply back to the MHD thread by resuming the connection. */
static void job_run(void *arg, int64_t index)
{
    srv_req *req = arg;
    srv_server *s = req->srv;
    int expected = REQ_QUEUED;
    api_call call;
    (void)index;

    if (!atomic_compare_exchange_strong(&req->state, &expected, REQ_RUNNING)) {
        /* The watcher answered it while it waited (hang-up, deadline, drain). */
        atomic_fetch_sub(&s->admitted, 1);
        srv__req_unref(req);
        return;
    }
    atomic_fetch_sub(&s->queued, 1);
    atomic_fetch_add(&s->running, 1);
    req->run_ns = eng_now_ns();

    memset(&call, 0, sizeof call);
    call.body = req->body.data ? req->body.data : "";
    call.body_len = req->body.len;
    call.content_type = req->has_content_type ? req->content_type : NULL;
    call.pool = s->pool;
    call.ctl = &req->ctl;
    call.start_ns = req->start_ns;
    call.limits = &s->limits;
    call.budget = s->budget;
    call.budget_held = req->reserved; /* the body's share: a request that can never fit is 413 */
    call.models = s->models;
    srv__call_headers(req, &call);
    srv__v2_started(s, req);
    srv__route_def(req->route)->work(req, &call, &req->reply);

    if (atomic_load(&req->drain_cancelled) && req->reply.status != 200) {
        int64_t dec = req->reply.decode_ns, comp = req->reply.compute_ns;
        srv__req_fail(req, 503, API_REASON_DRAINING,
                      "the server is shutting down (--drain-timeout-s passed)");
        req->reply.decode_ns = dec;
        req->reply.compute_ns = comp;
    }
    req->done_ns = eng_now_ns();
    release_body(req);
    /* A client that half-closed would lose the reply on resume (half_close.c): write it now,
     * once the watcher can no longer write its probe (watch.c) to the socket. */
    srv__watch_remove(s, req);
    if (srv__peer_sent_fin(req))
        srv__reply_direct(req);
    /* api released its reservation; the reply text stays in memory until it is sent, so it
     * is accounted for until the request completes (best effort: it exists already). */
    if (req->reply.body_len > 0 &&
        api_budget_reserve(s->budget, req->reply.body_len) == API_BUDGET_OK)
        req->reply_reserved = req->reply.body_len;
    atomic_store(&req->state, REQ_DONE);
    atomic_fetch_sub(&s->running, 1);
    atomic_fetch_sub(&s->admitted, 1); /* before resuming: the client may send the next at once */
    MHD_resume_connection(req->conn);
    atomic_fetch_sub(&s->suspended, 1);
    srv__req_unref(req);
}

/* The deadline of a request about to be queued: --request-timeout-ms from its arrival, or its
 * body's own timeout when that is tighter (then kept in req->own_timeout_ms). A worker reads
 * the body's timeout only once it reaches the request; read here (cheaply: api/peek.c), it
 * holds while the request waits behind others, and the watcher answers 504 on time.
 *
 * Only a request that will wait needs it now. With nothing admitted the request starts at once
 * (admissions happen on this thread only, so none can slip in before it), its route applies
 * the timeout, and the I/O thread does not scan a long body for nothing (memmem alone takes
 * ~6 ms over 64 MB of base64). */
static int64_t request_deadline(const srv_server *s, srv_req *req)
{
    const srv_route_def *rd = srv__route_def(req->route);
    api_call call = {.body = req->body.data, .body_len = req->body.len};
    int64_t ms = 0;

    if (rd && rd->timeout && atomic_load(&s->admitted) > 0) {
        call.content_type = req->has_content_type ? req->content_type : NULL;
        srv__call_headers(req, &call);
        ms = rd->timeout(&call);
    }
    req->own_timeout_ms = ms > 0 && ms < s->limits.max_timeout_ms ? ms : 0;
    if (req->own_timeout_ms > 0)
        return req->start_ns + req->own_timeout_ms * 1000000;
    return req->start_ns + s->request_timeout_ns;
}

static enum MHD_Result on_body_complete(srv_server *s, srv_req *req)
{
    int64_t now, deadline;
    int_fast64_t admitted;
    char origin[64];

    req->seen_body_end = true;
    set_phase(req, CONN_BUSY);
    if (req->pending_status)
        return respond_pending(req);
    if (atomic_load(&s->drain_expired))
        return respond_error(req, 503, API_REASON_DRAINING, NULL,
                             "the server is shutting down; retry on another replica");
    deadline = request_deadline(s, req);
    now = eng_now_ns(); /* after the peek, which the queue time should not include */
    if (now >= deadline) {
        srv__deadline_origin(s, req, origin, sizeof origin);
        return respond_error(req, 504, API_REASON_DEADLINE, NULL,
                             "deadline exceeded while receiving the request (%s)", origin);
    }
    admitted = atomic_load(&s->admitted);
    do {
        if (admitted >= s->max_queue) {
            resp_opts o = {.retry_after_s = 1};
            return respond_error(req, 429, API_REASON_QUEUE_FULL, &o,
                                 "the queue is full (--max-queue %lld); retry later",
                                 (long long)s->max_queue);
        }
    } while (!atomic_compare_exchange_weak(&s->admitted, &admitted, admitted + 1));

    atomic_store(&req->ctl.cancel, false);
    req->ctl.deadline_ns = deadline;
    req->queue_deadline_ns = deadline;
    req->submit_ns = now;
    atomic_store(&req->state, REQ_QUEUED);
    atomic_fetch_add(&s->queued, 1);
    srv__v2_admitted(s, req);
    atomic_fetch_add(&req->refs, 1); /* the job's reference */
    atomic_fetch_add(&s->suspended, 1);
    MHD_suspend_connection(req->conn);
    srv__watch_add(s, req);
    if (eng_pool_submit(s->pool, job_run, req) != ENG_OK) {
        int expected = REQ_QUEUED;
        atomic_fetch_sub(&s->admitted, 1);
        if (atomic_compare_exchange_strong(&req->state, &expected, REQ_DONE)) {
            atomic_fetch_sub(&s->queued, 1);
            srv__watch_remove(s, req);
            srv__req_fail(req, 503, API_REASON_INTERNAL, "could not queue the request");
            MHD_resume_connection(req->conn);
            atomic_fetch_sub(&s->suspended, 1);
        }
        srv__req_unref(req); /* the job's reference, never handed over */
    }
    return MHD_YES;
}

/* ---- libmicrohttpd callbacks --------------------------------------------------------------- */

void *srv__mhd_uri(void *cls, const char *uri, struct MHD_Connection *conn)
{
    srv_server *s = cls;
    srv_req *req = calloc(1, sizeof *req);
    const union MHD_ConnectionInfo *ci;
    size_t n;

    if (!req)
        return NULL;
    atomic_init(&req->refs, 1);
    atomic_init(&req->state, REQ_RECEIVING);
    atomic_init(&req->drain_cancelled, false);
    atomic_init(&req->client_gone, false);
    atomic_init(&req->ctl.cancel, false);
    req->srv = s;
    req->conn = conn;
    req->start_ns = eng_now_ns();
    srv__buf_init(&req->body, s->max_body_bytes);
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

    ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_DAEMON);
    req->admin = ci && s->admin_mhd && ci->daemon == s->admin_mhd;
    ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    pthread_mutex_lock(&s->watch_mu);
    req->sc = ci ? ci->socket_context : NULL;
    if (req->sc) {
        req->sc->phase = CONN_HEADERS;
        atomic_store_explicit(&req->sc->received, 0, memory_order_relaxed);
        req->sc->since_ns = req->start_ns;
        req->sc->req = req;
    }
    pthread_mutex_unlock(&s->watch_mu);
    atomic_fetch_add(&s->active, 1);
    return req;
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
    if (req->sent_directly)
        return MHD_NO; /* a worker wrote the reply (half_close.c): only the close is left */
    if (req->responded) {
        /* Answered early; whatever body libmicrohttpd still hands over is discarded. */
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (atomic_load(&req->state) == REQ_RECEIVING) {
        if (*upload_data_size > 0) {
            enum MHD_Result rc = on_body_chunk(s, req, upload_data, *upload_data_size);
            *upload_data_size = 0;
            return rc;
        }
        return on_body_complete(s, req);
    }
    if (atomic_load(&req->state) == REQ_DONE)
        return respond_reply(req);
    return MHD_YES; /* defensive: called while the request is with a worker */
}

static double ms(int64_t ns)
{
    return ns > 0 ? (double)ns / 1e6 : 0.0;
}

static void log_request(const srv_req *req, int status, api_reason reason, int64_t now,
                        int64_t queue_ns)
{
    /* receive: first byte of the request to its last; send: the reply's handoff to the
     * connection until libmicrohttpd has written it all. */
    int64_t receive_ns = req->submit_ns > 0 ? req->submit_ns - req->start_ns : 0;
    int64_t send_ns = req->done_ns > 0 ? now - req->done_ns : 0;
    srv_buf b;
    if (!srv_log_enabled(SRV_LOG_INFO))
        return;
    srv__buf_init(&b, 8192);
    srv__log_begin(&b, SRV_LOG_INFO);
    srv__buf_puts(&b, ",\"msg\":\"request\",\"request_id\":");
    srv__buf_json_str(&b, req->id, strlen(req->id));
    srv__buf_puts(&b, ",\"method\":");
    srv__buf_json_str(&b, req->method, strlen(req->method));
    srv__buf_printf(&b, ",\"route\":\"%s\",\"path\":", srv__route_label(req->route));
    srv__buf_json_str(&b, req->path, strlen(req->path));
    srv__buf_printf(&b,
                    ",\"status\":%d,\"bytes_in\":%llu,\"bytes_out\":%llu,\"receive_ms\":%.3f,"
                    "\"queue_ms\":%.3f,\"decode_ms\":%.3f,\"compute_ms\":%.3f,"
                    "\"encode_ms\":%.3f,\"send_ms\":%.3f,\"total_ms\":%.3f",
                    status, (unsigned long long)req->bytes_in, (unsigned long long)req->bytes_out,
                    ms(receive_ns), ms(queue_ns), ms(req->reply.decode_ns),
                    ms(req->reply.compute_ns), ms(req->reply.encode_ns), ms(send_ns),
                    ms(now - req->start_ns));
    if (reason != API_REASON_NONE)
        srv__buf_printf(&b, ",\"reason\":\"%s\"", api_reason_str(reason));
    if (req->cut_status > 0)
        srv__buf_printf(&b, ",\"reply_cut_off\":true,\"reply_status\":%d", req->cut_status);
    srv__buf_puts(&b, "}\n");
    if (!b.failed)
        srv__log_write(b.data, b.len);
    srv__buf_free(&b);
}

void srv__mhd_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                        enum MHD_RequestTerminationCode toe)
{
    srv_server *s = cls;
    srv_req *req = *con_cls;
    int64_t now = eng_now_ns(), queue_ns = 0;
    bool slow;
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
    pthread_mutex_lock(&s->watch_mu);
    if (req->sc) {
        req->sc->phase = CONN_IDLE;
        req->sc->since_ns = now;
        if (req->sc->req == req)
            req->sc->req = NULL;
        req->sc = NULL;
    }
    slow = req->dropped_slow;
    pthread_mutex_unlock(&s->watch_mu);

    status = req->status;
    reason = req->reason;
    if (atomic_load(&req->client_gone)) {
        status = 499; /* nginx's "client closed request": the reply was never delivered */
        reason = API_REASON_CANCELLED;
    } else if (req->responded && !req->sent_directly &&
               toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) {
        /* The reply was queued but not all of it was sent: the client stopped reading (cut at
         * --idle-timeout-s) or went away mid-download. Not a success, and its bytes did not
         * all go out. */
        req->cut_status = status;
        req->bytes_out = 0;
        status = 499;
        reason = API_REASON_CANCELLED;
    } else if (!req->responded) {
        if (slow) {
            status = 408;
            reason = API_REASON_NONE; /* counted in attnd_slow_clients_total */
        } else if (!req->framing_checked && toe == MHD_REQUEST_TERMINATED_WITH_ERROR) {
            status = 400; /* libmicrohttpd rejected the request line or headers itself */
            reason = API_REASON_BAD_REQUEST;
        } else {
            status = 499;
            reason = API_REASON_CANCELLED;
        }
    }

    if (req->submit_ns > 0) {
        queue_ns = (req->run_ns > 0 ? req->run_ns : req->done_ns) - req->submit_ns;
        srv__metrics_stage(&s->metrics, SRV_STAGE_QUEUE, queue_ns);
        if (req->run_ns > 0) {
            srv__metrics_stage(&s->metrics, SRV_STAGE_DECODE, req->reply.decode_ns);
            srv__metrics_stage(&s->metrics, SRV_STAGE_COMPUTE, req->reply.compute_ns);
            srv__metrics_stage(&s->metrics, SRV_STAGE_ENCODE, req->reply.encode_ns);
        }
    }
    srv__metrics_request(&s->metrics, req->route, status, now - req->start_ns, req->bytes_in,
                         req->bytes_out);
    srv__metrics_rejected(&s->metrics, reason);
    srv__v2_completed(s, req, status, reason, now - req->start_ns, queue_ns);
    log_request(req, status, reason, now, queue_ns);

    release_body(req);
    release_reply(req);
    atomic_fetch_sub(&s->active, 1);
    srv__req_unref(req);
}

void srv__mhd_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                         enum MHD_ConnectionNotificationCode code)
{
    srv_server *s = cls;
    srv_conn *c;

    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        c = calloc(1, sizeof *c);
        *socket_context = c;
        if (!c)
            return; /* the connection works, without deadlines or hang-up detection */
        c->fd = ci ? ci->connect_fd : -1;
        c->phase = CONN_IDLE;
        c->since_ns = eng_now_ns();
        pthread_mutex_lock(&s->watch_mu);
        c->next = s->conns;
        if (s->conns)
            s->conns->prev = c;
        s->conns = c;
        pthread_mutex_unlock(&s->watch_mu);
        return;
    }

    c = *socket_context;
    if (!c)
        return;
    *socket_context = NULL;
    pthread_mutex_lock(&s->watch_mu);
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    if (c->req && c->req->sc == c)
        c->req->sc = NULL;
    pthread_mutex_unlock(&s->watch_mu);
    free(c);
}
