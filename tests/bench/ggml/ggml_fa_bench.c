/*
 * ggml_fa_bench.c - the ggml peer of attnd's benchmarks: ggml's CPU flash attention
 * (ggml_flash_attn_ext on the CPU backend) on one shape, timed, after a check of its results.
 * tests/bench/ggml/build.sh builds it against a ggml source (github.com/ggml-org/ggml; written
 * for commit d99724f2), run.sh runs the standard shapes, and make bench-report charts its
 * lines beside attnd's (docs/benchmarks.md).
 *
 * This file is attnd's; it includes ggml's headers and links ggml's libraries, which are under
 * the MIT license (Copyright (c) 2023-2026 The ggml authors; the LICENSE file of ggml's
 * source), so a binary built from it carries that notice.
 *
 *     ggml_fa_bench B H LQ LK D CAUSAL KVTYPE THREADS [REPS]      (REPS default 5)
 *
 *   KVTYPE: f32 | f16 | bf16
 *   Q: F32 [D, LQ, H, B] (ggml order: ne0 fastest), K/V: KVTYPE [D, LK, H, B]
 *   scale = 1/sqrt(D); CAUSAL=1 -> F16 mask [LK, LQ, 1, 1], -inf where j > i
 *   (top-left aligned: key j visible to query i iff j <= i). CAUSAL=0 -> mask NULL.
 *   At the ggml commit this was written for, GGML_KQ_MASK_PAD no longer exists
 *   (removed in 4767bda "ggml : remove GGML_KQ_MASK_PAD constant"); the mask only
 *   needs ne1 == n_queries (rows beyond LQ are not read), so no padding is added.
 *   If GGML_KQ_MASK_PAD is defined (older ggml) the mask rows are padded to it.
 *
 * Before timing it checks correctness on B=1 H=2 LQ=LK=67 D=64, causal and not,
 * with the same KVTYPE and THREADS, against a float64 reference that uses the
 * KVTYPE-rounded K/V values (so it measures kernel error, not storage rounding).
 * Limits: f32 1e-5, f16 1e-3, bf16 5e-3 (ggml's bf16 path also rounds Q to bf16).
 * Inputs are uniform in [-1, 1) from the tests' one generator (tests/support/rng.h), seed 1.
 *
 * Output: one JSON line. gflops_dense = 4*B*H*LQ*LK*D / median;
 * gflops_useful = same, halved when causal && LQ == LK (exact visible-pair count
 * when causal && LQ != LK). Exit 3 when the check fails.
 */
#define _POSIX_C_SOURCE 200809L
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "tests/support/rng.h"

#ifndef GGML_COMMIT_ID
#define GGML_COMMIT_ID "unknown"
#endif

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static uint64_t rng_state = 1;
static float frand(void) { // uniform in [-1, 1)
    return rng_sym(&rng_state, 1.0);
}

static int cmp_d(const void * a, const void * b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

struct fa_case {
    struct ggml_context * ctx;
    ggml_backend_buffer_t buf;
    struct ggml_cgraph  * gf;
    struct ggml_tensor  * q, * k, * v, * mask, * out;
    float * qh, * kh, * vh; // host copies; kh/vh hold the KVTYPE-rounded values
};

// build graph, allocate, fill with random data
static int fa_case_init(struct fa_case * c, ggml_backend_t be, int B, int H, int LQ, int LK, int D,
                        int causal, enum ggml_type kvt) {
    memset(c, 0, sizeof(*c));
    struct ggml_init_params ip = {
        .mem_size   = ggml_tensor_overhead() * 16 + ggml_graph_overhead(),
        .mem_buffer = NULL,
        .no_alloc   = true,
    };
    c->ctx = ggml_init(ip);
    if (!c->ctx) return -1;

    c->q = ggml_new_tensor_4d(c->ctx, GGML_TYPE_F32, D, LQ, H, B);
    c->k = ggml_new_tensor_4d(c->ctx, kvt, D, LK, H, B);
    c->v = ggml_new_tensor_4d(c->ctx, kvt, D, LK, H, B);
    c->mask = NULL;
    if (causal) {
        int64_t rows = LQ;
#ifdef GGML_KQ_MASK_PAD
        rows = GGML_PAD(LQ, GGML_KQ_MASK_PAD);
#endif
        c->mask = ggml_new_tensor_4d(c->ctx, GGML_TYPE_F16, LK, rows, 1, 1);
    }
    c->out = ggml_flash_attn_ext(c->ctx, c->q, c->k, c->v, c->mask, 1.0f / sqrtf((float)D), 0.0f, 0.0f);
    ggml_flash_attn_ext_set_prec(c->out, GGML_PREC_F32);
    c->gf = ggml_new_graph(c->ctx);
    ggml_build_forward_expand(c->gf, c->out);

    c->buf = ggml_backend_alloc_ctx_tensors(c->ctx, be);
    if (!c->buf) return -2;

    const size_t nq = (size_t)D * LQ * H * B, nkv = (size_t)D * LK * H * B;
    c->qh = malloc(nq * sizeof(float));
    c->kh = malloc(nkv * sizeof(float));
    c->vh = malloc(nkv * sizeof(float));
    for (size_t i = 0; i < nq; i++) c->qh[i] = frand();
    for (size_t i = 0; i < nkv; i++) c->kh[i] = frand();
    for (size_t i = 0; i < nkv; i++) c->vh[i] = frand();
    ggml_backend_tensor_set(c->q, c->qh, 0, nq * sizeof(float));

    float * arr[2] = { c->kh, c->vh };
    struct ggml_tensor * dst[2] = { c->k, c->v };
    for (int t = 0; t < 2; t++) {
        if (kvt == GGML_TYPE_F32) {
            ggml_backend_tensor_set(dst[t], arr[t], 0, nkv * sizeof(float));
        } else if (kvt == GGML_TYPE_F16) {
            ggml_fp16_t * tmp = malloc(nkv * sizeof(ggml_fp16_t));
            ggml_fp32_to_fp16_row(arr[t], tmp, (int64_t)nkv);
            ggml_fp16_to_fp32_row(tmp, arr[t], (int64_t)nkv); // keep rounded values for reference
            ggml_backend_tensor_set(dst[t], tmp, 0, nkv * sizeof(ggml_fp16_t));
            free(tmp);
        } else { // bf16
            ggml_bf16_t * tmp = malloc(nkv * sizeof(ggml_bf16_t));
            ggml_fp32_to_bf16_row_ref(arr[t], tmp, (int64_t)nkv);
            ggml_bf16_to_fp32_row(tmp, arr[t], (int64_t)nkv);
            ggml_backend_tensor_set(dst[t], tmp, 0, nkv * sizeof(ggml_bf16_t));
            free(tmp);
        }
    }
    if (c->mask) {
        const int64_t rows = c->mask->ne[1];
        ggml_fp16_t * m = malloc((size_t)rows * LK * sizeof(ggml_fp16_t));
        const ggml_fp16_t zero = ggml_fp32_to_fp16(0.0f), ninf = ggml_fp32_to_fp16(-INFINITY);
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < LK; j++)
                m[i * LK + j] = (j <= i) ? zero : ninf;
        ggml_backend_tensor_set(c->mask, m, 0, (size_t)rows * LK * sizeof(ggml_fp16_t));
        free(m);
    }
    return 0;
}

static void fa_case_free(struct fa_case * c) {
    free(c->qh); free(c->kh); free(c->vh);
    if (c->buf) ggml_backend_buffer_free(c->buf);
    if (c->ctx) ggml_free(c->ctx);
}

// max abs error of ggml output vs float64 reference
static double check_case(ggml_backend_t be, int causal, enum ggml_type kvt) {
    const int B = 1, H = 2, L = 67, D = 64;
    struct fa_case c;
    if (fa_case_init(&c, be, B, H, L, L, D, causal, kvt) != 0) { fprintf(stderr, "check init failed\n"); exit(2); }
    if (ggml_backend_graph_compute(be, c.gf) != GGML_STATUS_SUCCESS) { fprintf(stderr, "check compute failed\n"); exit(2); }
    // out: [D, H, LQ, B] (permuted)
    const size_t no = (size_t)D * H * L * B;
    float * o = malloc(no * sizeof(float));
    ggml_backend_tensor_get(c.out, o, 0, no * sizeof(float));
    const double scale = 1.0 / sqrt((double)D);
    double * s = malloc(L * sizeof(double));
    double * acc = malloc(D * sizeof(double));
    double maxerr = 0.0;
    for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
    for (int i = 0; i < L; i++) {
        const float * qi = c.qh + (((size_t)b * H + h) * L + i) * D;
        double m = -INFINITY;
        const int jmax = causal ? (i < L - 1 ? i : L - 1) : L - 1;
        for (int j = 0; j <= jmax; j++) {
            const float * kj = c.kh + (((size_t)b * H + h) * L + j) * D;
            double d = 0;
            for (int e = 0; e < D; e++) d += (double)qi[e] * kj[e];
            s[j] = d * scale;
            if (s[j] > m) m = s[j];
        }
        double sum = 0;
        for (int e = 0; e < D; e++) acc[e] = 0;
        for (int j = 0; j <= jmax; j++) {
            const double p = exp(s[j] - m);
            sum += p;
            const float * vj = c.vh + (((size_t)b * H + h) * L + j) * D;
            for (int e = 0; e < D; e++) acc[e] += p * vj[e];
        }
        const float * oi = o + (((size_t)b * L + i) * H + h) * D;
        for (int e = 0; e < D; e++) {
            const double err = fabs(acc[e] / sum - (double)oi[e]);
            if (!(err <= maxerr)) maxerr = err; // NaN propagates as failure
        }
    }
    free(s); free(acc); free(o);
    fa_case_free(&c);
    return maxerr;
}

int main(int argc, char ** argv) {
    if (argc < 9) {
        fprintf(stderr, "usage: %s B H LQ LK D CAUSAL KVTYPE(f32|f16|bf16) THREADS [REPS]\n", argv[0]);
        return 1;
    }
    const int B = atoi(argv[1]), H = atoi(argv[2]), LQ = atoi(argv[3]), LK = atoi(argv[4]), D = atoi(argv[5]);
    const int causal = atoi(argv[6]);
    const char * kvs = argv[7];
    const int nth = atoi(argv[8]);
    const int reps = argc > 9 ? atoi(argv[9]) : 5;
    enum ggml_type kvt;
    double tol;
    if      (!strcmp(kvs, "f32"))  { kvt = GGML_TYPE_F32;  tol = 1e-5; }
    else if (!strcmp(kvs, "f16"))  { kvt = GGML_TYPE_F16;  tol = 1e-3; }
    else if (!strcmp(kvs, "bf16")) { kvt = GGML_TYPE_BF16; tol = 5e-3; }
    else { fprintf(stderr, "bad KVTYPE %s\n", kvs); return 1; }
    if (B < 1 || H < 1 || LQ < 1 || LK < 1 || D < 1 || nth < 1 || reps < 1) { fprintf(stderr, "bad args\n"); return 1; }

    ggml_backend_t be = ggml_backend_cpu_init();
    if (!be) { fprintf(stderr, "ggml_backend_cpu_init failed\n"); return 2; }
    ggml_backend_cpu_set_n_threads(be, nth);

    const double err_nc = check_case(be, 0, kvt);
    const double err_c  = check_case(be, 1, kvt);
    const int check_ok = err_nc < tol && err_c < tol;

    struct fa_case c;
    if (fa_case_init(&c, be, B, H, LQ, LK, D, causal, kvt) != 0) { fprintf(stderr, "init failed\n"); return 2; }
    if (ggml_backend_graph_compute(be, c.gf) != GGML_STATUS_SUCCESS) { fprintf(stderr, "compute failed\n"); return 2; } // warm-up
    double * t = malloc(reps * sizeof(double));
    for (int r = 0; r < reps; r++) {
        const double t0 = now_ms();
        ggml_backend_graph_compute(be, c.gf);
        t[r] = now_ms() - t0;
    }
    qsort(t, reps, sizeof(double), cmp_d);
    const double med = (reps % 2) ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
    const double mn = t[0];

    const double dense = 4.0 * B * H * (double)LQ * LK * D;
    double useful = dense;
    if (causal) {
        if (LQ == LK) useful = dense / 2;
        else {
            double pairs = 0;
            for (int i = 0; i < LQ; i++) pairs += (i + 1 < LK) ? i + 1 : LK;
            useful = 4.0 * B * H * pairs * D;
        }
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);

    printf("{\"impl\":\"ggml_flash_attn_ext_cpu\",\"commit\":\"%s\",\"B\":%d,\"H\":%d,\"LQ\":%d,\"LK\":%d,\"D\":%d,"
           "\"causal\":%d,\"kv_type\":\"%s\",\"threads\":%d,\"reps\":%d,\"median_ms\":%.3f,\"min_ms\":%.3f,"
           "\"gflops_dense\":%.2f,\"gflops_useful\":%.2f,\"peak_rss_mb\":%.1f,"
           "\"check_maxerr_noncausal\":%.3g,\"check_maxerr_causal\":%.3g,\"check_tol\":%g,\"check_pass\":%s,"
           "\"cpu\":{\"avx2\":%d,\"avx512\":%d,\"avx512_bf16\":%d,\"avx512_vnni\":%d,\"amx_int8\":%d,\"f16c\":%d,\"fma\":%d}}\n",
           GGML_COMMIT_ID, B, H, LQ, LK, D, causal, kvs, nth, reps, med, mn,
           dense / (med * 1e6), useful / (med * 1e6), ru.ru_maxrss / 1024.0,
           err_nc, err_c, tol, check_ok ? "true" : "false",
           ggml_cpu_has_avx2(), ggml_cpu_has_avx512(), ggml_cpu_has_avx512_bf16(), ggml_cpu_has_avx512_vnni(),
           ggml_cpu_has_amx_int8(), ggml_cpu_has_f16c(), ggml_cpu_has_fma());
    fflush(stdout);

    free(t);
    fa_case_free(&c);
    ggml_backend_free(be);
    return check_ok ? 0 : 3;
}
