/*
 * fuzz_grpc_message.c - libFuzzer harness for the gRPC edge's readers in api/: the
 * length-prefixed message reader (api_grpc_read, fed the input in pieces as DATA frames
 * arrive), the ModelInferRequest peek of the I/O thread (api_grpc_infer_peek_read), the
 * grpc-timeout parser, the method table, and every message read as a request of each method:
 * ModelInfer through api_grpc_infer (unary and stream forms) and the cheap methods through
 * api_grpc_unary (and api_grpc_statistics, on counters read from the bytes).
 *
 * An input is laid out as
 *
 *     byte 0     the size of the pieces the stream is cut into (1 to 256 bytes)
 *     the rest   the bytes of an HTTP/2 stream's DATA: 5-byte prefixes and messages
 *
 * Beyond what the sanitizers catch, the harness aborts on what api/api.h rules out: a read
 * that consumes more than it was given, a 500, a reply that is neither a message (200) nor a
 * plain-text error, and memory left reserved in the budget once the messages are done.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "engine/engine.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define MAX_MESSAGE ((size_t)1 << 20)

static eng_pool *pool;
static api_budget *budget;
static api_models *models;
static api_limits limits;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    eng_error err;
    (void)argc;
    (void)argv;
    pool = eng_pool_new(2, &err);
    budget = api_budget_new((size_t)64 << 20);
    models = api_models_new();
    if (!pool || !budget || !models) {
        fprintf(stderr, "fuzz_grpc_message: set-up failed\n");
        abort();
    }
    limits = api_limits_default();
    limits.max_body_bytes = MAX_MESSAGE;
    limits.max_elements = (size_t)1 << 16;
    limits.max_timeout_ms = 2000;
    return 0;
}

static void check_reply(const api_reply *r)
{
    if (r->status == 500 || r->status == 0 || !r->content_type) {
        fprintf(stderr, "fuzz_grpc_message: status %d, type %s\n", r->status,
                r->content_type ? r->content_type : "(none)");
        abort();
    }
    if (r->status != 200 && strcmp(r->content_type, "text/plain") != 0 &&
        strcmp(r->content_type, "application/grpc") != 0)
        abort();
}

/* One complete message, read as the request of every method. */
static void serve(const char *msg, size_t len)
{
    api_grpc_infer_peek pk;
    api_lease lease;
    api_reply reply;
    api_call call = {
        .body = msg, .body_len = len, .pool = pool, .limits = &limits, .models = models};
    api_grpc_infer_peek_read(msg, len, &pk);
    if (pk.peek.sequence_id && pk.peek.sequence_id_len == 0)
        abort();
    for (int stream = 0; stream < 2; stream++) {
        api_lease_start(&lease, budget, eng_now_ns(), limits.max_timeout_ms);
        call.lease = &lease;
        api_grpc_infer(&call, stream != 0, &reply);
        check_reply(&reply);
        api_reply_free(&reply);
        api_lease_end(&lease);
    }
    /* Once more on a copy the route may move bytes in, as the server's own buffer. */
    char *copy = eng_buf_alloc(len + 1);
    if (copy) {
        api_call moved = call;
        memcpy(copy, msg, len);
        moved.body = copy;
        moved.body_movable = true;
        api_lease_start(&lease, budget, eng_now_ns(), limits.max_timeout_ms);
        moved.lease = &lease;
        api_grpc_infer(&moved, false, &reply);
        check_reply(&reply);
        api_reply_free(&reply);
        api_lease_end(&lease);
        eng_buf_free(copy);
    }
    for (int m = API_GRPC_SERVER_LIVE; m <= API_GRPC_HEALTH_CHECK; m++) {
        if (m == API_GRPC_MODEL_INFER || m == API_GRPC_MODEL_STREAM_INFER ||
            m == API_GRPC_MODEL_STATISTICS)
            continue;
        api_grpc_unary((api_grpc_method)m, true, &call, &reply);
        check_reply(&reply);
        api_reply_free(&reply);
    }
    /* Statistics of counters taken from the message's bytes, for none, one or two models. */
    api_model_stats st[2] = {{.name = "sdpa"}, {.name = "demo"}};
    memcpy(&st[0].last_inference_ms, msg, len < 8 ? len : 8);
    memcpy(&st[1].success, msg, len < sizeof st[1].success ? len : sizeof st[1].success);
    api_grpc_statistics(st, len % 3, &reply);
    if (reply.status != 200)
        abort();
    check_reply(&reply);
    api_reply_free(&reply);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    api_grpc_reader r;
    api_lease lease;
    char text[24];
    if (size < 1)
        return 0;
    size_t piece = (size_t)data[0] + 1;
    data++;
    size--;

    api_grpc_method_of((const char *)data, size);
    memcpy(text, data, size < sizeof text - 1 ? size : sizeof text - 1);
    text[size < sizeof text - 1 ? size : sizeof text - 1] = '\0';
    if (api_grpc_timeout_ms(text) < -1)
        abort();

    api_lease_start(&lease, budget, eng_now_ns(), 0);
    api_grpc_reader_init(&r);
    for (size_t off = 0; off < size;) {
        size_t n = size - off < piece ? size - off : piece, used = 0;
        api_reply err;
        memset(&err, 0, sizeof err);
        api_grpc_read_result res =
            api_grpc_read(&r, data + off, n, MAX_MESSAGE, &lease, &used, &err);
        if (used > n)
            abort();
        off += used;
        if (res == API_GRPC_READ_ERROR) {
            check_reply(&err);
            api_reply_free(&err);
            break;
        }
        if (res == API_GRPC_READ_MESSAGE) {
            size_t len = 0, held = 0;
            char *msg = api_grpc_reader_take(&r, &len, &held);
            if (msg)
                serve(msg, len);
            eng_buf_free(msg);
            api_lease_give_back(&lease, held);
        } else if (used < n) {
            abort(); /* MORE consumes everything it is given */
        }
    }
    api_grpc_reader_free(&r, &lease);
    api_lease_end(&lease);
    if (api_budget_in_use(budget) != 0) {
        fprintf(stderr, "fuzz_grpc_message: %zu bytes left reserved\n", api_budget_in_use(budget));
        abort();
    }
    return 0;
}
