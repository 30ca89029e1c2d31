/*
 * security.h - TLS and bearer tokens in the server's life cycle (security.c): loaded at the
 * start, reloaded on SIGHUP (srv_server_reload, server.h).
 */
#ifndef ATTND_SERVER_SECURITY_H
#define ATTND_SERVER_SECURITY_H

#include "server/auth.h"
#include "server/tls.h"

/* Loads the TLS certificate (*tls) and the tokens (*auth), logging what they serve; each NULL
 * when not configured. Main thread. */
srv_status srv__security_start(const srv_config *cfg, srv_tls **tls, srv_auth **auth, char *err,
                               size_t errlen);

#endif
