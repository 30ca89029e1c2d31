/* route.c - see route.h. */
#include "tests/support/route.h"

#include "tests/support/check.h"

test_reply test_route(void (*route)(const api_call *, api_reply *), const api_call *call)
{
    api_reply reply;
    test_reply r = {0};
    route(call, &reply);
    r.status = reply.status;
    if (reply.body && reply.body_len)
        r.json = json_loadb(reply.body, reply.body_len, 0, NULL);
    CHECKF(r.json != NULL || !reply.body_len, "reply is not JSON: %.*s",
           (int)(reply.body_len < 400 ? reply.body_len : 400), reply.body);
    api_reply_free(&reply);
    return r;
}
