/*
 * layer.h - the multi-head attention layer operation: from a request probed by any protocol
 * to eng_mha and its outputs.
 */
#ifndef ATTND_API_OPS_LAYER_H
#define ATTND_API_OPS_LAYER_H

#include <stdbool.h>
#include <stdint.h>

#include "api/ops/operation.h"
#include "api/ops/options.h"
#include "api/ops/sessions.h"

/* One path from a decoded layer request to eng_mha, shared by POST /v1/mha and the KServe v2
 * route of a layer model: a route fills an api__layer_req from its wire format (tensors probed,
 * not decoded), then runs api__layer_op, ending with its free. Tensor names in
 * messages are the request's: input, memory, key, value, attn_mask, key_padding_mask,
 * weights.*; options: query_offset, rope_base, rope_style, num_heads, num_kv_heads.
 *
 * A request naming a session (POST /v1/mha "session", the v2 sequence of a layer model) is one
 * decoder-layer step of that session's KV cache: its input tokens are the next ones of the
 * session's sequence, their keys and values are appended, and the queries attend over the
 * whole cache (eng_mha_args.kv_cache). */

#define API_LAYER_MAX_WEIGHTS 16

/* The most a request's "layer" may say before it is compared with its model's layers (those
 * the server's peek reads too). */
#define API_LAYER_MAX ((int64_t)INT32_MAX)

typedef struct {
    const char *model; /* a registered model's name (borrowed), or NULL */
    bool layer_set;    /* "layer": which of the model's layers; not given: 0, which a model of
                          more than one layer refuses */
    int64_t layer;
    /* Inline weights under a model file's tensor names (/v1/mha only). */
    bool has_weights;
    size_t n_weights;
    api__tensor wt[API_LAYER_MAX_WEIGHTS];
    char wt_name[API_LAYER_MAX_WEIGHTS][80];
    char wt_field[API_LAYER_MAX_WEIGHTS][96]; /* "weights.<name>", for messages */
    int64_t num_heads, num_kv_heads;          /* 0: not given (must match a model's) */

    api__tensor input, memory, key, value, mask, kpm;
    api__causal causal;
    bool offset_set;
    int64_t query_offset;
    api__window window;
    bool positional_set;
    eng_positional positional;
    bool rope_base_set, rope_style_set;
    float rope_base;
    eng_rope_style rope_style;
    bool add_zero_attn;
    eng_weights_mode weights;
    bool precision_set;
    eng_precision precision; /* asked for (else the limits' default); see eng_mha_precision */
    int64_t timeout_ms;      /* 0: not given */

    /* A step of a session (call->sessions): its id (borrowed; NULL: none) and the length the
     * step expects it to have (409 otherwise). */
    const char *session;
    bool expect_set;
    int64_t expect_length;
} api__layer_req;

typedef struct {
    api__req *rq;
    api__layer_req r;
    const api_model *model;  /* the registered model (borrowed), or NULL for inline weights; a
                                route may set it, else check finds r.model */
    int64_t index;           /* which of its layers runs (r.layer): set by check */
    const eng_layer *layer;  /* model->layer[index], or inline_layer; set by check */
    eng_layer *inline_layer; /* built from r.wt; owned, freed by free */
    int64_t B, L, S, Sx;     /* Sx: S plus the keys the layer appends */
    api__out_shape os, ws;   /* output and weights: filled by check */
    /* Decoded inputs: owned by rq, or pointing into the body (raw tensors used in place). */
    float *x, *k_in, *v_in, *mask_f;
    uint8_t *mask_b, *kpm;
    /* Outputs: a route may point them into its reply before decode (which allocates
     * those still NULL); weights only when requested. */
    float *out, *weights;
    float placeholder; /* stands in for buffers not allocated yet when sizing */
    eng_mha_args args;
    api__session *sess; /* r.session, acquired by check until free */
    int64_t length;     /* the session's length after run */
} api__layer;

/* The operation (operation.h) on an api__layer whose rq is set and whose request r a route
 * filled (and s->model, when the route already knows the model). check tests the options that
 * exclude each other and the element limit over the inputs, sets the deadline, finds the model
 * (s->model, else r.model in call->models: 404) and its layer r.layer (422 naming "layer" when a
 * model of several layers is not told which, or when it has no such layer; inline weights are
 * one layer), or builds the layer from inline weights, reserving them in the budget, checks
 * every tensor against it and the element limit over inputs and outputs. Its outputs are output
 * and weights; free frees the inline layer.
 *
 * With r.session, check also acquires the session (501 sessions off, 404 session_not_found /
 * session_evicted) and checks it against the layer: created for this model (r.model may then
 * be left out), or of its shape (422 "session"); one sequence (422 input), none of the options
 * a cache step refuses (422 naming them), expect_length against the length of the layer's own
 * cache (409), max_tokens (413). Causal is then bottom-right unless the step (or the session's
 * defaults) says false; the session's window and precision apply unless the step gives its own.
 * run appends to and attends over the layer's cache, makes room in the pool when it is full
 * (429 when it cannot) and sets s->length (that cache's); free releases the session. */
extern const api__op api__layer_op;

/* The options every protocol reads the same way into an api__layer_req (options.h): layer,
 * causal, query_offset, positional, rope_base, rope_style, add_zero_attn, precision,
 * timeout_ms. */
extern const api__option_def api__layer_options[];
extern const size_t api__layer_n_options;

/* Whether the layer's keys and values can be a KV cache of its own tokens (a session's
 * steps): self-attention (kdim = vdim = embed_dim) with no bias_k/bias_v to append. */
bool api__layer_steps_a_cache(const eng_layer *l);
/* 0 when it can; else a 422 naming `field` that says why not. */
int api__layer_cache_check(const eng_layer *l, const char *field, api__error *err);

/* "none", "sinusoidal", "rope" or "alibi". */
const char *api__layer_positional_name(eng_positional p);

#endif
