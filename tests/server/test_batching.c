/*
 * test_batching.c - dynamic batching through a real daemon: layer passes of one model that
 * wait while the engine is busy run as groups (attnd_batches_total, attnd_batched_requests_total)
 * and answer what they answer alone; session steps, plain /v1/mha calls and KServe v2 inference
 * over HTTP and gRPC share a group; a member with a bad input, a stale expect_length or a deleted
 * session fails alone with its own status; the layers of a model of two wait in lanes of their
 * own; --max-batch-rows caps a group and 1 turns batching off.
 *
 * Two daemons get the same traffic: one batching (the default) and one with --max-batch-rows 1,
 * whose replies are the reference. A group's rows here are at most 16, so the engine takes the
 * same few-row products for the group as for each request alone (engine.h, eng_mha_batch), and
 * the outputs must be the same bits. The engine is kept busy by a long /v1/mha of the same layer
 * (its lane's first group) while the others are sent; its length is chosen from a measurement
 * in the same run, so that it outlasts sending them many times over.
 */
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "grpc_service.pb-c.h"
#include "tests/support/check.h"
#include "tests/support/daemon.h"
#include "tests/support/grpc.h"
#include "tests/support/rng.h"

enum { E = 64, PROMPT = 8, SESSIONS = 6 };

static const char *const JSON[] = {"Content-Type: application/json", NULL};

/* One daemon, its gRPC port and the sessions made on it (the same prompts on both). */
typedef struct {
    daemon_proc d;
    int grpc_port;
    char id[SESSIONS + 1][40]; /* the last one is deleted before the steps */
} server;

static server batching, alone;

/* Starts s with `args` and --grpc-port 0. */
static int start(server *s, const char *const *args)
{
    return daemon_start_grpc(&s->d, args, &s->grpc_port);
}

static long post(const server *s, const char *path, const char *body, http_resp *r)
{
    return http_do(NULL, s->d.port, "POST", path, JSON, body, strlen(body), r);
}

/* A /v1/mha body of `n` tokens of `x` (E wide, base64) with `fields` (malloc'd). */
static char *mha_body(const float *x, int64_t n, int64_t width, const char *fields)
{
    int64_t shape[2] = {n, width};
    char *t = json_tensor_b64(x, shape, 2);
    size_t len = strlen(t) + strlen(fields) + 32;
    char *b = malloc(len);
    snprintf(b, len, "{\"input\":%s,%s}", t, fields);
    free(t);
    return b;
}

/* A v2 inference body of one token of the demo layer as JSON numbers (malloc'd). */
static char *v2_body(const float *x)
{
    size_t len = 128 + (size_t)E * 24;
    char *b = malloc(len);
    int at = snprintf(b, len,
                      "{\"inputs\":[{\"name\":\"input\",\"shape\":[1,1,%d],"
                      "\"datatype\":\"FP32\",\"data\":[",
                      E);
    for (int i = 0; i < E; i++)
        at += snprintf(b + at, len - (size_t)at, "%s%.9g", i ? "," : "", (double)x[i]);
    snprintf(b + at, len - (size_t)at, "]}]}");
    return b;
}

/* The text of the reply's outputs ("output" natively, "outputs" in v2), for comparing bits. */
static char *outputs_of(const char *body)
{
    json_t *j = body ? json_loads(body, 0, NULL) : NULL;
    json_t *o = json_object_get(j, "output");
    if (!o)
        o = json_object_get(j, "outputs");
    if (!o)
        o = json_object_get(j, "hex");
    char *text = o ? json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY) : NULL;
    json_decref(j);
    return text;
}

/* POST /v1/sessions `body` on s: the reply's status, and the new id into id[40] ("" when the
 * reply is not 201 or its id does not fit). */
static long create_session(const server *s, const char *body, char id[40])
{
    http_resp r;
    post(s, "/v1/sessions", body, &r);
    json_t *j = r.body ? json_loads(r.body, 0, NULL) : NULL;
    const char *made = json_string_value(json_object_get(j, "id"));
    bool ok = r.status == 201 && made && strlen(made) < 40;
    snprintf(id, 40, "%s", ok ? made : "");
    long status = r.status;
    json_decref(j);
    http_resp_free(&r);
    return status;
}

static bool make_sessions(server *s, const float *prompt)
{
    char fields[160];
    for (int i = 0; i <= SESSIONS; i++) {
        bool ok = create_session(s, "{\"model\":\"demo\"}", s->id[i]) == 201 && s->id[i][0];
        CHECKF(ok, "creating session %d", i);
        if (!ok)
            return false;
        http_resp r;
        snprintf(fields, sizeof fields, "\"session\":\"%s\",\"positional\":\"rope\"", s->id[i]);
        char *body = mha_body(prompt + (size_t)i * PROMPT * E, PROMPT, E, fields);
        post(s, "/v1/mha", body, &r);
        free(body);
        CHECKF(r.status == 200, "prompt of session %d: %ld %.200s", i, r.status, r.body);
        http_resp_free(&r);
    }
    char path[64];
    http_resp r;
    snprintf(path, sizeof path, "/v1/sessions/%s", s->id[SESSIONS]);
    http_do(NULL, s->d.port, "DELETE", path, NULL, NULL, 0, &r);
    CHECKF(r.status == 204, "delete: %ld", r.status);
    http_resp_free(&r);
    return true;
}

/* The requests sent while the engine is busy, and what came back. */
enum { STEPS = SESSIONS, PLAIN = STEPS, V2, GRPC, BAD_WIDTH, BAD_LENGTH, DELETED, N_REQ };

typedef struct {
    const server *s;
    const char *path; /* NULL: a gRPC ModelInfer of `body` (packed, body_len bytes) */
    char *body;
    size_t body_len;
    http_resp r; /* gRPC: status 200 for grpc-status 0, body the outputs' raw bytes as hex */
    pthread_t t;
} request;

/* A ModelInfer message of one token of `model`, raw FP32, with parameters["layer"] when
 * layer >= 0 (malloc'd). */
static char *grpc_body(const float *x, const char *model, int64_t layer, size_t *len)
{
    Inference__ModelInferRequest req = INFERENCE__MODEL_INFER_REQUEST__INIT;
    Inference__ModelInferRequest__InferInputTensor in, *inp = &in;
    Inference__ModelInferRequest__ParametersEntry e, *ep = &e;
    Inference__InferParameter p;
    ProtobufCBinaryData raw = {.len = E * sizeof(float), .data = (uint8_t *)x};
    int64_t shape[3] = {1, 1, E};
    inference__model_infer_request__infer_input_tensor__init(&in);
    inference__model_infer_request__parameters_entry__init(&e);
    inference__infer_parameter__init(&p);
    if (layer >= 0) {
        p.parameter_choice_case = INFERENCE__INFER_PARAMETER__PARAMETER_CHOICE_INT64_PARAM;
        p.int64_param = layer;
        e.key = (char *)"layer";
        e.value = &p;
        req.n_parameters = 1;
        req.parameters = &ep;
    }
    req.model_name = (char *)model;
    in.name = (char *)"input";
    in.datatype = (char *)"FP32";
    in.n_shape = 3;
    in.shape = shape;
    req.n_inputs = req.n_raw_input_contents = 1;
    req.inputs = &inp;
    req.raw_input_contents = &raw;
    *len = inference__model_infer_request__get_packed_size(&req);
    uint8_t *msg = malloc(*len);
    inference__model_infer_request__pack(&req, msg);
    return (char *)msg;
}

/* The outputs of a ModelInferResponse as {"hex": ...}, comparable as text (malloc'd). */
static char *grpc_outputs(const grpc_stream *st)
{
    size_t len;
    const char *msg = grpc_message_at(st, 0, &len);
    Inference__ModelInferResponse *resp =
        msg ? inference__model_infer_response__unpack(NULL, len, (const uint8_t *)msg) : NULL;
    if (!resp || resp->n_raw_output_contents < 1) {
        if (resp)
            inference__model_infer_response__free_unpacked(resp, NULL);
        return NULL;
    }
    const ProtobufCBinaryData *o = &resp->raw_output_contents[0];
    char *text = malloc(2 * o->len + 16);
    int at = sprintf(text, "{\"hex\":\"");
    for (size_t i = 0; i < o->len; i++)
        at += sprintf(text + at, "%02x", o->data[i]);
    sprintf(text + at, "\"}");
    inference__model_infer_response__free_unpacked(resp, NULL);
    return text;
}

static void grpc_send(request *q)
{
    grpc_client c;
    grpc_stream st;
    memset(&q->r, 0, sizeof q->r);
    if (grpc_client_open(&c, q->s->grpc_port) != 0)
        return;
    if (grpc_call(&c, "/inference.GRPCInferenceService/ModelInfer", NULL, q->body, q->body_len,
                  60000, &st)) {
        q->r.status = st.grpc_status == 0 ? 200 : 1000 + st.grpc_status;
        if (st.grpc_status == 0)
            q->r.body = grpc_outputs(&st);
        grpc_stream_free(&st);
    }
    grpc_client_close(&c);
}

static void *send_one(void *arg)
{
    request *q = arg;
    if (q->path)
        post(q->s, q->path, q->body, &q->r);
    else
        grpc_send(q);
    return NULL;
}

static void requests_make(request *q, const server *s, const float *tok)
{
    char fields[192];
    for (int i = 0; i < N_REQ; i++) {
        q[i].s = s;
        q[i].path = "/v1/mha";
        const char *id = s->id[i < STEPS ? i : 0];
        long length = PROMPT;
        int64_t width = E;
        if (i == BAD_WIDTH)
            width = E / 2;
        if (i == BAD_LENGTH)
            length = PROMPT + 5;
        if (i == DELETED)
            id = s->id[SESSIONS];
        if (i == PLAIN)
            snprintf(fields, sizeof fields, "\"model\":\"demo\",\"positional\":\"rope\"");
        else
            snprintf(fields, sizeof fields,
                     "\"session\":\"%s\",\"expect_length\":%ld,\"positional\":\"rope\"", id,
                     length);
        q[i].body = i == V2 ? v2_body(tok + (size_t)i * E)
                            : mha_body(tok + (size_t)i * E, 1, width, fields);
        if (i == V2)
            q[i].path = "/v2/models/demo/infer";
        if (i == GRPC) {
            free(q[i].body);
            q[i].body = grpc_body(tok + (size_t)i * E, "demo", -1, &q[i].body_len);
            q[i].path = NULL;
        }
    }
}

static void requests_free(request *q, int n)
{
    for (int i = 0; i < n; i++) {
        free(q[i].body);
        http_resp_free(&q[i].r);
    }
}

/* Sends q[0..n) at once, each on its own connection, behind `hold` (a long request, or NULL),
 * and waits for every reply. */
static void send_all(request *q, int n, request *hold)
{
    if (hold) {
        pthread_create(&hold->t, NULL, send_one, hold);
        metric_wait(hold->s->d.port, "attnd_running_requests", 1, 10000);
    }
    for (int i = 0; i < n; i++)
        pthread_create(&q[i].t, NULL, send_one, &q[i]);
    for (int i = 0; i < n; i++)
        pthread_join(q[i].t, NULL);
    if (hold)
        pthread_join(hold->t, NULL);
}

/* A /v1/mha of `n` tokens of the demo layer, non-causal: its time grows as n^2 (malloc'd). */
static char *long_body(int64_t n)
{
    float *x = calloc((size_t)(n * E), sizeof *x);
    uint64_t rng = 5;
    rng_fill(&rng, x, (size_t)(n * E), 1.0);
    char *b = mha_body(x, n, E, "\"model\":\"demo\"");
    free(x);
    return b;
}

static double seconds_of(const server *s, const char *body)
{
    http_resp r;
    double t0 = now_s();
    post(s, "/v1/mha", body, &r);
    double t = now_s() - t0;
    CHECKF(r.status == 200, "%ld %.200s", r.status, r.body);
    http_resp_free(&r);
    return t;
}

/* A long request that outlasts sending N_REQ requests (measured: one step's round trip)
 * fifty times. Its length is found once, from one measured request of 1024 tokens and the
 * quadratic growth of its time, and kept for the later tests. */
static char *hold_body(const server *s, const float *tok)
{
    static int64_t n;
    if (!n) {
        char *step = mha_body(tok, 1, E, "\"model\":\"demo\"");
        double t_step = seconds_of(s, step);
        free(step);
        char *probe = long_body(1024);
        double t_probe = seconds_of(s, probe);
        free(probe);
        /* A fifth more than the quadratic estimate, for the part of its time that is linear. */
        double want = 1.2 * 1024 * sqrt(50 * N_REQ * t_step / fmax(t_probe, 1e-6));
        n = want < 1024 ? 1024 : want > 32768 ? 32768 : (int64_t)want;
    }
    return long_body(n);
}

/* What the batching daemon counted while requests waited behind a long one. */
typedef struct {
    double groups;  /* the rise of attnd_batches_total, the long request's group included */
    double members; /* the rise of attnd_batched_requests_total */
} lanes_seen;

/* Sends ref[0..n) to the unbatched daemon, then got[0..n) to the batching one behind `hold`, a
 * long request (its body made here) that keeps the engine busy while they wait. */
static lanes_seen send_behind_a_long_one(request *ref, request *got, int n, request *hold,
                                         const float *tok)
{
    send_all(ref, n, NULL);
    hold->body = hold_body(&batching, tok);
    double groups0 = metric_value(batching.d.port, "attnd_batches_total");
    double members0 = metric_value(batching.d.port, "attnd_batched_requests_total");
    send_all(got, n, hold);
    return (lanes_seen){.groups = metric_value(batching.d.port, "attnd_batches_total") - groups0,
                        .members = metric_value(batching.d.port, "attnd_batched_requests_total") -
                                   members0};
}

static void test_waiting_passes_run_together_and_answer_as_alone(void)
{
    float prompt[(SESSIONS + 1) * PROMPT * E], tok[N_REQ * E];
    uint64_t rng = 11;
    rng_fill(&rng, prompt, sizeof prompt / sizeof prompt[0], 1.0);
    rng_fill(&rng, tok, sizeof tok / sizeof tok[0], 1.0);
    if (!make_sessions(&batching, prompt) || !make_sessions(&alone, prompt))
        return;

    request ref[N_REQ], got[N_REQ], hold = {.s = &batching, .path = "/v1/mha"};
    requests_make(ref, &alone, tok);
    requests_make(got, &batching, tok);
    lanes_seen seen = send_behind_a_long_one(ref, got, N_REQ, &hold, tok);
    CHECKF(hold.r.status == 200, "the long request: %ld", hold.r.status);

    for (int i = 0; i < N_REQ; i++) {
        CHECKF(got[i].r.status == ref[i].r.status, "request %d: %ld batched, %ld alone: %.200s", i,
               got[i].r.status, ref[i].r.status, got[i].r.body ? got[i].r.body : "");
        if (got[i].r.status != 200 || ref[i].r.status != 200)
            continue;
        char *a = outputs_of(got[i].r.body), *b = outputs_of(ref[i].r.body);
        CHECKF(a && b && strcmp(a, b) == 0,
               "request %d: the batched output differs from alone: %.80s vs %.80s", i,
               a ? a : "(none)", b ? b : "(none)");
        free(a);
        free(b);
    }
    CHECK_EQ_INT((int)ref[BAD_WIDTH].r.status, 422);
    CHECK(ref[BAD_WIDTH].r.body && strstr(ref[BAD_WIDTH].r.body, "input"));
    CHECK_EQ_INT((int)ref[BAD_LENGTH].r.status, 409);
    CHECK_EQ_INT((int)ref[DELETED].r.status, 404);
    for (int i = 0; i < STEPS; i++)
        CHECKF(ref[i].r.status == 200, "step %d alone: %ld %.200s", i, ref[i].r.status,
               ref[i].r.body ? ref[i].r.body : "");

    /* The long request and those behind it: fewer groups than requests, every one counted but
     * the deleted session's step, whose layer is unknown when it is admitted (it runs alone). */
    double groups = seen.groups, members = seen.members;
    printf("  %d requests behind a long one of %.1f MB ran in %.0f groups\n", N_REQ,
           (double)strlen(hold.body) / 1e6, groups - 1);
    CHECKF(members == N_REQ, "%.0f requests ran from the lanes, want %d", members, N_REQ);
    CHECKF(groups >= 2 && groups <= 1 + N_REQ / 2.0,
           "%.0f groups for %d requests: they did not wait together", groups, N_REQ + 1);
    CHECK_EQ_INT((int)metric_value(alone.d.port, "attnd_batches_total"), 0);

    free(hold.body);
    http_resp_free(&hold.r);
    requests_free(ref, N_REQ);
    requests_free(got, N_REQ);
}

/* ---- Layers of one model ------------------------------------------------------------------ */

/* The requests through the two layers of the checkpoint "llama" (E = 64 too): session steps
 * through layer 0 and layer 1, a plain /v1/mha of layer 1, v2 of layer 0, gRPC of layer 1. */
enum { LAYER_SESSIONS = 4, L_PLAIN = LAYER_SESSIONS, L_V2, L_GRPC, N_LAYER_REQ };

static const int64_t layer_of[N_LAYER_REQ] = {0, 0, 1, 1, 1, 0, 1};

/* POSTs `body` to s, checking for 200. */
static void post_ok(const server *s, const char *path, char *body)
{
    http_resp r;
    post(s, path, body, &r);
    CHECKF(r.status == 200, "%s: %ld %.200s", path, r.status, r.body ? r.body : "");
    http_resp_free(&r);
    free(body);
}

/* LAYER_SESSIONS sessions of "llama" on s, the same prompt through both layers of each, and
 * the next token through layer 0 of those that step layer 1 next; their ids into ids[]. */
static bool layer_sessions(const server *s, const float *prompt, const float *tok,
                           char ids[LAYER_SESSIONS][40])
{
    char fields[160];
    for (int i = 0; i < LAYER_SESSIONS; i++) {
        long status = create_session(s, "{\"model\":\"llama\"}", ids[i]);
        bool ok = status == 201 && ids[i][0];
        CHECKF(ok, "session %d of llama: %ld", i, status);
        if (!ok)
            return false;
        for (int64_t l = 0; l < 2; l++) {
            snprintf(fields, sizeof fields, "\"session\":\"%s\",\"layer\":%lld", ids[i],
                     (long long)l);
            post_ok(s, "/v1/mha", mha_body(prompt, PROMPT, E, fields));
        }
        if (layer_of[i] == 1) {
            snprintf(fields, sizeof fields, "\"session\":\"%s\",\"layer\":0", ids[i]);
            post_ok(s, "/v1/mha", mha_body(tok + (size_t)i * E, 1, E, fields));
        }
    }
    return true;
}

static void layer_requests_make(request *q, const server *s, char ids[LAYER_SESSIONS][40],
                                const float *tok)
{
    char fields[192];
    for (int i = 0; i < N_LAYER_REQ; i++) {
        const float *x = tok + (size_t)i * E;
        q[i].s = s;
        q[i].path = "/v1/mha";
        if (i < LAYER_SESSIONS)
            snprintf(fields, sizeof fields,
                     "\"session\":\"%s\",\"layer\":%lld,\"expect_length\":%d", ids[i],
                     (long long)layer_of[i], PROMPT);
        else
            snprintf(fields, sizeof fields, "\"model\":\"llama\",\"layer\":%lld",
                     (long long)layer_of[i]);
        if (i == L_V2) {
            char *b = v2_body(x);
            size_t len = strlen(b) + 48;
            q[i].body = malloc(len);
            snprintf(q[i].body, len, "{\"parameters\":{\"layer\":%lld},%s", (long long)layer_of[i],
                     b + 1);
            free(b);
            q[i].path = "/v2/models/llama/infer";
        } else if (i == L_GRPC) {
            q[i].body = grpc_body(x, "llama", layer_of[i], &q[i].body_len);
            q[i].path = NULL;
        } else {
            q[i].body = mha_body(x, 1, E, fields);
        }
    }
}

/* Steps and passes of one model's two layers that wait while the engine is busy wait in a lane
 * per layer (different weights never share an engine call): at least one group per layer, every
 * request from a lane, and every reply the bits the unbatched daemon gives. */
static void test_layers_wait_in_lanes_of_their_own(void)
{
    float prompt[PROMPT * E], tok[N_LAYER_REQ * E];
    char ids[2][LAYER_SESSIONS][40];
    uint64_t rng = 13;
    rng_fill(&rng, prompt, sizeof prompt / sizeof prompt[0], 1.0);
    rng_fill(&rng, tok, sizeof tok / sizeof tok[0], 1.0);
    if (!layer_sessions(&batching, prompt, tok, ids[0]) ||
        !layer_sessions(&alone, prompt, tok, ids[1]))
        return;
    request ref[N_LAYER_REQ], got[N_LAYER_REQ], hold = {.s = &batching, .path = "/v1/mha"};
    layer_requests_make(ref, &alone, ids[1], tok);
    layer_requests_make(got, &batching, ids[0], tok);
    lanes_seen seen = send_behind_a_long_one(ref, got, N_LAYER_REQ, &hold, tok);
    CHECKF(hold.r.status == 200, "the long request: %ld", hold.r.status);
    for (int i = 0; i < N_LAYER_REQ; i++) {
        CHECKF(got[i].r.status == 200 && ref[i].r.status == 200,
               "request %d (layer %lld): %ld batched, %ld alone: %.200s", i, (long long)layer_of[i],
               got[i].r.status, ref[i].r.status, got[i].r.body ? got[i].r.body : "");
        char *a = outputs_of(got[i].r.body), *b = outputs_of(ref[i].r.body);
        CHECKF(a && b && strcmp(a, b) == 0, "request %d (layer %lld): the batched output differs",
               i, (long long)layer_of[i]);
        free(a);
        free(b);
    }
    double groups = seen.groups - 1, members = seen.members;
    printf("  %d requests through 2 layers behind a long one ran in %.0f groups\n", N_LAYER_REQ,
           groups);
    CHECKF(members == N_LAYER_REQ + 1, "%.0f requests ran from the lanes, want %d and the long one",
           members, N_LAYER_REQ);
    CHECKF(groups >= 2 && groups < N_LAYER_REQ, "%.0f groups for %d requests through 2 layers",
           groups, N_LAYER_REQ);
    free(hold.body);
    http_resp_free(&hold.r);
    requests_free(ref, N_LAYER_REQ);
    requests_free(got, N_LAYER_REQ);
}

/* --max-batch-rows 2: groups of at most two one-token requests, however many wait. */
static void test_max_batch_rows_caps_a_group(void)
{
    server capped;
    const char *const args[] = {"--threads", "1", "--kv-cache-bytes", "16MiB", "--max-batch-rows",
                                "2",         NULL};
    if (start(&capped, args) != 0) {
        CHECK(0);
        return;
    }
    float prompt[(SESSIONS + 1) * PROMPT * E], tok[N_REQ * E];
    uint64_t rng = 12;
    rng_fill(&rng, prompt, sizeof prompt / sizeof prompt[0], 1.0);
    rng_fill(&rng, tok, sizeof tok / sizeof tok[0], 1.0);
    if (make_sessions(&capped, prompt)) {
        request q[N_REQ], hold = {.s = &capped, .path = "/v1/mha"};
        requests_make(q, &capped, tok);
        hold.body = long_body(2048);
        double groups0 = metric_value(capped.d.port, "attnd_batches_total");
        send_all(q, N_REQ, &hold);
        double groups = metric_value(capped.d.port, "attnd_batches_total") - groups0;
        CHECKF(groups >= N_REQ / 2, "%.0f groups for %d requests in groups of at most 2", groups,
               N_REQ);
        free(hold.body);
        http_resp_free(&hold.r);
        requests_free(q, N_REQ);
    }
    CHECK_EQ_INT(daemon_stop(&capped.d), 0);
}

int main(void)
{
    const char *const on[] = {"--threads", "1",       "--kv-cache-bytes",
                              "16MiB",     "--model", "llama=tests/api/hf/cases/llama",
                              NULL};
    const char *const off[] = {"--threads",
                               "1",
                               "--kv-cache-bytes",
                               "16MiB",
                               "--max-batch-rows",
                               "1",
                               "--model",
                               "llama=tests/api/hf/cases/llama",
                               NULL};
    if (start(&batching, on) != 0 || start(&alone, off) != 0) {
        printf("FAIL cannot start attnd\n0 passed, 1 failed\n");
        return 1;
    }
    RUN_WITHIN(test_waiting_passes_run_together_and_answer_as_alone, 240);
    RUN_WITHIN(test_layers_wait_in_lanes_of_their_own, 240);
    CHECK_EQ_INT(daemon_stop(&batching.d), 0);
    CHECK_EQ_INT(daemon_stop(&alone.d), 0);
    RUN_WITHIN(test_max_batch_rows_caps_a_group, 120);
    return check_report();
}
