/*
 * v2_infer.c - the Open Inference Protocol (KServe v2) REST API, with Triton's binary tensor data
 * extension, so that KServe, tritonclient and perf_analyzer talk to attnd unchanged.
 *
 * Models: "sdpa" is the bare operation (the same request as /v1/attention, through the same
 * path in sdpa.c); every registered layer is a model too (the same layer as /v1/mha, through
 * the same path in layer.c). Each has the one version "1". Their metadata, configuration and
 * readiness are v2_model.c's.
 *
 * POST /v2/models/sdpa[/versions/1]/infer, the inference request:
 *
 *   {"id": "42",                                   optional, echoed
 *    "parameters": {...},                          optional, see below
 *    "inputs": [{"name": "query", "datatype": "FP32", "shape": [1, 8, 128, 64],
 *                "data": [...]}, ...],             flat or nested, row-major
 *    "outputs": [{"name": "output", "parameters": {"binary_data": true}}]}   optional
 *
 *   inputs    query, key, value: FP32 (JSON or binary), FP16 or BF16 (binary only: JSON has no
 *             16-bit floats); rank 4 [B, H, L, D], rank 3 [B, L, E] or rank 2 [L, E], as in
 *             docs/semantics.md, "Shapes and heads". attn_mask: BOOL (true = may attend) or
 *             FP32 added to the scores (FP16/BF16 binary; -inf as JSON -Infinity, as
 *             tritonclient writes it, or null). key_padding_mask: BOOL [B, S] or [S] (true =
 *             padding). kv_lengths: INT64 or INT32 [B]. sinks: FP32 [H], a logit
 *             per query head that joins each softmax (gpt-oss; finite; not with weights).
 *   parameters causal (true, false, "top_left", "bottom_right"), query_offset, scale, softcap,
 *             precision ("float32", "bfloat16"), output_dtype ("bfloat16": every output BF16,
 *             as binary data), num_heads, num_kv_heads, window_left, window_right (-1 or
 *             absent: unbounded), alibi (bool), return_weights ("per_head", "mean", false),
 *             return_lse (bool), timeout_ms; Triton's binary_data_output (bool), timeout
 *             (microseconds) and priority (accepted, ignored). Any other name is refused (a
 *             typo such as "casual" silently ignored would return a plausible wrong answer).
 *   outputs   output [B, H, L, Dv] (after the query's rank), weights [B, H, L, S] or mean
 *             [B, L, S], lse [B, H, L] (-inf as JSON -Infinity). Without "outputs", every
 *             output the model's metadata lists (v2_model.c: output and lse), as the KServe v2
 *             protocol has it, plus weights when return_weights asks for them, less lse when
 *             return_lse is false; the L x S weights are never returned unasked. With
 *             "outputs", exactly the ones listed (listing weights alone means per_head).
 *
 * POST /v2/models/{layer}[/versions/1]/infer, a registered layer (GET /v1/models; "demo"),
 * takes the same request with the options of /v1/mha (docs/semantics.md, "Multi-head attention
 * layers"), through the same path in layer.c:
 *
 *   inputs    input: FP32 (JSON or binary), FP16 or BF16 (binary only), [L, E] or [B, L, E]
 *             with E the layer's embed_dim. memory (cross-attention; keys and values from these
 *             tokens): [S, kdim] or [B, S, kdim], same rank and batch as input; layers whose
 *             kdim differs from their vdim need /v1/mha (key and value). attn_mask and
 *             key_padding_mask as for sdpa, with H the layer's heads.
 *   parameters causal, query_offset, window_left, window_right, positional ("sinusoidal",
 *             "rope", "alibi", "none"), rope_base, rope_style ("half", "interleaved"),
 *             add_zero_attn (bool), return_weights, timeout_ms; binary_data_output, timeout
 *             and priority as above. Triton's sequence_id / sequence_start / sequence_end make
 *             the request a decoder-layer step of its sequence's session (sessions on, a
 *             self-attention layer without bias_kv): start makes one with the layer's kv heads
 *             and head size, every request's input ([1, n, E] or [n, E]) is the sequence's
 *             next tokens, whose keys and values join the cache and whose queries attend over
 *             all of it (bottom-right causal unless causal is false), end frees it after the
 *             step; no memory, masks, query_offset or add_zero_attn then.
 *   outputs   output [B, L, E] (after the input's rank), weights [B, H, L, S'] or mean
 *             [B, L, S'] with S' = S plus the keys the layer appends; selected as above (a
 *             layer's metadata lists output alone).
 *
 * The reply is {"model_name", "model_version": "1", "id"?, "outputs": [{"name", "datatype":
 * "FP32", "shape", "data": [flat]}]}; an output asked for as binary has "parameters":
 * {"binary_data_size": n} instead of "data", its bytes follow the JSON in the order of the
 * outputs, reply->inference_header_len gives the JSON's length and the content type is
 * application/octet-stream.
 *
 * Binary tensor data (the body after Inference-Header-Content-Length bytes of JSON): each input
 * with "binary_data_size" takes that many bytes, in the order the inputs are listed; the sizes
 * must equal shape x datatype and add up to exactly the bytes after the JSON. All of this is
 * checked against the shapes and the limits before anything is allocated. Float32 and bool
 * bytes on their natural alignment are used where they lie (no copy); others are converted
 * into aligned buffers. When every output is binary, the JSON is written before the compute,
 * padded with spaces to a 64-byte boundary, and the engine writes its results straight into
 * the reply: no output is ever copied.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/core/memory.h"
#include "api/proto/serve.h"
#include "api/proto/v2.h"
#include "api/wire/reply.h"

/* Binary outputs start on this boundary of the reply (the JSON is padded with spaces). */
#define V2_BINARY_ALIGN 64

/* ---- Reply ---------------------------------------------------------------------------------- */

/* ---- The model's operation (sdpa.c or layer.c) ---------------------------------------------- */

int api__v2_model_check(v2_job *job, api__error *err)
{
    if (job->seq_set && job->rq.call->sessions && job->rq.call->body_unread)
        return api__sessions_unordered(err, "parameters.sequence_id");
    if (job->seq_set && job->rq.call->sessions && job->kind->sequence(job, err) != 0)
        return -1;
    if (job->kind->bind(job, err) != 0)
        return -1;
    return job->op->steps.check(job->op_state, err);
}

/* The JSON up to the first output's data: names, shapes and, for binary outputs, sizes. An
 * upper bound of its length: ids are escaped at most 6 bytes per byte. */
static size_t header_bound(const v2_job *job)
{
    size_t n = 512 + strlen(job->model.name) * 6;
    if (job->has_id)
        n += job->id_len * 6;
    for (int o = 0; o < API__N_OUTPUTS; o++)
        if (job->want[o])
            n += 256;
    return n;
}

/* Appends the output entries; JSON outputs with their data (after the compute), binary ones
 * with their sizes only. */
static int write_outputs(v2_job *job, api_buf *w, api__error *err)
{
    bool first = true;
    for (int o = 0; o < API__N_OUTPUTS; o++) {
        const api__out_shape *sh = v2_output_shape(job, o);
        if (!job->want[o])
            continue;
        api_buf_cstr(w, first ? "" : ",");
        first = false;
        api_buf_printf(w, "{\"name\":\"%s\",\"datatype\":\"%s\",\"shape\":[", api__out_names[o],
                       v2_output_datatype(job));
        for (int d = 0; d < sh->rank; d++) {
            if (d > 0)
                api_buf_char(w, ',');
            api_buf_int(w, sh->shape[d]);
        }
        api_buf_char(w, ']');
        if (job->binary[o]) {
            api_buf_printf(w, ",\"parameters\":{\"binary_data_size\":%zu}}",
                           sh->count * v2_elem_bytes(job));
            continue;
        }
        size_t bad = 0;
        const int64_t flat[1] = {(int64_t)sh->count};
        api_buf_cstr(w, ",\"data\":");
        switch (api__tensor_encode(w, v2_output_data(job, o), 1, flat, API_FORM_NESTED,
                                   o == API__OUT_LSE ? API_ENCODE_NEG_INF_TOKEN : 0,
                                   job->rq.call->pool, &bad)) {
        case API_ENCODE_OK:
            break;
        case API_ENCODE_NONFINITE:
            return api__tensor_nonfinite_result(err, api__out_names[o], v2_output_data(job, o), bad,
                                                sh->rank, sh->shape);
        case API_ENCODE_FULL:
            return api__buf_error(w, err);
        }
        api_buf_char(w, '}');
    }
    return 0;
}

static void write_header_start(v2_job *job, api_buf *w)
{
    api_buf_cstr(w, "{\"model_name\":");
    api_buf_json_string(w, job->model.name, strlen(job->model.name));
    api_buf_cstr(w, ",\"model_version\":\"" API_V2_VERSION "\"");
    if (job->has_id) {
        api_buf_cstr(w, ",\"id\":");
        api_buf_json_string(w, job->id, job->id_len);
    }
    api_buf_printf(w, ",\"parameters\":{\"precision\":\"%s\"}",
                   api__precision_name(job->op->precision(job->op_state)));
    api_buf_cstr(w, ",\"outputs\":[");
}

int api__v2_output_finite(v2_job *job, int o, api__error *err)
{
    const api__out_shape *sh = v2_output_shape(job, o);
    const float *data = v2_output_data(job, o);
    size_t bad;
    if (!api__tensor_writable(data, sh->count, o == API__OUT_LSE ? API_ENCODE_NEG_INF_TOKEN : 0u,
                              job->rq.call->pool, &bad))
        return api__tensor_nonfinite_result(err, api__out_names[o], data, bad, sh->rank, sh->shape);
    return 0;
}

/* ---- The route: its steps of api__serve ---------------------------------------------------- */

_Static_assert(offsetof(v2_job, rq) == 0, "api__serve takes the job for its api__req");

static int check(void *p, api__error *err)
{
    v2_job *job = p;
    if (api__v2_request_parse(job, err) != 0 || api__v2_outputs_settle(job, err) != 0)
        return -1;
    return api__v2_model_check(job, err);
}

/* Sizes everything before anything is allocated. When every output is binary the engine
 * writes into the reply itself, so the outputs count once, as part of the reply. */
static bool size(void *p, api__sizes *sz)
{
    v2_job *job = p;
    /* The engine writes fp32: BF16 outputs are converted into the reply after it, never
     * written in place. */
    job->all_binary = !job->bf16_out;
    for (int o = 0; o < API__N_OUTPUTS; o++) {
        if (!job->want[o])
            continue;
        const api__out_shape *sh = v2_output_shape(job, o);
        if (job->binary[o]) {
            job->any_binary = true;
            job->binary_bytes += sh->count * v2_elem_bytes(job); /* within --max-elements */
        } else {
            job->all_binary = false;
            job->json_text +=
                api__tensor_encoded_bound(API_FORM_NESTED, 1, (const int64_t[]){(int64_t)sh->count},
                                          sh->count) +
                64;
        }
    }
    bool ok = job->op->steps.size(job->op_state, sz);
    for (int o = 0; o < API__N_OUTPUTS; o++)
        if (v2_output_shape(job, o) && !(job->all_binary && job->want[o]))
            ok = ok && api__req_output_bytes(v2_output_shape(job, o)->count, &sz->tensors);
    return ok && api__size_add(&sz->text, header_bound(job) + V2_BINARY_ALIGN) &&
           api__size_add(&sz->text, job->json_text) && api__size_add(&sz->text, job->binary_bytes);
}

/* All binary: the whole reply is made now, JSON then outputs, and the engine writes the outputs
 * where they are sent from. */
static int place(void *p, api_buf *w, api__error *err)
{
    v2_job *job = p;
    if (!job->all_binary)
        return 0;
    write_header_start(job, w);
    if (write_outputs(job, w, err) != 0)
        return -1;
    api_buf_cstr(w, "]}");
    if (w->state != API_BUF_OK)
        return api__buf_error(w, err);
    /* Pad with spaces (JSON allows them after the value) so that the first output starts on a
     * 64-byte boundary of a 64-byte-aligned buffer. */
    job->json_len = (w->len + V2_BINARY_ALIGN - 1) / V2_BINARY_ALIGN * V2_BINARY_ALIGN;
    job->blob = eng_buf_alloc(job->json_len + job->binary_bytes); /* 64-byte aligned */
    if (!job->blob)
        return api__error_set(err, API_STATUS_UNAVAILABLE, API_REASON_MEMORY, NULL,
                              "out of memory for the reply");
    memcpy(job->blob, w->data, w->len);
    memset(job->blob + w->len, ' ', job->json_len - w->len);
    api_buf_free(w);
    size_t at = job->json_len;
    for (int o = 0; o < API__N_OUTPUTS; o++) {
        if (!job->want[o])
            continue;
        *v2_output_slot(job, o) = (float *)(void *)(job->blob + at);
        at += v2_output_shape(job, o)->count * 4;
    }
    return 0;
}

int api__v2_decode(void *p, api__error *err)
{
    v2_job *job = p;
    return job->op->steps.decode(job->op_state, err);
}

int api__v2_run(void *p, int64_t *compute_ns, api__error *err)
{
    v2_job *job = p;
    return job->op->steps.run(job->op_state, compute_ns, err);
}

int api__v2_output_bytes(v2_job *job, int o, api_buf *w, api__error *err)
{
    const api__out_shape *sh = v2_output_shape(job, o);
    if (!job->bf16_out) {
        api_buf_mem(w, v2_output_data(job, o), sh->count * 4);
        return 0;
    }
    size_t bad = 0;
    const int64_t flat[1] = {(int64_t)sh->count};
    unsigned flags = API_ENCODE_BF16 | (o == API__OUT_LSE ? API_ENCODE_NEG_INF_TOKEN : 0u);
    switch (api__tensor_encode(w, v2_output_data(job, o), 1, flat, API_FORM_RAW, flags,
                               job->rq.call->pool, &bad)) {
    case API_ENCODE_OK:
        return 0;
    case API_ENCODE_NONFINITE:
        return api__tensor_nonfinite_result(err, api__out_names[o], v2_output_data(job, o), bad,
                                            sh->rank, sh->shape);
    case API_ENCODE_FULL:
        break;
    }
    return api__buf_error(w, err);
}

/* JSON outputs: the text after the compute, binary ones appended in order. */
static int write_reply(v2_job *job, api_buf *w, api__error *err)
{
    write_header_start(job, w);
    if (write_outputs(job, w, err) != 0)
        return -1;
    api_buf_cstr(w, "]}");
    if (!job->any_binary)
        api_buf_char(w, '\n');
    job->json_len = w->len;
    for (int o = 0; o < API__N_OUTPUTS; o++)
        if (job->want[o] && job->binary[o] && api__v2_output_bytes(job, o, w, err) != 0)
            return -1;
    if (w->state != API_BUF_OK)
        return api__buf_error(w, err);
    job->blob = w->data;
    w->data = NULL;
    return 0;
}

static int encode(void *p, api_buf *w, api_reply *reply, api__error *err)
{
    v2_job *job = p;
    for (int o = 0; o < API__N_OUTPUTS; o++)
        if (job->want[o] && job->binary[o] && api__v2_output_finite(job, o, err) != 0)
            return -1;
    if (!job->all_binary && write_reply(job, w, err) != 0)
        return -1;
    reply->status = api_status_http(API_ERRORS_V2, API_STATUS_OK);
    reply->reason = API_REASON_NONE;
    reply->content_type = job->any_binary ? "application/octet-stream" : "application/json";
    reply->body = job->blob;
    reply->body_len = job->json_len + job->binary_bytes;
    reply->inference_header_len = job->any_binary ? (int64_t)job->json_len : 0;
    if (job->seq_set)
        snprintf(reply->session, sizeof reply->session, "%s", job->session);
    job->blob = NULL;
    return 0;
}

int64_t api__v2_batch(const void *p)
{
    const v2_job *job = p;
    return job->op->steps.batch(job->op_state);
}

void api__v2_free(void *p)
{
    v2_job *job = p;
    if (job->op->steps.free)
        job->op->steps.free(job->op_state);
    /* The end of a sequence frees its session once its last step is done (even a failed one:
     * Triton ends the sequence with its END request whatever happens to it). */
    if (job->seq_set && job->seq_end && job->session[0])
        api__sessions_end(job->rq.call->sessions, job->session);
    eng_buf_free(job->blob);
    job->blob = NULL;
}

void *api__v2_operation(void *p, const api__op **op)
{
    v2_job *job = p;
    *op = job->op;
    return job->op_state;
}

static const api__route v2_route = {
    .style = API_ERRORS_V2,
    .steps = {.check = check,
              .size = size,
              .place = place,
              .decode = api__v2_decode,
              .run = api__v2_run,
              .encode = encode,
              .batch = api__v2_batch,
              .free = api__v2_free,
              .operation = api__v2_operation},
};

void api__v2_job_init(v2_job *job)
{
    job->s.rq = &job->rq;
    job->s.r.causal = API_CAUSAL_UNSET; /* "not given", for a sequence's default */
    job->l.rq = &job->rq;
    job->l.r.causal = API_CAUSAL_UNSET; /* likewise: off, or bottom-right over a sequence */
    job->kind = api__v2_kind(&job->model);
    job->op = job->kind->op;
    job->op_state = (char *)job + job->kind->state;
    job->req = (char *)job + job->kind->request;
}

static void *job_new(const api_call *call, api_reply *reply, bool *answered)
{
    v2_job *job = calloc(1, sizeof *job);
    *answered = false;
    if (job && !api__v2_model_find(call, &job->model, reply)) {
        free(job);
        *answered = true;
        return NULL;
    }
    if (job)
        api__v2_job_init(job);
    return job;
}

const api__batchable api__v2_infer_batchable = {
    .route = &v2_route, .job_new = job_new, .whole = api_v2_infer};

void api_v2_infer(const api_call *call, api_reply *reply)
{
    bool answered;
    v2_job *job = job_new(call, reply, &answered);
    if (!answered)
        api__serve(&v2_route, job, call, reply);
    free(job);
}
