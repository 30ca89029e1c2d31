/*
 * fuzz_v2_infer.c - libFuzzer harness for the KServe v2 inference request (api_v2_infer: the
 * JSON header, Triton's binary tensor section after Inference-Header-Content-Length bytes,
 * validation, the engine call and the reply, JSON or binary), and for the server's timeout peek
 * (api_v2_timeout_peek) on the same request.
 *
 * An input is laid out as
 *
 *     byte 0        flags: bit 0 model "demo" (a layer) instead of "sdpa"; bit 1 Content-Type
 *                   application/octet-stream instead of application/json; bit 2 version "1";
 *                   bit 3 an unknown model
 *     bytes 1..     the Inference-Header-Content-Length value, up to a '\n' (at most 32 bytes;
 *                   an empty line or no '\n' there: no header), passed as the header's text
 *     the rest      the body: JSON, then the binary tensor data
 *
 * so that the fuzzer controls the header as a client does (garbage, negative, past the body).
 * The call must answer with a well-formed reply, never crash, hang, leak or read out of
 * bounds; beyond what the sanitizers catch, the harness aborts on what api/api.h rules out: a
 * 500, an undocumented status, an error body that is not {"error": "message"}, a 200 whose
 * JSON part is not an object with "outputs", and memory left reserved in the budget. Limits
 * are tight so that valid inputs stay cheap. Run by `make fuzz` (long) and `make test` (smoke).
 */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "engine/engine.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define FLAG_DEMO    1u
#define FLAG_BINARY  2u
#define FLAG_VERSION 4u
#define FLAG_UNKNOWN 8u
#define HEADER_MAX   32

static eng_pool *pool;
static api_budget *budget;
static api_models *models;
static api_limits limits;
static bool verbose; /* ATTND_FUZZ_VERBOSE=1: print each reply (to check what seeds reach) */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    eng_error err;
    (void)argc;
    (void)argv;
    pool = eng_pool_new(2, &err);
    budget = api_budget_new((size_t)64 << 20);
    models = api_models_new();
    if (!pool || !budget || !models) {
        fprintf(stderr, "fuzz_v2_infer: set-up failed\n");
        abort();
    }
    limits = api_limits_default();
    limits.max_body_bytes = (size_t)1 << 20;
    limits.max_elements = 4096;
    limits.max_timeout_ms = 250;
    verbose = getenv("ATTND_FUZZ_VERBOSE") != NULL;
    return 0;
}

/* The statuses api/api.h documents for api_v2_infer. */
static bool status_documented(int status)
{
    static const int ok[] = {200, 400, 404, 413, 415, 429, 503, 504}; /* no 422 in v2 */
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        if (status == ok[i])
            return true;
    }
    return false;
}

static void fail(const char *why, const api_reply *r)
{
    fprintf(stderr, "fuzz_v2_infer: %s (status %d, body %.*s)\n", why, r->status,
            (int)(r->body_len < 600 ? r->body_len : 600), r->body ? r->body : "");
    abort();
}

/* A copy of the JSON text[0..len) in which each -Infinity outside a string (how v2 writes an
 * lse of -inf, as Python's json module does) is the string "-inf", so that jansson reads it;
 * NULL when out of memory. */
static char *quote_minus_infinity(const char *text, size_t len, size_t *out_len)
{
    static const char token[] = "-Infinity", quoted[] = "\"-inf\"";
    char *out = malloc(len + 1), *p = out;
    bool in_string = false;
    if (!out)
        return NULL;
    for (size_t i = 0; i < len;) {
        if (!in_string && len - i >= sizeof token - 1 && memcmp(text + i, token, 9) == 0) {
            memcpy(p, quoted, sizeof quoted - 1); /* 6 bytes for 9: the copy never grows */
            p += sizeof quoted - 1;
            i += sizeof token - 1;
            continue;
        }
        if (in_string && text[i] == '\\' && i + 1 < len)
            *p++ = text[i++];
        else if (text[i] == '"')
            in_string = !in_string;
        *p++ = text[i++];
    }
    *out_len = (size_t)(p - out);
    return out;
}

/* The reply is JSON (RFC 8259: \u0000 included, which jansson refuses by default), but for the
 * -Infinity of an lse. */
static void check_reply(const api_reply *r)
{
    json_error_t jerr;
    json_t *root;
    size_t json_len, quoted_len = 0;
    if (!status_documented(r->status))
        fail("undocumented status", r);
    if (!r->body || r->body_len == 0)
        fail("no body", r);
    json_len = r->body_len;
    if (r->inference_header_len > 0) {
        if (r->status != 200 || (uint64_t)r->inference_header_len > r->body_len)
            fail("a bad Inference-Header-Content-Length in the reply", r);
        json_len = (size_t)r->inference_header_len;
    }
    char *quoted = quote_minus_infinity(r->body, json_len, &quoted_len);
    if (!quoted)
        fail("out of memory checking the reply", r);
    root = json_loadb(quoted, quoted_len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
    free(quoted);
    if (!json_is_object(root))
        fail("the JSON part is not a JSON object", r);
    if (r->status == 200) {
        if (!json_is_array(json_object_get(root, "outputs")))
            fail("a 200 without \"outputs\"", r);
    } else {
        if (!json_is_string(json_object_get(root, "error")))
            fail("an error that is not {\"error\": \"message\"}", r);
        if (r->reason == API_REASON_NONE)
            fail("an error without a rejection reason", r);
    }
    json_decref(root);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char header[HEADER_MAX + 1];
    const char *header_value = NULL;
    unsigned flags = 0;
    api_reply reply;
    api_call call;
    api_lease lease;
    size_t n = 0;

    if (size > 0) {
        flags = data[0];
        data++;
        size--;
    }
    while (n < size && n < HEADER_MAX && data[n] != '\n')
        n++;
    if (n < size && data[n] == '\n') {
        if (n > 0) {
            memcpy(header, data, n);
            header[n] = '\0';
            header_value = header;
        }
        data += n + 1;
        size -= n + 1;
    }

    memset(&call, 0, sizeof call);
    call.body = (const char *)data;
    call.body_len = size;
    call.content_type = (flags & FLAG_BINARY) ? "application/octet-stream" : "application/json";
    call.pool = pool;
    call.limits = &limits;
    api_lease_start(&lease, budget, eng_now_ns(), 0);
    call.lease = &lease;
    call.models = models;
    call.inference_header_length = header_value;
    call.model = (flags & FLAG_UNKNOWN) ? "nope" : (flags & FLAG_DEMO) ? "demo" : "sdpa";
    call.version = (flags & FLAG_VERSION) ? "1" : NULL;
    /* The server's timeout peek on the same request: in bounds, and never negative. */
    if (api_v2_timeout_peek(&call) < 0) {
        fprintf(stderr, "fuzz_v2_infer: a negative timeout from the peek\n");
        abort();
    }
    api_v2_infer(&call, &reply);
    if (verbose)
        fprintf(stderr, "status %d: %.*s\n", reply.status,
                (int)(reply.body_len < 300 ? reply.body_len : 300), reply.body ? reply.body : "");
    check_reply(&reply);
    api_reply_free(&reply);
    api_lease_end(&lease);
    if (api_budget_in_use(budget) != 0) {
        fprintf(stderr, "fuzz_v2_infer: %zu bytes left reserved in the budget\n",
                api_budget_in_use(budget));
        abort();
    }
    return 0;
}
