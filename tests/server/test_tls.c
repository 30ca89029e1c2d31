/*
 * test_tls.c - attnd over HTTPS: requests through a CA made at test time, TLS 1.2 and 1.3 only,
 * plain HTTP on the TLS port, certificates that cannot be loaded (exit 2), an encrypted key,
 * mutual TLS accepted and refused, a reload of the certificate on SIGHUP, and bearer tokens
 * over TLS.
 */
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/support/check.h"
#include "tests/support/daemon.h"
#include "tests/support/tls.h"

#define TLS12 "NORMAL:-VERS-ALL:+VERS-TLS1.2"
#define TLS13 "NORMAL:-VERS-ALL:+VERS-TLS1.3"

static tls_files pki;

static const char seed_body[] =
    "{\"query\": [[1, 0], [0, 1], [1, 1]], \"key\": [[1, 0], [0, 1], [1, 1]],"
    " \"value\": [[1, 0], [0, 2], [3, 1]], \"causal\": true}";
static const char *const json[] = {"Content-Type: application/json", NULL};

/* A daemon serving the test server certificate, with `extra` flags (NULL-terminated). */
static int start_tls(daemon_proc *d, const char *const *extra)
{
    const char *args[24] = {"--threads",     "1",         "--tls-cert",
                            pki.server_cert, "--tls-key", pki.server_key};
    size_t n = 6;
    for (size_t i = 0; extra && extra[i] && n < 23; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    return daemon_start(d, args);
}

/* The known answer of seed_body over `handle`. */
static void check_attention(void *handle, int port)
{
    http_resp r;
    double out[6];
    CHECK_EQ_INT(
        http_do(handle, port, "POST", "/v1/attention", json, seed_body, strlen(seed_body), &r),
        200);
    CHECK_EQ_INT(json_numbers(r.body, "output", out, 6), 6);
    CHECK_NEAR(out[3], 1.33952310, 1e-5);
    http_resp_free(&r);
}

static void test_https_requests(void)
{
    daemon_proc d;
    void *h;
    http_resp r;
    char *out;
    if (start_tls(&d, NULL) != 0) {
        CHECK(false);
        return;
    }
    h = https_handle_new(&pki, TLS_CLIENT_NONE);
    CHECK_EQ_INT(http_do(h, d.port, "GET", "/v2/health/ready", NULL, NULL, 0, &r), 200);
    http_resp_free(&r);
    check_attention(h, d.port);
    CHECK_EQ_INT(http_do(h, d.port, "GET", "/v2/models/sdpa", NULL, NULL, 0, &r), 200);
    CHECK_EQ_INT(r.new_connections, 0); /* keep-alive over TLS */
    http_resp_free(&r);
    http_handle_free(h);
    /* The start line names the scheme, so that an operator sees that TLS is on. */
    {
        char path[128];
        snprintf(path, sizeof path, "%s/stdout", d.dir);
        FILE *f = fopen(path, "r");
        char line[256] = "";
        if (f) {
            if (!fgets(line, sizeof line, f))
                line[0] = '\0';
            fclose(f);
        }
        CHECKF(strstr(line, "https://127.0.0.1:") != NULL, "start line: %s", line);
    }
    out = daemon_log(&d);
    CHECK(out && strstr(out, "TLS with the certificate CN=" TLS_SERVER_CN) != NULL);
    free(out);
    CHECK_EQ_INT(daemon_stop(&d), 0);
}

/* Only TLS 1.2 and 1.3 get through the default priorities; the refusal is the server's,
 * seen with a GnuTLS client that offers nothing else. */
static void test_old_protocols_refused(void)
{
    daemon_proc d;
    void *h;
    http_resp r;
    if (start_tls(&d, NULL) != 0) {
        CHECK(false);
        return;
    }
    CHECK_EQ_INT(tls_probe(d.port, TLS12, &pki, TLS_CLIENT_NONE, NULL, 0), 200);
    CHECK_EQ_INT(tls_probe(d.port, TLS13, &pki, TLS_CLIENT_NONE, NULL, 0), 200);
    CHECK(tls_probe(d.port, "NORMAL:-VERS-ALL:+VERS-TLS1.1", &pki, TLS_CLIENT_NONE, NULL, 0) < 0);
    CHECK(tls_probe(d.port, "NORMAL:-VERS-ALL:+VERS-TLS1.0", &pki, TLS_CLIENT_NONE, NULL, 0) < 0);
    /* Through curl as well. */
    h = https_handle_new(&pki, TLS_CLIENT_NONE);
    https_handle_tls11_only(h);
    CHECK_EQ_INT(http_do(h, d.port, "GET", "/v2/health/live", NULL, NULL, 0, &r), 0);
    http_resp_free(&r);
    http_handle_free(h);
    /* A CBC cipher suite of TLS 1.2 is not among the defaults either. */
    CHECK(tls_probe(d.port, "NORMAL:-VERS-ALL:+VERS-TLS1.2:-CIPHER-ALL:+AES-128-CBC:-MAC-ALL:+SHA1",
                    &pki, TLS_CLIENT_NONE, NULL, 0) < 0);
    CHECK_EQ_INT(tls_probe(d.port, TLS12, &pki, TLS_CLIENT_NONE, NULL, 0), 200);
    CHECK_EQ_INT(daemon_stop(&d), 0);

    /* The control: the same client gets TLS 1.1 from a daemon told to allow it, so the
     * refusals above were the server's. */
    {
        const char *old[] = {"--tls-priorities", "NORMAL:+VERS-TLS1.1", NULL};
        if (start_tls(&d, old) != 0) {
            CHECK(false);
            return;
        }
        CHECK_EQ_INT(
            tls_probe(d.port, "NORMAL:-VERS-ALL:+VERS-TLS1.1", &pki, TLS_CLIENT_NONE, NULL, 0),
            200);
        CHECK_EQ_INT(daemon_stop(&d), 0);
    }
}

/* Plain HTTP on the TLS port gets no HTTP answer and costs the daemon nothing. */
static void test_plain_http_refused(void)
{
    daemon_proc d;
    static const char req[] = "GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n";
    void *h;
    http_resp r;
    if (start_tls(&d, NULL) != 0) {
        CHECK(false);
        return;
    }
    for (int i = 0; i < 3; i++) {
        char *text = raw_exchange(d.port, req, sizeof req - 1, 10000);
        CHECK(text != NULL);
        CHECK_EQ_INT(raw_status(text ? text : ""), 0);
        free(text);
    }
    {
        const char *saved = http_scheme;
        http_scheme = "http";
        CHECK_EQ_INT(http_do(NULL, d.port, "GET", "/v2/health/live", NULL, NULL, 0, &r), 0);
        http_resp_free(&r);
        http_scheme = saved;
    }
    h = https_handle_new(&pki, TLS_CLIENT_NONE);
    check_attention(h, d.port);
    http_handle_free(h);
    CHECK_EQ_INT(daemon_stop(&d), 0);
}

/* Starts attnd with `args`, which must fail: exit 2 with `want` in its message. */
static void check_refused(const char *const *args, const char *want)
{
    daemon_proc d;
    char *out;
    CHECK_EQ_INT(daemon_start(&d, args), -1);
    CHECK_EQ_INT(d.exit_code, 2);
    out = daemon_log(&d);
    CHECKF(out && strstr(out, want), "wanted \"%s\" in: %s", want, out ? out : "(no log)");
    free(out);
    daemon_stop(&d);
}

static void test_bad_certificates_stop_the_start(void)
{
    const char *mismatch[] = {"--tls-cert", pki.server_cert, "--tls-key", pki.client_key, NULL};
    const char *missing[] = {"--tls-cert", "/nonexistent/cert.pem", "--tls-key", pki.server_key,
                             NULL};
    const char *not_pem[] = {"--tls-cert", pki.key_password, "--tls-key", pki.server_key, NULL};
    const char *no_key[] = {"--tls-cert", pki.server_cert, NULL};
    const char *no_password[] = {"--tls-cert", pki.server_cert, "--tls-key", pki.encrypted_key,
                                 NULL};
    const char *bad_ca[] = {"--tls-cert",      pki.server_cert,  "--tls-key", pki.server_key,
                            "--tls-client-ca", pki.key_password, NULL};
    const char *bad_prio[] = {"--tls-cert",       pki.server_cert,    "--tls-key", pki.server_key,
                              "--tls-priorities", "NORMAL:+NONSENSE", NULL};
    check_refused(mismatch, "do not match");
    check_refused(missing, "--tls-cert /nonexistent/cert.pem");
    check_refused(not_pem, "cannot load them");
    check_refused(no_key, "--tls-cert needs --tls-key");
    check_refused(no_password, "--tls-key-password-file");
    check_refused(bad_ca, "--tls-client-ca");
    check_refused(bad_prio, "--tls-priorities");
}

static void test_encrypted_key(void)
{
    daemon_proc d;
    const char *args[] = {"--tls-cert",
                          pki.server_cert,
                          "--tls-key",
                          pki.encrypted_key,
                          "--tls-key-password-file",
                          pki.key_password,
                          NULL};
    char *out;
    if (daemon_start(&d, args) != 0) {
        CHECK(false);
        return;
    }
    CHECK_EQ_INT(tls_probe(d.port, TLS13, &pki, TLS_CLIENT_NONE, NULL, 0), 200);
    out = daemon_log(&d);
    CHECK(out && !strstr(out, "attnd-test-password"));
    free(out);
    CHECK_EQ_INT(daemon_stop(&d), 0);
}

/* --tls-client-ca: a certificate of that CA is required, on both protocol versions. */
static void test_mutual_tls(void)
{
    daemon_proc d;
    const char *extra[] = {"--tls-client-ca", pki.ca, NULL};
    const char *prio[] = {TLS12, TLS13};
    void *h;
    http_resp r;
    if (start_tls(&d, extra) != 0) {
        CHECK(false);
        return;
    }
    for (int i = 0; i < 2; i++) {
        CHECK_EQ_INT(tls_probe(d.port, prio[i], &pki, TLS_CLIENT_GOOD, NULL, 0), 200);
        CHECKF(tls_probe(d.port, prio[i], &pki, TLS_CLIENT_NONE, NULL, 0) <= 0, "%s", prio[i]);
        CHECKF(tls_probe(d.port, prio[i], &pki, TLS_CLIENT_ROGUE, NULL, 0) <= 0, "%s", prio[i]);
    }
    h = https_handle_new(&pki, TLS_CLIENT_GOOD);
    check_attention(h, d.port);
    http_handle_free(h);
    h = https_handle_new(&pki, TLS_CLIENT_NONE);
    CHECK_EQ_INT(
        http_do(h, d.port, "POST", "/v1/attention", json, seed_body, strlen(seed_body), &r), 0);
    http_resp_free(&r);
    http_handle_free(h);
    h = https_handle_new(&pki, TLS_CLIENT_ROGUE);
    CHECK_EQ_INT(http_do(h, d.port, "GET", "/v2/health/live", NULL, NULL, 0, &r), 0);
    http_resp_free(&r);
    http_handle_free(h);
    /* Refused clients leave the daemon serving. */
    CHECK_EQ_INT(tls_probe(d.port, TLS13, &pki, TLS_CLIENT_GOOD, NULL, 0), 200);
    CHECK_EQ_INT(daemon_stop(&d), 0);
}

/* Waits up to timeout_ms for `text` to appear in the daemon's log `count` times. */
static bool log_wait(const daemon_proc *d, const char *text, int count, int timeout_ms)
{
    double deadline = now_s() + timeout_ms / 1000.0;
    do {
        char *out = daemon_log(d);
        int seen = 0;
        for (const char *p = out; p && (p = strstr(p, text)) != NULL; p++)
            seen++;
        free(out);
        if (seen >= count)
            return true;
        sleep_ms(20);
    } while (now_s() < deadline);
    return false;
}

/* SIGHUP: new handshakes get the renewed certificate, an open connection keeps working, and a
 * broken file keeps the last good certificate in use. */
static void test_certificate_reload(void)
{
    daemon_proc d;
    char cert[160], key[160], subject[256];
    void *h;
    http_resp r;
    snprintf(cert, sizeof cert, "%s/live.pem", pki.dir);
    snprintf(key, sizeof key, "%s/live.key", pki.dir);
    CHECK_EQ_INT(tls_copy_file(pki.server_cert, cert), 0);
    CHECK_EQ_INT(tls_copy_file(pki.server_key, key), 0);
    {
        const char *args[] = {"--tls-cert", cert, "--tls-key", key, NULL};
        if (daemon_start(&d, args) != 0) {
            CHECK(false);
            return;
        }
    }
    CHECK_EQ_INT(tls_probe(d.port, TLS13, &pki, TLS_CLIENT_NONE, subject, sizeof subject), 200);
    CHECKF(strstr(subject, TLS_SERVER_CN) != NULL, "subject %s", subject);
    h = https_handle_new(&pki, TLS_CLIENT_NONE);
    CHECK_EQ_INT(http_do(h, d.port, "GET", "/v2/health/live", NULL, NULL, 0, &r), 200);
    http_resp_free(&r);

    CHECK_EQ_INT(tls_copy_file(pki.renewed_cert, cert), 0);
    CHECK_EQ_INT(tls_copy_file(pki.renewed_key, key), 0);
    CHECK_EQ_INT(daemon_signal(&d, SIGHUP), 0);
    CHECK(log_wait(&d, "new handshakes get the certificate CN=" TLS_RENEWED_CN, 1, 30000));
    CHECK_EQ_INT(tls_probe(d.port, TLS12, &pki, TLS_CLIENT_NONE, subject, sizeof subject), 200);
    CHECKF(strstr(subject, TLS_RENEWED_CN) != NULL, "subject %s", subject);
    CHECK_EQ_INT(http_do(h, d.port, "GET", "/v2/health/live", NULL, NULL, 0, &r), 200);
    CHECK_EQ_INT(r.new_connections, 0); /* the open connection survived the reload */
    http_resp_free(&r);

    /* A half-written rotation (a key that does not match) is refused; the renewed pair stays. */
    CHECK_EQ_INT(tls_copy_file(pki.client_key, key), 0);
    CHECK_EQ_INT(daemon_signal(&d, SIGHUP), 0);
    CHECK(log_wait(&d, "the previous certificate stays in use", 1, 30000));
    CHECK_EQ_INT(tls_probe(d.port, TLS13, &pki, TLS_CLIENT_NONE, subject, sizeof subject), 200);
    CHECKF(strstr(subject, TLS_RENEWED_CN) != NULL, "subject %s", subject);
    check_attention(h, d.port);
    http_handle_free(h);
    CHECK_EQ_INT(daemon_stop(&d), 0);
}

/* SIGHUP re-reads --tls-client-ca too: after the file is replaced by another CA, a client
 * certificate of the new CA is accepted and one of the old CA refused, on both protocol
 * versions; a connection opened before keeps working; a file with no certificate in it is
 * refused and the CAs in force stay. */
static void test_client_ca_reload(void)
{
    daemon_proc d;
    char ca[160];
    const char *prio[] = {TLS12, TLS13};
    void *h;
    http_resp r;
    snprintf(ca, sizeof ca, "%s/live-ca.pem", pki.dir);
    CHECK_EQ_INT(tls_copy_file(pki.ca, ca), 0);
    {
        const char *extra[] = {"--tls-client-ca", ca, NULL};
        if (start_tls(&d, extra) != 0) {
            CHECK(false);
            return;
        }
    }
    for (int i = 0; i < 2; i++) {
        CHECK_EQ_INT(tls_probe(d.port, prio[i], &pki, TLS_CLIENT_GOOD, NULL, 0), 200);
        CHECKF(tls_probe(d.port, prio[i], &pki, TLS_CLIENT_OTHER, NULL, 0) <= 0, "%s", prio[i]);
    }
    h = https_handle_new(&pki, TLS_CLIENT_GOOD);
    CHECK_EQ_INT(http_do(h, d.port, "GET", "/v2/health/live", NULL, NULL, 0, &r), 200);
    http_resp_free(&r);

    CHECK_EQ_INT(tls_copy_file(pki.other_ca, ca), 0);
    CHECK_EQ_INT(daemon_signal(&d, SIGHUP), 0);
    CHECK(log_wait(&d, "new handshakes verify client certificates against the 1 CA certificate", 1,
                   30000));
    for (int i = 0; i < 2; i++) {
        CHECKF(tls_probe(d.port, prio[i], &pki, TLS_CLIENT_OTHER, NULL, 0) == 200, "%s", prio[i]);
        CHECKF(tls_probe(d.port, prio[i], &pki, TLS_CLIENT_GOOD, NULL, 0) <= 0, "%s", prio[i]);
        CHECKF(tls_probe(d.port, prio[i], &pki, TLS_CLIENT_NONE, NULL, 0) <= 0, "%s", prio[i]);
    }
    /* The connection verified under the old CA stays open; a new one of its client is refused. */
    CHECK_EQ_INT(http_do(h, d.port, "GET", "/v2/health/live", NULL, NULL, 0, &r), 200);
    CHECK_EQ_INT(r.new_connections, 0);
    http_resp_free(&r);
    http_handle_free(h);
    h = https_handle_new(&pki, TLS_CLIENT_GOOD);
    CHECK_EQ_INT(http_do(h, d.port, "GET", "/v2/health/live", NULL, NULL, 0, &r), 0);
    http_resp_free(&r);
    http_handle_free(h);
    h = https_handle_new(&pki, TLS_CLIENT_OTHER);
    check_attention(h, d.port);
    http_handle_free(h);

    /* A broken file (a key, no certificate) is refused; the new CA stays in force. */
    CHECK_EQ_INT(tls_copy_file(pki.client_key, ca), 0);
    CHECK_EQ_INT(daemon_signal(&d, SIGHUP), 0);
    CHECK(log_wait(&d, "the previous client CAs stay in force", 1, 30000));
    CHECK_EQ_INT(tls_probe(d.port, TLS13, &pki, TLS_CLIENT_OTHER, NULL, 0), 200);
    CHECK(tls_probe(d.port, TLS13, &pki, TLS_CLIENT_GOOD, NULL, 0) <= 0);
    CHECK_EQ_INT(daemon_stop(&d), 0);
}

/* `attnd --healthcheck` with the daemon's TLS flags (as a container's HEALTHCHECK has them,
 * through the environment): its exit status. */
static int healthcheck(const daemon_proc *d, const char *cert, const char *key, bool client_ca)
{
    const char *bin = getenv("ATTND_BIN");
    char cmd[1024];
    int rc;
    snprintf(cmd, sizeof cmd, "'%s' --healthcheck --port-file '%s/port'", bin ? bin : "build/attnd",
             d->dir);
    if (cert) {
        size_t n = strlen(cmd);
        snprintf(cmd + n, sizeof cmd - n, " --tls-cert '%s' --tls-key '%s'%s%s", cert, key,
                 client_ca ? " --tls-client-ca " : "", client_ca ? pki.ca : "");
    }
    rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static void test_healthcheck_over_tls(void)
{
    daemon_proc d;
    const char *mtls[] = {"--tls-cert",      pki.dual_cert, "--tls-key", pki.dual_key,
                          "--tls-client-ca", pki.ca,        NULL};
    if (start_tls(&d, NULL) != 0) {
        CHECK(false);
        return;
    }
    CHECK_EQ_INT(healthcheck(&d, pki.server_cert, pki.server_key, false), 0);
    CHECK_EQ_INT(healthcheck(&d, NULL, NULL, false), 1); /* plain HTTP gets no answer */
    CHECK_EQ_INT(daemon_stop(&d), 0);
    /* With client certificates required, the probe presents the daemon's own certificate,
     * which then needs the client-auth usage as well. */
    if (daemon_start(&d, mtls) != 0) {
        CHECK(false);
        return;
    }
    CHECK_EQ_INT(healthcheck(&d, pki.dual_cert, pki.dual_key, true), 0);
    CHECK_EQ_INT(healthcheck(&d, pki.dual_cert, pki.dual_key, false), 1);
    CHECK_EQ_INT(daemon_stop(&d), 0);
}

/* Tokens and TLS together: 401 then 200 over https, probes open. */
static void test_tokens_over_tls(void)
{
    daemon_proc d;
    char tokens[160];
    const char *extra[] = {"--auth-token-file", tokens, NULL};
    const char *const auth[] = {"Content-Type: application/json",
                                "Authorization: Bearer tls-test-token-0123456789", NULL};
    FILE *f;
    void *h;
    http_resp r;
    snprintf(tokens, sizeof tokens, "%s/tokens", pki.dir);
    f = fopen(tokens, "w");
    if (!f) {
        CHECK(false);
        return;
    }
    fputs("tls-test-token-0123456789\n", f);
    fclose(f);
    if (start_tls(&d, extra) != 0) {
        CHECK(false);
        return;
    }
    h = https_handle_new(&pki, TLS_CLIENT_NONE);
    CHECK_EQ_INT(
        http_do(h, d.port, "POST", "/v1/attention", json, seed_body, strlen(seed_body), &r), 401);
    CHECK(strncmp(r.www_authenticate, "Bearer", 6) == 0);
    http_resp_free(&r);
    CHECK_EQ_INT(
        http_do(h, d.port, "POST", "/v1/attention", auth, seed_body, strlen(seed_body), &r), 200);
    http_resp_free(&r);
    CHECK_EQ_INT(http_do(h, d.port, "GET", "/v2/health/ready", NULL, NULL, 0, &r), 200);
    http_resp_free(&r);
    http_handle_free(h);
    CHECK_EQ_INT(daemon_stop(&d), 0);
}

int main(void)
{
    if (tls_files_make(&pki) != 0) {
        printf("FAIL cannot make the test PKI (openssl is in the Makefile's DEB_PACKAGES)\n");
        return 1;
    }
    http_scheme = "https";
    RUN_WITHIN(test_https_requests, 300);
    RUN_WITHIN(test_old_protocols_refused, 300);
    RUN_WITHIN(test_plain_http_refused, 300);
    RUN_WITHIN(test_bad_certificates_stop_the_start, 300);
    RUN_WITHIN(test_encrypted_key, 300);
    RUN_WITHIN(test_mutual_tls, 300);
    RUN_WITHIN(test_certificate_reload, 300);
    RUN_WITHIN(test_client_ca_reload, 300);
    RUN_WITHIN(test_tokens_over_tls, 300);
    RUN_WITHIN(test_healthcheck_over_tls, 300);
    tls_files_remove(&pki);
    return check_report();
}
