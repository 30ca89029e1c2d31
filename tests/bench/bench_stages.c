/*
 * bench_stages.c - where a large request's time goes, and what HTTP leaves of the engine's
 * speed. A real attnd ($ATTND_BIN, --threads equal to this machine's CPUs) is sent one attention
 * problem at a time over one kept-alive connection, as
 *
 *   native_b64   POST /v1/attention, base64 float32 in and out;
 *   v2_binary    POST /v2/models/sdpa/infer, binary tensors in and out.
 *
 * Stages (default (1, 16, 1024, 64), no mask: a 16 MiB base64 body and a 5.3 MiB reply): the
 * reply's Server-Timing (docs/http-api.md) splits the request into receive, copy, queue,
 * parse, decode, compute and encode; send is what the client measured beyond their sum (the
 * reply's transfer and the client's own side). Of --reps requests after a warm-up, the one
 * with the median wall time is printed: a line of milliseconds with the engine's GFLOPS in
 * that request (its compute stage) against the in-register FMA loop of the kernel set in use
 * (tests/bench/harness), measured right after, then a line of each stage's share of the total.
 *
 *   stages native_b64 b=1 h=16 l=1024 d=64 causal=0 threads=2 total_ms=... receive_ms=...
 *          (a field per stage) send_ms=... engine_gflops=... engine_peak_ratio=... output=exact
 *   stages native_b64 shares receive=... (a field per stage) send=...
 *
 * Over HTTP and gRPC (default (1, 8, 8192, 64)), causal and not: the engine alone in this
 * process (eng_sdpa on a pool of the daemon's size), each route over HTTP, and ModelInfer with
 * raw tensors over one HTTP/2 connection to the daemon's --grpc-port (tests/support/grpc.c), in
 * turns (engine, native_b64, v2_binary, grpc_raw, engine, ...) so that the machine's drift
 * weighs on all alike; the fastest of --reps each. http_engine_ratio is the GFLOPS over HTTP
 * (the client's wall time) over the engine's alone; compute_share the same quotient within the
 * fastest HTTP request (its compute stage over its wall time), which the machine's drift
 * between runs cannot move; grpc_engine_ratio is http_engine_ratio's for the gRPC call.
 *
 *   http native_b64 b=1 h=8 l=8192 d=64 causal=0 http_ms=... http_gflops=... engine_ms=...
 *        engine_gflops=... http_engine_ratio=... compute_share=... output=exact
 *   grpc grpc_raw b=1 h=8 l=8192 d=64 causal=0 grpc_ms=... grpc_gflops=... engine_ms=...
 *        engine_gflops=... grpc_engine_ratio=... output=exact
 *
 * GFLOPS count useful work: 4·B·H·L·S·D, halved for causal. Every reply's output is compared
 * with the engine's, bit for bit; a request that fails or differs prints FAILED or DIFFERS and
 * the bench exits 1.
 *
 *     build/tests/bench/bench_stages [--reps N] [--stages B,H,L,D] [--http B,H,L,D]
 *
 * Absolute times on a shared machine drift; compare the lines of one run.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/core/memory.h"
#include "tests/bench/harness/harness.h"
#include "tests/support/attention_bodies.h"
#include "tests/support/daemon.h"
#include "tests/support/engine_env.h"
#include "tests/support/grpc.h"
#include "tests/support/rng.h"

enum { N_STAGES = 7, MAX_REPS = 50 };

/* Server-Timing's stages, in the order they happen. */
static const char *const stage_names[N_STAGES] = {"receive", "copy",    "queue", "parse",
                                                  "decode",  "compute", "encode"};
enum { COMPUTE = 5 };

static int reps = 5;

/* One problem: its tensors, the engine's output for it, and its bodies. */
typedef struct {
    attn_problem p;
    float *q, *k, *v, *want;
    size_t count;
    char *native, *v2, *grpc;
    size_t native_len, v2_len, v2_header_len, grpc_len;
} problem;

/* A route's case: how its body is sent. */
typedef struct {
    const char *name;
    bool v2;
} route;

static const route routes[2] = {{"native_b64", false}, {"v2_binary", true}};

/* What one request took: the client's wall time and the server's stages, in ms. */
typedef struct {
    double wall_ms, stage_ms[N_STAGES];
    size_t reply_bytes;
    bool ok, exact;
} measured;

static float *tensor_alloc(size_t n)
{
    float *x = api__aligned_alloc(n * sizeof *x);
    if (!x) {
        fprintf(stderr, "bench_stages: out of memory\n");
        exit(1);
    }
    return x;
}

static float *random_tensor(size_t n, uint64_t seed)
{
    float *x = tensor_alloc(n);
    for (size_t i = 0; i < n; i++)
        x[i] = rng_sym(&seed, 1.0);
    return x;
}

static double useful_flops(const attn_problem *p)
{
    double f = 4.0 * (double)(p->shape[0] * p->shape[1]) * (double)p->shape[2] *
               (double)p->shape[2] * (double)p->shape[3];
    return p->causal ? f / 2 : f;
}

/* The engine alone on `pool`: the problem's output into `out`, the time in seconds (< 0 on
 * failure). */
static double engine_once(eng_pool *pool, const problem *pb, float *out)
{
    const int64_t *s = pb->p.shape;
    eng_sdpa_args a;
    eng_error err;
    memset(&a, 0, sizeof a);
    a.q = eng_view_contiguous(pb->q, s[0], s[1], s[2], s[3]);
    a.k = eng_view_contiguous(pb->k, s[0], s[1], s[2], s[3]);
    a.v = eng_view_contiguous(pb->v, s[0], s[1], s[2], s[3]);
    a.out = eng_view_contiguous(out, s[0], s[1], s[2], s[3]);
    a.causal = pb->p.causal;
    double t0 = bench_seconds();
    if (eng_sdpa(pool, &a, NULL, &err) != ENG_OK) {
        fprintf(stderr, "bench_stages: eng_sdpa: %s\n", err.message);
        return -1;
    }
    return bench_seconds() - t0;
}

/* The problem's tensors, the engine's output and its bodies. */
static bool problem_make(problem *pb, const int64_t shape[4], bool causal, eng_pool *pool)
{
    memset(pb, 0, sizeof *pb);
    pb->count = (size_t)(shape[0] * shape[1] * shape[2] * shape[3]);
    pb->q = random_tensor(pb->count, 1);
    pb->k = random_tensor(pb->count, 2);
    pb->v = random_tensor(pb->count, 3);
    pb->want = tensor_alloc(pb->count);
    pb->p = (attn_problem){.q = pb->q, .k = pb->k, .v = pb->v, .causal = causal};
    memcpy(pb->p.shape, shape, sizeof pb->p.shape);
    pb->native = attn_body_native(&pb->p, &pb->native_len);
    pb->v2 = attn_body_v2(&pb->p, &pb->v2_len, &pb->v2_header_len);
    pb->grpc = attn_body_grpc(&pb->p, "sdpa", &pb->grpc_len);
    return pb->native && pb->v2 && pb->grpc && engine_once(pool, pb, pb->want) >= 0;
}

static void problem_free(problem *pb)
{
    free(pb->q);
    free(pb->k);
    free(pb->v);
    free(pb->want);
    free(pb->native);
    free(pb->v2);
    free(pb->grpc);
}

/* One request of route `r` for problem `pb` over connection `h`. */
static measured post_once(void *h, int port, const problem *pb, const route *r)
{
    static const char *const json[] = {"Content-Type: application/json", NULL};
    char hl[80];
    snprintf(hl, sizeof hl, "Inference-Header-Content-Length: %zu", pb->v2_header_len);
    const char *const binary[] = {"Content-Type: application/octet-stream", hl, NULL};
    measured m = {0};
    http_resp resp;
    long status =
        r->v2 ? http_do(h, port, "POST", "/v2/models/sdpa/infer", binary, pb->v2, pb->v2_len, &resp)
              : http_do(h, port, "POST", "/v1/attention", json, pb->native, pb->native_len, &resp);
    m.wall_ms = resp.seconds * 1e3;
    m.ok = status == 200;
    for (int i = 0; i < N_STAGES; i++) {
        m.stage_ms[i] = server_timing_ms(resp.server_timing, stage_names[i]);
        m.ok = m.ok && m.stage_ms[i] >= 0;
    }
    attn_reply reply = {.body = resp.body,
                        .len = resp.body_len,
                        .header_len = (size_t)strtoull(resp.inference_header_len, NULL, 10),
                        .v2 = r->v2};
    m.exact = m.ok && attn_reply_output(&reply, pb->want, pb->count);
    m.reply_bytes = resp.body_len;
    if (status != 200)
        fprintf(stderr, "bench_stages: %s answered %ld: %.200s\n", r->name, status,
                resp.body ? resp.body : resp.error);
    http_resp_free(&resp);
    return m;
}

/* One ModelInfer call of problem `pb` on client `c`: its wall time (ms) and whether its output
 * is the engine's. */
static measured grpc_once(grpc_client *c, const problem *pb)
{
    grpc_stream st = {.body = pb->grpc, .body_len = pb->grpc_len};
    measured m = {0};
    size_t n = 0;
    double t0 = bench_seconds();
    m.ok = grpc_start(c, "/inference.GRPCInferenceService/ModelInfer", NULL, &st) == 0 &&
           grpc_wait(c, &st, 600000) && st.grpc_status == 0;
    m.wall_ms = (bench_seconds() - t0) * 1e3;
    const char *msg = m.ok ? grpc_message_at(&st, 0, &n) : NULL;
    m.exact = m.ok && attn_grpc_output(msg, n, pb->want, pb->count);
    if (!m.ok)
        fprintf(stderr, "bench_stages: grpc_raw answered %d: %.200s\n", st.grpc_status, st.message);
    grpc_stream_free(&st);
    return m;
}

static int by_wall(const void *a, const void *b)
{
    double x = ((const measured *)a)->wall_ms, y = ((const measured *)b)->wall_ms;
    return x < y ? -1 : x > y;
}

static const char *verdict(bool ok, bool exact)
{
    return !ok ? "FAILED" : exact ? "exact" : "DIFFERS";
}

/* The stage lines of route `r`: --reps requests after a warm-up, the median one printed.
 * Returns whether every request succeeded with the engine's output. */
static bool stage_lines(void *h, int port, const problem *pb, const route *r, int threads)
{
    measured m[MAX_REPS];
    bool ok = true, exact = true;
    post_once(h, port, pb, r);
    for (int i = 0; i < reps; i++) {
        m[i] = post_once(h, port, pb, r);
        ok = ok && m[i].ok;
        exact = exact && m[i].exact;
    }
    qsort(m, (size_t)reps, sizeof m[0], by_wall);
    const measured *med = &m[reps / 2];
    double peak = bench_peak_gflops(eng_kernels_name(), threads), sum = 0;
    double compute_s = med->stage_ms[COMPUTE] / 1e3;
    double gflops = compute_s > 0 ? useful_flops(&pb->p) / compute_s * 1e-9 : 0;
    const int64_t *s = pb->p.shape;
    printf("stages %s b=%lld h=%lld l=%lld d=%lld causal=%d threads=%d total_ms=%.2f", r->name,
           (long long)s[0], (long long)s[1], (long long)s[2], (long long)s[3], pb->p.causal,
           threads, med->wall_ms);
    for (int i = 0; i < N_STAGES; i++) {
        printf(" %s_ms=%.2f", stage_names[i], med->stage_ms[i]);
        sum += med->stage_ms[i];
    }
    double send_ms = med->wall_ms > sum ? med->wall_ms - sum : 0;
    printf(" send_ms=%.2f request_mb=%.1f reply_mb=%.1f engine_gflops=%.1f kernels=%s "
           "peak_gflops=%.1f engine_peak_ratio=%.2f output=%s\n",
           send_ms, (double)(r->v2 ? pb->v2_len : pb->native_len) / 1048576.0,
           (double)med->reply_bytes / 1048576.0, gflops, eng_kernels_name(), peak,
           peak > 0 ? gflops / peak : 0, verdict(ok, exact));
    printf("stages %s shares", r->name);
    for (int i = 0; i < N_STAGES; i++)
        printf(" %s=%.2f", stage_names[i], med->stage_ms[i] / med->wall_ms);
    printf(" send=%.2f\n", send_ms / med->wall_ms);
    fflush(stdout);
    return ok && exact;
}

/* The engine alone, both routes over HTTP and ModelInfer over gRPC (client `g`), in turns, the
 * fastest of --reps each; a line per route. Returns whether every request succeeded with the
 * engine's output. */
static bool http_lines(void *h, int port, grpc_client *g, const problem *pb, eng_pool *pool,
                       int threads)
{
    double best_engine = 1e30, best_http[2] = {1e30, 1e30}, best_compute[2] = {0, 0};
    double best_grpc = 1e30;
    bool ok[2] = {true, true}, exact[2] = {true, true}, grpc_ok = true;
    float *out = api__aligned_alloc(pb->count * sizeof *out);
    if (!out)
        return false;
    for (int i = -1; i < reps; i++) {
        double e = engine_once(pool, pb, out);
        if (i >= 0 && e >= 0 && e < best_engine)
            best_engine = e;
        for (int r = 0; r < 2; r++) {
            measured m = post_once(h, port, pb, &routes[r]);
            ok[r] = ok[r] && m.ok;
            exact[r] = exact[r] && m.exact;
            if (i >= 0 && m.wall_ms / 1e3 < best_http[r]) {
                best_http[r] = m.wall_ms / 1e3;
                best_compute[r] = m.stage_ms[COMPUTE] / 1e3;
            }
        }
        measured m = grpc_once(g, pb);
        grpc_ok = grpc_ok && m.ok && m.exact;
        if (i >= 0 && m.wall_ms / 1e3 < best_grpc)
            best_grpc = m.wall_ms / 1e3;
    }
    bool engine_exact = memcmp(out, pb->want, pb->count * sizeof *out) == 0;
    free(out);
    double flops = useful_flops(&pb->p), peak = bench_peak_gflops(eng_kernels_name(), threads);
    double engine_gflops = flops / best_engine * 1e-9;
    const int64_t *s = pb->p.shape;
    for (int r = 0; r < 2; r++) {
        double http_gflops = flops / best_http[r] * 1e-9;
        printf("http %s b=%lld h=%lld l=%lld d=%lld causal=%d threads=%d http_ms=%.1f "
               "http_gflops=%.1f engine_ms=%.1f engine_gflops=%.1f http_engine_ratio=%.2f "
               "compute_ms=%.1f compute_share=%.2f kernels=%s peak_gflops=%.1f "
               "engine_peak_ratio=%.2f http_peak_ratio=%.2f output=%s\n",
               routes[r].name, (long long)s[0], (long long)s[1], (long long)s[2], (long long)s[3],
               pb->p.causal, threads, best_http[r] * 1e3, http_gflops, best_engine * 1e3,
               engine_gflops, http_gflops / engine_gflops, best_compute[r] * 1e3,
               best_compute[r] / best_http[r], eng_kernels_name(), peak,
               peak > 0 ? engine_gflops / peak : 0, peak > 0 ? http_gflops / peak : 0,
               verdict(ok[r], exact[r] && engine_exact));
    }
    double grpc_gflops = flops / best_grpc * 1e-9;
    printf("grpc grpc_raw b=%lld h=%lld l=%lld d=%lld causal=%d threads=%d grpc_ms=%.1f "
           "grpc_gflops=%.1f engine_ms=%.1f engine_gflops=%.1f grpc_engine_ratio=%.2f kernels=%s "
           "output=%s\n",
           (long long)s[0], (long long)s[1], (long long)s[2], (long long)s[3], pb->p.causal,
           threads, best_grpc * 1e3, grpc_gflops, best_engine * 1e3, engine_gflops,
           grpc_gflops / engine_gflops, eng_kernels_name(), verdict(grpc_ok, engine_exact));
    fflush(stdout);
    return ok[0] && ok[1] && exact[0] && exact[1] && engine_exact && grpc_ok;
}

static bool parse_shape(const char *text, int64_t shape[4])
{
    long long b, h, l, d;
    if (sscanf(text, "%lld,%lld,%lld,%lld", &b, &h, &l, &d) != 4 || b < 1 || h < 1 || l < 1 ||
        d < 1)
        return false;
    shape[0] = b;
    shape[1] = h;
    shape[2] = l;
    shape[3] = d;
    return true;
}

int main(int argc, char **argv)
{
    int64_t stage_shape[4] = {1, 16, 1024, 64}, http_shape[4] = {1, 8, 8192, 64};
    bool usage = false;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!val)
            usage = true;
        else if (strcmp(arg, "--reps") == 0)
            reps = (int)strtol(val, NULL, 10);
        else if (strcmp(arg, "--stages") == 0)
            usage = usage || !parse_shape(val, stage_shape);
        else if (strcmp(arg, "--http") == 0)
            usage = usage || !parse_shape(val, http_shape);
        else
            usage = true;
        i++;
    }
    if (usage || reps < 1 || reps > MAX_REPS) {
        fprintf(stderr, "usage: bench_stages [--reps N] [--stages B,H,L,D] [--http B,H,L,D]\n");
        return 2;
    }
    char why[320];
    if (test_engine_init(why, sizeof why) != TEST_ENGINE_READY) {
        fprintf(stderr, "bench_stages: %s\n", why);
        return 2;
    }
    int threads = eng_cpu_count();
    eng_error err;
    eng_pool *pool = eng_pool_new(threads, &err);
    if (!pool) {
        fprintf(stderr, "bench_stages: %s\n", err.message);
        return 1;
    }
    eng_buf_cache_limit((size_t)256 << 20); /* as the daemon's default --buffer-cache-bytes */
    char nthreads[16];
    snprintf(nthreads, sizeof nthreads, "%d", threads);
    const char *const args[] = {
        "--threads", nthreads, "--max-body-bytes", "1GiB", "--max-memory-bytes", "8GiB", NULL};
    daemon_proc d;
    grpc_client g;
    int grpc_port;
    if (daemon_start_grpc(&d, args, &grpc_port) != 0 || grpc_client_open(&g, grpc_port) != 0) {
        fprintf(stderr, "bench_stages: cannot start attnd ($ATTND_BIN) or reach its gRPC port\n");
        return 1;
    }
    void *h = http_handle_new();
    bool all = true;
    problem pb;
    if (!problem_make(&pb, stage_shape, false, pool)) {
        fprintf(stderr, "bench_stages: cannot make the stages' problem\n");
        return 1;
    }
    for (int r = 0; r < 2; r++)
        all = stage_lines(h, d.port, &pb, &routes[r], threads) && all;
    problem_free(&pb);
    for (int causal = 0; causal < 2; causal++) {
        if (!problem_make(&pb, http_shape, causal, pool)) {
            fprintf(stderr, "bench_stages: cannot make the HTTP problem\n");
            return 1;
        }
        all = http_lines(h, d.port, &g, &pb, pool, threads) && all;
        problem_free(&pb);
    }
    http_handle_free(h);
    grpc_client_close(&g);
    daemon_stop(&d);
    eng_pool_free(pool);
    return all ? 0 : 1;
}
