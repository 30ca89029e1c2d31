/*
 * grpc_json.c - the cheap methods of the v2 gRPC protocol: the same replies as the HTTP routes
 * (api_v2_server_metadata, api_v2_model_metadata, api_v2_model_config, api_v2_model_ready, the
 * statistics JSON), whose JSON already uses the protos' field names, converted into the
 * response messages field by field through protobuf-c's descriptors.
 */
#include <stdlib.h>
#include <string.h>

#include "api/proto/grpc.h"
#include "grpc_service.pb-c.h"

#define MEMBER(msg, offset) ((char *)(msg) + (offset))

static size_t elem_size(ProtobufCType type)
{
    switch (type) {
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_DOUBLE:
        return 8;
    case PROTOBUF_C_TYPE_STRING:
    case PROTOBUF_C_TYPE_MESSAGE:
        return sizeof(void *);
    case PROTOBUF_C_TYPE_BYTES:
        return sizeof(ProtobufCBinaryData);
    default:
        return 4; /* 32-bit numbers, enums, protobuf_c_boolean */
    }
}

static char *dup_text(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

static bool set_message(const ProtobufCMessageDescriptor *d, void **slot, const json_t *v);

/* One scalar, string or message value of field f from v into `dst` (elem_size bytes). */
static bool set_value(const ProtobufCFieldDescriptor *f, void *dst, const json_t *v)
{
    double x = json_is_real(v) ? json_real_value(v) : (double)json_integer_value(v);
    int64_t i = json_is_integer(v) ? (int64_t)json_integer_value(v) : (int64_t)x;
    switch (f->type) {
    case PROTOBUF_C_TYPE_BOOL:
        *(protobuf_c_boolean *)dst = json_is_true(v);
        return json_is_boolean(v);
    case PROTOBUF_C_TYPE_STRING:
        if (!json_is_string(v))
            return false;
        *(char **)dst = dup_text(json_string_value(v), json_string_length(v));
        return *(char **)dst != NULL;
    case PROTOBUF_C_TYPE_ENUM: {
        const ProtobufCEnumValue *e =
            json_is_string(v)
                ? protobuf_c_enum_descriptor_get_value_by_name(f->descriptor, json_string_value(v))
                : NULL;
        *(int32_t *)dst = e ? e->value : (int32_t)i;
        return e || json_is_integer(v);
    }
    case PROTOBUF_C_TYPE_MESSAGE:
        return set_message(f->descriptor, dst, v);
    case PROTOBUF_C_TYPE_FLOAT:
        *(float *)dst = (float)x;
        return json_is_number(v);
    case PROTOBUF_C_TYPE_DOUBLE:
        *(double *)dst = x;
        return json_is_number(v);
    case PROTOBUF_C_TYPE_BYTES:
        return false;
    default:
        if (!json_is_number(v))
            return false;
        if (elem_size(f->type) == 8)
            *(int64_t *)dst = i;
        else
            *(int32_t *)dst = (int32_t)i;
        return true;
    }
}

/* A map field from a JSON object: its entries are messages {key: 1, value: 2}. */
static bool set_map(const ProtobufCFieldDescriptor *f, void *msg, const json_t *obj)
{
    const ProtobufCMessageDescriptor *ed = f->descriptor;
    size_t n = json_object_size(obj), k = 0;
    void **arr = n ? calloc(n, sizeof *arr) : NULL;
    const char *key;
    const json_t *val;
    if (n && !arr)
        return false;
    *(void ***)MEMBER(msg, f->offset) = arr;
    json_object_foreach((json_t *)obj, key, val)
    {
        json_t *entry = json_pack("{s:s,s:O}", "key", key, "value", val);
        bool ok = entry && set_message(ed, &arr[k], entry);
        json_decref(entry);
        if (!ok)
            break;
        k++;
    }
    *(size_t *)MEMBER(msg, f->quantifier_offset) = k;
    return k == n;
}

static bool set_repeated(const ProtobufCFieldDescriptor *f, void *msg, const json_t *v)
{
    size_t n = json_array_size(v), k = 0, size = elem_size(f->type);
    char *arr;
    const ProtobufCMessageDescriptor *md = f->descriptor;
    if (f->type == PROTOBUF_C_TYPE_MESSAGE && json_is_object(v) && md->n_fields == 2 &&
        strcmp(md->fields[0].name, "key") == 0)
        return set_map(f, msg, v);
    if (!json_is_array(v))
        return false;
    arr = n ? calloc(n, size) : NULL;
    if (n && !arr)
        return false;
    *(char **)MEMBER(msg, f->offset) = arr;
    for (; k < n; k++)
        if (!set_value(f, arr + k * size, json_array_get(v, k)))
            break;
    *(size_t *)MEMBER(msg, f->quantifier_offset) = k;
    return k == n;
}

static bool set_field(const ProtobufCFieldDescriptor *f, void *msg, const json_t *v)
{
    if (f->label == PROTOBUF_C_LABEL_REPEATED)
        return set_repeated(f, msg, v);
    if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
        /* Members of a oneof share their storage: the first one given is kept (Triton's JSON
         * may hold two, dynamic_batching and sequence_batching, where protobuf has room for
         * one). */
        uint32_t *which = (uint32_t *)MEMBER(msg, f->quantifier_offset);
        if (*which != 0 && *which != f->id)
            return true;
        *which = f->id;
    } else if (f->label == PROTOBUF_C_LABEL_OPTIONAL && f->quantifier_offset)
        *(protobuf_c_boolean *)MEMBER(msg, f->quantifier_offset) = 1;
    return set_value(f, MEMBER(msg, f->offset), v);
}

bool api__grpc_from_json(ProtobufCMessage *msg, const json_t *obj)
{
    const char *key;
    const json_t *v;
    bool ok = true;
    json_object_foreach((json_t *)obj, key, v)
    {
        const ProtobufCFieldDescriptor *f =
            protobuf_c_message_descriptor_get_field_by_name(msg->descriptor, key);
        if (f && !json_is_null(v) && !set_field(f, msg, v))
            ok = false;
    }
    return ok;
}

/* A nested message: allocated, initialised and filled (a NULL slot when it cannot be). */
static bool set_message(const ProtobufCMessageDescriptor *d, void **slot, const json_t *v)
{
    ProtobufCMessage *m;
    if (!json_is_object(v))
        return false;
    m = malloc(d->sizeof_message);
    *slot = m;
    if (!m)
        return false;
    d->message_init(m);
    return api__grpc_from_json(m, v);
}

void api__grpc_reply_pack(api_reply *reply, const ProtobufCMessage *msg)
{
    size_t n = protobuf_c_message_get_packed_size(msg);
    api_reply_free(reply);
    reply->body = eng_buf_alloc(n ? n : 1);
    if (!reply->body) {
        api_grpc_error(reply, 503, API_REASON_MEMORY, "out of memory");
        return;
    }
    reply->body_len = protobuf_c_message_pack(msg, (uint8_t *)reply->body);
    reply->status = 200;
    reply->reason = API_REASON_NONE;
    reply->content_type = API_GRPC_MESSAGE_TYPE;
}

void api__grpc_reply_from_json_error(api_reply *reply)
{
    json_t *root = json_loadb(reply->body ? reply->body : "", reply->body_len, 0, NULL);
    const json_t *e = json_object_get(root, "error");
    const json_t *m = json_is_object(e) ? json_object_get(e, "message") : e;
    api_grpc_error(reply, reply->status, reply->reason,
                   json_is_string(m) ? json_string_value(m) : "request failed");
    json_decref(root);
}

/* Turns a JSON reply of an HTTP route into the response message of descriptor d, built from
 * the object `pick` names in it (NULL: the whole reply) or the whole reply under `wrap` (a
 * field of the response holding it). */
static void reply_convert(api_reply *reply, const ProtobufCMessageDescriptor *d, const char *wrap)
{
    json_t *root, *obj;
    ProtobufCMessage *msg;
    if (reply->status != 200) {
        api__grpc_reply_from_json_error(reply);
        return;
    }
    root = json_loadb(reply->body, reply->body_len, 0, NULL);
    obj = wrap && root ? json_pack("{s:O}", wrap, root) : json_incref(root);
    msg = malloc(d->sizeof_message);
    if (msg)
        d->message_init(msg);
    if (!root || !obj || !msg || !api__grpc_from_json(msg, obj))
        api_grpc_error(reply, 500, API_REASON_INTERNAL, "cannot convert the reply to protobuf");
    else
        api__grpc_reply_pack(reply, msg);
    if (msg)
        protobuf_c_message_free_unpacked(msg, NULL);
    json_decref(obj);
    json_decref(root);
}

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
        api_v2_model_ready(&c, reply);
        if (reply->status == 200)
            bool_reply(reply, &inference__model_ready_response__descriptor);
        else
            api__grpc_reply_from_json_error(reply);
        return;
    case API_GRPC_SERVER_METADATA:
        api_v2_server_metadata(reply);
        reply_convert(reply, &inference__server_metadata_response__descriptor, NULL);
        return;
    case API_GRPC_MODEL_METADATA:
        api_v2_model_metadata(&c, reply);
        reply_convert(reply, &inference__model_metadata_response__descriptor, NULL);
        return;
    case API_GRPC_MODEL_CONFIG:
        api_v2_model_config(&c, reply);
        reply_convert(reply, &inference__model_config_response__descriptor, "config");
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

void api_grpc_statistics(const char *stats_json, size_t len, api_reply *reply)
{
    memset(reply, 0, sizeof *reply);
    reply->body = eng_buf_alloc(len + 1);
    if (!reply->body) {
        api_grpc_error(reply, 503, API_REASON_MEMORY, "out of memory");
        return;
    }
    memcpy(reply->body, stats_json, len);
    reply->body_len = len;
    reply->status = 200;
    reply_convert(reply, &inference__model_statistics_response__descriptor, NULL);
}
