/*
 * sdpa.h - the scaled dot-product attention operation: from a request probed by any protocol
 * to eng_sdpa and its outputs.
 */
#ifndef ATTND_API_OPS_SDPA_H
#define ATTND_API_OPS_SDPA_H

#include <stdbool.h>
#include <stdint.h>

#include "api/ops/options.h"

/* One path from a decoded request to eng_sdpa, shared by the native JSON route and the KServe
 * v2 route: a route fills an api__sdpa_req from its wire format (tensors probed, not decoded),
 * then calls api__sdpa_check, api__sdpa_bytes (to reserve), api__sdpa_decode and api__sdpa_run,
 * and encodes s->out, s->weights and s->lse in its own format. Tensor names in messages are the
 * request's: query, key, value, attn_mask, key_padding_mask, kv_lengths, alibi, num_heads... */

typedef struct {
    api__tensor q, k, v, mask, kpm, kvlen, slopes, wq, wk, ww;
    bool has_q, has_k, has_v, has_mask, has_kpm, has_kvlen, has_slopes, has_wq, has_wk, has_ww;
    bool additive, has_additive_weights;

    int64_t num_heads, num_kv_heads; /* 0: not given */
    bool scale_set;
    float scale, softcap;
    api__causal causal;
    bool offset_set;
    int64_t query_offset;
    bool window_left_set, window_right_set;
    int64_t window_left, window_right;
    bool alibi;
    eng_weights_mode weights;
    bool return_lse;
    int64_t timeout_ms; /* 0: not given */

    /* Derived by api__sdpa_check. */
    int64_t B, H, Hkv, L, S, D, Dv;
} api__sdpa_req;

/* The shape of an output: its rank follows the query's; a rank-2 query drops the batch axis. */
typedef struct {
    int rank;
    int64_t shape[4];
    size_t count;
} api__out_shape;

typedef struct {
    api__req *rq;
    api__sdpa_req r;
    api__out_shape os, ws, ls; /* output, weights, lse: filled by api__sdpa_check */
    /* Decoded inputs: owned by rq, or pointing into the body (raw tensors used in place). */
    float *q, *k, *v, *slopes, *mask_f, *wq, *wk, *ww;
    uint8_t *mask_b, *kpm;
    int64_t *kvlen;
    /* Outputs: a route may point them into its reply before api__sdpa_decode (which allocates
     * those still NULL); weights and lse only when requested. */
    float *out, *weights, *lse;
    eng_sdpa_args args;
} api__sdpa;

/* Derives B, H, Hkv, L, S, D, Dv, checks every tensor against them, the element limit over
 * inputs and outputs (413, --max-elements), sets the deadline (timeout_ms) and the output
 * shapes. 422 names the field. */
int api__sdpa_check(api__sdpa *s, api__error *err);

/* Bytes the call will allocate beyond the body: decoded inputs (none for raw tensors used in
 * place), the outputs when `outputs` (a route that places them in its reply counts them there),
 * and the engine's scratch. False when a sum overflows. */
bool api__sdpa_bytes(api__sdpa *s, bool outputs, size_t *tensors, size_t *scratch);

/* Allocates and decodes every input (in place where api__tensor_in_place allows), checks
 * kv_lengths against S, allocates the outputs the route did not place, and frees the body tree
 * (its reservation goes back to the budget). */
int api__sdpa_decode(api__sdpa *s, api__error *err);

/* Runs eng_sdpa (checking the deadline and the cancel flag first); *compute_ns gets its time. */
int api__sdpa_run(api__sdpa *s, int64_t *compute_ns, api__error *err);

#endif
