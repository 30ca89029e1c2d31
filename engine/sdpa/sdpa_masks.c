/*
 * sdpa_masks.c - which keys a query row sees: position ranges (causal, window, kv_lengths),
 * padding, the attention mask, ALiBi and softcap on the scores, and the key blocks of a task.
 */
#include <math.h>

#include "engine/sdpa/plan.h"

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

void eng__sdpa_bias_row(const plan *p, int64_t b, int64_t h, int64_t i, const key_block *kb,
                        float *row)
{
    const eng_sdpa_args *a = p->a;
    const int64_t j0 = kb->j0 + kb->c0, cols = kb->n;
    if (a->softcap > 0.0f)
        p->vec->softcap(row, cols, a->softcap);
    if (kb->kind == KEYS_TAIL)
        return;
    if (a->alibi)
        add_alibi(p, h, i, 1, j0, cols, row);
    if (a->attn_mask.kind != ENG_MASK_NONE)
        apply_attn_mask(p, b, h, i, 1, j0, cols, row);
    if (a->key_padding)
        apply_padding(p, b, 1, j0, cols, row);
    if (kb->kind == KEYS_BOUNDARY)
        apply_ranges(p, b, i, 1, j0, cols, row);
}

/* The keys that rows [i0, i0 + rows) of batch b may see by position, within [kbeg, kend). */
static key_span rows_span(const plan *p, int64_t b, int64_t i0, int64_t rows, int64_t kbeg,
                          int64_t kend)
{
    int64_t lo0, hi0, lo1, hi1;
    row_range(p, b, i0, &lo0, &hi0);
    row_range(p, b, i0 + rows - 1, &lo1, &hi1);
    key_span k = {lo0 > kbeg ? lo0 : kbeg, hi1 < kend ? hi1 : kend, lo1, hi0};
    return k;
}

/* Sets kb->kind: under position rules (not the open tail) a block is inside when every row
 * may see all of it, else on a boundary. False when every key is padding. */
static bool block_kind(const plan *p, const key_blocks *it, key_block *kb)
{
    kb->kind = KEYS_TAIL;
    if (it->tail)
        return true;
    if (p->a->key_padding && all_padding(p, it->b, kb->j0, kb->j0 + kb->cols))
        return false;
    bool inside = kb->j0 >= it->span.full_lo && kb->j0 + kb->cols <= it->span.full_hi;
    kb->kind = inside ? KEYS_INSIDE : KEYS_BOUNDARY;
    return true;
}

/* True when block j0's panels come prepacked: a paged cache's block may then span cache
 * blocks (block_cols), and its rows are never read. */
static bool block_prepacked(const plan *p, int64_t j0)
{
    return (p->kpack || p->kpack16) && j0 % p->ks->nr == 0;
}

/* The keys from j0 that one block takes: at most Bc, up to `to`, and from a paged cache within
 * one cache block (rows are contiguous only there), unless the block comes prepacked (panels
 * span cache blocks, which then hold whole panels). */
static int64_t block_cols(const plan *p, int64_t j0, int64_t to)
{
    int64_t cols = to - j0 < p->bc ? to - j0 : p->bc;
    if (p->source == SDPA_PAGED && !block_prepacked(p, j0)) {
        int64_t left = p->paged->block_tokens - j0 % p->paged->block_tokens;
        cols = cols < left ? cols : left;
    }
    return cols;
}

/* Blocks start on whole panels of NR keys from the first visible one (or kbeg), so that they
 * find their K panels among the prepacked ones; then come the open tail's keys. */
void eng__sdpa_blocks_init(const plan *p, key_blocks *it, int64_t b, int64_t i0, int64_t rows,
                           int64_t kbeg, int64_t kend)
{
    it->span = rows_span(p, b, i0, rows, kbeg, kend);
    it->b = b;
    it->tail = false;
    it->tail_lo = kbeg > p->S_main ? kbeg : p->S_main;
    it->tail_hi = kend;
    it->j0 = it->end = 0;
    if (it->span.lo < it->span.hi) {
        int64_t from = it->span.lo / p->ks->nr * p->ks->nr;
        it->j0 = from > kbeg ? from : kbeg;
        it->end = it->span.hi;
    }
}

bool eng__sdpa_blocks_next(const plan *p, key_blocks *it, key_block *kb, eng_status *st)
{
    for (;;) {
        if (it->j0 >= it->end) {
            if (it->tail || it->tail_lo >= it->tail_hi)
                return false;
            it->tail = true;
            it->j0 = it->tail_lo;
            it->end = it->tail_hi;
            continue;
        }
        kb->j0 = it->j0;
        kb->cols = block_cols(p, it->j0, it->end);
        it->j0 += kb->cols;
        if ((*st = eng_ctl_check(p->ctl)) != ENG_OK)
            return false;
        if (block_kind(p, it, kb)) {
            kb->c0 = 0;
            kb->n = kb->cols;
            return true;
        }
    }
}

/* Row ranges never shrink as i grows: the first row bounds the start, the last the end. Keys
 * before the start that a panel takes (to start on a whole panel) are masked by the rows. */
bool eng__sdpa_panel_keys(const plan *p, int64_t b, int64_t i, int64_t rows, key_block *kb)
{
    int64_t lo, hi, lo_last, hi_last;
    row_range(p, b, i, &lo, &hi);
    row_range(p, b, i + rows - 1, &lo_last, &hi_last);
    int64_t first = clamp64(lo - kb->j0, 0, kb->cols), end = clamp64(hi_last - kb->j0, 0, kb->cols);
    kb->c0 = first / key_panel(p) * key_panel(p);
    kb->n = end - kb->c0;
    return first < end;
}
