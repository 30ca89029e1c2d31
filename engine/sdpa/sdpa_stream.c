/*
 * sdpa_stream.c - the streaming decode: a task of at most ENG__STREAM_ROWS query rows (a decode
 * step: a kv group's heads times one or a few rows) packs nothing. It streams the raw K and V
 * rows through the vector kernels' multi-row dot products and sums (dots_rows, axpys_rows),
 * each row loaded once for all the task's rows, so that the cache is read at memory speed; a
 * lone row over a paged bf16 cache takes the pair kernels, which multiply bf16 rows without
 * widening them.
 */
#include "engine/sdpa/plan.h"

const float *eng__sdpa_stream_query(const plan *p, const q_rows *q, const float *s)
{
    return p->q16 ? s + p->lay.qf + q->t * p->D : row_ptr(&p->a->q, q->b, q->h, q->i);
}

/* A single row over a bf16 cache (a decode step without grouped heads). Only a paged cache's:
 * bf16 views keep the bits of fp32 views. */
bool eng__sdpa_stream_pairs(const plan *p, int64_t nt)
{
    return nt == 1 && p->source == SDPA_PAGED && p->kv_dtype == ENG_DTYPE_BF16 &&
           p->vec->dots_bf16_pairs && p->D % 32 == 0 && p->Dv % 32 == 0 && !p->add_q;
}

/* One pass over the K rows for all the rows, or the additive scores. */
void eng__sdpa_stream_scores(const plan *p, const q_rows *q, int64_t heads, const float *const *qr,
                             const block_panels *bp, const key_block *kb, bool pairs, float *s)
{
    const int64_t c0 = kb->c0, n = kb->n;
    if (p->add_q) {
        for (int64_t g = 0; g < heads; g++) {
            q_rows qg = *q;
            qg.h = q->h + g;
            eng__sdpa_additive_scores(p, &qg, kb->j0 + c0, n, (mat){s + g * q->n * n, n});
        }
        return;
    }
    if (pairs) {
        p->vec->dots_bf16_pairs(qr[0], bp->kh + c0 * bp->ldk, bp->ldk, n, p->D, p->scale, s);
        return;
    }
    const void *k =
        bp->kh ? (const void *)(bp->kh + c0 * bp->ldk) : (const void *)(bp->kr + c0 * bp->ldk);
    p->vec->dots_rows(qr, (int)(heads * q->n), k, bp->kh ? p->kv_dtype : ENG_DTYPE_F32, bp->ldk, n,
                      p->D, p->scale, s, n);
}

/* Task row t = g rows + r is row i0 + r of head h0 + g, with its own head for ALiBi, masks and
 * outputs; each K row is loaded once for all of them, each V row once for all their sums. */
eng_status eng__sdpa_stream_block(plan *p, const sdpa_task *t, int64_t h0, const key_block *kb,
                                  const head_rows *hr)
{
    const int64_t b = t->b, i0 = t->i0, rows = t->rows;
    key_block k = *kb;
    if (k.kind == KEYS_BOUNDARY && !eng__sdpa_panel_keys(p, b, i0, rows, &k))
        return ENG_OK;
    block_panels bp = eng__sdpa_block_operands(p, b, h0 / p->group, &k, t->s);
    const int64_t n = k.n, nt = p->task_heads * rows;
    const float *q[ENG__STREAM_ROWS];
    float *o[ENG__STREAM_ROWS];
    for (int64_t r = 0; r < nt; r++) {
        q_rows qt = {b, h0 + r / rows, i0 + r % rows, 1, hr->row0 + r};
        q[r] = eng__sdpa_stream_query(p, &qt, t->s);
        o[r] = hr->o + r / rows * hr->o_step + r % rows * hr->ldo;
    }
    const bool pairs = bp.kh && eng__sdpa_stream_pairs(p, nt);
    const q_rows all = {b, h0, i0, rows, 0};
    eng__sdpa_stream_scores(p, &all, p->task_heads, q, &bp, &k, pairs, t->s);
    for (int64_t r = 0; r < nt; r++) {
        int64_t g = r / rows, i = i0 + r % rows;
        float *row = t->s + r * n, bmax;
        float *m = hr->m + g * hr->ml_step + r % rows, *l = hr->l + g * hr->ml_step + r % rows;
        bool rebase;
        eng__sdpa_bias_row(p, b, h0 + g, i, &k, row);
        eng_status st = eng__sdpa_softmax_row(p, row, n, m, l, &rebase, &bmax);
        if (st != ENG_OK)
            return st;
        if (!rebase)
            continue;
        const q_rows one = {b, h0 + g, i, 1, 0};
        eng__sdpa_stream_scores(p, &one, 1, &q[r], &bp, &k, pairs, row);
        eng__sdpa_bias_row(p, b, h0 + g, i, &k, row);
        eng__sdpa_rebase_row(p, row, n, bmax, o[r], m, l);
    }
    if (pairs) {
        p->vec->axpys_bf16_pairs(o[0], t->s, bp.vh + k.c0 * bp.ldv, bp.ldv, n, p->Dv);
        return ENG_OK;
    }
    const void *v =
        bp.vh ? (const void *)(bp.vh + k.c0 * bp.ldv) : (const void *)(bp.vr + k.c0 * bp.ldv);
    p->vec->axpys_rows(o, (int)nt, t->s, n, v, bp.vh ? p->kv_dtype : ENG_DTYPE_F32, bp.ldv, n,
                       p->Dv);
    return ENG_OK;
}
