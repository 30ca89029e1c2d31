/*
 * native.h - the native protocol's driver: the stages every native JSON route (POST
 * /v1/attention, /v1/mha) runs around its own steps, its body checks and its reply tensors, and
 * the description of a layer that GET /v1/models answers.
 */
#ifndef ATTND_API_PROTO_NATIVE_H
#define ATTND_API_PROTO_NATIVE_H

#include <stdbool.h>
#include <stdint.h>

#include "api/ops/request.h"
#include "api/ops/sdpa.h"
#include "api/wire/jsonw.h"
#include "api/wire/tensor.h"

/* The checks of a native JSON route before parsing: 415 for a Content-Type other than JSON,
 * 413 for a body past --max-body-bytes. */
int api__native_body_check(const api__req *rq, api__error *err);

/* Appends "name": tensor to `w`; a non-finite value is a 422 naming its index. */
int api__native_tensor_field(api__jsonw *w, const char *name, const float *data, int rank,
                             const int64_t *shape, api__form form, unsigned flags, eng_pool *pool,
                             api__error *err);

/* An upper bound of the text of a native reply with the outputs out[0..n) (NULL entries: not
 * returned) in `form`: its braces, keys and meta, and each tensor; false on overflow. */
bool api__native_reply_bound(api__form form, const api__out_shape *const *out, size_t n,
                             size_t *text);

/* The steps of a native JSON route (POST /v1/attention, /v1/mha) between the stages that
 * api__native_serve runs for every one of them. Each step takes the route's job (see
 * api__native_serve) and returns 0, or -1 with `err` filled. */
typedef struct {
    /* Reads rq->body (parsed, an object) into the job and checks it: fields, shapes, limits,
     * the deadline. */
    int (*parse)(void *job, api__error *err);
    /* Bytes of the decoded tensors, the engine's scratch and an upper bound of the reply's
     * text (also its writer's maximum); false when a sum overflowed. */
    bool (*size)(void *job, size_t *tensors, size_t *scratch, size_t *text);
    /* Allocates and decodes the inputs and frees the body tree. */
    int (*decode)(void *job, api__error *err);
    /* Runs the engine; *compute_ns gets its time. */
    int (*compute)(void *job, int64_t *compute_ns, api__error *err);
    /* Writes the reply into `w`, with the stage timings in its meta. */
    int (*encode)(void *job, api__jsonw *w, int64_t decode_ns, int64_t compute_ns, api__error *err);
    /* The batch the reply counts in reply->inferences; NULL: none counted. */
    int64_t (*inferences)(const void *job);
    /* Frees what the job owns beyond its api__req, on every path; NULL: nothing. */
    void (*free)(void *job);
} api__native_steps;

/* Serves one native JSON request with `steps`, so that every route runs the same stages in
 * the same order and fails the same way: the cancel flag and deadline, the Content-Type and
 * body size (api__native_body_check), the JSON parse (api__req_parse), then steps->parse; sizes
 * from steps->size reserved at once (api__req_reserve_run) before anything is allocated;
 * steps->decode, whose end is reply->decode_ns (from rq->call_ns); steps->compute; and
 * steps->encode into a writer capped at the reply bound, timed from the end of the compute
 * (api__reply_json). A failure at any stage becomes a native error reply, with decode_ns
 * measured up to the failure when decoding never finished.
 *
 * `job` is the route's zeroed job, whose first member is its api__req (initialised here from
 * `call`); NULL (its allocation failed) is answered 503. The job's own pointers to that
 * api__req are the route's to set. Frees the reply writer, then steps->free(job), then the
 * api__req; the job itself stays the caller's. Always fills `reply`. */
void api__native_serve(const api__native_steps *steps, void *job, const api_call *call,
                       api_reply *reply);

/* Appends the JSON description of layer `l` (as GET /v1/models/{name} answers). */
void api__model_describe(api__jsonw *w, const eng_layer *l);

#endif
