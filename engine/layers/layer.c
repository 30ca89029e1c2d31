/*
 * layer.c - multi-head attention layers: assembling one from weights by role, and the demo layer.
 *
 * The caller says which role each weight plays (eng_layer_weights); a layer is assembled by
 * checking that the roles present make exactly one consistent layer, then copying (and
 * converting) every weight into one parameter block, and packing the four matrices once into
 * the panels of the blocked products. Names of tensors in files or requests are the api's
 * (api/models/): here a weight is only its role, and its label for messages.
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/internal.h"
#include "engine/kernels/kernels.h"

typedef enum {
    ROLE_IN_W, /* packed [W_q; W_k; W_v] */
    ROLE_IN_B,
    ROLE_Q_W,
    ROLE_K_W,
    ROLE_V_W,
    ROLE_O_W,
    ROLE_Q_B,
    ROLE_K_B,
    ROLE_V_B,
    ROLE_O_B,
    ROLE_BIAS_K,
    ROLE_BIAS_V,
    ROLE_COUNT
} role;

/* Where each projection role lies in eng_layer_weights, and what messages call it. */
static const struct {
    size_t offset;
    const char *name;
} roles[ROLE_COUNT] = {
    {offsetof(eng_layer_weights, in_proj_w), "in_proj_w"},
    {offsetof(eng_layer_weights, in_proj_b), "in_proj_b"},
    {offsetof(eng_layer_weights, q_w), "q_w"},
    {offsetof(eng_layer_weights, k_w), "k_w"},
    {offsetof(eng_layer_weights, v_w), "v_w"},
    {offsetof(eng_layer_weights, o_w), "o_w"},
    {offsetof(eng_layer_weights, q_b), "q_b"},
    {offsetof(eng_layer_weights, k_b), "k_b"},
    {offsetof(eng_layer_weights, v_b), "v_b"},
    {offsetof(eng_layer_weights, o_b), "o_b"},
    {offsetof(eng_layer_weights, bias_k), "bias_k"},
    {offsetof(eng_layer_weights, bias_v), "bias_v"},
};

const char *eng__weight_label(const eng_weight *w, const char *role_name)
{
    return w && w->label && w->label[0] ? w->label : role_name;
}

/* Parameters above this many are refused: 2^34 floats is 64 GiB. */
#define MAX_LAYER_PARAMS (INT64_C(1) << 34)

static float load_element(const void *data, eng_dtype dtype, int64_t i)
{
    const unsigned char *p = data;
    if (dtype == ENG_DTYPE_F32) {
        float f;
        memcpy(&f, p + i * 4, sizeof f);
        return f;
    }
    uint16_t h = (uint16_t)(p[i * 2] | (p[i * 2 + 1] << 8));
    return dtype == ENG_DTYPE_F16 ? eng_f16_to_f32(h) : eng_bf16_to_f32(h);
}

/* ---- Assembly ----------------------------------------------------------------------------- */

static int64_t numel(const eng_weight *t)
{
    int64_t n = 1;
    for (int d = 0; d < t->rank; d++)
        n *= t->shape[d];
    return n;
}

/* The 2-D shape of a weight, or false when it is not rank 2. */
static bool matrix_shape(const eng_weight *t, int64_t *rows, int64_t *cols)
{
    if (t->rank != 2)
        return false;
    *rows = t->shape[0];
    *cols = t->shape[1];
    return true;
}

typedef struct {
    const eng_weight *by_role[ROLE_COUNT];
    int64_t E, H, Hkv, D, W, kdim, vdim;
    int64_t Q; /* the width of q and of the attention's output: H * D */
} layer_plan;

/* What an error calls the weight of role r. */
static const char *label(const layer_plan *lp, role r)
{
    return eng__weight_label(lp->by_role[r], roles[r].name);
}

static eng_status assign_roles(layer_plan *lp, const eng_layer_weights *w, eng_error *err)
{
    for (int r = 0; r < ROLE_COUNT; r++) {
        const eng_weight *t = (const eng_weight *)((const char *)w + roles[r].offset);
        if (!t->data)
            continue;
        const char *name = eng__weight_label(t, roles[r].name);
        if (t->rank < 1 || t->rank > 4)
            return eng__fail(err, ENG_EFORMAT, name, "tensor '%s' has rank %d", name, t->rank);
        for (int d = 0; d < t->rank; d++)
            if (t->shape[d] <= 0 || t->shape[d] > (INT64_C(1) << 31))
                return eng__fail(err, ENG_EFORMAT, name, "tensor '%s' has dimension %lld", name,
                                 (long long)t->shape[d]);
        if (t->dtype != ENG_DTYPE_F32 && t->dtype != ENG_DTYPE_F16 && t->dtype != ENG_DTYPE_BF16)
            return eng__fail(err, ENG_EFORMAT, name, "tensor '%s' has an unknown dtype", name);
        lp->by_role[r] = t;
    }
    /* A packed in_proj_b may sit beside separate q_w, k_w and v_w: torch keeps one packed
     * bias even when kdim/vdim split the weights. */
    const eng_weight *const *r = lp->by_role;
    bool separate_w = r[ROLE_Q_W] || r[ROLE_K_W] || r[ROLE_V_W];
    bool separate_b = r[ROLE_Q_B] || r[ROLE_K_B] || r[ROLE_V_B];
    if ((r[ROLE_IN_W] && (separate_w || separate_b)) || (r[ROLE_IN_B] && separate_b))
        return eng__fail(err, ENG_EFORMAT,
                         r[ROLE_IN_W] ? label(lp, ROLE_IN_W) : label(lp, ROLE_IN_B),
                         "both a packed in_proj and separate q/k/v projections are present");
    if (!r[ROLE_O_W])
        return eng__fail(err, ENG_EFORMAT, roles[ROLE_O_W].name, "no output projection (o_w)");
    if (!r[ROLE_IN_W]) {
        static const role needed[3] = {ROLE_Q_W, ROLE_K_W, ROLE_V_W};
        for (int i = 0; i < 3; i++)
            if (!r[needed[i]])
                return eng__fail(err, ENG_EFORMAT, roles[needed[i]].name,
                                 "no %s: the query, key and value projection weights are "
                                 "incomplete",
                                 roles[needed[i]].name);
    }
    if (!lp->by_role[ROLE_BIAS_K] != !lp->by_role[ROLE_BIAS_V])
        return eng__fail(err, ENG_EFORMAT, lp->by_role[ROLE_BIAS_K] ? "bias_v" : "bias_k",
                         "bias_k and bias_v come together");
    return ENG_OK;
}

static eng_status expect_vector(const layer_plan *lp, role r, int64_t n, eng_error *err)
{
    const eng_weight *t = lp->by_role[r];
    if (t && numel(t) != n)
        return eng__fail(err, ENG_EFORMAT, label(lp, r),
                         "tensor '%s' has %lld elements; expected %lld", label(lp, r),
                         (long long)numel(t), (long long)n);
    return ENG_OK;
}

static eng_status expect_matrix(const layer_plan *lp, role r, int64_t rows, int64_t cols,
                                eng_error *err)
{
    const eng_weight *t = lp->by_role[r];
    int64_t tr, tc;
    if (!matrix_shape(t, &tr, &tc) || tr != rows || (cols > 0 && tc != cols))
        return eng__fail(err, ENG_EFORMAT, label(lp, r),
                         "tensor '%s' must be [%lld, %lld] for embed_dim %lld", label(lp, r),
                         (long long)rows, (long long)cols, (long long)lp->E);
    return ENG_OK;
}

/* Derives E, D, Q, W, kdim and vdim from the shapes (D from head_dim when > 0, else E / H),
 * and checks every tensor against them. */
static eng_status plan_shapes(layer_plan *lp, int64_t heads, int64_t kv_heads, int64_t head_dim,
                              eng_error *err)
{
    const eng_weight *o = lp->by_role[ROLE_O_W];
    const char *o_name = label(lp, ROLE_O_W);
    int64_t rows, cols;
    if (!matrix_shape(o, &rows, &cols) || (head_dim <= 0 && rows != cols))
        return eng__fail(err, ENG_EFORMAT, o_name, "tensor '%s' must be a square [E, E] matrix",
                         o_name);
    lp->E = rows;
    if (heads <= 0 || heads > 65536 || (head_dim <= 0 && lp->E % heads != 0))
        return eng__fail_cause(err, ENG_CAUSE_HEAD_COUNT, ENG_EINVAL, "num_heads",
                               "num_heads = %lld must be positive and divide embed_dim %lld",
                               (long long)heads, (long long)lp->E);
    if (head_dim > 65536)
        return eng__fail(err, ENG_EINVAL, "head_dim", "head_dim = %lld is over 65536",
                         (long long)head_dim);
    lp->H = heads;
    lp->D = head_dim > 0 ? head_dim : lp->E / heads;
    lp->Q = lp->H * lp->D;
    if (lp->by_role[ROLE_IN_W] && lp->Q != lp->E)
        return eng__fail(err, ENG_EINVAL, "head_dim",
                         "a packed in_proj needs heads of embed_dim / num_heads");
    if (cols != lp->Q)
        return eng__fail(err, ENG_EFORMAT, o_name, "tensor '%s' must be [%lld, %lld]", o_name,
                         (long long)lp->E, (long long)lp->Q);
    lp->Hkv = kv_heads > 0 ? kv_heads : heads;
    if (lp->H % lp->Hkv != 0)
        return eng__fail_cause(err, ENG_CAUSE_HEAD_COUNT, ENG_EINVAL, "num_kv_heads",
                               "num_heads = %lld must be a multiple of num_kv_heads = %lld",
                               (long long)lp->H, (long long)lp->Hkv);
    lp->W = lp->Hkv * lp->D;
    eng_status st;
    if (lp->by_role[ROLE_IN_W]) {
        lp->kdim = lp->vdim = lp->E;
        if ((st = expect_matrix(lp, ROLE_IN_W, lp->E + 2 * lp->W, lp->E, err)) ||
            (st = expect_vector(lp, ROLE_IN_B, lp->E + 2 * lp->W, err)))
            return st;
    } else {
        if ((st = expect_matrix(lp, ROLE_Q_W, lp->Q, lp->E, err)) ||
            (st = expect_matrix(lp, ROLE_K_W, lp->W, 0, err)) ||
            (st = expect_matrix(lp, ROLE_V_W, lp->W, 0, err)))
            return st;
        lp->kdim = lp->by_role[ROLE_K_W]->shape[1];
        lp->vdim = lp->by_role[ROLE_V_W]->shape[1];
        if ((st = expect_vector(lp, ROLE_IN_B, lp->Q + 2 * lp->W, err)) ||
            (st = expect_vector(lp, ROLE_Q_B, lp->Q, err)) ||
            (st = expect_vector(lp, ROLE_K_B, lp->W, err)) ||
            (st = expect_vector(lp, ROLE_V_B, lp->W, err)))
            return st;
    }
    if ((st = expect_vector(lp, ROLE_O_B, lp->E, err)) ||
        (st = expect_vector(lp, ROLE_BIAS_K, lp->W, err)) ||
        (st = expect_vector(lp, ROLE_BIAS_V, lp->W, err)))
        return st;
    int64_t params = 2 * lp->E * lp->Q + lp->W * (lp->kdim + lp->vdim) + lp->Q + lp->E + 4 * lp->W;
    if (params > MAX_LAYER_PARAMS)
        return eng__fail(err, ENG_ETOOBIG, o_name, "the layer has over 2^34 parameters");
    return ENG_OK;
}

/* Converts n elements of t, starting at element `first`, into dst. */
static void copy_elements(float *dst, const eng_weight *t, int64_t first, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = load_element(t->data, t->dtype, first + i);
}

/* Reserves n floats of the block for a field, or leaves it NULL when `present` is false. */
static float *take(float **cursor, int64_t n, bool present)
{
    if (!present)
        return NULL;
    float *p = *cursor;
    *cursor += n;
    return p;
}

static const char *dtype_name(eng_dtype t)
{
    return t == ENG_DTYPE_F16 ? "F16" : t == ENG_DTYPE_BF16 ? "BF16" : "F32";
}

/* Copies n 16-bit elements of t (little-endian), from element `first`, into dst. */
static void copy_bits16(uint16_t *dst, const eng_weight *t, int64_t first, int64_t n)
{
    const unsigned char *p = (const unsigned char *)t->data + first * 2;
    for (int64_t i = 0; i < n; i++)
        dst[i] = (uint16_t)(p[2 * i] | (p[2 * i + 1] << 8));
}

/* The one 16-bit dtype of the four projection matrices, or F32 when they are fp32 or mixed. */
static eng_dtype matrices_dtype(const layer_plan *lp)
{
    const eng_weight *const *r = lp->by_role;
    const eng_weight *m[4] = {r[ROLE_O_W], r[ROLE_IN_W] ? r[ROLE_IN_W] : r[ROLE_Q_W],
                              r[ROLE_IN_W] ? NULL : r[ROLE_K_W], r[ROLE_IN_W] ? NULL : r[ROLE_V_W]};
    eng_dtype dt = m[0]->dtype;
    for (int i = 1; i < 4; i++)
        if (m[i] && m[i]->dtype != dt)
            return ENG_DTYPE_F32;
    return dt;
}

/* Copies the four projection matrices of a layer being assembled (whose fp32 block holds
 * only its vectors) into a 16-bit block; false when memory runs out. */
static bool keep_matrices16(eng_layer *layer, const layer_plan *lp, eng_dtype dt)
{
    const eng_weight *const *r = lp->by_role;
    int64_t E = lp->E, W = lp->W, Q = lp->Q;
    size_t n = (size_t)(2 * E * Q + W * (lp->kdim + lp->vdim));
    uint16_t *block = malloc(n * sizeof *block);
    if (!block)
        return false;
    uint16_t *q = block, *k = q + Q * E, *v = k + W * lp->kdim, *o = v + W * lp->vdim;
    if (r[ROLE_IN_W]) {
        copy_bits16(q, r[ROLE_IN_W], 0, E * E);
        copy_bits16(k, r[ROLE_IN_W], E * E, W * E);
        copy_bits16(v, r[ROLE_IN_W], (E + W) * E, W * E);
    } else {
        copy_bits16(q, r[ROLE_Q_W], 0, Q * E);
        copy_bits16(k, r[ROLE_K_W], 0, W * lp->kdim);
        copy_bits16(v, r[ROLE_V_W], 0, W * lp->vdim);
    }
    copy_bits16(o, r[ROLE_O_W], 0, E * Q);
    layer->w16_dtype = dt;
    layer->w16_q = q;
    layer->w16_k = k;
    layer->w16_v = v;
    layer->w16_o = o;
    layer->params16 = block;
    return true;
}

/* ---- Panels ------------------------------------------------------------------------------- */

/* Weight rows (output features) widened at a time while a 16-bit matrix is packed: a multiple
 * of every kernel set's NR, so that each step's rows are whole panels. */
#define PANEL_STEP_ROWS 128

/* Packs one matrix [out_f, in_f] (fp32 `w`, or 16-bit `w16` of the layer's dtype, widened
 * exactly into `wide`, PANEL_STEP_ROWS rows of in_f floats) into panels at dst as a long
 * input's product reads them (b_packed, panel stride in_f NR): B^T rows, packed as eng__sgemm
 * would pack them, so that the products give the bits of a per-call packing. */
static void pack_matrix(const eng__kernels *ks, const eng_layer *l, const float *w,
                        const uint16_t *w16, int64_t out_f, int64_t in_f, float *wide, float *dst)
{
    if (w) {
        eng__sgemm_pack_panels(ks, w, in_f, true, in_f, out_f, dst);
        return;
    }
    for (int64_t f0 = 0; f0 < out_f; f0 += PANEL_STEP_ROWS) {
        int64_t nf = out_f - f0 < PANEL_STEP_ROWS ? out_f - f0 : PANEL_STEP_ROWS;
        const uint16_t *rows = w16 + f0 * in_f;
        for (int64_t i = 0; i < nf * in_f; i++)
            wide[i] =
                l->w16_dtype == ENG_DTYPE_F16 ? eng_f16_to_f32(rows[i]) : eng_bf16_to_f32(rows[i]);
        eng__sgemm_pack_panels(ks, wide, in_f, true, in_f, nf, dst + f0 * in_f);
    }
}

/* The layer's matrices packed into panels for the kernel set in force (none on the openblas
 * set, which packs nothing); false when memory runs out. Packing is a copy, so a layer made
 * under one set and called under another packs as it goes and loses nothing. */
static bool pack_panels(eng_layer *l)
{
    const eng__kernels *ks = eng__kernels_current();
    if (!ks->tile)
        return true;
    const int64_t E = l->embed_dim, D = eng_layer_head_dim(l), W = l->num_kv_heads * D,
                  Q = l->num_heads * D;
    const int64_t out[4] = {Q, W, W, E}, in[4] = {E, l->kdim, l->vdim, Q};
    const float *w[4] = {l->w_q, l->w_k, l->w_v, l->w_o};
    const uint16_t *w16[4] = {l->w16_q, l->w16_k, l->w16_v, l->w16_o};
    size_t floats = 0, widest = 0;
    for (int i = 0; i < 4; i++) {
        floats += eng__sgemm_panels_floats(ks, out[i], in[i]);
        widest = (size_t)in[i] > widest ? (size_t)in[i] : widest;
    }
    /* Each matrix's panels are whole panels of NR floats x depth: 64-byte multiples when NR
     * is 16 or 32, so every matrix starts aligned. */
    float *block = aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64);
    float *wide = l->params16 ? malloc(PANEL_STEP_ROWS * widest * sizeof(float)) : NULL;
    if (!block || (l->params16 && !wide)) {
        free(block);
        free(wide);
        return false;
    }
    const float **panels[4] = {&l->panels_q, &l->panels_k, &l->panels_v, &l->panels_o};
    float *at = block;
    for (int i = 0; i < 4; i++) {
        pack_matrix(ks, l, w[i], w16[i], out[i], in[i], wide, at);
        *panels[i] = at;
        at += eng__sgemm_panels_floats(ks, out[i], in[i]);
    }
    free(wide);
    l->panels = block;
    l->panels_floats = floats;
    l->panels_kernels = ks;
    return true;
}

eng_layer *eng_layer_new(const char *name, const eng_layer_weights *weights, int64_t num_heads,
                         int64_t num_kv_heads, bool keep16, eng_error *err)
{
    if (weights && (weights->q_norm_w.data || weights->q_norm_b.data || weights->k_norm_w.data ||
                    weights->k_norm_b.data || weights->sinks.data)) {
        eng__fail(err, ENG_EFORMAT,
                  weights->sinks.data ? eng__weight_label(&weights->sinks, "sinks") : "q_norm_w",
                  "q/k norms and sinks belong to decoder layers (eng_layer_decoder)");
        return NULL;
    }
    return eng__layer_assemble(name, weights, num_heads, num_kv_heads, 0, keep16, err);
}

eng_layer *eng__layer_assemble(const char *name, const eng_layer_weights *weights,
                               int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                               bool keep16, eng_error *err)
{
    layer_plan lp;
    memset(&lp, 0, sizeof lp);
    if (!weights) {
        eng__fail(err, ENG_EINVAL, "weights", "no weights");
        return NULL;
    }
    if (assign_roles(&lp, weights, err) || plan_shapes(&lp, num_heads, num_kv_heads, head_dim, err))
        return NULL;
    const eng_weight *const *r = lp.by_role;
    bool packed = r[ROLE_IN_W] != NULL, packed_bias = r[ROLE_IN_B] != NULL;
    bool bq = packed_bias || r[ROLE_Q_B], bk = packed_bias || r[ROLE_K_B];
    bool bv = packed_bias || r[ROLE_V_B];
    int64_t E = lp.E, W = lp.W, Q = lp.Q;

    eng_layer *layer = calloc(1, sizeof *layer);
    /* The matrices stay in their 16 bits (keep_matrices16) or are widened into the block. */
    eng_dtype dt = matrices_dtype(&lp);
    bool as16 = keep16 && dt != ENG_DTYPE_F32;
    int64_t total = (as16 ? 0 : 2 * E * Q + W * (lp.kdim + lp.vdim)) + Q + E + 4 * W;
    float *block = layer ? malloc((size_t)total * sizeof(float)) : NULL;
    if (!block) {
        free(layer);
        eng__fail(err, ENG_ENOMEM, "", "cannot allocate %lld parameters", (long long)total);
        return NULL;
    }
    snprintf(layer->name, sizeof layer->name, "%s", name ? name : "");
    snprintf(layer->dtype, sizeof layer->dtype, "%s", dtype_name(r[ROLE_O_W]->dtype));
    layer->embed_dim = E;
    layer->num_heads = lp.H;
    layer->head_dim = lp.D;
    layer->num_kv_heads = lp.Hkv;
    layer->kdim = lp.kdim;
    layer->vdim = lp.vdim;
    layer->params = block;
    float *at = block;
    layer->w_q = take(&at, Q * E, !as16);
    layer->w_k = take(&at, W * lp.kdim, !as16);
    layer->w_v = take(&at, W * lp.vdim, !as16);
    layer->w_o = take(&at, E * Q, !as16);
    layer->b_q = take(&at, Q, bq);
    layer->b_k = take(&at, W, bk);
    layer->b_v = take(&at, W, bv);
    layer->b_o = take(&at, E, r[ROLE_O_B] != NULL);
    layer->bias_k = take(&at, W, r[ROLE_BIAS_K] != NULL);
    layer->bias_v = take(&at, W, r[ROLE_BIAS_V] != NULL);

    if (!as16 && packed) { /* rows [0, E) are W_q, then W rows of W_k, then W rows of W_v */
        copy_elements(layer->w_q, r[ROLE_IN_W], 0, E * E);
        copy_elements(layer->w_k, r[ROLE_IN_W], E * E, W * E);
        copy_elements(layer->w_v, r[ROLE_IN_W], (E + W) * E, W * E);
    } else if (!as16) {
        copy_elements(layer->w_q, r[ROLE_Q_W], 0, Q * E);
        copy_elements(layer->w_k, r[ROLE_K_W], 0, W * lp.kdim);
        copy_elements(layer->w_v, r[ROLE_V_W], 0, W * lp.vdim);
    }
    if (packed_bias) { /* [b_q; b_k; b_v] */
        copy_elements(layer->b_q, r[ROLE_IN_B], 0, E);
        copy_elements(layer->b_k, r[ROLE_IN_B], E, W);
        copy_elements(layer->b_v, r[ROLE_IN_B], E + W, W);
    } else {
        if (bq)
            copy_elements(layer->b_q, r[ROLE_Q_B], 0, Q);
        if (bk)
            copy_elements(layer->b_k, r[ROLE_K_B], 0, W);
        if (bv)
            copy_elements(layer->b_v, r[ROLE_V_B], 0, W);
    }
    if (!as16)
        copy_elements(layer->w_o, r[ROLE_O_W], 0, E * Q);
    if (layer->b_o)
        copy_elements(layer->b_o, r[ROLE_O_B], 0, E);
    if (layer->bias_k) {
        copy_elements(layer->bias_k, r[ROLE_BIAS_K], 0, W);
        copy_elements(layer->bias_v, r[ROLE_BIAS_V], 0, W);
    }
    if (as16 && !keep_matrices16(layer, &lp, dt)) {
        eng_layer_free(layer);
        eng__fail(err, ENG_ENOMEM, "", "cannot allocate %lld parameters", (long long)total);
        return NULL;
    }
    if (!pack_panels(layer)) {
        eng_layer_free(layer);
        eng__fail(err, ENG_ENOMEM, "", "cannot allocate the packed panels of %lld parameters",
                  (long long)(2 * E * Q + W * (lp.kdim + lp.vdim)));
        return NULL;
    }
    return layer;
}

void eng_layer_free(eng_layer *layer)
{
    if (!layer)
        return;
    free(layer->params);
    free(layer->params16);
    free(layer->panels);
    free(layer->decoder_params);
    free(layer);
}

size_t eng_layer_bytes(const eng_layer *l)
{
    int64_t E = l->embed_dim, D = eng_layer_head_dim(l), W = l->num_kv_heads * D,
            Q = l->num_heads * D;
    size_t matrices = (size_t)(2 * E * Q + W * (l->kdim + l->vdim));
    size_t all = (size_t)eng_layer_params(l);
    size_t own = (l->decoder_floats + l->panels_floats) * sizeof(float);
    return own + (l->params16 ? matrices * sizeof(uint16_t) + (all - matrices) * sizeof(float)
                              : all * sizeof(float));
}

int64_t eng_layer_head_dim(const eng_layer *l)
{
    return l->head_dim > 0 ? l->head_dim : l->embed_dim / l->num_heads;
}

int64_t eng_layer_params(const eng_layer *l)
{
    int64_t E = l->embed_dim, D = eng_layer_head_dim(l), W = l->num_kv_heads * D,
            Q = l->num_heads * D;
    int64_t n = 2 * E * Q + W * (l->kdim + l->vdim);
    n += (l->b_q ? Q : 0) + (l->b_k ? W : 0) + (l->b_v ? W : 0) + (l->b_o ? E : 0);
    n += l->bias_k ? 2 * W : 0;
    return n;
}

/* ---- The demo layer ----------------------------------------------------------------------- */

#define DEMO_E     64
#define DEMO_HEADS 4
#define DEMO_SEED  UINT64_C(0x5eed0a77e47104)

/* splitmix64: a fixed, portable sequence, so the demo layer is the same everywhere. */
static double demo_uniform(uint64_t *state)
{
    uint64_t z = (*state += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    z ^= z >> 31;
    return (double)(z >> 11) / (double)(UINT64_C(1) << 53) * 2.0 - 1.0;
}

eng_layer *eng_layer_demo(void)
{
    enum { E = DEMO_E };
    /* Generated as a torch state dict would hold them, then assembled like any other layer. */
    float *buf = malloc((size_t)(4 * E * E + 4 * E) * sizeof(float));
    if (!buf)
        return NULL;
    float *w = buf, *b = w + 3 * E * E, *ow = b + 3 * E, *ob = ow + E * E;
    uint64_t state = DEMO_SEED;
    double bound = 1.0 / sqrt((double)E);
    for (int i = 0; i < 3 * E * E; i++)
        w[i] = (float)(demo_uniform(&state) * bound);
    for (int i = 0; i < 3 * E; i++)
        b[i] = (float)(demo_uniform(&state) * bound);
    for (int i = 0; i < E * E; i++)
        ow[i] = (float)(demo_uniform(&state) * bound);
    for (int i = 0; i < E; i++)
        ob[i] = (float)(demo_uniform(&state) * bound);
    eng_layer_weights t;
    memset(&t, 0, sizeof t);
    t.in_proj_w = (eng_weight){NULL, ENG_DTYPE_F32, w, 2, {3 * E, E}};
    t.in_proj_b = (eng_weight){NULL, ENG_DTYPE_F32, b, 1, {3 * E}};
    t.o_w = (eng_weight){NULL, ENG_DTYPE_F32, ow, 2, {E, E}};
    t.o_b = (eng_weight){NULL, ENG_DTYPE_F32, ob, 1, {E}};
    eng_layer *layer = eng_layer_new("demo", &t, DEMO_HEADS, 0, false, NULL);
    free(buf);
    return layer;
}
