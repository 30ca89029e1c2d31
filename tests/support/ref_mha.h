/*
 * ref_mha.h - a float64 reference for eng_mha: torch's nn.MultiheadAttention forward, written
 * out naively from docs/semantics.md#multi-head-attention-layers.
 *
 * The engine projects with fp32 sgemm, rotates in place, appends keys into a packed K|V
 * buffer, runs its blocked SDPA kernel over strided head views and projects again. The
 * reference does each step as the textbook formula in double, one element at a time, on
 * separate arrays, so that the two share nothing but the specification:
 *
 *   xq = x (+ PE at positions p_i = i + offset)         xk, xv = memory or x (+ PE at j)
 *   q = xq W_q^T + b_q    k = xk W_k^T + b_k    v = xv W_v^T + b_v       (RoPE on q, k heads)
 *   keys S..S'-1: bias_k/bias_v (add_bias_kv), then a zero key and value (add_zero_attn)
 *   per query head h, kv head h / (H / Hkv): softmax over visible keys of
 *       q.k / sqrt(D) + float mask - slope_h |p_i - j|
 *   out = concat(heads) W_o^T + b_o
 *
 * The appended keys are visible to every query and get no mask or ALiBi term (torch pads its
 * masks with "attend" for them; engine.h says the same). Positions: p_i = i + offset where the
 * offset is 0 (top-left), S - L with S the number of *input* keys (bottom-right), or
 * query_offset; key j sits at j. Masks have the polarity of docs/semantics.md: a boolean
 * attn_mask entry that is nonzero means "may attend", a key_padding entry that is nonzero
 * means "ignore". A query row with no visible key gives attention output 0 (so the layer
 * output is b_o) and weights 0.
 *
 *     ref_mha_weights w = ref_mha_weights_of_layer(layer);   // or filled from test arrays
 *     ref_mha_result r;
 *     if (!ref_mha(&w, &args, &r)) { ... out of memory ... }
 *     // r.out[(b * L + i) * E + c], r.weights[((b * H + h) * L + i) * S_ext + j]
 *     ref_mha_result_free(&r);
 *
 * The reference trusts its arguments (only ever given what eng_mha accepts), reads every
 * option of eng_mha_args except `layer`, `out` and `weights`, writes nothing it is given and is
 * single-threaded.
 */
#ifndef ATTND_TESTS_REF_MHA_H
#define ATTND_TESTS_REF_MHA_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/engine.h"

/* A layer's parameters as torch stores them: row-major [out_features, in_features]. Every
 * pointer is borrowed; a NULL bias means the layer has none. W = num_kv_heads * D. */
typedef struct {
    int64_t embed_dim, num_heads, num_kv_heads, kdim, vdim;
    const float *w_q;                   /* [E, E]    */
    const float *w_k;                   /* [W, kdim] */
    const float *w_v;                   /* [W, vdim] */
    const float *w_o;                   /* [E, E]    */
    const float *b_q, *b_k, *b_v, *b_o; /* [E], [W], [W], [E] or NULL */
    const float *bias_k, *bias_v;       /* [W] each (add_bias_kv) or both NULL */
} ref_mha_weights;

/* The reference's answer. Every array is contiguous row-major. */
typedef struct {
    int64_t B, L, S, S_ext, E, H;
    double *out;          /* [B, L, E] */
    double *weights;      /* [B, H, L, S_ext]; NULL when weights_mode is ENG_WEIGHTS_NONE */
    double *weights_mean; /* [B, L, S_ext], the mean over heads; NULL unless ENG_WEIGHTS_MEAN */
    int64_t rows_empty;   /* (b, h, i) rows with no visible key */
} ref_mha_result;

/* The weights of an engine layer (borrowed from it). */
ref_mha_weights ref_mha_weights_of_layer(const eng_layer *layer);

/* Computes the layer's forward pass for `args` (args->layer is ignored: `w` is the layer) in
 * double precision into `res`, which it allocates. False only when memory runs out. */
bool ref_mha(const ref_mha_weights *w, const eng_mha_args *args, ref_mha_result *res);

/* Frees what ref_mha allocated; safe on a zeroed or already freed result. */
void ref_mha_result_free(ref_mha_result *res);

/* Rotates one head vector v[0..head_dim-1] (head_dim even) to position `pos`: pair d, for
 * d < head_dim/2, turns by pos * base^(-2d/head_dim); the pair is (d, d + head_dim/2) for
 * ENG_ROPE_HALF and (2d, 2d + 1) for ENG_ROPE_INTERLEAVED; (a, b) -> (a cos - b sin,
 * a sin + b cos). */
void ref_rope_rotate(double *v, int64_t head_dim, int64_t pos, double base, eng_rope_style style);

/* The sinusoidal encoding of channel c of a `dim`-wide input at position pos:
 * sin(pos / 10000^(2i/dim)) for c = 2i, cos(pos / 10000^(2i/dim)) for c = 2i + 1. */
double ref_sinusoid(int64_t pos, int64_t c, int64_t dim);

#endif
