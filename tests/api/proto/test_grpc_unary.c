/* test_grpc_unary.c - the cheap gRPC methods of api/ (proto/grpc_unary.c) without a socket,
 * against the v2 HTTP routes they answer for: ModelStatistics carries the same counters as GET
 * /v2/models/stats's JSON (both written from one api_model_stats array), ModelReady refuses an
 * unknown model or version with the status and message of GET /v2/models/{m}/ready, and
 * ModelMetadata and ServerMetadata say what GET /v2/models/{m} and GET /v2 say. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "api/wire/buf.h"
#include "grpc_service.pb-c.h"
#include "tests/support/check.h"

static api_models *models;

static const api_model_stats stats[2] = {
    {.name = "sdpa",
     .last_inference_ms = 1700000000123u,
     .inference_count = 42,
     .execution_count = 40,
     .success = {39, 123456789},
     .fail = {3, 4567},
     .queue = {42, 890},
     .compute_input = {39, 111},
     .compute_infer = {39, 222222},
     .compute_output = {39, 333}},
    {.name = "demo", .inference_count = 1, .execution_count = 1, .success = {1, 5}},
};

static void check_duration(const Inference__StatisticDuration *d, const json_t *j, const char *name)
{
    const json_t *o = json_object_get(j, name);
    CHECKF(d && o, "%s missing", name);
    if (d && o) {
        CHECKF(d->count == (uint64_t)json_integer_value(json_object_get(o, "count")), "%s count",
               name);
        CHECKF(d->ns == (uint64_t)json_integer_value(json_object_get(o, "ns")), "%s ns", name);
    }
}

/* Both replies of the same counters agree field by field, and with the counters. */
static void test_statistics_as_over_http(void)
{
    for (size_t n = 0; n <= 2; n++) {
        api_buf b;
        api_reply r;
        api_buf_init(&b, 1 << 16);
        api_v2_statistics_json(stats, n, &b);
        json_t *root = json_loadb(b.data, b.len, 0, NULL);
        const json_t *list = json_object_get(root, "model_stats");
        api_grpc_statistics(stats, n, &r);
        CHECK_EQ_INT(r.status, 200);
        CHECK(r.content_type && strcmp(r.content_type, "application/grpc") == 0);
        Inference__ModelStatisticsResponse *resp =
            inference__model_statistics_response__unpack(NULL, r.body_len, (uint8_t *)r.body);
        CHECK(resp && json_array_size(list) == n && resp->n_model_stats == n);
        for (size_t i = 0; resp && i < n && i < resp->n_model_stats; i++) {
            const Inference__ModelStatistics *m = resp->model_stats[i];
            const json_t *j = json_array_get(list, i);
            CHECK(strcmp(m->name, stats[i].name) == 0 &&
                  strcmp(m->name, json_string_value(json_object_get(j, "name"))) == 0);
            CHECK(strcmp(m->version, "1") == 0 &&
                  strcmp(json_string_value(json_object_get(j, "version")), "1") == 0);
            CHECK(m->last_inference == stats[i].last_inference_ms &&
                  m->last_inference ==
                      (uint64_t)json_integer_value(json_object_get(j, "last_inference")));
            CHECK(m->inference_count == stats[i].inference_count &&
                  m->inference_count ==
                      (uint64_t)json_integer_value(json_object_get(j, "inference_count")));
            CHECK(m->execution_count == stats[i].execution_count &&
                  m->execution_count ==
                      (uint64_t)json_integer_value(json_object_get(j, "execution_count")));
            const Inference__InferStatistics *s = m->inference_stats;
            const json_t *js = json_object_get(j, "inference_stats");
            CHECK(s && s->success && s->success->ns == stats[i].success.ns);
            if (!s)
                continue;
            check_duration(s->success, js, "success");
            check_duration(s->fail, js, "fail");
            check_duration(s->queue, js, "queue");
            check_duration(s->compute_input, js, "compute_input");
            check_duration(s->compute_infer, js, "compute_infer");
            check_duration(s->compute_output, js, "compute_output");
            check_duration(s->cache_hit, js, "cache_hit");
            check_duration(s->cache_miss, js, "cache_miss");
            CHECK(m->n_batch_stats == 0 && json_array_size(json_object_get(j, "batch_stats")) == 0);
        }
        if (resp)
            inference__model_statistics_response__free_unpacked(resp, NULL);
        api_reply_free(&r);
        json_decref(root);
        api_buf_free(&b);
    }
}

/* {name, version} as a ModelReadyRequest (or any model request: fields 1 and 2). */
static size_t model_request(const char *name, const char *version, uint8_t *buf)
{
    Inference__ModelReadyRequest req = INFERENCE__MODEL_READY_REQUEST__INIT;
    req.name = (char *)name;
    if (version)
        req.version = (char *)version;
    return inference__model_ready_request__pack(&req, buf);
}

static void test_model_ready_as_over_http(void)
{
    const char *cases[][2] = {{"sdpa", NULL}, {"demo", "1"}, {"nosuch", NULL}, {"sdpa", "2"}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        uint8_t buf[256];
        size_t len = model_request(cases[k][0], cases[k][1], buf);
        api_call call = {.body = (const char *)buf, .body_len = len, .models = models};
        api_call http = {.models = models, .model = cases[k][0], .version = cases[k][1]};
        api_reply g, h;
        api_grpc_unary(API_GRPC_MODEL_READY, true, &call, &g);
        api_v2_model_ready(&http, &h);
        CHECKF(g.status == h.status, "%s: gRPC %d, HTTP %d", cases[k][0], g.status, h.status);
        if (h.status == 200) {
            Inference__ModelReadyResponse *r =
                inference__model_ready_response__unpack(NULL, g.body_len, (uint8_t *)g.body);
            CHECK(r && r->ready);
            if (r)
                inference__model_ready_response__free_unpacked(r, NULL);
        } else {
            json_t *root = json_loadb(h.body, h.body_len, 0, NULL);
            const char *want = json_string_value(json_object_get(root, "error"));
            CHECK(g.content_type && strcmp(g.content_type, "text/plain") == 0);
            CHECKF(want && g.body && strlen(g.body) == g.body_len && strcmp(g.body, want) == 0,
                   "gRPC %s, HTTP %s", g.body ? g.body : "(none)", want ? want : "(none)");
            json_decref(root);
        }
        api_reply_free(&g);
        api_reply_free(&h);
    }
}

/* A TensorMetadata list equals the JSON's [{name, datatype, shape}]. */
static void check_tensors(Inference__ModelMetadataResponse__TensorMetadata **t, size_t n,
                          const json_t *list, const char *model)
{
    CHECKF(n == json_array_size(list), "%s: %zu tensors, HTTP %zu", model, n,
           json_array_size(list));
    for (size_t i = 0; i < n && i < json_array_size(list); i++) {
        const json_t *j = json_array_get(list, i), *shape = json_object_get(j, "shape");
        CHECK(strcmp(t[i]->name, json_string_value(json_object_get(j, "name"))) == 0);
        CHECK(strcmp(t[i]->datatype, json_string_value(json_object_get(j, "datatype"))) == 0);
        CHECK(t[i]->n_shape == json_array_size(shape));
        for (size_t d = 0; d < t[i]->n_shape && d < json_array_size(shape); d++)
            CHECK(t[i]->shape[d] == json_integer_value(json_array_get(shape, d)));
    }
}

/* ModelMetadata says what GET /v2/models/{m} says (its decoder parameters aside, which the
 * message has no field for), and refuses what it refuses in its words. */
static void test_model_metadata_as_over_http(void)
{
    const char *cases[][2] = {{"sdpa", NULL}, {"demo", "1"}, {"nosuch", NULL}, {"demo", "3"}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        uint8_t buf[256];
        size_t len = model_request(cases[k][0], cases[k][1], buf);
        api_call call = {.body = (const char *)buf, .body_len = len, .models = models};
        api_call http = {.models = models, .model = cases[k][0], .version = cases[k][1]};
        api_reply g, h;
        api_grpc_unary(API_GRPC_MODEL_METADATA, true, &call, &g);
        api_v2_model_metadata(&http, &h);
        json_t *root = json_loadb(h.body, h.body_len, 0, NULL);
        CHECKF(g.status == h.status, "%s: gRPC %d, HTTP %d", cases[k][0], g.status, h.status);
        if (h.status == 200) {
            Inference__ModelMetadataResponse *r =
                inference__model_metadata_response__unpack(NULL, g.body_len, (uint8_t *)g.body);
            const json_t *versions = json_object_get(root, "versions");
            CHECK(r && strcmp(r->name, json_string_value(json_object_get(root, "name"))) == 0);
            CHECK(r &&
                  strcmp(r->platform, json_string_value(json_object_get(root, "platform"))) == 0);
            CHECK(r && r->n_versions == 1 && json_array_size(versions) == 1 &&
                  strcmp(r->versions[0], json_string_value(json_array_get(versions, 0))) == 0);
            if (r) {
                check_tensors(r->inputs, r->n_inputs, json_object_get(root, "inputs"), cases[k][0]);
                check_tensors(r->outputs, r->n_outputs, json_object_get(root, "outputs"),
                              cases[k][0]);
                inference__model_metadata_response__free_unpacked(r, NULL);
            }
        } else {
            const char *want = json_string_value(json_object_get(root, "error"));
            CHECKF(want && g.body && strcmp(g.body, want) == 0, "gRPC %s, HTTP %s",
                   g.body ? g.body : "(none)", want ? want : "(none)");
        }
        json_decref(root);
        api_reply_free(&g);
        api_reply_free(&h);
    }
}

/* ServerMetadata says what GET /v2 says (its engine member aside). */
static void test_server_metadata_as_over_http(void)
{
    api_call call = {.body = "", .body_len = 0, .models = models};
    api_reply g, h;
    api_grpc_unary(API_GRPC_SERVER_METADATA, true, &call, &g);
    api_v2_server_metadata(&h);
    CHECK_EQ_INT(g.status, 200);
    json_t *root = json_loadb(h.body, h.body_len, 0, NULL);
    const json_t *ext = json_object_get(root, "extensions");
    Inference__ServerMetadataResponse *r =
        inference__server_metadata_response__unpack(NULL, g.body_len, (uint8_t *)g.body);
    CHECK(r && strcmp(r->name, json_string_value(json_object_get(root, "name"))) == 0 &&
          strcmp(r->version, json_string_value(json_object_get(root, "version"))) == 0);
    CHECK(r && r->n_extensions == json_array_size(ext) && r->n_extensions >= 3);
    for (size_t i = 0; r && i < r->n_extensions && i < json_array_size(ext); i++)
        CHECK(strcmp(r->extensions[i], json_string_value(json_array_get(ext, i))) == 0);
    if (r)
        inference__server_metadata_response__free_unpacked(r, NULL);
    json_decref(root);
    api_reply_free(&g);
    api_reply_free(&h);
}

int main(void)
{
    models = api_models_new();
    if (!models) {
        fprintf(stderr, "set-up failed\n");
        return 1;
    }
    RUN(test_statistics_as_over_http);
    RUN(test_model_ready_as_over_http);
    RUN(test_model_metadata_as_over_http);
    RUN(test_server_metadata_as_over_http);
    api_models_free(models);
    return check_report();
}
