/*
 * bench_mha.c - how fast eng_mha (a whole attention layer: projections, attention, output
 * projection) is, as a ratio to OpenBLAS sgemm measured in the same run.
 *
 * The approach of bench_sdpa.c: a 2048^3 sgemm on the same threads is the baseline, measured
 * at the start of the run; each case runs in its own process (this program re-executes itself
 * with --case N) so that its peak RSS is its own. One line per case:
 *
 *   mha b=1 h=8 l=2048 s=2048 e=512 causal=0 ms=21.3 gflops=250.1 sgemm_gflops=260.0 ratio=0.96
 * rss_mb=60
 *
 * gflops counts useful work: the four projections (q, k, v and output), 2*B*L*E*E each (S
 * instead of L for k and v), plus attention 4*B*L*S*E, the attention part halved for causal
 * self-attention (L = S). The layer has biases (nn.MultiheadAttention's default).
 */
#include <cblas.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/engine.h"

typedef struct {
    int64_t b, h, l, e;
    bool causal;
} bench_case;

static const bench_case cases[] = {
    {1, 8, 2048, 512, false},
    {1, 8, 2048, 512, true},
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

static double seconds(void)
{
    return (double)eng_now_ns() * 1e-9;
}

static float *random_floats(size_t n, unsigned seed, float amp)
{
    float *x = malloc(n * sizeof(float));
    if (!x) {
        fprintf(stderr, "bench: out of memory for %zu floats\n", n);
        exit(1);
    }
    uint32_t state = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        state = state * 1664525u + 1013904223u;
        x[i] = ((float)(state >> 8) / (float)(1u << 24) * 2.0f - 1.0f) * amp;
    }
    return x;
}

typedef eng_status (*timed_fn)(void *ctx);

/* Best of a few runs, at least `min_total` seconds of them, after a warm-up. */
static double best_seconds(timed_fn fn, void *ctx, double min_total)
{
    if (fn(ctx) != ENG_OK)
        return -1;
    double best = 1e30, total = 0;
    for (int rep = 0; rep < 20 && (rep < 3 || total < min_total); rep++) {
        double t0 = seconds();
        if (fn(ctx) != ENG_OK)
            return -1;
        double t = seconds() - t0;
        total += t;
        best = t < best ? t : best;
    }
    return best;
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

static double sgemm_gflops(int threads)
{
    sgemm_ctx g = {.n = 2048};
    size_t n2 = (size_t)g.n * (size_t)g.n;
    g.a = random_floats(n2, 1, 1.0f);
    g.b = random_floats(n2, 2, 1.0f);
    g.c = random_floats(n2, 3, 1.0f);
    openblas_set_num_threads(threads);
    double t = best_seconds(run_sgemm, &g, 1.0);
    free(g.a);
    free(g.b);
    free(g.c);
    return 2.0 * g.n * (double)g.n * g.n / t * 1e-9;
}

/* ---- One case (in a child process) ------------------------------------------------------ */

typedef struct {
    eng_pool *pool;
    eng_mha_args args;
} mha_ctx;

static eng_status run_mha(void *p)
{
    mha_ctx *c = p;
    eng_error err;
    eng_status st = eng_mha(c->pool, &c->args, NULL, &err);
    if (st != ENG_OK)
        fprintf(stderr, "bench: eng_mha: %s: %s\n", err.field, err.message);
    return st;
}

static int run_case(const bench_case *bc)
{
    eng_error err;
    eng_pool *pool = eng_pool_new(0, &err);
    if (!pool) {
        fprintf(stderr, "bench: %s\n", err.message);
        return 1;
    }
    int64_t E = bc->e;
    float amp = 1.0f / (float)E; /* keeps scores moderate, like torch's initialisation */
    float *in_w = random_floats((size_t)(3 * E * E), 11, amp * 8);
    float *in_b = random_floats((size_t)(3 * E), 12, 0.1f);
    float *out_w = random_floats((size_t)(E * E), 13, amp * 8);
    float *out_b = random_floats((size_t)E, 14, 0.1f);
    eng_tensor_ref t[4] = {
        {"in_proj_weight", ENG_DTYPE_F32, in_w, 2, {3 * E, E}},
        {"in_proj_bias", ENG_DTYPE_F32, in_b, 1, {3 * E}},
        {"out_proj.weight", ENG_DTYPE_F32, out_w, 2, {E, E}},
        {"out_proj.bias", ENG_DTYPE_F32, out_b, 1, {E}},
    };
    eng_layer *layer = eng_layer_from_tensors("bench", t, 4, bc->h, 0, &err);
    if (!layer) {
        fprintf(stderr, "bench: layer: %s\n", err.message);
        return 1;
    }
    size_t n = (size_t)(bc->b * bc->l * E);
    float *x = random_floats(n, 15, 1.0f), *out = random_floats(n, 16, 1.0f);
    mha_ctx c = {.pool = pool};
    c.args.layer = layer;
    c.args.B = bc->b;
    c.args.L = bc->l;
    c.args.x = x;
    c.args.out = out;
    c.args.causal = bc->causal;
    double secs = best_seconds(run_mha, &c, 2.0);
    printf("%.9f\n", secs);
    free(in_w);
    free(in_b);
    free(out_w);
    free(out_b);
    free(x);
    free(out);
    eng_layer_free(layer);
    eng_pool_free(pool);
    return secs > 0 ? 0 : 1;
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
    printf("baseline sgemm n=2048 threads=%d gflops=%.1f\n", threads, base);
    fflush(stdout);
    int failures = 0;
    for (int i = 0; i < NCASES; i++) {
        const bench_case *bc = &cases[i];
        double secs, rss;
        if (measure_case("/proc/self/exe", i, &secs, &rss) != 0) {
            printf("mha case %d failed\n", i);
            failures++;
            continue;
        }
        double B = (double)bc->b, L = (double)bc->l, E = (double)bc->e;
        double projections = 4.0 * 2.0 * B * L * E * E;
        double attention = 4.0 * B * L * L * E;
        if (bc->causal)
            attention /= 2;
        double gflops = (projections + attention) / secs * 1e-9;
        printf("mha b=%lld h=%lld l=%lld s=%lld e=%lld causal=%d ms=%.1f gflops=%.1f "
               "sgemm_gflops=%.1f ratio=%.2f rss_mb=%.0f\n",
               (long long)bc->b, (long long)bc->h, (long long)bc->l, (long long)bc->l,
               (long long)bc->e, bc->causal, secs * 1e3, gflops, base, gflops / base, rss);
        fflush(stdout);
    }
    return failures ? 1 : 0;
}
