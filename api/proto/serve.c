/*
 * serve.c - the one request driver: the steps of every inference route, native or KServe v2,
 * so that a status, a message, a reservation or a timing never differs between them by
 * accident; and the same steps for a batch, whose runs that share a layer are one engine call.
 */
#include <stdlib.h>
#include <string.h>

#include "api/proto/serve.h"
#include "api/wire/reply.h"

/* One request on its way through the steps. */
typedef struct {
    const api__route *route;
    void *job; /* its first member is its api__req */
    api_reply *reply;
    api_buf w;
    api__error err;
    int rc; /* 0 while every step so far succeeded */
} serving;

static void serve_begin(serving *sv, const api__route *route, void *job, const api_call *call,
                        api_reply *reply)
{
    memset(sv, 0, sizeof *sv);
    memset(reply, 0, sizeof *reply);
    sv->route = route;
    sv->job = job;
    sv->reply = reply;
    api_buf_init(&sv->w, 0);
    if (!job) {
        api__error_set(&sv->err, API_STATUS_UNAVAILABLE, API_REASON_MEMORY, NULL, "out of memory");
        sv->rc = -1;
        return;
    }
    api__req_init(job, call);
}

/* The steps before the run: read, check; the sizes from size reserved at once before anything
 * is allocated; place; decode. */
static void serve_prepare(serving *sv)
{
    const api__steps *steps = &sv->route->steps;
    api__req *rq = sv->job;
    if (sv->rc != 0)
        return;
    sv->rc = -1;
    if ((steps->read && steps->read(sv->job, &sv->err) != 0) ||
        steps->check(sv->job, &sv->err) != 0)
        return;
    api__sizes sz = {0, 0, 0};
    bool sized = steps->size(sv->job, &sz);
    if (api__req_reserve_run(rq, sized, sz.tensors, sz.text, sz.scratch, &sv->err) != 0)
        return;
    api_buf_init(&sv->w, sz.text);
    if ((steps->place && steps->place(sv->job, &sv->w, &sv->err) != 0) ||
        steps->decode(sv->job, &sv->err) != 0)
        return;
    sv->reply->decode_ns = eng_now_ns() - rq->call_ns;
    sv->reply->parse_ns = rq->parse_ns;
    sv->rc = 0;
}

static void serve_run(serving *sv)
{
    if (sv->rc == 0)
        sv->rc = sv->route->steps.run(sv->job, &sv->reply->compute_ns, &sv->err);
}

/* Encode and the batch count after a run; then the error reply of a step that failed, and
 * everything the request held freed (the job itself stays the caller's). */
static void serve_end(serving *sv)
{
    const api__steps *steps = &sv->route->steps;
    api_reply *reply = sv->reply;
    if (sv->rc == 0) {
        int64_t t_computed = eng_now_ns();
        sv->rc = steps->encode(sv->job, &sv->w, reply, &sv->err);
        reply->encode_ns = eng_now_ns() - t_computed;
        if (sv->rc == 0 && steps->batch)
            reply->inferences = steps->batch(sv->job);
    }
    if (sv->rc != 0) {
        api__reply_from_error(reply, sv->route->style, &sv->err);
        reply->encode_ns = 0;
        if (sv->job && reply->decode_ns == 0) {
            reply->decode_ns = eng_now_ns() - ((api__req *)sv->job)->call_ns;
            reply->parse_ns = ((api__req *)sv->job)->parse_ns;
        }
    }
    api_buf_free(&sv->w);
    if (!sv->job)
        return;
    api__req_keep_text(sv->job, sv->rc == 0 ? reply->body_len : 0);
    if (steps->free)
        steps->free(sv->job);
    api__req_free(sv->job);
}

void api__serve(const api__route *route, void *job, const api_call *call, api_reply *reply)
{
    serving sv;
    serve_begin(&sv, route, job, call, reply);
    serve_prepare(&sv);
    serve_run(&sv);
    serve_end(&sv);
}

/* ---- Batches ------------------------------------------------------------------------------ */

/* What members[i] may share an engine call by (its operation's batch_key), and its rows. */
static const void *batch_key(const serving *sv, const api__op **op, void **state, int64_t *rows)
{
    *op = NULL;
    *state = NULL;
    if (sv->rc != 0 || !sv->route->steps.operation)
        return NULL;
    *state = sv->route->steps.operation(sv->job, op);
    return (*op)->batch_key && (*op)->run_batch ? (*op)->batch_key(*state, rows) : NULL;
}

/* A batch's requests on their way, and the arrays one run_batch call takes. */
typedef struct {
    serving *sv;
    int n;
    int64_t max_rows;
    bool *ran;
    void **states;
    int *at; /* states[j] is sv[at[j]]'s */
    int *rc;
    int64_t *compute_ns;
    api__error *errs;
} batch;

static bool batch_alloc(batch *b, int n, int64_t max_rows)
{
    *b = (batch){.n = n, .max_rows = max_rows};
    b->sv = calloc((size_t)n, sizeof *b->sv);
    b->ran = calloc((size_t)n, sizeof *b->ran);
    b->states = calloc((size_t)n, sizeof *b->states);
    b->at = calloc((size_t)n, sizeof *b->at);
    b->rc = calloc((size_t)n, sizeof *b->rc);
    b->compute_ns = calloc((size_t)n, sizeof *b->compute_ns);
    b->errs = calloc((size_t)n, sizeof *b->errs);
    return b->sv && b->ran && b->states && b->at && b->rc && b->compute_ns && b->errs;
}

static void batch_free(batch *b)
{
    free(b->sv);
    free(b->ran);
    free(b->states);
    free(b->at);
    free(b->rc);
    free(b->compute_ns);
    free(b->errs);
}

/* One run_batch call over states[0..k), its results back into their requests. */
static void run_group(batch *b, const api__op *op, int k)
{
    op->run_batch(b->states, k, b->compute_ns, b->rc, b->errs);
    for (int j = 0; j < k; j++) {
        serving *sv = &b->sv[b->at[j]];
        sv->reply->compute_ns = b->compute_ns[j];
        sv->rc = b->rc[j];
        sv->err = b->errs[j];
    }
}

/* Runs the requests not run yet whose key is sv[first]'s, in order, as run_batch calls of at
 * most max_rows rows each (one request of more rows than that runs in a call of its own). */
static void run_alike(batch *b, int first)
{
    const api__op *op, *other = NULL;
    void *state;
    int64_t rows, total = 0;
    int k = 0;
    const void *key = batch_key(&b->sv[first], &op, &state, &rows);
    for (int i = first; i < b->n; i++) {
        if (b->ran[i] || batch_key(&b->sv[i], &other, &state, &rows) != key || other != op)
            continue;
        if (k > 0 && total + rows > b->max_rows) {
            run_group(b, op, k);
            k = 0;
            total = 0;
        }
        b->ran[i] = true;
        b->states[k] = state;
        b->at[k++] = i;
        total += rows;
    }
    if (k > 0)
        run_group(b, op, k);
}

void api__serve_batch(const api__serve_member *members, int n, int64_t max_rows)
{
    batch b;
    if (!batch_alloc(&b, n, max_rows)) {
        for (int i = 0; i < n; i++) /* one at a time needs no memory of the batch's */
            api__serve(members[i].route, members[i].job, members[i].call, members[i].reply);
        batch_free(&b);
        return;
    }
    for (int i = 0; i < n; i++) {
        serve_begin(&b.sv[i], members[i].route, members[i].job, members[i].call, members[i].reply);
        serve_prepare(&b.sv[i]);
    }
    for (int i = 0; i < n; i++) {
        const api__op *op;
        void *state;
        int64_t rows;
        if (b.ran[i])
            continue;
        if (batch_key(&b.sv[i], &op, &state, &rows))
            run_alike(&b, i);
        else
            serve_run(&b.sv[i]);
        b.ran[i] = true;
    }
    for (int i = 0; i < n; i++)
        serve_end(&b.sv[i]);
    batch_free(&b);
}
