/*
 * native_mha.c - POST /v1/mha: a multi-head attention layer on token embeddings
 * (docs/semantics.md#multi-head-attention-layers), with the weights of a registered model or
 * given inline: request body -> validated eng_mha call -> reply body.
 *
 * The request is a JSON object with these fields; any other is refused with 422 naming it:
 *
 *   model               the name of a registered model (GET /v1/models lists them: "demo" and
 *                       every --model), or
 *   weights             the layer inline: an object of tensors under the names a model file
 *                       uses (in_proj_weight, in_proj_bias, out_proj.weight, out_proj.bias,
 *                       q_proj_weight, k_proj_weight, v_proj_weight, bias_k, bias_v;
 *                       q_proj.weight ... o_proj.bias; W_Q.weight ... W_O.weight), at most 16,
 *                       in any wire form; their elements count toward --max-elements.
 *   layer               which layer of the model runs, 0 to N-1: required (422 naming it) for a
 *                       model of N > 1 layers (a whole checkpoint), optional (0) for one of one
 *                       layer; past the model's last layer 422 naming it and the limit.
 *   num_heads           required with weights; with a model, if given, it must match.
 *   num_kv_heads        likewise (default: num_heads): grouped-query layers.
 *   input               the queries' tokens [L, E] or [B, L, E] (E = the layer's embed_dim).
 *   memory              cross-attention: the tokens keys and values come from, [S, kdim] or
 *                       [B, S, kdim], same rank and batch as input (the layer's kdim must
 *                       equal its vdim). Without it the layer attends over `input` itself.
 *   key, value          cross-attention with different key and value tokens (needed when the
 *                       layer's kdim differs from its vdim): [.., S, kdim] and [.., S, vdim],
 *                       both or neither, never with memory.
 *   causal              false | true | "top_left" | "bottom_right" (S - L), as /v1/attention.
 *   query_offset        integer: query i sits at position i + query_offset.
 *   window              [left, right], each a non-negative integer or null.
 *   key_padding_mask    booleans [B, S] or [S]: true = padding, ignored (PyTorch polarity).
 *   attn_mask           booleans (true = MAY attend: the polarity of /v1/attention and PyTorch
 *                       SDPA, the opposite of nn.MultiheadAttention's boolean mask) or numbers
 *                       added to the scores (-inf as null), broadcast to [B, H, L, S] from
 *                       [L, S] or [B|1, H|1, L|1, S|1]. S counts the input keys only: keys the
 *                       layer appends (bias_kv, add_zero_attn) are visible to every query.
 *   positional          "sinusoidal" (added to the layer inputs) | "rope" (q and k per head) |
 *                       "alibi" | "none" | null.
 *   rope_base           > 0 (default 10000), with positional "rope" only.
 *   rope_style          "half" (default; GPT-NeoX / Hugging Face) | "interleaved", rope only.
 *   add_zero_attn       boolean: append a zero key and value, as torch does.
 *   precision           "float32" (default) | "bfloat16": bf16 operands for every product
 *                       (projections and attention), fp32 sums; meta.precision says what ran.
 *   return_weights      "mean" | "per_head" | false.
 *   output_encoding     "nested" | "flat" | "base64"; default: the input's form.
 *   timeout_ms          positive integer, capped by --request-timeout-ms.
 *   session             the id of a KV-cache session (POST /v1/sessions, best with "model"):
 *                       one decoder-layer step. input [L, E] or [1, L, E] holds the next L
 *                       tokens of the session's sequence, at positions n .. n+L-1 (n its
 *                       length); their keys and values (rotated, with rope) are appended to
 *                       the session and the queries attend over all n+L, bottom-right causal
 *                       unless causal is false (or the session's default says so). model may
 *                       be left out for a session made for one; a session of another model or
 *                       shape is 422 naming "session". Refused with it (422 naming them):
 *                       memory, key, value, masks, query_offset, causal "top_left",
 *                       add_zero_attn, a layer with bias_kv. Steps of one session apply in
 *                       the order they arrive; 404 session_not_found / session_evicted, 413
 *                       past its max_tokens, 429 when the pool is full of busy sessions.
 *                       The session's first step fixes its positional settings (the cache
 *                       keeps the keys as that step rotated them): a later step that gives
 *                       none takes them, one that gives others is 422 naming the field.
 *                       A session of a model of several layers holds one cache per layer:
 *                       a step appends to and attends over its layer's cache only.
 *   expect_length       with session: the length the step expects its layer's cache to have
 *                       before it appends (409 and nothing appended otherwise), which makes a
 *                       retried step safe and catches a layer skipped or repeated.
 * Every optional field may also be null, meaning its default.
 *
 * The reply is {"output": T, "weights"?: T, "length"?: n, "meta": {...}}: output [B, L, E] (or
 * [L, E] for a rank-2 input), weights [B, H, L, S'] per head or [B, L, S'] as the head mean (B
 * dropped likewise), where S' = S plus the appended keys (over a session S is n + L, the
 * keys of the whole cache); length is that of the layer's cache after the step; meta.layer is
 * the layer that ran.
 *
 * This file parses the native format into an api__layer_req and writes the native reply;
 * everything between (the layer, shapes, limits, the budget, decoding, the engine call) is
 * layer.c, which the KServe v2 route of a layer model (v2_infer.c) shares.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/models/models.h"
#include "api/ops/layer.h"
#include "api/proto/native.h"
#include "api/wire/timeout.h"

/* One request in flight: what it owns, so that one function frees it all on every path. */
typedef struct {
    api__native_job head; /* first: api__serve and the native steps find it there */
    api__layer s;
    bool encoding_set;
    api__form encoding;
} mha_job;

_Static_assert(offsetof(mha_job, head) == 0, "api__serve takes the job for its api__req");

/* ---- Field parsers ----------------------------------------------------------------------- */

static int f_model(void *jp, const json_t *v, const char *name, api__error *err)
{
    mha_job *job = jp;
    if (json_is_null(v))
        return 0;
    if (!json_is_string(v))
        return api__error_invalid(err, name, "%s must be the name of a model (GET /v1/models)",
                                  name);
    job->s.r.model = json_string_value(v);
    return 0;
}

static int f_weights(void *jp, const json_t *v, const char *name, api__error *err)
{
    mha_job *job = jp;
    api__layer_req *r = &job->s.r;
    const char *key;
    json_t *val;
    if (json_is_null(v))
        return 0;
    if (!json_is_object(v) || json_object_size(v) == 0)
        return api__error_invalid(err, name,
                                  "%s must be an object of tensors named as in a model file "
                                  "(in_proj_weight, out_proj.weight, ...)",
                                  name);
    if (json_object_size(v) > API_LAYER_MAX_WEIGHTS)
        return api__error_invalid(err, name, "%s has %zu tensors; a layer has at most %d", name,
                                  json_object_size(v), API_LAYER_MAX_WEIGHTS);
    r->has_weights = true;
    json_object_foreach((json_t *)v, key, val)
    {
        size_t i = r->n_weights++;
        snprintf(r->wt_name[i], sizeof r->wt_name[i], "%.60s", key);
        snprintf(r->wt_field[i], sizeof r->wt_field[i], "%s.%.60s", name, key);
        if (json_is_null(val))
            return api__error_invalid(err, r->wt_field[i], "%s must be a tensor", r->wt_field[i]);
        if (api__req_tensor(&job->head.rq, val, r->wt_field[i], &r->wt[i], err) != 0)
            return -1;
        if (r->wt[i].dtype == API_DTYPE_BOOL || r->wt[i].rank > 4)
            return api__error_invalid(err, r->wt_field[i], "%s must hold numbers, of rank 1 to 4",
                                      r->wt_field[i]);
    }
    return 0;
}

static int f_num_heads(void *jp, const json_t *v, const char *name, api__error *err)
{
    mha_job *job = jp;
    if (json_is_null(v))
        return 0;
    return api__option_int(v, name, 1, INT32_MAX, &job->s.r.num_heads, err);
}

static int f_num_kv_heads(void *jp, const json_t *v, const char *name, api__error *err)
{
    mha_job *job = jp;
    if (json_is_null(v))
        return 0;
    return api__option_int(v, name, 1, INT32_MAX, &job->s.r.num_kv_heads, err);
}

static int f_input(void *jp, const json_t *v, const char *name, api__error *err)
{
    mha_job *job = jp;
    return api__req_tensor(&job->head.rq, v, name, &job->s.r.input, err);
}

static int f_memory(void *jp, const json_t *v, const char *name, api__error *err)
{
    mha_job *job = jp;
    return api__req_tensor(&job->head.rq, v, name, &job->s.r.memory, err);
}

static int f_key(void *jp, const json_t *v, const char *name, api__error *err)
{
    mha_job *job = jp;
    return api__req_tensor(&job->head.rq, v, name, &job->s.r.key, err);
}

static int f_value(void *jp, const json_t *v, const char *name, api__error *err)
{
    mha_job *job = jp;
    return api__req_tensor(&job->head.rq, v, name, &job->s.r.value, err);
}

static int f_attn_mask(void *jp, const json_t *v, const char *name, api__error *err)
{
    mha_job *job = jp;
    return api__req_tensor(&job->head.rq, v, name, &job->s.r.mask, err);
}

static int f_key_padding_mask(void *jp, const json_t *v, const char *name, api__error *err)
{
    mha_job *job = jp;
    return api__req_tensor(&job->head.rq, v, name, &job->s.r.kpm, err);
}

static int f_window(void *jp, const json_t *v, const char *name, api__error *err)
{
    mha_job *job = jp;
    return api__option_window(v, name, &job->s.r.window, err);
}

static int f_return_weights(void *jp, const json_t *v, const char *name, api__error *err)
{
    mha_job *job = jp;
    return api__option_weights(v, name, &job->s.r.weights, err);
}

static int f_output_encoding(void *jp, const json_t *v, const char *name, api__error *err)
{
    mha_job *job = jp;
    return api__option_encoding(v, name, &job->encoding_set, &job->encoding, err);
}

static int f_session(void *jp, const json_t *v, const char *name, api__error *err)
{
    mha_job *job = jp;
    if (json_is_null(v))
        return 0;
    if (!json_is_string(v))
        return api__error_invalid(
            err, name, "%s must be the id of a session (as POST /v1/sessions returns)", name);
    if (job->head.rq.call->body_unread)
        return api__sessions_unordered(err, name);
    job->s.r.session = json_string_value(v);
    return 0;
}

static int f_expect_length(void *jp, const json_t *v, const char *name, api__error *err)
{
    mha_job *job = jp;
    job->s.r.expect_set = true;
    return api__option_int(v, name, 0, INT64_C(1) << 40, &job->s.r.expect_length, err);
}

/* The fields that are this route's own (the layer, tensors, the session and output settings);
 * the rest are the options of the operation (api__layer_options). */
static const api__native_field mha_fields[] = {
    {"session", f_session},
    {"expect_length", f_expect_length},
    {"model", f_model},
    {"weights", f_weights},
    {"num_heads", f_num_heads},
    {"num_kv_heads", f_num_kv_heads},
    {"input", f_input},
    {"memory", f_memory},
    {"key", f_key},
    {"value", f_value},
    {"window", f_window},
    {"key_padding_mask", f_key_padding_mask},
    {"attn_mask", f_attn_mask},
    {"return_weights", f_return_weights},
    {"output_encoding", f_output_encoding},
};

/* The fields, and what only the native format can get wrong: no input, no layer or two.
 * The options that exclude each other are the layer's check. */
static int parse_fields(mha_job *job, api__error *err)
{
    const api__layer_req *r = &job->s.r;
    if (api__native_fields(job, &job->s.r, mha_fields, sizeof mha_fields / sizeof mha_fields[0],
                           api__layer_options, api__layer_n_options, "/v1/mha", err) != 0)
        return -1;
    if (!r->input.present)
        return api__error_invalid(err, "input", "input is required");
    if (r->model && r->has_weights)
        return api__error_invalid(err, "weights",
                                  "give either model (a registered model) or weights (inline), "
                                  "not both");
    if (!r->model && !r->has_weights && !r->session)
        return api__error_invalid(err, "model",
                                  "model (a registered model, see GET /v1/models) or weights "
                                  "(inline tensors) is required");
    if (r->expect_set && !r->session)
        return api__error_invalid(err, "expect_length",
                                  "expect_length is the length of a session: give session too");
    return 0;
}

/* ---- Reply ------------------------------------------------------------------------------- */

/* The form of the reply's tensors: output_encoding, or else the input's. */
static api__form reply_form(const mha_job *job)
{
    return job->encoding_set ? job->encoding : job->s.r.input.form;
}

static int encode_reply(void *p, api_buf *w, api_reply *reply, api__error *err)
{
    int64_t decode_ns = reply->decode_ns, compute_ns = reply->compute_ns;
    const mha_job *job = p;
    const api__layer *s = &job->s;
    const eng_layer *l = s->layer;
    if (api__native_outputs(&job->head, w, err) != 0)
        return -1;
    if (s->sess) {
        api_buf_printf(w, ",\"length\":%lld", (long long)s->length);
        snprintf(reply->session, sizeof reply->session, "%s", s->sess->id);
    }
    api_buf_cstr(w, ",\"meta\":{\"model\":");
    if (s->inline_layer)
        api_buf_cstr(w, "null");
    else
        api_buf_json_string(w, l->name, strlen(l->name));
    api_buf_printf(w,
                   ",\"layer\":%lld,\"batch\":%lld,\"query_len\":%lld,\"key_len\":%lld,"
                   "\"keys_appended\":%lld,"
                   "\"embed_dim\":%lld,\"num_heads\":%lld,\"num_kv_heads\":%lld,"
                   "\"head_dim\":%lld,\"positional\":\"%s\",\"precision\":\"%s\","
                   "\"decode_ms\":%.3f,\"compute_ms\":%.3f}}\n",
                   (long long)s->index, (long long)s->B, (long long)s->L, (long long)s->S,
                   (long long)(s->Sx - s->S), (long long)l->embed_dim, (long long)l->num_heads,
                   (long long)l->num_kv_heads, (long long)eng_layer_head_dim(l),
                   api__layer_positional_name(s->r.positional),
                   api__precision_name(eng_mha_precision(&s->args)), (double)decode_ns / 1e6,
                   (double)compute_ns / 1e6);
    return api__native_reply(w, reply, err);
}

/* ---- The call: this route's steps of api__serve ----------------------------------------- */

static int check(void *p, api__error *err)
{
    mha_job *job = p;
    job->s.r.causal = API_CAUSAL_UNSET; /* not given: the layer's default, or a session's */
    if (parse_fields(job, err) != 0)
        return -1;
    job->head.form = reply_form(job);
    return job->head.op->steps.check(job->head.state, err);
}

/* No batch step: reply->inferences feeds only the KServe v2 models' metrics. */
static const api__route mha_steps = {
    .style = API_ERRORS_NATIVE,
    .steps = {.read = api__native_read,
              .check = check,
              .size = api__native_size,
              .decode = api__native_decode,
              .run = api__native_run,
              .encode = encode_reply,
              .free = api__native_free,
              .operation = api__native_operation},
};

static void *job_new(const api_call *call, api_reply *reply, bool *answered)
{
    (void)call;
    (void)reply;
    *answered = false;
    mha_job *job = calloc(1, sizeof *job);
    if (job) {
        job->head.op = &api__layer_op;
        job->head.state = &job->s;
        job->s.rq = &job->head.rq;
    }
    return job;
}

const api__batchable api__mha_batchable = {
    .route = &mha_steps, .job_new = job_new, .whole = api_mha};

void api_mha(const api_call *call, api_reply *reply)
{
    bool answered;
    mha_job *job = job_new(call, reply, &answered);
    api__serve(&mha_steps, job, call, reply);
    free(job);
}
