/*
 * native_serve.c - the driver of the native JSON routes: the stages every one runs around its
 * own steps, so that a status, a message or a timing never differs between them by accident,
 * with the body checks before parsing and the reply tensors after the engine.
 */
#include <math.h>
#include <string.h>

#include "api/core/memory.h"
#include "api/proto/native.h"
#include "api/wire/http_header.h"
#include "api/wire/reply.h"

int api__native_body_check(const api__req *rq, api__error *err)
{
    const api_call *call = rq->call;
    if (!api__content_type_json(call->content_type))
        return api__error_set(err, API_STATUS_UNSUPPORTED_MEDIA_TYPE, API_REASON_BAD_REQUEST, NULL,
                              "Content-Type \"%.80s\" is not supported; send application/json",
                              call->content_type);
    if (call->body_len > rq->limits.max_body_bytes)
        return api__error_set(err, API_STATUS_TOO_LARGE, API_REASON_TOO_LARGE, NULL,
                              "the body has %zu bytes, more than the %zu that --max-body-bytes "
                              "allows",
                              call->body_len, rq->limits.max_body_bytes);
    return 0;
}

int api__native_tensor_field(api__jsonw *w, const char *name, const float *data, int rank,
                             const int64_t *shape, api__form form, unsigned flags, eng_pool *pool,
                             api__error *err)
{
    size_t bad = 0;
    api__jsonw_char(w, '"');
    api__jsonw_cstr(w, name);
    api__jsonw_cstr(w, "\":");
    switch (api__tensor_encode(w, data, rank, shape, form, flags, pool, &bad)) {
    case API_ENCODE_OK:
        return 0;
    case API_ENCODE_NONFINITE: {
        char idx[128];
        return api__error_invalid(err, name,
                                  "the result %s%s is %s: it does not fit in float32 (inputs too "
                                  "large for float32 arithmetic?)",
                                  name, api__index_format(idx, sizeof idx, bad, rank, shape, rank),
                                  isnan(data[bad]) ? "NaN" : "infinite");
    }
    case API_ENCODE_FULL:
        break;
    }
    return api__jsonw_error(w, err);
}

/* The stages of api__native_serve up to a 200 reply; -1 with `err` filled at the first that fails.
 */
static int serve_stages(const api__native_steps *steps, void *job, api__req *rq, api__jsonw *w,
                        api_reply *reply, api__error *err)
{
    const api_call *call = rq->call;

    if (api__req_check_ctl(rq, err) != 0 || api__native_body_check(rq, err) != 0)
        return -1;
    if (api__req_parse(rq, call->body ? call->body : "", call->body_len, err) != 0 ||
        steps->parse(job, err) != 0)
        return -1;

    /* Size everything, reserve it, then allocate and decode. */
    size_t tensors = 0, scratch = 0, text = 0;
    bool sized = steps->size(job, &tensors, &scratch, &text);
    if (api__req_reserve_run(rq, sized, tensors, text, scratch, err) != 0)
        return -1;
    api__jsonw_init(w, text);

    if (steps->decode(job, err) != 0)
        return -1;
    reply->decode_ns = eng_now_ns() - rq->call_ns;
    if (steps->compute(job, &reply->compute_ns, err) != 0)
        return -1;
    int64_t t_computed = eng_now_ns();
    if (steps->encode(job, w, reply->decode_ns, reply->compute_ns, err) != 0)
        return -1;
    api__reply_json(reply, w, API_ERRORS_NATIVE);
    reply->encode_ns = eng_now_ns() - t_computed;
    if (steps->inferences)
        reply->inferences = steps->inferences(job);
    return 0;
}

void api__native_serve(const api__native_steps *steps, void *job, const api_call *call,
                       api_reply *reply)
{
    api__req *rq = job; /* its first member */
    api__error err;
    api__jsonw w;
    memset(&err, 0, sizeof err);
    memset(reply, 0, sizeof *reply);
    if (!job) {
        api__error_set(&err, API_STATUS_UNAVAILABLE, API_REASON_MEMORY, NULL, "out of memory");
        api__reply_from_error(reply, API_ERRORS_NATIVE, &err);
        return;
    }
    api__req_init(rq, call);
    api__jsonw_init(&w, 0);

    if (serve_stages(steps, job, rq, &w, reply, &err) != 0) {
        api__reply_from_error(reply, API_ERRORS_NATIVE, &err);
        if (reply->decode_ns == 0)
            reply->decode_ns = eng_now_ns() - rq->call_ns;
    }
    api__jsonw_free(&w);
    if (steps->free)
        steps->free(job);
    api__req_free(rq);
}

bool api__native_reply_bound(api__form form, const api__out_shape *const *out, size_t n,
                             size_t *text)
{
    *text = 1024; /* the reply's braces, keys and meta */
    for (size_t i = 0; i < n; i++)
        if (out[i] && !api__size_add(text, api__tensor_encoded_bound(form, out[i]->rank,
                                                                     out[i]->shape, out[i]->count)))
            return false;
    return true;
}
