/* clang-format off */
/*
 * bench_sdpa.c - how fast eng_sdpa is, as a ratio to OpenBLAS sgemm measured in the same run.
 *
 * Absolute times drift on a shared machine; the ratio to a 2048^3 sgemm on the same number of
 * threads, measured minutes apart in one run, does not drift much. Each case runs in its own
 * process (this program re-executes itself with --case N) so that its peak RSS is its own.
 * One line per case, in the fixed form tools read:
 *
 *   sdpa b=1 h=8 l=8192 s=8192 d=64 causal=0 ms=619.1 gflops=222.0 sgemm_gflops=250.3 ratio=0.89 rss_mb=71
 *
 * gflops counts useful work: 4*B*H*L*S*D, halved for causal self-attention (L = S). Decode
 * cases add the rate at which K and V are read, against a streaming read of memory measured
 * in the same run; a grouped-query case (kv_heads= on its line) counts its cache bytes once,
 * B*Hkv*S*(D+D)*4, as a decode step that reads each kv head once for its whole group does.
 * ATTND_BENCH_ONLY=decode runs the decode cases and session decode steps alone. The session lines (KV-cache decode steps, concurrent sessions, a prefill
 * against eng_sdpa) follow; see "Sessions" below.
 *
 * After the cases: a scaling line (the (1,8,8192,8192,128) case at one thread against all of
 * them, each against the FMA peak measured with it), and PyTorch's figure on the comparison
 * shapes (tests/bench/torch_case.py) when python3 imports torch, else a skip line with the
 * reason. bf16 lines carry the AMX tiles' peak (a TDPBF16PS loop) where the tiles are granted.
 * ATTND_BENCH_THREADS=N runs on N threads instead of every usable CPU; ATTND_BENCH_ONLY=comparison
 * runs only the shapes compared with PyTorch (and the scaling and torch lines).
 */
/* clang-format on */
#include <cblas.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/engine.h"
#include "tests/bench/harness/harness.h"
#include "tests/support/engine_env.h"

typedef struct {
    int64_t b, h, l, s, d;
    bool causal;
    bool bf16;   /* "precision": bfloat16; its line follows the same case's float32 line */
    int64_t hkv; /* key/value heads (grouped-query attention); 0: h */
} bench_case;

static const bench_case cases[] = {
    {1, 8, 2048, 2048, 64, false, false, 0},   {1, 8, 2048, 2048, 64, true, false, 0},
    {1, 8, 8192, 8192, 64, false, false, 0},   {1, 8, 8192, 8192, 64, true, false, 0},
    {1, 1, 16384, 16384, 64, false, false, 0}, {1, 1, 16384, 16384, 64, true, false, 0},
    {4, 16, 1024, 1024, 64, false, false, 0},  {4, 16, 1024, 1024, 64, true, false, 0},
    {1, 8, 256, 8192, 64, false, false, 0},  /* cross-attention */
    {1, 32, 1, 32768, 128, false, false, 0}, /* decode: one new token against a long cache */
    {1, 32, 1, 32768, 128, false, false, 8}, /* the same with 4 query heads per kv head */
    {1, 1, 65536, 65536, 64, true, false, 0},  {1, 8, 8192, 8192, 64, false, true, 0},
    {1, 8, 2048, 2048, 128, false, false, 0},  {1, 8, 2048, 2048, 128, false, true, 0},
    {1, 8, 8192, 8192, 128, false, false, 0},  {1, 8, 8192, 8192, 128, false, true, 0},
    {1, 8, 8192, 8192, 128, true, false, 0},   {1, 8, 8192, 8192, 128, true, true, 0},
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

/* Memory read bandwidth in GB/s: `threads` threads reading disjoint parts of 1 GiB (the best
 * of four). */
static double memory_gbps(int threads)
{
    size_t bytes = (size_t)1 << 30;
    double t = bench_stream_seconds(bytes, threads, 4);
    return t > 0 ? (double)bytes / t * 1e-9 : 0;
}

/* ---- One case (in a child process) ------------------------------------------------------------
 */

typedef struct {
    eng_pool *pool;
    eng_sdpa_args args;
} sdpa_ctx;

static eng_status run_sdpa(void *p)
{
    sdpa_ctx *c = p;
    eng_error err;
    eng_status st = eng_sdpa(c->pool, &c->args, NULL, &err);
    if (st != ENG_OK)
        fprintf(stderr, "bench: eng_sdpa: %s: %s\n", err.field, err.message);
    return st;
}

static int64_t kv_heads(const bench_case *bc)
{
    return bc->hkv > 0 ? bc->hkv : bc->h;
}

/* The threads of a run: ATTND_BENCH_THREADS when set (the scaling line's one-thread child),
 * else every CPU this process may use. */
static int bench_threads(void)
{
    const char *env = getenv("ATTND_BENCH_THREADS");
    long n = env ? strtol(env, NULL, 10) : 0;
    return n > 0 && n <= 1024 ? (int)n : eng_cpu_count();
}

/* Prints the case's seconds on stdout for the parent. */
static int run_case(const bench_case *bc)
{
    eng_error err;
    eng_pool *pool = eng_pool_new(bench_threads(), &err);
    if (!pool) {
        fprintf(stderr, "bench: %s\n", err.message);
        return 1;
    }
    eng_buf_cache_limit((size_t)256 << 20); /* as the daemon's default --buffer-cache-bytes */
    const int64_t hkv = kv_heads(bc);
    size_t nq = (size_t)(bc->b * bc->h * bc->l * bc->d), nk = (size_t)(bc->b * hkv * bc->s * bc->d);
    sdpa_ctx c = {.pool = pool};
    float *q = bench_random_floats(nq, 5, 1.0f), *k = bench_random_floats(nk, 6, 1.0f),
          *v = bench_random_floats(nk, 7, 1.0f);
    float *out = bench_random_floats(nq, 8, 1.0f);
    c.args.q = eng_view_contiguous(q, bc->b, bc->h, bc->l, bc->d);
    c.args.k = eng_view_contiguous(k, bc->b, hkv, bc->s, bc->d);
    c.args.v = eng_view_contiguous(v, bc->b, hkv, bc->s, bc->d);
    c.args.out = eng_view_contiguous(out, bc->b, bc->h, bc->l, bc->d);
    c.args.causal = bc->causal;
    c.args.precision = bc->bf16 ? ENG_PRECISION_BFLOAT16 : ENG_PRECISION_FLOAT32;
    double peak;
    double t = bench_best_seconds_and_peak(run_sdpa, &c, 2.0, bc->bf16, bench_threads(), &peak);
    printf("%.9f %.3f\n", t, peak);
    free(q);
    free(k);
    free(v);
    free(out);
    eng_pool_free(pool);
    return t > 0 ? 0 : 1;
}

/* ---- Sessions (KV cache, engine.h eng_kv_*) ---------------------------------------------------
 *
 * decode: one step (append one token, attend with one query row) on a cache of s tokens, its
 * K and V bytes against the streaming read measured right before (bw_ratio; the bound of issue
 * 16 is time <= 1.3 x bytes / stream, i.e. stream_ratio <= 1.3). concurrent: `seqs` sessions
 * of s tokens stepping at once from as many threads; aggregate K/V read against the stream.
 * prefill: s tokens into an empty session (append and causal attention) against eng_sdpa on
 * the same tensors, timed in turns in one process (sdpa_ratio = session rate / eng_sdpa rate).
 */
typedef enum { SESSION_DECODE, SESSION_CONCURRENT, SESSION_PREFILL } session_kind;

typedef struct {
    session_kind kind;
    int64_t seqs, h, hkv, s, d;
    eng_dtype dtype;
} session_case;

#define SESSION_BLOCK_TOKENS 64

static const session_case sessions[] = {
    {SESSION_DECODE, 1, 32, 32, 32768, 128, ENG_DTYPE_F32},
    {SESSION_DECODE, 1, 32, 32, 32768, 128, ENG_DTYPE_BF16},
    {SESSION_DECODE, 1, 32, 8, 32768, 128, ENG_DTYPE_F32}, /* grouped-query: 4 heads per kv head */
    {SESSION_DECODE, 1, 32, 8, 32768, 128, ENG_DTYPE_BF16},
    {SESSION_CONCURRENT, 64, 8, 8, 2048, 128, ENG_DTYPE_F32},
    {SESSION_CONCURRENT, 64, 8, 8, 2048, 128, ENG_DTYPE_BF16},
    {SESSION_PREFILL, 1, 8, 8, 8192, 64, ENG_DTYPE_F32},
};
#define NSESSIONS ((int)(sizeof sessions / sizeof sessions[0]))

static const char *dtype_name(eng_dtype dtype)
{
    return dtype == ENG_DTYPE_BF16 ? "bfloat16" : dtype == ENG_DTYPE_F16 ? "float16" : "float32";
}

/* K and V bytes of one session of the case. */
static double session_bytes(const session_case *sc)
{
    return 2.0 * (double)(sc->hkv * sc->s * sc->d) * (sc->dtype == ENG_DTYPE_F32 ? 4.0 : 2.0);
}

/* One session's state: the sequence, one new token's K and V, its query and output. */
typedef struct {
    eng_pool *pool;
    eng_kv_seq *seq;
    int64_t length; /* kept: each step first truncates back to length - n */
    eng_kv_rows k, v;
    eng_sdpa_args args;
    float *q, *out, *kv;
    int rounds;
} session_ctx;

/* Fills seq with `tokens` tokens of random K and V, appended 1024 at a time. */
static int session_fill(eng_kv_seq *seq, int64_t hkv, int64_t d, int64_t tokens)
{
    const int64_t chunk = 1024;
    float *x = bench_random_floats((size_t)(chunk * hkv * d), 11, 1.0f);
    for (int64_t at = 0; at < tokens; at += chunk) {
        int64_t n = tokens - at < chunk ? tokens - at : chunk;
        eng_kv_rows r = eng_kv_rows_f32(eng_view_contiguous(x, 1, hkv, n, d));
        eng_error err;
        if (eng_kv_seq_append(seq, &r, &r, &err) != ENG_OK) {
            fprintf(stderr, "bench: append: %s\n", err.message);
            free(x);
            return -1;
        }
    }
    free(x);
    return 0;
}

/* A session of sc's shape with s - n tokens cached and n new ones ready to step. */
static int session_init(session_ctx *c, eng_pool *pool, eng_kv_pool *kvp, const session_case *sc,
                        int64_t n, unsigned seed)
{
    memset(c, 0, sizeof *c);
    c->pool = pool;
    eng_error err;
    eng_kv_shape shape = {.num_kv_heads = sc->hkv, .head_dim = sc->d, .dtype = sc->dtype};
    c->seq = eng_kv_seq_new(kvp, &shape, &err);
    if (!c->seq) {
        fprintf(stderr, "bench: %s\n", err.message);
        return -1;
    }
    if (session_fill(c->seq, sc->hkv, sc->d, sc->s - n) != 0)
        return -1;
    c->length = sc->s;
    c->q = bench_random_floats((size_t)(sc->h * n * sc->d), seed, 1.0f);
    c->out = bench_random_floats((size_t)(sc->h * n * sc->d), seed + 1, 1.0f);
    c->kv = bench_random_floats((size_t)(sc->hkv * n * sc->d), seed + 2, 1.0f);
    c->k = eng_kv_rows_f32(eng_view_contiguous(c->kv, 1, sc->hkv, n, sc->d));
    c->v = c->k;
    c->args.q = eng_view_contiguous(c->q, 1, sc->h, n, sc->d);
    c->args.out = eng_view_contiguous(c->out, 1, sc->h, n, sc->d);
    c->args.causal = true;
    c->args.align = ENG_ALIGN_BOTTOM_RIGHT;
    c->rounds = 1;
    return 0;
}

static void session_free(session_ctx *c)
{
    eng_kv_seq_free(c->seq);
    free(c->q);
    free(c->out);
    free(c->kv);
}

/* `rounds` steps: truncate back by the new tokens, then append them and attend. */
static eng_status session_step(void *p)
{
    session_ctx *c = p;
    eng_error err;
    eng_status st = ENG_OK;
    for (int r = 0; r < c->rounds && st == ENG_OK; r++) {
        st = eng_kv_seq_truncate(c->seq, c->length - c->k.ne[2], &err);
        if (st == ENG_OK)
            st = eng_kv_step(c->pool, c->seq, &c->k, &c->v, &c->args, NULL, &err);
    }
    if (st != ENG_OK)
        fprintf(stderr, "bench: eng_kv_step: %s: %s\n", err.field, err.message);
    return st;
}

static void *session_thread(void *p)
{
    session_step(p);
    return NULL;
}

typedef struct {
    session_ctx *ctx;
    int n;
} session_group;

/* Every session of the group steps at once, one thread each. */
static eng_status sessions_step_all(void *p)
{
    session_group *g = p;
    pthread_t tid[64];
    for (int i = 0; i < g->n; i++)
        pthread_create(&tid[i], NULL, session_thread, &g->ctx[i]);
    for (int i = 0; i < g->n; i++)
        pthread_join(tid[i], NULL);
    return ENG_OK;
}

/* Prints the case's seconds (for prefill: the session's, then eng_sdpa's) for the parent. */
static int run_session_case(const session_case *sc)
{
    eng_error err;
    eng_pool *pool = eng_pool_new(0, &err);
    if (!pool) {
        fprintf(stderr, "bench: %s\n", err.message);
        return 1;
    }
    eng_buf_cache_limit((size_t)256 << 20);
    size_t capacity = (size_t)(session_bytes(sc) * (double)sc->seqs * 1.1) + ((size_t)64 << 20);
    eng_kv_pool *kvp = eng_kv_pool_new(capacity, SESSION_BLOCK_TOKENS, &err);
    if (!kvp) {
        fprintf(stderr, "bench: %s\n", err.message);
        return 1;
    }
    int rc = 1;
    if (sc->kind == SESSION_DECODE) {
        session_ctx c;
        if (session_init(&c, pool, kvp, sc, 1, 5) == 0) {
            double t = bench_best_seconds(session_step, &c, 2.0);
            printf("%.9f\n", t);
            rc = t > 0 ? 0 : 1;
        }
        session_free(&c);
    } else if (sc->kind == SESSION_CONCURRENT) {
        session_ctx c[64];
        session_group g = {.ctx = c, .n = (int)sc->seqs};
        int ok = 1;
        for (int i = 0; i < g.n; i++)
            if (session_init(&c[i], pool, kvp, sc, 1, 5 + (unsigned)i) != 0) {
                g.n = i + 1;
                ok = 0;
                break;
            }
        for (int i = 0; ok && i < g.n; i++)
            c[i].rounds = 2;
        if (ok) {
            double t = bench_best_seconds(sessions_step_all, &g, 2.0);
            printf("%.9f\n", t);
            rc = t > 0 ? 0 : 1;
        }
        for (int i = 0; i < g.n; i++)
            session_free(&c[i]);
    } else {
        session_ctx c;
        if (session_init(&c, pool, kvp, sc, sc->s, 5) == 0) {
            sdpa_ctx plain = {.pool = pool};
            plain.args = c.args;
            plain.args.k = eng_view_contiguous(c.kv, 1, sc->hkv, sc->s, sc->d);
            plain.args.v = plain.args.k;
            double best_session = 1e30, best_sdpa = 1e30;
            /* In turns, so that both see the same load on the shared machine. */
            for (int round = 0; round < 3; round++) {
                double ts = bench_best_seconds(session_step, &c, 1.0);
                double tp = bench_best_seconds(run_sdpa, &plain, 1.0);
                if (ts < 0 || tp < 0) {
                    best_session = -1;
                    break;
                }
                best_session = ts < best_session ? ts : best_session;
                best_sdpa = tp < best_sdpa ? tp : best_sdpa;
            }
            printf("%.9f %.9f\n", best_session, best_sdpa);
            rc = best_session > 0 ? 0 : 1;
        }
        session_free(&c);
    }
    eng_kv_pool_free(kvp);
    eng_pool_free(pool);
    return rc;
}

/* Runs the session cases (child indices from NCASES on; the decode steps alone when
 * decode_only) and prints their lines. */
static int run_session_cases(int threads, const char *kernels, bool decode_only)
{
    int failures = 0;
    for (int i = 0; i < NSESSIONS; i++) {
        const session_case *sc = &sessions[i];
        if (decode_only && sc->kind != SESSION_DECODE)
            continue;
        double mem_now = sc->kind == SESSION_PREFILL ? 0 : memory_gbps(threads);
        double values[2] = {0, 0}, rss;
        int want = sc->kind == SESSION_PREFILL ? 2 : 1;
        if (bench_measure_case_values(NCASES + i, values, want, &rss) != want) {
            printf("session case %d failed\n", i);
            failures++;
            continue;
        }
        double t = values[0];
        if (sc->kind == SESSION_PREFILL) {
            double flops = 4.0 * (double)sc->h * (double)sc->s * (double)sc->s * (double)sc->d / 2;
            printf("session prefill h=%lld kv_heads=%lld l=%lld d=%lld causal=1 cache=%s ms=%.1f "
                   "gflops=%.1f sdpa_ms=%.1f sdpa_gflops=%.1f sdpa_ratio=%.2f rss_mb=%.0f "
                   "kernels=%s\n",
                   (long long)sc->h, (long long)sc->hkv, (long long)sc->s, (long long)sc->d,
                   dtype_name(sc->dtype), t * 1e3, flops / t * 1e-9, values[1] * 1e3,
                   flops / values[1] * 1e-9, values[1] / t, rss, kernels);
        } else {
            double steps = sc->kind == SESSION_CONCURRENT ? 2.0 * (double)sc->seqs : 1.0;
            double bytes = session_bytes(sc) * steps, gbps = bytes / t * 1e-9;
            printf("session %s seqs=%lld h=%lld kv_heads=%lld s=%lld d=%lld cache=%s ms=%.2f "
                   "kv_gbps=%.1f mem_gbps=%.1f bw_ratio=%.2f stream_ratio=%.2f rss_mb=%.0f "
                   "kernels=%s\n",
                   sc->kind == SESSION_DECODE ? "decode" : "concurrent", (long long)sc->seqs,
                   (long long)sc->h, (long long)sc->hkv, (long long)sc->s, (long long)sc->d,
                   dtype_name(sc->dtype), t * 1e3 / steps, gbps, mem_now, gbps / mem_now,
                   mem_now / gbps, rss, kernels);
        }
        fflush(stdout);
    }
    return failures;
}

/* The float32 figure of the same shape measured earlier in this run, or 0. */
static double fp32_gflops(const bench_case *bc, const double *gflops)
{
    for (int i = 0; i < NCASES; i++) {
        const bench_case *c = &cases[i];
        if (!c->bf16 && c->b == bc->b && c->h == bc->h && c->l == bc->l && c->s == bc->s &&
            c->d == bc->d && c->causal == bc->causal)
            return gflops[i];
    }
    return 0;
}

/* GFLOPS of the case's useful work in t seconds. */
static double case_gflops_of(const bench_case *bc, double t)
{
    double flops = 4.0 * (double)(bc->b * bc->h) * (double)bc->l * (double)bc->s * (double)bc->d;
    if (bc->causal && bc->l == bc->s)
        flops /= 2;
    return flops / t * 1e-9;
}

/* The index of the case with this shape and precision, or -1. */
static int case_index(int64_t l, int64_t d, bool causal, bool bf16)
{
    for (int i = 0; i < NCASES; i++)
        if (cases[i].b == 1 && cases[i].h == 8 && cases[i].l == l && cases[i].s == l &&
            cases[i].d == d && cases[i].causal == causal && cases[i].bf16 == bf16 && !cases[i].hkv)
            return i;
    return -1;
}

/* The (1, 8, 8192, 8192, 128) case at one thread against the same case at all of them (measured
 * above), each against the FMA peak measured in turns with it: how close to linear the engine
 * scales, with the clock's drop under load taken out by the peaks. */
static void print_scaling(int threads, const double *gflops, const double *peaks)
{
    int i = case_index(8192, 128, false, false);
    if (i < 0 || gflops[i] <= 0)
        return;
    setenv("ATTND_BENCH_THREADS", "1", 1);
    double values[2], rss;
    int got = bench_measure_case_values(i, values, 2, &rss);
    unsetenv("ATTND_BENCH_THREADS");
    if (got != 2) {
        printf("scaling case %d failed at 1 thread\n", i);
        return;
    }
    double one = case_gflops_of(&cases[i], values[0]), one_ratio = one / values[1];
    double all_ratio = gflops[i] / peaks[i];
    const bench_case *bc = &cases[i];
    printf("scaling b=%lld h=%lld l=%lld s=%lld d=%lld causal=0 threads=1 gflops=%.1f "
           "peak_gflops=%.1f peak_ratio=%.2f threads=%d gflops=%.1f peak_gflops=%.1f "
           "peak_ratio=%.2f speedup=%.2f scaling_efficiency=%.2f\n",
           (long long)bc->b, (long long)bc->h, (long long)bc->l, (long long)bc->s, (long long)bc->d,
           one, values[1], one_ratio, threads, gflops[i], peaks[i], all_ratio, gflops[i] / one,
           all_ratio / one_ratio);
    fflush(stdout);
}

/* The (B, H, L, S, D) shapes compared with PyTorch: B = 1, H = 8, L = S. */
static const struct {
    int64_t l, d;
    bool causal;
} shapes[] = {
    {2048, 64, false}, {8192, 64, true}, {2048, 128, false}, {8192, 128, false}, {8192, 128, true}};
#define NSHAPES (sizeof shapes / sizeof shapes[0])

static bool compared_with_torch(const bench_case *bc)
{
    for (size_t s = 0; s < NSHAPES; s++)
        if (case_index(shapes[s].l, shapes[s].d, shapes[s].causal, bc->bf16) == bc - cases)
            return true;
    return false;
}

/* PyTorch's attention (tests/bench/torch_case.py) on the comparison shapes, beside
 * attnd's figure measured above: one line each, or one skip line saying why there is none. */
static void print_torch(int threads, const double *gflops)
{
    /* The exit status decides (an import may warn on stderr and still work); the error's last
     * line is the reason. */
    if (system("python3 -c 'import torch' >/dev/null 2>&1") != 0) {
        char why[256] = "";
        FILE *probe = popen("python3 -c 'import torch' 2>&1 | tail -n 1", "r");
        if (!probe || !fgets(why, sizeof why, probe))
            why[0] = '\0';
        if (probe)
            pclose(probe);
        why[strcspn(why, "\n")] = '\0';
        printf("torch skipped: python3 cannot import torch (%s)\n",
               why[0] ? why : "python3 did not run");
        return;
    }
    for (size_t s = 0; s < NSHAPES; s++) {
        for (int bf16 = 0; bf16 < 2; bf16++) {
            int i = case_index(shapes[s].l, shapes[s].d, shapes[s].causal, bf16);
            char cmd[256], api[64] = "?", version[64] = "?";
            snprintf(cmd, sizeof cmd,
                     "python3 tests/bench/torch_case.py 1 8 %lld %lld %lld %d %s %d",
                     (long long)shapes[s].l, (long long)shapes[s].l, (long long)shapes[s].d,
                     shapes[s].causal, bf16 ? "bfloat16" : "float32", threads);
            FILE *p = popen(cmd, "r");
            double t = 0;
            if (!p || fscanf(p, "%lf %63s %63s", &t, api, version) != 3)
                t = 0;
            if (p)
                pclose(p);
            if (t <= 0) {
                printf("torch b=1 h=8 l=%lld d=%lld causal=%d precision=%s failed\n",
                       (long long)shapes[s].l, (long long)shapes[s].d, shapes[s].causal,
                       bf16 ? "bf16" : "fp32");
                continue;
            }
            bench_case bc = {1,         8, shapes[s].l, shapes[s].l, shapes[s].d, shapes[s].causal,
                             bf16 != 0, 0};
            double torch_gflops = case_gflops_of(&bc, t);
            printf("torch b=1 h=8 l=%lld s=%lld d=%lld causal=%d precision=%s threads=%d ms=%.1f "
                   "gflops=%.1f api=%s torch=%s",
                   (long long)shapes[s].l, (long long)shapes[s].l, (long long)shapes[s].d,
                   shapes[s].causal, bf16 ? "bf16" : "fp32", threads, t * 1e3, torch_gflops, api,
                   version);
            if (i >= 0 && gflops[i] > 0)
                printf(" attnd_gflops=%.1f attnd_ratio=%.2f", gflops[i], gflops[i] / torch_gflops);
            printf("\n");
            fflush(stdout);
        }
    }
}

int main(int argc, char **argv)
{
    char why[320];
    if (test_engine_init(why, sizeof why) != TEST_ENGINE_READY) {
        fprintf(stderr, "bench_sdpa: %s\n", why);
        return 2;
    }
    int threads = bench_threads();
    int blas_child = bench_child_blas(argc, argv, threads);
    if (blas_child >= 0)
        return blas_child;
    int child = bench_child_case(argc, argv, NCASES + NSESSIONS);
    if (child != -1)
        return child < 0        ? 2
               : child < NCASES ? run_case(&cases[child])
                                : run_session_case(&sessions[child - NCASES]);
    const char *kernels = eng_kernels_name();
    double base = bench_sgemm_gflops(threads);
    double mem = memory_gbps(threads);
    double peak = bench_peak_gflops(kernels, threads);
    char best_core[32];
    double blas_best = bench_blas_best_gflops(best_core, sizeof best_core);
    printf("baseline sgemm n=2048 threads=%d gflops=%.1f; memory read gbps=%.1f; kernels=%s "
           "peak_gflops=%.1f; best OpenBLAS core %s gflops=%.1f\n",
           threads, base, mem, kernels, peak, best_core, blas_best);
    fflush(stdout);
    int failures = 0;
    double case_gflops[NCASES] = {0}, case_peak[NCASES] = {0};
    char tile_why[128];
    double tile_peak = bench_tile_peak_gflops(threads, tile_why, sizeof tile_why);
    /* ATTND_BENCH_ONLY=session runs the session section alone; =decode the decode shapes. */
    const char *only = getenv("ATTND_BENCH_ONLY");
    bool decode_only = only && strcmp(only, "decode") == 0;
    /* =comparison: the shapes of PyTorch's comparison alone, then the scaling and torch lines. */
    bool comparison_only = only && strcmp(only, "comparison") == 0;
    int ncases = only && strcmp(only, "session") == 0 ? 0 : NCASES;
    for (int i = 0; i < ncases; i++) {
        const bench_case *bc = &cases[i];
        if (decode_only && bc->l > 4)
            continue;
        if (comparison_only && !compared_with_torch(bc))
            continue;
        /* bf16 cases divide by the bf16 peak of the products they run. */
        if (bc->bf16 && !bench_peak_bf16_exists()) {
            printf("sdpa b=%lld h=%lld l=%lld s=%lld d=%lld causal=%d precision=bf16 skipped: "
                   "kernel set %s computes bf16 requests in float32\n",
                   (long long)bc->b, (long long)bc->h, (long long)bc->l, (long long)bc->s,
                   (long long)bc->d, bc->causal, kernels);
            continue;
        }
        /* The machine is shared: the memory rate of decoding is measured again right before
         * its case, and the child takes the peak in turns with the case's runs. */
        double mem_now = bc->l <= 4 ? memory_gbps(threads) : mem;
        double values[2], rss;
        if (bench_measure_case_values(i, values, 2, &rss) != 2) {
            printf("sdpa case %d failed\n", i);
            failures++;
            continue;
        }
        double t = values[0], peak_now = values[1];
        double flops =
            4.0 * (double)(bc->b * bc->h) * (double)bc->l * (double)bc->s * (double)bc->d;
        if (bc->causal && bc->l == bc->s)
            flops /= 2;
        double gflops = flops / t * 1e-9;
        case_gflops[i] = gflops;
        case_peak[i] = peak_now;
        printf("sdpa b=%lld h=%lld l=%lld s=%lld d=%lld causal=%d ms=%.1f gflops=%.1f "
               "sgemm_gflops=%.1f ratio=%.2f rss_mb=%.0f kernels=%s peak_gflops=%.1f "
               "peak_ratio=%.2f blas_best_gflops=%.1f",
               (long long)bc->b, (long long)bc->h, (long long)bc->l, (long long)bc->s,
               (long long)bc->d, bc->causal, t * 1e3, gflops, base, gflops / base, rss, kernels,
               peak_now, gflops / peak_now, blas_best);
        if (bc->bf16) {
            double fp32 = fp32_gflops(bc, case_gflops);
            eng_engine_info info;
            eng_engine_info_get(&info);
            printf(" precision=bf16 bf16_path=%s", info.bf16);
            if (fp32 > 0)
                printf(" fp32_ratio=%.2f", gflops / fp32);
            /* The tiles' peak, where they are granted, shows the room above the path that ran. */
            if (tile_peak > 0)
                printf(" tile_peak_gflops=%.1f tile_ratio=%.3f", tile_peak, gflops / tile_peak);
            else
                printf(" tiles=none (%s)", tile_why);
        }
        if (bc->l <= 4) {
            double kv = 2.0 * (double)(bc->b * kv_heads(bc) * bc->s * bc->d) * sizeof(float);
            printf(" kv_gbps=%.1f mem_gbps=%.1f bw_ratio=%.2f", kv / t * 1e-9, mem_now,
                   kv / t * 1e-9 / mem_now);
        }
        if (kv_heads(bc) != bc->h)
            printf(" kv_heads=%lld", (long long)kv_heads(bc));
        printf("\n");
        fflush(stdout);
    }
    if (ncases > 0 && !decode_only) {
        print_scaling(threads, case_gflops, case_peak);
        print_torch(threads, case_gflops);
    }
    failures += run_session_cases(threads, kernels, decode_only);
    return failures ? 1 : 0;
}
