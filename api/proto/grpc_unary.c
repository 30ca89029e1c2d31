/*
 * grpc_unary.c - the cheap methods of the v2 gRPC protocol, each response message built from the
 * data the HTTP routes write as JSON (v2_model.c's model lookup and descriptions, the server's
 * counters): liveness, readiness and health, server and model metadata, the repository index and
 * model statistics. ModelConfig alone is the HTTP route's JSON converted (grpc_json.c).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/proto/grpc.h"
#include "api/proto/v2.h"
#include "api/wire/reply.h"
#include "grpc_service.pb-c.h"

#define MEMBER(msg, offset) ((char *)(msg) + (offset))

/* The {name, version} of a model request message: ModelReady, ModelMetadata, ModelConfig and
 * ModelStatistics all put them in fields 1 and 2. */
static bool model_of(const api_call *call, char *name, size_t name_cap, char *version,
                     size_t version_cap)
{
    api__pb_cursor c = {.data = call->body, .len = call->body_len};
    api__pb_field f;
    name[0] = version[0] = '\0';
    while (api__pb_next(&c, &f)) {
        char *dst = f.number == 1 ? name : f.number == 2 ? version : NULL;
        size_t cap = f.number == 1 ? name_cap : version_cap;
        if (dst && f.type == 2) {
            size_t n = f.len < cap - 1 ? f.len : cap - 1;
            memcpy(dst, f.data, n);
            dst[n] = '\0';
        }
    }
    return !c.bad;
}

static void bool_reply(api_reply *reply, const ProtobufCMessageDescriptor *d)
{
    ProtobufCMessage *msg = malloc(d->sizeof_message);
    if (!msg) {
        api_grpc_error(reply, 503, API_REASON_MEMORY, "out of memory");
        return;
    }
    d->message_init(msg);
    *(protobuf_c_boolean *)MEMBER(msg, d->fields[0].offset) = 1;
    api__grpc_reply_pack(reply, msg);
    free(msg);
}

static void repository_index(const api_call *call, api_reply *reply)
{
    Inference__RepositoryIndexResponse resp = INFERENCE__REPOSITORY_INDEX_RESPONSE__INIT;
    size_t n = 1 + (call->models ? api_models_count(call->models) : 0);
    Inference__RepositoryIndexResponse__ModelIndex *index = calloc(n, sizeof *index);
    Inference__RepositoryIndexResponse__ModelIndex **ptrs = calloc(n, sizeof *ptrs);
    if (!index || !ptrs) {
        api_grpc_error(reply, 503, API_REASON_MEMORY, "out of memory");
    } else {
        for (size_t i = 0; i < n; i++) {
            inference__repository_index_response__model_index__init(&index[i]);
            index[i].name = (char *)(i == 0 ? "sdpa" : api_models_at(call->models, i - 1)->name);
            index[i].version = (char *)API_V2_VERSION;
            index[i].state = (char *)"READY";
            ptrs[i] = &index[i];
        }
        resp.n_models = n;
        resp.models = ptrs;
        api__grpc_reply_pack(reply, &resp.base);
    }
    free(index);
    free(ptrs);
}

/* grpc.health.v1's HealthCheckResponse {status: SERVING (1) or NOT_SERVING (2)}, written by
 * hand: the health service's proto is not compiled in for one enum field. */
static void health_check(bool ready, api_reply *reply)
{
    reply->body = eng_buf_alloc(2);
    if (!reply->body) {
        api_grpc_error(reply, 503, API_REASON_MEMORY, "out of memory");
        return;
    }
    reply->body[0] = 0x08; /* field 1, varint */
    reply->body[1] = ready ? 1 : 2;
    reply->body_len = 2;
    reply->status = 200;
    reply->content_type = API_GRPC_MESSAGE_TYPE;
}

static void server_metadata(api_reply *reply)
{
    Inference__ServerMetadataResponse resp = INFERENCE__SERVER_METADATA_RESPONSE__INIT;
    resp.name = (char *)API__V2_SERVER_NAME;
    resp.version = (char *)API__V2_SERVER_VERSION;
    resp.n_extensions = api__v2_n_extensions;
    resp.extensions = (char **)(uintptr_t)api__v2_extensions;
    api__grpc_reply_pack(reply, &resp.base);
}

/* n of a model's tensors as TensorMetadata in t[], pointed at by ptrs[]. */
static void tensor_metadata(const tensor_desc *d, int n,
                            Inference__ModelMetadataResponse__TensorMetadata *t,
                            Inference__ModelMetadataResponse__TensorMetadata **ptrs)
{
    for (int i = 0; i < n; i++) {
        inference__model_metadata_response__tensor_metadata__init(&t[i]);
        t[i].name = (char *)d[i].name;
        t[i].datatype = (char *)d[i].datatype;
        t[i].n_shape = (size_t)d[i].rank;
        t[i].shape = (int64_t *)(uintptr_t)d[i].dims;
        ptrs[i] = &t[i];
    }
}

/* GET /v2/models/{m}'s name, versions, platform and tensors (a decoder layer's parameters have
 * no field in the message). */
static void model_metadata(const model_ref *m, api_reply *reply)
{
    Inference__ModelMetadataResponse resp = INFERENCE__MODEL_METADATA_RESPONSE__INIT;
    Inference__ModelMetadataResponse__TensorMetadata in[MAX_TENSORS], out[MAX_TENSORS];
    Inference__ModelMetadataResponse__TensorMetadata *in_ptrs[MAX_TENSORS], *out_ptrs[MAX_TENSORS];
    char *versions[1] = {(char *)API_V2_VERSION};
    model_desc d = api__v2_model_desc(m);
    tensor_metadata(d.in, d.n_in, in, in_ptrs);
    tensor_metadata(d.out, d.n_out, out, out_ptrs);
    resp.name = (char *)m->name;
    resp.n_versions = 1;
    resp.versions = versions;
    resp.platform = (char *)d.platform;
    resp.n_inputs = (size_t)d.n_in;
    resp.inputs = in_ptrs;
    resp.n_outputs = (size_t)d.n_out;
    resp.outputs = out_ptrs;
    api__grpc_reply_pack(reply, &resp.base);
}

void api_grpc_unary(api_grpc_method method, bool ready, const api_call *call, api_reply *reply)
{
    char name[128], version[32];
    api_call c = *call;
    memset(reply, 0, sizeof *reply);
    if (!model_of(call, name, sizeof name, version, sizeof version)) {
        api_grpc_error(reply, 400, API_REASON_BAD_REQUEST, "malformed request message");
        return;
    }
    c.model = name;
    c.version = version[0] ? version : NULL;
    switch (method) {
    case API_GRPC_SERVER_LIVE:
        bool_reply(reply, &inference__server_live_response__descriptor);
        return;
    case API_GRPC_SERVER_READY:
        if (ready)
            bool_reply(reply, &inference__server_ready_response__descriptor);
        else
            api_grpc_error(reply, 503, API_REASON_DRAINING, "draining");
        return;
    case API_GRPC_MODEL_READY:
    case API_GRPC_MODEL_METADATA: {
        /* Every model attnd knows is ready: the lookup is the answer. */
        model_ref m;
        api__error err = {0};
        if (api__v2_model_lookup(call->models, c.model, c.version, &m, &err) != 0)
            api__reply_from_error(reply, API_ERRORS_GRPC, &err);
        else if (method == API_GRPC_MODEL_READY)
            bool_reply(reply, &inference__model_ready_response__descriptor);
        else
            model_metadata(&m, reply);
        return;
    }
    case API_GRPC_SERVER_METADATA:
        server_metadata(reply);
        return;
    case API_GRPC_MODEL_CONFIG:
        api_v2_model_config(&c, reply);
        api__grpc_reply_convert(reply, &inference__model_config_response__descriptor, "config");
        return;
    case API_GRPC_REPOSITORY_INDEX:
        repository_index(call, reply);
        return;
    case API_GRPC_HEALTH_CHECK:
        health_check(ready, reply);
        return;
    default:
        api_grpc_error(reply, 501, API_REASON_BAD_REQUEST, "method not implemented by attnd");
        return;
    }
}

static void duration(Inference__StatisticDuration *d, api_stat_duration v)
{
    inference__statistic_duration__init(d);
    d->count = v.count;
    d->ns = v.ns;
}

/* The response's messages for one model, which its pointers reference. */
typedef struct {
    Inference__ModelStatistics m;
    Inference__InferStatistics infer;
    Inference__StatisticDuration d[8];
} model_statistics;

void api_grpc_statistics(const api_model_stats *st, size_t n, api_reply *reply)
{
    Inference__ModelStatisticsResponse resp = INFERENCE__MODEL_STATISTICS_RESPONSE__INIT;
    model_statistics *ms = calloc(n ? n : 1, sizeof *ms);
    Inference__ModelStatistics **ptrs = calloc(n ? n : 1, sizeof *ptrs);
    const api_stat_duration none = {0, 0};
    memset(reply, 0, sizeof *reply);
    if (!ms || !ptrs) {
        free(ms);
        free(ptrs);
        api_grpc_error(reply, 503, API_REASON_MEMORY, "out of memory");
        return;
    }
    for (size_t i = 0; i < n; i++) {
        model_statistics *s = &ms[i];
        const api_stat_duration d[8] = {
            st[i].success,       st[i].fail,           st[i].queue, st[i].compute_input,
            st[i].compute_infer, st[i].compute_output, none,        none};
        inference__model_statistics__init(&s->m);
        inference__infer_statistics__init(&s->infer);
        for (int k = 0; k < 8; k++)
            duration(&s->d[k], d[k]);
        s->infer.success = &s->d[0];
        s->infer.fail = &s->d[1];
        s->infer.queue = &s->d[2];
        s->infer.compute_input = &s->d[3];
        s->infer.compute_infer = &s->d[4];
        s->infer.compute_output = &s->d[5];
        s->infer.cache_hit = &s->d[6];
        s->infer.cache_miss = &s->d[7];
        s->m.name = (char *)st[i].name;
        s->m.version = (char *)API_V2_VERSION;
        s->m.last_inference = st[i].last_inference_ms;
        s->m.inference_count = st[i].inference_count;
        s->m.execution_count = st[i].execution_count;
        s->m.inference_stats = &s->infer;
        ptrs[i] = &s->m;
    }
    resp.n_model_stats = n;
    resp.model_stats = ptrs;
    api__grpc_reply_pack(reply, &resp.base);
    free(ms);
    free(ptrs);
}
