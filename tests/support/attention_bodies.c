/*
 * attention_bodies.c - one attention problem as a native base64 body, a KServe v2 binary one and
 * a gRPC ModelInfer message, and its output read back from each reply (attention_bodies.h).
 */
#include "tests/support/attention_bodies.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/wire/base64.h"
#include "grpc_service.pb-c.h"
#include "tests/support/daemon.h"
#include "tests/support/grpc.h"

static const char *const names[3] = {"query", "key", "value"};

size_t attn_problem_count(const attn_problem *p)
{
    return (size_t)(p->shape[0] * p->shape[1] * p->shape[2] * p->shape[3]);
}

/* A body being built: its bytes so far and its room. */
typedef struct {
    char *data;
    size_t len, cap;
    bool failed;
} body_buf;

static void put(body_buf *b, const void *p, size_t n)
{
    if (b->failed)
        return;
    if (b->cap - b->len < n + 1) {
        size_t cap = (b->len + n + 1) * 2;
        char *grown = realloc(b->data, cap);
        if (!grown) {
            b->failed = true;
            return;
        }
        b->data = grown;
        b->cap = cap;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
}

static void put_str(body_buf *b, const char *s)
{
    put(b, s, strlen(s));
}

/* The body, or NULL (and nothing to free) when memory ran out on the way. */
static char *finish(body_buf *b, size_t *len)
{
    if (b->failed) {
        free(b->data);
        return NULL;
    }
    *len = b->len;
    return b->data;
}

char *attn_body_native(const attn_problem *p, size_t *len)
{
    body_buf b = {0};
    const float *data[3] = {p->q, p->k, p->v};
    put_str(&b, "{\"output_encoding\":\"base64\"");
    if (p->causal)
        put_str(&b, ",\"causal\":true");
    for (int t = 0; t < 3; t++) {
        char *tensor = json_tensor_b64(data[t], p->shape, 4);
        b.failed = b.failed || !tensor;
        put_str(&b, ",\"");
        put_str(&b, names[t]);
        put_str(&b, "\":");
        put_str(&b, tensor ? tensor : "");
        free(tensor);
    }
    put_str(&b, "}");
    return finish(&b, len);
}

char *attn_body_v2(const attn_problem *p, size_t *len, size_t *header_len)
{
    body_buf b = {0};
    char tmp[256];
    size_t bytes = attn_problem_count(p) * sizeof(float);
    const float *data[3] = {p->q, p->k, p->v};
    put_str(&b, "{\"parameters\":{\"binary_data_output\":true");
    put_str(&b, p->causal ? ",\"causal\":true}" : "}");
    put_str(&b, ",\"inputs\":[");
    for (int t = 0; t < 3; t++) {
        snprintf(tmp, sizeof tmp,
                 "%s{\"name\":\"%s\",\"datatype\":\"FP32\",\"shape\":[%lld,%lld,%lld,%lld],"
                 "\"parameters\":{\"binary_data_size\":%zu}}",
                 t ? "," : "", names[t], (long long)p->shape[0], (long long)p->shape[1],
                 (long long)p->shape[2], (long long)p->shape[3], bytes);
        put_str(&b, tmp);
    }
    /* The output alone, as the native route returns it (without "outputs" lse comes too). */
    put_str(&b, "],\"outputs\":[{\"name\":\"output\"}]}");
    *header_len = b.len;
    for (int t = 0; t < 3; t++)
        put(&b, data[t], bytes);
    return finish(&b, len);
}

bool attn_reply_output(const attn_reply *r, const float *want, size_t count)
{
    size_t n = count * sizeof(float);
    if (r->v2)
        return r->len == r->header_len + n && memcmp(r->body + r->header_len, want, n) == 0;
    const char *p = r->body ? strstr(r->body, "\"output\"") : NULL;
    p = p ? strstr(p, "\"base64\":\"") : NULL;
    if (!p)
        return false;
    p += strlen("\"base64\":\"");
    const char *end = memchr(p, '"', r->len - (size_t)(p - r->body));
    if (!end)
        return false;
    float *got = malloc(n + 4);
    size_t got_len = 0, bad;
    bool same = got &&
                api__base64_decode(p, (size_t)(end - p), got, &got_len, &bad) == API_B64_OK &&
                got_len == n && memcmp(got, want, n) == 0;
    free(got);
    return same;
}

char *attn_body_grpc(const attn_problem *p, const char *model, size_t *len)
{
    Inference__ModelInferRequest req = INFERENCE__MODEL_INFER_REQUEST__INIT;
    Inference__ModelInferRequest__InferInputTensor t[3], *tp[3];
    ProtobufCBinaryData raw[3];
    Inference__ModelInferRequest__ParametersEntry
        causal = INFERENCE__MODEL_INFER_REQUEST__PARAMETERS_ENTRY__INIT,
        *causalp = &causal;
    Inference__InferParameter yes = INFERENCE__INFER_PARAMETER__INIT;
    Inference__ModelInferRequest__InferRequestedOutputTensor
        out = INFERENCE__MODEL_INFER_REQUEST__INFER_REQUESTED_OUTPUT_TENSOR__INIT,
        *outp = &out;
    const float *data[3] = {p->q, p->k, p->v};
    for (int i = 0; i < 3; i++) {
        inference__model_infer_request__infer_input_tensor__init(&t[i]);
        t[i].name = (char *)names[i];
        t[i].datatype = (char *)"FP32";
        t[i].n_shape = 4;
        t[i].shape = (int64_t *)p->shape;
        tp[i] = &t[i];
        raw[i].data = (uint8_t *)data[i];
        raw[i].len = attn_problem_count(p) * sizeof(float);
    }
    req.model_name = (char *)model;
    req.n_inputs = req.n_raw_input_contents = 3;
    req.inputs = tp;
    req.raw_input_contents = raw;
    out.name = (char *)"output";
    req.n_outputs = 1;
    req.outputs = &outp;
    if (p->causal) {
        causal.key = (char *)"causal";
        yes.parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM;
        yes.bool_param = 1;
        causal.value = &yes;
        req.n_parameters = 1;
        req.parameters = &causalp;
    }
    size_t n = inference__model_infer_request__get_packed_size(&req);
    uint8_t *msg = malloc(n);
    if (!msg)
        return NULL;
    inference__model_infer_request__pack(&req, msg);
    char *framed = grpc_frame(msg, n, len);
    free(msg);
    return framed;
}

bool attn_grpc_output(const char *msg, size_t len, const float *want, size_t count)
{
    Inference__ModelInferResponse *r =
        msg ? inference__model_infer_response__unpack(NULL, len, (const uint8_t *)msg) : NULL;
    bool ok = r && r->n_raw_output_contents == 1;
    if (ok && want)
        ok = r->raw_output_contents[0].len == count * sizeof(float) &&
             memcmp(r->raw_output_contents[0].data, want, count * sizeof(float)) == 0;
    if (r)
        inference__model_infer_response__free_unpacked(r, NULL);
    return ok;
}
