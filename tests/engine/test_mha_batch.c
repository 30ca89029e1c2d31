/*
 * test_mha_batch.c - the specification of eng_mha_batch (engine.h): several passes of one layer
 * as one call, each computing what eng_mha computes for it alone.
 *
 * Every test builds passes twice over the same state: each pass's cache is forked before the
 * call, one fork for eng_mha alone and one for the batch, so both start from the same tokens.
 * Then, for every pass: the same status as alone (and the same error field); on success the
 * same output, attention weights and sequence length; on failure the sequence as it was.
 *
 * "The same output" is bit for bit when the batch's products and the pass's own take the
 * few-row path: the pass alone has at most FEW_ROWS = 16 rows, and so has every pass of its
 * precision in the batch, at most FEW_BATCH_ROWS = 64 rows in all (engine/layers/project.h).
 * Few-row products give a row bits that do not depend on the rows beside it
 * (engine/kernels/kernels.h), and positions, RoPE, norms, cache appends and the attention are
 * each pass's own. Other batches take the blocked product, whose sums run in another order
 * than the few-row sums the passes take alone: within 1e-6 x max|out| (float rounding of sums
 * of 64 terms is ~1e-7 relative; a row of another pass, a position off by one or a head of
 * the wrong pass moves outputs by tens of percent).
 *
 * The passes mix what a batch must keep apart: cache lengths, positions (none, RoPE, ALiBi,
 * sinusoid), sliding windows, grouped-query heads, fp32 and bf16 weights and bf16 requests, a
 * decoder layer with RoPE, q/k norms, a window and attention sinks, cross-attention, appended
 * keys and padding without a cache. Then passes that fail (their checks, a cancel, a deadline,
 * a full cache pool), each alone; what only a batch refuses (two layers, one sequence twice);
 * and one member, which is eng_mha.
 */
#include "engine/internal.h"
#include "tests/support/check.h"
#include "tests/support/util.h"

#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BLOCKED_RTOL 1e-6
#define MAX_PASSES   32

static eng_pool *pool;

/* ---- Layers ------------------------------------------------------------------------------- */

/* Separate q/k/v/o projections with biases (and bias_k/bias_v when asked), uniform in
 * +-1/sqrt(E) (biases +-0.5), the four matrices of `dtype` (F32 or BF16, kept in 16 bits as
 * a model file's are). */
static eng_layer *layer_plain(int64_t E, int64_t H, int64_t Hkv, eng_dtype dtype, bool bias_kv,
                              uint64_t seed)
{
    uint64_t rng = seed;
    int64_t W = Hkv * (E / H);
    eng_layer_weights w;
    memset(&w, 0, sizeof w);
    const struct {
        eng_weight *role;
        int64_t rows, cols; /* cols 0: a vector */
    } parts[] = {{&w.q_w, E, E},    {&w.k_w, W, E},   {&w.v_w, W, E}, {&w.o_w, E, E},
                 {&w.q_b, E, 0},    {&w.k_b, W, 0},   {&w.v_b, W, 0}, {&w.o_b, E, 0},
                 {&w.bias_k, W, 0}, {&w.bias_v, W, 0}};
    size_t n = bias_kv ? 10 : 8;
    void *data[10];
    for (size_t i = 0; i < n; i++) {
        bool matrix = parts[i].cols > 0, half = matrix && dtype == ENG_DTYPE_BF16;
        int64_t count = parts[i].rows * (matrix ? parts[i].cols : 1);
        data[i] = xcalloc((size_t)count, half ? sizeof(uint16_t) : sizeof(float));
        for (int64_t j = 0; j < count; j++) {
            float f = rng_sym(&rng, matrix ? 1.0 / sqrt((double)E) : 0.5);
            if (half)
                ((uint16_t *)data[i])[j] = eng_f32_to_bf16(f);
            else
                ((float *)data[i])[j] = f;
        }
        *parts[i].role = (eng_weight){NULL,
                                      half ? ENG_DTYPE_BF16 : ENG_DTYPE_F32,
                                      data[i],
                                      matrix ? 2 : 1,
                                      {parts[i].rows, parts[i].cols, 0, 0}};
    }
    eng_error err;
    memset(&err, 0, sizeof err);
    eng_layer *l = eng_layer_new("batch", &w, H, Hkv, true, &err);
    CHECKF(l != NULL, "eng_layer_new: %s: %s", err.field, err.message);
    CHECKF(!l || dtype == ENG_DTYPE_F32 || l->w16_q != NULL,
           "the bf16 layer is not kept in 16 bits");
    for (size_t i = 0; i < n; i++)
        free(data[i]);
    return l;
}

/* A decoder layer (E 32, 4 heads over 2 kv heads of 8): RoPE over each whole head, RMS q/k
 * norms, attention sinks and a sliding window of 6 tokens. */
static eng_layer *layer_decoder(uint64_t seed)
{
    enum { E = 32, H = 4, HKV = 2, D = 8, Q = H * D, W = HKV * D };
    uint64_t rng = seed;
    static float wq[Q * E], wk[W * E], wv[W * E], wo[E * Q], bq[Q], bk[W], bv[W], bo[E];
    static float qn[D], kn[D], sinks[H];
    struct {
        float *p;
        int n;
        double amp, offset;
    } fills[] = {{wq, Q * E, 0.4, 0}, {wk, W * E, 0.4, 0}, {wv, W * E, 0.4, 0}, {wo, E * Q, 0.4, 0},
                 {bq, Q, 0.3, 0},     {bk, W, 0.3, 0},     {bv, W, 0.3, 0},     {bo, E, 0.3, 0},
                 {qn, D, 0.3, 1.0},   {kn, D, 0.3, 1.0},   {sinks, H, 1.0, 0.5}};
    for (size_t f = 0; f < sizeof fills / sizeof fills[0]; f++)
        for (int i = 0; i < fills[f].n; i++)
            fills[f].p[i] = (float)(fills[f].offset + rng_sym(&rng, fills[f].amp));
    eng_layer_weights t = {
        .q_w = {NULL, ENG_DTYPE_F32, wq, 2, {Q, E}},
        .k_w = {NULL, ENG_DTYPE_F32, wk, 2, {W, E}},
        .v_w = {NULL, ENG_DTYPE_F32, wv, 2, {W, E}},
        .o_w = {NULL, ENG_DTYPE_F32, wo, 2, {E, Q}},
        .q_b = {NULL, ENG_DTYPE_F32, bq, 1, {Q}},
        .k_b = {NULL, ENG_DTYPE_F32, bk, 1, {W}},
        .v_b = {NULL, ENG_DTYPE_F32, bv, 1, {W}},
        .o_b = {NULL, ENG_DTYPE_F32, bo, 1, {E}},
        .q_norm_w = {NULL, ENG_DTYPE_F32, qn, 1, {D}},
        .k_norm_w = {NULL, ENG_DTYPE_F32, kn, 1, {D}},
        .sinks = {NULL, ENG_DTYPE_F32, sinks, 1, {H}},
    };
    eng_decoder_spec spec;
    memset(&spec, 0, sizeof spec);
    spec.rope.rotary_dim = D;
    spec.rope.style = ENG_ROPE_HALF;
    spec.rope.base = 10000.0;
    spec.qk_norm = ENG_QK_NORM_RMS;
    spec.qk_norm_eps = 1e-6;
    spec.window = 6;
    eng_error err;
    memset(&err, 0, sizeof err);
    eng_layer *l = eng_layer_decoder("dec", &t, H, HKV, &spec, &err);
    CHECKF(l != NULL, "eng_layer_decoder: %s: %s", err.field, err.message);
    return l;
}

/* ---- Passes ------------------------------------------------------------------------------- */

/* What a pass is made of; tests then set any other option on its args. */
typedef struct {
    int64_t B, L;   /* L query tokens in each of B batches */
    int64_t cached; /* tokens in its cache before the call; -1: no cache */
    int64_t S;      /* without a cache: a cross-attention memory of S tokens; 0: self */
    eng_positional positional;
    eng_precision precision;
    eng_dtype cache_dtype; /* F32 unless set */
    bool full;             /* its pool holds two blocks: its own and one of another sequence */
} pass_spec;

/* A pass in the batch, and its twin run alone: the same args but for the cache (a fork of the
 * same tokens), the output and the weights. */
typedef struct {
    pass_spec spec;
    const eng_layer *layer;
    eng_mha_args a;
    float *x, *mem, *out, *out_alone, *w, *w_alone;
    eng_kv_pool *kvp;
    eng_kv_seq *seq, *twin, *other;
    int64_t length; /* the sequence's length before the call */
    eng_ctl ctl;
    eng_error err, err_alone;
    eng_status alone;
} pass;

static float *random_floats(int64_t n, uint64_t *rng)
{
    float *x = xcalloc((size_t)n, sizeof(float));
    for (int64_t i = 0; i < n; i++)
        x[i] = rng_sym(rng, 1.0);
    return x;
}

/* The pass of `s` over layer l: random inputs, and over a cache, `cached` tokens run into it
 * by eng_mha before the twin forks off. */
static void pass_init(pass *p, const eng_layer *l, const pass_spec *s, uint64_t seed)
{
    uint64_t rng = seed;
    const int64_t E = l->embed_dim, D = eng_layer_head_dim(l);
    memset(p, 0, sizeof *p);
    p->spec = *s;
    p->layer = l;
    p->x = random_floats(s->B * s->L * E, &rng);
    p->out = xcalloc((size_t)(s->B * s->L * E), sizeof(float));
    p->out_alone = xcalloc((size_t)(s->B * s->L * E), sizeof(float));
    eng_mha_args *a = &p->a;
    a->layer = l;
    a->B = s->B;
    a->L = s->L;
    a->x = p->x;
    a->out = p->out;
    a->causal = s->S == 0;
    a->positional = s->positional;
    a->precision = s->precision;
    if (s->S > 0) {
        p->mem = random_floats(s->B * s->S * E, &rng);
        a->S = s->S;
        a->key_in = a->value_in = p->mem;
    }
    if (s->cached < 0)
        return;
    eng_error err;
    eng_kv_shape shape = {.num_kv_heads = l->num_kv_heads,
                          .head_dim = D,
                          .value_head_dim = D,
                          .dtype = s->cache_dtype};
    /* Blocks of 16 tokens: a full pool holds two, which a sequence alone could have. */
    size_t block = (size_t)(16 * l->num_kv_heads * 2 * D) * sizeof(float);
    p->kvp = eng_kv_pool_new(s->full ? 2 * block : (size_t)16 << 20, 16, &err);
    CHECKF(p->kvp != NULL, "eng_kv_pool_new: %s", err.message);
    p->seq = p->kvp ? eng_kv_seq_new(p->kvp, &shape, &err) : NULL;
    CHECKF(p->seq != NULL, "eng_kv_seq_new: %s", err.message);
    a->align = ENG_ALIGN_BOTTOM_RIGHT;
    a->kv_cache = p->seq;
    if (s->cached > 0 && p->seq) {
        float *prompt = random_floats(s->cached * E, &rng);
        float *out = xcalloc((size_t)(s->cached * E), sizeof(float));
        eng_mha_args pre = *a;
        pre.B = 1;
        pre.L = s->cached;
        pre.x = prompt;
        pre.out = out;
        eng_status st = eng_mha(pool, &pre, NULL, &err);
        CHECKF(st == ENG_OK, "prefill of %lld tokens: %s", (long long)s->cached, err.message);
        free(prompt), free(out);
    }
    if (s->full && p->seq) { /* another sequence takes the other block */
        p->other = eng_kv_seq_new(p->kvp, &shape, &err);
        float *row = random_floats(l->num_kv_heads * D, &rng);
        eng_kv_rows k = eng_kv_rows_f32(eng_view_contiguous(row, 1, l->num_kv_heads, 1, D));
        CHECKF(p->other && eng_kv_seq_append(p->other, &k, &k, &err) == ENG_OK,
               "the other sequence: %s", err.message);
        free(row);
    }
    p->twin = p->seq ? eng_kv_seq_fork(p->seq, &err) : NULL;
    CHECKF(p->twin != NULL, "eng_kv_seq_fork: %s", err.message);
    p->length = p->seq ? eng_kv_seq_length(p->seq) : 0;
}

/* Floats of the pass's attention weights: [B, H, L, S'] or, for the mean, [B, L, S']. */
static size_t weights_floats(const pass *p)
{
    int64_t keys = p->spec.cached >= 0 ? p->spec.cached + p->spec.L
                   : p->spec.S > 0     ? p->spec.S
                                       : p->spec.L;
    keys += eng_mha_extra_keys(&p->a);
    int64_t heads = p->a.weights_mode == ENG_WEIGHTS_PER_HEAD ? p->layer->num_heads : 1;
    return (size_t)(p->spec.B * p->spec.L * keys * heads);
}

/* Asks the pass (its other options set) for its attention weights. */
static void pass_want_weights(pass *p, eng_weights_mode mode)
{
    p->a.weights_mode = mode;
    p->w = xcalloc(weights_floats(p), sizeof(float));
    p->w_alone = xcalloc(weights_floats(p), sizeof(float));
    p->a.weights = p->w;
}

static void pass_free(pass *p)
{
    eng_kv_seq_free(p->seq);
    eng_kv_seq_free(p->twin);
    eng_kv_seq_free(p->other);
    eng_kv_pool_free(p->kvp);
    free(p->x), free(p->mem), free(p->out), free(p->out_alone), free(p->w), free(p->w_alone);
    memset(p, 0, sizeof *p);
}

/* The largest |got - want| relative to the largest |want| (at least 1e-3); NaN: infinity. */
static double rel_diff(const float *got, const float *want, size_t n)
{
    double worst = 0, scale = 1e-3;
    for (size_t i = 0; i < n; i++) {
        scale = fmax(scale, fabs((double)want[i]));
        double e = fabs((double)got[i] - (double)want[i]);
        worst = isnan(e) ? INFINITY : fmax(worst, e);
    }
    return worst / scale;
}

/* Each pass alone (eng_mha over its twin), then all of them as one batch; every pass must end
 * as it did alone. rtol 0: the same bits; else within rtol x max|out|. Returns the batch's
 * status. */
static eng_status run_and_compare(const char *what, pass *ps, int n, double rtol)
{
    eng_mha_member members[MAX_PASSES];
    for (int i = 0; i < n; i++) {
        pass *p = &ps[i];
        eng_mha_args alone = p->a;
        alone.out = p->out_alone;
        alone.kv_cache = p->twin;
        alone.weights = p->w_alone;
        memset(&p->err_alone, 0, sizeof p->err_alone);
        p->alone = eng_mha(pool, &alone, &p->ctl, &p->err_alone);
        memset(&p->err, 0, sizeof p->err);
        members[i] = (eng_mha_member){&p->a, &p->ctl, &p->err, (eng_status)-1};
    }
    eng_status st = eng_mha_batch(pool, members, n);
    eng_status first = ENG_OK;
    for (int i = 0; i < n; i++) {
        pass *p = &ps[i];
        if (first == ENG_OK)
            first = p->alone;
        CHECKF(members[i].status == p->alone, "%s: pass %d: %s in the batch, %s alone (%s: %s)",
               what, i, eng_status_str(members[i].status), eng_status_str(p->alone), p->err.field,
               p->err.message);
        if (p->seq && p->alone == ENG_OK)
            CHECKF(eng_kv_seq_length(p->seq) == p->length + p->spec.L &&
                       eng_kv_seq_length(p->twin) == p->length + p->spec.L,
                   "%s: pass %d: cache lengths %lld and %lld after a step of %lld over %lld", what,
                   i, (long long)eng_kv_seq_length(p->seq), (long long)eng_kv_seq_length(p->twin),
                   (long long)p->spec.L, (long long)p->length);
        if (p->alone != ENG_OK) {
            CHECKF(strcmp(p->err.field, p->err_alone.field) == 0,
                   "%s: pass %d: field '%s' in the batch, '%s' alone", what, i, p->err.field,
                   p->err_alone.field);
            if (p->seq)
                CHECKF(eng_kv_seq_length(p->seq) == p->length,
                       "%s: pass %d failed but its cache went from %lld to %lld tokens", what, i,
                       (long long)p->length, (long long)eng_kv_seq_length(p->seq));
            continue;
        }
        size_t count = (size_t)(p->spec.B * p->spec.L * p->layer->embed_dim);
        if (rtol == 0) {
            CHECKF(memcmp(p->out, p->out_alone, count * sizeof(float)) == 0,
                   "%s: pass %d: not the bits of the pass alone (kernels %s; worst %.3g)", what, i,
                   eng_kernels_name(), rel_diff(p->out, p->out_alone, count));
        } else {
            double e = rel_diff(p->out, p->out_alone, count);
            CHECKF(e <= rtol, "%s: pass %d: %.3g x max|out| from the pass alone (kernels %s)", what,
                   i, e, eng_kernels_name());
        }
        if (p->w) {
            size_t nw = weights_floats(p);
            double e = rel_diff(p->w, p->w_alone, nw);
            CHECKF(rtol == 0 ? memcmp(p->w, p->w_alone, nw * sizeof(float)) == 0 : e <= rtol,
                   "%s: pass %d: weights %.3g from the pass alone", what, i, e);
        }
    }
    CHECKF(st == first, "%s: the batch returned %s, its first failing pass %s", what,
           eng_status_str(st), eng_status_str(first));
    return st;
}

static void passes_free(pass *ps, int n)
{
    for (int i = 0; i < n; i++)
        pass_free(&ps[i]);
}

/* ---- What each pass computes -------------------------------------------------------------- */

/* Steps of one or a few tokens over caches of many lengths, each with its own positions and
 * window, over grouped-query heads; fp32 and bf16 weights, a bf16 request among fp32 ones (a
 * product of its own: its weights are read rounded), a bf16 cache, weights returned. 12 rows in
 * all: the few-row path, the bits of each pass alone. */
static void test_steps_over_mixed_caches_give_the_bits_of_steps_alone(void)
{
    const eng_dtype dtypes[] = {ENG_DTYPE_F32, ENG_DTYPE_BF16};
    for (int d = 0; d < 2; d++) {
        eng_layer *l = layer_plain(64, 4, 2, dtypes[d], false, 3);
        if (!l)
            return;
        const pass_spec specs[] = {
            {.B = 1, .L = 1, .cached = 5},
            {.B = 1, .L = 2, .cached = 17},
            {.B = 1, .L = 1, .cached = 33, .positional = ENG_POSITIONAL_ROPE},
            {.B = 1, .L = 3, .cached = 0, .positional = ENG_POSITIONAL_ALIBI},
            {.B = 1, .L = 1, .cached = 40, .positional = ENG_POSITIONAL_SINUSOIDAL},
            {.B = 1,
             .L = 2,
             .cached = 12,
             .precision = ENG_PRECISION_BFLOAT16,
             .cache_dtype = ENG_DTYPE_BF16},
            {.B = 1, .L = 1, .cached = 9, .positional = ENG_POSITIONAL_ROPE},
            {.B = 1, .L = 1, .cached = 3, .precision = ENG_PRECISION_BFLOAT16},
        };
        enum { N = sizeof specs / sizeof specs[0] };
        pass ps[N];
        for (int i = 0; i < N; i++)
            pass_init(&ps[i], l, &specs[i], (uint64_t)(100 + i));
        ps[1].a.window_left_set = true; /* a sliding window of 4 earlier keys */
        ps[1].a.window_left = 4;
        ps[6].a.rope_style = ENG_ROPE_INTERLEAVED;
        ps[6].a.rope_base = 500.0f;
        pass_want_weights(&ps[2], ENG_WEIGHTS_PER_HEAD);
        pass_want_weights(&ps[4], ENG_WEIGHTS_MEAN);
        run_and_compare(d ? "bf16 weights" : "fp32 weights", ps, N, 0);
        passes_free(ps, N);
        eng_layer_free(l);
    }
}

/* A decoder layer brings RoPE, q/k norms, a window and sinks: each pass's keys turned and
 * normalised at its own positions, its sinks' share from its own log-sum-exp. With a pass
 * without a cache among the steps. */
static void test_decoder_layer_steps_give_the_bits_of_steps_alone(void)
{
    eng_layer *l = layer_decoder(7);
    if (!l)
        return;
    const pass_spec specs[] = {
        {.B = 1, .L = 1, .cached = 3},  {.B = 1, .L = 1, .cached = 10},
        {.B = 1, .L = 2, .cached = 21}, {.B = 1, .L = 4, .cached = -1},
        {.B = 1, .L = 1, .cached = 0},
    };
    enum { N = sizeof specs / sizeof specs[0] };
    pass ps[N];
    for (int i = 0; i < N; i++)
        pass_init(&ps[i], l, &specs[i], (uint64_t)(200 + i));
    run_and_compare("decoder layer", ps, N, 0);
    passes_free(ps, N);
    eng_layer_free(l);
}

/* Without caches, what eng_mha takes goes in a batch too: batches of several sequences with
 * padding, cross-attention, bias_kv keys and a zero key, a sinusoid, weights. 12 query rows and
 * 13 key rows: the bits of each pass alone. */
static void test_passes_without_caches_give_the_bits_of_passes_alone(void)
{
    eng_layer *l = layer_plain(48, 4, 4, ENG_DTYPE_F32, true, 11);
    if (!l)
        return;
    const pass_spec specs[] = {
        {.B = 2, .L = 3, .cached = -1},
        {.B = 1, .L = 2, .cached = -1, .S = 5},
        {.B = 1, .L = 2, .cached = -1, .positional = ENG_POSITIONAL_SINUSOIDAL},
        {.B = 1, .L = 2, .cached = -1, .positional = ENG_POSITIONAL_ROPE},
    };
    enum { N = sizeof specs / sizeof specs[0] };
    pass ps[N];
    for (int i = 0; i < N; i++)
        pass_init(&ps[i], l, &specs[i], (uint64_t)(300 + i));
    static const uint8_t pad[2 * 3] = {0, 0, 1, 0, 0, 0}; /* the first sequence's last key */
    ps[0].a.key_padding = pad;
    ps[0].a.key_padding_stride = 3;
    ps[1].a.add_zero_attn = true;
    pass_want_weights(&ps[1], ENG_WEIGHTS_PER_HEAD);
    ps[2].a.causal = false;
    run_and_compare("without caches", ps, N, 0);
    passes_free(ps, N);
    eng_layer_free(l);
}

/* A pass of 40 rows among steps of 4: the blocked product over every pass's rows of its
 * precision (chunks that span passes), against each pass alone, on the few-row path but for
 * the long one: within float rounding. The bf16 requests, 8 rows, are a product of their own
 * on the few-row path: the bits of each alone. */
static void test_batches_of_many_rows_are_within_rounding_of_passes_alone(void)
{
    const eng_dtype dtypes[] = {ENG_DTYPE_F32, ENG_DTYPE_BF16};
    for (int d = 0; d < 2; d++) {
        eng_layer *l = layer_plain(64, 4, 2, dtypes[d], false, 13);
        if (!l)
            return;
        pass_spec specs[8];
        for (int i = 0; i < 6; i++)
            specs[i] = (pass_spec){.B = 1, .L = 4, .cached = 3 + 7 * i};
        specs[2].positional = ENG_POSITIONAL_ROPE;
        specs[3].precision = ENG_PRECISION_BFLOAT16;
        specs[4].precision = ENG_PRECISION_BFLOAT16;
        specs[6] = (pass_spec){.B = 2, .L = 5, .cached = -1};
        specs[7] = (pass_spec){.B = 1, .L = 40, .cached = 9};
        pass ps[8];
        for (int i = 0; i < 8; i++)
            pass_init(&ps[i], l, &specs[i], (uint64_t)(400 + i));
        ps[5].a.window_left_set = true;
        ps[5].a.window_left = 2;
        run_and_compare(d ? "many rows, bf16 weights" : "many rows, fp32 weights", ps, 8,
                        BLOCKED_RTOL);
        passes_free(ps, 8);
        eng_layer_free(l);
    }
}

/* Decode steps of more than FEW_ROWS rows in all, each of few rows: the few-row products over
 * all of them at once (up to FEW_BATCH_ROWS = 64 rows), so each step still gets the bits it
 * gets alone. 26 passes, 40 rows. */
static void test_many_steps_of_few_rows_give_the_bits_of_steps_alone(void)
{
    eng_layer *l = layer_plain(64, 4, 2, ENG_DTYPE_BF16, false, 29);
    if (!l)
        return;
    enum { N = 26 };
    pass ps[N];
    for (int i = 0; i < N; i++) {
        pass_spec s = {.B = 1, .L = 1 + (i % 3 == 0), .cached = 2 + 5 * i};
        s.positional = i % 4 == 1 ? ENG_POSITIONAL_ROPE : ENG_POSITIONAL_NONE;
        pass_init(&ps[i], l, &s, (uint64_t)(800 + i));
    }
    run_and_compare("40 rows of steps", ps, N, 0);
    passes_free(ps, N);
    eng_layer_free(l);
}

/* Past FEW_BATCH_ROWS rows the blocked product again: 20 steps of 4 tokens, 80 rows, within
 * rounding of the steps alone. */
static void test_many_steps_past_the_few_row_batch_are_within_rounding(void)
{
    eng_layer *l = layer_plain(64, 4, 2, ENG_DTYPE_F32, false, 31);
    if (!l)
        return;
    enum { N = 20 };
    pass ps[N];
    for (int i = 0; i < N; i++)
        pass_init(&ps[i], l, &(pass_spec){.B = 1, .L = 4, .cached = 1 + 3 * i},
                  (uint64_t)(900 + i));
    run_and_compare("80 rows of steps", ps, N, BLOCKED_RTOL);
    passes_free(ps, N);
    eng_layer_free(l);
}

/* ---- Passes that fail, each alone ---------------------------------------------------------- */

/* A pass refused by eng_mha's checks, one cancelled before the call, one past its deadline and
 * one whose cache pool is full: each fails with what eng_mha returns for it alone, its
 * sequence as it was; the passes between them compute their bits. The batch returns the first
 * failure. */
static void test_failing_passes_fail_alone(void)
{
    eng_layer *l = layer_plain(64, 4, 2, ENG_DTYPE_F32, false, 17);
    if (!l)
        return;
    const pass_spec specs[] = {
        {.B = 1, .L = 1, .cached = 7},
        {.B = 1, .L = 1, .cached = 4}, /* refused: add_zero_attn */
        {.B = 1, .L = 2, .cached = 20, .positional = ENG_POSITIONAL_ROPE},
        {.B = 1, .L = 1, .cached = 6},                /* cancelled */
        {.B = 1, .L = 1, .cached = 16, .full = true}, /* full */
        {.B = 1, .L = 1, .cached = 11},               /* past its deadline */
        {.B = 1, .L = 3, .cached = -1},
    };
    enum { N = sizeof specs / sizeof specs[0] };
    pass ps[N];
    for (int i = 0; i < N; i++)
        pass_init(&ps[i], l, &specs[i], (uint64_t)(500 + i));
    ps[1].a.add_zero_attn = true;
    atomic_store(&ps[3].ctl.cancel, true);
    ps[5].ctl.deadline_ns = 1;
    eng_status st = run_and_compare("failing passes", ps, N, 0);
    CHECK_EQ_INT(st, ENG_EINVAL);
    CHECK_EQ_INT(ps[1].alone, ENG_EINVAL);
    CHECKF(strcmp(ps[1].err.field, "add_zero_attn") == 0, "field '%s'", ps[1].err.field);
    CHECK_EQ_INT(ps[3].alone, ENG_ECANCELLED);
    CHECK_EQ_INT(ps[4].alone, ENG_ENOMEM);
    CHECKF(strcmp(ps[4].err.field, "kv_cache_bytes") == 0, "field '%s'", ps[4].err.field);
    CHECK_EQ_INT(ps[5].alone, ENG_EDEADLINE);
    for (int i = 0; i < N; i++)
        if (i != 1 && i != 3 && i != 4 && i != 5)
            CHECK_EQ_INT(ps[i].alone, ENG_OK);
    passes_free(ps, N);
    eng_layer_free(l);
}

/* What only a batch can get wrong: a pass of another layer, and two passes stepping one
 * sequence. Each is refused naming the field; the others run. */
static void test_another_layer_or_a_shared_sequence_is_refused(void)
{
    eng_layer *l = layer_plain(64, 4, 2, ENG_DTYPE_F32, false, 19);
    eng_layer *other = layer_plain(64, 4, 2, ENG_DTYPE_F32, false, 20);
    if (!l || !other)
        return;
    pass ps[3];
    pass_init(&ps[0], l, &(pass_spec){.B = 1, .L = 1, .cached = 5}, 600);
    pass_init(&ps[1], other, &(pass_spec){.B = 1, .L = 1, .cached = 5}, 601);
    pass_init(&ps[2], l, &(pass_spec){.B = 1, .L = 1, .cached = -1}, 602);
    eng_mha_args shared = ps[0].a;
    shared.x = ps[2].x;
    shared.out = ps[2].out_alone;
    eng_error errs[4];
    memset(errs, 0, sizeof errs);
    eng_mha_member m[4] = {{&ps[0].a, NULL, &errs[0], ENG_OK},
                           {&ps[1].a, NULL, &errs[1], ENG_OK},
                           {&ps[2].a, NULL, &errs[2], ENG_OK},
                           {&shared, NULL, &errs[3], ENG_OK}};
    CHECK_EQ_INT(eng_mha_batch(pool, m, 4), ENG_EINVAL);
    CHECK_EQ_INT(m[0].status, ENG_OK);
    CHECK_EQ_INT(m[1].status, ENG_EINVAL);
    CHECKF(strcmp(errs[1].field, "layer") == 0, "field '%s'", errs[1].field);
    CHECK_EQ_INT(m[2].status, ENG_OK);
    CHECK_EQ_INT(m[3].status, ENG_EINVAL);
    CHECKF(strcmp(errs[3].field, "kv_cache") == 0, "field '%s'", errs[3].field);
    CHECK_EQ_INT(eng_kv_seq_length(ps[0].seq), 6); /* the first one's step only */
    CHECK_EQ_INT(eng_kv_seq_length(ps[1].seq), 5);
    /* The batch's layer is the first valid member's: a first member without one is refused
     * alone, and the others run. */
    eng_mha_args none = ps[2].a;
    none.layer = NULL;
    eng_mha_member first_bad[2] = {{&none, NULL, &errs[0], ENG_OK},
                                   {&ps[2].a, NULL, &errs[2], ENG_OK}};
    CHECK_EQ_INT(eng_mha_batch(pool, first_bad, 2), ENG_EINVAL);
    CHECK_EQ_INT(first_bad[0].status, ENG_EINVAL);
    CHECKF(strcmp(errs[0].field, "layer") == 0, "field '%s'", errs[0].field);
    CHECK_EQ_INT(first_bad[1].status, ENG_OK);
    CHECK_EQ_INT(eng_mha_batch(pool, m, 0), ENG_OK);
    CHECK_EQ_INT(eng_mha_batch(pool, NULL, 2), ENG_EINVAL);
    passes_free(ps, 3);
    eng_layer_free(l);
    eng_layer_free(other);
}

/* ---- One member ----------------------------------------------------------------------------- */

/* A batch of one is eng_mha: the same bits on either path (one token, forty). */
static void test_one_member_is_eng_mha(void)
{
    eng_layer *l = layer_plain(64, 4, 2, ENG_DTYPE_BF16, false, 23);
    if (!l)
        return;
    const int64_t lengths[] = {1, 40};
    for (int i = 0; i < 2; i++) {
        pass p;
        pass_init(&p, l, &(pass_spec){.B = 1, .L = lengths[i], .cached = 8}, (uint64_t)(700 + i));
        run_and_compare(i ? "one member of 40 rows" : "one member of one row", &p, 1, 0);
        pass_free(&p);
    }
    eng_layer_free(l);
}

int main(void)
{
    int status;
    if (test_engine_start(&pool, &status))
        return status;
    RUN_WITHIN(test_steps_over_mixed_caches_give_the_bits_of_steps_alone, 60);
    RUN_WITHIN(test_decoder_layer_steps_give_the_bits_of_steps_alone, 60);
    RUN_WITHIN(test_passes_without_caches_give_the_bits_of_passes_alone, 60);
    RUN_WITHIN(test_batches_of_many_rows_are_within_rounding_of_passes_alone, 60);
    RUN_WITHIN(test_many_steps_of_few_rows_give_the_bits_of_steps_alone, 60);
    RUN_WITHIN(test_many_steps_past_the_few_row_batch_are_within_rounding, 60);
    RUN_WITHIN(test_failing_passes_fail_alone, 60);
    RUN_WITHIN(test_another_layer_or_a_shared_sequence_is_refused, 60);
    RUN_WITHIN(test_one_member_is_eng_mha, 60);
    eng_pool_free(pool);
    return check_report();
}
