/*
 * native.c - the steps the native JSON routes share: reading the body before their fields, and
 * their reply tensors and bound after the engine, so that both answer alike.
 */
#include <math.h>
#include <string.h>

#include "api/core/memory.h"
#include "api/proto/native.h"
#include "api/wire/http_header.h"
#include "api/wire/reply.h"

/* 415 for a Content-Type other than JSON, 413 for a body past --max-body-bytes. */
static int body_check(const api__req *rq, api__error *err)
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

int api__native_read(void *job, api__error *err)
{
    api__req *rq = job; /* its first member */
    const api_call *call = rq->call;
    if (api__req_check_ctl(rq, err) != 0 || body_check(rq, err) != 0)
        return -1;
    return api__req_parse(rq, call->body ? call->body : "", call->body_len, err);
}

int api__native_reply(api__jsonw *w, api_reply *reply, api__error *err)
{
    if (w->state != API_JSONW_OK)
        return api__jsonw_error(w, err);
    api__reply_json(reply, w, API_ERRORS_NATIVE);
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
