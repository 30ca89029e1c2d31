/* test_grpc_infer.c - gRPC inference as a route of api/ (proto/grpc_infer.c) without a socket,
 * specified against the KServe v2 HTTP route it shares its checks with: every case is one
 * request written twice, as a ModelInferRequest (api_grpc_infer) and as the v2 body with binary
 * tensor data and binary_data_output (api_v2_infer), and the two outcomes must agree - the same
 * status and message for a refusal, the same outputs (names, datatypes, shapes and bytes, bit
 * for bit), id and precision for an answer. Covered: raw tensors of each datatype (moved onto
 * their alignment and used in place where the caller allows it), typed contents, every
 * parameter of model sdpa and a layer model, parameters of each InferParameter type (and of
 * none), bad inputs (datatype, shape, byte count, missing, unknown, given twice),
 * unknown parameters and outputs, the gRPC-only refusals (raw and typed contents mixed or
 * missing, contents of another datatype), ModelStreamInfer's replies, sequences (a session per
 * sequence_id, as over HTTP), and that every byte reserved comes back to the budget. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "grpc_service.pb-c.h"
#include "tests/support/check.h"
#include "tests/support/rng.h"

static eng_pool *pool;
static api_budget *budget;
static api_models *models;
static api_sessions *sessions;
static bool movable; /* gRPC calls let the route move bytes of their message (as the server does) */

/* ---- Cases ---------------------------------------------------------------------------------- */

typedef enum { RAW = 0, TYPED, NO_DATA } data_form;

/* One input: its values as the bytes of its datatype (raw), which typed contents repeat as
 * numbers of the kind `contents` names ("fp32", "int", "int64", "bool"; NULL: the datatype's). */
typedef struct {
    const char *name, *datatype;
    size_t rank;
    int64_t shape[5];
    const void *bytes;
    size_t len;
    data_form form;
    const char *contents;
} tin;

/* One parameter: its InferParameter case (0: none set) and value. */
typedef struct {
    const char *key;
    char kind; /* 'b' bool, 'i' int64, 'u' uint64, 'd' double, 's' string, 'n' none */
    int64_t i;
    uint64_t u;
    double d;
    const char *s;
} tparam;

#define TIN(n, dt, b, l, r, ...)                                                                   \
    ((tin){.name = (n),                                                                            \
           .datatype = (dt),                                                                       \
           .bytes = (b),                                                                           \
           .len = (l),                                                                             \
           .rank = (r),                                                                            \
           .shape = {__VA_ARGS__}})
#define PB(k, v) ((tparam){.key = (k), .kind = 'b', .i = (v)})
#define PI(k, v) ((tparam){.key = (k), .kind = 'i', .i = (v)})
#define PU(k, v) ((tparam){.key = (k), .kind = 'u', .u = (v)})
#define PD(k, v) ((tparam){.key = (k), .kind = 'd', .d = (v)})
#define PS(k, v) ((tparam){.key = (k), .kind = 's', .s = (v)})
#define PN(k)    ((tparam){.key = (k), .kind = 'n'})

typedef struct {
    const char *model, *version, *id;
    tin in[8];
    size_t n_in;
    tparam p[12];
    size_t n_p;
    const char *out[4];
    size_t n_out;
    bool extra_raw; /* one raw_input_contents more than inputs (gRPC only) */
} tcase;

/* A growing byte string. */
typedef struct {
    char *data;
    size_t len;
    FILE *f;
} sbuf;

static void param_json(FILE *f, const tparam *p)
{
    switch (p->kind) {
    case 'b':
        fputs(p->i ? "true" : "false", f);
        break;
    case 'i':
        fprintf(f, "%lld", (long long)p->i);
        break;
    case 'u':
        fprintf(f, "%llu", (unsigned long long)p->u);
        break;
    case 'd':
        fprintf(f, "%.17g", p->d);
        break;
    case 's': {
        json_t *s = json_string(p->s);
        char *t = json_dumps(s, JSON_ENCODE_ANY);
        fputs(t, f);
        free(t);
        json_decref(s);
        break;
    }
    default:
        fputs("null", f);
    }
}

/* The v2 body of a case: the JSON part (binary_data_output true, every input binary), then
 * the inputs' bytes; *header_len the JSON's length. malloc'd. */
static char *v2_body(const tcase *c, size_t *len, size_t *header_len)
{
    char *data = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&data, &n);
    fputs("{", f);
    if (c->id)
        fprintf(f, "\"id\":\"%s\",", c->id);
    fputs("\"parameters\":{\"binary_data_output\":true", f);
    for (size_t i = 0; i < c->n_p; i++) {
        if (strcmp(c->p[i].key, "binary_data_output") == 0)
            continue;
        fprintf(f, ",\"%s\":", c->p[i].key);
        param_json(f, &c->p[i]);
    }
    fputs("},\"inputs\":[", f);
    for (size_t i = 0; i < c->n_in; i++) {
        const tin *in = &c->in[i];
        fprintf(f, "%s{\"name\":\"%s\",\"datatype\":\"%s\",\"shape\":[", i ? "," : "", in->name,
                in->datatype);
        for (size_t d = 0; d < in->rank; d++)
            fprintf(f, "%s%lld", d ? "," : "", (long long)in->shape[d]);
        fprintf(f, "],\"parameters\":{\"binary_data_size\":%zu}}", in->len);
    }
    fputs("]", f);
    if (c->n_out) {
        fputs(",\"outputs\":[", f);
        for (size_t o = 0; o < c->n_out; o++)
            fprintf(f, "%s{\"name\":\"%s\"}", o ? "," : "", c->out[o]);
        fputs("]", f);
    }
    fputs("}", f);
    fflush(f);
    *header_len = n;
    for (size_t i = 0; i < c->n_in; i++)
        fwrite(c->in[i].bytes, 1, c->in[i].len, f);
    fclose(f);
    *len = n;
    return data;
}

/* Input in's bytes as typed contents of kind `kind`. */
static void typed(const tin *in, Inference__InferTensorContents *t, float *f32, int32_t *i32,
                  int64_t *i64, protobuf_c_boolean *b)
{
    const char *kind = in->contents;
    if (!kind)
        kind = strcmp(in->datatype, "FP32") == 0    ? "fp32"
               : strcmp(in->datatype, "INT32") == 0 ? "int"
               : strcmp(in->datatype, "INT64") == 0 ? "int64"
                                                    : "bool";
    if (strcmp(kind, "fp32") == 0) {
        t->n_fp32_contents = in->len / 4;
        memcpy(f32, in->bytes, in->len);
        t->fp32_contents = f32;
    } else if (strcmp(kind, "int") == 0) {
        t->n_int_contents = in->len / 4;
        memcpy(i32, in->bytes, in->len);
        t->int_contents = i32;
    } else if (strcmp(kind, "int64") == 0) {
        t->n_int64_contents = in->len / 8;
        memcpy(i64, in->bytes, in->len);
        t->int64_contents = i64;
    } else {
        t->n_bool_contents = in->len;
        for (size_t k = 0; k < in->len; k++)
            b[k] = ((const uint8_t *)in->bytes)[k] != 0;
        t->bool_contents = b;
    }
}

#define MAX_TYPED 4096

/* The ModelInferRequest of a case, packed into a 64-byte-aligned buffer (as the server's
 * reader hands it over), at `shift` bytes past the alignment. */
static char *grpc_message(const tcase *c, size_t shift, size_t *len, char **base)
{
    Inference__ModelInferRequest req = INFERENCE__MODEL_INFER_REQUEST__INIT;
    Inference__ModelInferRequest__InferInputTensor in[8], *inp[8];
    Inference__InferTensorContents contents[8];
    ProtobufCBinaryData raw[9];
    Inference__ModelInferRequest__ParametersEntry e[12], *ep[12];
    Inference__InferParameter pv[12];
    Inference__ModelInferRequest__InferRequestedOutputTensor out[4], *outp[4];
    static float f32[8][MAX_TYPED];
    static int32_t i32[8][MAX_TYPED];
    static int64_t i64[8][MAX_TYPED];
    static protobuf_c_boolean b[8][MAX_TYPED];
    size_t n_raw = 0;
    req.model_name = (char *)c->model;
    if (c->version)
        req.model_version = (char *)c->version;
    if (c->id)
        req.id = (char *)c->id;
    for (size_t i = 0; i < c->n_in; i++) {
        const tin *t = &c->in[i];
        inference__model_infer_request__infer_input_tensor__init(&in[i]);
        in[i].name = (char *)t->name;
        in[i].datatype = (char *)t->datatype;
        in[i].n_shape = t->rank;
        in[i].shape = (int64_t *)t->shape;
        inp[i] = &in[i];
        if (t->form == RAW) {
            raw[n_raw].data = (uint8_t *)t->bytes;
            raw[n_raw++].len = t->len;
        } else if (t->form == TYPED) {
            inference__infer_tensor_contents__init(&contents[i]);
            CHECK(t->len <= MAX_TYPED);
            typed(t, &contents[i], f32[i], i32[i], i64[i], b[i]);
            in[i].contents = &contents[i];
        }
    }
    if (c->extra_raw) {
        raw[n_raw].data = (uint8_t *)"abcd";
        raw[n_raw++].len = 4;
    }
    req.n_inputs = c->n_in;
    req.inputs = inp;
    req.n_raw_input_contents = n_raw;
    req.raw_input_contents = raw;
    for (size_t i = 0; i < c->n_p; i++) {
        const tparam *p = &c->p[i];
        inference__model_infer_request__parameters_entry__init(&e[i]);
        inference__infer_parameter__init(&pv[i]);
        e[i].key = (char *)p->key;
        e[i].value = &pv[i];
        ep[i] = &e[i];
        switch (p->kind) {
        case 'b':
            pv[i].parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM;
            pv[i].bool_param = p->i != 0;
            break;
        case 'i':
            pv[i].parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM;
            pv[i].int64_param = p->i;
            break;
        case 'u':
            pv[i].parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_UINT64_PARAM;
            pv[i].uint64_param = p->u;
            break;
        case 'd':
            pv[i].parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_DOUBLE_PARAM;
            pv[i].double_param = p->d;
            break;
        case 's':
            pv[i].parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_STRING_PARAM;
            pv[i].string_param = (char *)p->s;
            break;
        default:
            break;
        }
    }
    req.n_parameters = c->n_p;
    req.parameters = ep;
    for (size_t o = 0; o < c->n_out; o++) {
        inference__model_infer_request__infer_requested_output_tensor__init(&out[o]);
        out[o].name = (char *)c->out[o];
        outp[o] = &out[o];
    }
    req.n_outputs = c->n_out;
    req.outputs = outp;
    *len = inference__model_infer_request__get_packed_size(&req);
    *base = eng_buf_alloc(*len + shift + 1);
    inference__model_infer_request__pack(&req, (uint8_t *)*base + shift);
    return *base + shift;
}

/* ---- Running both routes -------------------------------------------------------------------- */

typedef struct {
    api_reply v2, grpc;
    json_t *v2_json; /* the v2 reply's JSON part (or error) */
    Inference__ModelInferResponse *resp;
    Inference__ModelStreamInferResponse *stream_resp;
} outcome;

/* Runs one route under a lease of its own and checks that everything it reserved comes back. */
static void run_route(bool grpc, bool stream, const char *body, size_t len, const char *header_len,
                      const tcase *c, api_reply *reply)
{
    api_lease lease;
    size_t before = api_budget_in_use(budget);
    api_lease_start(&lease, budget, eng_now_ns(), 0);
    api_call call = {.body = body,
                     .body_len = len,
                     .pool = pool,
                     .lease = &lease,
                     .models = models,
                     .sessions = sessions,
                     .body_movable = grpc && movable};
    if (grpc) {
        api_grpc_infer(&call, stream, reply);
    } else {
        call.content_type = "application/octet-stream";
        call.inference_header_length = header_len;
        call.model = c->model;
        call.version = c->version && c->version[0] ? c->version : NULL;
        api_v2_infer(&call, reply);
    }
    CHECKF(reply->status != 200 || lease.held >= reply->body_len,
           "the lease holds %zu bytes for a reply of %zu", lease.held, reply->body_len);
    api_lease_end(&lease);
    CHECKF(api_budget_in_use(budget) == before, "%s: %zu bytes left reserved", grpc ? "gRPC" : "v2",
           api_budget_in_use(budget) - before);
}

static void run_both(const tcase *c, bool stream, size_t shift, outcome *r)
{
    size_t len, hlen, glen;
    char hl[32], *base;
    memset(r, 0, sizeof *r);
    char *body = v2_body(c, &len, &hlen);
    snprintf(hl, sizeof hl, "%zu", hlen);
    run_route(false, false, body, len, hl, c, &r->v2);
    free(body);
    const char *msg = grpc_message(c, shift, &glen, &base);
    run_route(true, stream, msg, glen, NULL, c, &r->grpc);
    eng_buf_free(base);
    size_t json_len =
        r->v2.inference_header_len > 0 ? (size_t)r->v2.inference_header_len : r->v2.body_len;
    r->v2_json = r->v2.body ? json_loadb(r->v2.body, json_len, 0, NULL) : NULL;
    if (r->grpc.status == 200 || stream) {
        CHECK(r->grpc.content_type && strcmp(r->grpc.content_type, "application/grpc") == 0);
        if (stream) {
            r->stream_resp = inference__model_stream_infer_response__unpack(
                NULL, r->grpc.body_len, (const uint8_t *)r->grpc.body);
            CHECK(r->stream_resp != NULL);
        } else {
            r->resp = inference__model_infer_response__unpack(NULL, r->grpc.body_len,
                                                              (const uint8_t *)r->grpc.body);
            CHECK(r->resp != NULL);
        }
    }
}

static void outcome_free(outcome *r)
{
    api_reply_free(&r->v2);
    api_reply_free(&r->grpc);
    json_decref(r->v2_json);
    if (r->resp)
        inference__model_infer_response__free_unpacked(r->resp, NULL);
    if (r->stream_resp)
        inference__model_stream_infer_response__free_unpacked(r->stream_resp, NULL);
}

/* The v2 error message of an outcome ("" when there is none). */
static const char *v2_error(const outcome *r)
{
    const char *m = json_string_value(json_object_get(r->v2_json, "error"));
    return m ? m : "";
}

/* The gRPC error message (the plain-text body). */
static const char *grpc_error(const outcome *r, char *buf, size_t cap)
{
    size_t n = r->grpc.body ? (r->grpc.body_len < cap - 1 ? r->grpc.body_len : cap - 1) : 0;
    if (n)
        memcpy(buf, r->grpc.body, n);
    buf[n] = '\0';
    return buf;
}

/* A successful response agrees with the v2 reply: id, model, precision, and each output's name,
 * datatype, shape and bytes. */
static void check_same_outputs(const outcome *r, const Inference__ModelInferResponse *resp,
                               const char *what)
{
    const json_t *outs = json_object_get(r->v2_json, "outputs");
    size_t at = (size_t)r->v2.inference_header_len;
    if (!resp || !json_is_array(outs)) {
        CHECKF(false, "%s: no outputs to compare", what);
        return;
    }
    CHECKF(strcmp(resp->model_name, json_string_value(json_object_get(r->v2_json, "model_name"))) ==
               0,
           "%s: model %s", what, resp->model_name);
    CHECK(strcmp(resp->model_version, "1") == 0);
    const char *id = json_string_value(json_object_get(r->v2_json, "id"));
    CHECKF(strcmp(resp->id, id ? id : "") == 0, "%s: id %s", what, resp->id);
    const char *prec =
        json_string_value(json_object_get(json_object_get(r->v2_json, "parameters"), "precision"));
    CHECK(resp->n_parameters == 1 && strcmp(resp->parameters[0]->key, "precision") == 0 && prec &&
          strcmp(resp->parameters[0]->value->string_param, prec) == 0);
    CHECKF(resp->n_outputs == json_array_size(outs) &&
               resp->n_raw_output_contents == resp->n_outputs,
           "%s: %zu outputs, v2 %zu", what, resp->n_outputs, json_array_size(outs));
    for (size_t o = 0; o < resp->n_outputs && o < json_array_size(outs); o++) {
        const json_t *v = json_array_get(outs, o);
        const Inference__ModelInferResponse__InferOutputTensor *t = resp->outputs[o];
        const json_t *shape = json_object_get(v, "shape");
        size_t size = (size_t)json_integer_value(
            json_object_get(json_object_get(v, "parameters"), "binary_data_size"));
        CHECKF(strcmp(t->name, json_string_value(json_object_get(v, "name"))) == 0, "%s: %s", what,
               t->name);
        CHECK(strcmp(t->datatype, json_string_value(json_object_get(v, "datatype"))) == 0);
        CHECK(t->n_shape == json_array_size(shape));
        for (size_t d = 0; d < t->n_shape && d < json_array_size(shape); d++)
            CHECK(t->shape[d] == json_integer_value(json_array_get(shape, d)));
        CHECKF(resp->raw_output_contents[o].len == size, "%s: %s has %zu bytes, v2 %zu", what,
               t->name, resp->raw_output_contents[o].len, size);
        if (resp->raw_output_contents[o].len == size && at + size <= r->v2.body_len)
            CHECKF(memcmp(resp->raw_output_contents[o].data, r->v2.body + at, size) == 0,
                   "%s: %s differs from v2's", what, t->name);
        at += size;
    }
}

/* Runs a case both ways and checks that they agree; returns the HTTP status both gave. */
static int agree(const tcase *c, const char *what)
{
    outcome r;
    char msg[600];
    run_both(c, false, 0, &r);
    int status = r.grpc.status;
    CHECKF(r.grpc.status == r.v2.status, "%s: gRPC %d, v2 %d (%s / %s)", what, r.grpc.status,
           r.v2.status, grpc_error(&r, msg, sizeof msg), v2_error(&r));
    if (r.v2.status == 200) {
        check_same_outputs(&r, r.resp, what);
    } else {
        CHECK(r.grpc.content_type && strcmp(r.grpc.content_type, "text/plain") == 0);
        CHECKF(strcmp(grpc_error(&r, msg, sizeof msg), v2_error(&r)) == 0,
               "%s:\n gRPC %s\n v2   %s", what, msg, v2_error(&r));
        CHECKF(v2_error(&r)[0] != '\0', "%s: no v2 message", what);
    }
    outcome_free(&r);
    return status;
}

/* Runs a gRPC-only case: the status and a part of the message. */
static void refused(const tcase *c, int status, const char *part)
{
    outcome r;
    char msg[600];
    run_both(c, false, 0, &r);
    CHECKF(r.grpc.status == status, "gRPC %d (want %d): %s", r.grpc.status, status,
           grpc_error(&r, msg, sizeof msg));
    CHECKF(strstr(grpc_error(&r, msg, sizeof msg), part) != NULL, "gRPC message: %s (want %s)", msg,
           part);
    CHECK(r.grpc.content_type && strcmp(r.grpc.content_type, "text/plain") == 0);
    outcome_free(&r);
}

/* ---- Tensors -------------------------------------------------------------------------------- */

static uint64_t seed = 0x5eed;

static float *randoms(size_t n)
{
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = rng_sym(&seed, 1.0);
    return x;
}

/* q, k, v of [B, H, L, D] FP32 (k and v of S rows), raw. */
typedef struct {
    float *q, *k, *v;
    int64_t B, H, L, S, D;
} qkv;

static void qkv_new(qkv *p, int64_t B, int64_t H, int64_t L, int64_t S, int64_t D)
{
    *p = (qkv){randoms((size_t)(B * H * L * D)),
               randoms((size_t)(B * H * S * D)),
               randoms((size_t)(B * H * S * D)),
               B,
               H,
               L,
               S,
               D};
}

static void qkv_free(qkv *p)
{
    free(p->q);
    free(p->k);
    free(p->v);
}

static void qkv_inputs(const qkv *p, tcase *c)
{
    c->in[0] = TIN("query", "FP32", p->q, (size_t)(p->B * p->H * p->L * p->D) * 4, 4, p->B, p->H,
                   p->L, p->D);
    c->in[1] = TIN("key", "FP32", p->k, (size_t)(p->B * p->H * p->S * p->D) * 4, 4, p->B, p->H,
                   p->S, p->D);
    c->in[2] = TIN("value", "FP32", p->v, (size_t)(p->B * p->H * p->S * p->D) * 4, 4, p->B, p->H,
                   p->S, p->D);
    c->n_in = 3;
}

/* ---- Tests ---------------------------------------------------------------------------------- */

/* Raw FP32 inputs, at every alignment of the message (in place or converted), the model's
 * default outputs, an id; and FP16 / BF16 raw inputs; all bit for bit as v2 computes them. */
static void test_raw_round_trip(void)
{
    qkv p;
    qkv_new(&p, 1, 2, 5, 7, 8);
    tcase c = {.model = "sdpa", .id = "req-1"};
    qkv_inputs(&p, &c);
    for (size_t shift = 0; shift < 4; shift++) {
        outcome r;
        run_both(&c, false, shift, &r);
        CHECKF(r.grpc.status == 200 && r.v2.status == 200, "shift %zu: %d %d", shift, r.grpc.status,
               r.v2.status);
        check_same_outputs(&r, r.resp, "raw fp32");
        CHECK(r.resp && r.resp->n_outputs == 2); /* output and lse, as the metadata lists */
        outcome_free(&r);
    }
    /* Half inputs: the raw bytes of FP16 and BF16. */
    const char *dts[2] = {"FP16", "BF16"};
    for (int h = 0; h < 2; h++) {
        uint16_t *half[3];
        float *src[3] = {p.q, p.k, p.v};
        tcase hc = c;
        for (int i = 0; i < 3; i++) {
            size_t n = c.in[i].len / 4;
            half[i] = malloc(n * 2);
            for (size_t k = 0; k < n; k++)
                half[i][k] = h == 0 ? eng_f32_to_f16(src[i][k]) : eng_f32_to_bf16(src[i][k]);
            hc.in[i].datatype = dts[h];
            hc.in[i].bytes = half[i];
            hc.in[i].len = n * 2;
        }
        CHECK_EQ_INT(agree(&hc, dts[h]), 200);
        for (int i = 0; i < 3; i++)
            free(half[i]);
    }
    qkv_free(&p);
}

/* The smallest memory budget (to 256 bytes) with which gRPC serves case c, its message `shift`
 * bytes past an alignment, movable or not. */
static size_t smallest_budget(const tcase *c, size_t shift, bool move)
{
    size_t lo = 0, hi = (size_t)64 << 20;
    while (hi - lo > 256) {
        size_t mid = lo + (hi - lo) / 2, len;
        char *base;
        const char *msg = grpc_message(c, shift, &len, &base);
        api_budget *b = api_budget_new(mid);
        api_lease lease;
        api_reply r;
        api_lease_start(&lease, b, eng_now_ns(), 0);
        api_call call = {
            .body = msg, .body_len = len, .pool = pool, .lease = &lease, .body_movable = move};
        api_grpc_infer(&call, false, &r);
        if (r.status == 200)
            hi = mid;
        else
            lo = mid;
        api_reply_free(&r);
        api_lease_end(&lease);
        api_budget_free(b);
        eng_buf_free(base);
    }
    return hi;
}

/* Where the caller lets the route move bytes of its message (the server does), raw FP32 inputs
 * off their alignment are moved onto it and used in place: the same outputs as v2's, and a
 * request that needs less memory by their bytes than when they are converted into copies. Each
 * raw input here takes 32 KiB plus a 4-byte tag and length, so all three share the message's
 * alignment: misaligned at three shifts of four. */
static void test_raw_moved_onto_alignment(void)
{
    qkv p;
    qkv_new(&p, 1, 2, 256, 256, 16);
    tcase c = {.model = "sdpa"};
    qkv_inputs(&p, &c);
    int saved = 0;
    movable = true;
    for (size_t shift = 0; shift < 4; shift++) {
        outcome r;
        run_both(&c, false, shift, &r);
        CHECKF(r.grpc.status == 200 && r.v2.status == 200, "shift %zu: %d %d", shift, r.grpc.status,
               r.v2.status);
        check_same_outputs(&r, r.resp, "moved");
        outcome_free(&r);
        size_t copied = smallest_budget(&c, shift, false), moved = smallest_budget(&c, shift, true);
        CHECKF(moved <= copied, "shift %zu: %zu bytes moved, %zu copied", shift, moved, copied);
        saved += copied >= moved + 2 * 32768;
    }
    movable = false;
    CHECK_EQ_INT(saved, 3);
    qkv_free(&p);
}

/* Typed contents: fp32_contents for q, k and v, bool_contents for the mask, int_contents and
 * int64_contents for kv_lengths, give what the same values as raw bytes give over v2. */
static void test_typed_contents(void)
{
    qkv p;
    qkv_new(&p, 2, 2, 4, 6, 4);
    uint8_t mask[4 * 6];
    int32_t kv32[2] = {5, 6};
    int64_t kv64[2] = {3, 6};
    for (int i = 0; i < 24; i++)
        mask[i] = (uint8_t)((i * 7) % 5 != 0);
    for (int variant = 0; variant < 2; variant++) {
        tcase c = {.model = "sdpa", .id = "typed"};
        qkv_inputs(&p, &c);
        c.in[3] = TIN("attn_mask", "BOOL", mask, 24, 2, 4, 6);
        c.in[4] = variant == 0 ? TIN("kv_lengths", "INT32", kv32, 8, 1, 2)
                               : TIN("kv_lengths", "INT64", kv64, 16, 1, 2);
        c.n_in = 5;
        for (size_t i = 0; i < c.n_in; i++)
            c.in[i].form = TYPED;
        CHECK_EQ_INT(agree(&c, variant == 0 ? "typed, int32" : "typed, int64"), 200);
    }
    qkv_free(&p);
}

/* Every parameter of model sdpa, with each of the InferParameter types its value may take,
 * selected outputs, and bf16 outputs. */
static void test_parameters(void)
{
    qkv p;
    qkv_new(&p, 1, 2, 4, 6, 4);
    tcase c = {.model = "sdpa"};
    qkv_inputs(&p, &c);
    c.p[0] = PS("causal", "bottom_right");
    c.p[1] = PI("window_left", 2);
    c.p[2] = PI("window_right", -1);
    c.p[3] = PD("scale", 0.7);
    c.p[4] = PD("softcap", 5.0); /* integral: read as JSON reads 5 */
    c.p[5] = PB("alibi", 1);
    c.p[6] = PS("return_weights", "mean");
    c.p[7] = PB("return_lse", 1);
    c.p[8] = PU("timeout_ms", 10000);
    c.p[9] = PI("priority", 0);
    c.p[10] = PI("timeout", 20000000);
    c.p[11] = PB("binary_data_output", 0); /* ignored: gRPC outputs are raw */
    c.n_p = 12;
    CHECK_EQ_INT(agree(&c, "every parameter"), 200);

    tcase d = {.model = "sdpa"};
    qkv_inputs(&p, &d);
    d.p[0] = PI("query_offset", 2);
    d.p[1] = PB("causal", 1);
    d.p[2] = PS("precision", "bfloat16");
    d.p[3] = PS("output_dtype", "bfloat16");
    d.p[4] = PN("triton_anything"); /* reserved: accepted, unused */
    d.n_p = 5;
    d.out[0] = "lse";
    d.out[1] = "output";
    d.out[2] = "weights";
    d.n_out = 3;
    CHECK_EQ_INT(agree(&d, "bf16 and selected outputs"), 200);

    /* Rank-3 inputs with num_heads / num_kv_heads. */
    tcase e = {.model = "sdpa"};
    float *q = randoms(5 * 16), *k = randoms(7 * 8), *v = randoms(7 * 8);
    e.in[0] = TIN("query", "FP32", q, 5 * 16 * 4, 3, 1, 5, 16);
    e.in[1] = TIN("key", "FP32", k, 7 * 8 * 4, 3, 1, 7, 8);
    e.in[2] = TIN("value", "FP32", v, 7 * 8 * 4, 3, 1, 7, 8);
    e.n_in = 3;
    e.p[0] = PI("num_heads", 4);
    e.p[1] = PU("num_kv_heads", 2);
    e.n_p = 2;
    CHECK_EQ_INT(agree(&e, "rank 3, heads"), 200);
    free(q);
    free(k);
    free(v);

    /* A layer model: its own parameters. */
    float *x = randoms(3 * 64);
    tcase l = {.model = "demo"};
    l.in[0] = TIN("input", "FP32", x, 3 * 64 * 4, 2, 3, 64);
    l.n_in = 1;
    l.p[0] = PB("causal", 1);
    l.p[1] = PS("positional", "rope");
    l.p[2] = PS("return_weights", "per_head");
    l.n_p = 3;
    CHECK_EQ_INT(agree(&l, "layer demo"), 200);
    free(x);
    qkv_free(&p);
}

/* Refusals of the request's fields: the v2 route's status and message, word for word. */
static void test_bad_requests_as_over_http(void)
{
    qkv p;
    qkv_new(&p, 1, 2, 4, 6, 4);
    tcase base = {.model = "sdpa"};
    qkv_inputs(&p, &base);
    static float tokens[4 * 64]; /* a layer model's input */
    tcase c;
    char what[64];
    for (int k = 0;; k++) {
        c = base;
        switch (k) {
        case 0: /* a datatype no input takes */
            c.in[0].datatype = "FP64";
            break;
        case 1: /* not a datatype */
            c.in[1].datatype = "FLOAT";
            break;
        case 2: /* a datatype the input does not take */
            c.in[2].datatype = "INT64";
            break;
        case 3: /* bytes that do not match the shape */
            c.in[1].len -= 4;
            break;
        case 4: /* a shape of the wrong size for the others */
            c.in[1].shape[3] = 2;
            c.in[1].len /= 2;
            break;
        case 5: /* no shape */
            c.in[0].rank = 0;
            break;
        case 6: /* a dimension that is not positive */
            c.in[0].shape[2] = -4;
            break;
        case 7: /* rank 5 */
            c.in[0].rank = 5;
            c.in[0].shape[4] = 1;
            break;
        case 8: /* a required input missing */
            c.n_in = 2;
            break;
        case 9: /* an unknown input */
            c.in[2].name = "valeu";
            break;
        case 10: /* an input given twice */
            c.in[2] = c.in[1];
            break;
        case 11: /* an unknown parameter */
            c.p[0] = PB("casual", 1);
            c.n_p = 1;
            break;
        case 12: /* a parameter of the wrong type */
            c.p[0] = PS("window_left", "two");
            c.n_p = 1;
            break;
        case 13: /* a parameter of no type */
            c.p[0] = PN("scale");
            c.n_p = 1;
            break;
        case 14: /* a double where an integer goes */
            c.p[0] = PD("window_left", 2.5);
            c.n_p = 1;
            break;
        case 15: /* out of range */
            c.p[0] = PI("priority", 99);
            c.n_p = 1;
            break;
        case 16: /* an unknown output */
            c.out[0] = "attention";
            c.n_out = 1;
            break;
        case 17: /* an output twice */
            c.out[0] = c.out[1] = "output";
            c.n_out = 2;
            break;
        case 18: /* weights asked for and refused */
            c.out[0] = "weights";
            c.n_out = 1;
            c.p[0] = PB("return_weights", 0);
            c.n_p = 1;
            break;
        case 19: /* an unknown model */
            c.model = "sdpb";
            break;
        case 20: /* a version the model does not have */
            c.version = "2";
            break;
        case 21: /* a sequence step without its start */
            c.p[0] = PU("sequence_id", 99);
            c.n_p = 1;
            break;
        case 22: /* a sequence_id of the wrong type */
            c.p[0] = PB("sequence_id", 1);
            c.n_p = 1;
            break;
        case 23: /* sinks with weights */
            c.in[3] = TIN("sinks", "FP32", p.q, 8, 1, 2);
            c.n_in = 4;
            c.p[0] = PB("return_weights", 1);
            c.n_p = 1;
            break;
        case 24: /* a layer model's input of the wrong width */
            c.model = "demo";
            c.in[0].name = "input";
            c.in[0].bytes = tokens;
            c.in[0].rank = 2;
            c.in[0].shape[0] = 4;
            c.in[0].shape[1] = 8;
            c.in[0].len = 4 * 8 * 4;
            c.n_in = 1;
            break;
        case 25: /* an option of the layer model that sdpa's are not */
            c.model = "demo";
            c.in[0].name = "input";
            c.in[0].bytes = tokens;
            c.in[0].rank = 2;
            c.in[0].shape[0] = 2;
            c.in[0].shape[1] = 64;
            c.in[0].len = 2 * 64 * 4;
            c.n_in = 1;
            c.p[0] = PB("alibi", 1);
            c.n_p = 1;
            break;
        default:
            qkv_free(&p);
            return;
        }
        snprintf(what, sizeof what, "case %d", k);
        int status = agree(&c, what);
        CHECKF(status >= 400 && status < 500, "%s: %d", what, status);
    }
}

/* What gRPC alone can get wrong: the contents of its inputs. */
static void test_contents_refusals(void)
{
    qkv p;
    qkv_new(&p, 1, 2, 4, 6, 4);
    tcase c = {.model = "sdpa"};
    qkv_inputs(&p, &c);
    c.in[1].form = TYPED; /* raw for two inputs, typed for the third */
    refused(&c, 400, "raw_input_contents: 2 entries for 3 inputs");
    c.in[1].form = RAW;
    c.extra_raw = true;
    refused(&c, 400, "raw_input_contents: 4 entries for 3 inputs");
    c.extra_raw = false;
    for (int i = 0; i < 3; i++)
        c.in[i].form = TYPED;
    c.in[2].form = NO_DATA;
    refused(&c, 400, "inputs[2] (value): no data");
    c.in[2].form = TYPED;
    c.in[2].contents = "int";
    refused(&c, 400, "input value has datatype FP32 but its contents are int_contents");
    c.in[2].contents = NULL;
    c.in[0].datatype = "FP16"; /* half inputs travel raw only */
    c.in[0].contents = "fp32";
    refused(&c, 400, "input query has datatype FP16 but its contents are fp32_contents");
    c.in[0].datatype = "FP32";
    c.in[0].contents = NULL;
    c.in[1].len -= 4; /* typed contents of the wrong count */
    refused(&c, 400, "input key has binary_data_size 188 but 48 FP32 elements take 192 bytes");
    qkv_free(&p);
}

/* ModelStreamInfer: the response wrapped as infer_response; a failure as error_message with
 * the status kept. */
static void test_stream(void)
{
    qkv p;
    qkv_new(&p, 1, 2, 3, 5, 8);
    tcase c = {.model = "sdpa", .id = "s1"};
    qkv_inputs(&p, &c);
    outcome r;
    run_both(&c, true, 0, &r);
    CHECK_EQ_INT(r.grpc.status, 200);
    CHECK(r.stream_resp && r.stream_resp->infer_response && !r.stream_resp->error_message[0]);
    if (r.stream_resp)
        check_same_outputs(&r, r.stream_resp->infer_response, "stream");
    outcome_free(&r);
    c.in[1].shape[3] = 4;
    c.in[1].len /= 2;
    run_both(&c, true, 0, &r);
    CHECK_EQ_INT(r.grpc.status, 400);
    CHECKF(r.stream_resp && !r.stream_resp->infer_response &&
               strcmp(r.stream_resp->error_message, v2_error(&r)) == 0,
           "stream error: %s, v2 %s", r.stream_resp ? r.stream_resp->error_message : "(none)",
           v2_error(&r));
    outcome_free(&r);
    qkv_free(&p);
}

/* A sequence over gRPC steps its own session as the same sequence over v2 steps another:
 * sequence_id as uint64, int64 and string, start, steps and end give the same outputs; after
 * end the sequence is gone on both. */
static void test_sequences(void)
{
    enum { STEPS = 3 };
    qkv p[STEPS];
    for (int s = 0; s < STEPS; s++)
        qkv_new(&p[s], 1, 2, s == 0 ? 4 : 1, s == 0 ? 4 : 1, 8);
    const char *kinds = "uis";
    for (int k = 0; k < 3; k++) {
        for (int s = 0; s <= STEPS; s++) {
            tcase c = {.model = "sdpa"};
            qkv_inputs(&p[s < STEPS ? s : STEPS - 1], &c);
            char id[16];
            snprintf(id, sizeof id, "seq%d", k);
            c.p[0] = (tparam){.key = "sequence_id",
                              .kind = kinds[k],
                              .i = 40 + k,
                              .u = (uint64_t)(40 + k),
                              .s = id};
            c.p[1] = PB("sequence_start", s == 0);
            c.p[2] = PB("sequence_end", s == STEPS - 1);
            c.n_p = 3;
            /* Each route steps a sequence of its own (v2's id is another), the same tensors. */
            outcome r;
            char msg[600];
            memset(&r, 0, sizeof r);
            size_t len, hlen, glen;
            char hl[32], *base;
            tcase v = c;
            char vid[24];
            snprintf(vid, sizeof vid, "v2seq%d", k);
            v.p[0] = (tparam){.key = "sequence_id",
                              .kind = kinds[k],
                              .i = 140 + k,
                              .u = (uint64_t)(140 + k),
                              .s = vid};
            char *body = v2_body(&v, &len, &hlen);
            snprintf(hl, sizeof hl, "%zu", hlen);
            run_route(false, false, body, len, hl, &v, &r.v2);
            free(body);
            const char *m = grpc_message(&c, 0, &glen, &base);
            run_route(true, false, m, glen, NULL, &c, &r.grpc);
            eng_buf_free(base);
            size_t jl =
                r.v2.inference_header_len > 0 ? (size_t)r.v2.inference_header_len : r.v2.body_len;
            r.v2_json = json_loadb(r.v2.body, jl, 0, NULL);
            if (s < STEPS) {
                CHECKF(r.grpc.status == 200 && r.v2.status == 200, "kind %c step %d: %d %d: %s",
                       kinds[k], s, r.grpc.status, r.v2.status, grpc_error(&r, msg, sizeof msg));
                r.resp = inference__model_infer_response__unpack(NULL, r.grpc.body_len,
                                                                 (const uint8_t *)r.grpc.body);
                check_same_outputs(&r, r.resp, "sequence step");
                CHECK(r.grpc.session[0] != '\0');
            } else {
                /* After the end: the sequence needs a new start, on both. */
                CHECK_EQ_INT(r.grpc.status, 400);
                CHECK_EQ_INT(r.v2.status, 400);
                CHECKF(strstr(grpc_error(&r, msg, sizeof msg), "must specify the START flag"), "%s",
                       msg);
            }
            outcome_free(&r);
        }
    }
    for (int s = 0; s < STEPS; s++)
        qkv_free(&p[s]);
}

int main(void)
{
    eng_error err;
    char msg[256];
    api_sessions_config cfg = {.capacity_bytes = (size_t)16 << 20, .block_tokens = 16, .ttl_s = 60};
    pool = eng_pool_new(2, &err);
    budget = api_budget_new((size_t)1 << 30);
    models = api_models_new();
    sessions = api_sessions_new(&cfg, msg, sizeof msg);
    if (!pool || !budget || !models || !sessions) {
        fprintf(stderr, "set-up failed\n");
        return 1;
    }
    RUN(test_raw_round_trip);
    RUN(test_raw_moved_onto_alignment);
    RUN(test_typed_contents);
    RUN(test_parameters);
    RUN(test_bad_requests_as_over_http);
    RUN(test_contents_refusals);
    RUN(test_stream);
    RUN(test_sequences);
    api_sessions_free(sessions);
    api_models_free(models);
    api_budget_free(budget);
    eng_pool_free(pool);
    return check_report();
}
