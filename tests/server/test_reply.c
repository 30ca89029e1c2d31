/* test_reply.c - reply values (server/reply.c), the statuses server/ picks itself
 * (server/outcome.c), and the header token test of server/request_check.c. */
#include <stdlib.h>
#include <string.h>

#include "server/outcome.h"
#include "server/reply.h"
#include "server/request_check.h"
#include "tests/support/check.h"

/* Collects the headers srv__reply_each_header lists as "Name: value\n" lines. */
typedef struct {
    char text[512];
    size_t n;
} header_lines;

static bool collect(void *cls, const char *name, const char *value)
{
    header_lines *h = cls;
    int w = snprintf(h->text + h->n, sizeof h->text - h->n, "%s: %s\n", name, value);
    if (w > 0 && (size_t)w < sizeof h->text - h->n)
        h->n += (size_t)w;
    return true;
}

static void test_every_429_and_only_it_says_retry_after(void)
{
#define CHECK_ROW(name, status, why, seconds)                                                      \
    CHECKF((srv__outcome(name)->retry_after_s > 0) ==                                              \
               (srv__outcome_http(name, API_ERRORS_NATIVE) == 429),                                \
           "%s: status %d, Retry-After %d", #name, srv__outcome_http(name, API_ERRORS_NATIVE),     \
           srv__outcome(name)->retry_after_s);
    SRV_OUTCOME_LIST(CHECK_ROW)
#undef CHECK_ROW
}

/* server/ names statuses, api/ picks their codes: a row is sent with the code api/ gives its
 * status, in the route's style. */
static void test_outcome_codes_come_from_api(void)
{
#define CHECK_CODE(name, status, why, seconds)                                                     \
    CHECK_EQ_INT(srv__outcome_http(name, API_ERRORS_NATIVE),                                       \
                 api_status_http(API_ERRORS_NATIVE, status));                                      \
    CHECK_EQ_INT(srv__outcome_http(name, API_ERRORS_V2), api_status_http(API_ERRORS_V2, status));
    SRV_OUTCOME_LIST(CHECK_CODE)
#undef CHECK_CODE
    CHECK_EQ_INT(srv__outcome_http(SRV_REFUSE_FRAMING, API_ERRORS_NATIVE), 400);
    CHECK_EQ_INT(srv__outcome_http(SRV_ANSWER_NOT_MODIFIED, API_ERRORS_NATIVE), 304);
    CHECK_EQ_INT(srv__outcome_http(SRV_REFUSE_CLIENT_GONE, API_ERRORS_V2),
                 API_STATUS_CLIENT_CLOSED);
    CHECK_EQ_INT(srv__outcome_http(SRV_REFUSE_DEADLINE, API_ERRORS_V2), 504);
}

static void test_refusals_carry_their_row(void)
{
    srv_reply r = srv__reply_refusal(API_ERRORS_NATIVE, SRV_REFUSE_QUEUE_FULL, "full (%d)", 4);
    CHECK_EQ_INT(r.status, 429);
    CHECK_EQ_INT(r.reason, API_REASON_QUEUE_FULL);
    CHECK_EQ_INT(r.retry_after_s, 1);
    CHECK(r.refusal);
    CHECK(r.body && memmem(r.body, r.len, "full (4)", 8));
    srv__reply_free(&r);
    CHECK(r.body == NULL);

    /* api/ gives a 503 Retry-After: 1; a refusal from the headers does not. */
    r = srv__reply_refusal(API_ERRORS_V2, SRV_REFUSE_DRAINING, "draining");
    CHECK_EQ_INT(r.status, 503);
    CHECK_EQ_INT(r.retry_after_s, 0);
    /* The Open Inference Protocol's form. */
    CHECK(r.body && r.len == 21 && memcmp(r.body, "{\"error\":\"draining\"}\n", 21) == 0);
    srv__reply_free(&r);
}

static void test_computed_replies_keep_what_api_said(void)
{
    api_reply a;
    srv_reply r;
    api_reply_error_status(&a, API_ERRORS_NATIVE, API_STATUS_UNAVAILABLE, API_REASON_MEMORY, NULL,
                           "out of memory");
    r = srv__reply_computed(&a);
    CHECK_EQ_INT(r.status, 503);
    CHECK_EQ_INT(r.retry_after_s, 1);
    CHECK(r.vary_accept_encoding);
    CHECK(!r.refusal);
    CHECK(a.body == NULL); /* taken over */
    srv__reply_free(&r);

    memset(&a, 0, sizeof a); /* a reply without a status is our bug: 500 */
    r = srv__reply_api(&a);
    CHECK_EQ_INT(r.status, 500);
    CHECK(!r.vary_accept_encoding);
}

static void test_headers_come_in_a_fixed_order(void)
{
    static const char *const extra[] = {"ETag", "\"x\"", NULL};
    srv_reply r = srv__reply_body(SRV_ANSWER_OK, NULL, NULL, 0);
    header_lines h = {.n = 0};
    char num[24];
    r.allow = "GET, HEAD";
    r.headers = extra;
    r.content_encoding = "gzip";
    r.inference_header_len = 123;
    r.vary_accept_encoding = true;
    r.retry_after_s = 1;
    CHECK(srv__reply_each_header(&r, num, collect, &h));
    CHECKF(strcmp(h.text, "Allow: GET, HEAD\nETag: \"x\"\nContent-Encoding: gzip\n"
                          "Inference-Header-Content-Length: 123\nVary: Accept-Encoding\n"
                          "Retry-After: 1\n") == 0,
           "got %s", h.text);

    h.n = 0;
    h.text[0] = '\0';
    r = srv__reply_body(SRV_ANSWER_NOT_MODIFIED, NULL, NULL, 0);
    CHECK(srv__reply_each_header(&r, num, collect, &h));
    CHECK_EQ_INT(h.n, 0);
    CHECK_EQ_INT(r.status, 304);
}

/* Server-Timing lists every stage in the order they happen, in milliseconds, decode without
 * the parse it includes; a reply that never reached a worker has none. */
static void test_computed_replies_carry_their_stages_as_server_timing(void)
{
    api_reply a;
    srv_reply r;
    header_lines h = {.n = 0};
    char num[24];
    memset(&a, 0, sizeof a);
    a.status = 200;
    a.receive_ns = 12345678;
    a.copy_ns = 1000;
    a.queue_ns = 0;
    a.parse_ns = 2000000;
    a.decode_ns = 5500000; /* parse included */
    a.compute_ns = 16000000;
    a.encode_ns = 999999;
    r = srv__reply_computed(&a);
    CHECKF(strcmp(r.timing, "receive;dur=12.346, copy;dur=0.001, queue;dur=0.000, "
                            "parse;dur=2.000, decode;dur=3.500, compute;dur=16.000, "
                            "encode;dur=1.000") == 0,
           "got %s", r.timing);
    CHECK(srv__reply_each_header(&r, num, collect, &h));
    CHECKF(strstr(h.text, "Vary: Accept-Encoding\nServer-Timing: receive;dur=12.346, ") != NULL,
           "got %s", h.text);
    srv__reply_free(&r);

    api_reply_error_status(&a, API_ERRORS_NATIVE, API_STATUS_UNAVAILABLE, API_REASON_MEMORY, NULL,
                           "out of memory");
    r = srv__reply_computed(&a);
    CHECK_EQ_INT(r.timing[0], '\0');
    srv__reply_free(&r);
}

static void test_text_replies_are_copies(void)
{
    char text[] = "{\"live\":true}";
    srv_reply r = srv__reply_text(SRV_ANSWER_OK, "application/json", text);
    text[0] = 'x';
    CHECK_EQ_INT(r.status, 200);
    CHECK(r.body && r.len == 13 && r.body[0] == '{');
    srv__reply_free(&r);
}

static void test_header_tokens_ignore_case_and_blanks_only(void)
{
    CHECK(api_header_token_is("chunked", "chunked"));
    CHECK(api_header_token_is(" \tChunked ", "chunked"));
    CHECK(!api_header_token_is("chunked, gzip", "chunked"));
    CHECK(!api_header_token_is("chunke", "chunked"));
    CHECK(!api_header_token_is("", "chunked"));
    CHECK(!api_header_token_is(NULL, "chunked"));
}

int main(void)
{
    RUN(test_every_429_and_only_it_says_retry_after);
    RUN(test_outcome_codes_come_from_api);
    RUN(test_refusals_carry_their_row);
    RUN(test_computed_replies_keep_what_api_said);
    RUN(test_headers_come_in_a_fixed_order);
    RUN(test_computed_replies_carry_their_stages_as_server_timing);
    RUN(test_text_replies_are_copies);
    RUN(test_header_tokens_ignore_case_and_blanks_only);
    return check_report();
}
