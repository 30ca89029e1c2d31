/*
 * fuzz_session_request.c - libFuzzer harness for the KV-cache session routes with a body
 * (api_sessions_create, api_session_attention, api_session_truncate, api_session_fork, and
 * api_mha on a session): the first byte picks the route and the session (a float32 and a
 * bfloat16 one, made at start-up), the rest is the body. With bit 3 of the first byte set the
 * body goes to POST /v1/mha instead, as a step of a third session, the demo layer's cache,
 * whose id is spliced in as the body's first member ("session").
 *
 * Every call must answer with a well-formed reply, never crash, hang, leak or read out of
 * bounds; beyond the sanitizers the harness aborts on what api/api.h rules out: a 500, an
 * undocumented status, a body that is not a JSON object with "error" {"code", "message"} on a
 * failure, a 201 without a Location, and memory left reserved in the budget. After each input
 * the two sessions are emptied and what it created is deleted, so that the registry
 * stays as small as the limits are tight (a few thousand elements, 250 ms, a 1 MiB cache).
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
static api_sessions *reg;
static api_models *models;
static char ids[3][64]; /* float32, bfloat16, the demo layer's */

static void fail(const char *why, const api_reply *r)
{
    fprintf(stderr, "fuzz_session_request: %s (status %d, body %.*s)\n", why, r->status,
            (int)(r->body_len < 600 ? r->body_len : 600), r->body ? r->body : "");
    abort();
}

static void call_route(void (*fn)(const api_call *, api_reply *), const char *id, const char *body,
                       size_t len, api_lease *lease, api_reply *reply)
{
    api_call call = {.body = body,
                     .body_len = len,
                     .content_type = "application/json",
                     .pool = pool,
                     .lease = lease,
                     .limits = &limits,
                     .models = models,
                     .sessions = reg,
                     .session = id};
    fn(&call, reply);
}

/* The id of a session a 201 created, from its Location. */
static const char *created_id(const api_reply *r)
{
    const char *prefix = "/v1/sessions/";
    if (strncmp(r->location, prefix, strlen(prefix)) != 0)
        fail("a 201 without a Location", r);
    return r->location + strlen(prefix);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    eng_error err;
    char msg[256];
    (void)argc;
    (void)argv;
    pool = eng_pool_new(2, &err);
    budget = api_budget_new((size_t)64 << 20);
    api_sessions_config cfg = {.capacity_bytes = (size_t)1 << 20, .block_tokens = 16, .ttl_s = 0};
    reg = api_sessions_new(&cfg, msg, sizeof msg);
    models = api_models_new();
    if (!pool || !budget || !reg || !models) {
        fprintf(stderr, "fuzz_session_request: set-up failed\n");
        abort();
    }
    limits = api_limits_default();
    limits.max_body_bytes = (size_t)1 << 20;
    limits.max_elements = 4096;
    limits.max_timeout_ms = 250;
    const char *shapes[3] = {"{\"num_heads\":2,\"head_dim\":4,\"max_tokens\":512}",
                             "{\"num_heads\":4,\"num_kv_heads\":2,\"head_dim\":2,"
                             "\"cache_dtype\":\"bfloat16\",\"softcap\":5}",
                             "{\"model\":\"demo\",\"max_tokens\":64}"};
    for (int i = 0; i < 3; i++) {
        api_reply r;
        call_route(api_sessions_create, NULL, shapes[i], strlen(shapes[i]), NULL, &r);
        if (r.status != 201)
            fail("cannot create the seed sessions", &r);
        snprintf(ids[i], sizeof ids[i], "%s", created_id(&r));
        api_reply_free(&r);
    }
    return 0;
}

static bool status_documented(int status)
{
    static const int ok[] = {200, 201, 400, 404, 409, 413, 415, 422, 429, 501, 503, 504};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        if (status == ok[i])
            return true;
    }
    return false;
}

static void check_reply(const api_reply *r)
{
    json_t *root, *e;
    if (!status_documented(r->status))
        fail("undocumented status", r);
    if (!r->body || r->body_len == 0)
        fail("no body", r);
    root = json_loadb(r->body, r->body_len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, NULL);
    if (!json_is_object(root))
        fail("the body is not a JSON object", r);
    if (r->status >= 300) {
        e = json_object_get(root, "error");
        if (!json_is_object(e) || !json_is_string(json_object_get(e, "code")) ||
            !json_is_string(json_object_get(e, "message")))
            fail("an error without error.code and error.message", r);
        if (r->reason == API_REASON_NONE)
            fail("an error without a rejection reason", r);
    } else if (!json_object_get(root, "length")) {
        fail("a success without \"length\"", r);
    }
    if ((r->status == 429) != (r->retry_after_s > 0) && r->status != 503)
        fail("Retry-After does not match the status", r);
    json_decref(root);
}

/* A /v1/mha step of the layer's session: the body with "session" spliced in after its '{' (as
 * it is when it does not open an object, which the route then refuses). */
static void mha_step(const char *body, size_t len, api_lease *lease, api_reply *reply)
{
    char *spliced = malloc(len + 64);
    size_t n = len;
    if (!spliced)
        abort();
    if (len > 0 && body[0] == '{') {
        n = (size_t)snprintf(spliced, 64, "{\"session\":\"%s\"%s", ids[2], len > 1 ? "," : "");
        memcpy(spliced + n, body + 1, len - 1);
        n += len - 1;
    } else {
        memcpy(spliced, body, len);
    }
    call_route(api_mha, NULL, spliced, n, lease, reply);
    free(spliced);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static void (*const routes[4])(const api_call *, api_reply *) = {
        api_session_attention, api_session_truncate, api_session_fork, api_sessions_create};
    if (size == 0)
        return 0;
    int route = data[0] & 3, which = (data[0] >> 2) & 1;
    api_reply reply;
    api_lease lease;
    api_lease_start(&lease, budget, eng_now_ns(), 0);
    if (data[0] & 8)
        mha_step((const char *)data + 1, size - 1, &lease, &reply);
    else
        call_route(routes[route], route == 3 ? NULL : ids[which], (const char *)data + 1, size - 1,
                   &lease, &reply);
    check_reply(&reply);
    if (reply.status == 201) {
        api_reply gone;
        api_sessions_delete(reg, created_id(&reply), &gone);
        if (gone.status != 204)
            fail("a created session could not be deleted", &gone);
        api_reply_free(&gone);
    }
    api_reply_free(&reply);
    api_lease_end(&lease);
    if (api_budget_in_use(budget) != 0) {
        fprintf(stderr, "fuzz_session_request: %zu bytes left reserved in the budget\n",
                api_budget_in_use(budget));
        abort();
    }
    for (int i = 0; i < 3; i++) { /* empty again for the next input */
        api_reply r;
        call_route(api_session_truncate, ids[i], "{\"length\":0}", 12, NULL, &r);
        api_reply_free(&r);
    }
    return 0;
}
