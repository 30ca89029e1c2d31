/*
 * test_grpc.c - attnd's --grpc-port spoken to by an nghttp2 client: the v2 methods and their
 * statuses, inference against the HTTP route's answer (every layer of a checkpoint served whole,
 * and a sequence stepped through its layers, too), the edge's guarantees (message size,
 * memory reserved only as bytes arrive, queue, deadlines, cancellation, tokens, drain,
 * metrics, log lines) and hostile peers (SETTINGS and PING floods, an HPACK bomb, a stalled
 * stream, a peer that never reads): none takes the port or the daemon down.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nghttp2/nghttp2.h>

#include "grpc_service.pb-c.h"
#include "tests/support/check.h"
#include "tests/support/daemon.h"
#include "tests/support/grpc.h"
#include "tests/support/rng.h"

#define SVC "/inference.GRPCInferenceService/"

typedef struct {
    daemon_proc d;
    int port; /* --grpc-port */
} grpc_daemon;

/* A daemon with --grpc-port 0 and `extra` flags. */
static int start(grpc_daemon *g, const char *const *extra)
{
    return daemon_start_grpc(&g->d, extra, &g->port);
}

/* start() and a client connected to it; false, a failed check, when either is not there. */
static bool start_with_client(grpc_daemon *g, grpc_client *c, const char *const *extra)
{
    bool ok = start(g, extra) == 0 && grpc_client_open(c, g->port) == 0;
    CHECKF(ok, "the daemon with --grpc-port did not start, or a client could not connect");
    return ok;
}

/* ---- Messages ------------------------------------------------------------------------------- */

typedef struct {
    const char *name;
    int64_t shape[4];
    size_t rank;
    const float *data; /* FP32, raw */
} tensor;

/* A request parameter: an int64 or a bool. */
typedef struct {
    const char *key;
    bool is_bool;
    int64_t value;
} param;

enum { MAX_PARAMS = 4 };

/* A packed ModelInferRequest for `model` with raw FP32 inputs and the parameters
 * params[0..n_params); malloc'd. */
static uint8_t *infer_request(const char *model, const tensor *t, size_t n, const param *params,
                              size_t n_params, size_t *len)
{
    Inference__ModelInferRequest req = INFERENCE__MODEL_INFER_REQUEST__INIT;
    Inference__ModelInferRequest__InferInputTensor in[4], *inp[4];
    ProtobufCBinaryData raw[4];
    Inference__ModelInferRequest__ParametersEntry e[MAX_PARAMS], *ep[MAX_PARAMS];
    Inference__InferParameter p[MAX_PARAMS];
    uint8_t *buf;
    req.model_name = (char *)model;
    for (size_t i = 0; i < n; i++) {
        inference__model_infer_request__infer_input_tensor__init(&in[i]);
        in[i].name = (char *)t[i].name;
        in[i].datatype = (char *)"FP32";
        in[i].n_shape = t[i].rank;
        in[i].shape = (int64_t *)t[i].shape;
        inp[i] = &in[i];
        size_t count = 1;
        for (size_t d = 0; d < t[i].rank; d++)
            count *= (size_t)t[i].shape[d];
        raw[i].data = (uint8_t *)t[i].data;
        raw[i].len = count * sizeof(float);
    }
    req.n_inputs = req.n_raw_input_contents = n;
    req.inputs = inp;
    req.raw_input_contents = raw;
    for (size_t i = 0; i < n_params && i < MAX_PARAMS; i++) {
        inference__model_infer_request__parameters_entry__init(&e[i]);
        inference__infer_parameter__init(&p[i]);
        e[i].key = (char *)params[i].key;
        if (params[i].is_bool) {
            p[i].parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM;
            p[i].bool_param = params[i].value != 0;
        } else {
            p[i].parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM;
            p[i].int64_param = params[i].value;
        }
        e[i].value = &p[i];
        ep[i] = &e[i];
    }
    req.n_parameters = n_params < MAX_PARAMS ? n_params : MAX_PARAMS;
    req.parameters = ep;
    *len = inference__model_infer_request__get_packed_size(&req);
    buf = malloc(*len);
    inference__model_infer_request__pack(&req, buf);
    return buf;
}

/* q, k, v of [1, heads, len, 8] with random values (malloc'd, one block). */
static float *qkv(uint64_t *r, int64_t heads, int64_t len, tensor t[3])
{
    size_t count = (size_t)(heads * len * 8);
    float *data = malloc(3 * count * sizeof(float));
    static const char *const names[] = {"query", "key", "value"};
    for (size_t i = 0; i < 3 * count; i++)
        data[i] = rng_sym(r, 1.0);
    for (int i = 0; i < 3; i++)
        t[i] = (tensor){names[i], {1, heads, len, 8}, 4, data + (size_t)i * count};
    return data;
}

static bool live(int port)
{
    grpc_client c;
    grpc_stream st;
    bool ok;
    if (grpc_client_open(&c, port) != 0)
        return false;
    ok = grpc_call(&c, SVC "ServerLive", NULL, "", 0, 5000, &st) && st.grpc_status == 0;
    grpc_stream_free(&st);
    grpc_client_close(&c);
    return ok;
}

/* ---- Methods and statuses ---------------------------------------------------------------------
 */

static void test_methods_and_statuses(void)
{
    grpc_daemon g;
    grpc_client c;
    grpc_stream st;
    size_t len;
    const char *msg;
    if (!start_with_client(&g, &c, NULL))
        return;
    CHECK(grpc_call(&c, SVC "ServerLive", NULL, "", 0, 5000, &st));
    CHECK_EQ_INT(st.grpc_status, 0);
    msg = grpc_message_at(&st, 0, &len);
    CHECK(msg && len == 2 && msg[0] == 0x08 && msg[1] == 1); /* live: true */
    grpc_stream_free(&st);

    /* grpc.health.v1: SERVING. */
    CHECK(grpc_call(&c, "/grpc.health.v1.Health/Check", NULL, "", 0, 5000, &st));
    CHECK_EQ_INT(st.grpc_status, 0);
    msg = grpc_message_at(&st, 0, &len);
    CHECK(msg && len == 2 && msg[0] == 0x08 && msg[1] == 1);
    grpc_stream_free(&st);

    /* ModelReady {name: "nosuch"}: NOT_FOUND naming it. */
    CHECK(grpc_call(&c, SVC "ModelReady", NULL, "\x0a\x06nosuch", 8, 5000, &st));
    CHECK_EQ_INT(st.grpc_status, 5);
    CHECK(strstr(st.message, "nosuch") != NULL);
    grpc_stream_free(&st);

    CHECK(grpc_call(&c, SVC "RepositoryModelLoad", NULL, "", 0, 5000, &st));
    CHECK_EQ_INT(st.grpc_status, 12);
    grpc_stream_free(&st);
    CHECK(grpc_call(&c, "/other.Service/Call", NULL, "", 0, 5000, &st));
    CHECK_EQ_INT(st.grpc_status, 12);
    grpc_stream_free(&st);

    const char *json_ct[] = {"content-type", "application/json", NULL};
    CHECK(grpc_call(&c, SVC "ServerLive", json_ct, "", 0, 5000, &st));
    CHECK_EQ_INT(st.grpc_status, 3);
    grpc_stream_free(&st);

    const char *bad_timeout[] = {"grpc-timeout", "12x", NULL};
    CHECK(grpc_call(&c, SVC "ServerLive", bad_timeout, "", 0, 5000, &st));
    CHECK_EQ_INT(st.grpc_status, 3);
    grpc_stream_free(&st);

    /* Not protobuf: a field of wire type 7. */
    CHECK(grpc_call(&c, SVC "ModelInfer", NULL, "\x0f\x01", 2, 5000, &st));
    CHECK_EQ_INT(st.grpc_status, 3);
    CHECK(strstr(st.message, "malformed") != NULL);
    grpc_stream_free(&st);

    /* A compressed message: attnd offers no grpc-encoding. */
    static const char compressed[] = {1, 0, 0, 0, 0};
    st.body = compressed;
    st.body_len = 5;
    st.keep_open = false;
    CHECK(grpc_start(&c, SVC "ServerLive", NULL, &st) == 0 && grpc_wait(&c, &st, 5000));
    CHECK_EQ_INT(st.grpc_status, 12);
    grpc_stream_free(&st);

    /* Two messages on a unary method. */
    static const char two[] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    st.body = two;
    st.body_len = sizeof two;
    CHECK(grpc_start(&c, SVC "ServerLive", NULL, &st) == 0 && grpc_wait(&c, &st, 5000));
    CHECK_EQ_INT(st.grpc_status, 3);
    grpc_stream_free(&st);
    grpc_client_close(&c);
    CHECK_EQ_INT(daemon_stop(&g.d), 0);
}

/* ModelInfer's outputs equal the HTTP route's for the same tensors, bit for bit: without
 * outputs named, both return every output the model lists (output, then lse). Invalid requests
 * carry the route's message. */
static void test_infer_matches_http(void)
{
    grpc_daemon g;
    grpc_client c;
    grpc_stream st;
    tensor t[3];
    uint64_t r;
    size_t len, out_len;
    r = 11;
    float *data = qkv(&r, 2, 5, t);
    if (!start_with_client(&g, &c, NULL)) {
        free(data);
        return;
    }
    uint8_t *req = infer_request("sdpa", t, 3, NULL, 0, &len);
    CHECK(grpc_call(&c, SVC "ModelInfer", NULL, req, len, 10000, &st));
    CHECK_EQ_INT(st.grpc_status, 0);
    const char *msg = grpc_message_at(&st, 0, &out_len);
    Inference__ModelInferResponse *resp =
        msg ? inference__model_infer_response__unpack(NULL, out_len, (const uint8_t *)msg) : NULL;
    CHECK(resp && resp->n_outputs == 2 && resp->n_raw_output_contents == 2);

    /* The same request over HTTP, JSON in and out. */
    char *body = NULL;
    size_t blen = 0;
    FILE *f = open_memstream(&body, &blen);
    fprintf(f, "{\"inputs\":[");
    for (int i = 0; i < 3; i++) {
        fprintf(f, "%s{\"name\":\"%s\",\"datatype\":\"FP32\",\"shape\":[1,2,5,8],\"data\":[",
                i ? "," : "", t[i].name);
        for (int k = 0; k < 80; k++)
            fprintf(f, "%s%.9g", k ? "," : "", (double)t[i].data[k]);
        fprintf(f, "]}");
    }
    fprintf(f, "]}");
    fclose(f);
    http_resp h;
    double want[80], want_lse[10];
    const char *ct[] = {"Content-Type: application/json", NULL};
    CHECK_EQ_INT(http_do(NULL, g.d.port, "POST", "/v2/models/sdpa/infer", ct, body, blen, &h), 200);
    CHECK_EQ_INT(json_numbers(h.body, "data", want, 80), 80);
    const char *lse_at = h.body ? strstr(h.body, "\"name\":\"lse\"") : NULL;
    CHECK_EQ_INT(json_numbers(lse_at, "data", want_lse, 10), 10);
    if (resp && resp->n_raw_output_contents == 2) {
        const char *names[2] = {"output", "lse"};
        const double *wants[2] = {want, want_lse};
        const size_t counts[2] = {80, 10}, ranks[2] = {4, 3};
        for (int o = 0; o < 2; o++) {
            CHECK(strcmp(resp->outputs[o]->name, names[o]) == 0);
            CHECK_EQ_INT((long)resp->raw_output_contents[o].len, (long)(counts[o] * 4));
            CHECK_EQ_INT((long)resp->outputs[o]->n_shape, (long)ranks[o]);
            CHECK(strcmp(resp->outputs[o]->datatype, "FP32") == 0);
            const float *got = (const float *)resp->raw_output_contents[o].data;
            for (size_t k = 0; k < counts[o] && resp->raw_output_contents[o].len == counts[o] * 4;
                 k++)
                CHECK_NEAR(got[k], wants[o][k], 1e-6);
        }
    }
    http_resp_free(&h);
    free(body);
    if (resp)
        inference__model_infer_response__free_unpacked(resp, NULL);
    grpc_stream_free(&st);
    free(req);

    /* A key of the wrong size: INVALID_ARGUMENT naming it. */
    t[1].shape[3] = 4;
    req = infer_request("sdpa", t, 3, NULL, 0, &len);
    CHECK(grpc_call(&c, SVC "ModelInfer", NULL, req, len, 10000, &st));
    CHECK_EQ_INT(st.grpc_status, 3);
    CHECKF(strstr(st.message, "key") != NULL, "message: %s", st.message);
    grpc_stream_free(&st);
    free(req);
    grpc_client_close(&c);
    free(data);
    CHECK_EQ_INT(daemon_stop(&g.d), 0);
}

/* ---- Every layer of a checkpoint ---------------------------------------------------------- */

#define CHECKPOINT_E 64 /* tests/api/hf/cases/llama: two layers */

/* ModelInfer of `model` on x [1, n, 64] with `params`: its output's raw floats into out[n * 64]
 * (grpc-status 0), or the status and message. */
static int grpc_layer(grpc_client *c, const float *x, int64_t n, const param *params,
                      size_t n_params, float *out, char *message, size_t message_len)
{
    tensor t = {"input", {1, n, CHECKPOINT_E}, 3, x};
    size_t len, out_len;
    grpc_stream st;
    uint8_t *req = infer_request("llama", &t, 1, params, n_params, &len);
    int status = -1;
    if (grpc_call(c, SVC "ModelInfer", NULL, req, len, 10000, &st)) {
        status = st.grpc_status;
        snprintf(message, message_len, "%s", st.message);
        const char *msg = grpc_message_at(&st, 0, &out_len);
        Inference__ModelInferResponse *resp =
            status == 0 && msg
                ? inference__model_infer_response__unpack(NULL, out_len, (const uint8_t *)msg)
                : NULL;
        bool whole = resp && resp->n_raw_output_contents == 1 &&
                     resp->raw_output_contents[0].len == (size_t)(n * CHECKPOINT_E) * sizeof(float);
        if (whole)
            memcpy(out, resp->raw_output_contents[0].data, resp->raw_output_contents[0].len);
        else if (status == 0)
            status = -2;
        if (resp)
            inference__model_infer_response__free_unpacked(resp, NULL);
        grpc_stream_free(&st);
    }
    free(req);
    return status;
}

/* POST `path` with a body holding x [1, n, 64] as JSON numbers: v2's inputs with `params`
 * (JSON members of "parameters"), or /v1/mha's input with `params` as fields. The output's
 * numbers into out[n * 64]; the HTTP status. */
static long http_layer(int port, const char *path, const float *x, int64_t n, const char *params,
                       double *out, http_resp *h)
{
    bool v2 = strncmp(path, "/v2/", 4) == 0;
    char *body = NULL;
    size_t blen = 0;
    FILE *f = open_memstream(&body, &blen);
    if (v2)
        fprintf(f,
                "{\"parameters\":{%s},\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\","
                "\"shape\":[1,%lld,%d],\"data\":[",
                params, (long long)n, CHECKPOINT_E);
    else
        fprintf(f, "{%s,\"output_encoding\":\"flat\",\"input\":{\"shape\":[1,%lld,%d],\"data\":[",
                params, (long long)n, CHECKPOINT_E);
    for (int64_t i = 0; i < n * CHECKPOINT_E; i++)
        fprintf(f, "%s%.9g", i ? "," : "", (double)x[i]);
    fprintf(f, v2 ? "]}]}" : "]}}");
    fclose(f);
    const char *ct[] = {"Content-Type: application/json", NULL};
    long status = http_do(NULL, port, "POST", path, ct, body, blen, h);
    if (status == 200)
        CHECK_EQ_INT(json_numbers(h->body, v2 ? "data" : "output", out, (size_t)(n * CHECKPOINT_E)),
                     n * CHECKPOINT_E);
    free(body);
    return status;
}

/* Whether the raw floats a[] are the JSON numbers b[] (written as the shortest text that reads
 * back as the same float). */
static bool same_numbers(const float *a, const double *b, int64_t count)
{
    for (int64_t i = 0; i < count; i++)
        if (a[i] != (float)b[i])
            return false;
    return true;
}

/* A checkpoint served whole (--model llama=DIR): ModelInfer with parameters["layer"] = l is
 * the HTTP v2 route's answer with parameters.layer l and /v1/mha's with "layer": l, bit for
 * bit, and layer 1's differs from layer 0's; without a layer all three refuse naming it. */
static void test_layers_match_http(void)
{
    enum { N = 5 };
    const char *const extra[] = {"--model", "llama=tests/api/hf/cases/llama", NULL};
    grpc_daemon g;
    grpc_client c;
    float x[N * CHECKPOINT_E], got[2][N * CHECKPOINT_E];
    double want[N * CHECKPOINT_E];
    char message[512], params[64];
    uint64_t r = 21;
    http_resp h;
    rng_fill(&r, x, sizeof x / sizeof x[0], 1.0);
    if (!start_with_client(&g, &c, extra))
        return;
    for (int64_t l = 0; l < 2; l++) {
        param p = {"layer", false, l};
        CHECKF(grpc_layer(&c, x, N, &p, 1, got[l], message, sizeof message) == 0,
               "ModelInfer layer %lld: %s", (long long)l, message);
        snprintf(params, sizeof params, "\"layer\":%lld", (long long)l);
        CHECK_EQ_INT(http_layer(g.d.port, "/v2/models/llama/infer", x, N, params, want, &h), 200);
        CHECKF(same_numbers(got[l], want, N * CHECKPOINT_E), "layer %lld: gRPC is not v2 HTTP",
               (long long)l);
        http_resp_free(&h);
        snprintf(params, sizeof params, "\"model\":\"llama\",\"layer\":%lld", (long long)l);
        CHECK_EQ_INT(http_layer(g.d.port, "/v1/mha", x, N, params, want, &h), 200);
        CHECKF(same_numbers(got[l], want, N * CHECKPOINT_E), "layer %lld: gRPC is not /v1/mha",
               (long long)l);
        http_resp_free(&h);
    }
    CHECK(memcmp(got[0], got[1], sizeof got[0]) != 0);
    /* No layer named. */
    CHECK_EQ_INT(grpc_layer(&c, x, N, NULL, 0, got[0], message, sizeof message), 3);
    CHECKF(strstr(message, "layer (0 to 1)") != NULL, "message: %s", message);
    CHECK_EQ_INT(http_layer(g.d.port, "/v2/models/llama/infer", x, N, "", want, &h), 400);
    CHECK(h.body && strstr(h.body, "layer (0 to 1)") != NULL);
    http_resp_free(&h);
    CHECK_EQ_INT(http_layer(g.d.port, "/v1/mha", x, N, "\"model\":\"llama\"", want, &h), 422);
    CHECK(h.body && strstr(h.body, "\"field\":\"layer\"") != NULL);
    http_resp_free(&h);
    grpc_client_close(&c);
    CHECK_EQ_INT(daemon_stop(&g.d), 0);
}

/* A v2 sequence of the whole checkpoint stepped through its layers over gRPC (sequence 5) gives
 * what the same sequence gives over HTTP (sequence 6) at every step: a prompt, then tokens, each
 * through layer 0 then 1, START on the first request and END on the last. */
static void test_a_sequence_over_layers_matches_http(void)
{
    enum { PROMPT = 4, TOKENS = 3, ALL = PROMPT + TOKENS };
    const char *const extra[] = {"--model", "llama=tests/api/hf/cases/llama", "--kv-cache-bytes",
                                 "16MiB", NULL};
    grpc_daemon g;
    grpc_client c;
    float x[ALL * CHECKPOINT_E], got[ALL * CHECKPOINT_E];
    double want[ALL * CHECKPOINT_E];
    char message[512], params[160];
    uint64_t r = 22;
    http_resp h;
    rng_fill(&r, x, sizeof x / sizeof x[0], 1.0);
    if (!start_with_client(&g, &c, extra))
        return;
    for (int64_t t0 = 0; t0 < ALL; t0 += t0 == 0 ? PROMPT : 1) {
        int64_t n = t0 == 0 ? PROMPT : 1;
        for (int64_t l = 0; l < 2; l++) {
            bool first = t0 == 0 && l == 0, last = t0 + n == ALL && l == 1;
            param p[4] = {{"sequence_id", false, 5}, {"layer", false, l}};
            size_t np = 2;
            if (first)
                p[np++] = (param){"sequence_start", true, 1};
            if (last)
                p[np++] = (param){"sequence_end", true, 1};
            int st = grpc_layer(&c, x + t0 * CHECKPOINT_E, n, p, np, got, message, sizeof message);
            CHECKF(st == 0, "gRPC step at %lld, layer %lld: %d %s", (long long)t0, (long long)l, st,
                   message);
            snprintf(params, sizeof params, "\"sequence_id\":6,\"layer\":%lld%s%s", (long long)l,
                     first ? ",\"sequence_start\":true" : "", last ? ",\"sequence_end\":true" : "");
            long hs = http_layer(g.d.port, "/v2/models/llama/infer", x + t0 * CHECKPOINT_E, n,
                                 params, want, &h);
            CHECKF(hs == 200 && st == 0 && same_numbers(got, want, n * CHECKPOINT_E),
                   "step at %lld, layer %lld: HTTP %ld, not gRPC's numbers", (long long)t0,
                   (long long)l, hs);
            http_resp_free(&h);
        }
    }
    /* Both sequences ended with their last request. */
    param p[2] = {{"sequence_id", false, 5}, {"layer", false, 0}};
    CHECK_EQ_INT(grpc_layer(&c, x, 1, p, 2, got, message, sizeof message), 3);
    CHECK(strstr(message, "START") != NULL);
    CHECK_EQ_INT(http_layer(g.d.port, "/v2/models/llama/infer", x, 1,
                            "\"sequence_id\":6,\"layer\":0", want, &h),
                 400);
    http_resp_free(&h);
    grpc_client_close(&c);
    CHECK_EQ_INT(daemon_stop(&g.d), 0);
}

/* ---- The edge's guarantees --------------------------------------------------------------------
 */

/* A message above --max-body-bytes is refused from its prefix alone; a declared length
 * reserves nothing until its bytes arrive; a stalled message ends at --receive-timeout-s. */
static void test_sizes_memory_and_stalls(void)
{
    grpc_daemon g;
    grpc_client c;
    grpc_stream big, stall;
    const char *args[] = {"--max-body-bytes", "1M", "--receive-timeout-s", "1", NULL};
    static const char too_big[] = {0, 0, 0x20, 0, 0};     /* 2 MiB */
    static const char declared[] = {0, 0, 0x0f, 0, 0, 1}; /* 960 KiB, one byte sent */
    if (!start_with_client(&g, &c, args))
        return;
    big.body = too_big;
    big.body_len = sizeof too_big;
    big.keep_open = true;
    CHECK(grpc_start(&c, SVC "ModelInfer", NULL, &big) == 0 && grpc_wait(&c, &big, 5000));
    CHECK_EQ_INT(big.grpc_status, 8);
    CHECK(strstr(big.message, "--max-body-bytes") != NULL);
    grpc_stream_free(&big);

    stall.body = declared;
    stall.body_len = sizeof declared;
    stall.keep_open = true;
    double t0 = now_s();
    CHECK(grpc_start(&c, SVC "ModelInfer", NULL, &stall) == 0);
    grpc_pump(&c, 200);
    CHECK(metric_value(g.d.port, "attnd_memory_reserved_bytes") < 4096);
    CHECK(live(g.port)); /* the port serves others meanwhile */
    CHECK(grpc_wait(&c, &stall, 10000));
    CHECK_EQ_INT(stall.grpc_status, 4);
    CHECK(now_s() - t0 >= 0.9);
    grpc_stream_free(&stall);

    /* A ModelStreamInfer stream waiting between messages longer than --receive-timeout-s is
     * idle, not slow: its next message is answered. */
    grpc_stream s1;
    tensor t[3];
    uint64_t r = 21;
    size_t len, n;
    float *data = qkv(&r, 1, 3, t);
    uint8_t *req = infer_request("sdpa", t, 3, NULL, 0, &len);
    char *framed = grpc_frame(req, len, &n);
    s1.body = framed;
    s1.body_len = n;
    s1.keep_open = true;
    CHECK(grpc_start(&c, SVC "ModelStreamInfer", NULL, &s1) == 0);
    for (int i = 0; i < 100 && !grpc_message_at(&s1, 0, &len) && !c.dead; i++)
        grpc_pump(&c, 20);
    CHECK(grpc_message_at(&s1, 0, &len) != NULL);
    for (t0 = now_s(); now_s() - t0 < 1.6;)
        grpc_pump(&c, 50);
    CHECK(s1.grpc_status < 0 && !s1.closed);
    grpc_send_more(&c, &s1, framed, n, true);
    CHECK(grpc_wait(&c, &s1, 10000));
    CHECK_EQ_INT(s1.grpc_status, 0);
    CHECK(grpc_message_at(&s1, 1, &len) != NULL);
    grpc_stream_free(&s1);
    free(framed);
    free(req);
    free(data);
    grpc_client_close(&c);
    CHECK(metric_wait_le(g.d.port, "attnd_memory_reserved_bytes", 0, 5000));
    CHECK_EQ_INT(daemon_stop(&g.d), 0);
}

/* A slow inference: many rows over many keys on one worker. */
static uint8_t *slow_request(uint64_t *r, float **data, size_t *len)
{
    tensor t[3];
    const int64_t rows = 2048; /* its compute outlasts the upload of the next, even quick */
    *data = qkv(r, 8, rows, t);
    return infer_request("sdpa", t, 3, NULL, 0, len);
}

/* grpc-timeout bounds the call (DEADLINE_EXCEEDED); a full queue, or one whose work would end
 * past the call's deadline (judged from its message's prefix), is RESOURCE_EXHAUSTED; a reset
 * stream cancels its inference (logged as CANCELLED); metrics and log lines count them. */
static void test_deadline_queue_cancel_metrics(void)
{
    grpc_daemon g;
    grpc_client c;
    grpc_stream a, b, d;
    uint64_t r;
    float *data;
    size_t len, n_whole = 0;
    const char *args[] = {"--threads", "1", "--max-queue", "1", NULL};
    r = 5;
    uint8_t *req = slow_request(&r, &data, &len);
    if (!start_with_client(&g, &c, args)) {
        free(req);
        free(data);
        return;
    }
    /* Measure one: the later bounds derive from it. */
    double t0 = now_s();
    CHECK(grpc_call(&c, SVC "ModelInfer", NULL, req, len, 60000, &a));
    double one = now_s() - t0;
    CHECKF(a.grpc_status == 0, "status %d: %s", a.grpc_status, a.message);
    grpc_stream_free(&a);

    /* A deadline that passes while the message arrives: its prefix is judged in time (the
     * deadline is four times the call above), half of it is sent, and the rest after the
     * deadline. The status may come before the last bytes are sent: the stream (whose state the
     * client keeps in `late`) ends once they are. */
    char *whole = grpc_frame(req, len, &n_whole);
    int late_ms = (int)(one * 4000) + 100;
    char late_timeout[32];
    snprintf(late_timeout, sizeof late_timeout, "%dm", late_ms);
    const char *late_deadline[] = {"grpc-timeout", late_timeout, NULL};
    grpc_stream late = {.body = whole, .body_len = 5 + len / 2, .keep_open = true};
    CHECK(whole && grpc_start(&c, SVC "ModelInfer", late_deadline, &late) == 0);
    for (int i = 0; i < 500 && late.body_off < late.body_len && !c.dead; i++)
        grpc_pump(&c, 10);
    sleep_ms(late_ms + 100);
    grpc_send_more(&c, &late, whole + late.body_len, n_whole - late.body_len, true);
    CHECK(grpc_wait(&c, &late, 60000));
    CHECKF(late.grpc_status == 4, "grpc-timeout %s: status %d: %s", late_timeout, late.grpc_status,
           late.message);
    for (int i = 0; i < 500 && !late.closed && !c.dead; i++)
        grpc_pump(&c, 10);
    grpc_stream_free(&late);
    free(whole);

    /* The goodput scheduler (admission.h) learned its cost from the first: a call whose
     * deadline is half of that is refused at admission, never started; the worker time of the
     * one that ran is counted, none of it wasted. */
    char half[32];
    snprintf(half, sizeof half, "%lldm", (long long)(one * 500));
    const char *half_deadline[] = {"grpc-timeout", half, NULL};
    grpc_stream o;
    CHECK(grpc_call(&c, SVC "ModelInfer", half_deadline, req, len, 60000, &o));
    CHECKF(o.grpc_status == 8 && strstr(o.message, "overloaded") != NULL,
           "grpc-timeout %s after %.0f ms alone: status %d: %s", half, one * 1e3, o.grpc_status,
           o.message);
    grpc_stream_free(&o);
    CHECK(metric_value(g.d.port, "attnd_worker_seconds_total") > 0);
    CHECK(metric_value(g.d.port, "attnd_wasted_compute_seconds_total") == 0);

    /* Two at once with --max-queue 1: the second is refused. */
    size_t n;
    char *framed = grpc_frame(req, len, &n);
    a.body = b.body = framed;
    a.body_len = b.body_len = n;
    a.keep_open = b.keep_open = false;
    grpc_start(&c, SVC "ModelInfer", NULL, &a);
    while (a.body_off < a.body_len && !c.dead)
        grpc_pump(&c, 10);
    grpc_pump(&c, 50);
    grpc_start(&c, SVC "ModelInfer", NULL, &b);
    CHECK(grpc_wait(&c, &b, 60000));
    CHECK_EQ_INT(b.grpc_status, 8);
    CHECK(strstr(b.message, "--max-queue") != NULL);
    CHECK(grpc_wait(&c, &a, 60000));
    CHECKF(a.grpc_status == 0, "status %d: %s", a.grpc_status, a.message);
    grpc_stream_free(&a);
    grpc_stream_free(&b);

    /* Cancel one mid-compute: the worker stops early and the call is logged as cancelled. */
    d.body = framed;
    d.body_len = n;
    d.keep_open = false;
    grpc_start(&c, SVC "ModelInfer", NULL, &d);
    while (d.body_off < d.body_len && !c.dead)
        grpc_pump(&c, 10);
    sleep_ms((int)(one * 200));
    grpc_cancel(&c, &d);
    CHECK(daemon_log_lines(&g.d, "\"grpc ModelInfer\"", "\"grpc_status\":1", 1, 10000) == 1);
    CHECK(live(g.port));
    free(framed);
    grpc_stream_free(&d);

    CHECK(metric_wait(g.d.port,
                      "attnd_requests_total{protocol=\"grpc\",route=\"ModelInfer\",code=\"0\"}", 2,
                      5000));
    CHECK(metric_wait(g.d.port,
                      "attnd_requests_total{protocol=\"grpc\",route=\"ModelInfer\",code=\"8\"}", 1,
                      5000));
    CHECK(metric_value(g.d.port, "nv_inference_request_success{model=\"sdpa\",version=\"1\"}") >=
          2);
    CHECK(daemon_log_lines(&g.d, "\"protocol\":\"grpc\"", "\"grpc_status\":0", 3, 5000) >= 3);
    grpc_client_close(&c);
    free(req);
    free(data);
    CHECK_EQ_INT(daemon_stop(&g.d), 0);
}

/* Both edges hand their inferences to one job (server/job.h): while a gRPC inference holds the
 * only place of --max-queue, an HTTP inference and a second gRPC one are refused with the same
 * outcome (429 and RESOURCE_EXHAUSTED, the same message), and both refusals are counted in the
 * same series. */
static void test_same_outcomes_as_http(void)
{
    grpc_daemon g;
    grpc_client c;
    grpc_stream a, b;
    uint64_t r = 7;
    float *data;
    size_t len, n;
    const char *args[] = {"--threads", "1", "--max-queue", "1", NULL};
    uint8_t *req = slow_request(&r, &data, &len);
    if (!start_with_client(&g, &c, args)) {
        free(req);
        free(data);
        return;
    }
    char *framed = grpc_frame(req, len, &n);
    a.body = framed;
    a.body_len = n;
    a.keep_open = false;
    grpc_start(&c, SVC "ModelInfer", NULL, &a);
    while (a.body_off < a.body_len && !c.dead)
        grpc_pump(&c, 10);
    CHECK(metric_wait(g.d.port, "attnd_running_requests", 1, 10000));

    CHECK(grpc_call(&c, SVC "ModelInfer", NULL, req, len, 60000, &b));
    CHECK_EQ_INT(b.grpc_status, 8);
    http_resp h;
    const char *ct[] = {"Content-Type: application/json", NULL};
    static const char body[] = "{\"inputs\":[]}";
    CHECK_EQ_INT(
        http_do(NULL, g.d.port, "POST", "/v2/models/sdpa/infer", ct, body, strlen(body), &h), 429);
    CHECKF(strstr(b.message, "the queue is full (--max-queue 1)") != NULL, "gRPC: %s", b.message);
    CHECKF(h.body && strstr(h.body, b.message) != NULL, "HTTP: %s, gRPC: %s", h.body, b.message);
    http_resp_free(&h);
    grpc_stream_free(&b);
    CHECK(grpc_wait(&c, &a, 60000));
    CHECKF(a.grpc_status == 0, "status %d: %s", a.grpc_status, a.message);
    grpc_stream_free(&a);
    CHECK(metric_wait(g.d.port, "attnd_rejected_total{reason=\"queue_full\"}", 2, 5000));
    grpc_client_close(&c);
    free(framed);
    free(req);
    free(data);
    CHECK_EQ_INT(daemon_stop(&g.d), 0);
}

static void test_bearer_tokens(void)
{
    grpc_daemon g;
    grpc_client c;
    grpc_stream st;
    char dir[64] = "/tmp/attnd_grpc_tok_XXXXXX", path[128];
    if (!mkdtemp(dir)) {
        CHECK(false);
        return;
    }
    snprintf(path, sizeof path, "%s/tokens", dir);
    FILE *f = fopen(path, "w");
    fputs("s3cret-token-for-grpc\n", f);
    fclose(f);
    const char *args[] = {"--auth-token-file", path, NULL};
    if (!start_with_client(&g, &c, args))
        return;
    CHECK(grpc_call(&c, SVC "ServerReady", NULL, "", 0, 5000, &st));
    CHECK_EQ_INT(st.grpc_status, 16);
    grpc_stream_free(&st);
    const char *wrong[] = {"authorization", "Bearer nope", NULL};
    CHECK(grpc_call(&c, SVC "ServerReady", wrong, "", 0, 5000, &st));
    CHECK_EQ_INT(st.grpc_status, 16);
    CHECK(strstr(st.message, "s3cret") == NULL);
    grpc_stream_free(&st);
    const char *right[] = {"authorization", "Bearer s3cret-token-for-grpc", NULL};
    CHECK(grpc_call(&c, SVC "ServerReady", right, "", 0, 5000, &st));
    CHECK_EQ_INT(st.grpc_status, 0);
    grpc_stream_free(&st);
    grpc_client_close(&c);
    CHECK_EQ_INT(daemon_stop(&g.d), 0);
    unlink(path);
    rmdir(dir);
}

/* SIGTERM: GOAWAY, the call in flight finishes OK, a new stream is refused, exit 0. */
static void test_drain(void)
{
    grpc_daemon g;
    grpc_client c;
    grpc_stream a, b;
    uint64_t r;
    float *data;
    size_t len, n;
    const char *args[] = {"--threads", "1", NULL};
    r = 9;
    uint8_t *req = slow_request(&r, &data, &len);
    char *framed = grpc_frame(req, len, &n);
    if (!start_with_client(&g, &c, args))
        return;
    a.body = framed;
    a.body_len = n;
    a.keep_open = false;
    grpc_start(&c, SVC "ModelInfer", NULL, &a);
    while (a.body_off < a.body_len && !c.dead)
        grpc_pump(&c, 10);
    grpc_pump(&c, 20);
    daemon_signal(&g.d, SIGTERM);
    for (int i = 0; i < 200 && !c.goaway && !c.dead; i++)
        grpc_pump(&c, 20);
    CHECK(c.goaway);
    b.body = "\0\0\0\0\0";
    b.body_len = 5;
    b.keep_open = false;
    if (grpc_start(&c, SVC "ServerReady", NULL, &b) == 0 && grpc_wait(&c, &b, 5000))
        CHECK(b.grpc_status == 14 || b.rst_code == 7 /* REFUSED_STREAM */ || b.grpc_status < 0);
    CHECK(grpc_wait(&c, &a, 60000));
    CHECKF(a.grpc_status == 0, "status %d: %s", a.grpc_status, a.message);
    grpc_stream_free(&a);
    grpc_stream_free(&b);
    grpc_client_close(&c);
    CHECK_EQ_INT(daemon_wait(&g.d, 60000), 0);
    free(framed);
    free(req);
    free(data);
}

/* ---- Hostile peers ------------------------------------------------------------------------------
 */

static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/* An HTTP/2 frame header. */
static void frame_header(unsigned char *h, size_t len, int type, int flags, uint32_t stream)
{
    h[0] = (unsigned char)(len >> 16);
    h[1] = (unsigned char)(len >> 8);
    h[2] = (unsigned char)len;
    h[3] = (unsigned char)type;
    h[4] = (unsigned char)flags;
    h[5] = (unsigned char)(stream >> 24);
    h[6] = (unsigned char)(stream >> 16);
    h[7] = (unsigned char)(stream >> 8);
    h[8] = (unsigned char)stream;
}

/* `count` copies of one frame after the preface and an empty SETTINGS, sent without reading a
 * byte; true when the daemon closed the connection. */
static bool flood(int port, int type, size_t payload, int count)
{
    int fd = raw_connect(port);
    unsigned char f[9 + 8] = {0}, s[9];
    bool closed = false;
    if (fd < 0)
        return false;
    frame_header(s, 0, 4, 0, 0);
    raw_send(fd, preface, sizeof preface - 1);
    raw_send(fd, s, 9);
    frame_header(f, payload, type, 0, 0);
    for (int i = 0; i < count; i++)
        if (raw_send(fd, f, 9 + payload) != 0) {
            closed = true;
            break;
        }
    free(raw_read_all(fd, 5000, &closed));
    close(fd);
    return closed;
}

static void test_hostile_peers(void)
{
    grpc_daemon g;
    const char *args[] = {
        "--receive-timeout-s", "2", "--send-timeout-s", "1", "--idle-timeout-s", "2", NULL};
    if (start(&g, args) != 0) {
        CHECK(false);
        return;
    }
    /* PING and SETTINGS floods whose ACKs are never read: the connection is dropped. */
    CHECK(flood(g.port, 6, 8, 20000));
    CHECK(flood(g.port, 4, 0, 20000));
    CHECK(live(g.port));

    /* An HPACK bomb: one 4 KiB header in the dynamic table, then referenced 1000 times
     * (one byte each): the header block is refused, the stream reset, the daemon fine. */
    {
        int fd = raw_connect(g.port);
        unsigned char s[9], hdr[9];
        size_t n = 0;
        unsigned char *block = malloc(8192);
        frame_header(s, 0, 4, 0, 0);
        raw_send(fd, preface, sizeof preface - 1);
        raw_send(fd, s, 9);
        block[n++] = 0x83; /* :method POST */
        block[n++] = 0x86; /* :scheme http */
        block[n++] = 0x40; /* literal, incremental indexing, new name */
        block[n++] = 6;
        memcpy(block + n, "x-bomb", 6);
        n += 6;
        block[n++] = 0x7f; /* value length 4000: 127 + 3873 as a varint */
        block[n++] = (unsigned char)((3873 & 0x7f) | 0x80);
        block[n++] = (unsigned char)(3873 >> 7);
        memset(block + n, 'a', 4000);
        n += 4000;
        for (int i = 0; i < 1000; i++)
            block[n++] = 0xbe; /* index 62: the entry just added */
        frame_header(hdr, n, 1, 0x4 | 0x1, 1);
        raw_send(fd, hdr, 9);
        raw_send(fd, block, n);
        bool closed = false;
        char *got = raw_read_all(fd, 2000, &closed);
        free(got);
        close(fd);
        free(block);
    }
    CHECK(live(g.port));

    /* A peer that asks for big replies and never reads them: the daemon serves others
     * meanwhile and closes that connection (--send-timeout-s, --idle-timeout-s). */
    {
        grpc_client c;
        grpc_stream st[4];
        tensor t[3];
        uint64_t r = 3;
        size_t len, n;
        float *data = qkv(&r, 8, 1024, t);
        uint8_t *req = infer_request("sdpa", t, 3, NULL, 0, &len);
        char *framed = grpc_frame(req, len, &n);
        if (grpc_client_open(&c, g.port) == 0) {
            for (int i = 0; i < 4; i++) {
                st[i].body = framed;
                st[i].body_len = n;
                st[i].keep_open = false;
                grpc_start(&c, SVC "ModelInfer", NULL, &st[i]);
            }
            grpc_flush(&c); /* the requests go; nothing is read */
            sleep_ms(500);
            CHECK(live(g.port));
            sleep_ms(3500);
            CHECK(live(g.port));
            double t0 = now_s();
            while (!c.dead && now_s() - t0 < 10)
                grpc_pump(&c, 20);
            CHECK(c.dead); /* closed by the daemon */
            grpc_client_close(&c);
            for (int i = 0; i < 4; i++)
                grpc_stream_free(&st[i]);
        }
        free(framed);
        free(req);
        free(data);
    }
    CHECK(live(g.port));
    CHECK_EQ_INT(daemon_stop(&g.d), 0);
}

/* --connection-limit holds on the gRPC port: a connection past it waits (in the listen
 * backlog, as on --port) and is served once a place is free. */
static void test_connection_limit(void)
{
    grpc_daemon g;
    grpc_client a, b, extra;
    grpc_stream st, waiting;
    const char *args[] = {"--connection-limit", "2", NULL};
    if (start(&g, args) != 0 || grpc_client_open(&a, g.port) != 0 ||
        grpc_client_open(&b, g.port) != 0) {
        CHECK(false);
        return;
    }
    CHECK(grpc_call(&a, SVC "ServerLive", NULL, "", 0, 5000, &st) && st.grpc_status == 0);
    grpc_stream_free(&st);
    CHECK(grpc_call(&b, SVC "ServerLive", NULL, "", 0, 5000, &st) && st.grpc_status == 0);
    grpc_stream_free(&st);
    if (grpc_client_open(&extra, g.port) == 0) {
        static const char empty[5] = {0};
        waiting.body = empty;
        waiting.body_len = 5;
        waiting.keep_open = false;
        CHECK(grpc_start(&extra, SVC "ServerLive", NULL, &waiting) == 0);
        CHECK(!grpc_wait(&extra, &waiting, 1000)); /* not served while two are open */
        grpc_client_close(&a);
        CHECK(grpc_wait(&extra, &waiting, 5000));
        CHECK_EQ_INT(waiting.grpc_status, 0);
        grpc_stream_free(&waiting);
        grpc_client_close(&extra);
    }
    grpc_client_close(&b);
    CHECK_EQ_INT(daemon_stop(&g.d), 0);
}

int main(void)
{
    RUN_WITHIN(test_methods_and_statuses, 60);
    RUN_WITHIN(test_infer_matches_http, 60);
    RUN_WITHIN(test_layers_match_http, 60);
    RUN_WITHIN(test_a_sequence_over_layers_matches_http, 60);
    RUN_WITHIN(test_sizes_memory_and_stalls, 60);
    RUN_WITHIN(test_deadline_queue_cancel_metrics, 240);
    RUN_WITHIN(test_same_outcomes_as_http, 120);
    RUN_WITHIN(test_bearer_tokens, 60);
    RUN_WITHIN(test_drain, 120);
    RUN_WITHIN(test_hostile_peers, 120);
    RUN_WITHIN(test_connection_limit, 60);
    return check_report();
}
