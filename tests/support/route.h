/*
 * route.h - one api/ route called in process (no daemon) and its reply read as JSON, for the
 * api suites that drive the routes directly.
 *
 *     api_sessions *reg = test_sessions_new((size_t)32 << 20);
 *     api_call call = test_json_call(pool, models, reg, "{\"model\":\"llama\"}");
 *     test_reply r = test_route(api_sessions_create, &call);
 *     CHECK(r.status == 201);
 *     CHECK(!test_error_field(&r));
 *     json_decref(r.json);
 *     api_sessions_free(reg);
 */
#ifndef ATTND_TESTS_ROUTE_H
#define ATTND_TESTS_ROUTE_H

#include <jansson.h>
#include <stddef.h>

#include "api/api.h"

typedef struct {
    int status;
    json_t *json; /* the reply's body; NULL when it had none */
} test_reply;

/* Runs `route` on `call`; a body that is not JSON is a failed check (its text printed). The
 * caller owns r.json. */
test_reply test_route(void (*route)(const api_call *, api_reply *), const api_call *call);

/* `reply` read as test_route reads it, and freed. For the routes whose arguments are not an
 * api_call (api_models_get, api_sessions_get). */
test_reply test_reply_take(api_reply *reply);

/* A call whose body is the JSON text `body` (borrowed), on the pool, models and sessions given
 * (any may be NULL). The path's model and session are NULL: the caller sets them where the
 * route reads them. */
api_call test_json_call(eng_pool *pool, api_models *models, api_sessions *sessions,
                        const char *body);

/* The "field" of the reply's error object; NULL when it has none. */
const char *test_error_field(const test_reply *r);

/* A session registry of `capacity_bytes` in blocks of 16 tokens; NULL, a failed check with the
 * reason, when it cannot be made. */
api_sessions *test_sessions_new(size_t capacity_bytes);

#endif
