/*
 * test_http.c - attnd over HTTP: routes and status codes, body caps, framing errors, request
 * ids, health, metrics and logs. One daemon (2 workers, --max-body-bytes 1MiB) serves every
 * test; each test leaves it healthy for the next, which is itself part of what is checked.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/support/attention_bodies.h"
#include "tests/support/check.h"
#include "tests/support/daemon.h"
#include "tests/support/rng.h"

#define CAP (1 << 20) /* --max-body-bytes below */

static daemon_proc d;
static bool up;

static const char seed_causal[] =
    "{\"query\": [[1, 0], [0, 1], [1, 1]], \"key\": [[1, 0], [0, 1], [1, 1]],"
    " \"value\": [[1, 0], [0, 2], [3, 1]], \"causal\": true}";

/* The daemon still answers a normal request correctly. */
static void check_still_serving(void)
{
    http_resp r;
    double out[6];
    CHECK_EQ_INT(http_post_json(NULL, d.port, seed_causal, &r), 200);
    CHECK_EQ_INT(json_numbers(r.body, "output", out, 6), 6);
    CHECK_NEAR(out[3], 1.33952310, 1e-5);
    http_resp_free(&r);
}

static void test_live_and_ready(void)
{
    http_resp r;
    CHECK_EQ_INT(http_do(NULL, d.port, "GET", "/v2/health/live", NULL, NULL, 0, &r), 200);
    CHECK(strstr(r.content_type, "application/json") != NULL);
    CHECK(r.body[0] == '{');
    http_resp_free(&r);
    CHECK_EQ_INT(http_do(NULL, d.port, "GET", "/v2/health/ready", NULL, NULL, 0, &r), 200);
    CHECK(strstr(r.body, "ready") != NULL);
    http_resp_free(&r);
    CHECK_EQ_INT(http_do(NULL, d.port, "HEAD", "/v2/health/live", NULL, NULL, 0, &r), 200);
    CHECK_EQ_INT(r.body_len, 0);
    http_resp_free(&r);
}

/* Health checks and scrapes keep their connection open. */
static void test_keep_alive(void)
{
    void *h = http_handle_new();
    http_resp r;
    CHECK_EQ_INT(http_do(h, d.port, "GET", "/v2/health/ready", NULL, NULL, 0, &r), 200);
    http_resp_free(&r);
    CHECK_EQ_INT(http_do(h, d.port, "GET", "/v2/health/live", NULL, NULL, 0, &r), 200);
    CHECK_EQ_INT(r.new_connections, 0);
    http_resp_free(&r);
    CHECK_EQ_INT(http_post_json(h, d.port, seed_causal, &r), 200);
    CHECK_EQ_INT(r.new_connections, 0);
    http_resp_free(&r);
    http_handle_free(h);
}

/* The hand-computed example of tests/engine/cases/seed_cases.json, end to end. */
static void test_seed_cases(void)
{
    static const double causal[6] = {1, 0, 0.33023845, 1.33952310, 1.75872460, 1.00000000};
    static const double queries[3][2] = {
        {1.60444836, 0.79666791}, {1.75872460, 1.00000000}, {1.40111209, 1.20333209}};
    static const char *const q[3] = {"[[1, 0]]", "[[1, 1]]", "[[0, 1]]"};
    http_resp r;
    double out[8];
    char body[512];

    CHECK_EQ_INT(http_post_json(NULL, d.port, seed_causal, &r), 200);
    CHECK(strstr(r.content_type, "application/json") != NULL);
    CHECK_EQ_INT(json_numbers(r.body, "output", out, 8), 6);
    for (int i = 0; i < 6; i++)
        CHECK_NEAR(out[i], causal[i], 1e-5);
    http_resp_free(&r);

    for (int i = 0; i < 3; i++) {
        snprintf(body, sizeof body,
                 "{\"query\": %s, \"key\": [[1, 0], [0, 1], [1, 1]],"
                 " \"value\": [[1, 0], [0, 2], [3, 1]]}",
                 q[i]);
        CHECK_EQ_INT(http_post_json(NULL, d.port, body, &r), 200);
        CHECK_EQ_INT(json_numbers(r.body, "output", out, 8), 2);
        CHECK_NEAR(out[0], queries[i][0], 1e-5);
        CHECK_NEAR(out[1], queries[i][1], 1e-5);
        http_resp_free(&r);
    }

    CHECK_EQ_INT(http_post_json(NULL, d.port,
                                "{\"query\": [[0.3, -1.2]], \"key\": [[1, 1], [1, 1], [1, 1]],"
                                " \"value\": [[1, 0], [0, 2], [3, 1]]}",
                                &r),
                 200);
    CHECK_EQ_INT(json_numbers(r.body, "output", out, 8), 2);
    CHECK_NEAR(out[0], 1.33333333, 1e-5);
    CHECK_NEAR(out[1], 1.0, 1e-5);
    http_resp_free(&r);
}

/* A native error: the status, a JSON {"error": {"code", "message", ...}} body and an id. */
static void check_native_error(const http_resp *r, long status, const char *in_message)
{
    CHECK_EQ_INT(r->status, status);
    CHECKF(strstr(r->body, "\"error\":{") || strstr(r->body, "\"error\": {"), "body: %s", r->body);
    CHECKF(strstr(r->body, "\"code\"") != NULL, "body: %s", r->body);
    if (in_message)
        CHECKF(strstr(r->body, in_message) != NULL, "\"%s\" not in %s", in_message, r->body);
    CHECK(r->request_id[0] != '\0');
}

static void test_not_found(void)
{
    http_resp r;
    http_do(NULL, d.port, "GET", "/nope", NULL, NULL, 0, &r);
    check_native_error(&r, 404, "/nope");
    http_resp_free(&r);
    http_do(NULL, d.port, "POST", "/v1/attentionx", NULL, "{}", 2, &r);
    check_native_error(&r, 404, NULL);
    http_resp_free(&r);
    /* Open Inference Protocol routes answer {"error": "message"}. */
    CHECK_EQ_INT(http_do(NULL, d.port, "GET", "/v2/models/nope", NULL, NULL, 0, &r), 404);
    CHECKF(strncmp(r.body, "{\"error\":\"", 10) == 0, "body: %s", r.body);
    http_resp_free(&r);
}

static void test_wrong_method(void)
{
    http_resp r;
    http_do(NULL, d.port, "GET", "/v1/attention", NULL, NULL, 0, &r);
    check_native_error(&r, 405, NULL);
    CHECK(strcmp(r.allow, "POST") == 0);
    http_resp_free(&r);
    http_do(NULL, d.port, "POST", "/metrics", NULL, "x", 1, &r);
    check_native_error(&r, 405, NULL);
    CHECK(strcmp(r.allow, "GET, HEAD") == 0);
    http_resp_free(&r);
    CHECK_EQ_INT(http_do(NULL, d.port, "DELETE", "/v2/health/ready", NULL, NULL, 0, &r), 405);
    CHECK(strcmp(r.allow, "GET, HEAD") == 0);
    http_resp_free(&r);
    check_still_serving();
}

static void test_bad_requests(void)
{
    static const char *const text[] = {"Content-Type: text/plain", NULL};
    /* gzip and deflate are decoded (tests/server/test_v2.c); other codings are refused. */
    static const char *const gzip[] = {"Content-Type: application/json", "Content-Encoding: br",
                                       NULL};
    http_resp r;

    http_post_json(NULL, d.port, "{\"query\": [[1, 0]", &r);
    check_native_error(&r, 400, NULL);
    http_resp_free(&r);
    http_post_json(NULL, d.port, "", &r);
    check_native_error(&r, 400, NULL);
    http_resp_free(&r);

    http_do(NULL, d.port, "POST", "/v1/attention", text, seed_causal, strlen(seed_causal), &r);
    check_native_error(&r, 415, NULL);
    http_resp_free(&r);
    http_do(NULL, d.port, "POST", "/v1/attention", gzip, seed_causal, strlen(seed_causal), &r);
    check_native_error(&r, 415, "Content-Encoding");
    http_resp_free(&r);

    /* Well-formed, but D of the query (2) does not match D of the key (3). */
    http_post_json(NULL, d.port,
                   "{\"query\": [[1, 0]], \"key\": [[1, 0, 0]], \"value\": [[1, 0, 0]]}", &r);
    check_native_error(&r, 422, NULL);
    http_resp_free(&r);
    check_still_serving();
}

/* A JSON body of exactly n bytes: the seed request padded with spaces. */
static char *padded_body(size_t n)
{
    size_t k = strlen(seed_causal);
    char *b = malloc(n + 1);
    if (!b)
        return NULL;
    memcpy(b, seed_causal, k);
    memset(b + k, ' ', n - k);
    b[n] = '\0';
    return b;
}

/* Sends `body` as chunks of `chunk` bytes on a raw socket; returns the response text. */
static char *send_chunked(const char *body, size_t n, size_t chunk)
{
    char head[256];
    char *resp;
    bool closed;
    int fd = raw_connect(d.port);
    if (fd < 0)
        return NULL;
    snprintf(head, sizeof head,
             "POST /v1/attention HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
             "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n");
    raw_send(fd, head, strlen(head));
    for (size_t off = 0; off < n; off += chunk) {
        size_t m = n - off < chunk ? n - off : chunk;
        char size_line[32];
        snprintf(size_line, sizeof size_line, "%zx\r\n", m);
        if (raw_send(fd, size_line, strlen(size_line)) != 0 || raw_send(fd, body + off, m) != 0 ||
            raw_send(fd, "\r\n", 2) != 0)
            break;
    }
    raw_send(fd, "0\r\n\r\n", 5);
    resp = raw_read_all(fd, 10000, &closed);
    (void)closed;
    close(fd);
    return resp;
}

static void test_body_cap_by_content_length(void)
{
    char *at = padded_body(CAP), *over = padded_body(CAP + 1);
    http_resp r;
    char *resp;
    double t0;
    static const char huge[] = "POST /v1/attention HTTP/1.1\r\nHost: t\r\n"
                               "Content-Type: application/json\r\n"
                               "Content-Length: 10000000000\r\n\r\n";

    CHECK_EQ_INT(http_post_json(NULL, d.port, at, &r), 200);
    http_resp_free(&r);
    http_post_json(NULL, d.port, over, &r);
    check_native_error(&r, 413, "--max-body-bytes");
    http_resp_free(&r);

    /* The answer comes from the header alone: no body is ever sent here. */
    t0 = now_s();
    resp = raw_exchange(d.port, huge, strlen(huge), 5000);
    CHECK_EQ_INT(raw_status(resp), 413);
    CHECK(now_s() - t0 < 2.0);
    CHECK(resp && strstr(resp, "Connection: close") != NULL);
    free(resp);
    free(at);
    free(over);
    check_still_serving();
}

static void test_body_cap_by_chunks(void)
{
    char *at = padded_body(CAP), *over = padded_body(CAP + 1), *big = padded_body(3 * CAP / 2);
    char *resp;

    resp = send_chunked(at, CAP, 65536);
    CHECK_EQ_INT(raw_status(resp), 200);
    free(resp);
    resp = send_chunked(over, CAP + 1, 65536);
    CHECK_EQ_INT(raw_status(resp), 413);
    CHECK(resp && strstr(resp, "--max-body-bytes") != NULL);
    free(resp);
    resp = send_chunked(big, 3 * CAP / 2, 4096);
    CHECK_EQ_INT(raw_status(resp), 413);
    free(resp);
    free(at);
    free(over);
    free(big);
    check_still_serving();
}

/* Framing that a proxy and this server could read differently: rejected before the body. */
static void test_framing_errors(void)
{
    static const struct {
        const char *request;
        int status;
    } cases[] = {
        {"POST /v1/attention HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
         "Content-Length: 3\r\nContent-Length: 5\r\n\r\nabcde",
         400},
        {"POST /v1/attention HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
         "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
         400},
        {"POST /v1/attention HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
         "Transfer-Encoding: gzip\r\n\r\nabc",
         501},
        {"POST /v1/attention HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
         "Transfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
         501},
        {"POST /v1/attention HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
         "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
         501},
        /* libmicrohttpd's own check: a Content-Length that is not a number. */
        {"POST /v1/attention HTTP/1.1\r\nHost: t\r\nContent-Length: -3\r\n\r\nabc", 400},
        /* The same smuggling shapes on a GET route. */
        {"GET /v2/health/live HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\n"
         "Content-Length: 2\r\n\r\nab",
         400},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *resp = raw_exchange(d.port, cases[i].request, strlen(cases[i].request), 3000);
        CHECKF(raw_status(resp) == cases[i].status, "case %zu: got %d, want %d (%.80s)", i,
               raw_status(resp), cases[i].status, resp ? resp : "(null)");
        CHECKF(resp && strstr(resp, "Connection: close"), "case %zu keeps the connection", i);
        free(resp);
    }
    check_still_serving();
}

static void test_request_id(void)
{
    static const char *const given[] = {"X-Request-Id: trace-42.a:b", NULL};
    static const char *const bad[] = {"X-Request-Id: has space\"quote", NULL};
    char long_id[300] = "X-Request-Id: ";
    const char *const too_long[] = {long_id, NULL};
    http_resp r, r2;

    http_do(NULL, d.port, "GET", "/v2/health/live", given, NULL, 0, &r);
    CHECK(strcmp(r.request_id, "trace-42.a:b") == 0);
    http_resp_free(&r);

    http_do(NULL, d.port, "GET", "/v2/health/live", NULL, NULL, 0, &r);
    http_do(NULL, d.port, "GET", "/v2/health/live", NULL, NULL, 0, &r2);
    CHECK_EQ_INT(strlen(r.request_id), 16);
    CHECK(strspn(r.request_id, "0123456789abcdef") == 16);
    CHECK(strcmp(r.request_id, r2.request_id) != 0);
    http_resp_free(&r);
    http_resp_free(&r2);

    /* Unsafe or over-long ids are replaced, never echoed. */
    http_do(NULL, d.port, "GET", "/v2/health/live", bad, NULL, 0, &r);
    CHECK_EQ_INT(strlen(r.request_id), 16);
    http_resp_free(&r);
    memset(long_id + 14, 'a', 200);
    long_id[214] = '\0';
    http_do(NULL, d.port, "GET", "/v2/health/live", too_long, NULL, 0, &r);
    CHECK_EQ_INT(strlen(r.request_id), 16);
    http_resp_free(&r);

    /* Errors carry the id too. */
    http_do(NULL, d.port, "GET", "/nope", given, NULL, 0, &r);
    CHECK(strcmp(r.request_id, "trace-42.a:b") == 0);
    http_resp_free(&r);
}

/* Every sample line names a family announced by # HELP and # TYPE lines before it. */
static void check_exposition_format(const char *text)
{
    const char *line = text;
    char family[128] = "";
    int samples = 0;
    while (line && *line) {
        const char *nl = strchr(line, '\n');
        size_t n = nl ? (size_t)(nl - line) : strlen(line);
        if (strncmp(line, "# HELP ", 7) == 0) {
            size_t k = strcspn(line + 7, " ");
            snprintf(family, sizeof family, "%.*s", (int)k, line + 7);
        } else if (strncmp(line, "# TYPE ", 7) == 0) {
            CHECKF(strncmp(line + 7, family, strlen(family)) == 0, "TYPE without HELP: %.*s",
                   (int)n, line);
            CHECKF(strstr(line, " counter") || strstr(line, " gauge") || strstr(line, " histogram"),
                   "bad TYPE: %.*s", (int)n, line);
        } else if (n > 0) {
            CHECKF(family[0] && strncmp(line, family, strlen(family)) == 0,
                   "sample outside its family: %.*s", (int)n, line);
            samples++;
        }
        line = nl ? nl + 1 : NULL;
    }
    CHECK(samples > 20);
}

/* The engine info metric names the bf16 path; a daemon started with --default-precision
 * bfloat16 computes requests that do not say in bf16 (and one that says float32 in float32),
 * and the reply's meta says so. */
static void test_default_precision_and_engine_info(void)
{
    http_resp r;
    CHECK_EQ_INT(http_do(NULL, d.port, "GET", "/metrics", NULL, NULL, 0, &r), 200);
    CHECK(strstr(r.body, "attnd_engine_info{kernels=\"") != NULL);
    CHECK(strstr(r.body, ",bf16=\"") != NULL);
    http_resp_free(&r);

    daemon_proc bf;
    const char *const args[] = {"--threads", "1", "--default-precision", "bfloat16", NULL};
    if (daemon_start(&bf, args) != 0)
        return;
#define PRECISION_BODY(extra)                                                                      \
    "{\"query\": [[0, 0]], \"key\": [[1, 0], [0, 1]], \"value\": [[1.00390625, 3], [1, 5]]" extra  \
    "}"
    CHECK_EQ_INT(http_post_json(NULL, bf.port, PRECISION_BODY(""), &r), 200);
    CHECKF(strstr(r.body, "\"output\":[[1,4]]") && strstr(r.body, "\"precision\":\"bfloat16\""),
           "reply %s", r.body);
    http_resp_free(&r);
    CHECK_EQ_INT(http_post_json(NULL, bf.port, PRECISION_BODY(", \"precision\": \"float32\""), &r),
                 200);
    CHECKF(strstr(r.body, "\"output\":[[1.00195312,4]]") &&
               strstr(r.body, "\"precision\":\"float32\""),
           "reply %s", r.body);
    http_resp_free(&r);
#undef PRECISION_BODY
    daemon_stop(&bf);
}

static void test_metrics(void)
{
    http_resp r;
    double before =
        metric_value(d.port, "attnd_requests_total{route=\"/v1/attention\",code=\"200\"}");
    check_still_serving();
    CHECK_EQ_INT(http_do(NULL, d.port, "GET", "/metrics", NULL, NULL, 0, &r), 200);
    CHECK(strstr(r.content_type, "text/plain") != NULL);
    check_exposition_format(r.body);
    CHECK(strstr(r.body, "# TYPE attnd_requests_total counter") != NULL);
    CHECK(strstr(r.body, "# TYPE attnd_request_duration_seconds histogram") != NULL);
    CHECK(strstr(r.body, "attnd_request_duration_seconds_bucket{route=\"/v1/attention\","
                         "le=\"+Inf\"}") != NULL);
    CHECK(strstr(r.body, "attnd_request_duration_seconds_count{route=\"/v1/attention\"}") != NULL);
    CHECK(strstr(r.body, "attnd_request_stage_seconds_bucket{stage=\"compute\",le=\"0.001\"}") !=
          NULL);
    CHECK(strstr(r.body, "attnd_request_stage_seconds_count{stage=\"queue\"}") != NULL);
    CHECK(strstr(r.body, "attnd_queue_depth 0\n") != NULL);
    CHECK(strstr(r.body, "attnd_running_requests 0\n") != NULL);
    CHECK(strstr(r.body, "\nattnd_inflight_requests ") != NULL);
    CHECK(strstr(r.body, "attnd_ready 1\n") != NULL);
    CHECK(strstr(r.body, "# TYPE attnd_received_bytes_total counter") != NULL);
    CHECK(strstr(r.body, "# TYPE attnd_sent_bytes_total counter") != NULL);
    http_resp_free(&r);

    CHECK(metric_wait(d.port, "attnd_requests_total{route=\"/v1/attention\",code=\"200\"}",
                      before + 1, 2000));
    CHECK(metric_wait(d.port, "attnd_requests_total{route=\"other\",code=\"404\"}", 1, 2000));
    CHECK(
        metric_wait(d.port, "attnd_requests_total{route=\"/v1/attention\",code=\"413\"}", 3, 2000));
    CHECK(metric_wait(d.port, "attnd_rejected_total{reason=\"too_large\"}", 3, 2000));
    CHECK(metric_wait(d.port, "attnd_rejected_total{reason=\"bad_request\"}", 5, 2000));
    CHECK(metric_value(d.port, "attnd_rejected_total{reason=\"queue_full\"}") == 0);
    CHECK(metric_value(d.port, "attnd_received_bytes_total") > CAP);
    CHECK(metric_value(d.port, "attnd_sent_bytes_total") > 0);
}

static void test_log_lines(void)
{
    static const char *const id[] = {"X-Request-Id: log-check-1", "Content-Type: application/json",
                                     NULL};
    static const char body[] = "{\"query\": [[1, 0]], \"key\": [[1, 0]], \"value\": [[4, 2]],"
                               " \"secret_marker_xyz\": 1}";
    http_resp r;
    char *log, *line, *end;

    http_do(NULL, d.port, "POST", "/v1/attention", id, body, strlen(body), &r);
    CHECK(r.status == 422 || r.status == 200);
    http_resp_free(&r);
    /* The line is written when the request completes, just after the client has its reply. */
    for (int tries = 0; tries < 200; tries++) {
        log = daemon_log(&d);
        if (!log || strstr(log, "\"request_id\":\"log-check-1\""))
            break;
        free(log);
        log = NULL;
        sleep_ms(10);
    }
    CHECK(log != NULL);
    if (!log)
        return;
    line = strstr(log, "\"request_id\":\"log-check-1\"");
    CHECK(line != NULL);
    if (line) {
        while (line > log && line[-1] != '\n')
            line--;
        end = strchr(line, '\n');
        if (end)
            *end = '\0';
        CHECKF(line[0] == '{' && line[strlen(line) - 1] == '}', "not a JSON line: %s", line);
        CHECK(strstr(line, "\"time\":\"20") != NULL);
        CHECK(strstr(line, "Z\"") != NULL);
        CHECK(strstr(line, "\"method\":\"POST\"") != NULL);
        CHECK(strstr(line, "\"route\":\"/v1/attention\"") != NULL);
        CHECK(strstr(line, "\"status\":") != NULL);
        CHECK(strstr(line, "\"bytes_in\":") != NULL);
        CHECK(strstr(line, "\"bytes_out\":") != NULL);
        CHECK(strstr(line, "\"queue_ms\":") != NULL);
        CHECK(strstr(line, "\"decode_ms\":") != NULL);
        CHECK(strstr(line, "\"compute_ms\":") != NULL);
        CHECK(strstr(line, "\"encode_ms\":") != NULL);
    }
    /* No request body in the log, not even its field names. */
    CHECK(strstr(log, "secret_marker_xyz") == NULL);
    /* The startup line names the port. */
    CHECK(strstr(log, "listening on 127.0.0.1 port") != NULL);
    free(log);
}

/* The stages of Server-Timing, in the order they happen (docs/http-api.md). */
static const char *const stages[] = {"receive", "copy",    "queue", "parse",
                                     "decode",  "compute", "encode"};

/* A reply that a worker made lists every stage, in order, none negative, and together they
 * last no longer than the request did as the client saw it (each rounded to a microsecond). */
static void check_stages(const http_resp *r)
{
    const char *prev = r->server_timing;
    double sum = 0;
    for (size_t i = 0; i < sizeof stages / sizeof stages[0]; i++) {
        double ms = server_timing_ms(r->server_timing, stages[i]);
        const char *at = strstr(r->server_timing, stages[i]);
        CHECKF(ms >= 0, "%s missing or negative in \"%s\"", stages[i], r->server_timing);
        CHECKF(at && at >= prev, "%s out of order in \"%s\"", stages[i], r->server_timing);
        prev = at ? at : prev;
        sum += ms > 0 ? ms : 0;
    }
    CHECKF(sum <= r->seconds * 1e3 + 0.0005 * 7, "the stages sum to %.3f ms, the client saw %.3f",
           sum, r->seconds * 1e3);
}

static void test_server_timing_says_where_a_request_s_time_went(void)
{
    static const char *const v2_type[] = {"Content-Type: application/octet-stream", NULL};
    enum { N = 2 * 256 * 64 };
    static float q[N], k[N], v[N];
    uint64_t rng = 7;
    for (size_t i = 0; i < N; i++) {
        q[i] = rng_sym(&rng, 1.0);
        k[i] = rng_sym(&rng, 1.0);
        v[i] = rng_sym(&rng, 1.0);
    }
    attn_problem p = {.q = q, .k = k, .v = v, .shape = {1, 2, 256, 64}};
    size_t len, header_len;
    char *body = attn_body_native(&p, &len), hl[64];
    http_resp r;
    CHECK(body && len < CAP);
    CHECK_EQ_INT(http_post_json(NULL, d.port, body ? body : "", &r), 200);
    check_stages(&r);
    CHECK(server_timing_ms(r.server_timing, "compute") > 0);
    CHECK(server_timing_ms(r.server_timing, "parse") > 0);
    http_resp_free(&r);
    free(body);

    body = attn_body_v2(&p, &len, &header_len);
    snprintf(hl, sizeof hl, "Inference-Header-Content-Length: %zu", header_len);
    const char *const v2_headers[] = {v2_type[0], hl, NULL};
    CHECK_EQ_INT(http_do(NULL, d.port, "POST", "/v2/models/sdpa/infer", v2_headers, body, len, &r),
                 200);
    check_stages(&r);
    CHECK(server_timing_ms(r.server_timing, "compute") > 0);
    http_resp_free(&r);
    free(body);

    /* Refused while decoding: the stages up to there, nothing computed. */
    static const char bad[] = "{\"query\": {\"shape\": [1, 4], \"dtype\": \"float32\", "
                              "\"base64\": \"AAAAAAAAAAAAAAAAAAAA!AAA\"}, \"key\": [[1, 0, 0, 0]], "
                              "\"value\": [[1, 0, 0, 0]]}";
    CHECK_EQ_INT(http_post_json(NULL, d.port, bad, &r), 422);
    check_stages(&r);
    CHECK(server_timing_ms(r.server_timing, "compute") == 0);
    http_resp_free(&r);

    /* No worker, no stages. */
    CHECK_EQ_INT(http_do(NULL, d.port, "GET", "/v2/health/live", NULL, NULL, 0, &r), 200);
    CHECK_EQ_INT(r.server_timing[0], '\0');
    http_resp_free(&r);
}

int main(void)
{
    const char *const args[] = {"--threads", "2", "--max-body-bytes", "1MiB", NULL};
    up = daemon_start(&d, args) == 0;
    if (!up) {
        printf("FAIL cannot start attnd\n0 passed, 1 failed\n");
        return 1;
    }
    RUN(test_live_and_ready);
    RUN(test_keep_alive);
    RUN(test_seed_cases);
    RUN(test_not_found);
    RUN(test_wrong_method);
    RUN(test_bad_requests);
    RUN(test_body_cap_by_content_length);
    RUN(test_body_cap_by_chunks);
    RUN(test_framing_errors);
    RUN(test_request_id);
    RUN(test_default_precision_and_engine_info);
    RUN(test_metrics);
    RUN(test_log_lines);
    RUN(test_server_timing_says_where_a_request_s_time_went);
    CHECK_EQ_INT(daemon_stop(&d), 0);
    return check_report();
}
