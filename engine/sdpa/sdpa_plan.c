/*
 * sdpa_plan.c - the plan of one call, made once: the path (streaming, panels, cblas), the
 * products (fp32, bf16 native, rounded or on AMX tiles) and the source (views, 16-bit views, paged
 * cache); the work split into tasks (query blocks, grouped heads, slots, key chunks); whether K and
 * V are prepacked; and the layout of each task's scratch block.
 */
#include <math.h>
#include <string.h>

#include "engine/sdpa/plan.h"

#define BR_MAX            256 /* query rows per task */
#define BR_MIN            16  /* smallest block worth a GEMM when shrinking for parallelism */
#define BC_MIN            64  /* keys per block, bounds of the L2-derived size */
#define BC_MAX            1024
#define SCORE_BLOCK_MAX   (256 << 10) /* bytes of a task's score block, at most (plan_blocks) */
#define TASKS_PER_THREAD  4 /* below this many tasks per worker, split decode-shaped keys */
#define PREPACK_MAX_BYTES ((uint64_t)64 << 20) /* shared K and V panels, at most */
/* At most this many query rows per head, one task takes every query head of a kv group, so
 * that each K/V block is read once for the group: below it a head does fewer FLOPs per byte of
 * K and V than the cores compute per byte they read. */
#define GROUP_L_MAX 16

static int64_t ceil_div(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

/* The most chunks a split may cut the keys into: whole key blocks, 1 when there are fewer
 * than two. */
static int64_t most_chunks(const plan *p)
{
    return p->S >= 2 * p->bc ? p->S / p->bc : 1;
}

/* Decoding: too few tasks for the pool and many keys: split the keys. */
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
 * turn in each key block reads them in the order they lie. As many as leave the pool enough tasks
 * once the keys are split (plan_chunks), and one when weights are asked for (their pass goes head
 * by head, and keys are not split). */
static int64_t stream_slots(const plan *p, int threads)
{
    const bool interleaved = p->source != SDPA_PAGED && p->a->k.stride[1] < p->a->k.stride[2];
    if ((p->source != SDPA_PAGED && !interleaved) || p->a->weights_mode != ENG_WEIGHTS_NONE)
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
 * multiplies it from L2, where query blocks of their own read shared panels back from
 * memory. Not when weights are asked for (their pass scores a query
 * block at once), nor from a paged cache: blocks a task packs itself stop at each cache block
 * (block_cols), where prepacked panels span them. */
static bool whole_heads(const plan *p, int64_t head_tasks, int threads, int64_t l2)
{
    return p->a->weights_mode == ENG_WEIGHTS_NONE && p->source != SDPA_PAGED &&
           head_tasks >= (int64_t)threads * TASKS_PER_THREAD &&
           p->L <= l2 / 4 / (p->Dv * (int64_t)sizeof(float));
}

static void plan_blocks(plan *p, int threads)
{
    /* Keys per block: the K and V blocks take at most a quarter of L2, and a score block of
     * BR_MAX rows a quarter too and at most SCORE_BLOCK_MAX, so that the weights pass, which
     * scores a query block at once, finds its scores still in L2; the flash loop, which scores
     * a panel at a time, is fastest under the same bound. */
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
    const bool stream = !bf16(p) && p->task_heads * p->L <= ENG__STREAM_ROWS;
    p->path = stream ? SDPA_STREAM : p->ks->tile ? SDPA_PANELS : SDPA_BLAS;
    if (stream) {
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
     * rows once per block; rounded up, only the last block of a head may be ragged. */
    int64_t tile = p->ks->tile ? p->ks->mr : 1;
    if (p->br > tile)
        p->br = ceil_div(p->br, tile) * tile;
    p->nqb = ceil_div(p->L, p->br);
    plan_chunks(p, threads);
}

/* Whether o += P V reads V's fp32 rows where they lie, so that V is never packed (packing it
 * is a copy of V through memory). The wide tile reads rows at any stride, but only rows that
 * start on cache lines (or every load reads two) and follow one another (padded at most to a
 * whole line: a block of keys is then one run of memory) are sure to pay: a head's rows far
 * apart, as in [B, S, H, D] memory, fall into few cache sets. Not for bf16 (V is
 * rounded as it is packed), 16-bit views (packed from their bits) or a paged cache (its prepacked
 * blocks span cache blocks, whose rows are not contiguous). */
static bool values_in_place(const plan *p)
{
    const eng_view *v = &p->a->v;
    bool lines = (uintptr_t)v->data % 64 == 0;
    for (int d = 0; d < 2; d++)
        lines = lines && (v->ne[d] == 1 || v->stride[d] % 16 == 0);
    lines = lines && (v->ne[2] == 1 || v->stride[2] == (v->ne[3] + 15) / 16 * 16);
    return p->path == SDPA_PANELS && p->ks->wide.rows && !bf16(p) && !kv16(p) &&
           p->source != SDPA_PAGED && lines;
}

/* bf16 elements rounded up to whole 64-byte lines, as the micro-kernel's panel loads need. */
static size_t align32(size_t elems)
{
    return (elems + 31) / 32 * 32;
}

/* The score block, then the running max and sum of each row. */
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

/* AMX: one block's K^T and V panels, then the tiles' A rows (Q rows D deep, or P rows a
 * block's keys deep), in bf16 elements. */
static size_t amx_k_elems(const plan *p)
{
    return align32(eng__amx_panels_elems(p->bc, p->D));
}

static size_t amx_v_elems(const plan *p)
{
    return align32(eng__amx_panels_elems(p->Dv, p->bc));
}

static size_t amx_panels_floats(const plan *p)
{
    size_t elems =
        amx_k_elems(p) + amx_v_elems(p) + align32(eng__amx_a_elems(p->D > p->bc ? p->D : p->bc));
    return align16((elems + 1) / 2);
}

/* One key block's panels, of whichever products the micro-kernels run. */
static size_t block_panels_floats(const plan *p)
{
    return p->products == SDPA_BF16_AMX ? amx_panels_floats(p) : fp32_panels_floats(p);
}

static size_t task_panels_floats(const plan *p)
{
    if (p->path != SDPA_PANELS) /* openblas or streaming: only bf16 Q rows, widened */
        return p->q16 ? qf_floats(p) : 0;
    if (p->products == SDPA_BF16_NATIVE) {
        size_t elems = q16_elems(p) + p16_elems(p) + k16_elems(p) +
                       eng__bf16_panels_elems(p->ks->nr, p->Dv, p->bc);
        return align16((elems + 1) / 2);
    }
    return block_panels_floats(p) + (bf16(p) || p->q16 ? qf_floats(p) : 0);
}

/* Whether a task widens 16-bit K and V rows into its scratch: a paged cache's that the
 * micro-kernels multiply, and bf16 views that cblas reads; bf16 views that the micro-kernels
 * read are packed from their bits, and streaming reads 16-bit rows in place. */
static bool task_widens(const plan *p)
{
    return kv16(p) && p->path != SDPA_STREAM && (p->source == SDPA_PAGED || p->path == SDPA_BLAS);
}

/* A block's K and V rows widened to fp32, for the products that read fp32. */
static size_t task_widen_floats(const plan *p)
{
    return task_widens(p) ? align16((size_t)(p->bc * p->D)) + align16((size_t)(p->bc * p->Dv)) : 0;
}

/* The scratch block's parts, in the order they lie. */
static void plan_layout(plan *p)
{
    sdpa_layout *y = &p->lay;
    y->pack = task_head_floats(p);
    y->panels = y->pack + task_pack_floats(p);
    y->qf_floats = qf_floats(p);
    y->qf = y->panels + (p->path == SDPA_PANELS ? block_panels_floats(p) : 0);
    y->widen = y->panels + task_panels_floats(p);
    y->total = y->widen + task_widen_floats(p);
    y->q16_elems = q16_elems(p);
    y->p16_elems = p16_elems(p);
    y->q16 = 2 * y->panels;
    y->p16 = y->q16 + y->q16_elems;
    y->k16 = y->p16 + y->p16_elems;
    y->v16 = y->k16 + k16_elems(p);
    if (p->products == SDPA_BF16_AMX) {
        y->k16 = 2 * y->panels;
        y->v16 = y->k16 + amx_k_elems(p);
        y->p16 = y->v16 + amx_v_elems(p);
    }
}

/* Bytes of one prepacked element. */
static size_t prepack_elem_bytes(const plan *p)
{
    return p->products == SDPA_BF16_NATIVE ? sizeof(uint16_t) : sizeof(float);
}

/* Packing K and V once per (b, kv head) pays when more than one task multiplies them (query
 * blocks, the query heads of a grouped-query group in tasks of their own) with the kernel
 * set's GEMM. Its memory is about that of K and V, so it is capped: beyond PREPACK_MAX_BYTES,
 * scratch stays O(block) and tasks pack per block, as they always do for AMX tiles. */
static void plan_prepack(plan *p)
{
    p->prepack = false;
    /* Tasks that multiply each (b, kv head)'s K and V: its query blocks, times its query heads
     * unless one task takes them all. */
    if (p->path != SDPA_PANELS || p->add_q || p->a->additive_w_q || p->products == SDPA_BF16_AMX ||
        p->nqb * (p->group / p->task_heads) < 2)
        return;
    /* From a paged cache, panels are packed a cache block at a time: each must hold whole
     * panels of keys. */
    if (p->source == SDPA_PAGED && p->paged->block_tokens % p->ks->nr != 0)
        return;
    int64_t heads = p->B * p->Hkv, total;
    if (p->products == SDPA_BF16_NATIVE) {
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
size_t eng__sdpa_prepack_bytes(const plan *p)
{
    if (!p->prepack)
        return 0;
    return (size_t)(p->B * p->Hkv * (p->kpack_head + p->vpack_head)) * prepack_elem_bytes(p);
}

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

/* bf16 products need a register tile: the openblas set, and additive scoring, compute fp32. */
eng_precision eng_sdpa_precision(const eng_sdpa_args *a)
{
    if (a->precision == ENG_PRECISION_BFLOAT16 && !a->additive_w_q && eng__kernels_current()->tile)
        return ENG_PRECISION_BFLOAT16;
    return ENG_PRECISION_FLOAT32;
}

void eng__sdpa_plan_init(plan *p, const eng_sdpa_args *a, const eng__kv_paged *kv, int threads)
{
    memset(p, 0, sizeof *p);
    atomic_init(&p->nonfinite, false);
    atomic_init(&p->no_scratch, false);
    p->a = a;
    p->paged = kv;
    p->source = kv ? SDPA_PAGED : a->kv_dtype != ENG_DTYPE_F32 ? SDPA_VIEW16 : SDPA_VIEW;
    p->kv_dtype = kv ? kv->dtype : a->kv_dtype;
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
    p->amx = eng_sdpa_precision(a) == ENG_PRECISION_FLOAT32 ? ENG__AMX_OFF : eng__amx_active();
    p->products = eng_sdpa_precision(a) == ENG_PRECISION_FLOAT32 ? SDPA_FP32
                  : p->amx != ENG__AMX_OFF                       ? SDPA_BF16_AMX
                  : p->ks->tile_bf16                             ? SDPA_BF16_NATIVE
                                                                 : SDPA_BF16_ROUNDED;
    p->dp = (p->D + 1) / 2 * 2;
    plan_blocks(p, threads);
    p->v_in_place = values_in_place(p);
    plan_prepack(p);
    plan_layout(p);
}

/* Bytes eng_sdpa allocates on the heap for one call (besides per-thread scratch). */
size_t eng__sdpa_heap_bytes(const plan *p)
{
    size_t bytes = 0;
    if (p->a->alibi && !p->a->alibi_slopes)
        bytes += (size_t)p->H * sizeof(float);
    if (p->chunks > 1)
        bytes += (size_t)(p->B * p->H * p->chunks * p->L * (p->Dv + 2)) * sizeof(float);
    if (p->a->additive_w_q)
        bytes += (size_t)((p->B * p->H * p->L + p->B * p->Hkv * p->S) * p->a->additive_dim) *
                 sizeof(float);
    return bytes + eng__sdpa_prepack_bytes(p);
}
