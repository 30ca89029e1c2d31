/*
 * native_sessions.c - the native routes of KV-cache sessions (api.h): POST /v1/sessions,
 * /v1/sessions/{id}/attention, /truncate and /fork, which run through the one driver (serve.h),
 * and GET /v1/sessions, GET and DELETE /v1/sessions/{id}, which carry no body and answer on the
 * spot. The registry and the step operation are ops/session_*.c; this file reads the native
 * format into them and writes the replies, every one of them with the same description of a
 * session.
 *
 * POST /v1/sessions
 *   model                  a registered model (GET /v1/models): the session is then its caches,
 *                          one per layer of the model, stepped by POST /v1/mha {"session",
 *                          "layer"} (and its v2 sequences), with the layers' heads and head
 *                          size; num_heads, num_kv_heads, head_dim and value_head_dim may be left
 *                          out (given, they must be the model's), and scale, softcap and alibi,
 *                          which a layer step does not take, are refused
 *   num_heads, head_dim    required (without model): query heads H and their size D
 *   num_kv_heads           Hkv (default H; H a multiple of it); value_head_dim Dv (default D)
 *   cache_dtype            "float32" (default) | "bfloat16" | "float16": how K and V are kept
 *   max_tokens             a cap on the length (default: only --kv-cache-bytes)
 *   ttl_s                  idle expiry in seconds (default --session-ttl-s; 0: none)
 *   scale, softcap, precision, causal, window, alibi (true/false)
 *                          defaults of every step, which a step may override
 * POST /v1/sessions/{id}/attention
 *   query                  the new queries, [n, H*D] or [H, n, D]; absent: append only
 *   key, value             the new tokens' rows, [n, Hkv*D] / [Hkv, n, D] (value with Dv),
 *                          appended first; absent: attend only
 *   expect_length          the length the step expects before it appends: else 409
 *   scale, softcap, precision, causal (default bottom_right: the queries are the last
 *   positions), query_offset, window, alibi, sinks ([H] logits), return_weights, return_lse,
 *   output_encoding, output_dtype, timeout_ms, num_heads / num_kv_heads (must match) as on
 *   /v1/attention
 *   (a session of several layers is refused: its steps are POST /v1/mha's)
 * POST /v1/sessions/{id}/truncate {"length": n, "expect_length"?}: every layer's cache to n
 *   tokens, n at most the session's length (the tokens every layer holds)
 * POST /v1/sessions/{id}/fork {"ttl_s"?}; the body may be empty: every layer's cache
 *
 * A session describes itself with "length", the tokens every one of its caches holds (the
 * shortest cache's: the last layer's while a client steps its layers in order), and
 * "layer_lengths", each cache's.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/models/models.h"
#include "api/ops/layer.h"
#include "api/ops/sessions.h"
#include "api/proto/native.h"
#include "api/wire/reply.h"
#include "api/wire/timeout.h"

/* ---- Shared ------------------------------------------------------------------------------ */

static const char *dtype_name(eng_dtype d)
{
    return d == ENG_DTYPE_BF16 ? "bfloat16" : d == ENG_DTYPE_F16 ? "float16" : "float32";
}

static void time_iso(api_buf *w, int64_t t)
{
    struct tm tm;
    char text[32];
    time_t tt = (time_t)t;
    gmtime_r(&tt, &tm);
    strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
    api_buf_char(w, '"');
    api_buf_cstr(w, text);
    api_buf_char(w, '"');
}

/* Writes the JSON description of `s` as its lengths and bytes were last recorded (release,
 * api__session_update), which every session route replies with: "length" the shortest cache's,
 * the tokens every layer holds, and "layer_lengths" each layer's. */
static void describe(api_buf *w, const api__session *s)
{
    api_buf_printf(w, "{\"id\":\"%s\",\"length\":%lld,\"layers\":%lld,\"layer_lengths\":[", s->id,
                   (long long)s->length, (long long)s->layers);
    for (int64_t i = 0; i < s->layers; i++)
        api_buf_printf(w, "%s%lld", i ? "," : "", (long long)s->cache[i].length);
    api_buf_printf(w,
                   "],\"bytes\":%zu,\"cache_dtype\":\"%s\","
                   "\"num_heads\":%lld,\"num_kv_heads\":%lld,\"head_dim\":%lld,"
                   "\"value_head_dim\":%lld,\"max_tokens\":",
                   s->bytes, dtype_name(s->shape.dtype), (long long)s->num_heads,
                   (long long)s->shape.num_kv_heads, (long long)s->shape.head_dim,
                   (long long)s->shape.value_head_dim);
    if (s->shape.max_tokens > 0)
        api_buf_int(w, s->shape.max_tokens);
    else
        api_buf_cstr(w, "null");
    api_buf_cstr(w, ",\"model\":");
    if (s->model[0])
        api_buf_json_string(w, s->model, strlen(s->model));
    else
        api_buf_cstr(w, "null");
    api_buf_printf(w, ",\"ttl_s\":%lld,\"created\":", (long long)s->ttl_s);
    time_iso(w, s->created_s);
    api_buf_cstr(w, ",\"last_used\":");
    time_iso(w, s->last_used_s);
    api_buf_char(w, '}');
}

/* Sessions off: every route answers 501 (api__sessions_off) before reading the body. */
static int check_on(const api__req *rq, api__error *err)
{
    return rq->call->sessions ? 0 : api__sessions_off(err);
}

static int f_window_into(const json_t *v, const char *name, api__window *w, api__error *err)
{
    return api__option_window(v, name, w, err);
}

static int read_ttl(const json_t *v, const char *name, int64_t *ttl, api__error *err)
{
    return api__option_int(v, name, 0, INT64_C(1) << 31, ttl, err);
}

/* The 201 of a new session: its description and its Location. */
static int reply_created(const api__session *s, api_buf *w, api_reply *reply, api__error *err)
{
    describe(w, s);
    api_buf_char(w, '\n');
    if (api__native_reply(w, reply, err) != 0)
        return -1;
    reply->status = api_status_http(API_ERRORS_NATIVE, API_STATUS_CREATED);
    snprintf(reply->location, sizeof reply->location, "/v1/sessions/%s", s->id);
    return 0;
}

/* A bound of one session's description: its fixed fields and a length (up to 20 digits and a
 * comma) per layer, `layers` of them. */
static size_t description_bytes(int64_t layers)
{
    return 1024 + (size_t)layers * 21;
}

/* The reply text of a route that describes a session: the description of a session of the
 * registry's largest model (or of one cache). The job starts with its api__req. */
static bool no_tensors(void *job, api__sizes *sz)
{
    const api_models *models = ((const api__req *)job)->call->models;
    int64_t most = 1;
    for (size_t i = 0; i < api_models_count(models); i++)
        most = api_models_at(models, i)->layers > most ? api_models_at(models, i)->layers : most;
    sz->text = description_bytes(most);
    return true;
}

static int no_decode(void *job, api__error *err)
{
    (void)err;
    api__req_parse_done(job); /* the job starts with its api__req */
    return 0;
}

/* ---- POST /v1/sessions -------------------------------------------------------------------- */

typedef struct {
    api__req rq;
    api__sdpa_req o; /* the step options read through api__sdpa_options */
    int64_t head_dim, value_head_dim, max_tokens, ttl_s;
    bool ttl_set, alibi, causal_set, window_set;
    api__window window;
    eng_dtype dtype;
    const char *model;      /* "model" as sent (the tree's, until decode) */
    const api_model *layer; /* the registered model it names */
    api__session *s;        /* acquired, once created */
    api_sessions *reg;
} create_job;

static int c_head_dim(void *jp, const json_t *v, const char *name, api__error *err)
{
    return api__option_int(v, name, 1, 65536, &((create_job *)jp)->head_dim, err);
}

static int c_value_head_dim(void *jp, const json_t *v, const char *name, api__error *err)
{
    return api__option_int(v, name, 1, 65536, &((create_job *)jp)->value_head_dim, err);
}

static int c_max_tokens(void *jp, const json_t *v, const char *name, api__error *err)
{
    return api__option_int(v, name, 1, INT64_C(1) << 40, &((create_job *)jp)->max_tokens, err);
}

static int c_ttl_s(void *jp, const json_t *v, const char *name, api__error *err)
{
    create_job *job = jp;
    job->ttl_set = true;
    return read_ttl(v, name, &job->ttl_s, err);
}

static int c_cache_dtype(void *jp, const json_t *v, const char *name, api__error *err)
{
    create_job *job = jp;
    const char *s = json_string_value(v);
    if (s && strcmp(s, "float32") == 0)
        job->dtype = ENG_DTYPE_F32;
    else if (s && strcmp(s, "bfloat16") == 0)
        job->dtype = ENG_DTYPE_BF16;
    else if (s && strcmp(s, "float16") == 0)
        job->dtype = ENG_DTYPE_F16;
    else
        return api__error_invalid(err, name, "%s must be \"float32\", \"bfloat16\" or \"float16\"",
                                  name);
    return 0;
}

static int c_window(void *jp, const json_t *v, const char *name, api__error *err)
{
    create_job *job = jp;
    return f_window_into(v, name, &job->window, err);
}

static int c_alibi(void *jp, const json_t *v, const char *name, api__error *err)
{
    return api__option_bool(v, name, &((create_job *)jp)->alibi, err);
}

static int c_model(void *jp, const json_t *v, const char *name, api__error *err)
{
    if (json_is_null(v))
        return 0;
    if (!json_is_string(v))
        return api__error_invalid(err, name, "%s must be the name of a model (GET /v1/models)",
                                  name);
    ((create_job *)jp)->model = json_string_value(v);
    return 0;
}

/* A given head setting must be the layer's (0: not given). */
static int same_as_layer(int64_t given, int64_t layers, const char *name, const eng_layer *l,
                         api__error *err)
{
    if (given == 0 || given == layers)
        return 0;
    return api__error_invalid(err, name, "%s is %lld but model \"%s\" has %lld; leave it out", name,
                              (long long)given, l->name, (long long)layers);
}

/* A session of a model: one cache per layer, of the shape its layers share, and the step
 * options it keeps are those of a layer step (causal, window, precision). */
static int create_layer_check(create_job *job, api__error *err)
{
    const api_models *models = job->rq.call->models;
    const api_model *m = models ? api_models_find(models, job->model) : NULL;
    if (!m)
        return api__error_set(err, API_STATUS_NOT_FOUND, API_REASON_BAD_REQUEST, "model",
                              "no model \"%.64s\"; GET /v1/models lists them", job->model);
    const eng_layer *l = m->layer[0];
    int64_t D = eng_layer_head_dim(l);
    if (same_as_layer(job->o.num_heads, l->num_heads, "num_heads", l, err) != 0 ||
        same_as_layer(job->o.num_kv_heads, l->num_kv_heads, "num_kv_heads", l, err) != 0 ||
        same_as_layer(job->head_dim, D, "head_dim", l, err) != 0 ||
        same_as_layer(job->value_head_dim, D, "value_head_dim", l, err) != 0)
        return -1;
    const char *not_layer = job->o.scale_set     ? "scale"
                            : job->o.softcap > 0 ? "softcap"
                            : job->alibi         ? "alibi"
                                                 : NULL;
    if (not_layer)
        return api__error_invalid(err, not_layer,
                                  "%s is not an option of a layer's steps (POST /v1/mha takes "
                                  "the layer's scale, and positional \"alibi\")",
                                  not_layer);
    for (int64_t i = 0; i < m->layers; i++)
        if (api__layer_cache_check(m->layer[i], "model", err) != 0)
            return -1;
    job->layer = m;
    job->o.num_heads = l->num_heads;
    job->o.num_kv_heads = l->num_kv_heads;
    job->head_dim = job->value_head_dim = D;
    return 0;
}

static const api__native_field create_fields[] = {
    {"head_dim", c_head_dim},
    {"value_head_dim", c_value_head_dim},
    {"max_tokens", c_max_tokens},
    {"ttl_s", c_ttl_s},
    {"cache_dtype", c_cache_dtype},
    {"window", c_window},
    {"alibi", c_alibi},
    {"model", c_model},
};

static int create_check(void *p, api__error *err)
{
    create_job *job = p;
    job->reg = job->rq.call->sessions;
    job->o.causal = API_CAUSAL_UNSET; /* "not given" until the options say otherwise */
    if (api__native_fields(job, &job->o, create_fields,
                           sizeof create_fields / sizeof create_fields[0], api__sdpa_options,
                           api__sdpa_n_options, "/v1/sessions", err) != 0)
        return -1;
    if (job->model && create_layer_check(job, err) != 0)
        return -1;
    if (!job->o.num_heads)
        return api__error_invalid(err, "num_heads", "num_heads is required (or model)");
    if (!job->head_dim)
        return api__error_invalid(err, "head_dim", "head_dim is required");
    if (job->o.num_heads > 65536)
        return api__error_invalid(err, "num_heads", "num_heads must be at most 65536");
    if (job->o.num_kv_heads && job->o.num_heads % job->o.num_kv_heads != 0)
        return api__error_invalid(err, "num_kv_heads",
                                  "%lld query heads cannot be shared among %lld key/value heads: "
                                  "num_heads must be a multiple of num_kv_heads",
                                  (long long)job->o.num_heads, (long long)job->o.num_kv_heads);
    if (job->o.offset_set)
        return api__error_invalid(err, "query_offset",
                                  "query_offset is a step's own; a session's steps sit at its end");
    return 0;
}

static int create_run(void *p, int64_t *compute_ns, api__error *err)
{
    create_job *job = p;
    eng_error e;
    int64_t t0 = eng_now_ns();
    eng_kv_shape shape = {
        .num_kv_heads = job->o.num_kv_heads ? job->o.num_kv_heads : job->o.num_heads,
        .head_dim = job->head_dim,
        .value_head_dim = job->value_head_dim,
        .dtype = job->dtype,
        .max_tokens = job->max_tokens,
    };
    api__session_opts opts = {
        .scale_set = job->o.scale_set,
        .scale = job->o.scale,
        .softcap = job->o.softcap,
        .window = job->window,
        .alibi = job->alibi,
        .precision_set = job->o.precision_set,
        .precision = job->o.precision,
        .causal_set = job->o.causal != API_CAUSAL_UNSET,
        .causal = job->o.causal != API_CAUSAL_UNSET ? job->o.causal : API_CAUSAL_ON,
    };
    memset(&e, 0, sizeof e);
    int64_t layers = job->layer ? job->layer->layers : 1;
    eng_kv_seq **seqs = api__session_caches_new(job->reg, &shape, layers, &e);
    if (!seqs) {
        if (e.status == ENG_ETOOBIG)
            return api__error_set(err, API_STATUS_TOO_LARGE, API_REASON_TOO_LARGE, NULL,
                                  "one block of this session could never fit the KV cache "
                                  "(--kv-cache-bytes): %s",
                                  e.message);
        return api__req_engine_error(&job->rq, e.status, &e, e.field[0] ? e.field : NULL, err);
    }
    int64_t ttl = job->ttl_set ? job->ttl_s : api__sessions_default_ttl(job->reg);
    int rc = api__sessions_add(job->reg, seqs, layers, job->o.num_heads, &opts, ttl, &job->s, err);
    free(seqs);
    if (rc != 0)
        return -1;
    if (job->layer)
        api__session_set_model(job->reg, job->s, job->layer->name, NULL);
    *compute_ns = eng_now_ns() - t0;
    return 0;
}

static int create_encode(void *p, api_buf *w, api_reply *reply, api__error *err)
{
    create_job *job = p;
    return reply_created(job->s, w, reply, err);
}

static void create_free(void *p)
{
    create_job *job = p;
    if (job->s)
        api__session_release(job->reg, job->s);
    job->s = NULL;
}

static int create_read(void *p, api__error *err)
{
    create_job *job = p;
    return check_on(&job->rq, err) != 0 ? -1 : api__native_read(p, err);
}

static const api__route create_steps = {
    .style = API_ERRORS_NATIVE,
    .steps = {.read = create_read,
              .check = create_check,
              .size = no_tensors,
              .decode = no_decode,
              .run = create_run,
              .encode = create_encode,
              .free = create_free},
};

void api_sessions_create(const api_call *call, api_reply *reply)
{
    create_job *job = calloc(1, sizeof *job);
    api__serve(&create_steps, job, call, reply);
    free(job);
}

/* ---- POST /v1/sessions/{id}/attention ---------------------------------------------------- */

typedef struct {
    api__native_job head; /* first */
    api__session_step st;
    bool encoding_set;
    api__form encoding;
} step_job;

_Static_assert(offsetof(step_job, head) == 0, "api__serve takes the job for its api__req");

static int s_tensor(step_job *job, const json_t *v, const char *name, api__tensor *t,
                    api__error *err)
{
    return api__req_tensor(&job->head.rq, v, name, t, err);
}

static int s_query(void *jp, const json_t *v, const char *name, api__error *err)
{
    step_job *job = jp;
    return s_tensor(job, v, name, &job->st.r.q, err);
}

static int s_key(void *jp, const json_t *v, const char *name, api__error *err)
{
    step_job *job = jp;
    return s_tensor(job, v, name, &job->st.r.k, err);
}

static int s_value(void *jp, const json_t *v, const char *name, api__error *err)
{
    step_job *job = jp;
    return s_tensor(job, v, name, &job->st.r.v, err);
}

static int s_expect_length(void *jp, const json_t *v, const char *name, api__error *err)
{
    step_job *job = jp;
    job->st.expect_set = true;
    return api__option_int(v, name, 0, INT64_C(1) << 40, &job->st.expect_length, err);
}

static int s_window(void *jp, const json_t *v, const char *name, api__error *err)
{
    step_job *job = jp;
    return f_window_into(v, name, &job->st.r.window, err);
}

static int s_alibi(void *jp, const json_t *v, const char *name, api__error *err)
{
    step_job *job = jp;
    return api__option_bool(v, name, &job->st.r.alibi, err);
}

static int s_sinks(void *jp, const json_t *v, const char *name, api__error *err)
{
    step_job *job = jp;
    if (json_is_null(v))
        return 0;
    return s_tensor(job, v, name, &job->st.r.sinks, err);
}

static int s_return_weights(void *jp, const json_t *v, const char *name, api__error *err)
{
    step_job *job = jp;
    return api__option_weights(v, name, &job->st.r.weights, err);
}

static int s_return_lse(void *jp, const json_t *v, const char *name, api__error *err)
{
    step_job *job = jp;
    return api__option_bool(v, name, &job->st.r.return_lse, err);
}

static int s_output_encoding(void *jp, const json_t *v, const char *name, api__error *err)
{
    step_job *job = jp;
    return api__option_encoding(v, name, &job->encoding_set, &job->encoding, err);
}

static int s_output_dtype(void *jp, const json_t *v, const char *name, api__error *err)
{
    step_job *job = jp;
    eng_precision p = ENG_PRECISION_FLOAT32;
    if (api__option_precision(v, name, &p, err) != 0)
        return -1;
    job->head.bf16_out = p == ENG_PRECISION_BFLOAT16;
    return 0;
}

static const api__native_field step_fields[] = {
    {"query", s_query},
    {"key", s_key},
    {"value", s_value},
    {"expect_length", s_expect_length},
    {"window", s_window},
    {"alibi", s_alibi},
    {"sinks", s_sinks},
    {"return_weights", s_return_weights},
    {"return_lse", s_return_lse},
    {"output_encoding", s_output_encoding},
    {"output_dtype", s_output_dtype},
};

static int step_read(void *p, api__error *err)
{
    step_job *job = p;
    return check_on(&job->head.rq, err) != 0 ? -1 : api__native_read(p, err);
}

static int step_check(void *p, api__error *err)
{
    step_job *job = p;
    api__session_step *st = &job->st;
    st->r.causal = API_CAUSAL_UNSET;
    if (api__native_fields(job, &st->r, step_fields, sizeof step_fields / sizeof step_fields[0],
                           api__sdpa_options, api__sdpa_n_options, "/v1/sessions/{id}/attention",
                           err) != 0)
        return -1;
    st->causal_set = st->r.causal != API_CAUSAL_UNSET;
    if (!st->causal_set)
        st->r.causal = API_CAUSAL_ON;
    if (st->r.offset_set &&
        (st->r.causal == API_CAUSAL_TOP_LEFT || st->r.causal == API_CAUSAL_BOTTOM_RIGHT))
        return api__error_invalid(err, "query_offset",
                                  "query_offset conflicts with an explicit causal alignment");
    job->head.form = job->encoding_set ? job->encoding : st->r.q.form;
    return job->head.op->steps.check(job->head.state, err);
}

static int step_encode(void *p, api_buf *w, api_reply *reply, api__error *err)
{
    step_job *job = p;
    const api__session_step *st = &job->st;
    if (api__native_outputs(&job->head, w, err) != 0)
        return -1;
    if (st->r.q.present)
        api_buf_char(w, ',');
    api_buf_printf(w,
                   "\"length\":%lld,\"meta\":{\"session\":\"%s\",\"appended\":%lld,"
                   "\"query_len\":%lld,\"key_len\":%lld,\"num_heads\":%lld,"
                   "\"num_kv_heads\":%lld,\"head_dim\":%lld,\"value_head_dim\":%lld",
                   (long long)st->length, st->s->id, (long long)st->n_new, (long long)st->n_q,
                   (long long)st->S, (long long)st->H, (long long)st->Hkv, (long long)st->D,
                   (long long)st->Dv);
    snprintf(reply->session, sizeof reply->session, "%s", st->s->id);
    if (st->r.q.present)
        api_buf_printf(w, ",\"precision\":\"%s\"",
                       api__precision_name(eng_sdpa_precision(&st->args)));
    api_buf_printf(w, ",\"decode_ms\":%.3f,\"compute_ms\":%.3f}}\n", (double)reply->decode_ns / 1e6,
                   (double)reply->compute_ns / 1e6);
    return api__native_reply(w, reply, err);
}

static const api__route step_steps = {
    .style = API_ERRORS_NATIVE,
    .steps = {.read = step_read,
              .check = step_check,
              .size = api__native_size,
              .decode = api__native_decode,
              .run = api__native_run,
              .encode = step_encode,
              .batch = api__native_batch,
              .free = api__native_free},
};

void api_session_attention(const api_call *call, api_reply *reply)
{
    step_job *job = calloc(1, sizeof *job);
    if (job) {
        job->head.op = &api__session_step_op;
        job->head.state = &job->st;
        job->st.rq = &job->head.rq;
        job->st.reg = call->sessions;
        job->st.id = call->session;
    }
    api__serve(&step_steps, job, call, reply);
    free(job);
}

/* ---- POST /v1/sessions/{id}/truncate and /fork ------------------------------------------- */

typedef struct {
    api__req rq;
    bool fork;
    bool length_set, expect_set, ttl_set;
    int64_t length, expect_length, ttl_s;
    api__session *s, *child; /* acquired */
} edit_job;

static int e_length(void *jp, const json_t *v, const char *name, api__error *err)
{
    edit_job *job = jp;
    job->length_set = true;
    return api__option_int(v, name, 0, INT64_C(1) << 40, &job->length, err);
}

static int e_expect_length(void *jp, const json_t *v, const char *name, api__error *err)
{
    edit_job *job = jp;
    job->expect_set = true;
    return api__option_int(v, name, 0, INT64_C(1) << 40, &job->expect_length, err);
}

static int e_ttl_s(void *jp, const json_t *v, const char *name, api__error *err)
{
    edit_job *job = jp;
    job->ttl_set = true;
    return read_ttl(v, name, &job->ttl_s, err);
}

static const api__native_field truncate_fields[] = {
    {"length", e_length},
    {"expect_length", e_expect_length},
};

static const api__native_field fork_fields[] = {
    {"ttl_s", e_ttl_s},
    {"expect_length", e_expect_length},
};

static int edit_read(void *p, api__error *err)
{
    edit_job *job = p;
    if (check_on(&job->rq, err) != 0)
        return -1;
    if (job->fork && job->rq.call->body_len == 0)
        return api__req_check_ctl(&job->rq, err); /* a fork may have no body */
    return api__native_read(p, err);
}

static int edit_check(void *p, api__error *err)
{
    edit_job *job = p;
    if (!job->rq.body.root)
        return 0;
    if (!json_is_object(job->rq.body.root))
        return api__error_invalid(err, NULL, "the body must be a JSON object");
    const api__native_field *fields = job->fork ? fork_fields : truncate_fields;
    size_t n = job->fork ? sizeof fork_fields / sizeof fork_fields[0]
                         : sizeof truncate_fields / sizeof truncate_fields[0];
    if (api__native_fields(job, NULL, fields, n, NULL, 0,
                           job->fork ? "/v1/sessions/{id}/fork" : "/v1/sessions/{id}/truncate",
                           err) != 0)
        return -1;
    if (!job->fork && !job->length_set)
        return api__error_invalid(err, "length", "length is required");
    return 0;
}

/* Truncates every cache of the acquired session to job->length tokens. */
static int truncate_caches(edit_job *job, api__error *err)
{
    const api__session *s = job->s;
    eng_error e;
    memset(&e, 0, sizeof e);
    if (job->length > s->length)
        return api__error_invalid(
            err, "length", "length is %lld but the session holds only %lld tokens%s",
            (long long)job->length, (long long)s->length, s->layers > 1 ? " in every layer" : "");
    for (int64_t i = 0; i < s->layers; i++)
        if (eng_kv_seq_truncate(s->cache[i].seq, job->length, &e) != ENG_OK)
            return api__req_engine_error(&job->rq, e.status, &e, "length", err);
    return 0;
}

/* A new session with every cache of the acquired one, shared copy-on-write, into job->child. */
static int fork_caches(edit_job *job, api__error *err)
{
    api_sessions *reg = job->rq.call->sessions;
    const api__session *s = job->s;
    eng_error e;
    memset(&e, 0, sizeof e);
    eng_kv_seq **seqs = calloc((size_t)s->layers, sizeof *seqs);
    int64_t made = 0;
    while (seqs && made < s->layers && (seqs[made] = eng_kv_seq_fork(s->cache[made].seq, &e)))
        made++;
    if (!seqs || made < s->layers) {
        while (made > 0)
            eng_kv_seq_free(seqs[--made]);
        free(seqs);
        return seqs ? api__req_engine_error(&job->rq, e.status, &e, NULL, err)
                    : api__error_set(err, API_STATUS_UNAVAILABLE, API_REASON_MEMORY, NULL,
                                     "out of memory for a fork");
    }
    int64_t ttl = job->ttl_set ? job->ttl_s : s->ttl_s;
    int rc = api__sessions_add(reg, seqs, s->layers, s->num_heads, &s->opts, ttl, &job->child, err);
    free(seqs);
    if (rc == 0 && s->model[0]) /* the same model's caches */
        api__session_set_model(reg, job->child, s->model, &s->positions);
    return rc;
}

static int edit_run(void *p, int64_t *compute_ns, api__error *err)
{
    edit_job *job = p;
    api_sessions *reg = job->rq.call->sessions;
    int64_t t0 = eng_now_ns();
    if (api__session_acquire(reg, job->rq.call->session, &job->s, err) != 0)
        return -1;
    api__session_update(reg, job->s);
    if (job->expect_set && job->expect_length != job->s->length)
        return api__error_set(err, API_STATUS_CONFLICT, API_REASON_BAD_REQUEST, "expect_length",
                              "the session holds %lld tokens%s but the request expects %lld",
                              (long long)job->s->length,
                              job->s->layers > 1 ? " in every layer" : "",
                              (long long)job->expect_length);
    int rc = job->fork ? fork_caches(job, err) : truncate_caches(job, err);
    if (rc == 0 && !job->fork)
        api__session_update(reg, job->s);
    *compute_ns = eng_now_ns() - t0;
    return rc;
}

static int edit_encode(void *p, api_buf *w, api_reply *reply, api__error *err)
{
    edit_job *job = p;
    if (job->fork)
        return reply_created(job->child, w, reply, err);
    describe(w, job->s);
    api_buf_char(w, '\n');
    return api__native_reply(w, reply, err);
}

static void edit_free(void *p)
{
    edit_job *job = p;
    api_sessions *reg = job->rq.call->sessions;
    if (job->child)
        api__session_release(reg, job->child);
    if (job->s)
        api__session_release(reg, job->s);
    job->child = job->s = NULL;
}

static const api__route edit_steps = {
    .style = API_ERRORS_NATIVE,
    .steps = {.read = edit_read,
              .check = edit_check,
              .size = no_tensors,
              .decode = no_decode,
              .run = edit_run,
              .encode = edit_encode,
              .free = edit_free},
};

static void edit(const api_call *call, api_reply *reply, bool fork)
{
    edit_job *job = calloc(1, sizeof *job);
    if (job)
        job->fork = fork;
    api__serve(&edit_steps, job, call, reply);
    free(job);
}

void api_session_truncate(const api_call *call, api_reply *reply)
{
    edit(call, reply, false);
}

void api_session_fork(const api_call *call, api_reply *reply)
{
    edit(call, reply, true);
}

/* ---- GET and DELETE: no body, answered on the spot --------------------------------------- */

static void describe_one(void *ctx, const api__session *s)
{
    describe(ctx, s);
}

void api_sessions_get(api_sessions *reg, const char *id, api_reply *reply)
{
    api__error err = {0};
    api_buf w;
    memset(reply, 0, sizeof *reply);
    if (!reg) {
        api__sessions_off(&err);
        api__reply_from_error(reply, API_ERRORS_NATIVE, &err);
        return;
    }
    api_buf_init(&w, description_bytes(API_MODEL_LAYERS_MAX));
    if (api__sessions_view(reg, id, describe_one, &w, &err) != 0) {
        api_buf_free(&w);
        api__reply_from_error(reply, API_ERRORS_NATIVE, &err);
        return;
    }
    api_buf_char(&w, '\n');
    api__reply_json(reply, &w, API_ERRORS_NATIVE);
}

/* The list's writer: a comma between sessions, and the id of the last one, the "next" of a
 * page that others follow. */
typedef struct {
    api_buf *w;
    int64_t shown;
    char last[API_SESSION_ID_LEN + 1];
} list_writer;

static void describe_listed(void *ctx, const api__session *s)
{
    list_writer *lw = ctx;
    if (lw->shown++ > 0)
        api_buf_char(lw->w, ',');
    describe(lw->w, s);
    memcpy(lw->last, s->id, sizeof lw->last);
}

void api_sessions_list(api_sessions *reg, const char *limit, const char *after, api_reply *reply)
{
    api__error err = {0};
    api_buf w;
    api__session_page page = {.after = after, .n = 100};
    list_writer lw = {.w = &w};
    memset(reply, 0, sizeof *reply);
    if (!reg) {
        api__sessions_off(&err);
        api__reply_from_error(reply, API_ERRORS_NATIVE, &err);
        return;
    }
    if (limit) {
        char *end = NULL;
        errno = 0;
        long long n = strtoll(limit, &end, 10);
        if (errno || end == limit || *end || n < 1 || n > 1000) {
            api__error_invalid(&err, "limit", "limit must be an integer in [1, 1000]");
            api__reply_from_error(reply, API_ERRORS_NATIVE, &err);
            return;
        }
        page.n = n;
    }
    api_buf_init(&w, (size_t)page.n * description_bytes(API_MODEL_LAYERS_MAX) + 256);
    api_buf_cstr(&w, "{\"sessions\":[");
    if (api__sessions_view_page(reg, &page, describe_listed, &lw, &err) != 0) {
        api_buf_free(&w);
        api__reply_from_error(reply, API_ERRORS_NATIVE, &err);
        return;
    }
    api_buf_cstr(&w, "],\"next\":");
    if (page.more)
        api_buf_printf(&w, "\"%s\"", lw.last);
    else
        api_buf_cstr(&w, "null");
    api_buf_printf(&w, ",\"live\":%lld}\n", (long long)page.live);
    api__reply_json(reply, &w, API_ERRORS_NATIVE);
}

void api_sessions_delete(api_sessions *reg, const char *id, api_reply *reply)
{
    api__error err = {0};
    memset(reply, 0, sizeof *reply);
    if (!reg) {
        api__sessions_off(&err);
        api__reply_from_error(reply, API_ERRORS_NATIVE, &err);
        return;
    }
    if (api__sessions_delete(reg, id, &err) != 0) {
        api__reply_from_error(reply, API_ERRORS_NATIVE, &err);
        return;
    }
    reply->status = api_status_http(API_ERRORS_NATIVE, API_STATUS_NO_CONTENT);
    reply->content_type = "application/json";
}
