/*
 * routes.h - the route table (routes.c): which paths the daemon serves, each row's methods,
 * error style, handlers and statistics hooks (route.h).
 */
#ifndef ATTND_SERVER_ROUTES_H
#define ATTND_SERVER_ROUTES_H

#include "server/route.h"

/* The route matching `path` (SRV_ROUTE_OTHER for none), with its parameters in *params. A path
 * whose shape matches a row but with an invalid parameter value still returns that row, with
 * params->bad naming the parameter. */
srv_route srv__route_find(const char *path, srv_params *params);
/* The row of `route`, or NULL for SRV_ROUTE_OTHER. */
const srv_route_def *srv__route_def(srv_route route);
/* The error style of a request to `path` routed to `route`: the row's, or for a path no row
 * serves, the Open Inference Protocol's under /v2 and the native one elsewhere. */
api_error_style srv__route_style(srv_route route, const char *path);
/* The labels metrics.c renders the per-route series with. */
extern const srv_route_names srv__route_names;

#endif
