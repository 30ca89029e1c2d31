/*
 * ref_mha.c - the float64 reference multi-head attention layer of ref_mha.h.
 *
 * Written for obviousness, not speed: every intermediate (inputs with their encodings, the
 * projections, the appended keys, each head's output) is its own double array, each step one
 * loop nest that reads like the formula in docs/semantics.md. The attention core is written
 * here rather than borrowed from ref_sdpa so that the projected q, k and v stay in double and
 * the MHA-specific rules (input-key positions, appended keys untouched by masks and ALiBi)
 * are spelled out where they apply.
 */
#include "tests/support/ref_mha.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/ref.h"

ref_mha_weights ref_mha_weights_of_layer(const eng_layer *l)
{
    ref_mha_weights w = {
        .embed_dim = l->embed_dim,
        .num_heads = l->num_heads,
        .num_kv_heads = l->num_kv_heads,
        .kdim = l->kdim,
        .vdim = l->vdim,
        .w_q = l->w_q,
        .w_k = l->w_k,
        .w_v = l->w_v,
        .w_o = l->w_o,
        .b_q = l->b_q,
        .b_k = l->b_k,
        .b_v = l->b_v,
        .b_o = l->b_o,
        .bias_k = l->bias_k,
        .bias_v = l->bias_v,
    };
    return w;
}

void ref_mha_result_free(ref_mha_result *res)
{
    free(res->out);
    free(res->weights);
    free(res->weights_mean);
    res->out = res->weights = res->weights_mean = NULL;
}

void ref_rope_rotate(double *v, int64_t head_dim, int64_t pos, double base, eng_rope_style style)
{
    int64_t half = head_dim / 2;
    for (int64_t d = 0; d < half; d++) {
        double theta = (double)pos * pow(base, -2.0 * (double)d / (double)head_dim);
        int64_t i = style == ENG_ROPE_HALF ? d : 2 * d;
        int64_t j = style == ENG_ROPE_HALF ? d + half : 2 * d + 1;
        double a = v[i], b = v[j];
        v[i] = a * cos(theta) - b * sin(theta);
        v[j] = a * sin(theta) + b * cos(theta);
    }
}

double ref_sinusoid(int64_t pos, int64_t c, int64_t dim)
{
    int64_t i = c / 2;
    double angle = (double)pos / pow(10000.0, 2.0 * (double)i / (double)dim);
    return c % 2 == 0 ? sin(angle) : cos(angle);
}

/* rows x in_f inputs (float) into double, plus the sinusoid at positions pos0.. when asked. */
static void load_input(double *dst, const float *src, int64_t rows, int64_t in_f, bool sinusoid,
                       int64_t pos0)
{
    for (int64_t t = 0; t < rows; t++)
        for (int64_t c = 0; c < in_f; c++)
            dst[t * in_f + c] =
                (double)src[t * in_f + c] + (sinusoid ? ref_sinusoid(pos0 + t, c, in_f) : 0.0);
}

/* y[t] = W x[t] + b for `rows` tokens: W is [out_f, in_f] fp32, b [out_f] or NULL. */
static void linear(double *y, const double *x, int64_t rows, const float *w, const float *b,
                   int64_t out_f, int64_t in_f)
{
    for (int64_t t = 0; t < rows; t++)
        for (int64_t f = 0; f < out_f; f++) {
            double acc = b ? (double)b[f] : 0.0;
            for (int64_t c = 0; c < in_f; c++)
                acc += (double)w[f * in_f + c] * x[t * in_f + c];
            y[t * out_f + f] = acc;
        }
}

/* Offset of attn_mask entry (b, h, i, j): a dimension of extent 1 broadcasts. */
static int64_t mask_offset(const eng_mask *m, int64_t b, int64_t h, int64_t i, int64_t j)
{
    int64_t idx[4] = {b, h, i, j}, off = 0;
    for (int d = 0; d < 4; d++)
        if (m->ne[d] != 1)
            off += idx[d] * m->stride[d];
    return off;
}

/* Whether input key j (j < S) may be seen by query i at position p in batch b, head h: the
 * rules of docs/semantics.md#which-keys-a-query-sees that hide a key outright. */
static bool input_key_visible(const eng_mha_args *a, int64_t b, int64_t h, int64_t i, int64_t p,
                              int64_t j)
{
    if (a->causal && !(j <= p))
        return false;
    if (a->window_left_set && !(p - a->window_left <= j))
        return false;
    if (a->window_right_set && !(j <= p + a->window_right))
        return false;
    if (a->key_padding && a->key_padding[b * a->key_padding_stride + j] != 0)
        return false; /* key_padding_mask: true means padding, ignore */
    if (a->attn_mask.kind == ENG_MASK_BOOL &&
        ((const uint8_t *)a->attn_mask.data)[mask_offset(&a->attn_mask, b, h, i, j)] == 0)
        return false; /* boolean attn_mask: true means may attend */
    return true;
}

bool ref_mha(const ref_mha_weights *w, const eng_mha_args *a, ref_mha_result *res)
{
    bool self = a->key_in == NULL;
    int64_t B = a->B, L = a->L, S = self ? a->L : a->S;
    int64_t E = w->embed_dim, H = w->num_heads, Hkv = w->num_kv_heads, D = E / H, W = Hkv * D;
    int64_t kdim = self ? E : w->kdim, vdim = self ? E : w->vdim;
    int64_t extra = (w->bias_k ? 1 : 0) + (a->add_zero_attn ? 1 : 0);
    int64_t Sx = S + extra, group = H / Hkv;
    int64_t offset = a->align == ENG_ALIGN_BOTTOM_RIGHT ? S - L
                     : a->align == ENG_ALIGN_OFFSET     ? a->query_offset
                                                        : 0;
    bool sinusoid = a->positional == ENG_POSITIONAL_SINUSOIDAL;
    bool rope = a->positional == ENG_POSITIONAL_ROPE;
    bool alibi = a->positional == ENG_POSITIONAL_ALIBI;
    double base = a->rope_base > 0.0f ? (double)a->rope_base : 10000.0;
    double scale = 1.0 / sqrt((double)D);

    memset(res, 0, sizeof *res);
    res->B = B, res->L = L, res->S = S, res->S_ext = Sx, res->E = E, res->H = H;
    res->out = calloc((size_t)(B * L * E), sizeof(double));
    if (a->weights_mode != ENG_WEIGHTS_NONE)
        res->weights = calloc((size_t)(B * H * L * Sx), sizeof(double));
    if (a->weights_mode == ENG_WEIGHTS_MEAN)
        res->weights_mean = calloc((size_t)(B * L * Sx), sizeof(double));
    double *xq = calloc((size_t)(L * E), sizeof(double));
    double *xk = calloc((size_t)(S * kdim), sizeof(double));
    double *xv = calloc((size_t)(S * vdim), sizeof(double));
    double *q = calloc((size_t)(L * E), sizeof(double));
    double *k = calloc((size_t)(Sx * W), sizeof(double));
    double *v = calloc((size_t)(Sx * W), sizeof(double));
    double *o = calloc((size_t)(L * E), sizeof(double));
    double *score = calloc((size_t)Sx, sizeof(double));
    bool *seen = calloc((size_t)Sx, sizeof(bool));
    double *slopes = calloc((size_t)H, sizeof(double));
    bool ok = res->out && (a->weights_mode == ENG_WEIGHTS_NONE || res->weights) &&
              (a->weights_mode != ENG_WEIGHTS_MEAN || res->weights_mean) && xq && xk && xv && q &&
              k && v && o && score && seen && slopes;
    if (!ok)
        goto done;
    if (alibi)
        ref_alibi_default_slopes(H, slopes);

    for (int64_t b = 0; b < B; b++) {
        /* Inputs, with the sinusoid added before the projections: queries at p_i, keys at j. */
        const float *x = a->x + b * L * E;
        const float *mk = self ? x : a->key_in + b * S * kdim;
        const float *mv = self ? x : a->value_in + b * S * vdim;
        load_input(xq, x, L, E, sinusoid, offset);
        load_input(xk, mk, S, kdim, sinusoid, 0);
        load_input(xv, mv, S, vdim, sinusoid, 0);

        /* Projections; the appended keys come after the S projected ones. */
        linear(q, xq, L, w->w_q, w->b_q, E, E);
        linear(k, xk, S, w->w_k, w->b_k, W, kdim);
        linear(v, xv, S, w->w_v, w->b_v, W, vdim);
        if (rope) {
            for (int64_t i = 0; i < L; i++)
                for (int64_t h = 0; h < H; h++)
                    ref_rope_rotate(q + i * E + h * D, D, offset + i, base, a->rope_style);
            for (int64_t j = 0; j < S; j++)
                for (int64_t h = 0; h < Hkv; h++)
                    ref_rope_rotate(k + j * W + h * D, D, j, base, a->rope_style);
        }
        int64_t next = S;
        if (w->bias_k) {
            for (int64_t c = 0; c < W; c++) {
                k[next * W + c] = (double)w->bias_k[c];
                v[next * W + c] = (double)w->bias_v[c];
            }
            next++;
        }
        if (a->add_zero_attn) {
            for (int64_t c = 0; c < W; c++)
                k[next * W + c] = v[next * W + c] = 0.0;
            next++;
        }

        /* Attention per head: a two-pass softmax over the visible keys. */
        for (int64_t h = 0; h < H; h++) {
            int64_t hk = h / group;
            for (int64_t i = 0; i < L; i++) {
                int64_t p = i + offset;
                double m = -INFINITY;
                for (int64_t j = 0; j < Sx; j++) {
                    bool appended = j >= S;
                    seen[j] = appended || input_key_visible(a, b, h, i, p, j);
                    if (!seen[j])
                        continue;
                    double dot = 0;
                    for (int64_t d = 0; d < D; d++)
                        dot += q[i * E + h * D + d] * k[j * W + hk * D + d];
                    double s = scale * dot;
                    if (!appended && a->attn_mask.kind == ENG_MASK_FLOAT)
                        s +=
                            (double)((const float *)
                                         a->attn_mask.data)[mask_offset(&a->attn_mask, b, h, i, j)];
                    if (!appended && alibi)
                        s -= slopes[h] * fabs((double)(p - j));
                    if (s == -INFINITY) { /* a float mask of -inf hides the key */
                        seen[j] = false;
                        continue;
                    }
                    score[j] = s;
                    m = s > m ? s : m;
                }
                double *oh = o + i * E + h * D;
                for (int64_t d = 0; d < D; d++)
                    oh[d] = 0.0;
                if (m == -INFINITY) {
                    res->rows_empty++;
                    continue;
                }
                double sum = 0;
                for (int64_t j = 0; j < Sx; j++)
                    if (seen[j])
                        sum += exp(score[j] - m);
                for (int64_t j = 0; j < Sx; j++) {
                    if (!seen[j])
                        continue;
                    double p_ij = exp(score[j] - m) / sum;
                    for (int64_t d = 0; d < D; d++)
                        oh[d] += p_ij * v[j * W + hk * D + d];
                    if (res->weights)
                        res->weights[((b * H + h) * L + i) * Sx + j] = p_ij;
                    if (res->weights_mean)
                        res->weights_mean[(b * L + i) * Sx + j] += p_ij / (double)H;
                }
            }
        }

        /* The output projection of the concatenated heads. */
        linear(res->out + b * L * E, o, L, w->w_o, w->b_o, E, E);
    }

done:
    free(xq);
    free(xk);
    free(xv);
    free(q);
    free(k);
    free(v);
    free(o);
    free(score);
    free(seen);
    free(slopes);
    if (!ok)
        ref_mha_result_free(res);
    return ok;
}
