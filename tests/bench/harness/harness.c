/* harness.c - the shared parts of the benchmarks (see harness.h). */
#include "harness.h"

#include <cblas.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

double bench_seconds(void)
{
    return (double)eng_now_ns() * 1e-9;
}

float *bench_random_floats(size_t n, unsigned seed, float amp)
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

double bench_best_seconds(bench_fn fn, void *ctx, double min_total)
{
    if (fn(ctx) != ENG_OK) /* warm-up: page faults, scratch, BLAS buffers */
        return -1;
    double best = 1e30, total = 0;
    for (int rep = 0; rep < 20 && (rep < 3 || total < min_total); rep++) {
        double t0 = bench_seconds();
        if (fn(ctx) != ENG_OK)
            return -1;
        double t = bench_seconds() - t0;
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
    int fd[2];
    if (pipe(fd) != 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        char arg[16];
        snprintf(arg, sizeof arg, "%d", i);
        dup2(fd[1], STDOUT_FILENO);
        close(fd[0]);
        execl("/proc/self/exe", "bench", "--case", arg, (char *)NULL);
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
