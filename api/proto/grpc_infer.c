/*
 * grpc_infer.c - ModelInfer and ModelStreamInfer: KServe v2 inference over gRPC, a route of its
 * own beside v2_infer.c's HTTP one, on the same job (v2.h), the same checks and the same steps
 * of the model's operation.
 *
 * Reading: the message's top-level fields are walked once; raw_input_contents are kept as
 * pointers into the message (protobuf-c would copy them) and the rest (names, shapes,
 * parameters, typed contents: small) unpacked. Each input fills its tensor of the operation's
 * request through v2_request.c's checks (api__v2_input_begin, api__v2_input_datatype,
 * api__v2_input_raw): raw contents as raw bytes, used where they lie in the message when they
 * are aligned for their datatype (api__tensor_in_place) or can be moved onto the alignment over
 * their own tag and length (call->body_movable), else converted once; typed contents
 * (fp32_contents for FP32, int_contents for INT32, int64_contents for INT64, bool_contents for
 * BOOL) the same way from protobuf-c's arrays, bools as bytes. Each parameter goes through
 * api__v2_parameter as the JSON scalar the HTTP route reads (the options' parsers take one), so
 * that every name, range and message is v2's. binary_data_output and the outputs' and inputs'
 * own parameters are ignored: gRPC returns every output as raw_output_contents.
 *
 * Writing: a ModelInferResponse (the model, version "1", the id, the precision parameter, each
 * output's name, datatype and shape) whose raw_output_contents are the computed outputs (or
 * their bf16 rounding), packed once into the reply. A failure is the v2 route's status and
 * message as plain text (API_ERRORS_GRPC); a stream carries it as its error_message.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/core/memory.h"
#include "api/proto/grpc.h"
#include "api/proto/serve.h"
#include "api/proto/v2.h"
#include "grpc_service.pb-c.h"

#define RAW_FIELD       7 /* ModelInferRequest.raw_input_contents */
#define MAX_RAW         64
#define UNPACK_PER_BYTE 4 /* a bool content of one byte unpacks into a 4-byte boolean */

typedef struct {
    v2_job v; /* first: its api__req is api__serve's */
    bool stream;
    ProtobufCBinaryData raw[MAX_RAW]; /* pointers into the message */
    size_t raw_head[MAX_RAW];         /* the bytes of each one's tag and length, before it */
    size_t n_raw;
    Inference__ModelInferRequest *req; /* the rest of the message, unpacked */
} grpc_job;

_Static_assert(offsetof(grpc_job, v) == 0 && offsetof(v2_job, rq) == 0,
               "api__serve takes the job for its api__req");

/* ---- The message ---------------------------------------------------------------------------- */

static int malformed(api__error *err, const char *what, size_t at)
{
    return api__error_set(err, API_STATUS_MALFORMED_REQUEST, API_REASON_BAD_REQUEST, NULL,
                          "malformed ModelInferRequest message%s (byte %zu)", what, at);
}

/* Walks the message's top-level fields: the raw contents as pointers into it, and (with `rest`)
 * the other fields copied into `rest`; *rest_len gets the bytes of those others. */
static int walk(grpc_job *job, char *rest, size_t *rest_len, api__error *err)
{
    const api_call *call = job->v.rq.call;
    api__pb_cursor c = {.data = call->body, .len = call->body_len};
    api__pb_field f;
    size_t start = 0;
    *rest_len = 0;
    job->n_raw = 0;
    while (api__pb_next(&c, &f)) {
        if (f.number == RAW_FIELD && f.type == 2) {
            if (job->n_raw == MAX_RAW)
                return api__error_set(err, API_STATUS_MALFORMED_REQUEST, API_REASON_BAD_REQUEST,
                                      NULL, "raw_input_contents: more than %d entries", MAX_RAW);
            job->raw_head[job->n_raw] = (size_t)(f.data - (call->body + start));
            job->raw[job->n_raw].data = (uint8_t *)(uintptr_t)f.data;
            job->raw[job->n_raw++].len = f.len;
        } else {
            if (rest)
                memcpy(rest + *rest_len, call->body + start, c.pos - start);
            *rest_len += c.pos - start;
        }
        start = c.pos;
    }
    return c.bad ? malformed(err, "", c.pos) : 0;
}

/* Splits the message into its raw contents (pointers) and the rest, and unpacks the rest,
 * reserving what the copy and unpacking may take. */
static int unpack(grpc_job *job, api__error *err)
{
    size_t rest_len;
    if (walk(job, NULL, &rest_len, err) != 0)
        return -1;
    /* rest_len <= the message's length <= --max-body-bytes; saturated all the same. */
    size_t unpacked = rest_len > (SIZE_MAX - 4096) / (1 + UNPACK_PER_BYTE)
                          ? SIZE_MAX
                          : rest_len * (1 + UNPACK_PER_BYTE) + 4096;
    if (api__req_reserve(&job->v.rq, unpacked, false,
                         "the message's names, shapes, parameters and typed contents", err) != 0)
        return -1;
    char *rest = malloc(rest_len + 1);
    if (!rest)
        return api__error_set(err, API_STATUS_UNAVAILABLE, API_REASON_MEMORY, NULL,
                              "out of memory");
    walk(job, rest, &rest_len, err);
    job->req = inference__model_infer_request__unpack(NULL, rest_len, (const uint8_t *)rest);
    free(rest);
    if (!job->req)
        return api__error_set(err, API_STATUS_MALFORMED_REQUEST, API_REASON_BAD_REQUEST, NULL,
                              "malformed ModelInferRequest message");
    return 0;
}

/* Whether input i has typed contents of any kind. */
static bool has_typed(const Inference__ModelInferRequest__InferInputTensor *in)
{
    const Inference__InferTensorContents *t = in->contents;
    return t &&
           (t->n_fp32_contents || t->n_int_contents || t->n_int64_contents || t->n_bool_contents);
}

/* Every input has its data in one place: raw_input_contents (one per input) or typed contents
 * (each its own), never both. */
static int contents_check(const grpc_job *job, api__error *err)
{
    const Inference__ModelInferRequest *req = job->req;
    if (job->n_raw && job->n_raw != req->n_inputs)
        return api__error_set(err, API_STATUS_MALFORMED_REQUEST, API_REASON_BAD_REQUEST, NULL,
                              "raw_input_contents: %zu entries for %zu inputs (give one per input, "
                              "or none)",
                              job->n_raw, req->n_inputs);
    if (req->n_inputs > MAX_RAW)
        return api__error_set(err, API_STATUS_MALFORMED_REQUEST, API_REASON_BAD_REQUEST, NULL,
                              "inputs: more than %d", MAX_RAW);
    for (size_t i = 0; i < req->n_inputs; i++) {
        bool typed = has_typed(req->inputs[i]);
        if (job->n_raw && typed)
            return api__error_set(err, API_STATUS_MALFORMED_REQUEST, API_REASON_BAD_REQUEST, NULL,
                                  "inputs[%zu] (%s): both contents and raw_input_contents", i,
                                  req->inputs[i]->name);
        if (!job->n_raw && !typed)
            return api__error_set(err, API_STATUS_MALFORMED_REQUEST, API_REASON_BAD_REQUEST, NULL,
                                  "inputs[%zu] (%s): no data (fp32, int, int64 or bool contents, "
                                  "or raw_input_contents)",
                                  i, req->inputs[i]->name);
    }
    return 0;
}

/* ---- The request ---------------------------------------------------------------------------- */

/* An InferParameter as the JSON value the HTTP route would read for it: an integral double as
 * an integer (JSON does not tell 2.0 from 2), a non-finite one as null, a uint64 beyond int64 as
 * its digits (a correlation id's text), an unset one as null. NULL when memory ran out or a
 * string is not UTF-8 (*bad_text). */
static json_t *param_value(const Inference__InferParameter *p, bool *bad_text)
{
    char digits[24];
    *bad_text = false;
    switch (p ? p->parameter_choice_case : INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE__NOT_SET) {
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM:
        return json_boolean(p->bool_param);
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM:
        return json_integer((json_int_t)p->int64_param);
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_UINT64_PARAM:
        if (p->uint64_param <= INT64_MAX)
            return json_integer((json_int_t)p->uint64_param);
        snprintf(digits, sizeof digits, "%llu", (unsigned long long)p->uint64_param);
        return json_string(digits);
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_DOUBLE_PARAM:
        if (!isfinite(p->double_param))
            return json_null();
        if (p->double_param == trunc(p->double_param) && fabs(p->double_param) < 1e17)
            return json_integer((json_int_t)p->double_param);
        return json_real(p->double_param);
    case INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_STRING_PARAM: {
        json_t *s = json_string(p->string_param);
        *bad_text = s == NULL;
        return s;
    }
    default:
        return json_null();
    }
}

static int read_parameters(grpc_job *job, api__error *err)
{
    const Inference__ModelInferRequest *req = job->req;
    for (size_t i = 0; i < req->n_parameters; i++) {
        const Inference__ModelInferRequest__ParametersEntry *e = req->parameters[i];
        bool bad_text;
        if (strcmp(e->key, "binary_data_output") == 0)
            continue; /* raw_output_contents are the only outputs gRPC has */
        json_t *v = param_value(e->value, &bad_text);
        if (!v && bad_text)
            return api__error_set(err, API_STATUS_MALFORMED_REQUEST, API_REASON_BAD_REQUEST, NULL,
                                  "parameters.%.60s: the string is not UTF-8", e->key);
        if (!v)
            return api__error_set(err, API_STATUS_UNAVAILABLE, API_REASON_MEMORY, NULL,
                                  "out of memory");
        int rc = api__v2_parameter(&job->v, e->key, v, err);
        json_decref(v);
        if (rc != 0)
            return -1;
    }
    return 0;
}

/* Input `in`'s typed contents: those of its datatype, as its raw bytes (protobuf-c's arrays
 * where they lie; bools converted to bytes into a buffer of the request). */
static int typed_input(grpc_job *job, const Inference__ModelInferRequest__InferInputTensor *in,
                       api__tensor *t, api__dtype dtype, api__error *err)
{
    const Inference__InferTensorContents *c = in->contents;
    const struct {
        size_t n;
        const void *data;
        api__dtype dtype;
        const char *name;
    } kinds[] = {
        {c->n_fp32_contents, c->fp32_contents, API_DTYPE_FLOAT32, "fp32_contents"},
        {c->n_int_contents, c->int_contents, API_DTYPE_INT32, "int_contents"},
        {c->n_int64_contents, c->int64_contents, API_DTYPE_INT64, "int64_contents"},
        {c->n_bool_contents, c->bool_contents, API_DTYPE_BOOL, "bool_contents"},
    };
    size_t k = 0, given = 0, n_kinds = sizeof kinds / sizeof kinds[0];
    for (size_t i = 0; i < n_kinds; i++) {
        if (kinds[i].n) {
            given++;
            k = kinds[i].dtype == dtype || given == 1 ? i : k;
        }
    }
    if (given > 1 || kinds[k].dtype != dtype)
        return api__error_invalid(err, in->name,
                                  "input %s has datatype %s but its contents are %s%s; give the "
                                  "contents of its datatype (fp32_contents for FP32, int_contents "
                                  "for INT32, int64_contents for INT64, bool_contents for BOOL) "
                                  "or raw_input_contents",
                                  in->name, in->datatype, kinds[k].name,
                                  given > 1 ? " and more" : "");
    const char *bytes = kinds[k].data;
    size_t n = kinds[k].n;
    if (dtype == API_DTYPE_BOOL) {
        char *b = api__req_alloc(&job->v.rq, n, err);
        if (!b)
            return -1;
        for (size_t i = 0; i < n; i++)
            b[i] = c->bool_contents[i] ? 1 : 0;
        bytes = b;
    }
    /* n <= the message's bytes, far from overflowing once multiplied by 8. */
    return api__v2_input_raw(t, in->name, in->datatype, dtype,
                             (int64_t)(n * api__dtype_size(dtype)), bytes, err);
}

/* Raw contents i of `dtype`, moved back onto the alignment of its elements over its own tag and
 * length (read already) when the caller lets the route move bytes of the message and they make
 * room: the operation then reads the tensor where it lies instead of converting a copy. Only the
 * dtypes that are used as they are (float32 and int64) are worth the move. */
static void realign(grpc_job *job, size_t i, api__dtype dtype)
{
    size_t size = api__dtype_size(dtype);
    size_t off = (uintptr_t)job->raw[i].data % size;
    if (!job->v.rq.call->body_movable || off == 0 || off > job->raw_head[i] ||
        (dtype != API_DTYPE_FLOAT32 && dtype != API_DTYPE_INT64))
        return;
    memmove(job->raw[i].data - off, job->raw[i].data, job->raw[i].len);
    job->raw[i].data -= off;
    job->raw_head[i] -= off;
}

static int read_input(grpc_job *job, size_t i, api__error *err)
{
    const Inference__ModelInferRequest__InferInputTensor *in = job->req->inputs[i];
    char field[64], sub[192];
    api__tensor *t;
    api__dtype dtype = API_DTYPE_FLOAT32;
    bool json_ok;
    snprintf(field, sizeof field, "inputs[%zu]", i);
    if (api__v2_input_begin(&job->v, in->name, field, &t, err) != 0)
        return -1;
    snprintf(sub, sizeof sub, "%s.shape", in->name);
    if (api__shape_dims(in->shape, in->n_shape, sub, job->v.rq.limits.max_elements, t->shape,
                        &t->rank, &t->count, err) != 0)
        return -1;
    snprintf(sub, sizeof sub, "%s.datatype", in->name);
    if (api__v2_input_datatype(in->name, in->datatype, sub, &dtype, &json_ok, err) != 0)
        return -1;
    if (!job->n_raw)
        return typed_input(job, in, t, dtype, err);
    if (api__v2_input_raw(t, in->name, in->datatype, dtype, (int64_t)job->raw[i].len,
                          (const char *)job->raw[i].data, err) != 0)
        return -1;
    realign(job, i, dtype);
    t->raw = job->raw[i].data;
    return 0;
}

/* The request's id, parameters, inputs and outputs into the job, in the order the HTTP route
 * reads them. */
static int read_request(grpc_job *job, api__error *err)
{
    const Inference__ModelInferRequest *req = job->req;
    v2_job *v = &job->v;
    if (req->id[0]) {
        v->id = req->id; /* the unpacked message outlives the reply's packing */
        v->id_len = strlen(req->id);
        v->has_id = true;
    }
    v->binary_default = true;
    if (read_parameters(job, err) != 0)
        return -1;
    for (size_t i = 0; i < req->n_inputs; i++)
        if (read_input(job, i, err) != 0)
            return -1;
    if (api__v2_inputs_complete(v, err) != 0)
        return -1;
    for (size_t i = 0; i < req->n_outputs; i++) {
        char field[64];
        int o;
        snprintf(field, sizeof field, "outputs[%zu]", i);
        if (api__v2_output_want(v, req->outputs[i]->name, field, &o, err) != 0)
            return -1;
    }
    return 0;
}

/* ---- The route: its steps of api__serve ------------------------------------------------------ */

/* The message, its contents and its model, before the request's fields are read. */
static int read(void *p, api__error *err)
{
    grpc_job *job = p;
    const Inference__ModelInferRequest *req;
    if (api__req_check_body_size(&job->v.rq, err) != 0 || unpack(job, err) != 0 ||
        contents_check(job, err) != 0)
        return -1;
    req = job->req;
    if (api__v2_model_lookup(job->v.rq.call->models, req->model_name,
                             req->model_version[0] ? req->model_version : NULL, &job->v.model,
                             err) != 0)
        return -1;
    api__v2_job_init(&job->v);
    return 0;
}

static int check(void *p, api__error *err)
{
    grpc_job *job = p;
    if (read_request(job, err) != 0 || api__v2_outputs_settle(&job->v, err) != 0)
        return -1;
    return api__v2_model_check(&job->v, err);
}

/* A bound of the packed response without its outputs' bytes: names and ids, parameters, and
 * per output its name, datatype, shape and the tags and lengths of its bytes. */
static size_t response_bound(const grpc_job *job)
{
    size_t n = 256 + strlen(job->v.model.name);
    if (job->v.has_id)
        n += job->v.id_len;
    for (int o = 0; o < API__N_OUTPUTS; o++)
        if (job->v.want[o])
            n += 128;
    return n;
}

/* The operation's own sizes, its outputs (in buffers of the request), and the response (its
 * outputs' bytes again, and once more for bf16 ones, rounded in the writer before packing). */
static bool size(void *p, api__sizes *sz)
{
    grpc_job *job = p;
    v2_job *v = &job->v;
    size_t bytes = 0;
    bool ok = v->op->steps.size(v->op_state, sz);
    for (int o = 0; o < API__N_OUTPUTS; o++) {
        const api__out_shape *sh = v2_output_shape(v, o);
        if (!sh)
            continue;
        ok = ok && api__req_output_bytes(sh->count, &sz->tensors);
        if (v->want[o])
            bytes += sh->count * v2_elem_bytes(v); /* within --max-elements */
    }
    return ok && api__size_add(&sz->text, response_bound(job)) && api__size_add(&sz->text, bytes) &&
           (!v->bf16_out || api__size_add(&sz->text, bytes));
}

typedef struct {
    Inference__ModelInferResponse resp;
    Inference__ModelInferResponse__InferOutputTensor tensors[API__N_OUTPUTS];
    Inference__ModelInferResponse__InferOutputTensor *tensor_ptrs[API__N_OUTPUTS];
    int64_t shapes[API__N_OUTPUTS][4];
    ProtobufCBinaryData raw[API__N_OUTPUTS];
    Inference__ModelInferResponse__ParametersEntry param, *param_ptr;
    Inference__InferParameter precision;
} response;

/* The response's outputs: fp32 where the engine wrote them, bf16 rounded into w. */
static int fill_outputs(grpc_job *job, response *r, api_buf *w, api__error *err)
{
    v2_job *v = &job->v;
    size_t n = 0, at[API__N_OUTPUTS];
    for (int o = 0; o < API__N_OUTPUTS; o++) {
        if (!v->want[o])
            continue;
        const api__out_shape *sh = v2_output_shape(v, o);
        Inference__ModelInferResponse__InferOutputTensor *t = &r->tensors[n];
        if (api__v2_output_finite(v, o, err) != 0)
            return -1;
        inference__model_infer_response__infer_output_tensor__init(t);
        t->name = (char *)api__out_names[o];
        t->datatype = (char *)v2_output_datatype(v);
        t->n_shape = (size_t)sh->rank;
        t->shape = r->shapes[n];
        memcpy(r->shapes[n], sh->shape, (size_t)sh->rank * sizeof sh->shape[0]);
        r->tensor_ptrs[n] = t;
        r->raw[n].len = sh->count * v2_elem_bytes(v);
        r->raw[n].data = (uint8_t *)v2_output_data(v, o);
        at[n] = w->len;
        if (v->bf16_out && api__v2_output_bytes(v, o, w, err) != 0)
            return -1;
        n++;
    }
    if (w->state != API_BUF_OK)
        return api__buf_error(w, err);
    /* The writer has stopped growing: its bytes stay where they are until the packing. */
    for (size_t i = 0; i < n && v->bf16_out; i++)
        r->raw[i].data = (uint8_t *)w->data + at[i];
    r->resp.n_outputs = r->resp.n_raw_output_contents = n;
    r->resp.outputs = r->tensor_ptrs;
    r->resp.raw_output_contents = r->raw;
    return 0;
}

static int encode(void *p, api_buf *w, api_reply *reply, api__error *err)
{
    grpc_job *job = p;
    v2_job *v = &job->v;
    response r;
    Inference__ModelStreamInferResponse s = INFERENCE__MODEL_STREAM_INFER_RESPONSE__INIT;
    const ProtobufCMessage *msg = job->stream ? &s.base : &r.resp.base;
    inference__model_infer_response__init(&r.resp);
    r.resp.model_name = (char *)v->model.name;
    r.resp.model_version = (char *)API_V2_VERSION;
    if (v->has_id)
        r.resp.id = v->id;
    inference__model_infer_response__parameters_entry__init(&r.param);
    inference__infer_parameter__init(&r.precision);
    r.precision.parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_STRING_PARAM;
    r.precision.string_param = (char *)api__precision_name(v->op->precision(v->op_state));
    r.param.key = (char *)"precision";
    r.param.value = &r.precision;
    r.param_ptr = &r.param;
    r.resp.n_parameters = 1;
    r.resp.parameters = &r.param_ptr;
    s.infer_response = &r.resp;
    if (fill_outputs(job, &r, w, err) != 0)
        return -1;
    size_t n = protobuf_c_message_get_packed_size(msg);
    reply->body = eng_buf_alloc(n ? n : 1);
    if (!reply->body)
        return api__error_set(err, API_STATUS_UNAVAILABLE, API_REASON_MEMORY, NULL,
                              "out of memory for the reply");
    reply->body_len = protobuf_c_message_pack(msg, (uint8_t *)reply->body);
    reply->status = api_status_http(API_ERRORS_GRPC, API_STATUS_OK);
    reply->reason = API_REASON_NONE;
    reply->content_type = API_GRPC_MESSAGE_TYPE;
    if (v->seq_set)
        snprintf(reply->session, sizeof reply->session, "%s", v->session);
    return 0;
}

static void free_job(void *p)
{
    grpc_job *job = p;
    if (job->v.op)
        api__v2_free(&job->v);
    if (job->req)
        inference__model_infer_request__free_unpacked(job->req, NULL);
    job->req = NULL;
}

static const api__route grpc_route = {
    .style = API_ERRORS_GRPC,
    .steps = {.read = read,
              .check = check,
              .size = size,
              .decode = api__v2_decode,
              .run = api__v2_run,
              .encode = encode,
              .batch = api__v2_batch,
              .free = free_job,
              .operation = api__v2_operation},
};

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

/* A stream's reply: a failure becomes a message of the stream. */
static void stream_finish(api_reply *reply)
{
    if (reply->status != 200)
        stream_error(reply);
}

static void *job_of(bool stream)
{
    grpc_job *job = calloc(1, sizeof *job);
    if (job)
        job->stream = stream;
    return job;
}

static void *unary_job_new(const api_call *call, api_reply *reply, bool *answered)
{
    (void)call;
    (void)reply;
    *answered = false;
    return job_of(false);
}

static void *stream_job_new(const api_call *call, api_reply *reply, bool *answered)
{
    (void)call;
    (void)reply;
    *answered = false;
    return job_of(true);
}

const api__batchable api__grpc_infer_batchable = {.route = &grpc_route, .job_new = unary_job_new};
const api__batchable api__grpc_stream_batchable = {
    .route = &grpc_route, .job_new = stream_job_new, .finish = stream_finish};

void api_grpc_infer(const api_call *call, bool stream, api_reply *reply)
{
    grpc_job *job = job_of(stream);
    api__serve(&grpc_route, job, call, reply);
    free(job);
    if (stream)
        stream_finish(reply);
}
