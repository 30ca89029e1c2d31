/*
 * v2.c - the Open Inference Protocol (KServe v2) REST API, with Triton's binary tensor data
 * extension, so that KServe, tritonclient and perf_analyzer talk to attnd unchanged.
 *
 * Models: "sdpa" is the bare operation (the same request as /v1/attention, through the same
 * path in sdpa.c); every registered layer is a model too (the same layer as /v1/mha, through
 * the same path in layer.c). Each has the one version "1".
 *
 * GET /v2 -> {"name": "attnd", "version", "extensions": ["binary_tensor_data", "parameters",
 * "statistics"]}. GET /v2/models/{m}[/versions/1] -> {"name", "versions": ["1"], "platform",
 * "inputs": [{"name", "datatype", "shape"}], "outputs": [...]}, -1 for variable dimensions.
 * GET .../ready -> {"name", "ready": true}.
 *
 * POST /v2/models/sdpa[/versions/1]/infer, the inference request:
 *
 *   {"id": "42",                                   optional, echoed
 *    "parameters": {...},                          optional, see below
 *    "inputs": [{"name": "query", "datatype": "FP32", "shape": [1, 8, 128, 64],
 *                "data": [...]}, ...],             flat or nested, row-major
 *    "outputs": [{"name": "output", "parameters": {"binary_data": true}}]}   optional
 *
 *   inputs    query, key, value: FP32 (JSON or binary), FP16 or BF16 (binary only: JSON has no
 *             16-bit floats); rank 4 [B, H, L, D], rank 3 [B, L, E] or rank 2 [L, E], as in
 *             DESIGN.md section 5. attn_mask: BOOL (true = may attend) or FP32 added to the
 *             scores (FP16/BF16 binary; -inf as JSON null). key_padding_mask: BOOL [B, S] or
 *             [S] (true = padding). kv_lengths: INT64 or INT32 [B].
 *   parameters causal (true, false, "top_left", "bottom_right"), query_offset, scale, softcap,
 *             num_heads, num_kv_heads, window_left, window_right (-1 or absent: unbounded),
 *             alibi (bool), return_weights ("per_head", "mean", false), return_lse (bool),
 *             timeout_ms; Triton's binary_data_output (bool), timeout (microseconds) and
 *             priority (accepted, ignored). Any other name is refused (a typo such as
 *             "casual" silently ignored would return a plausible wrong answer).
 *   outputs   output [B, H, L, Dv] (after the query's rank), weights [B, H, L, S] or mean
 *             [B, L, S], lse [B, H, L] (-inf as JSON null). Without "outputs", output is
 *             returned plus weights / lse when return_weights / return_lse ask for them; with
 *             it, exactly the ones listed (listing weights alone means per_head).
 *
 * POST /v2/models/{layer}[/versions/1]/infer, a registered layer (GET /v1/models; "demo"),
 * takes the same request with the options of /v1/mha (DESIGN.md section 6), through the same
 * path in layer.c:
 *
 *   inputs    input: FP32 (JSON or binary), FP16 or BF16 (binary only), [L, E] or [B, L, E]
 *             with E the layer's embed_dim. memory (cross-attention; keys and values from these
 *             tokens): [S, kdim] or [B, S, kdim], same rank and batch as input; layers whose
 *             kdim differs from their vdim need /v1/mha (key and value). attn_mask and
 *             key_padding_mask as for sdpa, with H the layer's heads.
 *   parameters causal, query_offset, window_left, window_right, positional ("sinusoidal",
 *             "rope", "alibi", "none"), rope_base, rope_style ("half", "interleaved"),
 *             add_zero_attn (bool), return_weights, timeout_ms; binary_data_output, timeout
 *             and priority as above.
 *   outputs   output [B, L, E] (after the input's rank), weights [B, H, L, S'] or mean
 *             [B, L, S'] with S' = S plus the keys the layer appends; selected as above.
 *
 * The reply is {"model_name", "model_version": "1", "id"?, "outputs": [{"name", "datatype":
 * "FP32", "shape", "data": [flat]}]}; an output asked for as binary has "parameters":
 * {"binary_data_size": n} instead of "data", its bytes follow the JSON in the order of the
 * outputs, reply->inference_header_len gives the JSON's length and the content type is
 * application/octet-stream.
 *
 * Binary tensor data (the body after Inference-Header-Content-Length bytes of JSON): each input
 * with "binary_data_size" takes that many bytes, in the order the inputs are listed; the sizes
 * must equal shape x datatype and add up to exactly the bytes after the JSON. All of this is
 * checked against the shapes and the limits before anything is allocated. Float32 and bool
 * bytes on their natural alignment are used where they lie (no copy); others are converted
 * into aligned buffers. When every output is binary, the JSON is written before the compute,
 * padded with spaces to a 64-byte boundary, and the engine writes its results straight into
 * the reply: no output is ever copied.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "api/internal.h"

/* The version GET /v2 reports. */
#define V2_SERVER_VERSION "0.1.0"

/* Binary outputs start on this boundary of the reply (the JSON is padded with spaces). */
#define V2_BINARY_ALIGN 64

static const char *const v2_extensions[] = {"binary_tensor_data", "parameters", "statistics"};

/* ---- Errors and small replies ------------------------------------------------------------- */

void api_v2_reply_from_error(api_reply *reply, const api_error *err)
{
    api_jsonw w;
    api_jsonw_init(&w, 4096);
    api_jsonw_cstr(&w, "{\"error\":");
    api_jsonw_string(&w, err->message, strlen(err->message));
    api_jsonw_cstr(&w, "}\n");
    eng_buf_free(reply->body);
    reply->status = err->status;
    reply->content_type = "application/json";
    reply->retry_after_s = err->retry_after_s;
    reply->reason = err->reason;
    reply->inference_header_len = 0;
    if (w.state == API_JSONW_OK) {
        reply->body = w.data;
        reply->body_len = w.len;
    } else {
        api_jsonw_free(&w);
        reply->body = NULL;
        reply->body_len = 0;
    }
}

static void reply_error(api_reply *reply, int status, api_reason reason, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void reply_error(api_reply *reply, int status, api_reason reason, const char *fmt, ...)
{
    api_error err;
    char msg[sizeof err.message];
    va_list ap;
    memset(&err, 0, sizeof err);
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    api_error_set(&err, status, reason, NULL, "%s", msg);
    api_v2_reply_from_error(reply, &err);
}

/* Makes `w` the 200 JSON body of `reply`, or a 503 when the writer failed. */
static void reply_json(api_reply *reply, api_jsonw *w)
{
    api_jsonw_cstr(w, "\n");
    if (w->state != API_JSONW_OK) {
        api_jsonw_free(w);
        reply_error(reply, 503, API_REASON_MEMORY, "out of memory for the reply");
        return;
    }
    reply->status = 200;
    reply->content_type = "application/json";
    reply->body = w->data;
    reply->body_len = w->len;
    w->data = NULL;
}

/* ---- Models --------------------------------------------------------------------------------- */

typedef enum { MODEL_NONE = 0, MODEL_SDPA, MODEL_LAYER } model_kind;

typedef struct {
    model_kind kind;
    const char *name;
    const eng_layer *layer;
} model_ref;

/* Finds call->model (and call->version); on failure fills a 404 reply and returns false. */
static bool model_find(const api_call *call, model_ref *m, api_reply *reply)
{
    const char *name = call->model ? call->model : "";
    memset(m, 0, sizeof *m);
    m->name = name;
    if (strcmp(name, "sdpa") == 0) {
        m->kind = MODEL_SDPA;
    } else if (call->models && (m->layer = api_models_find(call->models, name)) != NULL) {
        m->kind = MODEL_LAYER;
    } else {
        api_jsonw w;
        api_jsonw_init(&w, 1024);
        for (size_t i = 0; call->models && i < api_models_count(call->models); i++) {
            api_jsonw_cstr(&w, ", ");
            api_jsonw_cstr(&w, api_models_at(call->models, i)->name);
        }
        reply_error(reply, 404, API_REASON_BAD_REQUEST, "unknown model \"%.64s\"; models: sdpa%.*s",
                    name, w.state == API_JSONW_OK ? (int)(w.len < 600 ? w.len : 600) : 0,
                    w.data ? w.data : "");
        api_jsonw_free(&w);
        return false;
    }
    if (call->version && strcmp(call->version, API_V2_VERSION) != 0) {
        reply_error(
            reply, 404, API_REASON_BAD_REQUEST,
            "model \"%.64s\" has no version \"%.64s\"; its only version is \"" API_V2_VERSION "\"",
            name, call->version);
        return false;
    }
    return true;
}

bool api_v2_model_known(const api_models *models, const char *model, const char *version)
{
    if (!model || (version && strcmp(version, API_V2_VERSION) != 0))
        return false;
    return strcmp(model, "sdpa") == 0 || (models && api_models_find(models, model) != NULL);
}

void api_v2_server_metadata(api_reply *reply)
{
    api_jsonw w;
    memset(reply, 0, sizeof *reply);
    api_jsonw_init(&w, 4096);
    api_jsonw_cstr(&w,
                   "{\"name\":\"attnd\",\"version\":\"" V2_SERVER_VERSION "\",\"extensions\":[");
    for (size_t i = 0; i < sizeof v2_extensions / sizeof v2_extensions[0]; i++) {
        if (i > 0)
            api_jsonw_char(&w, ',');
        api_jsonw_string(&w, v2_extensions[i], strlen(v2_extensions[i]));
    }
    api_jsonw_cstr(&w, "]}");
    reply_json(reply, &w);
}

/* One $metadata_tensor; dims of -1 are variable, others fixed. */
static void write_meta_tensor(api_jsonw *w, bool first, const char *name, const char *datatype,
                              int rank, const int64_t *dims)
{
    if (!first)
        api_jsonw_char(w, ',');
    api_jsonw_printf(w, "{\"name\":\"%s\",\"datatype\":\"%s\",\"shape\":[", name, datatype);
    for (int d = 0; d < rank; d++) {
        if (d > 0)
            api_jsonw_char(w, ',');
        api_jsonw_int(w, dims[d]);
    }
    api_jsonw_cstr(w, "]}");
}

void api_v2_model_metadata(const api_call *call, api_reply *reply)
{
    static const int64_t var[4] = {-1, -1, -1, -1};
    model_ref m;
    api_jsonw w;
    memset(reply, 0, sizeof *reply);
    if (!model_find(call, &m, reply))
        return;
    api_jsonw_init(&w, 8192);
    api_jsonw_cstr(&w, "{\"name\":");
    api_jsonw_string(&w, m.name, strlen(m.name));
    api_jsonw_cstr(&w, ",\"versions\":[\"" API_V2_VERSION "\"],");
    if (m.kind == MODEL_SDPA) {
        /* Ranks 2 and 3 are accepted too; the metadata shows the PyTorch layout. */
        api_jsonw_cstr(&w, "\"platform\":\"attnd_sdpa\",\"inputs\":[");
        write_meta_tensor(&w, true, "query", "FP32", 4, var);
        write_meta_tensor(&w, false, "key", "FP32", 4, var);
        write_meta_tensor(&w, false, "value", "FP32", 4, var);
        write_meta_tensor(&w, false, "attn_mask", "BOOL", 4, var);
        write_meta_tensor(&w, false, "key_padding_mask", "BOOL", 2, var);
        write_meta_tensor(&w, false, "kv_lengths", "INT64", 1, var);
        api_jsonw_cstr(&w, "],\"outputs\":[");
        write_meta_tensor(&w, true, "output", "FP32", 4, var);
        write_meta_tensor(&w, false, "weights", "FP32", 4, var);
        write_meta_tensor(&w, false, "lse", "FP32", 3, var);
    } else {
        /* Rank 2 ([L, E], no batch axis) is accepted too; the widths are the layer's. */
        const eng_layer *l = m.layer;
        const int64_t x[3] = {-1, -1, l->embed_dim}, mem[3] = {-1, -1, l->kdim};
        api_jsonw_cstr(&w, "\"platform\":\"attnd_mha\",\"inputs\":[");
        write_meta_tensor(&w, true, "input", "FP32", 3, x);
        write_meta_tensor(&w, false, "memory", "FP32", 3, mem);
        write_meta_tensor(&w, false, "attn_mask", "BOOL", 4, var);
        write_meta_tensor(&w, false, "key_padding_mask", "BOOL", 2, var);
        api_jsonw_cstr(&w, "],\"outputs\":[");
        write_meta_tensor(&w, true, "output", "FP32", 3, x);
        write_meta_tensor(&w, false, "weights", "FP32", 4, var);
    }
    api_jsonw_cstr(&w, "]}");
    reply_json(reply, &w);
}

void api_v2_model_ready(const api_call *call, api_reply *reply)
{
    model_ref m;
    api_jsonw w;
    memset(reply, 0, sizeof *reply);
    if (!model_find(call, &m, reply))
        return;
    api_jsonw_init(&w, 1024);
    api_jsonw_cstr(&w, "{\"name\":");
    api_jsonw_string(&w, m.name, strlen(m.name));
    api_jsonw_cstr(&w, ",\"ready\":true}");
    reply_json(reply, &w);
}

/* ---- Datatypes ------------------------------------------------------------------------------ */

/* The v2 datatypes attnd reads, and the wire dtype each is. */
static const struct {
    const char *name;
    api_dtype dtype;
} v2_datatypes[] = {
    {"FP32", API_DTYPE_FLOAT32}, {"FP16", API_DTYPE_FLOAT16}, {"BF16", API_DTYPE_BFLOAT16},
    {"BOOL", API_DTYPE_BOOL},    {"INT64", API_DTYPE_INT64},  {"INT32", API_DTYPE_INT32},
};

/* The others of the protocol (and Triton's), which no input of attnd takes. */
static const char *const v2_other_datatypes[] = {"UINT8", "UINT16", "UINT32", "UINT64",
                                                 "INT8",  "INT16",  "FP64",   "BYTES"};

/* ---- The infer request ---------------------------------------------------------------------- */

enum { OUT_OUTPUT = 0, OUT_WEIGHTS, OUT_LSE, N_OUTPUTS };

static const char *const output_names[N_OUTPUTS] = {"output", "weights", "lse"};

typedef struct {
    api_req rq;
    api_sdpa s;  /* model sdpa */
    api_layer l; /* a layer model */
    model_ref model;
    char *id; /* NUL-terminated copy (the tree is freed before the reply is written) */
    size_t id_len;
    bool has_id;

    const char *bin; /* the binary part of the body, after the JSON */
    size_t bin_len, bin_used;
    bool has_header_len;

    bool binary_default; /* binary_data_output */
    bool outputs_given;
    bool want[N_OUTPUTS], binary[N_OUTPUTS], binary_set[N_OUTPUTS];
    bool weights_param_set; /* return_weights given */
    bool weights_param_off; /* ... as false */
    bool lse_param_set;
    int64_t timeout_us; /* Triton's "timeout" parameter; 0: none */
} v2_job;

static bool is_layer(const v2_job *job)
{
    return job->model.kind == MODEL_LAYER;
}

/* The options both kinds of model have, wherever the model keeps them. */
static eng_weights_mode *weights_of(v2_job *job)
{
    return is_layer(job) ? &job->l.r.weights : &job->s.r.weights;
}

static int64_t *timeout_ms_of(v2_job *job)
{
    return is_layer(job) ? &job->l.r.timeout_ms : &job->s.r.timeout_ms;
}

/* ---- Parameters ----------------------------------------------------------------------------- */

typedef int (*param_fn)(v2_job *job, const json_t *v, const char *name, api_error *err);

static int p_causal(v2_job *job, const json_t *v, const char *name, api_error *err)
{
    return api_field_causal(v, name, is_layer(job) ? &job->l.r.causal : &job->s.r.causal, err);
}

static int p_query_offset(v2_job *job, const json_t *v, const char *name, api_error *err)
{
    bool *set = is_layer(job) ? &job->l.r.offset_set : &job->s.r.offset_set;
    *set = true;
    return api_field_int(v, name, -API_QUERY_OFFSET_MAX, API_QUERY_OFFSET_MAX,
                         is_layer(job) ? &job->l.r.query_offset : &job->s.r.query_offset, err);
}

static int p_scale(v2_job *job, const json_t *v, const char *name, api_error *err)
{
    job->s.r.scale_set = true;
    return api_field_float(v, name, &job->s.r.scale, err);
}

static int p_softcap(v2_job *job, const json_t *v, const char *name, api_error *err)
{
    if (api_field_float(v, name, &job->s.r.softcap, err) != 0)
        return -1;
    if (job->s.r.softcap < 0)
        return api_field_invalid(err, name, "%s must be > 0 (or 0 for none), found %g", name,
                                 (double)job->s.r.softcap);
    return 0;
}

static int p_num_heads(v2_job *job, const json_t *v, const char *name, api_error *err)
{
    return api_field_int(v, name, 1, INT32_MAX, &job->s.r.num_heads, err);
}

static int p_num_kv_heads(v2_job *job, const json_t *v, const char *name, api_error *err)
{
    return api_field_int(v, name, 1, INT32_MAX, &job->s.r.num_kv_heads, err);
}

/* A window side: a non-negative integer, or -1 for unbounded (parameters cannot be null). */
static int window_side(const json_t *v, const char *name, bool *set, int64_t *out, api_error *err)
{
    int64_t n;
    if (json_is_integer(v) && json_integer_value(v) > API_WINDOW_MAX) {
        *set = false; /* reaches past every position: unbounded */
        return 0;
    }
    if (api_field_int(v, name, -1, API_WINDOW_MAX, &n, err) != 0)
        return -1;
    *set = n >= 0;
    *out = n >= 0 ? n : 0;
    return 0;
}

static int p_window_left(v2_job *job, const json_t *v, const char *name, api_error *err)
{
    if (is_layer(job))
        return window_side(v, name, &job->l.r.window.left_set, &job->l.r.window.left, err);
    return window_side(v, name, &job->s.r.window_left_set, &job->s.r.window_left, err);
}

static int p_window_right(v2_job *job, const json_t *v, const char *name, api_error *err)
{
    if (is_layer(job))
        return window_side(v, name, &job->l.r.window.right_set, &job->l.r.window.right, err);
    return window_side(v, name, &job->s.r.window_right_set, &job->s.r.window_right, err);
}

static int p_alibi(v2_job *job, const json_t *v, const char *name, api_error *err)
{
    return api_field_bool(v, name, &job->s.r.alibi, err);
}

static int p_return_weights(v2_job *job, const json_t *v, const char *name, api_error *err)
{
    const char *s = json_string_value(v);
    eng_weights_mode *w = weights_of(job);
    job->weights_param_set = true;
    if (s && strcmp(s, "none") == 0) {
        *w = ENG_WEIGHTS_NONE;
    } else if (json_is_true(v)) {
        *w = ENG_WEIGHTS_PER_HEAD;
    } else if (api_field_weights(v, name, w, err) != 0) {
        return -1;
    }
    job->weights_param_off = *w == ENG_WEIGHTS_NONE;
    return 0;
}

static int p_return_lse(v2_job *job, const json_t *v, const char *name, api_error *err)
{
    job->lse_param_set = true;
    return api_field_bool(v, name, &job->s.r.return_lse, err);
}

static int p_timeout_ms(v2_job *job, const json_t *v, const char *name, api_error *err)
{
    return api_field_int(v, name, 1, API_TIMEOUT_MS_MAX, timeout_ms_of(job), err);
}

static int p_positional(v2_job *job, const json_t *v, const char *name, api_error *err)
{
    return api_field_positional(v, name, &job->l.r.positional, err);
}

static int p_rope_base(v2_job *job, const json_t *v, const char *name, api_error *err)
{
    return api_field_rope_base(v, name, &job->l.r.rope_base_set, &job->l.r.rope_base, err);
}

static int p_rope_style(v2_job *job, const json_t *v, const char *name, api_error *err)
{
    return api_field_rope_style(v, name, &job->l.r.rope_style_set, &job->l.r.rope_style, err);
}

static int p_add_zero_attn(v2_job *job, const json_t *v, const char *name, api_error *err)
{
    return api_field_bool(v, name, &job->l.r.add_zero_attn, err);
}

static int p_timeout(v2_job *job, const json_t *v, const char *name, api_error *err)
{
    return api_field_int(v, name, 0, API_TIMEOUT_US_MAX, &job->timeout_us, err);
}

static int p_priority(v2_job *job, const json_t *v, const char *name, api_error *err)
{
    int64_t ignored;
    (void)job;
    return api_field_int(v, name, 0, INT64_MAX, &ignored, err);
}

static int p_binary_data_output(v2_job *job, const json_t *v, const char *name, api_error *err)
{
    return api_field_bool(v, name, &job->binary_default, err);
}

typedef struct {
    const char *name;
    param_fn parse;
} param_def;

static const param_def sdpa_params[] = {
    {"causal", p_causal},
    {"query_offset", p_query_offset},
    {"scale", p_scale},
    {"softcap", p_softcap},
    {"num_heads", p_num_heads},
    {"num_kv_heads", p_num_kv_heads},
    {"window_left", p_window_left},
    {"window_right", p_window_right},
    {"alibi", p_alibi},
    {"return_weights", p_return_weights},
    {"return_lse", p_return_lse},
    {"timeout_ms", p_timeout_ms},
    {"binary_data_output", p_binary_data_output},
    {"timeout", p_timeout},
    {"priority", p_priority},
};

/* Those of a layer model: the options of /v1/mha that a registered layer leaves open. */
static const param_def layer_params[] = {
    {"causal", p_causal},
    {"query_offset", p_query_offset},
    {"window_left", p_window_left},
    {"window_right", p_window_right},
    {"positional", p_positional},
    {"rope_base", p_rope_base},
    {"rope_style", p_rope_style},
    {"add_zero_attn", p_add_zero_attn},
    {"return_weights", p_return_weights},
    {"timeout_ms", p_timeout_ms},
    {"binary_data_output", p_binary_data_output},
    {"timeout", p_timeout},
    {"priority", p_priority},
};

#define N_SDPA_PARAMS  (sizeof sdpa_params / sizeof sdpa_params[0])
#define N_LAYER_PARAMS (sizeof layer_params / sizeof layer_params[0])
#define N_PARAMS_MAX   (N_SDPA_PARAMS > N_LAYER_PARAMS ? N_SDPA_PARAMS : N_LAYER_PARAMS)

static int parse_parameters(v2_job *job, const json_t *params, api_error *err)
{
    const param_def *defs = is_layer(job) ? layer_params : sdpa_params;
    size_t n_params = is_layer(job) ? N_LAYER_PARAMS : N_SDPA_PARAMS;
    const char *key;
    json_t *val;
    char field[96];
    if (!json_is_object(params))
        return api_field_invalid(err, "parameters",
                                 "parameters must be an object of name: value pairs");
    json_object_foreach((json_t *)params, key, val)
    {
        size_t i = 0;
        while (i < n_params && strcmp(defs[i].name, key) != 0)
            i++;
        snprintf(field, sizeof field, "parameters.%.60s", key);
        if (i == n_params) {
            const char *names[N_PARAMS_MAX];
            for (size_t j = 0; j < n_params; j++)
                names[j] = defs[j].name;
            const char *best = api_closest_name(key, names, n_params);
            if (best)
                return api_field_invalid(
                    err, field, "unknown parameter \"%.60s\"; did you mean \"%s\"?", key, best);
            if (is_layer(job))
                return api_field_invalid(err, field,
                                         "unknown parameter \"%.60s\"; model %.64s takes causal, "
                                         "query_offset, window_left, window_right, positional, "
                                         "rope_base, rope_style, add_zero_attn, return_weights, "
                                         "timeout_ms, binary_data_output, timeout and priority",
                                         key, job->model.name);
            return api_field_invalid(err, field,
                                     "unknown parameter \"%.60s\"; model sdpa takes causal, "
                                     "query_offset, scale, softcap, num_heads, num_kv_heads, "
                                     "window_left, window_right, alibi, return_weights, "
                                     "return_lse, timeout_ms, binary_data_output, timeout and "
                                     "priority",
                                     key);
        }
        if (defs[i].parse(job, val, field, err) != 0)
            return -1;
    }
    return 0;
}

/* ---- Inputs --------------------------------------------------------------------------------- */

static const char *const input_names[] = {
    "query", "key", "value", "attn_mask", "key_padding_mask", "kv_lengths"};

#define N_INPUT_NAMES (sizeof input_names / sizeof input_names[0])

static const char *const layer_input_names[] = {"input", "memory", "attn_mask", "key_padding_mask"};

#define N_LAYER_INPUT_NAMES (sizeof layer_input_names / sizeof layer_input_names[0])

/* The tensor slot of input `name` of the job's model, or NULL. */
static api_tensor *input_slot(v2_job *job, const char *name, bool **has)
{
    api_sdpa_req *r = &job->s.r;
    api_layer_req *lr = &job->l.r;
    api_tensor *slots[N_INPUT_NAMES] = {&r->q, &r->k, &r->v, &r->mask, &r->kpm, &r->kvlen};
    bool *flags[N_INPUT_NAMES] = {&r->has_q,    &r->has_k,   &r->has_v,
                                  &r->has_mask, &r->has_kpm, &r->has_kvlen};
    api_tensor *lslots[N_LAYER_INPUT_NAMES] = {&lr->input, &lr->memory, &lr->mask, &lr->kpm};
    bool *lflags[N_LAYER_INPUT_NAMES] = {&lr->has_input, &lr->has_memory, &lr->has_mask,
                                         &lr->has_kpm};
    bool layer = is_layer(job);
    const char *const *names = layer ? layer_input_names : input_names;
    size_t n = layer ? N_LAYER_INPUT_NAMES : N_INPUT_NAMES;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(name, names[i]) == 0) {
            *has = layer ? lflags[i] : flags[i];
            return layer ? lslots[i] : slots[i];
        }
    }
    return NULL;
}

/* Whether input `name` takes `dtype`, and whether as JSON data too (false: binary only). */
static bool input_takes(const char *name, api_dtype dtype, bool *json_ok)
{
    bool qkv = strcmp(name, "query") == 0 || strcmp(name, "key") == 0 ||
               strcmp(name, "value") == 0 || strcmp(name, "input") == 0 ||
               strcmp(name, "memory") == 0;
    *json_ok = dtype == API_DTYPE_FLOAT32 || dtype == API_DTYPE_BOOL || dtype == API_DTYPE_INT64 ||
               dtype == API_DTYPE_INT32;
    if (qkv)
        return dtype == API_DTYPE_FLOAT32 || dtype == API_DTYPE_FLOAT16 ||
               dtype == API_DTYPE_BFLOAT16;
    if (strcmp(name, "attn_mask") == 0)
        return dtype != API_DTYPE_INT64 && dtype != API_DTYPE_INT32;
    if (strcmp(name, "key_padding_mask") == 0)
        return dtype == API_DTYPE_BOOL;
    return dtype == API_DTYPE_INT64 || dtype == API_DTYPE_INT32; /* kv_lengths */
}

static const char *input_datatypes(const char *name)
{
    if (strcmp(name, "attn_mask") == 0)
        return "BOOL, FP32, or FP16 / BF16 as binary data";
    if (strcmp(name, "key_padding_mask") == 0)
        return "BOOL";
    if (strcmp(name, "kv_lengths") == 0)
        return "INT64 or INT32";
    return "FP32, or FP16 / BF16 as binary data";
}

static int parse_datatype(const json_t *v, const char *name, const char *field, api_dtype *out,
                          api_error *err)
{
    const char *s = json_string_value(v);
    if (!s)
        return api_field_invalid(err, field, "%s must be a string such as \"FP32\"", field);
    for (size_t i = 0; i < sizeof v2_datatypes / sizeof v2_datatypes[0]; i++) {
        if (strcmp(s, v2_datatypes[i].name) == 0) {
            *out = v2_datatypes[i].dtype;
            return 0;
        }
    }
    for (size_t i = 0; i < sizeof v2_other_datatypes / sizeof v2_other_datatypes[0]; i++) {
        if (strcmp(s, v2_other_datatypes[i]) == 0)
            return api_field_invalid(err, field, "input %s does not take datatype %s; it takes %s",
                                     name, s, input_datatypes(name));
    }
    return api_field_invalid(err, field,
                             "%s \"%.32s\" is not a datatype of the protocol (BOOL, INT32, INT64, "
                             "FP16, BF16, FP32, ...)",
                             field, s);
}

/* binary_data_size, the one parameter an input takes; -1 when absent. */
static int input_parameters(const json_t *params, const char *field, int64_t *size, api_error *err)
{
    const char *key;
    json_t *val;
    char name[192];
    *size = -1;
    if (!params || json_is_null(params))
        return 0;
    if (!json_is_object(params))
        return api_field_invalid(err, field, "%s must be an object", field);
    json_object_foreach((json_t *)params, key, val)
    {
        snprintf(name, sizeof name, "%.120s.%.40s", field, key);
        if (strcmp(key, "binary_data_size") != 0)
            return api_field_invalid(err, name,
                                     "unknown input parameter \"%.40s\"; an input takes "
                                     "binary_data_size",
                                     key);
        if (api_field_int(val, name, 0, INT64_MAX, size, err) != 0)
            return -1;
    }
    return 0;
}

/* "data" of a JSON input: nested (whose nesting must be the shape) or flat. Fills t's form,
 * items and numbers; t's shape is the declared one. */
static int input_data(v2_job *job, const json_t *data, const char *name, api_dtype dtype,
                      api_tensor *t, api_error *err)
{
    char field[96], want[96], got[96];
    api_tensor probe;
    const api_body_span *sp = api_body_span_of(&job->rq.body, data);
    snprintf(field, sizeof field, "%s.data", name);
    if (!json_is_array(data) && !(sp && sp->kind == API_SPAN_NUMBERS))
        return api_field_invalid(
            err, field, "%s must be an array of the tensor's elements, flat or nested", field);
    if (api_tensor_probe(&job->rq.body, data, field, job->rq.limits.max_elements, &probe, err) != 0)
        return -1;
    if (probe.count != t->count && probe.rank == 1)
        return api_field_invalid(err, field, "%s has %zu elements but shape %s holds %zu", field,
                                 probe.count, api_field_shape_str(t, want, sizeof want), t->count);
    bool flat = probe.rank == 1 && t->rank != 1;
    if (!flat && (probe.rank != t->rank ||
                  memcmp(probe.shape, t->shape, (size_t)t->rank * sizeof t->shape[0]) != 0))
        return api_field_invalid(err, field,
                                 "%s is nested as %s but the shape is %s; give the data flat or "
                                 "nested as the shape",
                                 field, api_field_shape_str(&probe, got, sizeof got),
                                 api_field_shape_str(t, want, sizeof want));
    bool bools = probe.dtype == API_DTYPE_BOOL;
    if (bools != (dtype == API_DTYPE_BOOL))
        return api_field_invalid(err, field, "%s holds %s but the datatype is %s", field,
                                 bools ? "booleans" : "numbers",
                                 dtype == API_DTYPE_BOOL    ? "BOOL"
                                 : dtype == API_DTYPE_INT64 ? "INT64"
                                 : dtype == API_DTYPE_INT32 ? "INT32"
                                                            : "FP32");
    t->dtype = probe.dtype;
    t->items = probe.items;
    t->numbers = probe.numbers;
    t->form = flat ? API_FORM_FLAT : API_FORM_NESTED;
    return 0;
}

static int parse_input(v2_job *job, const json_t *in, size_t index, api_error *err)
{
    char field[64], sub[192];
    const char *key, *name = NULL;
    json_t *val, *shape = NULL, *datatype = NULL, *params = NULL, *data = NULL;
    snprintf(field, sizeof field, "inputs[%zu]", index);
    if (!json_is_object(in))
        return api_field_invalid(err, field,
                                 "%s must be an object {\"name\", \"shape\", \"datatype\", "
                                 "\"data\"}",
                                 field);
    json_object_foreach((json_t *)in, key, val)
    {
        if (strcmp(key, "name") == 0)
            name = json_string_value(val);
        else if (strcmp(key, "shape") == 0)
            shape = val;
        else if (strcmp(key, "datatype") == 0)
            datatype = val;
        else if (strcmp(key, "parameters") == 0)
            params = val;
        else if (strcmp(key, "data") == 0)
            data = val;
        else {
            snprintf(sub, sizeof sub, "%s.%.40s", field, key);
            return api_field_invalid(err, sub,
                                     "unknown key \"%.40s\" in %s; an input has name, shape, "
                                     "datatype, parameters and data",
                                     key, field);
        }
    }
    if (!name)
        return api_field_invalid(err, field, "%s needs a \"name\" (a string)", field);
    bool *has = NULL;
    api_tensor *t = input_slot(job, name, &has);
    if (!t && is_layer(job)) {
        const char *best = api_closest_name(name, layer_input_names, N_LAYER_INPUT_NAMES);
        return api_field_invalid(err, field,
                                 "unknown input \"%.60s\"%s%s%s; model %.64s takes input, memory, "
                                 "attn_mask and key_padding_mask",
                                 name, best ? " (did you mean \"" : "", best ? best : "",
                                 best ? "\"?)" : "", job->model.name);
    }
    if (!t) {
        const char *best = api_closest_name(name, input_names, N_INPUT_NAMES);
        return api_field_invalid(err, field,
                                 "unknown input \"%.60s\"%s%s%s; model sdpa takes query, key, "
                                 "value, attn_mask, key_padding_mask and kv_lengths",
                                 name, best ? " (did you mean \"" : "", best ? best : "",
                                 best ? "\"?)" : "");
    }
    if (*has)
        return api_field_invalid(err, name, "input %s is given twice", name);
    *has = true;
    memset(t, 0, sizeof *t);
    if (!shape || !datatype)
        return api_field_invalid(err, name, "input %s needs \"shape\" and \"datatype\"", name);
    snprintf(sub, sizeof sub, "%s.shape", name);
    if (api_shape_parse(shape, sub, job->rq.limits.max_elements, t->shape, &t->rank, &t->count,
                        err) != 0)
        return -1;
    snprintf(sub, sizeof sub, "%s.datatype", name);
    api_dtype dtype = API_DTYPE_FLOAT32;
    bool json_ok;
    if (parse_datatype(datatype, name, sub, &dtype, err) != 0)
        return -1;
    if (!input_takes(name, dtype, &json_ok))
        return api_field_invalid(err, sub, "input %s does not take datatype %s; it takes %s", name,
                                 json_string_value(datatype), input_datatypes(name));
    int64_t size;
    snprintf(sub, sizeof sub, "%s.parameters", name);
    if (input_parameters(params, sub, &size, err) != 0)
        return -1;

    if (size >= 0) {
        /* Binary tensor data: the next `size` bytes after the JSON. */
        size_t want = t->count * api_dtype_size(dtype); /* count <= max_elements <= 2^59 */
        if (data)
            return api_field_invalid(
                err, name, "input %s has both \"data\" and binary_data_size; give one", name);
        if (!job->has_header_len)
            return api_error_set(err, 400, API_REASON_BAD_REQUEST, name,
                                 "input %s has binary_data_size but the request has no "
                                 "Inference-Header-Content-Length header to say where its JSON "
                                 "ends",
                                 name);
        if ((uint64_t)size != want)
            return api_field_invalid(err, name,
                                     "input %s has binary_data_size %lld but %zu %s elements take "
                                     "%zu bytes",
                                     name, (long long)size, t->count, json_string_value(datatype),
                                     want);
        if (want > job->bin_len - job->bin_used)
            return api_error_set(err, 400, API_REASON_BAD_REQUEST, name,
                                 "the binary data is truncated: input %s needs bytes %zu to %zu "
                                 "after the JSON, but only %zu follow it",
                                 name, job->bin_used, job->bin_used + want, job->bin_len);
        t->form = API_FORM_RAW;
        t->dtype = dtype;
        t->raw = job->bin + job->bin_used;
        job->bin_used += want;
        return 0;
    }
    if (!data)
        return api_field_invalid(err, name,
                                 "input %s needs \"data\" (or binary_data_size with the binary "
                                 "tensor extension)",
                                 name);
    if (!json_ok)
        return api_field_invalid(err, name,
                                 "input %s has datatype %s, which JSON cannot carry: send it as "
                                 "binary data (parameters.binary_data_size and "
                                 "Inference-Header-Content-Length)",
                                 name, json_string_value(datatype));
    return input_data(job, data, name, dtype, t, err);
}

/* ---- Outputs -------------------------------------------------------------------------------- */

static int parse_output(v2_job *job, const json_t *out, size_t index, api_error *err)
{
    char field[64], sub[128];
    const char *key, *name = NULL;
    json_t *val, *params = NULL;
    snprintf(field, sizeof field, "outputs[%zu]", index);
    if (!json_is_object(out))
        return api_field_invalid(err, field, "%s must be an object {\"name\", \"parameters\"}",
                                 field);
    json_object_foreach((json_t *)out, key, val)
    {
        if (strcmp(key, "name") == 0)
            name = json_string_value(val);
        else if (strcmp(key, "parameters") == 0)
            params = val;
        else {
            snprintf(sub, sizeof sub, "%s.%.40s", field, key);
            return api_field_invalid(err, sub,
                                     "unknown key \"%.40s\" in %s; an output has name and "
                                     "parameters",
                                     key, field);
        }
    }
    if (!name)
        return api_field_invalid(err, field, "%s needs a \"name\" (a string)", field);
    size_t o = 0, n_outputs = is_layer(job) ? OUT_LSE : N_OUTPUTS; /* a layer has no lse */
    while (o < n_outputs && strcmp(name, output_names[o]) != 0)
        o++;
    if (o == n_outputs && is_layer(job))
        return api_field_invalid(err, field,
                                 "unknown output \"%.60s\"; model %.64s has output and weights",
                                 name, job->model.name);
    if (o == n_outputs)
        return api_field_invalid(
            err, field, "unknown output \"%.60s\"; model sdpa has output, weights and lse", name);
    if (job->want[o])
        return api_field_invalid(err, field, "output %s is asked for twice", name);
    job->want[o] = true;
    if (!params || json_is_null(params))
        return 0;
    if (!json_is_object(params))
        return api_field_invalid(err, field, "%s.parameters must be an object", field);
    json_object_foreach(params, key, val)
    {
        snprintf(sub, sizeof sub, "%s.parameters.%.40s", field, key);
        if (strcmp(key, "binary_data") != 0)
            return api_field_invalid(err, sub,
                                     "unknown output parameter \"%.40s\"; an output takes "
                                     "binary_data",
                                     key);
        if (api_field_bool(val, sub, &job->binary[o], err) != 0)
            return -1;
        job->binary_set[o] = true;
    }
    return 0;
}

/* ---- Request -------------------------------------------------------------------------------- */

/* `ct` is the media type `type`, any case, with any parameters. */
static bool media_type_is(const char *ct, const char *type)
{
    size_t n = strlen(type);
    while (*ct == ' ' || *ct == '\t')
        ct++;
    if (strncasecmp(ct, type, n) != 0)
        return false;
    ct += n;
    while (*ct == ' ' || *ct == '\t')
        ct++;
    return *ct == '\0' || *ct == ';';
}

/* JSON; application/octet-stream, which the binary extension's clients send; and
 * application/x-www-form-urlencoded, which `curl -d` sends unless told otherwise and which
 * KServe's own examples rely on (Triton does not look at the Content-Type at all). */
bool api_v2_content_type_ok(const char *ct)
{
    return !ct || api_field_json_type(ct) || media_type_is(ct, "application/octet-stream") ||
           media_type_is(ct, "application/x-www-form-urlencoded");
}

/* Inference-Header-Content-Length: decimal digits, optionally surrounded by blanks. */
bool api_v2_header_len_parse(const char *s, size_t *out)
{
    size_t n = 0;
    int digits = 0;
    while (*s == ' ' || *s == '\t')
        s++;
    for (; *s >= '0' && *s <= '9'; s++, digits++) {
        if (n > (SIZE_MAX - 9) / 10)
            return false;
        n = n * 10 + (size_t)(*s - '0');
    }
    while (*s == ' ' || *s == '\t')
        s++;
    if (digits == 0 || *s != '\0')
        return false;
    *out = n;
    return true;
}

static int parse_request(v2_job *job, api_error *err)
{
    const api_call *call = job->rq.call;
    const char *body = call->body ? call->body : "";
    size_t header_len = call->body_len;
    const json_t *root, *inputs = NULL, *outputs = NULL, *params = NULL, *id = NULL;
    const char *key;
    json_t *val;

    if (!api_v2_content_type_ok(call->content_type))
        return api_error_set(err, 415, API_REASON_BAD_REQUEST, NULL,
                             "Content-Type \"%.80s\" is not supported; send application/json "
                             "(or application/octet-stream with binary tensor data)",
                             call->content_type);
    if (call->body_len > job->rq.limits.max_body_bytes)
        return api_error_set(err, 413, API_REASON_TOO_LARGE, NULL,
                             "the body has %zu bytes, more than the %zu that --max-body-bytes "
                             "allows",
                             call->body_len, job->rq.limits.max_body_bytes);
    if (call->inference_header_length) {
        if (!api_v2_header_len_parse(call->inference_header_length, &header_len))
            return api_error_set(err, 400, API_REASON_BAD_REQUEST, NULL,
                                 "Inference-Header-Content-Length \"%.40s\" is not a byte count",
                                 call->inference_header_length);
        if (header_len > call->body_len)
            return api_error_set(err, 400, API_REASON_BAD_REQUEST, NULL,
                                 "Inference-Header-Content-Length is %zu but the body has only "
                                 "%zu bytes",
                                 header_len, call->body_len);
        job->has_header_len = true;
    }
    job->bin = body + header_len;
    job->bin_len = call->body_len - header_len;

    if (api_req_parse(&job->rq, body, header_len, err) != 0)
        return -1;
    root = job->rq.body.root;
    json_object_foreach((json_t *)root, key, val)
    {
        if (strcmp(key, "inputs") == 0)
            inputs = val;
        else if (strcmp(key, "outputs") == 0)
            outputs = val;
        else if (strcmp(key, "parameters") == 0)
            params = val;
        else if (strcmp(key, "id") == 0)
            id = val;
        else if (strcmp(key, "model_name") == 0 || strcmp(key, "model_version") == 0) {
            /* Triton's own examples send them; they must agree with the path. */
            const char *s = json_string_value(val);
            const char *want = key[6] == 'n' ? job->model.name : API_V2_VERSION;
            if (!s || strcmp(s, want) != 0)
                return api_field_invalid(err, key, "%s must be \"%s\", as in the path", key, want);
        } else {
            return api_field_invalid(err, key,
                                     "unknown field \"%.60s\"; an inference request has id, "
                                     "parameters, inputs and outputs",
                                     key);
        }
    }
    if (id && !json_is_null(id)) {
        const char *s;
        size_t n;
        if (!api_body_string_get(&job->rq.body, id, &s, &n))
            return api_field_invalid(err, "id", "id must be a string");
        job->id = api_req_alloc(&job->rq, n + 1, err);
        if (!job->id)
            return -1;
        memcpy(job->id, s, n);
        job->id[n] = '\0';
        job->id_len = n;
        job->has_id = true;
    }
    if (params && !json_is_null(params) && parse_parameters(job, params, err) != 0)
        return -1;
    if (!json_is_array(inputs))
        return api_field_invalid(err, "inputs", "inputs must be an array of input tensors");
    for (size_t i = 0; i < json_array_size(inputs); i++)
        if (parse_input(job, json_array_get(inputs, i), i, err) != 0)
            return -1;
    if (job->bin_used != job->bin_len)
        return api_error_set(err, 400, API_REASON_BAD_REQUEST, NULL,
                             "%zu bytes follow the JSON but the inputs' binary_data_size add up "
                             "to %zu",
                             job->bin_len, job->bin_used);
    if (is_layer(job) && !job->l.r.has_input)
        return api_field_invalid(err, "input",
                                 "input \"input\" is required (the tokens, [L, E] or [B, L, E])");
    if (!is_layer(job) && (!job->s.r.has_q || !job->s.r.has_k || !job->s.r.has_v)) {
        const char *missing = !job->s.r.has_q ? "query" : !job->s.r.has_k ? "key" : "value";
        return api_field_invalid(err, missing, "input %s is required", missing);
    }
    if (outputs && !json_is_null(outputs)) {
        if (!json_is_array(outputs))
            return api_field_invalid(err, "outputs", "outputs must be an array");
        job->outputs_given = true;
        for (size_t i = 0; i < json_array_size(outputs); i++)
            if (parse_output(job, json_array_get(outputs, i), i, err) != 0)
                return -1;
    }
    return 0;
}

/* What the outputs say to compute: weights and lse only when returned. */
static int settle_outputs(v2_job *job, api_error *err)
{
    eng_weights_mode *weights = weights_of(job);
    bool no_lse = false, *return_lse = is_layer(job) ? &no_lse : &job->s.r.return_lse;
    int64_t *timeout_ms = timeout_ms_of(job);
    if (!job->outputs_given) {
        job->want[OUT_OUTPUT] = true;
        job->want[OUT_WEIGHTS] = *weights != ENG_WEIGHTS_NONE;
        job->want[OUT_LSE] = *return_lse;
    } else {
        if (job->want[OUT_WEIGHTS] && job->weights_param_off)
            return api_field_invalid(err, "return_weights",
                                     "output weights is asked for but return_weights is false");
        if (job->want[OUT_LSE] && job->lse_param_set && !*return_lse)
            return api_field_invalid(err, "return_lse",
                                     "output lse is asked for but return_lse is false");
        if (job->want[OUT_WEIGHTS] && *weights == ENG_WEIGHTS_NONE)
            *weights = ENG_WEIGHTS_PER_HEAD;
        if (!job->want[OUT_WEIGHTS])
            *weights = ENG_WEIGHTS_NONE;
        *return_lse = job->want[OUT_LSE];
    }
    for (int o = 0; o < N_OUTPUTS; o++)
        if (!job->binary_set[o])
            job->binary[o] = job->binary_default;
    *timeout_ms = api_v2_timeout_ms(*timeout_ms, job->timeout_us);
    return 0;
}

int64_t api_v2_timeout_ms(int64_t timeout_ms, int64_t timeout_us)
{
    int64_t ms = (timeout_us + 999) / 1000;
    if (timeout_us > 0 && (timeout_ms == 0 || ms < timeout_ms))
        return ms;
    return timeout_ms;
}

/* ---- Reply ---------------------------------------------------------------------------------- */

static const api_out_shape *output_shape(const v2_job *job, int o)
{
    if (is_layer(job))
        return o == OUT_OUTPUT ? &job->l.os : &job->l.ws;
    return o == OUT_OUTPUT ? &job->s.os : o == OUT_WEIGHTS ? &job->s.ws : &job->s.ls;
}

/* Where output o is (or will be) written. */
static float **output_slot(v2_job *job, int o)
{
    if (is_layer(job))
        return o == OUT_OUTPUT ? &job->l.out : &job->l.weights;
    return o == OUT_OUTPUT ? &job->s.out : o == OUT_WEIGHTS ? &job->s.weights : &job->s.lse;
}

static float *output_data(const v2_job *job, int o)
{
    if (is_layer(job))
        return o == OUT_OUTPUT ? job->l.out : job->l.weights;
    return o == OUT_OUTPUT ? job->s.out : o == OUT_WEIGHTS ? job->s.weights : job->s.lse;
}

/* ---- The model's path (sdpa.c or layer.c) --------------------------------------------------- */

static int model_check(v2_job *job, api_error *err)
{
    const eng_layer *l = job->model.layer;
    if (!is_layer(job))
        return api_sdpa_check(&job->s, err);
    if (l->kdim != l->vdim)
        return api_field_invalid(err, "memory",
                                 "model %.64s has kdim %lld and vdim %lld: its keys and values "
                                 "come from different tokens, which the v2 inputs cannot carry; "
                                 "use POST /v1/mha with key and value",
                                 job->model.name, (long long)l->kdim, (long long)l->vdim);
    job->l.layer = l;
    return api_layer_check(&job->l, err);
}

static bool model_bytes(v2_job *job, size_t *tensors, size_t *scratch)
{
    return is_layer(job) ? api_layer_bytes(&job->l, false, tensors, scratch)
                         : api_sdpa_bytes(&job->s, false, tensors, scratch);
}

/* Whether output o is computed (whether or not it is returned). */
static bool model_computes(v2_job *job, int o)
{
    if (o == OUT_OUTPUT)
        return true;
    if (o == OUT_WEIGHTS)
        return *weights_of(job) != ENG_WEIGHTS_NONE;
    return !is_layer(job) && job->s.r.return_lse;
}

static int model_decode(v2_job *job, api_error *err)
{
    return is_layer(job) ? api_layer_decode(&job->l, err) : api_sdpa_decode(&job->s, err);
}

static int model_run(v2_job *job, int64_t *compute_ns, api_error *err)
{
    return is_layer(job) ? api_layer_run(&job->l, compute_ns, err)
                         : api_sdpa_run(&job->s, compute_ns, err);
}

/* The JSON up to the first output's data: names, shapes and, for binary outputs, sizes. An
 * upper bound of its length: ids are escaped at most 6 bytes per byte. */
static size_t header_bound(const v2_job *job)
{
    size_t n = 512 + strlen(job->model.name) * 6;
    if (job->has_id)
        n += job->id_len * 6;
    for (int o = 0; o < N_OUTPUTS; o++)
        if (job->want[o])
            n += 256;
    return n;
}

/* Appends the output entries; JSON outputs with their data (after the compute), binary ones
 * with their sizes only. */
static int write_outputs(v2_job *job, api_jsonw *w, api_error *err)
{
    bool first = true;
    for (int o = 0; o < N_OUTPUTS; o++) {
        const api_out_shape *sh = output_shape(job, o);
        if (!job->want[o])
            continue;
        api_jsonw_cstr(w, first ? "" : ",");
        first = false;
        api_jsonw_printf(w, "{\"name\":\"%s\",\"datatype\":\"FP32\",\"shape\":[", output_names[o]);
        for (int d = 0; d < sh->rank; d++) {
            if (d > 0)
                api_jsonw_char(w, ',');
            api_jsonw_int(w, sh->shape[d]);
        }
        api_jsonw_char(w, ']');
        if (job->binary[o]) {
            api_jsonw_printf(w, ",\"parameters\":{\"binary_data_size\":%zu}}", sh->count * 4);
            continue;
        }
        size_t bad = 0;
        const int64_t flat[1] = {(int64_t)sh->count};
        api_jsonw_cstr(w, ",\"data\":");
        switch (api_tensor_encode(w, output_data(job, o), 1, flat, API_FORM_NESTED,
                                  o == OUT_LSE ? API_ENCODE_NEG_INF_NULL : 0, NULL, &bad)) {
        case API_ENCODE_OK:
            break;
        case API_ENCODE_NONFINITE: {
            char idx[128];
            return api_field_invalid(
                err, output_names[o],
                "the result %s%s is %s: it does not fit in float32 (inputs too large for "
                "float32 arithmetic?)",
                output_names[o],
                api_index_format(idx, sizeof idx, bad, sh->rank, sh->shape, sh->rank),
                isnan(output_data(job, o)[bad]) ? "NaN" : "infinite");
        }
        case API_ENCODE_FULL:
            return api_field_writer_error(w, err);
        }
        api_jsonw_char(w, '}');
    }
    return 0;
}

static void write_header_start(v2_job *job, api_jsonw *w)
{
    api_jsonw_cstr(w, "{\"model_name\":");
    api_jsonw_string(w, job->model.name, strlen(job->model.name));
    api_jsonw_cstr(w, ",\"model_version\":\"" API_V2_VERSION "\"");
    if (job->has_id) {
        api_jsonw_cstr(w, ",\"id\":");
        api_jsonw_string(w, job->id, job->id_len);
    }
    api_jsonw_cstr(w, ",\"outputs\":[");
}

/* Checks a binary output for values the protocol's JSON could not carry either: the engine
 * never returns them, so one is an error, never silently sent. */
static int check_finite(v2_job *job, int o, api_error *err)
{
    const api_out_shape *sh = output_shape(job, o);
    const float *data = output_data(job, o);
    for (size_t i = 0; i < sh->count; i++) {
        if (!isfinite(data[i]) && !(o == OUT_LSE && data[i] == -INFINITY)) {
            char idx[128];
            return api_field_invalid(
                err, output_names[o],
                "the result %s%s is %s: it does not fit in float32 (inputs too large for "
                "float32 arithmetic?)",
                output_names[o],
                api_index_format(idx, sizeof idx, i, sh->rank, sh->shape, sh->rank),
                isnan(data[i]) ? "NaN" : "infinite");
        }
    }
    return 0;
}

static bool add_size(size_t *acc, size_t n)
{
    return !__builtin_add_overflow(*acc, n, acc);
}

static int infer(v2_job *job, api_reply *reply, api_error *err)
{
    bool all_binary = true, any_binary = false;
    size_t binary_bytes = 0, json_text = 0;
    job->s.rq = &job->rq;
    job->l.rq = &job->rq;

    if (parse_request(job, err) != 0 || settle_outputs(job, err) != 0 || model_check(job, err) != 0)
        return -1;
    for (int o = 0; o < N_OUTPUTS; o++) {
        if (!job->want[o])
            continue;
        const api_out_shape *sh = output_shape(job, o);
        if (job->binary[o]) {
            any_binary = true;
            binary_bytes += sh->count * 4; /* within --max-elements */
        } else {
            all_binary = false;
            json_text += api_tensor_encoded_bound(
                             API_FORM_NESTED, 1, (const int64_t[]){(int64_t)sh->count}, sh->count) +
                         64;
        }
    }

    /* Size everything, reserve it, then allocate and decode. When every output is binary the
     * engine writes into the reply itself, so the outputs count once, as part of the reply. */
    size_t tensors, scratch, header = header_bound(job), reply_bytes;
    bool ok = model_bytes(job, &tensors, &scratch);
    for (int o = 0; o < N_OUTPUTS; o++)
        if (model_computes(job, o) && !(all_binary && job->want[o]))
            ok = ok && add_size(&tensors, api_aligned_size(output_shape(job, o)->count * 4));
    reply_bytes = header + V2_BINARY_ALIGN;
    ok = ok && add_size(&reply_bytes, json_text) && add_size(&reply_bytes, binary_bytes);
    if (api_req_reserve_run(&job->rq, ok, tensors, reply_bytes, scratch, err) != 0)
        return -1;

    api_jsonw w;
    api_jsonw_init(&w, reply_bytes);
    char *blob = NULL; /* all binary: the whole reply, JSON then outputs */
    size_t json_len = 0;
    if (all_binary) {
        write_header_start(job, &w);
        if (write_outputs(job, &w, err) != 0) {
            api_jsonw_free(&w);
            return -1;
        }
        api_jsonw_cstr(&w, "]}");
        if (w.state != API_JSONW_OK) {
            api_jsonw_free(&w);
            return api_field_writer_error(&w, err);
        }
        /* Pad with spaces (JSON allows them after the value) so that the first output starts
         * on a 64-byte boundary of a 64-byte-aligned buffer. */
        json_len = (w.len + V2_BINARY_ALIGN - 1) / V2_BINARY_ALIGN * V2_BINARY_ALIGN;
        blob = eng_buf_alloc(json_len + binary_bytes); /* 64-byte aligned */
        if (!blob) {
            api_jsonw_free(&w);
            return api_error_set(err, 503, API_REASON_MEMORY, NULL, "out of memory for the reply");
        }
        memcpy(blob, w.data, w.len);
        memset(blob + w.len, ' ', json_len - w.len);
        api_jsonw_free(&w);
        size_t at = json_len;
        for (int o = 0; o < N_OUTPUTS; o++) {
            if (!job->want[o])
                continue;
            *output_slot(job, o) = (float *)(void *)(blob + at);
            at += output_shape(job, o)->count * 4;
        }
    }

    int rc = model_decode(job, err);
    reply->decode_ns = eng_now_ns() - job->rq.call_ns;
    rc = rc != 0 ? rc : model_run(job, &reply->compute_ns, err);
    int64_t t_encode = eng_now_ns();
    for (int o = 0; rc == 0 && o < N_OUTPUTS; o++)
        if (job->want[o] && job->binary[o])
            rc = check_finite(job, o, err);
    if (rc == 0 && !all_binary) {
        /* JSON outputs: the text after the compute, binary ones appended in order. */
        write_header_start(job, &w);
        rc = write_outputs(job, &w, err);
        api_jsonw_cstr(&w, "]}");
        if (rc == 0 && !any_binary)
            api_jsonw_char(&w, '\n');
        json_len = w.len;
        for (int o = 0; rc == 0 && o < N_OUTPUTS; o++)
            if (job->want[o] && job->binary[o])
                api_jsonw_mem(&w, output_data(job, o), output_shape(job, o)->count * 4);
        if (rc == 0 && w.state != API_JSONW_OK)
            rc = api_field_writer_error(&w, err);
        if (rc == 0) {
            blob = w.data;
            w.data = NULL;
        }
        api_jsonw_free(&w);
    }
    if (rc != 0) {
        eng_buf_free(blob);
        return -1;
    }
    reply->status = 200;
    reply->reason = API_REASON_NONE;
    reply->content_type = any_binary ? "application/octet-stream" : "application/json";
    reply->body = blob;
    reply->body_len = json_len + binary_bytes;
    reply->inference_header_len = any_binary ? (int64_t)json_len : 0;
    reply->inferences = is_layer(job) ? job->l.B : job->s.r.B;
    reply->encode_ns = eng_now_ns() - t_encode;
    return 0;
}

void api_v2_infer(const api_call *call, api_reply *reply)
{
    v2_job *job = calloc(1, sizeof *job);
    api_error err;
    memset(&err, 0, sizeof err);
    memset(reply, 0, sizeof *reply);
    if (!job) {
        api_error_set(&err, 503, API_REASON_MEMORY, NULL, "out of memory");
        api_v2_reply_from_error(reply, &err);
        return;
    }
    if (!model_find(call, &job->model, reply)) {
        free(job);
        return;
    }
    api_req_init(&job->rq, call);
    if (infer(job, reply, &err) != 0) {
        api_v2_reply_from_error(reply, &err);
        if (reply->decode_ns == 0)
            reply->decode_ns = eng_now_ns() - job->rq.call_ns;
    }
    api_layer_free(&job->l);
    api_req_free(&job->rq);
    free(job);
}
