/*
 * sdpa_bits.c - the SDPA case matrix with one hash of the output bits per case, so that two
 * builds of the engine can be compared bit for bit (tests/engine/check_sdpa_bits.sh).
 *
 * Every path (streaming decode, register-tile panels, cblas), precision (fp32, bf16), source
 * (fp32 views, bf16 views, interleaved views, the paged cache in f32, bf16 and f16) and option
 * (masks, windows, padding, lengths, ALiBi, softcap, additive scoring, weights, lse, key split)
 * meets each shape once. Prints one line per case: its name, the status and an FNV-1a hash of
 * the output, weights and lse bits. The kernel set and the bf16 path are ATTND_KERNELS and
 * ATTND_BF16 (tests/support/engine_env.h).
 *
 *     sdpa_bits [THREADS]          (default 3: enough for the key split and the pool's order)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "tests/support/engine_env.h"
#include "tests/support/rng.h"

typedef struct {
    const char *name;
    int64_t b, h, hkv, l, s, d, dv;
} shape;

/* Decode steps stream; a few rows group heads; the rest take panels, split keys or whole heads. */
static const shape shapes[] = {
    {"decode", 1, 4, 4, 1, 300, 64, 64},      {"decode_gqa", 2, 8, 2, 1, 700, 64, 64},
    {"decode_rows", 1, 4, 2, 3, 129, 32, 48}, {"prefill", 1, 3, 3, 70, 300, 64, 64},
    {"square", 2, 4, 2, 97, 97, 40, 24},      {"heads", 1, 16, 8, 256, 256, 64, 64},
    {"cross", 1, 2, 1, 40, 1100, 16, 16},     {"odd", 1, 2, 2, 13, 35, 7, 5},
};
#define NSHAPES ((int)(sizeof shapes / sizeof shapes[0]))

enum {
    OPT_PLAIN,
    OPT_CAUSAL,
    OPT_WINDOW,
    OPT_MASK_BOOL,
    OPT_MASK_FLOAT,
    OPT_PADDING,
    OPT_LENGTHS,
    OPT_ALIBI_SOFTCAP,
    OPT_WEIGHTS_HEAD,
    OPT_WEIGHTS_MEAN,
    OPT_TAIL,
    OPT_ADDITIVE,
    OPT_COUNT
};
static const char *const option_names[OPT_COUNT] = {
    "plain",   "causal",        "window",       "mask_bool",    "mask_float", "padding",
    "lengths", "alibi_softcap", "weights_head", "weights_mean", "open_tail",  "additive"};

typedef enum {
    SRC_VIEW,
    SRC_VIEW16,
    SRC_INTERLEAVED,
    SRC_PAGED_F32,
    SRC_PAGED_BF16,
    SRC_PAGED_F16,
    SRC_COUNT
} source;
static const char *const source_names[SRC_COUNT] = {"view",      "view16",     "interleaved",
                                                    "paged_f32", "paged_bf16", "paged_f16"};

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ c[i]) * 1099511628211u;
    return h;
}

static float *randoms(uint64_t *rng, size_t n, double amp)
{
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = rng_sym(rng, amp);
    return x;
}

static uint16_t *bf16_of(const float *x, size_t n)
{
    uint16_t *y = malloc(n * sizeof *y);
    for (size_t i = 0; i < n; i++)
        y[i] = eng_f32_to_bf16(x[i]);
    return y;
}

/* Rounds x to bf16 values in place, so that the 16-bit sources hold the same values. */
static void round_bf16(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = eng_bf16_to_f32(eng_f32_to_bf16(x[i]));
}

typedef struct {
    const shape *sh;
    float *q, *k, *v;
    uint16_t *q16, *k16, *v16;
    uint8_t *mask_bool, *padding;
    float *mask_float, *slopes, *wq, *wk, *wv;
    int64_t lengths[4];
} inputs;

static void inputs_make(inputs *in, const shape *sh, uint64_t seed)
{
    uint64_t rng = seed;
    size_t nq = (size_t)(sh->b * sh->h * sh->l * sh->d);
    size_t nk = (size_t)(sh->b * sh->hkv * sh->s * sh->d);
    size_t nv = (size_t)(sh->b * sh->hkv * sh->s * sh->dv);
    size_t nm = (size_t)(sh->b * sh->h * sh->l * sh->s);
    memset(in, 0, sizeof *in);
    in->sh = sh;
    in->q = randoms(&rng, nq, 1.5);
    in->k = randoms(&rng, nk, 1.5);
    in->v = randoms(&rng, nv, 1.0);
    round_bf16(in->q, nq);
    round_bf16(in->k, nk);
    round_bf16(in->v, nv);
    in->q16 = bf16_of(in->q, nq);
    in->k16 = bf16_of(in->k, nk);
    in->v16 = bf16_of(in->v, nv);
    in->mask_bool = malloc(nm);
    in->mask_float = malloc(nm * sizeof(float));
    for (size_t i = 0; i < nm; i++) {
        in->mask_bool[i] = rng_below(&rng, 5) != 0;
        in->mask_float[i] = rng_below(&rng, 6) == 0 ? -INFINITY : rng_sym(&rng, 2.0);
    }
    in->padding = malloc((size_t)(sh->b * sh->s));
    for (int64_t i = 0; i < sh->b * sh->s; i++)
        in->padding[i] = rng_below(&rng, 4) == 0;
    for (int64_t b = 0; b < sh->b; b++)
        in->lengths[b] = sh->s - (b + 1) * sh->s / 5;
    in->slopes = randoms(&rng, (size_t)sh->h, 0.5);
    in->wq = randoms(&rng, (size_t)(8 * sh->d), 0.3);
    in->wk = randoms(&rng, (size_t)(8 * sh->d), 0.3);
    in->wv = randoms(&rng, 8, 1.0);
}

static void inputs_free(inputs *in)
{
    free(in->q), free(in->k), free(in->v), free(in->q16), free(in->k16), free(in->v16);
    free(in->mask_bool), free(in->mask_float), free(in->padding), free(in->slopes);
    free(in->wq), free(in->wk), free(in->wv);
}

static void set_option(eng_sdpa_args *a, const inputs *in, int opt)
{
    const shape *sh = in->sh;
    switch (opt) {
    case OPT_CAUSAL:
        a->causal = true;
        a->align = ENG_ALIGN_BOTTOM_RIGHT;
        break;
    case OPT_WINDOW:
        a->causal = true;
        a->align = ENG_ALIGN_OFFSET;
        a->query_offset = sh->s / 3;
        a->window_left_set = true;
        a->window_left = sh->s / 4 + 3;
        break;
    case OPT_MASK_BOOL:
        a->attn_mask = (eng_mask){ENG_MASK_BOOL,
                                  in->mask_bool,
                                  {sh->b, sh->h, sh->l, sh->s},
                                  {sh->h * sh->l * sh->s, sh->l * sh->s, sh->s, 1}};
        break;
    case OPT_MASK_FLOAT:
        a->attn_mask = (eng_mask){
            ENG_MASK_FLOAT, in->mask_float, {1, sh->h, sh->l, sh->s}, {0, sh->l * sh->s, sh->s, 1}};
        a->window_right_set = true;
        a->window_right = 5;
        a->align = ENG_ALIGN_BOTTOM_RIGHT;
        break;
    case OPT_PADDING:
        a->key_padding = in->padding;
        a->key_padding_stride = sh->s;
        a->scale_set = true;
        a->scale = 0.3f;
        break;
    case OPT_LENGTHS:
        a->kv_lengths = in->lengths;
        a->causal = true;
        break;
    case OPT_ALIBI_SOFTCAP:
        a->alibi = true;
        a->alibi_slopes = sh->h % 2 ? NULL : in->slopes;
        a->softcap = 3.0f;
        break;
    case OPT_WEIGHTS_HEAD:
    case OPT_WEIGHTS_MEAN:
        a->weights_mode = opt == OPT_WEIGHTS_HEAD ? ENG_WEIGHTS_PER_HEAD : ENG_WEIGHTS_MEAN;
        a->causal = opt == OPT_WEIGHTS_MEAN;
        break;
    case OPT_TAIL:
        a->open_tail_keys = 2;
        a->causal = true;
        a->key_padding = in->padding;
        a->key_padding_stride = 0;
        break;
    case OPT_ADDITIVE:
        a->additive_w_q = in->wq;
        a->additive_w_k = in->wk;
        a->additive_v = in->wv;
        a->additive_dim = 8;
        break;
    default:
        break;
    }
}

/* Runs one case over the paged cache: batch by batch (the cache holds one sequence). */
static eng_status run_paged(eng_pool *pool, const inputs *in, eng_sdpa_args *a, eng_dtype dtype,
                            int64_t block_tokens, float *weights_all, eng_error *err)
{
    const shape *sh = in->sh;
    eng_kv_pool *kvp = eng_kv_pool_new((size_t)256 << 20, block_tokens, err);
    if (!kvp)
        return err->status;
    eng_status st = ENG_OK;
    for (int64_t b = 0; b < sh->b && st == ENG_OK; b++) {
        eng_kv_shape ks = {sh->hkv, sh->d, sh->dv, dtype, 0};
        eng_kv_seq *seq = eng_kv_seq_new(kvp, &ks, err);
        if (!seq) {
            st = err->status;
            break;
        }
        eng_kv_rows k = {ENG_DTYPE_F32,
                         in->k + b * sh->hkv * sh->s * sh->d,
                         {1, sh->hkv, sh->s, sh->d},
                         {0, sh->s * sh->d, sh->d, 1}};
        eng_kv_rows v = {ENG_DTYPE_F32,
                         in->v + b * sh->hkv * sh->s * sh->dv,
                         {1, sh->hkv, sh->s, sh->dv},
                         {0, sh->s * sh->dv, sh->dv, 1}};
        st = eng_kv_seq_append(seq, &k, &v, err);
        if (st == ENG_OK) {
            eng_sdpa_args one = *a;
            one.q.data = a->q.data + b * a->q.stride[0];
            one.q.ne[0] = 1;
            one.out.data = a->out.data + b * a->out.stride[0];
            one.out.ne[0] = 1;
            memset(&one.k, 0, sizeof one.k);
            memset(&one.v, 0, sizeof one.v);
            if (a->key_padding)
                one.key_padding = a->key_padding + b * a->key_padding_stride;
            if (a->kv_lengths)
                one.kv_lengths = a->kv_lengths + b;
            if (a->attn_mask.kind != ENG_MASK_NONE && a->attn_mask.ne[0] > 1) {
                size_t esz = a->attn_mask.kind == ENG_MASK_BOOL ? 1 : sizeof(float);
                one.attn_mask.data =
                    (const char *)a->attn_mask.data + (size_t)(b * a->attn_mask.stride[0]) * esz;
                one.attn_mask.ne[0] = 1;
            }
            if (a->lse)
                one.lse = a->lse + b * sh->h * sh->l;
            if (a->weights)
                one.weights = weights_all +
                              b * (a->weights_mode == ENG_WEIGHTS_MEAN ? 1 : sh->h) * sh->l * sh->s;
            st = eng_kv_attend(pool, seq, &one, NULL, err);
        }
        eng_kv_seq_free(seq);
    }
    eng_kv_pool_free(kvp);
    return st;
}

static void run_case(eng_pool *pool, const inputs *in, int opt, bool bf16, source src)
{
    const shape *sh = in->sh;
    if (opt == OPT_ADDITIVE && (bf16 || src != SRC_VIEW))
        return;
    size_t no = (size_t)(sh->b * sh->h * sh->l * sh->dv);
    size_t nw = (size_t)(sh->b * sh->h * sh->l * sh->s);
    float *out = malloc(no * sizeof(float)), *lse = malloc((size_t)(sh->b * sh->h * sh->l) * 4);
    float *weights =
        opt == OPT_WEIGHTS_HEAD || opt == OPT_WEIGHTS_MEAN ? malloc(nw * sizeof(float)) : NULL;
    float *kt = NULL, *vt = NULL;
    eng_sdpa_args a = {0};
    a.q = eng_view_contiguous(in->q, sh->b, sh->h, sh->l, sh->d);
    a.k = eng_view_contiguous(in->k, sh->b, sh->hkv, sh->s, sh->d);
    a.v = eng_view_contiguous(in->v, sh->b, sh->hkv, sh->s, sh->dv);
    a.out = eng_view_contiguous(out, sh->b, sh->h, sh->l, sh->dv);
    a.precision = bf16 ? ENG_PRECISION_BFLOAT16 : ENG_PRECISION_FLOAT32;
    a.lse = lse;
    a.weights = weights;
    set_option(&a, in, opt);
    if (src == SRC_VIEW16) {
        a.q_dtype = ENG_DTYPE_BF16;
        a.kv_dtype = ENG_DTYPE_BF16;
        a.q16 = in->q16;
        a.k16 = in->k16;
        a.v16 = in->v16;
    }
    if (src == SRC_INTERLEAVED) {
        /* K and V as [B, S, Hkv, D]: heads interleave key by key. */
        kt = malloc((size_t)(sh->b * sh->hkv * sh->s * sh->d) * sizeof(float));
        vt = malloc((size_t)(sh->b * sh->hkv * sh->s * sh->dv) * sizeof(float));
        for (int64_t b = 0; b < sh->b; b++)
            for (int64_t h = 0; h < sh->hkv; h++)
                for (int64_t j = 0; j < sh->s; j++) {
                    memcpy(kt + ((b * sh->s + j) * sh->hkv + h) * sh->d,
                           in->k + ((b * sh->hkv + h) * sh->s + j) * sh->d,
                           (size_t)sh->d * sizeof(float));
                    memcpy(vt + ((b * sh->s + j) * sh->hkv + h) * sh->dv,
                           in->v + ((b * sh->hkv + h) * sh->s + j) * sh->dv,
                           (size_t)sh->dv * sizeof(float));
                }
        a.k = (eng_view){kt,
                         {sh->b, sh->hkv, sh->s, sh->d},
                         {sh->s * sh->hkv * sh->d, sh->d, sh->hkv * sh->d, 1}};
        a.v = (eng_view){vt,
                         {sh->b, sh->hkv, sh->s, sh->dv},
                         {sh->s * sh->hkv * sh->dv, sh->dv, sh->hkv * sh->dv, 1}};
    }
    memset(out, 0xff, no * sizeof(float));
    eng_error err = {0};
    eng_status st;
    if (src >= SRC_PAGED_F32) {
        eng_dtype dt = src == SRC_PAGED_F32    ? ENG_DTYPE_F32
                       : src == SRC_PAGED_BF16 ? ENG_DTYPE_BF16
                                               : ENG_DTYPE_F16;
        st = run_paged(pool, in, &a, dt, sh->s % 2 ? 32 : 40, weights, &err);
    } else {
        st = eng_sdpa(pool, &a, NULL, &err);
    }
    uint64_t h = 1469598103934665603u;
    if (st == ENG_OK) {
        h = fnv(h, out, no * sizeof(float));
        h = fnv(h, lse, (size_t)(sh->b * sh->h * sh->l) * sizeof(float));
        if (weights)
            h = fnv(h, weights,
                    (opt == OPT_WEIGHTS_MEAN ? nw / (size_t)sh->h : nw) * sizeof(float));
    }
    printf("%s/%s/%s/%s %d %016llx%s%s\n", sh->name, option_names[opt], bf16 ? "bf16" : "fp32",
           source_names[src], (int)st, (unsigned long long)h, st == ENG_OK ? "" : " ",
           st == ENG_OK ? "" : err.field);
    free(out), free(lse), free(weights), free(kt), free(vt);
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? (int)strtol(argv[1], NULL, 10) : 3;
    char why[320];
    test_engine_state engine = test_engine_init(why, sizeof why);
    if (engine != TEST_ENGINE_READY) {
        /* check_sdpa_bits.sh reads a first line without this set's name as a skip. */
        printf("# kernels none: %s\n", why);
        return engine == TEST_ENGINE_UNSUPPORTED ? 0 : 1;
    }
    eng_error err = {0};
    eng_pool *pool = eng_pool_new(threads, &err);
    if (!pool) {
        fprintf(stderr, "pool: %s\n", err.message);
        return 1;
    }
    printf("# kernels %s threads %d\n", eng_kernels_name(), threads);
    for (int s = 0; s < NSHAPES; s++) {
        inputs in;
        inputs_make(&in, &shapes[s], 1000 + (uint64_t)s);
        for (int opt = 0; opt < OPT_COUNT; opt++)
            for (int bf = 0; bf < 2; bf++)
                for (int src = 0; src < SRC_COUNT; src++)
                    run_case(pool, &in, opt, bf == 1, (source)src);
        inputs_free(&in);
    }
    eng_pool_free(pool);
    return 0;
}
