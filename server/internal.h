/*
 * internal.h - module-private declarations shared by the files of server/ (never included from
 * outside server/). Names carry the srv__ prefix.
 *
 * Threads of a running daemon:
 *   main     parses the config, starts everything, waits for a signal, runs the drain;
 *   MHD      libmicrohttpd's internal epoll thread: every callback in http.c runs on it;
 *   watcher  watch.c: polls the sockets of suspended requests for a hang-up, enforces the
 *            receive deadline of slow clients and the queue deadline, applies the drain timeout;
 *   workers  the engine pool: decode, compute and encode one request each (job_run in http.c).
 *
 * Ownership of a request (srv_req): created by the URI callback when the request line arrives,
 * it belongs to the MHD thread until the body is complete. It is then suspended and handed to
 * the pool with a second reference; the MHD thread does not touch it while it is suspended.
 * Whoever finishes it (the worker, or the watcher when it abandons a request still waiting in
 * the queue) fills `reply`, marks it REQ_DONE and resumes the connection, and after that never
 * touches it again except to drop its reference. The MHD thread then queues the reply and, at
 * NOTIFY_COMPLETED, logs, counts and drops its reference; the last reference frees it.
 */
#ifndef ATTND_SERVER_INTERNAL_H
#define ATTND_SERVER_INTERNAL_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>

#include "api/api.h"
#include "engine/engine.h"
#include "server/server.h"

typedef struct srv_tls srv_tls;
typedef struct srv_auth srv_auth;

/* ---- Growable buffers (buf.c) ------------------------------------------------------------ */

/* A byte buffer that grows up to `limit`. A failed append sets `failed` and leaves the buffer
 * as it was, so a series of appends can be checked once at the end. */
typedef struct {
    char *data;
    size_t len, cap, limit;
    bool failed;
    bool pooled; /* data is from eng_buf_alloc (request bodies, see srv__buf_grow_to) */
} srv_buf;

void srv__buf_init(srv_buf *b, size_t limit);
void srv__buf_free(srv_buf *b);
/* Ensures room for `extra` more bytes: SRV_OK, SRV_ETOOBIG (past the limit) or SRV_ENOMEM. */
srv_status srv__buf_reserve(srv_buf *b, size_t extra);
/* Grows the allocation to exactly `cap` bytes (data plus the NUL), for callers that account
 * for every allocated byte (request bodies against the memory budget). The storage comes from
 * eng_buf_alloc, whose cache keeps the pages of big bodies for the next request; such a buffer
 * is never taken (srv__buf_take). */
srv_status srv__buf_grow_to(srv_buf *b, size_t cap);
srv_status srv__buf_append(srv_buf *b, const void *data, size_t n);
srv_status srv__buf_puts(srv_buf *b, const char *s);
srv_status srv__buf_printf(srv_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends `s` (n bytes) as a JSON string literal with quotes; bytes that are not printable
 * ASCII are escaped as \u00XX, so the output is ASCII whatever the input. */
srv_status srv__buf_json_str(srv_buf *b, const char *s, size_t n);
/* Hands the data (NUL-terminated, malloc'd) to the caller and resets the buffer; NULL if the
 * buffer failed or allocation failed. */
char *srv__buf_take(srv_buf *b, size_t *len);

/* ---- Logging (log.c) --------------------------------------------------------------------- */

/* Writes the RFC 3339 UTC time with milliseconds ("2024-05-01T12:00:00.123Z") into out[32]. */
void srv__log_time(char out[32]);
/* Appends the opening of a log line, {"time":"...","level":"...", to `b`. */
void srv__log_begin(srv_buf *b, srv_log_level level);
/* Writes a complete line (without its newline) to stderr in one piece. */
void srv__log_write(const char *line, size_t len);
/* libmicrohttpd's error-log callback (MHD_OPTION_EXTERNAL_LOGGER). */
void srv__log_mhd(void *cls, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));

/* ---- Metrics (metrics.c) ----------------------------------------------------------------- */

/* A route is the index of its row in the route table (routes.c). Metrics keep one series per
 * row, labelled with the row's pattern (never the raw path), plus SRV_ROUTE_OTHER for requests
 * that match no row. The table holds fewer than SRV_ROUTE_OTHER rows (checked at compile time). */
typedef int srv_route;
#define SRV_ROUTE_COUNT 48
#define SRV_ROUTE_OTHER (SRV_ROUTE_COUNT - 1)

typedef enum {
    SRV_STAGE_QUEUE = 0,
    SRV_STAGE_DECODE,
    SRV_STAGE_COMPUTE,
    SRV_STAGE_ENCODE,
    SRV_STAGE_COUNT
} srv_stage;

#define SRV__REASON_COUNT_ONE(name, text) +1
enum { SRV_REASON_COUNT = 0 API_REASON_LIST(SRV__REASON_COUNT_ONE) };
#undef SRV__REASON_COUNT_ONE

#define SRV_HIST_BUCKETS 16
#define SRV_CODE_SLOTS   17

typedef struct {
    atomic_uint_fast64_t bucket[SRV_HIST_BUCKETS + 1]; /* last: above the largest bound */
    atomic_uint_fast64_t sum_ns;
} srv_hist;

/* Counters of the whole daemon. Every field is atomic: any thread may update it, and /metrics
 * reads it without a lock (each value is exact; values may be a few requests apart). */
/* The Triton (nv_inference_*) counters of one model of the KServe v2 routes, which also
 * answer GET /v2/models/{m}/stats. Slot 0 is "sdpa", slot i + 1 the i-th registered layer;
 * models beyond SRV_MODELS_MAX are not counted. Durations in nanoseconds. */
#define SRV_MODELS_MAX 64

typedef enum {
    SRV_FAIL_REJECTED = 0, /* queue or memory full, draining, past the deadline */
    SRV_FAIL_CANCELED,     /* the client went away */
    SRV_FAIL_BACKEND,      /* the engine failed (500, out of memory) */
    SRV_FAIL_OTHER,        /* the request was invalid */
    SRV_FAIL_COUNT
} srv_fail_reason;

typedef struct {
    atomic_uint_fast64_t success, success_ns, fail, fail_ns, failure[SRV_FAIL_COUNT];
    atomic_uint_fast64_t inferences, executions, last_ms;
    atomic_uint_fast64_t queue_count, queue_ns, input_ns, infer_ns, output_ns;
    atomic_int_fast64_t pending; /* admitted, not yet running */
} srv_model_stats;

typedef struct {
    atomic_uint_fast64_t requests[SRV_ROUTE_COUNT][SRV_CODE_SLOTS];
    srv_hist duration[SRV_ROUTE_COUNT];
    srv_hist stage[SRV_STAGE_COUNT];
    atomic_uint_fast64_t rejected[SRV_REASON_COUNT];
    atomic_uint_fast64_t bytes_in, bytes_out;
    atomic_uint_fast64_t slow_clients, hangups;
    srv_model_stats model[SRV_MODELS_MAX];
} srv_metrics;

/* Values sampled at scrape time. */
typedef struct {
    int64_t queued, running, inflight, suspended;
    int64_t memory_in_use, memory_budget, max_queue, buffer_cache;
    int threads;
    bool ready;
} srv_gauges;

const char *srv__route_label(srv_route route);
void srv__metrics_request(srv_metrics *m, srv_route route, int status, int64_t total_ns,
                          uint64_t bytes_in, uint64_t bytes_out);
void srv__metrics_stage(srv_metrics *m, srv_stage stage, int64_t ns);
void srv__metrics_rejected(srv_metrics *m, api_reason reason);
/* Appends the Prometheus text exposition of `m` and `g` to `b`. */
void srv__metrics_render(const srv_metrics *m, const srv_gauges *g, srv_buf *b);

/* The stats slot of a v2 model (0 "sdpa", i + 1 the i-th layer of `models`), or -1. */
int srv__metrics_model_slot(const api_models *models, const char *name);
/* Counts one finished v2 inference of the model in `slot`: success (status 200) with the
 * reply's stage timings and batch, or a failure by reason. */
void srv__metrics_infer(srv_metrics *m, int slot, int status, api_reason reason, int64_t total_ns,
                        int64_t queue_ns, const api_reply *reply);
/* Appends Triton's nv_inference_* families, labelled model and version, for every model. */
void srv__metrics_render_models(const srv_metrics *m, const api_models *models, srv_buf *b);
/* Appends GET /v2/models[/{m}]/stats's {"model_stats": [...]} for one slot, or all (-1). */
void srv__metrics_stats_json(const srv_metrics *m, const api_models *models, int slot, srv_buf *b);

/* ---- Requests and connections ------------------------------------------------------------ */

typedef enum {
    REQ_RECEIVING = 0, /* MHD thread: headers and body arriving */
    REQ_QUEUED,        /* suspended, submitted to the pool, no worker yet */
    REQ_RUNNING,       /* a worker runs api_attention */
    REQ_DONE,          /* reply ready, connection resumed (or about to be) */
} srv_req_state;

typedef enum {
    CONN_IDLE = 0,  /* between requests: a request line must arrive within the idle timeout */
    CONN_HEADERS,   /* request line seen: headers within the header timeout */
    CONN_RECEIVING, /* headers seen: the body within the receive timeout (from the request line) */
    CONN_BUSY,      /* request complete: computing or answering; no deadline of ours */
} srv_conn_phase;

typedef struct srv_server srv_server;
typedef struct srv_req srv_req;

/* One client connection, created at MHD_CONNECTION_NOTIFY_STARTED and freed at ..._CLOSED.
 * Fields after `fd` are guarded by srv_server.watch_mu. libmicrohttpd closes the socket only
 * after the CLOSED notification, so the watcher may shutdown() `fd` while holding the lock. */
typedef struct srv_conn {
    int fd;
    srv_conn_phase phase;
    int64_t since_ns;
    bool shut;                /* the watcher shut it down (slow client, or end-of-file missed) */
    bool eof_seen;            /* the watcher saw end-of-file with no unread byte (see watch.c, 6) */
    int64_t eof_since_ns;     /* since_ns when it was seen: unchanged means no progress since */
    srv_conn_phase eof_phase; /* and the phase then */
    atomic_uint_fast64_t received; /* body bytes of the current request (MHD thread adds) */
    srv_req *req;                  /* the request being received on it, if any */
    struct srv_conn *prev, *next;
} srv_conn;

#define SRV_REQUEST_ID_MAX 128
#define SRV_PATH_MAX       256 /* a longer path matches no route (404) */

/* Path parameters extracted by the route matcher: each "{name}" segment of the route's pattern.
 * A value is 1 to SRV_PARAM_MAX bytes of [A-Za-z0-9_.-] (a model name's alphabet). */
#define SRV_PARAMS_MAX     4
#define SRV_PARAM_MAX      63
#define SRV_PARAM_NAME_MAX 15

typedef struct {
    int count;
    struct {
        char name[SRV_PARAM_NAME_MAX + 1];
        char value[SRV_PARAM_MAX + 1];
    } p[SRV_PARAMS_MAX];
    char bad[SRV_PARAM_NAME_MAX + 1]; /* non-empty: the path had this segment, but its value
                                         is not a valid name (answered 400) */
} srv_params;

struct srv_req {
    atomic_int refs;
    atomic_int state; /* srv_req_state */
    srv_server *srv;
    struct MHD_Connection *conn;
    srv_conn *sc;

    /* Set on the MHD thread while receiving. */
    bool framing_checked; /* the first call of the access handler ran */
    bool seen_headers;    /* routing and header checks ran */
    srv_route route;
    bool path_too_long;     /* longer than SRV_PATH_MAX - 1: matches no route */
    const char *bad_target; /* srv__target_check's finding, answered 400 (static text) */
    srv_params params;      /* filled by the route matcher */
    char method[12];
    char path[SRV_PATH_MAX];
    char id[SRV_REQUEST_ID_MAX + 1];
    char content_type[256];
    bool has_content_type;
    /* Worker routes: more headers api/ needs (v2.c captures them; "" when absent). */
    char content_encoding[32], accept_encoding[256], infer_header_len[32];
    bool has_model_slot; /* a v2 inference of a known model: counted in its stats slot */
    int model_slot;
    atomic_bool pending; /* counted in the model's pending gauge (admitted, not running yet) */
    bool body_expected;  /* Content-Length > 0 or chunked: an early answer closes the connection */
    bool has_length;     /* a Content-Length header was given */
    bool seen_body_end;  /* the last upload call arrived */
    size_t content_length;
    srv_buf body;
    size_t reserved;       /* bytes of the memory budget held for the body */
    size_t reply_reserved; /* bytes held for the reply text until it is sent */
    uint64_t bytes_in;     /* body bytes received, including those drained after a rejection */
    int pending_status;    /* > 0: rejected while receiving; answer this once the body is in */
    api_reason pending_reason;
    char pending_msg[200];
    int64_t start_ns, submit_ns, run_ns, done_ns;
    int64_t queue_deadline_ns; /* written before the handoff, then only read (watcher) */
    int64_t own_timeout_ms;    /* the body's own timeout when it is tighter than
                                  --request-timeout-ms, else 0; set with queue_deadline_ns */

    /* Handed between threads as the state machine says. */
    eng_ctl ctl;
    api_reply reply;
    atomic_bool drain_cancelled; /* cancelled by the drain timeout: answer 503 */
    atomic_bool client_gone;     /* the client hung up while the request was suspended */

    /* Set when the response is queued (MHD thread). */
    int status;
    api_reason reason;
    uint64_t bytes_out;
    bool responded;

    bool http11;        /* the request line says HTTP/1.1: an interim 1xx reply may be sent */
    bool sent_directly; /* a worker wrote the reply to the socket (half_close.c) */
    bool admin;         /* arrived on --admin-port: only health and metrics are served */
    bool send_timer;    /* the connection's timeout is --send-timeout-s until completion */
    int cut_status;     /* > 0: a reply of this status was queued but never delivered whole */

    /* Watcher bookkeeping, guarded by srv_server.watch_mu. */
    bool watched, hup, dropped_slow;
    bool probed; /* the watcher sent a "100 Continue" to tell a half-close from a hang-up */
    srv_req *wprev, *wnext;
};

struct srv_server {
    /* Settings, fixed after start. */
    char *host;
    int port;
    int threads;
    size_t max_body_bytes;
    int64_t max_queue;
    int64_t request_timeout_ns, header_timeout_ns, receive_timeout_ns, idle_timeout_ns;
    int64_t drain_timeout_ns;
    unsigned send_timeout_s, idle_timeout_s; /* libmicrohttpd's idle timer while a reply is
                                                written, and otherwise */
    size_t min_upload_rate;                  /* --min-upload-rate */
    size_t max_memory_bytes;
    api_limits limits;
    api_models *models; /* the registered layers: built before listening, read-only after */

    api_budget *budget;
    eng_pool *pool;
    struct MHD_Daemon *mhd;
    struct MHD_Daemon *admin_mhd; /* --admin-port's listener, or NULL */
    int admin_port;
    srv_metrics metrics;

    atomic_bool draining;          /* readiness 503, new requests 503 */
    atomic_bool drain_expired;     /* the drain timeout passed: cancel what is left */
    atomic_int_fast64_t active;    /* requests between the URI callback and completion */
    atomic_int_fast64_t admitted;  /* jobs in the pool's queue or running (--max-queue) */
    atomic_int_fast64_t queued;    /* jobs waiting for a worker, not yet answered */
    atomic_int_fast64_t running;   /* jobs a worker is running */
    atomic_int_fast64_t suspended; /* connections suspended and not yet resumed */
    uint64_t id_seed;
    atomic_uint_fast64_t id_counter;

    /* The watcher (watch.c). */
    pthread_t watch_thread;
    bool watch_started;
    pthread_mutex_t watch_mu;
    int wake_fd; /* eventfd: wakes the watcher's poll */
    bool watch_stop;
    srv_conn *conns;     /* every open connection */
    srv_req *watched;    /* every suspended request */
    int64_t eof_scan_ns; /* when the watcher last looked for missed end-of-file */

    srv_tls *tls;   /* NULL: plain HTTP (tls.c) */
    srv_auth *auth; /* NULL: no bearer tokens (auth.c) */
};

/* Drops one reference; the last one frees the request. Any thread. */
void srv__req_unref(srv_req *req);

/* libmicrohttpd callbacks (http.c). */
enum MHD_Result srv__mhd_access(void *cls, struct MHD_Connection *conn, const char *url,
                                const char *method, const char *version, const char *upload_data,
                                size_t *upload_data_size, void **con_cls);
void *srv__mhd_uri(void *cls, const char *uri, struct MHD_Connection *conn);
void srv__mhd_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                        enum MHD_RequestTerminationCode toe);
void srv__mhd_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                         enum MHD_ConnectionNotificationCode code);

/* The watcher (watch.c). */
srv_status srv__watch_start(srv_server *s);
void srv__watch_stop(srv_server *s);
void srv__watch_wake(srv_server *s);
/* Starts watching a suspended request (MHD thread, after MHD_suspend_connection). */
void srv__watch_add(srv_server *s, srv_req *req);
/* Stops watching it; afterwards the watcher never touches it. Any thread. */
void srv__watch_remove(srv_server *s, srv_req *req);

/* ---- Responses (http.c), for route handlers on the MHD thread --------------------------- */

typedef struct {
    const char *allow;          /* Allow header, for 405 */
    int retry_after_s;          /* > 0: Retry-After header */
    bool close;                 /* Connection: close */
    const char *const *headers; /* NULL, or more headers: name, value, ..., NULL */
} srv_resp_opts;

/* Queues `body` (malloc'd, taken over even on failure; NULL: empty) as the response;
 * `content_type` NULL means application/json; `o` may be NULL. */
enum MHD_Result srv__respond(srv_req *req, int status, const char *content_type, char *body,
                             size_t len, const srv_resp_opts *o);
/* Queues a reply built by api/ (status, Content-Type, body and rejection reason). */
enum MHD_Result srv__respond_api(srv_req *req, api_reply *reply);
/* Queues a copy of the NUL-terminated `text`. */
enum MHD_Result srv__respond_text(srv_req *req, int status, const char *content_type,
                                  const char *text, const srv_resp_opts *o);
/* Queues an error body: {"error": {"code", "message"}} on native routes, {"error": "message"}
 * on /v2/ routes (the Open Inference Protocol's form). */
enum MHD_Result srv__respond_error(srv_req *req, int status, api_reason reason,
                                   const srv_resp_opts *o, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* ---- Routes (routes.c) ------------------------------------------------------------------- */

/* Answers a request on the MHD thread, from its headers alone (cheap work only: no engine
 * call, nothing that blocks). Must queue a response with srv__respond*. */
typedef enum MHD_Result (*srv_answer_fn)(srv_server *s, srv_req *req);
/* Answers a request on an engine worker, with its whole body in `call`: fills `reply` (always,
 * like api_attention). `req` is read-only here (its params, method, path). */
typedef void (*srv_work_fn)(const srv_req *req, const api_call *call, api_reply *reply);

/* One row of the route table. `pattern` is literal segments and "{name}" segments (one path
 * segment each, bound into srv_req.params); it is also the metrics and log label. A GET or
 * HEAD request runs `answer` on the MHD thread; any other allowed method runs `work` on an
 * engine worker when the row has one (else `answer`). A worker route whose body may set its
 * own timeout has `timeout`, which reads it on the MHD thread before the request is queued
 * (api_timeout_peek), so that the deadline holds while the request waits for a worker. */
typedef struct {
    const char *pattern;
    const char *allow; /* allowed methods, as sent in the Allow header of a 405: "GET, HEAD" */
    srv_answer_fn answer;
    srv_work_fn work;
    int64_t (*timeout)(const api_call *call); /* NULL: the body sets no timeout */
} srv_route_def;

/* The route matching `path` (SRV_ROUTE_OTHER for none), with its parameters in *params. A path
 * whose shape matches a row but with an invalid parameter value still returns that row, with
 * params->bad naming the parameter. */
srv_route srv__route_find(const char *path, srv_params *params);
/* The row of `route`, or NULL for SRV_ROUTE_OTHER. */
const srv_route_def *srv__route_def(srv_route route);
/* Whether `method` is one of the row's allowed methods. */
bool srv__route_allows(const srv_route_def *rd, const char *method);
/* The value of path parameter `name` in `req`, or NULL. */
const char *srv__req_param(const srv_req *req, const char *name);

/* ---- The inspector page (page.c) --------------------------------------------------------- */

/* GET /: the page, with its CSP, ETag (304 on If-None-Match) and caching headers. */
enum MHD_Result srv__answer_page(srv_server *s, srv_req *req);

/* Generated at build time from server/assets/inspector.html by server/assets/embed_page.c
 * (build/gen/inspector_page.c): the page's bytes, a Content-Security-Policy allowing exactly its
 * inline style and script by their SHA-256, and a strong ETag (quotes included). */
extern const unsigned char srv_inspector_page[];
extern const size_t srv_inspector_page_len;
extern const char srv_inspector_csp[];
extern const char srv_inspector_etag[];

/* ---- KServe v2 routes (v2.c) ------------------------------------------------------------- */

/* GET /v2, /v2/models/{model}[/versions/{version}], .../ready, .../config, .../stats,
 * /v2/models/stats. */
enum MHD_Result srv__answer_v2_server(srv_server *s, srv_req *req);
enum MHD_Result srv__answer_v2_model(srv_server *s, srv_req *req);
enum MHD_Result srv__answer_v2_ready(srv_server *s, srv_req *req);
enum MHD_Result srv__answer_v2_config(srv_server *s, srv_req *req);
enum MHD_Result srv__answer_v2_stats(srv_server *s, srv_req *req);
/* POST .../infer on a worker, with the body's Content-Encoding undone and the reply
 * compressed as Accept-Encoding allows. */
void srv__work_v2_infer(const srv_req *req, const api_call *call, api_reply *reply);

/* For every worker route, on the MHD thread before the body is read: captures
 * Content-Encoding, Accept-Encoding and Inference-Header-Content-Length (answering 415 or 400
 * for values too long to keep) and the model's stats slot of a v2 inference. Returns MHD_YES
 * with *answered false when the request goes on. */
enum MHD_Result srv__capture_headers(srv_server *s, srv_req *req, bool *answered);
/* Copies what srv__capture_headers kept into the call (worker). */
void srv__call_headers(const srv_req *req, api_call *call);
/* The response headers of a worker's reply: Content-Encoding, Inference-Header-Content-Length,
 * Vary. Fills `headers` (name, value, ..., NULL; at least 7 slots) using `num` for the number. */
void srv__reply_headers(const api_reply *reply, const char **headers, char num[24]);
/* Model stats: admitted to the queue, started on a worker, completed (any thread). */
void srv__v2_admitted(srv_server *s, srv_req *req);
void srv__v2_started(srv_server *s, srv_req *req);
void srv__v2_completed(srv_server *s, srv_req *req, int status, api_reason reason, int64_t total_ns,
                       int64_t queue_ns);

/* ---- Request line and header checks (request_check.c) ---------------------------------- */

/* What srv__headers_scan found in a header block. */
typedef struct {
    const char *bad_name;    /* the first field name that is not a token, or that extends a framing
                                field (obs-fold glued on by libmicrohttpd); NULL: none */
    int n_host, n_infer_len; /* Host and Inference-Header-Content-Length fields */
} srv_header_scan;

/* Scans the request headers of `conn` (MHD thread, from the access handler). */
void srv__headers_scan(struct MHD_Connection *conn, srv_header_scan *scan);
/* Checks the raw request target as the URI callback receives it: NULL when sound, else what is
 * wrong (a static sentence for the 400). */
const char *srv__target_check(const char *uri);
/* The path of a request target in origin form: `target` itself, or for the absolute form
 * ("http://host:port/path?q") the part from the path on ("/" when empty). */
const char *srv__origin_path(const char *target);

/* ---- Half-closed clients (half_close.c) -------------------------------------------------- */

/* Whether the peer of a suspended request has sent its FIN and nothing else is unread. */
bool srv__peer_sent_fin(srv_req *req);
/* Writes req->reply to the socket of the request and records it as the response (status,
 * bytes, sent_directly; client_gone when the write failed); the connection must then close.
 * Called by the worker that owns a suspended request, before resuming it (it may block up to
 * --idle-timeout-s), or on the MHD thread for a small error reply (it then fits the empty
 * socket buffer at once). */
void srv__reply_direct(srv_req *req);

/* Fills req->reply with an error for a request that ends without running (watcher, worker). */
void srv__req_fail(srv_req *req, int status, api_reason reason, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* What set the deadline of a queued request, for the message of its 504 (buf: 64 bytes is
 * enough): "--request-timeout-ms 60000", or "the request's timeout of 100 ms" when its body's
 * own timeout was tighter. */
void srv__deadline_origin(const srv_server *s, const srv_req *req, char *buf, size_t size);

/* ---- TLS (tls.c) and bearer tokens (auth.c) ---------------------------------------------- */

/* Loads --tls-cert/--tls-key (and --tls-key-password-file, --tls-client-ca) and checks
 * --tls-priorities: SRV_OK with *out NULL when TLS is off, SRV_EINVAL with `err` naming the
 * flag and the file when something cannot be loaded. Main thread. */
srv_status srv__tls_new(const srv_config *cfg, srv_tls **out, char *err, size_t errlen);
/* Reads the certificate and key again; new handshakes get them, open connections keep theirs.
 * On failure the previous ones stay in use. Main thread. */
srv_status srv__tls_reload(srv_tls *t, char *err, size_t errlen);
void srv__tls_free(srv_tls *t);
/* The libmicrohttpd options that serve `t` (for MHD_OPTION_ARRAY; an empty list when `t` is
 * NULL), adding MHD_USE_TLS to *flags; NULL with `err` when another server already serves
 * TLS in this process. */
const struct MHD_OptionItem *srv__tls_options(srv_tls *t, unsigned *flags, char *err,
                                              size_t errlen);
/* "CN=...,O=... (chain of N, expires 2027-01-01T00:00:00Z)" for the start and reload lines. */
void srv__tls_describe(srv_tls *t, char *out, size_t outlen);

/* attnd --healthcheck over TLS: a handshake on the connected socket `fd` (nothing verified;
 * with --tls-client-ca the daemon's own certificate is presented), `req` sent, and up to
 * `out_len` bytes of the answer read into `out` before `deadline_ms` (CLOCK_MONOTONIC).
 * Returns the bytes read; 0 when the handshake or the exchange failed. */
size_t srv__tls_exchange(const srv_config *cfg, int fd, const char *req, size_t req_len, char *out,
                         size_t out_len, int64_t deadline_ms);

/* Loads --auth-token-file: SRV_OK with *out NULL when it is not set. Main thread. */
srv_status srv__auth_new(const srv_config *cfg, srv_auth **out, char *err, size_t errlen);
/* Reads the file again (*count: its tokens); on failure the previous tokens stay. */
srv_status srv__auth_reload(srv_auth *a, size_t *count, char *err, size_t errlen);
void srv__auth_free(srv_auth *a);
/* Whether `req` may go on: true without tokens, for the health probes and the page, and with
 * "Authorization: Bearer" and a configured token (compared in constant time). MHD thread. */
bool srv__auth_allows(srv_auth *a, const srv_req *req);
/* Sets req->pending_* to the 401 (the message never holds the token). */
void srv__auth_refuse(srv_req *req);
/* Loads s->tls and s->auth (security.c), logging what they serve. Main thread. */
srv_status srv__security_start(srv_server *s, const srv_config *cfg, char *err, size_t errlen);
/* The header of a 401: name, value, NULL (for srv_resp_opts.headers). */
extern const char *const srv__auth_challenge[];

#endif
