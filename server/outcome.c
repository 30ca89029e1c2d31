/*
 * outcome.c - the table of outcome.h: the api/ status, rejection reason and Retry-After of each
 * thing server/ decides about a request by itself.
 */
#include "server/outcome.h"

static const srv_outcome_info outcomes[] = {
#define SRV_OUTCOME_ROW(name, status, reason, retry) [name] = {status, reason, retry},
    SRV_OUTCOME_LIST(SRV_OUTCOME_ROW)
#undef SRV_OUTCOME_ROW
};

const srv_outcome_info *srv__outcome(srv_outcome o)
{
    if ((unsigned)o >= sizeof outcomes / sizeof outcomes[0])
        o = SRV_REFUSE_NO_STATUS; /* defensive: a value outside the list */
    return &outcomes[o];
}

int srv__outcome_http(srv_outcome o, api_error_style style)
{
    return api_status_http(style, srv__outcome(o)->status);
}
