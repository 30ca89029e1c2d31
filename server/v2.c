/*
 * v2.c - the daemon's side of the Open Inference Protocol (KServe v2) routes, and the HTTP
 * headers that worker routes pass to api/ and back.
 *
 * The replies themselves come from api/ (api_v2_*); this file binds the path parameters
 * {model} and {version} into the call, answers the cheap GETs on the MHD thread, runs inference
 * on a worker through api_call_encoded (gzip / deflate bodies in and out), keeps Triton's
 * per-model statistics (metrics.c renders them as nv_inference_* families and as the statistics
 * extension's JSON), and carries Content-Encoding, Accept-Encoding and
 * Inference-Header-Content-Length between the MHD thread and the worker.
 */
#include "server/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static api_call path_call(const srv_server *s, const srv_req *req)
{
    api_call call;
    memset(&call, 0, sizeof call);
    call.models = s->models;
    call.model = srv__req_param(req, "model");
    call.version = srv__req_param(req, "version");
    return call;
}

enum MHD_Result srv__answer_v2_server(srv_server *s, srv_req *req)
{
    api_reply reply;
    (void)s;
    api_v2_server_metadata(&reply);
    return srv__respond_api(req, &reply);
}

enum MHD_Result srv__answer_v2_model(srv_server *s, srv_req *req)
{
    api_call call = path_call(s, req);
    api_reply reply;
    api_v2_model_metadata(&call, &reply);
    return srv__respond_api(req, &reply);
}

enum MHD_Result srv__answer_v2_config(srv_server *s, srv_req *req)
{
    api_call call = path_call(s, req);
    api_reply reply;
    api_v2_model_config(&call, &reply);
    return srv__respond_api(req, &reply);
}

enum MHD_Result srv__answer_v2_ready(srv_server *s, srv_req *req)
{
    api_call call = path_call(s, req);
    api_reply reply;
    if (atomic_load(&s->draining) && api_v2_model_known(s->models, call.model, call.version))
        return srv__respond_error(req, 503, API_REASON_NONE, NULL, "draining");
    api_v2_model_ready(&call, &reply);
    return srv__respond_api(req, &reply);
}

enum MHD_Result srv__answer_v2_stats(srv_server *s, srv_req *req)
{
    api_call call = path_call(s, req);
    srv_buf b;
    char *body;
    size_t len = 0;
    int slot = -1;
    if (call.model) {
        if (!api_v2_model_known(s->models, call.model, call.version)) {
            api_reply reply;
            api_v2_model_ready(&call, &reply); /* the 404 that names what is unknown */
            return srv__respond_api(req, &reply);
        }
        slot = srv__metrics_model_slot(s->models, call.model);
    }
    srv__buf_init(&b, (size_t)1 << 20);
    srv__metrics_stats_json(&s->metrics, s->models, slot, &b);
    body = srv__buf_take(&b, &len);
    if (!body)
        return srv__respond_error(req, 503, API_REASON_INTERNAL, NULL, "out of memory");
    return srv__respond(req, 200, "application/json", body, len, NULL);
}

void srv__work_v2_infer(const srv_req *req, const api_call *call, api_reply *reply)
{
    api_call c = *call;
    c.model = srv__req_param(req, "model");
    c.version = srv__req_param(req, "version");
    api_call_encoded(api_v2_infer, API_ERRORS_V2, &c, reply);
}

/* ---- Headers between the MHD thread and the worker ------------------------------------------ */

/* Copies header `name` into dst; false when it is too long to keep. */
static bool keep_header(srv_req *req, const char *name, char *dst, size_t size)
{
    const char *v = MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, name);
    dst[0] = '\0';
    if (!v)
        return true;
    if (strlen(v) >= size)
        return false;
    memcpy(dst, v, strlen(v) + 1);
    return true;
}

enum MHD_Result srv__capture_headers(srv_server *s, srv_req *req, bool *answered)
{
    const srv_route_def *rd = srv__route_def(req->route);
    *answered = true;
    if (!keep_header(req, MHD_HTTP_HEADER_CONTENT_ENCODING, req->content_encoding,
                     sizeof req->content_encoding))
        return srv__respond_error(req, 415, API_REASON_BAD_REQUEST, NULL,
                                  "unsupported Content-Encoding: send gzip, deflate or identity");
    if (!keep_header(req, "Inference-Header-Content-Length", req->infer_header_len,
                     sizeof req->infer_header_len))
        return srv__respond_error(req, 400, API_REASON_BAD_REQUEST, NULL,
                                  "Inference-Header-Content-Length is not a byte count");
    /* An Accept-Encoding too long to keep is as good as none: the reply goes uncompressed. */
    if (!keep_header(req, MHD_HTTP_HEADER_ACCEPT_ENCODING, req->accept_encoding,
                     sizeof req->accept_encoding))
        req->accept_encoding[0] = '\0';
    if (rd && rd->work == srv__work_v2_infer) {
        const char *model = srv__req_param(req, "model");
        if (api_v2_model_known(s->models, model, srv__req_param(req, "version"))) {
            req->model_slot = srv__metrics_model_slot(s->models, model);
            req->has_model_slot = req->model_slot >= 0;
        }
    }
    *answered = false;
    return MHD_YES;
}

void srv__call_headers(const srv_req *req, api_call *call)
{
    call->content_encoding = req->content_encoding[0] ? req->content_encoding : NULL;
    call->accept_encoding = req->accept_encoding[0] ? req->accept_encoding : NULL;
    call->inference_header_length = req->infer_header_len[0] ? req->infer_header_len : NULL;
    call->request_id = req->id[0] ? req->id : NULL;
}

void srv__reply_headers(const api_reply *reply, const char **headers, char num[24])
{
    size_t i = 0;
    if (reply->content_encoding) {
        headers[i++] = MHD_HTTP_HEADER_CONTENT_ENCODING;
        headers[i++] = reply->content_encoding;
    }
    if (reply->inference_header_len > 0) {
        snprintf(num, 24, "%lld", (long long)reply->inference_header_len);
        headers[i++] = "Inference-Header-Content-Length";
        headers[i++] = num;
    }
    /* The reply depends on Accept-Encoding: caches must key on it. */
    headers[i++] = MHD_HTTP_HEADER_VARY;
    headers[i++] = MHD_HTTP_HEADER_ACCEPT_ENCODING;
    headers[i] = NULL;
}

/* ---- Model statistics ------------------------------------------------------------------------ */

void srv__v2_admitted(srv_server *s, srv_req *req)
{
    if (!req->has_model_slot)
        return;
    atomic_store(&req->pending, true);
    atomic_fetch_add(&s->metrics.model[req->model_slot].pending, 1);
}

void srv__v2_started(srv_server *s, srv_req *req)
{
    if (req->has_model_slot && atomic_exchange(&req->pending, false))
        atomic_fetch_sub(&s->metrics.model[req->model_slot].pending, 1);
}

void srv__v2_completed(srv_server *s, srv_req *req, int status, api_reason reason, int64_t total_ns,
                       int64_t queue_ns)
{
    srv__v2_started(s, req); /* answered without running (the watcher, a failed submit) */
    if (req->has_model_slot)
        srv__metrics_infer(&s->metrics, req->model_slot, status, reason, total_ns, queue_ns,
                           &req->reply);
}
