/*
 * v2_job.h - the KServe v2 inference job that api/v2.c and api/v2_request.c share: what
 * v2_request.c parses a request into and v2.c runs and answers, and the model lookup of
 * v2_model.c. Nothing else includes it; the protocol itself is described at the top of v2.c
 * (inference) and v2_model.c (metadata and configuration).
 *
 * The type names are unprefixed because they never leave these two files; the functions, which
 * the linker sees, carry api_v2_.
 */
#ifndef ATTND_API_V2_JOB_H
#define ATTND_API_V2_JOB_H

#include "api/internal.h"

typedef enum { MODEL_NONE = 0, MODEL_SDPA, MODEL_LAYER } model_kind;

typedef struct {
    model_kind kind;
    const char *name;
    const eng_layer *layer;
} model_ref;

/* The outputs, in the order of the reply; a layer model has no lse. Both files name them in
 * messages, so the table is here (three pointers per includer). */
enum { OUT_OUTPUT = 0, OUT_WEIGHTS, OUT_LSE, N_OUTPUTS };

static const char *const output_names[N_OUTPUTS] = {"output", "weights", "lse"};

typedef struct {
    api_req rq;
    api_sdpa s;  /* model sdpa */
    api_layer l; /* a layer model */
    model_ref model;
    char *id; /* NUL-terminated copy (the tree is freed before the reply is written) */
    size_t id_len;
    bool has_id;

    const char *bin; /* the binary part of the body, after the JSON */
    size_t bin_len, bin_used;
    bool has_header_len;

    bool binary_default; /* binary_data_output */
    bool outputs_given;
    bool want[N_OUTPUTS], binary[N_OUTPUTS], binary_set[N_OUTPUTS];
    bool weights_param_set; /* return_weights given */
    bool weights_param_off; /* ... as false */
    bool lse_param_set;
    int64_t timeout_us; /* Triton's "timeout" parameter; 0: none */
} v2_job;

/* Finds call->model (and call->version); on failure fills a 404 reply and returns false. */
bool api_v2_model_find(const api_call *call, model_ref *m, api_reply *reply);

static inline bool is_layer(const v2_job *job)
{
    return job->model.kind == MODEL_LAYER;
}

/* The options both kinds of model have, wherever the model keeps them. */
static inline eng_weights_mode *weights_of(v2_job *job)
{
    return is_layer(job) ? &job->l.r.weights : &job->s.r.weights;
}

/* Reads the body of job->rq.call into the job (v2_request.c): the Content-Type, the body size
 * and Inference-Header-Content-Length checked first, then id, parameters, inputs (tensors
 * probed, not decoded; binary ones pointing into the body) and outputs. job->model and job->rq
 * must be set, the rest zeroed. Errors: 415 Content-Type, 413 size, 400 framing or malformed
 * JSON, 422 naming the field (sent as 400 in the v2 style), and what api_req_parse and
 * api_req_alloc fail with (429, 503).
 * Whatever it allocates belongs to job->rq. */
int api_v2_request_parse(v2_job *job, api_error *err);

/* After api_v2_request_parse: settles which outputs are returned and computed (weights and lse
 * only when returned), which are binary, and the request's timeout (api_v2_timeout_ms). 422
 * when the outputs listed contradict return_weights or return_lse. */
int api_v2_outputs_settle(v2_job *job, api_error *err);

#endif
