/*
 * test_robustness.c - hostile and malformed input against a real attnd: every case gets its
 * expected status and a well-formed JSON error (parsed here with jansson: valid UTF-8, an
 * object {"error": {"code", "message", "field"}} with the expected code, field and a message
 * naming the limit where one applies), the rejection is counted under the expected
 * attnd_rejected_total{reason}, and a normal request right after it still succeeds with the
 * right numbers.
 *
 * Cases: malformed JSON, empty body, wrong types, zero/negative/fractional/huge dimensions, a
 * shape product that overflows, data length not matching the shape, NaN/Infinity/1e999
 * literals, 3.5e38 (a finite double, inf as float32), nesting 150,000 levels deep, duplicate
 * keys, invalid UTF-8, wrong content types and encodings, ambiguous framing (two
 * Content-Length headers, chunked with Content-Length, an unknown transfer coding), bodies at
 * the cap and one byte over (Content-Length and chunked), 1,000,000 one-byte chunks, and a
 * Content-Length that promises more than is sent (the client waits, or hangs up).
 *
 * One daemon serves every case (--max-body-bytes 1000000: small enough that the cap cases are
 * cheap, large enough that the 150,000-deep bodies reach the parser). The whole set runs twice:
 * the first round is the warm-up, after which the daemon's RSS and open descriptors are the
 * baseline; after the second round they must be flat (see test_rss_and_fds_are_flat). A
 * last test shows that rejections while draining are counted as reason="draining", the one
 * reason the other suites produce but do not count.
 */
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/support/check.h"
#include "tests/support/daemon.h"

#define CAP 1000000 /* --max-body-bytes below */
/* --receive-timeout-s below: how long a client that promised more bytes is waited for. */
#define RECEIVE_TIMEOUT_S 2

static daemon_proc d;

static const char seed[] = "{\"query\": [[1, 0], [0, 1], [1, 1]], \"key\": [[1, 0], [0, 1], "
                           "[1, 1]], \"value\": [[1, 0], [0, 2], [3, 1]], \"causal\": true}";

/* ---- Checks shared by every case ----------------------------------------------------------- */

/* The daemon still answers a normal request, with the right numbers. */
static void check_still_serving(const char *after)
{
    http_resp r;
    double out[6] = {0};
    long status = http_post_json(NULL, d.port, seed, &r);
    CHECKF(status == 200, "after %s: a normal request got %ld (%s)", after, status,
           status ? r.body : r.error);
    CHECKF(json_numbers(r.body, "output", out, 6) == 6, "after %s: output %.200s", after, r.body);
    CHECK_NEAR(out[3], 1.33952310, 1e-5);
    http_resp_free(&r);
}

static double rejected(const char *reason)
{
    char series[96];
    double v;
    snprintf(series, sizeof series, "attnd_rejected_total{reason=\"%s\"}", reason);
    v = metric_value(d.port, series);
    return v < 0 ? 0 : v;
}

/* Waits until the counter of `reason` is `before + 1`, and checks it went no further. */
static void check_counted(const char *what, const char *reason, double before)
{
    char series[96];
    snprintf(series, sizeof series, "attnd_rejected_total{reason=\"%s\"}", reason);
    metric_wait(d.port, series, before + 1, 3000);
    CHECKF(rejected(reason) == before + 1, "%s: %s went from %.0f to %.0f, not up by one", what,
           reason, before, rejected(reason));
}

/* What a case must get back. */
typedef struct {
    int status;
    const char *code;     /* error.code */
    const char *field;    /* error.field; NULL: not checked; "": must be null */
    const char *mentions; /* a substring of error.message (case-insensitive), or NULL */
    const char *reason;   /* the attnd_rejected_total reason it counts as */
} expect;

/* `body` (len bytes) is a native error reply as `e` describes. */
static void check_error_body(const char *what, const char *body, size_t len, const expect *e)
{
    json_error_t jerr;
    json_t *root = json_loadb(body ? body : "", body ? len : 0, JSON_REJECT_DUPLICATES, &jerr);
    json_t *err = json_object_get(root, "error");
    const char *code = json_string_value(json_object_get(err, "code"));
    const char *msg = json_string_value(json_object_get(err, "message"));
    json_t *field = json_object_get(err, "field");

    CHECKF(root != NULL, "%s: the body is not valid JSON (%s): %.200s", what, jerr.text,
           body ? body : "");
    CHECKF(json_is_object(err), "%s: no error object: %.200s", what, body ? body : "");
    CHECKF(code && strcmp(code, e->code) == 0, "%s: code %s, want %s", what, code ? code : "-",
           e->code);
    CHECKF(msg && msg[0], "%s: no message", what);
    if (e->mentions)
        CHECKF(msg && strcasestr(msg, e->mentions), "%s: message \"%s\" does not mention %s", what,
               msg ? msg : "", e->mentions);
    CHECKF(field != NULL, "%s: no \"field\" member", what);
    if (e->field && !e->field[0])
        CHECKF(json_is_null(field), "%s: field is %s, want null", what,
               json_string_value(field) ? json_string_value(field) : "?");
    else if (e->field)
        CHECKF(json_string_value(field) && strcmp(json_string_value(field), e->field) == 0,
               "%s: field %s, want %s", what,
               json_string_value(field) ? json_string_value(field) : "null", e->field);
    json_decref(root);
}

/* POSTs `body` to /v1/attention with `headers` (NULL: JSON) and checks the reply, the
 * counter and that the daemon still serves. */
static void post_case(const char *what, const char *const *headers, const char *body, size_t len,
                      const expect *e)
{
    static const char *const json[] = {"Content-Type: application/json", NULL};
    double before = rejected(e->reason);
    http_resp r;
    long status =
        http_do(NULL, d.port, "POST", "/v1/attention", headers ? headers : json, body, len, &r);
    CHECKF(status == e->status, "%s: status %ld, want %d (%s%.200s)", what, status, e->status,
           r.error, r.body);
    if (status == e->status) {
        CHECKF(strstr(r.content_type, "application/json") != NULL, "%s: Content-Type %s", what,
               r.content_type);
        check_error_body(what, r.body, r.body_len, e);
        check_counted(what, e->reason, before);
    }
    http_resp_free(&r);
    check_still_serving(what);
}

/* The body of a raw HTTP response text (after the blank line). */
static const char *raw_body(const char *resp, size_t *len)
{
    const char *p = resp ? strstr(resp, "\r\n\r\n") : NULL;
    if (!p) {
        *len = 0;
        return "";
    }
    p += 4;
    *len = strlen(p);
    return p;
}

/* Sends a raw request, reads until the server closes, and checks the reply like post_case;
 * `must_close`: the reply says Connection: close (the body was not, or not all, read). */
static void raw_case(const char *what, const char *request, size_t len, const expect *e,
                     bool must_close)
{
    double before = rejected(e->reason);
    char *resp = raw_exchange(d.port, request, len, 15000);
    int status = raw_status(resp);
    CHECKF(status == e->status, "%s: status %d, want %d (%.200s)", what, status, e->status,
           resp ? resp : "no response");
    if (status == e->status) {
        size_t blen;
        const char *body = raw_body(resp, &blen);
        if (must_close)
            CHECKF(strcasestr(resp, "\r\nConnection: close\r\n") != NULL,
                   "%s: the connection is kept open: %.200s", what, resp);
        check_error_body(what, body, blen, e);
        check_counted(what, e->reason, before);
    }
    free(resp);
    check_still_serving(what);
}

/* ---- JSON bodies that are wrong -------------------------------------------------------------- */

#define QKV_TAIL "\"key\": [[1, 0], [0, 1]], \"value\": [[1, 0], [0, 1]]"

typedef struct {
    const char *name;
    const char *body;
    expect e;
} json_case;

#define BAD(status, field, mentions)                                                               \
    {                                                                                              \
        status, status == 400 ? "malformed_request" : "invalid_argument", field, mentions,         \
            "bad_request"                                                                          \
    }
#define BIG(field, mentions)                                                                       \
    {                                                                                              \
        413, "too_large", field, mentions, "too_large"                                             \
    }

static const json_case malformed_cases[] = {
    {"truncated", "{\"query\": [[1, 0]], \"key\": ", BAD(400, "", "malformed JSON")},
    {"trailing comma", "{\"query\": [[1, 0],], " QKV_TAIL "}", BAD(400, "", "malformed JSON")},
    {"single quotes", "{'query': [[1, 0]]}", BAD(400, "", "malformed JSON")},
    {"two documents", "{\"query\": [[1, 0]], " QKV_TAIL "} {}", BAD(400, "", "malformed JSON")},
    {"bare word", "attention", BAD(400, "", "malformed JSON")},
    {"unterminated string", "{\"query", BAD(400, "", "malformed JSON")},
    {"empty body", "", BAD(400, "", "malformed JSON")},
    {"whitespace only", " \r\n\t ", BAD(400, "", "malformed JSON")},
};

static const json_case type_cases[] = {
    {"body is an array", "[[1, 0]]", BAD(422, "", "object")},
    {"body is a number", "42", BAD(400, "", NULL)},
    {"query is a string", "{\"query\": \"[[1, 0]]\", " QKV_TAIL "}", BAD(422, "query", NULL)},
    {"query holds a string", "{\"query\": [[1, \"0\"]], " QKV_TAIL "}", BAD(422, NULL, NULL)},
    {"query holds null", "{\"query\": [[1, null]], " QKV_TAIL "}", BAD(422, NULL, NULL)},
    {"query is missing", "{" QKV_TAIL "}", BAD(422, "query", NULL)},
    {"shape is a string", "{\"query\": {\"shape\": \"1x2\", \"data\": [1, 0]}, " QKV_TAIL "}",
     BAD(422, "query.shape", NULL)},
    {"num_heads is a string", "{\"query\": [[1, 0]], " QKV_TAIL ", \"num_heads\": \"1\"}",
     BAD(422, "num_heads", NULL)},
    {"causal is a number", "{\"query\": [[1, 0]], " QKV_TAIL ", \"causal\": 1}",
     BAD(422, "causal", NULL)},
    {"scale is a string", "{\"query\": [[1, 0]], " QKV_TAIL ", \"scale\": \"big\"}",
     BAD(422, "scale", NULL)},
    {"return_lse is a string", "{\"query\": [[1, 0]], " QKV_TAIL ", \"return_lse\": \"yes\"}",
     BAD(422, "return_lse", NULL)},
    {"window is a number", "{\"query\": [[1, 0]], " QKV_TAIL ", \"window\": 3}",
     BAD(422, "window", NULL)},
    {"mask of numbers", "{\"query\": [[1, 0]], " QKV_TAIL ", \"key_padding_mask\": [1, 0]}",
     BAD(422, "key_padding_mask", NULL)},
    {"dtype unknown",
     "{\"query\": {\"shape\": [1, 2], \"dtype\": \"float64\", \"base64\": "
     "\"AAAAAAAA8D8AAAAAAAAAAA==\"}, " QKV_TAIL "}",
     BAD(422, "query.dtype", "dtype")},
    {"unknown field", "{\"query\": [[1, 0]], " QKV_TAIL ", \"casual\": true}",
     BAD(422, "casual", "causal")},
};

static const json_case dimension_cases[] = {
    {"zero dimension", "{\"query\": {\"shape\": [1, 0], \"data\": []}, " QKV_TAIL "}",
     BAD(422, "query.shape[1]", NULL)},
    {"empty nested array", "{\"query\": [[]], " QKV_TAIL "}", BAD(422, NULL, NULL)},
    {"empty outer array", "{\"query\": [], " QKV_TAIL "}", BAD(422, NULL, NULL)},
    {"negative dimension", "{\"query\": {\"shape\": [-1, 2], \"data\": [1, 0]}, " QKV_TAIL "}",
     BAD(422, "query.shape[0]", NULL)},
    {"fractional dimension", "{\"query\": {\"shape\": [1, 2.5], \"data\": [1, 0]}, " QKV_TAIL "}",
     BAD(422, "query.shape[1]", NULL)},
    {"dimension 2.0", "{\"query\": {\"shape\": [1, 2.0], \"data\": [1, 0]}, " QKV_TAIL "}",
     BAD(422, "query.shape[1]", NULL)},
    {"huge dimension",
     "{\"query\": {\"shape\": [9223372036854775807, 2], \"data\": [1, 0]}, " QKV_TAIL "}",
     BIG("query.shape", "--max-elements")},
    {"dimension beyond int64",
     "{\"query\": {\"shape\": [18446744073709551616, 2], \"data\": [1, 0]}, " QKV_TAIL "}",
     BAD(422, "query.shape[0]", "beyond the range")},
    {"dimension 1e300", "{\"query\": {\"shape\": [1e300, 2], \"data\": [1, 0]}, " QKV_TAIL "}",
     BAD(422, "query.shape[0]", NULL)},
    {"rank 9",
     "{\"query\": {\"shape\": [1, 1, 1, 1, 1, 1, 1, 1, 2], \"data\": [1, 0]}, " QKV_TAIL "}",
     BAD(422, NULL, NULL)},
    {"num_heads zero", "{\"query\": [[1, 0]], " QKV_TAIL ", \"num_heads\": 0}",
     BAD(422, "num_heads", NULL)},
    {"num_heads negative", "{\"query\": [[1, 0]], " QKV_TAIL ", \"num_heads\": -2}",
     BAD(422, "num_heads", NULL)},
    {"num_heads fractional", "{\"query\": [[1, 0]], " QKV_TAIL ", \"num_heads\": 1.5}",
     BAD(422, "num_heads", NULL)},
    {"num_heads huge", "{\"query\": [[1, 0]], " QKV_TAIL ", \"num_heads\": 4294967296}",
     BAD(422, "num_heads", NULL)},
    {"shape product overflows size_t",
     "{\"query\": {\"shape\": [4294967296, 4294967296, 4294967296], \"data\": [1]}, " QKV_TAIL "}",
     BIG("query.shape", "--max-elements")},
    {"shape product overflows, base64",
     "{\"query\": {\"shape\": [65536, 65536, 65536, 65536, 65536], \"dtype\": \"float32\", "
     "\"base64\": \"AACAPw==\"}, " QKV_TAIL "}",
     BIG("query.shape", "--max-elements")},
    {"data shorter than the shape",
     "{\"query\": {\"shape\": [2, 2], \"data\": [1, 0, 0]}, " QKV_TAIL "}",
     BAD(422, "query.data", NULL)},
    {"data longer than the shape",
     "{\"query\": {\"shape\": [1, 2], \"data\": [1, 0, 0]}, " QKV_TAIL "}",
     BAD(422, "query.data", NULL)},
    {"base64 shorter than the shape",
     "{\"query\": {\"shape\": [1, 2], \"dtype\": \"float32\", \"base64\": \"AACAPw==\"}, " QKV_TAIL
     "}",
     BAD(422, "query.base64", NULL)},
    {"ragged nesting", "{\"query\": [[1, 0], [1]], " QKV_TAIL "}", BAD(422, "query[1]", NULL)},
    {"key shorter than value",
     "{\"query\": [[1, 0]], \"key\": [[1, 0]], \"value\": [[1, 0], [0, 1]]}", BAD(422, NULL, NULL)},
};

static const json_case number_cases[] = {
    /* Read as Python's json module writes them; a query must be finite. */
    {"NaN", "{\"query\": [[NaN, 0]], " QKV_TAIL "}", BAD(422, "query[0][0]", "is NaN")},
    {"Infinity", "{\"query\": [[Infinity, 0]], " QKV_TAIL "}",
     BAD(422, "query[0][0]", "is Infinity")},
    {"-Infinity", "{\"query\": [[-Infinity, 0]], " QKV_TAIL "}",
     BAD(422, "query[0][0]", "is -Infinity")},
    {"1e999", "{\"query\": [[1e999, 0]], " QKV_TAIL "}", BAD(422, "query[0][0]", "overflow")},
    {"-1e999", "{\"query\": [[-1e999, 0]], " QKV_TAIL "}", BAD(422, "query[0][0]", "overflow")},
    {"1e999 in a long array",
     "{\"query\": [[1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1e999]], \"key\": [[1, 0, 0, 0, "
     "0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]], \"value\": [[1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, "
     "0, 0]]}",
     BAD(422, "query[0][15]", "overflow")},
    {"3.5e38", "{\"query\": [[3.5e38, 0]], " QKV_TAIL "}", BAD(422, "query[0][0]", "float32")},
    {"-3.5e38", "{\"query\": [[0, -3.5e38]], " QKV_TAIL "}", BAD(422, "query[0][1]", "float32")},
    {"3.5e38 in a long array",
     "{\"query\": [[1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3.5e38]], \"key\": [[1, 0, 0, 0, "
     "0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]], \"value\": [[1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, "
     "0, 0]]}",
     BAD(422, "query[0][15]", "float32")},
    {"3.5e38 in flat data", "{\"query\": {\"shape\": [1, 2], \"data\": [3.5e38, 0]}, " QKV_TAIL "}",
     BAD(422, "query.data[0]", "float32")},
    {"3.5e38 as scale", "{\"query\": [[1, 0]], " QKV_TAIL ", \"scale\": 3.5e38}",
     BAD(422, "scale", "float32")},
    {"NaN in base64 float32",
     "{\"query\": {\"shape\": [1, 2], \"dtype\": \"float32\", \"base64\": "
     "\"AADAfwAAAAA=\"}, " QKV_TAIL "}",
     BAD(422, NULL, NULL)},
    {"infinity in base64 float16",
     "{\"query\": {\"shape\": [1, 2], \"dtype\": \"float16\", \"base64\": \"AHwAAA==\"}, " QKV_TAIL
     "}",
     BAD(422, NULL, NULL)},
    {"hex number", "{\"query\": [[0x1, 0]], " QKV_TAIL "}", BAD(400, "", "malformed JSON")},
    {"leading zeros", "{\"query\": [[01, 0]], " QKV_TAIL "}", BAD(400, "", "malformed JSON")},
};

static const json_case duplicate_cases[] = {
    {"duplicate top-level key", "{\"query\": [[1, 0]], \"query\": [[0, 1]], " QKV_TAIL "}",
     BAD(400, "", "duplicate")},
    {"duplicate key in a tensor",
     "{\"query\": {\"shape\": [1, 2], \"shape\": [2, 1], \"data\": [1, 0]}, " QKV_TAIL "}",
     BAD(400, "", "duplicate")},
    {"duplicate key, escaped", "{\"query\": [[1, 0]], \"quer\\u0079\": [[0, 1]], " QKV_TAIL "}",
     BAD(400, "", "duplicate")},
};

static const json_case utf8_cases[] = {
    {"invalid UTF-8 in a key", "{\"query\": [[1, 0]], " QKV_TAIL ", \"\xff\xfe\": true}",
     BAD(400, "", NULL)},
    {"invalid UTF-8 in a value", "{\"query\": [[1, 0]], " QKV_TAIL ", \"causal\": \"\xc3\x28\"}",
     BAD(400, "", NULL)},
    {"overlong UTF-8", "{\"query\": [[1, 0]], " QKV_TAIL ", \"causal\": \"\xc0\xaf\"}",
     BAD(400, "", NULL)},
    {"UTF-8 surrogate", "{\"query\": [[1, 0]], " QKV_TAIL ", \"causal\": \"\xed\xa0\x80\"}",
     BAD(400, "", NULL)},
    {"truncated UTF-8 at the end", "{\"query\": [[1, 0]], " QKV_TAIL ", \"causal\": \"\xe2\x82",
     BAD(400, "", NULL)},
    {"lone surrogate escape", "{\"query\": [[1, 0]], " QKV_TAIL ", \"causal\": \"\\ud800\"}",
     BAD(400, "", NULL)},
    {"NUL escape in a key", "{\"query\": [[1, 0]], " QKV_TAIL ", \"x\\u0000\": 1}",
     BAD(400, "", NULL)},
    /* jansson quotes the text near an error, raw bytes included */
    {"bad escape before invalid UTF-8",
     "{\"query\": [[1, 0]], " QKV_TAIL ", \"causal\": \"\\u000\xd0\xa3\x8a\xcf\"}",
     BAD(400, "", "invalid escape")},
    /* the message and the field quote an unknown key cut to 40 bytes, here inside a "é" */
    {"unknown key cut inside a character",
     "{\"query\": [[1, 0]], " QKV_TAIL ", \"abcdefghijklmnopqrstuvwxyzabcdefghijklm\xc3\xa9\": 1}",
     BAD(422, NULL, "unknown field")},
};

static void run_json_cases(const char *group, const json_case *cases, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char what[160];
        snprintf(what, sizeof what, "%s: %s", group, cases[i].name);
        post_case(what, NULL, cases[i].body, strlen(cases[i].body), &cases[i].e);
    }
}

static void test_malformed_json_and_empty_body(void)
{
    run_json_cases("malformed", malformed_cases, sizeof malformed_cases / sizeof *malformed_cases);
}

static void test_wrong_types(void)
{
    run_json_cases("types", type_cases, sizeof type_cases / sizeof *type_cases);
}

static void test_dimensions_and_lengths(void)
{
    run_json_cases("dimensions", dimension_cases, sizeof dimension_cases / sizeof *dimension_cases);
}

static void test_non_finite_and_out_of_range_numbers(void)
{
    run_json_cases("numbers", number_cases, sizeof number_cases / sizeof *number_cases);
}

static void test_duplicate_keys(void)
{
    run_json_cases("duplicates", duplicate_cases, sizeof duplicate_cases / sizeof *duplicate_cases);
}

/* Invalid UTF-8 is refused, and the reply quoting the offending text is itself valid UTF-8
 * (check_error_body parses it strictly). A long string bypasses jansson only when it is
 * printable ASCII, so invalid UTF-8 inside a long base64 string is malformed JSON too. */
static void test_invalid_utf8(void)
{
    const expect e = BAD(400, "", "byte 0xc3");
    size_t n = 4000; /* 3000 bytes: 750 float32 */
    char *good = malloc(n + 1), *bad = malloc(n + 1), *body = malloc(3 * n + 512);
    run_json_cases("utf8", utf8_cases, sizeof utf8_cases / sizeof *utf8_cases);
    if (!good || !bad || !body) {
        CHECK(0);
        goto done;
    }
    memset(good, 'A', n);
    good[n] = '\0';
    memcpy(bad, good, n + 1);
    bad[1000] = '\xc3'; /* an invalid sequence in the middle of a long base64 string */
    bad[1001] = '\x28';
    snprintf(body, 3 * n + 512,
             "{\"query\": {\"shape\": [1, 750], \"dtype\": \"float32\", \"base64\": \"%s\"}, "
             "\"key\": {\"shape\": [1, 750], \"dtype\": \"float32\", \"base64\": \"%s\"}, "
             "\"value\": {\"shape\": [1, 750], \"dtype\": \"float32\", \"base64\": \"%s\"}}",
             bad, good, good);
    post_case("utf8: in a long base64 string", NULL, body, strlen(body), &e);
done:
    free(good);
    free(bad);
    free(body);
}

/* 150,000 levels: jansson stops at its depth limit (2048) and the pre-scan must not recurse. */
static void test_nesting_150000_deep(void)
{
    const size_t depth = 150000;
    const expect e = BAD(400, "", "depth");
    char *body = malloc(8 * depth + 256);
    size_t n;
    if (!body) {
        CHECK(0);
        return;
    }
    /* As the whole body. */
    memset(body, '[', depth);
    memset(body + depth, ']', depth);
    post_case("nesting: a bare array", NULL, body, 2 * depth, &e);
    /* As the query tensor. */
    n = (size_t)snprintf(body, 32, "{\"query\": ");
    memset(body + n, '[', depth);
    n += depth;
    body[n++] = '1';
    memset(body + n, ']', depth);
    n += depth;
    n += (size_t)snprintf(body + n, 128, ", " QKV_TAIL "}");
    post_case("nesting: inside query", NULL, body, n, &e);
    /* Objects in objects. */
    n = 0;
    for (size_t i = 0; i < depth; i++) {
        memcpy(body + n, "{\"a\":", 5);
        n += 5;
    }
    body[n++] = '1';
    memset(body + n, '}', depth);
    n += depth;
    post_case("nesting: objects", NULL, body, n, &e);
    /* Never closed. */
    memset(body, '[', depth);
    post_case("nesting: never closed", NULL, body, depth, &e);
    free(body);
}

/* ---- Content types and framing --------------------------------------------------------------- */

static void test_wrong_content_type(void)
{
    static const char *const text[] = {"Content-Type: text/plain", NULL};
    static const char *const xml[] = {"Content-Type: application/xml", NULL};
    static const char *const form[] = {"Content-Type: application/x-www-form-urlencoded", NULL};
    static const char *const latin1[] = {"Content-Type: application/json; charset=latin1", NULL};
    /* gzip and deflate are decoded (tests/server/test_v2.c); other codings are refused. */
    static const char *const brotli[] = {"Content-Type: application/json", "Content-Encoding: br",
                                         NULL};
    static const char *const utf8[] = {"Content-Type: application/json; charset=utf-8", NULL};
    const expect e = {415, "unsupported_media_type", "", NULL, "bad_request"};
    const expect e_ct = {415, "unsupported_media_type", "", "Content-Type", "bad_request"};
    const expect e_enc = {415, "unsupported_media_type", "", "Content-Encoding", "bad_request"};
    size_t n = strlen(seed);
    http_resp r;

    post_case("content type: text/plain", text, seed, n, &e);
    post_case("content type: application/xml", xml, seed, n, &e);
    post_case("content type: form", form, seed, n, &e);
    post_case("content type: charset latin1", latin1, seed, n, &e_ct);
    post_case("content encoding: br", brotli, seed, n, &e_enc);
    /* What is allowed. */
    CHECK_EQ_INT(http_do(NULL, d.port, "POST", "/v1/attention", utf8, seed, n, &r), 200);
    http_resp_free(&r);
}

static void test_ambiguous_framing(void)
{
    static const char two_lengths[] =
        "POST /v1/attention HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        "Content-Length: 3\r\nContent-Length: 5\r\n\r\nabcde";
    static const char same_two_lengths[] =
        "POST /v1/attention HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        "Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}";
    static const char chunked_and_length[] =
        "POST /v1/attention HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
    static const char length_and_chunked[] =
        "POST /v1/attention HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n";
    static const char unknown_coding[] =
        "POST /v1/attention HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: gzip\r\n\r\nabc";
    static const char coding_list[] =
        "POST /v1/attention HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
    static const char made_up_coding[] =
        "POST /v1/attention HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: x-smuggle\r\n\r\n";
    const expect e_len = {400, "malformed_request", "", "Content-Length", "bad_request"};
    const expect e_both = {400, "malformed_request", "", "Transfer-Encoding", "bad_request"};
    const expect e_te = {501, "not_implemented", "", "Transfer-Encoding", "bad_request"};

    raw_case("framing: two Content-Length", two_lengths, sizeof two_lengths - 1, &e_len, true);
    raw_case("framing: two equal Content-Length", same_two_lengths, sizeof same_two_lengths - 1,
             &e_len, true);
    raw_case("framing: Content-Length then chunked", chunked_and_length,
             sizeof chunked_and_length - 1, &e_both, true);
    raw_case("framing: chunked then Content-Length", length_and_chunked,
             sizeof length_and_chunked - 1, &e_both, true);
    raw_case("framing: Transfer-Encoding gzip", unknown_coding, sizeof unknown_coding - 1, &e_te,
             true);
    raw_case("framing: Transfer-Encoding gzip, chunked", coding_list, sizeof coding_list - 1, &e_te,
             true);
    raw_case("framing: Transfer-Encoding x-smuggle", made_up_coding, sizeof made_up_coding - 1,
             &e_te, true);
}

/* ---- Body size: the cap, chunks, short bodies ------------------------------------------------ */

/* The seed request padded with spaces to exactly n bytes. */
static char *padded_seed(size_t n)
{
    size_t k = strlen(seed);
    char *b = malloc(n + 1);
    if (!b)
        return NULL;
    memcpy(b, seed, k);
    memset(b + k, ' ', n - k);
    b[n] = '\0';
    return b;
}

/* A raw chunked POST of `body` in chunks of `chunk` bytes, built in one buffer so that even a
 * million chunks go out at socket speed. */
static char *chunked_request(const char *body, size_t n, size_t chunk, size_t *len)
{
    static const char head[] =
        "POST /v1/attention HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
    size_t chunks = (n + chunk - 1) / chunk;
    size_t cap = sizeof head + n + chunks * 24 + 16, used = sizeof head - 1;
    char *req = malloc(cap);
    if (!req)
        return NULL;
    memcpy(req, head, used);
    for (size_t off = 0; off < n; off += chunk) {
        size_t m = n - off < chunk ? n - off : chunk;
        used += (size_t)snprintf(req + used, cap - used, "%zx\r\n", m);
        memcpy(req + used, body + off, m);
        used += m;
        memcpy(req + used, "\r\n", 2);
        used += 2;
    }
    memcpy(req + used, "0\r\n\r\n", 5);
    used += 5;
    *len = used;
    return req;
}

/* A body of exactly --max-body-bytes is served; one byte more is 413 naming the flag, whether
 * the size comes from Content-Length or from the chunks. */
static void test_body_at_the_cap_and_one_over(void)
{
    const expect e = {413, "too_large", "", "--max-body-bytes", "too_large"};
    char *at = padded_seed(CAP), *over = padded_seed(CAP + 1), *req;
    char *resp;
    size_t len;
    http_resp r;

    if (!at || !over) {
        CHECK(0);
        goto done;
    }
    CHECK_EQ_INT(http_post_json(NULL, d.port, at, &r), 200);
    http_resp_free(&r);
    post_case("cap: Content-Length one over", NULL, over, CAP + 1, &e);

    req = chunked_request(at, CAP, 65536, &len);
    resp = req ? raw_exchange(d.port, req, len, 15000) : NULL;
    CHECKF(raw_status(resp) == 200, "cap: chunked at the cap got %.200s", resp ? resp : "nothing");
    free(resp);
    free(req);
    req = chunked_request(over, CAP + 1, 65536, &len);
    if (req)
        raw_case("cap: chunked one over", req, len, &e, true);
    free(req);
    /* Exactly at the cap in chunks that do not divide it, then one over in the last chunk. */
    req = chunked_request(at, CAP, 999, &len);
    resp = req ? raw_exchange(d.port, req, len, 15000) : NULL;
    CHECKF(raw_status(resp) == 200, "cap: 999-byte chunks got %.200s", resp ? resp : "nothing");
    free(resp);
    free(req);
done:
    free(at);
    free(over);
}

/* The daemon's CPU seconds for `n` bytes of a padded seed request sent in one-byte chunks
 * (whose answer must be 200); -1 when it is not. */
static double one_byte_chunks_cpu(size_t n)
{
    char *body = padded_seed(n), *req, *resp;
    size_t len;
    double cpu0 = daemon_cpu_s(&d), cpu = -1;
    req = body ? chunked_request(body, n, 1, &len) : NULL;
    resp = req ? raw_exchange(d.port, req, len, 60000) : NULL;
    if (raw_status(resp) == 200)
        cpu = daemon_cpu_s(&d) - cpu0;
    free(resp);
    free(req);
    free(body);
    return cpu;
}

/* A million one-byte chunks (the body exactly at the cap; 200,000 in a sanitizer build): the
 * chunk parser must neither fall over nor take quadratic time, and the answer is right. "Not
 * quadratic" is the daemon's CPU time (which suites running beside this one do not inflate, as
 * they would its wall time) against a tenth as many chunks sent first: ten times the chunks may
 * take about ten times as long (thirty is allowed, plus half a second), where quadratic work
 * would take a hundred. */
static void test_a_million_one_byte_chunks(void)
{
    size_t n = daemon_quick() ? 200000 : CAP;
    char *body = padded_seed(n), *req, *resp;
    size_t len;
    double tenth = one_byte_chunks_cpu(n / 10), cpu0, cpu;
    double out[6] = {0};
    const char *json;
    size_t jlen;

    CHECKF(tenth >= 0, "%zu one-byte chunks did not get 200", n / 10);
    if (!body) {
        CHECK(0);
        return;
    }
    cpu0 = daemon_cpu_s(&d);
    req = chunked_request(body, n, 1, &len);
    resp = req ? raw_exchange(d.port, req, len, 60000) : NULL;
    cpu = daemon_cpu_s(&d) - cpu0;
    CHECKF(raw_status(resp) == 200, "one-byte chunks: %.200s", resp ? resp : "nothing");
    json = raw_body(resp, &jlen);
    CHECK_EQ_INT(json_numbers(json, "output", out, 6), 6);
    CHECK_NEAR(out[3], 1.33952310, 1e-5);
    CHECKF(cpu < 30 * tenth + 0.5,
           "%zu one-byte chunks took %.2f s of the daemon's CPU, a tenth of them %.3f s", n, cpu,
           tenth);
    free(resp);
    free(req);
    free(body);
    check_still_serving("one-byte chunks");
}

/* A Content-Length that promises more than is sent: a client that waits is disconnected after
 * --receive-timeout-s (counted as a slow client, never given a worker), one that hangs up is
 * forgotten at once (counted as cancelled); neither gets a reply or holds anything after
 * (test_rss_and_fds_are_flat). */
static void test_content_length_promises_more(void)
{
    static const char head[] =
        "POST /v1/attention HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        "Content-Length: 1000\r\n\r\n{\"query\": [[1, 0], [0, 1], [1, 1]], \"key\": [[1, 0]";
    double slow_before = metric_value(d.port, "attnd_slow_clients_total");
    double cancelled_before = rejected("cancelled");
    double t0, waited;
    bool closed = false;
    char *resp;
    int fd;

    /* The client waits. */
    fd = raw_connect(d.port);
    CHECK(fd >= 0);
    if (fd >= 0) {
        t0 = now_s();
        raw_send(fd, head, sizeof head - 1);
        resp = raw_read_all(fd, (RECEIVE_TIMEOUT_S + 5) * 1000, &closed);
        waited = now_s() - t0;
        CHECK(closed);
        CHECKF(!resp || raw_status(resp) != 200, "a short body got %.100s", resp);
        CHECKF(waited > RECEIVE_TIMEOUT_S - 0.5 && waited < RECEIVE_TIMEOUT_S + 2.5,
               "disconnected after %.2f s (--receive-timeout-s %d)", waited, RECEIVE_TIMEOUT_S);
        free(resp);
        close(fd);
    }
    CHECK(metric_wait(d.port, "attnd_slow_clients_total", slow_before + 1, 3000));
    check_still_serving("a short body, waiting");

    /* The client hangs up after sending part of the body: forgotten at once. (A client that
     * only shuts down its sending side is, by libmicrohttpd, waited for until the receive
     * timeout, like the one above.) */
    fd = raw_connect(d.port);
    CHECK(fd >= 0);
    if (fd >= 0) {
        raw_send(fd, head, sizeof head - 1);
        sleep_ms(50);
        close(fd);
        t0 = now_s();
        CHECK(metric_wait(d.port, "attnd_rejected_total{reason=\"cancelled\"}",
                          cancelled_before + 1, 1000));
        waited = now_s() - t0;
        CHECKF(waited < 1.0, "the hang-up was noticed after %.2f s", waited);
    }
    check_counted("a short body, hung up", "cancelled", cancelled_before);
    check_still_serving("a short body, hung up");
}

/* ---- Flat RSS and descriptors ---------------------------------------------------------------- */

/* Every connection of the tests is closed: the daemon's descriptors are back to `want`
 * (libmicrohttpd closes a socket a moment after the client does). */
static int fds_settled(int want)
{
    double deadline = now_s() + 5;
    int n;
    do {
        n = daemon_fd_count(&d);
        if (n == want)
            break;
        sleep_ms(20);
    } while (now_s() < deadline);
    return n;
}

static long baseline_rss_kib;
static int baseline_fds;

static void run_every_case(void);

/* Round one of every case (checked like the real round), then the baseline. */
static void test_warm_up_then_baseline(void)
{
    run_every_case();
    baseline_fds = fds_settled(-1); /* whatever it is once the sockets have closed */
    sleep_ms(200);
    baseline_fds = daemon_fd_count(&d);
    baseline_rss_kib = daemon_rss_kib(&d);
    CHECK(baseline_fds > 0);
    CHECK(baseline_rss_kib > 0);
    printf("baseline after the warm-up: VmRSS %ld KiB, %d open descriptors\n", baseline_rss_kib,
           baseline_fds);
}

/* After round two, as many descriptors as at the baseline (exactly: every connection is
 * closed), and RSS within 8 MiB of it. The allowance is for glibc's allocator: freed memory
 * stays in per-thread arenas, and which of the 2 workers (and MHD's thread) served which
 * request changes the arena layout from one round to the next, so the same work can leave a
 * few MiB more resident without holding anything. A leak of the bodies alone would be far
 * above it: one round sends more than 20 MB of bodies. Under ASan, freed memory sits in the
 * quarantine (up to 256 MiB by design), so RSS says nothing there: LeakSanitizer checks the
 * daemon at exit instead, and daemon_stop's exit status catches what it reports. */
static void test_rss_and_fds_are_flat(void)
{
    int fds = fds_settled(baseline_fds);
    long rss = daemon_rss_kib(&d);
    const long slack_kib = 8 * 1024;
    printf("after round two: VmRSS %ld KiB (%+ld), %d open descriptors (%+d)\n", rss,
           rss - baseline_rss_kib, fds, fds - baseline_fds);
    CHECKF(fds == baseline_fds, "open descriptors: %d after, %d at the baseline", fds,
           baseline_fds);
    if (!daemon_quick())
        CHECKF(rss - baseline_rss_kib <= slack_kib, "VmRSS grew by %ld KiB (allowed %ld)",
               rss - baseline_rss_kib, slack_kib);
    CHECK(metric_wait_le(d.port, "attnd_memory_reserved_bytes", 0, 2000));
    /* The scrape itself. The last case's client that hung up can leave the count a moment
     * after its cancellation is counted, on a busy machine; a request that leaked would stay. */
    CHECK(metric_wait_le(d.port, "attnd_inflight_requests", 1, 2000));
}

/* SIGTERM: exit 0 (under ASan, also no leak reported by LeakSanitizer at exit). */
static void test_daemon_exits_cleanly(void)
{
    CHECK_EQ_INT(daemon_stop(&d), 0);
}

/* ---- Draining ----------------------------------------------------------------------------------
 */

/* A request made on its own thread. */
typedef struct {
    int port;
    const char *body;
    long status;
} bg_post;

static void *bg_post_main(void *arg)
{
    bg_post *b = arg;
    http_resp r;
    b->status = http_post_json(NULL, b->port, b->body, &r);
    http_resp_free(&r);
    return NULL;
}

/* Whether the daemon says it is draining within `secs` (its log line, written as the drain
 * begins: on a loaded machine a signal can take longer than any fixed sleep to act). */
static bool wait_for_drain(const daemon_proc *proc, double secs)
{
    for (double until = now_s() + secs; now_s() < until; sleep_ms(10)) {
        char *log = daemon_log(proc);
        bool draining = log && strstr(log, "draining: readiness is 503");
        free(log);
        if (draining)
            return true;
    }
    return false;
}

/* A request refused because the daemon is draining is counted as reason="draining". The
 * listener is closed by then and every reply during the drain closes its connection, so the
 * scrapes go over keep-alive connections opened before the signal, one per scrape. */
static void test_draining_rejections_are_counted(void)
{
    enum { SCRAPES = 8 };
    static const char series[] = "attnd_rejected_total{reason=\"draining\"} ";
    const char *const args[] = {"--threads", "1", NULL};
    daemon_proc dd;
    void *handles[SCRAPES + 1];
    size_t slow_len;
    char *slow = slow_attention_body(daemon_quick() ? 16384 : 32768, 32768, &slow_len);
    bg_post in_flight = {0};
    pthread_t thread;
    http_resp r;
    bool counted = false;

    if (!slow || daemon_start(&dd, args) != 0) {
        free(slow);
        CHECK(0);
        return;
    }
    for (int i = 0; i <= SCRAPES; i++) {
        handles[i] = http_handle_new();
        CHECK_EQ_INT(http_do(handles[i], dd.port, "GET", "/v2/health/live", NULL, NULL, 0, &r),
                     200);
        http_resp_free(&r);
    }
    /* Something in flight keeps the drain going while the test looks. */
    in_flight.port = dd.port;
    in_flight.body = slow;
    pthread_create(&thread, NULL, bg_post_main, &in_flight);
    CHECK(metric_wait(dd.port, "attnd_running_requests", 1, 10000));
    CHECK(metric_value(dd.port, "attnd_rejected_total{reason=\"draining\"}") == 0);
    daemon_signal(&dd, SIGTERM);
    CHECK(wait_for_drain(&dd, 10));

    http_post_json(handles[0], dd.port, seed, &r);
    CHECK_EQ_INT(r.status, 503);
    if (r.status == 503) {
        const expect e = {503, "unavailable", "", "shutting down", "draining"};
        check_error_body("draining", r.body, r.body_len, &e);
    }
    http_resp_free(&r);
    for (int i = 1; i <= SCRAPES && !counted; i++) {
        if (http_do(handles[i], dd.port, "GET", "/metrics", NULL, NULL, 0, &r) == 200) {
            const char *p = strstr(r.body, series);
            counted = p && strtod(p + sizeof series - 1, NULL) == 1;
        }
        http_resp_free(&r);
        if (!counted)
            sleep_ms(20);
    }
    CHECKF(counted, "%s did not reach 1", series);
    pthread_join(thread, NULL);
    CHECK_EQ_INT(in_flight.status, 200);
    CHECK_EQ_INT(daemon_wait(&dd, 30000), 0);
    daemon_stop(&dd);
    for (int i = 0; i <= SCRAPES; i++)
        http_handle_free(handles[i]);
    free(slow);
}

/* ---- Main ---------------------------------------------------------------------------------- */

static void run_every_case(void)
{
    test_malformed_json_and_empty_body();
    test_wrong_types();
    test_dimensions_and_lengths();
    test_non_finite_and_out_of_range_numbers();
    test_duplicate_keys();
    test_invalid_utf8();
    test_nesting_150000_deep();
    test_wrong_content_type();
    test_ambiguous_framing();
    test_body_at_the_cap_and_one_over();
    test_a_million_one_byte_chunks();
    test_content_length_promises_more();
}

int main(void)
{
    const char *const args[] = {
        "--threads", "2", "--max-body-bytes", "1000000", "--receive-timeout-s", "2", "--log-level",
        "warn",      NULL};
    if (daemon_start(&d, args) != 0) {
        printf("0 passed, 1 failed\n");
        return 1;
    }
    RUN_WITHIN(test_warm_up_then_baseline, 240);
    RUN_WITHIN(test_malformed_json_and_empty_body, 60);
    RUN_WITHIN(test_wrong_types, 60);
    RUN_WITHIN(test_dimensions_and_lengths, 60);
    RUN_WITHIN(test_non_finite_and_out_of_range_numbers, 60);
    RUN_WITHIN(test_duplicate_keys, 60);
    RUN_WITHIN(test_invalid_utf8, 60);
    RUN_WITHIN(test_nesting_150000_deep, 60);
    RUN_WITHIN(test_wrong_content_type, 60);
    RUN_WITHIN(test_ambiguous_framing, 60);
    RUN_WITHIN(test_body_at_the_cap_and_one_over, 60);
    RUN_WITHIN(test_a_million_one_byte_chunks, 120);
    RUN_WITHIN(test_content_length_promises_more, 60);
    RUN_WITHIN(test_rss_and_fds_are_flat, 60);
    RUN_WITHIN(test_daemon_exits_cleanly, 90);
    RUN_WITHIN(test_draining_rejections_are_counted, 120);
    return check_report();
}
