/*
 * test_grpc_wire.c - gRPC's framing and cheap readers in api/ (grpc_wire.c): the
 * length-prefixed message reader fed byte by byte and in one piece, its refusals (too large
 * from the prefix alone, compressed, no room in the budget), grpc-timeout, the method table,
 * the status mapping and the peek of a ModelInferRequest.
 */
#include <string.h>

#include "api/api.h"
#include "tests/support/check.h"

/* Two messages, "abc" and "", then three bytes of a third's prefix. */
static const unsigned char stream[] = {0, 0, 0, 0, 3, 'a', 'b', 'c', 0, 0, 0, 0, 0, 0, 0, 0};

static void test_reader_byte_by_byte_and_whole(void)
{
    api_budget *budget = api_budget_new(1 << 20);
    for (size_t piece = 1; piece <= sizeof stream; piece += sizeof stream - 1) {
        api_grpc_reader r;
        api_lease lease;
        api_reply err = {0};
        size_t off = 0, got = 0, lens[2] = {9, 9};
        char first[4] = "";
        api_lease_start(&lease, budget, 0, 0);
        api_grpc_reader_init(&r);
        while (off < sizeof stream) {
            size_t n = sizeof stream - off < piece ? sizeof stream - off : piece, used = 0;
            api_grpc_read_result res = api_grpc_read(&r, stream + off, n, 100, &lease, &used, &err);
            CHECK(res != API_GRPC_READ_ERROR);
            off += used;
            if (res == API_GRPC_READ_MESSAGE) {
                size_t len, held;
                char *msg = api_grpc_reader_take(&r, &len, &held);
                CHECK(msg != NULL && got < 2);
                if (got == 0 && len == 3)
                    memcpy(first, msg, 3);
                if (got < 2)
                    lens[got] = len;
                got++;
                eng_buf_free(msg);
                api_lease_give_back(&lease, held);
            }
        }
        CHECK_EQ_INT((long)got, 2);
        CHECK_EQ_INT((long)lens[0], 3);
        CHECK_EQ_INT((long)lens[1], 0);
        CHECK(memcmp(first, "abc", 3) == 0);
        CHECK_EQ_INT((long)r.prefix_len, 3); /* the third message's prefix so far */
        api_grpc_reader_free(&r, &lease);
        api_lease_end(&lease);
        CHECK_EQ_INT((long)api_budget_in_use(budget), 0);
    }
    api_budget_free(budget);
}

static void test_reader_refusals(void)
{
    api_budget *budget = api_budget_new(64);
    api_grpc_reader r;
    api_lease lease;
    api_reply err = {0};
    size_t used;
    /* 2 GiB declared: refused from the prefix, nothing reserved. */
    static const unsigned char huge[] = {0, 0x80, 0, 0, 0};
    api_lease_start(&lease, budget, 0, 0);
    api_grpc_reader_init(&r);
    CHECK_EQ_INT(api_grpc_read(&r, huge, 5, 1000, &lease, &used, &err), API_GRPC_READ_ERROR);
    CHECK_EQ_INT(err.status, 413);
    CHECK(err.body && strstr(err.body, "--max-body-bytes") != NULL);
    CHECK_EQ_INT((long)api_budget_in_use(budget), 0);
    api_reply_free(&err);
    api_grpc_reader_free(&r, &lease);

    /* A length under the limit reserves only the bytes that came: 100 declared, 3 sent. */
    static const unsigned char partial[] = {0, 0, 0, 0, 100, 1, 2, 3};
    CHECK_EQ_INT(api_grpc_read(&r, partial, sizeof partial, 1000, &lease, &used, &err),
                 API_GRPC_READ_MORE);
    CHECK_EQ_INT((long)api_budget_in_use(budget), 3);
    /* ... and past the budget (64 bytes) it is refused: 413, it could never fit. */
    static unsigned char rest[97];
    CHECK_EQ_INT(api_grpc_read(&r, rest, sizeof rest, 1000, &lease, &used, &err),
                 API_GRPC_READ_ERROR);
    CHECK_EQ_INT(err.status, 413);
    CHECK_EQ_INT(api_grpc_code_of(err.status), API_GRPC_RESOURCE_EXHAUSTED);
    api_reply_free(&err);
    api_grpc_reader_free(&r, &lease);
    CHECK_EQ_INT((long)api_budget_in_use(budget), 0);

    static const unsigned char compressed[] = {1, 0, 0, 0, 1, 'x'};
    CHECK_EQ_INT(api_grpc_read(&r, compressed, sizeof compressed, 1000, &lease, &used, &err),
                 API_GRPC_READ_ERROR);
    CHECK_EQ_INT(api_grpc_code_of(err.status), API_GRPC_CODE_UNIMPLEMENTED);
    api_reply_free(&err);
    api_grpc_reader_free(&r, &lease);
    api_lease_end(&lease);
    api_budget_free(budget);
}

static void test_timeout_header(void)
{
    CHECK_EQ_INT(api_grpc_timeout_ms("1S"), 1000);
    CHECK_EQ_INT(api_grpc_timeout_ms("2M"), 120000);
    CHECK_EQ_INT(api_grpc_timeout_ms("1H"), 3600000);
    CHECK_EQ_INT(api_grpc_timeout_ms("250m"), 250);
    CHECK_EQ_INT(api_grpc_timeout_ms("1500u"), 2); /* rounded up */
    CHECK_EQ_INT(api_grpc_timeout_ms("1n"), 1);
    CHECK_EQ_INT(api_grpc_timeout_ms("123456789S"), -1); /* nine digits */
    CHECK_EQ_INT(api_grpc_timeout_ms("S"), -1);
    CHECK_EQ_INT(api_grpc_timeout_ms("10x"), -1);
    CHECK_EQ_INT(api_grpc_timeout_ms("10mm"), -1);
    CHECK_EQ_INT(api_grpc_timeout_ms(NULL), -1);
}

static void test_methods_and_codes(void)
{
    const char *p = "/inference.GRPCInferenceService/ModelInfer";
    CHECK_EQ_INT(api_grpc_method_of(p, strlen(p)), API_GRPC_MODEL_INFER);
    CHECK_EQ_INT(api_grpc_method_of(p, strlen(p) - 1), API_GRPC_UNIMPLEMENTED);
    p = "/inference.GRPCInferenceService/ModelStreamInfer";
    CHECK_EQ_INT(api_grpc_method_of(p, strlen(p)), API_GRPC_MODEL_STREAM_INFER);
    p = "/inference.GRPCInferenceService/RepositoryModelLoad";
    CHECK_EQ_INT(api_grpc_method_of(p, strlen(p)), API_GRPC_UNIMPLEMENTED);
    CHECK(strcmp(api_grpc_method_name(API_GRPC_REPOSITORY_INDEX), "RepositoryIndex") == 0);
    p = "/grpc.health.v1.Health/Check";
    CHECK_EQ_INT(api_grpc_method_of(p, strlen(p)), API_GRPC_HEALTH_CHECK);
    p = "/grpc.health.v1.Health/Watch";
    CHECK_EQ_INT(api_grpc_method_of(p, strlen(p)), API_GRPC_UNIMPLEMENTED);
    CHECK_EQ_INT(api_grpc_code_of(200), API_GRPC_OK);
    CHECK_EQ_INT(api_grpc_code_of(400), API_GRPC_INVALID_ARGUMENT);
    CHECK_EQ_INT(api_grpc_code_of(401), API_GRPC_UNAUTHENTICATED);
    CHECK_EQ_INT(api_grpc_code_of(404), API_GRPC_NOT_FOUND);
    CHECK_EQ_INT(api_grpc_code_of(429), API_GRPC_RESOURCE_EXHAUSTED);
    CHECK_EQ_INT(api_grpc_code_of(API_STATUS_CLIENT_CLOSED), API_GRPC_CANCELLED);
    CHECK_EQ_INT(api_grpc_code_of(503), API_GRPC_UNAVAILABLE);
    CHECK_EQ_INT(api_grpc_code_of(504), API_GRPC_DEADLINE_EXCEEDED);
    CHECK_EQ_INT(api_grpc_code_of(500), API_GRPC_INTERNAL);
}

/* A ModelInferRequest {model_name: "demo", model_version: "1", parameters: {timeout: 100
 * (us), priority: 2, sequence_id: 77, layer: 3}}, written field by field. */
static void test_infer_peek(void)
{
    static const char msg[] = "\x0a\x04"
                              "demo"
                              "\x12\x01"
                              "1"
                              "\x22\x0d"
                              "\x0a\x07"
                              "timeout"
                              "\x12\x02"
                              "\x10\x64"
                              "\x22\x0e"
                              "\x0a\x08"
                              "priority"
                              "\x12\x02"
                              "\x28\x02"
                              "\x22\x11"
                              "\x0a\x0b"
                              "sequence_id"
                              "\x12\x02"
                              "\x10\x4d"
                              "\x22\x0b"
                              "\x0a\x05"
                              "layer"
                              "\x12\x02"
                              "\x10\x03";
    api_grpc_infer_peek pk;
    CHECK(api_grpc_infer_peek_read(msg, sizeof msg - 1, &pk));
    CHECK(strcmp(pk.model, "demo") == 0 && strcmp(pk.version, "1") == 0);
    CHECK_EQ_INT(pk.peek.timeout_ms, 1); /* 100 us, rounded up */
    CHECK_EQ_INT((long)pk.peek.priority, 2);
    CHECK(pk.peek.sequence_id && pk.peek.sequence_id_len == 2 &&
          memcmp(pk.peek.sequence_id, "77", 2) == 0);
    CHECK_EQ_INT(pk.peek.layer, 3);
    /* A length past the end: malformed. */
    CHECK(!api_grpc_infer_peek_read("\x0a\x09"
                                    "demo",
                                    6, &pk));
}

int main(void)
{
    RUN(test_reader_byte_by_byte_and_whole);
    RUN(test_reader_refusals);
    RUN(test_timeout_header);
    RUN(test_methods_and_codes);
    RUN(test_infer_peek);
    return check_report();
}
