/*
 * metrics.c - the daemon's counters and histograms, and their Prometheus text exposition.
 *
 * Everything is a relaxed atomic: request paths update counters without a lock, and a scrape
 * reads them one by one. A histogram keeps non-cumulative bucket counts and derives the
 * cumulative `le` series, `_count` and `+Inf` from the same reads, so one scrape is always
 * self-consistent even while requests finish.
 */
#include "server/internal.h"

#include <string.h>

/* Upper bounds in seconds: half a millisecond (health checks) to a minute (long sequences). */
static const double bucket_le[SRV_HIST_BUCKETS] = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};

/* Status codes with their own series; anything else is counted as code="other". */
static const int code_slots[SRV_CODE_SLOTS - 1] = {200, 400, 404, 405, 408, 411, 413, 415,
                                                   422, 429, 499, 500, 501, 503, 504};

static const char *const route_labels[SRV_ROUTE_COUNT] = {"/v1/attention", "/v2/health/live",
                                                          "/v2/health/ready", "/metrics", "other"};

static const char *const stage_labels[SRV_STAGE_COUNT] = {"queue", "decode", "compute", "encode"};

const char *srv__route_label(srv_route route)
{
    return (unsigned)route < SRV_ROUTE_COUNT ? route_labels[route] : "other";
}

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

static void family(srv_buf *b, const char *name, const char *type, const char *help)
{
    srv__buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* One histogram series set; `labels` is "" or `key="value",`. */
static void hist_render(srv_buf *b, const char *name, const char *labels, const srv_hist *h)
{
    uint64_t counts[SRV_HIST_BUCKETS + 1], cum = 0;
    for (size_t i = 0; i <= SRV_HIST_BUCKETS; i++)
        counts[i] = load(&h->bucket[i]);
    for (size_t i = 0; i < SRV_HIST_BUCKETS; i++) {
        cum += counts[i];
        srv__buf_printf(b, "%s_bucket{%sle=\"%g\"} %llu\n", name, labels, bucket_le[i],
                        (unsigned long long)cum);
    }
    cum += counts[SRV_HIST_BUCKETS];
    srv__buf_printf(b, "%s_bucket{%sle=\"+Inf\"} %llu\n", name, labels, (unsigned long long)cum);
    /* Labels end with a comma for the bucket series; _sum and _count need them without it. */
    if (labels[0]) {
        size_t n = strlen(labels) - 1;
        srv__buf_printf(b, "%s_sum{%.*s} %.9f\n%s_count{%.*s} %llu\n", name, (int)n, labels,
                        (double)load(&h->sum_ns) / 1e9, name, (int)n, labels,
                        (unsigned long long)cum);
    } else {
        srv__buf_printf(b, "%s_sum %.9f\n%s_count %llu\n", name, (double)load(&h->sum_ns) / 1e9,
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

void srv__metrics_render(const srv_metrics *m, const srv_gauges *g, srv_buf *b)
{
    char labels[96];

    family(b, "attnd_requests_total", "counter",
           "HTTP requests answered, by route and status code.");
    for (int r = 0; r < SRV_ROUTE_COUNT; r++) {
        for (size_t c = 0; c < SRV_CODE_SLOTS; c++) {
            uint64_t v = load(&m->requests[r][c]);
            if (v == 0)
                continue;
            if (c < SRV_CODE_SLOTS - 1)
                srv__buf_printf(b, "attnd_requests_total{route=\"%s\",code=\"%d\"} %llu\n",
                                route_labels[r], code_slots[c], (unsigned long long)v);
            else
                srv__buf_printf(b, "attnd_requests_total{route=\"%s\",code=\"other\"} %llu\n",
                                route_labels[r], (unsigned long long)v);
        }
    }

    family(b, "attnd_request_duration_seconds", "histogram",
           "Time from the request line to the queued response, by route.");
    for (int r = 0; r < SRV_ROUTE_COUNT; r++) {
        if (hist_count(&m->duration[r]) == 0 && r != SRV_ROUTE_ATTENTION)
            continue;
        snprintf(labels, sizeof labels, "route=\"%s\",", route_labels[r]);
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
           "too_large, bad_request, internal).");
    for (int r = 1; r < SRV_REASON_COUNT; r++)
        srv__buf_printf(b, "attnd_rejected_total{reason=\"%s\"} %llu\n",
                        api_reason_str((api_reason)r), (unsigned long long)load(&m->rejected[r]));

    family(b, "attnd_queue_depth", "gauge", "Attention requests waiting for an engine worker.");
    srv__buf_printf(b, "attnd_queue_depth %lld\n", (long long)g->queued);
    family(b, "attnd_running_requests", "gauge", "Attention requests running on engine workers.");
    srv__buf_printf(b, "attnd_running_requests %lld\n", (long long)g->running);
    family(b, "attnd_inflight_requests", "gauge",
           "HTTP requests in progress: receiving, queued, running or being answered.");
    srv__buf_printf(b, "attnd_inflight_requests %lld\n", (long long)g->inflight);
    family(b, "attnd_max_queue", "gauge", "The admission limit (--max-queue).");
    srv__buf_printf(b, "attnd_max_queue %lld\n", (long long)g->max_queue);
    family(b, "attnd_worker_threads", "gauge", "Engine worker threads.");
    srv__buf_printf(b, "attnd_worker_threads %d\n", g->threads);
    family(b, "attnd_memory_reserved_bytes", "gauge",
           "Bytes of the memory budget reserved by requests in progress.");
    srv__buf_printf(b, "attnd_memory_reserved_bytes %lld\n", (long long)g->memory_in_use);
    family(b, "attnd_memory_budget_bytes", "gauge", "The memory budget (--max-memory-bytes).");
    srv__buf_printf(b, "attnd_memory_budget_bytes %lld\n", (long long)g->memory_budget);
    family(b, "attnd_ready", "gauge", "1 when /v2/health/ready answers 200, 0 while draining.");
    srv__buf_printf(b, "attnd_ready %d\n", g->ready ? 1 : 0);

    family(b, "attnd_received_bytes_total", "counter", "Request body bytes received.");
    srv__buf_printf(b, "attnd_received_bytes_total %llu\n", (unsigned long long)load(&m->bytes_in));
    family(b, "attnd_sent_bytes_total", "counter", "Response body bytes queued for sending.");
    srv__buf_printf(b, "attnd_sent_bytes_total %llu\n", (unsigned long long)load(&m->bytes_out));
    family(b, "attnd_slow_clients_total", "counter",
           "Connections closed because the client did not send its request in time "
           "(--receive-timeout-s, --idle-timeout-s).");
    srv__buf_printf(b, "attnd_slow_clients_total %llu\n",
                    (unsigned long long)load(&m->slow_clients));
    family(b, "attnd_client_hangups_total", "counter",
           "Clients that hung up while their request was queued or computing.");
    srv__buf_printf(b, "attnd_client_hangups_total %llu\n", (unsigned long long)load(&m->hangups));
}
