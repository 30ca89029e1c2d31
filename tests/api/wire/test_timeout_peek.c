/* test_timeout_peek.c - a request's own timeout read from its body before decoding
 * (api/wire/timeout_peek.c): the top-level "timeout_ms" of a native body, the top-level
 * "parameters" of a KServe v2 one (with Triton's "timeout" in microseconds, the tighter applying),
 * never a decoy inside a string or a nested object, only the JSON before v2 binary tensor data, and
 * 0 for whatever the routes would not apply. Every answer is also checked against jansson: the peek
 * may say 0 where a route applies a timeout (late, not wrong), never another number. Triton's
 * "sequence_id" comes out of the same walk of v2 "parameters", as written (an integer's digits, a
 * string's bytes), and is likewise never another sequence than the one the route reads. The
 * session a POST /v1/mha names comes out of the native walk, held to the same rule: "" or the
 * string the route reads, never another. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "api/wire/timeout.h"
#include "tests/support/check.h"
#include "tests/support/rng.h"
#include "tests/support/util.h"

typedef enum { NATIVE, V2 } protocol;

typedef struct {
    protocol proto;
    const char *body;
    int64_t want;
} peek_case;

/* The route's own reading of the timeout, through jansson; -1 when the body is not valid JSON
 * (the route answers 400 and no timeout applies). */
static int64_t reference_timeout(protocol proto, const char *body, size_t len)
{
    json_error_t e;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &e), *v, *params;
    int64_t ms = 0, us = 0;
    if (!root)
        return -1;
    if (proto == NATIVE) {
        v = json_object_get(root, "timeout_ms");
        if (json_is_integer(v) && json_integer_value(v) >= 1 &&
            json_integer_value(v) <= API_TIMEOUT_MS_MAX)
            ms = json_integer_value(v);
    } else {
        params = json_object_get(root, "parameters");
        v = json_object_get(params, "timeout_ms");
        if (json_is_integer(v) && json_integer_value(v) >= 1 &&
            json_integer_value(v) <= API_TIMEOUT_MS_MAX)
            ms = json_integer_value(v);
        v = json_object_get(params, "timeout");
        if (json_is_integer(v) && json_integer_value(v) >= 0 &&
            json_integer_value(v) <= API_TIMEOUT_US_MAX)
            us = json_integer_value(v);
        ms = api__v2_timeout_ms(ms, us);
    }
    json_decref(root);
    return ms;
}

static int64_t peek(protocol proto, const api_call *call)
{
    return proto == NATIVE ? api_timeout_peek(call) : api_v2_timeout_peek(call);
}

static int64_t peek_body(protocol proto, const char *body, size_t len)
{
    api_call call = {.body = body, .body_len = len};
    return peek(proto, &call);
}

/* A peeked timeout is 0 or exactly what the route applies to a valid body. */
static void check_never_wrong(protocol proto, const char *body, size_t len, int64_t got)
{
    int64_t ref = reference_timeout(proto, body, len);
    CHECKF(got == 0 || ref < 0 || got == ref, "%.*s: peeked %lld, the route applies %lld", (int)len,
           body, (long long)got, (long long)ref);
}

static void check_cases(const peek_case *cases, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(cases[i].body);
        int64_t got = peek_body(cases[i].proto, cases[i].body, len);
        CHECKF(got == cases[i].want, "%s: peeked %lld, want %lld", cases[i].body, (long long)got,
               (long long)cases[i].want);
        check_never_wrong(cases[i].proto, cases[i].body, len, got);
    }
}

#define N(cases) (sizeof cases / sizeof cases[0])

static const peek_case native_cases[] = {
    /* The top level, anywhere among the members, with any JSON whitespace. */
    {NATIVE, "{\"timeout_ms\": 50, \"query\": [[1, 0]]}", 50},
    {NATIVE, "{\"query\": [[1, 0], [0, 1]], \"causal\": true, \"timeout_ms\": 75}", 75},
    {NATIVE, "\r\n{ \"scale\" : 0.5 ,\n\t\"timeout_ms\"\t:\r\n 40 }", 40},
    {NATIVE, "{\"query\": {\"shape\": [1, 2], \"data\": [1, 0]}, \"timeout_ms\": 60}", 60},
    /* Nested decoys: only the top-level member counts. */
    {NATIVE, "{\"query\": {\"shape\": [1], \"data\": [1], \"timeout_ms\": 5}}", 0},
    {NATIVE, "{\"weights\": {\"timeout_ms\": 5}, \"timeout_ms\": 70}", 70},
    {NATIVE, "{\"x\": [{\"timeout_ms\": 5}, [\"]\", {\"timeout_ms\": 6}]], \"timeout_ms\": 80}",
     80},
    {NATIVE, "[{\"timeout_ms\": 5}]", 0},
    /* String decoys, escaped quotes and backslashes included. */
    {NATIVE, "{\"query\": \"timeout_ms\"}", 0},
    {NATIVE, "{\"note\": \"say \\\"timeout_ms\\\": 5, {\", \"timeout_ms\": 90}", 90},
    {NATIVE, "{\"note\": \"\\\\\\\"timeout_ms\\\": 5\"}", 0},
    {NATIVE, "{\"note\": \"ends in a backslash \\\\\", \"timeout_ms\": 30}", 30},
    {NATIVE, "{\"note\": \"\\\\\\\\\", \"timeout_ms\": 31}", 31},
    {NATIVE, "{\"timeout_ms_note\": 5, \"a_timeout_ms\": 6}", 0},
    /* Absent. */
    {NATIVE, "{\"query\": [[1, 0]]}", 0},
    {NATIVE, "{}", 0},
    {NATIVE, "", 0},
    {NATIVE, "{\"timeout\": 5}", 0},
    /* Not an integer in [1, 2^40]: the route refuses it (422) or reads it as none. */
    {NATIVE, "{\"timeout_ms\": 1.5}", 0},
    {NATIVE, "{\"timeout_ms\": 100.0}", 0},
    {NATIVE, "{\"timeout_ms\": 1e2}", 0},
    {NATIVE, "{\"timeout_ms\": \"100\"}", 0},
    {NATIVE, "{\"timeout_ms\": null}", 0},
    {NATIVE, "{\"timeout_ms\": true}", 0},
    {NATIVE, "{\"timeout_ms\": -5}", 0},
    {NATIVE, "{\"timeout_ms\": 0}", 0},
    {NATIVE, "{\"timeout_ms\": 007}", 0},
    {NATIVE, "{\"timeout_ms\": 1099511627776}", (int64_t)1 << 40},
    {NATIVE, "{\"timeout_ms\": 1099511627777}", 0},
    {NATIVE, "{\"timeout_ms\": 99999999999999999999999999}", 0},
    /* A key written with escapes is not recognised: late, not wrong. */
    {NATIVE, "{\"timeout\\u005fms\": 5}", 0},
};

static const peek_case v2_cases[] = {
    {V2, "{\"parameters\": {\"timeout_ms\": 100}, \"inputs\": []}", 100},
    {V2, "{\"id\": \"1\", \"inputs\": [], \"parameters\": {\"causal\": true, \"timeout_ms\": 120}}",
     120},
    /* Triton's timeout is in microseconds, rounded up; the tighter of the two applies. */
    {V2, "{\"parameters\": {\"timeout\": 50000, \"timeout_ms\": 100}}", 50},
    {V2, "{\"parameters\": {\"timeout_ms\": 100, \"timeout\": 500000}}", 100},
    {V2, "{\"parameters\": {\"timeout\": 1500}}", 2},
    {V2, "{\"parameters\": {\"timeout\": 1}}", 1},
    {V2, "{\"parameters\": {\"timeout\": 0, \"timeout_ms\": 100}}", 100},
    /* Decoys: the top level, an input's parameters, a string. */
    {V2, "{\"timeout_ms\": 100, \"inputs\": []}", 0},
    {V2,
     "{\"inputs\": [{\"name\": \"query\", \"parameters\": {\"timeout_ms\": 5}}], "
     "\"parameters\": {\"timeout_ms\": 100}}",
     100},
    {V2, "{\"parameters\": {\"note\": {\"timeout_ms\": 5}}}", 0},
    {V2, "{\"id\": \"\\\"parameters\\\": {\\\"timeout_ms\\\": 5}\"}", 0},
    {V2, "{\"parameters\": [{\"timeout_ms\": 5}]}", 0},
    /* Not integers in range. */
    {V2, "{\"parameters\": {\"timeout_ms\": 1.5}}", 0},
    {V2, "{\"parameters\": {\"timeout\": -1}}", 0},
    {V2, "{\"parameters\": {\"timeout\": 1125899906842625}}", 0},
    {V2, "{\"parameters\": {\"timeout_ms\": null}}", 0},
};

static void test_native_reads_the_top_level_timeout_ms_only(void)
{
    check_cases(native_cases, N(native_cases));
}

static void test_v2_reads_the_top_level_parameters_only(void)
{
    check_cases(v2_cases, N(v2_cases));
}

/* With binary tensor data, only the JSON before it is read: the bytes after it are tensors,
 * whatever text they happen to hold. */
static void test_v2_binary_data_is_not_read(void)
{
    static const char json[] = "{\"inputs\": [], \"parameters\": {\"causal\": true}}";
    static const char json_timeout[] = "{\"inputs\": [], \"parameters\": {\"timeout_ms\": 70}}";
    static const char bytes[] = "\"parameters\": {\"timeout_ms\": 5}}";
    char body[256], hl[32];
    api_call call = {
        .body = body, .inference_header_length = hl, .content_type = "application/octet-stream"};

    memcpy(body, json, sizeof json - 1);
    memcpy(body + sizeof json - 1, bytes, sizeof bytes - 1);
    call.body_len = sizeof json - 1 + sizeof bytes - 1;
    snprintf(hl, sizeof hl, "%zu", sizeof json - 1);
    CHECK_EQ_INT(api_v2_timeout_peek(&call), 0);

    memcpy(body, json_timeout, sizeof json_timeout - 1);
    memcpy(body + sizeof json_timeout - 1, bytes, sizeof bytes - 1);
    call.body_len = sizeof json_timeout - 1 + sizeof bytes - 1;
    snprintf(hl, sizeof hl, " %zu ", sizeof json_timeout - 1);
    CHECK_EQ_INT(api_v2_timeout_peek(&call), 70);

    /* A header the route refuses (400): nothing is read. */
    snprintf(hl, sizeof hl, "%zu", call.body_len + 1);
    CHECK_EQ_INT(api_v2_timeout_peek(&call), 0);
    snprintf(hl, sizeof hl, "12x");
    CHECK_EQ_INT(api_v2_timeout_peek(&call), 0);
}

/* A body that says it is compressed but is not cannot be read, nor one of an unknown coding,
 * and a Content-Type the route refuses (415) has no timeout to apply. */
static void test_encoded_and_refused_bodies_give_0(void)
{
    static const char native[] = "{\"timeout_ms\": 50}";
    static const char v2[] = "{\"parameters\": {\"timeout_ms\": 50}}";
    api_call call = {.body = native, .body_len = sizeof native - 1};

    call.content_type = "application/json; charset=utf-8";
    CHECK_EQ_INT(api_timeout_peek(&call), 50);
    call.content_encoding = "identity";
    CHECK_EQ_INT(api_timeout_peek(&call), 50);
    call.content_encoding = "gzip";
    CHECK_EQ_INT(api_timeout_peek(&call), 0);
    call.content_encoding = "deflate";
    CHECK_EQ_INT(api_timeout_peek(&call), 0);
    call.content_encoding = NULL;
    call.content_type = "text/plain";
    CHECK_EQ_INT(api_timeout_peek(&call), 0);

    call.body = v2;
    call.body_len = sizeof v2 - 1;
    call.content_type = "application/x-www-form-urlencoded";
    CHECK_EQ_INT(api_v2_timeout_peek(&call), 50);
    call.content_type = "text/plain";
    CHECK_EQ_INT(api_v2_timeout_peek(&call), 0);
    call.content_type = NULL;
    call.content_encoding = "x-gzip";
    CHECK_EQ_INT(api_v2_timeout_peek(&call), 0);
}

/* The length is the body's: nothing past it is read, not even the text that would complete a
 * member (the sanitizer build checks the reads). */
static void test_reads_stop_at_the_body_length(void)
{
    static const char text[] = "{\"query\": \"abc\", \"timeout_ms\": 500}";
    size_t full = sizeof text - 1;
    for (size_t len = 0; len <= full; len++) {
        char *body = malloc(len ? len : 1);
        int64_t got;
        if (!body)
            return;
        memcpy(body, text, len);
        got = peek_body(NATIVE, body, len);
        /* Cut inside the number or after it, the body is malformed (the route says 400) and
         * may read as 5, 50 or 500. */
        CHECKF(len == full ? got == 500 : got == 0 || len >= full - 3, "len %zu: %lld", len,
               (long long)got);
        free(body);
    }
}

/* A big body: tensors as number arrays and base64 strings that hold "timeout" text, with the
 * timeout last. */
static void test_big_bodies_are_walked_exactly(void)
{
    size_t rows = 1 << 16, cap = rows * 64 + 4096, len = 0;
    char *body = malloc(cap);
    if (!body) {
        CHECK(0);
        return;
    }
    len += (size_t)snprintf(body + len, cap - len, "{\"query\": [");
    for (size_t i = 0; i < rows; i++)
        len += (size_t)snprintf(body + len, cap - len, "%s[%zu.5, -1e-3, 0]", i ? "," : "", i);
    len += (size_t)snprintf(body + len, cap - len, "], \"key\": {\"shape\": [1], \"base64\": \"");
    for (size_t i = 0; i < rows; i++)
        len += (size_t)snprintf(body + len, cap - len, "timeout_ms\\\":9}");
    len += (size_t)snprintf(body + len, cap - len, "\"}");
    CHECK_EQ_INT(peek_body(NATIVE, body, len), 0);
    len += (size_t)snprintf(body + len, cap - len, ", \"timeout_ms\": 250}");
    CHECK_EQ_INT(peek_body(NATIVE, body, len), 250);
    free(body);
}

/* Random edits of the cases above: the peek never reads outside the body and never gives a
 * timeout other than the route's. */
static void test_mutations_are_never_wrong(void)
{
    static const char alphabet[] = "\"\\{}[],: 0123456789.e-tx";
    const peek_case *sets[] = {native_cases, v2_cases};
    size_t counts[] = {N(native_cases), N(v2_cases)};
    uint64_t rng = 12345;
    for (int s = 0; s < 2; s++) {
        for (size_t i = 0; i < counts[s]; i++) {
            size_t len = strlen(sets[s][i].body);
            if (len == 0)
                continue;
            for (int round = 0; round < 300; round++) {
                char *body = malloc(len);
                if (!body)
                    return;
                memcpy(body, sets[s][i].body, len);
                for (int edits = 1 + round % 3; edits > 0; edits--) {
                    body[rng_below(&rng, len)] = alphabet[rng_below(&rng, sizeof alphabet - 1)];
                }
                check_never_wrong(sets[s][i].proto, body, len,
                                  peek_body(sets[s][i].proto, body, len));
                free(body);
                if (check__failures_in_test > 5)
                    return;
            }
        }
    }
}

/* Triton's "priority" comes out of the same walk of v2 "parameters" as the timeout: as written
 * (the route checks it against --priority-levels), 0 when absent, not an integer in [0, 2^32),
 * or a decoy; the native routes take none. */
typedef struct {
    const char *body;
    uint64_t priority;
    int64_t timeout_ms;
} priority_case;

static void test_v2_priority_is_read_in_the_same_walk(void)
{
    static const priority_case cases[] = {
        {"{\"parameters\": {\"priority\": 1}, \"inputs\": []}", 1, 0},
        {"{\"inputs\": [], \"parameters\": {\"timeout\": 2000, \"priority\": 3}}", 3, 2},
        {"{\"parameters\": {\"priority\": 2, \"timeout_ms\": 40, \"causal\": true}}", 2, 40},
        {"{\"parameters\": {\"priority\": 0}}", 0, 0},
        {"{\"parameters\": {\"priority\": 4294967295}}", 4294967295u, 0},
        /* Unreadable: the route refuses the body, so neither value matters. */
        {"{\"parameters\": {\"priority\": 4294967296, \"timeout_ms\": 40}}", 0, 0},
        {"{\"parameters\": {\"priority\": -1}}", 0, 0},
        {"{\"parameters\": {\"priority\": 1.0}}", 0, 0},
        {"{\"parameters\": {\"priority\": \"1\"}}", 0, 0},
        /* Decoys: the top level, an input's parameters, a nested object, a string. */
        {"{\"priority\": 1, \"parameters\": {}}", 0, 0},
        {"{\"inputs\": [{\"parameters\": {\"priority\": 1}}]}", 0, 0},
        {"{\"parameters\": {\"headers\": {\"priority\": 1}}}", 0, 0},
        {"{\"id\": \"\\\"parameters\\\": {\\\"priority\\\": 1}\"}", 0, 0},
    };
    for (size_t i = 0; i < N(cases); i++) {
        api_call call = {.body = cases[i].body, .body_len = strlen(cases[i].body)};
        api_peek p;
        api_peek_v2(&call, &p);
        CHECKF(p.priority == cases[i].priority && p.timeout_ms == cases[i].timeout_ms,
               "%s: priority %llu timeout %lld, want %llu and %lld", cases[i].body,
               (unsigned long long)p.priority, (long long)p.timeout_ms,
               (unsigned long long)cases[i].priority, (long long)cases[i].timeout_ms);
    }
    static const char native[] = "{\"priority\": 1, \"timeout_ms\": 30}";
    api_call call = {.body = native, .body_len = sizeof native - 1};
    api_peek p;
    api_peek_native(&call, &p);
    CHECK(p.priority == 0 && p.timeout_ms == 30);
}

/* Triton's "sequence_id" as v2_request.c reads it, through jansson, into id[72]: a string's
 * value or an integer's digits; "" when there is none (absent, 0, "", or another type), and
 * false when the body is not valid JSON (the route answers 400). */
static bool reference_sequence_id(const char *body, size_t len, char id[72])
{
    json_error_t e;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &e);
    json_t *v = json_object_get(json_object_get(root, "parameters"), "sequence_id");
    id[0] = '\0';
    if (!root)
        return false;
    if (json_is_string(v) && json_string_length(v) < 72)
        snprintf(id, 72, "%s", json_string_value(v));
    else if (json_is_integer(v) && json_integer_value(v) > 0)
        snprintf(id, 72, "%lld", (long long)json_integer_value(v));
    json_decref(root);
    return true;
}

/* A peeked sequence_id is none or the route's own (compared where it holds no escape, which
 * the peek leaves as written). */
static void check_sequence_never_wrong(const char *body, size_t len, const api_peek *p)
{
    char ref[72];
    if (!p->sequence_id || !reference_sequence_id(body, len, ref) ||
        memchr(p->sequence_id, '\\', p->sequence_id_len))
        return;
    CHECKF(p->sequence_id_len == strlen(ref) && memcmp(p->sequence_id, ref, strlen(ref)) == 0,
           "%.*s: peeked sequence %.*s, the route reads \"%s\"", (int)len, body,
           (int)p->sequence_id_len, p->sequence_id, ref);
}

typedef struct {
    const char *body;
    const char *sequence_id; /* as written; NULL: none */
    uint64_t priority;
    int64_t timeout_ms;
} sequence_case;

static const sequence_case sequence_cases[] = {
    /* A number, a string, beside the other values the walk reads. */
    {"{\"parameters\": {\"sequence_id\": 42}, \"inputs\": []}", "42", 0, 0},
    {"{\"inputs\": [], \"parameters\": {\"sequence_id\": \"chat-7\", \"sequence_start\": true}}",
     "chat-7", 0, 0},
    {"{\"parameters\": {\"priority\": 1, \"sequence_id\": 9223372036854775807, "
     "\"timeout_ms\": 30, \"sequence_end\": true}}",
     "9223372036854775807", 1, 30},
    {"{\"parameters\": {\"sequence_id\" : \t\"7\" }}", "7", 0, 0},
    /* A string is taken as written: escapes are not undone. */
    {"{\"parameters\": {\"sequence_id\": \"a\\\"b\\\\\"}}", "a\\\"b\\\\", 0, 0},
    /* None, as Triton reads 0 and "". */
    {"{\"parameters\": {\"sequence_id\": 0, \"priority\": 2}}", NULL, 2, 0},
    {"{\"parameters\": {\"sequence_id\": \"\", \"priority\": 2}}", NULL, 2, 0},
    /* Absent. */
    {"{\"parameters\": {\"sequence_start\": true}, \"inputs\": []}", NULL, 0, 0},
    {"{\"inputs\": []}", NULL, 0, 0},
    {"", NULL, 0, 0},
    /* Decoys: the top level, an input's parameters, a nested object, strings. */
    {"{\"sequence_id\": 5, \"parameters\": {}}", NULL, 0, 0},
    {"{\"inputs\": [{\"name\": \"query\", \"parameters\": {\"sequence_id\": 5}}], "
     "\"parameters\": {\"timeout_ms\": 9}}",
     NULL, 0, 9},
    {"{\"parameters\": {\"headers\": {\"sequence_id\": 5}}}", NULL, 0, 0},
    {"{\"id\": \"\\\"parameters\\\": {\\\"sequence_id\\\": 5}\"}", NULL, 0, 0},
    {"{\"parameters\": {\"note\": \"\\\"sequence_id\\\": 5\"}}", NULL, 0, 0},
    {"{\"parameters\": {\"sequence_id_x\": 5, \"x_sequence_id\": 6}}", NULL, 0, 0},
    /* Not an unsigned integer or a string: the route refuses the body, so nothing is read. */
    {"{\"parameters\": {\"timeout_ms\": 40, \"sequence_id\": -1}}", NULL, 0, 0},
    {"{\"parameters\": {\"timeout_ms\": 40, \"sequence_id\": 1.0}}", NULL, 0, 0},
    {"{\"parameters\": {\"timeout_ms\": 40, \"sequence_id\": 1e3}}", NULL, 0, 0},
    {"{\"parameters\": {\"timeout_ms\": 40, \"sequence_id\": 007}}", NULL, 0, 0},
    {"{\"parameters\": {\"timeout_ms\": 40, \"sequence_id\": null}}", NULL, 0, 0},
    {"{\"parameters\": {\"timeout_ms\": 40, \"sequence_id\": [7]}}", NULL, 0, 0},
    /* A key written with escapes is not recognised (the request is then ordered with no one). */
    {"{\"parameters\": {\"sequence\\u005fid\": 5}}", NULL, 0, 0},
};

static void check_sequence_case(const sequence_case *c, const api_peek *p)
{
    bool id_ok = c->sequence_id
                     ? p->sequence_id && p->sequence_id_len == strlen(c->sequence_id) &&
                           memcmp(p->sequence_id, c->sequence_id, p->sequence_id_len) == 0
                     : p->sequence_id == NULL && p->sequence_id_len == 0;
    CHECKF(id_ok && p->priority == c->priority && p->timeout_ms == c->timeout_ms,
           "%s: sequence %.*s priority %llu timeout %lld, want %s, %llu and %lld", c->body,
           (int)p->sequence_id_len, p->sequence_id ? p->sequence_id : "(none)",
           (unsigned long long)p->priority, (long long)p->timeout_ms,
           c->sequence_id ? c->sequence_id : "(none)", (unsigned long long)c->priority,
           (long long)c->timeout_ms);
}

static void test_v2_sequence_id_is_read_in_the_same_walk(void)
{
    for (size_t i = 0; i < N(sequence_cases); i++) {
        const char *body = sequence_cases[i].body;
        api_call call = {.body = body, .body_len = strlen(body)};
        api_peek p;
        api_peek_v2(&call, &p);
        check_sequence_case(&sequence_cases[i], &p);
        check_sequence_never_wrong(body, strlen(body), &p);
    }
    /* The native routes have no sequences. */
    static const char native[] = "{\"parameters\": {\"sequence_id\": 5}, \"sequence_id\": 6}";
    api_call call = {.body = native, .body_len = sizeof native - 1};
    api_peek p;
    api_peek_native(&call, &p);
    CHECK(p.sequence_id == NULL);
}

/* With binary tensor data, a sequence_id in the bytes after the JSON is not one; and the
 * id points into the body, inside the JSON part. */
static void test_v2_sequence_id_in_binary_data_is_not_read(void)
{
    static const char json[] = "{\"inputs\": [], \"parameters\": {\"causal\": true}}";
    static const char json_seq[] = "{\"inputs\": [], \"parameters\": {\"sequence_id\": 77}}";
    static const char bytes[] = "\"parameters\": {\"sequence_id\": 5}}";
    char body[256], hl[32];
    api_call call = {
        .body = body, .inference_header_length = hl, .content_type = "application/octet-stream"};
    api_peek p;

    memcpy(body, json, sizeof json - 1);
    memcpy(body + sizeof json - 1, bytes, sizeof bytes - 1);
    call.body_len = sizeof json - 1 + sizeof bytes - 1;
    snprintf(hl, sizeof hl, "%zu", sizeof json - 1);
    api_peek_v2(&call, &p);
    CHECK(p.sequence_id == NULL);

    memcpy(body, json_seq, sizeof json_seq - 1);
    memcpy(body + sizeof json_seq - 1, bytes, sizeof bytes - 1);
    call.body_len = sizeof json_seq - 1 + sizeof bytes - 1;
    snprintf(hl, sizeof hl, "%zu", sizeof json_seq - 1);
    api_peek_v2(&call, &p);
    CHECK(p.sequence_id == body + (strstr(json_seq, "77") - json_seq) && p.sequence_id_len == 2);
}

/* Random edits of the sequence cases: never a sequence other than the route's, never a read
 * outside the body. */
static void test_sequence_mutations_are_never_wrong(void)
{
    static const char alphabet[] = "\"\\{}[],: 0123456789.e-sx";
    uint64_t rng = 99;
    for (size_t i = 0; i < N(sequence_cases); i++) {
        size_t len = strlen(sequence_cases[i].body);
        if (len == 0)
            continue;
        for (int round = 0; round < 300; round++) {
            char *body = malloc(len);
            api_peek p;
            if (!body)
                return;
            memcpy(body, sequence_cases[i].body, len);
            for (int edits = 1 + round % 3; edits > 0; edits--)
                body[rng_below(&rng, len)] = alphabet[rng_below(&rng, sizeof alphabet - 1)];
            api_call call = {.body = body, .body_len = len};
            api_peek_v2(&call, &p);
            CHECK(!p.sequence_id ||
                  (p.sequence_id >= body && p.sequence_id + p.sequence_id_len <= body + len));
            check_sequence_never_wrong(body, len, &p);
            free(body);
            if (check__failures_in_test > 5)
                return;
        }
    }
}

/* A peeked session is "" or exactly the top-level "session" string the route reads (jansson)
 * from a valid body. */
static void check_session_never_wrong(const char *body, size_t len, const char *got)
{
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, NULL);
    const char *ref = json_string_value(json_object_get(root, "session"));
    CHECKF(!got[0] || !root || (ref && strcmp(ref, got) == 0),
           "%.*s: peeked \"%s\", the route reads %s", (int)len, body, got, ref ? ref : "none");
    json_decref(root);
}

typedef struct {
    const char *body;
    const char *session;
    int64_t timeout_ms;
} session_case;

static const session_case session_cases[] = {
    {"{\"session\": \"s0123abcd\", \"input\": [[1, 0]]}", "s0123abcd", 0},
    {"{\"input\": [[1, 0]], \"timeout_ms\": 20, \"session\": \"s1\"}", "s1", 20},
    {"{\"session\" : \"s2\" ,\n \"timeout_ms\": 30}", "s2", 30},
    /* Not an id the walk copies: too long, escaped, empty, not a string. The timeout after it
     * is still read. */
    {"{\"session\": \"s0123456789012345678901234567890123456789\", \"timeout_ms\": 40}", "", 40},
    {"{\"session\": \"s\\u0030\", \"timeout_ms\": 41}", "", 41},
    {"{\"session\": \"\", \"timeout_ms\": 42}", "", 42},
    {"{\"session\": 12, \"timeout_ms\": 43}", "", 43},
    {"{\"session\": null}", "", 0},
    /* Decoys: nested, in a string, another key. */
    {"{\"weights\": {\"session\": \"s3\"}}", "", 0},
    {"{\"note\": \"\\\"session\\\": \\\"s4\\\"\"}", "", 0},
    {"{\"sessions\": \"s5\", \"a_session\": \"s6\"}", "", 0},
    {"[{\"session\": \"s7\"}]", "", 0},
};

static void test_native_session_is_read_in_the_same_walk(void)
{
    for (size_t i = 0; i < N(session_cases); i++) {
        const session_case *c = &session_cases[i];
        api_call call = {.body = c->body, .body_len = strlen(c->body)};
        api_peek p;
        api_peek_native(&call, &p);
        CHECKF(strcmp(p.session, c->session) == 0 && p.timeout_ms == c->timeout_ms,
               "%s: session \"%s\" timeout %lld, want \"%s\" and %lld", c->body, p.session,
               (long long)p.timeout_ms, c->session, (long long)c->timeout_ms);
        check_session_never_wrong(c->body, call.body_len, p.session);
    }
    /* Nor one of a Content-Type the route refuses. */
    static const char body[] = "{\"session\": \"s8\"}";
    api_call call = {.body = body, .body_len = sizeof body - 1, .content_type = "text/plain"};
    api_peek p;
    api_peek_native(&call, &p);
    CHECK(p.session[0] == '\0');
}

/* Random edits of the session cases: never another session than the route's. */
static void test_session_mutations_are_never_wrong(void)
{
    static const char alphabet[] = "\"\\{}[],: 0123456789sion";
    uint64_t rng = 54321;
    for (size_t i = 0; i < N(session_cases); i++) {
        size_t len = strlen(session_cases[i].body);
        for (int round = 0; round < 300; round++) {
            char *body = malloc(len);
            if (!body)
                return;
            memcpy(body, session_cases[i].body, len);
            for (int edits = 1 + round % 3; edits > 0; edits--)
                body[rng_below(&rng, len)] = alphabet[rng_below(&rng, sizeof alphabet - 1)];
            api_call call = {.body = body, .body_len = len};
            api_peek p;
            api_peek_native(&call, &p);
            check_session_never_wrong(body, len, p.session);
            free(body);
            if (check__failures_in_test > 5)
                return;
        }
    }
}

/* {"pad": "aaa...", "session": "s10"}, len bytes in all. */
static char *padded_session_body(size_t len)
{
    static const char head[] = "{\"pad\": \"", tail[] = "\", \"session\": \"s10\"}";
    char *text = xcalloc(len + 1, 1);
    memset(text, 'a', len);
    memcpy(text, head, sizeof head - 1);
    memcpy(text + len - (sizeof tail - 1), tail, sizeof tail - 1);
    return text;
}

/* A gzip or deflate body is inflated for the walk, up to API_PEEK_INFLATE_MAX bytes of it: a
 * step's session, a sequence's id (pointing into the inflated text) and the timeout come out
 * as from the plain body, reserved through the call's lease until api_peek_free. Past the cap,
 * or for a stream that does not inflate, nothing is read and the peek says so (unread). */
static void test_compressed_bodies_are_inflated_up_to_the_cap(void)
{
    static const char native[] = "{\"input\": [1, 2], \"session\": \"s9\", \"timeout_ms\": 70}";
    static const char v2[] = "{\"parameters\": {\"sequence_id\": \"chat-7\", \"priority\": 2}}";
    api_budget *budget = api_budget_new((size_t)64 << 20);
    api_lease lease;
    api_lease_start(&lease, budget, 0, 0);
    size_t n;
    char *packed = zlib_pack(native, sizeof native - 1, 31, &n);
    api_call call = {.body = packed, .body_len = n, .content_encoding = "gzip", .lease = &lease};
    api_peek p;
    api_peek_native(&call, &p);
    CHECK(strcmp(p.session, "s9") == 0 && p.timeout_ms == 70 && !p.unread);
    CHECK(api_budget_in_use(budget) >= sizeof native - 1); /* the inflated text is reserved */
    api_peek_free(&p);
    CHECK_EQ_INT(api_budget_in_use(budget), 0);
    api_peek_free(&p); /* a second free is a no-op */
    free(packed);

    packed = zlib_pack(v2, sizeof v2 - 1, 15, &n);
    call = (api_call){.body = packed, .body_len = n, .content_encoding = "deflate"};
    api_peek_v2(&call, &p); /* no lease: nothing reserved */
    CHECK(p.sequence_id && p.sequence_id_len == 6 && memcmp(p.sequence_id, "chat-7", 6) == 0 &&
          p.priority == 2 && !p.unread);
    api_peek_free(&p);
    free(packed);

    /* At the cap the session at the end of the text is read; one byte past it, nothing is. */
    for (size_t extra = 0; extra <= 1; extra++) {
        size_t len = API_PEEK_INFLATE_MAX + extra;
        char *text = padded_session_body(len);
        packed = zlib_pack(text, len, 31, &n);
        call =
            (api_call){.body = packed, .body_len = n, .content_encoding = "gzip", .lease = &lease};
        api_peek_native(&call, &p);
        if (extra == 0)
            CHECK(!p.unread && strcmp(p.session, "s10") == 0);
        else
            CHECK(p.unread && p.session[0] == '\0' && p.inflated == NULL);
        api_peek_free(&p);
        CHECK_EQ_INT(api_budget_in_use(budget), 0);
        free(packed);
        free(text);
    }

    call = (api_call){.body = native, .body_len = sizeof native - 1, .content_encoding = "gzip"};
    api_peek_native(&call, &p); /* not gzip at all */
    CHECK(p.unread && p.session[0] == '\0');
    call.content_encoding = "br"; /* unknown: the route answers 415 */
    api_peek_native(&call, &p);
    CHECK(!p.unread && p.session[0] == '\0');
    api_lease_end(&lease);
    api_budget_free(budget);
}

int main(void)
{
    RUN(test_native_reads_the_top_level_timeout_ms_only);
    RUN(test_v2_reads_the_top_level_parameters_only);
    RUN(test_v2_binary_data_is_not_read);
    RUN(test_encoded_and_refused_bodies_give_0);
    RUN(test_reads_stop_at_the_body_length);
    RUN(test_big_bodies_are_walked_exactly);
    RUN(test_mutations_are_never_wrong);
    RUN(test_v2_priority_is_read_in_the_same_walk);
    RUN(test_v2_sequence_id_is_read_in_the_same_walk);
    RUN(test_v2_sequence_id_in_binary_data_is_not_read);
    RUN(test_sequence_mutations_are_never_wrong);
    RUN(test_native_session_is_read_in_the_same_walk);
    RUN(test_session_mutations_are_never_wrong);
    RUN(test_compressed_bodies_are_inflated_up_to_the_cap);
    return check_report();
}
