/*
 * routes.c - the route table: which paths the daemon serves, with which methods, and where each
 * request is answered (on the MHD thread from its headers, or on an engine worker with its
 * body), plus the matcher that binds "{name}" path parameters.
 *
 * Adding a route: add one row to `routes` below - the pattern (literal segments and "{param}"
 * segments; the pattern is also the route's metrics and log label, so keep it fixed), the
 * allowed methods as sent in an Allow header ("GET, HEAD" or "POST"), the error style (the
 * Open Inference Protocol's {"error": "message"} under /v2), flags (SRV_ROUTE_ADMIN: also on
 * --admin-port; SRV_ROUTE_OPEN: no bearer token), and a handler. A cheap GET (health,
 * listings, static pages) gets an `answer` function (srv_answer_fn, runs on the MHD thread,
 * returns a srv_reply, must not block); a POST that computes gets a `work` function
 * (srv_work_fn, runs on an engine worker with the body in the api_call and fills the
 * api_reply, like api_attention), and when its body may set its own timeout or priority, a
 * `peek` reader (api_peek_native, api_peek_v2) so that the deadline holds while the request is
 * queued and it waits at its priority; a route
 * with statistics of its own adds srv_stats_hooks. Write the handler in your own file with its
 * own header, included below. Everything else is shared (http.c): 404 for unknown paths, 405
 * with Allow for other methods, 400 for a parameter outside [A-Za-z0-9_.-]{1,63} (read one
 * with srv__param(params, "name")), and for worker routes the header capture, draining,
 * --max-queue admission, the body cap and budget, deadlines and cancellation. The first
 * matching row wins, so put a literal path before a pattern that would also match it. The
 * table may hold up to SRV_ROUTE_OTHER - 1 rows (a compile-time check).
 */
#include "server/routes.h"

#include <string.h>

#include "server/daemon.h"
#include "server/page.h"
#include "server/v2.h"

/* ---- Handlers of the built-in routes ------------------------------------------------------ */

static srv_reply answer_live(srv_server *s, const srv_answer_args *args)
{
    (void)s;
    (void)args;
    return srv__reply_text(SRV_ANSWER_OK, "application/json", "{\"live\":true}");
}

static srv_reply answer_ready(srv_server *s, const srv_answer_args *args)
{
    /* The server listens only once every --model is loaded, so not draining means ready. */
    if (atomic_load(&s->draining))
        return srv__reply_refusal(args->style, SRV_REFUSE_NOT_READY, "draining");
    return srv__reply_text(SRV_ANSWER_OK, "application/json", "{\"ready\":true}");
}

static srv_reply answer_metrics(srv_server *s, const srv_answer_args *args)
{
    srv_gauges g;
    api_buf b;
    char *body;
    size_t len = 0;
    g.queued = atomic_load(&s->queued);
    g.running = atomic_load(&s->running);
    g.inflight = atomic_load(&s->active);
    g.suspended = atomic_load(&s->suspended);
    g.memory_in_use = (int64_t)api_budget_in_use(s->budget);
    g.buffer_cache = (int64_t)eng_buf_cached();
    g.memory_budget = (int64_t)s->max_memory_bytes;
    g.max_queue = s->max_queue;
    g.threads = s->threads;
    g.io_threads = s->io_threads;
    uint64_t upload_bytes, upload_rate;
    srv__uploads_state(s->uploads, eng_now_ns(), &upload_bytes, &upload_rate);
    g.upload_bytes = (int64_t)upload_bytes;
    g.upload_rate = (int64_t)upload_rate;
    g.ready = !atomic_load(&s->draining);

    api_buf_init(&b, (size_t)4 << 20);
    srv__metrics_render(&s->metrics, &g, &srv__route_names, &b);
    srv__metrics_render_models(&s->metrics, s->models, &b);
    api_sessions_stats st;
    api_sessions_stats_get(s->sessions, &st);
    srv__metrics_render_sessions(&s->metrics, &st, s->sessions != NULL, &b);
    body = api_buf_take(&b, &len);
    if (!body)
        return srv__reply_refusal(args->style, SRV_REFUSE_INTERNAL, "out of memory");
    return srv__reply_body(SRV_ANSWER_OK, "text/plain; version=0.0.4; charset=utf-8", body, len);
}

static srv_reply answer_models(srv_server *s, const srv_answer_args *args)
{
    api_reply reply;
    (void)args;
    api_models_list(s->models, &reply);
    return srv__reply_api(&reply);
}

static srv_reply answer_model(srv_server *s, const srv_answer_args *args)
{
    api_reply reply;
    api_models_get(s->models, srv__param(args->params, "name"), &reply);
    return srv__reply_api(&reply);
}

/* ---- Sessions (api_sessions_*: ops/session_*.c, proto/native_sessions.c) ---------------- */

static srv_reply answer_sessions(srv_server *s, const srv_answer_args *args)
{
    api_reply reply;
    api_sessions_list(s->sessions, args->query(args->query_cls, "limit"),
                      args->query(args->query_cls, "after"), &reply);
    return srv__reply_api(&reply);
}

static srv_reply answer_session(srv_server *s, const srv_answer_args *args)
{
    api_reply reply;
    const char *id = srv__param(args->params, "id");
    if (strcmp(args->method, "DELETE") == 0)
        api_sessions_delete(s->sessions, id, &reply);
    else
        api_sessions_get(s->sessions, id, &reply);
    return srv__reply_api(&reply);
}

static void work_sessions_create(const srv_params *params, const api_call *call, api_reply *reply)
{
    (void)params;
    api_call_encoded(api_sessions_create, API_ERRORS_NATIVE, call, reply);
}

static void work_session_attention(const srv_params *params, const api_call *call, api_reply *reply)
{
    (void)params;
    api_call_encoded(api_session_attention, API_ERRORS_NATIVE, call, reply);
}

static void work_session_truncate(const srv_params *params, const api_call *call, api_reply *reply)
{
    (void)params;
    api_call_encoded(api_session_truncate, API_ERRORS_NATIVE, call, reply);
}

static void work_session_fork(const srv_params *params, const api_call *call, api_reply *reply)
{
    (void)params;
    api_call_encoded(api_session_fork, API_ERRORS_NATIVE, call, reply);
}

static void work_attention(const srv_params *params, const api_call *call, api_reply *reply)
{
    (void)params;
    api_call_encoded(api_attention, API_ERRORS_NATIVE, call, reply);
}

static void work_mha(const srv_params *params, const api_call *call, api_reply *reply)
{
    (void)params;
    api_call_encoded(api_mha, API_ERRORS_NATIVE, call, reply);
}

/* ---- The table ---------------------------------------------------------------------------- */

#define NATIVE API_ERRORS_NATIVE
#define V2     API_ERRORS_V2
#define GET    "GET, HEAD"
#define PROBE  (SRV_ROUTE_ADMIN | SRV_ROUTE_OPEN) /* kubelet probes: --admin-port, no token */
#define ALONE  API_BATCH_NONE

static const srv_route_def routes[] = {
    {"/v1/attention", "POST", NATIVE, 0, NULL, work_attention, api_peek_native, NULL, ALONE},
    {"/v1/mha", "POST", NATIVE, SRV_ROUTE_BODY_SESSION, NULL, work_mha, api_peek_native, NULL,
     API_BATCH_MHA},
    {"/v1/models", GET, NATIVE, 0, answer_models, NULL, NULL, NULL, ALONE},
    {"/v1/sessions", "GET, HEAD, POST", NATIVE, 0, answer_sessions, work_sessions_create,
     api_peek_native, NULL, ALONE},
    {"/v1/sessions/{id}", "GET, HEAD, DELETE", NATIVE, 0, answer_session, NULL, NULL, NULL, ALONE},
    {"/v1/sessions/{id}/attention", "POST", NATIVE, SRV_ROUTE_SESSION, NULL, work_session_attention,
     api_peek_native, NULL, ALONE},
    {"/v1/sessions/{id}/truncate", "POST", NATIVE, SRV_ROUTE_SESSION, NULL, work_session_truncate,
     NULL, NULL, ALONE},
    {"/v1/sessions/{id}/fork", "POST", NATIVE, SRV_ROUTE_SESSION, NULL, work_session_fork, NULL,
     NULL, ALONE},
    {"/v1/models/{name}", GET, NATIVE, 0, answer_model, NULL, NULL, NULL, ALONE},
    {"/v2/health/live", GET, V2, PROBE, answer_live, NULL, NULL, NULL, ALONE},
    {"/v2/health/ready", GET, V2, PROBE, answer_ready, NULL, NULL, NULL, ALONE},
    {"/v2", GET, V2, 0, srv__answer_v2_server, NULL, NULL, NULL, ALONE},
    /* The path open_inference_rest.yaml writes for server metadata. */
    {"/v2/", GET, V2, 0, srv__answer_v2_server, NULL, NULL, NULL, ALONE},
    {"/v2/models/stats", GET, V2, 0, srv__answer_v2_stats, NULL, NULL, NULL, ALONE},
    {"/v2/models/{model}", GET, V2, 0, srv__answer_v2_model, NULL, NULL, NULL, ALONE},
    {"/v2/models/{model}/ready", GET, V2, 0, srv__answer_v2_ready, NULL, NULL, NULL, ALONE},
    {"/v2/models/{model}/config", GET, V2, 0, srv__answer_v2_config, NULL, NULL, NULL, ALONE},
    {"/v2/models/{model}/stats", GET, V2, 0, srv__answer_v2_stats, NULL, NULL, NULL, ALONE},
    {"/v2/models/{model}/infer", "POST", V2, SRV_ROUTE_SEQUENCE, NULL, srv__work_v2_infer,
     api_peek_v2, &srv__v2_infer_stats, API_BATCH_V2_INFER},
    {"/v2/models/{model}/versions/{version}", GET, V2, 0, srv__answer_v2_model, NULL, NULL, NULL,
     ALONE},
    {"/v2/models/{model}/versions/{version}/ready", GET, V2, 0, srv__answer_v2_ready, NULL, NULL,
     NULL, ALONE},
    {"/v2/models/{model}/versions/{version}/config", GET, V2, 0, srv__answer_v2_config, NULL, NULL,
     NULL, ALONE},
    {"/v2/models/{model}/versions/{version}/stats", GET, V2, 0, srv__answer_v2_stats, NULL, NULL,
     NULL, ALONE},
    {"/v2/models/{model}/versions/{version}/infer", "POST", V2, SRV_ROUTE_SEQUENCE, NULL,
     srv__work_v2_infer, api_peek_v2, &srv__v2_infer_stats, API_BATCH_V2_INFER},
    /* Scrapes reach --admin-port without a token; on --port they need one. */
    {"/metrics", GET, NATIVE, SRV_ROUTE_ADMIN, answer_metrics, NULL, NULL, NULL, ALONE},
    /* The page's shell holds no data: its API calls carry the token the user types in. */
    {"/", GET, NATIVE, SRV_ROUTE_OPEN, srv__answer_page, NULL, NULL, NULL, ALONE},
};

#undef NATIVE
#undef V2
#undef GET
#undef PROBE
#undef ALONE

#define N_ROUTES (sizeof routes / sizeof routes[0])
_Static_assert(N_ROUTES < SRV_ROUTE_OTHER, "raise SRV_ROUTE_COUNT in metrics.h");

srv_route srv__route_find(const char *path, srv_params *params)
{
    for (size_t i = 0; i < N_ROUTES; i++) {
        if (srv__route_match(routes[i].pattern, path, params))
            return (srv_route)i;
    }
    memset(params, 0, sizeof *params);
    return SRV_ROUTE_OTHER;
}

const srv_route_def *srv__route_def(srv_route route)
{
    return route >= 0 && (size_t)route < N_ROUTES ? &routes[route] : NULL;
}

api_error_style srv__route_style(srv_route route, const char *path)
{
    const srv_route_def *rd = srv__route_def(route);
    if (rd)
        return rd->style;
    return strncmp(path, "/v2/", 4) == 0 || strcmp(path, "/v2") == 0 ? API_ERRORS_V2
                                                                     : API_ERRORS_NATIVE;
}

static const char *route_label(srv_route route)
{
    const srv_route_def *rd = srv__route_def(route);
    return rd ? rd->pattern : "other";
}

static bool route_always_shown(srv_route route)
{
    const srv_route_def *rd = srv__route_def(route);
    return rd && rd->work;
}

const srv_route_names srv__route_names = {.label = route_label, .always_shown = route_always_shown};
