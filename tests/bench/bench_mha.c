/* clang-format off */
/*
 * bench_mha.c - how fast eng_mha (a whole attention layer: projections, attention, output
 * projection) is, as a ratio to OpenBLAS sgemm measured in the same run.
 *
 * The approach of bench_sdpa.c: a 2048^3 sgemm on the same threads is the baseline, measured
 * at the start of the run; each case runs in its own process (this program re-executes itself
 * with --case N) so that its peak RSS is its own. One line per case:
 *
 *   mha b=1 h=8 l=2048 s=2048 e=512 causal=0 ms=62.1 gflops=207.5 sgemm_gflops=248.1 ratio=0.84 rss_mb=39
 *
 * gflops counts useful work: the four projections (q, k, v and output), 2*B*L*E*E each (S
 * instead of L for k and v), plus attention 4*B*L*S*E, the attention part halved for causal
 * self-attention (L = S). The layer has biases (nn.MultiheadAttention's default). The
 * engine's buffer cache is on, as in the daemon (--buffer-cache-bytes), so repetitions reuse
 * the layer's intermediate buffers instead of faulting in fresh pages.
 */
/* clang-format on */
#include <cblas.h>
#include <errno.h>
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
    int64_t b, h, l, e;
    bool causal;
    bool bf16; /* "precision": bfloat16, after the same case in float32 */
} bench_case;

static const bench_case cases[] = {
    {1, 8, 2048, 512, false, false},
    {1, 8, 2048, 512, true, false},
    {1, 8, 2048, 512, false, true},
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

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
    eng_buf_cache_limit((size_t)256 << 20); /* as the daemon's default --buffer-cache-bytes */
    int64_t E = bc->e;
    float amp = 1.0f / (float)E; /* keeps scores moderate, like torch's initialisation */
    float *in_w = bench_random_floats((size_t)(3 * E * E), 11, amp * 8);
    float *in_b = bench_random_floats((size_t)(3 * E), 12, 0.1f);
    float *out_w = bench_random_floats((size_t)(E * E), 13, amp * 8);
    float *out_b = bench_random_floats((size_t)E, 14, 0.1f);
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
    float *x = bench_random_floats(n, 15, 1.0f), *out = bench_random_floats(n, 16, 1.0f);
    mha_ctx c = {.pool = pool};
    c.args.layer = layer;
    c.args.B = bc->b;
    c.args.L = bc->l;
    c.args.x = x;
    c.args.out = out;
    c.args.causal = bc->causal;
    c.args.precision = bc->bf16 ? ENG_PRECISION_BFLOAT16 : ENG_PRECISION_FLOAT32;
    double peak;
    double secs = bench_best_seconds_and_peak(run_mha, &c, 2.0, bc->bf16, eng_cpu_count(), &peak);
    printf("%.9f %.3f\n", secs, peak);
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

int main(int argc, char **argv)
{
    char why[320];
    if (test_engine_init(why, sizeof why) != TEST_ENGINE_READY) {
        fprintf(stderr, "bench_mha: %s\n", why);
        return 2;
    }
    int threads = eng_cpu_count();
    int blas_child = bench_child_blas(argc, argv, threads);
    if (blas_child >= 0)
        return blas_child;
    int child = bench_child_case(argc, argv, NCASES);
    if (child != -1)
        return child < 0 ? 2 : run_case(&cases[child]);
    const char *kernels = eng_kernels_name();
    double base = bench_sgemm_gflops(threads);
    double peak = bench_peak_gflops(kernels, threads);
    char best_core[32];
    double blas_best = bench_blas_best_gflops(best_core, sizeof best_core);
    printf("baseline sgemm n=2048 threads=%d gflops=%.1f; kernels=%s peak_gflops=%.1f; best "
           "OpenBLAS core %s gflops=%.1f\n",
           threads, base, kernels, peak, best_core, blas_best);
    fflush(stdout);
    int failures = 0;
    double fp32_gflops = 0;
    for (int i = 0; i < NCASES; i++) {
        const bench_case *bc = &cases[i];
        /* bf16 cases divide by the peak of the bf16 products they run, which the child
         * measures in turns with the case's runs: the machine is shared. */
        if (bc->bf16 && !bench_peak_bf16_exists()) {
            printf("mha precision=bf16 skipped: kernel set %s computes bf16 in float32\n", kernels);
            continue;
        }
        double values[2], rss;
        if (bench_measure_case_values(i, values, 2, &rss) != 2) {
            printf("mha case %d failed\n", i);
            failures++;
            continue;
        }
        double secs = values[0], peak_now = values[1];
        double B = (double)bc->b, L = (double)bc->l, E = (double)bc->e;
        double projections = 4.0 * 2.0 * B * L * E * E;
        double attention = 4.0 * B * L * L * E;
        if (bc->causal)
            attention /= 2;
        double gflops = (projections + attention) / secs * 1e-9;
        printf("mha b=%lld h=%lld l=%lld s=%lld e=%lld causal=%d ms=%.1f gflops=%.1f "
               "sgemm_gflops=%.1f ratio=%.2f rss_mb=%.0f kernels=%s peak_gflops=%.1f "
               "peak_ratio=%.2f blas_best_gflops=%.1f",
               (long long)bc->b, (long long)bc->h, (long long)bc->l, (long long)bc->l,
               (long long)bc->e, bc->causal, secs * 1e3, gflops, base, gflops / base, rss, kernels,
               peak_now, gflops / peak_now, blas_best);
        if (bc->bf16) {
            eng_engine_info info;
            eng_engine_info_get(&info);
            printf(" precision=bf16 bf16_path=%s projection_tiles=%.*s", info.bf16,
                   (int)strcspn(info.amx, " "), info.amx);
            if (fp32_gflops > 0)
                printf(" fp32_ratio=%.2f", gflops / fp32_gflops);
        } else if (!bc->causal) {
            fp32_gflops = gflops;
        }
        printf("\n");
        fflush(stdout);
    }
    return failures ? 1 : 0;
}
