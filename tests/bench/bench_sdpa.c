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
 * in the same run.
 */
/* clang-format on */
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
#include "tests/bench/harness/harness.h"

typedef struct {
    int64_t b, h, l, s, d;
    bool causal;
    bool bf16; /* "precision": bfloat16; its line follows the same case's float32 line */
} bench_case;

static const bench_case cases[] = {
    {1, 8, 2048, 2048, 64, false, false},   {1, 8, 2048, 2048, 64, true, false},
    {1, 8, 8192, 8192, 64, false, false},   {1, 8, 8192, 8192, 64, true, false},
    {1, 1, 16384, 16384, 64, false, false}, {1, 1, 16384, 16384, 64, true, false},
    {4, 16, 1024, 1024, 64, false, false},  {4, 16, 1024, 1024, 64, true, false},
    {1, 8, 256, 8192, 64, false, false},  /* cross-attention */
    {1, 32, 1, 32768, 128, false, false}, /* decode: one new token against a long cache */
    {1, 1, 65536, 65536, 64, true, false},  {1, 8, 8192, 8192, 64, false, true},
    {1, 8, 2048, 2048, 128, false, false},  {1, 8, 2048, 2048, 128, false, true},
    {1, 8, 8192, 8192, 128, false, false},  {1, 8, 8192, 8192, 128, false, true},
    {1, 8, 8192, 8192, 128, true, false},   {1, 8, 8192, 8192, 128, true, true},
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

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
    float *x = bench_random_floats(n, 4, 1.0f);
    pthread_t tid[64];
    stream_part parts[64];
    if (threads > 64)
        threads = 64;
    double best = 1e30;
    for (int rep = 0; rep < 4; rep++) {
        double t0 = bench_seconds();
        for (int i = 0; i < threads; i++) {
            parts[i] = (stream_part){x + n / (size_t)threads * (size_t)i, n / (size_t)threads, 0};
            pthread_create(&tid[i], NULL, stream_read, &parts[i]);
        }
        for (int i = 0; i < threads; i++)
            pthread_join(tid[i], NULL);
        double t = bench_seconds() - t0;
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
    eng_buf_cache_limit((size_t)256 << 20); /* as the daemon's default --buffer-cache-bytes */
    size_t nq = (size_t)(bc->b * bc->h * bc->l * bc->d),
           nk = (size_t)(bc->b * bc->h * bc->s * bc->d);
    sdpa_ctx c = {.pool = pool};
    float *q = bench_random_floats(nq, 5, 1.0f), *k = bench_random_floats(nk, 6, 1.0f),
          *v = bench_random_floats(nk, 7, 1.0f);
    float *out = bench_random_floats(nq, 8, 1.0f);
    c.args.q = eng_view_contiguous(q, bc->b, bc->h, bc->l, bc->d);
    c.args.k = eng_view_contiguous(k, bc->b, bc->h, bc->s, bc->d);
    c.args.v = eng_view_contiguous(v, bc->b, bc->h, bc->s, bc->d);
    c.args.out = eng_view_contiguous(out, bc->b, bc->h, bc->l, bc->d);
    c.args.causal = bc->causal;
    c.args.precision = bc->bf16 ? ENG_PRECISION_BFLOAT16 : ENG_PRECISION_FLOAT32;
    double t = bench_best_seconds(run_sdpa, &c, 2.0);
    printf("%.9f\n", t);
    free(q);
    free(k);
    free(v);
    free(out);
    eng_pool_free(pool);
    return t > 0 ? 0 : 1;
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

int main(int argc, char **argv)
{
    int threads = eng_cpu_count();
    int blas_child = bench_child_blas(argc, argv, threads);
    if (blas_child >= 0)
        return blas_child;
    int child = bench_child_case(argc, argv, NCASES);
    if (child != -1)
        return child < 0 ? 2 : run_case(&cases[child]);
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
    double case_gflops[NCASES] = {0};
    for (int i = 0; i < NCASES; i++) {
        const bench_case *bc = &cases[i];
        double t, rss;
        /* The machine is shared: the peak (and for decoding the memory rate) is measured
         * again right before each case, so that the ratio compares like with like. bf16 cases
         * divide by the bf16 peak of the products they run. */
        double peak_now =
            bc->bf16 ? bench_peak_bf16_gflops(threads) : bench_peak_gflops(kernels, threads);
        if (bc->bf16 && peak_now == 0) {
            printf("sdpa b=%lld h=%lld l=%lld s=%lld d=%lld causal=%d precision=bf16 skipped: "
                   "kernel set %s computes bf16 requests in float32\n",
                   (long long)bc->b, (long long)bc->h, (long long)bc->l, (long long)bc->s,
                   (long long)bc->d, bc->causal, kernels);
            continue;
        }
        double mem_now = bc->l <= 4 ? memory_gbps(threads) : mem;
        if (bench_measure_case(i, &t, &rss) != 0) {
            printf("sdpa case %d failed\n", i);
            failures++;
            continue;
        }
        double flops =
            4.0 * (double)(bc->b * bc->h) * (double)bc->l * (double)bc->s * (double)bc->d;
        if (bc->causal && bc->l == bc->s)
            flops /= 2;
        double gflops = flops / t * 1e-9;
        case_gflops[i] = gflops;
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
        }
        if (bc->l <= 4) {
            double kv = 2.0 * (double)(bc->b * bc->h * bc->s * bc->d) * sizeof(float);
            printf(" kv_gbps=%.1f mem_gbps=%.1f bw_ratio=%.2f", kv / t * 1e-9, mem_now,
                   kv / t * 1e-9 / mem_now);
        }
        printf("\n");
        fflush(stdout);
    }
    return failures ? 1 : 0;
}
