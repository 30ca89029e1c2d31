/*
 * sdpa_flash.c - the flash loop: a task's query rows against the keys they can see, a key
 * block at a time (sdpa_masks.c), each block's operands read and packed once and then taken
 * a panel of rows (the micro-kernel's tile height) at a time, head after head, while they are
 * still in the cache: S = scale Q K^T, masks and biases, the online softmax (running row
 * maximum m and sum l), then O += P V into the output rows (sdpa_products.c). A panel's scores
 * stay in L1 through all three; on a causal or window boundary a panel multiplies only the
 * keys its rows may see, so causal work halves. A streaming task takes each block through
 * sdpa_stream.c instead.
 */
#include <math.h>
#include <string.h>

#include "engine/sdpa/plan.h"

/* A panel's accumulators: output rows o, row maxima m and sums l. */
typedef struct {
    mat o;
    float *m, *l;
} panel_acc;

/* Rows q against the panel keys of kb: the scores into s, the online-softmax update of the
 * rows' maxima, sums and outputs, then o += P V. */
static eng_status attend_panel(plan *p, const q_rows *q, const key_block *kb,
                               const block_panels *bp, const panel_acc *acc, mat s, float *scratch)
{
    eng_status st;
    const int64_t n = kb->n;
    eng__sdpa_panel_scores(p, q, kb, bp, s, scratch);
    for (int64_t r = 0; r < q->n; r++) {
        float *row = s.x + r * s.ld, bmax;
        bool rebase;
        /* Masks and biases in the same sweep as the softmax: the row stays in L1. */
        eng__sdpa_bias_row(p, q->b, q->h, q->i + r, kb, row);
        if ((st = eng__sdpa_softmax_row(p, row, n, &acc->m[r], &acc->l[r], &rebase, &bmax)) !=
            ENG_OK)
            return st;
        if (!rebase)
            continue;
        const q_rows one = {q->b, q->h, q->i + r, 1, q->t + r};
        eng__sdpa_panel_scores(p, &one, kb, bp, (mat){row, s.ld}, scratch);
        eng__sdpa_bias_row(p, q->b, q->h, q->i + r, kb, row);
        eng__sdpa_rebase_row(p, row, n, bmax, acc->o.x + r * acc->o.ld, &acc->m[r], &acc->l[r]);
    }
    eng__sdpa_panel_values(p, q->n, kb, bp, s, acc->o, scratch);
    return ENG_OK;
}

/* Key block kb for the rows of every head of one slot (heads from h0, accumulating in hr).
 * A head's panel keeps its own head index (ALiBi slope, mask, output) and its own Q rows:
 * those of head g at task row g rows. */
static eng_status attend_block(plan *p, const sdpa_task *t, int64_t h0, const key_block *kb,
                               const head_rows *hr)
{
    if (p->path == SDPA_STREAM)
        return eng__sdpa_stream_block(p, t, h0, kb, hr);
    block_panels bp = eng__sdpa_block_operands(p, t->b, h0 / p->group, kb, t->s);
    const int64_t height = p->ks->panel_rows, rows = t->rows;
    for (int64_t r0 = 0; r0 < rows; r0 += height) {
        int64_t pr = rows - r0 < height ? rows - r0 : height;
        key_block k = *kb;
        /* Positions, and so the visible keys, are the same for every head. */
        if (k.kind == KEYS_BOUNDARY && !eng__sdpa_panel_keys(p, t->b, t->i0 + r0, pr, &k))
            continue;
        for (int64_t g = 0; g < p->task_heads; g++) {
            const q_rows q = {t->b, h0 + g, t->i0 + r0, pr, g * rows + r0};
            const panel_acc acc = {{hr->o + g * hr->o_step + r0 * hr->ldo, hr->ldo},
                                   hr->m + g * hr->ml_step + r0,
                                   hr->l + g * hr->ml_step + r0};
            eng_status st = attend_panel(p, &q, &k, &bp, &acc, (mat){t->s, kb->cols}, t->s);
            if (st != ENG_OK)
                return st;
        }
    }
    return ENG_OK;
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

/* Slot after slot in each key block: where several kv heads lie side by side, a streaming task
 * reads their rows in the order they lie. */
eng_status eng__sdpa_attend(plan *p, const sdpa_task *t, int64_t kbeg, int64_t kend)
{
    const head_rows *hr = &t->hr;
    for (int64_t g = 0; g < task_head_count(p); g++) {
        float *o = hr->o + g * hr->o_step, *m = hr->m + g * hr->ml_step,
              *l = hr->l + g * hr->ml_step;
        for (int64_t r = 0; r < t->rows; r++) {
            m[r] = -INFINITY;
            l[r] = 0.0f;
            memset(o + r * hr->ldo, 0, (size_t)p->Dv * sizeof(float));
        }
        if (bf16(p) || p->q16) {
            const q_rows q = {t->b, t->h + g, t->i0, t->rows, g * t->rows};
            eng__sdpa_round_queries(p, &q, t->s);
        }
    }
    key_blocks it;
    key_block kb;
    eng_status st = ENG_OK;
    eng__sdpa_blocks_init(p, &it, t->b, t->i0, t->rows, kbeg, kend);
    while (eng__sdpa_blocks_next(p, &it, &kb, &st))
        for (int64_t slot = 0; slot < p->task_slots; slot++) {
            const head_rows hs = slot_rows(p, hr, slot, t->rows);
            eng_status bst = attend_block(p, t, t->h + slot * p->task_heads, &kb, &hs);
            if (bst != ENG_OK)
                return bst;
        }
    return st;
}
