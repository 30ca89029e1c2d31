/*
 * request.c - what every route of api/ holds for one request, and frees on every path.
 *
 * A route (POST /v1/attention, /v1/mha, the KServe v2 infer route) starts an api_req, parses its
 * JSON into it, reserves memory in the shared budget before allocating, allocates its buffers
 * through it, checks the deadline and the cancel flag between stages, and ends with
 * api_req_free, which frees the tree and the buffers and returns every reserved byte whatever
 * happened on the way.
 *
 * The native JSON routes run the same stages in the same order and differ only in their steps
 * (their fields, their engine call, their reply), so api_req_serve runs the stages once for
 * both: a status, a message or a timing never differs between them by accident.
 */
#include <stdlib.h>
#include <string.h>

#include "api/internal.h"

void api_req_init(api_req *rq, const api_call *call)
{
    memset(rq, 0, sizeof *rq);
    rq->call = call;
    rq->limits = call->limits ? *call->limits : api_limits_default();
    /* Sizes are element counts times at most 16 bytes: keep them far from overflow whatever
     * the flag says (2^59 elements is beyond any machine anyway). */
    if (rq->limits.max_elements > SIZE_MAX / 32)
        rq->limits.max_elements = SIZE_MAX / 32;
    rq->ctl = call->ctl ? call->ctl : &rq->own_ctl;
    rq->call_ns = eng_now_ns();
    rq->start_ns = call->start_ns ? call->start_ns : rq->call_ns;
    api_req_set_deadline(rq, 0); /* the cap for now; the request's timeout once it is parsed */
}

void api_req_free(api_req *rq)
{
    api_body_free(&rq->body);
    for (size_t i = 0; i < rq->n_owned; i++)
        eng_buf_free(rq->owned[i]);
    rq->n_owned = 0;
    if (rq->call->budget && rq->parse_reserved + rq->reserved > 0)
        api_budget_release(rq->call->budget, rq->parse_reserved + rq->reserved);
    rq->parse_reserved = rq->reserved = 0;
}

static double mib(size_t bytes)
{
    return (double)bytes / (1024.0 * 1024.0);
}

int api_req_reserve(api_req *rq, size_t bytes, bool parse, const char *what, api_error *err)
{
    api_budget *budget = rq->call->budget;
    if (!budget)
        return 0;
    size_t total = api_budget_total(budget);
    size_t holding = rq->parse_reserved + rq->reserved;
    holding =
        holding > SIZE_MAX - rq->call->budget_held ? SIZE_MAX : holding + rq->call->budget_held;
    if (bytes > total || holding > total - bytes)
        return api_error_set(err, API_STATUS_TOO_LARGE, API_REASON_MEMORY, NULL,
                             "the request needs about %.1f MiB (%s), more than the %.1f MiB "
                             "that --max-memory-bytes allows",
                             mib(holding > SIZE_MAX - bytes ? SIZE_MAX : holding + bytes), what,
                             mib(total));
    switch (api_budget_reserve(budget, bytes)) {
    case API_BUDGET_OK:
        if (parse)
            rq->parse_reserved += bytes;
        else
            rq->reserved += bytes;
        return 0;
    case API_BUDGET_NEVER:
        break;
    case API_BUDGET_NOT_NOW:
        return api_error_set(err, API_STATUS_OVERLOADED, API_REASON_MEMORY, NULL,
                             "the memory budget (--max-memory-bytes) is in use by other "
                             "requests; retry shortly");
    }
    return api_error_set(err, API_STATUS_INTERNAL, API_REASON_INTERNAL, NULL,
                         "memory budget inconsistent");
}

int api_req_reserve_run(api_req *rq, bool sized, size_t tensors, size_t text, size_t scratch,
                        api_error *err)
{
    size_t need = tensors;
    sized = sized && !__builtin_add_overflow(need, text, &need) &&
            !__builtin_add_overflow(need, scratch, &need);
    char what[160];
    snprintf(what, sizeof what, "%.1f MiB of tensors, %.1f MiB of reply, %.1f MiB of scratch",
             mib(tensors), mib(text), mib(scratch));
    return api_req_reserve(rq, sized ? need : SIZE_MAX, false, what, err);
}

void api_reply_json(api_reply *reply, api_jsonw *w, api_error_style style)
{
    if (w->state != API_JSONW_OK) {
        api_error err = {0};
        api_error_set(&err, API_STATUS_UNAVAILABLE, API_REASON_MEMORY, NULL,
                      "out of memory for the reply");
        api_reply_from_error(reply, style, &err);
        api_jsonw_free(w);
        return;
    }
    reply->status = api_status_http(style, API_STATUS_OK);
    reply->content_type = "application/json";
    reply->reason = API_REASON_NONE;
    reply->body = w->data;
    reply->body_len = w->len;
    w->data = NULL;
}

/* The stages of api_req_serve up to a 200 reply; -1 with `err` filled at the first that fails. */
static int serve_stages(const api_req_steps *steps, void *job, api_req *rq, api_jsonw *w,
                        api_reply *reply, api_error *err)
{
    const api_call *call = rq->call;

    if (api_req_check_ctl(rq, err) != 0 || api_field_json_body(rq, err) != 0)
        return -1;
    if (api_req_parse(rq, call->body ? call->body : "", call->body_len, err) != 0 ||
        steps->parse(job, err) != 0)
        return -1;

    /* Size everything, reserve it, then allocate and decode. */
    size_t tensors = 0, scratch = 0, text = 0;
    bool sized = steps->size(job, &tensors, &scratch, &text);
    if (api_req_reserve_run(rq, sized, tensors, text, scratch, err) != 0)
        return -1;
    api_jsonw_init(w, text);

    if (steps->decode(job, err) != 0)
        return -1;
    reply->decode_ns = eng_now_ns() - rq->call_ns;
    if (steps->compute(job, &reply->compute_ns, err) != 0)
        return -1;
    int64_t t_computed = eng_now_ns();
    if (steps->encode(job, w, reply->decode_ns, reply->compute_ns, err) != 0)
        return -1;
    api_reply_json(reply, w, API_ERRORS_NATIVE);
    reply->encode_ns = eng_now_ns() - t_computed;
    if (steps->inferences)
        reply->inferences = steps->inferences(job);
    return 0;
}

void api_req_serve(const api_req_steps *steps, void *job, const api_call *call, api_reply *reply)
{
    api_req *rq = job; /* its first member */
    api_error err;
    api_jsonw w;
    memset(&err, 0, sizeof err);
    memset(reply, 0, sizeof *reply);
    if (!job) {
        api_error_set(&err, API_STATUS_UNAVAILABLE, API_REASON_MEMORY, NULL, "out of memory");
        api_reply_from_error(reply, API_ERRORS_NATIVE, &err);
        return;
    }
    api_req_init(rq, call);
    api_jsonw_init(&w, 0);

    if (serve_stages(steps, job, rq, &w, reply, &err) != 0) {
        api_reply_from_error(reply, API_ERRORS_NATIVE, &err);
        if (reply->decode_ns == 0)
            reply->decode_ns = eng_now_ns() - rq->call_ns;
    }
    api_jsonw_free(&w);
    if (steps->free)
        steps->free(job);
    api_req_free(rq);
}

int api_req_parse(api_req *rq, const char *json, size_t len, api_error *err)
{
    /* The tree's memory is reserved before jansson allocates it. */
    api_body_scan scan;
    api_body_scan_run(json, len, &scan);
    if (api_req_reserve(rq, scan.parse_bytes, true, "to parse the body", err) != 0) {
        api_body_scan_free(&scan);
        return -1;
    }
    return api_body_parse(&rq->body, json, len, &scan, err);
}

void api_req_parse_done(api_req *rq)
{
    api_body_free(&rq->body);
    if (rq->call->budget && rq->parse_reserved) {
        api_budget_release(rq->call->budget, rq->parse_reserved);
        rq->parse_reserved = 0;
    }
}

void *api_req_alloc(api_req *rq, size_t bytes, api_error *err)
{
    void *p;
    if (rq->n_owned == API_REQ_MAX_OWNED) {
        api_error_set(err, API_STATUS_INTERNAL, API_REASON_INTERNAL, NULL,
                      "too many buffers for one request");
        return NULL;
    }
    p = eng_buf_alloc(bytes); /* big ones reuse the pages of an earlier request */
    if (!p) {
        api_error_set(err, API_STATUS_UNAVAILABLE, API_REASON_MEMORY, NULL,
                      "out of memory for a buffer of %zu bytes", bytes);
        return NULL;
    }
    rq->owned[rq->n_owned++] = p;
    return p;
}

/* Bytes of one decoded element. */
static size_t elem_size(api_elem elem)
{
    return elem == API_ELEM_BOOL ? 1 : elem == API_ELEM_INT64 ? 8 : 4;
}

bool api_input_bytes(const api_input *in, size_t n, size_t *bytes)
{
    bool ok = true;
    for (size_t i = 0; i < n; i++) {
        if (!in[i].present || in[i].t->count == 0 || api_tensor_in_place(in[i].t, in[i].elem))
            continue;
        ok = ok && !__builtin_add_overflow(
                       *bytes, api_aligned_size(in[i].t->count * elem_size(in[i].elem)), bytes);
    }
    return ok;
}

int api_req_decode_input(api_req *rq, const api_input *in, api_error *err)
{
    const api_tensor *t = in->t;
    if (api_tensor_in_place(t, in->elem)) {
        /* Used where it lies (the engine only reads its inputs): checked, not copied. */
        if (api_tensor_convert(t->raw, t->dtype, t->count, 0, in->elem, in->flags,
                               (void *)(uintptr_t)t->raw, in->field, err) != 0)
            return -1;
        *in->dst = (void *)(uintptr_t)t->raw;
        return 0;
    }
    *in->dst = api_req_alloc(rq, t->count * elem_size(in->elem), err);
    if (!*in->dst)
        return -1;
    return api_tensor_decode(&rq->body, t, in->elem, in->flags, *in->dst, in->field, rq->call->pool,
                             err);
}

int api_req_alloc_output(api_req *rq, float **out, size_t count, api_error *err)
{
    if (*out)
        return 0; /* placed by the route */
    *out = api_req_alloc(rq, count * 4, err);
    return *out ? 0 : -1;
}

int api_req_check_ctl(api_req *rq, api_error *err)
{
    switch (eng_ctl_check(rq->ctl)) {
    case ENG_OK:
        return 0;
    case ENG_ECANCELLED:
        return api_error_set(err, API_STATUS_CANCELLED, API_REASON_CANCELLED, NULL,
                             "the request was cancelled");
    default:
        return api_error_set(err, API_STATUS_DEADLINE_EXCEEDED, API_REASON_DEADLINE, NULL,
                             "the request did not finish within its deadline of %lld ms "
                             "(--request-timeout-ms, or timeout_ms)",
                             (long long)((rq->ctl->deadline_ns - rq->start_ns) / 1000000));
    }
}

void api_req_set_deadline(api_req *rq, int64_t timeout_ms)
{
    int64_t cap = rq->limits.max_timeout_ms, t = timeout_ms;
    if (cap > 0 && (t == 0 || t > cap))
        t = cap;
    if (t > 0)
        rq->ctl->deadline_ns = rq->start_ns + t * 1000000;
}

int api_req_engine_error(api_req *rq, eng_status st, const eng_error *e, const char *field,
                         api_error *err)
{
    switch (st) {
    case ENG_OK:
        return 0;
    case ENG_EINVAL:
        return api_error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, field, "%s",
                             e->message);
    case ENG_ENONFINITE:
        return api_error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST,
                             field ? field : "output",
                             "%s (inputs too large for float32 arithmetic?)", e->message);
    case ENG_ETOOBIG:
        return api_error_set(err, API_STATUS_TOO_LARGE, API_REASON_TOO_LARGE, field, "%s",
                             e->message);
    case ENG_ENOMEM:
        return api_error_set(err, API_STATUS_UNAVAILABLE, API_REASON_MEMORY, NULL,
                             "out of memory: %s", e->message);
    case ENG_ECANCELLED:
    case ENG_EDEADLINE:
        if (api_req_check_ctl(rq, err) != 0)
            return -1;
        /* The engine saw what eng_ctl_check no longer does: trust the engine. */
        return st == ENG_ECANCELLED
                   ? api_error_set(err, API_STATUS_CANCELLED, API_REASON_CANCELLED, NULL,
                                   "the request was cancelled")
                   : api_error_set(err, API_STATUS_DEADLINE_EXCEEDED, API_REASON_DEADLINE, NULL,
                                   "the request did not finish within its deadline");
    case ENG_EIO:
    case ENG_EFORMAT:
        break;
    }
    return api_error_set(err, API_STATUS_INTERNAL, API_REASON_INTERNAL, field, "engine: %s: %s",
                         eng_status_str(st), e->message);
}

/* Edit distance: names are short, so the quadratic table is fine. */
static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b), row[40];
    if (la >= 40 || lb >= 40)
        return SIZE_MAX;
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

const char *api_closest_name(const char *key, const char *const *names, size_t n)
{
    const char *best = NULL;
    size_t best_d = 3; /* suggest only close names */
    for (size_t i = 0; i < n; i++) {
        size_t d = edit_distance(key, names[i]);
        if (d < best_d) {
            best_d = d;
            best = names[i];
        }
    }
    return best;
}
