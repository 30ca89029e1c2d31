/*
 * sdpa.c - scaled dot-product attention: argument checks, work planning and the flash kernel.
 *
 * One task computes a block of Br query rows of one (batch, head) against the keys they can
 * see, Bc keys at a time, and each key block a panel of MR query rows at a time (the
 * micro-kernel's tile): S = scale * Q K^T by the kernel set's GEMM (kernels.h: Q read in place,
 * K packed once per block or per call), then softcap, ALiBi, masks and padding on S, then the
 * online softmax (running row maximum m and sum l; the accumulator is rescaled when m grows),
 * then O += P V by the same GEMM, P read where the softmax wrote it, straight into the output
 * rows (beta = 1: no zeroing pass per block). A panel's scores stay in L1 through all three,
 * and on a causal or window boundary a panel multiplies only the keys its rows may see. The
 * avx512 set runs both products on its wide 6 x 64 tile (tile_avx512.h) instead of its GEMM's
 * 12 x 32 one: a broadcast feeds four FMAs, and P V takes a block's keys in one depth. The
 * openblas kernel set does both products with cblas_sgemm instead. With bf16 precision the
 * products take bf16 operands (VDPBF16PS on pair-packed panels, or operands rounded for the
 * fp32 kernel): Q, K, V and P are rounded, everything else stays fp32. Memory per worker is
 * one Br x Bc block and one block's panels. Key blocks that no row of the task can see (causal,
 * window, kv_lengths, all-padding) are never computed, so causal work halves. When few (batch,
 * head, query block) tasks exist but the keys are many (decoding), the keys are split into chunks
 * computed in parallel and merged by their log-sum-exp. With grouped-query heads and few query
 * rows (decoding), one task takes every query head of a kv group: each K/V block is read once,
 * and serves the group's heads in turn, each head's rows keeping their own head for ALiBi,
 * masks and outputs. A task of at most ENG__STREAM_ROWS rows per kv head (a decode step: a kv
 * group's heads times one or a few query rows) packs nothing: it streams the raw K and V rows
 * through the vector kernels' multi-row dot products and sums (dots_rows, axpys_rows), each
 * row loaded once for all the task's query rows, so that the cache is read at memory speed
 * (a pass over an L2-resident block per head, or packing it for register tiles of which the
 * rows fill a third, took longer than the read itself); a lone row over a paged bf16 cache
 * takes the pair kernels instead (stream_pairs), which multiply bf16 rows without widening
 * them. Where kv heads lie side by side (a paged cache block, or views whose heads interleave),
 * such a task takes several kv heads in turn in each key block, so that it reads their rows in
 * the order they lie (stream_slots). Weights, when asked for, are a second pass that
 * recomputes S and writes exp(s - m) / l with each row's final maximum m and sum l (not
 * exp(s - lse): lse rounded to float loses log(l) next to scores of 1e9).
 *
 * K and V come from a source: the caller's views (eng_sdpa), or the block table of a paged KV
 * cache (eng__sdpa_paged, for engine/kvcache.c), whose rows are contiguous only inside a cache
 * block and may be bf16 or f16. The loop is the same: a key block ends at a cache-block
 * boundary when its rows are read in place (block_cols, source_rows), prepacking goes a cache
 * block at a time into panels that then span cache blocks, a 16-bit block is widened into the
 * task's scratch for the products, and a streaming task reads 16-bit rows in place, widened
 * by the vector kernels as they load them.
 */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels.h"

#define BR_MAX          256 /* query rows per task */
#define BR_MIN          16  /* smallest block worth a GEMM when shrinking for parallelism */
#define BC_MIN          64  /* keys per block, bounds of the L2-derived size */
#define BC_MAX          1024
#define SCORE_BLOCK_MAX (256 << 10) /* bytes of a task's score block, at most (plan_blocks) */
/* How far a block's maximum may exceed a row's reference maximum before the row is rebased:
 * exp(s - m) then stays below e^8, far from float's range, and rebases are rare. */
#define RESCALE_SLACK     8.0f
#define TASKS_PER_THREAD  4 /* below this many tasks per worker, split decode-shaped keys */
#define PREPACK_MAX_BYTES ((uint64_t)64 << 20) /* shared K and V panels, at most */
/* At most this many query rows per head, one task takes every query head of a kv group, so
 * that each K/V block is read once for the group rather than once per head. Below it a head
 * does under L / 2 FLOPs per byte of fp32 K and V (2 L (D + Dv) per key of 4 (D + Dv) bytes),
 * less than two cores compute per byte they read (make bench here: 100-200 GFLOPS over 10-20
 * GB/s), so the reads set the speed. */
#define GROUP_L_MAX 16
/* Positions and window bounds stay far from INT64_MAX so that p_i + right + 1 cannot wrap. */
#define POSITION_LIMIT (INT64_C(1) << 60)

/* Everything a task needs, resolved once per call. */
typedef struct {
    const eng_sdpa_args *a;
    const eng__kernels *ks; /* read once per call: a call keeps the set it started with */
    const eng__vec_ops *vec;
    eng_ctl *ctl;
    int64_t B, H, Hkv, L, S, D, Dv, group;
    int64_t S_main; /* keys under position rules and masks; the rest are the open tail */
    float scale;
    int64_t offset; /* p_i = i + offset */
    const float *slopes;
    int64_t br, bc, nqb; /* rows per head in a task, keys per block, query blocks per head */
    int64_t task_heads;  /* query heads per slot: 1, or a kv group's (grouped decoding) */
    int64_t task_slots;  /* slots (kv heads) per task, taken in turn in each key block: 1, or
                          * several when a streaming task's kv heads lie side by side */
    int64_t chunks;      /* key chunks per (b, h, query block); 1 = no split */
    int64_t chunk_len;
    float *part_o;        /* split partials: [B, H, chunks, L, Dv] unnormalised outputs */
    float *part_ml;       /* and [B, H, chunks, 2, L] row maxima then sums */
    float *lse;           /* the caller's, or NULL */
    float *add_q, *add_k; /* additive scoring: W_q q [B, H, L, A] and W_k k [B, Hkv, S, A] */
    bool bf16;            /* the products take bf16 operands (eng_sdpa_precision) ... */
    bool bf16_native;     /* ... multiplied by VDPBF16PS; else rounded for the fp32 kernel */
    bool stream;          /* few rows in all: they stream raw K and V rows (stream_block) */
    bool v_in_place;      /* o += P V reads V's rows where they lie (values_in_place) */
    int64_t dp;           /* bf16 rows of Q: D rounded up to a whole pair */
    bool prepack;         /* K and V are packed once, before the attention, and shared */
    float *kpack, *vpack; /* per (b, kv head): K^T panels (D x NR each) and V panels (S x NR) */
    uint16_t *kpack16, *vpack16;    /* the same in bf16 pair panels, when bf16_native */
    int64_t kpack_head, vpack_head; /* elements per (b, kv head) */
    const eng__kv_paged *kv;        /* K and V through a block table, or NULL: a->k, a->v */
    bool kv16;                      /* K and V rows are bf16 or f16 (the table's or the views') */
    eng_dtype kv_dtype;             /* which: the table's dtype, or the views' */
    bool q16;                       /* Q rows are bf16: copied or widened per task, never whole */
    atomic_int_fast64_t *kv_rows;   /* counts the keys of every block read (tests), or NULL */
    atomic_bool nonfinite;          /* some row overflowed */
    atomic_bool no_scratch;         /* some task could not get its scratch block */
} plan;

/* ---- Views ------------------------------------------------------------------------------------
 */

eng_view eng_view_contiguous(float *data, int64_t n0, int64_t n1, int64_t n2, int64_t n3)
{
    eng_view v = {.data = data, .ne = {n0, n1, n2, n3}};
    v.stride[3] = 1;
    v.stride[2] = n3;
    v.stride[1] = n3 * n2;
    v.stride[0] = n3 * n2 * n1;
    return v;
}

static inline float *row_ptr(const eng_view *v, int64_t b, int64_t h, int64_t i)
{
    return v->data + b * v->stride[0] + h * v->stride[1] + i * v->stride[2];
}

/* The same for the bfloat16 data of view v (eng_sdpa_args q16, k16, v16). */
static inline const uint16_t *row_ptr16(const uint16_t *data, const eng_view *v, int64_t b,
                                        int64_t h, int64_t i)
{
    return data + b * v->stride[0] + h * v->stride[1] + i * v->stride[2];
}

/* The leading dimension to hand BLAS: the row stride, or the row length for a single row
 * (whose stride is never used and may be anything). */
static inline int ld_of(const eng_view *v)
{
    return (int)(v->ne[2] > 1 ? v->stride[2] : v->ne[3]);
}

/* ---- Validation -------------------------------------------------------------------------------
 */

/* Checks view v of an operand whose elements are at `data` (v->data, or the bf16 pointer). */
static eng_status check_view(const eng_view *v, const void *data, const char *name, eng_error *err)
{
    if (!data)
        return eng__fail(err, ENG_EINVAL, name, "%s has no data", name);
    for (int d = 0; d < 4; d++) {
        if (v->ne[d] <= 0)
            return eng__fail(err, ENG_EINVAL, name, "%s dimension %d is %lld; must be positive",
                             name, d, (long long)v->ne[d]);
        if (v->ne[d] > INT_MAX)
            return eng__fail(err, ENG_ETOOBIG, name,
                             "%s dimension %d is %lld; BLAS accepts at most %d", name, d,
                             (long long)v->ne[d], INT_MAX);
        if (v->stride[d] < 0)
            return eng__fail(err, ENG_EINVAL, name, "%s stride %d is negative", name, d);
    }
    if (v->stride[3] != 1)
        return eng__fail(err, ENG_EINVAL, name, "%s rows must be contiguous (stride 1)", name);
    if (v->ne[2] > 1 && v->stride[2] > INT_MAX)
        return eng__fail(err, ENG_ETOOBIG, name, "%s row stride %lld is beyond BLAS's %d", name,
                         (long long)v->stride[2], INT_MAX);
    if (v->ne[2] > 1 && v->stride[2] < v->ne[3])
        return eng__fail(err, ENG_EINVAL, name,
                         "%s row stride %lld is below the row length %lld (rows may not overlap)",
                         name, (long long)v->stride[2], (long long)v->ne[3]);
    /* The farthest element must be addressable. */
    int64_t last = 0;
    for (int d = 0; d < 4; d++) {
        int64_t span;
        if (__builtin_mul_overflow(v->ne[d] - 1, v->stride[d], &span) ||
            __builtin_add_overflow(last, span, &last))
            return eng__fail(err, ENG_ETOOBIG, name, "%s spans more than 2^63 elements", name);
    }
    if ((uint64_t)last >= SIZE_MAX / sizeof(float))
        return eng__fail(err, ENG_ETOOBIG, name, "%s is larger than memory", name);
    return ENG_OK;
}

static eng_status check_shapes(const eng_sdpa_args *a, eng_error *err)
{
    eng_status st;
    for (int i = 0; i < 2; i++) {
        eng_dtype dt = i == 0 ? a->q_dtype : a->kv_dtype;
        if (dt != ENG_DTYPE_F32 && dt != ENG_DTYPE_BF16)
            return eng__fail(err, ENG_EINVAL, i == 0 ? "q" : "k",
                             "%s must be float32 or bfloat16 (dtype %d)", i == 0 ? "q" : "k and v",
                             (int)dt);
    }
    const bool q16 = a->q_dtype == ENG_DTYPE_BF16, kv16 = a->kv_dtype == ENG_DTYPE_BF16;
    if ((st = check_view(&a->q, q16 ? (const void *)a->q16 : a->q.data, "q", err)) ||
        (st = check_view(&a->k, kv16 ? (const void *)a->k16 : a->k.data, "k", err)) ||
        (st = check_view(&a->v, kv16 ? (const void *)a->v16 : a->v.data, "v", err)) ||
        (st = check_view(&a->out, a->out.data, "out", err)))
        return st;
    for (int d = 0; d < 2; d++) /* tasks write their own rows: out may not broadcast */
        if (a->out.ne[d] > 1 && a->out.stride[d] == 0)
            return eng__fail(err, ENG_EINVAL, "out", "out stride %d is 0: rows would collide", d);
    const int64_t *q = a->q.ne, *k = a->k.ne, *v = a->v.ne, *o = a->out.ne;
    if (k[0] != q[0] || v[0] != q[0])
        return eng__fail(err, ENG_EINVAL, k[0] != q[0] ? "k" : "v",
                         "batch sizes differ: q %lld, k %lld, v %lld", (long long)q[0],
                         (long long)k[0], (long long)v[0]);
    if (v[1] != k[1])
        return eng__fail(err, ENG_EINVAL, "v", "v has %lld heads but k has %lld", (long long)v[1],
                         (long long)k[1]);
    if (q[1] % k[1] != 0)
        return eng__fail(err, ENG_EINVAL, "k",
                         "query heads (%lld) must be a multiple of key/value heads (%lld)",
                         (long long)q[1], (long long)k[1]);
    if (v[2] != k[2])
        return eng__fail(err, ENG_EINVAL, "v", "v has %lld positions but k has %lld",
                         (long long)v[2], (long long)k[2]);
    if (k[3] != q[3])
        return eng__fail(err, ENG_EINVAL, "k", "k head size %lld differs from q head size %lld",
                         (long long)k[3], (long long)q[3]);
    if (o[0] != q[0] || o[1] != q[1] || o[2] != q[2] || o[3] != v[3])
        return eng__fail(err, ENG_EINVAL, "out",
                         "out is [%lld,%lld,%lld,%lld]; must be [%lld,%lld,%lld,%lld]",
                         (long long)o[0], (long long)o[1], (long long)o[2], (long long)o[3],
                         (long long)q[0], (long long)q[1], (long long)q[2], (long long)v[3]);
    return ENG_OK;
}

static eng_status check_mask(const eng_sdpa_args *a, eng_error *err)
{
    const eng_mask *m = &a->attn_mask;
    if (m->kind == ENG_MASK_NONE)
        return ENG_OK;
    if (m->kind != ENG_MASK_BOOL && m->kind != ENG_MASK_FLOAT)
        return eng__fail(err, ENG_EINVAL, "attn_mask", "unknown mask kind %d", (int)m->kind);
    if (!m->data)
        return eng__fail(err, ENG_EINVAL, "attn_mask", "attn_mask has no data");
    const int64_t full[4] = {a->q.ne[0], a->q.ne[1], a->q.ne[2], a->k.ne[2] - a->open_tail_keys};
    static const char *const axis[4] = {"B", "H", "L", "S"};
    int64_t last = 0;
    for (int d = 0; d < 4; d++) {
        if (m->ne[d] != 1 && m->ne[d] != full[d])
            return eng__fail(err, ENG_EINVAL, "attn_mask",
                             "attn_mask dimension %d is %lld; must be 1 or %s = %lld", d,
                             (long long)m->ne[d], axis[d], (long long)full[d]);
        if (m->stride[d] < 0)
            return eng__fail(err, ENG_EINVAL, "attn_mask", "attn_mask stride %d is negative", d);
        int64_t span;
        if (__builtin_mul_overflow(m->ne[d] - 1, m->stride[d], &span) ||
            __builtin_add_overflow(last, span, &last))
            return eng__fail(err, ENG_ETOOBIG, "attn_mask", "attn_mask spans too much memory");
    }
    return ENG_OK;
}

static eng_status check_options(const eng_sdpa_args *a, eng_error *err)
{
    const int64_t B = a->q.ne[0], H = a->q.ne[1], L = a->q.ne[2], S = a->k.ne[2];
    if (a->open_tail_keys < 0 || a->open_tail_keys > S)
        return eng__fail(err, ENG_EINVAL, "open_tail_keys",
                         "open_tail_keys = %lld must be in [0, S = %lld]",
                         (long long)a->open_tail_keys, (long long)S);
    const int64_t S_main = S - a->open_tail_keys;
    if (a->scale_set && !isfinite(a->scale))
        return eng__fail(err, ENG_EINVAL, "scale", "scale must be finite");
    if (a->precision != ENG_PRECISION_FLOAT32 && a->precision != ENG_PRECISION_BFLOAT16)
        return eng__fail(err, ENG_EINVAL, "precision", "precision must be float32 or bfloat16");
    if (!(a->softcap >= 0.0f) || !isfinite(a->softcap))
        return eng__fail(err, ENG_EINVAL, "softcap", "softcap must be finite and >= 0");
    if (a->align != ENG_ALIGN_TOP_LEFT && a->align != ENG_ALIGN_BOTTOM_RIGHT &&
        a->align != ENG_ALIGN_OFFSET)
        return eng__fail(err, ENG_EINVAL, "align", "unknown alignment %d", (int)a->align);
    if (a->align == ENG_ALIGN_OFFSET &&
        (a->query_offset > POSITION_LIMIT || a->query_offset < -POSITION_LIMIT))
        return eng__fail(err, ENG_EINVAL, "query_offset", "query_offset must be within +-2^60");
    if ((a->window_left_set && (a->window_left < 0 || a->window_left > POSITION_LIMIT)) ||
        (a->window_right_set && (a->window_right < 0 || a->window_right > POSITION_LIMIT)))
        return eng__fail(err, ENG_EINVAL, "window", "window bounds must be in [0, 2^60]");
    if (a->key_padding && a->key_padding_stride < 0)
        return eng__fail(err, ENG_EINVAL, "key_padding_mask", "negative batch stride");
    if (a->kv_lengths) {
        for (int64_t b = 0; b < B; b++)
            if (a->kv_lengths[b] < 0 || a->kv_lengths[b] > S_main)
                return eng__fail(err, ENG_EINVAL, "kv_lengths",
                                 "kv_lengths[%lld] = %lld must be in [0, %lld]", (long long)b,
                                 (long long)a->kv_lengths[b], (long long)S_main);
    }
    if (a->alibi && a->alibi_slopes) {
        for (int64_t h = 0; h < H; h++)
            if (!isfinite(a->alibi_slopes[h]))
                return eng__fail(err, ENG_EINVAL, "alibi", "alibi slope %lld is not finite",
                                 (long long)h);
    }
    if (a->additive_w_q || a->additive_w_k || a->additive_v) {
        int64_t n;
        if (!a->additive_w_q || !a->additive_w_k || !a->additive_v)
            return eng__fail(err, ENG_EINVAL, "additive",
                             "additive scoring needs w_q, w_k and v together");
        if (a->q_dtype != ENG_DTYPE_F32 || a->kv_dtype != ENG_DTYPE_F32)
            return eng__fail(err, ENG_EINVAL, "additive",
                             "additive scoring takes float32 q and k, not bfloat16 views");
        if (a->additive_dim <= 0 || a->additive_dim > INT_MAX)
            return eng__fail(err, ENG_EINVAL, "additive",
                             "additive dimension %lld must be positive",
                             (long long)a->additive_dim);
        if (__builtin_mul_overflow(B * H * L + B * a->k.ne[1] * S, a->additive_dim, &n) ||
            (uint64_t)n > SIZE_MAX / sizeof(float))
            return eng__fail(err, ENG_ETOOBIG, "additive",
                             "the additive projections are too large");
    }
    if (a->weights_mode != ENG_WEIGHTS_NONE) {
        if (a->weights_mode != ENG_WEIGHTS_PER_HEAD && a->weights_mode != ENG_WEIGHTS_MEAN)
            return eng__fail(err, ENG_EINVAL, "weights", "unknown weights mode %d",
                             (int)a->weights_mode);
        if (!a->weights)
            return eng__fail(err, ENG_EINVAL, "weights", "weights requested but no buffer");
        int64_t n;
        if (__builtin_mul_overflow(B, a->weights_mode == ENG_WEIGHTS_MEAN ? 1 : H, &n) ||
            __builtin_mul_overflow(n, L, &n) || __builtin_mul_overflow(n, S, &n) ||
            (uint64_t)n > SIZE_MAX / sizeof(float))
            return eng__fail(err, ENG_ETOOBIG, "weights", "the weights matrix is too large");
    }
    return check_mask(a, err);
}

/* ---- Planning ---------------------------------------------------------------------------------
 */

static int64_t ceil_div(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

static int64_t clamp64(int64_t x, int64_t lo, int64_t hi)
{
    return x < lo ? lo : x > hi ? hi : x;
}

/* Tasks of (b, the task's heads, query block): the attention's, or the split's before its
 * chunks. */
static int64_t attention_tasks(const plan *p)
{
    return p->B * (p->H / (p->task_heads * p->task_slots)) * p->nqb;
}

/* Decoding: too few tasks for the pool and many keys: split the keys. */
/* The most chunks a split may cut the keys into: whole key blocks, 1 when there are fewer
 * than two. */
static int64_t most_chunks(const plan *p)
{
    return p->S >= 2 * p->bc ? p->S / p->bc : 1;
}

static void plan_chunks(plan *p, int threads)
{
    p->chunks = 1;
    p->chunk_len = p->S;
    int64_t tasks = attention_tasks(p), most = most_chunks(p);
    if (p->a->weights_mode == ENG_WEIGHTS_NONE && tasks < (int64_t)threads * TASKS_PER_THREAD &&
        most > 1) {
        int64_t want = ceil_div((int64_t)threads * TASKS_PER_THREAD, tasks);
        p->chunks = want < most ? want : most;
        p->chunk_len = ceil_div(ceil_div(p->S, p->chunks), p->bc) * p->bc;
        p->chunks = ceil_div(p->S, p->chunk_len);
    }
}

/* Slots of a streaming task. A paged cache block holds every kv head's rows, head after head,
 * and views whose heads interleave hold them key by key; a task that takes several kv heads in
 * turn in each key block reads them in the order they lie (with 64-token blocks of 32 heads,
 * AMD Zen 4 read a head's 32 KiB runs block after block at half the speed of whole blocks in
 * order). As many as leave the pool enough tasks once the keys are split (plan_chunks), and
 * one when weights are asked for (their pass goes head by head, and keys are not split). */
static int64_t stream_slots(const plan *p, int threads)
{
    const bool interleaved = !p->kv && p->a->k.stride[1] < p->a->k.stride[2];
    if ((!p->kv && !interleaved) || p->a->weights_mode != ENG_WEIGHTS_NONE)
        return 1;
    const int64_t kv_heads = p->H / p->task_heads, want = (int64_t)threads * TASKS_PER_THREAD;
    for (int64_t slots = kv_heads; slots > 1; slots--)
        if (kv_heads % slots == 0 && p->B * (kv_heads / slots) * most_chunks(p) >= want)
            return slots;
    return 1;
}

/* Whether a task takes every query row of its heads: when there are heads enough for
 * TASKS_PER_THREAD tasks per worker and a head's output rows fit in a quarter of L2. Each key
 * block is then packed once, into the task's scratch, right before every row of the head
 * multiplies it from L2; query blocks of their own share panels packed in a pass before the
 * call, which they read back from memory (AMD Zen 5, (4,16,1024,1024,64) causal, alternating
 * in one process: 1-6% faster). Not when weights are asked for (their pass scores a query
 * block at once), nor from a paged cache: blocks a task packs itself stop at each cache block
 * (block_cols), where prepacked panels span them. */
static bool whole_heads(const plan *p, int64_t head_tasks, int threads, int64_t l2)
{
    return p->a->weights_mode == ENG_WEIGHTS_NONE && !p->kv &&
           head_tasks >= (int64_t)threads * TASKS_PER_THREAD &&
           p->L <= l2 / 4 / (p->Dv * (int64_t)sizeof(float));
}

static void plan_blocks(plan *p, int threads)
{
    /* Keys per block: the K and V blocks take at most a quarter of L2, and a score block of
     * BR_MAX rows a quarter too and at most SCORE_BLOCK_MAX, so that the weights pass, which
     * scores a query block at once, finds its scores still in L2. The flash loop scores a panel
     * at a time, and measured fastest under the same bound: on a 2 MiB L2, 256 keys ran
     * clearly faster than 1024; on AMD Zen 4's 1 MiB L2, 4-8% faster than 128 and as fast as
     * 512. */
    int64_t l2 = (int64_t)eng__l2_bytes();
    int64_t bc = l2 / (16 * (p->D + p->Dv));
    int64_t score_bytes = l2 / 4 < SCORE_BLOCK_MAX ? l2 / 4 : SCORE_BLOCK_MAX;
    int64_t bc_scores = score_bytes / (BR_MAX * (int64_t)sizeof(float));
    bc = bc < bc_scores ? bc : bc_scores;
    bc = bc < BC_MIN ? BC_MIN : bc > BC_MAX ? BC_MAX : bc;
    p->bc = bc / 64 * 64; /* whole panels of every kernel set (NR divides 64) */

    /* Few query rows: a task takes the rows of every query head of a kv group. */
    p->task_heads = p->group > 1 && p->L <= GROUP_L_MAX ? p->group : 1;
    p->task_slots = 1;
    const int64_t head_tasks = p->B * (p->H / p->task_heads);
    /* So few that they all fit the vector kernels' registers: one query block of every row,
     * which streams K and V (bf16 products always go through the micro-kernel, so that a
     * single row is rounded as every other is). */
    p->stream = !p->bf16 && p->task_heads * p->L <= ENG__STREAM_ROWS;
    if (p->stream) {
        p->br = p->L;
        p->nqb = 1;
        p->task_slots = stream_slots(p, threads);
        plan_chunks(p, threads);
        return;
    }

    /* Rows: a whole head's (whole_heads), or about BR_MAX, spread evenly; smaller when that is
     * what it takes to give every worker a task. */
    int64_t nqb = whole_heads(p, head_tasks, threads, l2) ? 1 : ceil_div(p->L, BR_MAX);
    while (head_tasks * nqb < threads && ceil_div(p->L, nqb + 1) >= BR_MIN)
        nqb++;
    p->br = ceil_div(p->L, nqb);
    /* Whole register tiles: a ragged tile in every block would run the micro-kernel on padding
     * rows once per block (1/22 of the work at Br = 256 with 12-row tiles); rounded up, only
     * the last block of a head may be ragged. */
    int64_t tile = p->ks->tile ? p->ks->mr : 1;
    if (p->br > tile)
        p->br = ceil_div(p->br, tile) * tile;
    p->nqb = ceil_div(p->L, p->br);
    plan_chunks(p, threads);
}

/* Scratch of one task: the score block and the running max and sum of each row; then the
 * GEMM's packing space (for K^T blocks of D x Bc and V blocks of Bc x Dv, when a product packs
 * its own B); then one key block's K^T and V panels, for the query panels of attend_block to
 * share when K and V were not packed before the call. Every part starts 64-byte aligned, as the
 * micro-kernels' panel loads need. */
static size_t align16(size_t floats)
{
    return (floats + 15) / 16 * 16;
}

/* Query heads of a task: its slots' heads. */
static int64_t task_head_count(const plan *p)
{
    return p->task_heads * p->task_slots;
}

/* Query rows of a task: br rows of each of its heads. */
static int64_t task_rows(const plan *p)
{
    return task_head_count(p) * p->br;
}

/* Query rows per panel: the micro-kernel's tile height, so that a panel's scores stay in L1
 * from the first product through the softmax to the second, and the causal diagonal is cut
 * at tile granularity. */
static int64_t panel_rows(const plan *p)
{
    return p->ks->panel_rows;
}

/* Rows of a task's score block: a panel's, which every panel of the task overwrites in turn;
 * a query block's when weights are asked for (their pass scores a whole block at once); or,
 * when the task streams, every row of every head of a slot at once. */
static int64_t score_rows(const plan *p)
{
    if (p->stream)
        return p->task_heads * p->br;
    return p->a->weights_mode == ENG_WEIGHTS_NONE ? panel_rows(p) : p->br;
}

static size_t task_head_floats(const plan *p)
{
    return align16((size_t)(score_rows(p) * p->bc + 2 * task_rows(p)));
}

static size_t task_pack_floats(const plan *p)
{
    size_t pack_k = eng__sgemm_pack_floats(p->ks, p->bc, p->D);
    size_t pack_v = eng__sgemm_pack_floats(p->ks, p->Dv, p->bc);
    return align16(pack_k > pack_v ? pack_k : pack_v);
}

/* bf16 elements rounded up to whole 64-byte lines, as the micro-kernel's panel loads need. */
static size_t align32(size_t elems)
{
    return (elems + 31) / 32 * 32;
}

/* bf16 areas, in elements: Q rows of a task (whole tiles, and one more tile so that a tile
 * may start at any row), one panel of P, and one block's K and V pair panels. */
static size_t q16_elems(const plan *p)
{
    int64_t mr = p->ks->mr;
    return align32((size_t)(((task_rows(p) + mr - 1) / mr * mr + mr) * p->dp));
}

static size_t p16_elems(const plan *p)
{
    return align32((size_t)(p->ks->mr * (p->bc + 1) / 2 * 2));
}

static size_t k16_elems(const plan *p)
{
    return align32(eng__bf16_panels_elems(p->ks->nr, p->bc, p->D));
}

/* Whether the task's key blocks go through the micro-kernel's panels. */
static bool task_packs(const plan *p)
{
    return p->ks->tile && !p->stream;
}

/* Whether o += P V reads V's fp32 rows where they lie, so that V is never packed (packing it
 * is a copy of V through memory: 10% of a 256 x 8192 cross-attention). The avx512 set's wide
 * tile reads rows at any stride, but only rows that start on cache lines (or every load reads
 * two) and follow one another (padded at most to a whole line: a block of keys is then one run
 * of memory) are sure to pay: a head's rows far apart, as in [B, S, H, D] memory, fall into few
 * cache sets (an E = 512 layer's heads as views of its [L, E] projections measured no faster
 * read that way than over packed panels; mha.c now writes them head-major). Not for bf16 (V is
 * rounded as it is packed), 16-bit views (packed from their bits) or a paged cache (its prepacked
 * blocks span cache blocks, whose rows are not contiguous). */
static bool values_in_place(const plan *p)
{
    const eng_view *v = &p->a->v;
    bool lines = (uintptr_t)v->data % 64 == 0;
    for (int d = 0; d < 2; d++)
        lines = lines && (v->ne[d] == 1 || v->stride[d] % 16 == 0);
    lines = lines && (v->ne[2] == 1 || v->stride[2] == (v->ne[3] + 15) / 16 * 16);
    return task_packs(p) && p->ks->wide.rows && !p->bf16 && !p->kv16 && !p->kv && lines;
}

static size_t fp32_panels_floats(const plan *p)
{
    return align16(eng__sgemm_panels_floats(p->ks, p->bc, p->D)) +
           (p->v_in_place ? 0 : align16(eng__sgemm_panels_floats(p->ks, p->Dv, p->bc)));
}

/* Emulated bf16: the task's Q rows rounded, in fp32 (whole tiles, and one more tile). */
static size_t qf_floats(const plan *p)
{
    int64_t mr = p->ks->mr;
    return align16((size_t)(((task_rows(p) + mr - 1) / mr * mr + mr) * p->D));
}

static size_t task_panels_floats(const plan *p)
{
    if (!task_packs(p)) /* openblas or streaming: only bf16 Q rows, widened */
        return p->q16 ? qf_floats(p) : 0;
    if (p->bf16_native) {
        size_t elems = q16_elems(p) + p16_elems(p) + k16_elems(p) +
                       eng__bf16_panels_elems(p->ks->nr, p->Dv, p->bc);
        return align16((elems + 1) / 2);
    }
    return fp32_panels_floats(p) + (p->bf16 || p->q16 ? qf_floats(p) : 0);
}

/* Whether a task widens 16-bit K and V rows into its scratch: a paged cache's that the
 * micro-kernels multiply, and bf16 views that cblas reads; bf16 views that the micro-kernels
 * read are packed from their bits, and streaming reads 16-bit rows in place. */
static bool task_widens(const plan *p)
{
    return p->kv16 && !p->stream && (p->kv || !p->ks->tile);
}

/* A block's K and V rows widened to fp32, for the products that read fp32. */
static size_t task_widen_floats(const plan *p)
{
    return task_widens(p) ? align16((size_t)(p->bc * p->D)) + align16((size_t)(p->bc * p->Dv)) : 0;
}

static size_t task_scratch_floats(const plan *p)
{
    return task_head_floats(p) + task_pack_floats(p) + task_panels_floats(p) + task_widen_floats(p);
}

/* The GEMM packing space inside a task's scratch block s. */
static float *task_pack(const plan *p, const float *s)
{
    return (float *)s + task_head_floats(p);
}

/* The key block panels' space inside a task's scratch block s. */
static float *task_panels(const plan *p, const float *s)
{
    return task_pack(p, s) + task_pack_floats(p);
}

/* The widened rows of a 16-bit cache block come last. */
static float *task_widen(const plan *p, const float *s)
{
    return task_panels(p, s) + task_panels_floats(p);
}

/* Emulated bf16, or bf16 Q rows for fp32 products: the task's rounded (or widened) Q rows
 * follow the fp32 block panels. */
static float *task_qf(const plan *p, const float *s)
{
    return task_panels(p, s) + (task_packs(p) ? fp32_panels_floats(p) : 0);
}

/* With native bf16, the panel space holds the task's Q rows, a P panel, then the block's K and
 * V panels. */
static uint16_t *task_q16(const plan *p, const float *s)
{
    return (uint16_t *)task_panels(p, s);
}

static uint16_t *task_p16(const plan *p, const float *s)
{
    return task_q16(p, s) + q16_elems(p);
}

static uint16_t *task_kv16(const plan *p, const float *s)
{
    return task_p16(p, s) + p16_elems(p);
}

/* ---- Visibility -------------------------------------------------------------------------------
 */

/* Keys [lo, hi) that query row i of batch b may see by position and length (masks and padding
 * come on top), within the batch's keys: a window that starts past them leaves lo = hi = their
 * end, never a range among the open tail keys (whose padding bytes do not exist). Both bounds
 * never decrease as i grows, which block skipping relies on. */
static inline void row_range(const plan *p, int64_t b, int64_t i, int64_t *lo, int64_t *hi)
{
    const eng_sdpa_args *a = p->a;
    int64_t pos = i + p->offset;
    const int64_t end = a->kv_lengths ? a->kv_lengths[b] : p->S_main;
    int64_t l = 0, h = end;
    if (a->causal && pos + 1 < h)
        h = pos + 1;
    if (a->window_right_set && pos + a->window_right + 1 < h)
        h = pos + a->window_right + 1;
    if (a->window_left_set && pos - a->window_left > l)
        l = pos - a->window_left < end ? pos - a->window_left : end;
    *lo = l;
    *hi = h > l ? h : l;
}

/* True when every key of [j0, j1) is padding for batch b. */
static bool all_padding(const plan *p, int64_t b, int64_t j0, int64_t j1)
{
    const uint8_t *pad = p->a->key_padding + b * p->a->key_padding_stride;
    for (int64_t j = j0; j < j1; j++)
        if (!pad[j])
            return false;
    return true;
}

/* ---- Score block ------------------------------------------------------------------------------
 */

/* The prepacked K^T panels of keys [j0, ...) of (b, kv head hk), or NULL when K is packed per
 * block (no prepacking, or j0 not on a panel boundary, as a window's left edge may be). */
static const float *key_panels(const plan *p, int64_t b, int64_t hk, int64_t j0)
{
    if (!p->kpack || j0 % p->ks->nr != 0)
        return NULL;
    return p->kpack + (b * p->Hkv + hk) * p->kpack_head + j0 / p->ks->nr * p->D * p->ks->nr;
}

/* The same for bf16 pair panels; V's must start on a whole pair. */
static const uint16_t *key_panels16(const plan *p, int64_t b, int64_t hk, int64_t j0)
{
    if (!p->kpack16 || j0 % p->ks->nr != 0)
        return NULL;
    return p->kpack16 + (b * p->Hkv + hk) * p->kpack_head +
           j0 / p->ks->nr * eng__bf16_panel_stride(p->ks->nr, p->D);
}

static const uint16_t *value_panels16(const plan *p, int64_t b, int64_t hk, int64_t j0)
{
    if (!p->vpack16 || j0 % 2 != 0)
        return NULL;
    return p->vpack16 + (b * p->Hkv + hk) * p->vpack_head + j0 * p->ks->nr;
}

/* The prepacked V panels from key j0 (its depth rows) of (b, kv head hk), or NULL. */
static const float *value_panels(const plan *p, int64_t b, int64_t hk, int64_t j0)
{
    if (!p->vpack)
        return NULL;
    return p->vpack + (b * p->Hkv + hk) * p->vpack_head + j0 * p->ks->nr;
}

/* One key block's operands for the products, as every query panel of the block reads them:
 * its rows where they are (kr, vr: fp32 rows of keys and values from the block's first key,
 * row strides ldk and ldv; or kh, vh: the 16-bit rows of a bf16/f16 cache, which the dot
 * products of one or two query rows read in place), and for the micro-kernels the K^T panels
 * (NR keys each, D deep, panel stride D NR) and V panels (NR columns of Dv each, one row per
 * key, panel stride v_stride), or their bf16 pair panels. */
typedef struct {
    const float *kr, *vr;
    int64_t ldk, ldv;
    const uint16_t *kh, *vh;
    const float *k, *v;
    int64_t v_stride;
    const uint16_t *k16, *v16; /* bf16 pair panels instead, when bf16 */
    int64_t k16_stride, v16_stride;
} block_panels;

/* s[rows x cols] (row stride lds) = scale * q k^T with the avx512 set's wide tile over pairs of
 * the K^T panels at k (64 keys, D deep, per call): each query element broadcast feeds four
 * FMAs, and a tile of few rows (one or two, or a ragged panel's last) computes 6, not 12. */
static void scores_wide_gemm(const plan *p, const float *q, int64_t ldq, int64_t rows,
                             const float *k, int64_t cols, float *s, int64_t lds)
{
    const int64_t nr = p->ks->nr, mr = p->ks->wide.mr, panel = p->D * nr;
    for (int64_t j = 0; j < cols; j += 2 * nr) {
        int64_t n = cols - j < 2 * nr ? cols - j : 2 * nr;
        for (int64_t r = 0; r < rows; r += mr)
            p->ks->wide.packed(p->D, q + r * ldq, ldq, k + j / nr * panel, n > nr ? panel : 0,
                               s + r * lds + j, lds, p->scale, 0.0f,
                               (int)(rows - r < mr ? rows - r : mr), (int)n);
    }
}

/* s[rows x cols] (row stride lds) = scale * q k^T for keys [c0, c0 + cols) of block bp by the
 * kernel set's GEMM, reading K^T from the block's panels when it has them (the micro-kernels'
 * packed layout; the avx512 set's wide tile reads them directly) or else packing it into
 * `pack`. */
static void scores_gemm(const plan *p, const float *q, int ldq, int64_t rows,
                        const block_panels *bp, int64_t c0, int64_t cols, float *s, int64_t lds,
                        float *pack)
{
    const int64_t ldk = bp->ldk;
    const float *k = bp->kr ? bp->kr + c0 * ldk : NULL; /* NULL: the panels have them */
    const int64_t nr = p->ks->nr;
    if (bp->k && p->ks->wide.packed) {
        scores_wide_gemm(p, q, ldq, rows, bp->k + c0 / nr * p->D * nr, cols, s, lds);
        return;
    }
    eng__gemm g = {.m = rows,
                   .n = cols,
                   .k = p->D,
                   .alpha = p->scale,
                   .beta = 0.0f,
                   .a = q,
                   .lda = ldq,
                   .b = k,
                   .ldb = ldk,
                   .b_trans = true,
                   .c = s,
                   .ldc = lds,
                   .b_packed = bp->k ? bp->k + c0 / nr * p->D * nr : NULL,
                   .b_panel_stride = p->D * nr};
    eng__sgemm(p->ks, &g, pack);
}

/* o[rows x Dv] += s[rows x cols] v[cols x Dv] for keys [c0, c0 + cols) of block bp, P (row
 * stride lds) read where the softmax left it; V from the block's panels when it has them, else
 * packed into `pack`. */
static void values_gemm(const plan *p, const float *s, int64_t lds, int64_t rows, int64_t cols,
                        const block_panels *bp, int64_t c0, float *o, int64_t ldo, float *pack)
{
    const float *v = bp->vr ? bp->vr + c0 * bp->ldv : NULL;
    eng__gemm g = {.m = rows,
                   .n = p->Dv,
                   .k = cols,
                   .alpha = 1.0f,
                   .beta = 1.0f,
                   .a = s,
                   .lda = lds,
                   .b = v,
                   .ldb = bp->ldv,
                   .b_trans = false,
                   .c = o,
                   .ldc = ldo,
                   .b_packed = bp->v ? bp->v + c0 * p->ks->nr : NULL,
                   .b_panel_stride = bp->v_stride};
    eng__sgemm(p->ks, &g, pack);
}

/* s[rows x cols] = v . tanh(W_q q_i + W_k k_j) from the projected queries and keys. */
static void additive_scores(const plan *p, int64_t b, int64_t h, int64_t i0, int64_t rows,
                            int64_t j0, int64_t cols, float *s, int64_t lds)
{
    int64_t A = p->a->additive_dim;
    const float *qa = p->add_q + ((b * p->H + h) * p->L + i0) * A;
    const float *ka = p->add_k + ((b * p->Hkv + h / p->group) * p->S + j0) * A;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            s[r * lds + c] = p->vec->tanh_dot(qa + r * A, ka + c * A, p->a->additive_v, A);
}

static void add_alibi(const plan *p, int64_t h, int64_t i0, int64_t rows, int64_t j0, int64_t cols,
                      float *s)
{
    float slope = p->slopes[h];
    for (int64_t r = 0; r < rows; r++) {
        int64_t pos = i0 + r + p->offset;
        float *row = s + r * cols;
        for (int64_t c = 0; c < cols; c++) {
            int64_t dist = pos - (j0 + c);
            row[c] -= slope * (float)(dist < 0 ? -dist : dist);
        }
    }
}

static void apply_attn_mask(const plan *p, int64_t b, int64_t h, int64_t i0, int64_t rows,
                            int64_t j0, int64_t cols, float *s)
{
    const eng_mask *m = &p->a->attn_mask;
    int64_t base = (m->ne[0] > 1 ? b * m->stride[0] : 0) + (m->ne[1] > 1 ? h * m->stride[1] : 0);
    int64_t rs = m->ne[2] > 1 ? m->stride[2] : 0, cs = m->ne[3] > 1 ? m->stride[3] : 0;
    for (int64_t r = 0; r < rows; r++) {
        float *row = s + r * cols;
        int64_t at = base + (i0 + r) * rs + j0 * cs;
        if (m->kind == ENG_MASK_FLOAT) {
            const float *mf = (const float *)m->data + at;
            for (int64_t c = 0; c < cols; c++)
                row[c] += mf[c * cs];
        } else {
            const uint8_t *mb = (const uint8_t *)m->data + at;
            for (int64_t c = 0; c < cols; c++)
                if (!mb[c * cs])
                    row[c] = -INFINITY;
        }
    }
}

static void apply_padding(const plan *p, int64_t b, int64_t rows, int64_t j0, int64_t cols,
                          float *s)
{
    const uint8_t *pad = p->a->key_padding + b * p->a->key_padding_stride + j0;
    for (int64_t c = 0; c < cols; c++) {
        if (!pad[c])
            continue;
        for (int64_t r = 0; r < rows; r++)
            s[r * cols + c] = -INFINITY;
    }
}

/* Hides keys outside each row's position range, for blocks that straddle a boundary. */
static void apply_ranges(const plan *p, int64_t b, int64_t i0, int64_t rows, int64_t j0,
                         int64_t cols, float *s)
{
    for (int64_t r = 0; r < rows; r++) {
        int64_t lo, hi;
        row_range(p, b, i0 + r, &lo, &hi);
        int64_t first = clamp64(lo - j0, 0, cols), end = clamp64(hi - j0, first, cols);
        float *row = s + r * cols;
        for (int64_t c = 0; c < first; c++)
            row[c] = -INFINITY;
        for (int64_t c = end; c < cols; c++)
            row[c] = -INFINITY;
    }
}

/* What a key block needs on top of its scores. */
typedef enum {
    KEYS_INSIDE,   /* every row may see every key by position: masks and biases only */
    KEYS_BOUNDARY, /* straddles a causal/window/length boundary: per-row ranges as well */
    KEYS_TAIL,     /* appended keys that every row sees: no positions, no masks */
} key_kind;

/* Everything that modifies the scores of query row i after the product: softcap, ALiBi, the
 * attention mask, padding and the position range; invisible entries become -inf. One row at a
 * time, so that the row is still in L1 for the softmax that follows. */
static void bias_row(const plan *p, int64_t b, int64_t h, int64_t i, int64_t j0, int64_t cols,
                     key_kind kind, float *row)
{
    const eng_sdpa_args *a = p->a;
    if (a->softcap > 0.0f)
        p->vec->softcap(row, cols, a->softcap);
    if (kind == KEYS_TAIL)
        return;
    if (a->alibi)
        add_alibi(p, h, i, 1, j0, cols, row);
    if (a->attn_mask.kind != ENG_MASK_NONE)
        apply_attn_mask(p, b, h, i, 1, j0, cols, row);
    if (a->key_padding)
        apply_padding(p, b, 1, j0, cols, row);
    if (kind == KEYS_BOUNDARY)
        apply_ranges(p, b, i, 1, j0, cols, row);
}

/* ---- Attention over a key range ---------------------------------------------------------------
 */

/* The keys that rows [i0, i0+rows) may see by position, within [kbeg, kend). */
typedef struct {
    int64_t lo, hi;           /* keys any row may see */
    int64_t full_lo, full_hi; /* keys every row sees */
} key_span;

static key_span rows_span(const plan *p, int64_t b, int64_t i0, int64_t rows, int64_t kbeg,
                          int64_t kend)
{
    int64_t lo0, hi0, lo1, hi1;
    row_range(p, b, i0, &lo0, &hi0);
    row_range(p, b, i0 + rows - 1, &lo1, &hi1);
    key_span k = {lo0 > kbeg ? lo0 : kbeg, hi1 < kend ? hi1 : kend, lo1, hi0};
    return k;
}

/* Stops the request on a non-finite score (NaN or +inf from q, k or a mask). */
static eng_status nonfinite(plan *p)
{
    atomic_store(&p->nonfinite, true);
    return ENG_ENONFINITE;
}

/* A row that has seen no key before this block: two passes, the maximum then the
 * exponentials, which set the row's reference maximum m and its sum l. */
static eng_status first_block_row(plan *p, float *row, int64_t cols, float *m, float *l)
{
    float mb = p->vec->max(row, cols);
    if (mb == -INFINITY) { /* still nothing visible: this row adds nothing */
        memset(row, 0, (size_t)cols * sizeof(float));
        return ENG_OK;
    }
    if (!isfinite(mb))
        return nonfinite(p);
    *l = p->vec->exp_sum(row, cols, mb);
    *m = mb;
    return ENG_OK;
}

/* True when block j0's panels come prepacked: a paged cache's block may then span cache
 * blocks (block_cols), and its rows are never read. */
static bool block_prepacked(const plan *p, int64_t j0)
{
    return (p->kpack || p->kpack16) && j0 % p->ks->nr == 0;
}

/* The keys from j0 that one block takes: at most Bc, up to `to`, and, from a paged cache,
 * within one cache block (rows are contiguous only inside a block), unless the block comes
 * from the call's prepacked panels (which span the cache blocks: they are whole for any j0 on
 * a panel boundary, and cache blocks then hold whole panels). */
static int64_t block_cols(const plan *p, int64_t j0, int64_t to)
{
    int64_t cols = to - j0 < p->bc ? to - j0 : p->bc;
    if (p->kv && !block_prepacked(p, j0)) {
        int64_t left = p->kv->block_tokens - j0 % p->kv->block_tokens;
        cols = cols < left ? cols : left;
    }
    return cols;
}

/* Where the K and V rows of key j0 of (b, kv head hk) are, and their row strides (elements of
 * the source's type); from a paged cache the rows run on to the end of j0's cache block. */
static void source_rows(const plan *p, int64_t b, int64_t hk, int64_t j0, const void **k,
                        int64_t *ldk, const void **v, int64_t *ldv)
{
    const eng_sdpa_args *a = p->a;
    if (!p->kv) {
        *k = p->kv16 ? (const void *)row_ptr16(a->k16, &a->k, b, hk, j0)
                     : (const void *)row_ptr(&a->k, b, hk, j0);
        *v = p->kv16 ? (const void *)row_ptr16(a->v16, &a->v, b, hk, j0)
                     : (const void *)row_ptr(&a->v, b, hk, j0);
        *ldk = ld_of(&a->k);
        *ldv = ld_of(&a->v);
        return;
    }
    const int64_t T = p->kv->block_tokens, t = j0 % T;
    const size_t elem = p->kv16 ? sizeof(uint16_t) : sizeof(float);
    const char *block = p->kv->blocks[j0 / T];
    *k = block + (size_t)((hk * T + t) * p->D) * elem;
    *v = block + (size_t)(p->Hkv * T * p->D + (hk * T + t) * p->Dv) * elem;
    *ldk = p->D;
    *ldv = p->Dv;
}

/* n 16-bit values to fp32 (exact). */
static void widen(eng_dtype dtype, const uint16_t *x, int64_t n, float *dst)
{
    if (dtype == ENG_DTYPE_F16) {
        for (int64_t i = 0; i < n; i++)
            dst[i] = eng_f16_to_f32(x[i]);
    } else {
        for (int64_t i = 0; i < n; i++) {
            uint32_t bits = (uint32_t)x[i] << 16;
            memcpy(&dst[i], &bits, sizeof bits);
        }
    }
}

/* `rows` rows of n 16-bit values (row stride ld) to fp32 rows of n at dst (exact). */
static void widen_rows(eng_dtype dtype, const uint16_t *x, int64_t ld, int64_t rows, int64_t n,
                       float *dst)
{
    if (ld == n) {
        widen(dtype, x, rows * n, dst);
        return;
    }
    for (int64_t r = 0; r < rows; r++)
        widen(dtype, x + r * ld, n, dst + r * n);
}

/* The bf16 pair panels of the block, prepacked or packed into `area`. */
static void pack_block16(const plan *p, int64_t b, int64_t hk, int64_t j0, int64_t cols,
                         uint16_t *area, block_panels *bp)
{
    const int64_t nr = p->ks->nr;
    bp->k16_stride = eng__bf16_panel_stride(nr, p->D);
    bp->k16 = key_panels16(p, b, hk, j0);
    if (!bp->k16) {
        if (bp->kr)
            eng__bf16_pack_panels(nr, bp->kr, bp->ldk, true, p->D, cols, area);
        else
            eng__bf16_pack_panels16(nr, bp->kh, bp->ldk, true, p->D, cols, area);
        bp->k16 = area;
    }
    bp->v16 = value_panels16(p, b, hk, j0);
    bp->v16_stride = eng__bf16_panel_stride(nr, p->S);
    if (!bp->v16) {
        uint16_t *v_area = area + k16_elems(p);
        if (bp->vr)
            eng__bf16_pack_panels(nr, bp->vr, bp->ldv, false, cols, p->Dv, v_area);
        else
            eng__bf16_pack_panels16(nr, bp->vh, bp->ldv, false, cols, p->Dv, v_area);
        bp->v16 = v_area;
        bp->v16_stride = eng__bf16_panel_stride(nr, cols);
    }
}

/* The panels of keys [j0, j0+cols) of (b, kv head hk) from their rows in bp: the call's
 * prepacked ones where it has them, else packed once here into the block panel space of the
 * task's scratch s. */
static void pack_block(const plan *p, int64_t b, int64_t hk, int64_t j0, int64_t cols,
                       const float *s, block_panels *bp)
{
    if (p->bf16_native) {
        pack_block16(p, b, hk, j0, cols, task_kv16(p, s), bp);
        return;
    }
    float *area = task_panels(p, s);
    bp->k = key_panels(p, b, hk, j0);
    if (!bp->k && !p->add_q) { /* additive scoring never multiplies K */
        if (bp->kr)
            eng__sgemm_pack_panels(p->ks, bp->kr, bp->ldk, true, p->D, cols, area);
        else
            eng__sgemm_pack_panels16(p->ks, bp->kh, bp->ldk, true, p->D, cols, area);
        if (p->bf16)
            p->ks->round_bf16(area, (int64_t)eng__sgemm_panels_floats(p->ks, cols, p->D));
        bp->k = area;
        area += align16(eng__sgemm_panels_floats(p->ks, cols, p->D));
    }
    bp->v = value_panels(p, b, hk, j0);
    bp->v_stride = p->S * p->ks->nr;
    if (!bp->v && !p->v_in_place) {
        if (bp->vr)
            eng__sgemm_pack_panels(p->ks, bp->vr, bp->ldv, false, cols, p->Dv, area);
        else
            eng__sgemm_pack_panels16(p->ks, bp->vh, bp->ldv, false, cols, p->Dv, area);
        if (p->bf16)
            p->ks->round_bf16(area, (int64_t)eng__sgemm_panels_floats(p->ks, p->Dv, cols));
        bp->v = area;
        bp->v_stride = cols * p->ks->nr;
    }
}

/* The operands of keys [j0, j0+cols) of (b, kv head hk): their rows in place (16-bit ones
 * widened into the task's scratch s, unless the streaming kernels or the packing read them),
 * and, when the micro-kernel multiplies them, their panels. */
static block_panels block_operands(const plan *p, int64_t b, int64_t hk, int64_t j0, int64_t cols,
                                   const float *s)
{
    block_panels bp = {0};
    if (p->kv_rows)
        atomic_fetch_add_explicit(p->kv_rows, cols, memory_order_relaxed);
    const bool prepacked = block_prepacked(p, j0), panels = task_packs(p);
    /* Prepacked blocks never read their rows: from a paged cache they may span cache blocks,
     * and 16-bit rows would be widened for nothing. */
    if (!prepacked || !(p->kv || p->kv16)) {
        const void *k, *v;
        source_rows(p, b, hk, j0, &k, &bp.ldk, &v, &bp.ldv);
        if (!p->kv16) {
            bp.kr = k;
            bp.vr = v;
        } else if (p->stream || (panels && !p->kv)) {
            /* Read in place: by the streaming kernels, or packed from the bits of bf16
             * views. */
            bp.kh = k;
            bp.vh = v;
        } else {
            /* Widened: then the products are those of fp32 rows. */
            float *kw = task_widen(p, s), *vw = kw + align16((size_t)(p->bc * p->D));
            widen_rows(p->kv_dtype, k, bp.ldk, cols, p->D, kw);
            widen_rows(p->kv_dtype, v, bp.ldv, cols, p->Dv, vw);
            bp.kr = kw;
            bp.vr = vw;
            bp.ldk = p->D;
            bp.ldv = p->Dv;
        }
    }
    if (panels)
        pack_block(p, b, hk, j0, cols, s, &bp);
    return bp;
}

/* The keys [*c0, *c1) of a block of cols keys from j0 that some row of [i, i+rows) may see by
 * position, *c0 rounded down to a whole panel of NR keys (rows that cannot see the extra keys
 * mask them). False when no row sees any. Row ranges never shrink as i grows, so the first
 * row bounds the start and the last row the end. */
static bool panel_keys(const plan *p, int64_t b, int64_t i, int64_t rows, int64_t j0, int64_t cols,
                       int64_t *c0, int64_t *c1)
{
    int64_t lo, hi, lo_last, hi_last;
    row_range(p, b, i, &lo, &hi);
    row_range(p, b, i + rows - 1, &lo_last, &hi_last);
    int64_t first = clamp64(lo - j0, 0, cols), end = clamp64(hi_last - j0, 0, cols);
    *c0 = first / p->ks->nr * p->ks->nr;
    *c1 = end;
    return first < end;
}

/* s[rows x n] (row stride lds) = the products of query rows [i, i+rows) of head (b, h) and keys
 * [j0 + c0, j0 + c0 + n) of a block whose panels are bp, before anything modifies them. Row i
 * is row ti of the task whose scratch is `scratch`, where its rounded copy lives with bf16. */
static void panel_scores(const plan *p, int64_t b, int64_t h, int64_t i, int64_t rows, int64_t ti,
                         int64_t j0, int64_t c0, int64_t n, const block_panels *bp, float *s,
                         int64_t lds, const float *scratch)
{
    const eng_sdpa_args *a = p->a;
    const int64_t nr = p->ks->nr;
    float *pack = task_pack(p, scratch);
    if (p->add_q) {
        additive_scores(p, b, h, i, rows, j0 + c0, n, s, lds);
    } else if ((p->bf16 && !p->bf16_native) || (!p->bf16 && p->q16)) {
        scores_gemm(p, task_qf(p, scratch) + ti * p->D, (int)p->D, rows, bp, c0, n, s, lds, pack);
    } else if (p->bf16) {
        const uint16_t *q16 = task_q16(p, scratch) + ti * p->dp;
        eng__gemm_bf16 g = {.m = rows,
                            .n = n,
                            .kp = p->dp / 2,
                            .alpha = p->scale,
                            .beta = 0.0f,
                            .a = q16,
                            .lda = p->dp,
                            .b = bp->k16 + c0 / nr * bp->k16_stride,
                            .b_panel_stride = bp->k16_stride,
                            .c = s,
                            .ldc = lds};
        eng__sgemm_bf16(p->ks, &g);
    } else {
        scores_gemm(p, row_ptr(&a->q, b, h, i), ld_of(&a->q), rows, bp, c0, n, s, lds, pack);
    }
}

/* Whether o += P V takes the avx512 set's wide 6 x 64 tile: over V's rows in place, or over
 * fp32 V panels, 64 output columns (two panels of 32) at a time. Either way the whole key
 * range is one depth, summed in key order, so that V in place and V packed from 16-bit views
 * of the same values give the same bits. */
static bool values_wide(const plan *p, const block_panels *bp)
{
    return p->ks->wide.packed && (p->v_in_place ? bp->vr != NULL : bp->v != NULL);
}

/* o[rows x Dv] += s[rows x n] V for keys [c0, c0 + n) of block bp with the wide tile: each P
 * row is broadcast once per 64 columns of V, and the whole key range is one depth. */
static void values_wide_gemm(const plan *p, const float *s, int64_t lds, int64_t rows, int64_t n,
                             const block_panels *bp, int64_t c0, float *o, int64_t ldo)
{
    const int64_t nr = p->ks->nr, mr = p->ks->wide.mr;
    for (int64_t j = 0; j < p->Dv; j += 2 * nr) {
        const int cols = (int)(p->Dv - j < 2 * nr ? p->Dv - j : 2 * nr);
        for (int64_t r = 0; r < rows; r += mr) {
            const int m = (int)(rows - r < mr ? rows - r : mr);
            if (!bp->v) /* in place: V's rows from key c0, column j */
                p->ks->wide.rows(n, s + r * lds, lds, bp->vr + c0 * bp->ldv + j, bp->ldv,
                                 o + r * ldo + j, ldo, 1.0f, 1.0f, m, cols);
            else /* the panels of columns j.. (a last lone panel has no second) */
                p->ks->wide.packed(n, s + r * lds, lds, bp->v + j / nr * bp->v_stride + c0 * nr,
                                   cols > nr ? bp->v_stride : 0, o + r * ldo + j, ldo, 1.0f, 1.0f,
                                   m, cols);
        }
    }
}

/* o[rows x Dv] += P V for the panel's probabilities in s (row stride lds) and keys
 * [c0, c0 + n) of block bp. With bf16, P is rounded first: in place for the fp32 kernel, or
 * into the task's P panel for VDPBF16PS. */
static void panel_values(const plan *p, int64_t rows, int64_t c0, int64_t n, const block_panels *bp,
                         float *s, int64_t lds, float *o, int64_t ldo, const float *scratch)
{
    const int64_t nr = p->ks->nr;
    if (!p->bf16_native) {
        if (p->bf16)
            for (int64_t r = 0; r < rows; r++)
                p->ks->round_bf16(s + r * lds, n);
        if (values_wide(p, bp))
            values_wide_gemm(p, s, lds, rows, n, bp, c0, o, ldo);
        else
            values_gemm(p, s, lds, rows, n, bp, c0, o, ldo, task_pack(p, scratch));
        return;
    }
    uint16_t *p16 = task_p16(p, scratch);
    const int64_t np = (n + 1) / 2 * 2;
    for (int64_t r = 0; r < rows; r++)
        p->ks->to_bf16(s + r * lds, n, p16 + r * np);
    eng__gemm_bf16 g = {.m = rows,
                        .n = p->Dv,
                        .kp = np / 2,
                        .alpha = 1.0f,
                        .beta = 1.0f,
                        .a = p16,
                        .lda = np,
                        .b = bp->v16 + c0 * nr,
                        .b_panel_stride = bp->v16_stride,
                        .c = o,
                        .ldc = ldo};
    eng__sgemm_bf16(p->ks, &g);
}

/* The online-softmax update of one row of n scores, masks applied, with the row's reference
 * maximum *m and sum *l.
 *
 * After a row's first visible block, the exponentials and the block maximum come from one
 * pass, shifted by the row's reference m instead of its true running maximum: exactness only
 * needs exp(s - m) to stay in range, so a block whose maximum exceeds m by at most
 * RESCALE_SLACK simply adds to l (p <= e^SLACK), and only a larger jump (rare: a maximum that
 * arrives late) needs the row rebased: then *rebase is set, *bmax is the block maximum, and the
 * row holds nothing useful: the caller recomputes its scores and calls rebase_row. */
static eng_status softmax_row(plan *p, float *row, int64_t n, float *m, float *l, bool *rebase,
                              float *bmax)
{
    *rebase = false;
    if (*m == -INFINITY)
        return first_block_row(p, row, n, m, l);
    float sum = p->vec->exp_sum_max(row, n, *m, bmax);
    if (isnan(*bmax))
        return nonfinite(p);
    if (*bmax <= *m + RESCALE_SLACK) {
        *l += sum;
        return ENG_OK;
    }
    if (!isfinite(*bmax))
        return nonfinite(p);
    *rebase = true;
    return ENG_OK;
}

/* Rebases a row on the block maximum bmax: what it has gathered (o, l) is rescaled, and its
 * recomputed scores in `row` become exponentials of the new reference. */
static void rebase_row(plan *p, float *row, int64_t n, float bmax, float *orow, float *m, float *l)
{
    float alpha = expf(*m - bmax);
    for (int64_t d = 0; d < p->Dv; d++)
        orow[d] *= alpha;
    *l = *l * alpha + p->vec->exp_sum(row, n, bmax);
    *m = bmax;
}

/* Query rows [i, i+rows) of head (b, h) against keys [j0 + c0, j0 + c0 + n) of a block whose
 * panels are bp: the scores into s (row stride lds), the online-softmax update of the rows'
 * reference maxima m, sums l and accumulators o (row stride ldo), then o += P V. */
static eng_status attend_panel(plan *p, int64_t b, int64_t h, int64_t i, int64_t rows, int64_t ti,
                               int64_t j0, int64_t c0, int64_t n, key_kind kind,
                               const block_panels *bp, float *o, int64_t ldo, float *m, float *l,
                               float *s, int64_t lds, float *scratch)
{
    eng_status st;
    panel_scores(p, b, h, i, rows, ti, j0, c0, n, bp, s, lds, scratch);
    for (int64_t r = 0; r < rows; r++) {
        float *row = s + r * lds, bmax;
        bool rebase;
        /* Masks and biases in the same sweep as the softmax: the row stays in L1. */
        bias_row(p, b, h, i + r, j0 + c0, n, kind, row);
        if ((st = softmax_row(p, row, n, &m[r], &l[r], &rebase, &bmax)) != ENG_OK)
            return st;
        if (!rebase)
            continue;
        panel_scores(p, b, h, i + r, 1, ti + r, j0, c0, n, bp, row, lds, scratch);
        bias_row(p, b, h, i + r, j0 + c0, n, kind, row);
        rebase_row(p, row, n, bmax, o + r * ldo, &m[r], &l[r]);
    }
    panel_values(p, rows, c0, n, bp, s, lds, o, ldo, scratch);
    return ENG_OK;
}

/* Where the rows of a task's heads accumulate: head g of the task (query head h0 + g) has its
 * output rows at o + g o_step (row stride ldo), its row maxima at m + g ml_step and its sums at
 * l + g ml_step: the output view's or the split's partials, whose heads lie at fixed strides. */
typedef struct {
    float *o;
    int64_t ldo, o_step;
    float *m, *l;
    int64_t ml_step;
    int64_t row0; /* task row of the first head's first row (its Q copy, when Q is copied) */
} head_rows;

/* Query row i of head (b, h), task row t, as the streaming kernels read it: in place, or the
 * widened copy of a bf16 row in the task's scratch s. */
static const float *stream_query(const plan *p, int64_t b, int64_t h, int64_t i, int64_t t,
                                 const float *s)
{
    return p->q16 ? task_qf(p, s) + t * p->D : row_ptr(&p->a->q, b, h, i);
}

/* Whether a streaming task of nt rows goes through the bf16 pair kernels: a single row over a
 * bf16 cache (a decode step without grouped heads), whose rows the pairs read faster than
 * the multi-row kernels. Only a paged cache's: bf16 views keep the bits of fp32 views. */
static bool stream_pairs(const plan *p, int64_t nt)
{
    return nt == 1 && p->kv && p->kv_dtype == ENG_DTYPE_BF16 && p->vec->dots_bf16_pairs &&
           p->D % 32 == 0 && p->Dv % 32 == 0 && !p->add_q;
}

/* s (row stride lds) = the scores of query rows [i, i+rows) of each of `heads` heads from (b,
 * h), whose rows are q (head g's at q + g rows), against keys [j0 + c0, j0 + c0 + n) of block
 * bp (raw rows): one pass over the K rows for all of them, or the additive scores. */
static void stream_scores(const plan *p, int64_t b, int64_t h, int64_t i, int64_t rows,
                          int64_t heads, const float *const *q, const block_panels *bp, int64_t j0,
                          int64_t c0, int64_t n, bool pairs, float *s, int64_t lds)
{
    if (p->add_q) {
        for (int64_t g = 0; g < heads; g++)
            additive_scores(p, b, h + g, i, rows, j0 + c0, n, s + g * rows * lds, lds);
        return;
    }
    if (pairs) {
        p->vec->dots_bf16_pairs(q[0], bp->kh + c0 * bp->ldk, bp->ldk, n, p->D, p->scale, s);
        return;
    }
    const void *k =
        bp->kh ? (const void *)(bp->kh + c0 * bp->ldk) : (const void *)(bp->kr + c0 * bp->ldk);
    p->vec->dots_rows(q, (int)(heads * rows), k, bp->kh ? p->kv_dtype : ENG_DTYPE_F32, bp->ldk, n,
                      p->D, p->scale, s, lds);
}

/* A key block [j0, j0+cols) for the few rows [i0, i0+rows) of every head of a streaming task:
 * each K row is loaded once for the dot products of all the task's rows, each V row once for
 * all their sums, straight from the source (a cache's 16-bit rows widened as they are read);
 * nothing is packed. Task row t = g rows + r is row i0 + r of head h0 + g, with its own head
 * for ALiBi, masks and outputs. */
static eng_status stream_block(plan *p, int64_t b, int64_t h0, int64_t i0, int64_t rows, int64_t j0,
                               int64_t cols, key_kind kind, const head_rows *hr, float *s)
{
    int64_t c0 = 0, c1 = cols;
    if (kind == KEYS_BOUNDARY && !panel_keys(p, b, i0, rows, j0, cols, &c0, &c1))
        return ENG_OK;
    block_panels bp = block_operands(p, b, h0 / p->group, j0, cols, s);
    const int64_t n = c1 - c0, nt = p->task_heads * rows;
    const float *q[ENG__STREAM_ROWS];
    float *o[ENG__STREAM_ROWS];
    for (int64_t t = 0; t < nt; t++) {
        int64_t g = t / rows, r = t % rows;
        q[t] = stream_query(p, b, h0 + g, i0 + r, hr->row0 + t, s);
        o[t] = hr->o + g * hr->o_step + r * hr->ldo;
    }
    const bool pairs = bp.kh && stream_pairs(p, nt);
    stream_scores(p, b, h0, i0, rows, p->task_heads, q, &bp, j0, c0, n, pairs, s, n);
    for (int64_t t = 0; t < nt; t++) {
        int64_t g = t / rows, r = t % rows;
        float *row = s + t * n, bmax;
        float *m = hr->m + g * hr->ml_step + r, *l = hr->l + g * hr->ml_step + r;
        bool rebase;
        bias_row(p, b, h0 + g, i0 + r, j0 + c0, n, kind, row);
        eng_status st = softmax_row(p, row, n, m, l, &rebase, &bmax);
        if (st != ENG_OK)
            return st;
        if (!rebase)
            continue;
        stream_scores(p, b, h0 + g, i0 + r, 1, 1, &q[t], &bp, j0, c0, n, pairs, row, n);
        bias_row(p, b, h0 + g, i0 + r, j0 + c0, n, kind, row);
        rebase_row(p, row, n, bmax, o[t], m, l);
    }
    if (pairs) {
        p->vec->axpys_bf16_pairs(o[0], s, bp.vh + c0 * bp.ldv, bp.ldv, n, p->Dv);
        return ENG_OK;
    }
    const void *v =
        bp.vh ? (const void *)(bp.vh + c0 * bp.ldv) : (const void *)(bp.vr + c0 * bp.ldv);
    p->vec->axpys_rows(o, (int)nt, s, n, v, bp.vh ? p->kv_dtype : ENG_DTYPE_F32, bp.ldv, n, p->Dv);
    return ENG_OK;
}

/* One key block [j0, j0+cols) for the query rows [i0, i0+rows) of every head of the task (one,
 * or a kv group's): a streaming task's go through stream_block; otherwise the block's operands
 * are read, and packed, once, then each panel of rows is taken head after head against them,
 * while they are still in the cache. On a causal or window boundary each panel computes only
 * the keys its rows may see, so the part of the triangle that no row sees is never multiplied.
 * A head's panel keeps its own head index (ALiBi slope, mask, output) and its own Q rows:
 * those of head g at task row g rows. */
static eng_status attend_block(plan *p, int64_t b, int64_t h0, int64_t i0, int64_t rows, int64_t j0,
                               int64_t cols, key_kind kind, const head_rows *hr, float *s)
{
    if (p->stream)
        return stream_block(p, b, h0, i0, rows, j0, cols, kind, hr, s);
    block_panels bp = block_operands(p, b, h0 / p->group, j0, cols, s);
    const int64_t height = panel_rows(p);
    for (int64_t r0 = 0; r0 < rows; r0 += height) {
        int64_t pr = rows - r0 < height ? rows - r0 : height, c0 = 0, c1 = cols;
        /* Positions, and so the visible keys, are the same for every head. */
        if (kind == KEYS_BOUNDARY && !panel_keys(p, b, i0 + r0, pr, j0, cols, &c0, &c1))
            continue;
        for (int64_t g = 0; g < p->task_heads; g++) {
            eng_status st = attend_panel(p, b, h0 + g, i0 + r0, pr, g * rows + r0, j0, c0, c1 - c0,
                                         kind, &bp, hr->o + g * hr->o_step + r0 * hr->ldo, hr->ldo,
                                         hr->m + g * hr->ml_step + r0, hr->l + g * hr->ml_step + r0,
                                         s, cols, s);
            if (st != ENG_OK)
                return st;
        }
    }
    return ENG_OK;
}

/* What key block [j0, j0+cols) needs: under position rules (not the open tail) it is inside
 * when every row may see all of it, else on a boundary. False when every key is padding. */
static bool block_kind(const plan *p, int64_t b, int64_t j0, int64_t cols, const key_span *span,
                       bool tail, key_kind *kind)
{
    *kind = KEYS_TAIL;
    if (tail)
        return true;
    if (p->a->key_padding && all_padding(p, b, j0, j0 + cols))
        return false;
    bool inside = j0 >= span->full_lo && j0 + cols <= span->full_hi;
    *kind = inside ? KEYS_INSIDE : KEYS_BOUNDARY;
    return true;
}

/* The rows of slot `slot` of a task whose rows are hr (`rows` query rows per head). */
static head_rows slot_rows(const plan *p, const head_rows *hr, int64_t slot, int64_t rows)
{
    const int64_t first = slot * p->task_heads;
    head_rows hs = *hr;
    hs.o += first * hr->o_step;
    hs.m += first * hr->ml_step;
    hs.l += first * hr->ml_step;
    hs.row0 = hr->row0 + first * rows;
    return hs;
}

/* Keys [from, to) in blocks of Bc for the task's heads from h, slot after slot in each block;
 * under position rules (not the open tail) a block is inside when every row may see all of
 * it, else on a boundary. */
static eng_status attend_keys(plan *p, int64_t b, int64_t h, int64_t i0, int64_t rows, int64_t from,
                              int64_t to, const key_span *span, bool tail, const head_rows *hr,
                              float *s)
{
    for (int64_t j0 = from, cols; j0 < to; j0 += cols) {
        cols = block_cols(p, j0, to);
        eng_status st = eng_ctl_check(p->ctl);
        if (st != ENG_OK)
            return st;
        key_kind kind;
        if (!block_kind(p, b, j0, cols, span, tail, &kind))
            continue;
        for (int64_t slot = 0; slot < p->task_slots; slot++) {
            const head_rows hs = slot_rows(p, hr, slot, rows);
            st = attend_block(p, b, h + slot * p->task_heads, i0, rows, j0, cols, kind, &hs, s);
            if (st != ENG_OK)
                return st;
        }
    }
    return ENG_OK;
}

/* A bf16 query row as VDPBF16PS reads it: copied, with what eng__to_bf16_avx512 does to an fp32
 * row on the way (it treats denormals as zero: so does this, so that bf16 views give the bits
 * fp32 views of the same values give), and a zero after an odd row so that it reads in pairs. */
static void copy_bf16_row(const uint16_t *x, int64_t n, uint16_t *dst)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = (x[i] & 0x7F80u) ? x[i] : (uint16_t)(x[i] & 0x8000u);
    if (n % 2)
        dst[n] = 0;
}

/* With bf16, or bf16 Q rows: query rows [i0, i0+rows) of head (b, h) rounded (or copied, or
 * widened for fp32 products) into the task's Q rows from task row `first`; the rows past
 * them, which the micro-kernel reads but never stores, and the P panel are zeroed (a task of
 * several heads fills them in order, so only the last head's zeroing stays). */
static void round_queries(const plan *p, int64_t b, int64_t h, int64_t i0, int64_t rows,
                          int64_t first, float *s)
{
    const size_t end = (size_t)(first + rows);
    if (!p->bf16_native) {
        float *qf = task_qf(p, s) + first * p->D;
        for (int64_t r = 0; r < rows; r++) {
            if (p->q16)
                widen(ENG_DTYPE_BF16, row_ptr16(p->a->q16, &p->a->q, b, h, i0 + r), p->D,
                      qf + r * p->D);
            else
                memcpy(qf + r * p->D, row_ptr(&p->a->q, b, h, i0 + r),
                       (size_t)p->D * sizeof(float));
            if (p->bf16 && !p->q16) /* bf16 rows round to themselves */
                p->ks->round_bf16(qf + r * p->D, p->D);
        }
        memset(qf + rows * p->D, 0, (qf_floats(p) - end * (size_t)p->D) * sizeof(float));
        return;
    }
    uint16_t *q16 = task_q16(p, s) + first * p->dp;
    for (int64_t r = 0; r < rows; r++) {
        if (p->q16)
            copy_bf16_row(row_ptr16(p->a->q16, &p->a->q, b, h, i0 + r), p->D, q16 + r * p->dp);
        else
            p->ks->to_bf16(row_ptr(&p->a->q, b, h, i0 + r), p->D, q16 + r * p->dp);
    }
    memset(q16 + rows * p->dp, 0, (q16_elems(p) - end * (size_t)p->dp) * sizeof *q16);
    memset(task_p16(p, s), 0, p16_elems(p) * sizeof(uint16_t));
}

/* Online softmax over the visible keys of [kbeg, kend) for rows [i0, i0+rows) of the task's
 * heads from (b, h): each head's o (hr) gets the unnormalised sum of exp(s - m) v, m the row
 * maxima and l the sums. Blocks start on whole panels of NR keys from the first visible one (or
 * kbeg), so that they find their K panels among the prepacked ones; then come the open tail's
 * keys. Returns ENG_OK or why it stopped. */
static eng_status attend(plan *p, int64_t b, int64_t h, int64_t i0, int64_t rows, int64_t kbeg,
                         int64_t kend, const head_rows *hr, float *s)
{
    for (int64_t g = 0; g < task_head_count(p); g++) {
        float *o = hr->o + g * hr->o_step, *m = hr->m + g * hr->ml_step,
              *l = hr->l + g * hr->ml_step;
        for (int64_t r = 0; r < rows; r++) {
            m[r] = -INFINITY;
            l[r] = 0.0f;
            memset(o + r * hr->ldo, 0, (size_t)p->Dv * sizeof(float));
        }
        if (p->bf16 || p->q16)
            round_queries(p, b, h + g, i0, rows, g * rows, s);
    }
    eng_status st = ENG_OK;
    key_span k = rows_span(p, b, i0, rows, kbeg, kend);
    if (k.lo < k.hi) {
        int64_t from = k.lo / p->ks->nr * p->ks->nr;
        st = attend_keys(p, b, h, i0, rows, from > kbeg ? from : kbeg, k.hi, &k, false, hr, s);
    }
    int64_t tail_lo = kbeg > p->S_main ? kbeg : p->S_main;
    if (st == ENG_OK && tail_lo < kend)
        st = attend_keys(p, b, h, i0, rows, tail_lo, kend, &k, true, hr, s);
    return st;
}

/* Elements per step of scale_row: a fixed count, so that the compiler vectorises the step. */
#define SCALE_BLOCK 16

/* x[0..n) *= mul; true when some result is not finite. */
static bool scale_row(float *x, int64_t n, float mul)
{
    int bad = 0; /* an int reduction, which vectorises where a float one may not */
    int64_t d = 0;
    for (; n - d >= SCALE_BLOCK; d += SCALE_BLOCK) {
        int block = 0;
        for (int k = 0; k < SCALE_BLOCK; k++) {
            float y = x[d + k] * mul;
            x[d + k] = y;
            block |= !(fabsf(y) <= FLT_MAX);
        }
        bad |= block;
    }
    for (; d < n; d++) {
        x[d] *= mul;
        bad |= !(fabsf(x[d]) <= FLT_MAX);
    }
    return bad != 0;
}

/* Divides o by l and writes lse (when wanted); a row that saw no key becomes 0 / -inf. Flags a
 * non-finite result. */
static void finish_rows(plan *p, int64_t rows, float *o, int64_t ldo, const float *m,
                        const float *l, float *lse)
{
    for (int64_t r = 0; r < rows; r++) {
        float *orow = o + r * ldo;
        if (l[r] == 0.0f) {
            memset(orow, 0, (size_t)p->Dv * sizeof(float));
            if (lse)
                lse[r] = -INFINITY;
            continue;
        }
        if (scale_row(orow, p->Dv, 1.0f / l[r]))
            atomic_store(&p->nonfinite, true);
        if (lse)
            lse[r] = m[r] + logf(l[r]);
    }
}

/* The score block of rows [i0, i0+rows) x keys [j0, j0+cols) with everything applied, as the
 * attention computed it (with bf16: from the task's rounded Q rows and the block's panels). */
static void block_scores(const plan *p, int64_t b, int64_t h, int64_t i0, int64_t rows, int64_t j0,
                         int64_t cols, key_kind kind, float *s)
{
    block_panels bp = block_operands(p, b, h / p->group, j0, cols, s);
    if (p->stream) {
        /* Row by row as the attention computed them: the same bits whatever the rows. */
        const float *q[ENG__STREAM_ROWS];
        for (int64_t r = 0; r < rows; r++)
            q[r] = stream_query(p, b, h, i0 + r, r, s);
        const bool pairs = bp.kh && stream_pairs(p, p->task_heads * rows);
        stream_scores(p, b, h, i0, rows, 1, q, &bp, j0, 0, cols, pairs, s, cols);
    } else {
        const int64_t height = panel_rows(p);
        for (int64_t r0 = 0; r0 < rows; r0 += height) {
            int64_t pr = rows - r0 < height ? rows - r0 : height;
            panel_scores(p, b, h, i0 + r0, pr, r0, j0, 0, cols, &bp, s + r0 * cols, cols, s);
        }
    }
    for (int64_t r = 0; r < rows; r++)
        bias_row(p, b, h, i0 + r, j0, cols, kind, s + r * cols);
}

/* Writes exp(s - m) * mul / l for keys [from, to) into the weights rows (row stride S). */
static eng_status weights_keys(plan *p, int64_t b, int64_t h, int64_t i0, int64_t rows,
                               int64_t from, int64_t to, const key_span *span, bool tail,
                               const float *m, const float *l, float *w, float mul, bool accumulate,
                               float *s)
{
    for (int64_t j0 = from, cols; j0 < to; j0 += cols) {
        cols = block_cols(p, j0, to);
        eng_status st = eng_ctl_check(p->ctl);
        if (st != ENG_OK)
            return st;
        key_kind kind;
        if (!block_kind(p, b, j0, cols, span, tail, &kind))
            continue;
        block_scores(p, b, h, i0, rows, j0, cols, kind, s);
        for (int64_t r = 0; r < rows; r++) {
            if (!(l[r] > 0.0f)) /* no visible key: the row stays 0 */
                continue;
            p->vec->exp_store(s + r * cols, w + r * p->S + j0, cols, m[r], mul / l[r], accumulate);
        }
    }
    return ENG_OK;
}

/* Second pass for the weights: recompute each visible score block and write
 * exp(s - m) * mul / l into the weights rows, adding to them when `accumulate`. */
static eng_status write_weights(plan *p, int64_t b, int64_t h, int64_t i0, int64_t rows,
                                const float *m, const float *l, float *w, float mul,
                                bool accumulate, float *s)
{
    key_span span = rows_span(p, b, i0, rows, 0, p->S_main);
    eng_status st = weights_keys(p, b, h, i0, rows, span.lo, span.hi, &span, false, m, l, w, mul,
                                 accumulate, s);
    if (st == ENG_OK)
        st = weights_keys(p, b, h, i0, rows, p->S_main, p->S, &span, true, m, l, w, mul, accumulate,
                          s);
    return st;
}

/* ---- Tasks ------------------------------------------------------------------------------------
 */

/* Task index -> (b, first head h, query block). Later blocks first: under causal masking they
 * are the largest, and starting them early evens out the finish. */
static void task_coords(const plan *p, int64_t index, int64_t *b, int64_t *h, int64_t *qb)
{
    const int64_t tasks = p->H / task_head_count(p);
    *qb = p->nqb - 1 - index % p->nqb;
    index /= p->nqb;
    *h = index % tasks * task_head_count(p);
    *b = index / tasks;
}

static float *task_scratch(plan *p)
{
    float *s = eng__scratch(task_scratch_floats(p) * sizeof(float));
    if (!s)
        atomic_store(&p->no_scratch, true);
    return s;
}

/* The rows of the task's heads from (b, h), query rows from i0: the output view's, with the
 * maxima and sums in the task's scratch s. */
static head_rows output_rows(const plan *p, int64_t b, int64_t h, int64_t i0, float *s)
{
    float *m = s + score_rows(p) * p->bc;
    head_rows hr = {.o = row_ptr(&p->a->out, b, h, i0),
                    .ldo = ld_of(&p->a->out),
                    .o_step = p->a->out.stride[1],
                    .m = m,
                    .l = m + task_rows(p),
                    .ml_step = p->br};
    return hr;
}

/* finish_rows for each head of the task, with its LSE rows. */
static void finish_heads(plan *p, int64_t b, int64_t h, int64_t i0, int64_t rows,
                         const head_rows *hr)
{
    for (int64_t g = 0; g < task_head_count(p); g++) {
        float *lse = p->lse ? p->lse + (b * p->H + h + g) * p->L + i0 : NULL;
        finish_rows(p, rows, hr->o + g * hr->o_step, hr->ldo, hr->m + g * hr->ml_step,
                    hr->l + g * hr->ml_step, lse);
    }
}

/* write_weights for head g of the task; its Q rows, which the weights' scores are computed
 * from, go back to the first task rows first, where block_scores reads them. */
static eng_status head_weights(plan *p, int64_t b, int64_t h, int64_t g, int64_t i0, int64_t rows,
                               const head_rows *hr, float *w, float mul, bool accumulate, float *s)
{
    if (g > 0 && (p->bf16 || p->q16))
        round_queries(p, b, h + g, i0, rows, 0, s);
    return write_weights(p, b, h + g, i0, rows, hr->m + g * hr->ml_step, hr->l + g * hr->ml_step, w,
                         mul, accumulate, s);
}

/* Attention of one (b, query block) for the task's heads from h, with their per-head weights
 * when asked for. */
static void head_block_task(void *arg, int64_t index)
{
    plan *p = arg;
    const eng_sdpa_args *a = p->a;
    int64_t b, h, qb;
    task_coords(p, index, &b, &h, &qb);
    int64_t i0 = qb * p->br, rows = p->L - i0 < p->br ? p->L - i0 : p->br;
    float *s = task_scratch(p);
    if (!s)
        return;
    head_rows hr = output_rows(p, b, h, i0, s);
    if (attend(p, b, h, i0, rows, 0, p->S, &hr, s) != ENG_OK)
        return;
    finish_heads(p, b, h, i0, rows, &hr);
    for (int64_t g = 0; g < task_head_count(p) && a->weights_mode == ENG_WEIGHTS_PER_HEAD; g++) {
        float *w = a->weights + ((b * p->H + h + g) * p->L + i0) * p->S;
        memset(w, 0, (size_t)(rows * p->S) * sizeof(float));
        if (head_weights(p, b, h, g, i0, rows, &hr, w, 1.0f, false, s) != ENG_OK)
            return;
    }
}

/* Attention of one (b, query block) over every head, adding each head's weights / H into the
 * mean: one task owns the mean rows, so no two threads add to the same row. */
static void mean_block_task(void *arg, int64_t index)
{
    plan *p = arg;
    const eng_sdpa_args *a = p->a;
    int64_t qb = p->nqb - 1 - index % p->nqb, b = index / p->nqb;
    int64_t i0 = qb * p->br, rows = p->L - i0 < p->br ? p->L - i0 : p->br;
    float *s = task_scratch(p);
    if (!s)
        return;
    float *w = a->weights + (b * p->L + i0) * p->S;
    memset(w, 0, (size_t)(rows * p->S) * sizeof(float));
    for (int64_t h = 0; h < p->H; h += task_head_count(p)) {
        head_rows hr = output_rows(p, b, h, i0, s);
        if (attend(p, b, h, i0, rows, 0, p->S, &hr, s) != ENG_OK)
            return;
        finish_heads(p, b, h, i0, rows, &hr);
        for (int64_t g = 0; g < task_head_count(p); g++)
            if (head_weights(p, b, h, g, i0, rows, &hr, w, 1.0f / (float)p->H, true, s) != ENG_OK)
                return;
    }
}

/* Split decoding, step 1: one key chunk of one (b, query block) for the task's heads from h
 * into the partials. */
static void chunk_task(void *arg, int64_t index)
{
    plan *p = arg;
    int64_t c = index % p->chunks, bhq = index / p->chunks;
    int64_t b, h, qb;
    task_coords(p, bhq, &b, &h, &qb);
    int64_t i0 = qb * p->br, rows = p->L - i0 < p->br ? p->L - i0 : p->br;
    float *s = task_scratch(p);
    if (!s)
        return;
    /* Partials of (b, h, chunk c): o [L, Dv] then m [L] and l [L]; head h + 1's are `chunks`
     * parts further. */
    int64_t part = (b * p->H + h) * p->chunks + c;
    float *m = p->part_ml + (part * 2) * p->L + i0;
    head_rows hr = {.o = p->part_o + (part * p->L + i0) * p->Dv,
                    .ldo = p->Dv,
                    .o_step = p->chunks * p->L * p->Dv,
                    .m = m,
                    .l = m + p->L,
                    .ml_step = p->chunks * 2 * p->L};
    int64_t kbeg = c * p->chunk_len;
    int64_t kend = kbeg + p->chunk_len < p->S ? kbeg + p->chunk_len : p->S;
    attend(p, b, h, i0, rows, kbeg, kend, &hr, s);
}

/* Split decoding, step 2: merge the chunks of one (b, h) by their maxima and sums. */
static void merge_task(void *arg, int64_t index)
{
    plan *p = arg;
    const eng_sdpa_args *a = p->a;
    int64_t b = index / p->H, h = index % p->H;
    int64_t first = (b * p->H + h) * p->chunks;
    for (int64_t i = 0; i < p->L; i++) {
        float mmax = -INFINITY;
        for (int64_t c = 0; c < p->chunks; c++) {
            float mc = p->part_ml[((first + c) * 2) * p->L + i];
            mmax = mc > mmax ? mc : mmax;
        }
        float *out = row_ptr(&a->out, b, h, i);
        memset(out, 0, (size_t)p->Dv * sizeof(float));
        float lsum = 0.0f;
        if (mmax != -INFINITY) {
            for (int64_t c = 0; c < p->chunks; c++) {
                const float *ml = p->part_ml + ((first + c) * 2) * p->L;
                if (ml[i] == -INFINITY)
                    continue;
                float w = expf(ml[i] - mmax);
                lsum += w * ml[p->L + i];
                const float *oc = p->part_o + ((first + c) * p->L + i) * p->Dv;
                for (int64_t d = 0; d < p->Dv; d++)
                    out[d] += w * oc[d];
            }
        }
        float *lse = p->lse ? p->lse + (b * p->H + h) * p->L + i : NULL;
        finish_rows(p, 1, out, 0, &mmax, &lsum, lse);
    }
}

/* ---- Entry points -----------------------------------------------------------------------------
 */

static int64_t resolve_offset(const eng_sdpa_args *a)
{
    switch (a->align) {
    case ENG_ALIGN_BOTTOM_RIGHT:
        return a->k.ne[2] - a->q.ne[2];
    case ENG_ALIGN_OFFSET:
        return a->query_offset;
    case ENG_ALIGN_TOP_LEFT:
    default:
        return 0;
    }
}

/* Bytes of one prepacked element. */
static size_t prepack_elem_bytes(const plan *p)
{
    return p->bf16_native ? sizeof(uint16_t) : sizeof(float);
}

/* Packing K and V once per (b, kv head) pays when more than one task multiplies them (query
 * blocks, the query heads of a grouped-query group in tasks of their own) with the kernel
 * set's GEMM: the per-block packing it replaces cost ~9% of the time at L = 2048. Its memory is
 * about that of K and V, so it is capped: beyond PREPACK_MAX_BYTES, scratch stays O(block) and
 * tasks pack per block. */
static void plan_prepack(plan *p)
{
    p->prepack = false;
    /* Tasks that multiply each (b, kv head)'s K and V: its query blocks, times its query heads
     * unless one task takes them all. */
    if (!task_packs(p) || p->add_q || p->a->additive_w_q || p->nqb * (p->group / p->task_heads) < 2)
        return;
    /* From a paged cache, panels are packed a cache block at a time: each must hold whole
     * panels of keys. */
    if (p->kv && p->kv->block_tokens % p->ks->nr != 0)
        return;
    int64_t heads = p->B * p->Hkv, total;
    if (p->bf16_native) {
        p->kpack_head = (int64_t)align32(eng__bf16_panels_elems(p->ks->nr, p->S, p->D));
        p->vpack_head = (int64_t)eng__bf16_panels_elems(p->ks->nr, p->Dv, p->S);
    } else {
        p->kpack_head = (int64_t)eng__sgemm_panels_floats(p->ks, p->S, p->D);
        p->vpack_head = p->v_in_place ? 0 : (int64_t)eng__sgemm_panels_floats(p->ks, p->Dv, p->S);
    }
    if (__builtin_mul_overflow(heads, p->kpack_head + p->vpack_head, &total) ||
        (uint64_t)total > PREPACK_MAX_BYTES / prepack_elem_bytes(p))
        return; /* then each task packs its blocks as it goes */
    p->prepack = true;
}

/* Bytes of the prepacked K and V. */
static size_t prepack_bytes(const plan *p)
{
    if (!p->prepack)
        return 0;
    return (size_t)(p->B * p->Hkv * (p->kpack_head + p->vpack_head)) * prepack_elem_bytes(p);
}

/* Packs keys [j, j+len) of (b, kv head hk), whose rows are k and v (row strides ldk, ldv),
 * into the panels of prepack index `index`: K^T panels from panel j / NR on, and in each V
 * panel the depth rows from j on (prepacking from a paged cache is planned only when its
 * blocks hold whole panels of keys). */
static void prepack_range(plan *p, int64_t index, int64_t j, int64_t len, const float *k,
                          int64_t ldk, const float *v, int64_t ldv)
{
    const int64_t nr = p->ks->nr;
    if (p->bf16_native) {
        const int64_t vstride = eng__bf16_panel_stride(nr, p->S);
        eng__bf16_pack_panels(nr, k, ldk, true, p->D, len,
                              p->kpack16 + index * p->kpack_head +
                                  j / nr * eng__bf16_panel_stride(nr, p->D));
        for (int64_t q = 0; q < p->Dv; q += nr)
            eng__bf16_pack_panels(nr, v + q, ldv, false, len, p->Dv - q < nr ? p->Dv - q : nr,
                                  p->vpack16 + index * p->vpack_head + q / nr * vstride + j * nr);
        return;
    }
    eng__sgemm_pack_panels(p->ks, k, ldk, true, p->D, len,
                           p->kpack + index * p->kpack_head + j / nr * p->D * nr);
    for (int64_t q = 0; p->vpack && q < p->Dv; q += nr)
        eng__sgemm_pack_panels(p->ks, v + q, ldv, false, len, p->Dv - q < nr ? p->Dv - q : nr,
                               p->vpack + index * p->vpack_head + q / nr * p->S * nr + j * nr);
}

/* The prepacked panels of (b, kv head) `index` from the bits of bf16 views (all S keys at
 * once: their rows are strided, not split into cache blocks): K^T, then each V panel. */
static void prepack_views16(plan *p, int64_t index, const uint16_t *k, int64_t ldk,
                            const uint16_t *v, int64_t ldv)
{
    const int64_t nr = p->ks->nr;
    if (p->bf16_native)
        eng__bf16_pack_panels16(nr, k, ldk, true, p->D, p->S, p->kpack16 + index * p->kpack_head);
    else
        eng__sgemm_pack_panels16(p->ks, k, ldk, true, p->D, p->S, p->kpack + index * p->kpack_head);
    for (int64_t q = 0; q < p->Dv; q += nr) {
        int64_t w = p->Dv - q < nr ? p->Dv - q : nr;
        if (p->bf16_native)
            eng__bf16_pack_panels16(nr, v + q, ldv, false, p->S, w,
                                    p->vpack16 + index * p->vpack_head +
                                        q / nr * eng__bf16_panel_stride(nr, p->S));
        else
            eng__sgemm_pack_panels16(p->ks, v + q, ldv, false, p->S, w,
                                     p->vpack + index * p->vpack_head + q / nr * p->S * nr);
    }
}

/* Packing step: K^T and V panels of one (b, kv head), a cache block at a time from a paged
 * cache (a 16-bit one widened first); bf16 views are packed from their bits (rounding them
 * again would change nothing). */
static void prepack_task(void *arg, int64_t index)
{
    plan *p = arg;
    int64_t b = index / p->Hkv, hk = index % p->Hkv;
    if (p->kv16 && !p->kv) {
        prepack_views16(p, index, row_ptr16(p->a->k16, &p->a->k, b, hk, 0), ld_of(&p->a->k),
                        row_ptr16(p->a->v16, &p->a->v, b, hk, 0), ld_of(&p->a->v));
        return;
    }
    float *wide = NULL;
    if (p->kv16) {
        wide = eng__scratch((size_t)(p->kv->block_tokens * (p->D + p->Dv)) * sizeof(float));
        if (!wide) {
            atomic_store(&p->no_scratch, true);
            return;
        }
    }
    for (int64_t j = 0, len; j < p->S; j += len) {
        len = p->S - j;
        if (p->kv && p->kv->block_tokens - j % p->kv->block_tokens < len)
            len = p->kv->block_tokens - j % p->kv->block_tokens;
        const void *k, *v;
        int64_t ldk, ldv;
        source_rows(p, b, hk, j, &k, &ldk, &v, &ldv);
        if (wide) {
            widen(p->kv->dtype, k, len * p->D, wide);
            widen(p->kv->dtype, v, len * p->Dv, wide + len * p->D);
            k = wide;
            v = wide + len * p->D;
        }
        prepack_range(p, index, j, len, k, ldk, v, ldv);
    }
    if (p->bf16 && !p->bf16_native) {
        p->ks->round_bf16(p->kpack + index * p->kpack_head, p->kpack_head);
        p->ks->round_bf16(p->vpack + index * p->vpack_head, p->vpack_head);
    }
}

static void plan_init(plan *p, const eng_sdpa_args *a, const eng__kv_paged *kv, int threads)
{
    memset(p, 0, sizeof *p);
    atomic_init(&p->nonfinite, false);
    atomic_init(&p->no_scratch, false);
    p->a = a;
    p->kv = kv;
    p->kv_dtype = kv ? kv->dtype : a->kv_dtype;
    p->kv16 = p->kv_dtype != ENG_DTYPE_F32;
    p->q16 = a->q_dtype == ENG_DTYPE_BF16;
    p->ks = eng__kernels_current();
    p->vec = p->ks->vec;
    p->B = a->q.ne[0];
    p->H = a->q.ne[1];
    p->L = a->q.ne[2];
    p->D = a->q.ne[3];
    p->Hkv = a->k.ne[1];
    p->S = a->k.ne[2];
    p->Dv = a->v.ne[3];
    p->S_main = p->S - a->open_tail_keys;
    p->group = p->H / p->Hkv;
    p->scale = a->scale_set ? a->scale : (float)(1.0 / sqrt((double)p->D));
    p->offset = resolve_offset(a);
    p->bf16 = eng_sdpa_precision(a) == ENG_PRECISION_BFLOAT16;
    p->bf16_native = p->bf16 && p->ks->tile_bf16;
    p->dp = (p->D + 1) / 2 * 2;
    plan_blocks(p, threads);
    p->v_in_place = values_in_place(p);
    plan_prepack(p);
}

/* Bytes eng_sdpa allocates on the heap for one call (besides per-thread scratch). */
static size_t plan_heap_bytes(const plan *p)
{
    size_t bytes = 0;
    if (p->a->alibi && !p->a->alibi_slopes)
        bytes += (size_t)p->H * sizeof(float);
    if (p->chunks > 1)
        bytes += (size_t)(p->B * p->H * p->chunks * p->L * (p->Dv + 2)) * sizeof(float);
    if (p->a->additive_w_q)
        bytes += (size_t)((p->B * p->H * p->L + p->B * p->Hkv * p->S) * p->a->additive_dim) *
                 sizeof(float);
    return bytes + prepack_bytes(p);
}

size_t eng_sdpa_scratch_bytes(const eng_sdpa_args *args, int threads)
{
    return eng__sdpa_paged_scratch_bytes(args, NULL, threads);
}

size_t eng__sdpa_paged_scratch_bytes(const eng_sdpa_args *args, const eng__kv_paged *kv,
                                     int threads)
{
    plan p;
    plan_init(&p, args, kv, threads > 0 ? threads : 1);
    /* One scratch block per thread that may run a task: the workers and this caller; a 16-bit
     * cache's prepacking widens one cache block per thread. */
    size_t per_thread = task_scratch_floats(&p);
    if (p.prepack && p.kv16 && p.kv)
        per_thread += (size_t)(kv->block_tokens * (p.D + p.Dv));
    return plan_heap_bytes(&p) + (size_t)(threads + 1) * per_thread * sizeof(float);
}

/* Additive scoring, step 0: W_q q for one (b, h), or W_k k for one (b, kv head). */
static void additive_project_task(void *arg, int64_t index)
{
    plan *p = arg;
    const eng_sdpa_args *a = p->a;
    int64_t A = a->additive_dim;
    bool query = index < p->B * p->H;
    int64_t heads = query ? p->H : p->Hkv, i = query ? index : index - p->B * p->H;
    int64_t b = i / heads, h = i % heads;
    const eng_view *x = query ? &a->q : &a->k;
    float *out =
        query ? p->add_q + (b * p->H + h) * p->L * A : p->add_k + (b * p->Hkv + h) * p->S * A;
    eng__gemm g = {.m = x->ne[2],
                   .n = A,
                   .k = p->D,
                   .alpha = 1.0f,
                   .beta = 0.0f,
                   .a = row_ptr(x, b, h, 0),
                   .lda = ld_of(x),
                   .b = query ? a->additive_w_q : a->additive_w_k,
                   .ldb = p->D,
                   .b_trans = true,
                   .c = out,
                   .ldc = A};
    float *pack = eng__scratch(eng__sgemm_pack_floats(p->ks, A, p->D) * sizeof(float));
    if (!pack && p->ks->tile) {
        atomic_store(&p->no_scratch, true);
        return;
    }
    eng__sgemm(p->ks, &g, pack);
}

/* The attention passes for the plan's shape of work. */
static eng_status run_attention(eng_pool *pool, plan *p)
{
    eng_status st;
    if (p->chunks > 1) {
        st = eng_pool_run(pool, chunk_task, p, attention_tasks(p) * p->chunks, p->ctl);
        if (st == ENG_OK && !atomic_load(&p->nonfinite))
            st = eng_pool_run(pool, merge_task, p, p->B * p->H, p->ctl);
    } else if (p->a->weights_mode == ENG_WEIGHTS_MEAN) {
        st = eng_pool_run(pool, mean_block_task, p, p->B * p->nqb, p->ctl);
    } else {
        st = eng_pool_run(pool, head_block_task, p, attention_tasks(p), p->ctl);
    }
    return st;
}

static eng_status run_plan(eng_pool *pool, plan *p, eng_error *err)
{
    eng_status st = ENG_OK;
    if (p->add_q)
        st = eng_pool_run(pool, additive_project_task, p, p->B * (p->H + p->Hkv), p->ctl);
    if (st == ENG_OK && (p->kpack || p->kpack16))
        st = eng_pool_run(pool, prepack_task, p, p->B * p->Hkv, p->ctl);
    if (st == ENG_OK)
        st = run_attention(pool, p);
    if (st == ENG_OK && atomic_load(&p->no_scratch))
        st = ENG_ENOMEM;
    if (st == ENG_OK && atomic_load(&p->nonfinite))
        st = ENG_ENONFINITE;
    switch (st) {
    case ENG_OK:
        return ENG_OK;
    case ENG_ENOMEM:
        return eng__fail(err, st, "", "cannot allocate %zu bytes of attention scratch",
                         task_scratch_floats(p) * sizeof(float));
    case ENG_ENONFINITE:
        return eng__fail(err, st, "",
                         "the result is not finite: q.k or the weighted sum of v overflows "
                         "float32");
    case ENG_EDEADLINE:
        return eng__fail(err, st, "", "deadline exceeded during attention");
    default:
        return eng__fail(err, st, "", "attention stopped: %s", eng_status_str(st));
    }
}

eng_precision eng_sdpa_precision(const eng_sdpa_args *a)
{
    if (a->precision == ENG_PRECISION_BFLOAT16 && !a->additive_w_q && eng__kernels_current()->tile)
        return ENG_PRECISION_BFLOAT16;
    return ENG_PRECISION_FLOAT32;
}

eng_status eng__sdpa_validate(const eng_sdpa_args *a, eng_error *err)
{
    eng_status st = check_shapes(a, err);
    return st != ENG_OK ? st : check_options(a, err);
}

/* eng__sdpa_paged, counting into kv_rows when it is not NULL. */
static eng_status sdpa_run(eng_pool *pool, const eng_sdpa_args *a, const eng__kv_paged *kv,
                           atomic_int_fast64_t *kv_rows, eng_ctl *ctl, eng_error *err)
{
    eng_status st;
    if (!pool || !a)
        return eng__fail(err, ENG_EINVAL, "", "no pool or no arguments");
    if ((st = eng__sdpa_validate(a, err)) != ENG_OK)
        return st;
    if (kv && a->kv_dtype != ENG_DTYPE_F32)
        return eng__fail(err, ENG_EINVAL, "k", "k and v come from the KV cache: leave them unset");
    if (kv && (a->additive_w_q || a->q.ne[0] != 1))
        return eng__fail(err, ENG_EINVAL, a->additive_w_q ? "additive" : "q",
                         "attention over a KV cache takes one sequence (batch 1) and dot-product "
                         "scoring");

    plan p;
    plan_init(&p, a, kv, eng_pool_threads(pool));
    p.ctl = ctl;
    p.kv_rows = kv_rows;

    float *slopes = NULL, *parts = NULL;
    p.slopes = a->alibi_slopes;
    p.lse = a->lse;
    if (a->alibi && !a->alibi_slopes) {
        slopes = malloc((size_t)p.H * sizeof(float));
        if (slopes)
            eng_alibi_default_slopes(p.H, slopes);
        p.slopes = slopes;
    }
    if (p.chunks > 1) {
        size_t outs = (size_t)(p.B * p.H * p.chunks * p.L);
        parts = malloc(outs * (size_t)(p.Dv + 2) * sizeof(float));
        p.part_o = parts;
        p.part_ml = parts ? parts + outs * (size_t)p.Dv : NULL;
    }
    float *additive = NULL;
    if (a->additive_w_q) {
        size_t nq = (size_t)(p.B * p.H * p.L * a->additive_dim);
        additive = malloc((nq + (size_t)(p.B * p.Hkv * p.S * a->additive_dim)) * sizeof(float));
        p.add_q = additive;
        p.add_k = additive ? additive + nq : NULL;
    }
    /* Without the memory for shared K and V panels, each task packs its own blocks. */
    float *packed = p.prepack ? eng_buf_alloc(prepack_bytes(&p)) : NULL;
    if (packed && p.bf16_native) {
        p.kpack16 = (uint16_t *)packed;
        p.vpack16 = p.kpack16 + p.B * p.Hkv * p.kpack_head;
    } else if (packed) {
        p.kpack = packed;
        p.vpack = p.vpack_head ? packed + p.B * p.Hkv * p.kpack_head : NULL;
    }
    if ((a->alibi && !p.slopes) || (p.chunks > 1 && !parts) || (a->additive_w_q && !additive)) {
        st = eng__fail(err, ENG_ENOMEM, "", "cannot allocate %zu bytes of attention state",
                       plan_heap_bytes(&p));
    } else {
        st = run_plan(pool, &p, err);
    }
    free(slopes);
    free(parts);
    free(additive);
    eng_buf_free(packed);
    return st;
}

eng_status eng_sdpa(eng_pool *pool, const eng_sdpa_args *a, eng_ctl *ctl, eng_error *err)
{
    return sdpa_run(pool, a, NULL, NULL, ctl, err);
}

eng_status eng__sdpa_paged(eng_pool *pool, const eng_sdpa_args *a, const eng__kv_paged *kv,
                           eng_ctl *ctl, eng_error *err)
{
    return sdpa_run(pool, a, kv, NULL, ctl, err);
}

eng_status eng__sdpa_counted(eng_pool *pool, const eng_sdpa_args *a, const eng__kv_paged *kv,
                             int64_t *kv_rows, eng_ctl *ctl, eng_error *err)
{
    atomic_int_fast64_t count;
    atomic_init(&count, 0);
    eng_status st = sdpa_run(pool, a, kv, &count, ctl, err);
    *kv_rows = atomic_load(&count);
    return st;
}
