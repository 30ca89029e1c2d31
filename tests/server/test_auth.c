/*
 * test_auth.c - bearer tokens (--auth-token-file): 401 with WWW-Authenticate in the native and
 * the v2 error forms, 200 with any configured token, the probes and the page shell open, a
 * refused upload answered rather than reset, tokens kept out of logs and metrics, the file
 * re-read on SIGHUP, and files that stop the start. One daemon serves the tests that share
 * its token file.
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/support/check.h"
#include "tests/support/daemon.h"

#define TOKEN_A "first-token-0123456789abcdef"
#define TOKEN_B "second.token_~+/=ABCDEFGHIJ"
#define TOKEN_C "rotated-token-9876543210zyxw"

static daemon_proc d;
static bool up;
static char dir[64], token_path[128];

static const char seed_body[] =
    "{\"query\": [[1, 0], [0, 1], [1, 1]], \"key\": [[1, 0], [0, 1], [1, 1]],"
    " \"value\": [[1, 0], [0, 2], [3, 1]], \"causal\": true}";
static const char v2_body[] =
    "{\"inputs\": [{\"name\": \"query\", \"shape\": [1, 2], \"datatype\": \"FP32\", \"data\": "
    "[1, 0]}, {\"name\": \"key\", \"shape\": [1, 2], \"datatype\": \"FP32\", \"data\": [1, 0]},"
    " {\"name\": \"value\", \"shape\": [1, 2], \"datatype\": \"FP32\", \"data\": [3, 1]}]}";

static int write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fputs(text, f);
    return fclose(f);
}

/* One request with `auth` as the whole Authorization header value (NULL: none). */
static long request(const char *method, const char *path, const char *auth, const char *body,
                    http_resp *r)
{
    char header[256];
    const char *headers[3] = {"Content-Type: application/json", NULL, NULL};
    if (auth) {
        snprintf(header, sizeof header, "Authorization: %s", auth);
        headers[1] = header;
    }
    return http_do(NULL, d.port, method, path, headers, body, body ? strlen(body) : 0, r);
}

/* A 401 of the native form {"error": {"code": "unauthenticated", ...}}. */
static void check_native_401(const char *method, const char *path, const char *auth)
{
    http_resp r;
    CHECKF(request(method, path, auth, strcmp(method, "POST") == 0 ? seed_body : NULL, &r) == 401,
           "%s %s: %ld", method, path, r.status);
    CHECKF(strncmp(r.www_authenticate, "Bearer", 6) == 0, "WWW-Authenticate: %s",
           r.www_authenticate);
    CHECKF(strstr(r.body, "{\"error\":{\"code\":\"unauthenticated\"") == r.body, "%s", r.body);
    http_resp_free(&r);
}

/* A 401 of the Open Inference Protocol's form {"error": "message"}. */
static void check_v2_401(const char *method, const char *path, const char *auth)
{
    http_resp r;
    CHECKF(request(method, path, auth, strcmp(method, "POST") == 0 ? v2_body : NULL, &r) == 401,
           "%s %s: %ld", method, path, r.status);
    CHECK(strncmp(r.www_authenticate, "Bearer", 6) == 0);
    CHECKF(strncmp(r.body, "{\"error\":\"", 10) == 0, "%s", r.body);
    http_resp_free(&r);
}

static void test_missing_token(void)
{
    check_native_401("POST", "/v1/attention", NULL);
    check_native_401("POST", "/v1/mha", NULL);
    check_native_401("GET", "/v1/models", NULL);
    check_native_401("GET", "/metrics", NULL);
    check_native_401("GET", "/no/such/route", NULL); /* routes are not told apart unseen */
    check_v2_401("GET", "/v2", NULL);
    check_v2_401("GET", "/v2/models/sdpa", NULL);
    check_v2_401("GET", "/v2/models/sdpa/ready", NULL);
    check_v2_401("POST", "/v2/models/sdpa/infer", NULL);
}

static void test_wrong_token(void)
{
    check_native_401("POST", "/v1/attention", "Bearer not-the-token-0123456789");
    check_native_401("POST", "/v1/attention", "Bearer " TOKEN_A "x"); /* a longer one */
    check_native_401("POST", "/v1/attention", "Bearer first-token-0123456789abcde");
    check_native_401("POST", "/v1/attention", "Bearer ");
    check_native_401("POST", "/v1/attention", "Basic Zmlyc3Q6dG9rZW4=");
    check_native_401("GET", "/v1/models", TOKEN_A); /* no scheme */
    check_v2_401("POST", "/v2/models/sdpa/infer", "Bearer " TOKEN_A TOKEN_B);
}

static void test_right_tokens(void)
{
    const char *auths[] = {"Bearer " TOKEN_A, "Bearer " TOKEN_B, "bearer   " TOKEN_A " "};
    for (size_t i = 0; i < sizeof auths / sizeof auths[0]; i++) {
        http_resp r;
        double out[6];
        CHECKF(request("POST", "/v1/attention", auths[i], seed_body, &r) == 200, "%s: %ld %s",
               auths[i], r.status, r.body);
        CHECK_EQ_INT(json_numbers(r.body, "output", out, 6), 6);
        CHECK_NEAR(out[3], 1.33952310, 1e-5);
        http_resp_free(&r);
        CHECK_EQ_INT(request("POST", "/v2/models/sdpa/infer", auths[i], v2_body, &r), 200);
        http_resp_free(&r);
        CHECK_EQ_INT(request("GET", "/v2/models/sdpa", auths[i], NULL, &r), 200);
        http_resp_free(&r);
        CHECK_EQ_INT(request("GET", "/metrics", auths[i], NULL, &r), 200);
        http_resp_free(&r);
    }
}

/* The kubelet's probes carry no token, and the page's shell holds no data. */
static void test_open_routes(void)
{
    const char *paths[] = {"/v2/health/live", "/v2/health/ready", "/"};
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        http_resp r;
        CHECKF(request("GET", paths[i], NULL, NULL, &r) == 200, "%s: %ld", paths[i], r.status);
        http_resp_free(&r);
        CHECK_EQ_INT(request("GET", paths[i], "Bearer wrong-token-0123456789", NULL, &r), 200);
        http_resp_free(&r);
    }
}

/* A refused upload still gets its 401 (its body is read and dropped, not reset), and the
 * connection of a refused GET stays usable. */
static void test_refused_upload_is_answered(void)
{
    size_t n = (size_t)(daemon_quick() ? 256 : 900) * 1024;
    char *body = malloc(n + 1);
    http_resp r;
    void *h;
    const char *headers[] = {"Content-Type: application/json", NULL};
    if (!body) {
        CHECK(false);
        return;
    }
    memset(body, ' ', n);
    memcpy(body, seed_body, sizeof seed_body - 1);
    body[n] = '\0';
    CHECK_EQ_INT(http_do(NULL, d.port, "POST", "/v1/attention", headers, body, n, &r), 401);
    CHECK(strstr(r.body, "unauthenticated") != NULL);
    http_resp_free(&r);
    free(body);
    h = http_handle_new();
    CHECK_EQ_INT(http_do(h, d.port, "GET", "/v1/models", NULL, NULL, 0, &r), 401);
    http_resp_free(&r);
    CHECK_EQ_INT(http_do(h, d.port, "GET", "/v2/health/live", NULL, NULL, 0, &r), 200);
    CHECK_EQ_INT(r.new_connections, 0);
    http_resp_free(&r);
    http_handle_free(h);
}

/* Tokens reach neither the log, nor the metrics, nor an error message. */
static void test_tokens_stay_secret(void)
{
    http_resp r;
    char *out;
    CHECK_EQ_INT(request("GET", "/v1/models", "Bearer " TOKEN_A "-guess", NULL, &r), 401);
    CHECK(strstr(r.body, TOKEN_A) == NULL);
    http_resp_free(&r);
    CHECK_EQ_INT(request("GET", "/metrics", "Bearer " TOKEN_B, NULL, &r), 200);
    CHECK(strstr(r.body, TOKEN_A) == NULL && strstr(r.body, TOKEN_B) == NULL);
    CHECKF(strstr(r.body, "attnd_rejected_total{reason=\"unauthorized\"} ") != NULL &&
               strstr(r.body, "attnd_rejected_total{reason=\"unauthorized\"} 0\n") == NULL,
           "the 401s are counted");
    CHECK(strstr(r.body, "attnd_requests_total{route=\"/v1/attention\",code=\"401\"}") != NULL);
    http_resp_free(&r);
    out = daemon_log(&d);
    CHECK(out != NULL);
    CHECK(out && strstr(out, "\"status\":401") != NULL); /* the refusals are logged... */
    CHECK(out && strstr(out, TOKEN_A) == NULL);          /* ...without what was sent */
    CHECK(out && strstr(out, TOKEN_B) == NULL);
    CHECK(out && strstr(out, "first-token") == NULL);
    free(out);
}

/* Waits until a request with `auth` gets `want` (the reload runs on the main thread). */
static bool wait_status(const char *auth, long want, int timeout_ms)
{
    double deadline = now_s() + timeout_ms / 1000.0;
    do {
        http_resp r;
        long got = request("GET", "/v1/models", auth, NULL, &r);
        http_resp_free(&r);
        if (got == want)
            return true;
        sleep_ms(20);
    } while (now_s() < deadline);
    return false;
}

/* Rotation: add the new token, SIGHUP, then drop the old one, SIGHUP. A broken file keeps
 * the tokens in force. */
static void test_reload_on_sighup(void)
{
    http_resp r;
    char *out;
    CHECK_EQ_INT(write_file(token_path, TOKEN_A "\n" TOKEN_C "\n"), 0);
    CHECK_EQ_INT(daemon_signal(&d, SIGHUP), 0);
    CHECK(wait_status("Bearer " TOKEN_C, 200, 30000));
    CHECK_EQ_INT(request("GET", "/v1/models", "Bearer " TOKEN_A, NULL, &r), 200);
    http_resp_free(&r);
    CHECK_EQ_INT(request("GET", "/v1/models", "Bearer " TOKEN_B, NULL, &r), 401);
    http_resp_free(&r);

    CHECK_EQ_INT(write_file(token_path, "# rotated\n" TOKEN_C "\n"), 0);
    CHECK_EQ_INT(daemon_signal(&d, SIGHUP), 0);
    CHECK(wait_status("Bearer " TOKEN_A, 401, 30000));
    CHECK_EQ_INT(request("GET", "/v1/models", "Bearer " TOKEN_C, NULL, &r), 200);
    http_resp_free(&r);

    /* A line that is no token (too short, and secret-looking): refused without echoing it. */
    CHECK_EQ_INT(write_file(token_path, "s3cr3t\n"), 0);
    CHECK_EQ_INT(daemon_signal(&d, SIGHUP), 0);
    {
        double deadline = now_s() + 30;
        bool seen = false;
        while (!seen && now_s() < deadline) {
            out = daemon_log(&d);
            seen = out && strstr(out, "the previous tokens stay in force") != NULL;
            if (seen) {
                CHECK(strstr(out, "line 1") != NULL);
                CHECK(strstr(out, "s3cr3t") == NULL);
                CHECK(strstr(out, TOKEN_C) == NULL);
            }
            free(out);
            if (!seen)
                sleep_ms(20);
        }
        CHECK(seen);
    }
    CHECK_EQ_INT(request("GET", "/v1/models", "Bearer " TOKEN_C, NULL, &r), 200);
    http_resp_free(&r);
    CHECK_EQ_INT(write_file(token_path, TOKEN_A "\n" TOKEN_B "\n"), 0);
    CHECK_EQ_INT(daemon_signal(&d, SIGHUP), 0);
    CHECK(wait_status("Bearer " TOKEN_A, 200, 30000));
}

/* Starts attnd with the token file holding `text`: it must exit 2 naming the file. */
static void check_refused(const char *text, const char *want)
{
    daemon_proc bad;
    char path[128], *out;
    const char *args[] = {"--auth-token-file", path, NULL};
    snprintf(path, sizeof path, "%s/bad-tokens", dir);
    if (text)
        CHECK_EQ_INT(write_file(path, text), 0);
    else
        unlink(path);
    CHECK_EQ_INT(daemon_start(&bad, args), -1);
    CHECK_EQ_INT(bad.exit_code, 2);
    out = daemon_log(&bad);
    CHECKF(out && strstr(out, "--auth-token-file") && strstr(out, want), "wanted \"%s\": %s", want,
           out ? out : "(no log)");
    free(out);
    daemon_stop(&bad);
}

static void test_bad_files_stop_the_start(void)
{
    check_refused(NULL, "No such file");
    check_refused("# only a comment\n\n", "no token");
    check_refused("short\n", "at least 16");
    check_refused(TOKEN_A "\nhas a space in it 0123\n", "line 2");
}

int main(void)
{
    const char *args[] = {"--threads", "2", "--max-body-bytes", "1MiB", "--auth-token-file",
                          token_path,  NULL};
    snprintf(dir, sizeof dir, "/tmp/attnd-auth-XXXXXX");
    if (!mkdtemp(dir)) {
        printf("FAIL mkdtemp\n");
        return 1;
    }
    snprintf(token_path, sizeof token_path, "%s/tokens", dir);
    if (write_file(token_path, "# attnd test tokens\n\n" TOKEN_A "\n  " TOKEN_B "\r\n") != 0) {
        printf("FAIL cannot write %s\n", token_path);
        return 1;
    }
    up = daemon_start(&d, args) == 0;
    if (!up) {
        printf("FAIL the daemon did not start\n");
        return 1;
    }
    RUN_WITHIN(test_missing_token, 300);
    RUN_WITHIN(test_wrong_token, 300);
    RUN_WITHIN(test_right_tokens, 300);
    RUN_WITHIN(test_open_routes, 300);
    RUN_WITHIN(test_refused_upload_is_answered, 300);
    RUN_WITHIN(test_tokens_stay_secret, 300);
    RUN_WITHIN(test_reload_on_sighup, 300);
    RUN_WITHIN(test_bad_files_stop_the_start, 300);
    CHECK_EQ_INT(daemon_stop(&d), 0);
    unlink(token_path);
    rmdir(dir);
    return check_report();
}
