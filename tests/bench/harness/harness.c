/* harness.c - the shared parts of the benchmarks (see harness.h). */
#include "harness.h"

#include "tests/support/rng.h"

#include <cblas.h>
#include <cpuid.h>
#include <errno.h>
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

double bench_seconds(void)
{
    return (double)eng_now_ns() * 1e-9;
}

float *bench_random_floats(size_t n, unsigned seed, float amp)
{
    /* On cache lines, as the daemon's tensors are (eng_buf_alloc). */
    float *x = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
    if (!x) {
        fprintf(stderr, "bench: out of memory for %zu floats\n", n);
        exit(1);
    }
    uint64_t rng = seed;
    for (size_t i = 0; i < n; i++)
        x[i] = rng_sym(&rng, amp);
    return x;
}

/* The best of at least three runs of fn and of at least min_total seconds of them, at most
 * max_runs, after one warm-up; with a shot of `loop` on `threads` threads before each run when
 * loop is not NULL, the best in *peak_gflops. -1 when a run fails. */
static double best_of(bench_fn fn, void *ctx, double min_total, int max_runs, double (*loop)(void),
                      int threads, double *peak_gflops);

double bench_best_seconds(bench_fn fn, void *ctx, double min_total)
{
    return best_of(fn, ctx, min_total, 20, NULL, 0, NULL);
}

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

double bench_sgemm_gflops(int threads)
{
    sgemm_ctx g = {.n = 2048};
    size_t n2 = (size_t)g.n * (size_t)g.n;
    g.a = bench_random_floats(n2, 1, 1.0f);
    g.b = bench_random_floats(n2, 2, 1.0f);
    g.c = bench_random_floats(n2, 3, 1.0f);
    openblas_set_num_threads(threads);
    double t = bench_best_seconds(run_sgemm, &g, 1.0);
    free(g.a);
    free(g.b);
    free(g.c);
    return 2.0 * g.n * (double)g.n * g.n / t * 1e-9;
}

/* ---- Peak of the instruction set ---------------------------------------------------------- */

/* Sixteen independent chains: more than the FMA latency times the ports, so the loop runs at
 * the ports' throughput. The multiplier keeps the values bounded over billions of steps. */
#define PEAK_CHAINS 16
#define PEAK_STEPS  (INT64_C(1) << 24)

/* AVX2 has 16 ymm registers, two of which hold the operands: sixteen chains would spill three
 * accumulators to the stack, whose store-to-load round trip per step slows the whole loop.
 * Twelve still exceed the FMA latency times the ports of the CPUs that have AVX2. */
#define PEAK_CHAINS_AVX2 12

/* Where each loop leaves its sum, so that the compiler must compute it. */
static volatile float peak_sink;

__attribute__((target("avx512f"))) static double peak_avx512(void)
{
    __m512 acc[PEAK_CHAINS], x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(1e-4f);
    for (int j = 0; j < PEAK_CHAINS; j++)
        acc[j] = _mm512_set1_ps((float)j);
    for (int64_t i = 0; i < PEAK_STEPS; i++)
#pragma GCC unroll 16
        for (int j = 0; j < PEAK_CHAINS; j++)
            acc[j] = _mm512_fmadd_ps(acc[j], x, y);
    __m512 s = acc[0];
    for (int j = 1; j < PEAK_CHAINS; j++)
        s = _mm512_add_ps(s, acc[j]);
    peak_sink = _mm512_reduce_add_ps(s);
    return 2.0 * 16 * PEAK_CHAINS * (double)PEAK_STEPS;
}

__attribute__((target("avx2,fma"))) static double peak_avx2(void)
{
    __m256 acc[PEAK_CHAINS_AVX2], x = _mm256_set1_ps(0.999f), y = _mm256_set1_ps(1e-4f);
    for (int j = 0; j < PEAK_CHAINS_AVX2; j++)
        acc[j] = _mm256_set1_ps((float)j);
    for (int64_t i = 0; i < PEAK_STEPS; i++)
#pragma GCC unroll 16
        for (int j = 0; j < PEAK_CHAINS_AVX2; j++)
            acc[j] = _mm256_fmadd_ps(acc[j], x, y);
    float lanes[8];
    __m256 s = acc[0];
    for (int j = 1; j < PEAK_CHAINS_AVX2; j++)
        s = _mm256_add_ps(s, acc[j]);
    _mm256_storeu_ps(lanes, s);
    peak_sink = lanes[0];
    return 2.0 * 8 * PEAK_CHAINS_AVX2 * (double)PEAK_STEPS;
}

static double peak_sse2(void)
{
    __m128 acc[PEAK_CHAINS], x = _mm_set1_ps(0.999f), y = _mm_set1_ps(1e-4f);
    for (int j = 0; j < PEAK_CHAINS; j++)
        acc[j] = _mm_set1_ps((float)j);
    for (int64_t i = 0; i < PEAK_STEPS; i++)
#pragma GCC unroll 16
        for (int j = 0; j < PEAK_CHAINS; j++)
            acc[j] = _mm_add_ps(_mm_mul_ps(acc[j], x), y);
    float lanes[4];
    __m128 s = acc[0];
    for (int j = 1; j < PEAK_CHAINS; j++)
        s = _mm_add_ps(s, acc[j]);
    _mm_storeu_ps(lanes, s);
    peak_sink = lanes[0];
    return 2.0 * 4 * PEAK_CHAINS * (double)PEAK_STEPS;
}

/* VDPBF16PS: each instruction adds 16 lanes of two bf16 products (64 flops). The operands stay
 * fixed, so the accumulators only grow by a bounded step. */
__attribute__((target("avx512f,avx512bf16"))) static double peak_avx512bf16(void)
{
    __m512 acc[PEAK_CHAINS];
    __m512bh x = (__m512bh)_mm512_set1_epi32(0x3F803F80),
             y = (__m512bh)_mm512_set1_epi32(0x38003800);
    for (int j = 0; j < PEAK_CHAINS; j++)
        acc[j] = _mm512_set1_ps((float)j);
    for (int64_t i = 0; i < PEAK_STEPS; i++)
#pragma GCC unroll 16
        for (int j = 0; j < PEAK_CHAINS; j++)
            acc[j] = _mm512_dpbf16_ps(acc[j], x, y);
    __m512 s = acc[0];
    for (int j = 1; j < PEAK_CHAINS; j++)
        s = _mm512_add_ps(s, acc[j]);
    peak_sink = _mm512_reduce_add_ps(s);
    return 4.0 * 16 * PEAK_CHAINS * (double)PEAK_STEPS;
}

/* TDPBF16PS on resident tiles: each instruction is a 16 x 16 block of C over 32 depths (16384
 * flops); four independent accumulators (tmm0-3) from two A and two B tiles, as the engine's
 * micro-kernel uses them. The tile configuration is loaded on the calling thread. */
__attribute__((target("amx-tile,amx-bf16"))) static double peak_amx(void)
{
    struct {
        unsigned char palette, start_row, reserved[14];
        unsigned short colsb[16];
        unsigned char rows[16];
    } cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
    _tile_loadconfig(&cfg);
    const int64_t steps = PEAK_STEPS / 16;
    for (int64_t i = 0; i < steps; i++) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_release();
    return 4.0 * 16384.0 * (double)steps;
}

/* Whether this process may run tile instructions (cpuid, XCR0, the kernel's permission,
 * requested here); else why not. */
static bool amx_granted(char *why, size_t len)
{
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid_max(0, NULL) < 7) {
        snprintf(why, len, "no cpuid leaf 7");
        return false;
    }
    __cpuid_count(7, 0, a, b, c, d);
    if (!(d & (1u << 24)) || !(d & (1u << 22))) {
        snprintf(why, len, "the CPU has no AMX-TILE and AMX-BF16");
        return false;
    }
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 0x60000u) != 0x60000u) {
        snprintf(why, len, "the OS does not enable the tile state");
        return false;
    }
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) != 0) {
        snprintf(why, len, "arch_prctl(ARCH_REQ_XCOMP_PERM) refused");
        return false;
    }
    return true;
}

typedef struct {
    double (*loop)(void);
    double flops;
} peak_part;

static void *peak_thread(void *p)
{
    peak_part *part = p;
    part->flops = part->loop();
    return NULL;
}

/* The FMA loop of the kernel set `kernels`. */
static double (*peak_loop(const char *kernels))(void)
{
    bool avx512 = eng_kernels_supported("avx512"), avx2 = eng_kernels_supported("avx2");
    if (strcmp(kernels, "avx512") == 0 || (strcmp(kernels, "openblas") == 0 && avx512))
        return peak_avx512;
    if (strcmp(kernels, "avx2") == 0 || (strcmp(kernels, "openblas") == 0 && avx2))
        return peak_avx2;
    return peak_sse2;
}

/* The loop of the bf16 products the engine runs, or NULL when it computes them in float32. */
static double (*peak_bf16_loop(void))(void)
{
    eng_engine_info info;
    eng_engine_info_get(&info);
    if (strcmp(info.bf16, "amx") == 0)
        return peak_amx;
    if (strcmp(info.bf16, "avx512bf16") == 0)
        return peak_avx512bf16;
    if (strcmp(info.bf16, "emulated") == 0 || strcmp(info.bf16, "amx-emulated") == 0)
        return peak_loop(info.kernels);
    return NULL;
}

/* GFLOPS of one run of `loop` on `threads` threads at once. */
static double peak_shot(double (*loop)(void), int threads)
{
    pthread_t tid[64];
    peak_part parts[64];
    threads = threads < 1 ? 1 : threads > 64 ? 64 : threads;
    double t0 = bench_seconds(), flops = 0;
    for (int i = 0; i < threads; i++) {
        parts[i] = (peak_part){loop, 0};
        pthread_create(&tid[i], NULL, peak_thread, &parts[i]);
    }
    for (int i = 0; i < threads; i++) {
        pthread_join(tid[i], NULL);
        flops += parts[i].flops;
    }
    return flops / (bench_seconds() - t0) * 1e-9;
}

static double peak_best(double (*loop)(void), int threads)
{
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        double gflops = peak_shot(loop, threads);
        best = gflops > best ? gflops : best;
    }
    return best;
}

double bench_peak_gflops(const char *kernels, int threads)
{
    return peak_best(peak_loop(kernels), threads);
}

double bench_tile_peak_gflops(int threads, char *why, size_t len)
{
    if (!amx_granted(why, len))
        return 0;
    why[0] = '\0';
    return peak_best(peak_amx, threads);
}

bool bench_peak_bf16_exists(void)
{
    return peak_bf16_loop() != NULL;
}

static double best_of(bench_fn fn, void *ctx, double min_total, int max_runs, double (*loop)(void),
                      int threads, double *peak_gflops)
{
    if (fn(ctx) != ENG_OK) /* warm-up: page faults, scratch, BLAS buffers */
        return -1;
    double best = 1e30, total = 0;
    for (int rep = 0; rep < max_runs && (rep < 3 || total < min_total); rep++) {
        if (loop) {
            double gflops = peak_shot(loop, threads);
            *peak_gflops = gflops > *peak_gflops ? gflops : *peak_gflops;
        }
        double t0 = bench_seconds();
        if (fn(ctx) != ENG_OK)
            return -1;
        double t = bench_seconds() - t0;
        total += t;
        best = t < best ? t : best;
    }
    return best;
}

double bench_best_seconds_and_peak(bench_fn fn, void *ctx, double min_total, bool bf16, int threads,
                                   double *peak_gflops)
{
    double (*loop)(void) = bf16 ? peak_bf16_loop() : peak_loop(eng_kernels_name());
    *peak_gflops = 0;
    return loop ? best_of(fn, ctx, min_total, 60, loop, threads, peak_gflops) : -1;
}

/* ---- The best OpenBLAS core ----------------------------------------------------------------- */

/* OpenBLAS 0.3.21's x86-64 cores that a DYNAMIC_ARCH build may run, oldest first. */
static const char *const blas_cores[] = {"Prescott", "Nehalem",  "Sandybridge", "Haswell",
                                         "Zen",      "SkylakeX", "Cooperlake"};
#define N_BLAS_CORES ((int)(sizeof blas_cores / sizeof blas_cores[0]))

/* 256 sampled elements of C = A B against float64: a core whose kernel faults or miscomputes
 * on this CPU must not count as the fastest. */
static bool sgemm_correct(const sgemm_ctx *g)
{
    uint64_t rng = 12345;
    for (int s = 0; s < 256; s++) {
        int i = (int)rng_below(&rng, (uint64_t)g->n);
        int j = (int)rng_below(&rng, (uint64_t)g->n);
        double ref = 0, mag = 0;
        for (int k = 0; k < g->n; k++) {
            double t = (double)g->a[(size_t)i * (size_t)g->n + (size_t)k] *
                       g->b[(size_t)k * (size_t)g->n + (size_t)j];
            ref += t;
            mag += fabs(t);
        }
        if (!(fabs(g->c[(size_t)i * (size_t)g->n + (size_t)j] - ref) <= 1e-5 * mag))
            return false;
    }
    return true;
}

int bench_child_blas(int argc, char **argv, int threads)
{
    if (argc != 3 || strcmp(argv[1], "--blas-core") != 0)
        return -1;
    sgemm_ctx g = {.n = 2048};
    size_t n2 = (size_t)g.n * (size_t)g.n;
    g.a = bench_random_floats(n2, 1, 1.0f);
    g.b = bench_random_floats(n2, 2, 1.0f);
    g.c = bench_random_floats(n2, 3, 1.0f);
    openblas_set_num_threads(threads);
    double t = bench_best_seconds(run_sgemm, &g, 1.0);
    bool ok = t > 0 && sgemm_correct(&g);
    const char *core = openblas_get_corename();
    printf("%.3f %s\n", ok ? 2.0 * g.n * (double)g.n * g.n / t * 1e-9 : 0.0, core ? core : "?");
    free(g.a);
    free(g.b);
    free(g.c);
    return 0;
}

/* Runs this program again as "FLAG ARG" (with OPENBLAS_CORETYPE=coretype unless NULL) and reads
 * the first line it prints into line; 0 when it exited 0 and printed one, with its resource use
 * in *ru. */
static int run_child(const char *flag, const char *arg, const char *coretype, char *line,
                     size_t len, struct rusage *ru)
{
    int fd[2];
    if (pipe(fd) != 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        if (coretype)
            setenv("OPENBLAS_CORETYPE", coretype, 1);
        dup2(fd[1], STDOUT_FILENO);
        close(fd[0]);
        execl("/proc/self/exe", "bench", flag, arg, (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    line[0] = '\0';
    FILE *f = fdopen(fd[0], "r");
    int got = f && fgets(line, (int)len, f) != NULL;
    if (f)
        fclose(f);
    int status = 0;
    if (wait4(pid, &status, 0, ru) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0 || !got)
        return -1;
    return 0;
}

/* Runs this program as "--blas-core NAME" with OPENBLAS_CORETYPE=NAME; its GFLOPS or 0. */
static double blas_core_gflops(const char *name, char *got, size_t got_len)
{
    char buf[96];
    struct rusage ru;
    if (run_child("--blas-core", name, name, buf, sizeof buf, &ru) != 0)
        return 0;
    char *end;
    double gflops = strtod(buf, &end);
    /* The core OpenBLAS actually ran: a name it does not know falls back to its own pick. */
    snprintf(got, got_len, "%.*s", (int)strcspn(end + (*end == ' '), "\n"), end + (*end == ' '));
    return gflops;
}

double bench_blas_best_gflops(char *core, size_t core_len)
{
    double best = 0;
    snprintf(core, core_len, "none");
    for (int i = 0; i < N_BLAS_CORES; i++) {
        char got[32] = "";
        double gflops = blas_core_gflops(blas_cores[i], got, sizeof got);
        if (gflops > best) {
            best = gflops;
            snprintf(core, core_len, "%s", got);
        }
    }
    return best;
}

int bench_child_case(int argc, char **argv, int ncases)
{
    if (argc != 3 || strcmp(argv[1], "--case") != 0)
        return -1;
    char *end;
    errno = 0;
    long i = strtol(argv[2], &end, 10);
    if (errno || *end || i < 0 || i >= ncases)
        return -2;
    return (int)i;
}

int bench_measure_case(int i, double *secs, double *rss_mb)
{
    char arg[16], buf[64];
    struct rusage ru;
    snprintf(arg, sizeof arg, "%d", i);
    if (run_child("--case", arg, NULL, buf, sizeof buf, &ru) != 0)
        return -1;
    *secs = strtod(buf, NULL);
    *rss_mb = (double)ru.ru_maxrss / 1024.0;
    return 0;
}

int bench_measure_case_values(int i, double *values, int n, double *rss_mb)
{
    char arg[16], buf[128];
    struct rusage ru;
    snprintf(arg, sizeof arg, "%d", i);
    if (run_child("--case", arg, NULL, buf, sizeof buf, &ru) != 0)
        return -1;
    *rss_mb = (double)ru.ru_maxrss / 1024.0;
    char *at = buf;
    int got = 0;
    while (got < n) {
        char *end;
        errno = 0;
        double x = strtod(at, &end);
        if (end == at || errno)
            break;
        values[got++] = x;
        at = end;
    }
    return got;
}

/* ---- Streaming reads ---------------------------------------------------------------------- */

typedef struct {
    const uint64_t *x;
    size_t n;
    uint64_t sum;
} stream_part;

static void *stream_read(void *p)
{
    stream_part *s = p;
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    for (size_t i = 0; i + 4 <= s->n; i += 4) {
        a0 ^= s->x[i];
        a1 ^= s->x[i + 1];
        a2 ^= s->x[i + 2];
        a3 ^= s->x[i + 3];
    }
    s->sum = a0 ^ a1 ^ a2 ^ a3;
    return NULL;
}

double bench_stream_seconds(size_t bytes, int threads, int reps)
{
    size_t n = bytes / sizeof(uint64_t);
    uint64_t *x = malloc(n * sizeof *x);
    pthread_t tid[64];
    stream_part parts[64];
    if (!x || n == 0) {
        free(x);
        return 0;
    }
    for (size_t i = 0; i < n; i++)
        x[i] = i;
    threads = threads < 1 ? 1 : threads > 64 ? 64 : threads;
    double best = 1e30;
    for (int rep = 0; rep < reps; rep++) {
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
    return best;
}
