/* test_native_request.c - POST /v1/attention request validation: every field's errors, each with
 * the status and the "field" of its JSON error, and the statuses that come from the call around the
 * body (content type, limits, memory budget, deadline, cancellation); and api__serve, the
 * stages every native JSON route runs, with stub steps. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/proto/native.h"
#include "tests/support/check.h"
#include "tests/support/rng.h"

static eng_pool *pool;

/* A valid rank-2 request: L = 1, S = 2, E = 2. */
#define QKV "\"query\": [[1, 0]], \"key\": [[1, 0], [0, 1]], \"value\": [[1, 2], [3, 4]]"
/* Rank 3: B = 2, L = 1, S = 2, E = 4 (num_heads 2 gives D = 2). */
#define QKV3                                                                                       \
    "\"query\": [[[1, 0, 1, 0]], [[0, 1, 0, 1]]], "                                                \
    "\"key\": [[[1, 0, 0, 1], [0, 1, 1, 0]], [[1, 1, 1, 1], [0, 0, 0, 0]]], "                      \
    "\"value\": [[[1, 2, 3, 4], [5, 6, 7, 8]], [[1, 1, 1, 1], [2, 2, 2, 2]]]"

typedef struct {
    const char *body;
    int status;
    const char *field; /* NULL: the error's field is null; ignored for 200 */
} request_case;

static const request_case cases[] = {
    /* The body as a whole. */
    {"", 400, NULL},
    {"null", 400, NULL},
    {"[]", 422, NULL},
    {"{\"query\": [[1]], \"query\": [[2]]}", 400, NULL},
    {"{\"query\": [[1e999]]}", 422, "query[0][0]"},
    /* NaN and Infinity are read (Python's json writes them); a query must be finite. */
    {"{\"query\": [[NaN]], \"key\": [[1]], \"value\": [[1]]}", 422, "query[0][0]"},
    {"{\"query\": [[Infinity]], \"key\": [[1]], \"value\": [[1]]}", 422, "query[0][0]"},
    {"{\"query\": [[1]], \"key\": [[-Infinity]], \"value\": [[1]]}", 422, "key[0][0]"},
    {"{\"query\": [[Infinityx]]}", 400, NULL},
    {"{" QKV "} x", 400, NULL},
    {"{" QKV "}", 200, NULL},
    /* Required and unknown fields. */
    {"{}", 422, "query"},
    {"{\"query\": [[1, 0]]}", 422, "key"},
    {"{\"query\": [[1, 0]], \"key\": [[1, 0]]}", 422, "value"},
    {"{\"query\": null, \"key\": [[1, 0]], \"value\": [[1, 0]]}", 422, "query"},
    {"{" QKV ", \"casual\": true}", 422, "casual"},
    {"{" QKV ", \"foo\": 1}", 422, "foo"},
    /* Shapes of query, key and value. */
    {"{\"query\": [1, 0], \"key\": [[1, 0]], \"value\": [[1, 0]]}", 422, "query"},
    {"{\"query\": [[[[[1]]]]], \"key\": [[[[[1]]]]], \"value\": [[[[[1]]]]]}", 422, "query"},
    {"{\"query\": [[1, 0]], \"key\": [[[1, 0]]], \"value\": [[1, 0]]}", 422, "key"},
    {"{\"query\": [[1, 0]], \"key\": [[1, 0]], \"value\": [[[1, 0]]]}", 422, "value"},
    {"{\"query\": [[1, 0]], \"key\": [[1, 0, 0]], \"value\": [[1, 0, 0]]}", 422, "key"},
    {"{\"query\": [[1, 0]], \"key\": [[1, 0]], \"value\": [[1, 0], [0, 1]]}", 422, "value"},
    {"{\"query\": [[[1, 0]]], \"key\": [[[1, 0]], [[1, 0]]], \"value\": [[[1, 0]], [[1, 0]]]}", 422,
     "key"},
    {"{\"query\": [[[1, 0]]], \"key\": [[[1, 0]]], \"value\": [[[1, 0]], [[1, 0]]]}", 422, "value"},
    {"{\"query\": [[[[1, 0]], [[1, 0]], [[1, 0]]]], \"key\": [[[[1, 0]], [[1, 0]]]], "
     "\"value\": [[[[1, 0]], [[1, 0]]]]}",
     422, "key"},
    {"{\"query\": [[[[1, 0]]]], \"key\": [[[[1, 0]]]], \"value\": [[[[1, 0]], [[1, 0]]]]}", 422,
     "value"},
    {"{\"query\": [[[[1, 0]]]], \"key\": [[[[1, 0]]]], \"value\": [[[[1, 0]]]], "
     "\"num_heads\": 2}",
     422, "num_heads"},
    {"{\"query\": [[[[1, 0]]]], \"key\": [[[[1, 0]]]], \"value\": [[[[1, 0]]]], "
     "\"num_kv_heads\": 2}",
     422, "num_kv_heads"},
    {"{\"query\": [[[[1, 0]]]], \"key\": [[[[1, 0]]]], \"value\": [[[[1, 0]]]], "
     "\"num_heads\": 1, \"num_kv_heads\": 1}",
     200, NULL},
    /* Values. */
    {"{\"query\": [[1e39, 0]], \"key\": [[1, 0]], \"value\": [[1, 0]]}", 422, "query[0][0]"},
    {"{\"query\": [[3.5e38, 0]], \"key\": [[1, 0]], \"value\": [[1, 0]]}", 422, "query[0][0]"},
    {"{\"query\": [[1, 0]], \"key\": [[1, \"x\"]], \"value\": [[1, 0]]}", 422, "key[0][1]"},
    {"{\"query\": [[1, 0]], \"key\": [[1, 0], [0, 1]], \"value\": [[1, 0], [1]]}", 422, "value[1]"},
    {"{\"query\": [[true, false]], \"key\": [[1, 0]], \"value\": [[1, 0]]}", 422, "query"},
    {"{\"query\": {\"shape\": [1, 2], \"data\": [1]}, \"key\": [[1, 0]], \"value\": [[1, 0]]}", 422,
     "query.data"},
    {"{\"query\": {\"shape\": [1, 0], \"data\": []}, \"key\": [[1, 0]], \"value\": [[1, 0]]}", 422,
     "query.shape[1]"},
    {"{\"query\": {\"shape\": [1, 2], \"dtype\": \"float32\", \"base64\": \"AAAA\"}, "
     "\"key\": [[1, 0]], \"value\": [[1, 0]]}",
     422, "query.base64"},
    /* num_heads and num_kv_heads. */
    {"{" QKV ", \"num_heads\": 0}", 422, "num_heads"},
    {"{" QKV ", \"num_heads\": -1}", 422, "num_heads"},
    {"{" QKV ", \"num_heads\": 1.5}", 422, "num_heads"},
    {"{" QKV ", \"num_heads\": \"2\"}", 422, "num_heads"},
    {"{" QKV ", \"num_heads\": 3}", 422, "num_heads"},
    {"{" QKV ", \"num_heads\": 2147483648}", 422, "num_heads"},
    {"{" QKV ", \"num_heads\": 2}", 200, NULL},
    {"{" QKV ", \"num_heads\": null}", 200, NULL},
    {"{" QKV ", \"num_kv_heads\": 0}", 422, "num_kv_heads"},
    {"{" QKV ", \"num_kv_heads\": 2}", 422, "num_kv_heads"}, /* H = 1 is not a multiple of 2 */
    {"{" QKV3 ", \"num_heads\": 2, \"num_kv_heads\": 3}", 422, "num_kv_heads"},
    {"{" QKV3 ", \"num_heads\": 2, \"num_kv_heads\": 1}", 422, "key"}, /* D 4 vs 2 */
    {"{" QKV3 ", \"num_heads\": 2, \"num_kv_heads\": 2}", 200, NULL},
    {"{" QKV3 ", \"num_heads\": 4}", 200, NULL},
    /* scale, softcap, score. */
    {"{" QKV ", \"scale\": \"x\"}", 422, "scale"},
    {"{" QKV ", \"scale\": 1e39}", 422, "scale"},
    {"{" QKV ", \"scale\": 3.5e38}", 422, "scale"},
    {"{" QKV ", \"scale\": 0}", 200, NULL},
    {"{" QKV ", \"scale\": -2.5}", 200, NULL},
    {"{" QKV ", \"softcap\": -1}", 422, "softcap"},
    {"{" QKV ", \"softcap\": true}", 422, "softcap"},
    {"{" QKV ", \"softcap\": 0}", 200, NULL},
    {"{" QKV ", \"softcap\": 30}", 200, NULL},
    {"{" QKV ", \"score\": \"mlp\"}", 422, "score"},
    {"{" QKV ", \"score\": \"dot\"}", 200, NULL},
    {"{" QKV ", \"score\": \"additive\"}", 422, "additive_weights"},
    {"{" QKV ", \"additive_weights\": {\"w_q\": [[1, 0]], \"w_k\": [[1, 0]], \"w\": [1]}}", 422,
     "additive_weights"},
    {"{" QKV ", \"score\": \"additive\", \"additive_weights\": {\"w_q\": [[1, 0]], \"w_k\": [[1, "
     "0]], \"w\": [1]}}",
     200, NULL},
    {"{" QKV ", \"score\": \"additive\", \"scale\": 1, \"additive_weights\": {\"w_q\": [[1, 0]], "
     "\"w_k\": [[1, 0]], \"w\": [1]}}",
     422, "scale"},
    {"{" QKV ", \"score\": \"additive\", \"additive_weights\": {\"w_q\": [[1, 0, 0]], \"w_k\": "
     "[[1, 0]], \"w\": [1]}}",
     422, "additive_weights.w_q"},
    {"{" QKV ", \"score\": \"additive\", \"additive_weights\": {\"w_q\": [[1, 0]], \"w_k\": "
     "[[1, 0]], \"w\": [1, 2]}}",
     422, "additive_weights.w_q"},
    {"{" QKV ", \"score\": \"additive\", \"additive_weights\": {\"w_q\": [[1, 0]], \"w_k\": "
     "[[1, 0]]}}",
     422, "additive_weights.w"},
    {"{" QKV ", \"score\": \"additive\", \"additive_weights\": {\"w_q\": [[1, 0]], \"w_k\": "
     "[[1, 0]], \"w\": [1], \"b\": [0]}}",
     422, "additive_weights.b"},
    {"{" QKV ", \"score\": \"additive\", \"additive_weights\": [1]}", 422, "additive_weights"},
    /* causal and positions. */
    {"{" QKV ", \"causal\": \"yes\"}", 422, "causal"},
    {"{" QKV ", \"causal\": 1}", 422, "causal"},
    {"{" QKV ", \"causal\": true}", 200, NULL},
    {"{" QKV ", \"causal\": \"top_left\"}", 200, NULL},
    {"{" QKV ", \"causal\": \"bottom_right\"}", 200, NULL},
    {"{" QKV ", \"query_offset\": 1.5}", 422, "query_offset"},
    {"{" QKV ", \"query_offset\": 1000000000000000}", 422, "query_offset"},
    {"{" QKV ", \"query_offset\": \"1\"}", 422, "query_offset"},
    {"{" QKV ", \"causal\": \"bottom_right\", \"query_offset\": 1}", 422, "query_offset"},
    {"{" QKV ", \"causal\": \"top_left\", \"query_offset\": 1}", 422, "query_offset"},
    {"{" QKV ", \"causal\": true, \"query_offset\": -3}", 200, NULL},
    {"{" QKV ", \"window\": [1]}", 422, "window"},
    {"{" QKV ", \"window\": 3}", 422, "window"},
    {"{" QKV ", \"window\": [-1, 0]}", 422, "window[0]"},
    {"{" QKV ", \"window\": [0, 1.5]}", 422, "window[1]"},
    {"{" QKV ", \"window\": [0, \"1\"]}", 422, "window[1]"},
    {"{" QKV ", \"window\": [null, null]}", 200, NULL},
    {"{" QKV ", \"window\": [0, 99999999999999999]}", 200, NULL},
    {"{" QKV ", \"window\": [1, 0]}", 200, NULL},
    /* Masks. */
    {"{" QKV ", \"key_padding_mask\": [true]}", 422, "key_padding_mask"},
    {"{" QKV ", \"key_padding_mask\": [1, 0]}", 422, "key_padding_mask"},
    {"{" QKV ", \"key_padding_mask\": [[true, false], [true, false]]}", 422, "key_padding_mask"},
    {"{" QKV ", \"key_padding_mask\": [true, 0]}", 422, "key_padding_mask[1]"},
    {"{" QKV ", \"key_padding_mask\": [true, false]}", 200, NULL},
    {"{" QKV ", \"key_padding_mask\": [[false, true]]}", 200, NULL},
    {"{" QKV ", \"key_padding_mask\": {\"shape\": [2], \"dtype\": \"bool\", \"base64\": "
     "\"AAE=\"}}",
     200, NULL},
    {"{" QKV ", \"kv_lengths\": [3]}", 422, "kv_lengths[0]"},
    {"{" QKV ", \"kv_lengths\": [-1]}", 422, "kv_lengths[0]"},
    {"{" QKV ", \"kv_lengths\": [1, 1]}", 422, "kv_lengths"},
    {"{" QKV ", \"kv_lengths\": [1.5]}", 422, "kv_lengths[0]"},
    {"{" QKV ", \"kv_lengths\": [true]}", 422, "kv_lengths"},
    {"{" QKV ", \"kv_lengths\": 1}", 422, "kv_lengths"},
    {"{" QKV ", \"kv_lengths\": [1]}", 200, NULL},
    {"{" QKV ", \"kv_lengths\": [0]}", 200, NULL},
    {"{" QKV ", \"attn_mask\": [[true, false, true]]}", 422, "attn_mask"},
    {"{" QKV ", \"attn_mask\": [true, false]}", 422, "attn_mask"},
    {"{" QKV ", \"attn_mask\": [[[true, false]]]}", 422, "attn_mask"},
    {"{" QKV ", \"attn_mask\": [[[[true, false]]], [[[true, false]]]]}", 422, "attn_mask"},
    {"{" QKV ", \"attn_mask\": [[1, \"a\"]]}", 422, "attn_mask[0][1]"},
    {"{" QKV ", \"attn_mask\": [[0, 1e39]]}", 422, "attn_mask[0][1]"},
    {"{" QKV ", \"attn_mask\": [[true, 1]]}", 422, "attn_mask[0][1]"},
    {"{" QKV ", \"attn_mask\": [[true, false]]}", 200, NULL},
    {"{" QKV ", \"attn_mask\": [[true]]}", 200, NULL}, /* [1, 1] broadcasts */
    {"{" QKV ", \"attn_mask\": [[0, null]]}", 200, NULL},
    {"{" QKV ", \"attn_mask\": [[[[true, false]]]]}", 200, NULL},
    {"{" QKV ", \"attn_mask\": {\"shape\": [1, 2], \"dtype\": \"float16\", \"base64\": "
     "\"AAAA/A==\"}}",
     200, NULL}, /* float16 0 and -inf */
    {"{" QKV ", \"attn_mask\": {\"shape\": [1, 2], \"dtype\": \"float16\", \"base64\": "
     "\"AAAAfA==\"}}",
     422, "attn_mask.base64"}, /* +inf */
    /* ALiBi. */
    {"{" QKV ", \"alibi\": \"yes\"}", 422, "alibi"},
    {"{" QKV ", \"alibi\": [1, 2]}", 422, "alibi"},
    {"{" QKV ", \"alibi\": [1e39]}", 422, "alibi[0]"},
    {"{" QKV ", \"alibi\": [true]}", 422, "alibi"},
    {"{" QKV ", \"alibi\": [0.5]}", 200, NULL},
    {"{" QKV ", \"alibi\": true}", 200, NULL},
    {"{" QKV ", \"alibi\": false}", 200, NULL},
    /* Optional outputs and their encoding. */
    {"{" QKV ", \"return_weights\": true}", 422, "return_weights"},
    {"{" QKV ", \"return_weights\": \"all\"}", 422, "return_weights"},
    {"{" QKV ", \"return_weights\": \"mean\"}", 200, NULL},
    {"{" QKV ", \"return_weights\": \"per_head\"}", 200, NULL},
    {"{" QKV ", \"return_weights\": false}", 200, NULL},
    {"{" QKV ", \"return_lse\": 1}", 422, "return_lse"},
    {"{" QKV ", \"return_lse\": \"true\"}", 422, "return_lse"},
    {"{" QKV ", \"return_lse\": true}", 200, NULL},
    {"{" QKV ", \"output_encoding\": \"json\"}", 422, "output_encoding"},
    {"{" QKV ", \"output_encoding\": 3}", 422, "output_encoding"},
    {"{" QKV ", \"output_encoding\": \"flat\"}", 200, NULL},
    {"{" QKV ", \"output_encoding\": \"base64\"}", 200, NULL},
    /* timeout_ms. */
    {"{" QKV ", \"timeout_ms\": 0}", 422, "timeout_ms"},
    {"{" QKV ", \"timeout_ms\": -5}", 422, "timeout_ms"},
    {"{" QKV ", \"timeout_ms\": 1.5}", 422, "timeout_ms"},
    {"{" QKV ", \"timeout_ms\": \"100\"}", 422, "timeout_ms"},
    {"{" QKV ", \"timeout_ms\": 100}", 200, NULL},
    {"{" QKV ", \"timeout_ms\": 99999999999}", 200, NULL}, /* capped, not refused */
};

/* Runs one call; the reply must be well-formed JSON with the documented shape. */
static json_t *run_call(const api_call *call, api_reply *r)
{
    api_attention(call, r);
    json_error_t jerr;
    json_t *j = r->body ? json_loadb(r->body, r->body_len, 0, &jerr) : NULL;
    CHECKF(j != NULL, "reply %d is not JSON: %.*s", r->status, (int)r->body_len,
           r->body ? r->body : "");
    CHECK(r->content_type && strcmp(r->content_type, "application/json") == 0);
    return j;
}

static json_t *run_body(const char *body, api_reply *r)
{
    api_call call = {.body = body, .body_len = strlen(body), .pool = pool};
    return run_call(&call, r);
}

static const char *error_field(json_t *j)
{
    return json_string_value(json_object_get(json_object_get(j, "error"), "field"));
}

static void test_every_field_is_validated(void)
{
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const request_case *c = &cases[i];
        api_reply r;
        json_t *j = run_body(c->body, &r);
        CHECKF(r.status == c->status, "%s: status %d, want %d: %.*s", c->body, r.status, c->status,
               (int)r.body_len, r.body);
        if (c->status != 200 && j) {
            json_t *e = json_object_get(j, "error");
            const char *field = error_field(j);
            CHECKF(json_is_object(e) && json_object_size(e) == 3, "%s: error body", c->body);
            CHECKF(c->field ? field && strcmp(field, c->field) == 0
                            : json_is_null(json_object_get(e, "field")),
                   "%s: field %s, want %s (%s)", c->body, field ? field : "null",
                   c->field ? c->field : "null", json_string_value(json_object_get(e, "message")));
            CHECKF(r.reason == (c->status == 413 ? API_REASON_TOO_LARGE : API_REASON_BAD_REQUEST),
                   "%s: reason %s", c->body, api_reason_str(r.reason));
        }
        if (c->status == 200 && j) {
            json_t *out = json_object_get(j, "output");
            CHECKF(json_is_array(out) || json_is_object(out), "%s: no output", c->body);
        }
        json_decref(j);
        api_reply_free(&r);
    }
}

static void test_a_typo_gets_a_suggestion(void)
{
    api_reply r;
    json_t *j = run_body("{" QKV ", \"casual\": true}", &r);
    const char *msg = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
    CHECKF(msg && strstr(msg, "did you mean \"causal\"?"), "%s", msg);
    json_decref(j);
    api_reply_free(&r);
}

static void test_content_types(void)
{
    static const struct {
        const char *type;
        int status;
    } types[] = {
        {NULL, 200},
        {"application/json", 200},
        {"application/json; charset=utf-8", 200},
        {"Application/JSON;charset=UTF-8", 200},
        {"application/json; charset=\"utf-8\"", 200},
        {"application/json ; foo=bar", 200},
        {"text/plain", 415},
        {"application/json; charset=latin1", 415},
        {"application/jsonx", 415},
        {"application/json-seq", 415},
        {"application/x-www-form-urlencoded", 415},
        {"", 415},
        {"application/json; charset", 415},
    };
    const char *body = "{" QKV "}";
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        api_call call = {
            .body = body, .body_len = strlen(body), .pool = pool, .content_type = types[i].type};
        api_reply r;
        json_t *j = run_call(&call, &r);
        CHECKF(r.status == types[i].status, "%s: %d", types[i].type ? types[i].type : "(none)",
               r.status);
        json_decref(j);
        api_reply_free(&r);
    }
}

/* The message of the error in j contains `text`. */
static void check_message(json_t *j, const char *text)
{
    const char *msg = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
    CHECKF(msg && strstr(msg, text), "message \"%s\" does not name %s", msg ? msg : "", text);
}

static void test_limits_are_413_naming_their_flag(void)
{
    const char *body = "{" QKV ", \"return_weights\": \"per_head\"}";
    api_limits limits = api_limits_default();
    api_call call = {.body = body, .body_len = strlen(body), .pool = pool, .limits = &limits};
    api_reply r;

    limits.max_body_bytes = strlen(body) - 1;
    json_t *j = run_call(&call, &r);
    CHECK_EQ_INT(r.status, 413);
    CHECK_EQ_INT(r.reason, API_REASON_TOO_LARGE);
    check_message(j, "--max-body-bytes");
    json_decref(j);
    api_reply_free(&r);

    limits.max_body_bytes = strlen(body); /* exactly at the cap is fine */
    j = run_call(&call, &r);
    CHECK_EQ_INT(r.status, 200);
    json_decref(j);
    api_reply_free(&r);

    /* Inputs 2 + 4 + 4, outputs 2 + weights 2: 14 elements. */
    limits.max_elements = 13;
    j = run_call(&call, &r);
    CHECK_EQ_INT(r.status, 413);
    check_message(j, "--max-elements");
    json_decref(j);
    api_reply_free(&r);
    limits.max_elements = 14;
    j = run_call(&call, &r);
    CHECK_EQ_INT(r.status, 200);
    json_decref(j);
    api_reply_free(&r);

    /* One tensor alone over the limit is caught before its values are read. */
    limits.max_elements = 3;
    j = run_call(&call, &r);
    CHECK_EQ_INT(r.status, 413);
    CHECK(strcmp(error_field(j), "key") == 0);
    json_decref(j);
    api_reply_free(&r);
}

static void test_the_memory_budget(void)
{
    const char *body = "{" QKV "}";
    api_lease lease;
    api_call call = {.body = body, .body_len = strlen(body), .pool = pool, .lease = &lease};
    api_reply r;

    /* Too small for this request ever: 413 naming the flag. */
    api_budget *budget = api_budget_new(1000);
    api_lease_start(&lease, budget, eng_now_ns(), 0);
    json_t *j = run_call(&call, &r);
    CHECK_EQ_INT(r.status, 413);
    CHECK_EQ_INT(r.reason, API_REASON_MEMORY);
    check_message(j, "--max-memory-bytes");
    json_decref(j);
    api_reply_free(&r);
    api_lease_end(&lease);
    CHECK_EQ_INT(api_budget_in_use(budget), 0);
    api_budget_free(budget);

    /* Big enough when idle, but taken by others now: 429 with Retry-After. */
    budget = api_budget_new((size_t)64 << 20);
    CHECK_EQ_INT(api_budget_reserve(budget, (size_t)64 << 20), API_BUDGET_OK);
    api_lease_start(&lease, budget, eng_now_ns(), 0);
    j = run_call(&call, &r);
    CHECK_EQ_INT(r.status, 429);
    CHECK_EQ_INT(r.reason, API_REASON_MEMORY);
    CHECK_EQ_INT(r.retry_after_s, 1);
    json_decref(j);
    api_reply_free(&r);
    api_lease_end(&lease);
    api_budget_release(budget, (size_t)64 << 20);

    /* What the lease holds already (the server's body) counts: together they can never fit. */
    api_lease_start(&lease, budget, eng_now_ns(), 0);
    CHECK_EQ_INT(api_lease_reserve(&lease, ((size_t)64 << 20) - 100), API_BUDGET_OK);
    j = run_call(&call, &r);
    CHECK_EQ_INT(r.status, 413);
    json_decref(j);
    api_reply_free(&r);
    api_lease_end(&lease);
    CHECK_EQ_INT(api_budget_in_use(budget), 0);

    /* On success the lease keeps the reply's bytes (the reply is in memory until it is sent:
     * the estimate of its text trimmed to its size) and gives back the rest; ending it gives
     * back everything. */
    api_lease_start(&lease, budget, eng_now_ns(), 0);
    j = run_call(&call, &r);
    CHECK_EQ_INT(r.status, 200);
    CHECK_EQ_INT(lease.held, r.body_len);
    CHECK(api_budget_in_use(budget) == lease.held);
    json_decref(j);
    api_reply_free(&r);
    api_lease_end(&lease);
    CHECK_EQ_INT(api_budget_in_use(budget), 0);

    /* And on failure. */
    const char *bad = "{" QKV ", \"window\": [-1, 0]}";
    call.body = bad;
    call.body_len = strlen(bad);
    api_lease_start(&lease, budget, eng_now_ns(), 0);
    j = run_call(&call, &r);
    CHECK_EQ_INT(r.status, 422);
    CHECK_EQ_INT(lease.held, 0); /* an error body is small and not accounted */
    json_decref(j);
    api_reply_free(&r);
    api_lease_end(&lease);
    CHECK_EQ_INT(api_budget_in_use(budget), 0);
    api_budget_free(budget);
}

static void test_deadlines_and_cancellation(void)
{
    const char *body = "{" QKV "}";
    api_limits limits = api_limits_default();
    api_lease lease;
    api_call call = {
        .body = body, .body_len = strlen(body), .pool = pool, .lease = &lease, .limits = &limits};
    api_reply r;

    /* The request arrived 2 s ago; the limit is 1 s. */
    limits.max_timeout_ms = 1000;
    api_lease_start(&lease, NULL, eng_now_ns() - 2000000000, 0);
    json_t *j = run_call(&call, &r);
    CHECK_EQ_INT(r.status, 504);
    CHECK_EQ_INT(r.reason, API_REASON_DEADLINE);
    CHECK(lease.ctl.deadline_ns == lease.start_ns + 1000000000);
    json_decref(j);
    api_reply_free(&r);

    /* Its own timeout_ms is shorter than the limit and has passed too. */
    const char *short_body = "{" QKV ", \"timeout_ms\": 10}";
    call.body = short_body;
    call.body_len = strlen(short_body);
    api_lease_start(&lease, NULL, eng_now_ns() - 50000000, 0);
    j = run_call(&call, &r);
    CHECK_EQ_INT(r.status, 504);
    CHECK(lease.ctl.deadline_ns == lease.start_ns + 10000000);
    json_decref(j);
    api_reply_free(&r);

    /* A longer timeout_ms is capped by the limit. */
    const char *long_body = "{" QKV ", \"timeout_ms\": 5000}";
    call.body = long_body;
    call.body_len = strlen(long_body);
    api_lease_start(&lease, NULL, eng_now_ns(), 0);
    j = run_call(&call, &r);
    CHECK_EQ_INT(r.status, 200);
    CHECK(lease.ctl.deadline_ns == lease.start_ns + 1000000000);
    json_decref(j);
    api_reply_free(&r);

    /* The caller's deadline (the server's queue deadline) is only ever shortened: a timeout_ms
     * longer than what the lease allows does not extend it. */
    api_lease_start(&lease, NULL, eng_now_ns(), 200);
    j = run_call(&call, &r);
    CHECK_EQ_INT(r.status, 200);
    CHECK(lease.ctl.deadline_ns == lease.start_ns + 200000000);
    json_decref(j);
    api_reply_free(&r);

    /* A cancelled request gets the status the server drops. */
    atomic_store(&lease.ctl.cancel, true);
    j = run_call(&call, &r);
    CHECK_EQ_INT(r.status, API_STATUS_CLIENT_CLOSED);
    CHECK_EQ_INT(r.reason, API_REASON_CANCELLED);
    json_decref(j);
    api_reply_free(&r);
}

static void test_replies_carry_timings_and_metadata(void)
{
    api_reply r;
    json_t *j = run_body("{" QKV3 ", \"num_heads\": 2, \"num_kv_heads\": 1, \"scale\": 0.5}", &r);
    CHECK_EQ_INT(r.status, 422); /* D: key width 4 over 1 head is 4, query's is 2 */
    json_decref(j);
    api_reply_free(&r);
    j = run_body("{" QKV3 ", \"num_heads\": 2}", &r);
    CHECK_EQ_INT(r.status, 200);
    CHECK(r.decode_ns > 0 && r.compute_ns > 0 && r.encode_ns > 0);
    CHECK_EQ_INT(r.reason, API_REASON_NONE);
    json_t *meta = json_object_get(j, "meta");
    CHECK_EQ_INT(json_integer_value(json_object_get(meta, "batch")), 2);
    CHECK_EQ_INT(json_integer_value(json_object_get(meta, "num_heads")), 2);
    CHECK_EQ_INT(json_integer_value(json_object_get(meta, "num_kv_heads")), 2);
    CHECK_EQ_INT(json_integer_value(json_object_get(meta, "query_len")), 1);
    CHECK_EQ_INT(json_integer_value(json_object_get(meta, "key_len")), 2);
    CHECK_EQ_INT(json_integer_value(json_object_get(meta, "head_dim")), 2);
    CHECK_EQ_INT(json_integer_value(json_object_get(meta, "value_head_dim")), 2);
    CHECK_NEAR(json_number_value(json_object_get(meta, "scale")), 0.70710678, 1e-7);
    CHECK(json_is_number(json_object_get(meta, "decode_ms")));
    CHECK(json_is_number(json_object_get(meta, "compute_ms")));
    json_decref(j);
    api_reply_free(&r);
}

static bool quick(void)
{
    const char *q = getenv("ATTND_TEST_QUICK");
    return q && *q && strcmp(q, "0") != 0;
}

/* A reply to any input is JSON with a status of docs/http-api.md#errors-and-statuses. */
static void check_sane_reply(const char *body, size_t len)
{
    api_call call = {.body = body, .body_len = len, .pool = pool};
    api_reply r;
    api_attention(&call, &r);
    static const int allowed[] = {200, 400, 413, 415, 422, 429, 503, 504};
    bool ok = false;
    for (size_t i = 0; i < sizeof allowed / sizeof allowed[0]; i++)
        ok |= r.status == allowed[i];
    CHECKF(ok, "status %d for %.*s", r.status, (int)(len < 200 ? len : 200), body);
    json_error_t jerr;
    json_t *j = r.body ? json_loadb(r.body, r.body_len, 0, &jerr) : NULL;
    CHECKF(j != NULL, "reply %d is not JSON", r.status);
    if (r.status != 200 && j) {
        json_t *e = json_object_get(j, "error");
        CHECKF(json_is_string(json_object_get(e, "code")) &&
                   json_is_string(json_object_get(e, "message")),
               "error body %.*s", (int)r.body_len, r.body);
    }
    json_decref(j);
    api_reply_free(&r);
}

static void test_hostile_bodies_get_an_answer(void)
{
    enum { DEPTH = 150000 };
    char *deep = malloc(2 * DEPTH + 64);
    size_t at = (size_t)snprintf(deep, 64, "{\"query\": ");
    memset(deep + at, '[', DEPTH);
    memset(deep + at + DEPTH, ']', DEPTH);
    at += 2 * DEPTH;
    deep[at++] = '}';
    check_sane_reply(deep, at);
    free(deep);
    static const char *const bodies[] = {
        "{\"query\": \"\xc3\x28\"}",                                /* invalid UTF-8 */
        "{\"query\": [[1]], \"key\": [[1]], \"value\": [[1]]}\x00", /* a NUL after the end */
        "{\"query\": {\"shape\": [9223372036854775807, 9223372036854775807, 4], \"data\": [1]}, "
        "\"key\": [[1]], \"value\": [[1]]}",
        "{\"query\": {\"shape\": [99999999999999999999], \"data\": [1]}}",
        "{\"query\": [[-0.0, 1e-400, 4.9e-324]], \"key\": [[1, 0]], \"value\": [[1, 0]]}",
        "\xef\xbb\xbf{}", /* a byte order mark */
        "{\"\": 1}",
        "{\"query\": {\"shape\": [1, 2], \"dtype\": \"bool\", \"base64\": \"AQE=\"}, "
        "\"key\": [[1, 0]], \"value\": [[1, 0]]}",
    };
    static const size_t lens[] = {0, 47, 0, 0, 0, 0, 0, 0};
    for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++)
        check_sane_reply(bodies[i], lens[i] ? lens[i] : strlen(bodies[i]));
}

/* Random edits of valid requests (flipped, inserted, deleted bytes, truncation): whatever
 * comes in, a JSON answer goes out, and under ASan nothing leaks or overflows. */
static void test_random_mutations_never_crash(void)
{
    static const char *const seeds[] = {
        "{" QKV ", \"causal\": true, \"return_weights\": \"mean\", \"return_lse\": true}",
        "{" QKV3 ", \"num_heads\": 2, \"window\": [1, null], \"alibi\": true}",
        "{\"query\": {\"shape\": [1, 2], \"dtype\": \"float32\", \"base64\": \"AACAPwAAAAA=\"}, "
        "\"key\": {\"shape\": [2, 2], \"data\": [1, 0, 0, 1]}, \"value\": [[1, 2], [3, 4]], "
        "\"attn_mask\": [[true, false]], \"key_padding_mask\": [false, false], "
        "\"kv_lengths\": [2], \"output_encoding\": \"flat\"}",
        /* Arrays of 16 numbers and more go through the body's own number scanner. */
        "{\"query\": [[1.5, -2, 3e-2, 4], [5, 6.25, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16]], "
        "\"key\": {\"shape\": [4, 4], \"data\": [1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, "
        "1]}, \"value\": [[1, 2, 3, 4], [5, 6, 7, 8], [9, 1e1, 11, 12], [-0.5, 14, 15, 16]], "
        "\"kv_lengths\": [0, 1, 2, 3, 4, 3, 2, 1, 0, 1, 2, 3, 4, 3, 2, 1]}",
    };
    static const char alphabet[] = "{}[],:\"0123456789.-eE truefalsnul\\AQ=";
    uint64_t rng = 0x2545F4914F6CDD1Du;
    int rounds = quick() ? 300 : 3000;
    char buf[1024];
    for (int n = 0; n < rounds; n++) {
        const char *seed = seeds[n % 4];
        size_t len = strlen(seed);
        memcpy(buf, seed, len);
        int edits = 1 + n % 4;
        for (int e = 0; e < edits; e++) {
            uint64_t x = rng_next(&rng);
            size_t at = (size_t)(x >> 8) % (len ? len : 1);
            char c = alphabet[(x >> 40) % (sizeof alphabet - 1)];
            switch ((x >> 20) % 4) {
            case 0:
                buf[at] = c;
                break;
            case 1:
                if (len + 1 < sizeof buf) {
                    memmove(buf + at + 1, buf + at, len - at);
                    buf[at] = c;
                    len++;
                }
                break;
            case 2:
                if (len > 1) {
                    memmove(buf + at, buf + at + 1, len - at - 1);
                    len--;
                }
                break;
            default:
                len = at;
                break;
            }
        }
        check_sane_reply(buf, len);
        if (check__failures_in_test > 5)
            return;
    }
}

/* ---- api__serve, with stub steps of a native route
 * ------------------------------------------------------ */

/* A route whose steps only record that they ran (one letter each, in `trace`); the step named
 * by `fail` fails with a 422. */
typedef struct {
    api__req rq;
    char trace[16];
    size_t n;
    char fail;
} stub_job;

static int stub_step(void *p, char step, api__error *err)
{
    stub_job *job = p;
    job->trace[job->n++] = step;
    if (job->fail == step)
        return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, "stub",
                              "step %c failed", step);
    return 0;
}

static int stub_check(void *p, api__error *err)
{
    return stub_step(p, 'k', err);
}

static bool stub_size(void *p, api__sizes *sz)
{
    api__error err = {0};
    sz->text = 64;
    return stub_step(p, 's', &err) == 0;
}

static int stub_decode(void *p, api__error *err)
{
    return stub_step(p, 'd', err);
}

static int stub_run(void *p, int64_t *compute_ns, api__error *err)
{
    *compute_ns = 5;
    return stub_step(p, 'r', err);
}

static int stub_encode(void *p, api_buf *w, api_reply *reply, api__error *err)
{
    api_buf_printf(w, "{\"compute_ns\":%lld}\n", (long long)reply->compute_ns);
    if (stub_step(p, 'e', err) != 0)
        return -1;
    return api__native_reply(w, reply, err);
}

static int64_t stub_batch(const void *p)
{
    (void)p;
    return 3;
}

static void stub_free(void *p)
{
    stub_job *job = p;
    job->trace[job->n++] = 'f';
}

static const api__route stub_steps = {
    .style = API_ERRORS_NATIVE,
    .steps = {.read = api__native_read,
              .check = stub_check,
              .size = stub_size,
              .decode = stub_decode,
              .run = stub_run,
              .encode = stub_encode,
              .batch = stub_batch,
              .free = stub_free},
};

static void test_serve_runs_the_steps_in_order_and_frees_on_every_path(void)
{
    static const struct {
        const char *content_type;
        char fail;
        int status;
        const char *trace;
    } serves[] = {
        {NULL, 0, 200, "ksdref"},  {NULL, 'k', 422, "kf"},     {NULL, 'd', 422, "ksdf"},
        {NULL, 'r', 422, "ksdrf"}, {NULL, 'e', 422, "ksdref"}, {"text/plain", 0, 415, "f"},
    };
    for (size_t i = 0; i < sizeof serves / sizeof serves[0]; i++) {
        api_call call = {
            .body = "{}", .body_len = 2, .pool = pool, .content_type = serves[i].content_type};
        stub_job job = {.fail = serves[i].fail};
        api_reply r;
        api__serve(&stub_steps, &job, &call, &r);
        CHECKF(r.status == serves[i].status, "case %zu: %d", i, r.status);
        CHECKF(strcmp(job.trace, serves[i].trace) == 0, "case %zu ran \"%s\"", i, job.trace);
        CHECK(r.decode_ns > 0); /* up to the failure when decoding never finished */
        CHECK_EQ_INT(r.inferences, serves[i].status == 200 ? 3 : 0);
        if (serves[i].status == 200)
            CHECK(r.body_len == 17 && memcmp(r.body, "{\"compute_ns\":5}\n", 17) == 0);
        api_reply_free(&r);
    }
    api_call call = {.body = "{}", .body_len = 2, .pool = pool};
    api_reply r;
    api__serve(&stub_steps, NULL, &call, &r); /* the route's job could not be allocated */
    CHECK_EQ_INT(r.status, 503);
    api_reply_free(&r);
}

int main(void)
{
    eng_error err;
    pool = eng_pool_new(2, &err);
    if (!pool) {
        fprintf(stderr, "eng_pool_new: %s\n", err.message);
        return 1;
    }
    RUN(test_every_field_is_validated);
    RUN(test_a_typo_gets_a_suggestion);
    RUN(test_content_types);
    RUN(test_limits_are_413_naming_their_flag);
    RUN(test_the_memory_budget);
    RUN(test_deadlines_and_cancellation);
    RUN(test_replies_carry_timings_and_metadata);
    RUN(test_hostile_bodies_get_an_answer);
    RUN(test_random_mutations_never_crash);
    RUN(test_serve_runs_the_steps_in_order_and_frees_on_every_path);
    eng_pool_free(pool);
    return check_report();
}
