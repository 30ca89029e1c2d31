/*
 * grpc_wire.c - gRPC's framing and the cheap readers of the v2 gRPC protocol: the method table,
 * the status mapping, the length-prefixed message reader, grpc-timeout, and the walk that reads
 * a ModelInferRequest's model, timeout, priority, sequence_id and layer on the I/O thread without
 * decoding its tensors; and the packing of a reply message. Pure functions on bytes (the fuzz
 * harness feeds them anything).
 */
#include <stdio.h>
#include <string.h>

#include "api/api.h"
#include "api/proto/grpc.h"

#define SERVICE "/inference.GRPCInferenceService/"

static const char *const method_names[] = {
    [API_GRPC_UNIMPLEMENTED] = "unimplemented",
    [API_GRPC_SERVER_LIVE] = "ServerLive",
    [API_GRPC_SERVER_READY] = "ServerReady",
    [API_GRPC_MODEL_READY] = "ModelReady",
    [API_GRPC_SERVER_METADATA] = "ServerMetadata",
    [API_GRPC_MODEL_METADATA] = "ModelMetadata",
    [API_GRPC_MODEL_INFER] = "ModelInfer",
    [API_GRPC_MODEL_STREAM_INFER] = "ModelStreamInfer",
    [API_GRPC_MODEL_CONFIG] = "ModelConfig",
    [API_GRPC_MODEL_STATISTICS] = "ModelStatistics",
    [API_GRPC_REPOSITORY_INDEX] = "RepositoryIndex",
    [API_GRPC_HEALTH_CHECK] = "HealthCheck",
};

#define HEALTH_CHECK "/grpc.health.v1.Health/Check"

#define N_METHODS (sizeof method_names / sizeof method_names[0])

api_grpc_method api_grpc_method_of(const char *path, size_t n)
{
    const size_t prefix = sizeof SERVICE - 1;
    if (path && n == sizeof HEALTH_CHECK - 1 && memcmp(path, HEALTH_CHECK, n) == 0)
        return API_GRPC_HEALTH_CHECK;
    if (!path || n <= prefix || memcmp(path, SERVICE, prefix) != 0)
        return API_GRPC_UNIMPLEMENTED;
    for (size_t m = 1; m < API_GRPC_HEALTH_CHECK; m++) {
        size_t len = strlen(method_names[m]);
        if (n - prefix == len && memcmp(path + prefix, method_names[m], len) == 0)
            return (api_grpc_method)m;
    }
    return API_GRPC_UNIMPLEMENTED;
}

const char *api_grpc_method_name(api_grpc_method method)
{
    return (size_t)method < N_METHODS ? method_names[method] : method_names[0];
}

api_grpc_code api_grpc_code_of(int http_status)
{
    switch (http_status) {
    case 200:
        return API_GRPC_OK;
    case 400:
    case 415:
        return API_GRPC_INVALID_ARGUMENT;
    case 401:
        return API_GRPC_UNAUTHENTICATED;
    case 403:
        return API_GRPC_PERMISSION_DENIED;
    case 404:
        return API_GRPC_NOT_FOUND;
    case 408:
    case 504:
        return API_GRPC_DEADLINE_EXCEEDED;
    case 409:
        return API_GRPC_FAILED_PRECONDITION;
    case 413:
    case 429:
        return API_GRPC_RESOURCE_EXHAUSTED;
    case API_STATUS_CLIENT_CLOSED:
        return API_GRPC_CANCELLED;
    case 501:
        return API_GRPC_CODE_UNIMPLEMENTED;
    case 503:
        return API_GRPC_UNAVAILABLE;
    default:
        return API_GRPC_INTERNAL;
    }
}

void api_grpc_error(api_reply *reply, int http_status, api_reason reason, const char *msg)
{
    size_t n = strlen(msg);
    api_reply_free(reply);
    reply->status = http_status;
    reply->reason = reason;
    reply->content_type = API_GRPC_ERROR_TYPE;
    reply->body = eng_buf_alloc(n + 1);
    reply->body_len = reply->body ? n : 0;
    if (reply->body)
        memcpy(reply->body, msg, n + 1);
}

/* ---- Length-prefixed messages ------------------------------------------------------------- */

void api_grpc_reader_init(api_grpc_reader *r)
{
    memset(r, 0, sizeof *r);
    api_buf_init(&r->msg, 0);
}

static api_grpc_read_result read_error(api_reply *reply, int status, api_reason reason,
                                       const char *msg)
{
    api_grpc_error(reply, status, reason, msg);
    return API_GRPC_READ_ERROR;
}

/* The 5-byte prefix is complete: check the flag and the length, and size the buffer. */
static api_grpc_read_result prefix_done(api_grpc_reader *r, size_t max_message, api_reply *reply)
{
    char msg[160];
    if (r->prefix[0] != 0)
        return read_error(reply, 501, API_REASON_BAD_REQUEST,
                          "compressed message: attnd offers no grpc-encoding");
    r->length = (size_t)r->prefix[1] << 24 | (size_t)r->prefix[2] << 16 |
                (size_t)r->prefix[3] << 8 | r->prefix[4];
    if (r->length > max_message) {
        snprintf(msg, sizeof msg, "message of %zu bytes is above --max-body-bytes %zu", r->length,
                 max_message);
        return read_error(reply, 413, API_REASON_TOO_LARGE, msg);
    }
    api_buf_free(&r->msg);
    api_buf_init(&r->msg, r->length + 1); /* + the NUL api_buf_take adds */
    return API_GRPC_READ_MORE;
}

/* Appends n bytes of the message, reserving them first. */
static api_grpc_read_result append(api_grpc_reader *r, const unsigned char *data, size_t n,
                                   api_lease *lease, api_reply *reply)
{
    char msg[160];
    api_budget_result b = api_lease_reserve(lease, n);
    if (b != API_BUDGET_OK) {
        snprintf(msg, sizeof msg,
                 "memory budget (--max-memory-bytes) has no room for the %zu-byte message",
                 r->length);
        return read_error(reply, b == API_BUDGET_NEVER ? 413 : 429, API_REASON_MEMORY, msg);
    }
    r->held += n;
    api_buf_mem(&r->msg, data, n);
    if (r->msg.state != API_BUF_OK)
        return read_error(reply, 503, API_REASON_MEMORY, "out of memory reading a message");
    return API_GRPC_READ_MORE;
}

api_grpc_read_result api_grpc_read(api_grpc_reader *r, const unsigned char *data, size_t len,
                                   size_t max_message, api_lease *lease, size_t *used,
                                   api_reply *reply)
{
    size_t pos = 0;
    *used = 0;
    while (r->prefix_len < 5 && pos < len) {
        r->prefix[r->prefix_len++] = data[pos++];
        if (r->prefix_len == 5 && prefix_done(r, max_message, reply) != API_GRPC_READ_MORE) {
            *used = pos;
            return API_GRPC_READ_ERROR;
        }
    }
    if (r->prefix_len < 5) {
        *used = pos;
        return API_GRPC_READ_MORE;
    }
    size_t n = r->length - r->msg.len;
    if (n > len - pos)
        n = len - pos;
    if (n > 0 && append(r, data + pos, n, lease, reply) != API_GRPC_READ_MORE) {
        *used = pos + n;
        return API_GRPC_READ_ERROR;
    }
    *used = pos + n;
    return r->msg.len == r->length ? API_GRPC_READ_MESSAGE : API_GRPC_READ_MORE;
}

char *api_grpc_reader_take(api_grpc_reader *r, size_t *len, size_t *held)
{
    char *msg;
    if (r->length == 0) {
        msg = eng_buf_alloc(1); /* an empty message still has an address */
        *len = 0;
    } else {
        msg = api_buf_take(&r->msg, len);
    }
    *held = r->held;
    api_buf_free(&r->msg);
    api_grpc_reader_init(r);
    return msg;
}

void api_grpc_reader_free(api_grpc_reader *r, api_lease *lease)
{
    api_buf_free(&r->msg);
    api_lease_give_back(lease, r->held);
    api_grpc_reader_init(r);
}

int64_t api_grpc_timeout_ms(const char *value)
{
    int64_t n = 0;
    size_t digits = 0;
    if (!value)
        return -1;
    while (value[digits] >= '0' && value[digits] <= '9') {
        n = n * 10 + (value[digits] - '0');
        if (++digits > 8)
            return -1;
    }
    if (digits == 0 || value[digits] == '\0' || value[digits + 1] != '\0')
        return -1;
    switch (value[digits]) {
    case 'H':
        return n * 3600000;
    case 'M':
        return n * 60000;
    case 'S':
        return n * 1000;
    case 'm':
        return n;
    case 'u':
        return (n + 999) / 1000;
    case 'n':
        return (n + 999999) / 1000000;
    default:
        return -1;
    }
}

/* ---- Protobuf's wire format, top level only ------------------------------------------------ */

/* A base-128 varint at the cursor into *out; false when the bytes end inside one or it passes
 * 64 bits. */
static bool pb_varint(api__pb_cursor *c, uint64_t *out)
{
    uint64_t v = 0;
    for (unsigned shift = 0; shift < 64 && c->pos < c->len; shift += 7) {
        unsigned char b = (unsigned char)c->data[c->pos++];
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = v;
            return true;
        }
    }
    return false;
}

bool api__pb_next(api__pb_cursor *c, api__pb_field *f)
{
    uint64_t key;
    if (c->pos >= c->len)
        return false;
    if (!pb_varint(c, &key) || key >> 3 == 0 || key >> 3 > UINT32_MAX) {
        c->bad = true;
        return false;
    }
    f->number = (uint32_t)(key >> 3);
    f->type = (int)(key & 7);
    f->data = NULL;
    f->len = 0;
    f->value = 0;
    switch (f->type) {
    case 0:
        if (!pb_varint(c, &f->value))
            break;
        return true;
    case 1:
    case 5: {
        size_t n = f->type == 1 ? 8 : 4;
        if (c->len - c->pos < n)
            break;
        f->data = c->data + c->pos;
        f->len = n;
        for (size_t i = 0; i < n; i++)
            f->value |= (uint64_t)(unsigned char)c->data[c->pos + i] << (8 * i);
        c->pos += n;
        return true;
    }
    case 2: {
        uint64_t n;
        if (!pb_varint(c, &n) || n > c->len - c->pos)
            break;
        f->data = c->data + c->pos;
        f->len = (size_t)n;
        c->pos += (size_t)n;
        return true;
    }
    default:
        break;
    }
    c->bad = true;
    return false;
}

/* Copies a string field into `out` (NUL-terminated, truncated to fit). */
static void copy_text(const api__pb_field *f, char *out, size_t cap)
{
    size_t n = f->len < cap - 1 ? f->len : cap - 1;
    memcpy(out, f->data, n);
    out[n] = '\0';
}

/* One InferParameter's value as an integer (int64, uint64 or a bool); false for others. */
static bool param_int(const char *data, size_t len, int64_t *out, const api__pb_field **str,
                      api__pb_field *str_field)
{
    api__pb_cursor c = {.data = data, .len = len};
    api__pb_field f;
    bool found = false;
    while (api__pb_next(&c, &f)) {
        if (f.type == 0 && (f.number == 1 || f.number == 2 || f.number == 5)) {
            *out = (int64_t)f.value;
            found = true;
        } else if (f.type == 2 && f.number == 3 && str) {
            *str_field = f;
            *str = str_field;
        }
    }
    return found && !c.bad;
}

/* A parameters map entry: the ones that order, bound or group the request. */
static void peek_param(const char *data, size_t len, api_grpc_infer_peek *out)
{
    api__pb_cursor c = {.data = data, .len = len};
    api__pb_field f, key = {0}, value = {0}, str_field;
    const api__pb_field *str = NULL;
    int64_t v = 0;
    while (api__pb_next(&c, &f)) {
        if (f.type == 2 && f.number == 1)
            key = f;
        else if (f.type == 2 && f.number == 2)
            value = f;
    }
    if (!key.data || c.bad)
        return;
    bool is_int = param_int(value.data, value.len, &v, &str, &str_field);
    if (key.len == 7 && memcmp(key.data, "timeout", 7) == 0 && is_int && v > 0)
        out->peek.timeout_ms = (v + 999) / 1000;
    else if (key.len == 10 && memcmp(key.data, "timeout_ms", 10) == 0 && is_int && v > 0)
        out->peek.timeout_ms = v;
    else if (key.len == 8 && memcmp(key.data, "priority", 8) == 0 && is_int && v > 0)
        out->peek.priority = (uint64_t)v;
    else if (key.len == 5 && memcmp(key.data, "layer", 5) == 0 && is_int && v > 0 && v <= INT32_MAX)
        out->peek.layer = v;
    else if (key.len == 11 && memcmp(key.data, "sequence_id", 11) == 0) {
        if (is_int && v != 0) {
            snprintf(out->sequence_digits, sizeof out->sequence_digits, "%lld", (long long)v);
            out->peek.sequence_id = out->sequence_digits;
            out->peek.sequence_id_len = strlen(out->sequence_digits);
        } else if (str && str->len > 0) {
            out->peek.sequence_id = str->data;
            out->peek.sequence_id_len = str->len;
        }
    }
}

bool api_grpc_infer_peek_read(const char *msg, size_t len, api_grpc_infer_peek *out)
{
    api__pb_cursor c = {.data = msg, .len = len};
    api__pb_field f;
    memset(out, 0, sizeof *out);
    while (api__pb_next(&c, &f)) {
        if (f.type != 2)
            continue;
        if (f.number == 1)
            copy_text(&f, out->model, sizeof out->model);
        else if (f.number == 2)
            copy_text(&f, out->version, sizeof out->version);
        else if (f.number == 4)
            peek_param(f.data, f.len, out);
    }
    return !c.bad;
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
