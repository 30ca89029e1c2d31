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
 *
 * Then decoding: one-token steps over a KV cache of 256 tokens through Llama-shaped layers
 * with bf16 weights generated here (hidden 2048 and 4096, 32 heads, 8 kv heads, no biases),
 * against the time a plain summing loop on the same threads takes to read the same weight
 * bytes once, measured in turns in the same process. A step has to read every weight once,
 * so the ratio says how close it comes to the memory's pace:
 *
 *   mha decode e=E h=H kv=KV d=D cache=C weights_mb=.. step_ms=.. stream_ms=.. ratio=..
 *
 * And dynamic batching: N = 1, 8 and 32 sequences of 256 cached tokens each take a one-token
 * step, as one eng_mha_batch call and as N eng_mha calls one after another, against the same
 * stream of the weights, all three in turns in one process. The batch reads the weights once
 * for all N steps; the N calls read them N times. bound_ms is what the batch cannot do
 * without: one stream of the weights plus its FLOPs (the four projections' 2 N in out and the
 * attention's 4 N (C + 1) H D) at the FMA peak (peak_gflops, the best shot of the kernel set's
 * loop on the pool's threads, taken in the same turns); bound_ratio is batch_ms over it:
 *
 *   mha decode batch e=E n=N cache=C batch_ms=.. alone_ms=.. stream_ms=.. batch_ratio=..
 *       alone_ratio=.. speedup=.. peak_gflops=.. bound_ms=.. bound_ratio=..
 *
 * And prefill: a prompt of 256 tokens through the same bf16 layers (causal self-attention, no
 * cache), as a fraction of the FMA peak measured in turns with it in the same process. gflops
 * counts the four projections (2 rows x in x out each) and the causal half of the attention:
 *
 *   mha prefill b=1 e=E h=H kv=KV d=D l=256 causal=1 ms=.. gflops=.. peak_gflops=.. peak_ratio=..
 *       rss_mb=.. kernels=SET
 *
 * `--decode` runs the decode lines only (no sgemm baseline, no prefill cases); `--prefill` the
 * prefill lines only.
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

#include "engine/internal.h"
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

/* Decode steps of Llama-shaped layers: hidden E, 32 heads of E / 32, 8 kv heads. */
static const int64_t decode_hidden[] = {2048, 4096};
#define NDECODE       ((int)(sizeof decode_hidden / sizeof decode_hidden[0]))
#define DECODE_H      32
#define DECODE_HKV    8
#define DECODE_CACHED 256

/* Sequences stepped at once by eng_mha_batch, against as many eng_mha calls. */
static const int batch_sizes[] = {1, 8, 32};
#define NBATCH     ((int)(sizeof batch_sizes / sizeof batch_sizes[0]))
#define BATCH_MOST 32

/* Tokens of the prompt a prefill line runs through decode_layer(E), for each decode_hidden. */
#define PREFILL_ROWS 256

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
    eng_layer_weights t = {
        .in_proj_w = {"in_proj_weight", ENG_DTYPE_F32, in_w, 2, {3 * E, E}},
        .in_proj_b = {"in_proj_bias", ENG_DTYPE_F32, in_b, 1, {3 * E}},
        .o_w = {"out_proj.weight", ENG_DTYPE_F32, out_w, 2, {E, E}},
        .o_b = {"out_proj.bias", ENG_DTYPE_F32, out_b, 1, {E}},
    };
    eng_layer *layer = eng_layer_new("bench", &t, bc->h, 0, false, &err);
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

/* ---- Decode steps (in a child process) ---------------------------------------------------- */

typedef struct {
    eng_pool *pool;
    eng_mha_args args;
    eng_kv_seq *seq;
} step_ctx;

/* One token through the layer over the cache, which goes back to its length after. */
static eng_status run_step(void *p)
{
    step_ctx *c = p;
    eng_error err;
    eng_status st = eng_mha(c->pool, &c->args, NULL, &err);
    if (st != ENG_OK)
        fprintf(stderr, "bench: decode step: %s: %s\n", err.field, err.message);
    eng_kv_seq_truncate(c->seq, DECODE_CACHED, NULL);
    return st;
}

/* The plain loop a step's weight reads are held against: each task sums its slice of the
 * bytes as 64-bit words, nothing else. */
typedef struct {
    eng_pool *pool;
    const uint64_t *words;
    int64_t count, parts;
    uint64_t sums[64];
} stream_ctx;

static void stream_task(void *arg, int64_t part)
{
    stream_ctx *c = arg;
    int64_t per = (c->count + c->parts - 1) / c->parts, end = (part + 1) * per;
    uint64_t sum = 0;
    for (int64_t i = part * per; i < end && i < c->count; i++)
        sum += c->words[i];
    c->sums[part] = sum;
}

static eng_status run_stream(void *p)
{
    stream_ctx *c = p;
    return eng_pool_run(c->pool, stream_task, c, c->parts, NULL);
}

/* Bytes of the four bf16 matrices of decode_layer(E): all its weights. */
static int64_t weight_bytes(int64_t E)
{
    int64_t D = E / DECODE_H;
    return (2 * E * DECODE_H * D + 2 * E * DECODE_HKV * D) * (int64_t)sizeof(uint16_t);
}

/* A Llama-shaped layer (hidden E, bf16 matrices kept in 16 bits, no biases). */
static eng_layer *decode_layer(int64_t E, eng_error *err)
{
    int64_t D = E / DECODE_H, Q = DECODE_H * D, W = DECODE_HKV * D;
    const struct {
        const char *name;
        int64_t rows, cols;
    } parts[4] = {{"q_proj.weight", Q, E},
                  {"k_proj.weight", W, E},
                  {"v_proj.weight", W, E},
                  {"o_proj.weight", E, Q}};
    eng_layer_weights t;
    eng_weight *roles[4] = {&t.q_w, &t.k_w, &t.v_w, &t.o_w};
    uint16_t *bits[4];
    memset(&t, 0, sizeof t);
    for (int i = 0; i < 4; i++) {
        size_t n = (size_t)(parts[i].rows * parts[i].cols);
        float *f = bench_random_floats(n, (unsigned)(21 + i), 1.0f / 64);
        bits[i] = malloc(n * sizeof(uint16_t));
        if (!bits[i])
            exit(1);
        for (size_t j = 0; j < n; j++)
            bits[i][j] = eng_f32_to_bf16(f[j]);
        free(f);
        *roles[i] =
            (eng_weight){parts[i].name, ENG_DTYPE_BF16, bits[i], 2, {parts[i].rows, parts[i].cols}};
    }
    eng_layer *l = eng__layer_assemble("decode", &t, DECODE_H, DECODE_HKV, D, true, err);
    for (int i = 0; i < 4; i++)
        free(bits[i]);
    return l;
}

/* Prints the best step's and the best stream's seconds, taken in turns. */
static int run_decode(int64_t E)
{
    eng_error err;
    eng_pool *pool = eng_pool_new(0, &err);
    eng_layer *layer = pool ? decode_layer(E, &err) : NULL;
    if (!layer) {
        fprintf(stderr, "bench: decode layer: %s\n", err.message);
        return 1;
    }
    eng_buf_cache_limit((size_t)256 << 20);
    eng_kv_shape shape = {.num_kv_heads = DECODE_HKV,
                          .head_dim = E / DECODE_H,
                          .value_head_dim = E / DECODE_H,
                          .dtype = ENG_DTYPE_BF16};
    eng_kv_pool *kvp = eng_kv_pool_new((size_t)256 << 20, 64, &err);
    eng_kv_seq *seq = kvp ? eng_kv_seq_new(kvp, &shape, &err) : NULL;
    if (!seq) {
        fprintf(stderr, "bench: cache: %s\n", err.message);
        return 1;
    }
    float *prompt = bench_random_floats((size_t)(DECODE_CACHED * E), 31, 1.0f);
    float *x = bench_random_floats((size_t)E, 32, 1.0f);
    float *out = bench_random_floats((size_t)(DECODE_CACHED * E), 33, 1.0f);
    step_ctx c = {.pool = pool, .seq = seq};
    c.args.layer = layer;
    c.args.B = 1;
    c.args.L = DECODE_CACHED;
    c.args.x = prompt;
    c.args.out = out;
    c.args.causal = true;
    c.args.align = ENG_ALIGN_BOTTOM_RIGHT;
    c.args.kv_cache = seq;
    if (eng_mha(pool, &c.args, NULL, &err) != ENG_OK) {
        fprintf(stderr, "bench: prefill: %s\n", err.message);
        return 1;
    }
    c.args.L = 1;
    c.args.x = x;
    stream_ctx s = {.pool = pool,
                    .words = (const uint64_t *)(const void *)layer->params16,
                    .count = weight_bytes(E) / (int64_t)sizeof(uint64_t),
                    .parts = 4 * eng_pool_threads(pool)};
    if (s.parts > 64)
        s.parts = 64;
    double step = 1e30, stream = 1e30;
    for (int round = 0; round < 5; round++) {
        double a = bench_best_seconds(run_step, &c, 0.2),
               b = bench_best_seconds(run_stream, &s, 0.2);
        if (a < 0 || b < 0)
            return 1;
        step = a < step ? a : step;
        stream = b < stream ? b : stream;
    }
    printf("%.9f %.9f %.3f\n", step, stream, (double)weight_bytes(E) / 1e6);
    free(prompt), free(x), free(out);
    eng_kv_seq_free(seq);
    eng_kv_pool_free(kvp);
    eng_layer_free(layer);
    eng_pool_free(pool);
    return 0;
}

/* ---- Batched decode steps (in a child process) -------------------------------------------- */

typedef struct {
    eng_pool *pool;
    int n;
    eng_mha_args args[BATCH_MOST];
    eng_mha_member members[BATCH_MOST];
    eng_kv_seq *seqs[BATCH_MOST];
} batch_ctx;

/* The caches back to their length after a step. */
static void batch_rewind(batch_ctx *c)
{
    for (int i = 0; i < c->n; i++)
        eng_kv_seq_truncate(c->seqs[i], DECODE_CACHED, NULL);
}

/* One token of each of n sequences as one eng_mha_batch call. */
static eng_status run_batch(void *p)
{
    batch_ctx *c = p;
    for (int i = 0; i < c->n; i++)
        c->members[i] = (eng_mha_member){&c->args[i], NULL, NULL, ENG_OK};
    eng_status st = eng_mha_batch(c->pool, c->members, c->n);
    if (st != ENG_OK)
        fprintf(stderr, "bench: batch of %d steps: %s\n", c->n, eng_status_str(st));
    batch_rewind(c);
    return st;
}

/* The same n steps as n eng_mha calls. */
static eng_status run_alone(void *p)
{
    batch_ctx *c = p;
    eng_status st = ENG_OK;
    for (int i = 0; i < c->n && st == ENG_OK; i++) {
        eng_error err;
        if ((st = eng_mha(c->pool, &c->args[i], NULL, &err)) != ENG_OK)
            fprintf(stderr, "bench: decode step: %s: %s\n", err.field, err.message);
    }
    batch_rewind(c);
    return st;
}

/* Prints, for each of batch_sizes, the best batch's and the best n calls' seconds, then the
 * best stream's seconds and the weights' MB, all taken in turns. The caches hold random K and
 * V rows, appended directly: what a step costs does not depend on their values. */
static int run_decode_batch(int64_t E)
{
    eng_error err;
    eng_pool *pool = eng_pool_new(0, &err);
    eng_layer *layer = pool ? decode_layer(E, &err) : NULL;
    if (!layer) {
        fprintf(stderr, "bench: decode layer: %s\n", err.message);
        return 1;
    }
    eng_buf_cache_limit((size_t)256 << 20);
    const int64_t D = E / DECODE_H;
    eng_kv_shape shape = {
        .num_kv_heads = DECODE_HKV, .head_dim = D, .value_head_dim = D, .dtype = ENG_DTYPE_BF16};
    eng_kv_pool *kvp = eng_kv_pool_new((size_t)512 << 20, 64, &err);
    float *rows = bench_random_floats((size_t)(DECODE_HKV * DECODE_CACHED * D), 34, 1.0f);
    float *x = bench_random_floats((size_t)(BATCH_MOST * E), 35, 1.0f);
    float *out = bench_random_floats((size_t)(BATCH_MOST * E), 36, 1.0f);
    eng_kv_rows kv = eng_kv_rows_f32(eng_view_contiguous(rows, 1, DECODE_HKV, DECODE_CACHED, D));
    static batch_ctx c;
    c.pool = pool;
    for (int i = 0; i < BATCH_MOST; i++) {
        c.seqs[i] = kvp ? eng_kv_seq_new(kvp, &shape, &err) : NULL;
        if (!c.seqs[i] || eng_kv_seq_append(c.seqs[i], &kv, &kv, &err) != ENG_OK) {
            fprintf(stderr, "bench: cache: %s\n", err.message);
            return 1;
        }
        eng_mha_args *a = &c.args[i];
        memset(a, 0, sizeof *a);
        a->layer = layer;
        a->B = 1;
        a->L = 1;
        a->x = x + i * E;
        a->out = out + i * E;
        a->causal = true;
        a->align = ENG_ALIGN_BOTTOM_RIGHT;
        a->kv_cache = c.seqs[i];
    }
    stream_ctx s = {.pool = pool,
                    .words = (const uint64_t *)(const void *)layer->params16,
                    .count = weight_bytes(E) / (int64_t)sizeof(uint64_t),
                    .parts = 4 * eng_pool_threads(pool)};
    if (s.parts > 64)
        s.parts = 64;
    double batch[NBATCH], alone[NBATCH], stream = 1e30, peak = 0;
    for (int k = 0; k < NBATCH; k++)
        batch[k] = alone[k] = 1e30;
    for (int round = 0; round < 3; round++)
        for (int k = 0; k < NBATCH; k++) {
            c.n = batch_sizes[k];
            double a = bench_best_seconds(run_batch, &c, 0.2),
                   b = bench_best_seconds(run_alone, &c, 0.2),
                   t = bench_best_seconds(run_stream, &s, 0.1);
            if (a < 0 || b < 0 || t < 0)
                return 1;
            batch[k] = a < batch[k] ? a : batch[k];
            alone[k] = b < alone[k] ? b : alone[k];
            stream = t < stream ? t : stream;
            double g = bench_peak_gflops(eng_kernels_name(), eng_pool_threads(pool));
            peak = g > peak ? g : peak;
        }
    for (int k = 0; k < NBATCH; k++)
        printf("%.9f %.9f ", batch[k], alone[k]);
    printf("%.9f %.3f %.3f\n", stream, (double)weight_bytes(E) / 1e6, peak);
    for (int i = 0; i < BATCH_MOST; i++)
        eng_kv_seq_free(c.seqs[i]);
    free(rows), free(x), free(out);
    eng_kv_pool_free(kvp);
    eng_layer_free(layer);
    eng_pool_free(pool);
    return 0;
}

/* ---- Prefill (in a child process) --------------------------------------------------------- */

/* Prints the best prefill's seconds and the FMA peak's best shot, taken in turns. */
static int run_prefill(int64_t E)
{
    eng_error err;
    eng_pool *pool = eng_pool_new(0, &err);
    eng_layer *layer = pool ? decode_layer(E, &err) : NULL;
    if (!layer) {
        fprintf(stderr, "bench: prefill layer: %s\n", err.message);
        return 1;
    }
    eng_buf_cache_limit((size_t)256 << 20);
    float *x = bench_random_floats((size_t)(PREFILL_ROWS * E), 37, 1.0f);
    float *out = bench_random_floats((size_t)(PREFILL_ROWS * E), 38, 1.0f);
    mha_ctx c = {.pool = pool};
    c.args.layer = layer;
    c.args.B = 1;
    c.args.L = PREFILL_ROWS;
    c.args.x = x;
    c.args.out = out;
    c.args.causal = true;
    double peak;
    double secs = bench_best_seconds_and_peak(run_mha, &c, 2.0, false, eng_cpu_count(), &peak);
    printf("%.9f %.3f\n", secs, peak);
    free(x), free(out);
    eng_layer_free(layer);
    eng_pool_free(pool);
    return secs > 0 ? 0 : 1;
}

static int prefill_lines(void)
{
    int failures = 0;
    for (int i = 0; i < NDECODE; i++) {
        int64_t E = decode_hidden[i], D = E / DECODE_H;
        double values[2], rss;
        if (bench_measure_case_values(NCASES + 2 * NDECODE + i, values, 2, &rss) != 2) {
            printf("mha prefill e=%lld failed\n", (long long)E);
            failures++;
            continue;
        }
        double L = PREFILL_ROWS, Q = (double)(DECODE_H * D), W = (double)(DECODE_HKV * D);
        double flops =
            2.0 * L * (2.0 * (double)E * Q + 2.0 * (double)E * W) + 4.0 * L * L * Q / 2.0;
        double gflops = flops / values[0] * 1e-9;
        printf("mha prefill b=1 e=%lld h=%d kv=%d d=%lld l=%d causal=1 ms=%.1f gflops=%.1f "
               "peak_gflops=%.1f peak_ratio=%.2f rss_mb=%.0f kernels=%s\n",
               (long long)E, DECODE_H, DECODE_HKV, (long long)D, PREFILL_ROWS, values[0] * 1e3,
               gflops, values[1], gflops / values[1], rss, eng_kernels_name());
        fflush(stdout);
    }
    return failures;
}

static int decode_lines(void)
{
    int failures = 0;
    for (int i = 0; i < NDECODE; i++) {
        int64_t E = decode_hidden[i];
        double values[3], rss;
        if (bench_measure_case_values(NCASES + i, values, 3, &rss) != 3) {
            printf("mha decode e=%lld failed\n", (long long)E);
            failures++;
            continue;
        }
        printf("mha decode e=%lld h=%d kv=%d d=%lld cache=%d weights_mb=%.1f step_ms=%.2f "
               "stream_ms=%.2f ratio=%.2f kernels=%s\n",
               (long long)E, DECODE_H, DECODE_HKV, (long long)(E / DECODE_H), DECODE_CACHED,
               values[2], values[0] * 1e3, values[1] * 1e3, values[0] / values[1],
               eng_kernels_name());
        fflush(stdout);
    }
    for (int i = 0; i < NDECODE; i++) {
        int64_t E = decode_hidden[i];
        double v[2 * NBATCH + 3], rss;
        if (bench_measure_case_values(NCASES + NDECODE + i, v, 2 * NBATCH + 3, &rss) !=
            2 * NBATCH + 3) {
            printf("mha decode batch e=%lld failed\n", (long long)E);
            failures++;
            continue;
        }
        double stream = v[2 * NBATCH], peak = v[2 * NBATCH + 2];
        double Q = (double)(DECODE_H * (E / DECODE_H)), W = (double)(DECODE_HKV * (E / DECODE_H));
        for (int k = 0; k < NBATCH; k++) {
            double n = batch_sizes[k];
            double flops = 2.0 * n * (2.0 * (double)E * Q + 2.0 * (double)E * W) +
                           4.0 * n * (DECODE_CACHED + 1) * Q;
            double bound = stream + flops / (peak * 1e9);
            printf("mha decode batch e=%lld n=%d cache=%d batch_ms=%.2f alone_ms=%.2f "
                   "stream_ms=%.2f batch_ratio=%.2f alone_ratio=%.2f speedup=%.2f "
                   "peak_gflops=%.1f bound_ms=%.2f bound_ratio=%.2f kernels=%s\n",
                   (long long)E, batch_sizes[k], DECODE_CACHED, v[2 * k] * 1e3, v[2 * k + 1] * 1e3,
                   stream * 1e3, v[2 * k] / stream, v[2 * k + 1] / stream, v[2 * k + 1] / v[2 * k],
                   peak, bound * 1e3, v[2 * k] / bound, eng_kernels_name());
        }
        fflush(stdout);
    }
    return failures;
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
    int child = bench_child_case(argc, argv, NCASES + 3 * NDECODE);
    if (child != -1)
        return child < 0                  ? 2
               : child < NCASES           ? run_case(&cases[child])
               : child < NCASES + NDECODE ? run_decode(decode_hidden[child - NCASES])
               : child < NCASES + 2 * NDECODE
                   ? run_decode_batch(decode_hidden[child - NCASES - NDECODE])
                   : run_prefill(decode_hidden[child - NCASES - 2 * NDECODE]);
    if (argc > 1 && strcmp(argv[1], "--decode") == 0)
        return decode_lines() ? 1 : 0;
    if (argc > 1 && strcmp(argv[1], "--prefill") == 0)
        return prefill_lines() ? 1 : 0;
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
    failures += decode_lines();
    failures += prefill_lines();
    return failures ? 1 : 0;
}
