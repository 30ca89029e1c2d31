/*
 * request.c - what every route of api/ holds for one request, and frees on every path.
 *
 * A route (POST /v1/attention, /v1/mha, the KServe v2 infer route) starts an api__req, parses its
 * JSON into it, reserves memory through the request's lease before allocating, allocates its
 * buffers through it, checks the deadline and the cancel flag between stages, and ends with
 * api__req_free, which frees the tree and the buffers and gives back what they held whatever
 * happened on the way. The operations (sdpa.c, layer.c) decode their inputs through it.
 */
#include <stdlib.h>
#include <string.h>

#include "api/core/memory.h"
#include "api/ops/request.h"

void api__req_init(api__req *rq, const api_call *call)
{
    memset(rq, 0, sizeof *rq);
    rq->call = call;
    rq->limits = call->limits ? *call->limits : api_limits_default();
    /* Sizes are element counts times at most 16 bytes: keep them far from overflow whatever
     * the flag says (2^59 elements is beyond any machine anyway). */
    if (rq->limits.max_elements > SIZE_MAX / 32)
        rq->limits.max_elements = SIZE_MAX / 32;
    rq->call_ns = eng_now_ns();
    rq->lease = call->lease;
    if (!rq->lease) {
        rq->lease = &rq->own_lease;
        api_lease_start(rq->lease, NULL, rq->call_ns, 0);
    }
    api_lease_shorten(rq->lease, rq->limits.max_timeout_ms);
}

void api__req_free(api__req *rq)
{
    api__body_free(&rq->body);
    for (size_t i = 0; i < rq->n_owned; i++)
        eng_buf_free(rq->owned[i]);
    rq->n_owned = 0;
    api_lease_give_back(rq->lease, rq->parse_held + rq->run_held);
    rq->parse_held = rq->run_held = 0;
    if (rq->lease == &rq->own_lease)
        api_lease_end(rq->lease);
}

static double mib(size_t bytes)
{
    return (double)bytes / (1024.0 * 1024.0);
}

int api__req_reserve(api__req *rq, size_t bytes, bool parse, const char *what, api__error *err)
{
    switch (api_lease_reserve(rq->lease, bytes)) {
    case API_BUDGET_OK:
        if (parse)
            rq->parse_held += bytes;
        else
            rq->run_held += bytes;
        return 0;
    case API_BUDGET_NEVER: {
        size_t total = api_budget_total(rq->lease->budget), held = rq->lease->held;
        return api__error_set(err, API_STATUS_TOO_LARGE, API_REASON_MEMORY, NULL,
                              "the request needs about %.1f MiB (%s), more than the %.1f MiB "
                              "that --max-memory-bytes allows",
                              mib(held > SIZE_MAX - bytes ? SIZE_MAX : held + bytes), what,
                              mib(total));
    }
    case API_BUDGET_NOT_NOW:
        break;
    }
    return api__error_set(err, API_STATUS_OVERLOADED, API_REASON_MEMORY, NULL,
                          "the memory budget (--max-memory-bytes) is in use by other "
                          "requests; retry shortly");
}

int api__req_reserve_run(api__req *rq, bool sized, size_t tensors, size_t text, size_t scratch,
                         api__error *err)
{
    size_t need = tensors;
    sized = sized && api__size_add(&need, text) && api__size_add(&need, scratch);
    char what[160];
    snprintf(what, sizeof what, "%.1f MiB of tensors, %.1f MiB of reply, %.1f MiB of scratch",
             mib(tensors), mib(text), mib(scratch));
    if (api__req_reserve(rq, sized ? need : SIZE_MAX, false, what, err) != 0)
        return -1;
    rq->run_held -= text; /* the reply's share stays with the lease until the reply is sent */
    rq->text_held = text;
    return 0;
}

void api__req_keep_text(api__req *rq, size_t len)
{
    if (len < rq->text_held) {
        api_lease_give_back(rq->lease, rq->text_held - len);
        rq->text_held = len;
    }
}

int api__req_check_body_size(const api__req *rq, api__error *err)
{
    size_t len = rq->call->body_len, max = rq->limits.max_body_bytes;
    if (len > max)
        return api__error_set(err, API_STATUS_TOO_LARGE, API_REASON_TOO_LARGE, NULL,
                              "the body has %zu bytes, more than the %zu that --max-body-bytes "
                              "allows",
                              len, max);
    return 0;
}

int api__req_parse(api__req *rq, const char *json, size_t len, api__error *err)
{
    /* The tree's memory is reserved before jansson allocates it. */
    int64_t t0 = eng_now_ns();
    api__body_scan scan;
    api__body_scan_run(json, len, &scan);
    if (api__req_reserve(rq, scan.parse_bytes, true, "to parse the body", err) != 0) {
        api__body_scan_free(&scan);
        return -1;
    }
    int rc = api__body_parse(&rq->body, json, len, &scan, err);
    rq->parse_ns += eng_now_ns() - t0;
    return rc;
}

void api__req_parse_done(api__req *rq)
{
    api__body_free(&rq->body);
    api_lease_give_back(rq->lease, rq->parse_held);
    rq->parse_held = 0;
}

void *api__req_alloc(api__req *rq, size_t bytes, api__error *err)
{
    void *p;
    if (rq->n_owned == API_REQ_MAX_OWNED) {
        api__error_set(err, API_STATUS_INTERNAL, API_REASON_INTERNAL, NULL,
                       "too many buffers for one request");
        return NULL;
    }
    p = eng_buf_alloc(bytes); /* big ones reuse the pages of an earlier request */
    if (!p) {
        api__error_set(err, API_STATUS_UNAVAILABLE, API_REASON_MEMORY, NULL,
                       "out of memory for a buffer of %zu bytes", bytes);
        return NULL;
    }
    rq->owned[rq->n_owned++] = p;
    return p;
}

bool api__input_bytes(const api__input *in, size_t n, size_t *bytes)
{
    bool ok = true;
    for (size_t i = 0; i < n; i++) {
        if (!in[i].present || in[i].t->count == 0 || api__tensor_in_place(in[i].t, in[i].elem))
            continue;
        ok = ok &&
             api__size_add(bytes, api__aligned_size(in[i].t->count * api__elem_size(in[i].elem)));
    }
    return ok;
}

int api__req_decode_input(api__req *rq, const api__input *in, api__error *err)
{
    const api__tensor *t = in->t;
    if (api__tensor_in_place(t, in->elem)) {
        /* Used where it lies (the engine only reads its inputs): checked, not copied. */
        void *raw = (void *)(uintptr_t)t->raw;
        if (api__tensor_decode(&rq->body, t, in->elem, in->flags, raw, in->field, rq->call->pool,
                               err) != 0)
            return -1;
        *in->dst = raw;
        return 0;
    }
    *in->dst = api__req_alloc(rq, t->count * api__elem_size(in->elem), err);
    if (!*in->dst)
        return -1;
    return api__tensor_decode(&rq->body, t, in->elem, in->flags, *in->dst, in->field,
                              rq->call->pool, err);
}

bool api__req_output_bytes(size_t count, size_t *bytes)
{
    return api__size_add(bytes, api__aligned_size(count * sizeof(float)));
}

int api__req_alloc_output(api__req *rq, float **out, size_t count, api__error *err)
{
    if (*out)
        return 0; /* placed by the route */
    *out = api__req_alloc(rq, count * sizeof(float), err);
    return *out ? 0 : -1;
}

int api__req_check_ctl(api__req *rq, api__error *err)
{
    switch (eng_ctl_check(&rq->lease->ctl)) {
    case ENG_OK:
        return 0;
    case ENG_ECANCELLED:
        return api__error_set(err, API_STATUS_CANCELLED, API_REASON_CANCELLED, NULL,
                              "the request was cancelled");
    default:
        return api__error_set(
            err, API_STATUS_DEADLINE_EXCEEDED, API_REASON_DEADLINE, NULL,
            "the request did not finish within its deadline of %lld ms "
            "(--request-timeout-ms, or timeout_ms)",
            (long long)((rq->lease->ctl.deadline_ns - rq->lease->start_ns) / 1000000));
    }
}

void api__req_set_deadline(api__req *rq, int64_t timeout_ms)
{
    api_lease_shorten(rq->lease, timeout_ms);
}

int api__req_engine_error(api__req *rq, eng_status st, const eng_error *e, const char *field,
                          api__error *err)
{
    /* The engine stopped at the control block: say which limit, when it still says so. */
    if ((st == ENG_ECANCELLED || st == ENG_EDEADLINE) && api__req_check_ctl(rq, err) != 0)
        return -1;
    return api__error_engine(err, st, e, field, API_ENGINE_INPUT_SERVER);
}
