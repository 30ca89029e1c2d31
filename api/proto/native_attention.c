/*
 * native_attention.c - POST /v1/attention: request body -> validated eng_sdpa call -> reply body.
 *
 * The request is a JSON object with these fields (docs/semantics.md); any other field is
 * refused with 422 naming it, because a typo such as "casual" silently ignored would return a
 * plausible wrong answer:
 *
 *   query, key, value   tensors (any wire form). Rank 4 [B, H, L, D] / [B, Hkv, S, D|Dv];
 *                       rank 3 [B, L, E]; rank 2 [L, E] (B = 1). The three share one rank.
 *   num_heads           H for ranks 2 and 3 (default 1): E = H * D. With rank 4, if given,
 *                       it must match. num_kv_heads likewise (default num_heads).
 *   scale               any finite number (default 1/sqrt(D)). softcap: > 0, or 0 for off.
 *   precision           "float32" (default) | "bfloat16": bf16 operands for both products,
 *                       fp32 sums (engine.h eng_precision); meta.precision says what ran.
 *   score               "dot" (default) | "additive": Bahdanau scoring s = w . tanh(W_q q +
 *                       W_k k), no scale, with additive_weights {"w_q": [A, D], "w_k": [A, D],
 *                       "w": [A]} (tensors in any form).
 *   causal              false | true | "top_left" | "bottom_right".
 *   query_offset        integer: query i sits at i + query_offset (with causal true, or on its
 *                       own for window/alibi; it conflicts with an explicit alignment string).
 *   window              [left, right], each a non-negative integer or null (unbounded).
 *   key_padding_mask    booleans [B, S] or [S]; true = padding, ignored. Boolean masks take
 *                       true/false (or dtype "bool" bytes), never 0/1 numbers: tokenizers'
 *                       attention_mask uses 1 = keep, the opposite polarity, and a silent
 *                       reading of it would hide exactly the real tokens.
 *   kv_lengths          integers [B], each in [0, S].
 *   attn_mask           booleans (true = may attend) or numbers (added to the score; -inf may
 *                       be written -Infinity or null, or -inf in base64), of shape [L, S] or
 *                       [B|1, H|1, L|1, S|1]; size-1 dimensions broadcast.
 *   alibi               true (default slopes), false, or a tensor of H slopes.
 *   sinks               a tensor of H logits (gpt-oss's attention sinks): each joins its query
 *                       head's softmax as a key with no value, so the output is scaled by
 *                       1 / (1 + exp(sink - lse)) and lse counts it; not with return_weights.
 *   return_weights      "per_head" | "mean" | false. return_lse: boolean.
 *   output_encoding     "nested" | "flat" | "base64" (float32); default: the query's form.
 *   output_dtype        "float32" (default) | "bfloat16": the reply's tensors rounded to bf16
 *                       (base64 then carries two bytes per value, dtype "bfloat16").
 *   timeout_ms          positive integer, capped by --request-timeout-ms.
 * Every optional field may also be null, meaning its default.
 *
 * The reply is {"output": T, "weights"?: T, "lse"?: T, "meta": {shapes, scale, timings}}, with
 * output [B, H, L, Dv], [B, L, H*Dv] or [L, H*Dv] after the query's rank, weights [B, H, L, S]
 * or (mean) [B, L, S], lse [B, H, L] (leading B dropped for a rank-2 query); an lse of -inf (a
 * query row that sees no key) is null in JSON, which has no -inf: the native API's replies stay
 * strict JSON for every parser (v2, whose clients are Python's, writes -Infinity).
 *
 * The tokens NaN, Infinity and -Infinity are read wherever a number may stand (body.c); only a
 * float mask may hold one, -Infinity. Anywhere else a non-finite value is a 422 naming it.
 *
 * This file parses the native format into an api__sdpa_req and writes the native reply;
 * everything between (shapes, limits, the budget, decoding, the engine call) is sdpa.c, which
 * the KServe v2 route (v2_infer.c) shares.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/ops/sdpa.h"
#include "api/proto/native.h"
#include "api/wire/timeout.h"

/* One request in flight: what it owns, so that one function frees it all on every path. */
typedef struct {
    api__native_job head; /* first: api__serve and the native steps find it there */
    api__sdpa s;
    bool encoding_set;
    api__form encoding;
} attn_job;

_Static_assert(offsetof(attn_job, head) == 0, "api__serve takes the job for its api__req");

/* ---- Field parsers ----------------------------------------------------------------------- */

static int f_query(void *jp, const json_t *v, const char *name, api__error *err)
{
    attn_job *job = jp;
    return api__req_tensor(&job->head.rq, v, name, &job->s.r.q, err);
}

static int f_key(void *jp, const json_t *v, const char *name, api__error *err)
{
    attn_job *job = jp;
    return api__req_tensor(&job->head.rq, v, name, &job->s.r.k, err);
}

static int f_value(void *jp, const json_t *v, const char *name, api__error *err)
{
    attn_job *job = jp;
    return api__req_tensor(&job->head.rq, v, name, &job->s.r.v, err);
}

static int f_attn_mask(void *jp, const json_t *v, const char *name, api__error *err)
{
    attn_job *job = jp;
    return api__req_tensor(&job->head.rq, v, name, &job->s.r.mask, err);
}

static int f_key_padding_mask(void *jp, const json_t *v, const char *name, api__error *err)
{
    attn_job *job = jp;
    return api__req_tensor(&job->head.rq, v, name, &job->s.r.kpm, err);
}

static int f_kv_lengths(void *jp, const json_t *v, const char *name, api__error *err)
{
    attn_job *job = jp;
    return api__req_tensor(&job->head.rq, v, name, &job->s.r.kvlen, err);
}

static int f_score(void *jp, const json_t *v, const char *name, api__error *err)
{
    attn_job *job = jp;
    const char *s = json_string_value(v);
    if (json_is_null(v) || (s && strcmp(s, "dot") == 0))
        job->s.r.additive = false;
    else if (s && strcmp(s, "additive") == 0)
        job->s.r.additive = true;
    else
        return api__error_invalid(err, name, "%s must be \"dot\" or \"additive\"", name);
    return 0;
}

static int f_additive_weights(void *jp, const json_t *v, const char *name, api__error *err)
{
    attn_job *job = jp;
    static const char *const keys[3] = {"w_q", "w_k", "w"};
    api__sdpa_req *r = &job->s.r;
    api__tensor *tensors[3] = {&r->wq, &r->wk, &r->ww};
    char field[64];
    const char *key;
    json_t *val;
    if (json_is_null(v))
        return 0;
    if (!json_is_object(v))
        return api__error_invalid(err, name, "%s must be an object {\"w_q\", \"w_k\", \"w\"}",
                                  name);
    r->has_additive_weights = true;
    json_object_foreach((json_t *)v, key, val)
    {
        size_t i = 0;
        while (i < 3 && strcmp(key, keys[i]) != 0)
            i++;
        snprintf(field, sizeof field, "%s.%.40s", name, key);
        if (i == 3)
            return api__error_invalid(err, field, "unknown key \"%.40s\"; %s has w_q, w_k and w",
                                      key, name);
        if (api__req_tensor(&job->head.rq, val, field, tensors[i], err) != 0)
            return -1;
    }
    for (size_t i = 0; i < 3; i++) {
        if (!tensors[i]->present) {
            snprintf(field, sizeof field, "%s.%s", name, keys[i]);
            return api__error_invalid(err, field, "%s is required", field);
        }
    }
    return 0;
}

static int f_window(void *jp, const json_t *v, const char *name, api__error *err)
{
    attn_job *job = jp;
    return api__option_window(v, name, &job->s.r.window, err);
}

static int f_alibi(void *jp, const json_t *v, const char *name, api__error *err)
{
    attn_job *job = jp;
    if (json_is_null(v) || json_is_false(v))
        return 0;
    job->s.r.alibi = true;
    if (json_is_true(v))
        return 0;
    if (!json_is_array(v) && !json_is_object(v))
        return api__error_invalid(err, name,
                                  "%s must be true, false or an array of one slope per head", name);
    return api__req_tensor(&job->head.rq, v, name, &job->s.r.slopes, err);
}

static int f_sinks(void *jp, const json_t *v, const char *name, api__error *err)
{
    attn_job *job = jp;
    if (json_is_null(v))
        return 0;
    return api__req_tensor(&job->head.rq, v, name, &job->s.r.sinks, err);
}

static int f_return_weights(void *jp, const json_t *v, const char *name, api__error *err)
{
    attn_job *job = jp;
    return api__option_weights(v, name, &job->s.r.weights, err);
}

static int f_return_lse(void *jp, const json_t *v, const char *name, api__error *err)
{
    attn_job *job = jp;
    if (json_is_null(v))
        return 0;
    return api__option_bool(v, name, &job->s.r.return_lse, err);
}

static int f_output_encoding(void *jp, const json_t *v, const char *name, api__error *err)
{
    attn_job *job = jp;
    return api__option_encoding(v, name, &job->encoding_set, &job->encoding, err);
}

static int f_output_dtype(void *jp, const json_t *v, const char *name, api__error *err)
{
    attn_job *job = jp;
    eng_precision p = ENG_PRECISION_FLOAT32;
    if (!json_is_null(v) && api__option_precision(v, name, &p, err) != 0)
        return -1;
    job->head.bf16_out = p == ENG_PRECISION_BFLOAT16;
    return 0;
}

/* The fields that are this route's own (tensors and output settings); the rest are the
 * options of the operation (api__sdpa_options). */
static const api__native_field attn_fields[] = {
    {"query", f_query},
    {"key", f_key},
    {"value", f_value},
    {"score", f_score},
    {"additive_weights", f_additive_weights},
    {"window", f_window},
    {"key_padding_mask", f_key_padding_mask},
    {"kv_lengths", f_kv_lengths},
    {"attn_mask", f_attn_mask},
    {"alibi", f_alibi},
    {"sinks", f_sinks},
    {"return_weights", f_return_weights},
    {"return_lse", f_return_lse},
    {"output_encoding", f_output_encoding},
    {"output_dtype", f_output_dtype},
};

static int parse_fields(attn_job *job, api__error *err)
{
    if (api__native_fields(job, &job->s.r, attn_fields, sizeof attn_fields / sizeof attn_fields[0],
                           api__sdpa_options, api__sdpa_n_options, "/v1/attention", err) != 0)
        return -1;
    if (!job->s.r.q.present || !job->s.r.k.present || !job->s.r.v.present) {
        const char *missing = !job->s.r.q.present ? "query" : !job->s.r.k.present ? "key" : "value";
        return api__error_invalid(err, missing, "%s is required", missing);
    }
    return 0;
}

/* ---- Reply ------------------------------------------------------------------------------- */

/* The form of the reply's tensors: output_encoding, or else the query's. */
static api__form reply_form(const attn_job *job)
{
    return job->encoding_set ? job->encoding : job->s.r.q.form;
}

static double ms(int64_t ns)
{
    return (double)ns / 1e6;
}

static int encode_reply(void *p, api_buf *w, api_reply *reply, api__error *err)
{
    int64_t decode_ns = reply->decode_ns, compute_ns = reply->compute_ns;
    const attn_job *job = p;
    const api__sdpa *s = &job->s;
    const api__sdpa_req *r = &s->r;
    if (api__native_outputs(&job->head, w, err) != 0)
        return -1;
    float scale = r->additive ? 1.0f : r->scale_set ? r->scale : (float)(1.0 / sqrt((double)r->D));
    api_buf_printf(w,
                   ",\"meta\":{\"batch\":%lld,\"num_heads\":%lld,\"num_kv_heads\":%lld,"
                   "\"query_len\":%lld,\"key_len\":%lld,\"head_dim\":%lld,"
                   "\"value_head_dim\":%lld,\"scale\":",
                   (long long)r->B, (long long)r->H, (long long)r->Hkv, (long long)r->L,
                   (long long)r->S, (long long)r->D, (long long)r->Dv);
    api_buf_float(w, scale);
    api_buf_printf(w, ",\"precision\":\"%s\",\"decode_ms\":%.3f,\"compute_ms\":%.3f}}\n",
                   api__precision_name(eng_sdpa_precision(&s->args)), ms(decode_ns),
                   ms(compute_ns));
    return api__native_reply(w, reply, err);
}

/* ---- The call: this route's steps of api__serve ----------------------------------------- */

static int check(void *p, api__error *err)
{
    attn_job *job = p;
    if (parse_fields(job, err) != 0)
        return -1;
    job->head.form = reply_form(job);
    return job->head.op->steps.check(job->head.state, err);
}

static const api__route attn_steps = {
    .style = API_ERRORS_NATIVE,
    .steps = {.read = api__native_read,
              .check = check,
              .size = api__native_size,
              .decode = api__native_decode,
              .run = api__native_run,
              .encode = encode_reply,
              .batch = api__native_batch,
              .free = api__native_free},
};

void api_attention(const api_call *call, api_reply *reply)
{
    attn_job *job = calloc(1, sizeof *job);
    if (job) {
        job->head.op = &api__sdpa_op;
        job->head.state = &job->s;
        job->s.rq = &job->head.rq;
    }
    api__serve(&attn_steps, job, call, reply);
    free(job);
}
