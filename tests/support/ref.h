/*
 * ref.h - a float64 reference for eng_sdpa: naive, slow and obviously right.
 *
 * The engine is a blocked fp32 kernel with an online softmax, fused masks and key-split merges;
 * the reference is the textbook formula written out once per (batch, head, query, key), in
 * double, straight from docs/semantics.md. It takes the very eng_sdpa_args the engine takes
 * (strided views, every option) so that a test builds one argument struct and runs both.
 *
 *     ref_result r;
 *     if (!ref_sdpa(&args, &r)) { ... out of memory ... }
 *     // r.out[((b * H + h) * L + i) * Dv + c], r.lse[(b * H + h) * L + i], ...
 *     ref_result_free(&r);
 *
 * Scores are scale * q.k, or with additive_w_q set the additive (Bahdanau) score
 * v . tanh(W_q q + W_k k); softcap, masks, ALiBi and open tail keys then act as engine.h says.
 *
 * The reference trusts its arguments: it is only ever given arguments that eng_sdpa accepts
 * (the tests check rejections against the engine alone). It is single-threaded and allocates
 * its results; nothing it is given is written.
 */
#ifndef ATTND_TESTS_REF_H
#define ATTND_TESTS_REF_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/engine.h"

/* The reference's answer for one eng_sdpa_args. Every array is contiguous row-major. */
typedef struct {
    int64_t B, H, Hkv, L, S, D, Dv;
    double *out;          /* [B, H, L, Dv] */
    double *lse;          /* [B, H, L]; -inf for a row with no visible key */
    double *weights;      /* [B, H, L, S] per head; NULL when weights_mode is ENG_WEIGHTS_NONE */
    double *weights_mean; /* [B, L, S], the mean over heads; NULL unless ENG_WEIGHTS_MEAN */
    int64_t rows_empty;   /* how many (b, h, i) rows have no visible key */
} ref_result;

/* Computes attention for `args` in double precision into `res` (which it allocates; free with
 * ref_result_free). Returns false only when memory runs out. */
bool ref_sdpa(const eng_sdpa_args *args, ref_result *res);

/* Frees what ref_sdpa allocated; safe on a zeroed or already freed result. */
void ref_result_free(ref_result *res);

/* The position offset of query rows: p_i = i + offset (0, S - L or query_offset by align). */
int64_t ref_query_offset(const eng_sdpa_args *args);

/* Whether key j may be seen by query i of batch b, head h under the visibility rules of
 * docs/semantics.md (causal, window, key padding, kv_lengths, boolean attn_mask), except
 * that the last args->open_tail_keys keys are seen by every query (engine.h: appended keys,
 * untouched by masks and ALiBi). A float attn_mask never hides a key here; a -inf entry hides
 * it later, through its score. */
bool ref_key_visible(const eng_sdpa_args *args, int64_t b, int64_t h, int64_t i, int64_t j);

/* The default ALiBi slopes for `heads` heads, computed from the formula in double:
 * 2^(-8(h+1)/H) for a power-of-two H; otherwise the slopes for n = 2^floor(log2 H) followed by
 * the slopes at even indices 0, 2, 4, ... of the set for 2n, H - n of them. */
void ref_alibi_default_slopes(int64_t heads, double *slopes);

/* Element (i0, i1, i2, i3) of a view, read through its strides. */
double ref_view_at(const eng_view *view, int64_t i0, int64_t i1, int64_t i2, int64_t i3);

#endif
