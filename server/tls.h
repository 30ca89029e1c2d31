/*
 * tls.h - TLS through GnuTLS and libmicrohttpd (tls.c): the certificate and key, their reload
 * on SIGHUP, client certificates, and the client side of attnd --healthcheck.
 */
#ifndef ATTND_SERVER_TLS_H
#define ATTND_SERVER_TLS_H

#include <gnutls/gnutls.h>
#include <microhttpd.h>

#include "server/server.h"

typedef struct srv_tls srv_tls;

/* Loads --tls-cert/--tls-key (and --tls-key-password-file, --tls-client-ca) and checks
 * --tls-priorities: SRV_OK with *out NULL when TLS is off, SRV_EINVAL with `err` naming the
 * flag and the file when something cannot be loaded. `cfg` is one srv_config_parse accepted
 * (which pairs the flags). Main thread. */
srv_status srv__tls_new(const srv_config *cfg, srv_tls **out, char *err, size_t errlen);
/* Reads the certificate and key again; new handshakes get them, open connections keep theirs.
 * On failure the previous ones stay in use. Main thread. */
srv_status srv__tls_reload(srv_tls *t, char *err, size_t errlen);
/* Reads --tls-client-ca again (SRV_OK at once without one); new handshakes verify client
 * certificates against the new CAs, open connections keep going. On failure, with `err` naming
 * the file, the previous CAs stay in force. Main thread. */
srv_status srv__tls_reload_client_ca(srv_tls *t, char *err, size_t errlen);
/* "N CA certificates of FILE" for the reload line; false (out untouched) without
 * --tls-client-ca. */
bool srv__tls_describe_client_ca(srv_tls *t, char *out, size_t outlen);
void srv__tls_free(srv_tls *t);
/* The libmicrohttpd options that serve `t` (for MHD_OPTION_ARRAY; an empty list when `t` is
 * NULL), adding MHD_USE_TLS to *flags; NULL with `err` when another server already serves
 * TLS in this process. */
const struct MHD_OptionItem *srv__tls_options(srv_tls *t, unsigned *flags, char *err,
                                              size_t errlen);
/* A server session on the non-blocking socket `fd` of a --grpc-port connection: the certificate
 * (the newest chain at each handshake), priorities and --tls-client-ca of HTTPS, and ALPN "h2"
 * required. NULL when it cannot be made. The gRPC thread; needs srv__tls_options to have run
 * (the HTTPS listener starts first). */
gnutls_session_t srv__tls_grpc_session(srv_tls *t, int fd);
/* "CN=...,O=... (chain of N, expires 2027-01-01T00:00:00Z)" for the start and reload lines. */
void srv__tls_describe(srv_tls *t, char *out, size_t outlen);

/* attnd --healthcheck over TLS: a handshake on the connected socket `fd` (nothing verified;
 * with --tls-client-ca the daemon's own certificate is presented), `req` sent, and up to
 * `out_len` bytes of the answer read into `out` before `deadline_ms` (CLOCK_MONOTONIC).
 * Returns the bytes read; 0 when the handshake or the exchange failed. */
size_t srv__tls_exchange(const srv_config *cfg, int fd, const char *req, size_t req_len, char *out,
                         size_t out_len, int64_t deadline_ms);

#endif
