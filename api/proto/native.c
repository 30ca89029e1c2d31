/*
 * native.c - the steps the native JSON routes share: reading the body before their fields, and
 * their reply tensors and bound after the engine, so that both answer alike.
 */
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
    return api__req_check_body_size(rq, err);
}

int api__native_read(void *job, api__error *err)
{
    api__req *rq = job; /* its first member */
    const api_call *call = rq->call;
    if (api__req_check_ctl(rq, err) != 0 || body_check(rq, err) != 0)
        return -1;
    return api__req_parse(rq, call->body ? call->body : "", call->body_len, err);
}

int api__native_fields(void *job, void *op_req, const api__native_field *fields, size_t n,
                       const api__option_def *opts, size_t n_opts, const char *route,
                       api__error *err)
{
    const api__req *rq = job; /* every native job starts with its request */
    const char *key;
    json_t *val;
    json_object_foreach(rq->body.root, key, val)
    {
        size_t i = 0;
        while (i < n && strcmp(fields[i].name, key) != 0)
            i++;
        if (i < n) {
            if (fields[i].parse(job, val, key, err) != 0)
                return -1;
            continue;
        }
        const api__option_def *opt = api__option_find(opts, n_opts, key);
        if (opt) {
            if (!json_is_null(val) && opt->parse(op_req, val, key, err) != 0)
                return -1;
            continue;
        }
        const char *names[64];
        for (i = 0; i < n && i < 64; i++)
            names[i] = fields[i].name;
        api__names known = {"field", route, names, i, opts, n_opts};
        return api__unknown_name(key, key, &known, err);
    }
    return 0;
}

int api__native_reply(api_buf *w, api_reply *reply, api__error *err)
{
    if (w->state != API_BUF_OK)
        return api__buf_error(w, err);
    api__reply_json(reply, w, API_ERRORS_NATIVE);
    return 0;
}

/* Appends "name": tensor (data of shape `sh`) to `w`; a non-finite value is a 422 naming its
 * index. */
static int tensor_field(api_buf *w, const char *name, const float *data, const api__out_shape *sh,
                        api__form form, unsigned flags, eng_pool *pool, api__error *err)
{
    const int rank = sh->rank;
    const int64_t *shape = sh->shape;
    size_t bad = 0;
    api_buf_char(w, '"');
    api_buf_cstr(w, name);
    api_buf_cstr(w, "\":");
    switch (api__tensor_encode(w, data, rank, shape, form, flags, pool, &bad)) {
    case API_ENCODE_OK:
        return 0;
    case API_ENCODE_NONFINITE:
        return api__tensor_nonfinite_result(err, name, data, bad, rank, shape);
    case API_ENCODE_FULL:
        break;
    }
    return api__buf_error(w, err);
}

bool api__native_size(void *job, api__sizes *sz)
{
    api__native_job *nj = job;
    bool ok = nj->op->steps.size(nj->state, sz);
    ok = ok && api__size_add(&sz->text, 1024); /* the reply's braces, keys and meta */
    for (int o = 0; o < API__N_OUTPUTS; o++) {
        const api__out_shape *sh = nj->op->output(nj->state, o, NULL);
        if (sh)
            ok = ok && api__req_output_bytes(sh->count, &sz->tensors) &&
                 api__size_add(&sz->text,
                               api__tensor_encoded_bound(nj->form, sh->rank, sh->shape, sh->count));
    }
    return ok;
}

int api__native_decode(void *job, api__error *err)
{
    api__native_job *nj = job;
    return nj->op->steps.decode(nj->state, err);
}

int api__native_run(void *job, int64_t *compute_ns, api__error *err)
{
    api__native_job *nj = job;
    return nj->op->steps.run(nj->state, compute_ns, err);
}

void *api__native_operation(void *job, const api__op **op)
{
    api__native_job *nj = job;
    *op = nj->op;
    return nj->state;
}

int64_t api__native_batch(const void *job)
{
    const api__native_job *nj = job;
    return nj->op->steps.batch(nj->state);
}

void api__native_free(void *job)
{
    api__native_job *nj = job;
    if (nj->op->steps.free)
        nj->op->steps.free(nj->state);
}

int api__native_outputs(const api__native_job *nj, api_buf *w, api__error *err)
{
    api_buf_char(w, '{');
    for (int o = 0; o < API__N_OUTPUTS; o++) {
        float **data;
        const api__out_shape *sh = nj->op->output(nj->state, o, &data);
        if (!sh)
            continue;
        if (o != API__OUT_OUTPUT) /* the output comes first, always */
            api_buf_char(w, ',');
        unsigned flags = (o == API__OUT_LSE ? API_ENCODE_NEG_INF_NULL : 0u) |
                         (nj->bf16_out ? API_ENCODE_BF16 : 0u);
        if (tensor_field(w, api__out_names[o], *data, sh, nj->form, flags, nj->rq.call->pool,
                         err) != 0)
            return -1;
    }
    return 0;
}
