/*
 * v2.h - the daemon's side of the Open Inference Protocol (KServe v2) routes (v2.c): the
 * handlers and the per-model statistics hooks that the route table (routes.c) points to.
 */
#ifndef ATTND_SERVER_V2_H
#define ATTND_SERVER_V2_H

#include "server/route.h"

/* GET /v2, /v2/models/{model}[/versions/{version}], .../ready, .../config, .../stats,
 * /v2/models/stats (MHD thread). */
srv_reply srv__answer_v2_server(srv_server *s, const srv_answer_args *args);
srv_reply srv__answer_v2_model(srv_server *s, const srv_answer_args *args);
srv_reply srv__answer_v2_ready(srv_server *s, const srv_answer_args *args);
srv_reply srv__answer_v2_config(srv_server *s, const srv_answer_args *args);
srv_reply srv__answer_v2_stats(srv_server *s, const srv_answer_args *args);
/* POST .../infer on a worker, with the body's Content-Encoding undone and the reply
 * compressed as Accept-Encoding allows. */
void srv__work_v2_infer(const srv_params *params, const api_call *call, api_reply *reply);
/* Triton's per-model counters of an inference (nv_inference_*, .../stats). */
extern const srv_stats_hooks srv__v2_infer_stats;

#endif
