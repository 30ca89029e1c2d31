/*
 * sdpa.h - the scaled dot-product attention operation: from a request probed by any protocol
 * to eng_sdpa and its outputs.
 */
#ifndef ATTND_API_OPS_SDPA_H
#define ATTND_API_OPS_SDPA_H

#include <stdbool.h>
#include <stdint.h>

#include "api/ops/operation.h"
#include "api/ops/options.h"

/* One path from a decoded request to eng_sdpa, shared by the native JSON route and the KServe
 * v2 route: a route fills an api__sdpa_req from its wire format (tensors probed, not decoded),
 * then runs api__sdpa_op. Tensor names in messages are the request's: query, key, value,
 * attn_mask, key_padding_mask, kv_lengths, alibi, num_heads... */

typedef struct {
    /* Each knows whether the request gave it (present); sinks: attention sinks, a logit per
     * query head that joins each softmax. */
    api__tensor q, k, v, mask, kpm, kvlen, slopes, wq, wk, ww, sinks;
    bool additive, has_additive_weights;

    int64_t num_heads, num_kv_heads; /* 0: not given */
    bool scale_set;
    float scale, softcap;
    bool precision_set;
    eng_precision precision; /* asked for (else the limits' default); the call may compute
                                float32 (eng_sdpa_precision) */
    api__causal causal;
    bool offset_set;
    int64_t query_offset;
    api__window window;
    bool alibi;
    eng_weights_mode weights;
    bool return_lse;
    int64_t timeout_ms; /* 0: not given */

    /* Derived by check. */
    int64_t B, H, Hkv, L, S, D, Dv;
} api__sdpa_req;

typedef struct {
    api__req *rq;
    api__sdpa_req r;
    api__out_shape os, ws, ls; /* output, weights, lse: filled by check */
    /* Decoded inputs: owned by rq, or pointing into the body (raw tensors used in place). */
    float *q, *k, *v, *slopes, *mask_f, *wq, *wk, *ww, *sinks;
    /* bfloat16 query (key and value) kept as sent, for a request that computes in bfloat16
     * (set by check): their bits in place (raw) or decoded from base64, never widened. */
    bool q_bf16, kv_bf16;
    const uint16_t *q16, *k16, *v16;
    uint8_t *mask_b, *kpm;
    int64_t *kvlen;
    /* Outputs: a route may point them into its reply before decode (which allocates
     * those still NULL); weights and lse only when requested (lse also for sinks). */
    float *out, *weights, *lse;
    eng_sdpa_args args;
} api__sdpa;

/* The operation (operation.h) on an api__sdpa whose rq is set and whose request r a route
 * filled. check derives B, H, Hkv, L, S, D, Dv from the ranks (docs/semantics.md#shapes-and-heads)
 * and checks every tensor against them and the element limit over inputs and outputs; decode
 * also checks kv_lengths against S. Its outputs are output, weights and lse. */
extern const api__op api__sdpa_op;

/* Attention sinks, shared with the session step (session_step.c): 422 naming "sinks" unless the
 * tensor is [H] with no weights asked for (checked before decoding) and, once decoded, every
 * logit finite. */
int api__sinks_check(const api__tensor *sinks, int64_t H, eng_weights_mode weights,
                     api__error *err);
int api__sinks_check_values(const float *sinks, int64_t H, api__error *err);

/* Each query head's sink logit joins its softmax: scales the rows of out [B, H, L, Dv] (as its
 * view strides them) and makes lse [B, H, L] that of all the logits, the sink's included. */
void api__sinks_apply(const float *sinks, const eng_view *out, float *lse);

/* The options every protocol reads the same way into an api__sdpa_req (options.h): num_heads,
 * num_kv_heads, scale, softcap, precision, causal, query_offset, timeout_ms. */
extern const api__option_def api__sdpa_options[];
extern const size_t api__sdpa_n_options;

#endif
