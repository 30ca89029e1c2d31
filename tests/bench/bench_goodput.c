/*
 * bench_goodput.c - goodput past capacity: what attnd still serves in time when more long
 * requests arrive than it can finish, and what small requests see meanwhile.
 *
 *   alone     one long request (one head of --tokens causal tokens, D 64, base64 float32) at a
 *             time on an idle daemon: the median of five, the unit of every deadline;
 *   capacity  long requests closed loop (--clients at once) for a third of --seconds;
 *   1x 2x 4x  long requests open loop at that multiple of capacity for --seconds each, every
 *             one with "timeout_ms" three times one alone; per offer: goodput / capacity, p50
 *             and p99 latency of those served, the share refused at admission (429), the share
 *             answered 504, and the worker time spent on requests that still ended 504, as a
 *             share of the workers' busy time (attnd_wasted_compute_seconds_total over
 *             attnd_worker_seconds_total);
 *   mix       small requests (one head, 16 tokens) open loop at --mix-rate, alone and then with
 *             1% long requests among them: the small requests' p99 in the mix against alone.
 *   medium    the per-request overhead of a medium request: (1, 8, 256, 64) float32 over the KServe
 *             v2 binary protocol, MEDIUM_REPS one after the other on one kept-alive connection;
 *             the client's p50 and p99 against the daemon's own mean queue, decode, compute and
 *             encode times (attnd_request_stage_seconds), and what is left: receiving, sending
 *             and the hand-offs between threads.
 *
 * Every request is its own connection, sent by its own thread at its scheduled time (open
 * loop: a late reply does not delay the next request); at most MAX_INFLIGHT are in flight.
 * The daemon is $ATTND_BIN (default build/attnd), with default flags.
 *
 *     build/tests/bench/bench_goodput [--tokens N] [--seconds S] [--clients N] [--mix-rate R]
 *
 * A shared machine's other load moves every number; the lines of one run are comparable.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/daemon.h"
#include "tests/support/rng.h"

#define MAX_INFLIGHT 256
#define MAX_SENT     65536
#define SMALL_L      16
#define HEAD_D       64
#define MEDIUM_REPS  200

typedef struct {
    int tokens, clients;
    double seconds, mix_rate;
} options;

static options opt = {.tokens = 8192, .clients = 4, .seconds = 10, .mix_rate = 100};

typedef struct {
    char *text;
    size_t len;
} body_t;

/* One result per request sent. */
typedef struct {
    float latency; /* seconds */
    int16_t status;
    bool is_long;
} result;

typedef struct {
    int port;
    const body_t *lng, *small;
    result res[MAX_SENT];
    atomic_size_t done;
    atomic_int inflight;
} run_t;

typedef struct {
    run_t *run;
    size_t slot;
    bool is_long;
} send_arg;

static bool parse_args(int argc, char **argv)
{
    for (int i = 1; i + 1 < argc; i += 2) {
        char *end = NULL;
        double v = strtod(argv[i + 1], &end);
        if (!end || *end || !(v > 0))
            return false;
        if (strcmp(argv[i], "--tokens") == 0 && v >= 64 && v <= 65536)
            opt.tokens = (int)v;
        else if (strcmp(argv[i], "--seconds") == 0 && v <= 3600)
            opt.seconds = v;
        else if (strcmp(argv[i], "--clients") == 0 && v <= 64)
            opt.clients = (int)v;
        else if (strcmp(argv[i], "--mix-rate") == 0 && v <= 10000)
            opt.mix_rate = v;
        else
            return false;
    }
    return argc % 2 == 1;
}

/* Self-attention over `tokens` tokens, one head, base64 float32, with "timeout_ms" set to
 * `timeout_ms` (0: none). */
static bool make_body(body_t *b, int tokens, bool causal, long timeout_ms)
{
    static uint64_t rng = 7;
    size_t n = (size_t)tokens * HEAD_D;
    float *x = malloc(n * sizeof *x);
    int64_t shape[2] = {tokens, HEAD_D};
    char *t = NULL;
    if (!x)
        return false;
    for (size_t i = 0; i < n; i++)
        x[i] = (float)rng_range(&rng, -1, 1);
    t = json_tensor_b64(x, shape, 2);
    free(x);
    if (!t)
        return false;
    char head[48] = "";
    if (timeout_ms > 0)
        snprintf(head, sizeof head, "\"timeout_ms\":%ld,", timeout_ms);
    b->len = 3 * strlen(t) + 128;
    b->text = malloc(b->len);
    if (b->text) {
        int w = snprintf(b->text, b->len, "{%s\"causal\":%s,\"query\":%s,\"key\":%s,\"value\":%s}",
                         head, causal ? "true" : "false", t, t, t);
        b->len = w > 0 ? (size_t)w : 0;
    }
    free(t);
    return b->text != NULL;
}

static long post(int port, const body_t *b, double *seconds)
{
    static const char *const json[] = {"Content-Type: application/json", NULL};
    http_resp r;
    long status = http_do(NULL, port, "POST", "/v1/attention", json, b->text, b->len, &r);
    *seconds = r.seconds;
    http_resp_free(&r);
    return status;
}

static void *send_main(void *arg)
{
    send_arg *a = arg;
    run_t *run = a->run;
    double secs = 0;
    long status = post(run->port, a->is_long ? run->lng : run->small, &secs);
    run->res[a->slot] =
        (result){.latency = (float)secs, .status = (int16_t)status, .is_long = a->is_long};
    atomic_fetch_add(&run->done, 1);
    atomic_fetch_sub(&run->inflight, 1);
    free(a);
    return NULL;
}

/* Offers requests open loop at `rate` per second for `seconds`, a `long_share` of them long;
 * returns how many were sent, once all have their reply. */
static size_t offer(run_t *run, double rate, double seconds, double long_share)
{
    static uint64_t rng = 11;
    pthread_attr_t attr;
    size_t sent = 0;
    double t0 = now_s();
    atomic_store(&run->done, 0);
    atomic_store(&run->inflight, 0);
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, (size_t)256 * 1024);
    while (sent < MAX_SENT && now_s() - t0 < seconds) {
        double due = t0 + (double)sent / rate, wait = due - now_s();
        send_arg *a;
        pthread_t th;
        if (wait > 0)
            sleep_ms((int)ceil(wait * 1e3));
        if (atomic_load(&run->inflight) >= MAX_INFLIGHT) {
            sleep_ms(1);
            continue;
        }
        a = malloc(sizeof *a);
        if (!a)
            break;
        *a = (send_arg){.run = run, .slot = sent, .is_long = rng_range(&rng, 0, 1) < long_share};
        atomic_fetch_add(&run->inflight, 1);
        if (pthread_create(&th, &attr, send_main, a) != 0) {
            atomic_fetch_sub(&run->inflight, 1);
            free(a);
            break;
        }
        sent++;
    }
    pthread_attr_destroy(&attr);
    while (atomic_load(&run->done) < sent)
        sleep_ms(5);
    return sent;
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static double pct(float *v, size_t n, double p)
{
    if (n == 0)
        return 0;
    qsort(v, n, sizeof *v, cmp_float);
    size_t i = (size_t)ceil(p * (double)n);
    return v[i == 0 ? 0 : i - 1];
}

typedef struct {
    size_t n, ok, refused, late, other;
    double p50, p99; /* of the 200s, seconds */
} stats;

static stats summarize(const run_t *run, size_t sent, bool is_long)
{
    stats s = {0};
    float *lat = malloc((sent + 1) * sizeof *lat);
    for (size_t i = 0; lat && i < sent; i++) {
        const result *r = &run->res[i];
        if (r->is_long != is_long)
            continue;
        s.n++;
        if (r->status == 200)
            lat[s.ok++] = r->latency;
        else if (r->status == 429)
            s.refused++;
        else if (r->status == 504)
            s.late++;
        else
            s.other++;
    }
    s.p50 = lat ? pct(lat, s.ok, 0.5) : 0;
    s.p99 = lat ? pct(lat, s.ok, 0.99) : 0;
    free(lat);
    return s;
}

static double share(size_t part, size_t whole)
{
    return whole ? (double)part / (double)whole : 0;
}

/* Closed loop: `clients` threads each sending long requests back to back. */
typedef struct {
    run_t *run;
    double until;
    size_t ok;
} closed_arg;

static void *closed_main(void *arg)
{
    closed_arg *c = arg;
    while (now_s() < c->until) {
        double secs;
        if (post(c->run->port, c->run->lng, &secs) == 200)
            c->ok++;
    }
    return NULL;
}

static double closed_loop(run_t *run, int clients, double seconds)
{
    pthread_t th[64];
    closed_arg args[64];
    double t0 = now_s();
    size_t ok = 0;
    for (int i = 0; i < clients; i++) {
        args[i] = (closed_arg){.run = run, .until = t0 + seconds};
        pthread_create(&th[i], NULL, closed_main, &args[i]);
    }
    for (int i = 0; i < clients; i++) {
        pthread_join(th[i], NULL);
        ok += args[i].ok;
    }
    return (double)ok / (now_s() - t0);
}

static double median_alone(int port, const body_t *b, int n)
{
    float t[16];
    for (int i = 0; i < n && i < 16; i++) {
        double secs = 0;
        if (post(port, b, &secs) != 200)
            return 0;
        t[i] = (float)secs;
    }
    return pct(t, (size_t)n, 0.5);
}

static void print_offer(int port, run_t *run, double multiple, double capacity, double deadline)
{
    double busy0 = metric_value(port, "attnd_worker_seconds_total");
    double waste0 = metric_value(port, "attnd_wasted_compute_seconds_total");
    size_t sent = offer(run, multiple * capacity, opt.seconds, 1);
    stats s = summarize(run, sent, true);
    double busy = metric_value(port, "attnd_worker_seconds_total") - busy0;
    double waste = metric_value(port, "attnd_wasted_compute_seconds_total") - waste0;
    printf(
        "goodput offered_x=%.0f offered_per_s=%.1f goodput_ratio=%.2f p50_ms=%.1f p99_ms=%.1f "
        "deadline_ms=%.0f refused_pct=%.1f late_pct=%.1f other=%zu wasted_pct=%.1f busy_s=%.1f\n",
        multiple, (double)sent / opt.seconds, (double)s.ok / opt.seconds / capacity, s.p50 * 1e3,
        s.p99 * 1e3, deadline * 1e3, 100 * share(s.refused, s.n), 100 * share(s.late, s.n), s.other,
        busy > 0 ? 100 * waste / busy : 0, busy);
}

/* The sum of stage `stage` of attnd_request_stage_seconds, in seconds. */
static double stage_sum(int port, const char *stage)
{
    char series[96];
    snprintf(series, sizeof series, "attnd_request_stage_seconds_sum{stage=\"%s\"}", stage);
    return metric_value(port, series);
}

/* A (1, 8, 256, 64) float32 self-attention as a KServe v2 binary request. */
static char *medium_body(size_t *len, size_t *header_len)
{
    static uint64_t rng = 13;
    const size_t n = (size_t)8 * 256 * HEAD_D, bytes = n * sizeof(float);
    char head[1024];
    int w = snprintf(head, sizeof head, "{\"inputs\":[");
    static const char *const names[3] = {"query", "key", "value"};
    for (int t = 0; t < 3; t++)
        w += snprintf(head + w, sizeof head - (size_t)w,
                      "%s{\"name\":\"%s\",\"datatype\":\"FP32\",\"shape\":[1,8,256,64],"
                      "\"parameters\":{\"binary_data_size\":%zu}}",
                      t ? "," : "", names[t], bytes);
    w += snprintf(head + w, sizeof head - (size_t)w,
                  "],\"outputs\":[{\"name\":\"output\",\"parameters\":{\"binary_data\":true}}]}");
    char *body = malloc((size_t)w + 3 * bytes);
    if (!body)
        return NULL;
    memcpy(body, head, (size_t)w);
    for (size_t i = 0; i < 3 * n; i++) {
        float f = (float)rng_range(&rng, -1, 1);
        memcpy(body + w + i * sizeof f, &f, sizeof f);
    }
    *header_len = (size_t)w;
    *len = (size_t)w + 3 * bytes;
    return body;
}

static void medium_overhead(int port)
{
    static const char *const stages[4] = {"queue", "decode", "compute", "encode"};
    size_t len = 0, header_len = 0;
    char *body = medium_body(&len, &header_len), hl[80];
    const char *headers[] = {"Content-Type: application/octet-stream", hl, NULL};
    void *conn = http_handle_new();
    float lat[MEDIUM_REPS];
    double before[4], mean[4], client = 0;
    int n = 0;
    if (!body || !conn) {
        free(body);
        http_handle_free(conn);
        return;
    }
    snprintf(hl, sizeof hl, "Inference-Header-Content-Length: %zu", header_len);
    for (int i = -5; i < MEDIUM_REPS; i++) { /* five to warm up */
        http_resp r;
        if (i == 0)
            for (int k = 0; k < 4; k++)
                before[k] = stage_sum(port, stages[k]);
        long status = http_do(conn, port, "POST", "/v2/models/sdpa/infer", headers, body, len, &r);
        if (i >= 0 && status == 200) {
            lat[n++] = (float)r.seconds;
            client += r.seconds;
        }
        http_resp_free(&r);
    }
    for (int k = 0; k < 4; k++)
        mean[k] = n ? (stage_sum(port, stages[k]) - before[k]) / n : 0;
    client = n ? client / n : 0;
    printf("goodput medium (1,8,256,64) v2 binary, one connection: client p50 %.2f ms p99 %.2f ms "
           "mean %.2f ms; daemon queue %.2f decode %.2f compute %.2f encode %.2f ms; the rest "
           "(receive, send, hand-offs) %.2f ms (%d of %d served)\n",
           pct(lat, (size_t)n, 0.5) * 1e3, pct(lat, (size_t)n, 0.99) * 1e3, client * 1e3,
           mean[0] * 1e3, mean[1] * 1e3, mean[2] * 1e3, mean[3] * 1e3,
           (client - mean[0] - mean[1] - mean[2] - mean[3]) * 1e3, n, MEDIUM_REPS);
    free(body);
    http_handle_free(conn);
}

int main(int argc, char **argv)
{
    const char *const args[] = {"--log-level", "warn", NULL};
    static run_t run;
    body_t probe = {0}, lng = {0}, small = {0};
    daemon_proc d;
    double alone, capacity, small_p99_alone;
    size_t sent;
    stats s;

    if (!parse_args(argc, argv)) {
        fprintf(stderr, "usage: bench_goodput [--tokens N] [--seconds S] [--clients N] "
                        "[--mix-rate R]\n");
        return 2;
    }
    if (!make_body(&probe, opt.tokens, true, 0) || daemon_start(&d, args) != 0)
        return 1;
    run.port = d.port;
    run.lng = &probe;
    median_alone(d.port, &probe, 2); /* warm-up */
    alone = median_alone(d.port, &probe, 5);
    capacity = closed_loop(&run, opt.clients, opt.seconds / 3);
    printf("goodput: one head of %d causal tokens, base64: %.1f ms alone, capacity %.1f/s closed "
           "loop (%d clients), deadline 3x alone\n",
           opt.tokens, alone * 1e3, capacity, opt.clients);
    if (alone <= 0 || capacity <= 0 || !make_body(&lng, opt.tokens, true, lround(3e3 * alone)) ||
        !make_body(&small, SMALL_L, false, 0)) {
        daemon_stop(&d);
        return 1;
    }
    run.lng = &lng;
    run.small = &small;
    for (int m = 1; m <= 4; m *= 2)
        print_offer(d.port, &run, m, capacity, 3 * alone);

    sent = offer(&run, opt.mix_rate, opt.seconds, 0);
    s = summarize(&run, sent, false);
    small_p99_alone = s.p99;
    printf("goodput mix   small alone at %.0f/s: p50 %.2f ms p99 %.2f ms (%zu of %zu served)\n",
           opt.mix_rate, s.p50 * 1e3, s.p99 * 1e3, s.ok, s.n);
    sent = offer(&run, opt.mix_rate, opt.seconds, 0.01);
    s = summarize(&run, sent, false);
    printf("goodput mix   small with 1%% long: p50 %.2f ms p99 %.2f ms (%zu of %zu served), "
           "p99 %.1fx alone",
           s.p50 * 1e3, s.p99 * 1e3, s.ok, s.n, small_p99_alone > 0 ? s.p99 / small_p99_alone : 0);
    s = summarize(&run, sent, true);
    printf("; long: %zu served, %zu refused, %zu 504 of %zu\n", s.ok, s.refused, s.late, s.n);
    medium_overhead(d.port);
    free(probe.text);
    free(lng.text);
    free(small.text);
    return daemon_stop(&d) == 0 ? 0 : 1;
}
