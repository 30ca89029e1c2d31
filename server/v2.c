/*
 * v2.c - the daemon's side of the Open Inference Protocol (KServe v2) routes.
 *
 * The replies themselves come from api/ (api_v2_*); this file binds the path parameters
 * {model} and {version} into the call, answers the cheap GETs on the MHD thread, runs inference
 * on a worker through api_call_encoded (gzip / deflate bodies in and out), and keeps Triton's
 * per-model statistics through the route table's hooks (metrics.c renders them as
 * nv_inference_* families and as the statistics extension's JSON). The HTTP headers a worker
 * route passes to api/ are http.c's: they are captured for every worker route alike.
 */
#include "server/v2.h"

#include <stdlib.h>
#include <string.h>

#include "server/daemon.h"

static api_call path_call(const srv_server *s, const srv_params *params)
{
    api_call call;
    memset(&call, 0, sizeof call);
    call.models = s->models;
    call.limits = &s->limits; /* the priority levels of the model configuration */
    call.sessions = s->sessions;
    call.model = srv__param(params, "model");
    call.version = srv__param(params, "version");
    return call;
}

srv_reply srv__answer_v2_server(srv_server *s, const srv_answer_args *args)
{
    api_reply reply;
    (void)s;
    (void)args;
    api_v2_server_metadata(&reply);
    return srv__reply_api(&reply);
}

srv_reply srv__answer_v2_model(srv_server *s, const srv_answer_args *args)
{
    api_call call = path_call(s, args->params);
    api_reply reply;
    api_v2_model_metadata(&call, &reply);
    return srv__reply_api(&reply);
}

srv_reply srv__answer_v2_config(srv_server *s, const srv_answer_args *args)
{
    api_call call = path_call(s, args->params);
    api_reply reply;
    api_v2_model_config(&call, &reply);
    return srv__reply_api(&reply);
}

srv_reply srv__answer_v2_ready(srv_server *s, const srv_answer_args *args)
{
    api_call call = path_call(s, args->params);
    api_reply reply;
    if (atomic_load(&s->draining) && api_v2_model_known(s->models, call.model, call.version))
        return srv__reply_refusal(args->style, SRV_REFUSE_NOT_READY, "draining");
    api_v2_model_ready(&call, &reply);
    return srv__reply_api(&reply);
}

srv_reply srv__answer_v2_stats(srv_server *s, const srv_answer_args *args)
{
    api_call call = path_call(s, args->params);
    api_buf b;
    char *body;
    size_t len = 0;
    int slot = -1;
    if (call.model) {
        if (!api_v2_model_known(s->models, call.model, call.version)) {
            api_reply reply;
            api_v2_model_ready(&call, &reply); /* the 404 that names what is unknown */
            return srv__reply_api(&reply);
        }
        slot = srv__metrics_model_slot(s->models, call.model);
    }
    size_t n;
    api_model_stats *st = srv__metrics_model_stats(&s->metrics, s->models, slot, &n);
    api_buf_init(&b, (size_t)1 << 20);
    if (st)
        api_v2_statistics_json(st, n, &b);
    free(st);
    body = st ? api_buf_take(&b, &len) : NULL;
    api_buf_free(&b);
    if (!body)
        return srv__reply_refusal(args->style, SRV_REFUSE_INTERNAL, "out of memory");
    return srv__reply_body(SRV_ANSWER_OK, "application/json", body, len);
}

void srv__work_v2_infer(const srv_params *params, const api_call *call, api_reply *reply)
{
    api_call c = *call;
    c.model = srv__param(params, "model");
    c.version = srv__param(params, "version");
    api_call_encoded(api_v2_infer, API_ERRORS_V2, &c, reply);
}

/* ---- Model statistics ------------------------------------------------------------------------ */

/* A request for a model that exists is counted in that model's slot; others are not. */
static void infer_begin(const api_models *models, const srv_params *params, srv_route_stats *st)
{
    const char *model = srv__param(params, "model");
    st->slot = -1;
    if (api_v2_model_known(models, model, srv__param(params, "version")))
        st->slot = srv__metrics_model_slot(models, model);
}

static void infer_admitted(srv_metrics *m, srv_route_stats *st)
{
    if (st->slot < 0)
        return;
    atomic_store(&st->pending, true);
    srv__metrics_model_pending(m, st->slot, 1);
}

static void infer_started(srv_metrics *m, srv_route_stats *st)
{
    if (st->slot >= 0 && atomic_exchange(&st->pending, false))
        srv__metrics_model_pending(m, st->slot, -1);
}

static void infer_completed(srv_metrics *m, srv_route_stats *st, int status, api_reason reason,
                            int64_t handler_ns, int64_t queue_ns, const api_reply *reply)
{
    infer_started(m, st); /* answered without running (the watcher, a failed submit) */
    srv__metrics_infer(m, st->slot, status, reason, handler_ns, queue_ns, reply);
}

const srv_stats_hooks srv__v2_infer_stats = {
    .begin = infer_begin,
    .admitted = infer_admitted,
    .started = infer_started,
    .completed = infer_completed,
};
