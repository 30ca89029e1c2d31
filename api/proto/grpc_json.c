/*
 * grpc_json.c - ModelConfig's response: the reply of GET /v2/models/{m}/config
 * (api_v2_model_config), whose JSON already uses the protos' field names, converted into the
 * message field by field through protobuf-c's descriptors. Triton's model configuration is a
 * large nested message of which attnd fills a few fields; one generic converter keeps that JSON
 * the only place they are written.
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

/* Fills `msg` (initialised, of descriptor d) from the JSON object `obj`: each key that names a
 * field of the message (its proto name) is converted by the field's type (numbers, bools,
 * strings, enums by name, nested messages, repeated fields, maps from objects); others are
 * skipped. Allocates with malloc: protobuf_c_message_free_unpacked(msg, NULL) frees it. False
 * when memory ran out or a value does not fit its field. */
static bool from_json(ProtobufCMessage *msg, const json_t *obj)
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
    return from_json(m, v);
}

/* The message of an error reply of the JSON routes ({"error": "..."}) as the plain text of a
 * gRPC error reply, status kept. */
static void reply_from_json_error(api_reply *reply)
{
    json_t *root = json_loadb(reply->body ? reply->body : "", reply->body_len, 0, NULL);
    const json_t *e = json_object_get(root, "error");
    const json_t *m = json_is_object(e) ? json_object_get(e, "message") : e;
    api_grpc_error(reply, reply->status, reply->reason,
                   json_is_string(m) ? json_string_value(m) : "request failed");
    json_decref(root);
}

void api__grpc_reply_convert(api_reply *reply, const ProtobufCMessageDescriptor *d,
                             const char *wrap)
{
    json_t *root, *obj;
    ProtobufCMessage *msg;
    if (reply->status != 200) {
        reply_from_json_error(reply);
        return;
    }
    root = json_loadb(reply->body, reply->body_len, 0, NULL);
    obj = wrap && root ? json_pack("{s:O}", wrap, root) : json_incref(root);
    msg = malloc(d->sizeof_message);
    if (msg)
        d->message_init(msg);
    if (!root || !obj || !msg || !from_json(msg, obj))
        api_grpc_error(reply, 500, API_REASON_INTERNAL, "cannot convert the reply to protobuf");
    else
        api__grpc_reply_pack(reply, msg);
    if (msg)
        protobuf_c_message_free_unpacked(msg, NULL);
    json_decref(obj);
    json_decref(root);
}
