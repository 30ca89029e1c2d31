/*
 * ref.c - the float64 reference SDPA of ref.h.
 *
 * Written for obviousness first: one score per (b, h, i, j), the visibility rules as one
 * predicate that mirrors docs/semantics.md line by line, a two-pass softmax (maximum, then sum)
 * in double, and the output as the weighted sum of value rows. Two things keep it from being
 * the slowest part of the suites that run it on every kernel set and sanitizer: a head's keys
 * and values are copied once into contiguous doubles, and four keys' dot products run side by
 * side (each still summed in order, so the bits are those of one at a time).
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

/* One (batch, head) of the reference at a time: that head's query row, keys and values copied
 * once out of the strided views into contiguous doubles, so that the loops over keys read
 * arrays rather than recomputing a strided offset per element. */
typedef struct {
    const eng_sdpa_args *a;
    int64_t H, L, S, D, Dv, A, offset;
    double scale;
    bool additive;
    double *slopes; /* [H], ALiBi's */
    double *score;  /* [S]: the current row's scores, then exp(score - max) */
    bool *seen;     /* [S]: whether the current row sees key j */
    double *qrow;   /* [D] */
    double *keys;   /* [S, D] of the current kv head */
    double *values; /* [S, Dv] of the current kv head */
    double *qproj;  /* [A]: W_q q_i (additive scoring) */
    double *kproj;  /* [S, A]: W_k k_j (additive scoring) */
} ref_head;

static void ref_head_free(ref_head *r)
{
    free(r->slopes);
    free(r->score);
    free(r->seen);
    free(r->qrow);
    free(r->keys);
    free(r->values);
    free(r->qproj);
    free(r->kproj);
}

static bool ref_head_init(ref_head *r, const eng_sdpa_args *a)
{
    memset(r, 0, sizeof *r);
    r->a = a;
    r->H = a->q.ne[1], r->L = a->q.ne[2], r->D = a->q.ne[3];
    r->S = a->k.ne[2], r->Dv = a->v.ne[3];
    r->offset = ref_query_offset(a);
    r->scale = a->scale_set ? (double)a->scale : 1.0 / sqrt((double)r->D);
    r->additive = a->additive_w_q != NULL;
    r->A = r->additive ? a->additive_dim : 1;
    size_t S = (size_t)r->S;
    r->slopes = calloc((size_t)r->H, sizeof(double));
    r->score = calloc(S, sizeof(double));
    r->seen = calloc(S, sizeof(bool));
    r->qrow = calloc((size_t)r->D, sizeof(double));
    r->keys = calloc(S * (size_t)r->D, sizeof(double));
    r->values = calloc(S * (size_t)r->Dv, sizeof(double));
    r->qproj = calloc((size_t)r->A, sizeof(double));
    r->kproj = calloc(r->additive ? S * (size_t)r->A : 1, sizeof(double));
    if (!r->slopes || !r->score || !r->seen || !r->qrow || !r->keys || !r->values || !r->qproj ||
        !r->kproj) {
        ref_head_free(r);
        return false;
    }
    if (a->alibi) {
        if (a->alibi_slopes)
            for (int64_t h = 0; h < r->H; h++)
                r->slopes[h] = (double)a->alibi_slopes[h];
        else
            ref_alibi_default_slopes(r->H, r->slopes);
    }
    return true;
}

/* Rows [0, rows) of view (i0, i1, ., .) as contiguous doubles, cols per row. */
static void gather(const eng_view *view, int64_t i0, int64_t i1, int64_t rows, int64_t cols,
                   double *dst)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            dst[r * cols + c] = ref_view_at(view, i0, i1, r, c);
}

/* The keys and values of kv head hk of batch b (and W_k k_j for additive scoring). */
static void load_kv_head(ref_head *r, int64_t b, int64_t hk)
{
    const eng_sdpa_args *a = r->a;
    gather(&a->k, b, hk, r->S, r->D, r->keys);
    gather(&a->v, b, hk, r->S, r->Dv, r->values);
    if (!r->additive)
        return;
    for (int64_t j = 0; j < r->S; j++)
        for (int64_t t = 0; t < r->A; t++) {
            double x = 0;
            for (int64_t d = 0; d < r->D; d++)
                x += (double)a->additive_w_k[t * r->D + d] * r->keys[j * r->D + d];
            r->kproj[j * r->A + t] = x;
        }
}

/* q . k_j for the visible keys j, into score[j]. Four keys at a time, each still its own sum
 * over d in order: the bits of one key at a time, without waiting on one addition chain. */
static void dot_scores(ref_head *r)
{
    int64_t D = r->D, j = 0;
    for (; j + 4 <= r->S; j += 4) {
        if (!(r->seen[j] || r->seen[j + 1] || r->seen[j + 2] || r->seen[j + 3]))
            continue;
        const double *k = r->keys + j * D;
        double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (int64_t d = 0; d < D; d++) {
            s0 += r->qrow[d] * k[d];
            s1 += r->qrow[d] * k[D + d];
            s2 += r->qrow[d] * k[2 * D + d];
            s3 += r->qrow[d] * k[3 * D + d];
        }
        r->score[j] = s0, r->score[j + 1] = s1, r->score[j + 2] = s2, r->score[j + 3] = s3;
    }
    for (; j < r->S; j++) {
        double s = 0;
        for (int64_t d = 0; d < D; d++)
            s += r->qrow[d] * r->keys[j * D + d];
        r->score[j] = s;
    }
}

/* The scores of query row i of head h (batch b) after every option; returns their maximum
 * (-inf when no key is seen), with seen[j] false for each hidden key. */
static double row_scores(ref_head *r, int64_t b, int64_t h, int64_t i)
{
    const eng_sdpa_args *a = r->a;
    int64_t p = i + r->offset;
    double m = -INFINITY;
    for (int64_t d = 0; d < r->D; d++)
        r->qrow[d] = ref_view_at(&a->q, b, h, i, d);
    for (int64_t j = 0; j < r->S; j++)
        r->seen[j] = ref_key_visible(a, b, h, i, j);
    if (r->additive)
        for (int64_t t = 0; t < r->A; t++) {
            double x = 0;
            for (int64_t d = 0; d < r->D; d++)
                x += (double)a->additive_w_q[t * r->D + d] * r->qrow[d];
            r->qproj[t] = x;
        }
    else
        dot_scores(r);
    for (int64_t j = 0; j < r->S; j++) {
        if (!r->seen[j])
            continue;
        double s = 0;
        if (r->additive) {
            /* Bahdanau: s = v . tanh(W_q q + W_k k), no scale. */
            for (int64_t t = 0; t < r->A; t++)
                s += (double)a->additive_v[t] * tanh(r->qproj[t] + r->kproj[j * r->A + t]);
        } else {
            s = r->score[j] * r->scale;
        }
        /* Softcap acts on the raw score, before masks and biases. */
        if (a->softcap > 0)
            s = (double)a->softcap * tanh(s / (double)a->softcap);
        /* Masks and biases do not touch the open tail keys. */
        if (a->attn_mask.kind == ENG_MASK_FLOAT && !open_tail(a, j))
            s += (double)((const float *)a->attn_mask.data)[mask_index(&a->attn_mask, b, h, i, j)];
        if (a->alibi && !open_tail(a, j))
            s -= r->slopes[h] * fabs((double)(p - j));
        /* A float mask of -inf hides the key as surely as a boolean false. */
        if (s == -INFINITY) {
            r->seen[j] = false;
            continue;
        }
        r->score[j] = s;
        if (s > m)
            m = s;
    }
    return m;
}

/* out = sum of score[j] v_j over the seen keys j, in the order of j. Where four keys in a row
 * are seen, one pass over out adds all four, in the same order as one key at a time (a hidden
 * key's value is never touched: it may hold anything). */
static void weighted_values(const ref_head *r, double *out)
{
    int64_t Dv = r->Dv, j = 0;
    while (j < r->S) {
        const double *v = r->values + j * Dv, *w = r->score + j;
        if (j + 4 <= r->S && r->seen[j] && r->seen[j + 1] && r->seen[j + 2] && r->seen[j + 3]) {
            for (int64_t c = 0; c < Dv; c++)
                out[c] = out[c] + w[0] * v[c] + w[1] * v[Dv + c] + w[2] * v[2 * Dv + c] +
                         w[3] * v[3 * Dv + c];
            j += 4;
            continue;
        }
        if (r->seen[j])
            for (int64_t c = 0; c < Dv; c++)
                out[c] += w[0] * v[c];
        j++;
    }
}

bool ref_sdpa(const eng_sdpa_args *a, ref_result *res)
{
    int64_t B = a->q.ne[0], H = a->q.ne[1], L = a->q.ne[2], D = a->q.ne[3];
    int64_t Hkv = a->k.ne[1], S = a->k.ne[2], Dv = a->v.ne[3];
    int64_t group = H / Hkv;
    bool want_weights = a->weights_mode != ENG_WEIGHTS_NONE;
    ref_head r;

    memset(res, 0, sizeof *res);
    res->B = B, res->H = H, res->Hkv = Hkv, res->L = L, res->S = S, res->D = D, res->Dv = Dv;
    res->out = calloc((size_t)(B * H * L * Dv), sizeof(double));
    res->lse = calloc((size_t)(B * H * L), sizeof(double));
    if (want_weights)
        res->weights = calloc((size_t)(B * H * L * S), sizeof(double));
    if (a->weights_mode == ENG_WEIGHTS_MEAN)
        res->weights_mean = calloc((size_t)(B * L * S), sizeof(double));
    if (!res->out || !res->lse || (want_weights && !res->weights) ||
        (a->weights_mode == ENG_WEIGHTS_MEAN && !res->weights_mean) || !ref_head_init(&r, a)) {
        ref_result_free(res);
        return false;
    }

    for (int64_t b = 0; b < B; b++) {
        for (int64_t h = 0; h < H; h++) {
            if (h % group == 0) /* grouped-query attention: query head h reads kv head h / group */
                load_kv_head(&r, b, h / group);
            for (int64_t i = 0; i < L; i++) {
                int64_t row = (b * H + h) * L + i;
                double m = row_scores(&r, b, h, i);
                if (m == -INFINITY) {
                    /* No visible key: output 0 and weights 0 (already zeroed), lse -inf. */
                    res->lse[row] = -INFINITY;
                    res->rows_empty++;
                    continue;
                }
                double sum = 0;
                for (int64_t j = 0; j < S; j++)
                    if (r.seen[j]) {
                        r.score[j] = exp(r.score[j] - m);
                        sum += r.score[j];
                    }
                res->lse[row] = m + log(sum);
                for (int64_t j = 0; j < S; j++)
                    if (r.seen[j])
                        r.score[j] /= sum;
                weighted_values(&r, res->out + row * Dv);
                for (int64_t j = 0; j < S; j++) {
                    if (!r.seen[j])
                        continue;
                    if (want_weights)
                        res->weights[row * S + j] = r.score[j];
                    if (res->weights_mean)
                        res->weights_mean[(b * L + i) * S + j] += r.score[j] / (double)H;
                }
            }
        }
    }
    ref_head_free(&r);
    return true;
}
