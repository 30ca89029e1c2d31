/*
 * v2.h - the KServe v2 protocol's inference job, shared by proto/v2_request.c (which parses a
 * request into it), proto/v2_infer.c (which runs it and answers), proto/v2_model.c (the
 * model lookup) and proto/grpc_infer.c (the same protocol over gRPC: its own reader and writer,
 * the same job, checks and steps; grpc_unary.c looks models up). Nothing outside proto/v2_*.c and
 * proto/grpc_*.c includes it; the protocol itself is described at the top of v2_infer.c (inference)
 * and v2_model.c (metadata and configuration).
 *
 * The type names are unprefixed because they never leave these files; the functions, which
 * the linker sees, carry api__v2_.
 */
#ifndef ATTND_API_PROTO_V2_H
#define ATTND_API_PROTO_V2_H

#include "api/ops/layer.h"
#include "api/ops/sdpa.h"
#include "api/ops/sessions.h"

typedef enum { MODEL_NONE = 0, MODEL_SDPA, MODEL_LAYER } model_kind;

typedef struct {
    model_kind kind;
    const char *name;
    const api_model *model; /* MODEL_LAYER: the registered model */
} model_ref;

typedef struct v2_kind v2_kind;

typedef struct {
    api__req rq;         /* first: api__serve finds it there */
    api__sdpa s;         /* model sdpa */
    api__layer l;        /* a layer model */
    const v2_kind *kind; /* what the model takes and gives */
    const api__op *op;   /* the operation run: the kind's, or a sequence's step */
    void *op_state;      /* its state: s, l or st */
    void *req;           /* the kind's operation request: s.r or l.r */
    model_ref model;
    char *id; /* NUL-terminated copy (the tree is freed before the reply is written) */
    size_t id_len;
    bool has_id;

    const char *bin; /* the binary part of the body, after the JSON */
    size_t bin_len, bin_used;
    bool has_header_len;

    bool binary_default; /* binary_data_output */
    bool bf16_out;       /* "output_dtype": "bfloat16": every output BF16, as binary data */
    bool outputs_given;
    bool want[API__N_OUTPUTS], binary[API__N_OUTPUTS], binary_set[API__N_OUTPUTS];
    bool weights_param_set; /* return_weights given */
    bool weights_param_off; /* ... as false */
    bool lse_param_set;
    int64_t timeout_us; /* Triton's "timeout" parameter; 0: none */

    /* Triton's sequence parameters: the request is a step of the session of its sequence. */
    bool seq_set, seq_start, seq_end;
    char seq_id[72];      /* sequence_id as text (an integer's digits, or the string) */
    api__session_step st; /* the step, when seq_set: op is then its operation */
    char session[API_SESSION_ID_LEN + 1]; /* the sequence's session */

    /* The reply, as v2_infer.c sizes and writes it. */
    bool all_binary, any_binary; /* of the outputs returned */
    size_t binary_bytes;         /* the binary outputs' bytes after the JSON */
    size_t json_text;            /* a bound of the JSON outputs' text */
    char *blob;                  /* the body once made (owned until the reply takes it) */
    size_t json_len;             /* the JSON part of blob */
} v2_job;

/* An input of a kind of model: its name, and where the kind's operation request keeps its
 * tensor (an offset in api__sdpa_req or api__layer_req). */
typedef struct {
    const char *name;
    size_t tensor;
    const char *required; /* NULL: optional; else what it is, for the message when missing */
} v2_input;

/* Inputs a kind of model takes, at most. */
#define API__V2_MAX_INPUTS 8

typedef struct v2_param v2_param; /* a parameter v2 spells its own way (v2_request.c) */

/* Where a kind's request keeps nothing of the sort. */
#define V2_NO_FIELD SIZE_MAX

/* What one kind of model (sdpa, a layer) takes and gives over v2: reading the request and
 * writing the reply ask it for every difference between the kinds, never the kind itself.
 * Offsets of fields are in the kind's operation request (v2_job.req). */
struct v2_kind {
    const api__op *op;
    size_t state, request; /* offsets in v2_job of the operation's state and its request */
    const v2_param *params;
    size_t n_params;
    const api__option_def *options; /* the operation's own, as /v1 reads them */
    const size_t *n_options;
    const v2_input *inputs;
    size_t n_inputs;
    int n_outputs;                      /* the first n of API__OUT_*: a layer has no lse */
    size_t window, weights, timeout_ms; /* api__window, eng_weights_mode, int64_t */
    size_t return_lse;                  /* bool, or V2_NO_FIELD */
    /* Settles what the model implies for its operation once the request is read (defaults,
     * the registered layer); 422 naming the field when the model cannot serve the request. */
    int (*bind)(v2_job *job, api__error *err);
    /* Makes the request (sequence_id set, sessions on) a step of its sequence's session:
     * api__v2_sdpa_sequence or api__v2_layer_sequence (v2_sequence.c). */
    int (*sequence)(v2_job *job, api__error *err);
};

/* The steps of a sequence on model sdpa (the query attends the session after key and value
 * are appended) and on a layer model (a decoder-layer step over the session); sequence_start
 * makes the session, any other request needs it (400 in Triton's words). v2_sequence.c. */
int api__v2_sdpa_sequence(v2_job *job, api__error *err);
int api__v2_layer_sequence(v2_job *job, api__error *err);

/* The kind of model m is (v2_request.c). */
const v2_kind *api__v2_kind(const model_ref *m);

/* A field of the job's operation request at `offset` (a v2_kind offset). */
static inline void *v2_req_field(v2_job *job, size_t offset)
{
    return (char *)job->req + offset;
}

/* What GET /v2 and ServerMetadata report (v2_model.c). */
#define API__V2_SERVER_NAME    "attnd"
#define API__V2_SERVER_VERSION "0.1.0"
extern const char *const api__v2_extensions[];
extern const size_t api__v2_n_extensions;

/* One tensor of a model's metadata and configuration: dims of -1 are variable. */
typedef struct {
    const char *name;
    const char *datatype; /* the protocol's name ("FP32"); Triton's is "TYPE_" and this */
    int rank;
    int64_t dims[4];
    bool optional; /* an input a request may leave out */
} tensor_desc;

enum { MAX_TENSORS = 8 };

/* What a model's metadata and configuration describe: its platform and tensors. */
typedef struct {
    const char *platform;
    tensor_desc in[MAX_TENSORS], out[MAX_TENSORS];
    int n_in, n_out;
} model_desc;

/* The description of model m (found by api__v2_model_lookup). v2_model.c. */
model_desc api__v2_model_desc(const model_ref *m);

/* Whether model m's metadata lists output o (an API__OUT_*): those an infer without "outputs"
 * returns. v2_model.c. */
bool api__v2_output_listed(const model_ref *m, int o);

/* Finds model `name` (NULL: "") of version `version` (NULL: any) among "sdpa" and `models`;
 * 404 naming the models there are when there is none. */
int api__v2_model_lookup(const api_models *models, const char *name, const char *version,
                         model_ref *m, api__error *err);

/* Finds call->model (and call->version); on failure fills a 404 reply and returns false. */
bool api__v2_model_find(const api_call *call, model_ref *m, api_reply *reply);

/* Points the job's operation at its model's kind (job->model set, the rest zeroed): the pointers
 * to its api__req, causal "not given", kind, op, op_state and req. */
void api__v2_job_init(v2_job *job);

/* Reads the body of job->rq.call into the job (v2_request.c): the Content-Type, the body size
 * and Inference-Header-Content-Length checked first, then id, parameters, inputs (tensors
 * probed, not decoded; binary ones pointing into the body) and outputs. job->model and job->rq
 * must be set, the rest zeroed. Errors: 415 Content-Type, 413 size, 400 framing or malformed
 * JSON, 422 naming the field (sent as 400 in the v2 style), and what api__req_parse and
 * api__req_alloc fail with (429, 503).
 * Whatever it allocates belongs to job->rq. */
int api__v2_request_parse(v2_job *job, api__error *err);

/* The pieces of api__v2_request_parse that another reader of the same request (gRPC) uses, so
 * that each check and message exists once. */

/* Parameter `key` of the request (the model's own, its operation's options, Triton's reserved
 * ones; 422 naming "parameters.<key>" for anything else). */
int api__v2_parameter(v2_job *job, const char *key, const json_t *v, api__error *err);

/* Input `name` (`field` names it in messages: "inputs[i]"): its tensor slot, marked present and
 * otherwise zeroed, into *t. 422 when the model has no such input or it is given twice. */
int api__v2_input_begin(v2_job *job, const char *name, const char *field, api__tensor **t,
                        api__error *err);

/* The datatype `datatype` (NULL: not a string) of input `name`, into *dtype when the input takes
 * it; *json_ok says whether JSON numbers can carry it. 422 naming `field` otherwise. */
int api__v2_input_datatype(const char *name, const char *datatype, const char *field,
                           api__dtype *dtype, bool *json_ok, api__error *err);

/* Input t (its shape set) as `size` raw bytes of `dtype` at `bytes` (borrowed until the request
 * ends); 422 when size is not the shape's count times the datatype's size. */
int api__v2_input_raw(api__tensor *t, const char *name, const char *datatype, api__dtype dtype,
                      int64_t size, const char *bytes, api__error *err);

/* 422 naming the first input the model requires that the request lacks. */
int api__v2_inputs_complete(v2_job *job, api__error *err);

/* Output `name` asked for (`field` names it in messages): *o its API__OUT_*; 422 when the model
 * has no such output or it is asked for twice. */
int api__v2_output_want(v2_job *job, const char *name, const char *field, int *o, api__error *err);

/* After api__v2_request_parse: settles which outputs are returned and computed (weights and lse
 * only when returned; without "outputs", every output the model's metadata lists, weights when
 * return_weights asks and lse unless return_lse is false), which are binary, and the request's
 * timeout (api__v2_timeout_ms). 422 when the outputs listed contradict return_weights or
 * return_lse. */
int api__v2_outputs_settle(v2_job *job, api__error *err);

/* After api__v2_outputs_settle: the sequence's step or the model's binding, then the
 * operation's check (v2_infer.c). */
int api__v2_model_check(v2_job *job, api__error *err);

/* Steps of the v2 inference route (api__steps) that gRPC's shares: the operation's decode, run,
 * batch and the operation itself (for a batch of requests), and the job's free (which ends a
 * sequence at its sequence_end). */
int api__v2_decode(void *job, api__error *err);
int api__v2_run(void *job, int64_t *compute_ns, api__error *err);
int64_t api__v2_batch(const void *job);
void *api__v2_operation(void *job, const api__op **op);
void api__v2_free(void *job);

/* Output o of the job, which the request returns or computes. */
static inline const api__out_shape *v2_output_shape(const v2_job *job, int o)
{
    return job->op->output(job->op_state, o, NULL);
}

/* Where output o is (or will be) written. */
static inline float **v2_output_slot(v2_job *job, int o)
{
    float **slot = NULL;
    job->op->output(job->op_state, o, &slot);
    return slot;
}

static inline float *v2_output_data(v2_job *job, int o)
{
    return *v2_output_slot(job, o);
}

/* Bytes of one output element as bytes are sent: 4 (FP32), or 2 with output_dtype bfloat16. */
static inline size_t v2_elem_bytes(const v2_job *job)
{
    return job->bf16_out ? 2 : 4;
}

/* The datatype of every output: "FP32", or "BF16" with output_dtype bfloat16. */
static inline const char *v2_output_datatype(const v2_job *job)
{
    return job->bf16_out ? "BF16" : "FP32";
}

/* 422 when output o (computed) holds a value the protocol's JSON could not carry either (the
 * engine never returns one, so it is an error, never silently sent); -inf is lse's. */
int api__v2_output_finite(v2_job *job, int o, api__error *err);

/* Appends output o's bytes to w: fp32 as computed, or rounded to bf16. */
int api__v2_output_bytes(v2_job *job, int o, api_buf *w, api__error *err);

#endif
