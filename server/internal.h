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

/* ---- Growable buffers (buf.c) ------------------------------------------------------------ */

/* A byte buffer that grows up to `limit`. A failed append sets `failed` and leaves the buffer
 * as it was, so a series of appends can be checked once at the end. */
typedef struct {
    char *data;
    size_t len, cap, limit;
    bool failed;
} srv_buf;

void srv__buf_init(srv_buf *b, size_t limit);
void srv__buf_free(srv_buf *b);
/* Ensures room for `extra` more bytes: SRV_OK, SRV_ETOOBIG (past the limit) or SRV_ENOMEM. */
srv_status srv__buf_reserve(srv_buf *b, size_t extra);
/* Grows the allocation to exactly `cap` bytes (data plus the NUL), for callers that account
 * for every allocated byte (request bodies against the memory budget). */
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

typedef enum {
    SRV_ROUTE_ATTENTION = 0,
    SRV_ROUTE_LIVE,
    SRV_ROUTE_READY,
    SRV_ROUTE_METRICS,
    SRV_ROUTE_OTHER,
    SRV_ROUTE_COUNT
} srv_route;

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
#define SRV_CODE_SLOTS   16

typedef struct {
    atomic_uint_fast64_t bucket[SRV_HIST_BUCKETS + 1]; /* last: above the largest bound */
    atomic_uint_fast64_t sum_ns;
} srv_hist;

/* Counters of the whole daemon. Every field is atomic: any thread may update it, and /metrics
 * reads it without a lock (each value is exact; values may be a few requests apart). */
typedef struct {
    atomic_uint_fast64_t requests[SRV_ROUTE_COUNT][SRV_CODE_SLOTS];
    srv_hist duration[SRV_ROUTE_COUNT];
    srv_hist stage[SRV_STAGE_COUNT];
    atomic_uint_fast64_t rejected[SRV_REASON_COUNT];
    atomic_uint_fast64_t bytes_in, bytes_out;
    atomic_uint_fast64_t slow_clients, hangups;
} srv_metrics;

/* Values sampled at scrape time. */
typedef struct {
    int64_t queued, running, inflight, suspended;
    int64_t memory_in_use, memory_budget, max_queue;
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

/* ---- Requests and connections ------------------------------------------------------------ */

typedef enum {
    REQ_RECEIVING = 0, /* MHD thread: headers and body arriving */
    REQ_QUEUED,        /* suspended, submitted to the pool, no worker yet */
    REQ_RUNNING,       /* a worker runs api_attention */
    REQ_DONE,          /* reply ready, connection resumed (or about to be) */
} srv_req_state;

typedef enum {
    CONN_IDLE = 0,  /* between requests: a request line must arrive within the idle timeout */
    CONN_RECEIVING, /* request line seen: headers and body within the receive timeout */
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
    bool shut;    /* the watcher shut it down (slow client) */
    srv_req *req; /* the request being received on it, if any */
    struct srv_conn *prev, *next;
} srv_conn;

#define SRV_REQUEST_ID_MAX 128

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
    char method[12];
    char path[128];
    char id[SRV_REQUEST_ID_MAX + 1];
    char content_type[256];
    bool has_content_type;
    bool body_expected; /* Content-Length > 0 or chunked: an early answer closes the connection */
    bool has_length;    /* a Content-Length header was given */
    bool seen_body_end; /* the last upload call arrived */
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

    /* Watcher bookkeeping, guarded by srv_server.watch_mu. */
    bool watched, hup, dropped_slow;
    srv_req *wprev, *wnext;
};

struct srv_server {
    /* Settings, fixed after start. */
    char *host;
    int port;
    int threads;
    size_t max_body_bytes;
    int64_t max_queue;
    int64_t request_timeout_ns, receive_timeout_ns, idle_timeout_ns, drain_timeout_ns;
    size_t max_memory_bytes;
    api_limits limits;

    api_budget *budget;
    eng_pool *pool;
    struct MHD_Daemon *mhd;
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
    srv_conn *conns;  /* every open connection */
    srv_req *watched; /* every suspended request */
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

/* Fills req->reply with an error for a request that ends without running (watcher, worker). */
void srv__req_fail(srv_req *req, int status, api_reason reason, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
