/*
 * fuzz_attention_request.c - libFuzzer harness for the native request of POST /v1/attention
 * (api_attention: body scan, jansson parse, tensor probes and decoders, validation, the engine
 * call and the reply encoder), and for the server's timeout peek on the same bytes.
 *
 * Any bytes go in as the body; the call must answer with a well-formed reply, never crash,
 * hang, leak or read out of bounds. Beyond what the sanitizers catch, the harness aborts on
 * what the contract in api/api.h rules out: a 500 (only for bugs), a status outside the ones
 * api_attention documents, a body that is not a JSON object with "output" (200) or "error"
 * (otherwise), and memory left reserved in the budget after the call.
 *
 * Limits are tight so that a valid input stays cheap (a few thousand elements, a 250 ms
 * deadline): the fuzzer should spend its time on the decoders, not on attention itself. Run
 * by `make fuzz` (long) and `make test` (smoke).
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

static eng_pool *pool;
static api_budget *budget;
static api_limits limits;
static bool verbose; /* ATTND_FUZZ_VERBOSE=1: print each reply (to check what seeds reach) */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    eng_error err;
    (void)argc;
    (void)argv;
    /* Two workers, so that requests fan out over a pool as they do in the daemon. */
    pool = eng_pool_new(2, &err);
    budget = api_budget_new((size_t)64 << 20);
    if (!pool || !budget) {
        fprintf(stderr, "fuzz_attention_request: set-up failed\n");
        abort();
    }
    limits = api_limits_default();
    limits.max_body_bytes = (size_t)1 << 20;
    limits.max_elements = 4096;
    limits.max_timeout_ms = 250;
    verbose = getenv("ATTND_FUZZ_VERBOSE") != NULL;
    return 0;
}

static bool status_documented(int status)
{
    static const int ok[] = {200, 400, 413, 415, 422, 429, 503, 504};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        if (status == ok[i])
            return true;
    }
    return false;
}

static void fail(const char *why, const api_reply *r)
{
    fprintf(stderr, "fuzz_attention_request: %s (status %d, body %.*s)\n", why, r->status,
            (int)(r->body_len < 600 ? r->body_len : 600), r->body ? r->body : "");
    abort();
}

/* The reply body is a JSON object (RFC 8259: \u0000 included, which jansson refuses by
 * default): {"output": ...} for 200, {"error": {"code", "message", "field"}} otherwise. */
static void check_reply(const api_reply *r)
{
    json_error_t jerr;
    json_t *root, *e;
    if (!status_documented(r->status))
        fail("undocumented status", r);
    if (!r->body || r->body_len == 0)
        fail("no body", r);
    root = json_loadb(r->body, r->body_len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
    if (!json_is_object(root))
        fail("the body is not a JSON object", r);
    if (r->status == 200) {
        if (!json_object_get(root, "output"))
            fail("a 200 without \"output\"", r);
    } else {
        e = json_object_get(root, "error");
        if (!json_is_object(e) || !json_is_string(json_object_get(e, "code")) ||
            !json_is_string(json_object_get(e, "message")))
            fail("an error without error.code and error.message", r);
        if (r->reason == API_REASON_NONE)
            fail("an error without a rejection reason", r);
    }
    if ((r->status == 429) != (r->retry_after_s > 0) && r->status != 503)
        fail("Retry-After does not match the status", r);
    json_decref(root);
}

/* The server's timeout peek (api_timeout_peek, run on its I/O thread) on the same bytes: it
 * stays in bounds (the sanitizers), and on a well-formed body it finds no timeout but the one
 * at the body's top level, which the route applies. */
static void check_peek(const api_call *call)
{
    int64_t ms = api_timeout_peek(call);
    json_t *root, *t;
    if (ms == 0)
        return;
    root = json_loadb(call->body, call->body_len, JSON_REJECT_DUPLICATES, NULL);
    t = json_object_get(root, "timeout_ms");
    if (root && !(json_is_integer(t) && json_integer_value(t) == ms)) {
        fprintf(stderr, "fuzz_attention_request: the peek found timeout %lld in %.*s\n",
                (long long)ms, (int)(call->body_len < 300 ? call->body_len : 300), call->body);
        abort();
    }
    json_decref(root);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    api_reply reply;
    api_lease lease;
    api_lease_start(&lease, budget, eng_now_ns(), 0);
    api_call call = {
        .body = (const char *)data,
        .body_len = size,
        .content_type = "application/json",
        .pool = pool,
        .lease = &lease,
        .limits = &limits,
    };
    check_peek(&call);
    api_attention(&call, &reply);
    if (verbose)
        fprintf(stderr, "status %d: %.*s\n", reply.status,
                (int)(reply.body_len < 300 ? reply.body_len : 300), reply.body ? reply.body : "");
    check_reply(&reply);
    api_reply_free(&reply);
    api_lease_end(&lease);
    if (api_budget_in_use(budget) != 0) {
        fprintf(stderr, "fuzz_attention_request: %zu bytes left reserved in the budget\n",
                api_budget_in_use(budget));
        abort();
    }
    return 0;
}
