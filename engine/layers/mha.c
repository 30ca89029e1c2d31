/*
 * mha.c - the forward pass of a multi-head attention layer, as torch's nn.MultiheadAttention.
 *
 *   q = x Wq^T + bq          [B, H, L, D]     one GEMM per row chunk, chunks over the pool
 *   k = m Wk^T + bk, v = m Wv^T + bv          [B, Hkv, S', D] each
 *   (RoPE turns q and k per head; bias_kv and a zero key/value are appended as rows S..S'-1)
 *   o = sdpa(q, k, v)        [B, L, E]: heads are views of those buffers
 *   out = o Wo^T + bo
 *
 * The input projections leave every head's rows one after another (head-major): a chunk's
 * product is staged in the task's scratch, then each head's columns are copied out, while
 * the chunk is still in L2. Heads as strided views of [B, L, E] rows instead put a head's
 * consecutive rows E or 2W floats apart, 2 or 4 KiB at E = 512, which fall into the same few
 * L1 sets: the attention would pack V instead of reading it in place, and pack K from rows
 * that evict each other.
 *
 * A decoder layer (eng_layer_decoder, engine/layers/decoder.c) has q H D wide (D its own head
 * size), normalises and turns the q and k rows of each projection task while they are staged,
 * brings its scale, softcap and window to the attention, and its sinks rescale each head's output
 * rows from the attention's log-sum-exp before the output projection.
 *
 * m is x for self-attention or the key/value inputs for cross-attention. Sinusoidal encodings
 * are added to copies of the inputs before the projections. The projections (project.c) run on
 * the kernel set's GEMM (kernels.h), the same one as the attention's block products, except
 * products of few rows (FEW_ROWS, a decode step): those read each weight once where it lies,
 * 16-bit ones widened in registers (eng__gemv), instead of packing it for rows that would use
 * it once.
 *
 * A call runs passes (mha_pass): eng_mha_batch several of one layer, eng_mha one, through the
 * same stages. Each projection is one product over the rows of every pass (each batch of each
 * pass a part of the job, with its own positions and its own buffers), so that a batch of
 * decode steps reads the weights once for all of them (up to FEW_BATCH_ROWS rows in all,
 * project.h); the attentions are the tasks of one pool job, a pass
 * each, whose own heads fan out in turn. A pass fails alone: it is checked before any work,
 * its control block between the stages, and once it fails it takes no part in the stages
 * after, its appended tokens truncated away.
 *
 * A step over a KV cache (eng_mha_args.kv_cache) projects only the new tokens, at the
 * positions after the cache's length, and instead of the sdpa call appends their K and V rows
 * (each head's L rows of the K and V buffers) to the sequence and attends over all of it with
 * eng_kv_step, which reads the cache's blocks in place. The step fails before projecting for
 * anything the cache or its attention would refuse, and a failure after the append (the
 * output projection cancelled, say) truncates the sequence back, so that no failed step ever
 * leaves a token behind.
 */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/layers/project.h"

/* ---- Shapes and checks -------------------------------------------------------------------- */

typedef struct {
    int64_t B, L, S, Sx, E, H, Hkv, D, W, extra; /* S: keys attended; Sx: with the appended */
    int64_t Q;       /* the width of q and of the attention's output: H D */
    int64_t S_in;    /* key/value input tokens projected: S, or L over a cache */
    int64_t kv_rows; /* rows per head of the K and V buffers: S_in plus the appended keys */
    bool self;
    eng_kv_seq *cache;      /* a step over this sequence, or NULL */
    int64_t cached;         /* its length before the step */
    int64_t q_offset;       /* query positions start here (sinusoidal, RoPE) */
    int64_t k_offset;       /* key input positions start here: 0, or `cached` */
    bool sinusoid, bf16;    /* inputs are copied: encoding added, or rounded to bf16 */
    const eng__kernels *ks; /* read once per call */
    size_t q_floats, kv_floats, o_floats, copy_floats;
    size_t x_floats;   /* the input [B, L, E] */
    size_t lse_floats; /* [B, H, L] for a layer's sinks, else 0 */
} mha_shape;

/* The tokens the input projections read: the query input, and the key and value inputs (the
 * query input again for self-attention). */
typedef struct {
    const float *q, *k, *v;
} mha_inputs;

eng_precision eng_mha_precision(const eng_mha_args *a)
{
    if (a->precision == ENG_PRECISION_BFLOAT16 && eng__kernels_current()->tile)
        return ENG_PRECISION_BFLOAT16;
    return ENG_PRECISION_FLOAT32;
}

int64_t eng_mha_extra_keys(const eng_mha_args *a)
{
    return (a->layer && a->layer->bias_k ? 1 : 0) + (a->add_zero_attn ? 1 : 0);
}

static bool mul3(int64_t a, int64_t b, int64_t c, size_t *out)
{
    int64_t r;
    if (__builtin_mul_overflow(a, b, &r) || __builtin_mul_overflow(r, c, &r) ||
        (uint64_t)r > SIZE_MAX / sizeof(float) / 4)
        return false;
    *out = (size_t)r;
    return true;
}

/* The step over a->kv_cache: what it refuses, and its shape (set after the rest of check_mha
 * filled `sh` as for self-attention): S counts the cached keys too, the K and V buffers hold the
 * new tokens only, and queries and keys sit after the cached ones. */
static eng_status check_cache(const eng_mha_args *a, mha_shape *sh, eng_error *err)
{
    const eng_layer *ly = a->layer;
    const eng_kv_shape cs = eng_kv_seq_shape(a->kv_cache);
    if (!sh->self)
        return eng__fail(err, ENG_EINVAL, "memory",
                         "a step over a KV cache is self-attention: its keys and values are "
                         "the new tokens of x");
    if (sh->B != 1)
        return eng__fail(err, ENG_EINVAL, "input",
                         "a step over a KV cache takes one sequence: batch %lld must be 1",
                         (long long)sh->B);
    if (a->align != ENG_ALIGN_BOTTOM_RIGHT)
        return eng__fail(err, ENG_EINVAL, "align",
                         "the queries of a step over a KV cache are its last positions: align "
                         "must be ENG_ALIGN_BOTTOM_RIGHT");
    if (ly->bias_k)
        return eng__fail(err, ENG_EINVAL, "layer",
                         "layer '%s' appends bias_k/bias_v keys (add_bias_kv), which a KV "
                         "cache step cannot: they would sit inside the cached sequence",
                         ly->name);
    if (a->add_zero_attn)
        return eng__fail(err, ENG_EINVAL, "add_zero_attn",
                         "add_zero_attn appends a key to the inputs, which a KV cache step "
                         "cannot");
    if (a->key_padding || a->attn_mask.kind != ENG_MASK_NONE)
        return eng__fail(err, ENG_EINVAL, a->key_padding ? "key_padding" : "attn_mask",
                         "a step over a KV cache takes no %s: its keys are the cache's",
                         a->key_padding ? "key_padding" : "attn_mask");
    const struct {
        const char *name;
        int64_t cache, layer;
    } dims[] = {{"num_kv_heads", cs.num_kv_heads, sh->Hkv},
                {"head_dim", cs.head_dim, sh->D},
                {"value_head_dim", cs.value_head_dim, sh->D}};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (dims[i].cache != dims[i].layer)
            return eng__fail(err, ENG_EINVAL, "kv_cache",
                             "the KV cache has %s %lld but layer '%s' has %lld", dims[i].name,
                             (long long)dims[i].cache, ly->name, (long long)dims[i].layer);
    int64_t cached = eng_kv_seq_length(a->kv_cache);
    if (cs.max_tokens > 0 && sh->L > cs.max_tokens - cached)
        return eng__fail_cause(err, ENG_CAUSE_MAX_TOKENS, ENG_ETOOBIG, "max_tokens",
                               "appending %lld tokens to %lld would pass max_tokens = %lld",
                               (long long)sh->L, (long long)cached, (long long)cs.max_tokens);
    if (cached > INT_MAX - 2 - sh->L)
        return eng__fail(err, ENG_ETOOBIG, "kv_cache",
                         "the KV cache would hold %lld + %lld tokens, past 2^31", (long long)cached,
                         (long long)sh->L);
    sh->cache = a->kv_cache;
    sh->cached = cached;
    sh->S = sh->Sx = cached + sh->L;
    sh->S_in = sh->kv_rows = sh->L;
    sh->q_offset = sh->k_offset = cached;
    return ENG_OK;
}

/* A LongRoPE or dynamic-NTK layer turns positions below its max_positions only: past them
 * transformers would turn every position by other frequencies. */
static eng_status check_positions(const eng_layer *ly, const mha_shape *sh, eng_error *err)
{
    if (!ly->decoder || ly->spec.rope.max_positions <= 0)
        return ENG_OK;
    int64_t limit = ly->spec.rope.max_positions;
    int64_t end = sh->q_offset + sh->L > sh->k_offset + sh->S_in ? sh->q_offset + sh->L
                                                                 : sh->k_offset + sh->S_in;
    if (end > limit)
        return eng__fail(err, ENG_EINVAL, "input",
                         "layer '%s' serves positions below %lld, not up to %lld: past them "
                         "transformers rescales the RoPE of every position",
                         ly->name, (long long)limit, (long long)end);
    return ENG_OK;
}

static eng_status check_mha(const eng_mha_args *a, mha_shape *sh, eng_error *err)
{
    const eng_layer *ly = a->layer;
    eng_status st;
    if (!ly)
        return eng__fail(err, ENG_EINVAL, "layer", "no layer");
    if (!a->x || !a->out)
        return eng__fail(err, ENG_EINVAL, a->x ? "out" : "input", "no input or output buffer");
    if (a->B <= 0 || a->L <= 0 || a->B > INT_MAX || a->L > INT_MAX)
        return eng__fail(err, ENG_EINVAL, "input",
                         "batch %lld and length %lld must be in [1, 2^31)", (long long)a->B,
                         (long long)a->L);
    if (!a->key_in != !a->value_in)
        return eng__fail(err, ENG_EINVAL, "memory", "key and value inputs come together");
    memset(sh, 0, sizeof *sh);
    sh->self = a->key_in == NULL;
    sh->B = a->B;
    sh->L = a->L;
    sh->S = sh->self ? a->L : a->S;
    sh->E = ly->embed_dim;
    sh->H = ly->num_heads;
    sh->Hkv = ly->num_kv_heads;
    sh->D = eng_layer_head_dim(ly);
    sh->Q = sh->H * sh->D;
    sh->W = sh->Hkv * sh->D;
    sh->extra = eng_mha_extra_keys(a);
    if (sh->S <= 0 || sh->S > INT_MAX - 2)
        return eng__fail(err, ENG_EINVAL, "memory", "memory length %lld must be in [1, 2^31)",
                         (long long)sh->S);
    sh->Sx = sh->S + sh->extra;
    sh->S_in = sh->S;
    sh->kv_rows = sh->Sx;
    if (sh->self && (ly->kdim != sh->E || ly->vdim != sh->E))
        return eng__fail(err, ENG_EINVAL, "memory",
                         "layer '%s' has kdim %lld and vdim %lld: it needs a memory input",
                         ly->name, (long long)ly->kdim, (long long)ly->vdim);
    if (a->positional < ENG_POSITIONAL_NONE || a->positional > ENG_POSITIONAL_ALIBI)
        return eng__fail(err, ENG_EINVAL, "positional", "unknown positional encoding");
    if (ly->decoder && a->positional != ENG_POSITIONAL_NONE)
        return eng__fail(err, ENG_EINVAL, "positional",
                         "decoder layer '%s' has its own positions: positional must be none",
                         ly->name);
    if (ly->sinks && a->weights_mode != ENG_WEIGHTS_NONE)
        return eng__fail(err, ENG_EINVAL, "weights_mode",
                         "layer '%s' has attention sinks: it returns no weights", ly->name);
    if (a->positional == ENG_POSITIONAL_ROPE) {
        if (sh->D % 2 != 0)
            return eng__fail(err, ENG_EINVAL, "positional",
                             "rope needs an even head size, not %lld", (long long)sh->D);
        if (a->rope_base < 0.0f || !isfinite(a->rope_base))
            return eng__fail(err, ENG_EINVAL, "rope_base", "rope_base must be finite and > 0");
        if (a->rope_style != ENG_ROPE_HALF && a->rope_style != ENG_ROPE_INTERLEAVED)
            return eng__fail(err, ENG_EINVAL, "rope_style", "unknown rope style");
    }
    sh->q_offset = a->align == ENG_ALIGN_BOTTOM_RIGHT ? sh->S - sh->L
                   : a->align == ENG_ALIGN_OFFSET     ? a->query_offset
                                                      : 0;
    if (a->kv_cache && (st = check_cache(a, sh, err)) != ENG_OK)
        return st;
    if ((st = check_positions(ly, sh, err)) != ENG_OK)
        return st;
    size_t in_k, in_v;
    if (!mul3(sh->B, sh->L, sh->Q, &sh->q_floats) || !mul3(sh->B, sh->L, sh->E, &sh->x_floats) ||
        !mul3(sh->B, sh->kv_rows, 2 * sh->W, &sh->kv_floats) ||
        !mul3(sh->B, sh->S_in, ly->kdim, &in_k) || !mul3(sh->B, sh->S_in, ly->vdim, &in_v))
        return eng__fail(err, ENG_ETOOBIG, "input", "the layer's buffers would exceed memory");
    sh->o_floats = sh->q_floats;
    sh->lse_floats = ly->sinks ? (size_t)(sh->B * sh->H * sh->L) : 0;
    sh->sinusoid = a->positional == ENG_POSITIONAL_SINUSOIDAL;
    sh->ks = eng__kernels_current();
    sh->bf16 = a->precision == ENG_PRECISION_BFLOAT16 && sh->ks->tile;
    if (sh->sinusoid || sh->bf16) {
        /* Copies with the encoding added (or rounded to bf16): the queries, and keys/values
         * unless they are the queries' tokens at the same positions. */
        sh->copy_floats = sh->x_floats;
        if (!sh->self || (sh->sinusoid && sh->q_offset != sh->k_offset)) {
            bool shared = sh->self || a->key_in == a->value_in;
            sh->copy_floats += in_k + (shared ? 0 : in_v);
        }
    }
    return ENG_OK;
}

/* The V buffer, after the K buffer in one allocation: K of head g of batch b from
 * kv + (b Hkv + g) kv_rows D, V the same from here. */
static float *value_rows(const mha_shape *sh, float *kv)
{
    return kv + sh->B * sh->Hkv * sh->kv_rows * sh->D;
}

/* The SDPA call over the projected buffers (data pointers may be placeholders for checks). */
static eng_sdpa_args sdpa_args(const eng_mha_args *a, const mha_shape *sh, float *q, float *kv,
                               float *o)
{
    eng_sdpa_args s;
    memset(&s, 0, sizeof s);
    int64_t Q = sh->Q, D = sh->D;
    s.q = (eng_view){q, {sh->B, sh->H, sh->L, D}, {sh->L * Q, sh->L * D, D, 1}};
    s.k = (eng_view){kv, {sh->B, sh->Hkv, sh->Sx, D}, {sh->Hkv * sh->Sx * D, sh->Sx * D, D, 1}};
    s.v = s.k;
    s.v.data = value_rows(sh, kv);
    s.out = (eng_view){o, {sh->B, sh->H, sh->L, D}, {sh->L * Q, D, Q, 1}};
    s.causal = a->causal;
    /* Positions count the S input keys only: bottom-right alignment means S - L, not S' - L. */
    s.align = ENG_ALIGN_OFFSET;
    s.query_offset = sh->q_offset;
    s.window_left_set = a->window_left_set;
    s.window_right_set = a->window_right_set;
    s.window_left = a->window_left;
    s.window_right = a->window_right;
    s.key_padding = a->key_padding;
    s.key_padding_stride = a->key_padding_stride;
    s.attn_mask = a->attn_mask;
    s.alibi = a->positional == ENG_POSITIONAL_ALIBI;
    s.open_tail_keys = sh->extra;
    s.weights_mode = a->weights_mode;
    s.weights = a->weights;
    s.precision = sh->bf16 ? ENG_PRECISION_BFLOAT16 : ENG_PRECISION_FLOAT32;
    const eng_layer *ly = a->layer;
    if (ly->decoder) { /* the layer's scale, cap and window, unless the call sets a window */
        s.scale_set = ly->spec.scale_set;
        s.scale = ly->spec.scale;
        s.softcap = ly->spec.softcap;
        if (ly->spec.window > 0 && !s.window_left_set && !s.window_right_set) {
            s.window_left_set = true;
            s.window_left = ly->spec.window - 1;
        }
    }
    return s;
}

/* The attention of a step over the cache: sdpa_args without K and V, which the cache has, and
 * queries at its end (S - L). With `shape_kv`, K and V views of the cache's shape after the
 * append, as eng_kv_attend checks them (for validation only: their data is a placeholder). */
static eng_sdpa_args cache_sdpa_args(const eng_mha_args *a, const mha_shape *sh, float *q, float *o,
                                     float *shape_kv)
{
    eng_sdpa_args s = sdpa_args(a, sh, q, o, o); /* K and V unset below */
    memset(&s.k, 0, sizeof s.k);
    memset(&s.v, 0, sizeof s.v);
    if (shape_kv) {
        s.k = eng_view_contiguous(shape_kv, 1, sh->Hkv, sh->S, sh->D);
        s.v = eng_view_contiguous(shape_kv, 1, sh->Hkv, sh->S, sh->D);
    }
    s.align = ENG_ALIGN_BOTTOM_RIGHT;
    s.query_offset = 0;
    return s;
}

size_t eng_mha_scratch_bytes(const eng_mha_args *a, int threads)
{
    mha_shape sh;
    if (check_mha(a, &sh, NULL) != ENG_OK)
        return 0;
    float placeholder;
    size_t attention;
    if (sh.cache) { /* over the cache as it will be once the step's L tokens are in */
        eng_sdpa_args s = cache_sdpa_args(a, &sh, &placeholder, &placeholder, NULL);
        attention = eng_kv_attend_scratch_bytes(sh.cache, &s, sh.L, threads);
    } else {
        eng_sdpa_args s = sdpa_args(a, &sh, &placeholder, &placeholder, &placeholder);
        attention = eng_sdpa_scratch_bytes(&s, threads);
    }
    /* Projection tasks pack a weight block, widen 16-bit weight rows, stage head-major
     * products and gather the rows of a chunk that spans batches (or the passes of a batched
     * call: this pass's share of such a chunk is at most its own rows) in per-thread scratch
     * (the workers and the caller): at most this much for the widest projection. */
    const eng__kernels *ks = eng__kernels_current();
    const bool amx = sh.bf16 && eng__amx_active() != ENG__AMX_OFF;
    int64_t in_most = sh.E > a->layer->kdim ? sh.E : a->layer->kdim;
    in_most = in_most > a->layer->vdim ? in_most : a->layer->vdim;
    in_most = in_most > sh.Q ? in_most : sh.Q;
    int64_t out_most = sh.E > sh.Q ? sh.E : sh.Q;
    int64_t rows_most = sh.L > sh.S_in ? sh.L : sh.S_in;
    const linear_job widest = {.out_f = out_most, .in_f = in_most, .head_major = true};
    int64_t chunk_most = sh.B * rows_most < CHUNK_ROWS ? sh.B * rows_most : CHUNK_ROWS;
    /* The layer's panels serve float32 products on the set they were packed for. */
    const bool panels = !sh.bf16 && a->layer->panels_kernels == (const void *)ks;
    size_t pack =
        eng__linear_task_floats(ks, amx, &widest, a->layer->params16 && !panels, chunk_most, true) *
        sizeof(float);
    /* Few-row products stage the input projections' rows instead of packing (run_few_rows). */
    const bool few = rows_most <= FEW_ROWS / sh.B;
    size_t staged = few ? (size_t)(sh.B * (sh.L * sh.Q + 2 * sh.S_in * sh.W)) * sizeof(float) : 0;
    /* The weights packed once per call (pack_weights): the three input ones, or later the
     * output one; none where the products read the layer's panels or widen 16-bit rows. */
    size_t weights = 0;
    if (amx)
        weights =
            eng__linear_amx_weight_bytes(&(linear_job){.out_f = sh.Q, .in_f = sh.E}) +
            eng__linear_amx_weight_bytes(&(linear_job){.out_f = sh.W, .in_f = a->layer->kdim}) +
            eng__linear_amx_weight_bytes(&(linear_job){.out_f = sh.W, .in_f = a->layer->vdim});
    else if (ks->tile && !a->layer->params16 && !panels)
        weights = (eng__sgemm_panels_floats(ks, sh.Q, sh.E) +
                   eng__sgemm_panels_floats(ks, sh.W, a->layer->kdim) +
                   eng__sgemm_panels_floats(ks, sh.W, a->layer->vdim)) *
                  sizeof(float);
    size_t packing = (size_t)(threads + 1) * pack + weights;
    /* A pass of few rows packs nothing, unless a batch of more than FEW_BATCH_ROWS rows takes it
     * into the blocked product, which packs once for all of them: its share is its part of those
     * rows, so that the members' reservations still cover the batch. */
    if (few)
        packing = (packing / (FEW_BATCH_ROWS + 1) + 1) * (size_t)(sh.B * rows_most);
    return (sh.q_floats + sh.kv_floats + sh.o_floats + sh.copy_floats + sh.lse_floats) *
               sizeof(float) +
           attention + (size_t)(threads + 1) * staged + packing;
}

/* ---- Forward ------------------------------------------------------------------------------ */

/* x + PE for `rows` tokens per batch at positions pos0..: a copy, in parallel over batches. */
typedef struct {
    const float *x;
    float *out;
    int64_t rows, dim, pos0;
} sinusoid_job;

static void sinusoid_task(void *arg, int64_t b)
{
    sinusoid_job *j = arg;
    size_t n = (size_t)(j->rows * j->dim);
    memcpy(j->out + (size_t)b * n, j->x + (size_t)b * n, n * sizeof(float));
    eng_sinusoidal_add(j->out + (size_t)b * n, j->rows, j->dim, j->dim, j->pos0);
}

static eng_status add_sinusoid(eng_pool *pool, const float *x, float *out, int64_t B, int64_t rows,
                               int64_t dim, int64_t pos0, eng_ctl *ctl)
{
    sinusoid_job j = {x, out, rows, dim, pos0};
    return eng_pool_run(pool, sinusoid_task, &j, B, ctl);
}

/* An input copied for the projections: with the sinusoidal encoding added, and rounded to bf16
 * when the layer computes in bf16. */
static eng_status copy_input(eng_pool *pool, const mha_shape *sh, const float *x, float *out,
                             int64_t rows, int64_t dim, int64_t pos0, eng_ctl *ctl)
{
    size_t n = (size_t)(sh->B * rows * dim);
    eng_status st = ENG_OK;
    if (sh->sinusoid)
        st = add_sinusoid(pool, x, out, sh->B, rows, dim, pos0, ctl);
    else
        memcpy(out, x, n * sizeof(float));
    if (st == ENG_OK && sh->bf16)
        sh->ks->round_bf16(out, (int64_t)n);
    return st;
}

/* Rows S..S'-1 of every head of every batch: bias_k / bias_v (the head's D of them), then a
 * zero key and value. */
static void append_keys(const eng_mha_args *a, const mha_shape *sh, float *kv)
{
    const int64_t D = sh->D;
    float *v = value_rows(sh, kv);
    for (int64_t b = 0; b < sh->B; b++)
        for (int64_t g = 0; g < sh->Hkv; g++) {
            int64_t at = ((b * sh->Hkv + g) * sh->kv_rows + sh->S_in) * D;
            if (a->layer->bias_k) {
                memcpy(kv + at, a->layer->bias_k + g * D, (size_t)D * sizeof(float));
                memcpy(v + at, a->layer->bias_v + g * D, (size_t)D * sizeof(float));
                at += D;
            }
            if (a->add_zero_attn) {
                memset(kv + at, 0, (size_t)D * sizeof(float));
                memset(v + at, 0, (size_t)D * sizeof(float));
            }
        }
}

/* ---- Passes ------------------------------------------------------------------------------- */

/* One pass of a call (a member of eng_mha_batch; eng_mha is a batch of one): its arguments,
 * shape and buffers, and how it stands. A pass fails alone: once `live` is false its member's
 * status and error say why, and nothing more is done for it. */
typedef struct {
    eng_mha_member *m;
    const eng_mha_args *a;
    mha_shape sh;
    /* Request-sized buffers: the projected queries, the projected K then V rows (value_rows),
     * the attention's output, the inputs' copies (sinusoid, bf16) and each query's
     * log-sum-exp (NULL without sinks). */
    float *q, *kv, *o, *copies, *lse;
    mha_inputs x;
    bool live;
    bool appended; /* its tokens are in its cache: a failure now truncates them away */
} mha_pass;

/* Ends a pass with `st`, its error already written, and takes back what it appended. */
static void pass_fail(mha_pass *p, eng_status st)
{
    p->m->status = st;
    p->live = false;
    if (p->appended) /* cannot fail: the length before the step is at most the length now */
        eng_kv_seq_truncate(p->sh.cache, p->sh.cached, NULL);
    p->appended = false;
}

/* Ends a pass stopped between or inside its stages: cancelled, past its deadline, or without
 * the memory of a product. */
static void pass_stop(mha_pass *p, eng_status st)
{
    eng__fail(p->m->err, st, "", "attention stopped: %s", eng_status_str(st));
    pass_fail(p, st);
}

/* Stops a live pass whose control block says so; true when it goes on. */
static bool pass_goes_on(mha_pass *p)
{
    eng_status st;
    if (p->live && (st = eng_ctl_check(p->m->ctl)) != ENG_OK)
        pass_stop(p, st);
    return p->live;
}

/* Everything eng_mha checks before doing any work: the arguments, then the attention's options
 * (over a cache, as eng_kv_step will, with K and V the size the cache will have), so that no
 * projection is spent on a pass the attention would refuse. */
static eng_status check_pass(const eng_mha_args *a, mha_shape *sh, eng_error *err)
{
    eng_status st;
    if (!a)
        return eng__fail(err, ENG_EINVAL, "", "no pool or no arguments");
    if ((st = check_mha(a, sh, err)) != ENG_OK)
        return st;
    float placeholder;
    eng_sdpa_args probe = sh->cache
                              ? cache_sdpa_args(a, sh, &placeholder, &placeholder, &placeholder)
                              : sdpa_args(a, sh, &placeholder, &placeholder, &placeholder);
    return eng__sdpa_validate(&probe, err);
}

/* check_pass, then what a batch adds: one layer for every pass (*layer, set by the first pass
 * that passes its checks), and no sequence stepped by two of them. */
static eng_status check_member(const eng_mha_member *members, int i, const eng_layer **layer,
                               mha_shape *sh)
{
    const eng_mha_args *a = members[i].args;
    eng_error *err = members[i].err;
    eng_status st = check_pass(a, sh, err);
    if (st != ENG_OK)
        return st;
    if (!*layer)
        *layer = a->layer;
    if (a->layer != *layer)
        return eng__fail(err, ENG_EINVAL, "layer",
                         "the passes of a batch run one layer: member %d runs '%s', the batch "
                         "'%s'",
                         i, a->layer->name, (*layer)->name);
    for (int k = 0; a->kv_cache && k < i; k++)
        if (members[k].args && members[k].args->kv_cache == a->kv_cache)
            return eng__fail(err, ENG_EINVAL, "kv_cache",
                             "members %d and %d of a batch step the same sequence: each pass "
                             "appends to its own",
                             k, i);
    return ENG_OK;
}

/* The pass's request-sized buffers (eng_buf's cache spares them the page faults of fresh
 * memory), and its inputs: x, key_in and value_in where they lie, or copies with the
 * sinusoidal encoding added or rounded to bf16. */
static eng_status pass_prepare(eng_pool *pool, mha_pass *p)
{
    const mha_shape *sh = &p->sh;
    const eng_mha_args *a = p->a;
    p->q = eng_buf_alloc(sh->q_floats * sizeof(float));
    p->kv = eng_buf_alloc(sh->kv_floats * sizeof(float));
    p->o = eng_buf_alloc(sh->o_floats * sizeof(float));
    p->copies = sh->copy_floats ? eng_buf_alloc(sh->copy_floats * sizeof(float)) : NULL;
    p->lse = sh->lse_floats ? eng_buf_alloc(sh->lse_floats * sizeof(float)) : NULL;
    if (!p->q || !p->kv || !p->o || (sh->copy_floats && !p->copies) || (sh->lse_floats && !p->lse))
        return ENG_ENOMEM;
    p->x = (mha_inputs){a->x, sh->self ? a->x : a->key_in, sh->self ? a->x : a->value_in};
    if (!p->copies)
        return ENG_OK;
    const eng_layer *ly = a->layer;
    eng_ctl *ctl = p->m->ctl;
    float *next = p->copies;
    eng_status st = copy_input(pool, sh, a->x, next, sh->L, sh->E, sh->q_offset, ctl);
    p->x.q = next;
    next += sh->x_floats;
    if (sh->self && (!sh->sinusoid || sh->q_offset == sh->k_offset)) {
        p->x.k = p->x.v = p->x.q; /* the same tokens at the same positions */
        return st;
    }
    bool shared = p->x.k == p->x.v;
    if (st == ENG_OK)
        st = copy_input(pool, sh, p->x.k, next, sh->S_in, ly->kdim, sh->k_offset, ctl);
    p->x.k = next;
    next += sh->B * sh->S_in * ly->kdim;
    if (shared) {
        p->x.v = p->x.k;
    } else {
        if (st == ENG_OK)
            st = copy_input(pool, sh, p->x.v, next, sh->S_in, ly->vdim, sh->k_offset, ctl);
        p->x.v = next;
    }
    return st;
}

static void pass_release(mha_pass *p)
{
    eng_buf_free(p->q);
    eng_buf_free(p->kv);
    eng_buf_free(p->o);
    eng_buf_free(p->copies);
    eng_buf_free(p->lse);
}

/* The live passes that compute in bf16 (`bf16`) or not: a product rounds its weights one way
 * or the other, so each precision is a product of its own. */
static bool in_group(const mha_pass *p, bool bf16)
{
    return p->live && p->sh.bf16 == bf16;
}

/* The control block a product of one group takes: the pass's own when it is the only one, so
 * that a lone pass stops inside its product as eng_mha always did; a product shared by several
 * runs to its end, and each checks its own between the stages. */
static eng_ctl *group_ctl(mha_pass *ps, int count, bool bf16, int *live)
{
    eng_ctl *ctl = NULL;
    *live = 0;
    for (int i = 0; i < count; i++)
        if (in_group(&ps[i], bf16)) {
            ctl = ps[i].m->ctl;
            ++*live;
        }
    return *live == 1 ? ctl : NULL;
}

/* Ends the group's passes after its product: those the product failed, and those their control
 * blocks stop. */
static void group_after(mha_pass *ps, int count, bool bf16, eng_status st)
{
    for (int i = 0; i < count; i++) {
        if (!in_group(&ps[i], bf16))
            continue;
        if (st != ENG_OK)
            pass_stop(&ps[i], st);
        else
            pass_goes_on(&ps[i]);
    }
}

/* The q, k and v projections of one group: each one product over the rows of every pass (each
 * batch of each a part), RoPE and a decoder layer's norms at each pass's own positions, every
 * head's rows scattered into that pass's buffers. */
static void project_inputs(eng_pool *pool, mha_pass *ps, int count, bool bf16)
{
    int live;
    eng_ctl *ctl = group_ctl(ps, count, bf16, &live);
    if (live == 0)
        return;
    int64_t nparts = 0;
    for (int i = 0; i < count; i++)
        nparts += in_group(&ps[i], bf16) ? ps[i].sh.B : 0;
    linear_part *parts = malloc((size_t)(3 * nparts) * sizeof *parts);
    if (!parts) {
        group_after(ps, count, bf16, ENG_ENOMEM);
        return;
    }
    linear_part *qp = parts, *kp = parts + nparts, *vp = parts + 2 * nparts;
    int64_t n = 0, qrows = 0, krows = 0;
    const mha_shape *sh = NULL;
    const eng_layer *ly = NULL; /* the batch's: every live pass's */
    for (int i = 0; i < count; i++) {
        if (!in_group(&ps[i], bf16))
            continue;
        const mha_pass *p = &ps[i];
        const eng_mha_args *a = p->a;
        sh = &p->sh;
        ly = a->layer;
        const int64_t D = sh->D, kv_head = sh->kv_rows * D;
        const bool rope = a->positional == ENG_POSITIONAL_ROPE;
        for (int64_t b = 0; b < sh->B; b++, n++) {
            float *k = p->kv + b * sh->Hkv * kv_head;
            qp[n] = (linear_part){a,
                                  p->x.q + b * sh->L * sh->E,
                                  p->q + b * sh->L * sh->Q,
                                  sh->L * D,
                                  sh->L,
                                  qrows,
                                  sh->q_offset,
                                  rope};
            kp[n] = (linear_part){a,
                                  p->x.k + b * sh->S_in * a->layer->kdim,
                                  k,
                                  kv_head,
                                  sh->S_in,
                                  krows,
                                  sh->k_offset,
                                  rope};
            vp[n] = (linear_part){a,
                                  p->x.v + b * sh->S_in * a->layer->vdim,
                                  value_rows(sh, p->kv) + b * sh->Hkv * kv_head,
                                  kv_head,
                                  sh->S_in,
                                  krows,
                                  sh->k_offset,
                                  false};
            qrows += sh->L;
            krows += sh->S_in;
        }
    }
    linear_batch lb = {.layer = ly,
                       .njobs = 3,
                       .head_dim = sh->D,
                       .bf16 = bf16,
                       .w16 = {ly->w16_q, ly->w16_k, ly->w16_v},
                       .w16_dtype = ly->w16_dtype,
                       .panels = {ly->panels_q, ly->panels_k, ly->panels_v},
                       .panels_kernels = ly->panels_kernels};
    lb.jobs[0] = (linear_job){.w = ly->w_q,
                              .bias = ly->b_q,
                              .out_f = sh->Q,
                              .in_f = sh->E,
                              .head_major = true,
                              .rope_heads = sh->H,
                              .qk = ly->decoder ? DECODER_QUERY : DECODER_NONE,
                              .parts = qp,
                              .nparts = n,
                              .rows = qrows};
    lb.jobs[1] = (linear_job){.w = ly->w_k,
                              .bias = ly->b_k,
                              .out_f = sh->W,
                              .in_f = ly->kdim,
                              .head_major = true,
                              .rope_heads = sh->Hkv,
                              .qk = ly->decoder ? DECODER_KEY : DECODER_NONE,
                              .parts = kp,
                              .nparts = n,
                              .rows = krows};
    lb.jobs[2] = (linear_job){.w = ly->w_v,
                              .bias = ly->b_v,
                              .out_f = sh->W,
                              .in_f = ly->vdim,
                              .head_major = true,
                              .parts = vp,
                              .nparts = n,
                              .rows = krows};
    eng_status st = eng__linear_run(pool, &lb, ctl);
    free(parts);
    group_after(ps, count, bf16, st);
}

/* The output projection of one group: one product over every pass's attention output, each
 * pass's rows written to its own `out`. */
static void project_output(eng_pool *pool, mha_pass *ps, int count, bool bf16)
{
    int live;
    eng_ctl *ctl = group_ctl(ps, count, bf16, &live);
    if (live == 0)
        return;
    linear_part *parts = malloc((size_t)live * sizeof *parts);
    if (!parts) {
        group_after(ps, count, bf16, ENG_ENOMEM);
        return;
    }
    int64_t n = 0, rows = 0;
    const mha_shape *sh = NULL;
    const eng_layer *ly = NULL;
    for (int i = 0; i < count; i++) {
        if (!in_group(&ps[i], bf16))
            continue;
        sh = &ps[i].sh;
        ly = ps[i].a->layer;
        parts[n++] = (linear_part){
            .a = ps[i].a, .in = ps[i].o, .out = ps[i].a->out, .rows = sh->B * sh->L, .first = rows};
        rows += sh->B * sh->L;
    }
    linear_batch lb = {.layer = ly,
                       .njobs = 1,
                       .head_dim = sh->D,
                       .bf16 = bf16,
                       .w16 = {ly->w16_o},
                       .w16_dtype = ly->w16_dtype,
                       .panels = {ly->panels_o},
                       .panels_kernels = ly->panels_kernels};
    lb.jobs[0] = (linear_job){.w = ly->w_o,
                              .bias = ly->b_o,
                              .out_f = sh->E,
                              .in_f = sh->Q,
                              .parts = parts,
                              .nparts = n,
                              .rows = rows};
    eng_status st = eng__linear_run(pool, &lb, ctl);
    free(parts);
    for (int i = 0; i < count; i++)
        if (st != ENG_OK && in_group(&ps[i], bf16))
            pass_stop(&ps[i], st);
}

/* Appends the new tokens' K and V rows (each head's L rows of the K and V buffers) to the
 * cache and attends the queries over all of it. */
static eng_status cache_step(eng_pool *pool, const mha_pass *p)
{
    const mha_shape *sh = &p->sh;
    eng_view kview = eng_view_contiguous(p->kv, 1, sh->Hkv, sh->L, sh->D);
    eng_view vview = eng_view_contiguous(value_rows(sh, p->kv), 1, sh->Hkv, sh->L, sh->D);
    eng_kv_rows k = eng_kv_rows_f32(kview), v = eng_kv_rows_f32(vview);
    eng_sdpa_args s = cache_sdpa_args(p->a, sh, p->q, p->o, NULL);
    s.lse = p->lse;
    return eng_kv_step(pool, sh->cache, &k, &v, &s, p->m->ctl, p->m->err);
}

/* One pass's attention, then what its output takes before the output projection: the sinks'
 * share, and the rounding to bf16 of the products' operand. */
static void attend(eng_pool *pool, mha_pass *p)
{
    const mha_shape *sh = &p->sh;
    eng_status st;
    if (sh->cache) {
        st = cache_step(pool, p);
        p->appended = st == ENG_OK; /* else eng_kv_step left the sequence as it was */
    } else {
        append_keys(p->a, sh, p->kv);
        eng_sdpa_args s = sdpa_args(p->a, sh, p->q, p->kv, p->o);
        s.lse = p->lse;
        st = eng_sdpa(pool, &s, p->m->ctl, p->m->err);
    }
    if (st != ENG_OK) {
        pass_fail(p, st); /* the attention wrote why */
        return;
    }
    if (p->lse)
        eng__decoder_sinks(p->a->layer, p->o, sh->B, sh->L, p->lse);
    if (sh->bf16) /* the output projection's operand, as the products take them */
        sh->ks->round_bf16(p->o, (int64_t)sh->o_floats);
}

typedef struct {
    eng_pool *pool;
    mha_pass **live;
} attend_job;

static void attend_task(void *arg, int64_t i)
{
    attend_job *j = arg;
    attend(j->pool, j->live[i]);
}

/* The attentions of the live passes, in parallel: one task per pass, each fanning its heads
 * (and a decode step's keys) out over the pool in turn, so that workers idle in one pass's
 * attention help another's. Each stops on its own control block. */
static void attend_all(eng_pool *pool, mha_pass *ps, int count, mha_pass **live)
{
    int64_t n = 0;
    for (int i = 0; i < count; i++)
        if (ps[i].live)
            live[n++] = &ps[i];
    if (n <= 1) {
        if (n == 1)
            attend(pool, live[0]);
        return;
    }
    attend_job j = {pool, live};
    eng_pool_run(pool, attend_task, &j, n, NULL); /* no control block: it runs every task */
}

/* Every stage of the call over its passes, each stage once for all of them. */
static void run_passes(eng_pool *pool, mha_pass *ps, int count, mha_pass **live)
{
    for (int g = 0; g < 2; g++)
        project_inputs(pool, ps, count, g == 1);
    attend_all(pool, ps, count, live);
    for (int i = 0; i < count; i++)
        pass_goes_on(&ps[i]);
    for (int g = 0; g < 2; g++)
        project_output(pool, ps, count, g == 1);
}

eng_status eng_mha_batch(eng_pool *pool, eng_mha_member *members, int count)
{
    if (count <= 0 || !members)
        return count == 0 ? ENG_OK : ENG_EINVAL;
    /* One pass needs no allocation of its own: eng_mha is this call with one member. */
    mha_pass one, *one_live;
    mha_pass *ps = &one;
    mha_pass **live = &one_live;
    if (count > 1) {
        ps = calloc((size_t)count, sizeof *ps + sizeof *live);
        live = (mha_pass **)(void *)(ps + count);
    }
    if (!ps) {
        for (int i = 0; i < count; i++)
            members[i].status = eng__fail(members[i].err, ENG_ENOMEM, "",
                                          "cannot allocate the batch of %d passes", count);
        return ENG_ENOMEM;
    }
    const eng_layer *layer = NULL; /* the batch's: the first valid pass's */
    for (int i = 0; i < count; i++) {
        mha_pass *p = &ps[i];
        memset(p, 0, sizeof *p);
        p->m = &members[i];
        p->a = members[i].args;
        p->live = true;
        eng_status st = pool ? check_member(members, i, &layer, &p->sh)
                             : eng__fail(p->m->err, ENG_EINVAL, "", "no pool or no arguments");
        if (st != ENG_OK) {
            pass_fail(p, st);
            continue;
        }
        if (!pass_goes_on(p))
            continue;
        if ((st = pass_prepare(pool, p)) == ENG_ENOMEM)
            pass_fail(p, eng__fail(p->m->err, st, "", "cannot allocate the layer's buffers"));
        else if (st != ENG_OK)
            pass_stop(p, st);
    }
    run_passes(pool, ps, count, live);
    eng_status first = ENG_OK;
    for (int i = 0; i < count; i++) {
        if (ps[i].live)
            members[i].status = ENG_OK;
        if (first == ENG_OK)
            first = members[i].status;
        pass_release(&ps[i]);
    }
    if (ps != &one)
        free(ps);
    return first;
}

eng_status eng_mha(eng_pool *pool, const eng_mha_args *a, eng_ctl *ctl, eng_error *err)
{
    if (!pool || !a)
        return eng__fail(err, ENG_EINVAL, "", "no pool or no arguments");
    eng_mha_member m = {.args = a, .ctl = ctl, .err = err};
    return eng_mha_batch(pool, &m, 1);
}
