/* test_error.c - api/core/error.c and api/wire/reply.c: the native error body, status codes and
 * reason names, the status an engine failure becomes, and the default limits. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "api/wire/reply.h"
#include "tests/support/check.h"

/* Parses a reply body; NULL (and a failed check) if it is not JSON. */
static json_t *parse_reply(const api_reply *r)
{
    json_error_t jerr;
    json_t *j = json_loadb(r->body, r->body_len, JSON_REJECT_DUPLICATES, &jerr);
    CHECKF(j != NULL, "reply is not JSON: %s", jerr.text);
    return j;
}

static void test_error_reply_has_code_message_and_field(void)
{
    api_reply r;
    api_reply_error_status(&r, API_ERRORS_NATIVE, API_STATUS_INVALID_ARGUMENT,
                           API_REASON_BAD_REQUEST, "query.shape[1]", "bad %s \"%d\"", "dim", 0);
    CHECK_EQ_INT(r.status, 422);
    CHECK(strcmp(r.content_type, "application/json") == 0);
    CHECK_EQ_INT(r.reason, API_REASON_BAD_REQUEST);
    CHECK_EQ_INT(r.retry_after_s, 0);
    json_t *j = parse_reply(&r);
    json_t *e = json_object_get(j, "error");
    CHECK_EQ_INT(json_object_size(j), 1);
    CHECK_EQ_INT(json_object_size(e), 3);
    CHECK(strcmp(json_string_value(json_object_get(e, "code")), "invalid_argument") == 0);
    CHECK(strcmp(json_string_value(json_object_get(e, "message")), "bad dim \"0\"") == 0);
    CHECK(strcmp(json_string_value(json_object_get(e, "field")), "query.shape[1]") == 0);
    json_decref(j);
    api_reply_free(&r);
    api_reply_free(&r); /* a second free is harmless */
}

static void test_an_error_without_a_field_says_null(void)
{
    api_reply r;
    api_reply_error_status(&r, API_ERRORS_NATIVE, API_STATUS_OVERLOADED, API_REASON_QUEUE_FULL,
                           NULL, "queue full");
    CHECK_EQ_INT(r.retry_after_s, 1);
    json_t *j = parse_reply(&r);
    CHECK(json_is_null(json_object_get(json_object_get(j, "error"), "field")));
    CHECK(strcmp(json_string_value(json_object_get(json_object_get(j, "error"), "code")),
                 "overloaded") == 0);
    json_decref(j);
    size_t len = 0;
    char *body = api_reply_take_body(&r, &len);
    CHECK(body != NULL && len > 0 && r.body == NULL && r.body_len == 0);
    eng_buf_free(body);
    api_reply_free(&r);
}

/* The KServe v2 form is {"error": "message"}, with the same status, reason and Retry-After. */
static void test_a_v2_error_is_a_bare_message(void)
{
    api_reply r;
    api_reply_error_status(&r, API_ERRORS_V2, API_STATUS_UNAVAILABLE, API_REASON_DRAINING,
                           "ignored", "%s", "draining");
    CHECK_EQ_INT(r.status, 503);
    CHECK_EQ_INT(r.reason, API_REASON_DRAINING);
    CHECK_EQ_INT(r.retry_after_s, 1);
    json_t *j = parse_reply(&r);
    CHECK(json_object_size(j) == 1);
    CHECK(json_is_string(json_object_get(j, "error")) &&
          strcmp(json_string_value(json_object_get(j, "error")), "draining") == 0);
    json_decref(j);
    api_reply_free(&r);
}

static void test_every_design_status_has_a_code(void)
{
    static const struct {
        api_status status;
        int native, v2;
        const char *code;
    } codes[] = {
        {API_STATUS_OK, 200, 200, "ok"},
        {API_STATUS_NOT_MODIFIED, 304, 304, "not_modified"},
        {API_STATUS_MALFORMED_REQUEST, 400, 400, "malformed_request"},
        {API_STATUS_NOT_FOUND, 404, 404, "not_found"},
        {API_STATUS_METHOD_NOT_ALLOWED, 405, 405, "method_not_allowed"},
        {API_STATUS_TOO_LARGE, 413, 413, "too_large"},
        {API_STATUS_UNSUPPORTED_MEDIA_TYPE, 415, 415, "unsupported_media_type"},
        {API_STATUS_INVALID_ARGUMENT, 422, 400, "invalid_argument"},
        {API_STATUS_OVERLOADED, 429, 429, "overloaded"},
        {API_STATUS_CANCELLED, API_STATUS_CLIENT_CLOSED, API_STATUS_CLIENT_CLOSED, "cancelled"},
        {API_STATUS_INTERNAL, 500, 500, "internal"},
        {API_STATUS_UNAVAILABLE, 503, 503, "unavailable"},
        {API_STATUS_DEADLINE_EXCEEDED, 504, 504, "deadline_exceeded"},
    };
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        CHECKF(strcmp(api_status_name(codes[i].status), codes[i].code) == 0, "%d -> %s",
               codes[i].native, api_status_name(codes[i].status));
        CHECK_EQ_INT(api_status_http(API_ERRORS_NATIVE, codes[i].status), codes[i].native);
        CHECK_EQ_INT(api_status_http(API_ERRORS_V2, codes[i].status), codes[i].v2);
    }
}

static void test_reasons_have_their_metric_names(void)
{
    CHECK(strcmp(api_reason_str(API_REASON_NONE), "none") == 0);
    CHECK(strcmp(api_reason_str(API_REASON_QUEUE_FULL), "queue_full") == 0);
    CHECK(strcmp(api_reason_str(API_REASON_MEMORY), "memory") == 0);
    CHECK(strcmp(api_reason_str(API_REASON_DEADLINE), "deadline") == 0);
    CHECK(strcmp(api_reason_str(API_REASON_CANCELLED), "cancelled") == 0);
    CHECK(strcmp(api_reason_str(API_REASON_DRAINING), "draining") == 0);
    CHECK(strcmp(api_reason_str(API_REASON_TOO_LARGE), "too_large") == 0);
    CHECK(strcmp(api_reason_str(API_REASON_BAD_REQUEST), "bad_request") == 0);
    CHECK(strcmp(api_reason_str(API_REASON_INTERNAL), "internal") == 0);
}

static void test_messages_are_escaped_and_bounded(void)
{
    char long_text[2000];
    memset(long_text, 'x', sizeof long_text - 1);
    long_text[sizeof long_text - 1] = '\0';
    api_reply r;
    api_reply_error_status(&r, API_ERRORS_NATIVE, API_STATUS_MALFORMED_REQUEST,
                           API_REASON_BAD_REQUEST, "a\"b", "quote \" backslash \\ newline \n %s",
                           long_text);
    json_t *j = parse_reply(&r);
    const char *msg = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
    CHECK(msg && strncmp(msg, "quote \" backslash \\ newline \n x", 31) == 0);
    CHECK(strcmp(json_string_value(json_object_get(json_object_get(j, "error"), "field")),
                 "a\"b") == 0);
    json_decref(j);
    api_reply_free(&r);
}

static void test_the_first_error_wins(void)
{
    api__error err = {0};
    CHECK_EQ_INT(
        api__error_set(&err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, "a", "first"),
        -1);
    CHECK_EQ_INT(api__error_set(&err, API_STATUS_INTERNAL, API_REASON_INTERNAL, "b", "second"), -1);
    CHECK_EQ_INT(err.status, API_STATUS_INVALID_ARGUMENT);
    CHECK(strcmp(err.field, "a") == 0 && strcmp(err.message, "first") == 0);
}

static void test_default_limits(void)
{
    api_limits l = api_limits_default();
    CHECK_EQ_INT(l.max_body_bytes, 256u << 20);
    CHECK_EQ_INT(l.max_elements, 1u << 28);
    CHECK_EQ_INT(l.max_timeout_ms, 60000);
}

/* Each engine status maps to one api status; a malformed input is the client's fault only when
 * the request supplied it. */
static void test_engine_statuses_map_to_api_statuses(void)
{
    static const struct {
        eng_status st;
        api__engine_input input;
        api_status status;
        api_reason reason;
        bool field; /* the error names the field it was given */
    } cases[] = {
        {ENG_EINVAL, API_ENGINE_INPUT_SERVER, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST,
         true},
        {ENG_ENONFINITE, API_ENGINE_INPUT_SERVER, API_STATUS_INVALID_ARGUMENT,
         API_REASON_BAD_REQUEST, true},
        {ENG_ETOOBIG, API_ENGINE_INPUT_REQUEST, API_STATUS_TOO_LARGE, API_REASON_TOO_LARGE, true},
        {ENG_ENOMEM, API_ENGINE_INPUT_SERVER, API_STATUS_UNAVAILABLE, API_REASON_MEMORY, false},
        {ENG_ECANCELLED, API_ENGINE_INPUT_SERVER, API_STATUS_CANCELLED, API_REASON_CANCELLED,
         false},
        {ENG_EDEADLINE, API_ENGINE_INPUT_SERVER, API_STATUS_DEADLINE_EXCEEDED, API_REASON_DEADLINE,
         false},
        {ENG_EFORMAT, API_ENGINE_INPUT_SERVER, API_STATUS_INTERNAL, API_REASON_INTERNAL, true},
        {ENG_EIO, API_ENGINE_INPUT_SERVER, API_STATUS_INTERNAL, API_REASON_INTERNAL, true},
        {ENG_EFORMAT, API_ENGINE_INPUT_REQUEST, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST,
         true},
        {ENG_EIO, API_ENGINE_INPUT_REQUEST, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST,
         true},
    };
    eng_error e = {0};
    snprintf(e.message, sizeof e.message, "the engine's words");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        api__error err = {0};
        e.status = cases[i].st;
        CHECK_EQ_INT(api__error_engine(&err, cases[i].st, &e, "key", cases[i].input), -1);
        CHECKF(err.status == cases[i].status && err.reason == cases[i].reason,
               "%s -> status %d reason %d", eng_status_str(cases[i].st), (int)err.status,
               (int)err.reason);
        CHECK_EQ_INT(strcmp(err.field, cases[i].field ? "key" : ""), 0);
        if (cases[i].st != ENG_ECANCELLED && cases[i].st != ENG_EDEADLINE)
            CHECKF(strstr(err.message, "the engine's words") != NULL, "message: %s", err.message);
    }
    api__error ok = {0};
    CHECK_EQ_INT(api__error_engine(&ok, ENG_OK, &e, "key", API_ENGINE_INPUT_SERVER), 0);
    CHECK_EQ_INT(ok.status, API_STATUS_OK);
    api__error nofield = {0};
    api__error_engine(&nofield, ENG_ENONFINITE, &e, NULL, API_ENGINE_INPUT_SERVER);
    CHECK_EQ_INT(strcmp(nofield.field, "output"), 0);
}

int main(void)
{
    RUN(test_error_reply_has_code_message_and_field);
    RUN(test_an_error_without_a_field_says_null);
    RUN(test_a_v2_error_is_a_bare_message);
    RUN(test_every_design_status_has_a_code);
    RUN(test_reasons_have_their_metric_names);
    RUN(test_messages_are_escaped_and_bounded);
    RUN(test_the_first_error_wins);
    RUN(test_engine_statuses_map_to_api_statuses);
    RUN(test_default_limits);
    return check_report();
}
