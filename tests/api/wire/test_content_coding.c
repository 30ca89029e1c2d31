/* test_content_coding.c - content codings (wire/content_coding.c): Content-Encoding and
 * Accept-Encoding parsing, gzip and deflate round trips (zlib and raw deflate, several gzip
 * members), the decompression bomb (413 at --max-body-bytes, having allocated no more than the
 * limit), corrupt and truncated streams (400), the memory budget (413 / 429), and api_call_encoded
 * around real routes: a gzip request, a compressed reply, the error forms of both protocols. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "api/wire/content_coding.h"
#include "tests/support/check.h"
#include "tests/support/rng.h"
#include "tests/support/util.h"

static eng_pool *pool;
/* The lease of the calls that test no budget: it has none, so it holds nothing. */
static api_lease unbudgeted;

/* ---- Header parsing ------------------------------------------------------------------------ */

static void test_content_encoding_parse(void)
{
    const struct {
        const char *value;
        api__coding want;
    } cases[] = {
        {NULL, API_CODING_IDENTITY},        {"", API_CODING_IDENTITY},
        {"identity", API_CODING_IDENTITY},  {" Identity ", API_CODING_IDENTITY},
        {"gzip", API_CODING_GZIP},          {"GZIP", API_CODING_GZIP},
        {"x-gzip", API_CODING_GZIP},        {" gzip\t", API_CODING_GZIP},
        {"deflate", API_CODING_DEFLATE},    {"Deflate", API_CODING_DEFLATE},
        {"br", API_CODING_UNKNOWN},         {"compress", API_CODING_UNKNOWN},
        {"gzip, gzip", API_CODING_UNKNOWN}, {"gzip;q=1", API_CODING_UNKNOWN},
        {"gzipx", API_CODING_UNKNOWN},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        api__coding got = api__coding_parse(cases[i].value);
        CHECKF(got == cases[i].want, "\"%s\": %d, want %d",
               cases[i].value ? cases[i].value : "(null)", (int)got, (int)cases[i].want);
        CHECK(api_content_encoding_known(cases[i].value) == (cases[i].want != API_CODING_UNKNOWN));
    }
}

static void test_accept_encoding_pick(void)
{
    const struct {
        const char *value;
        api__coding want;
    } cases[] = {
        {NULL, API_CODING_IDENTITY},
        {"", API_CODING_IDENTITY},
        {"identity", API_CODING_IDENTITY},
        {"gzip", API_CODING_GZIP},
        {"deflate", API_CODING_DEFLATE},
        {"gzip, deflate", API_CODING_GZIP},
        {"deflate, gzip", API_CODING_GZIP},
        {"gzip;q=0", API_CODING_IDENTITY},
        {"gzip;q=0.000", API_CODING_IDENTITY},
        {"gzip;q=0, deflate", API_CODING_DEFLATE},
        {"deflate;q=1, gzip;q=0.5", API_CODING_DEFLATE},
        {"gzip;q=0.5, deflate;q=0.5", API_CODING_GZIP},
        {" gzip ; q=0.8 , deflate;q=0.9", API_CODING_DEFLATE},
        {"*", API_CODING_GZIP},
        {"*;q=0", API_CODING_IDENTITY},
        {"*;q=0, deflate;q=0.1", API_CODING_DEFLATE},
        {"gzip;q=0, *", API_CODING_DEFLATE},
        {"br, zstd", API_CODING_IDENTITY},
        {"GZip", API_CODING_GZIP},
        {"x-gzip", API_CODING_GZIP},
        {"gzip;q=1.5", API_CODING_IDENTITY}, /* malformed q: the entry is dropped */
        {"gzip;q=abc", API_CODING_IDENTITY},
        {"gzip;q=0.0001", API_CODING_IDENTITY}, /* at most three decimals */
        {"gzip;level=9", API_CODING_GZIP},      /* other parameters do not matter */
        {"gzip;Q=0", API_CODING_IDENTITY},
        {",,gzip,,", API_CODING_GZIP},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        api__coding got = api__accept_encoding_pick(cases[i].value);
        CHECKF(got == cases[i].want, "\"%s\": %d, want %d",
               cases[i].value ? cases[i].value : "(null)", (int)got, (int)cases[i].want);
    }
}

/* ---- Round trips --------------------------------------------------------------------------- */

/* A JSON-like text of n bytes: compressible, but not trivially. */
static char *sample(size_t n)
{
    char *s = malloc(n + 1);
    uint64_t rng = 12345;
    for (size_t i = 0; i < n; i++)
        s[i] = "0123456789.,-[] e"[rng_below(&rng, 17)];
    s[n] = '\0';
    return s;
}

static void test_roundtrip(void)
{
    const size_t sizes[] = {0, 1, 100, 70000, (size_t)3 << 20};
    const api__coding codings[] = {API_CODING_GZIP, API_CODING_DEFLATE};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        char *text = sample(sizes[s]);
        for (size_t c = 0; c < 2; c++) {
            char *packed, *plain = NULL;
            size_t packed_len, plain_len, reserved;
            api__error err = {0};
            CHECK(api__deflate(codings[c], text, sizes[s], &packed, &packed_len));
            int rc = api__inflate(
                &(api__inflate_job){codings[c], packed, packed_len, sizes[s], &unbudgeted}, &plain,
                &plain_len, &reserved, &err);
            CHECKF(rc == 0, "size %zu coding %d: %s", sizes[s], (int)codings[c], err.message);
            CHECK(plain_len == sizes[s] && (sizes[s] == 0 || memcmp(plain, text, sizes[s]) == 0));
            CHECK(plain && plain[plain_len] == '\0');
            if (sizes[s] > 1000) /* 17 symbols: about 4.1 bits of 8 per byte */
                CHECKF(packed_len < sizes[s] / 10 * 7, "%zu -> %zu", sizes[s], packed_len);
            eng_buf_free(packed);
            free(plain);
        }
        free(text);
    }
}

/* What other compressors send: zlib's own gzip and zlib formats, raw deflate for "deflate"
 * (some clients), and a gzip body of two members (RFC 1952 allows it). */
static void test_foreign_streams(void)
{
    char *text = sample(50000);
    const struct {
        int wbits;
        api__coding coding;
    } cases[] = {{31, API_CODING_GZIP}, {15, API_CODING_DEFLATE}, {-15, API_CODING_DEFLATE}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n, plain_len, reserved;
        char *packed = zlib_pack(text, 50000, cases[i].wbits, &n), *plain = NULL;
        api__error err = {0};
        int rc = api__inflate(&(api__inflate_job){cases[i].coding, packed, n, 1 << 20, &unbudgeted},
                              &plain, &plain_len, &reserved, &err);
        CHECKF(rc == 0 && plain_len == 50000 && memcmp(plain, text, 50000) == 0, "wbits %d: %s",
               cases[i].wbits, err.message);
        free(packed);
        free(plain);
    }
    size_t n1, n2, plain_len, reserved;
    char *a = zlib_pack(text, 20000, 31, &n1), *b = zlib_pack(text + 20000, 30000, 31, &n2);
    char *both = malloc(n1 + n2), *plain = NULL;
    memcpy(both, a, n1);
    memcpy(both + n1, b, n2);
    api__error err = {0};
    CHECK(api__inflate(&(api__inflate_job){API_CODING_GZIP, both, n1 + n2, 1 << 20, &unbudgeted},
                       &plain, &plain_len, &reserved, &err) == 0);
    CHECK(plain_len == 50000 && memcmp(plain, text, 50000) == 0);
    free(a);
    free(b);
    free(both);
    free(plain);
    free(text);
}

/* ---- Failures ------------------------------------------------------------------------------ */

/* 64 MiB of zeros gzip to under 300 KB at zlib's fastest level; with a 1 MiB cap the inflater stops
 * at the cap, having reserved (and so allocated) no more than the cap and a byte. */
static void test_bomb(void)
{
    size_t n = (size_t)64 << 20, packed_len, plain_len = 0, reserved = 0;
    char *zeros = calloc(n, 1), *packed, *plain = NULL;
    CHECK(api__deflate(API_CODING_GZIP, zeros, n, &packed, &packed_len));
    free(zeros);
    CHECKF(packed_len < n / 100, "bomb is %zu bytes", packed_len);
    api_budget *budget = api_budget_new((size_t)1 << 30);
    api_lease lease;
    api_lease_start(&lease, budget, eng_now_ns(), 0);
    api__error err = {0};
    size_t max = (size_t)1 << 20;
    int rc = api__inflate(&(api__inflate_job){API_CODING_GZIP, packed, packed_len, max, &lease},
                          &plain, &plain_len, &reserved, &err);
    CHECK(rc != 0 && plain == NULL);
    CHECK_EQ_INT(err.status, API_STATUS_TOO_LARGE);
    CHECKF(strstr(err.message, "--max-body-bytes") != NULL, "%s", err.message);
    CHECKF(reserved <= max + 2, "reserved %zu for a cap of %zu", reserved, max);
    CHECK_EQ_INT(api_budget_in_use(budget), reserved);
    CHECK_EQ_INT(lease.held, reserved);
    api_lease_give_back(&lease, reserved);

    /* Exactly the cap is fine; one byte more is not. */
    char *text = sample(1000);
    eng_buf_free(packed);
    CHECK(api__deflate(API_CODING_DEFLATE, text, 1000, &packed, &packed_len));
    memset(&err, 0, sizeof err);
    CHECK(api__inflate(&(api__inflate_job){API_CODING_DEFLATE, packed, packed_len, 1000, &lease},
                       &plain, &plain_len, &reserved, &err) == 0);
    CHECK(plain_len == 1000);
    free(plain);
    plain = NULL;
    api_lease_give_back(&lease, reserved);
    memset(&err, 0, sizeof err);
    CHECK(api__inflate(&(api__inflate_job){API_CODING_DEFLATE, packed, packed_len, 999, &lease},
                       &plain, &plain_len, &reserved, &err) != 0);
    CHECK_EQ_INT(err.status, API_STATUS_TOO_LARGE);
    api_lease_give_back(&lease, reserved);
    CHECK_EQ_INT(api_budget_in_use(budget), 0);
    api_budget_free(budget);
    eng_buf_free(packed);
    free(text);
}

static void test_corrupt_and_truncated(void)
{
    char *text = sample(20000), *packed, *plain = NULL;
    size_t packed_len, plain_len, reserved;
    api__error err;
    CHECK(api__deflate(API_CODING_GZIP, text, 20000, &packed, &packed_len));

    memset(&err, 0, sizeof err);
    CHECK(api__inflate(
              &(api__inflate_job){API_CODING_GZIP, packed, packed_len / 2, 1 << 20, &unbudgeted},
              &plain, &plain_len, &reserved, &err) != 0);
    CHECK_EQ_INT(err.status, API_STATUS_MALFORMED_REQUEST);
    CHECKF(strstr(err.message, "truncated") != NULL, "%s", err.message);

    memset(&err, 0, sizeof err);
    packed[packed_len / 2] ^= 0x55;
    packed[packed_len / 2 + 1] ^= 0x33;
    CHECK(
        api__inflate(&(api__inflate_job){API_CODING_GZIP, packed, packed_len, 1 << 20, &unbudgeted},
                     &plain, &plain_len, &reserved, &err) != 0);
    CHECK_EQ_INT(err.status, API_STATUS_MALFORMED_REQUEST);

    memset(&err, 0, sizeof err);
    CHECK(api__inflate(
              &(api__inflate_job){API_CODING_GZIP, "not gzip at all", 15, 1 << 20, &unbudgeted},
              &plain, &plain_len, &reserved, &err) != 0);
    CHECK_EQ_INT(err.status, API_STATUS_MALFORMED_REQUEST);
    CHECKF(strstr(err.message, "gzip") != NULL, "%s", err.message);
    eng_buf_free(packed);

    /* A deflate stream followed by garbage. */
    CHECK(api__deflate(API_CODING_DEFLATE, text, 20000, &packed, &packed_len));
    char *extra = malloc(packed_len + 4);
    memcpy(extra, packed, packed_len);
    memcpy(extra + packed_len, "junk", 4);
    memset(&err, 0, sizeof err);
    CHECK(api__inflate(
              &(api__inflate_job){API_CODING_DEFLATE, extra, packed_len + 4, 1 << 20, &unbudgeted},
              &plain, &plain_len, &reserved, &err) != 0);
    CHECK_EQ_INT(err.status, API_STATUS_MALFORMED_REQUEST);
    CHECKF(strstr(err.message, "extra") != NULL, "%s", err.message);
    CHECK(plain == NULL);
    free(extra);
    eng_buf_free(packed);
    free(text);
}

static void test_budget(void)
{
    char *text = sample(200000), *packed, *plain = NULL;
    size_t packed_len, plain_len, reserved;
    api__error err;
    CHECK(api__deflate(API_CODING_GZIP, text, 200000, &packed, &packed_len));

    api_budget *tiny = api_budget_new(50000);
    api_lease lease;
    api_lease_start(&lease, tiny, eng_now_ns(), 0);
    memset(&err, 0, sizeof err);
    CHECK(api__inflate(&(api__inflate_job){API_CODING_GZIP, packed, packed_len, 1 << 20, &lease},
                       &plain, &plain_len, &reserved, &err) != 0);
    CHECK_EQ_INT(err.status, API_STATUS_TOO_LARGE);
    CHECKF(strstr(err.message, "--max-memory-bytes") != NULL, "%s", err.message);
    api_lease_give_back(&lease, reserved);
    CHECK_EQ_INT(api_budget_in_use(tiny), 0);
    api_budget_free(tiny);

    api_budget *busy = api_budget_new((size_t)16 << 20);
    CHECK(api_budget_reserve(busy, ((size_t)16 << 20) - 1000) == API_BUDGET_OK);
    api_lease_start(&lease, busy, eng_now_ns(), 0);
    memset(&err, 0, sizeof err);
    CHECK(api__inflate(&(api__inflate_job){API_CODING_GZIP, packed, packed_len, 1 << 20, &lease},
                       &plain, &plain_len, &reserved, &err) != 0);
    CHECK_EQ_INT(err.status, API_STATUS_OVERLOADED);
    api_lease_give_back(&lease, reserved);
    api_budget_release(busy, ((size_t)16 << 20) - 1000);
    api_budget_free(busy);
    eng_buf_free(packed);
    free(text);
}

/* ---- api_call_encoded ---------------------------------------------------------------------- */

static const char *seen_body;
static size_t seen_len;

/* A route that answers with what it was given. */
static void echo_route(const api_call *call, api_reply *reply)
{
    memset(reply, 0, sizeof *reply);
    seen_len = call->body_len;
    seen_body = call->body;
    reply->status = 200;
    reply->content_type = "application/json";
    reply->body = eng_buf_alloc(call->body_len + 1); /* as every route's reply body */
    memcpy(reply->body, call->body, call->body_len);
    reply->body_len = call->body_len;
}

/* The status a body starts with ("422 ..."). */
static int status_of_body(const char *body)
{
    return (body[0] - '0') * 100 + (body[1] - '0') * 10 + (body[2] - '0');
}

static char *unpack(const api_reply *r, api__coding coding, size_t *len)
{
    char *plain = NULL;
    size_t reserved;
    api__error err = {0};
    if (api__inflate(&(api__inflate_job){coding, r->body, r->body_len, 1 << 30, &unbudgeted},
                     &plain, len, &reserved, &err) != 0)
        return NULL;
    return plain;
}

static void test_call_encoded(void)
{
    char *text = sample(100000), *packed;
    size_t packed_len, len;
    api_budget *budget = api_budget_new((size_t)64 << 20);
    api_lease lease;
    api_lease_start(&lease, budget, eng_now_ns(), 0);
    CHECK(api__deflate(API_CODING_GZIP, text, 100000, &packed, &packed_len));

    /* A gzip body reaches the route inflated; the reply goes back as the client accepts. */
    const struct {
        const char *accept;
        const char *want; /* NULL: uncompressed */
    } accepts[] = {{NULL, NULL},
                   {"gzip", "gzip"},
                   {"deflate", "deflate"},
                   {"gzip;q=0, deflate;q=0", NULL},
                   {"br", NULL}};
    for (size_t i = 0; i < sizeof accepts / sizeof accepts[0]; i++) {
        api_call call = {.body = packed,
                         .body_len = packed_len,
                         .lease = &lease,
                         .content_encoding = "gzip",
                         .accept_encoding = accepts[i].accept};
        api_reply r;
        api_call_encoded(echo_route, API_ERRORS_NATIVE, &call, &r);
        CHECK_EQ_INT(r.status, 200);
        CHECK(seen_len == 100000);
        if (!accepts[i].want) {
            CHECK(r.content_encoding == NULL);
            CHECK(r.body_len == 100000 && memcmp(r.body, text, 100000) == 0);
        } else {
            CHECK(r.content_encoding && strcmp(r.content_encoding, accepts[i].want) == 0);
            CHECK(r.body_len < 100000);
            char *plain = unpack(
                &r, strcmp(accepts[i].want, "gzip") == 0 ? API_CODING_GZIP : API_CODING_DEFLATE,
                &len);
            CHECK(plain && len == 100000 && memcmp(plain, text, len) == 0);
            free(plain);
        }
        api_reply_free(&r);
        CHECK_EQ_INT(api_budget_in_use(budget), 0);
    }

    /* An identity body goes through as it is; a reply that compression would not shrink
     * stays as it is. */
    api_call plain_call = {.body = "{}", .body_len = 2, .accept_encoding = "gzip"};
    api_reply r;
    api_call_encoded(echo_route, API_ERRORS_NATIVE, &plain_call, &r);
    CHECK(seen_body == plain_call.body && r.content_encoding == NULL && r.body_len == 2);
    api_reply_free(&r);

    /* Errors of its own, in the form of the route's protocol. */
    api_call unknown = {.body = "{}", .body_len = 2, .content_encoding = "br"};
    api_call_encoded(echo_route, API_ERRORS_NATIVE, &unknown, &r);
    CHECK_EQ_INT(r.status, 415);
    CHECK(r.body && strstr(r.body, "\"code\":\"unsupported_media_type\"") != NULL);
    api_reply_free(&r);
    api_call_encoded(echo_route, API_ERRORS_V2, &unknown, &r);
    CHECK_EQ_INT(r.status, 415);
    CHECK(r.body && strncmp(r.body, "{\"error\":\"", 10) == 0);
    api_reply_free(&r);

    api_limits limits = api_limits_default();
    limits.max_body_bytes = 50000;
    api_call bomb = {.body = packed,
                     .body_len = packed_len,
                     .limits = &limits,
                     .lease = &lease,
                     .content_encoding = "gzip"};
    api_call_encoded(echo_route, API_ERRORS_V2, &bomb, &r);
    CHECK_EQ_INT(r.status, 413);
    CHECK(r.body && strstr(r.body, "--max-body-bytes") != NULL);
    api_reply_free(&r);
    CHECK_EQ_INT(api_budget_in_use(budget), 0);

    api_call corrupt = {.body = text, .body_len = 1000, .content_encoding = "deflate"};
    api_call_encoded(echo_route, API_ERRORS_NATIVE, &corrupt, &r);
    CHECK_EQ_INT(r.status, 400);
    api_reply_free(&r);

    eng_buf_free(packed);
    free(text);
    api_budget_free(budget);
}

/* The echo route's body, under the status the body's first three digits name. */
static void status_echo_route(const api_call *call, api_reply *reply)
{
    echo_route(call, reply);
    reply->status = status_of_body(call->body);
}

/* Only successful replies are compressed: an error body, however compressible, reaches a
 * client that accepts gzip as plain JSON (tritonclient's error path does not decompress). */
static void test_errors_are_never_compressed(void)
{
    static const int statuses[] = {200, 400, 413, 422, 429, 500, 503, 504};
    size_t n = 4000;
    char *text = malloc(n);
    CHECK(text != NULL);
    if (!text)
        return;
    for (size_t s = 0; s < sizeof statuses / sizeof statuses[0]; s++) {
        api_call call = {.body = text, .body_len = n, .accept_encoding = "gzip, deflate"};
        api_reply r;
        memset(text, 'e', n);
        snprintf(text, n, "%d", statuses[s]);
        text[3] = ' ';
        api_call_encoded(status_echo_route, API_ERRORS_V2, &call, &r);
        CHECK_EQ_INT(r.status, statuses[s]);
        if (statuses[s] == 200) {
            CHECK(r.content_encoding && strcmp(r.content_encoding, "gzip") == 0);
            CHECK(r.body_len < n);
        } else {
            CHECKF(r.content_encoding == NULL, "a %d reply was sent as %s", statuses[s],
                   r.content_encoding);
            CHECK(r.body_len == n && memcmp(r.body, text, n) == 0);
        }
        api_reply_free(&r);
    }
    free(text);
}

/* A real route behind the wrapper: a gzip /v1/attention body, and a v2 inference with binary
 * tensors (whose header length counts the uncompressed JSON) answered in gzip. */
static void test_call_encoded_routes(void)
{
    const char *body = "{\"query\": [[1, 0]], \"key\": [[1, 0], [0, 1]], "
                       "\"value\": [[1, 2], [3, 4]]}";
    char *packed;
    size_t packed_len, len;
    CHECK(api__deflate(API_CODING_DEFLATE, body, strlen(body), &packed, &packed_len));
    api_call call = {
        .body = packed, .body_len = packed_len, .pool = pool, .content_encoding = "deflate"};
    api_reply r;
    api_call_encoded(api_attention, API_ERRORS_NATIVE, &call, &r);
    CHECKF(r.status == 200, "%d", r.status);
    CHECK(r.body && strstr(r.body, "\"output\"") != NULL);
    api_reply_free(&r);
    eng_buf_free(packed);

    const char *json = "{\"inputs\":["
                       "{\"name\":\"query\",\"datatype\":\"FP32\",\"shape\":[1,2],\"data\":[1,0]},"
                       "{\"name\":\"key\",\"datatype\":\"FP32\",\"shape\":[1,2],\"data\":[1,0]},"
                       "{\"name\":\"value\",\"datatype\":\"FP32\",\"shape\":[1,2],"
                       "\"parameters\":{\"binary_data_size\":8}}],"
                       "\"parameters\":{\"binary_data_output\":true}}";
    size_t jl = strlen(json);
    char v2body[1024], hl[32];
    float v[2] = {3, 4};
    memcpy(v2body, json, jl);
    memcpy(v2body + jl, v, 8);
    snprintf(hl, sizeof hl, "%zu", jl);
    CHECK(api__deflate(API_CODING_GZIP, v2body, jl + 8, &packed, &packed_len));
    api_call v2 = {.body = packed,
                   .body_len = packed_len,
                   .pool = pool,
                   .content_encoding = "gzip",
                   .accept_encoding = "gzip",
                   .inference_header_length = hl,
                   .model = "sdpa"};
    api_call_encoded(api_v2_infer, API_ERRORS_V2, &v2, &r);
    CHECKF(r.status == 200, "%d", r.status);
    CHECK(r.content_encoding && strcmp(r.content_encoding, "gzip") == 0);
    char *plain = unpack(&r, API_CODING_GZIP, &len);
    CHECK(plain != NULL);
    if (plain) {
        /* The model's default outputs, in binary: output [1, 2], then lse [1]. */
        CHECKF(r.inference_header_len > 0 && len == (size_t)r.inference_header_len + 12,
               "%zu bytes, header %zu", len, (size_t)r.inference_header_len);
        float out[3] = {0, 0, 0};
        if (len == (size_t)r.inference_header_len + 12)
            memcpy(out, plain + r.inference_header_len, 12);
        CHECK(out[0] == 3 && out[1] == 4);
        CHECK_NEAR(out[2], 1 / sqrt(2.0), 1e-6); /* the one score, q.k / sqrt(D) */
    }
    free(plain);
    api_reply_free(&r);
    eng_buf_free(packed);
}

int main(void)
{
    eng_error err;
    pool = eng_pool_new(2, &err);
    if (!pool)
        return 1;
    api_lease_start(&unbudgeted, NULL, eng_now_ns(), 0);
    RUN(test_content_encoding_parse);
    RUN(test_accept_encoding_pick);
    RUN(test_roundtrip);
    RUN(test_foreign_streams);
    RUN(test_bomb);
    RUN(test_corrupt_and_truncated);
    RUN(test_budget);
    RUN(test_call_encoded);
    RUN(test_call_encoded_routes);
    RUN(test_errors_are_never_compressed);
    eng_pool_free(pool);
    return check_report();
}
