/*
 * sdpa_operands.c - the operands of the products: where a key block's K and V rows are (views
 * or a paged cache's blocks), 16-bit rows widened, K^T and V packed into the micro-kernels'
 * panels per block or once per call (prepacking), Q rows rounded to bf16, and the additive
 * scoring's projections.
 */
#include <string.h>

#include "engine/sdpa/plan.h"

/* Where the K and V rows of key j0 of (b, kv head hk) are, and their row strides (elements of
 * the source's type); from a paged cache the rows run on to the end of j0's cache block. */
static void source_rows(const plan *p, int64_t b, int64_t hk, int64_t j0, const void **k,
                        int64_t *ldk, const void **v, int64_t *ldv)
{
    const eng_sdpa_args *a = p->a;
    if (p->source != SDPA_PAGED) {
        *k = kv16(p) ? (const void *)row_ptr16(a->k16, &a->k, b, hk, j0)
                     : (const void *)row_ptr(&a->k, b, hk, j0);
        *v = kv16(p) ? (const void *)row_ptr16(a->v16, &a->v, b, hk, j0)
                     : (const void *)row_ptr(&a->v, b, hk, j0);
        *ldk = ld_of(&a->k);
        *ldv = ld_of(&a->v);
        return;
    }
    const int64_t T = p->paged->block_tokens, t = j0 % T;
    const size_t elem = kv16(p) ? sizeof(uint16_t) : sizeof(float);
    const char *block = p->paged->blocks[j0 / T];
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

/* The bf16 pair panels of the block, prepacked or packed into `area`. */
static void pack_block16(const plan *p, int64_t b, int64_t hk, int64_t j0, int64_t cols,
                         const float *s, block_panels *bp)
{
    uint16_t *area = (uint16_t *)s + p->lay.k16;
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
        uint16_t *v_area = (uint16_t *)s + p->lay.v16;
        if (bp->vr)
            eng__bf16_pack_panels(nr, bp->vr, bp->ldv, false, cols, p->Dv, v_area);
        else
            eng__bf16_pack_panels16(nr, bp->vh, bp->ldv, false, cols, p->Dv, v_area);
        bp->v16 = v_area;
        bp->v16_stride = eng__bf16_panel_stride(nr, cols);
    }
}

/* The AMX panels of the block, packed into the task's scratch s from its fp32 rows, or from
 * the bits of its 16-bit rows: K^T D deep, V the block's keys deep. */
static void pack_block_amx(const plan *p, int64_t cols, const float *s, block_panels *bp)
{
    uint16_t *k_area = (uint16_t *)s + p->lay.k16, *v_area = (uint16_t *)s + p->lay.v16;
    const eng_dtype dtype = bp->kr ? ENG_DTYPE_F32 : p->kv_dtype;
    eng__amx_pack_b(bp->kr ? (const void *)bp->kr : bp->kh, dtype, bp->ldk, true, p->D, cols,
                    k_area);
    eng__amx_pack_b(bp->vr ? (const void *)bp->vr : bp->vh, dtype, bp->ldv, false, cols, p->Dv,
                    v_area);
    bp->k16 = k_area;
    bp->k16_stride = eng__amx_depth(p->D) * ENG__AMX_NR;
    bp->v16 = v_area;
    bp->v16_stride = eng__amx_depth(cols) * ENG__AMX_NR;
}

/* The panels of keys [j0, j0+cols) of (b, kv head hk) from their rows in bp: the call's
 * prepacked ones where it has them, else packed once here into the block panel space of the
 * task's scratch s. */
static void pack_block(const plan *p, int64_t b, int64_t hk, int64_t j0, int64_t cols,
                       const float *s, block_panels *bp)
{
    if (p->products == SDPA_BF16_NATIVE) {
        pack_block16(p, b, hk, j0, cols, s, bp);
        return;
    }
    if (p->products == SDPA_BF16_AMX) {
        pack_block_amx(p, cols, s, bp);
        return;
    }
    float *area = (float *)s + p->lay.panels;
    bp->k = key_panels(p, b, hk, j0);
    if (!bp->k && !p->add_q) { /* additive scoring never multiplies K */
        if (bp->kr)
            eng__sgemm_pack_panels(p->ks, bp->kr, bp->ldk, true, p->D, cols, area);
        else
            eng__sgemm_pack_panels16(p->ks, bp->kh, bp->ldk, true, p->D, cols, area);
        if (bf16(p))
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
        if (bf16(p))
            p->ks->round_bf16(area, (int64_t)eng__sgemm_panels_floats(p->ks, p->Dv, cols));
        bp->v = area;
        bp->v_stride = cols * p->ks->nr;
    }
}

/* The operands of keys [j0, j0+cols) of (b, kv head hk): their rows in place (16-bit ones
 * widened into the task's scratch s, unless the streaming kernels or the packing read them),
 * and, when the micro-kernel multiplies them, their panels. */
block_panels eng__sdpa_block_operands(const plan *p, int64_t b, int64_t hk, const key_block *kb,
                                      const float *s)
{
    const int64_t j0 = kb->j0, cols = kb->cols;
    block_panels bp = {0};
    if (p->kv_rows)
        atomic_fetch_add_explicit(p->kv_rows, cols, memory_order_relaxed);
    const bool prepacked = (p->kpack || p->kpack16) && j0 % p->ks->nr == 0,
               panels = p->path == SDPA_PANELS;
    /* Prepacked blocks never read their rows: from a paged cache they may span cache blocks,
     * and 16-bit rows would be widened for nothing. */
    if (!prepacked || !(p->source == SDPA_PAGED || kv16(p))) {
        const void *k, *v;
        source_rows(p, b, hk, j0, &k, &bp.ldk, &v, &bp.ldv);
        if (!kv16(p)) {
            bp.kr = k;
            bp.vr = v;
        } else if (p->path == SDPA_STREAM || (panels && p->source != SDPA_PAGED)) {
            /* Read in place: by the streaming kernels, or packed from the bits of bf16
             * views. */
            bp.kh = k;
            bp.vh = v;
        } else {
            /* Widened: then the products are those of fp32 rows. */
            float *kw = (float *)s + p->lay.widen, *vw = kw + align16((size_t)(p->bc * p->D));
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
void eng__sdpa_round_queries(const plan *p, const q_rows *q, float *s)
{
    const int64_t b = q->b, h = q->h, i0 = q->i, rows = q->n, first = q->t;
    const size_t end = (size_t)(first + rows);
    if (p->products != SDPA_BF16_NATIVE) {
        float *qf = s + p->lay.qf + first * p->D;
        for (int64_t r = 0; r < rows; r++) {
            if (p->q16)
                widen(ENG_DTYPE_BF16, row_ptr16(p->a->q16, &p->a->q, b, h, i0 + r), p->D,
                      qf + r * p->D);
            else
                memcpy(qf + r * p->D, row_ptr(&p->a->q, b, h, i0 + r),
                       (size_t)p->D * sizeof(float));
            if (bf16(p) && !p->q16) /* bf16 rows round to themselves */
                p->ks->round_bf16(qf + r * p->D, p->D);
        }
        memset(qf + rows * p->D, 0, (p->lay.qf_floats - end * (size_t)p->D) * sizeof(float));
        return;
    }
    uint16_t *q16 = (uint16_t *)s + p->lay.q16 + first * p->dp;
    for (int64_t r = 0; r < rows; r++) {
        if (p->q16)
            copy_bf16_row(row_ptr16(p->a->q16, &p->a->q, b, h, i0 + r), p->D, q16 + r * p->dp);
        else
            p->ks->to_bf16(row_ptr(&p->a->q, b, h, i0 + r), p->D, q16 + r * p->dp);
    }
    memset(q16 + rows * p->dp, 0, (p->lay.q16_elems - end * (size_t)p->dp) * sizeof *q16);
    memset((uint16_t *)s + p->lay.p16, 0, p->lay.p16_elems * sizeof(uint16_t));
}

/* Packs keys [j, j+len) of (b, kv head hk), whose rows are k and v (row strides ldk, ldv),
 * into the panels of prepack index `index`: K^T panels from panel j / NR on, and in each V
 * panel the depth rows from j on (prepacking from a paged cache is planned only when its
 * blocks hold whole panels of keys). */
static void prepack_range(plan *p, int64_t index, int64_t j, int64_t len, const float *k,
                          int64_t ldk, const float *v, int64_t ldv)
{
    const int64_t nr = p->ks->nr;
    if (p->products == SDPA_BF16_NATIVE) {
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
    if (p->products == SDPA_BF16_NATIVE)
        eng__bf16_pack_panels16(nr, k, ldk, true, p->D, p->S, p->kpack16 + index * p->kpack_head);
    else
        eng__sgemm_pack_panels16(p->ks, k, ldk, true, p->D, p->S, p->kpack + index * p->kpack_head);
    for (int64_t q = 0; q < p->Dv; q += nr) {
        int64_t w = p->Dv - q < nr ? p->Dv - q : nr;
        if (p->products == SDPA_BF16_NATIVE)
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
void eng__sdpa_prepack_task(void *arg, int64_t index)
{
    plan *p = arg;
    int64_t b = index / p->Hkv, hk = index % p->Hkv;
    if (p->source == SDPA_VIEW16) {
        prepack_views16(p, index, row_ptr16(p->a->k16, &p->a->k, b, hk, 0), ld_of(&p->a->k),
                        row_ptr16(p->a->v16, &p->a->v, b, hk, 0), ld_of(&p->a->v));
        return;
    }
    float *wide = NULL;
    if (kv16(p)) {
        wide = eng__scratch((size_t)(p->paged->block_tokens * (p->D + p->Dv)) * sizeof(float));
        if (!wide) {
            atomic_store(&p->no_scratch, true);
            return;
        }
    }
    for (int64_t j = 0, len; j < p->S; j += len) {
        len = p->S - j;
        if (p->source == SDPA_PAGED && p->paged->block_tokens - j % p->paged->block_tokens < len)
            len = p->paged->block_tokens - j % p->paged->block_tokens;
        const void *k, *v;
        int64_t ldk, ldv;
        source_rows(p, b, hk, j, &k, &ldk, &v, &ldv);
        if (wide) {
            widen(p->paged->dtype, k, len * p->D, wide);
            widen(p->paged->dtype, v, len * p->Dv, wide + len * p->D);
            k = wide;
            v = wide + len * p->D;
        }
        prepack_range(p, index, j, len, k, ldk, v, ldv);
    }
    if (bf16(p) && p->products != SDPA_BF16_NATIVE) {
        p->ks->round_bf16(p->kpack + index * p->kpack_head, p->kpack_head);
        p->ks->round_bf16(p->vpack + index * p->vpack_head, p->vpack_head);
    }
}

/* Additive scoring, step 0: W_q q for one (b, h), or W_k k for one (b, kv head). */
void eng__sdpa_additive_project_task(void *arg, int64_t index)
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
