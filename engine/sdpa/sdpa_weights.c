/*
 * sdpa_weights.c - the attention weights, when asked for: a second pass over the same key
 * blocks that recomputes each score block as the attention did and writes exp(s - m) / l with
 * each row's final maximum m and sum l (not exp(s - lse): lse rounded to float loses log(l)
 * next to scores of 1e9).
 */
#include "engine/sdpa/plan.h"

/* The score block of rows q x the keys of kb with everything applied, as the attention
 * computed it (with bf16: from the task's rounded Q rows), row stride kb->cols. */
static void block_scores(const plan *p, const q_rows *q, const key_block *kb, float *s)
{
    block_panels bp = eng__sdpa_block_operands(p, q->b, q->h / p->group, kb, s);
    const int64_t cols = kb->cols;
    if (p->path == SDPA_STREAM) {
        /* Row by row as the attention computed them: the same bits whatever the rows. */
        const float *qr[ENG__STREAM_ROWS];
        for (int64_t r = 0; r < q->n; r++) {
            const q_rows one = {q->b, q->h, q->i + r, 1, r};
            qr[r] = eng__sdpa_stream_query(p, &one, s);
        }
        const bool pairs = bp.kh && eng__sdpa_stream_pairs(p, p->task_heads * q->n);
        eng__sdpa_stream_scores(p, q, 1, qr, &bp, kb, pairs, s);
    } else {
        const int64_t height = p->ks->panel_rows;
        for (int64_t r0 = 0; r0 < q->n; r0 += height) {
            const q_rows panel = {q->b, q->h, q->i + r0, q->n - r0 < height ? q->n - r0 : height,
                                  r0};
            eng__sdpa_panel_scores(p, &panel, kb, &bp, (mat){s + r0 * cols, cols}, s);
        }
    }
    for (int64_t r = 0; r < q->n; r++)
        eng__sdpa_bias_row(p, q->b, q->h, q->i + r, kb, s + r * cols);
}

/* Recomputes each visible score block of rows q and writes its weights (out) with the rows'
 * maxima m and sums l. */
static eng_status write_weights(plan *p, const q_rows *q, const float *m, const float *l,
                                const weights_out *out, float *s)
{
    key_blocks it;
    key_block kb;
    eng_status st = ENG_OK;
    eng__sdpa_blocks_init(p, &it, q->b, q->i, q->n, 0, p->S);
    while (eng__sdpa_blocks_next(p, &it, &kb, &st)) {
        block_scores(p, q, &kb, s);
        for (int64_t r = 0; r < q->n; r++) {
            if (!(l[r] > 0.0f)) /* no visible key: the row stays 0 */
                continue;
            p->vec->exp_store(s + r * kb.cols, out->w + r * p->S + kb.j0, kb.cols, m[r],
                              out->mul / l[r], out->accumulate);
        }
    }
    return st;
}

/* Head g's Q rows, which its scores are computed from, go back to the first task rows first,
 * where block_scores reads them. */
eng_status eng__sdpa_head_weights(plan *p, const sdpa_task *t, int64_t g, const weights_out *out)
{
    const q_rows q = {t->b, t->h + g, t->i0, t->rows, 0};
    if (g > 0 && (bf16(p) || p->q16))
        eng__sdpa_round_queries(p, &q, t->s);
    return write_weights(p, &q, t->hr.m + g * t->hr.ml_step, t->hr.l + g * t->hr.ml_step, out,
                         t->s);
}
