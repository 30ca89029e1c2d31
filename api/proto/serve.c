/*
 * serve.c - the one request driver: the steps of every inference route, native or KServe v2,
 * so that a status, a message, a reservation or a timing never differs between them by
 * accident.
 */
#include <string.h>

#include "api/proto/serve.h"
#include "api/wire/reply.h"

/* The steps of api__serve up to a filled reply; -1 with `err` filled at the first that fails. */
static int serve_steps(const api__steps *steps, void *job, api__req *rq, api_buf *w,
                       api_reply *reply, api__error *err)
{
    if ((steps->read && steps->read(job, err) != 0) || steps->check(job, err) != 0)
        return -1;

    /* Size everything, reserve it, then allocate and decode. */
    api__sizes sz = {0, 0, 0};
    bool sized = steps->size(job, &sz);
    if (api__req_reserve_run(rq, sized, sz.tensors, sz.text, sz.scratch, err) != 0)
        return -1;
    api_buf_init(w, sz.text);

    if ((steps->place && steps->place(job, w, err) != 0) || steps->decode(job, err) != 0)
        return -1;
    reply->decode_ns = eng_now_ns() - rq->call_ns;
    if (steps->run(job, &reply->compute_ns, err) != 0)
        return -1;
    int64_t t_computed = eng_now_ns();
    if (steps->encode(job, w, reply, err) != 0)
        return -1;
    reply->encode_ns = eng_now_ns() - t_computed;
    if (steps->batch)
        reply->inferences = steps->batch(job);
    return 0;
}

void api__serve(const api__route *route, void *job, const api_call *call, api_reply *reply)
{
    api__req *rq = job; /* its first member */
    api__error err;
    api_buf w;
    memset(&err, 0, sizeof err);
    memset(reply, 0, sizeof *reply);
    if (!job) {
        api__error_set(&err, API_STATUS_UNAVAILABLE, API_REASON_MEMORY, NULL, "out of memory");
        api__reply_from_error(reply, route->style, &err);
        return;
    }
    api__req_init(rq, call);
    api_buf_init(&w, 0);

    if (serve_steps(&route->steps, job, rq, &w, reply, &err) != 0) {
        api__reply_from_error(reply, route->style, &err);
        if (reply->decode_ns == 0)
            reply->decode_ns = eng_now_ns() - rq->call_ns;
        api__req_keep_text(rq, 0);
    } else {
        api__req_keep_text(rq, reply->body_len);
    }
    api_buf_free(&w);
    if (route->steps.free)
        route->steps.free(job);
    api__req_free(rq);
}
