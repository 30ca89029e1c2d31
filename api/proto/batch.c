/*
 * batch.c - requests that run together: the key the server groups waiting requests by (the
 * layer they run, of which model), and the driver that serves a group with one engine call per
 * layer (serve.c's batch steps).
 */
#include <stdlib.h>

#include "api/ops/sessions.h"
#include "api/proto/serve.h"
#include "api/wire/content_coding.h"

uint64_t api_batch_key(api_batch_route route, const api_call *call, const api_peek *peek)
{
    char model[sizeof peek->model];
    const char *name = NULL;
    if (route == API_BATCH_V2_INFER || route == API_BATCH_GRPC_INFER ||
        route == API_BATCH_GRPC_STREAM) {
        name = call->model;
    } else if (route == API_BATCH_MHA && peek->model[0]) {
        name = peek->model;
    } else if (route == API_BATCH_MHA && peek->session[0] && call->sessions) {
        api__session_model(call->sessions, peek->session, model, sizeof model);
        name = model;
    }
    const api_model *m = name && call->models ? api_models_find(call->models, name) : NULL;
    if (!m || peek->layer < 0 || peek->layer >= m->layers)
        return 0;
    return (uint64_t)(uintptr_t)m->layer[peek->layer];
}

static const api__batchable *batchable(api_batch_route route)
{
    switch (route) {
    case API_BATCH_V2_INFER:
        return &api__v2_infer_batchable;
    case API_BATCH_GRPC_INFER:
        return &api__grpc_infer_batchable;
    case API_BATCH_GRPC_STREAM:
        return &api__grpc_stream_batchable;
    case API_BATCH_MHA:
    case API_BATCH_NONE:
        break;
    }
    return &api__mha_batchable;
}

/* Serves members[0..n) with api__serve_batch (in[] is room for n of its members). */
static void serve_members(const api_batch_member *members, int n, api__serve_member *in,
                          int64_t max_rows)
{
    int k = 0;
    for (int i = 0; i < n; i++) {
        const api_batch_member *m = &members[i];
        const api__batchable *bi = batchable(m->route);
        bool answered = false;
        /* A compressed body is inflated by api_call_encoded, alone. */
        if (bi->whole && api__coding_parse(m->call->content_encoding) != API_CODING_IDENTITY) {
            api_call_encoded(bi->whole, bi->route->style, m->call, m->reply);
            continue;
        }
        void *job = bi->job_new(m->call, m->reply, &answered);
        if (answered)
            continue;
        in[k++] = (api__serve_member){bi->route, job, m->call, m->reply}; /* NULL job: 503 */
    }
    if (k > 0)
        api__serve_batch(in, k, max_rows);
    for (int i = 0, j = 0; i < n && j < k; i++) { /* in[] holds members in their order */
        if (in[j].call != members[i].call)
            continue;
        const api__batchable *bi = batchable(members[i].route);
        api__reply_compress(in[j].call, in[j].route->style, in[j].reply);
        if (bi->finish)
            bi->finish(in[j].reply);
        free(in[j++].job);
    }
}

void api_call_batch(const api_batch_member *members, int n, int64_t max_rows)
{
    api__serve_member *in = calloc((size_t)n, sizeof *in);
    if (in) {
        serve_members(members, n, in, max_rows);
    } else {
        api__serve_member one; /* no memory for the batch: one at a time */
        for (int i = 0; i < n; i++)
            serve_members(&members[i], 1, &one, max_rows);
    }
    free(in);
}
