/*
 * v2_model.c - what each KServe v2 model is: its tensors, told to clients three ways from one
 * table, so that the metadata, Triton's model configuration and readiness never disagree.
 *
 * GET /v2 -> {"name": "attnd", "version", "extensions": ["binary_tensor_data", "parameters",
 * "statistics"], "engine": {"kernels", "bf16", "cpu", "openblas_core"}}.
 *
 * GET /v2/models/{m}[/versions/1] -> {"name", "versions": ["1"], "platform", "inputs": [{"name",
 * "datatype", "shape"}], "outputs": [...]}, -1 for variable dimensions.
 *
 * GET /v2/models/{m}[/versions/1]/config -> Triton's model configuration, as tritonclient's
 * get_model_config and perf_analyzer read it: {"name", "platform", "backend", "max_batch_size":
 * 0 (the batch axis is part of each shape), "input": [{"name", "data_type": "TYPE_FP32", "dims",
 * "optional", ...}], "output": [...], "dynamic_batching": {"max_queue_delay_microseconds": 0,
 * "priority_levels", "default_priority_level"}, "model_transaction_policy": {"decoupled":
 * false}, "response_cache": {"enable": false}}. Triton keeps a model's priority levels inside
 * "dynamic_batching", the scheduler that owns its priority queue, and that is where
 * tritonclient users look for them. max_batch_size stays 0 because every request's batch axis is
 * part of its shape (clients send whole shapes, and perf_analyzer adds no batch dimension), and
 * a queue delay of 0 holds nothing back: the object says what attnd does, one queue ordered by
 * priority, where the requests of one layer model that wait while the engine is busy run as
 * one engine call, each with its own shapes and reply (--max-batch-rows; model sdpa's run
 * alone). With sessions on (call->sessions), model sdpa and every
 * layer whose keys and values can be a cache of its own tokens (self-attention, no bias_kv:
 * api__layer_steps_a_cache) add "sequence_batching" {"max_sequence_idle_microseconds":
 * --session-ttl-s}: their requests may carry sequence_id / sequence_start / sequence_end
 * (v2_infer.c).
 *
 * GET .../ready -> {"name", "ready": true}.
 *
 * The tensors listed are those every request may send and what a request gets back when it
 * asks for nothing else: an infer without "outputs" returns every listed output, as the KServe
 * v2 protocol says (api__v2_output_listed). Each shape is the canonical layout, PyTorch's
 * [B, H, L, D] for sdpa and [B, L, E] for a layer; the protocol has one rank and one datatype
 * per tensor, so the other forms the infer route takes (ranks 2 and 3, FP16/BF16 binary, FP32
 * masks, INT32 lengths; see v2_infer.c) are documented there and in api/openapi.yaml. The
 * attention weights are not a listed output: they are L x S per head, and clients that request
 * every listed output (perf_analyzer does) would otherwise measure the weights rather than
 * attention. A request gets them with the parameter return_weights or by naming "weights" in
 * its outputs.
 */
#include <stdio.h>
#include <string.h>

#include "api/proto/v2.h"
#include "api/wire/reply.h"

const char *const api__v2_extensions[] = {"binary_tensor_data", "parameters", "statistics"};
const size_t api__v2_n_extensions = sizeof api__v2_extensions / sizeof api__v2_extensions[0];

#define VAR4                                                                                       \
    {                                                                                              \
        -1, -1, -1, -1                                                                             \
    }

static const model_desc sdpa_desc = {
    .platform = "attnd_sdpa",
    .in = {{"query", "FP32", 4, VAR4, false},
           {"key", "FP32", 4, VAR4, false},
           {"value", "FP32", 4, VAR4, false},
           {"attn_mask", "BOOL", 4, VAR4, true},
           {"key_padding_mask", "BOOL", 2, VAR4, true},
           {"kv_lengths", "INT64", 1, VAR4, true},
           {"sinks", "FP32", 1, VAR4, true}},
    .n_in = 7,
    .out = {{"output", "FP32", 4, VAR4, false}, {"lse", "FP32", 3, VAR4, false}},
    .n_out = 2,
};

/* A layer's tensors, with its widths as fixed dimensions. */
static model_desc layer_desc(const eng_layer *l)
{
    model_desc d = {
        .platform = "attnd_mha",
        .in = {{"input", "FP32", 3, {-1, -1, l->embed_dim}, false},
               {"memory", "FP32", 3, {-1, -1, l->kdim}, true},
               {"attn_mask", "BOOL", 4, VAR4, true},
               {"key_padding_mask", "BOOL", 2, VAR4, true}},
        .n_in = 4,
        .out = {{"output", "FP32", 3, {-1, -1, l->embed_dim}, false}},
        .n_out = 1,
    };
    if (l->decoder) { /* attends over its own input tokens: no memory */
        d.in[1] = d.in[2];
        d.in[2] = d.in[3];
        d.n_in = 3;
    }
    return d;
}

/* A layer model's settings as {name: value} pairs: as JSON values in the metadata, as Triton's
 * {"string_value": text} in the configuration. Every layer model says how many layers it has
 * (a request of a model of several names one with the parameter "layer"); a decoder adds its
 * first layer's: its family, index in the checkpoint, heads, positions, window and dtype. */
static void write_layer_parameters(api_buf *w, const api_model *m, bool triton)
{
    const eng_layer *l = m->layer[0];
    const eng_decoder_spec *sp = &l->spec;
    char values[9][64];
    const char *names[9] = {"layers",   "family",     "layer",  "num_heads", "num_kv_heads",
                            "head_dim", "positional", "window", "dtype"};
    int n = l->decoder ? 9 : 1;
    snprintf(values[0], sizeof values[0], "%lld", (long long)m->layers);
    snprintf(values[1], sizeof values[1], "%s", m->about ? m->about->family : "decoder");
    snprintf(values[2], sizeof values[2], "%lld", (long long)(m->about ? m->about->layer : 0));
    snprintf(values[3], sizeof values[3], "%lld", (long long)l->num_heads);
    snprintf(values[4], sizeof values[4], "%lld", (long long)l->num_kv_heads);
    snprintf(values[5], sizeof values[5], "%lld", (long long)eng_layer_head_dim(l));
    snprintf(values[6], sizeof values[6], "%s", sp->rope.rotary_dim ? "rope" : "none");
    snprintf(values[7], sizeof values[7], "%lld", (long long)sp->window);
    snprintf(values[8], sizeof values[8], "%s", l->dtype);
    api_buf_cstr(w, ",\"parameters\":{");
    for (int i = 0; i < n; i++) {
        bool text = i == 1 || i == 6 || i == 8;
        api_buf_printf(w, "%s\"%s\":", i ? "," : "", names[i]);
        if (triton)
            api_buf_cstr(w, "{\"string_value\":");
        if (text || triton)
            api_buf_json_string(w, values[i], strlen(values[i]));
        else
            api_buf_cstr(w, values[i]);
        if (triton)
            api_buf_char(w, '}');
    }
    api_buf_char(w, '}');
}

int api__v2_model_lookup(const api_models *models, const char *name, const char *version,
                         model_ref *m, api__error *err)
{
    name = name ? name : "";
    memset(m, 0, sizeof *m);
    m->name = name;
    if (strcmp(name, "sdpa") == 0) {
        m->kind = MODEL_SDPA;
    } else if (models && (m->model = api_models_find(models, name)) != NULL) {
        m->kind = MODEL_LAYER;
    } else {
        api_buf w;
        api_buf_init(&w, 1024);
        for (size_t i = 0; models && i < api_models_count(models); i++) {
            api_buf_cstr(&w, ", ");
            api_buf_cstr(&w, api_models_at(models, i)->name);
        }
        api__error_set(err, API_STATUS_NOT_FOUND, API_REASON_BAD_REQUEST, NULL,
                       "unknown model \"%.64s\"; models: sdpa%.*s", name,
                       w.state == API_BUF_OK ? (int)(w.len < 600 ? w.len : 600) : 0,
                       w.data ? w.data : "");
        api_buf_free(&w);
        return -1;
    }
    if (version && strcmp(version, API_V2_VERSION) != 0)
        return api__error_set(
            err, API_STATUS_NOT_FOUND, API_REASON_BAD_REQUEST, NULL,
            "model \"%.64s\" has no version \"%.64s\"; its only version is \"" API_V2_VERSION "\"",
            name, version);
    return 0;
}

bool api__v2_model_find(const api_call *call, model_ref *m, api_reply *reply)
{
    api__error err = {0};
    if (api__v2_model_lookup(call->models, call->model, call->version, m, &err) == 0)
        return true;
    memset(reply, 0, sizeof *reply);
    api__reply_from_error(reply, API_ERRORS_V2, &err);
    return false;
}

bool api_v2_model_known(const api_models *models, const char *model, const char *version)
{
    if (!model || (version && strcmp(version, API_V2_VERSION) != 0))
        return false;
    return strcmp(model, "sdpa") == 0 || (models && api_models_find(models, model) != NULL);
}

model_desc api__v2_model_desc(const model_ref *m)
{
    return m->kind == MODEL_SDPA ? sdpa_desc : layer_desc(m->model->layer[0]);
}

bool api__v2_output_listed(const model_ref *m, int o)
{
    model_desc d = api__v2_model_desc(m);
    for (int i = 0; i < d.n_out; i++)
        if (strcmp(d.out[i].name, api__out_names[o]) == 0)
            return true;
    return false;
}

void api_v2_server_metadata(api_reply *reply)
{
    api_buf w;
    memset(reply, 0, sizeof *reply);
    api_buf_init(&w, 4096);
    api_buf_cstr(&w, "{\"name\":\"" API__V2_SERVER_NAME "\",\"version\":\"" API__V2_SERVER_VERSION
                     "\",\"extensions\":[");
    for (size_t i = 0; i < api__v2_n_extensions; i++) {
        if (i > 0)
            api_buf_char(&w, ',');
        api_buf_json_string(&w, api__v2_extensions[i], strlen(api__v2_extensions[i]));
    }
    /* What the engine computes with, as the start-up log and attnd_engine_info say: an
     * extra member, which v2 clients ignore and operators can read without a scrape. */
    eng_engine_info info;
    eng_engine_info_get(&info);
    api_buf_cstr(&w, "],\"engine\":{\"kernels\":");
    api_buf_json_string(&w, info.kernels, strlen(info.kernels));
    api_buf_cstr(&w, ",\"bf16\":");
    api_buf_json_string(&w, info.bf16, strlen(info.bf16));
    api_buf_cstr(&w, ",\"cpu\":");
    api_buf_json_string(&w, info.cpu, strlen(info.cpu));
    api_buf_cstr(&w, ",\"openblas_core\":");
    api_buf_json_string(&w, info.openblas_core, strlen(info.openblas_core));
    api_buf_cstr(&w, "}}\n");
    api__reply_json(reply, &w, API_ERRORS_V2);
}

static void write_dims(api_buf *w, const tensor_desc *t)
{
    api_buf_char(w, '[');
    for (int d = 0; d < t->rank; d++) {
        if (d > 0)
            api_buf_char(w, ',');
        api_buf_int(w, t->dims[d]);
    }
    api_buf_char(w, ']');
}

/* A list of $metadata_tensor. */
static void write_meta_tensors(api_buf *w, const tensor_desc *t, int n)
{
    api_buf_char(w, '[');
    for (int i = 0; i < n; i++) {
        if (i > 0)
            api_buf_char(w, ',');
        api_buf_printf(w, "{\"name\":\"%s\",\"datatype\":\"%s\",\"shape\":", t[i].name,
                       t[i].datatype);
        write_dims(w, &t[i]);
        api_buf_char(w, '}');
    }
    api_buf_char(w, ']');
}

/* A list of Triton's ModelInput (is_input) or ModelOutput. */
static void write_config_tensors(api_buf *w, const tensor_desc *t, int n, bool is_input)
{
    api_buf_char(w, '[');
    for (int i = 0; i < n; i++) {
        if (i > 0)
            api_buf_char(w, ',');
        api_buf_printf(w, "{\"name\":\"%s\",\"data_type\":\"TYPE_%s\",\"dims\":", t[i].name,
                       t[i].datatype);
        write_dims(w, &t[i]);
        api_buf_cstr(w, ",\"is_shape_tensor\":false");
        if (is_input)
            api_buf_printf(w,
                           ",\"format\":\"FORMAT_NONE\",\"allow_ragged_batch\":false,"
                           "\"optional\":%s}",
                           t[i].optional ? "true" : "false");
        else
            api_buf_cstr(w, ",\"label_filename\":\"\"}");
    }
    api_buf_char(w, ']');
}

/* Starts a reply about call's model, {"name": ..., in *w; false, with the 404 in `reply`, when
 * there is no such model or version. */
static bool model_reply_start(const api_call *call, api_reply *reply, model_ref *m, api_buf *w)
{
    memset(reply, 0, sizeof *reply);
    if (!api__v2_model_find(call, m, reply))
        return false;
    api_buf_init(w, 8192);
    api_buf_cstr(w, "{\"name\":");
    api_buf_json_string(w, m->name, strlen(m->name));
    return true;
}

void api_v2_model_metadata(const api_call *call, api_reply *reply)
{
    model_ref m;
    api_buf w;
    if (!model_reply_start(call, reply, &m, &w))
        return;
    model_desc d = api__v2_model_desc(&m);
    api_buf_printf(
        &w, ",\"versions\":[\"" API_V2_VERSION "\"],\"platform\":\"%s\",\"inputs\":", d.platform);
    write_meta_tensors(&w, d.in, d.n_in);
    api_buf_cstr(&w, ",\"outputs\":");
    write_meta_tensors(&w, d.out, d.n_out);
    if (m.kind != MODEL_SDPA)
        write_layer_parameters(&w, m.model, false);
    api_buf_cstr(&w, "}\n");
    api__reply_json(reply, &w, API_ERRORS_V2);
}

void api_v2_model_config(const api_call *call, api_reply *reply)
{
    model_ref m;
    api_buf w;
    if (!model_reply_start(call, reply, &m, &w))
        return;
    model_desc d = api__v2_model_desc(&m);
    api_buf_printf(&w,
                   ",\"platform\":\"%s\",\"backend\":\"attnd\",\"version_policy\":{\"specific\":"
                   "{\"versions\":[" API_V2_VERSION "]}},\"max_batch_size\":0,\"input\":",
                   d.platform);
    write_config_tensors(&w, d.in, d.n_in, true);
    api_buf_cstr(&w, ",\"output\":");
    write_config_tensors(&w, d.out, d.n_out, false);
    api_limits limits = call->limits ? *call->limits : api_limits_default();
    api_buf_printf(&w,
                   ",\"dynamic_batching\":{\"max_queue_delay_microseconds\":0,"
                   "\"priority_levels\":%u,\"default_priority_level\":%u}",
                   limits.priority_levels, limits.default_priority_level);
    api_buf_cstr(&w, ",\"model_transaction_policy\":{\"decoupled\":false},"
                     "\"response_cache\":{\"enable\":false}");
    if (call->sessions && (m.kind == MODEL_SDPA || api__layer_steps_a_cache(m.model->layer[0])))
        api_buf_printf(&w,
                       ",\"sequence_batching\":{\"max_sequence_idle_microseconds\":%lld,"
                       "\"direct\":{}}",
                       (long long)api__sessions_default_ttl(call->sessions) * 1000000);
    if (m.kind != MODEL_SDPA)
        write_layer_parameters(&w, m.model, true);
    api_buf_cstr(&w, "}\n");
    api__reply_json(reply, &w, API_ERRORS_V2);
}

void api_v2_model_ready(const api_call *call, api_reply *reply)
{
    model_ref m;
    api_buf w;
    if (!model_reply_start(call, reply, &m, &w))
        return;
    api_buf_cstr(&w, ",\"ready\":true}\n");
    api__reply_json(reply, &w, API_ERRORS_V2);
}

static void duration_json(api_buf *b, const char *name, api_stat_duration d, bool last)
{
    api_buf_printf(b, "\"%s\":{\"count\":%llu,\"ns\":%llu}%s", name, (unsigned long long)d.count,
                   (unsigned long long)d.ns, last ? "" : ",");
}

void api_v2_statistics_json(const api_model_stats *st, size_t n, api_buf *b)
{
    const api_stat_duration none = {0, 0};
    api_buf_cstr(b, "{\"model_stats\":[");
    for (size_t i = 0; i < n; i++) {
        api_buf_cstr(b, i == 0 ? "{\"name\":" : ",{\"name\":");
        api_buf_json_string(b, st[i].name, strlen(st[i].name));
        api_buf_printf(b,
                       ",\"version\":\"" API_V2_VERSION "\",\"last_inference\":%llu,"
                       "\"inference_count\":%llu,\"execution_count\":%llu,\"inference_stats\":{",
                       (unsigned long long)st[i].last_inference_ms,
                       (unsigned long long)st[i].inference_count,
                       (unsigned long long)st[i].execution_count);
        duration_json(b, "success", st[i].success, false);
        duration_json(b, "fail", st[i].fail, false);
        duration_json(b, "queue", st[i].queue, false);
        duration_json(b, "compute_input", st[i].compute_input, false);
        duration_json(b, "compute_infer", st[i].compute_infer, false);
        duration_json(b, "compute_output", st[i].compute_output, false);
        duration_json(b, "cache_hit", none, false);
        duration_json(b, "cache_miss", none, true);
        api_buf_cstr(b, "},\"batch_stats\":[]}");
    }
    api_buf_cstr(b, "]}\n");
}
