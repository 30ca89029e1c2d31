/*
 * test_kvcache.c - KV-cache sessions (engine.h eng_kv_*): the block pool, sequences (append,
 * truncate, fork, copy-on-write) and attention through the block table.
 *
 * Every attention is held to tests/support/ref.c's float64 attention over the concatenated
 * history, which each test keeps beside the sequence as the cache should hold it (for a bf16 or
 * f16 cache, the values rounded to that type): output within 1e-5 x max|V| (the tolerance of
 * test_sdpa.c: widening a cached value is exact, so the cache adds no error of its own), the
 * log-sum-exp within 1e-5 (relative), the weights within 1e-5. Against the unrounded inputs a
 * bf16 cache is held to the bf16 tolerance of test_sdpa_bf16.c, 1.5e-2 x max|V|.
 *
 * Block sizes of 16 (key blocks of 16 keys, no prepacking: 16 is below the avx512 panel) and
 * 64 (prepacked prefills) run through the same cases. The Makefile runs this binary once per
 * kernel set; sizes shrink when ATTND_TEST_QUICK=1 (the ASan and TSan runs).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "tests/support/check.h"
#include "tests/support/ref.h"
#include "tests/support/util.h"

static eng_pool *pool;
static bool quick;

/* ---- A sequence and its history ------------------------------------------------------------ */

/* A sequence beside the history it should hold: [Hkv][cap][D] as the cache rounds it, and the
 * original fp32 values. */
typedef struct {
    eng_kv_seq *seq;
    int64_t Hkv, D, Dv, cap, len;
    eng_dtype dtype;
    float amp;      /* of the keys drawn next (1 unless a test raises it) */
    float *k, *v;   /* as cached */
    float *k0, *v0; /* as given */
} hist;

static float round_to(eng_dtype dtype, float x)
{
    if (dtype == ENG_DTYPE_BF16)
        return eng_bf16_to_f32(eng_f32_to_bf16(x));
    if (dtype == ENG_DTYPE_F16)
        return eng_f16_to_f32(eng_f32_to_f16(x));
    return x;
}

static void hist_init(hist *h, eng_kv_pool *kvp, int64_t Hkv, int64_t D, int64_t Dv,
                      eng_dtype dtype, int64_t cap)
{
    memset(h, 0, sizeof *h);
    h->Hkv = Hkv;
    h->D = D;
    h->Dv = Dv;
    h->cap = cap;
    h->dtype = dtype;
    h->amp = 1.0f;
    h->k = xcalloc((size_t)(Hkv * cap * D), sizeof(float));
    h->v = xcalloc((size_t)(Hkv * cap * Dv), sizeof(float));
    h->k0 = xcalloc((size_t)(Hkv * cap * D), sizeof(float));
    h->v0 = xcalloc((size_t)(Hkv * cap * Dv), sizeof(float));
    eng_kv_shape shape = {.num_kv_heads = Hkv, .head_dim = D, .value_head_dim = Dv, .dtype = dtype};
    eng_error err;
    h->seq = eng_kv_seq_new(kvp, &shape, &err);
    CHECKF(h->seq != NULL, "eng_kv_seq_new: %s", err.message);
}

/* A fork of h's sequence with a copy of its history. */
static void hist_fork(hist *f, const hist *h)
{
    *f = *h;
    size_t nk = (size_t)(h->Hkv * h->cap * h->D) * sizeof(float),
           nv = (size_t)(h->Hkv * h->cap * h->Dv) * sizeof(float);
    f->k = memcpy(xcalloc(nk, 1), h->k, nk);
    f->v = memcpy(xcalloc(nv, 1), h->v, nv);
    f->k0 = memcpy(xcalloc(nk, 1), h->k0, nk);
    f->v0 = memcpy(xcalloc(nv, 1), h->v0, nv);
    eng_error err;
    f->seq = eng_kv_seq_fork(h->seq, &err);
    CHECKF(f->seq != NULL, "eng_kv_seq_fork: %s", err.message);
}

static void hist_free(hist *h)
{
    eng_kv_seq_free(h->seq);
    free(h->k);
    free(h->v);
    free(h->k0);
    free(h->v0);
}

/* New rows of n tokens in the token-major layout [1, n, Hkv, width] of a [B, L, H, D] tensor,
 * as `in` (the dtype they travel in), viewed as [1, Hkv, n, width]. */
typedef struct {
    void *data;
    eng_kv_rows rows;
} new_rows;

static void rows_make(new_rows *r, const float *x, int64_t Hkv, int64_t n, int64_t width,
                      eng_dtype in)
{
    size_t count = (size_t)(n * Hkv * width);
    if (in == ENG_DTYPE_F32) {
        r->data = memcpy(xcalloc(count, sizeof(float)), x, count * sizeof(float));
    } else {
        uint16_t *h = xcalloc(count, sizeof *h);
        for (size_t i = 0; i < count; i++)
            h[i] = in == ENG_DTYPE_BF16 ? eng_f32_to_bf16(x[i]) : eng_f32_to_f16(x[i]);
        r->data = h;
    }
    r->rows = (eng_kv_rows){.dtype = in,
                            .data = r->data,
                            .ne = {1, Hkv, n, width},
                            .stride = {n * Hkv * width, width, Hkv * width, 1}};
}

/* Draws n tokens' K and V (uniform in +-1), turns them into rows of dtype `in`, and records
 * them in h's history past len (not yet in h->len). */
static void draw_tokens(hist *h, int64_t n, eng_dtype in, uint64_t *rng, new_rows *k, new_rows *v)
{
    float *xk = xcalloc((size_t)(n * h->Hkv * h->D), sizeof(float)),
          *xv = xcalloc((size_t)(n * h->Hkv * h->Dv), sizeof(float));
    for (int64_t t = 0; t < n; t++)
        for (int64_t hk = 0; hk < h->Hkv; hk++) {
            for (int64_t d = 0; d < h->D; d++) {
                float x = rng_sym(rng, h->amp);
                xk[(t * h->Hkv + hk) * h->D + d] = x;
                size_t at = (size_t)((hk * h->cap + h->len + t) * h->D + d);
                h->k0[at] = x;
                h->k[at] = round_to(h->dtype, round_to(in, x));
            }
            for (int64_t d = 0; d < h->Dv; d++) {
                float x = rng_sym(rng, 1.0);
                xv[(t * h->Hkv + hk) * h->Dv + d] = x;
                size_t at = (size_t)((hk * h->cap + h->len + t) * h->Dv + d);
                h->v0[at] = x;
                h->v[at] = round_to(h->dtype, round_to(in, x));
            }
        }
    rows_make(k, xk, h->Hkv, n, h->D, in);
    rows_make(v, xv, h->Hkv, n, h->Dv, in);
    free(xk);
    free(xv);
}

static void rows_free(new_rows *r)
{
    free(r->data);
}

/* Appends n random tokens; true when the append succeeded. */
static bool hist_append(hist *h, int64_t n, eng_dtype in, uint64_t *rng)
{
    new_rows k, v;
    draw_tokens(h, n, in, rng, &k, &v);
    eng_error err;
    eng_status st = eng_kv_seq_append(h->seq, &k.rows, &v.rows, &err);
    CHECKF(st == ENG_OK, "append %lld tokens at %lld: %s", (long long)n, (long long)h->len,
           err.message);
    if (st == ENG_OK)
        h->len += n;
    rows_free(&k);
    rows_free(&v);
    return st == ENG_OK;
}

/* The history as K and V views of its first len tokens (original values when `given`). */
static void history_views(const hist *h, bool given, eng_sdpa_args *a)
{
    a->k = (eng_view){.data = given ? h->k0 : h->k,
                      .ne = {1, h->Hkv, h->len, h->D},
                      .stride = {h->Hkv * h->cap * h->D, h->cap * h->D, h->D, 1}};
    a->v = (eng_view){.data = given ? h->v0 : h->v,
                      .ne = {1, h->Hkv, h->len, h->Dv},
                      .stride = {h->Hkv * h->cap * h->Dv, h->cap * h->Dv, h->Dv, 1}};
}

/* A query of L rows and H heads with its output, LSE and (when asked) weights buffers. */
typedef struct {
    float *q, *out, *lse, *w;
    eng_sdpa_args a;
} query;

static void query_make(query *qq, int64_t H, int64_t L, int64_t D, int64_t Dv, int64_t S,
                       eng_weights_mode wm, uint64_t *rng)
{
    memset(qq, 0, sizeof *qq);
    qq->q = xcalloc((size_t)(H * L * D), sizeof(float));
    for (int64_t i = 0; i < H * L * D; i++)
        qq->q[i] = rng_sym(rng, 1.5);
    qq->out = xcalloc((size_t)(H * L * Dv), sizeof(float));
    qq->lse = xcalloc((size_t)(H * L), sizeof(float));
    qq->a.q = eng_view_contiguous(qq->q, 1, H, L, D);
    qq->a.out = eng_view_contiguous(qq->out, 1, H, L, Dv);
    qq->a.lse = qq->lse;
    qq->a.causal = true;
    qq->a.align = ENG_ALIGN_BOTTOM_RIGHT;
    if (wm != ENG_WEIGHTS_NONE) {
        qq->w = xcalloc((size_t)((wm == ENG_WEIGHTS_MEAN ? 1 : H) * L * S), sizeof(float));
        qq->a.weights_mode = wm;
        qq->a.weights = qq->w;
    }
}

static void query_free(query *qq)
{
    free(qq->q);
    free(qq->out);
    free(qq->lse);
    free(qq->w);
}

/* Compares what the engine wrote for qq against the reference over h's history; returns the
 * output error over max|V| (the LSE and weights are checked here). */
static double check_against_history(const hist *h, const query *qq, bool given, const char *what)
{
    eng_sdpa_args r = qq->a;
    history_views(h, given, &r);
    ref_result ref;
    if (!ref_sdpa(&r, &ref)) {
        CHECKF(false, "[%s] reference out of memory", what);
        return 1e30;
    }
    const int64_t H = r.q.ne[1], L = r.q.ne[2], S = h->len, Dv = h->Dv;
    double vmax = 0, err = 0, lse_err = 0, w_err = 0;
    for (int64_t hk = 0; hk < h->Hkv; hk++)
        for (int64_t j = 0; j < S * Dv; j++)
            vmax = fmax(vmax, fabs((double)(given ? h->v0 : h->v)[hk * h->cap * Dv + j]));
    for (int64_t i = 0; i < H * L * Dv; i++)
        err = fmax(err, fabs((double)qq->out[i] - ref.out[i]));
    for (int64_t i = 0; i < H * L; i++) {
        if (isinf(ref.lse[i])) {
            CHECKF(isinf(qq->lse[i]) && qq->lse[i] < 0, "[%s] lse %lld: %g, want -inf", what,
                   (long long)i, (double)qq->lse[i]);
            continue;
        }
        lse_err = fmax(lse_err, fabs((double)qq->lse[i] - ref.lse[i]) / (1 + fabs(ref.lse[i])));
    }
    if (qq->a.weights_mode != ENG_WEIGHTS_NONE) {
        const double *want =
            qq->a.weights_mode == ENG_WEIGHTS_MEAN ? ref.weights_mean : ref.weights;
        int64_t n = (qq->a.weights_mode == ENG_WEIGHTS_MEAN ? 1 : H) * L * S;
        for (int64_t i = 0; i < n; i++)
            w_err = fmax(w_err, fabs((double)qq->w[i] - want[i]));
        CHECKF(w_err <= (given ? 2e-2 : 1e-5), "[%s] weights off by %g", what, w_err);
    }
    if (!given)
        CHECKF(lse_err <= 1e-5, "[%s] lse off by %g (relative)", what, lse_err);
    ref_result_free(&ref);
    return vmax > 0 ? err / vmax : err;
}

/* Runs one step (append n tokens, then attend with qq's L rows) and checks it. */
static void step_and_check(hist *h, int64_t n, query *qq, eng_dtype in, uint64_t *rng,
                           const char *what)
{
    new_rows k, v;
    draw_tokens(h, n, in, rng, &k, &v);
    eng_error err;
    eng_status st = eng_kv_step(pool, h->seq, &k.rows, &v.rows, &qq->a, NULL, &err);
    rows_free(&k);
    rows_free(&v);
    CHECKF(st == ENG_OK, "[%s] eng_kv_step at %lld: %s: %s", what, (long long)h->len, err.field,
           err.message);
    if (st != ENG_OK)
        return;
    h->len += n;
    CHECK_EQ_INT(eng_kv_seq_length(h->seq), h->len);
    double e = check_against_history(h, qq, false, what);
    CHECKF(e <= 1e-5, "[%s] at length %lld: output off by %g x max|V|", what, (long long)h->len, e);
    /* The bf16 tolerance holds for unit-sized keys; scores of peaked rows move further. */
    if (h->dtype == ENG_DTYPE_BF16 && h->amp <= 1.0f) {
        double e0 = check_against_history(h, qq, true, what);
        CHECKF(e0 <= 1.5e-2, "[%s] bf16 cache vs fp32 history: %g x max|V|", what, e0);
    }
}

/* Attends without appending (the step's query only) and checks it. */
static void attend_and_check(hist *h, query *qq, const char *what)
{
    eng_error err;
    eng_status st = eng_kv_step(pool, h->seq, NULL, NULL, &qq->a, NULL, &err);
    CHECKF(st == ENG_OK, "[%s] attend-only: %s", what, err.message);
    double e = check_against_history(h, qq, false, what);
    CHECKF(e <= 1e-5, "[%s] output off by %g x max|V|", what, e);
}

static eng_kv_pool *new_pool(size_t bytes, int64_t block_tokens)
{
    eng_error err;
    eng_kv_pool *kvp = eng_kv_pool_new(bytes, block_tokens, &err);
    CHECKF(kvp != NULL, "eng_kv_pool_new: %s", err.message);
    return kvp;
}

static eng_kv_pool_stats stats_of(eng_kv_pool *kvp)
{
    eng_kv_pool_stats s;
    eng_kv_pool_stats_get(kvp, &s);
    return s;
}

/* ---- Prefill and decode --------------------------------------------------------------------- */

/* A prefill then single-token steps, each equal to attention over the whole history. */
static void prefill_then_decode(eng_dtype dtype, int64_t T, int64_t prefill, int64_t steps,
                                int64_t H, int64_t Hkv, int64_t D, const char *what)
{
    uint64_t rng = 1000 + (uint64_t)dtype * 7 + (uint64_t)T;
    eng_kv_pool *kvp = new_pool((size_t)1 << 30, T);
    hist h;
    hist_init(&h, kvp, Hkv, D, D, dtype, prefill + steps);
    query qq;
    query_make(&qq, H, prefill, D, D, prefill, ENG_WEIGHTS_NONE, &rng);
    char name[96];
    snprintf(name, sizeof name, "%s prefill", what);
    step_and_check(&h, prefill, &qq, ENG_DTYPE_F32, &rng, name);
    query_free(&qq);
    for (int64_t s = 0; s < steps; s++) {
        query_make(&qq, H, 1, D, D, h.len + 1, ENG_WEIGHTS_NONE, &rng);
        snprintf(name, sizeof name, "%s step %lld", what, (long long)s);
        step_and_check(&h, 1, &qq, ENG_DTYPE_F32, &rng, name);
        query_free(&qq);
    }
    eng_kv_pool_stats st = stats_of(kvp);
    CHECK_EQ_INT(st.tokens, prefill + steps);
    CHECK_EQ_INT(st.blocks, (prefill + steps + T - 1) / T);
    hist_free(&h);
    CHECK_EQ_INT(stats_of(kvp).used_bytes, 0);
    eng_kv_pool_free(kvp);
}

static void test_prefill_1000_then_200_steps_float32(void)
{
    prefill_then_decode(ENG_DTYPE_F32, 64, quick ? 300 : 1000, quick ? 40 : 200, 4, 2, 64,
                        "f32 T=64");
}

static void test_prefill_then_steps_float32_small_blocks(void)
{
    prefill_then_decode(ENG_DTYPE_F32, 16, quick ? 150 : 400, quick ? 20 : 60, 4, 4, 32,
                        "f32 T=16");
}

static void test_prefill_then_steps_bfloat16(void)
{
    prefill_then_decode(ENG_DTYPE_BF16, 64, quick ? 200 : 1000, quick ? 20 : 200, 4, 2, 64,
                        "bf16 T=64");
}

/* One query head per kv head: a step's single rows read the bf16 cache through the pair
 * kernels (heads of a multiple of 32; 160 spans a chunk of 128 and a short one). */
static void test_prefill_then_steps_bfloat16_ungrouped(void)
{
    prefill_then_decode(ENG_DTYPE_BF16, 64, quick ? 200 : 600, quick ? 10 : 40, 3, 3, 96,
                        "bf16 ungrouped D=96");
    prefill_then_decode(ENG_DTYPE_BF16, 32, quick ? 100 : 300, quick ? 10 : 40, 2, 2, 160,
                        "bf16 ungrouped D=160");
}

static void test_prefill_then_steps_float16(void)
{
    prefill_then_decode(ENG_DTYPE_F16, 32, quick ? 150 : 500, quick ? 20 : 60, 2, 1, 48,
                        "f16 T=32");
}

/* Prefills whose query blocks end in panels of one or two rows, after keys ten times smaller,
 * so that rows rebase on a late maximum, into prepacked caches of 32-token blocks (panels span
 * cache blocks) in float32 and bfloat16. */
static void test_prefill_shapes_and_late_maxima(void)
{
    const int64_t lengths[] = {1, 2, 13, 14, 97, 301, 517};
    const eng_dtype types[] = {ENG_DTYPE_F32, ENG_DTYPE_BF16};
    for (int t = 0; t < 2; t++)
        for (size_t i = 0; i < sizeof lengths / sizeof lengths[0]; i++) {
            uint64_t rng = 300 + i;
            eng_kv_pool *kvp = new_pool((size_t)64 << 20, 32);
            hist h;
            hist_init(&h, kvp, 2, 32, 32, types[t], 1200);
            h.amp = 0.3f;
            CHECK(hist_append(&h, 45, ENG_DTYPE_F32, &rng));
            h.amp = 12.0f;
            query qq;
            query_make(&qq, 4, lengths[i], 32, 32, h.len + lengths[i], ENG_WEIGHTS_NONE, &rng);
            char name[64];
            snprintf(name, sizeof name, "prefill L=%lld dtype %d", (long long)lengths[i], t);
            step_and_check(&h, lengths[i], &qq, ENG_DTYPE_F32, &rng, name);
            query_free(&qq);
            hist_free(&h);
            eng_kv_pool_free(kvp);
        }
}

/* One query head per kv head, a group of four, and a single kv head for eight queries. */
static void test_grouped_query_heads(void)
{
    const int64_t groups[][2] = {{4, 4}, {8, 2}, {8, 1}};
    for (size_t g = 0; g < 3; g++) {
        char name[64];
        snprintf(name, sizeof name, "gqa H=%lld Hkv=%lld", (long long)groups[g][0],
                 (long long)groups[g][1]);
        prefill_then_decode(ENG_DTYPE_F32, 32, quick ? 70 : 200, 8, groups[g][0], groups[g][1], 32,
                            name);
    }
}

/* The options of one grouped-query decode step over S keys, by number: per-head weights;
 * a window and softcap; ALiBi (a slope per query head) with mean weights; key padding with
 * kv_lengths; a boolean mask with rows of its own per query head; a float mask per query head
 * without causality (cross-attention over the cache). pad is [S], bmask [H, L, S], fmask [H, S]. */
enum { GQA_OPTIONS = 6 };

static eng_weights_mode gqa_weights(int opt)
{
    return opt == 0 ? ENG_WEIGHTS_PER_HEAD : opt == 2 ? ENG_WEIGHTS_MEAN : ENG_WEIGHTS_NONE;
}

static const char *gqa_option(int opt, query *qq, int64_t H, int64_t L, int64_t S, uint8_t *pad,
                              uint8_t *bmask, float *fmask, int64_t *kv_length, uint64_t *rng)
{
    eng_sdpa_args *a = &qq->a;
    switch (opt) {
    case 0:
        return "causal, per-head weights";
    case 1:
        a->window_left_set = true;
        a->window_left = 37;
        a->softcap = 5.0f;
        return "window, softcap";
    case 2:
        a->alibi = true;
        return "ALiBi, mean weights";
    case 3:
        for (int64_t j = 0; j < S; j++)
            pad[j] = j % 7 == 3;
        *kv_length = S > 2 ? S - 2 : S;
        a->key_padding = pad;
        a->kv_lengths = kv_length;
        return "key padding, kv_lengths";
    case 4:
        for (int64_t i = 0; i < H * L * S; i++)
            bmask[i] = rng_unit(rng) < 0.7;
        a->attn_mask = (eng_mask){
            .kind = ENG_MASK_BOOL, .data = bmask, .ne = {1, H, L, S}, .stride = {0, L * S, S, 1}};
        return "bool mask per head";
    default:
        for (int64_t i = 0; i < H * S; i++)
            fmask[i] = rng_unit(rng) < 0.9 ? rng_sym(rng, 3.0) : -INFINITY;
        a->attn_mask = (eng_mask){
            .kind = ENG_MASK_FLOAT, .data = fmask, .ne = {1, H, 1, S}, .stride = {0, S, 0, 1}};
        a->causal = false;
        return "float mask per head, not causal";
    }
}

/* Grouped-query decoding through the block table of 16-token blocks: 2, 4 and 8 query heads
 * per kv head (one task takes a group, reading each block once for it), steps of 1, 2 and 5
 * tokens ending at the ragged lengths 1, 17, 1000 and 4097 (truncated back between them), with
 * every option of gqa_option. A step of more tokens than the length attends without appending. */
static void test_grouped_query_decode_steps(void)
{
    const int64_t groups[] = {2, 4, 8}, steps[] = {1, 2, 5}, ends[] = {1, 17, 1000, 4097};
    const int64_t Hkv = 2, D = 64, S_max = 4097;
    const size_t n_ends = quick ? 3 : 4;
    for (size_t gi = 0; gi < 3; gi++) {
        const int64_t H = groups[gi] * Hkv;
        uint64_t rng = 600 + gi;
        eng_kv_pool *kvp = new_pool((size_t)64 << 20, 16);
        hist h;
        hist_init(&h, kvp, Hkv, D, D, ENG_DTYPE_F32, S_max);
        uint8_t *pad = xcalloc((size_t)S_max, 1);
        uint8_t *bmask = xcalloc((size_t)(H * 5 * S_max), 1);
        float *fmask = xcalloc((size_t)(H * S_max), sizeof(float));
        for (size_t e = 0; e < n_ends; e++)
            for (size_t si = 0; si < 3; si++) {
                const int64_t S = ends[e], L = steps[si];
                const int64_t keep = S >= L ? S - L : S;
                eng_error err;
                if (h.len > keep) {
                    CHECK(eng_kv_seq_truncate(h.seq, keep, &err) == ENG_OK);
                    h.len = keep;
                } else if (h.len < keep) {
                    CHECK(hist_append(&h, keep - h.len, ENG_DTYPE_F32, &rng));
                }
                const int opt = (int)((e * 3 + si + gi) % GQA_OPTIONS);
                query qq;
                int64_t kv_length;
                query_make(&qq, H, L, D, D, S, gqa_weights(opt), &rng);
                const char *what =
                    gqa_option(opt, &qq, H, L, S, pad, bmask, fmask, &kv_length, &rng);
                char name[128];
                snprintf(name, sizeof name, "gqa decode H=%lld Hkv=%lld L=%lld S=%lld, %s",
                         (long long)H, (long long)Hkv, (long long)L, (long long)S, what);
                if (S >= L)
                    step_and_check(&h, L, &qq, ENG_DTYPE_F32, &rng, name);
                else
                    attend_and_check(&h, &qq, name);
                query_free(&qq);
            }
        free(pad);
        free(bmask);
        free(fmask);
        hist_free(&h);
        eng_kv_pool_free(kvp);
    }
}

/* Value heads wider and narrower than key heads (one of more than 128, which the bf16 block
 * loops take in two chunks), inputs in f16 and bf16 into caches of every type. */
static void test_value_dims_and_input_dtypes(void)
{
    const eng_dtype types[] = {ENG_DTYPE_F32, ENG_DTYPE_BF16, ENG_DTYPE_F16};
    const int64_t dims[][2] = {{24, 40}, {160, 96}};
    for (int sh = 0; sh < 2; sh++)
        for (int c = 0; c < 3; c++)
            for (int in = 0; in < 3; in++) {
                const int64_t D = dims[sh][0], Dv = dims[sh][1];
                uint64_t rng = (uint64_t)(77 + sh * 9 + c * 3 + in);
                eng_kv_pool *kvp = new_pool((size_t)64 << 20, 16);
                hist h;
                hist_init(&h, kvp, 2, D, Dv, types[c], 200);
                query qq;
                char name[64];
                snprintf(name, sizeof name, "D=%lld Dv=%lld cache %d input %d", (long long)D,
                         (long long)Dv, c, in);
                for (int s = 0; s < 4; s++) {
                    int64_t n = s == 0 ? 37 : s;
                    query_make(&qq, 4, n, D, Dv, h.len + n, ENG_WEIGHTS_NONE, &rng);
                    step_and_check(&h, n, &qq, types[in], &rng, name);
                    query_free(&qq);
                }
                hist_free(&h);
                eng_kv_pool_free(kvp);
            }
}

/* Every option of a step: softcap, window, ALiBi, scale, weights (per head, mean), bf16, key
 * padding with kv_lengths, and a boolean mask (the masks cover the length after the append). */
static void test_step_options(void)
{
    for (int opt = 0; opt < 9; opt++) {
        uint64_t rng = (uint64_t)(500 + opt);
        eng_kv_pool *kvp = new_pool((size_t)64 << 20, 16);
        hist h;
        hist_init(&h, kvp, 2, 32, 32, ENG_DTYPE_F32, 400);
        CHECK(hist_append(&h, 150, ENG_DTYPE_F32, &rng));
        for (int64_t L = 1; L <= 9; L += 8) {
            query qq;
            eng_weights_mode wm = opt == 4   ? ENG_WEIGHTS_PER_HEAD
                                  : opt == 5 ? ENG_WEIGHTS_MEAN
                                             : ENG_WEIGHTS_NONE;
            query_make(&qq, 4, L, 32, 32, h.len + L, wm, &rng);
            const int64_t S = h.len + L;
            uint8_t *pad = xcalloc((size_t)S, 1), *mask = xcalloc((size_t)(L * S), 1);
            int64_t lengths[1] = {S - 2};
            for (int64_t j = 0; j < S; j++)
                pad[j] = j % 7 == 3;
            for (int64_t i = 0; i < L * S; i++)
                mask[i] = rng_unit(&rng) < 0.7;
            const char *name = "";
            switch (opt) {
            case 7:
                qq.a.key_padding = pad;
                qq.a.kv_lengths = lengths;
                name = "key padding, kv_lengths";
                break;
            case 8:
                qq.a.attn_mask = (eng_mask){.kind = ENG_MASK_BOOL,
                                            .data = mask,
                                            .ne = {1, 1, L, S},
                                            .stride = {0, 0, S, 1}};
                name = "bool mask";
                break;
            case 0:
                qq.a.softcap = 5.0f;
                name = "softcap";
                break;
            case 1:
                qq.a.window_left_set = true;
                qq.a.window_left = 37;
                name = "window";
                break;
            case 2:
                qq.a.alibi = true;
                name = "alibi";
                break;
            case 3:
                qq.a.scale_set = true;
                qq.a.scale = 0.3f;
                qq.a.causal = false;
                name = "scale, non-causal";
                break;
            case 4:
                name = "weights per head";
                break;
            case 5:
                name = "weights mean";
                break;
            default:
                qq.a.precision = ENG_PRECISION_BFLOAT16;
                name = "bf16 precision";
                break;
            }
            if (opt == 6) {
                /* bf16 products: held to the rounded-inputs tolerance of test_sdpa_bf16.c. */
                new_rows k, v;
                draw_tokens(&h, L, ENG_DTYPE_F32, &rng, &k, &v);
                eng_error err;
                eng_status st = eng_kv_step(pool, h.seq, &k.rows, &v.rows, &qq.a, NULL, &err);
                CHECKF(st == ENG_OK, "bf16 step: %s", err.message);
                h.len += L;
                rows_free(&k);
                rows_free(&v);
                double e = check_against_history(&h, &qq, true, name);
                CHECKF(e <= 1.5e-2, "[%s] %g x max|V|", name, e);
            } else {
                step_and_check(&h, L, &qq, ENG_DTYPE_F32, &rng, name);
            }
            free(pad);
            free(mask);
            query_free(&qq);
        }
        hist_free(&h);
        eng_kv_pool_free(kvp);
    }
}

/* ---- Append-only, attend-only, fork, truncate ---------------------------------------------- */

/* Appends without a query, then attends without appending (cross-attention over a stored
 * memory: not causal). */
static void test_append_only_then_attend_only(void)
{
    uint64_t rng = 9;
    eng_kv_pool *kvp = new_pool((size_t)64 << 20, 16);
    hist h;
    hist_init(&h, kvp, 2, 32, 32, ENG_DTYPE_F32, 300);
    for (int i = 0; i < 5; i++) {
        new_rows k, v;
        draw_tokens(&h, 10 + i, ENG_DTYPE_F32, &rng, &k, &v);
        eng_error err;
        CHECK(eng_kv_step(pool, h.seq, &k.rows, &v.rows, NULL, NULL, &err) == ENG_OK);
        h.len += 10 + i;
        rows_free(&k);
        rows_free(&v);
    }
    CHECK_EQ_INT(eng_kv_seq_length(h.seq), 60);
    query qq;
    query_make(&qq, 4, 7, 32, 32, 60, ENG_WEIGHTS_PER_HEAD, &rng);
    qq.a.causal = false;
    attend_and_check(&h, &qq, "cross-attention");
    query_free(&qq);
    query_make(&qq, 2, 3, 32, 32, 60, ENG_WEIGHTS_NONE, &rng);
    attend_and_check(&h, &qq, "causal attend-only");
    CHECK_EQ_INT(eng_kv_seq_length(h.seq), 60);
    query_free(&qq);
    hist_free(&h);
    eng_kv_pool_free(kvp);
}

/* A fork shares every block; each side then diverges, the shared partial block copied on the
 * first append of each, and neither sees the other's tokens. */
static void test_fork_then_diverge(void)
{
    uint64_t rng = 21;
    const int64_t T = 16;
    eng_kv_pool *kvp = new_pool((size_t)64 << 20, T);
    hist a, b;
    hist_init(&a, kvp, 2, 32, 32, ENG_DTYPE_F32, 400);
    CHECK(hist_append(&a, 100, ENG_DTYPE_F32, &rng)); /* 6 full blocks and 4 tokens */
    eng_kv_pool_stats s0 = stats_of(kvp);
    CHECK_EQ_INT(s0.blocks, 7);
    hist_fork(&b, &a);
    eng_kv_pool_stats s1 = stats_of(kvp);
    CHECK_EQ_INT(s1.blocks, 7); /* nothing copied */
    CHECK_EQ_INT(s1.used_bytes, s0.used_bytes);
    CHECK_EQ_INT(s1.sequences, 2);
    CHECK_EQ_INT(s1.tokens, 200);
    query qq;
    for (int s = 0; s < 6; s++) {
        hist *x = s % 2 ? &b : &a;
        query_make(&qq, 4, 2, 32, 32, x->len + 2, ENG_WEIGHTS_NONE, &rng);
        step_and_check(x, 2, &qq, ENG_DTYPE_F32, &rng, s % 2 ? "fork" : "parent");
        query_free(&qq);
    }
    /* Each side owns its copy of block 6 now (10 tokens in it): 6 shared + 2. */
    CHECK_EQ_INT(stats_of(kvp).blocks, 8);
    query_make(&qq, 4, 1, 32, 32, a.len, ENG_WEIGHTS_NONE, &rng);
    attend_and_check(&a, &qq, "parent after the fork's steps");
    attend_and_check(&b, &qq, "fork after the parent's steps");
    query_free(&qq);
    hist_free(&a);
    CHECK_EQ_INT(stats_of(kvp).blocks, 7); /* the fork still holds the shared ones */
    hist_free(&b);
    CHECK_EQ_INT(stats_of(kvp).blocks, 0);
    CHECK_EQ_INT(stats_of(kvp).used_bytes, 0);
    eng_kv_pool_free(kvp);
}

/* A fork of a fork, forked at a block boundary and inside a block; a truncate of a shared
 * block followed by an append copies it rather than writing into the other's tokens. */
static void test_fork_of_a_fork_and_shared_truncate(void)
{
    uint64_t rng = 33;
    const int64_t T = 16;
    eng_kv_pool *kvp = new_pool((size_t)64 << 20, T);
    hist a, b, c;
    hist_init(&a, kvp, 1, 16, 16, ENG_DTYPE_BF16, 300);
    CHECK(hist_append(&a, 64, ENG_DTYPE_F32, &rng)); /* four full blocks */
    hist_fork(&b, &a);
    CHECK(hist_append(&b, 5, ENG_DTYPE_F32, &rng));
    hist_fork(&c, &b);
    CHECK_EQ_INT(stats_of(kvp).blocks, 5);
    /* c rolls back into a block all three share, then writes: its own copy. */
    eng_error err;
    CHECK(eng_kv_seq_truncate(c.seq, 40, &err) == ENG_OK);
    c.len = 40;
    CHECK(hist_append(&c, 30, ENG_DTYPE_F32, &rng));
    query qq;
    query_make(&qq, 2, 3, 16, 16, 100, ENG_WEIGHTS_NONE, &rng);
    attend_and_check(&a, &qq, "a");
    attend_and_check(&b, &qq, "b");
    attend_and_check(&c, &qq, "c");
    query_free(&qq);
    CHECK_EQ_INT(stats_of(kvp).tokens, 64 + 69 + 70);
    hist_free(&b);
    hist_free(&a);
    hist_free(&c);
    CHECK_EQ_INT(stats_of(kvp).blocks, 0);
    CHECK_EQ_INT(stats_of(kvp).sequences, 0);
    eng_kv_pool_free(kvp);
}

/* Truncating frees whole blocks past the new length; appending then continues from it. */
static void test_truncate_then_continue(void)
{
    uint64_t rng = 45;
    const int64_t T = 16;
    eng_kv_pool *kvp = new_pool((size_t)64 << 20, T);
    hist h;
    hist_init(&h, kvp, 2, 32, 32, ENG_DTYPE_F32, 400);
    CHECK(hist_append(&h, 100, ENG_DTYPE_F32, &rng));
    const int64_t cuts[] = {99, 64, 33, 0};
    for (size_t i = 0; i < 4; i++) {
        eng_error err;
        CHECK(eng_kv_seq_truncate(h.seq, cuts[i], &err) == ENG_OK);
        h.len = cuts[i];
        CHECK_EQ_INT(eng_kv_seq_length(h.seq), cuts[i]);
        CHECK_EQ_INT(stats_of(kvp).blocks, (cuts[i] + T - 1) / T);
        CHECK_EQ_INT(stats_of(kvp).tokens, cuts[i]);
        query qq;
        query_make(&qq, 4, 3, 32, 32, h.len + 3, ENG_WEIGHTS_NONE, &rng);
        step_and_check(&h, 3, &qq, ENG_DTYPE_F32, &rng, "after truncate");
        query_free(&qq);
        CHECK(hist_append(&h, 20, ENG_DTYPE_F32, &rng));
    }
    eng_error err;
    CHECK(eng_kv_seq_truncate(h.seq, h.len + 1, &err) == ENG_EINVAL);
    CHECK(strcmp(err.field, "length") == 0);
    CHECK(eng_kv_seq_truncate(h.seq, -1, &err) == ENG_EINVAL);
    CHECK(eng_kv_seq_truncate(h.seq, 0, &err) == ENG_OK);
    CHECK_EQ_INT(stats_of(kvp).used_bytes, 0);
    hist_free(&h);
    eng_kv_pool_free(kvp);
}

/* ---- Limits and errors ---------------------------------------------------------------------- */

/* Bytes of one block of the given shape. */
static size_t block_bytes(int64_t T, int64_t Hkv, int64_t D, int64_t Dv, size_t elem)
{
    return (size_t)(T * Hkv * (D + Dv)) * elem;
}

/* A full pool refuses an append (ENOMEM, kv_cache_bytes) and leaves the sequence as it was;
 * freeing another sequence makes room; a sequence that could never fit, or past max_tokens, is
 * ETOOBIG naming the limit. */
static void test_pool_exhaustion_and_limits(void)
{
    uint64_t rng = 57;
    const int64_t T = 16;
    const size_t bb = block_bytes(T, 2, 8, 8, sizeof(float));
    eng_kv_pool *kvp = new_pool(3 * bb, T);
    hist a, b;
    hist_init(&a, kvp, 2, 8, 8, ENG_DTYPE_F32, 200);
    hist_init(&b, kvp, 2, 8, 8, ENG_DTYPE_F32, 200);
    CHECK(hist_append(&a, 20, ENG_DTYPE_F32, &rng)); /* two blocks */
    CHECK(hist_append(&b, 10, ENG_DTYPE_F32, &rng)); /* the third */
    CHECK_EQ_INT(stats_of(kvp).used_bytes, 3 * bb);
    CHECK_EQ_INT(eng_kv_seq_append_bytes(a.seq, 20), bb);

    query qq;
    query_make(&qq, 2, 1, 8, 8, 21, ENG_WEIGHTS_NONE, &rng);
    attend_and_check(&a, &qq, "before the full append");
    float before[16];
    memcpy(before, qq.out, sizeof before);

    new_rows k, v;
    draw_tokens(&a, 20, ENG_DTYPE_F32, &rng, &k, &v);
    eng_error err;
    CHECK(eng_kv_seq_append(a.seq, &k.rows, &v.rows, &err) == ENG_ENOMEM);
    CHECK(strcmp(err.field, "kv_cache_bytes") == 0);
    CHECK_EQ_INT(err.cause, ENG_CAUSE_KV_CACHE_FULL);
    CHECK(eng_kv_step(pool, a.seq, &k.rows, &v.rows, &qq.a, NULL, &err) == ENG_ENOMEM);
    CHECK_EQ_INT(eng_kv_seq_length(a.seq), 20);
    CHECK_EQ_INT(stats_of(kvp).used_bytes, 3 * bb);
    attend_and_check(&a, &qq, "after the refused append");
    CHECK(memcmp(before, qq.out, sizeof before) == 0);

    /* Filling the last block of a needs nothing new. */
    rows_free(&k);
    rows_free(&v);
    CHECK(hist_append(&a, 12, ENG_DTYPE_F32, &rng));
    hist_free(&b); /* frees the third block */
    CHECK(hist_append(&a, 16, ENG_DTYPE_F32, &rng));
    CHECK_EQ_INT(stats_of(kvp).used_bytes, 3 * bb);

    /* More than the whole capacity: never fits. */
    draw_tokens(&a, 17, ENG_DTYPE_F32, &rng, &k, &v);
    CHECK(eng_kv_seq_append(a.seq, &k.rows, &v.rows, &err) == ENG_ETOOBIG);
    CHECK(strcmp(err.field, "kv_cache_bytes") == 0);
    CHECK_EQ_INT(err.cause, ENG_CAUSE_KV_CACHE_CAPACITY);
    CHECK(strstr(err.message, "capacity") != NULL);
    rows_free(&k);
    rows_free(&v);
    CHECK_EQ_INT(eng_kv_seq_length(a.seq), 48);
    hist_free(&a);

    /* A block larger than the pool. */
    eng_kv_shape big = {.num_kv_heads = 64, .head_dim = 128, .dtype = ENG_DTYPE_F32};
    CHECK(eng_kv_seq_new(kvp, &big, &err) == NULL);
    CHECK(err.status == ENG_ETOOBIG);
    CHECK_EQ_INT(err.cause, ENG_CAUSE_KV_CACHE_CAPACITY);

    /* max_tokens. */
    eng_kv_shape capped = {
        .num_kv_heads = 2, .head_dim = 8, .dtype = ENG_DTYPE_F32, .max_tokens = 10};
    eng_kv_seq *s = eng_kv_seq_new(kvp, &capped, &err);
    CHECK(s != NULL);
    hist c;
    hist_init(&c, kvp, 2, 8, 8, ENG_DTYPE_F32, 40);
    eng_kv_seq_free(c.seq);
    c.seq = s;
    CHECK(hist_append(&c, 10, ENG_DTYPE_F32, &rng));
    draw_tokens(&c, 1, ENG_DTYPE_F32, &rng, &k, &v);
    CHECK(eng_kv_seq_append(s, &k.rows, &v.rows, &err) == ENG_ETOOBIG);
    CHECK(strcmp(err.field, "max_tokens") == 0);
    CHECK_EQ_INT(err.cause, ENG_CAUSE_MAX_TOKENS);
    CHECK_EQ_INT(eng_kv_seq_length(s), 10);
    rows_free(&k);
    rows_free(&v);
    hist_free(&c);
    query_free(&qq);
    CHECK_EQ_INT(stats_of(kvp).used_bytes, 0);
    eng_kv_pool_free(kvp);
}

/* The last reference frees a block, whichever sequence holds it. */
static void test_refcounts_free_blocks(void)
{
    uint64_t rng = 61;
    eng_kv_pool *kvp = new_pool((size_t)16 << 20, 16);
    hist a;
    hist_init(&a, kvp, 1, 8, 8, ENG_DTYPE_F16, 100);
    CHECK(hist_append(&a, 40, ENG_DTYPE_F32, &rng));
    eng_error err;
    eng_kv_seq *forks[4];
    for (int i = 0; i < 4; i++)
        forks[i] = eng_kv_seq_fork(i ? forks[i - 1] : a.seq, &err);
    CHECK_EQ_INT(stats_of(kvp).blocks, 3);
    CHECK_EQ_INT(stats_of(kvp).sequences, 5);
    hist_free(&a);
    for (int i = 0; i < 3; i++) {
        eng_kv_seq_free(forks[i]);
        CHECK_EQ_INT(stats_of(kvp).blocks, 3);
    }
    CHECK(eng_kv_seq_truncate(forks[3], 16, &err) == ENG_OK);
    CHECK_EQ_INT(stats_of(kvp).blocks, 1);
    eng_kv_seq_free(forks[3]);
    eng_kv_pool_stats s = stats_of(kvp);
    CHECK_EQ_INT(s.blocks, 0);
    CHECK_EQ_INT(s.used_bytes, 0);
    CHECK_EQ_INT(s.tokens, 0);
    CHECK_EQ_INT(s.sequences, 0);
    eng_kv_seq_free(NULL);
    eng_kv_pool_free(kvp);
    eng_kv_pool_free(NULL);
}

static void test_rejects_bad_arguments(void)
{
    uint64_t rng = 71;
    eng_error err;
    CHECK(eng_kv_pool_new(1 << 20, 0, &err) == NULL && err.status == ENG_EINVAL);
    CHECK(eng_kv_pool_new(0, 16, &err) == NULL && err.status == ENG_EINVAL);
    eng_kv_pool *kvp = new_pool((size_t)16 << 20, 16);
    eng_kv_shape bad = {.num_kv_heads = 0, .head_dim = 8};
    CHECK(eng_kv_seq_new(kvp, &bad, &err) == NULL && strcmp(err.field, "num_kv_heads") == 0);
    CHECK_EQ_INT(err.cause, ENG_CAUSE_NONE); /* a bad shape, not a layer's head count */
    bad = (eng_kv_shape){.num_kv_heads = 1, .head_dim = 8, .dtype = (eng_dtype)9};
    CHECK(eng_kv_seq_new(kvp, &bad, &err) == NULL && strcmp(err.field, "cache_dtype") == 0);

    hist h;
    hist_init(&h, kvp, 2, 8, 8, ENG_DTYPE_F32, 100);
    query qq;
    query_make(&qq, 2, 1, 8, 8, 1, ENG_WEIGHTS_NONE, &rng);
    CHECK(eng_kv_attend(pool, h.seq, &qq.a, NULL, &err) == ENG_EINVAL); /* empty */
    new_rows k, v;
    draw_tokens(&h, 4, ENG_DTYPE_F32, &rng, &k, &v);
    eng_kv_rows wrong = k.rows;
    wrong.ne[1] = 3;
    CHECK(eng_kv_seq_append(h.seq, &wrong, &v.rows, &err) == ENG_EINVAL);
    CHECK(strcmp(err.field, "k") == 0);
    wrong = v.rows;
    wrong.ne[2] = 3;
    CHECK(eng_kv_seq_append(h.seq, &k.rows, &wrong, &err) == ENG_EINVAL);
    wrong = k.rows;
    wrong.stride[3] = 2;
    CHECK(eng_kv_seq_append(h.seq, &wrong, &v.rows, &err) == ENG_EINVAL);
    wrong = k.rows;
    wrong.data = NULL;
    CHECK(eng_kv_seq_append(h.seq, &wrong, &v.rows, &err) == ENG_EINVAL);
    CHECK(eng_kv_step(pool, h.seq, &k.rows, NULL, NULL, NULL, &err) == ENG_EINVAL);
    /* A step with bad rows names them, even on an empty sequence. */
    wrong = k.rows;
    wrong.ne[2] = 0;
    CHECK(eng_kv_step(pool, h.seq, &wrong, &v.rows, &qq.a, NULL, &err) == ENG_EINVAL);
    CHECK(strcmp(err.field, "k") == 0);
    /* A query of the wrong head size fails before the append. */
    query bad_q;
    query_make(&bad_q, 2, 1, 6, 8, 5, ENG_WEIGHTS_NONE, &rng);
    CHECK(eng_kv_step(pool, h.seq, &k.rows, &v.rows, &bad_q.a, NULL, &err) == ENG_EINVAL);
    CHECK_EQ_INT(eng_kv_seq_length(h.seq), 0);
    query_free(&bad_q);
    /* Query heads not a multiple of the kv heads. */
    query_make(&bad_q, 3, 1, 8, 8, 5, ENG_WEIGHTS_NONE, &rng);
    CHECK(eng_kv_step(pool, h.seq, &k.rows, &v.rows, &bad_q.a, NULL, &err) == ENG_EINVAL);
    CHECK_EQ_INT(eng_kv_seq_length(h.seq), 0);
    query_free(&bad_q);
    CHECK(eng_kv_seq_append(h.seq, &k.rows, &v.rows, &err) == ENG_OK);
    h.len = 4;
    /* k set by the caller. */
    eng_sdpa_args a = qq.a;
    a.k = qq.a.q;
    CHECK(eng_kv_attend(pool, h.seq, &a, NULL, &err) == ENG_EINVAL);
    CHECK(strcmp(err.field, "k") == 0);
    float w[3] = {1, 2, 3};
    a = qq.a;
    a.additive_w_q = a.additive_w_k = a.additive_v = w;
    a.additive_dim = 1;
    CHECK(eng_kv_attend(pool, h.seq, &a, NULL, &err) == ENG_EINVAL);
    /* A cancelled attention step undoes its append. */
    eng_ctl ctl = {.deadline_ns = 0};
    atomic_init(&ctl.cancel, true);
    CHECK(eng_kv_step(pool, h.seq, &k.rows, &v.rows, &qq.a, &ctl, &err) == ENG_ECANCELLED);
    CHECK_EQ_INT(eng_kv_seq_length(h.seq), 4);
    CHECK_EQ_INT(stats_of(kvp).tokens, 4);
    rows_free(&k);
    rows_free(&v);
    query_free(&qq);
    hist_free(&h);
    eng_kv_pool_free(kvp);
}

/* ---- Threads -------------------------------------------------------------------------------- */

#define CONC_THREADS 4

typedef struct {
    eng_kv_pool *kvp;
    uint64_t seed;
    int steps;
    double worst;
    int failures;
} conc_job;

/* Two sequences (one forked from the other midway) stepped in turn, each step checked. */
static void *conc_worker(void *arg)
{
    conc_job *j = arg;
    uint64_t rng = j->seed;
    hist a, b;
    hist_init(&a, j->kvp, 2, 32, 32, j->seed % 2 ? ENG_DTYPE_BF16 : ENG_DTYPE_F32, 600);
    CHECK(hist_append(&a, 70, ENG_DTYPE_F32, &rng));
    hist_fork(&b, &a);
    for (int s = 0; s < j->steps; s++) {
        hist *x = s % 2 ? &b : &a;
        query qq;
        int64_t n = 1 + s % 3;
        query_make(&qq, 4, n, 32, 32, x->len + n, ENG_WEIGHTS_NONE, &rng);
        step_and_check(x, n, &qq, ENG_DTYPE_F32, &rng, "concurrent");
        query_free(&qq);
        if (s == j->steps / 2) {
            eng_error err;
            CHECK(eng_kv_seq_truncate(a.seq, a.len - 5, &err) == ENG_OK);
            a.len -= 5;
        }
    }
    hist_free(&a);
    hist_free(&b);
    return NULL;
}

static void test_concurrent_sequences_share_a_pool(void)
{
    eng_kv_pool *kvp = new_pool((size_t)256 << 20, 32);
    pthread_t tid[CONC_THREADS];
    conc_job jobs[CONC_THREADS];
    for (int i = 0; i < CONC_THREADS; i++) {
        jobs[i] = (conc_job){.kvp = kvp, .seed = (uint64_t)(900 + i), .steps = quick ? 12 : 40};
        pthread_create(&tid[i], NULL, conc_worker, &jobs[i]);
    }
    for (int i = 0; i < CONC_THREADS; i++)
        pthread_join(tid[i], NULL);
    eng_kv_pool_stats s = stats_of(kvp);
    CHECK_EQ_INT(s.used_bytes, 0);
    CHECK_EQ_INT(s.blocks, 0);
    CHECK_EQ_INT(s.sequences, 0);
    eng_kv_pool_free(kvp);
}

int main(void)
{
    int status;
    if (test_engine_start(&pool, &status))
        return status;
    quick = test_quick();
    RUN_WITHIN(test_prefill_1000_then_200_steps_float32, 240);
    RUN_WITHIN(test_prefill_then_steps_float32_small_blocks, 120);
    RUN_WITHIN(test_prefill_then_steps_bfloat16, 240);
    RUN_WITHIN(test_prefill_then_steps_bfloat16_ungrouped, 120);
    RUN_WITHIN(test_prefill_then_steps_float16, 120);
    RUN_WITHIN(test_prefill_shapes_and_late_maxima, 120);
    RUN_WITHIN(test_grouped_query_heads, 120);
    RUN_WITHIN(test_grouped_query_decode_steps, 120);
    RUN_WITHIN(test_value_dims_and_input_dtypes, 60);
    RUN_WITHIN(test_step_options, 120);
    RUN_WITHIN(test_append_only_then_attend_only, 60);
    RUN_WITHIN(test_fork_then_diverge, 60);
    RUN_WITHIN(test_fork_of_a_fork_and_shared_truncate, 60);
    RUN_WITHIN(test_truncate_then_continue, 60);
    RUN_WITHIN(test_pool_exhaustion_and_limits, 60);
    RUN_WITHIN(test_refcounts_free_blocks, 30);
    RUN_WITHIN(test_rejects_bad_arguments, 30);
    RUN_WITHIN(test_concurrent_sequences_share_a_pool, 240);
    eng_pool_free(pool);
    return check_report();
}
