/*
 * tls.h - HTTPS helpers for the integration tests: a throw-away PKI made with openssl at test
 * time, libcurl handles that trust it, and a raw GnuTLS client for what curl cannot be made to
 * do on purpose (an old protocol version, a certificate of the wrong CA).
 *
 *     tls_files f;
 *     if (tls_files_make(&f) != 0) return 1;            // prints why
 *     const char *args[] = {"--tls-cert", f.server_cert, "--tls-key", f.server_key, NULL};
 *     daemon_start(&d, args);
 *     http_scheme = "https";
 *     void *h = https_handle_new(&f, TLS_CLIENT_NONE);
 *     http_do(h, d.port, "GET", "/v2/health/live", NULL, NULL, 0, &r);
 *     http_handle_free(h);
 *     tls_files_remove(&f);
 */
#ifndef ATTND_TESTS_TLS_H
#define ATTND_TESTS_TLS_H

#include <stddef.h>

/* Every file of the test PKI, in one temporary folder. The server certificates are for IP
 * 127.0.0.1; "renewed" is a second one from the same CA (another subject, for reloads); the
 * rogue client certificate is self-signed, so no CA of the test vouches for it; "other" is a
 * second CA with a client certificate of its own (for client CA rotation). */
typedef struct {
    char dir[64];
    char ca[128];
    char server_cert[128], server_key[128];
    char renewed_cert[128], renewed_key[128];
    char encrypted_key[128], key_password[128]; /* server_key under a password, and that */
    char client_cert[128], client_key[128];
    char rogue_cert[128], rogue_key[128];
    char dual_cert[128], dual_key[128]; /* a server certificate good for client auth too */
    char other_ca[128], other_client_cert[128], other_client_key[128];
} tls_files;

/* The common names of the two server certificates. */
#define TLS_SERVER_CN  "attnd-test-server"
#define TLS_RENEWED_CN "attnd-test-renewed"

/* Makes the CA and the certificates with openssl; 0, or -1 with the reason printed. */
int tls_files_make(tls_files *f);
void tls_files_remove(const tls_files *f);

/* Copies the file at `from` to `to` (replacing it in one rename); 0 or -1. */
int tls_copy_file(const char *from, const char *to);

/* Which client certificate a connection presents: none, client_cert (of ca), rogue_cert, or
 * other_client_cert (of other_ca). */
typedef enum { TLS_CLIENT_NONE, TLS_CLIENT_GOOD, TLS_CLIENT_ROGUE, TLS_CLIENT_OTHER } tls_client;

/* A curl handle (for http_do with http_scheme "https") that trusts the test CA, checks the
 * server's name, and presents the chosen client certificate. */
void *https_handle_new(const tls_files *f, tls_client client);

/* Makes the handle offer TLS 1.1 and nothing else. */
void https_handle_tls11_only(void *handle);

/* A GnuTLS handshake with 127.0.0.1:port under `priority` (e.g. "NORMAL:-VERS-ALL:+VERS-TLS1.1"),
 * trusting the test CA, then "GET /v2/health/live" on it. Returns the HTTP status (> 0), 0 when
 * the handshake passed but no answer came, or the (negative) GnuTLS error of the handshake.
 * `subject`, when not NULL, gets the server certificate's DN after a handshake. */
int tls_probe(int port, const char *priority, const tls_files *f, tls_client client, char *subject,
              size_t subject_len);

#endif
