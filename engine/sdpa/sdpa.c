/*
 * sdpa.c - scaled dot-product attention: the entry points, the argument checks, and the tasks
 * that run a plan (sdpa_plan.c) on the pool. plan.h tells how the parts fit.
 *
 * A task computes a block of query rows of one (batch, head), or of every head of a kv group
 * when query rows are few (decoding), against the keys they can see (sdpa_flash.c). When tasks
 * are few but keys many, the keys are split into chunks computed in parallel and merged by
 * their log-sum-exp. Weights are a second pass (sdpa_weights.c). K and V come from the
 * caller's views (eng_sdpa) or the block table of a paged KV cache (eng__sdpa_paged, for
 * engine/layers/kvcache.c).
 */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sdpa/plan.h"

/* Positions and window bounds stay far from INT64_MAX so that p_i + right + 1 cannot wrap. */
#define POSITION_LIMIT (INT64_C(1) << 60)

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

/* ---- Tasks ---------------------------------------------------------------------------- */

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
    float *s = eng__scratch(p->lay.total * sizeof(float));
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
    const sdpa_task t = {b, h, i0, rows, output_rows(p, b, h, i0, s), s};
    if (eng__sdpa_attend(p, &t, 0, p->S) != ENG_OK)
        return;
    finish_heads(p, b, h, i0, rows, &t.hr);
    for (int64_t g = 0; g < task_head_count(p) && a->weights_mode == ENG_WEIGHTS_PER_HEAD; g++) {
        const weights_out out = {a->weights + ((b * p->H + h + g) * p->L + i0) * p->S, 1.0f, false};
        memset(out.w, 0, (size_t)(rows * p->S) * sizeof(float));
        if (eng__sdpa_head_weights(p, &t, g, &out) != ENG_OK)
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
    const weights_out out = {a->weights + (b * p->L + i0) * p->S, 1.0f / (float)p->H, true};
    memset(out.w, 0, (size_t)(rows * p->S) * sizeof(float));
    for (int64_t h = 0; h < p->H; h += task_head_count(p)) {
        const sdpa_task t = {b, h, i0, rows, output_rows(p, b, h, i0, s), s};
        if (eng__sdpa_attend(p, &t, 0, p->S) != ENG_OK)
            return;
        finish_heads(p, b, h, i0, rows, &t.hr);
        for (int64_t g = 0; g < task_head_count(p); g++)
            if (eng__sdpa_head_weights(p, &t, g, &out) != ENG_OK)
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
    const sdpa_task t = {b,
                         h,
                         i0,
                         rows,
                         {.o = p->part_o + (part * p->L + i0) * p->Dv,
                          .ldo = p->Dv,
                          .o_step = p->chunks * p->L * p->Dv,
                          .m = m,
                          .l = m + p->L,
                          .ml_step = p->chunks * 2 * p->L},
                         s};
    int64_t kbeg = c * p->chunk_len;
    int64_t kend = kbeg + p->chunk_len < p->S ? kbeg + p->chunk_len : p->S;
    eng__sdpa_attend(p, &t, kbeg, kend);
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
        st = eng_pool_run(pool, eng__sdpa_additive_project_task, p, p->B * (p->H + p->Hkv), p->ctl);
    if (st == ENG_OK && (p->kpack || p->kpack16))
        st = eng_pool_run(pool, eng__sdpa_prepack_task, p, p->B * p->Hkv, p->ctl);
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
                         p->lay.total * sizeof(float));
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

/* ---- Entry points --------------------------------------------------------------------- */

size_t eng_sdpa_scratch_bytes(const eng_sdpa_args *args, int threads)
{
    return eng__sdpa_paged_scratch_bytes(args, NULL, threads);
}

size_t eng__sdpa_paged_scratch_bytes(const eng_sdpa_args *args, const eng__kv_paged *kv,
                                     int threads)
{
    plan p;
    eng__sdpa_plan_init(&p, args, kv, threads > 0 ? threads : 1);
    /* One scratch block per thread that may run a task: the workers and this caller; a 16-bit
     * cache's prepacking widens one cache block per thread. */
    size_t per_thread = p.lay.total;
    if (p.prepack && p.source == SDPA_PAGED && p.kv_dtype != ENG_DTYPE_F32)
        per_thread += (size_t)(kv->block_tokens * (p.D + p.Dv));
    return eng__sdpa_heap_bytes(&p) + (size_t)(threads + 1) * per_thread * sizeof(float);
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
    eng__sdpa_plan_init(&p, a, kv, eng_pool_threads(pool));
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
    float *packed = p.prepack ? eng_buf_alloc(eng__sdpa_prepack_bytes(&p)) : NULL;
    if (packed && p.products == SDPA_BF16_NATIVE) {
        p.kpack16 = (uint16_t *)packed;
        p.vpack16 = p.kpack16 + p.B * p.Hkv * p.kpack_head;
    } else if (packed) {
        p.kpack = packed;
        p.vpack = p.vpack_head ? packed + p.B * p.Hkv * p.kpack_head : NULL;
    }
    if ((a->alibi && !p.slopes) || (p.chunks > 1 && !parts) || (a->additive_w_q && !additive)) {
        st = eng__fail(err, ENG_ENOMEM, "", "cannot allocate %zu bytes of attention state",
                       eng__sdpa_heap_bytes(&p));
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
