/*
 * ref.c - the float64 reference SDPA of ref.h.
 *
 * Written for obviousness, not speed: one score per (b, h, i, j) from the strided views, the
 * visibility rules as one predicate that mirrors docs/semantics.md line by line, a two-pass
 * softmax (maximum, then sum) in double, and the output as the weighted sum of value rows.
 */
#include "tests/support/ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

double ref_view_at(const eng_view *view, int64_t i0, int64_t i1, int64_t i2, int64_t i3)
{
    return (double)view->data[i0 * view->stride[0] + i1 * view->stride[1] + i2 * view->stride[2] +
                              i3 * view->stride[3]];
}

int64_t ref_query_offset(const eng_sdpa_args *args)
{
    int64_t L = args->q.ne[2], S = args->k.ne[2];
    switch (args->align) {
    case ENG_ALIGN_TOP_LEFT:
        return 0;
    case ENG_ALIGN_BOTTOM_RIGHT:
        return S - L;
    case ENG_ALIGN_OFFSET:
        return args->query_offset;
    }
    return 0;
}

/* Offset in elements of mask entry (b, h, i, j): a dimension of extent 1 broadcasts. */
static int64_t mask_index(const eng_mask *m, int64_t b, int64_t h, int64_t i, int64_t j)
{
    int64_t idx[4] = {b, h, i, j}, off = 0;
    for (int d = 0; d < 4; d++)
        if (m->ne[d] != 1)
            off += idx[d] * m->stride[d];
    return off;
}

/* Whether key j is one of the open tail keys (appended keys every query sees). */
static bool open_tail(const eng_sdpa_args *a, int64_t j)
{
    return j >= a->k.ne[2] - a->open_tail_keys;
}

bool ref_key_visible(const eng_sdpa_args *a, int64_t b, int64_t h, int64_t i, int64_t j)
{
    int64_t p = i + ref_query_offset(a); /* the query's position; key j sits at j */

    /* open_tail_keys: the last keys are seen by every query, whatever the rules below say. */
    if (open_tail(a, j))
        return true;

    /* causal: j <= p_i */
    if (a->causal && !(j <= p))
        return false;
    /* window [left, right]: p_i - left <= j <= p_i + right, an unset side unbounded */
    if (a->window_left_set && !(p - a->window_left <= j))
        return false;
    if (a->window_right_set && !(j <= p + a->window_right))
        return false;
    /* key_padding_mask: nonzero means padding, ignore */
    if (a->key_padding && a->key_padding[b * a->key_padding_stride + j] != 0)
        return false;
    /* kv_lengths: keys at j >= kv_lengths[b] are ignored */
    if (a->kv_lengths && j >= a->kv_lengths[b])
        return false;
    /* boolean attn_mask: nonzero means may attend */
    if (a->attn_mask.kind == ENG_MASK_BOOL &&
        ((const uint8_t *)a->attn_mask.data)[mask_index(&a->attn_mask, b, h, i, j)] == 0)
        return false;
    return true;
}

void ref_alibi_default_slopes(int64_t heads, double *slopes)
{
    int64_t n = 1;
    while (n * 2 <= heads)
        n *= 2;
    /* The power-of-two set for n heads: 2^(-8(h+1)/n). */
    for (int64_t h = 0; h < n; h++)
        slopes[h] = exp2(-8.0 * (double)(h + 1) / (double)n);
    /* The rest: every other slope (indices 0, 2, 4, ...) of the set for 2n heads. */
    for (int64_t h = n, idx = 0; h < heads; h++, idx += 2)
        slopes[h] = exp2(-8.0 * (double)(idx + 1) / (double)(2 * n));
}

void ref_result_free(ref_result *res)
{
    free(res->out);
    free(res->lse);
    free(res->weights);
    free(res->weights_mean);
    res->out = res->lse = res->weights = res->weights_mean = NULL;
}

bool ref_sdpa(const eng_sdpa_args *a, ref_result *res)
{
    int64_t B = a->q.ne[0], H = a->q.ne[1], L = a->q.ne[2], D = a->q.ne[3];
    int64_t Hkv = a->k.ne[1], S = a->k.ne[2], Dv = a->v.ne[3];
    int64_t group = H / Hkv;
    int64_t offset = ref_query_offset(a);
    double scale = a->scale_set ? (double)a->scale : 1.0 / sqrt((double)D);
    bool want_weights = a->weights_mode != ENG_WEIGHTS_NONE;

    memset(res, 0, sizeof *res);
    res->B = B, res->H = H, res->Hkv = Hkv, res->L = L, res->S = S, res->D = D, res->Dv = Dv;
    res->out = calloc((size_t)(B * H * L * Dv), sizeof(double));
    res->lse = calloc((size_t)(B * H * L), sizeof(double));
    if (want_weights)
        res->weights = calloc((size_t)(B * H * L * S), sizeof(double));
    if (a->weights_mode == ENG_WEIGHTS_MEAN)
        res->weights_mean = calloc((size_t)(B * L * S), sizeof(double));
    /* Additive scoring: W_q q_i and W_k k_j, kept per row and per key of the current head. */
    bool additive = a->additive_w_q != NULL;
    int64_t A = additive ? a->additive_dim : 1;
    double *slopes = calloc((size_t)H, sizeof(double));
    double *score = calloc((size_t)S, sizeof(double));
    bool *seen = calloc((size_t)S, sizeof(bool));
    double *qproj = calloc((size_t)A, sizeof(double));
    double *kproj = calloc((size_t)(additive ? S * A : 1), sizeof(double));
    if (!res->out || !res->lse || (want_weights && !res->weights) ||
        (a->weights_mode == ENG_WEIGHTS_MEAN && !res->weights_mean) || !slopes || !score || !seen ||
        !qproj || !kproj) {
        free(slopes);
        free(score);
        free(seen);
        free(qproj);
        free(kproj);
        ref_result_free(res);
        return false;
    }
    if (a->alibi) {
        if (a->alibi_slopes)
            for (int64_t h = 0; h < H; h++)
                slopes[h] = (double)a->alibi_slopes[h];
        else
            ref_alibi_default_slopes(H, slopes);
    }

    for (int64_t b = 0; b < B; b++) {
        for (int64_t h = 0; h < H; h++) {
            int64_t hk = h / group; /* grouped-query attention: the kv head of query head h */
            if (additive)
                for (int64_t j = 0; j < S; j++)
                    for (int64_t t = 0; t < A; t++) {
                        double x = 0;
                        for (int64_t d = 0; d < D; d++)
                            x += (double)a->additive_w_k[t * D + d] *
                                 ref_view_at(&a->k, b, hk, j, d);
                        kproj[j * A + t] = x;
                    }
            for (int64_t i = 0; i < L; i++) {
                int64_t p = i + offset;
                int64_t row = (b * H + h) * L + i;
                double m = -INFINITY;
                if (additive)
                    for (int64_t t = 0; t < A; t++) {
                        double x = 0;
                        for (int64_t d = 0; d < D; d++)
                            x +=
                                (double)a->additive_w_q[t * D + d] * ref_view_at(&a->q, b, h, i, d);
                        qproj[t] = x;
                    }
                for (int64_t j = 0; j < S; j++) {
                    seen[j] = ref_key_visible(a, b, h, i, j);
                    if (!seen[j])
                        continue;
                    double s = 0;
                    if (additive) {
                        /* Bahdanau: s = v . tanh(W_q q + W_k k), no scale. */
                        for (int64_t t = 0; t < A; t++)
                            s += (double)a->additive_v[t] * tanh(qproj[t] + kproj[j * A + t]);
                    } else {
                        for (int64_t d = 0; d < D; d++)
                            s += ref_view_at(&a->q, b, h, i, d) * ref_view_at(&a->k, b, hk, j, d);
                        s *= scale;
                    }
                    /* Softcap acts on the raw score, before masks and biases. */
                    if (a->softcap > 0)
                        s = (double)a->softcap * tanh(s / (double)a->softcap);
                    /* Masks and biases do not touch the open tail keys. */
                    if (a->attn_mask.kind == ENG_MASK_FLOAT && !open_tail(a, j))
                        s += (double)((const float *)
                                          a->attn_mask.data)[mask_index(&a->attn_mask, b, h, i, j)];
                    if (a->alibi && !open_tail(a, j))
                        s -= slopes[h] * fabs((double)(p - j));
                    /* A float mask of -inf hides the key as surely as a boolean false. */
                    if (s == -INFINITY) {
                        seen[j] = false;
                        continue;
                    }
                    score[j] = s;
                    if (s > m)
                        m = s;
                }
                if (m == -INFINITY) {
                    /* No visible key: output 0 and weights 0 (already zeroed), lse -inf. */
                    res->lse[row] = -INFINITY;
                    res->rows_empty++;
                    continue;
                }
                double sum = 0;
                for (int64_t j = 0; j < S; j++)
                    if (seen[j])
                        sum += exp(score[j] - m);
                res->lse[row] = m + log(sum);
                for (int64_t j = 0; j < S; j++) {
                    if (!seen[j])
                        continue;
                    double w = exp(score[j] - m) / sum;
                    for (int64_t c = 0; c < Dv; c++)
                        res->out[row * Dv + c] += w * ref_view_at(&a->v, b, hk, j, c);
                    if (want_weights)
                        res->weights[row * S + j] = w;
                    if (res->weights_mean)
                        res->weights_mean[(b * L + i) * S + j] += w / (double)H;
                }
            }
        }
    }
    free(slopes);
    free(score);
    free(seen);
    free(qproj);
    free(kproj);
    return true;
}
