/*
 * route.h - one api/ route called in process (no daemon) and its reply read as JSON, for the
 * api suites that drive the routes directly.
 *
 *     api_call call = {.body = body, .body_len = strlen(body),
 *                      .content_type = "application/json", .pool = pool};
 *     test_reply r = test_route(api_attention, &call);
 *     CHECK(r.status == 200);
 *     json_decref(r.json);
 */
#ifndef ATTND_TESTS_ROUTE_H
#define ATTND_TESTS_ROUTE_H

#include <jansson.h>

#include "api/api.h"

typedef struct {
    int status;
    json_t *json; /* the reply's body; NULL when it had none */
} test_reply;

/* Runs `route` on `call`; a body that is not JSON is a failed check (its text printed). The
 * caller owns r.json. */
test_reply test_route(void (*route)(const api_call *, api_reply *), const api_call *call);

#endif
