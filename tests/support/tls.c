/*
 * tls.c - the test PKI (openssl), https handles (libcurl) and a raw GnuTLS client; see tls.h.
 */
#include "tests/support/tls.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <errno.h>
#include <gnutls/gnutls.h>
#include <gnutls/x509.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#define PASSWORD "attnd-test-password"

static void path_in(const tls_files *f, const char *name, char *out, size_t n)
{
    snprintf(out, n, "%s/%s", f->dir, name);
}

/* Runs one shell command in the PKI folder, its output going to openssl.log there. */
static int run(const tls_files *f, const char *cmd)
{
    char line[2048];
    int rc;
    snprintf(line, sizeof line, "cd '%s' && { %s; } >>openssl.log 2>&1", f->dir, cmd);
    rc = system(line);
    if (rc != 0) {
        printf("tls_files_make: failed (%d): %s (see %s/openssl.log)\n", rc, cmd, f->dir);
        return -1;
    }
    return 0;
}

/* A P-256 key and a certificate signed by the test CA, with the extensions in `ext`. */
static int issue(const tls_files *f, const char *name, const char *cn, const char *ext)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout %s.key "
             "-out %s.csr -subj '/CN=%s' && printf '%s' > %s.ext && openssl x509 -req -in "
             "%s.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -out %s.pem -extfile %s.ext",
             name, name, cn, ext, name, name, name, name);
    return run(f, cmd);
}

int tls_files_make(tls_files *f)
{
    static const char server_ext[] = "subjectAltName=IP:127.0.0.1\\nextendedKeyUsage=serverAuth\\n";
    memset(f, 0, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "/tmp/attnd-pki-XXXXXX");
    if (!mkdtemp(f->dir)) {
        printf("tls_files_make: mkdtemp: %s\n", strerror(errno));
        return -1;
    }
    path_in(f, "ca.pem", f->ca, sizeof f->ca);
    path_in(f, "server.pem", f->server_cert, sizeof f->server_cert);
    path_in(f, "server.key", f->server_key, sizeof f->server_key);
    path_in(f, "renewed.pem", f->renewed_cert, sizeof f->renewed_cert);
    path_in(f, "renewed.key", f->renewed_key, sizeof f->renewed_key);
    path_in(f, "server-encrypted.key", f->encrypted_key, sizeof f->encrypted_key);
    path_in(f, "password", f->key_password, sizeof f->key_password);
    path_in(f, "client.pem", f->client_cert, sizeof f->client_cert);
    path_in(f, "client.key", f->client_key, sizeof f->client_key);
    path_in(f, "rogue.pem", f->rogue_cert, sizeof f->rogue_cert);
    path_in(f, "rogue.key", f->rogue_key, sizeof f->rogue_key);
    path_in(f, "dual.pem", f->dual_cert, sizeof f->dual_cert);
    path_in(f, "dual.key", f->dual_key, sizeof f->dual_key);
    path_in(f, "other-ca.pem", f->other_ca, sizeof f->other_ca);
    path_in(f, "other-client.pem", f->other_client_cert, sizeof f->other_client_cert);
    path_in(f, "other-client.key", f->other_client_key, sizeof f->other_client_key);
    if (run(f, "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "
               "ca.key -out ca.pem -days 2 -subj '/CN=attnd test CA'") != 0 ||
        issue(f, "server", TLS_SERVER_CN, server_ext) != 0 ||
        issue(f, "renewed", TLS_RENEWED_CN, server_ext) != 0 ||
        issue(f, "client", "attnd-test-client", "extendedKeyUsage=clientAuth\\n") != 0 ||
        issue(f, "dual", TLS_SERVER_CN,
              "subjectAltName=IP:127.0.0.1\\nextendedKeyUsage=serverAuth,clientAuth\\n") != 0 ||
        run(f, "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "
               "rogue.key -out rogue.pem -days 2 -subj '/CN=attnd-test-rogue' -addext "
               "extendedKeyUsage=clientAuth") != 0 ||
        run(f, "openssl pkcs8 -topk8 -v2 aes-256-cbc -in server.key -out server-encrypted.key "
               "-passout pass:" PASSWORD " && printf '" PASSWORD "\\n' > password") != 0 ||
        run(f, "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "
               "other-ca.key -out other-ca.pem -days 2 -subj '/CN=attnd other test CA' && "
               "openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "
               "other-client.key -out other-client.csr -subj '/CN=attnd-test-other-client' && "
               "printf 'extendedKeyUsage=clientAuth\\n' > other-client.ext && openssl x509 -req "
               "-in other-client.csr -CA other-ca.pem -CAkey other-ca.key -CAcreateserial -days 2 "
               "-out other-client.pem -extfile other-client.ext") != 0)
        return -1;
    return 0;
}

void tls_files_remove(const tls_files *f)
{
    char cmd[128];
    if (!f->dir[0] || getenv("ATTND_TEST_KEEP"))
        return;
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
    if (system(cmd) != 0)
        printf("tls_files_remove: could not remove %s\n", f->dir);
}

int tls_copy_file(const char *from, const char *to)
{
    char tmp[256], buf[8192];
    FILE *in = fopen(from, "rb"), *out;
    size_t n;
    int rc = 0;
    snprintf(tmp, sizeof tmp, "%s.tmp", to);
    out = fopen(tmp, "wb");
    if (!in || !out) {
        if (in)
            fclose(in);
        if (out)
            fclose(out);
        return -1;
    }
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, n, out) != n)
            rc = -1;
    fclose(in);
    if (fclose(out) != 0 || rc != 0)
        return -1;
    return rename(tmp, to);
}

/* The certificate and key files of a client (not TLS_CLIENT_NONE). */
static const char *client_cert(const tls_files *f, tls_client client)
{
    return client == TLS_CLIENT_GOOD    ? f->client_cert
           : client == TLS_CLIENT_OTHER ? f->other_client_cert
                                        : f->rogue_cert;
}

static const char *client_key(const tls_files *f, tls_client client)
{
    return client == TLS_CLIENT_GOOD    ? f->client_key
           : client == TLS_CLIENT_OTHER ? f->other_client_key
                                        : f->rogue_key;
}

void *https_handle_new(const tls_files *f, tls_client client)
{
    CURL *h = curl_easy_init();
    if (!h)
        return NULL;
    curl_easy_setopt(h, CURLOPT_CAINFO, f->ca);
    curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 1L);
    curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 2L);
    if (client != TLS_CLIENT_NONE) {
        curl_easy_setopt(h, CURLOPT_SSLCERT, client_cert(f, client));
        curl_easy_setopt(h, CURLOPT_SSLKEY, client_key(f, client));
    }
    return h;
}

void https_handle_tls11_only(void *handle)
{
    curl_easy_setopt(handle, CURLOPT_SSLVERSION,
                     (long)(CURL_SSLVERSION_TLSv1_1 | CURL_SSLVERSION_MAX_TLSv1_1));
}

static int connect_loopback(int port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    struct timeval tv = {.tv_sec = 30};
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0)
        return -1;
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static void peer_subject(gnutls_session_t s, char *out, size_t n)
{
    unsigned count = 0;
    const gnutls_datum_t *certs = gnutls_certificate_get_peers(s, &count);
    gnutls_x509_crt_t crt;
    size_t len = n;
    if (!out || n == 0)
        return;
    out[0] = '\0';
    if (!certs || count == 0 || gnutls_x509_crt_init(&crt) < 0)
        return;
    if (gnutls_x509_crt_import(crt, &certs[0], GNUTLS_X509_FMT_DER) < 0 ||
        gnutls_x509_crt_get_dn(crt, out, &len) < 0)
        out[0] = '\0';
    gnutls_x509_crt_deinit(crt);
}

/* Sends a GET of the liveness probe and returns the status of the answer (0: none). */
static int get_live(gnutls_session_t s)
{
    static const char req[] = "GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                              "Connection: close\r\n\r\n";
    char buf[512];
    size_t got = 0;
    ssize_t n;
    int status = 0;
    if (gnutls_record_send(s, req, sizeof req - 1) != (ssize_t)(sizeof req - 1))
        return 0;
    while (got < sizeof buf - 1 && (n = gnutls_record_recv(s, buf + got, sizeof buf - 1 - got)) > 0)
        got += (size_t)n;
    buf[got] = '\0';
    if (sscanf(buf, "HTTP/1.1 %d", &status) != 1)
        return 0;
    return status;
}

int tls_probe(int port, const char *priority, const tls_files *f, tls_client client, char *subject,
              size_t subject_len)
{
    gnutls_certificate_credentials_t cred;
    gnutls_session_t s;
    int fd, rc;
    /* A refused client writes into a connection the server closed: EPIPE, not a signal. */
    signal(SIGPIPE, SIG_IGN);
    if (subject && subject_len)
        subject[0] = '\0';
    if (gnutls_certificate_allocate_credentials(&cred) < 0)
        return GNUTLS_E_MEMORY_ERROR;
    gnutls_certificate_set_x509_trust_file(cred, f->ca, GNUTLS_X509_FMT_PEM);
    if (client != TLS_CLIENT_NONE)
        gnutls_certificate_set_x509_key_file(cred, client_cert(f, client), client_key(f, client),
                                             GNUTLS_X509_FMT_PEM);
    fd = connect_loopback(port);
    if (fd < 0) {
        gnutls_certificate_free_credentials(cred);
        return GNUTLS_E_PUSH_ERROR;
    }
    gnutls_init(&s, GNUTLS_CLIENT);
    rc = gnutls_priority_set_direct(s, priority, NULL);
    if (rc >= 0)
        rc = gnutls_credentials_set(s, GNUTLS_CRD_CERTIFICATE, cred);
    if (rc >= 0) {
        gnutls_session_set_verify_cert(s, NULL, 0);
        gnutls_transport_set_int(s, fd);
        gnutls_handshake_set_timeout(s, 30000);
        do {
            rc = gnutls_handshake(s);
        } while (rc < 0 && !gnutls_error_is_fatal(rc));
    }
    if (rc >= 0) {
        peer_subject(s, subject, subject_len);
        rc = get_live(s);
        gnutls_bye(s, GNUTLS_SHUT_WR);
    }
    gnutls_deinit(s);
    close(fd);
    gnutls_certificate_free_credentials(cred);
    return rc;
}
