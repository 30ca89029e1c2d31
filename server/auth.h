/*
 * auth.h - bearer tokens (auth.c, --auth-token-file): loading, reload on SIGHUP, and the check
 * of an Authorization header in constant time.
 */
#ifndef ATTND_SERVER_AUTH_H
#define ATTND_SERVER_AUTH_H

#include "server/server.h"

typedef struct srv_auth srv_auth;

/* Loads --auth-token-file: SRV_OK with *out NULL when it is not set. Main thread. */
srv_status srv__auth_new(const srv_config *cfg, srv_auth **out, char *err, size_t errlen);
/* Reads the file again (*count: its tokens); on failure the previous tokens stay. */
srv_status srv__auth_reload(srv_auth *a, size_t *count, char *err, size_t errlen);
void srv__auth_free(srv_auth *a);
/* Whether a request with this Authorization header value (NULL: none) may go on: true without
 * tokens, else with "Bearer" and a configured token (compared in constant time). Which routes
 * need no token is the route table's business (routes.h). MHD thread. */
bool srv__auth_allows(srv_auth *a, const char *authorization);
/* The message of the 401 for a request that sent an Authorization header (`sent`) or none;
 * it never holds the token. */
const char *srv__auth_refusal(bool sent);
/* The header of a 401: name, value, NULL (for srv_reply.headers). */
extern const char *const srv__auth_challenge[];

#endif
