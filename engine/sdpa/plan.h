/*
 * plan.h - what the files of scaled dot-product attention share, and nothing else of
 * engine/ includes.
 *
 * One call: sdpa.c checks the arguments, sdpa_plan.c makes a plan once (the path, the products,
 * the source and the scratch layout), and sdpa.c runs its tasks on the pool. A task takes query
 * rows of one or a few heads against the keys they can see, a key block at a time (the
 * iterator of sdpa_masks.c): its operands come from sdpa_operands.c (rows in place, widened or
 * packed into panels), and the flash loop (sdpa_flash.c) computes each panel of rows with
 * sdpa_products.c (Q K^T, masks and biases, the online softmax, P V), or a decode step streams
 * the rows instead (sdpa_stream.c). Weights are a second pass over the same blocks
 * (sdpa_weights.c). The functions here carry the eng__sdpa_ prefix.
 */
#ifndef ATTND_ENGINE_SDPA_PLAN_H
#define ATTND_ENGINE_SDPA_PLAN_H

#include <stdatomic.h>

#include "engine/kernels/amx.h"
#include "engine/kernels/kernels.h"

/* How the products run: streaming raw K and V rows through the vector kernels (few query rows
 * in all), register tiles over packed panels, or cblas_sgemm (the openblas set). */
typedef enum { SDPA_STREAM, SDPA_PANELS, SDPA_BLAS } sdpa_path;

/* The products' operands: fp32, bf16 multiplied by VDPBF16PS, bf16 values rounded for the
 * fp32 kernel, or bf16 on AMX tiles (TDPBF16PS, the hardware's or the emulation). */
typedef enum { SDPA_FP32, SDPA_BF16_NATIVE, SDPA_BF16_ROUNDED, SDPA_BF16_AMX } sdpa_products;

/* Where K and V come from: fp32 views, bf16 views (eng_sdpa_args k16, v16), or the block table
 * of a paged KV cache (any of its dtypes). */
typedef enum { SDPA_VIEW, SDPA_VIEW16, SDPA_PAGED } sdpa_source;

/* A task's scratch block, computed once per call: offsets in floats from its start (bf16
 * areas in elements). Every part starts 64-byte aligned, as the micro-kernels' loads need. */
typedef struct {
    size_t pack;   /* the GEMM's packing space (after the score block, maxima and sums) */
    size_t panels; /* one key block's K^T and V panels (or the bf16 areas below) */
    size_t qf;     /* the task's Q rows rounded (or widened) to fp32, qf_floats long */
    size_t widen;  /* a block's 16-bit K and V rows widened to fp32 */
    size_t total;
    size_t qf_floats;
    size_t q16, p16, k16, v16; /* bf16: Q rows, a P panel, K and V pair panels (elements);
                                * AMX: p16 is the tiles' A rows, k16 and v16 their B panels */
    size_t q16_elems, p16_elems;
} sdpa_layout;

/* Everything a task needs, resolved once per call. */
typedef struct {
    const eng_sdpa_args *a;
    const eng__kernels *ks; /* read once per call: a call keeps the set it started with */
    const eng__vec_ops *vec;
    eng_ctl *ctl;
    sdpa_path path;
    sdpa_products products;
    eng__amx_mode amx; /* the tile instructions of SDPA_BF16_AMX, else ENG__AMX_OFF */
    sdpa_source source;
    const eng__kv_paged *paged; /* the block table (source SDPA_PAGED), else NULL */
    eng_dtype kv_dtype;         /* of K and V rows: the table's, or the views' */
    bool q16;                   /* Q rows are bf16: copied or widened per task, never whole */
    int64_t B, H, Hkv, L, S, D, Dv, group;
    int64_t S_main; /* keys under position rules and masks; the rest are the open tail */
    float scale;
    int64_t offset; /* p_i = i + offset */
    const float *slopes;
    int64_t br, bc, nqb; /* rows per head in a task, keys per block, query blocks per head */
    int64_t task_heads;  /* query heads per slot: 1, or a kv group's (grouped decoding) */
    int64_t task_slots;  /* slots (kv heads) per task, taken in turn in each key block */
    int64_t chunks;      /* key chunks per (b, h, query block); 1 = no split */
    int64_t chunk_len;
    int64_t dp;                  /* bf16 rows of Q: D rounded up to a whole pair */
    bool v_in_place;             /* o += P V reads V's rows where they lie */
    bool prepack;                /* K and V are packed once, before the attention, and shared */
    sdpa_layout lay;             /* the task scratch */
    float *part_o;               /* split partials: [B, H, chunks, L, Dv] unnormalised outputs */
    float *part_ml;              /* and [B, H, chunks, 2, L] row maxima then sums */
    float *lse;                  /* the caller's, or NULL */
    float *add_q, *add_k;        /* additive scoring: W_q q [B, H, L, A] and W_k k [B, Hkv, S, A] */
    float *kpack, *vpack;        /* prepacked per (b, kv head): K^T panels and V panels */
    uint16_t *kpack16, *vpack16; /* the same in bf16 pair panels (SDPA_BF16_NATIVE) */
    int64_t kpack_head, vpack_head; /* elements per (b, kv head) */
    atomic_int_fast64_t *kv_rows;   /* counts the keys of every block read (tests), or NULL */
    atomic_bool nonfinite;          /* some row overflowed */
    atomic_bool no_scratch;         /* some task could not get its scratch block */
} plan;

/* Where the rows of a task's heads accumulate: head g of the task has its output rows at o +
 * g o_step (row stride ldo), its row maxima at m + g ml_step and its sums at l + g ml_step. */
typedef struct {
    float *o;
    int64_t ldo, o_step;
    float *m, *l;
    int64_t ml_step;
    int64_t row0; /* task row of the first head's first row (its Q copy, when Q is copied) */
} head_rows;

/* One task: query rows [i0, i0 + rows) of each of its heads from h in batch b, where they
 * accumulate, and its scratch block s. */
typedef struct {
    int64_t b, h, i0, rows;
    head_rows hr;
    float *s;
} sdpa_task;

/* Query rows [i, i + n) of head (b, h); task row t is row i's (where its Q copy lives). */
typedef struct {
    int64_t b, h, i, n, t;
} q_rows;

/* What a key block needs on top of its scores. */
typedef enum {
    KEYS_INSIDE,   /* every row may see every key by position: masks and biases only */
    KEYS_BOUNDARY, /* straddles a causal/window/length boundary: per-row ranges as well */
    KEYS_TAIL,     /* appended keys that every row sees: no positions, no masks */
} key_kind;

/* Keys [j0, j0 + cols) of one block, and the part [j0 + c0, j0 + c0 + n) that a panel of rows
 * computes. */
typedef struct {
    int64_t j0, cols;
    key_kind kind;
    int64_t c0, n;
} key_block;

/* The keys that some rows may see by position: [lo, hi) any row, [full_lo, full_hi) every. */
typedef struct {
    int64_t lo, hi;
    int64_t full_lo, full_hi;
} key_span;

/* The key blocks of a task's keys: those under position rules that some row may see, from a
 * whole panel, then the open tail's. */
typedef struct {
    key_span span;
    int64_t b, j0, end; /* the next block's first key, the current range's end */
    int64_t tail_lo, tail_hi;
    bool tail;
} key_blocks;

/* A row-major matrix with row stride ld. */
typedef struct {
    float *x;
    int64_t ld;
} mat;

/* One key block's operands: its rows where they are (kr, vr: fp32; kh, vh: 16-bit rows read
 * in place), and for the micro-kernels the K^T panels (NR keys each, D deep, panel stride D
 * NR) and V panels (NR columns each, one row per key, panel stride v_stride), or their bf16
 * pair panels (with AMX: eng__amx_pack_b's panels of K^T, D deep, and of V, the block's keys
 * deep). */
typedef struct {
    const float *kr, *vr;
    int64_t ldk, ldv;
    const uint16_t *kh, *vh;
    const float *k, *v;
    int64_t v_stride;
    const uint16_t *k16, *v16;
    int64_t k16_stride, v16_stride;
} block_panels;

/* ---- Small helpers ------------------------------------------------------------------------ */

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

/* The leading dimension to hand BLAS: the row stride, or the row length for a single row. */
static inline int ld_of(const eng_view *v)
{
    return (int)(v->ne[2] > 1 ? v->stride[2] : v->ne[3]);
}

static inline int64_t clamp64(int64_t x, int64_t lo, int64_t hi)
{
    return x < lo ? lo : x > hi ? hi : x;
}

/* Floats rounded up to whole 64-byte lines. */
static inline size_t align16(size_t floats)
{
    return (floats + 15) / 16 * 16;
}

/* K and V rows are bf16 or f16. */
static inline bool kv16(const plan *p)
{
    return p->kv_dtype != ENG_DTYPE_F32;
}

static inline bool bf16(const plan *p)
{
    return p->products != SDPA_FP32;
}

/* Keys of one panel of the products: a panel's keys start on a multiple of it. */
static inline int64_t key_panel(const plan *p)
{
    return p->products == SDPA_BF16_AMX ? ENG__AMX_NR : p->ks->nr;
}

/* Query heads of a task: its slots' heads. */
static inline int64_t task_head_count(const plan *p)
{
    return p->task_heads * p->task_slots;
}

/* Query rows of a task: br rows of each of its heads. */
static inline int64_t task_rows(const plan *p)
{
    return task_head_count(p) * p->br;
}

/* Tasks of (b, the task's heads, query block): the attention's, or the split's before its
 * chunks. */
static inline int64_t attention_tasks(const plan *p)
{
    return p->B * (p->H / task_head_count(p)) * p->nqb;
}

/* Rows of a task's score block: a panel's; a query block's when weights are asked for; every
 * row of every head of a slot when the task streams. */
static inline int64_t score_rows(const plan *p)
{
    if (p->path == SDPA_STREAM)
        return p->task_heads * p->br;
    return p->a->weights_mode == ENG_WEIGHTS_NONE ? p->ks->panel_rows : p->br;
}

/* ---- sdpa_plan.c -------------------------------------------------------------------------- */

/* The plan of call a (kv: the paged source, or NULL) on `threads` workers. */
void eng__sdpa_plan_init(plan *p, const eng_sdpa_args *a, const eng__kv_paged *kv, int threads);

/* Bytes a call allocates on the heap (besides per-thread scratch), and of them the
 * prepacked K and V. */
size_t eng__sdpa_heap_bytes(const plan *p);
size_t eng__sdpa_prepack_bytes(const plan *p);

/* ---- sdpa_masks.c ------------------------------------------------------------------------- */

/* The key blocks of keys [kbeg, kend) for rows [i0, i0 + rows) of batch b. */
void eng__sdpa_blocks_init(const plan *p, key_blocks *it, int64_t b, int64_t i0, int64_t rows,
                           int64_t kbeg, int64_t kend);

/* The next block with a key some row may see into *kb (c0 = 0, n = cols): false when none is
 * left, or when ctl stops the call (*st then says why). */
bool eng__sdpa_blocks_next(const plan *p, key_blocks *it, key_block *kb, eng_status *st);

/* For rows [i, i + rows) of batch b: kb's keys that some row may see by position, c0 rounded
 * down to a whole panel of keys (key_panel). False when no row sees any. */
bool eng__sdpa_panel_keys(const plan *p, int64_t b, int64_t i, int64_t rows, key_block *kb);

/* Softcap, ALiBi, the attention mask, padding and the position range on the scores `row` of
 * query row i of head (b, h) against the keys [j0 + c0, j0 + c0 + n) of kb. */
void eng__sdpa_bias_row(const plan *p, int64_t b, int64_t h, int64_t i, const key_block *kb,
                        float *row);

/* ---- sdpa_operands.c ---------------------------------------------------------------------- */

/* The operands of block kb of (b, kv head hk), rows widened or packed into the scratch s. */
block_panels eng__sdpa_block_operands(const plan *p, int64_t b, int64_t hk, const key_block *kb,
                                      const float *s);

/* With bf16 products or bf16 Q rows: the rows of q rounded (or copied, or widened) into the
 * task's Q rows of scratch s from task row q->t. */
void eng__sdpa_round_queries(const plan *p, const q_rows *q, float *s);

/* K and V of (b, kv head) `index` packed into the shared panels (a pool task). */
void eng__sdpa_prepack_task(void *arg, int64_t index);

/* W_q q of one (b, h), or W_k k of one (b, kv head) (a pool task). */
void eng__sdpa_additive_project_task(void *arg, int64_t index);

/* ---- sdpa_products.c ---------------------------------------------------------------------- */

/* s (row stride lds) = the products of rows q against the panel keys of kb with operands bp,
 * before anything modifies them; scratch is the task's. */
void eng__sdpa_panel_scores(const plan *p, const q_rows *q, const key_block *kb,
                            const block_panels *bp, mat s, const float *scratch);

/* o (accumulators of rows) += P V for the probabilities in s and the panel keys of kb. */
void eng__sdpa_panel_values(const plan *p, int64_t rows, const key_block *kb,
                            const block_panels *bp, mat s, mat o, const float *scratch);

/* The additive scores of rows q against keys [j0, j0 + n) into s. */
void eng__sdpa_additive_scores(const plan *p, const q_rows *q, int64_t j0, int64_t n, mat s);

/* The online-softmax update of one row of n scores with its reference maximum *m and sum *l;
 * *rebase set when the block maximum *bmax jumped too far (then rebase the recomputed row). */
eng_status eng__sdpa_softmax_row(plan *p, float *row, int64_t n, float *m, float *l, bool *rebase,
                                 float *bmax);

/* Rebases a row on the block maximum bmax: its accumulator orow and sum are rescaled and its
 * recomputed scores become exponentials of the new reference. */
void eng__sdpa_rebase_row(plan *p, float *row, int64_t n, float bmax, float *orow, float *m,
                          float *l);

/* ---- sdpa_stream.c ------------------------------------------------------------------------ */

/* Query row i of head (b, h), task row t, as the streaming kernels read it. */
const float *eng__sdpa_stream_query(const plan *p, const q_rows *q, const float *s);

/* Whether a streaming task of nt rows multiplies with the bf16 pair kernels. */
bool eng__sdpa_stream_pairs(const plan *p, int64_t nt);

/* s (row stride kb->n) = the scores of rows [i, i + n) of each of `heads` heads from (b, h)
 * (q: their row pointers) against the keys of kb in bp's rows. */
void eng__sdpa_stream_scores(const plan *p, const q_rows *q, int64_t heads, const float *const *qr,
                             const block_panels *bp, const key_block *kb, bool pairs, float *s);

/* One key block for the few rows of every head of a streaming task's slot. */
eng_status eng__sdpa_stream_block(plan *p, const sdpa_task *t, int64_t h0, const key_block *kb,
                                  const head_rows *hr);

/* ---- sdpa_flash.c ------------------------------------------------------------------------- */

/* Online softmax over the visible keys of [kbeg, kend) for task t's rows: each head's output
 * rows get the unnormalised sum of exp(s - m) v, with the row maxima m and sums l. */
eng_status eng__sdpa_attend(plan *p, const sdpa_task *t, int64_t kbeg, int64_t kend);

/* ---- sdpa_weights.c ----------------------------------------------------------------------- */

/* Where a weights pass writes: rows of S at w, each exp(s - m) * mul / l, added when
 * `accumulate`. */
typedef struct {
    float *w;
    float mul;
    bool accumulate;
} weights_out;

/* The weights of head g of task t (after eng__sdpa_attend has set its maxima and sums). */
eng_status eng__sdpa_head_weights(plan *p, const sdpa_task *t, int64_t g, const weights_out *out);

#endif
