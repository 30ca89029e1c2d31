/*
 * batch.c - requests that run together: the key the server groups waiting requests by, and
 * the driver that serves a group with one engine call per layer (serve.c's batch steps).
 */
#include <stdlib.h>
#include <string.h>

#include "api/ops/sessions.h"
#include "api/proto/serve.h"
#include "api/wire/content_coding.h"

uint64_t api_batch_key(api_batch_route route, const api_call *call, const api_peek *peek)
{
    char model[sizeof peek->model];
    const char *name = NULL;
    if (route == API_BATCH_V2_INFER) {
        name = call->model;
    } else if (route == API_BATCH_MHA && peek->model[0]) {
        name = peek->model;
    } else if (route == API_BATCH_MHA && peek->session[0] && call->sessions) {
        api__session_model(call->sessions, peek->session, model, sizeof model);
        name = model;
    }
    const eng_layer *layer = name && call->models ? api_models_find(call->models, name) : NULL;
    return (uint64_t)(uintptr_t)layer;
}

static const api__batchable *batchable(api_batch_route route)
{
    return route == API_BATCH_V2_INFER ? &api__v2_infer_batchable : &api__mha_batchable;
}

void api_call_batch(const api_batch_member *members, int n, int64_t max_rows)
{
    api__serve_member *in = calloc((size_t)n, sizeof *in);
    int k = 0;
    for (int i = 0; i < n; i++) {
        const api_batch_member *m = &members[i];
        const api__batchable *b = batchable(m->route);
        bool answered = false;
        /* A compressed body is inflated by api_call_encoded, alone; so is every member when
         * the batch's own memory cannot be had. */
        if (!in || api__coding_parse(m->call->content_encoding) != API_CODING_IDENTITY) {
            api_call_encoded(m->route == API_BATCH_V2_INFER ? api_v2_infer : api_mha,
                             b->route->style, m->call, m->reply);
            continue;
        }
        void *job = b->job_new(m->call, m->reply, &answered);
        if (!answered) /* a NULL job is answered 503 by api__serve_batch */
            in[k++] = (api__serve_member){b->route, job, m->call, m->reply};
    }
    if (k > 0)
        api__serve_batch(in, k, max_rows);
    for (int i = 0; i < k; i++) {
        api__reply_compress(in[i].call, in[i].route->style, in[i].reply);
        free(in[i].job);
    }
    free(in);
}
