/* route.c - see route.h. */
#include "tests/support/route.h"

#include <string.h>

#include "tests/support/check.h"

test_reply test_reply_take(api_reply *reply)
{
    test_reply r = {0};
    r.status = reply->status;
    if (reply->body && reply->body_len)
        r.json = json_loadb(reply->body, reply->body_len, 0, NULL);
    CHECKF(r.json != NULL || !reply->body_len, "reply is not JSON: %.*s",
           (int)(reply->body_len < 400 ? reply->body_len : 400), reply->body);
    api_reply_free(reply);
    return r;
}

test_reply test_route(void (*route)(const api_call *, api_reply *), const api_call *call)
{
    api_reply reply;
    route(call, &reply);
    return test_reply_take(&reply);
}

api_call test_json_call(eng_pool *pool, api_models *models, api_sessions *sessions,
                        const char *body)
{
    return (api_call){.body = body,
                      .body_len = strlen(body),
                      .content_type = "application/json",
                      .pool = pool,
                      .models = models,
                      .sessions = sessions};
}

const char *test_error_field(const test_reply *r)
{
    return json_string_value(json_object_get(json_object_get(r->json, "error"), "field"));
}

api_sessions *test_sessions_new(size_t capacity_bytes)
{
    char msg[256];
    api_sessions_config cfg = {.capacity_bytes = capacity_bytes, .block_tokens = 16};
    api_sessions *reg = api_sessions_new(&cfg, msg, sizeof msg);
    CHECKF(reg != NULL, "%s", msg);
    return reg;
}
