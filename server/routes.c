/*
 * routes.c - the route table: which paths the daemon serves, with which methods, and where each
 * request is answered (on the MHD thread from its headers, or on an engine worker with its
 * body), plus the matcher that binds "{name}" path parameters.
 *
 * Adding a route: add one row to `routes` below - the pattern (literal segments and "{param}"
 * segments; the pattern is also the route's metrics and log label, so keep it fixed), the
 * allowed methods as sent in an Allow header ("GET, HEAD" or "POST"), and a handler. A cheap
 * GET (health, listings, static pages) gets an `answer` function (srv_answer_fn, runs on the
 * MHD thread, must queue a response with srv__respond*, must not block); a POST that computes
 * gets a `work` function (srv_work_fn, runs on an engine worker with the body in the api_call
 * and fills the api_reply, like api_attention), and when its body may set its own timeout, a
 * `timeout` reader (api_timeout_peek) so that the deadline holds while the request is queued.
 * Write the handler in your own file and declare it in internal.h next to the ones below.
 * Everything else is shared: 404 for unknown paths,
 * 405 with Allow for other methods, 400 for a parameter outside [A-Za-z0-9_.-]{1,63} (read one
 * with srv__req_param(req, "name")), and for worker routes the Content-Type capture, draining,
 * --max-queue admission, the body cap and budget, deadlines and cancellation. Errors on paths
 * under /v2/ take the Open Inference Protocol's {"error": "message"} form. The first matching
 * row wins, so put a literal path before a pattern that would also match it. The table may hold
 * up to SRV_ROUTE_OTHER - 1 rows (a compile-time check).
 */
#include "server/internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- Handlers of the built-in routes ------------------------------------------------------ */

static enum MHD_Result answer_live(srv_server *s, srv_req *req)
{
    (void)s;
    return srv__respond_text(req, 200, "application/json", "{\"live\":true}", NULL);
}

static enum MHD_Result answer_ready(srv_server *s, srv_req *req)
{
    /* The server listens only once every --model is loaded, so not draining means ready. */
    if (atomic_load(&s->draining))
        return srv__respond_error(req, 503, API_REASON_NONE, NULL, "draining");
    return srv__respond_text(req, 200, "application/json", "{\"ready\":true}", NULL);
}

static enum MHD_Result answer_metrics(srv_server *s, srv_req *req)
{
    srv_gauges g;
    srv_buf b;
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
    g.ready = !atomic_load(&s->draining);

    srv__buf_init(&b, (size_t)4 << 20);
    srv__metrics_render(&s->metrics, &g, &b);
    srv__metrics_render_models(&s->metrics, s->models, &b);
    body = srv__buf_take(&b, &len);
    if (!body)
        return srv__respond_error(req, 503, API_REASON_INTERNAL, NULL, "out of memory");
    return srv__respond(req, 200, "text/plain; version=0.0.4; charset=utf-8", body, len, NULL);
}

static enum MHD_Result answer_models(srv_server *s, srv_req *req)
{
    api_reply reply;
    api_models_list(s->models, &reply);
    return srv__respond_api(req, &reply);
}

static enum MHD_Result answer_model(srv_server *s, srv_req *req)
{
    api_reply reply;
    api_models_get(s->models, srv__req_param(req, "name"), &reply);
    return srv__respond_api(req, &reply);
}

static void work_attention(const srv_req *req, const api_call *call, api_reply *reply)
{
    (void)req;
    api_call_encoded(api_attention, API_ERRORS_NATIVE, call, reply);
}

static void work_mha(const srv_req *req, const api_call *call, api_reply *reply)
{
    (void)req;
    api_call_encoded(api_mha, API_ERRORS_NATIVE, call, reply);
}

/* ---- The table ---------------------------------------------------------------------------- */

static const srv_route_def routes[] = {
    {"/v1/attention", "POST", NULL, work_attention, api_timeout_peek},
    {"/v1/mha", "POST", NULL, work_mha, api_timeout_peek},
    {"/v1/models", "GET, HEAD", answer_models, NULL, NULL},
    {"/v1/models/{name}", "GET, HEAD", answer_model, NULL, NULL},
    {"/v2/health/live", "GET, HEAD", answer_live, NULL, NULL},
    {"/v2/health/ready", "GET, HEAD", answer_ready, NULL, NULL},
    {"/v2", "GET, HEAD", srv__answer_v2_server, NULL, NULL},
    /* The path open_inference_rest.yaml writes for server metadata. */
    {"/v2/", "GET, HEAD", srv__answer_v2_server, NULL, NULL},
    {"/v2/models/stats", "GET, HEAD", srv__answer_v2_stats, NULL, NULL},
    {"/v2/models/{model}", "GET, HEAD", srv__answer_v2_model, NULL, NULL},
    {"/v2/models/{model}/ready", "GET, HEAD", srv__answer_v2_ready, NULL, NULL},
    {"/v2/models/{model}/config", "GET, HEAD", srv__answer_v2_config, NULL, NULL},
    {"/v2/models/{model}/stats", "GET, HEAD", srv__answer_v2_stats, NULL, NULL},
    {"/v2/models/{model}/infer", "POST", NULL, srv__work_v2_infer, api_v2_timeout_peek},
    {"/v2/models/{model}/versions/{version}", "GET, HEAD", srv__answer_v2_model, NULL, NULL},
    {"/v2/models/{model}/versions/{version}/ready", "GET, HEAD", srv__answer_v2_ready, NULL, NULL},
    {"/v2/models/{model}/versions/{version}/config", "GET, HEAD", srv__answer_v2_config, NULL,
     NULL},
    {"/v2/models/{model}/versions/{version}/stats", "GET, HEAD", srv__answer_v2_stats, NULL, NULL},
    {"/v2/models/{model}/versions/{version}/infer", "POST", NULL, srv__work_v2_infer,
     api_v2_timeout_peek},
    {"/metrics", "GET, HEAD", answer_metrics, NULL, NULL},
    {"/", "GET, HEAD", srv__answer_page, NULL, NULL},
};

#define N_ROUTES (sizeof routes / sizeof routes[0])
_Static_assert(N_ROUTES < SRV_ROUTE_OTHER, "raise SRV_ROUTE_COUNT in internal.h");

/* ---- Matching ----------------------------------------------------------------------------- */

static bool param_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '.' || c == '-';
}

/* Matches `path` against `pattern` segment by segment. Returns false when the shape differs;
 * on a match fills `params` (params->bad names the first invalid value, if any). */
static bool match(const char *pattern, const char *path, srv_params *params)
{
    const char *p = pattern, *u = path;
    memset(params, 0, sizeof *params);
    while (*p && *u) {
        if (*p == '{') {
            const char *close = strchr(p, '}');
            size_t name_len, val_len = strcspn(u, "/");
            bool ok = val_len > 0 && val_len <= SRV_PARAM_MAX;
            if (!close || params->count >= SRV_PARAMS_MAX)
                return false; /* defensive: a malformed pattern matches nothing */
            name_len = (size_t)(close - p - 1);
            if (name_len > SRV_PARAM_NAME_MAX)
                name_len = SRV_PARAM_NAME_MAX;
            if (val_len == 0)
                return false; /* an empty segment is a different path */
            for (size_t i = 0; ok && i < val_len; i++)
                ok = param_char(u[i]);
            if (ok) {
                memcpy(params->p[params->count].name, p + 1, name_len);
                memcpy(params->p[params->count].value, u, val_len);
                params->count++;
            } else if (!params->bad[0]) {
                memcpy(params->bad, p + 1, name_len);
            }
            p = close + 1;
            u += val_len;
            continue;
        }
        if (*p != *u)
            return false;
        p++;
        u++;
    }
    return *p == '\0' && *u == '\0';
}

srv_route srv__route_find(const char *path, srv_params *params)
{
    for (size_t i = 0; i < N_ROUTES; i++) {
        if (match(routes[i].pattern, path, params))
            return (srv_route)i;
    }
    memset(params, 0, sizeof *params);
    return SRV_ROUTE_OTHER;
}

const srv_route_def *srv__route_def(srv_route route)
{
    return route >= 0 && (size_t)route < N_ROUTES ? &routes[route] : NULL;
}

const char *srv__route_label(srv_route route)
{
    const srv_route_def *rd = srv__route_def(route);
    return rd ? rd->pattern : "other";
}

bool srv__route_allows(const srv_route_def *rd, const char *method)
{
    size_t n = strlen(method);
    const char *a = rd->allow;
    while (n > 0 && *a) {
        size_t len = strcspn(a, ", ");
        if (len == n && strncmp(a, method, n) == 0)
            return true;
        a += len;
        a += strspn(a, ", ");
    }
    return false;
}

const char *srv__req_param(const srv_req *req, const char *name)
{
    for (int i = 0; i < req->params.count; i++) {
        if (strcmp(req->params.p[i].name, name) == 0)
            return req->params.p[i].value;
    }
    return NULL;
}
