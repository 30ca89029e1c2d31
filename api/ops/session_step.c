/*
 * session_step.c - the step operation of a KV-cache session (sessions.h api__session_step_op):
 * it checks a step's tensors against the session's shape, appends key and value to the
 * session's cache and attends over the whole of it, evicting idle sessions while the pool is
 * full.
 */
#include <stdlib.h>
#include <string.h>

#include "api/core/memory.h"
#include "api/ops/sessions.h"

/* Checks that tensor `t` (field `name`) is rank 2 [n, heads * d] or rank 3 [heads, n, d] and
 * sets *n. */
static int step_rows(const api__tensor *t, const char *name, int64_t heads, int64_t d,
                     const char *heads_name, int64_t *n, api__error *err)
{
    char shape[96];
    api__tensor_shape_str(t, shape, sizeof shape);
    if (t->rank == 2 && t->shape[1] == heads * d) {
        *n = t->shape[0];
        return 0;
    }
    if (t->rank == 3 && t->shape[0] == heads && t->shape[2] == d) {
        *n = t->shape[1];
        return 0;
    }
    return api__error_invalid(err, name,
                              "%s has shape %s; this session takes [n, %lld] (n tokens of %lld "
                              "%s of %lld) or [%lld, n, %lld]",
                              name, shape, (long long)(heads * d), (long long)heads, heads_name,
                              (long long)d, (long long)heads, (long long)d);
}

/* A [n, heads * d] (rank 2) or [heads, n, d] (rank 3) buffer as [1, heads, n, d]. */
static eng_view step_view(float *data, int rank, int64_t heads, int64_t n, int64_t d)
{
    if (rank == 3)
        return eng_view_contiguous(data, 1, heads, n, d);
    eng_view v = {data, {1, heads, n, d}, {n * heads * d, d, heads * d, 1}};
    return v;
}

static int step_shapes(api__session_step *st, api__error *err)
{
    api__sdpa_req *r = &st->r;
    const api__session *s = st->s;
    if (s->layers > 1)
        return api__error_invalid(err, "session",
                                  "session %s holds the caches of the %lld layers of model "
                                  "\"%s\": step it with POST /v1/mha and layer",
                                  s->id, (long long)s->layers, s->model);
    st->H = s->num_heads;
    st->Hkv = s->shape.num_kv_heads;
    st->D = s->shape.head_dim;
    st->Dv = s->shape.value_head_dim;
    if (r->num_heads && r->num_heads != st->H)
        return api__error_invalid(err, "num_heads", "num_heads is %lld but the session has %lld",
                                  (long long)r->num_heads, (long long)st->H);
    if (r->num_kv_heads && r->num_kv_heads != st->Hkv)
        return api__error_invalid(err, "num_kv_heads",
                                  "num_kv_heads is %lld but the session has %lld",
                                  (long long)r->num_kv_heads, (long long)st->Hkv);
    if (r->k.present != r->v.present)
        return api__error_invalid(err, r->k.present ? "value" : "key",
                                  "key and value are appended together: give both or neither");
    if (!r->q.present && !r->k.present)
        return api__error_invalid(err, "query",
                                  "a step needs a query (attend), key and value (append), or "
                                  "all three");
    int64_t nv = 0;
    if (r->k.present &&
        (step_rows(&r->k, "key", st->Hkv, st->D, "kv heads", &st->n_new, err) != 0 ||
         step_rows(&r->v, "value", st->Hkv, st->Dv, "kv heads", &nv, err) != 0))
        return -1;
    if (r->k.present && nv != st->n_new)
        return api__error_invalid(err, "value", "value has %lld tokens but key %lld", (long long)nv,
                                  (long long)st->n_new);
    if (r->q.present && step_rows(&r->q, "query", st->H, st->D, "heads", &st->n_q, err) != 0)
        return -1;
    int64_t length;
    if (api__session_check_append(s, 0, st->expect_set, st->expect_length, st->n_new, "key",
                                  &length, err) != 0)
        return -1;
    st->S = length + st->n_new;
    if (r->q.present && st->S == 0)
        return api__error_invalid(err, "query",
                                  "the session is empty: append key and value before attending");
    if (r->mask.present || r->kpm.present || r->kvlen.present || r->additive)
        return api__error_invalid(err, "attn_mask", "a session step takes no masks");
    return r->sinks.present ? api__sinks_check(&r->sinks, st->H, r->weights, err) : 0;
}

static int step_elements(api__session_step *st, api__error *err)
{
    const api__sdpa_req *r = &st->r;
    size_t max = st->rq->limits.max_elements, total = 0;
    bool ok = api__size_add(&total, r->q.count) && api__size_add(&total, r->k.count) &&
              api__size_add(&total, r->v.count);
    if (r->q.present) {
        size_t o = 0;
        ok = ok && !__builtin_mul_overflow((size_t)(st->H * st->n_q), (size_t)st->Dv, &o) &&
             api__size_add(&total, o);
        if (r->weights != ENG_WEIGHTS_NONE) {
            size_t heads = r->weights == ENG_WEIGHTS_PER_HEAD ? (size_t)st->H : 1;
            ok = ok && !__builtin_mul_overflow(heads * (size_t)st->n_q, (size_t)st->S, &o) &&
                 api__size_add(&total, o);
        }
        if (r->return_lse || r->sinks.present)
            ok = ok && api__size_add(&total, (size_t)(st->H * st->n_q));
    }
    if (!ok || total > max)
        return api__error_set(err, API_STATUS_TOO_LARGE, API_REASON_TOO_LARGE, NULL,
                              "the step has %s%zu input and output elements (weights included), "
                              "more than the %zu that --max-elements allows",
                              ok ? "" : "over ", total, max);
    return 0;
}

/* Puts a batch axis of 1 in front of `sh`. */
static void batch_axis(api__out_shape *sh)
{
    memmove(sh->shape + 1, sh->shape, sizeof sh->shape - sizeof sh->shape[0]);
    sh->shape[0] = 1;
    sh->rank++;
}

static void step_out_shapes(api__session_step *st)
{
    int64_t n = st->n_q, S = st->S, H = st->H;
    if (st->r.q.rank == 3)
        st->os = (api__out_shape){3, {H, n, st->Dv}, (size_t)(H * n * st->Dv)};
    else
        st->os = (api__out_shape){2, {n, H * st->Dv}, (size_t)(H * n * st->Dv)};
    if (st->r.weights == ENG_WEIGHTS_PER_HEAD)
        st->ws = (api__out_shape){3, {H, n, S}, (size_t)(H * n * S)};
    else
        st->ws = (api__out_shape){2, {n, S}, (size_t)(n * S)};
    st->ls = (api__out_shape){2, {H, n}, (size_t)(H * n)};
    if (st->batch_axis) {
        batch_axis(&st->os);
        batch_axis(&st->ws);
        batch_axis(&st->ls);
    }
}

/* The step's options over the session's: what the step sets wins. */
static void step_args(api__session_step *st)
{
    const api__sdpa_req *r = &st->r;
    const api__session_opts *o = &st->s->opts;
    eng_sdpa_args *a = &st->args;
    memset(a, 0, sizeof *a);
    a->q = step_view(st->q, r->q.rank, st->H, st->n_q, st->D);
    a->out = step_view(st->out, r->q.rank, st->H, st->n_q, st->Dv);
    a->scale_set = r->scale_set || o->scale_set;
    a->scale = r->scale_set ? r->scale : o->scale;
    a->softcap = r->softcap > 0 ? r->softcap : o->softcap;
    a->precision = r->precision_set   ? r->precision
                   : o->precision_set ? o->precision
                                      : st->rq->limits.default_precision;
    api__causal c = st->causal_set ? r->causal : o->causal_set ? o->causal : API_CAUSAL_ON;
    a->causal = c != API_CAUSAL_OFF;
    if (r->offset_set) {
        a->align = ENG_ALIGN_OFFSET;
        a->query_offset = r->query_offset;
    } else {
        a->align = c == API_CAUSAL_TOP_LEFT ? ENG_ALIGN_TOP_LEFT : ENG_ALIGN_BOTTOM_RIGHT;
    }
    const api__window *w = r->window.left_set || r->window.right_set ? &r->window : &o->window;
    a->window_left_set = w->left_set;
    a->window_left = w->left;
    a->window_right_set = w->right_set;
    a->window_right = w->right;
    a->alibi = r->alibi || o->alibi;
    a->weights_mode = r->weights;
    a->weights = st->weights;
    a->lse = st->lse;
}

static int step_check(void *op, api__error *err)
{
    api__session_step *st = op;
    if (api__session_acquire(st->reg, st->id, &st->s, err) != 0)
        return -1;
    if (step_shapes(st, err) != 0 || step_elements(st, err) != 0)
        return -1;
    api__req_set_deadline(st->rq, st->r.timeout_ms);
    if (st->r.q.present) {
        step_out_shapes(st);
        step_args(st);
    }
    return 0;
}

enum { STEP_INPUTS = 4 };

static void step_inputs(api__session_step *st, api__input in[STEP_INPUTS])
{
    api__sdpa_req *r = &st->r;
    const api__input defs[STEP_INPUTS] = {
        {&r->q, r->q.present, API_ELEM_FLOAT, 0, (void **)&st->q, "query"},
        {&r->k, r->k.present, API_ELEM_FLOAT, 0, (void **)&st->k, "key"},
        {&r->v, r->v.present, API_ELEM_FLOAT, 0, (void **)&st->v, "value"},
        {&r->sinks, r->sinks.present, API_ELEM_FLOAT, 0, (void **)&st->sinks, "sinks"},
    };
    memcpy(in, defs, sizeof defs);
}

/* The inputs and, for a step with queries, the log-sum-exp that sinks need when it is not an
 * output, and the scratch. */
static bool step_size(void *op, api__sizes *sz)
{
    api__session_step *st = op;
    api__input in[STEP_INPUTS];
    step_inputs(st, in);
    bool ok = api__input_bytes(in, STEP_INPUTS, &sz->tensors);
    if (!st->r.q.present)
        return ok;
    if (st->r.sinks.present && !st->r.return_lse)
        ok = ok && api__req_output_bytes(st->ls.count, &sz->tensors);
    return ok && api__size_add(&sz->scratch, eng_kv_attend_scratch_bytes(
                                                 st->s->cache[0].seq, &st->args, st->n_new,
                                                 eng_pool_threads(st->rq->call->pool)));
}

static int step_decode(void *op, api__error *err)
{
    api__session_step *st = op;
    api__input in[STEP_INPUTS];
    step_inputs(st, in);
    for (size_t i = 0; i < STEP_INPUTS; i++)
        if (in[i].present && api__req_decode_input(st->rq, &in[i], err) != 0)
            return -1;
    if (st->r.q.present && (api__req_alloc_output(st->rq, &st->out, st->os.count, err) != 0 ||
                            (st->r.weights != ENG_WEIGHTS_NONE &&
                             api__req_alloc_output(st->rq, &st->weights, st->ws.count, err) != 0) ||
                            ((st->r.return_lse || st->r.sinks.present) &&
                             api__req_alloc_output(st->rq, &st->lse, st->ls.count, err) != 0)))
        return -1;
    if (st->r.sinks.present && api__sinks_check_values(st->sinks, st->H, err) != 0)
        return -1;
    api__req_parse_done(st->rq);
    if (st->r.q.present) {
        st->args.q.data = st->q;
        st->args.out.data = st->out;
        st->args.weights = st->weights;
        st->args.lse = st->lse;
    }
    return 0;
}

/* The engine call of a step: append and attend. */
static eng_status step_engine(void *op, eng_error *e)
{
    api__session_step *st = op;
    api__req *rq = st->rq;
    eng_kv_rows kr, vr;
    if (st->r.k.present) {
        kr = eng_kv_rows_f32(step_view(st->k, st->r.k.rank, st->Hkv, st->n_new, st->D));
        vr = eng_kv_rows_f32(step_view(st->v, st->r.v.rank, st->Hkv, st->n_new, st->Dv));
    }
    return eng_kv_step(rq->call->pool, st->s->cache[0].seq, st->r.k.present ? &kr : NULL,
                       st->r.k.present ? &vr : NULL, st->r.q.present ? &st->args : NULL,
                       &rq->lease->ctl, e);
}

static int step_run(void *op, int64_t *compute_ns, api__error *err)
{
    api__session_step *st = op;
    api__req *rq = st->rq;
    eng_error e;
    eng_status rc;
    if (api__req_check_ctl(rq, err) != 0)
        return -1;
    int64_t t0 = eng_now_ns();
    eng_kv_seq *seq = st->s->cache[0].seq;
    int fail = api__session_with_room(st->reg, st->s, eng_kv_seq_append_bytes(seq, st->n_new),
                                      step_engine, st, &rc, &e, err);
    *compute_ns = eng_now_ns() - t0;
    if (fail)
        return -1;
    st->length = eng_kv_seq_length(seq);
    if (rc == ENG_OK && st->r.q.present && st->r.sinks.present)
        api__sinks_apply(st->sinks, &st->args.out, st->lse);
    if (rc == ENG_OK)
        return 0;
    if (api__session_too_long(st->reg, st->s, rc, &e, "key", err))
        return -1;
    const char *field = e.field[0] == 'q'   ? "query"
                        : e.field[0] == 'k' ? "key"
                        : e.field[0] == 'v' ? "value"
                                            : NULL;
    return api__req_engine_error(rq, rc, &e, field, err);
}

static const api__out_shape *step_output(void *op, int o, float ***slot)
{
    api__session_step *st = op;
    float **data = NULL;
    const api__out_shape *shape = NULL;
    if (!st->r.q.present) {
    } else if (o == API__OUT_OUTPUT) {
        data = &st->out;
        shape = &st->os;
    } else if (o == API__OUT_WEIGHTS && st->r.weights != ENG_WEIGHTS_NONE) {
        data = &st->weights;
        shape = &st->ws;
    } else if (o == API__OUT_LSE && st->r.return_lse) {
        data = &st->lse;
        shape = &st->ls;
    }
    if (slot)
        *slot = data;
    return shape;
}

static int64_t step_batch(const void *op)
{
    (void)op;
    return 1;
}

static void step_free(void *op)
{
    api__session_step *st = op;
    if (st->s) {
        api__session_release(st->reg, st->s);
        st->s = NULL;
    }
}

static eng_precision step_precision(const void *op)
{
    return eng_sdpa_precision(&((const api__session_step *)op)->args);
}

const api__op api__session_step_op = {
    .steps = {.check = step_check,
              .size = step_size,
              .decode = step_decode,
              .run = step_run,
              .batch = step_batch,
              .free = step_free},
    .output = step_output,
    .precision = step_precision,
};
