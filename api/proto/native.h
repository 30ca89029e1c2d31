/*
 * native.h - what the native JSON routes (POST /v1/attention, /v1/mha) share beyond the driver
 * (serve.h): reading the body, the reply's tensors and its bound, and the description of a
 * layer that GET /v1/models answers.
 */
#ifndef ATTND_API_PROTO_NATIVE_H
#define ATTND_API_PROTO_NATIVE_H

#include <stdbool.h>
#include <stdint.h>

#include "api/ops/operation.h"
#include "api/ops/options.h"
#include "api/ops/request.h"
#include "api/proto/serve.h"
#include "api/wire/buf.h"
#include "api/wire/tensor.h"

/* The read step (api__steps) of a native JSON route: the cancel flag and deadline, 415 for a
 * Content-Type other than JSON, 413 for a body past --max-body-bytes, then the JSON parse
 * (api__req_parse). `job` starts with its api__req. */
int api__native_read(void *job, api__error *err);

/* A field of a native route's body that is the route's own (a tensor, an output setting), not
 * one of its operation's options: its parser gets the route's job. */
typedef struct {
    const char *name;
    int (*parse)(void *job, const json_t *v, const char *name, api__error *err);
} api__native_field;

/* Reads every field of the parsed body: the route's own (fields[0..n)) with `job`, else an
 * option of its operation (opts[0..n_opts)) into `op_req`, where null leaves the default;
 * anything else is a 422 listing what `route` ("/v1/attention") takes. */
int api__native_fields(void *job, void *op_req, const api__native_field *fields, size_t n,
                       const api__option_def *opts, size_t n_opts, const char *route,
                       api__error *err);

/* The end of a native route's encode step: the text of `w` as a 200 JSON reply, or the writer's
 * failure (api__buf_error). */
int api__native_reply(api_buf *w, api_reply *reply, api__error *err);

/* The head of a native route's job: its request and the operation it runs, so that the steps
 * below serve every native route. */
typedef struct {
    api__req rq;       /* first: api__serve finds it there */
    const api__op *op; /* api__sdpa_op, api__layer_op */
    void *state;       /* the operation's state, in the route's job; its rq is &rq */
    api__form form;    /* of the reply's tensors: set by the route's check step */
    bool bf16_out;     /* "output_dtype": "bfloat16": the tensors as bf16 */
} api__native_job;

/* Steps (api__steps) of a route whose job starts with an api__native_job. size: the
 * operation's, the outputs it computes, and an upper bound of the reply (its braces, keys and
 * meta, and each output in `form`). decode, run, batch, free, operation: the operation's. */
bool api__native_size(void *job, api__sizes *sz);
void *api__native_operation(void *job, const api__op **op);
int api__native_decode(void *job, api__error *err);
int api__native_run(void *job, int64_t *compute_ns, api__error *err);
int64_t api__native_batch(const void *job);
void api__native_free(void *job);

/* The start of a native reply: '{' and "name": tensor for each output the operation computed,
 * in nj->form ("lse" with -inf as null, as strict JSON has no -inf); a non-finite value is a
 * 422 naming its index. */
int api__native_outputs(const api__native_job *nj, api_buf *w, api__error *err);

#endif
