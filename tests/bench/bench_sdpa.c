/*
 * bench_sdpa.c - how fast eng_sdpa is, as a ratio to OpenBLAS sgemm measured in the same run.
 *
 * Absolute times drift on a shared machine; the ratio to a 2048^3 sgemm on the same number of
 * threads, measured minutes apart in one run, does not drift much. Each case runs in its own
 * process (this program re-executes itself with --case N) so that its peak RSS is its own.
 * One line per case, in the fixed form tools read:
 *
 *   sdpa b=1 h=8 l=8192 s=8192 d=64 causal=0 ms=612.3 gflops=224.5 sgemm_gflops=246.0 ratio=0.91
 * rss_mb=140
 *
 * gflops counts useful work: 4*B*H*L*S*D, halved for causal self-attention (L = S). Decode
 * cases add the rate at which K and V are read, against a streaming read of memory measured
 * in the same run.
 */
#include <cblas.h>
#include <errno.h>
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/engine.h"

typedef struct {
    int64_t b, h, l, s, d;
    bool causal;
} bench_case;

static const bench_case cases[] = {
    {1, 8, 2048, 2048, 64, false},   {1, 8, 2048, 2048, 64, true},
    {1, 8, 8192, 8192, 64, false},   {1, 8, 8192, 8192, 64, true},
    {1, 1, 16384, 16384, 64, false}, {1, 1, 16384, 16384, 64, true},
    {4, 16, 1024, 1024, 64, false},  {4, 16, 1024, 1024, 64, true},
    {1, 8, 256, 8192, 64, false},  /* cross-attention */
    {1, 32, 1, 32768, 128, false}, /* decode: one new token against a long cache */
    {1, 1, 65536, 65536, 64, true},
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

static double seconds(void)
{
    return (double)eng_now_ns() * 1e-9;
}

static float *random_floats(size_t n, unsigned seed)
{
    float *x = malloc(n * sizeof(float));
    if (!x) {
        fprintf(stderr, "bench: out of memory for %zu floats\n", n);
        exit(1);
    }
    uint32_t state = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        state = state * 1664525u + 1013904223u;
        x[i] = (float)(state >> 8) / (float)(1u << 24) * 2.0f - 1.0f;
    }
    return x;
}

/* Best of a few runs, at least `min_total` seconds of them. */
typedef eng_status (*timed_fn)(void *ctx);

static double best_seconds(timed_fn fn, void *ctx, double min_total)
{
    if (fn(ctx) != ENG_OK) /* warm-up: page faults, scratch, BLAS buffers */
        return -1;
    double best = 1e30, total = 0;
    for (int rep = 0; rep < 10 && (rep < 3 || total < min_total); rep++) {
        double t0 = seconds();
        if (fn(ctx) != ENG_OK)
            return -1;
        double t = seconds() - t0;
        total += t;
        best = t < best ? t : best;
    }
    return best;
}

/* ---- Baselines --------------------------------------------------------------------------------
 */

typedef struct {
    float *a, *b, *c;
    int n;
} sgemm_ctx;

static eng_status run_sgemm(void *p)
{
    sgemm_ctx *g = p;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, g->n, g->n, g->n, 1.0f, g->a, g->n, g->b,
                g->n, 0.0f, g->c, g->n);
    return ENG_OK;
}

static double sgemm_gflops(int threads)
{
    sgemm_ctx g = {.n = 2048};
    size_t n2 = (size_t)g.n * (size_t)g.n;
    g.a = random_floats(n2, 1);
    g.b = random_floats(n2, 2);
    g.c = random_floats(n2, 3);
    openblas_set_num_threads(threads);
    double t = best_seconds(run_sgemm, &g, 1.0);
    free(g.a);
    free(g.b);
    free(g.c);
    return 2.0 * g.n * (double)g.n * g.n / t * 1e-9;
}

typedef struct {
    const float *data;
    size_t n;
    double sum;
} stream_part;

/* Sums a part of memory with four vector accumulators: about as fast as memory can be read. */
__attribute__((target("avx2"))) static void *stream_read(void *p)
{
    stream_part *s = p;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    for (size_t i = 0; i + 32 <= s->n; i += 32)
        for (int k = 0; k < 4; k++)
            acc[k] = _mm256_add_ps(acc[k], _mm256_loadu_ps(s->data + i + 8 * (size_t)k));
    float lanes[8];
    _mm256_storeu_ps(lanes,
                     _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    for (int k = 0; k < 8; k++)
        s->sum += lanes[k];
    return NULL;
}

/* Memory read bandwidth in GB/s: `threads` threads summing disjoint parts of 1 GiB. */
static double memory_gbps(int threads)
{
    size_t n = (size_t)1 << 28;
    float *x = random_floats(n, 4);
    pthread_t tid[64];
    stream_part parts[64];
    if (threads > 64)
        threads = 64;
    double best = 1e30;
    for (int rep = 0; rep < 4; rep++) {
        double t0 = seconds();
        for (int i = 0; i < threads; i++) {
            parts[i] = (stream_part){x + n / (size_t)threads * (size_t)i, n / (size_t)threads, 0};
            pthread_create(&tid[i], NULL, stream_read, &parts[i]);
        }
        for (int i = 0; i < threads; i++)
            pthread_join(tid[i], NULL);
        double t = seconds() - t0;
        best = t < best ? t : best;
    }
    free(x);
    return (double)(n * sizeof(float)) / best * 1e-9;
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

/* Prints the case's seconds on stdout for the parent. */
static int run_case(const bench_case *bc)
{
    eng_error err;
    eng_pool *pool = eng_pool_new(0, &err);
    if (!pool) {
        fprintf(stderr, "bench: %s\n", err.message);
        return 1;
    }
    size_t nq = (size_t)(bc->b * bc->h * bc->l * bc->d),
           nk = (size_t)(bc->b * bc->h * bc->s * bc->d);
    sdpa_ctx c = {.pool = pool};
    float *q = random_floats(nq, 5), *k = random_floats(nk, 6), *v = random_floats(nk, 7);
    float *out = random_floats(nq, 8);
    c.args.q = eng_view_contiguous(q, bc->b, bc->h, bc->l, bc->d);
    c.args.k = eng_view_contiguous(k, bc->b, bc->h, bc->s, bc->d);
    c.args.v = eng_view_contiguous(v, bc->b, bc->h, bc->s, bc->d);
    c.args.out = eng_view_contiguous(out, bc->b, bc->h, bc->l, bc->d);
    c.args.causal = bc->causal;
    double t = best_seconds(run_sdpa, &c, 2.0);
    printf("%.9f\n", t);
    free(q);
    free(k);
    free(v);
    free(out);
    eng_pool_free(pool);
    return t > 0 ? 0 : 1;
}

/* Runs case `i` in a fresh process; returns its seconds and peak RSS in MiB. */
static int measure_case(const char *self, int i, double *secs, double *rss_mb)
{
    int fd[2];
    if (pipe(fd) != 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        char arg[16];
        snprintf(arg, sizeof arg, "%d", i);
        dup2(fd[1], STDOUT_FILENO);
        close(fd[0]);
        execl(self, self, "--case", arg, (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    char buf[64] = "";
    FILE *f = fdopen(fd[0], "r");
    int got = f && fgets(buf, sizeof buf, f) != NULL;
    if (f)
        fclose(f);
    int status = 0;
    struct rusage ru;
    if (wait4(pid, &status, 0, &ru) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0 || !got)
        return -1;
    *secs = strtod(buf, NULL);
    *rss_mb = (double)ru.ru_maxrss / 1024.0;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--case") == 0) {
        char *end;
        errno = 0;
        long i = strtol(argv[2], &end, 10);
        if (errno || *end || i < 0 || i >= NCASES)
            return 2;
        return run_case(&cases[i]);
    }
    int threads = eng_cpu_count();
    double base = sgemm_gflops(threads);
    double mem = memory_gbps(threads);
    printf("baseline sgemm n=2048 threads=%d gflops=%.1f; memory read gbps=%.1f\n", threads, base,
           mem);
    fflush(stdout);
    int failures = 0;
    for (int i = 0; i < NCASES; i++) {
        const bench_case *bc = &cases[i];
        double t, rss;
        if (measure_case("/proc/self/exe", i, &t, &rss) != 0) {
            printf("sdpa case %d failed\n", i);
            failures++;
            continue;
        }
        double flops =
            4.0 * (double)(bc->b * bc->h) * (double)bc->l * (double)bc->s * (double)bc->d;
        if (bc->causal && bc->l == bc->s)
            flops /= 2;
        double gflops = flops / t * 1e-9;
        printf("sdpa b=%lld h=%lld l=%lld s=%lld d=%lld causal=%d ms=%.1f gflops=%.1f "
               "sgemm_gflops=%.1f ratio=%.2f rss_mb=%.0f",
               (long long)bc->b, (long long)bc->h, (long long)bc->l, (long long)bc->s,
               (long long)bc->d, bc->causal, t * 1e3, gflops, base, gflops / base, rss);
        if (bc->l <= 4) {
            double kv = 2.0 * (double)(bc->b * bc->h * bc->s * bc->d) * sizeof(float);
            printf(" kv_gbps=%.1f mem_gbps=%.1f bw_ratio=%.2f", kv / t * 1e-9, mem,
                   kv / t * 1e-9 / mem);
        }
        printf("\n");
        fflush(stdout);
    }
    return failures ? 1 : 0;
}
