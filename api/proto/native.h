/*
 * native.h - what the native JSON routes (POST /v1/attention, /v1/mha) share beyond the driver
 * (serve.h): reading the body, the reply's tensors and its bound, and the description of a
 * layer that GET /v1/models answers.
 */
#ifndef ATTND_API_PROTO_NATIVE_H
#define ATTND_API_PROTO_NATIVE_H

#include <stdbool.h>
#include <stdint.h>

#include "api/ops/request.h"
#include "api/ops/sdpa.h"
#include "api/proto/serve.h"
#include "api/wire/jsonw.h"
#include "api/wire/tensor.h"

/* The read step (api__route) of a native JSON route: the cancel flag and deadline, 415 for a
 * Content-Type other than JSON, 413 for a body past --max-body-bytes, then the JSON parse
 * (api__req_parse). `job` starts with its api__req. */
int api__native_read(void *job, api__error *err);

/* The end of a native route's encode step: the text of `w` as a 200 JSON reply, or the writer's
 * failure (api__jsonw_error). */
int api__native_reply(api__jsonw *w, api_reply *reply, api__error *err);

/* Appends "name": tensor to `w`; a non-finite value is a 422 naming its index. */
int api__native_tensor_field(api__jsonw *w, const char *name, const float *data, int rank,
                             const int64_t *shape, api__form form, unsigned flags, eng_pool *pool,
                             api__error *err);

/* An upper bound of the text of a native reply with the outputs out[0..n) (NULL entries: not
 * returned) in `form`: its braces, keys and meta, and each tensor; false on overflow. */
bool api__native_reply_bound(api__form form, const api__out_shape *const *out, size_t n,
                             size_t *text);

/* Appends the JSON description of layer `l` (as GET /v1/models/{name} answers). */
void api__model_describe(api__jsonw *w, const eng_layer *l);

#endif
