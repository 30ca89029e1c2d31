/*
 * security.c - what TLS (tls.c) and bearer tokens (auth.c) add to the server's life cycle: the
 * check before the start, the loading at the start, and the reload on SIGHUP.
 */
#include "server/security.h"

#include <stdio.h>

#include "server/daemon.h"

srv_status srv_security_check(const srv_config *cfg, char *err, size_t errlen)
{
    srv_tls *tls = NULL;
    srv_auth *auth = NULL;
    srv_status st = srv__tls_new(cfg, &tls, err, errlen);
    if (st == SRV_OK)
        st = srv__auth_new(cfg, &auth, err, errlen);
    if (st == SRV_ENOMEM)
        snprintf(err, errlen, "out of memory while loading --tls-* and --auth-token-file");
    srv__tls_free(tls);
    srv__auth_free(auth);
    return st;
}

srv_status srv__security_start(const srv_config *cfg, srv_tls **tls, srv_auth **auth, char *err,
                               size_t errlen)
{
    char what[512];
    srv_status st = srv__tls_new(cfg, tls, err, errlen);
    if (st == SRV_OK)
        st = srv__auth_new(cfg, auth, err, errlen);
    if (st == SRV_ENOMEM)
        snprintf(err, errlen, "out of memory while loading --tls-* and --auth-token-file");
    if (st != SRV_OK)
        return st;
    if (*tls) {
        srv__tls_describe(*tls, what, sizeof what);
        srv_log(SRV_LOG_INFO, "TLS with the certificate %s", what);
    }
    if (*auth)
        srv_log(SRV_LOG_INFO, "bearer tokens from %s required (--auth-token-file)",
                cfg->auth_token_file);
    return SRV_OK;
}

void srv_server_reload(srv_server *s)
{
    char err[512], what[512];
    size_t tokens = 0;
    if (!s->tls && !s->auth) {
        srv_log(SRV_LOG_INFO, "SIGHUP: nothing to reload (no --tls-cert, no --auth-token-file)");
        return;
    }
    if (s->auth && srv__auth_reload(s->auth, &tokens, err, sizeof err) != SRV_OK)
        srv_log(SRV_LOG_ERROR, "SIGHUP: the previous tokens stay in force: %s", err);
    else if (s->auth)
        srv_log(SRV_LOG_INFO, "SIGHUP: %zu bearer tokens loaded", tokens);
    if (s->tls && srv__tls_reload(s->tls, err, sizeof err) != SRV_OK) {
        srv_log(SRV_LOG_ERROR, "SIGHUP: the previous certificate stays in use: %s", err);
    } else if (s->tls) {
        srv__tls_describe(s->tls, what, sizeof what);
        srv_log(SRV_LOG_INFO, "SIGHUP: new handshakes get the certificate %s", what);
    }
    if (s->tls && srv__tls_reload_client_ca(s->tls, err, sizeof err) != SRV_OK) {
        srv_log(SRV_LOG_ERROR, "SIGHUP: the previous client CAs stay in force: %s", err);
    } else if (s->tls && srv__tls_describe_client_ca(s->tls, what, sizeof what)) {
        srv_log(SRV_LOG_INFO, "SIGHUP: new handshakes verify client certificates against the %s",
                what);
    }
}
