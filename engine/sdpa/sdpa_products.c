/*
 * sdpa_products.c - one panel of query rows against one key block: S = scale Q K^T (register
 * tiles over the block's panels, the wide tile where the set has one, VDPBF16PS on pair
 * panels, TDPBF16PS on AMX panels, or cblas), or additive scores; the online softmax of each row;
 * then O += P V, P read where the softmax wrote it.
 */
#include <math.h>
#include <string.h>

#include "engine/sdpa/plan.h"

/* How far a block's maximum may exceed a row's reference maximum before the row is rebased:
 * exp(s - m) then stays below e^8, far from float's range, and rebases are rare. */
#define RESCALE_SLACK 8.0f

/* s[rows x cols] = scale q k^T with the wide tile over pairs of the K^T panels at k (2 NR
 * keys, D deep, per call): a tile of few rows computes only those. */
static void scores_wide_gemm(const plan *p, mat q, int64_t rows, const float *k, int64_t cols,
                             mat s)
{
    const int64_t nr = p->ks->nr, mr = p->ks->wide.mr, panel = p->D * nr;
    for (int64_t j = 0; j < cols; j += 2 * nr) {
        int64_t n = cols - j < 2 * nr ? cols - j : 2 * nr;
        for (int64_t r = 0; r < rows; r += mr)
            p->ks->wide.packed(p->D, q.x + r * q.ld, q.ld, k + j / nr * panel, n > nr ? panel : 0,
                               s.x + r * s.ld + j, s.ld, p->scale, 0.0f,
                               (int)(rows - r < mr ? rows - r : mr), (int)n);
    }
}

/* s[rows x n] = scale q k^T for the panel keys of kb by the kernel set's GEMM, K^T from the
 * block's panels when it has them, else packed into `pack`. */
static void scores_gemm(const plan *p, mat q, int64_t rows, const block_panels *bp,
                        const key_block *kb, mat s, float *pack)
{
    const int64_t ldk = bp->ldk, c0 = kb->c0;
    const float *k = bp->kr ? bp->kr + c0 * ldk : NULL; /* NULL: the panels have them */
    const int64_t nr = p->ks->nr;
    if (bp->k && p->ks->wide.packed) {
        scores_wide_gemm(p, q, rows, bp->k + c0 / nr * p->D * nr, kb->n, s);
        return;
    }
    eng__gemm g = {.m = rows,
                   .n = kb->n,
                   .k = p->D,
                   .alpha = p->scale,
                   .beta = 0.0f,
                   .a = q.x,
                   .lda = q.ld,
                   .b = k,
                   .ldb = ldk,
                   .b_trans = true,
                   .c = s.x,
                   .ldc = s.ld,
                   .b_packed = bp->k ? bp->k + c0 / nr * p->D * nr : NULL,
                   .b_panel_stride = p->D * nr};
    eng__sgemm(p->ks, &g, pack);
}

/* o[rows x Dv] += s[rows x n] v for the panel keys of kb: V from the block's panels when it
 * has them, else packed into `pack`. */
static void values_gemm(const plan *p, mat s, int64_t rows, const key_block *kb,
                        const block_panels *bp, mat o, float *pack)
{
    const int64_t c0 = kb->c0;
    const float *v = bp->vr ? bp->vr + c0 * bp->ldv : NULL;
    eng__gemm g = {.m = rows,
                   .n = p->Dv,
                   .k = kb->n,
                   .alpha = 1.0f,
                   .beta = 1.0f,
                   .a = s.x,
                   .lda = s.ld,
                   .b = v,
                   .ldb = bp->ldv,
                   .b_trans = false,
                   .c = o.x,
                   .ldc = o.ld,
                   .b_packed = bp->v ? bp->v + c0 * p->ks->nr : NULL,
                   .b_panel_stride = bp->v_stride};
    eng__sgemm(p->ks, &g, pack);
}

void eng__sdpa_additive_scores(const plan *p, const q_rows *q, int64_t j0, int64_t n, mat s)
{
    int64_t A = p->a->additive_dim;
    const float *qa = p->add_q + ((q->b * p->H + q->h) * p->L + q->i) * A;
    const float *ka = p->add_k + ((q->b * p->Hkv + q->h / p->group) * p->S + j0) * A;
    for (int64_t r = 0; r < q->n; r++)
        for (int64_t c = 0; c < n; c++)
            s.x[r * s.ld + c] = p->vec->tanh_dot(qa + r * A, ka + c * A, p->a->additive_v, A);
}

/* Whether o += P V takes the wide tile: over V's rows in place, or over fp32 V panels, 2 NR
 * output columns at a time. Either way the whole key
 * range is one depth, summed in key order, so that V in place and V packed from 16-bit views
 * of the same values give the same bits. */
static bool values_wide(const plan *p, const block_panels *bp)
{
    return p->ks->wide.packed && (p->v_in_place ? bp->vr != NULL : bp->v != NULL);
}

/* o[rows x Dv] += s[rows x n] V for the panel keys of kb with the wide tile: each P row is
 * broadcast once per 2 NR columns of V, and the whole key range is one depth. */
static void values_wide_gemm(const plan *p, mat s, int64_t rows, const key_block *kb,
                             const block_panels *bp, mat o)
{
    const int64_t nr = p->ks->nr, mr = p->ks->wide.mr, c0 = kb->c0, n = kb->n;
    for (int64_t j = 0; j < p->Dv; j += 2 * nr) {
        const int cols = (int)(p->Dv - j < 2 * nr ? p->Dv - j : 2 * nr);
        for (int64_t r = 0; r < rows; r += mr) {
            const int m = (int)(rows - r < mr ? rows - r : mr);
            if (!bp->v) /* in place: V's rows from key c0, column j */
                p->ks->wide.rows(n, s.x + r * s.ld, s.ld, bp->vr + c0 * bp->ldv + j, bp->ldv,
                                 o.x + r * o.ld + j, o.ld, 1.0f, 1.0f, m, cols);
            else /* the panels of columns j.. (a last lone panel has no second) */
                p->ks->wide.packed(n, s.x + r * s.ld, s.ld, bp->v + j / nr * bp->v_stride + c0 * nr,
                                   cols > nr ? bp->v_stride : 0, o.x + r * o.ld + j, o.ld, 1.0f,
                                   1.0f, m, cols);
        }
    }
}

/* s[rows x n] = scale Q K^T on AMX tiles: the task's rounded Q rows against the K^T panels of
 * the panel keys of kb (kb->c0 is a whole panel of them). */
static void scores_amx(const plan *p, const q_rows *q, const key_block *kb, const block_panels *bp,
                       mat s, const float *scratch)
{
    eng__amx_gemm g = {.m = q->n,
                       .n = kb->n,
                       .k = p->D,
                       .alpha = p->scale,
                       .beta = 0.0f,
                       .a = scratch + p->lay.qf + q->t * p->D,
                       .lda = p->D,
                       .b = bp->k16 + kb->c0 / ENG__AMX_NR * bp->k16_stride,
                       .b_panel_stride = bp->k16_stride,
                       .c = s.x,
                       .ldc = s.ld};
    eng__amx_sgemm(p->amx, &g, (uint16_t *)scratch + p->lay.p16);
}

/* o[rows x Dv] += P V on AMX tiles: P rounded to bf16 as the tiles' rows take it, against the
 * V panels from key c0 (a whole tile step: kb->c0 is a whole panel of keys). */
static void values_amx(const plan *p, int64_t rows, const key_block *kb, const block_panels *bp,
                       mat s, mat o, const float *scratch)
{
    eng__amx_gemm g = {.m = rows,
                       .n = p->Dv,
                       .k = kb->n,
                       .alpha = 1.0f,
                       .beta = 1.0f,
                       .a = s.x,
                       .lda = s.ld,
                       .b = bp->v16 + kb->c0 / ENG__AMX_DEPTH * ENG__AMX_DEPTH * ENG__AMX_NR,
                       .b_panel_stride = bp->v16_stride,
                       .c = o.x,
                       .ldc = o.ld};
    eng__amx_sgemm(p->amx, &g, (uint16_t *)scratch + p->lay.p16);
}

/* Row q->t of the task is row q->i's: with bf16 its rounded copy lives there. */
void eng__sdpa_panel_scores(const plan *p, const q_rows *q, const key_block *kb,
                            const block_panels *bp, mat s, const float *scratch)
{
    const eng_sdpa_args *a = p->a;
    const int64_t nr = p->ks->nr, rows = q->n;
    float *pack = (float *)scratch + p->lay.pack;
    if (p->add_q) {
        eng__sdpa_additive_scores(p, q, kb->j0 + kb->c0, kb->n, s);
    } else if (p->products == SDPA_BF16_AMX) {
        scores_amx(p, q, kb, bp, s, scratch);
    } else if (p->products == SDPA_BF16_ROUNDED || (!bf16(p) && p->q16)) {
        mat qf = {(float *)scratch + p->lay.qf + q->t * p->D, p->D};
        scores_gemm(p, qf, rows, bp, kb, s, pack);
    } else if (p->products == SDPA_BF16_NATIVE) {
        const uint16_t *q16 = (const uint16_t *)scratch + p->lay.q16 + q->t * p->dp;
        eng__gemm_bf16 g = {.m = rows,
                            .n = kb->n,
                            .kp = p->dp / 2,
                            .alpha = p->scale,
                            .beta = 0.0f,
                            .a = q16,
                            .lda = p->dp,
                            .b = bp->k16 + kb->c0 / nr * bp->k16_stride,
                            .b_panel_stride = bp->k16_stride,
                            .c = s.x,
                            .ldc = s.ld};
        eng__sgemm_bf16(p->ks, &g);
    } else {
        mat qv = {row_ptr(&a->q, q->b, q->h, q->i), ld_of(&a->q)};
        scores_gemm(p, qv, rows, bp, kb, s, pack);
    }
}

/* With bf16, P is rounded first: in place for the fp32 kernel, into the task's P panel for
 * VDPBF16PS, or into the tiles' rows. */
void eng__sdpa_panel_values(const plan *p, int64_t rows, const key_block *kb,
                            const block_panels *bp, mat s, mat o, const float *scratch)
{
    const int64_t nr = p->ks->nr, n = kb->n;
    if (p->products == SDPA_BF16_AMX) {
        values_amx(p, rows, kb, bp, s, o, scratch);
        return;
    }
    if (p->products != SDPA_BF16_NATIVE) {
        if (bf16(p))
            for (int64_t r = 0; r < rows; r++)
                p->ks->round_bf16(s.x + r * s.ld, n);
        if (values_wide(p, bp))
            values_wide_gemm(p, s, rows, kb, bp, o);
        else
            values_gemm(p, s, rows, kb, bp, o, (float *)scratch + p->lay.pack);
        return;
    }
    uint16_t *p16 = (uint16_t *)scratch + p->lay.p16;
    const int64_t np = (n + 1) / 2 * 2;
    for (int64_t r = 0; r < rows; r++)
        p->ks->to_bf16(s.x + r * s.ld, n, p16 + r * np);
    eng__gemm_bf16 g = {.m = rows,
                        .n = p->Dv,
                        .kp = np / 2,
                        .alpha = 1.0f,
                        .beta = 1.0f,
                        .a = p16,
                        .lda = np,
                        .b = bp->v16 + kb->c0 * nr,
                        .b_panel_stride = bp->v16_stride,
                        .c = o.x,
                        .ldc = o.ld};
    eng__sgemm_bf16(p->ks, &g);
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

/* After a row's first visible block, the exponentials and the block maximum come from one
 * pass, shifted by the row's reference m instead of its true running maximum: exactness only
 * needs exp(s - m) to stay in range, so a block whose maximum exceeds m by at most
 * RESCALE_SLACK simply adds to l (p <= e^SLACK), and only a larger jump (rare: a maximum that
 * arrives late) needs the row rebased: then *rebase is set, *bmax is the block maximum, and the
 * row holds nothing useful: the caller recomputes its scores and calls eng__sdpa_rebase_row. */
eng_status eng__sdpa_softmax_row(plan *p, float *row, int64_t n, float *m, float *l, bool *rebase,
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

void eng__sdpa_rebase_row(plan *p, float *row, int64_t n, float bmax, float *orow, float *m,
                          float *l)
{
    float alpha = expf(*m - bmax);
    for (int64_t d = 0; d < p->Dv; d++)
        orow[d] *= alpha;
    *l = *l * alpha + p->vec->exp_sum(row, n, bmax);
    *m = bmax;
}
