/*
 * bench_session.c - a KV-cache decode step over HTTP: one
 * session of S tokens (default 32,768) with H heads of D (default 32 x 128) in a real attnd,
 * filled by append-only steps, then single-token steps (one token's q, k and v as base64 JSON,
 * about 48 KB in) timed as
 *
 *   compute   the daemon's own compute time of the step (the reply's meta.compute_ms: the
 *             append and one pass of the attention over the whole cache);
 *   http      the whole step as the client sees it (upload, queue, decode, compute, encode,
 *             download) over one kept-alive connection;
 *
 * each against the time a streaming read of the cache's bytes takes at the rate measured in
 * this process right before (stream_ratio = compute / (cache bytes / stream rate); the
 * targets are compute <= 1.3 and http <= 1.5 x that), for a float32 and a bfloat16 cache.
 * Every step's output is checked finite and of the right size; the last one's length is
 * S + steps.
 *
 * Then two other cases, with shapes of their own:
 *
 *   concurrent  64 sessions of 2,048 tokens, 32 query heads sharing 8 key/value heads of 128
 *               (a grouped-query model; float32, 16 MiB of cache each, 1 GiB in all: far past
 *               the caches, so a step is a read of its session's K/V from memory), each stepped
 *               by a client thread of its own over HTTP for CONCURRENT_SECONDS: the K/V bytes
 *               all steps read per second, against the streaming read of this run
 *               (stream_ratio; the target is >= 0.60);
 *   prefill     8,192 tokens of 8 heads of 128 (float32) appended to an empty session with
 *               their queries, against the same causal attention through POST /v1/attention:
 *               tokens per second of the daemon's compute time (ratio; the target is >= 0.90),
 *               and of the whole request as the client sees it (http_ratio).
 *
 *     build/tests/bench/bench_session [--tokens S] [--heads H] [--head-dim D] [--reps N]
 *                                     [--case decode|concurrent|prefill|all]
 *
 * --tokens, --heads, --head-dim and --reps shape the decode case only. The daemon is
 * $ATTND_BIN (default build/attnd) with --threads equal to this machine's CPUs. Absolute times
 * on a shared machine drift; the ratios of one run are what this measures.
 */
#include <curl/curl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "tests/bench/harness/harness.h"
#include "tests/support/daemon.h"
#include "tests/support/util.h"

static int64_t S = 32768, H = 32, D = 128;
static int reps = 5;

/* The concurrent case. */
enum { CONCURRENT_SESSIONS = 64, CONCURRENT_SECONDS = 4 };
static const int64_t C_TOKENS = 2048, C_HEADS = 32, C_KV_HEADS = 8, C_HEAD_DIM = 128;

/* The prefill case. */
enum { PREFILL_REPS = 3 };
static const int64_t P_TOKENS = 8192, P_HEADS = 8, P_HEAD_DIM = 128;

static const char *const json[] = {"Content-Type: application/json", NULL};

/* Streaming reads of 1 GiB over `threads` threads, in GB/s (the best of four). */
static double stream_gbps(int threads)
{
    size_t bytes = (size_t)1 << 30;
    double t = bench_stream_seconds(bytes, threads, 4);
    return t > 0 ? (double)bytes / t * 1e-9 : 0;
}

/* A step body: n tokens of key and value (and n queries when `query`), base64 float32. */
static char *step_body(int64_t n, bool query, uint64_t *rng, size_t *len)
{
    size_t count = (size_t)(n * H * D);
    float *x = malloc(count * sizeof *x);
    int64_t shape[2] = {n, H * D};
    for (size_t i = 0; i < count; i++)
        x[i] = rng_sym(rng, 1.0);
    char *t = json_tensor_b64(x, shape, 2);
    free(x);
    size_t cap = strlen(t) * 3 + 128;
    char *b = malloc(cap);
    int w = snprintf(b, cap, "{%s%s%s\"key\":%s,\"value\":%s,\"output_encoding\":\"base64\"}",
                     query ? "\"query\":" : "", query ? t : "", query ? "," : "", t, t);
    free(t);
    *len = (size_t)w;
    return b;
}

/* {"query": q?, "key": k?, "value": v?, <extra>} (each may be NULL), malloc'd, into *len. */
static char *tensors_body(const char *q, const char *k, const char *v, const char *extra,
                          size_t *len)
{
    size_t cap = (q ? strlen(q) : 0) + (k ? strlen(k) : 0) + (v ? strlen(v) : 0) + 512;
    char *b = malloc(cap);
    if (!b)
        return NULL;
    int w = snprintf(b, cap, "{\"output_encoding\":\"base64\"%s%s%s%s%s%s%s%s}",
                     q ? ",\"query\":" : "", q ? q : "", k ? ",\"key\":" : "", k ? k : "",
                     v ? ",\"value\":" : "", v ? v : "", extra ? "," : "", extra ? extra : "");
    *len = (size_t)w;
    return b;
}

/* POST /v1/sessions with `body`; the new id into id[40]. False (printed) on failure. */
static bool session_create(void *h, int port, const char *body, char id[40])
{
    http_resp r;
    http_do(h, port, "POST", "/v1/sessions", json, body, strlen(body), &r);
    char *idp = r.body ? strstr(r.body, "\"id\":\"") : NULL;
    bool ok = r.status == 201 && idp;
    if (ok)
        snprintf(id, 40, "%.33s", idp + 6);
    else
        fprintf(stderr, "bench_session: create: %ld %s\n", r.status, r.body ? r.body : "");
    http_resp_free(&r);
    return ok;
}

static void session_delete(void *h, int port, const char *id)
{
    char path[128];
    http_resp r;
    snprintf(path, sizeof path, "/v1/sessions/%s", id);
    http_do(h, port, "DELETE", path, NULL, NULL, 0, &r);
    http_resp_free(&r);
}

static double median(double *t, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            double x = t[j];
            t[j] = t[j - 1];
            t[j - 1] = x;
        }
    return t[n / 2];
}

/* One cache dtype: create, fill, step; prints one line. 0 on success. */
static int run(int port, const char *dtype, int threads)
{
    char body[256], path[128];
    uint64_t rng = 11;
    http_resp r;
    void *h = http_handle_new();
    snprintf(body, sizeof body, "{\"num_heads\":%lld,\"head_dim\":%lld,\"cache_dtype\":\"%s\"}",
             (long long)H, (long long)D, dtype);
    char id[40];
    if (!session_create(h, port, body, id)) {
        http_handle_free(h);
        return 1;
    }
    snprintf(path, sizeof path, "/v1/sessions/%s/attention", id);

    int64_t chunk = 2048;
    size_t len;
    for (int64_t done = 0; done < S; done += chunk) {
        char *b = step_body(done + chunk <= S ? chunk : S - done, false, &rng, &len);
        http_do(h, port, "POST", path, json, b, len, &r);
        free(b);
        if (r.status != 200) {
            fprintf(stderr, "bench_session: fill at %lld: %ld %.300s\n", (long long)done, r.status,
                    r.body ? r.body : "");
            http_resp_free(&r);
            http_handle_free(h);
            return 1;
        }
        http_resp_free(&r);
    }

    double gbps = stream_gbps(threads);
    double elem = strcmp(dtype, "float32") == 0 ? 4 : 2;
    double cache_bytes = (double)S * (double)H * (double)D * 2 * elem;
    double stream_ms = cache_bytes / (gbps * 1e9) * 1e3;
    double *comp = calloc((size_t)reps, sizeof *comp), *wall = calloc((size_t)reps, sizeof *wall);
    size_t in_bytes = 0;
    bool ok = true;
    for (int i = -1; i < reps; i++) { /* one warm-up step */
        char *b = step_body(1, true, &rng, &len);
        in_bytes = len;
        double t0 = now_s();
        http_do(h, port, "POST", path, json, b, len, &r);
        double t = (now_s() - t0) * 1e3;
        free(b);
        double cms[1] = {0};
        long got = r.body ? json_numbers(r.body, "compute_ms", cms, 1) : -1;
        ok = ok && r.status == 200 && got == 1 && strstr(r.body, "\"output\":") != NULL;
        if (i >= 0) {
            comp[i] = cms[0];
            wall[i] = t;
        }
        http_resp_free(&r);
    }
    double cm = median(comp, reps), wm = median(wall, reps);
    printf("session decode s=%lld h=%lld d=%lld dtype=%s threads=%d compute_ms=%.2f http_ms=%.2f "
           "in_kb=%.0f cache_mb=%.0f stream_gbps=%.1f stream_ms=%.2f stream_ratio=%.2f "
           "http_ratio=%.2f%s\n",
           (long long)S, (long long)H, (long long)D, dtype, threads, cm, wm,
           (double)in_bytes / 1024, cache_bytes / (1 << 20), gbps, stream_ms, cm / stream_ms,
           wm / stream_ms, ok ? "" : " FAILED");
    fflush(stdout);
    session_delete(h, port, id);
    http_handle_free(h);
    free(comp);
    free(wall);
    return ok ? 0 : 1;
}

/* ---- 64 sessions stepping at once ---------------------------------------------------------- */

typedef struct {
    int port;
    char id[40];
    const char *body; /* the step: one token's q, k and v (shared by every client) */
    size_t len;
    double end_s;    /* steps start before this */
    int64_t steps;   /* done, all 200 */
    double kv_bytes; /* the K/V bytes those steps read */
    double last_s;   /* when the last one finished */
    bool failed;
    pthread_barrier_t *go;
} stepper;

/* One client: steps its session until end_s, counting the K/V bytes each step reads (its
 * whole cache after the append). */
static void *stepper_run(void *p)
{
    stepper *c = p;
    char path[128];
    void *h = http_handle_new();
    double token_bytes = (double)(C_KV_HEADS * C_HEAD_DIM * 2 * 4);
    snprintf(path, sizeof path, "/v1/sessions/%s/attention", c->id);
    pthread_barrier_wait(c->go);
    while (!c->failed && now_s() < c->end_s) {
        http_resp r;
        http_do(h, c->port, "POST", path, json, c->body, c->len, &r);
        if (r.status == 200) {
            c->steps++;
            c->kv_bytes += (double)(C_TOKENS + c->steps) * token_bytes;
            c->last_s = now_s();
        } else {
            fprintf(stderr, "bench_session: concurrent step: %ld %.200s\n", r.status,
                    r.body ? r.body : "");
            c->failed = true;
        }
        http_resp_free(&r);
    }
    http_handle_free(h);
    return NULL;
}

/* Creates the sessions of `clients` and fills each with C_TOKENS tokens, one after the other;
 * *made counts those created (to delete). False (printed) on a failure. */
static bool concurrent_fill(void *h, int port, stepper *clients, int *made)
{
    uint64_t rng = 12;
    char create[160];
    size_t len;
    char *k = json_random_tensor_b64(C_TOKENS, C_KV_HEADS * C_HEAD_DIM, &rng);
    char *fill = k ? tensors_body(NULL, k, k, NULL, &len) : NULL;
    bool ok = fill != NULL;
    free(k);
    snprintf(create, sizeof create, "{\"num_heads\":%lld,\"num_kv_heads\":%lld,\"head_dim\":%lld}",
             (long long)C_HEADS, (long long)C_KV_HEADS, (long long)C_HEAD_DIM);
    for (*made = 0; ok && *made < CONCURRENT_SESSIONS; ++*made) {
        char path[128];
        http_resp r;
        if (!session_create(h, port, create, clients[*made].id))
            break;
        snprintf(path, sizeof path, "/v1/sessions/%s/attention", clients[*made].id);
        http_do(h, port, "POST", path, json, fill, len, &r);
        ok = r.status == 200;
        if (!ok)
            fprintf(stderr, "bench_session: concurrent fill: %ld %.200s\n", r.status,
                    r.body ? r.body : "");
        http_resp_free(&r);
    }
    free(fill);
    return ok && *made == CONCURRENT_SESSIONS;
}

/* Every client steps its session at once for CONCURRENT_SECONDS, from a barrier; the K/V
 * bytes they read, their steps, and the seconds from the barrier to the last step's end. False
 * when a step failed. */
static bool concurrent_steps(int port, stepper *clients, const char *step, size_t len,
                             double *bytes, int64_t *steps, double *secs)
{
    pthread_t tid[CONCURRENT_SESSIONS];
    pthread_barrier_t go;
    bool failed = false;
    pthread_barrier_init(&go, NULL, CONCURRENT_SESSIONS + 1);
    double start = now_s() + 0.2; /* every client is waiting at the barrier by then */
    for (int i = 0; i < CONCURRENT_SESSIONS; i++) {
        stepper *c = &clients[i];
        c->port = port;
        c->body = step;
        c->len = len;
        c->end_s = start + CONCURRENT_SECONDS;
        c->go = &go;
        pthread_create(&tid[i], NULL, stepper_run, c);
    }
    while (now_s() < start)
        sleep_ms(10);
    start = now_s();
    pthread_barrier_wait(&go);
    double last = start;
    *bytes = 0;
    *steps = 0;
    for (int i = 0; i < CONCURRENT_SESSIONS; i++) {
        pthread_join(tid[i], NULL);
        *steps += clients[i].steps;
        *bytes += clients[i].kv_bytes;
        last = clients[i].last_s > last ? clients[i].last_s : last;
        failed = failed || clients[i].failed;
    }
    pthread_barrier_destroy(&go);
    *secs = last - start;
    return !failed && *steps > 0;
}

/* Fills the sessions, measures the streaming read (the daemon idle, its sessions made), then
 * steps them all at once; prints one line. 0 on success. */
static int run_concurrent(int port, int threads)
{
    stepper *clients = calloc(CONCURRENT_SESSIONS, sizeof *clients);
    uint64_t rng = 14;
    size_t len = 0;
    int made = 0;
    void *h = http_handle_new();
    char *q1 = json_random_tensor_b64(1, C_HEADS * C_HEAD_DIM, &rng);
    char *k1 = json_random_tensor_b64(1, C_KV_HEADS * C_HEAD_DIM, &rng);
    char *step = q1 && k1 ? tensors_body(q1, k1, k1, NULL, &len) : NULL;
    free(q1);
    free(k1);
    bool ok = clients && step && concurrent_fill(h, port, clients, &made);
    double gbps = ok ? stream_gbps(threads) : 0, bytes = 0, secs = 0;
    int64_t steps = 0;
    ok = ok && concurrent_steps(port, clients, step, len, &bytes, &steps, &secs);
    double kv_gbps = secs > 0 ? bytes / secs * 1e-9 : 0;
    printf("session concurrent sessions=%d s=%lld h=%lld kv_heads=%lld d=%lld dtype=float32 "
           "threads=%d steps=%lld seconds=%.2f steps_per_s=%.0f cache_mb=%.0f "
           "kv_read_gbps=%.2f stream_gbps=%.1f stream_ratio=%.2f%s\n",
           CONCURRENT_SESSIONS, (long long)C_TOKENS, (long long)C_HEADS, (long long)C_KV_HEADS,
           (long long)C_HEAD_DIM, threads, (long long)steps, secs,
           secs > 0 ? (double)steps / secs : 0,
           (double)(CONCURRENT_SESSIONS * C_TOKENS * C_KV_HEADS * C_HEAD_DIM * 2 * 4) / (1 << 20),
           kv_gbps, gbps, gbps > 0 ? kv_gbps / gbps : 0, ok ? "" : " FAILED");
    fflush(stdout);
    for (int i = 0; i < made; i++)
        session_delete(h, port, clients[i].id);
    free(step);
    free(clients);
    http_handle_free(h);
    return ok ? 0 : 1;
}

/* ---- Prefill into a session against /v1/attention ---------------------------------------- */

/* POSTs `body` to `path`: the daemon's compute time and the whole request's, in ms. False
 * (printed) unless it answers 200 with an output. */
static bool timed_post(void *h, int port, const char *path, const char *body, size_t len,
                       double *compute_ms, double *http_ms)
{
    http_resp r;
    double t0 = now_s();
    http_do(h, port, "POST", path, json, body, len, &r);
    *http_ms = (now_s() - t0) * 1e3;
    double cms[1] = {0};
    bool ok = r.status == 200 && json_numbers(r.body, "compute_ms", cms, 1) == 1 &&
              strstr(r.body, "\"output\":") != NULL;
    if (!ok)
        fprintf(stderr, "bench_session: %s: %ld %.200s\n", path, r.status, r.body ? r.body : "");
    *compute_ms = cms[0];
    http_resp_free(&r);
    return ok;
}

/* The same causal attention of P_TOKENS tokens through /v1/attention and as the prefill of an
 * empty session (emptied again by truncate after each), alternately; prints one line. 0 on
 * success. */
static int run_prefill(int port, int threads)
{
    uint64_t rng = 13;
    char create[128], extra[64], path[128], truncate[128], id[40] = "";
    size_t att_len = 0, pre_len = 0;
    double att_c[PREFILL_REPS], att_w[PREFILL_REPS], pre_c[PREFILL_REPS], pre_w[PREFILL_REPS];
    void *h = http_handle_new();
    char *q = json_random_tensor_b64(P_TOKENS, P_HEADS * P_HEAD_DIM, &rng);
    char *k = json_random_tensor_b64(P_TOKENS, P_HEADS * P_HEAD_DIM, &rng);
    char *v = json_random_tensor_b64(P_TOKENS, P_HEADS * P_HEAD_DIM, &rng);
    snprintf(extra, sizeof extra, "\"num_heads\":%lld,\"causal\":true", (long long)P_HEADS);
    char *att = q && k && v ? tensors_body(q, k, v, extra, &att_len) : NULL;
    char *pre = q && k && v ? tensors_body(q, k, v, NULL, &pre_len) : NULL;
    free(q);
    free(k);
    free(v);
    snprintf(create, sizeof create, "{\"num_heads\":%lld,\"head_dim\":%lld}", (long long)P_HEADS,
             (long long)P_HEAD_DIM);
    bool ok = att && pre && session_create(h, port, create, id);
    snprintf(path, sizeof path, "/v1/sessions/%s/attention", id);
    snprintf(truncate, sizeof truncate, "/v1/sessions/%s/truncate", id);
    for (int i = 0; ok && i < PREFILL_REPS; i++) {
        http_resp r;
        ok = timed_post(h, port, "/v1/attention", att, att_len, &att_c[i], &att_w[i]) &&
             timed_post(h, port, path, pre, pre_len, &pre_c[i], &pre_w[i]);
        http_do(h, port, "POST", truncate, json, "{\"length\":0}", 12, &r);
        ok = ok && r.status == 200;
        http_resp_free(&r);
    }
    if (ok) {
        double ac = median(att_c, PREFILL_REPS), aw = median(att_w, PREFILL_REPS);
        double pc = median(pre_c, PREFILL_REPS), pw = median(pre_w, PREFILL_REPS);
        double tokens = (double)P_TOKENS;
        printf("session prefill tokens=%lld h=%lld d=%lld dtype=float32 threads=%d "
               "session_compute_ms=%.1f attention_compute_ms=%.1f session_tok_s=%.0f "
               "attention_tok_s=%.0f ratio=%.2f session_http_ms=%.1f attention_http_ms=%.1f "
               "http_ratio=%.2f in_mb=%.0f\n",
               (long long)P_TOKENS, (long long)P_HEADS, (long long)P_HEAD_DIM, threads, pc, ac,
               tokens / pc * 1e3, tokens / ac * 1e3, ac / pc, pw, aw, aw / pw,
               (double)pre_len / (1 << 20));
    } else {
        printf("session prefill tokens=%lld FAILED\n", (long long)P_TOKENS);
    }
    fflush(stdout);
    if (id[0])
        session_delete(h, port, id);
    free(att);
    free(pre);
    http_handle_free(h);
    return ok ? 0 : 1;
}

/* The KV pool the cases need at most (they run one after the other), plus room. */
static int64_t kv_cache_bytes(void)
{
    int64_t decode = S * H * D * 2 * 4;
    /* Room for 512 steps of each session: more than CONCURRENT_SECONDS gives them. */
    int64_t concurrent = CONCURRENT_SESSIONS * (C_TOKENS + 512) * C_KV_HEADS * C_HEAD_DIM * 2 * 4;
    int64_t prefill = P_TOKENS * P_HEADS * P_HEAD_DIM * 2 * 4;
    int64_t most = decode > concurrent ? decode : concurrent;
    return (most > prefill ? most : prefill) + ((int64_t)256 << 20);
}

int main(int argc, char **argv)
{
    const char *which = "all";
    for (int i = 1; i + 1 < argc; i += 2) {
        long long v = strtoll(argv[i + 1], NULL, 10);
        if (strcmp(argv[i], "--tokens") == 0)
            S = v;
        else if (strcmp(argv[i], "--heads") == 0)
            H = v;
        else if (strcmp(argv[i], "--head-dim") == 0)
            D = v;
        else if (strcmp(argv[i], "--reps") == 0)
            reps = (int)v;
        else if (strcmp(argv[i], "--case") == 0)
            which = argv[i + 1];
    }
    bool all = strcmp(which, "all") == 0;
    if (S < 1 || H < 1 || D < 1 || reps < 1 || reps > 100 ||
        (!all && strcmp(which, "decode") && strcmp(which, "concurrent") &&
         strcmp(which, "prefill"))) {
        fprintf(stderr, "usage: bench_session [--tokens S] [--heads H] [--head-dim D] [--reps N] "
                        "[--case decode|concurrent|prefill|all]\n");
        return 2;
    }
    int threads = eng_cpu_count();
    char th[16], kv[32];
    snprintf(th, sizeof th, "%d", threads);
    snprintf(kv, sizeof kv, "%lld", (long long)kv_cache_bytes());
    /* --max-queue: every concurrent client's step in flight at once. */
    const char *const args[] = {
        "--threads", th, "--kv-cache-bytes", kv, "--max-queue", "256", "--log-level", "warn", NULL};
    daemon_proc d;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    if (daemon_start(&d, args) != 0)
        return 1;
    int rc = 0;
    if (all || strcmp(which, "decode") == 0)
        rc |= run(d.port, "float32", threads) | run(d.port, "bfloat16", threads);
    if (all || strcmp(which, "concurrent") == 0)
        rc |= run_concurrent(d.port, threads);
    if (all || strcmp(which, "prefill") == 0)
        rc |= run_prefill(d.port, threads);
    daemon_stop(&d);
    return rc;
}
