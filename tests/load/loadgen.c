/*
 * loadgen.c - the load and fault suites of attnd (tests/load): a libcurl-multi load generator
 * that drives a real daemon on 127.0.0.1 beyond its capacity, and the faults it must survive.
 *
 *   loadgen [--duration S] [--overload X] [--long-fraction F] [--max-tokens N] [--rate R]
 *   loadgen --soak            the same for 30 minutes, with a progress line every minute
 *   loadgen --faults          the fault suite
 *   loadgen --uploads [--io-threads N] [--duration S]   the edge under large uploads
 *
 * The load suite starts attnd ($ATTND_BIN, as every suite does) and measures its capacity for
 * the request mix: every long size once on an idle daemon, then small requests with a few
 * in flight. It then offers X (default 2) times that rate, open loop, for S seconds (default
 * 20): small requests (one head, 16x64 query/key/value as nested JSON) and, a fraction F
 * (default 1%) of the time, long sequences (causal self-attention over 2k to N tokens, default
 * 16k, as base64 float32). It asserts that only 200 and 429 come back, every 429 with
 * Retry-After, no reset or other transport error, both classes served; it reports the offered
 * and achieved rates and p50/p99 latency per class, and checks that the daemon's RSS and
 * descriptor count are flat once the load is over and that it exits 0.
 *
 * The fault suite runs each fault against its own daemon while background load keeps it busy:
 * clients hanging up mid-compute, SIGTERM (every request admitted before it answered 200, exit
 * 0), requests beyond the memory budget (413, or 429 with Retry-After), queue saturation (429
 * with Retry-After, the queue never beyond --max-queue) and deadline misses (504, promptly).
 *
 * The uploads mode measures what the HTTP edge costs large requests: 16 heads x 1,024 tokens of
 * D 64, base64 in and out (a 16 MiB body, a 5 MiB reply). It prints one request alone (and the
 * engine's capacity from its meta.compute_ms), two clients closed loop (the daemon's capacity for
 * them), then open loop at twice and four times that capacity for S seconds each (default 10),
 * every request with "timeout_ms" three times one alone: the goodput (200s per second) over
 * both capacities. It checks only what holds on any machine: every reply is 200, 429 (with
 * Retry-After) or 504, and some are served. --io-threads N is handed to the daemon.
 *
 * All end with "N passed, N failed". Traffic goes to 127.0.0.1 only; every run is bounded in
 * time (its duration plus a drain limit) and in requests in flight (--max-inflight, 256).
 */
#include <curl/curl.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "tests/support/check.h"
#include "tests/support/daemon.h"
#include "tests/support/rng.h"

/* ---- Options ------------------------------------------------------------------------------ */

typedef struct {
    double duration_s;
    double overload;      /* offered rate / measured capacity */
    double rate;          /* > 0: offer exactly this many requests per second instead */
    double long_fraction; /* share of long requests, by count */
    int max_tokens;       /* longest long sequence */
    int max_inflight;     /* requests in flight at once (one connection each) */
    bool soak, faults, uploads;
    bool duration_given;
    const char *io_threads; /* --io-threads for the daemon of --uploads (NULL: its default) */
} options;

static options opt = {.duration_s = 20,
                      .overload = 2,
                      .long_fraction = 0.01,
                      .max_tokens = 16384,
                      .max_inflight = 256};

static bool parse_double(const char *s, double lo, double hi, double *out)
{
    char *end = NULL;
    double v;
    errno = 0;
    v = strtod(s, &end);
    if (errno != 0 || end == s || *end != '\0' || !(v >= lo && v <= hi))
        return false;
    *out = v;
    return true;
}

static bool parse_int(const char *s, long lo, long hi, int *out)
{
    char *end = NULL;
    long v;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi)
        return false;
    *out = (int)v;
    return true;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: loadgen [--duration S] [--overload X] [--rate R] [--long-fraction F]\n"
            "               [--max-tokens N] [--max-inflight N] [--soak] [--faults]\n"
            "       loadgen --uploads [--io-threads N] [--duration S] [--max-inflight N]\n");
}

static bool parse_options(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true;
        if (strcmp(a, "--soak") == 0) {
            opt.soak = true;
            opt.duration_s = 1800;
            continue;
        }
        if (strcmp(a, "--faults") == 0) {
            opt.faults = true;
            continue;
        }
        if (strcmp(a, "--uploads") == 0) {
            opt.uploads = true;
            continue;
        }
        if (!v) {
            usage();
            return false;
        }
        int io_threads;
        if (strcmp(a, "--duration") == 0) {
            ok = parse_double(v, 1, 86400, &opt.duration_s);
            opt.duration_given = true;
        } else if (strcmp(a, "--overload") == 0)
            ok = parse_double(v, 0.1, 100, &opt.overload);
        else if (strcmp(a, "--rate") == 0)
            ok = parse_double(v, 1, 1e6, &opt.rate);
        else if (strcmp(a, "--long-fraction") == 0)
            ok = parse_double(v, 0, 1, &opt.long_fraction);
        else if (strcmp(a, "--max-tokens") == 0)
            ok = parse_int(v, 2048, 65536, &opt.max_tokens);
        else if (strcmp(a, "--max-inflight") == 0)
            ok = parse_int(v, 1, 4096, &opt.max_inflight);
        else if (strcmp(a, "--io-threads") == 0) {
            ok = parse_int(v, 1, 64, &io_threads);
            opt.io_threads = v;
        } else
            ok = false;
        if (!ok) {
            fprintf(stderr, "loadgen: bad argument %s %s\n", a, v);
            usage();
            return false;
        }
        i++;
    }
    return true;
}

/* ---- Request bodies ------------------------------------------------------------------------- */

enum { CLASS_SMALL = 0, CLASS_LONG, N_CLASSES };
static const char *const class_names[N_CLASSES] = {"small", "long"};

typedef struct {
    char *text;
    size_t len;
    int cls;
    int tokens;
} body_t;

#define N_SMALL   8
#define N_LONG    4
#define SMALL_L   16
#define SMALL_D   64
#define LONG_D    64
#define MAX_DRAIN 120.0 /* seconds the loader waits for requests in flight once it stops */

static body_t small_bodies[N_SMALL], long_bodies[N_LONG];
static int n_long_bodies;

/* Fixed seeds (tests/support/rng.h), so every run sends the same bodies in the same order. */
static uint64_t body_rng = 1; /* the main thread's, for making bodies */

/* A [rows, cols] nested JSON array of numbers in [-1, 1) with 4 decimals. */
static size_t write_nested(char *out, size_t cap, int rows, int cols)
{
    size_t n = 0;
    out[n++] = '[';
    for (int i = 0; i < rows; i++) {
        out[n++] = '[';
        for (int j = 0; j < cols; j++) {
            int w = snprintf(out + n, cap - n, "%s%.4f", j ? "," : "", rng_range(&body_rng, -1, 1));
            n += w > 0 ? (size_t)w : 0;
        }
        out[n++] = ']';
        if (i + 1 < rows)
            out[n++] = ',';
    }
    out[n++] = ']';
    return n;
}

/* One head, 16x64 query, key and value as nested JSON (about 25 KB). */
static bool make_small(body_t *b)
{
    size_t cap = (size_t)3 * SMALL_L * SMALL_D * 10 + 256, n = 0;
    static const char *const names[3] = {"query", "key", "value"};
    b->text = malloc(cap);
    if (!b->text)
        return false;
    b->text[n++] = '{';
    for (int t = 0; t < 3; t++) {
        int w = snprintf(b->text + n, cap - n, "%s\"%s\":", t ? "," : "", names[t]);
        n += (size_t)w;
        n += write_nested(b->text + n, cap - n, SMALL_L, SMALL_D);
    }
    b->text[n++] = '}';
    b->text[n] = '\0';
    b->len = n;
    b->cls = CLASS_SMALL;
    b->tokens = SMALL_L;
    return true;
}

/* Causal self-attention over `tokens` tokens, one head of 64, base64 float32 (3 x 4/3 x
 * tokens x 256 bytes: 16 MB at 16k tokens). */
static bool make_long(body_t *b, int tokens)
{
    int64_t shape[2] = {tokens, LONG_D};
    size_t count = (size_t)tokens * LONG_D, n;
    float *x = malloc(count * sizeof *x);
    char *t[3] = {NULL, NULL, NULL};
    bool ok = false;
    if (!x)
        return false;
    for (int k = 0; k < 3; k++) {
        for (size_t i = 0; i < count; i++)
            x[i] = (float)(rng_range(&body_rng, -1, 1));
        t[k] = json_tensor_b64(x, shape, 2);
        if (!t[k])
            goto done;
    }
    n = strlen(t[0]) + strlen(t[1]) + strlen(t[2]) + 128;
    b->text = malloc(n);
    if (!b->text)
        goto done;
    b->len = (size_t)snprintf(b->text, n, "{\"query\":%s,\"key\":%s,\"value\":%s,\"causal\":true}",
                              t[0], t[1], t[2]);
    b->cls = CLASS_LONG;
    b->tokens = tokens;
    ok = true;
done:
    for (int k = 0; k < 3; k++)
        free(t[k]);
    free(x);
    return ok;
}

static bool make_bodies(void)
{
    for (int i = 0; i < N_SMALL; i++) {
        if (!make_small(&small_bodies[i]))
            return false;
    }
    n_long_bodies = 0;
    for (int tokens = 2048; tokens <= opt.max_tokens && n_long_bodies < N_LONG; tokens *= 2) {
        if (!make_long(&long_bodies[n_long_bodies], tokens))
            return false;
        n_long_bodies++;
    }
    return true;
}

static void free_bodies(void)
{
    for (int i = 0; i < N_SMALL; i++)
        free(small_bodies[i].text);
    for (int i = 0; i < n_long_bodies; i++)
        free(long_bodies[i].text);
}

/* ---- The daemon's process ---------------------------------------------------------------------
 */

/* The descriptor count once it has stopped changing (sockets close a moment after the client
 * closes its end): `want` as soon as it gets there, within 30 s (a CI run with other builds on
 * the same two cores once needed more than 5 s to close 256 connections), else the last value
 * seen. */
static int fds_settled(const daemon_proc *d, int want)
{
    double deadline = now_s() + 30;
    int last = daemon_fd_count(d), stable = 0;
    while (now_s() < deadline) {
        int n;
        sleep_ms(50);
        n = daemon_fd_count(d);
        if (n == want)
            return n;
        stable = n == last ? stable + 1 : 0;
        last = n;
        if (want < 0 && stable >= 6)
            break;
    }
    return last;
}

/* ---- The loader: open-loop traffic from one thread with libcurl multi ----------------------- */

typedef struct {
    float sent;    /* seconds since the loader started */
    float latency; /* seconds */
    int16_t status;
    int16_t curl_rc;
    uint8_t cls;
    bool retry_after, body_ok;
} result;

typedef struct transfer transfer;

typedef struct {
    /* Set before loader_start. */
    int port;
    double rate;      /* requests per second; <= 0: closed loop (keep max_inflight busy) */
    int max_inflight; /* requests in flight at once */
    double long_fraction;
    const body_t *smalls, *longs; /* the bodies it picks from (NULL: the global sets) */
    int n_smalls, n_longs;
    uint64_t rng; /* its own random sequence */

    /* The thread's, readable after loader_stop. */
    pthread_t thread;
    atomic_bool stop;
    CURLM *multi;
    struct curl_slist *headers;
    int inflight, inflight_peak;
    double t0, stopped_at, next_send;
    size_t behind; /* send slots skipped because max_inflight requests were in flight */
    result *res;
    size_t n_res, cap_res;
    size_t unfinished; /* still in flight after MAX_DRAIN: abandoned */
    transfer *live;    /* the transfers in flight */
} loader;

/* One request in flight. */
struct transfer {
    loader *l;
    CURL *easy;
    int cls;
    double sent;
    bool retry_after;
    char head[16]; /* the start of the reply body */
    size_t head_len;
    transfer *prev, *next;
};

static void transfer_free(loader *l, transfer *t)
{
    if (t->prev)
        t->prev->next = t->next;
    else
        l->live = t->next;
    if (t->next)
        t->next->prev = t->prev;
    curl_multi_remove_handle(l->multi, t->easy);
    curl_easy_cleanup(t->easy);
    free(t);
    l->inflight--;
}

static size_t on_data(char *ptr, size_t size, size_t nmemb, void *userdata)
{
    transfer *t = userdata;
    size_t n = size * nmemb;
    if (t->head_len < sizeof t->head) {
        size_t k = sizeof t->head - t->head_len < n ? sizeof t->head - t->head_len : n;
        memcpy(t->head + t->head_len, ptr, k);
        t->head_len += k;
    }
    return n;
}

static size_t on_header_line(char *ptr, size_t size, size_t nmemb, void *userdata)
{
    transfer *t = userdata;
    size_t n = size * nmemb;
    if (n > 12 && strncasecmp(ptr, "Retry-After:", 12) == 0)
        t->retry_after = true;
    return n;
}

static const body_t *pick_body(loader *l)
{
    if (l->n_longs > 0 && rng_unit(&l->rng) < l->long_fraction)
        return &l->longs[rng_below(&l->rng, (uint64_t)l->n_longs)];
    return &l->smalls[rng_below(&l->rng, (uint64_t)l->n_smalls)];
}

static void add_request(loader *l, double now)
{
    const body_t *b = pick_body(l);
    transfer *t = calloc(1, sizeof *t);
    char url[64];
    if (!t)
        return;
    t->l = l;
    t->cls = b->cls;
    t->sent = now;
    t->easy = curl_easy_init();
    if (!t->easy) {
        free(t);
        return;
    }
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/attention", l->port);
    curl_easy_setopt(t->easy, CURLOPT_URL, url);
    curl_easy_setopt(t->easy, CURLOPT_POSTFIELDS, b->text);
    curl_easy_setopt(t->easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)b->len);
    curl_easy_setopt(t->easy, CURLOPT_HTTPHEADER, l->headers);
    curl_easy_setopt(t->easy, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(t->easy, CURLOPT_WRITEDATA, t);
    curl_easy_setopt(t->easy, CURLOPT_HEADERFUNCTION, on_header_line);
    curl_easy_setopt(t->easy, CURLOPT_HEADERDATA, t);
    curl_easy_setopt(t->easy, CURLOPT_PRIVATE, t);
    curl_easy_setopt(t->easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(t->easy, CURLOPT_TIMEOUT_MS, 110000L);
    curl_easy_setopt(t->easy, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
    if (curl_multi_add_handle(l->multi, t->easy) != CURLM_OK) {
        curl_easy_cleanup(t->easy);
        free(t);
        return;
    }
    t->next = l->live;
    if (l->live)
        l->live->prev = t;
    l->live = t;
    l->inflight++;
    if (l->inflight > l->inflight_peak)
        l->inflight_peak = l->inflight;
}

static void record(loader *l, transfer *t, CURLcode rc, double now)
{
    result *r;
    long status = 0;
    if (l->n_res == l->cap_res) {
        size_t cap = l->cap_res ? l->cap_res * 2 : 65536;
        result *grown = realloc(l->res, cap * sizeof *grown);
        if (!grown)
            return;
        l->res = grown;
        l->cap_res = cap;
    }
    r = &l->res[l->n_res++];
    if (rc == CURLE_OK)
        curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &status);
    r->sent = (float)(t->sent - l->t0);
    r->latency = (float)(now - t->sent);
    r->status = (int16_t)status;
    r->curl_rc = (int16_t)rc;
    r->cls = (uint8_t)t->cls;
    r->retry_after = t->retry_after;
    /* 200: {"output": ...}; an error: {"error": ...}. */
    r->body_ok = status == 200 ? t->head_len >= 10 && memcmp(t->head, "{\"output\":", 10) == 0
                               : t->head_len >= 9 && memcmp(t->head, "{\"error\":", 9) == 0;
}

static void reap(loader *l)
{
    CURLMsg *m;
    int left;
    double now = now_s();
    while ((m = curl_multi_info_read(l->multi, &left)) != NULL) {
        transfer *t = NULL;
        if (m->msg != CURLMSG_DONE)
            continue;
        curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&t);
        record(l, t, m->data.result, now);
        transfer_free(l, t);
    }
}

static void *loader_main(void *arg)
{
    loader *l = arg;
    int running = 0;
    l->next_send = l->t0;
    for (;;) {
        double now = now_s();
        int wait_ms = 5;
        if (!atomic_load(&l->stop)) {
            if (l->rate <= 0) {
                while (l->inflight < l->max_inflight)
                    add_request(l, now);
            } else {
                while (l->next_send <= now && l->inflight < l->max_inflight) {
                    add_request(l, now);
                    l->next_send += 1.0 / l->rate;
                }
                if (l->next_send < now - 0.05) {
                    /* Every connection is busy: skip the slots rather than burst later. */
                    l->behind += (size_t)((now - l->next_send) * l->rate);
                    l->next_send = now;
                }
                wait_ms = (int)((l->next_send - now) * 1000);
                wait_ms = wait_ms < 0 ? 0 : wait_ms > 5 ? 5 : wait_ms;
            }
        } else {
            if (l->stopped_at == 0)
                l->stopped_at = now;
            if (l->inflight == 0)
                break;
            if (now - l->stopped_at > MAX_DRAIN) {
                l->unfinished = (size_t)l->inflight;
                while (l->live)
                    transfer_free(l, l->live);
                break;
            }
        }
        curl_multi_perform(l->multi, &running);
        reap(l);
        curl_multi_poll(l->multi, NULL, 0, wait_ms, NULL);
    }
    return NULL;
}

static bool loader_start(loader *l)
{
    if (!l->smalls) {
        l->smalls = small_bodies;
        l->n_smalls = N_SMALL;
    }
    if (!l->longs) {
        l->longs = long_bodies;
        l->n_longs = n_long_bodies;
    }
    l->rng = l->rng ? l->rng : (uint64_t)l->port;
    l->multi = curl_multi_init();
    l->headers = curl_slist_append(NULL, "Content-Type: application/json");
    l->headers = curl_slist_append(l->headers, "Expect:");
    if (!l->multi || !l->headers)
        return false;
    curl_multi_setopt(l->multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, (long)l->max_inflight);
    curl_multi_setopt(l->multi, CURLMOPT_MAXCONNECTS, (long)l->max_inflight);
    atomic_init(&l->stop, false);
    l->t0 = now_s();
    return pthread_create(&l->thread, NULL, loader_main, l) == 0;
}

/* Stops sending, waits for what is in flight (up to MAX_DRAIN), closes every connection. */
static void loader_stop(loader *l)
{
    atomic_store(&l->stop, true);
    curl_multi_wakeup(l->multi);
    pthread_join(l->thread, NULL);
    curl_multi_cleanup(l->multi);
    curl_slist_free_all(l->headers);
    l->multi = NULL;
    l->headers = NULL;
}

static void loader_free(loader *l)
{
    free(l->res);
    l->res = NULL;
    l->n_res = l->cap_res = 0;
}

/* ---- Statistics ---------------------------------------------------------------------------- */

typedef struct {
    size_t n, ok, rejected, unavailable, deadline, other_status, transport, no_retry_after,
        bad_body;
    double p50, p99, max; /* latency of the 200s, seconds */
    double p50_429, p99_429;
    double max_504; /* the longest wait for a 504, seconds */
    int first_other_status, first_transport;
} class_stats;

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static double percentile(float *v, size_t n, double p)
{
    size_t i;
    if (n == 0)
        return 0;
    qsort(v, n, sizeof *v, cmp_float);
    i = (size_t)ceil(p * (double)n);
    i = i == 0 ? 0 : i - 1;
    return v[i < n ? i : n - 1];
}

/* Statistics of the results of class `cls` (-1: all) sent in [from, to) seconds. */
static class_stats summarize(const loader *l, int cls, double from, double to)
{
    class_stats s;
    float *ok = malloc((l->n_res + 1) * sizeof *ok), *rej = malloc((l->n_res + 1) * sizeof *rej);
    size_t n_ok = 0, n_rej = 0;
    memset(&s, 0, sizeof s);
    for (size_t i = 0; ok && rej && i < l->n_res; i++) {
        const result *r = &l->res[i];
        if ((cls >= 0 && r->cls != cls) || r->sent < from || r->sent >= to)
            continue;
        s.n++;
        if (r->curl_rc != CURLE_OK) {
            if (s.transport++ == 0)
                s.first_transport = r->curl_rc;
            continue;
        }
        if (!r->body_ok)
            s.bad_body++;
        switch (r->status) {
        case 200:
            s.ok++;
            ok[n_ok++] = r->latency;
            if (r->latency > s.max)
                s.max = r->latency;
            break;
        case 429:
            s.rejected++;
            rej[n_rej++] = r->latency;
            if (!r->retry_after)
                s.no_retry_after++;
            break;
        case 503:
            s.unavailable++;
            break;
        case 504:
            s.deadline++;
            if (r->latency > s.max_504)
                s.max_504 = r->latency;
            break;
        default:
            if (s.other_status++ == 0)
                s.first_other_status = r->status;
        }
    }
    if (ok && rej) {
        s.p50 = percentile(ok, n_ok, 0.50);
        s.p99 = percentile(ok, n_ok, 0.99);
        s.p50_429 = percentile(rej, n_rej, 0.50);
        s.p99_429 = percentile(rej, n_rej, 0.99);
    }
    free(ok);
    free(rej);
    return s;
}

static void print_stats(const char *label, const class_stats *s, double seconds)
{
    printf("  %-6s sent %zu (%.1f/s): 200 %zu (%.1f/s), 429 %zu, 503 %zu, 504 %zu, other %zu, "
           "transport errors %zu; 200 latency p50 %.1f ms p99 %.1f ms max %.1f ms; 429 p50 %.2f "
           "ms p99 %.2f ms; 504 max %.1f ms\n",
           label, s->n, (double)s->n / seconds, s->ok, (double)s->ok / seconds, s->rejected,
           s->unavailable, s->deadline, s->other_status, s->transport, s->p50 * 1e3, s->p99 * 1e3,
           s->max * 1e3, s->p50_429 * 1e3, s->p99_429 * 1e3, s->max_504 * 1e3);
}

/* Only 200 and 429 (with Retry-After), no transport error, every body what its status says. */
static void check_only_200_and_429(const char *what, const class_stats *s)
{
    CHECKF(s->transport == 0, "%s: %zu transport errors (first: %s)", what, s->transport,
           curl_easy_strerror((CURLcode)s->first_transport));
    CHECKF(s->other_status + s->unavailable + s->deadline == 0,
           "%s: statuses other than 200 and 429: %zu 503, %zu 504, %zu other (first %d)", what,
           s->unavailable, s->deadline, s->other_status, s->first_other_status);
    CHECKF(s->no_retry_after == 0, "%s: %zu 429s without Retry-After", what, s->no_retry_after);
    CHECKF(s->bad_body == 0, "%s: %zu replies whose body does not match the status", what,
           s->bad_body);
}

/* ---- Helpers for single requests ------------------------------------------------------------ */

static long post(int port, const body_t *b, http_resp *r)
{
    static const char *const json[] = {"Content-Type: application/json", NULL};
    return http_do(NULL, port, "POST", "/v1/attention", json, b->text, b->len, r);
}

/* The value of a sample line `name value` in a /metrics text, or -1. */
static double sample_of(const char *text, const char *name)
{
    size_t k = strlen(name);
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        if (strncmp(p, name, k) == 0 && p[k] == ' ')
            return strtod(p + k + 1, NULL);
    }
    return -1;
}

/* Two samples from one scrape of /metrics. */
static bool scrape2(int port, const char *a, double *va, const char *b, double *vb)
{
    http_resp r;
    bool ok = http_do(NULL, port, "GET", "/metrics", NULL, NULL, 0, &r) == 200;
    if (ok) {
        *va = sample_of(r.body, a);
        *vb = sample_of(r.body, b);
        ok = *va >= 0 && *vb >= 0;
    }
    http_resp_free(&r);
    return ok;
}

static bool start_daemon(daemon_proc *d, const char *const *args)
{
    if (daemon_start(d, args) != 0) {
        CHECKF(0, "attnd did not start");
        return false;
    }
    return true;
}

/* Small requests with `concurrency` in flight for `seconds`: 200s per second. */
static double small_capacity(int port, int concurrency, double seconds)
{
    loader l = {.port = port, .rate = 0, .max_inflight = concurrency, .long_fraction = 0};
    class_stats s;
    double elapsed;
    if (!loader_start(&l))
        return 0;
    sleep_ms((int)(seconds * 1000));
    loader_stop(&l);
    elapsed = l.stopped_at - l.t0;
    s = summarize(&l, -1, 0, 1e9);
    check_only_200_and_429("calibration", &s);
    loader_free(&l);
    return elapsed > 0 ? (double)s.ok / elapsed : 0;
}

/* ---- The load suite ------------------------------------------------------------------------ */

static daemon_proc daemon_;
static bool daemon_up;
static int idle_fds;
static long idle_rss_kib;

#define BUFFER_CACHE "attnd_buffer_cache_bytes"
/* The daemon releases cached buffers 10 s after their last use; its watcher looks each second. */
#define CACHE_RELEASE_MS 13000

/* Requests per second the daemon on `port` can serve for the mix with `long_fraction` long
 * requests: each long size alone on the idle daemon (which also warms up the allocator with
 * the biggest bodies), small requests with twice as many in flight as workers for `seconds`,
 * then the harmonic mix of the two. Prints what it measured when `verbose`. */
static double mix_capacity(int port, double long_fraction, double seconds, bool verbose)
{
    double small_rate, mean_long = 0;
    int threads = (int)metric_value(port, "attnd_worker_threads");
    http_resp r;
    if (threads <= 0)
        threads = 2;
    for (int i = 0; i < n_long_bodies; i++) {
        double t0 = now_s(), secs;
        long status = post(port, &long_bodies[i], &r);
        secs = now_s() - t0;
        CHECKF(status == 200, "a long request of %d tokens alone got %ld", long_bodies[i].tokens,
               status);
        http_resp_free(&r);
        mean_long += secs / n_long_bodies;
        if (verbose)
            printf("  long %5d tokens alone: %.0f ms (%.1f MB body)\n", long_bodies[i].tokens,
                   secs * 1e3, (double)long_bodies[i].len / 1e6);
    }
    small_rate = small_capacity(port, 2 * threads, seconds);
    CHECK(small_rate > 0);
    if (small_rate <= 0)
        return 0;
    if (verbose)
        printf("  capacity: %.0f small requests/s with %d in flight; %.0f/s for the mix with "
               "%.1f%% long (%d engine workers)\n",
               small_rate, 2 * threads,
               1.0 / ((1 - long_fraction) / small_rate + long_fraction * mean_long),
               long_fraction * 100, threads);
    return 1.0 / ((1 - long_fraction) / small_rate + long_fraction * mean_long);
}

/* The load itself: the capacity for the mix is measured first, on the same daemon (each long
 * request must get 200 alone), and the offered rate is a multiple of it. */
static void test_load_at_twice_capacity(void)
{
    loader l = {.port = daemon_.port, .max_inflight = opt.max_inflight};
    class_stats all, per[N_CLASSES];
    double capacity, elapsed, t_end, next_note, rss_peak = 0, fds_peak = 0;
    long first_minute_rss = -1;
    if (!daemon_up) {
        CHECK(0);
        return;
    }
    capacity = mix_capacity(daemon_.port, opt.long_fraction, opt.soak ? 5 : 2, true);
    CHECKF(capacity > 0, "no capacity measured for the mix");
    if (capacity <= 0)
        return;
    idle_fds = fds_settled(&daemon_, -1);
    CHECK(metric_wait_le(daemon_.port, BUFFER_CACHE, 0, CACHE_RELEASE_MS));
    idle_rss_kib = daemon_rss_kib(&daemon_);
    l.rate = opt.rate > 0 ? opt.rate : opt.overload * capacity;
    l.long_fraction = opt.long_fraction;
    printf("  offering %.0f requests/s (%.1f x capacity) for %.0f s, at most %d in flight; daemon "
           "idle: VmRSS %ld KiB, %d descriptors\n",
           l.rate, l.rate / capacity, opt.duration_s, l.max_inflight, idle_rss_kib, idle_fds);
    fflush(stdout);
    if (!loader_start(&l)) {
        CHECK(0);
        return;
    }
    t_end = l.t0 + opt.duration_s;
    next_note = l.t0 + 60;
    while (now_s() < t_end) {
        long rss = daemon_rss_kib(&daemon_);
        int fds = daemon_fd_count(&daemon_);
        if ((double)rss > rss_peak)
            rss_peak = (double)rss;
        if (fds > fds_peak)
            fds_peak = fds;
        if (opt.soak && now_s() >= next_note) {
            if (first_minute_rss < 0)
                first_minute_rss = rss;
            printf("  %4.0f s: VmRSS %ld KiB, %d descriptors, %zu replies so far\n", now_s() - l.t0,
                   rss, fds, l.n_res);
            fflush(stdout);
            next_note += 60;
        }
        sleep_ms(250);
    }
    loader_stop(&l);
    elapsed = l.stopped_at - l.t0;
    all = summarize(&l, -1, 0, 1e9);
    for (int c = 0; c < N_CLASSES; c++)
        per[c] = summarize(&l, c, 0, 1e9);
    printf("  load: %.1f s, offered %.0f/s, sent %zu (%.0f/s, %zu slots skipped with every "
           "connection busy), in flight at most %d, drained in %.1f s\n",
           elapsed, l.rate, all.n, (double)all.n / elapsed, l.behind, l.inflight_peak,
           now_s() - l.stopped_at);
    print_stats("all", &all, elapsed);
    for (int c = 0; c < N_CLASSES; c++)
        print_stats(class_names[c], &per[c], elapsed);
    printf("  daemon under load: VmRSS peak %.0f KiB, descriptors peak %.0f\n", rss_peak, fds_peak);
    check_only_200_and_429("load", &all);
    CHECKF(l.unfinished == 0, "%zu requests unanswered %.0f s after the load stopped", l.unfinished,
           MAX_DRAIN);
    CHECKF(per[CLASS_SMALL].ok > 0 && per[CLASS_SMALL].rejected > 0,
           "small requests: %zu served, %zu refused: the load was not beyond capacity",
           per[CLASS_SMALL].ok, per[CLASS_SMALL].rejected);
    if (opt.long_fraction > 0)
        CHECKF(per[CLASS_LONG].ok > 0, "no long request was served");
    CHECKF((double)all.n > 0.8 * l.rate * elapsed, "sent %zu of the %.0f offered", all.n,
           l.rate * elapsed);
    loader_free(&l);
}

/* Once the load is over and its connections closed: as many descriptors as before it, and
 * RSS within 16 MiB of the idle RSS before it. Both RSS readings wait until the daemon has
 * released its cache of request buffers (--buffer-cache-bytes: kept 10 s after last use), so
 * the comparison sees memory in use, not pages kept on purpose for the next request. The allowance
 * is for glibc's arenas: small freed chunks stay in the arena of the thread that used them (one per
 * worker and the I/O thread), and their layout after a run depends on which thread served what; it
 * does not grow with the length of the run. Large blocks (bodies, tensors) are mmapped and returned
 * on free because the daemon runs with MALLOC_MMAP_THRESHOLD_ fixed (see main), so what remains is
 * live memory plus that slack; a leak of small requests alone (25 KB bodies at hundreds per
 * second) would pass it within a second. In --soak mode the RSS is also printed every minute. */
static void test_rss_and_fds_flat_after_load(void)
{
    int fds;
    long rss;
    if (!daemon_up)
        return;
    fds = fds_settled(&daemon_, idle_fds);
    CHECK(metric_wait_le(daemon_.port, BUFFER_CACHE, 0, CACHE_RELEASE_MS));
    sleep_ms(500);
    rss = daemon_rss_kib(&daemon_);
    printf("  after the load: VmRSS %ld KiB (%+ld KiB), %d descriptors (%+d)\n", rss,
           rss - idle_rss_kib, fds, fds - idle_fds);
    CHECKF(fds == idle_fds, "descriptors: %d after the load, %d before", fds, idle_fds);
    CHECKF(rss - idle_rss_kib <= 16 * 1024, "VmRSS grew by %ld KiB", rss - idle_rss_kib);
    CHECK(metric_wait_le(daemon_.port, "attnd_memory_reserved_bytes", 0, 2000));
    CHECK(metric_wait_le(daemon_.port, "attnd_queue_depth", 0, 2000));
}

static void test_daemon_exits_cleanly(void)
{
    if (!daemon_up)
        return;
    CHECK_EQ_INT(daemon_stop(&daemon_), 0);
    daemon_up = false;
}

static int load_suite(void)
{
    const char *const args[] = {"--log-level", "warn", NULL};
    daemon_up = start_daemon(&daemon_, args);
    RUN_WITHIN(test_load_at_twice_capacity, (unsigned)(opt.duration_s + MAX_DRAIN + 60));
    RUN(test_rss_and_fds_flat_after_load);
    RUN(test_daemon_exits_cleanly);
    return check_report();
}

/* ---- The fault suite ----------------------------------------------------------------------- */

/* A raw POST of `b` (Connection: close) whose connection the caller can hang up; -1 when it
 * cannot connect or the server cuts the upload off. */
static int raw_post(int port, const body_t *b)
{
    char head[256];
    int fd = raw_connect(port);
    if (fd < 0)
        return -1;
    snprintf(head, sizeof head,
             "POST /v1/attention HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
             "Connection: close\r\nContent-Length: %zu\r\n\r\n",
             b->len);
    if (raw_send(fd, head, strlen(head)) != 0 || raw_send(fd, b->text, b->len) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static const body_t *longest(void)
{
    return &long_bodies[n_long_bodies - 1];
}

/* Background load at `rate` (small requests, plus `long_fraction` long ones). */
static bool background(loader *l, int port, double rate, double long_fraction)
{
    memset(l, 0, sizeof *l);
    l->port = port;
    l->rate = rate;
    l->max_inflight = opt.max_inflight;
    l->long_fraction = long_fraction;
    return loader_start(l);
}

/* Clients that hang up while their requests compute or wait free the workers at once, while
 * other clients keep the daemon busy: the cancellations are counted within half a second (or,
 * on a slow machine, a quarter of one long request alone), the
 * background traffic sees only 200 and 429, and a long request sent afterwards takes its usual
 * time. The requests hung up compute for seconds, so none of them can have finished first. */
static void test_hangups_mid_compute_under_load(void)
{
    enum { HANGUPS = 4 };
    const char *const args[] = {"--max-queue", "32", "--log-level", "warn", NULL};
    daemon_proc d;
    loader bg;
    class_stats s;
    body_t slow = {0};
    int fds[HANGUPS];
    double before, t0, waited, alone, again;
    http_resp r;

    slow.text = slow_attention_body(65536, 65536, &slow.len);
    if (!slow.text || !start_daemon(&d, args)) {
        free(slow.text);
        CHECK(0);
        return;
    }
    t0 = now_s();
    CHECK_EQ_INT(post(d.port, longest(), &r), 200);
    alone = now_s() - t0;
    http_resp_free(&r);
    before = metric_value(d.port, "attnd_rejected_total{reason=\"cancelled\"}");
    CHECK(background(&bg, d.port, 100, 0));
    for (int i = 0; i < HANGUPS; i++)
        fds[i] = raw_post(d.port, &slow);
    free(slow.text);
    CHECK(metric_wait(d.port, "attnd_running_requests", 1, 10000));
    sleep_ms(100);
    for (int i = 0; i < HANGUPS; i++) {
        if (fds[i] >= 0)
            close(fds[i]);
    }
    t0 = now_s();
    CHECK(
        metric_wait(d.port, "attnd_rejected_total{reason=\"cancelled\"}", before + HANGUPS, 5000));
    waited = now_s() - t0;
    printf("  %d requests computing or queued for seconds hung up: all cancelled within %.0f ms\n",
           HANGUPS, waited * 1e3);
    /* Half a second, or a quarter of one long request alone on a machine slow enough that an
     * engine block takes longer: each hung-up request stops at its next block. */
    CHECKF(waited < fmax(0.5, alone / 4), "the hang-ups were noticed after %.3f s (%.3f s alone)",
           waited, alone);
    t0 = now_s();
    CHECK_EQ_INT(post(d.port, longest(), &r), 200);
    again = now_s() - t0;
    http_resp_free(&r);
    CHECKF(again < 2 * alone + 0.5, "a long request after the hang-ups took %.0f ms (%.0f alone)",
           again * 1e3, alone * 1e3);
    loader_stop(&bg);
    s = summarize(&bg, -1, 0, 1e9);
    print_stats("bg", &s, bg.stopped_at - bg.t0);
    check_only_200_and_429("background", &s);
    CHECK(s.ok > 0);
    loader_free(&bg);
    CHECK_EQ_INT(daemon_stop(&d), 0);
}

/* The drain timeout of the tests whose requests in flight at SIGTERM must finish: far beyond
 * what they need on any machine (one that computes for seconds here took over 30 s with the
 * other core busy), because these tests are about the drain, not its timeout (test_resilience
 * checks that). The daemon exits as soon as the work is done. */
#define DRAIN_TIMEOUT_S "300"
#define DRAIN_WAIT_MS   320000

/* SIGTERM under load (twice capacity, long requests among the small): every request sent
 * before the signal is answered 200 (or 429 if the queue was full when it arrived), none is
 * cut off; requests after it get 503 or a refused connection; the daemon exits 0 once the
 * work in flight is done. */
/* A request made on its own thread. */
typedef struct {
    int port;
    const char *body;
    size_t len;
    long status;
    atomic_bool done;
} bg_post;

static void *bg_post_main(void *arg)
{
    static const char *const json[] = {"Content-Type: application/json", NULL};
    bg_post *b = arg;
    http_resp r;
    b->status = http_do(NULL, b->port, "POST", "/v1/attention", json, b->body, b->len, &r);
    http_resp_free(&r);
    atomic_store(&b->done, true);
    return NULL;
}

static void test_sigterm_under_load(void)
{
    const char *const args[] = {"--max-queue", "32", "--drain-timeout-s", DRAIN_TIMEOUT_S, NULL};
    const double margin = 0.05; /* requests sent this close to the signal may see either */
    daemon_proc d;
    loader bg;
    bg_post slow = {0};
    pthread_t thread;
    class_stats before, after;
    double rate, t_signal, drained;
    size_t admitted_in_flight = 0, long_in_flight = 0;
    int code;
    char *log;

    slow.body = slow_attention_body(65536, 65536, &slow.len);
    if (!slow.body || !start_daemon(&d, args)) {
        free((char *)slow.body);
        CHECK(0);
        return;
    }
    rate = 2 * mix_capacity(d.port, opt.long_fraction, 1, false);
    /* One request that computes for seconds, admitted before the load fills the queue: it is
     * certainly in flight when the signal comes. */
    slow.port = d.port;
    atomic_init(&slow.done, false);
    pthread_create(&thread, NULL, bg_post_main, &slow);
    CHECK(metric_wait(d.port, "attnd_running_requests", 1, 10000));
    CHECK(background(&bg, d.port, rate, opt.long_fraction));
    sleep_ms(1500);
    /* Signal when others wait behind it, too. */
    for (double until = now_s() + 5; now_s() < until;) {
        double q = 0, run = 0;
        if (scrape2(d.port, "attnd_queue_depth", &q, "attnd_running_requests", &run) && q >= 1 &&
            run >= 1)
            break;
        sleep_ms(2);
    }
    t_signal = now_s() - bg.t0;
    CHECKF(!atomic_load(&slow.done), "the slow request ended before the signal");
    daemon_signal(&d, SIGTERM);
    sleep_ms(500);
    loader_stop(&bg);
    pthread_join(thread, NULL);
    code = daemon_wait(&d, DRAIN_WAIT_MS);
    drained = now_s() - bg.t0 - t_signal;

    before = summarize(&bg, -1, 0, (double)t_signal - margin);
    after = summarize(&bg, -1, t_signal + margin, 1e9);
    for (size_t i = 0; i < bg.n_res; i++) {
        const result *x = &bg.res[i];
        if (x->sent < t_signal - margin && x->sent + x->latency > t_signal && x->status == 200) {
            admitted_in_flight++;
            long_in_flight += x->cls == CLASS_LONG;
        }
    }
    printf("  SIGTERM at %.1f s with %.0f requests/s offered: the slow request and %zu more "
           "(%zu long) in flight then, answered 200; %zu sent after it got 503 or a refused "
           "connection; exit %d within %.1f s of the signal\n",
           t_signal, rate, admitted_in_flight, long_in_flight, after.n, code, drained);
    print_stats("before", &before, t_signal);
    CHECK_EQ_INT(slow.status, 200);
    check_only_200_and_429("before the signal", &before);
    /* After the signal: 503 (draining) or refused (the listener is closed). */
    for (size_t i = 0; i < bg.n_res; i++) {
        const result *x = &bg.res[i];
        bool ok = x->status == 503 || x->curl_rc == CURLE_COULDNT_CONNECT;
        if (x->sent < t_signal + margin || ok)
            continue;
        CHECKF(ok, "a request %.3f s after the signal got status %d (%s)", x->sent - t_signal,
               x->status, curl_easy_strerror((CURLcode)x->curl_rc));
        break;
    }
    CHECK(after.n > 0);
    CHECK_EQ_INT(code, 0);
    log = daemon_log(&d);
    CHECK(log && strstr(log, "drained") != NULL);
    free(log);
    daemon_stop(&d);
    loader_free(&bg);
    free((char *)slow.body);
}

/* Beyond the memory budget under load: a body larger than the budget and a request whose
 * weights matrix alone exceeds it get 413 naming --max-memory-bytes; a burst of requests that
 * each fit but not together get 200 or 429 with Retry-After (reason memory); the budget is
 * all returned afterwards. */
static void test_memory_budget_under_load(void)
{
    enum { BURST = 8 };
    const char *const args[] = {"--max-memory-bytes", "64MiB", "--max-queue", "64",
                                "--log-level",        "warn",  NULL};
    daemon_proc d;
    loader bg, burst;
    class_stats s, b;
    char head[256], *resp, *weights_body;
    double memory_before;
    http_resp r;
    static const char *const json[] = {"Content-Type: application/json", NULL};
    const body_t *mid = &long_bodies[0]; /* 2048 tokens: ~6 MB of body, ~20 MB with weights */
    char *mid_weights;
    size_t n;

    if (!start_daemon(&d, args))
        return;
    CHECK(background(&bg, d.port, 200, 0));

    /* A client waiting for "100 Continue" hears the 413 before sending 100 MB it need not. */
    snprintf(head, sizeof head,
             "POST /v1/attention HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
             "Expect: 100-continue\r\nContent-Length: %d\r\n\r\n",
             100 << 20);
    resp = raw_exchange(d.port, head, strlen(head), 5000);
    CHECK_EQ_INT(raw_status(resp), 413);
    CHECK(resp && strstr(resp, "--max-memory-bytes") != NULL);
    free(resp);

    /* 4096 x 4096 per-head weights: 64 MiB of output alone. */
    n = long_bodies[1].len + 64;
    weights_body = malloc(n);
    CHECK(weights_body != NULL);
    if (weights_body) {
        memcpy(weights_body, long_bodies[1].text, long_bodies[1].len - 1);
        snprintf(weights_body + long_bodies[1].len - 1, n - long_bodies[1].len + 1,
                 ",\"return_weights\":\"per_head\"}");
        http_do(NULL, d.port, "POST", "/v1/attention", json, weights_body, strlen(weights_body),
                &r);
        CHECK_EQ_INT(r.status, 413);
        CHECKF(strstr(r.body, "--max-memory-bytes") != NULL, "body: %.200s", r.body);
        http_resp_free(&r);
    }
    free(weights_body);

    /* A burst of requests needing ~20 MB each: a few fit at a time. */
    memory_before = metric_value(d.port, "attnd_rejected_total{reason=\"memory\"}");
    n = mid->len + 64;
    mid_weights = malloc(n);
    CHECK(mid_weights != NULL);
    if (mid_weights) {
        body_t one;
        memcpy(mid_weights, mid->text, mid->len - 1);
        snprintf(mid_weights + mid->len - 1, n - mid->len + 1, ",\"return_weights\":\"mean\"}");
        one = (body_t){mid_weights, strlen(mid_weights), CLASS_LONG, mid->tokens};
        memset(&burst, 0, sizeof burst);
        burst.port = d.port;
        burst.rate = 0; /* closed loop: BURST in flight all the time */
        burst.max_inflight = BURST;
        burst.smalls = &one;
        burst.n_smalls = 1;
        burst.longs = &one;
        burst.n_longs = 0;
        CHECK(loader_start(&burst));
        sleep_ms(2000);
        loader_stop(&burst);
        b = summarize(&burst, -1, 0, 1e9);
        print_stats("burst", &b, burst.stopped_at - burst.t0);
        check_only_200_and_429("memory burst", &b);
        CHECKF(b.ok > 0 && b.rejected > 0, "burst: %zu served, %zu refused", b.ok, b.rejected);
        CHECK(metric_value(d.port, "attnd_rejected_total{reason=\"memory\"}") > memory_before);
        loader_free(&burst);
    }
    free(mid_weights);
    loader_stop(&bg);
    s = summarize(&bg, -1, 0, 1e9);
    print_stats("bg", &s, bg.stopped_at - bg.t0);
    check_only_200_and_429("background", &s);
    loader_free(&bg);
    CHECK(metric_wait_le(d.port, "attnd_memory_reserved_bytes", 0, 3000));
    CHECK_EQ_INT(daemon_stop(&d), 0);
}

/* Queue saturation: with one worker and --max-queue 4, a closed loop of 64 clients. The
 * queue plus the running request never exceed 4, everything beyond is 429 with Retry-After
 * at once, each counted as reason="queue_full", and everything admitted is served. */
static void test_queue_saturation(void)
{
    const char *const args[] = {"--threads", "1", "--max-queue", "4", "--log-level", "warn", NULL};
    daemon_proc d;
    loader l;
    class_stats s;
    double t_end, admitted_peak = 0, queued_peak = 0, counted;

    if (!start_daemon(&d, args))
        return;
    memset(&l, 0, sizeof l);
    l.port = d.port;
    l.rate = 0;
    l.max_inflight = 64;
    l.long_fraction = 0.05;
    l.n_longs = 2; /* 2k and 4k tokens: long enough to fill the queue, short enough to end */
    l.longs = long_bodies;
    CHECK(loader_start(&l));
    t_end = now_s() + 3;
    while (now_s() < t_end) {
        double q, run;
        if (scrape2(d.port, "attnd_queue_depth", &q, "attnd_running_requests", &run)) {
            queued_peak = q > queued_peak ? q : queued_peak;
            admitted_peak = q + run > admitted_peak ? q + run : admitted_peak;
        }
        sleep_ms(10);
    }
    loader_stop(&l);
    s = summarize(&l, -1, 0, 1e9);
    print_stats("all", &s, l.stopped_at - l.t0);
    check_only_200_and_429("saturation", &s);
    CHECKF(s.ok > 0 && s.rejected > s.ok, "%zu served, %zu refused", s.ok, s.rejected);
    /* The two gauges are read one after the other, so a request moving from the queue to the
     * worker in between can count twice: the queue alone is the exact bound. */
    CHECKF(queued_peak <= 4, "the queue reached %.0f (--max-queue 4)", queued_peak);
    metric_wait(d.port, "attnd_rejected_total{reason=\"queue_full\"}", (double)s.rejected, 2000);
    counted = metric_value(d.port, "attnd_rejected_total{reason=\"queue_full\"}");
    CHECKF(counted == (double)s.rejected, "queue_full counted %.0f, clients saw %zu 429s", counted,
           s.rejected);
    printf("  queued at most %.0f, queued plus running at most %.0f; %zu refused and counted\n",
           queued_peak, admitted_peak, s.rejected);
    loader_free(&l);
    CHECK_EQ_INT(daemon_stop(&d), 0);
}

/* Seconds one long request of `b` takes alone on an idle daemon started with default flags
 * (the second of two, so the first warms the daemon up); 0 when the daemon fails it. */
static double long_request_alone(const body_t *b)
{
    const char *const args[] = {"--log-level", "warn", NULL};
    daemon_proc d;
    http_resp r;
    double t0, secs = 0;
    if (!start_daemon(&d, args))
        return 0;
    for (int i = 0; i < 2; i++) {
        long status;
        t0 = now_s();
        status = post(d.port, b, &r);
        secs = now_s() - t0;
        http_resp_free(&r);
        CHECKF(status == 200, "a long request alone got %ld", status);
        if (status != 200)
            secs = 0;
    }
    CHECK_EQ_INT(daemon_stop(&d), 0);
    return secs;
}

/* Deadline misses under load: long requests at twice the rate the daemon can finish them, with
 * a deadline (--request-timeout-ms) of three times one long request alone, measured first on
 * this machine. Goodput holds: at least half of the capacity measured alone is served (the
 * daemon refuses at admission, 429 with Retry-After, what its queue cannot finish in time,
 * and never starts a request that would end past its deadline, so the work it does is work
 * clients get). Every reply is 200, 429 or 504, none later than half a deadline past it; a
 * request with "timeout_ms": 50 behind them is refused (429) or late (504); the rejection
 * counters agree with what the clients saw, the time spent on requests that still ended 504
 * stays a small share of the workers' time, and nothing is left running or queued. */
static void test_deadline_misses_under_load(void)
{
    static const char *const json[] = {"Content-Type: application/json", NULL};
    daemon_proc d;
    loader l;
    class_stats s;
    http_resp r;
    double alone = long_request_alone(longest()), timeout_s, seconds, goodput, busy, wasted,
           counted, capacity;
    char *quick = NULL, timeout_arg[32];
    const char *const args[] = {"--request-timeout-ms", timeout_arg, "--max-queue", "16",
                                "--log-level",          "warn",      NULL};
    size_t quick_ok = 0, quick_429 = 0, quick_504 = 0;

    if (alone <= 0)
        return;
    /* At least 300 ms, so that the 50 ms request below is the first to be late. */
    timeout_s = fmax(0.3, ceil(30 * alone) / 10);
    snprintf(timeout_arg, sizeof timeout_arg, "%.0f", timeout_s * 1e3);
    if (!start_daemon(&d, args))
        return;
    memset(&l, 0, sizeof l);
    l.port = d.port;
    l.rate = 2 / alone;
    l.max_inflight = 64;
    l.long_fraction = 1;
    l.longs = longest();
    l.n_longs = 1;
    CHECK(loader_start(&l));
    /* Once requests wait, a long one with a 50 ms deadline of its own: one long request runs at a
     * time, so behind the others it cannot finish in time, and it is refused at admission or
     * answered 504 (a small one would run beside them, on the pool's spare thread). */
    quick = malloc(longest()->len + 32);
    CHECK(quick != NULL);
    if (quick)
        snprintf(quick, longest()->len + 32, "{\"timeout_ms\":50,%s", longest()->text + 1);
    for (int attempt = 0; quick && attempt < 10 && quick_429 + quick_504 == 0; attempt++) {
        double q = 0, run = 0;
        for (double until = now_s() + 5; now_s() < until;) {
            if (scrape2(d.port, "attnd_queue_depth", &q, "attnd_running_requests", &run) &&
                q >= 1 && run >= 1)
                break;
            sleep_ms(2);
        }
        http_do(NULL, d.port, "POST", "/v1/attention", json, quick, strlen(quick), &r);
        CHECKF(r.status == 429 || r.status == 504 || r.status == 200, "a 50 ms deadline got %ld",
               r.status);
        quick_ok += r.status == 200;
        quick_429 += r.status == 429;
        quick_504 += r.status == 504;
        if (r.status == 429 || r.status == 504) {
            printf("  a request with \"timeout_ms\": 50 behind them: %ld after %.0f ms\n", r.status,
                   r.seconds * 1e3);
            CHECKF(strstr(r.body, "deadline") != NULL, "body: %.200s", r.body);
        }
        http_resp_free(&r);
    }
    CHECKF(quick_429 + quick_504 > 0,
           "a request with a 50 ms deadline was never refused or late behind long requests");
    /* Long enough for the queue to grow past a deadline's worth of work. */
    sleep_ms((int)(fmax(4, 4 * timeout_s) * 1e3));
    loader_stop(&l);
    seconds = l.stopped_at - l.t0;
    s = summarize(&l, -1, 0, 1e9);
    goodput = (double)s.ok / seconds;
    /* A request is counted when it completes, which can be a moment after its client has the
     * reply. */
    metric_wait(d.port, "attnd_rejected_total{reason=\"deadline\"}",
                (double)(s.deadline + quick_504), 2000);
    metric_wait(d.port, "attnd_rejected_total{reason=\"queue_full\"}",
                (double)(s.rejected + quick_429), 2000);
    metric_wait(d.port, "attnd_requests_total{route=\"/v1/attention\",code=\"200\"}",
                (double)(s.ok + quick_ok), 2000);
    busy = metric_value(d.port, "attnd_worker_seconds_total");
    wasted = metric_value(d.port, "attnd_wasted_compute_seconds_total");
    /* The capacity: one request alone at a time, as measured before, or as the workers' time per
     * request served shows it was during the load (the machine may have slowed down since). */
    capacity =
        1 / fmax(alone, (busy - wasted) / (double)(s.ok + quick_ok + (s.ok + quick_ok == 0)));
    printf("  long requests (%.0f ms alone) at %.1f/s, --request-timeout-ms %s:\n", alone * 1e3,
           l.rate, timeout_arg);
    print_stats("long", &s, seconds);
    CHECKF(s.transport == 0 && s.other_status == 0 && s.unavailable == 0 && s.no_retry_after == 0,
           "transport errors %zu, other statuses %zu, 503 %zu, 429 without Retry-After %zu",
           s.transport, s.other_status, s.unavailable, s.no_retry_after);
    CHECKF(goodput >= 0.5 * capacity, "served %.2f/s, less than half the capacity (%.2f/s)",
           goodput, capacity);
    CHECKF(s.max_504 < 1.5 * timeout_s, "a 504 came %.0f ms after its request (deadline %s ms)",
           s.max_504 * 1e3, timeout_arg);
    CHECKF(s.max < 1.5 * timeout_s, "a 200 came %.0f ms after its request (deadline %s ms)",
           s.max * 1e3, timeout_arg);
    counted = metric_value(d.port, "attnd_rejected_total{reason=\"deadline\"}");
    CHECKF(counted == (double)(s.deadline + quick_504),
           "deadline counted %.0f, clients saw %zu 504s", counted, s.deadline + quick_504);
    counted = metric_value(d.port, "attnd_rejected_total{reason=\"queue_full\"}");
    CHECKF(counted == (double)(s.rejected + quick_429),
           "queue_full counted %.0f, clients saw %zu 429s", counted, s.rejected + quick_429);
    counted = metric_value(d.port, "attnd_requests_total{route=\"/v1/attention\",code=\"200\"}");
    CHECKF(counted == (double)(s.ok + quick_ok), "200 counted %.0f, clients saw %zu", counted,
           s.ok + quick_ok);
    printf("  goodput %.2f of capacity; workers busy %.2f s, of which %.3f s on requests that "
           "ended 504\n",
           goodput / capacity, busy, wasted);
    CHECKF(wasted <= 0.25 * busy, "%.3f s of %.2f s of worker time went to requests that ended 504",
           wasted, busy);
    CHECK(metric_value(d.port, "attnd_running_requests") == 0);
    CHECK(metric_value(d.port, "attnd_queue_depth") == 0);
    loader_free(&l);
    free(quick);
    CHECK_EQ_INT(daemon_stop(&d), 0);
}

/* A refusal decided from the headers (queue full, draining) still reads the body before it
 * answers: a client in the middle of uploading a 16 MB long sequence gets its 429 (with
 * Retry-After) or 503, not a reset. libmicrohttpd stops reading a body once a response is
 * queued, so answering at once would close the connection under the client's upload. */
static void test_refusals_reach_clients_still_uploading(void)
{
    const char *const args[] = {"--threads",   "1",    "--max-queue",       "1",
                                "--log-level", "warn", "--drain-timeout-s", DRAIN_TIMEOUT_S,
                                NULL};
    daemon_proc d;
    bg_post busy = {0};
    pthread_t thread;
    void *keep = http_handle_new();
    size_t slow_len = 0;
    char *slow = slow_attention_body(65536, 65536, &slow_len);
    http_resp r;

    if (!slow || !start_daemon(&d, args)) {
        free(slow);
        http_handle_free(keep);
        CHECK(slow != NULL);
        return;
    }
    CHECK_EQ_INT(http_do(keep, d.port, "GET", "/v2/health/live", NULL, NULL, 0, &r), 200);
    http_resp_free(&r);
    busy.port = d.port;
    busy.body = slow;
    busy.len = slow_len;
    pthread_create(&thread, NULL, bg_post_main, &busy);
    CHECK(metric_wait(d.port, "attnd_running_requests", 1, 10000));
    for (int i = 0; i < 3; i++) {
        /* Blocking sends of the whole body, as a plain HTTP client does, then the reply. */
        int fd = raw_post(d.port, longest());
        bool closed = false;
        char *resp = fd >= 0 ? raw_read_all(fd, 10000, &closed) : NULL;
        CHECKF(fd >= 0, "the upload of a 16 MB body to a full queue was cut off");
        CHECKF(raw_status(resp) == 429, "a 16 MB upload to a full queue got %.60s",
               resp ? resp : "nothing");
        CHECKF(resp && strstr(resp, "Retry-After: 1"), "a 429 without Retry-After");
        free(resp);
        if (fd >= 0)
            close(fd);
    }
    daemon_signal(&d, SIGTERM);
    sleep_ms(50);
    {
        static const char *const json[] = {"Content-Type: application/json", NULL};
        long status = http_do(keep, d.port, "POST", "/v1/attention", json, longest()->text,
                              longest()->len, &r);
        CHECKF(status == 503, "a 16 MB upload while draining got %ld (%s)", status,
               status ? r.body : r.error);
        http_resp_free(&r);
    }
    pthread_join(thread, NULL);
    CHECK_EQ_INT(busy.status, 200);
    CHECK_EQ_INT(daemon_wait(&d, DRAIN_WAIT_MS), 0);
    daemon_stop(&d);
    http_handle_free(keep);
    free(slow);
}

static int fault_suite(void)
{
    RUN_WITHIN(test_hangups_mid_compute_under_load, 90);
    RUN_WITHIN(test_sigterm_under_load, DRAIN_WAIT_MS / 1000 + 90);
    RUN_WITHIN(test_memory_budget_under_load, 90);
    RUN_WITHIN(test_queue_saturation, 90);
    RUN_WITHIN(test_refusals_reach_clients_still_uploading, DRAIN_WAIT_MS / 1000 + 90);
    RUN_WITHIN(test_deadline_misses_under_load, 180);
    return check_report();
}

/* ---- The uploads mode ------------------------------------------------------------------------ */

#define UP_HEADS  16
#define UP_TOKENS 1024
#define UP_D      64
/* Connections the open-loop offers keep at most: beyond, a send slot is skipped and counted. */
#define UP_INFLIGHT 128

/* The uploads mode's body: query, key and value of [UP_HEADS, UP_TOKENS, UP_D] in base64 and a
 * base64 reply, with "timeout_ms" first when `timeout_ms` > 0. One tensor serves as all three. */
static bool make_upload_body(body_t *b, long timeout_ms)
{
    int64_t shape[3] = {UP_HEADS, UP_TOKENS, UP_D};
    size_t count = (size_t)UP_HEADS * UP_TOKENS * UP_D, n;
    float *x = malloc(count * sizeof *x);
    char *t, head[40] = "";
    if (!x)
        return false;
    for (size_t i = 0; i < count; i++)
        x[i] = (float)rng_range(&body_rng, -1, 1);
    t = json_tensor_b64(x, shape, 3);
    free(x);
    if (!t)
        return false;
    if (timeout_ms > 0)
        snprintf(head, sizeof head, "\"timeout_ms\":%ld,", timeout_ms);
    n = 3 * strlen(t) + 128;
    b->text = malloc(n);
    if (b->text)
        b->len = (size_t)snprintf(b->text, n,
                                  "{%s\"query\":%s,\"key\":%s,\"value\":%s,"
                                  "\"output_encoding\":\"base64\"}",
                                  head, t, t, t);
    b->cls = CLASS_LONG;
    b->tokens = UP_TOKENS;
    free(t);
    return b->text != NULL;
}

/* One request alone: its seconds (0 when it failed) and its meta.compute_ms in *compute_ms. */
static double upload_alone(int port, const body_t *b, double *compute_ms)
{
    http_resp r;
    double t0 = now_s(), secs;
    long status = post(port, b, &r);
    const char *meta = status == 200 ? strstr(r.body, "\"compute_ms\":") : NULL;
    secs = now_s() - t0;
    CHECKF(status == 200, "a request alone got %ld", status);
    *compute_ms = meta ? strtod(meta + 13, NULL) : 0;
    http_resp_free(&r);
    return status == 200 ? secs : 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Offers `b` open loop at `rate` for the mode's duration and prints its line: the goodput over
 * the daemon's capacity for two clients (`closed`, per second) and over the engine's
 * (`engine`). Only 200, 429 with Retry-After and 504 may come back. */
static void upload_offer(int port, const body_t *b, double multiple, double closed, double engine)
{
    loader l = {.port = port,
                .rate = multiple * closed,
                .max_inflight = opt.max_inflight < UP_INFLIGHT ? opt.max_inflight : UP_INFLIGHT,
                .long_fraction = 1,
                .longs = b,
                .n_longs = 1};
    class_stats s;
    double seconds;
    if (!loader_start(&l)) {
        CHECK(0);
        return;
    }
    sleep_ms((int)(opt.duration_s * 1e3));
    loader_stop(&l);
    seconds = l.stopped_at - l.t0;
    s = summarize(&l, -1, 0, 1e9);
    printf("uploads open %.0fx: offered %.1f/s for %.0f s, sent %zu (%zu slots skipped with %d "
           "connections busy); 200 %.1f/s: goodput %.2f of the closed-loop capacity, %.2f of the "
           "engine's; 429 %zu, 504 %zu, other %zu, transport errors %zu; 200 p50 %.0f ms p99 "
           "%.0f ms\n",
           multiple, l.rate, seconds, s.n, l.behind, l.max_inflight, (double)s.ok / seconds,
           (double)s.ok / seconds / closed, (double)s.ok / seconds / engine, s.rejected, s.deadline,
           s.other_status + s.unavailable, s.transport, s.p50 * 1e3, s.p99 * 1e3);
    fflush(stdout);
    CHECKF(s.other_status + s.unavailable == 0, "%zu replies neither 200, 429 nor 504",
           s.other_status + s.unavailable);
    CHECKF(s.no_retry_after == 0, "%zu 429s without Retry-After", s.no_retry_after);
    CHECKF(s.ok > 0, "nothing served at %.0fx", multiple);
    loader_free(&l);
}

static void test_uploads(void)
{
    const char *args[] = {"--log-level", "warn", NULL, NULL, NULL};
    body_t probe = {0}, timed = {0};
    daemon_proc d;
    double alone[5], compute[5], closed, engine;
    loader l = {.rate = 0, .max_inflight = 2, .long_fraction = 1, .n_longs = 1};
    class_stats s;

    if (opt.io_threads) {
        args[2] = "--io-threads";
        args[3] = opt.io_threads;
    }
    if (!make_upload_body(&probe, 0) || !start_daemon(&d, args)) {
        free(probe.text);
        CHECK(0);
        return;
    }
    upload_alone(d.port, &probe, &compute[0]); /* warm-up */
    for (int i = 0; i < 5; i++)
        alone[i] = upload_alone(d.port, &probe, &compute[i]);
    qsort(alone, 5, sizeof alone[0], cmp_double);
    qsort(compute, 5, sizeof compute[0], cmp_double);
    engine = compute[2] > 0 ? 1e3 / compute[2] : 0;
    l.port = d.port;
    l.longs = &probe;
    CHECK(loader_start(&l));
    sleep_ms((int)(opt.duration_s * 1e3 / 2));
    loader_stop(&l);
    s = summarize(&l, -1, 0, 1e9);
    closed = (double)s.ok / (l.stopped_at - l.t0);
    loader_free(&l);
    printf("uploads: %.1f MiB bodies (%d heads x %d tokens, D %d, base64 in and out), --io-threads "
           "%s\n",
           (double)probe.len / 1048576, UP_HEADS, UP_TOKENS, UP_D,
           opt.io_threads ? opt.io_threads : "(default)");
    printf("uploads alone: %.1f ms (median of 5), compute_ms %.1f: engine capacity %.1f/s\n",
           alone[2] * 1e3, compute[2], engine);
    printf("uploads closed loop, 2 clients: %.1f/s = %.2f of the engine's capacity\n", closed,
           engine > 0 ? closed / engine : 0);
    fflush(stdout);
    CHECK(alone[2] > 0 && closed > 0 && engine > 0);
    if (alone[2] > 0 && closed > 0 && engine > 0 &&
        make_upload_body(&timed, lround(3e3 * alone[2]))) {
        upload_offer(d.port, &timed, 2, closed, engine);
        upload_offer(d.port, &timed, 4, closed, engine);
    }
    free(probe.text);
    free(timed.text);
    CHECK_EQ_INT(daemon_stop(&d), 0);
}

static int uploads_mode(void)
{
    if (!opt.duration_given)
        opt.duration_s = 10;
    RUN_WITHIN(test_uploads, (unsigned)(3 * opt.duration_s + 3 * MAX_DRAIN + 60));
    return check_report();
}

int main(int argc, char **argv)
{
    int rc;
    if (!parse_options(argc, argv))
        return 2;
    /* Large blocks straight from mmap and back on free, in the daemon (inherited through
     * exec): its RSS is then live memory plus small-chunk arenas, and can be compared before
     * and after a load whose 16 MB bodies would otherwise stay cached in glibc's heap. */
    setenv("MALLOC_MMAP_THRESHOLD_", "262144", 1);
    curl_global_init(CURL_GLOBAL_ALL);
    if (!make_bodies()) {
        printf("out of memory making the request bodies\n0 passed, 1 failed\n");
        return 1;
    }
    rc = opt.uploads ? uploads_mode() : opt.faults ? fault_suite() : load_suite();
    free_bodies();
    curl_global_cleanup();
    return rc;
}
