/*
 * metrics.c - the daemon's counters and histograms, and their Prometheus text exposition.
 *
 * Everything is a relaxed atomic: request paths update counters without a lock, and a scrape
 * reads them one by one. A histogram keeps non-cumulative bucket counts and derives the
 * cumulative `le` series, `_count` and `+Inf` from the same reads, so one scrape is always
 * self-consistent even while requests finish.
 */
#include "server/metrics.h"

#include <stdio.h>
#include <stdlib.h>

#include <stddef.h>
#include <string.h>
#include <time.h>

/* Upper bounds in seconds: half a millisecond (health checks) to a minute (long sequences). */
static const double bucket_le[SRV_HIST_BUCKETS] = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};

/* Status codes with their own series; anything else is counted as code="other". */
static const int code_slots[SRV_CODE_SLOTS - 1] = {200, 400, 401, 404, 405, 408, 411, 413,
                                                   415, 422, 429, 499, 500, 501, 503, 504};

static const char *const stage_labels[SRV_STAGE_COUNT] = {"receive", "queue",  "decode",
                                                          "compute", "encode", "send"};

static size_t code_slot(int status)
{
    for (size_t i = 0; i < SRV_CODE_SLOTS - 1; i++) {
        if (code_slots[i] == status)
            return i;
    }
    return SRV_CODE_SLOTS - 1;
}

static void hist_add(srv_hist *h, int64_t ns)
{
    size_t i = 0;
    double secs;
    if (ns < 0)
        ns = 0;
    secs = (double)ns / 1e9;
    while (i < SRV_HIST_BUCKETS && secs > bucket_le[i])
        i++;
    atomic_fetch_add_explicit(&h->bucket[i], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_ns, (uint_fast64_t)ns, memory_order_relaxed);
}

void srv__metrics_request(srv_metrics *m, srv_route route, int status, int64_t total_ns,
                          uint64_t bytes_in, uint64_t bytes_out)
{
    if ((unsigned)route >= SRV_ROUTE_COUNT)
        route = SRV_ROUTE_OTHER;
    atomic_fetch_add_explicit(&m->requests[route][code_slot(status)], 1, memory_order_relaxed);
    hist_add(&m->duration[route], total_ns);
    atomic_fetch_add_explicit(&m->bytes_in, bytes_in, memory_order_relaxed);
    atomic_fetch_add_explicit(&m->bytes_out, bytes_out, memory_order_relaxed);
}

void srv__metrics_stage(srv_metrics *m, srv_stage stage, int64_t ns)
{
    if ((unsigned)stage < SRV_STAGE_COUNT)
        hist_add(&m->stage[stage], ns);
}

void srv__metrics_rejected(srv_metrics *m, api_reason reason)
{
    if (reason != API_REASON_NONE && (unsigned)reason < SRV_REASON_COUNT)
        atomic_fetch_add_explicit(&m->rejected[reason], 1, memory_order_relaxed);
}

static uint64_t load(const atomic_uint_fast64_t *v)
{
    return (uint64_t)atomic_load_explicit(v, memory_order_relaxed);
}

static void family(api_buf *b, const char *name, const char *type, const char *help)
{
    api_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* One histogram series set; `labels` is "" or `key="value",`. */
static void hist_render(api_buf *b, const char *name, const char *labels, const srv_hist *h)
{
    uint64_t counts[SRV_HIST_BUCKETS + 1], cum = 0;
    for (size_t i = 0; i <= SRV_HIST_BUCKETS; i++)
        counts[i] = load(&h->bucket[i]);
    for (size_t i = 0; i < SRV_HIST_BUCKETS; i++) {
        cum += counts[i];
        api_buf_printf(b, "%s_bucket{%sle=\"%g\"} %llu\n", name, labels, bucket_le[i],
                       (unsigned long long)cum);
    }
    cum += counts[SRV_HIST_BUCKETS];
    api_buf_printf(b, "%s_bucket{%sle=\"+Inf\"} %llu\n", name, labels, (unsigned long long)cum);
    /* Labels end with a comma for the bucket series; _sum and _count need them without it. */
    if (labels[0]) {
        size_t n = strlen(labels) - 1;
        api_buf_printf(b, "%s_sum{%.*s} %.9f\n%s_count{%.*s} %llu\n", name, (int)n, labels,
                       (double)load(&h->sum_ns) / 1e9, name, (int)n, labels,
                       (unsigned long long)cum);
    } else {
        api_buf_printf(b, "%s_sum %.9f\n%s_count %llu\n", name, (double)load(&h->sum_ns) / 1e9,
                       name, (unsigned long long)cum);
    }
}

static uint64_t hist_count(const srv_hist *h)
{
    uint64_t n = 0;
    for (size_t i = 0; i <= SRV_HIST_BUCKETS; i++)
        n += load(&h->bucket[i]);
    return n;
}

/* A label value with the characters the exposition format escapes (\\, " and newline)
 * dropped: CPU brand strings never hold them, and a metric must parse whatever cpuid says. */
static void label_clean(char *dst, size_t n, const char *src)
{
    size_t o = 0;
    for (; *src && o + 1 < n; src++)
        if (*src != '\\' && *src != '"' && *src != '\n')
            dst[o++] = *src;
    dst[o] = '\0';
}

static void engine_info_render(api_buf *b)
{
    eng_engine_info info;
    char cpu[sizeof info.cpu], core[sizeof info.openblas_core];
    eng_engine_info_get(&info);
    label_clean(cpu, sizeof cpu, info.cpu);
    label_clean(core, sizeof core, info.openblas_core);
    family(b, "attnd_engine_info", "gauge",
           "What the engine computes with: its kernel set, its bf16 products, OpenBLAS's own "
           "core and the CPU.");
    api_buf_printf(b,
                   "attnd_engine_info{kernels=\"%s\",bf16=\"%s\",openblas_core=\"%s\","
                   "cpu=\"%s\"} 1\n",
                   info.kernels, info.bf16, core, cpu);
}

void srv__metrics_slow_client(srv_metrics *m)
{
    atomic_fetch_add_explicit(&m->slow_clients, 1, memory_order_relaxed);
}

void srv__metrics_hangup(srv_metrics *m)
{
    atomic_fetch_add_explicit(&m->hangups, 1, memory_order_relaxed);
}

void srv__metrics_work(srv_metrics *m, int64_t ns, bool deadline_missed)
{
    uint64_t v = ns > 0 ? (uint64_t)ns : 0;
    atomic_fetch_add_explicit(&m->work_ns, v, memory_order_relaxed);
    if (deadline_missed)
        atomic_fetch_add_explicit(&m->wasted_ns, v, memory_order_relaxed);
}

void srv__metrics_batch(srv_metrics *m, int n)
{
    atomic_fetch_add_explicit(&m->batches, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&m->batched, (uint64_t)n, memory_order_relaxed);
}

_Static_assert(SRV_GRPC_METHODS == API_GRPC_HEALTH_CHECK + 1, "a counter per gRPC method");

void srv__metrics_grpc(srv_metrics *m, int method, int grpc_code, int64_t total_ns,
                       uint64_t bytes_in, uint64_t bytes_out)
{
    if (method < 0 || method >= SRV_GRPC_METHODS || grpc_code < 0 || grpc_code >= SRV_GRPC_CODES)
        return;
    atomic_fetch_add_explicit(&m->grpc_requests[method][grpc_code], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&m->grpc_ns[method], total_ns > 0 ? (uint64_t)total_ns : 0,
                              memory_order_relaxed);
    atomic_fetch_add_explicit(&m->bytes_in, bytes_in, memory_order_relaxed);
    atomic_fetch_add_explicit(&m->bytes_out, bytes_out, memory_order_relaxed);
}

/* The gRPC port's calls in attnd_requests_total: protocol="grpc", the method as the route and
 * the gRPC status code. */
static void grpc_render(const srv_metrics *m, api_buf *b)
{
    for (int r = 0; r < SRV_GRPC_METHODS; r++)
        for (int c = 0; c < SRV_GRPC_CODES; c++) {
            uint64_t v = load(&m->grpc_requests[r][c]);
            if (v > 0)
                api_buf_printf(b,
                               "attnd_requests_total{protocol=\"grpc\",route=\"%s\",code=\"%d\"} "
                               "%llu\n",
                               api_grpc_method_name((api_grpc_method)r), c, (unsigned long long)v);
        }
}

void srv__metrics_render(const srv_metrics *m, const srv_gauges *g, const srv_route_names *routes,
                         api_buf *b)
{
    char labels[160];

    engine_info_render(b);

    family(b, "attnd_requests_total", "counter",
           "Requests answered: HTTP by route and status code; gRPC (protocol=\"grpc\") by method "
           "and gRPC status code.");
    for (int r = 0; r < SRV_ROUTE_COUNT; r++) {
        for (size_t c = 0; c < SRV_CODE_SLOTS; c++) {
            uint64_t v = load(&m->requests[r][c]);
            if (v == 0)
                continue;
            if (c < SRV_CODE_SLOTS - 1)
                api_buf_printf(b, "attnd_requests_total{route=\"%s\",code=\"%d\"} %llu\n",
                               routes->label(r), code_slots[c], (unsigned long long)v);
            else
                api_buf_printf(b, "attnd_requests_total{route=\"%s\",code=\"other\"} %llu\n",
                               routes->label(r), (unsigned long long)v);
        }
    }
    grpc_render(m, b);

    family(b, "attnd_request_duration_seconds", "histogram",
           "Time from the request line to the queued response, by route.");
    for (int r = 0; r < SRV_ROUTE_COUNT; r++) {
        /* Worker routes always show their series, so that dashboards find them at start. */
        if (hist_count(&m->duration[r]) == 0 && !routes->always_shown(r))
            continue;
        snprintf(labels, sizeof labels, "route=\"%s\",", routes->label(r));
        hist_render(b, "attnd_request_duration_seconds", labels, &m->duration[r]);
    }

    family(b, "attnd_request_stage_seconds", "histogram",
           "Time attention requests spent in each stage: queue (waiting for a worker), decode, "
           "compute, encode.");
    for (int st = 0; st < SRV_STAGE_COUNT; st++) {
        snprintf(labels, sizeof labels, "stage=\"%s\",", stage_labels[st]);
        hist_render(b, "attnd_request_stage_seconds", labels, &m->stage[st]);
    }

    family(b, "attnd_rejected_total", "counter",
           "Requests that failed, by reason (queue_full, memory, deadline, cancelled, draining, "
           "too_large, bad_request, internal, unauthorized).");
    for (int r = 1; r < SRV_REASON_COUNT; r++)
        api_buf_printf(b, "attnd_rejected_total{reason=\"%s\"} %llu\n",
                       api_reason_str((api_reason)r), (unsigned long long)load(&m->rejected[r]));

    family(b, "attnd_queue_depth", "gauge", "Attention requests waiting for an engine worker.");
    api_buf_printf(b, "attnd_queue_depth %lld\n", (long long)g->queued);
    family(b, "attnd_running_requests", "gauge", "Attention requests running on engine workers.");
    api_buf_printf(b, "attnd_running_requests %lld\n", (long long)g->running);
    family(b, "attnd_inflight_requests", "gauge",
           "HTTP requests in progress: receiving, queued, running or being answered.");
    api_buf_printf(b, "attnd_inflight_requests %lld\n", (long long)g->inflight);
    family(b, "attnd_max_queue", "gauge", "The admission limit (--max-queue).");
    api_buf_printf(b, "attnd_max_queue %lld\n", (long long)g->max_queue);
    family(b, "attnd_worker_threads", "gauge", "Engine worker threads.");
    api_buf_printf(b, "attnd_worker_threads %d\n", g->threads);
    family(b, "attnd_io_threads", "gauge", "libmicrohttpd threads serving --port (--io-threads).");
    api_buf_printf(b, "attnd_io_threads %d\n", g->io_threads);
    family(b, "attnd_upload_bytes_in_flight", "gauge",
           "Body bytes still to arrive on the requests admitted from their headers "
           "(bounded by --max-upload-bytes).");
    api_buf_printf(b, "attnd_upload_bytes_in_flight %lld\n", (long long)g->upload_bytes);
    family(b, "attnd_upload_rate_bytes_per_second", "gauge",
           "The rate the daemon takes bodies in, learned from recent bodies of 256 KiB or more, "
           "which admission predicts a body's arrival from (0: none in the last 10 s).");
    api_buf_printf(b, "attnd_upload_rate_bytes_per_second %lld\n", (long long)g->upload_rate);
    family(b, "attnd_memory_reserved_bytes", "gauge",
           "Bytes of the memory budget reserved by requests in progress.");
    api_buf_printf(b, "attnd_memory_reserved_bytes %lld\n", (long long)g->memory_in_use);
    family(b, "attnd_memory_budget_bytes", "gauge", "The memory budget (--max-memory-bytes).");
    api_buf_printf(b, "attnd_memory_budget_bytes %lld\n", (long long)g->memory_budget);
    family(b, "attnd_buffer_cache_bytes", "gauge",
           "Freed request buffers kept mapped for reuse (--buffer-cache-bytes).");
    api_buf_printf(b, "attnd_buffer_cache_bytes %lld\n", (long long)g->buffer_cache);
    family(b, "attnd_ready", "gauge", "1 when /v2/health/ready answers 200, 0 while draining.");
    api_buf_printf(b, "attnd_ready %d\n", g->ready ? 1 : 0);

    family(b, "attnd_received_bytes_total", "counter", "Request body bytes received.");
    api_buf_printf(b, "attnd_received_bytes_total %llu\n", (unsigned long long)load(&m->bytes_in));
    family(b, "attnd_sent_bytes_total", "counter", "Response body bytes queued for sending.");
    api_buf_printf(b, "attnd_sent_bytes_total %llu\n", (unsigned long long)load(&m->bytes_out));
    family(b, "attnd_slow_clients_total", "counter",
           "Connections closed because the client did not send its request in time "
           "(--receive-timeout-s, --idle-timeout-s).");
    api_buf_printf(b, "attnd_slow_clients_total %llu\n",
                   (unsigned long long)load(&m->slow_clients));
    family(b, "attnd_client_hangups_total", "counter",
           "Clients that hung up while their request was queued or computing.");
    api_buf_printf(b, "attnd_client_hangups_total %llu\n", (unsigned long long)load(&m->hangups));
    family(b, "attnd_worker_seconds_total", "counter",
           "Time engine workers spent on requests, from start to reply.");
    api_buf_printf(b, "attnd_worker_seconds_total %.6f\n", (double)load(&m->work_ns) / 1e9);
    family(b, "attnd_wasted_compute_seconds_total", "counter",
           "Of attnd_worker_seconds_total, the time spent on requests that still ended 504 "
           "(past their deadline): work nobody could use.");
    api_buf_printf(b, "attnd_wasted_compute_seconds_total %.6f\n",
                   (double)load(&m->wasted_ns) / 1e9);
    family(b, "attnd_batches_total", "counter",
           "Groups of layer passes that waited for the same layer and ran together "
           "(--max-batch-rows); a group of one is an idle engine's request.");
    api_buf_printf(b, "attnd_batches_total %llu\n", (unsigned long long)load(&m->batches));
    family(b, "attnd_batched_requests_total", "counter",
           "Requests that ran in those groups: over attnd_batches_total, the mean batch size.");
    api_buf_printf(b, "attnd_batched_requests_total %llu\n", (unsigned long long)load(&m->batched));
}

/* ---- Triton's per-model families (KServe v2 routes) ---------------------------------------- */

int srv__metrics_model_slot(const api_models *models, const char *name)
{
    if (!name)
        return -1;
    if (strcmp(name, "sdpa") == 0)
        return 0;
    for (size_t i = 0; models && i < api_models_count(models) && i + 1 < SRV_MODELS_MAX; i++) {
        if (strcmp(api_models_at(models, i)->name, name) == 0)
            return (int)i + 1;
    }
    return -1;
}

void srv__metrics_model_pending(srv_metrics *m, int slot, int delta)
{
    if (slot >= 0 && slot < SRV_MODELS_MAX)
        atomic_fetch_add(&m->model[slot].pending, delta);
}

static const char *model_name(const api_models *models, int slot)
{
    return slot == 0 ? "sdpa" : api_models_at(models, (size_t)slot - 1)->name;
}

static int model_count(const api_models *models)
{
    size_t n = 1 + (models ? api_models_count(models) : 0);
    return n < SRV_MODELS_MAX ? (int)n : SRV_MODELS_MAX;
}

/* Triton's failure reasons: REJECTED before execution (queue or memory full, draining, the
 * deadline), CANCELED by the client, BACKEND when the engine failed, OTHER for the rest (an
 * invalid request). */
static srv_fail_reason fail_reason(int status, api_reason reason)
{
    switch (reason) {
    case API_REASON_QUEUE_FULL:
    case API_REASON_DRAINING:
    case API_REASON_DEADLINE:
        return SRV_FAIL_REJECTED;
    case API_REASON_MEMORY:
        return status == 503 ? SRV_FAIL_BACKEND : SRV_FAIL_REJECTED;
    case API_REASON_CANCELLED:
        return SRV_FAIL_CANCELED;
    case API_REASON_INTERNAL:
        return SRV_FAIL_BACKEND;
    case API_REASON_NONE:
    case API_REASON_TOO_LARGE:
    case API_REASON_BAD_REQUEST:
    case API_REASON_UNAUTHORIZED:
        break;
    }
    return status >= 500 && status != 503 && status != 504 ? SRV_FAIL_BACKEND : SRV_FAIL_OTHER;
}

static void add(atomic_uint_fast64_t *v, int64_t x)
{
    atomic_fetch_add_explicit(v, x > 0 ? (uint_fast64_t)x : 0, memory_order_relaxed);
}

void srv__metrics_infer(srv_metrics *m, int slot, int status, api_reason reason, int64_t handler_ns,
                        int64_t queue_ns, const api_reply *reply)
{
    srv_model_stats *st;
    if (slot < 0 || slot >= SRV_MODELS_MAX)
        return;
    st = &m->model[slot];
    if (status != 200) {
        add(&st->fail, 1);
        add(&st->fail_ns, handler_ns);
        add(&st->failure[fail_reason(status, reason)], 1);
        return;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    add(&st->success, 1);
    add(&st->success_ns, handler_ns);
    add(&st->inferences, reply->inferences > 0 ? reply->inferences : 1);
    add(&st->executions, 1);
    add(&st->queue_count, 1);
    add(&st->queue_ns, queue_ns);
    add(&st->input_ns, reply->decode_ns);
    add(&st->infer_ns, reply->compute_ns);
    add(&st->output_ns, reply->encode_ns);
    atomic_store_explicit(&st->last_ms,
                          (uint_fast64_t)ts.tv_sec * 1000 + (uint_fast64_t)(ts.tv_nsec / 1000000),
                          memory_order_relaxed);
}

void srv__metrics_render_models(const srv_metrics *m, const api_models *models, api_buf *b)
{
    static const char *const fail_labels[SRV_FAIL_COUNT] = {"REJECTED", "CANCELED", "BACKEND",
                                                            "OTHER"};
    static const struct {
        const char *name, *type, *help;
        size_t offset; /* of the counter in srv_model_stats */
        bool micros;   /* a duration in ns shown in microseconds */
    } families[] = {
        {"nv_inference_request_success", "counter",
         "Number of successful inference requests, all batch sizes",
         offsetof(srv_model_stats, success), false},
        {"nv_inference_count", "counter", "Number of inferences performed (a batch of n counts n)",
         offsetof(srv_model_stats, inferences), false},
        {"nv_inference_exec_count", "counter", "Number of model executions performed",
         offsetof(srv_model_stats, executions), false},
        {"nv_inference_request_duration_us", "counter",
         "Cumulative end-to-end inference request handling time of successful requests",
         offsetof(srv_model_stats, success_ns), true},
        {"nv_inference_queue_duration_us", "counter",
         "Cumulative time requests spent waiting for an engine worker",
         offsetof(srv_model_stats, queue_ns), true},
        {"nv_inference_compute_input_duration_us", "counter",
         "Cumulative time requests spent decoding their inputs",
         offsetof(srv_model_stats, input_ns), true},
        {"nv_inference_compute_infer_duration_us", "counter",
         "Cumulative time requests spent computing attention", offsetof(srv_model_stats, infer_ns),
         true},
        {"nv_inference_compute_output_duration_us", "counter",
         "Cumulative time requests spent encoding their outputs",
         offsetof(srv_model_stats, output_ns), true},
    };
    int n = model_count(models);
    for (size_t f = 0; f < sizeof families / sizeof families[0]; f++) {
        family(b, families[f].name, families[f].type, families[f].help);
        for (int i = 0; i < n; i++) {
            const atomic_uint_fast64_t *v =
                (const atomic_uint_fast64_t *)(const void *)((const char *)&m->model[i] +
                                                             families[f].offset);
            uint64_t x = load(v);
            api_buf_printf(b, "%s{model=\"%s\",version=\"" API_V2_VERSION "\"} %llu\n",
                           families[f].name, model_name(models, i),
                           (unsigned long long)(families[f].micros ? x / 1000 : x));
        }
        if (f == 0) {
            family(b, "nv_inference_request_failure", "counter",
                   "Number of failed inference requests, all batch sizes, by reason");
            for (int i = 0; i < n; i++)
                for (int r = 0; r < SRV_FAIL_COUNT; r++)
                    api_buf_printf(b,
                                   "nv_inference_request_failure{model=\"%s\",reason=\"%s\","
                                   "version=\"" API_V2_VERSION "\"} %llu\n",
                                   model_name(models, i), fail_labels[r],
                                   (unsigned long long)load(&m->model[i].failure[r]));
        }
    }
    family(b, "nv_inference_pending_request_count", "gauge",
           "Instantaneous number of requests awaiting an engine worker");
    for (int i = 0; i < n; i++) {
        int64_t p = (int64_t)atomic_load_explicit(&m->model[i].pending, memory_order_relaxed);
        api_buf_printf(b,
                       "nv_inference_pending_request_count{model=\"%s\",version=\"" API_V2_VERSION
                       "\"} %lld\n",
                       model_name(models, i), (long long)(p > 0 ? p : 0));
    }
}

api_model_stats *srv__metrics_model_stats(const srv_metrics *m, const api_models *models, int slot,
                                          size_t *n_out)
{
    int n = model_count(models);
    api_model_stats *out = calloc((size_t)n, sizeof *out);
    size_t k = 0;
    *n_out = 0;
    if (!out)
        return NULL;
    for (int i = 0; i < n; i++) {
        const srv_model_stats *st = &m->model[i];
        uint64_t ok = load(&st->success);
        if (slot >= 0 && i != slot)
            continue;
        out[k++] = (api_model_stats){
            .name = model_name(models, i),
            .last_inference_ms = load(&st->last_ms),
            .inference_count = load(&st->inferences),
            .execution_count = load(&st->executions),
            .success = {ok, load(&st->success_ns)},
            .fail = {load(&st->fail), load(&st->fail_ns)},
            .queue = {load(&st->queue_count), load(&st->queue_ns)},
            .compute_input = {ok, load(&st->input_ns)},
            .compute_infer = {ok, load(&st->infer_ns)},
            .compute_output = {ok, load(&st->output_ns)},
        };
    }
    *n_out = k;
    return out;
}

void srv__metrics_session_step(srv_metrics *m, int64_t compute_ns)
{
    hist_add(&m->session_step, compute_ns);
}

void srv__metrics_session_ticket(srv_metrics *m)
{
    atomic_fetch_add_explicit(&m->session_tickets, 1, memory_order_relaxed);
}

void srv__metrics_render_sessions(const srv_metrics *m, const api_sessions_stats *st, bool on,
                                  api_buf *b)
{
    if (!on)
        return;
    api_buf_printf(b,
                   "# HELP attnd_sessions_live KV-cache sessions alive\n"
                   "# TYPE attnd_sessions_live gauge\nattnd_sessions_live %lld\n"
                   "# HELP attnd_sessions_created_total KV-cache sessions created (forks "
                   "included)\n# TYPE attnd_sessions_created_total counter\n"
                   "attnd_sessions_created_total %lld\n"
                   "# HELP attnd_session_evictions_total KV-cache sessions ended, by reason\n"
                   "# TYPE attnd_session_evictions_total counter\n"
                   "attnd_session_evictions_total{reason=\"ttl\"} %lld\n"
                   "attnd_session_evictions_total{reason=\"pressure\"} %lld\n"
                   "attnd_session_evictions_total{reason=\"deleted\"} %lld\n"
                   "attnd_session_evictions_total{reason=\"ended\"} %lld\n"
                   "# HELP attnd_kv_cache_bytes_used Bytes of KV-cache blocks in use\n"
                   "# TYPE attnd_kv_cache_bytes_used gauge\nattnd_kv_cache_bytes_used %zu\n"
                   "# HELP attnd_kv_cache_bytes_capacity The KV cache's size (--kv-cache-bytes)\n"
                   "# TYPE attnd_kv_cache_bytes_capacity gauge\n"
                   "attnd_kv_cache_bytes_capacity %zu\n"
                   "# HELP attnd_kv_cache_tokens Tokens cached over all sessions (a fork counts "
                   "its shared prefix)\n# TYPE attnd_kv_cache_tokens gauge\n"
                   "attnd_kv_cache_tokens %lld\n",
                   (long long)st->live, (long long)st->created_total, (long long)st->evicted_ttl,
                   (long long)st->evicted_pressure, (long long)st->deleted, (long long)st->ended,
                   st->bytes_used, st->bytes_capacity, (long long)st->tokens);
    api_buf_printf(b,
                   "# HELP attnd_session_steps_admitted_total Requests on a session or a v2 "
                   "sequence admitted in their order (the order their steps apply in)\n"
                   "# TYPE attnd_session_steps_admitted_total counter\n"
                   "attnd_session_steps_admitted_total %llu\n",
                   (unsigned long long)load(&m->session_tickets));
    api_buf_cstr(b, "# HELP attnd_session_step_seconds Compute time of session steps\n"
                    "# TYPE attnd_session_step_seconds histogram\n");
    hist_render(b, "attnd_session_step_seconds", "", &m->session_step);
}
