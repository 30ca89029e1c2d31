/*
 * route.h - what a row of the route table is (route.c matches paths against rows; routes.c
 * holds the table): the pattern and its "{name}" parameters, the allowed methods, the protocol
 * style of its errors, where its requests are answered, and its statistics hooks.
 *
 * Handlers see neither the request nor libmicrohttpd: they get the path parameters (and, for
 * the page, one header) and return a reply value (reply.h), which http.c sends.
 */
#ifndef ATTND_SERVER_ROUTE_H
#define ATTND_SERVER_ROUTE_H

#include <stdatomic.h>

#include "api/api.h"
#include "server/metrics.h"
#include "server/reply.h"

typedef struct srv_server srv_server;

/* Path parameters bound by the matcher: each "{name}" segment of the row's pattern. A value is
 * 1 to SRV_PARAM_MAX bytes of [A-Za-z0-9_.-] (a model name's alphabet). */
#define SRV_PARAMS_MAX     4
#define SRV_PARAM_MAX      63
#define SRV_PARAM_NAME_MAX 15

typedef struct {
    int count;
    struct {
        char name[SRV_PARAM_NAME_MAX + 1];
        char value[SRV_PARAM_MAX + 1];
    } p[SRV_PARAMS_MAX];
    char bad[SRV_PARAM_NAME_MAX + 1]; /* non-empty: the path had this segment, but its value
                                         is not a valid name (answered 400) */
} srv_params;

/* What a handler on the MHD thread may read of its request. */
typedef struct {
    const srv_params *params;
    api_error_style style;     /* the row's: for the handler's own refusals */
    const char *if_none_match; /* the If-None-Match header, or NULL */
    const char *method;        /* "GET", "HEAD", or another method of a row without `work` */
    /* The value of query argument `name` ("?limit=10"), or NULL: */
    const char *(*query)(const void *cls, const char *name);
    const void *query_cls;
} srv_answer_args;

/* Answers a request on the MHD thread from its headers alone (cheap work only: no engine call,
 * nothing that blocks). `s` is read-only here but for its atomics. */
typedef srv_reply (*srv_answer_fn)(srv_server *s, const srv_answer_args *args);
/* Answers a request on an engine worker, with its whole body in `call`: fills `reply` (always,
 * like api_attention). */
typedef void (*srv_work_fn)(const srv_params *params, const api_call *call, api_reply *reply);
/* (call->sessions and, on a row with {id}, call->session are set by http.c.) */

/* The per-request state of a route's statistics hooks: the model's stats slot (-1: not
 * counted) and whether it is counted as pending (admitted, not yet running). */
typedef struct {
    int slot;
    atomic_bool pending;
} srv_route_stats;

/* Statistics a route keeps beyond the per-route series every request has (metrics.h), called
 * by http.c at each step of a worker request: `begin` on the MHD thread before the body is
 * read (fills *st), `admitted` when it is queued, `started` when a worker takes it, and
 * `completed` once it is answered, whether or not it ran (any thread). */
typedef struct {
    void (*begin)(const api_models *models, const srv_params *params, srv_route_stats *st);
    void (*admitted)(srv_metrics *m, srv_route_stats *st);
    void (*started)(srv_metrics *m, srv_route_stats *st);
    void (*completed)(srv_metrics *m, srv_route_stats *st, int status, api_reason reason,
                      int64_t handler_ns, int64_t queue_ns, const api_reply *reply);
} srv_stats_hooks;

/* Where a route may be reached without what guards the others. */
enum {
    SRV_ROUTE_ADMIN = 1u << 0,        /* also served on --admin-port (probes, scrapes) */
    SRV_ROUTE_OPEN = 1u << 1,         /* needs no bearer token (probes, the page's shell) */
    SRV_ROUTE_SESSION = 1u << 2,      /* a request on the session {id}: takes its turn in the
                                         session's order (api_session_ticket_take at admission) */
    SRV_ROUTE_SEQUENCE = 1u << 3,     /* a KServe v2 inference: one that names a sequence (Triton's
                                         sequence_id) takes its turn in that sequence's order
                                         (api_sequence_ticket_take at admission) */
    SRV_ROUTE_BODY_SESSION = 1u << 4, /* a request on the session its body names, which its peek
                                         reads at admission (POST /v1/mha "session"): takes its
                                         turn in that session's order */
};

/* One row of the route table. `pattern` is literal segments and "{name}" segments (one path
 * segment each, bound into srv_params); it is also the metrics and log label. A GET or HEAD
 * request runs `answer` on the MHD thread; any other allowed method runs `work` on an engine
 * worker when the row has one (else `answer`). A worker route whose body may set its own
 * timeout (and priority) has `peek`, which reads them on the MHD thread before the request is
 * queued (api_peek_native, api_peek_v2), so that the deadline holds while the request waits for
 * a worker and the request waits at its priority. A row with `batch` lets the requests that
 * wait for the same layer run as one batch (job.h). */
typedef struct {
    const char *pattern;
    const char *allow;     /* allowed methods, as sent in the Allow header of a 405: "GET, HEAD" */
    api_error_style style; /* the form of the errors server/ answers on it */
    unsigned flags;        /* SRV_ROUTE_* */
    srv_answer_fn answer;
    srv_work_fn work;
    void (*peek)(const api_call *call, api_peek *out); /* NULL: the body sets no timeout
                                                          and no priority */
    const srv_stats_hooks *stats;                      /* NULL: the per-route series only */
    api_batch_route batch; /* its requests may run in batches (api_batch_key): the api route
                              its work runs; API_BATCH_NONE: alone */
} srv_route_def;

/* Matches `path` against `pattern` segment by segment. Returns false when the shape differs;
 * on a match fills `params` (params->bad names the first invalid value, if any). */
bool srv__route_match(const char *pattern, const char *path, srv_params *params);
/* Whether `method` is one of the row's allowed methods. */
bool srv__route_allows(const srv_route_def *rd, const char *method);
/* The value of path parameter `name`, or NULL. */
const char *srv__param(const srv_params *params, const char *name);

#endif
