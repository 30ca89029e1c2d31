/* test_batch.c - requests that run together (api/proto/batch.c) when a model has several
 * layers: the key the server groups waiting requests by is the layer they run, so that the
 * same layer of one model, named by /v1/mha's "layer", v2's parameter or a session's model,
 * gives one key, and another layer, another model or a layer past the last does not; and
 * api_call_batch serves steps of several sessions through two layers in one call, each
 * member's reply the bits it gets alone. The daemon's lanes are tests/server/test_batching.c's. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "tests/support/check.h"
#include "tests/support/daemon.h"
#include "tests/support/rng.h"
#include "tests/support/route.h"
#include "tests/support/util.h"

#define CHECKPOINT "tests/api/hf/cases/llama" /* two layers, E = 64 */
#define E          64

static eng_pool *pool;
static api_models *models;

static uint64_t native_key(api_sessions *reg, const char *body)
{
    api_call call = test_json_call(pool, models, reg, body);
    api_peek pk;
    api_peek_native(&call, &pk);
    uint64_t key = api_batch_key(API_BATCH_MHA, &call, &pk);
    api_peek_free(&pk);
    return key;
}

static uint64_t v2_key(const char *model, const char *body)
{
    api_call call = {.body = body, .body_len = strlen(body), .models = models, .model = model};
    api_peek pk;
    api_peek_v2(&call, &pk);
    uint64_t key = api_batch_key(API_BATCH_V2_INFER, &call, &pk);
    api_peek_free(&pk);
    return key;
}

static api_sessions *registry(void)
{
    return test_sessions_new((size_t)16 << 20);
}

/* A session of `model` in reg, its id into id[40]. */
static void create(api_sessions *reg, const char *model, char id[40])
{
    char body[96];
    snprintf(body, sizeof body, "{\"model\":\"%s\"}", model);
    api_call call = test_json_call(pool, models, reg, body);
    test_reply r = test_route(api_sessions_create, &call);
    const char *s = json_string_value(json_object_get(r.json, "id"));
    CHECKF(r.status == 201 && s, "session: %d", r.status);
    snprintf(id, 40, "%s", r.status == 201 && s ? s : "");
    json_decref(r.json);
}

/* A step that must pass before the ones the test compares: POST /v1/mha `body` on reg. */
static void step_before(api_sessions *reg, const char *body)
{
    api_call call = test_json_call(pool, models, reg, body);
    test_reply r = test_route(api_mha, &call);
    CHECK_EQ_INT(r.status, 200);
    json_decref(r.json);
}

static void test_the_key_is_the_layer(void)
{
    const api_model *m = api_models_find(models, "llama");
    CHECK(m && m->layers == 2);
    if (!m)
        return;
    uint64_t l0 = (uint64_t)(uintptr_t)m->layer[0], l1 = (uint64_t)(uintptr_t)m->layer[1];
    CHECK(l0 != l1);
    CHECK(native_key(NULL, "{\"model\":\"llama\",\"layer\":1,\"input\":[[1]]}") == l1);
    CHECK(native_key(NULL, "{\"layer\":0,\"model\":\"llama\",\"input\":[[1]]}") == l0);
    /* Not named: layer 0's lane (the request is refused when it runs). */
    CHECK(native_key(NULL, "{\"model\":\"llama\",\"input\":[[1]]}") == l0);
    /* No such layer, or not one the peek reads: no lane, the request runs alone. */
    CHECK(native_key(NULL, "{\"model\":\"llama\",\"layer\":2,\"input\":[[1]]}") == 0);
    CHECK(native_key(NULL, "{\"model\":\"llama\",\"layer\":\"1\",\"input\":[[1]]}") == l0);
    /* The same layer of another model is another key. */
    uint64_t alone = native_key(NULL, "{\"model\":\"llama_1\",\"input\":[[1]]}");
    CHECK(alone != 0 && alone != l1);
    /* v2 and gRPC (whose peek reads the same parameter: test_grpc_wire.c) over the path's
     * model. */
    CHECK(v2_key("llama", "{\"parameters\":{\"layer\":1},\"inputs\":[]}") == l1);
    CHECK(v2_key("llama", "{\"inputs\":[],\"parameters\":{\"priority\":1,\"layer\":0}}") == l0);
    CHECK(v2_key("llama", "{\"parameters\":{\"layer\":5},\"inputs\":[]}") == 0);
    api_call call = {.models = models, .model = "llama"};
    api_peek pk = {.layer = 1};
    CHECK(api_batch_key(API_BATCH_GRPC_INFER, &call, &pk) == l1);
    /* A session's step: the session's model and the body's layer. */
    api_sessions *reg = registry();
    char id[40], body[160];
    create(reg, "llama", id);
    snprintf(body, sizeof body, "{\"session\":\"%s\",\"layer\":1,\"input\":[[1]]}", id);
    CHECK(native_key(reg, body) == l1);
    api_sessions_free(reg);
}

/* /v1/mha over session `id` of one token through `layer` (malloc'd). */
static char *step_body(const char *id, int64_t layer, const float *x)
{
    int64_t shape[2] = {1, E};
    char *t = json_tensor_b64(x, shape, 2);
    size_t len = strlen(t) + 192;
    char *b = malloc(len);
    snprintf(b, len,
             "{\"session\":\"%s\",\"layer\":%lld,\"input\":%s,\"output_encoding\":\"base64\"}", id,
             (long long)layer, t);
    free(t);
    return b;
}

/* Sessions of "llama" in reg[0] (served in batches) and reg[1] (alone), the same prompt in
 * each through both layers. */
enum { SESSIONS = 4, PROMPT = 6 };

static void prompt_all(api_sessions *reg, char ids[SESSIONS][40], const float *x)
{
    int64_t shape[2] = {PROMPT, E};
    char *t = json_tensor_b64(x, shape, 2);
    for (int s = 0; s < SESSIONS; s++) {
        create(reg, "llama", ids[s]);
        for (int64_t l = 0; l < 2; l++) {
            size_t len = strlen(t) + 160;
            char *b = malloc(len);
            snprintf(b, len, "{\"session\":\"%s\",\"layer\":%lld,\"input\":%s}", ids[s],
                     (long long)l, t);
            step_before(reg, b);
            free(b);
        }
    }
    free(t);
}

/* One batch of steps through both layers: sessions 0 and 1 through layer 0, 2 and 3 through
 * layer 1 (their layer 0 for the token stepped before, alone). Each reply is the bits of the
 * same step served alone. */
static void test_a_batch_of_two_layers_answers_as_alone(void)
{
    api_sessions *reg[2] = {registry(), registry()};
    char ids[2][SESSIONS][40];
    float x[(PROMPT + SESSIONS) * E];
    uint64_t rng = 3;
    rng_fill(&rng, x, sizeof x / sizeof x[0], 1.0);
    for (int r = 0; r < 2; r++)
        prompt_all(reg[r], ids[r], x);
    const float *tok = x + PROMPT * E;
    static const int64_t layer_of[SESSIONS] = {0, 0, 1, 1};
    char *bodies[2][SESSIONS];
    api_call calls[2][SESSIONS];
    api_reply replies[2][SESSIONS];
    api_batch_member m[SESSIONS];
    for (int r = 0; r < 2; r++) {
        for (int s = 0; s < SESSIONS; s++) {
            if (layer_of[s] == 1) { /* the token through layer 0 first */
                char *b = step_body(ids[r][s], 0, tok + s * E);
                step_before(reg[r], b);
                free(b);
            }
            bodies[r][s] = step_body(ids[r][s], layer_of[s], tok + s * E);
            calls[r][s] = test_json_call(pool, models, reg[r], bodies[r][s]);
        }
    }
    for (int s = 0; s < SESSIONS; s++) {
        m[s] = (api_batch_member){API_BATCH_MHA, &calls[0][s], &replies[0][s]};
        api_mha(&calls[1][s], &replies[1][s]);
    }
    api_call_batch(m, SESSIONS, 64);
    for (int s = 0; s < SESSIONS; s++) {
        json_t *a = json_loadb(replies[0][s].body, replies[0][s].body_len, 0, NULL);
        json_t *b = json_loadb(replies[1][s].body, replies[1][s].body_len, 0, NULL);
        const char *ba = json_string_value(json_object_get(json_object_get(a, "output"), "base64"));
        const char *bb = json_string_value(json_object_get(json_object_get(b, "output"), "base64"));
        CHECKF(replies[0][s].status == 200 && ba && bb && strcmp(ba, bb) == 0,
               "session %d (layer %lld): batched %d, alone %d, not the same bits", s,
               (long long)layer_of[s], replies[0][s].status, replies[1][s].status);
        CHECK_EQ_INT(json_integer_value(json_object_get(a, "length")), PROMPT + 1);
        json_decref(a);
        json_decref(b);
        api_reply_free(&replies[0][s]);
        api_reply_free(&replies[1][s]);
        free(bodies[0][s]);
        free(bodies[1][s]);
    }
    api_sessions_free(reg[0]);
    api_sessions_free(reg[1]);
}

int main(void)
{
    eng_error err;
    char msg[600];
    pool = eng_pool_new(2, &err);
    models = api_models_new();
    api_model_source whole = {.name = "llama", .path = CHECKPOINT, .layer = -1};
    api_model_source one = {.name = "llama_1", .path = CHECKPOINT, .layer = 1};
    if (!pool || !models || !api_models_load(models, &whole, msg, sizeof msg) ||
        !api_models_load(models, &one, msg, sizeof msg)) {
        printf("FAIL set-up: %s\n0 passed, 1 failed\n", msg);
        return 1;
    }
    RUN_WITHIN(test_the_key_is_the_layer, 30);
    RUN_WITHIN(test_a_batch_of_two_layers_answers_as_alone, 60);
    api_models_free(models);
    eng_pool_free(pool);
    return check_report();
}
