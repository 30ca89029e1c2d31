/*
 * bench_e2e.c - what the wire costs: one attention problem (default (1, 8, 8192, 64), no mask)
 * timed side by side as
 *
 *   engine       eng_sdpa alone on a pool of the daemon's size (the floor);
 *   api          the same request through api/ in this process: the KServe v2 binary body
 *                (api_v2_infer) and the native base64 JSON body (api_attention), parse,
 *                decode, compute, encode - no socket; buffers are cached as in the daemon;
 *   http         the same bodies POSTed to a real attnd over loopback (libcurl, one kept-alive
 *                connection): upload, queue, api, download;
 *   https        the base64 body again, to a second attnd serving TLS (--tls-cert, a P-256
 *                certificate made with openssl at run time, default priorities: TLS 1.3 with
 *                AES-GCM here), over one kept-alive connection;
 *   small        a 3-token request (the README's example) over http and https: milliseconds
 *                per request on one kept-alive connection, over batches of SMALL_BATCH;
 *   grpc         the v2 request again as a ModelInferRequest with raw_input_contents, and the
 *                small request, to the plain daemon's --grpc-port over one HTTP/2 connection
 *                (tests/support/grpc.c, nghttp2).
 * The http and https runs of a case alternate (http, https, http, ...), so that the machine's
 * drift weighs on both alike; "tls cost" compares their medians.
 *
 * Bodies are built once, before the clock starts; each case runs --reps times (default 3) after
 * one warm-up and reports the median and the fastest, in milliseconds, with the bytes each way.
 * The outputs of every path are compared with the engine's, bit for bit. The daemon is
 * $ATTND_BIN (default build/attnd), started with --threads equal to this pool's.
 *
 *     build/tests/bench/bench_e2e [--reps N] [--shape B,H,L,D] [--threads N]
 *
 * Absolute times on a shared machine drift; the differences between the lines of one run are
 * what this measures.
 */
#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "api/api.h"
#include "api/core/memory.h"
#include "tests/support/attention_bodies.h"
#include "tests/support/daemon.h"
#include "tests/support/engine_env.h"
#include "tests/support/grpc.h"
#include "tests/support/rng.h"
#include "tests/support/tls.h"

/* Requests per timed batch of the small case: one is too short for the clock. */
#define SMALL_BATCH 200
/* The small case: the README's example request. */
static const char small_body[] = "{\"query\": [[1, 0], [0, 1], [1, 1]], \"key\": [[1, 0], [0, 1], "
                                 "[1, 1]], \"value\": [[1, 0], [0, 2], [3, 1]], \"causal\": true}";

typedef struct {
    char *data;
    size_t len, cap;
} sbuf;

static void sb_mem(sbuf *b, const void *p, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = (b->len + n + 1) * 2;
        char *d = realloc(b->data, cap);
        if (!d) {
            fprintf(stderr, "bench_e2e: out of memory\n");
            exit(1);
        }
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
}

static float *random_floats(size_t n, unsigned seed)
{
    float *x = malloc(n * sizeof *x);
    uint64_t rng = seed;
    if (!x) {
        fprintf(stderr, "bench_e2e: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++)
        x[i] = rng_sym(&rng, 1.0);
    return x;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double ms_since(int64_t t0)
{
    return (double)(eng_now_ns() - t0) / 1e6;
}

/* ---- The problem and its bodies ------------------------------------------------------------ */

static int64_t B = 1, H = 8, L = 8192, D = 64;
static float *q, *k, *v;
static size_t n_in; /* elements per tensor */

/* The problem's reply holds the engine's output `want`, bit for bit. */
static bool same_output(const char *body, size_t len, size_t header_len, bool v2, const float *want)
{
    attn_reply r = {.body = body, .len = len, .header_len = header_len, .v2 = v2};
    return attn_reply_output(&r, want, n_in);
}

/* ---- HTTP ----------------------------------------------------------------------------------- */

typedef struct {
    sbuf body;
    size_t header_len;
} reply_buf;

static size_t on_data(char *p, size_t size, size_t nmemb, void *u)
{
    sb_mem(&((reply_buf *)u)->body, p, size * nmemb);
    return size * nmemb;
}

static size_t on_head(char *p, size_t size, size_t nmemb, void *u)
{
    static const char name[] = "Inference-Header-Content-Length:";
    size_t n = size * nmemb;
    if (n > sizeof name && strncasecmp(p, name, sizeof name - 1) == 0)
        ((reply_buf *)u)->header_len = (size_t)strtoull(p + sizeof name - 1, NULL, 10);
    return n;
}

static long post(CURL *h, const char *scheme, int port, const char *path,
                 const char *const *headers, const char *body, size_t len, reply_buf *r)
{
    struct curl_slist *hl = curl_slist_append(NULL, "Expect:");
    char url[256];
    long status = 0;
    snprintf(url, sizeof url, "%s://127.0.0.1:%d%s", scheme, port, path);
    for (int i = 0; headers[i]; i++)
        hl = curl_slist_append(hl, headers[i]);
    r->body.len = 0;
    r->header_len = 0;
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_head);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, r);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 600000L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    if (curl_easy_perform(h) == CURLE_OK)
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, NULL);
    curl_slist_free_all(hl);
    return status;
}

/* ---- Cases ---------------------------------------------------------------------------------- */

static int reps = 3;

/* Prints one line and returns the median. */
static double report(const char *name, double *t, size_t up, size_t down, bool ok)
{
    qsort(t, (size_t)reps, sizeof *t, cmp_double);
    printf("%-28s ms=%8.3f  min_ms=%8.3f  request_mb=%6.1f  reply_mb=%6.1f  output=%s\n", name,
           t[reps / 2], t[0], (double)up / 1048576.0, (double)down / 1048576.0,
           ok ? "exact" : "DIFFERS");
    fflush(stdout);
    return t[reps / 2];
}

/* One connection's case: a scheme, a port, the handle, and what it measured. */
typedef struct {
    const char *scheme;
    int port;
    const daemon_proc *proc; /* the daemon, for its CPU time */
    double cpu_s;            /* the daemon's CPU seconds over the timed runs */
    int64_t requests;        /* requests in the timed runs */
    CURL *h;
    reply_buf r;
    bool ok;
    double *t;
} conn_case;

/* One native base64 request: its time in ms. */
static double native_once(conn_case *c, const char *body, size_t len, const float *want)
{
    static const char *const headers[] = {"Content-Type: application/json", NULL};
    int64_t t0 = eng_now_ns();
    long status = post(c->h, c->scheme, c->port, "/v1/attention", headers, body, len, &c->r);
    double ms = ms_since(t0);
    c->ok = c->ok && status == 200 && same_output(c->r.body.data, c->r.body.len, 0, false, want);
    return ms;
}

/* A batch of SMALL_BATCH small requests: the time per request in ms. */
static double small_once(conn_case *c)
{
    static const char *const headers[] = {"Content-Type: application/json", NULL};
    int64_t t0 = eng_now_ns();
    for (int j = 0; j < SMALL_BATCH; j++)
        c->ok = c->ok && post(c->h, c->scheme, c->port, "/v1/attention", headers, small_body,
                              sizeof small_body - 1, &c->r) == 200;
    return ms_since(t0) / SMALL_BATCH;
}

/* Runs a case on the plain and the TLS daemon in turns (plain, TLS, plain, ...: the machine's
 * drift hits both alike), prints both lines and the TLS cost. `len` is the request size. */
static void plain_and_tls(const char *what, conn_case *c, int n, const char *body, size_t len,
                          const float *want)
{
    double median[2], cpu_per_req[2];
    char name[64];
    for (int i = 0; i < n; i++) {
        c[i].ok = true;
        c[i].r.body.len = 0;
        c[i].cpu_s = 0;
        c[i].requests = 0;
    }
    for (int r = -1; r < reps; r++) {
        for (int i = 0; i < n; i++) {
            double cpu0 = daemon_cpu_s(c[i].proc);
            double ms = body ? native_once(&c[i], body, len, want) : small_once(&c[i]);
            if (r >= 0) {
                c[i].t[r] = ms;
                c[i].cpu_s += daemon_cpu_s(c[i].proc) - cpu0;
                c[i].requests += body ? 1 : SMALL_BATCH;
            }
        }
    }
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof name, "%s %s", c[i].scheme, what);
        median[i] = report(name, c[i].t, len, c[i].r.body.len, c[i].ok);
        cpu_per_req[i] = c[i].cpu_s / (double)c[i].requests;
    }
    /* The daemon's own CPU per request is what TLS takes from the server's throughput; the
     * wall time also holds the client's share (both run on the same cores here). */
    if (n == 2)
        printf("%-28s time %+.1f%% (median https / http - 1), daemon cpu per request %.3f -> "
               "%.3f ms (%+.1f%%)\n",
               "tls cost", (median[1] / median[0] - 1) * 100, cpu_per_req[0] * 1e3,
               cpu_per_req[1] * 1e3, (cpu_per_req[1] / cpu_per_req[0] - 1) * 100);
}

/* ---- gRPC ---------------------------------------------------------------------------------- */

#define INFER_PATH "/inference.GRPCInferenceService/ModelInfer"

/* One ModelInfer call; true when it answered OK with an output equal to `want` (NULL: any). */
static bool grpc_infer_once(grpc_client *c, const char *body, size_t len, const float *want,
                            size_t *down)
{
    grpc_stream st = {.body = body, .body_len = len};
    size_t n = 0;
    bool ok = grpc_start(c, INFER_PATH, NULL, &st) == 0 && grpc_wait(c, &st, 600000) &&
              st.grpc_status == 0;
    const char *msg = ok ? grpc_message_at(&st, 0, &n) : NULL;
    ok = attn_grpc_output(msg, n, want, n_in);
    *down = st.len;
    grpc_stream_free(&st);
    return ok;
}

/* The large request and the small one over one gRPC connection to `port`. */
static void grpc_lines(int port, double *t, const float *first)
{
    grpc_client c;
    size_t len, down = 0;
    const attn_problem problem = {.q = q, .k = k, .v = v, .shape = {B, H, L, D}};
    char *big = attn_body_grpc(&problem, "sdpa", &len);
    bool ok = true;
    if (!big || grpc_client_open(&c, port) != 0) {
        printf("grpc lines skipped: no connection\n");
        free(big);
        return;
    }
    for (int r = -1; r < reps; r++) {
        int64_t t0 = eng_now_ns();
        ok = grpc_infer_once(&c, big, len, first, &down) && ok;
        if (r >= 0)
            t[r] = ms_since(t0);
    }
    report("grpc raw fp32", t, len, down, ok);
    free(big);

    /* The README's small example as tensors: [1, 1, 3, 2], causal. */
    static const float sq[6] = {1, 0, 0, 1, 1, 1}, sv[6] = {1, 0, 0, 2, 3, 1};
    const attn_problem small = {.q = sq, .k = sq, .v = sv, .shape = {1, 1, 3, 2}, .causal = true};
    char *body = attn_body_grpc(&small, "sdpa", &len);
    ok = body != NULL;
    for (int r = -1; r < reps && ok; r++) {
        int64_t t0 = eng_now_ns();
        for (int i = 0; i < SMALL_BATCH && ok; i++)
            ok = grpc_infer_once(&c, body, len, NULL, &down);
        if (r >= 0)
            t[r] = ms_since(t0) / SMALL_BATCH;
    }
    report("grpc small (per req)", t, len, down, ok);
    free(body);
    grpc_client_close(&c);
}

int main(int argc, char **argv)
{
    /* The in-process baseline runs on the options the daemon reads from the same variables. */
    char why[320];
    if (test_engine_init(why, sizeof why) != TEST_ENGINE_READY) {
        fprintf(stderr, "bench_e2e: %s\n", why);
        return 2;
    }
    int threads = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
            reps = (int)strtol(argv[++i], NULL, 10);
        } else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
            threads = (int)strtol(argv[++i], NULL, 10);
        } else if (strcmp(argv[i], "--shape") == 0 && i + 1 < argc) {
            long long b, h, l, d;
            if (sscanf(argv[++i], "%lld,%lld,%lld,%lld", &b, &h, &l, &d) != 4) {
                fprintf(stderr, "bench_e2e: --shape B,H,L,D\n");
                return 2;
            }
            B = b;
            H = h;
            L = l;
            D = d;
        } else {
            fprintf(stderr, "usage: bench_e2e [--reps N] [--shape B,H,L,D] [--threads N]\n");
            return 2;
        }
    }
    if (reps < 1 || reps > 100)
        reps = 3;
    double *t = calloc((size_t)reps, sizeof *t);
    eng_error eerr;
    eng_pool *pool = eng_pool_new(threads, &eerr);
    if (!pool || !t) {
        fprintf(stderr, "bench_e2e: %s\n", pool ? "out of memory" : eerr.message);
        return 1;
    }
    threads = eng_pool_threads(pool);
    eng_buf_cache_limit((size_t)256 << 20); /* as the daemon's default --buffer-cache-bytes */
    n_in = (size_t)(B * H * L * D);
    q = random_floats(n_in, 1);
    k = random_floats(n_in, 2);
    v = random_floats(n_in, 3);
    printf("e2e shape=(%lld,%lld,%lld,%lld) fp32 no-mask threads=%d reps=%d\n", (long long)B,
           (long long)H, (long long)L, (long long)D, threads, reps);

    /* Engine alone. */
    float *out = api__aligned_alloc(n_in * 4), *first = api__aligned_alloc(n_in * 4);
    eng_sdpa_args a;
    memset(&a, 0, sizeof a);
    a.q = eng_view_contiguous(q, B, H, L, D);
    a.k = eng_view_contiguous(k, B, H, L, D);
    a.v = eng_view_contiguous(v, B, H, L, D);
    a.out = eng_view_contiguous(out, B, H, L, D);
    if (eng_sdpa(pool, &a, NULL, &eerr) != ENG_OK) {
        fprintf(stderr, "bench_e2e: eng_sdpa: %s\n", eerr.message);
        return 1;
    }
    memcpy(first, out, n_in * 4);
    for (int r = 0; r < reps; r++) {
        int64_t t0 = eng_now_ns();
        eng_sdpa(pool, &a, NULL, &eerr);
        t[r] = ms_since(t0);
    }
    report("engine eng_sdpa", t, n_in * 12, n_in * 4, memcmp(out, first, n_in * 4) == 0);

    size_t v2_len, v2_hlen, nat_len;
    attn_problem problem = {.q = q, .k = k, .v = v, .shape = {B, H, L, D}};
    char *v2 = attn_body_v2(&problem, &v2_len, &v2_hlen);
    char *nat = attn_body_native(&problem, &nat_len);
    if (!v2 || !nat) {
        fprintf(stderr, "bench_e2e: out of memory\n");
        return 1;
    }
    char hl_value[32], hl_header[64];
    snprintf(hl_value, sizeof hl_value, "%zu", v2_hlen);
    snprintf(hl_header, sizeof hl_header, "Inference-Header-Content-Length: %zu", v2_hlen);

    /* api/ in this process. */
    api_budget *budget = api_budget_new((size_t)8 << 30);
    for (int which = 0; which < 2; which++) {
        api_lease lease;
        api_call call = {.pool = pool, .lease = &lease, .model = "sdpa"};
        api_reply reply;
        bool ok = true;
        size_t down = 0;
        call.body = which == 0 ? v2 : nat;
        call.body_len = which == 0 ? v2_len : nat_len;
        call.inference_header_length = which == 0 ? hl_value : NULL;
        for (int r = -1; r < reps; r++) {
            int64_t t0 = eng_now_ns();
            api_lease_start(&lease, budget, t0, 0);
            if (which == 0)
                api_v2_infer(&call, &reply);
            else
                api_attention(&call, &reply);
            if (r >= 0)
                t[r] = ms_since(t0);
            ok = ok && reply.status == 200 &&
                 same_output(reply.body, reply.body_len, (size_t)reply.inference_header_len,
                             which == 0, first);
            down = reply.body_len;
            api_reply_free(&reply);
            api_lease_end(&lease);
        }
        report(which == 0 ? "api v2 binary fp32" : "api native base64 json", t, call.body_len, down,
               ok);
    }

    /* Real daemons over loopback: plain, and TLS with a certificate made now. */
    daemon_proc d, ds;
    tls_files pki;
    bool tls = tls_files_make(&pki) == 0;
    char nthreads[16];
    snprintf(nthreads, sizeof nthreads, "%d", threads);
    char grpc_port_file[64];
    snprintf(grpc_port_file, sizeof grpc_port_file, "/tmp/attnd_bench_grpc.%d", (int)getpid());
    const char *const args[] = {"--threads",
                                nthreads,
                                "--max-body-bytes",
                                "1GiB",
                                "--max-memory-bytes",
                                "8GiB",
                                "--grpc-port",
                                "0",
                                "--grpc-port-file",
                                grpc_port_file,
                                NULL};
    const char *const tls_args[] = {
        "--threads", nthreads,     "--max-body-bytes", "1GiB",      "--max-memory-bytes",
        "8GiB",      "--tls-cert", pki.server_cert,    "--tls-key", pki.server_key,
        NULL};
    curl_global_init(CURL_GLOBAL_DEFAULT);
    if (daemon_start(&d, args) != 0 || (tls && daemon_start(&ds, tls_args) != 0)) {
        fprintf(stderr, "bench_e2e: cannot start attnd ($ATTND_BIN)\n");
        return 1;
    }
    CURL *h = curl_easy_init();
    CURL *hs = tls ? https_handle_new(&pki, TLS_CLIENT_NONE) : NULL;
    const char *v2_headers[] = {"Content-Type: application/octet-stream", hl_header, NULL};
    {
        reply_buf r = {{0}, 0};
        bool ok = true;
        for (int i = -1; i < reps; i++) {
            int64_t t0 = eng_now_ns();
            long status =
                post(h, "http", d.port, "/v2/models/sdpa/infer", v2_headers, v2, v2_len, &r);
            if (i >= 0)
                t[i] = ms_since(t0);
            ok = ok && status == 200 &&
                 same_output(r.body.data, r.body.len, r.header_len, true, first);
        }
        report("http v2 binary fp32", t, v2_len, r.body.len, ok);
        free(r.body.data);
    }
    {
        FILE *f = fopen(grpc_port_file, "r");
        int grpc_port = 0;
        if (!f || fscanf(f, "%d", &grpc_port) != 1)
            grpc_port = 0;
        if (f)
            fclose(f);
        unlink(grpc_port_file);
        if (grpc_port > 0)
            grpc_lines(grpc_port, t, first);
        else
            printf("grpc lines skipped: no --grpc-port-file\n");
    }
    {
        double *ts = calloc((size_t)reps, sizeof *ts);
        conn_case c[2] = {{.scheme = "http", .port = d.port, .proc = &d, .h = h, .t = t},
                          {.scheme = "https",
                           .port = tls ? ds.port : 0,
                           .proc = tls ? &ds : NULL,
                           .h = hs,
                           .t = ts}};
        int n = tls ? 2 : 1;
        if (!ts)
            return 1;
        if (!tls)
            printf("https lines skipped: no test certificate (openssl)\n");
        plain_and_tls("native base64 json", c, n, nat, nat_len, first);
        plain_and_tls("small json (per req)", c, n, NULL, sizeof small_body - 1, NULL);
        free(c[0].r.body.data);
        free(c[1].r.body.data);
        free(ts);
    }
    curl_easy_cleanup(h);
    if (hs)
        curl_easy_cleanup(hs);
    daemon_stop(&d);
    if (tls) {
        daemon_stop(&ds);
        tls_files_remove(&pki);
    }
    curl_global_cleanup();

    api_budget_free(budget);
    free(v2);
    free(nat);
    free(out);
    free(first);
    free(q);
    free(k);
    free(v);
    free(t);
    eng_pool_free(pool);
    return 0;
}
