/*
 * grpc_infer.c - ModelInfer and ModelStreamInfer: a reader and a writer around api_v2_infer.
 *
 * A ModelInferRequest becomes the v2 request with Triton's binary tensor extension: the JSON
 * part from the message's names, shapes, datatypes and parameters (binary_data_output set, so
 * that every output comes back as bytes), the binary part from raw_input_contents (or typed
 * contents: fp32, int32, int64 and bool, written as their little-endian bytes). The route
 * then reads, checks, reserves, computes and answers exactly as it does for HTTP. Its reply
 * (the JSON part and the outputs' bytes) becomes a ModelInferResponse whose
 * raw_output_contents point into that reply until it is packed.
 *
 * The message's raw_input_contents are never decoded by protobuf-c (which would copy them): the
 * top-level fields are walked once, the raw contents kept as pointers into the message, and
 * the rest (small: names, shapes, parameters, typed contents) unpacked.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/proto/grpc.h"
#include "grpc_service.pb-c.h"

#define RAW_FIELD       7 /* ModelInferRequest.raw_input_contents */
#define MAX_RAW         64
#define JSON_HEADER_MAX ((size_t)1 << 20)
#define UNPACK_PER_BYTE 4 /* a bool content of one byte unpacks into a 4-byte boolean */

typedef struct {
    const api_call *call;
    char *rest; /* the message without raw_input_contents */
    size_t rest_len;
    ProtobufCBinaryData raw[MAX_RAW];
    size_t n_raw;
    Inference__ModelInferRequest *req;
    size_t held; /* reserved in call->lease by this file */
    api_buf body;
} infer_job;

static int fail(api_reply *reply, int status, api_reason reason, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail(api_reply *reply, int status, api_reason reason, const char *fmt, ...)
{
    char msg[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    api_grpc_error(reply, status, reason, msg);
    return -1;
}

static int reserve(infer_job *job, size_t bytes, api_reply *reply)
{
    api_budget_result b = api_lease_reserve(job->call->lease, bytes);
    if (b == API_BUDGET_OK) {
        job->held += bytes;
        return 0;
    }
    return fail(reply, b == API_BUDGET_NEVER ? 413 : 429, API_REASON_MEMORY,
                "memory budget (--max-memory-bytes) has no room for %zu bytes of this request",
                bytes);
}

/* Walks the message's top-level fields: the raw contents as pointers into it, and (with `rest`)
 * the other fields copied into `rest`; returns the bytes of those others, or -1 when the
 * message is malformed or has too many raw contents (reply filled). */
static int64_t walk(infer_job *job, char *rest, api_reply *reply)
{
    api__pb_cursor c = {.data = job->call->body, .len = job->call->body_len};
    api__pb_field f;
    size_t start = 0, rest_len = 0;
    job->n_raw = 0;
    while (api__pb_next(&c, &f)) {
        if (f.number == RAW_FIELD && f.type == 2) {
            if (job->n_raw == MAX_RAW)
                return fail(reply, 400, API_REASON_BAD_REQUEST,
                            "raw_input_contents: more than %d entries", MAX_RAW);
            job->raw[job->n_raw].data = (uint8_t *)f.data;
            job->raw[job->n_raw++].len = f.len;
        } else {
            if (rest)
                memcpy(rest + rest_len, job->call->body + start, c.pos - start);
            rest_len += c.pos - start;
        }
        start = c.pos;
    }
    if (c.bad)
        return fail(reply, 400, API_REASON_BAD_REQUEST,
                    "malformed ModelInferRequest message (byte %zu)", c.pos);
    return (int64_t)rest_len;
}

/* Splits the message into its raw contents (pointers) and the rest (a copy: names, shapes,
 * parameters, typed contents), then unpacks the rest, reserving what unpacking may take. */
static int split(infer_job *job, api_reply *reply)
{
    int64_t rest_len = walk(job, NULL, reply);
    if (rest_len < 0 || reserve(job, (size_t)rest_len * (1 + UNPACK_PER_BYTE) + 4096, reply) != 0)
        return -1;
    job->rest = malloc((size_t)rest_len + 1);
    if (!job->rest)
        return fail(reply, 503, API_REASON_MEMORY, "out of memory");
    job->rest_len = (size_t)walk(job, job->rest, reply);
    job->req =
        inference__model_infer_request__unpack(NULL, job->rest_len, (const uint8_t *)job->rest);
    if (!job->req)
        return fail(reply, 400, API_REASON_BAD_REQUEST, "malformed ModelInferRequest message");
    return 0;
}

/* ---- The v2 request ---------------------------------------------------------------------- */

static void write_param_value(api_buf *w, const Inference__InferParameter *p)
{
    switch (p ? p->parameter_choice_case : INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE__NOT_SET) {
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM:
        api_buf_cstr(w, p->bool_param ? "true" : "false");
        break;
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM:
        api_buf_int(w, p->int64_param);
        break;
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_UINT64_PARAM:
        api_buf_printf(w, "%llu", (unsigned long long)p->uint64_param);
        break;
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_DOUBLE_PARAM:
        if (isfinite(p->double_param))
            api_buf_printf(w, "%.17g", p->double_param);
        else
            api_buf_cstr(w, "null");
        break;
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_STRING_PARAM:
        api_buf_json_string(w, p->string_param, strlen(p->string_param));
        break;
    default:
        api_buf_cstr(w, "null");
        break;
    }
}

static void write_params(api_buf *w, const Inference__ModelInferRequest *req)
{
    api_buf_cstr(w, "\"parameters\":{\"binary_data_output\":true");
    for (size_t i = 0; i < req->n_parameters; i++) {
        const Inference__ModelInferRequest__ParametersEntry *e = req->parameters[i];
        if (strcmp(e->key, "binary_data_output") == 0)
            continue; /* raw_output_contents are the only outputs gRPC has */
        api_buf_char(w, ',');
        api_buf_json_string(w, e->key, strlen(e->key));
        api_buf_char(w, ':');
        write_param_value(w, e->value);
    }
    api_buf_char(w, '}');
}

/* Bytes of input i's typed contents as the binary extension carries them; -1 when it has none
 * (or ones of a datatype attnd takes only raw). */
static int64_t typed_bytes(const Inference__ModelInferRequest__InferInputTensor *in)
{
    const Inference__InferTensorContents *t = in->contents;
    if (!t)
        return -1;
    if (t->n_fp32_contents)
        return (int64_t)t->n_fp32_contents * 4;
    if (t->n_int_contents)
        return (int64_t)t->n_int_contents * 4;
    if (t->n_int64_contents)
        return (int64_t)t->n_int64_contents * 8;
    if (t->n_bool_contents)
        return (int64_t)t->n_bool_contents;
    return -1;
}

static void write_typed(api_buf *w, const Inference__InferTensorContents *t)
{
    for (size_t k = 0; k < t->n_fp32_contents; k++)
        api_buf_mem(w, &t->fp32_contents[k], 4);
    for (size_t k = 0; k < t->n_int_contents; k++)
        api_buf_mem(w, &t->int_contents[k], 4);
    for (size_t k = 0; k < t->n_int64_contents; k++)
        api_buf_mem(w, &t->int64_contents[k], 8);
    for (size_t k = 0; k < t->n_bool_contents; k++)
        api_buf_char(w, t->bool_contents[k] ? 1 : 0);
}

/* The size of each input's bytes; 400 when raw and typed contents do not add up. */
static int input_sizes(infer_job *job, size_t *sizes, size_t *total, api_reply *reply)
{
    const Inference__ModelInferRequest *req = job->req;
    *total = 0;
    if (job->n_raw && job->n_raw != req->n_inputs)
        return fail(reply, 400, API_REASON_BAD_REQUEST,
                    "raw_input_contents: %zu entries for %zu inputs (give one per input, or none)",
                    job->n_raw, req->n_inputs);
    if (req->n_inputs > MAX_RAW)
        return fail(reply, 400, API_REASON_BAD_REQUEST, "inputs: more than %d", MAX_RAW);
    for (size_t i = 0; i < req->n_inputs; i++) {
        int64_t typed = typed_bytes(req->inputs[i]);
        if (job->n_raw && typed >= 0)
            return fail(reply, 400, API_REASON_BAD_REQUEST,
                        "inputs[%zu] (%s): both contents and raw_input_contents", i,
                        req->inputs[i]->name);
        if (!job->n_raw && typed < 0)
            return fail(reply, 400, API_REASON_BAD_REQUEST,
                        "inputs[%zu] (%s): no data (fp32, int, int64 or bool contents, or "
                        "raw_input_contents)",
                        i, req->inputs[i]->name);
        sizes[i] = job->n_raw ? job->raw[i].len : (size_t)typed;
        *total += sizes[i];
    }
    return 0;
}

static void write_header(api_buf *w, const Inference__ModelInferRequest *req, const size_t *sizes)
{
    api_buf_char(w, '{');
    if (req->id[0]) {
        api_buf_cstr(w, "\"id\":");
        api_buf_json_string(w, req->id, strlen(req->id));
        api_buf_char(w, ',');
    }
    write_params(w, req);
    api_buf_cstr(w, ",\"inputs\":[");
    for (size_t i = 0; i < req->n_inputs; i++) {
        const Inference__ModelInferRequest__InferInputTensor *in = req->inputs[i];
        api_buf_cstr(w, i ? ",{\"name\":" : "{\"name\":");
        api_buf_json_string(w, in->name, strlen(in->name));
        api_buf_cstr(w, ",\"datatype\":");
        api_buf_json_string(w, in->datatype, strlen(in->datatype));
        api_buf_cstr(w, ",\"shape\":[");
        for (size_t d = 0; d < in->n_shape; d++) {
            if (d)
                api_buf_char(w, ',');
            api_buf_int(w, in->shape[d]);
        }
        api_buf_printf(w, "],\"parameters\":{\"binary_data_size\":%zu}}", sizes[i]);
    }
    api_buf_char(w, ']');
    if (req->n_outputs) {
        api_buf_cstr(w, ",\"outputs\":[");
        for (size_t o = 0; o < req->n_outputs; o++) {
            api_buf_cstr(w, o ? ",{\"name\":" : "{\"name\":");
            api_buf_json_string(w, req->outputs[o]->name, strlen(req->outputs[o]->name));
            api_buf_char(w, '}');
        }
        api_buf_char(w, ']');
    }
    api_buf_char(w, '}');
}

/* The v2 body: the JSON part, then every input's bytes. *json_len gets the JSON's length. */
static int build_body(infer_job *job, size_t *json_len, api_reply *reply)
{
    size_t sizes[MAX_RAW], total;
    const size_t max =
        job->call->limits ? job->call->limits->max_body_bytes : api_limits_default().max_body_bytes;
    if (input_sizes(job, sizes, &total, reply) != 0)
        return -1;
    if (total > max)
        return fail(reply, 413, API_REASON_TOO_LARGE,
                    "inputs of %zu bytes are above --max-body-bytes %zu", total, max);
    api_buf_init(&job->body, JSON_HEADER_MAX);
    write_header(&job->body, job->req, sizes);
    if (job->body.state != API_BUF_OK)
        return fail(reply, 400, API_REASON_BAD_REQUEST,
                    "names, shapes and parameters take more than %zu bytes", JSON_HEADER_MAX);
    *json_len = job->body.len;
    if (reserve(job, *json_len + total, reply) != 0)
        return -1;
    job->body.max = *json_len + total + 1;
    if (!api_buf_grow_to(&job->body, *json_len + total + 1))
        return fail(reply, 503, API_REASON_MEMORY, "out of memory");
    for (size_t i = 0; i < job->req->n_inputs; i++) {
        if (job->n_raw)
            api_buf_mem(&job->body, job->raw[i].data, job->raw[i].len);
        else
            write_typed(&job->body, job->req->inputs[i]->contents);
    }
    return 0;
}

/* ---- The response ------------------------------------------------------------------------ */

typedef struct {
    Inference__ModelInferResponse resp;
    Inference__ModelInferResponse__InferOutputTensor tensors[API__GRPC_MAX_OUTPUTS];
    Inference__ModelInferResponse__InferOutputTensor *tensor_ptrs[API__GRPC_MAX_OUTPUTS];
    int64_t shapes[API__GRPC_MAX_OUTPUTS][8];
    ProtobufCBinaryData raw[API__GRPC_MAX_OUTPUTS];
    Inference__ModelInferResponse__ParametersEntry param;
    Inference__ModelInferResponse__ParametersEntry *param_ptr;
    Inference__InferParameter precision;
} response;

/* One output of the v2 reply's JSON part, its bytes at *offset of `data`. */
static bool read_output(response *r, size_t o, const json_t *out, const char *data, size_t len,
                        size_t *offset)
{
    Inference__ModelInferResponse__InferOutputTensor *t = &r->tensors[o];
    const json_t *shape = json_object_get(out, "shape");
    json_int_t size =
        json_integer_value(json_object_get(json_object_get(out, "parameters"), "binary_data_size"));
    inference__model_infer_response__infer_output_tensor__init(t);
    if (!json_is_string(json_object_get(out, "name")) || json_array_size(shape) > 8 || size < 0 ||
        (size_t)size > len - *offset)
        return false;
    t->name = (char *)json_string_value(json_object_get(out, "name"));
    t->datatype = (char *)json_string_value(json_object_get(out, "datatype"));
    t->n_shape = json_array_size(shape);
    t->shape = r->shapes[o];
    for (size_t d = 0; d < t->n_shape; d++)
        r->shapes[o][d] = json_integer_value(json_array_get(shape, d));
    r->raw[o].data = (uint8_t *)data + *offset;
    r->raw[o].len = (size_t)size;
    *offset += (size_t)size;
    r->tensor_ptrs[o] = t;
    return t->datatype != NULL;
}

static bool read_reply(response *r, const json_t *root, const api_reply *v2, size_t json_len)
{
    const json_t *outs = json_object_get(root, "outputs");
    const json_t *prec = json_object_get(json_object_get(root, "parameters"), "precision");
    size_t offset = json_len;
    inference__model_infer_response__init(&r->resp);
    r->resp.model_name = (char *)json_string_value(json_object_get(root, "model_name"));
    r->resp.model_version = (char *)json_string_value(json_object_get(root, "model_version"));
    if (json_is_string(json_object_get(root, "id")))
        r->resp.id = (char *)json_string_value(json_object_get(root, "id"));
    if (!r->resp.model_name || !r->resp.model_version ||
        json_array_size(outs) > API__GRPC_MAX_OUTPUTS)
        return false;
    for (size_t o = 0; o < json_array_size(outs); o++)
        if (!read_output(r, o, json_array_get(outs, o), v2->body, v2->body_len, &offset))
            return false;
    r->resp.n_outputs = r->resp.n_raw_output_contents = json_array_size(outs);
    r->resp.outputs = r->tensor_ptrs;
    r->resp.raw_output_contents = r->raw;
    if (json_is_string(prec)) {
        inference__model_infer_response__parameters_entry__init(&r->param);
        inference__infer_parameter__init(&r->precision);
        r->precision.parameter_choice_case =
            INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_STRING_PARAM;
        r->precision.string_param = (char *)json_string_value(prec);
        r->param.key = (char *)"precision";
        r->param.value = &r->precision;
        r->param_ptr = &r->param;
        r->resp.n_parameters = 1;
        r->resp.parameters = &r->param_ptr;
    }
    return offset == v2->body_len;
}

/* Packs `msg` into a new reply body reserved in the lease. */
static void pack_reply(infer_job *job, const ProtobufCMessage *msg, api_reply *v2, api_reply *reply)
{
    size_t n = protobuf_c_message_get_packed_size(msg);
    char *body;
    if (reserve(job, n, reply) != 0)
        return;
    body = eng_buf_alloc(n ? n : 1);
    if (!body) {
        fail(reply, 503, API_REASON_MEMORY, "out of memory");
        return;
    }
    *reply = *v2;
    reply->body = body;
    reply->body_len = protobuf_c_message_pack(msg, (uint8_t *)body);
    reply->content_type = API_GRPC_MESSAGE_TYPE;
    reply->inference_header_len = 0;
    reply->content_encoding = NULL;
    api_reply_free(v2);
}

/* The v2 reply of a successful inference as a ModelInferResponse (or its stream form). */
static void convert_reply(infer_job *job, bool stream, api_reply *v2, api_reply *reply)
{
    size_t json_len =
        v2->inference_header_len > 0 ? (size_t)v2->inference_header_len : v2->body_len;
    json_t *root = json_loadb(v2->body, json_len, 0, NULL);
    response *r = calloc(1, sizeof *r);
    if (!root || !r || !read_reply(r, root, v2, json_len)) {
        api_reply_free(v2);
        fail(reply, 500, API_REASON_INTERNAL, "cannot convert the inference reply to protobuf");
    } else if (stream) {
        Inference__ModelStreamInferResponse s = INFERENCE__MODEL_STREAM_INFER_RESPONSE__INIT;
        s.infer_response = &r->resp;
        pack_reply(job, &s.base, v2, reply);
    } else {
        pack_reply(job, &r->resp.base, v2, reply);
    }
    free(r);
    json_decref(root);
}

/* ModelStreamInfer carries a failure as a message: error_message, status kept for metrics. */
static void stream_error(api_reply *reply)
{
    Inference__ModelStreamInferResponse s = INFERENCE__MODEL_STREAM_INFER_RESPONSE__INIT;
    int status = reply->status;
    api_reason reason = reply->reason;
    char *text = reply->body;
    reply->body = NULL;
    s.error_message = text ? text : (char *)"request failed";
    api__grpc_reply_pack(reply, &s.base);
    eng_buf_free(text);
    if (reply->status == 200) {
        reply->status = status;
        reply->reason = reason;
    }
}

static void run(infer_job *job, bool stream, api_reply *reply)
{
    api_call c = *job->call;
    api_reply v2;
    size_t json_len = 0;
    char header_len[24];
    if (split(job, reply) != 0 || build_body(job, &json_len, reply) != 0)
        return;
    snprintf(header_len, sizeof header_len, "%zu", json_len);
    c.body = job->body.data;
    c.body_len = job->body.len;
    c.content_type = "application/octet-stream";
    c.inference_header_length = header_len;
    c.content_encoding = NULL;
    c.accept_encoding = NULL;
    c.model = job->req->model_name;
    c.version = job->req->model_version[0] ? job->req->model_version : NULL;
    c.request_id = NULL;
    /* The request's own copies go before the route allocates its own. */
    free(job->rest);
    job->rest = NULL;
    api_v2_infer(&c, &v2);
    api_buf_free(&job->body);
    inference__model_infer_request__free_unpacked(job->req, NULL);
    job->req = NULL;
    if (v2.status != 200) {
        *reply = v2;
        api__grpc_reply_from_json_error(reply);
        return;
    }
    convert_reply(job, stream, &v2, reply);
}

void api_grpc_infer(const api_call *call, bool stream, api_reply *reply)
{
    api_lease own;
    api_call c = *call;
    infer_job job;
    memset(reply, 0, sizeof *reply);
    memset(&job, 0, sizeof job);
    if (!c.lease) {
        api_lease_start(&own, NULL, eng_now_ns(), c.limits ? c.limits->max_timeout_ms : 0);
        c.lease = &own;
    }
    job.call = &c;
    api_buf_init(&job.body, 0);
    run(&job, stream, reply);
    free(job.rest);
    api_buf_free(&job.body);
    if (job.req)
        inference__model_infer_request__free_unpacked(job.req, NULL);
    /* What this file reserved was freed above, except the reply it packed, which the caller's
     * lease keeps until the call ends (as the HTTP routes keep their reply text). */
    api_lease_give_back(c.lease, job.held - (reply->status == 200 ? reply->body_len : 0));
    if (stream && reply->content_type && strcmp(reply->content_type, API_GRPC_ERROR_TYPE) == 0)
        stream_error(reply);
    if (c.lease == &own)
        api_lease_end(&own);
}
