/*
 * v2_sequence.c - Triton's sequence batcher on attnd's v2 models: a request with sequence_id
 * (and sequence_start / sequence_end) is a step of its sequence's KV-cache session
 * (api/ops/sessions.h), named "<model>/<sequence_id>". Each kind of model (v2.h's v2_kind)
 * turns its request into a step its own way: model sdpa appends key and value and attends the
 * query (api__session_step_op), a layer model steps the layer the request names over that
 * layer's cache (layer.c with r.session). v2_infer.c calls the kind's hook with sessions on;
 * with them off the model has no sequence batcher (its configuration says so) and, as Triton
 * does then, the flags are ignored.
 *
 * A sequence of a model of several layers is one session holding every layer's cache, whatever
 * layer each request names: sequence_start (on the sequence's first request, the first layer of
 * its first token) makes them all, and sequence_end ends the sequence after its own request
 * (the last layer of the last token).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/proto/v2.h"

/* A tensor of one sequence with its batch axis of 1 dropped: rank 4 [1, H, n, D] becomes the
 * session's rank 3 [H, n, D], rank 3 [1, n, E] its rank 2 [n, E]. */
static int drop_batch(api__tensor *t, const char *name, api__error *err)
{
    if (t->rank == 2)
        return 0;
    if (t->rank < 2 || t->shape[0] != 1)
        return api__error_invalid(err, name,
                                  "a sequence is one sequence: %s must have a batch of 1 "
                                  "([1, H, n, D] or [1, n, E]) or none ([n, E])",
                                  name);
    memmove(t->shape, t->shape + 1, sizeof t->shape - sizeof t->shape[0]);
    t->rank--;
    return 0;
}

/* The session of the request's sequence, named "<model>/<sequence_id>", into job->session:
 * sequence_start ends one the name already has and wants a new one (*create: the caller makes
 * it); any other request needs the session its start made (400 in Triton's words). */
static int sequence_find(v2_job *job, char *name, size_t name_len, bool *create, api__error *err)
{
    api_sessions *reg = job->rq.call->sessions;
    snprintf(name, name_len, "%s/%s", job->model.name, job->seq_id);
    bool found = api__sessions_find_name(reg, name, job->session);
    if (found && job->seq_start) {
        api__sessions_end(reg, job->session);
        found = false;
    }
    if (!found && !job->seq_start)
        return api__error_invalid(err, "parameters.sequence_id",
                                  "inference request for sequence %s to model '%s' must "
                                  "specify the START flag on the first request of the sequence",
                                  job->seq_id, job->model.name);
    *create = !found;
    return 0;
}

/* Registers a new session of `layers` caches of `shape` as the sequence `name`, into
 * job->session; `model` names the model they are the caches of, or is NULL. A cache that cannot
 * be made is the engine's error, naming `field`. */
static int sequence_add(v2_job *job, const eng_kv_shape *shape, int64_t layers, int64_t heads,
                        const char *name, const char *model, const char *field, api__error *err)
{
    api_sessions *reg = job->rq.call->sessions;
    api__session_opts opts = {0};
    api__session *s;
    eng_error e;
    memset(&e, 0, sizeof e);
    eng_kv_seq **seqs = api__session_caches_new(reg, shape, layers, &e);
    if (!seqs)
        return api__req_engine_error(&job->rq, e.status, &e, field, err);
    int rc =
        api__sessions_add(reg, seqs, layers, heads, &opts, api__sessions_default_ttl(reg), &s, err);
    free(seqs);
    if (rc != 0)
        return -1;
    api__session_set_name(reg, s, name);
    if (model)
        api__session_set_model(reg, s, model, NULL);
    memcpy(job->session, s->id, sizeof job->session);
    api__session_release(reg, s);
    return 0;
}

/* A layer model's sequence: start makes a session with a cache for each of the model's layers,
 * of their kv heads and head size, and every request is a decoder-layer step of the cache of
 * the layer it names (layer.c with r.session: the input tokens' keys and values appended, the
 * queries attending over that whole cache). */
int api__v2_layer_sequence(v2_job *job, api__error *err)
{
    const api_model *m = job->model.model;
    const eng_layer *l = m->layer[0];
    char name[160];
    bool create;
    /* Refused before a session is made for nothing. */
    for (int64_t i = 0; i < m->layers; i++)
        if (api__layer_cache_check(m->layer[i], "parameters.sequence_id", err) != 0)
            return -1;
    if (sequence_find(job, name, sizeof name, &create, err) != 0)
        return -1;
    if (create) {
        int64_t D = eng_layer_head_dim(l);
        eng_kv_shape shape = {.num_kv_heads = l->num_kv_heads, .head_dim = D, .value_head_dim = D};
        if (sequence_add(job, &shape, m->layers, l->num_heads, name, m->name, "input", err) != 0)
            return -1;
    }
    job->l.r.session = job->session;
    return 0;
}

/* Model sdpa's sequence: start makes a session with the shape of the request's tensors (ending
 * one the id already names); every request then appends key and value and attends the query
 * (bottom-right causal unless "causal" says otherwise); sequence_end frees the session after
 * the step (v2_infer.c free_job). Steps get here in arrival order, a START too: the server gave
 * each a ticket of its sequence as it admitted it (api_sequence_ticket_take, keyed
 * "<model>/<sequence_id>" like the session's name, which keeps the session from eviction while
 * steps wait). */
int api__v2_sdpa_sequence(v2_job *job, api__error *err)
{
    api_sessions *reg = job->rq.call->sessions;
    api__sdpa_req *r = &job->s.r;
    char name[160];
    bool create;
    if (!r->q.present || !r->k.present || !r->v.present)
        return api__error_invalid(err, "inputs", "a step of a sequence takes query, key and value");
    if (r->mask.present || r->kpm.present || r->kvlen.present)
        return api__error_invalid(err, "inputs", "a step of a sequence takes no masks");
    bool batch = r->q.rank >= 3;
    if (drop_batch(&r->q, "query", err) != 0 || drop_batch(&r->k, "key", err) != 0 ||
        drop_batch(&r->v, "value", err) != 0)
        return -1;
    if (sequence_find(job, name, sizeof name, &create, err) != 0)
        return -1;
    if (create) {
        int64_t H, Hkv, D, Dv;
        if (r->q.rank == 3) { /* [H, n, D] */
            H = r->q.shape[0];
            D = r->q.shape[2];
            Hkv = r->k.shape[0];
            Dv = r->v.shape[2];
        } else {
            H = r->num_heads ? r->num_heads : 1;
            Hkv = r->num_kv_heads ? r->num_kv_heads : H;
            if (r->q.shape[1] % H || r->k.shape[1] % Hkv || r->v.shape[1] % Hkv)
                return api__error_invalid(err, "parameters.num_heads",
                                          "the widths of query, key and value must split "
                                          "into num_heads and num_kv_heads heads");
            D = r->q.shape[1] / H;
            Dv = r->v.shape[1] / Hkv;
        }
        if (H % Hkv)
            return api__error_invalid(err, "key",
                                      "%lld query heads cannot share %lld key/value heads",
                                      (long long)H, (long long)Hkv);
        eng_kv_shape shape = {.num_kv_heads = Hkv, .head_dim = D, .value_head_dim = Dv};
        if (sequence_add(job, &shape, 1, H, name, NULL, "key", err) != 0)
            return -1;
    }
    job->st.rq = &job->rq;
    job->st.reg = reg;
    job->st.id = job->session;
    job->st.r = *r;
    job->st.causal_set = r->causal != API_CAUSAL_UNSET; /* else bottom_right: decoding */
    job->st.batch_axis = batch;
    job->op = &api__session_step_op;
    job->op_state = &job->st;
    return 0;
}
