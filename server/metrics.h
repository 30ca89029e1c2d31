/*
 * metrics.h - the daemon's counters and histograms (metrics.c), their Prometheus text, and
 * Triton's per-model statistics of the KServe v2 routes.
 *
 * metrics.c knows nothing of routes, requests or connections: the files that see those update
 * the counters through the functions below (and the route table's statistics hooks, routes.h),
 * and the renderer learns each route's label from the caller (srv_route_names). Every counter
 * is a relaxed atomic: any thread may update one, and /metrics reads them without a lock (each
 * value is exact; values may be a few requests apart).
 */
#ifndef ATTND_SERVER_METRICS_H
#define ATTND_SERVER_METRICS_H

#include <stdatomic.h>

#include "api/api.h"
#include "server/server.h"

/* A route is the index of its row in the route table (routes.c). Metrics keep one series per
 * row, labelled with the row's pattern (never the raw path), plus SRV_ROUTE_OTHER for requests
 * that match no row. The table holds fewer than SRV_ROUTE_OTHER rows (checked at compile time). */
typedef int srv_route;
#define SRV_ROUTE_COUNT 48
#define SRV_ROUTE_OTHER (SRV_ROUTE_COUNT - 1)

typedef enum {
    SRV_STAGE_RECEIVE = 0, /* the request's first byte to its last (HTTP) */
    SRV_STAGE_QUEUE,
    SRV_STAGE_DECODE,
    SRV_STAGE_COMPUTE,
    SRV_STAGE_ENCODE,
    SRV_STAGE_SEND, /* the reply's handoff to its last byte written (HTTP) */
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

/* gRPC methods (api_grpc_method) and status codes counted. */
#define SRV_GRPC_METHODS 12
#define SRV_GRPC_CODES   17

/* Counters of the whole daemon. */
typedef struct {
    atomic_uint_fast64_t requests[SRV_ROUTE_COUNT][SRV_CODE_SLOTS];
    srv_hist duration[SRV_ROUTE_COUNT];
    srv_hist stage[SRV_STAGE_COUNT];
    atomic_uint_fast64_t rejected[SRV_REASON_COUNT];
    atomic_uint_fast64_t bytes_in, bytes_out;
    atomic_uint_fast64_t slow_clients, hangups;
    atomic_uint_fast64_t work_ns, wasted_ns; /* worker time on requests; of it, on late ones */
    atomic_uint_fast64_t batches, batched;   /* groups run from the lanes, and their requests */
    srv_model_stats model[SRV_MODELS_MAX];
    atomic_uint_fast64_t grpc_requests[SRV_GRPC_METHODS][SRV_GRPC_CODES]; /* --grpc-port */
    atomic_uint_fast64_t grpc_ns[SRV_GRPC_METHODS];
    srv_hist session_step; /* compute time of session steps (attention, truncate, fork) */
    atomic_uint_fast64_t session_tickets; /* requests given their place in a session's order */
} srv_metrics;

/* Values sampled at scrape time. */
typedef struct {
    int64_t queued, running, inflight, suspended;
    int64_t memory_in_use, memory_budget, max_queue, buffer_cache;
    int64_t upload_bytes, upload_rate; /* bodies' bytes on their way, their learned rate */
    int threads, io_threads;
    bool ready;
} srv_gauges;

/* What the renderer needs of the route table: each route's label (SRV_ROUTE_OTHER's too), and
 * whether its duration series is shown before its first request (worker routes, so that
 * dashboards find them at start). */
typedef struct {
    const char *(*label)(srv_route route);
    bool (*always_shown)(srv_route route);
} srv_route_names;

void srv__metrics_request(srv_metrics *m, srv_route route, int status, int64_t total_ns,
                          uint64_t bytes_in, uint64_t bytes_out);
void srv__metrics_stage(srv_metrics *m, srv_stage stage, int64_t ns);
/* Counts one gRPC call (--grpc-port) of `method` (api_grpc_method) ended with `grpc_code`. */
void srv__metrics_grpc(srv_metrics *m, int method, int grpc_code, int64_t total_ns,
                       uint64_t bytes_in, uint64_t bytes_out);
void srv__metrics_rejected(srv_metrics *m, api_reason reason);
/* One connection closed because its client was too slow (the watcher), or one client that hung
 * up while its request was suspended or incomplete. */
void srv__metrics_slow_client(srv_metrics *m);
void srv__metrics_hangup(srv_metrics *m);
/* `ns` of worker time went to one request; `deadline_missed`: it still ended 504. */
void srv__metrics_work(srv_metrics *m, int64_t ns, bool deadline_missed);
/* A group of `n` requests ran from a lane (dynamic batching). */
void srv__metrics_batch(srv_metrics *m, int n);
/* Appends the Prometheus text exposition of `m` and `g` to `b`. */
void srv__metrics_render(const srv_metrics *m, const srv_gauges *g, const srv_route_names *routes,
                         api_buf *b);

/* Counts the compute time of one session step that succeeded. */
void srv__metrics_session_step(srv_metrics *m, int64_t compute_ns);
/* Counts one request admitted with a ticket of a session or a v2 sequence (its place in the
 * order in which their steps apply). */
void srv__metrics_session_ticket(srv_metrics *m);
/* Appends the attnd_sessions_* and attnd_kv_cache_* families (sessions off: nothing). */
void srv__metrics_render_sessions(const srv_metrics *m, const api_sessions_stats *st, bool on,
                                  api_buf *b);

/* The stats slot of a v2 model (0 "sdpa", i + 1 the i-th layer of `models`), or -1. */
int srv__metrics_model_slot(const api_models *models, const char *name);
/* A v2 inference of the model in `slot` was admitted to the queue (+1) or left it (-1). */
void srv__metrics_model_pending(srv_metrics *m, int slot, int delta);
/* Counts one finished v2 inference of the model in `slot`: success (status 200) with the
 * reply's stage timings and batch, or a failure by reason. Its duration is the handler's
 * (srv__job_handler_ns), as Triton's request duration leaves out the wire. */
void srv__metrics_infer(srv_metrics *m, int slot, int status, api_reason reason, int64_t handler_ns,
                        int64_t queue_ns, const api_reply *reply);
/* Appends Triton's nv_inference_* families, labelled model and version, for every model. */
void srv__metrics_render_models(const srv_metrics *m, const api_models *models, api_buf *b);
/* The statistics of one slot, or all (-1), as api/ writes them (api_v2_statistics_json,
 * api_grpc_statistics): a malloc'd array of *n (names borrowed from `models`); NULL when memory
 * runs out. */
api_model_stats *srv__metrics_model_stats(const srv_metrics *m, const api_models *models, int slot,
                                          size_t *n);

#endif
