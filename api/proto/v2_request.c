/*
 * v2_request.c - the KServe v2 inference request turned into a job (proto/v2.h): the
 * Content-Type and Inference-Header-Content-Length, the parameters, the inputs (JSON data or
 * binary tensor data after the JSON) and the outputs asked for. The protocol, and what each
 * model takes, is described at the top of v2_infer.c, which runs the job and writes the reply.
 */
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "api/proto/v2.h"
#include "api/wire/http_header.h"
#include "api/wire/timeout.h"

/* ---- Datatypes ------------------------------------------------------------------------------ */

/* The v2 datatypes attnd reads, and the wire dtype each is. */
static const struct {
    const char *name;
    api__dtype dtype;
} v2_datatypes[] = {
    {"FP32", API_DTYPE_FLOAT32}, {"FP16", API_DTYPE_FLOAT16}, {"BF16", API_DTYPE_BFLOAT16},
    {"BOOL", API_DTYPE_BOOL},    {"INT64", API_DTYPE_INT64},  {"INT32", API_DTYPE_INT32},
};

/* The others of the protocol (and Triton's), which no input of attnd takes. */
static const char *const v2_other_datatypes[] = {"UINT8", "UINT16", "UINT32", "UINT64",
                                                 "INT8",  "INT16",  "FP64",   "BYTES"};

/* ---- Parameters ----------------------------------------------------------------------------- */

typedef int (*param_fn)(v2_job *job, const json_t *v, const char *name, api__error *err);

static int p_output_dtype(v2_job *job, const json_t *v, const char *name, api__error *err)
{
    eng_precision p;
    if (api__option_precision(v, name, &p, err) != 0)
        return -1;
    job->bf16_out = p == ENG_PRECISION_BFLOAT16;
    return 0;
}

/* A window side: a non-negative integer, or -1 for unbounded (parameters cannot be null). */
static int window_side(const json_t *v, const char *name, bool *set, int64_t *out, api__error *err)
{
    int64_t n;
    if (json_is_integer(v) && json_integer_value(v) > API_WINDOW_MAX) {
        *set = false; /* reaches past every position: unbounded */
        return 0;
    }
    if (api__option_int(v, name, -1, API_WINDOW_MAX, &n, err) != 0)
        return -1;
    *set = n >= 0;
    *out = n >= 0 ? n : 0;
    return 0;
}

static int p_window_left(v2_job *job, const json_t *v, const char *name, api__error *err)
{
    api__window *w = v2_req_field(job, job->kind->window);
    return window_side(v, name, &w->left_set, &w->left, err);
}

static int p_window_right(v2_job *job, const json_t *v, const char *name, api__error *err)
{
    api__window *w = v2_req_field(job, job->kind->window);
    return window_side(v, name, &w->right_set, &w->right, err);
}

static int p_alibi(v2_job *job, const json_t *v, const char *name, api__error *err)
{
    return api__option_bool(v, name, &job->s.r.alibi, err);
}

static int p_return_weights(v2_job *job, const json_t *v, const char *name, api__error *err)
{
    const char *s = json_string_value(v);
    eng_weights_mode *w = v2_req_field(job, job->kind->weights);
    job->weights_param_set = true;
    if (s && strcmp(s, "none") == 0) {
        *w = ENG_WEIGHTS_NONE;
    } else if (json_is_true(v)) {
        *w = ENG_WEIGHTS_PER_HEAD;
    } else if (api__option_weights(v, name, w, err) != 0) {
        return -1;
    }
    job->weights_param_off = *w == ENG_WEIGHTS_NONE;
    return 0;
}

static int p_return_lse(v2_job *job, const json_t *v, const char *name, api__error *err)
{
    job->lse_param_set = true;
    return api__option_bool(v, name, &job->s.r.return_lse, err);
}

static int p_timeout(v2_job *job, const json_t *v, const char *name, api__error *err)
{
    return api__option_int(v, name, 0, API_TIMEOUT_US_MAX, &job->timeout_us, err);
}

/* Triton's "priority": 0 for the default level, else 1 (the most urgent) to --priority-levels.
 * Triton maps a level beyond the model's priority_levels to the default one silently; attnd
 * refuses it, since a caller who asked for a level that does not exist has a configuration to
 * fix and would otherwise never learn that its requests queue at the default level. The server
 * queued the request at this level already (api_peek_v2); here it is only checked. */
static int p_priority(v2_job *job, const json_t *v, const char *name, api__error *err)
{
    int64_t priority;
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return api__option_int(v, name, 0, INT64_MAX, &priority, err);
    priority = (int64_t)json_integer_value(v);
    if (priority > (int64_t)job->rq.limits.priority_levels)
        return api__error_invalid(err, name,
                                  "%s is %lld; this server has %u priority levels (1 is the "
                                  "most urgent, 0 the default level %u; --priority-levels)",
                                  name, (long long)priority, job->rq.limits.priority_levels,
                                  job->rq.limits.default_priority_level);
    return 0;
}

static int p_binary_data_output(v2_job *job, const json_t *v, const char *name, api__error *err)
{
    return api__option_bool(v, name, &job->binary_default, err);
}

struct v2_param {
    const char *name;
    param_fn parse;
};

static const v2_param sdpa_params[] = {
    {"output_dtype", p_output_dtype},
    {"window_left", p_window_left},
    {"window_right", p_window_right},
    {"alibi", p_alibi},
    {"return_weights", p_return_weights},
    {"return_lse", p_return_lse},
    {"binary_data_output", p_binary_data_output},
    {"timeout", p_timeout},
    {"priority", p_priority},
};

/* Those of a layer model: the options of /v1/mha that a registered layer leaves open. */
static const v2_param layer_params[] = {
    {"window_left", p_window_left},
    {"window_right", p_window_right},
    {"return_weights", p_return_weights},
    {"binary_data_output", p_binary_data_output},
    {"timeout", p_timeout},
    {"priority", p_priority},
};

#define N_SDPA_PARAMS  (sizeof sdpa_params / sizeof sdpa_params[0])
#define N_LAYER_PARAMS (sizeof layer_params / sizeof layer_params[0])
#define N_PARAMS_MAX   (N_SDPA_PARAMS > N_LAYER_PARAMS ? N_SDPA_PARAMS : N_LAYER_PARAMS)

/* Triton's reserved request parameters: the sequence flags, which make the request a step of
 * its sequence's KV-cache session (v2_infer.c; a sequence_id of 0 or "" is none, as Triton
 * reads it; with sessions off they are checked and ignored, as on a Triton model without a
 * sequence batcher), "headers" (which its HTTP front end fills with forwarded headers) and anything
 * named triton_*, accepted and unused. 1 when `key` is one (and well-formed), 0 when it is not
 * reserved, -1 with `err` set when it is ill-formed. */
static int reserved_parameter(v2_job *job, const char *key, const json_t *v, const char *field,
                              api__error *err)
{
    if (strncmp(key, "triton_", 7) == 0 || strcmp(key, "headers") == 0)
        return 1;
    if (strcmp(key, "sequence_start") == 0 || strcmp(key, "sequence_end") == 0)
        return api__option_bool(v, field, key[9] == 's' ? &job->seq_start : &job->seq_end, err) == 0
                   ? 1
                   : -1;
    if (strcmp(key, "sequence_id") == 0) {
        if (json_is_string(v) && json_string_length(v) < sizeof job->seq_id) {
            snprintf(job->seq_id, sizeof job->seq_id, "%s", json_string_value(v));
            job->seq_set = job->seq_id[0] != '\0';
            return 1;
        }
        if (json_is_integer(v) && json_integer_value(v) >= 0) {
            snprintf(job->seq_id, sizeof job->seq_id, "%lld", (long long)json_integer_value(v));
            job->seq_set = json_integer_value(v) != 0;
            return 1;
        }
        return api__error_invalid(err, field,
                                  "%s must be an unsigned integer or a string (Triton's "
                                  "correlation id)",
                                  field);
    }
    return 0;
}

int api__v2_parameter(v2_job *job, const char *key, const json_t *val, api__error *err)
{
    const v2_param *defs = job->kind->params;
    size_t n_params = job->kind->n_params;
    const api__option_def *opts = job->kind->options;
    size_t n_opts = *job->kind->n_options;
    char field[96];
    size_t i = 0;
    while (i < n_params && strcmp(defs[i].name, key) != 0)
        i++;
    snprintf(field, sizeof field, "parameters.%.60s", key);
    if (i < n_params)
        return defs[i].parse(job, val, field, err);
    const api__option_def *opt = api__option_find(opts, n_opts, key);
    if (opt)
        return opt->parse(job->req, val, field, err);
    int reserved = reserved_parameter(job, key, val, field, err);
    if (reserved != 0)
        return reserved < 0 ? -1 : 0;
    const char *names[N_PARAMS_MAX];
    for (size_t j = 0; j < n_params; j++)
        names[j] = defs[j].name;
    char what[80];
    snprintf(what, sizeof what, "model %.64s", job->model.name);
    api__names known = {"parameter", what, names, n_params, opts, n_opts};
    return api__unknown_name(key, field, &known, err);
}

/* The "parameters" object of the request, each by api__v2_parameter. */
static int parse_parameters(v2_job *job, const json_t *params, api__error *err)
{
    const char *key;
    json_t *val;
    if (!json_is_object(params))
        return api__error_invalid(err, "parameters",
                                  "parameters must be an object of name: value pairs");
    json_object_foreach((json_t *)params, key, val)
    {
        if (api__v2_parameter(job, key, val, err) != 0)
            return -1;
    }
    return 0;
}

/* ---- Inputs --------------------------------------------------------------------------------- */

/* The tensor slot of input `name` of the job's model, or NULL. */
static api__tensor *input_slot(v2_job *job, const char *name)
{
    for (size_t i = 0; i < job->kind->n_inputs; i++) {
        const v2_input *in = &job->kind->inputs[i];
        if (strcmp(name, in->name) == 0)
            return v2_req_field(job, in->tensor);
    }
    return NULL;
}

/* "a, b and c": the model's inputs, for messages. */
static void input_list(const v2_kind *kind, char *out, size_t size)
{
    size_t n = 0;
    out[0] = '\0';
    for (size_t i = 0; i < kind->n_inputs && n < size; i++) {
        const char *sep = i == 0 ? "" : i + 1 == kind->n_inputs ? " and " : ", ";
        int w = snprintf(out + n, size - n, "%s%s", sep, kind->inputs[i].name);
        n += w > 0 ? (size_t)w : 0;
    }
}

/* Whether input `name` takes `dtype`, and whether as JSON data too (false: binary only). */
static bool input_takes(const char *name, api__dtype dtype, bool *json_ok)
{
    bool qkv = strcmp(name, "query") == 0 || strcmp(name, "key") == 0 ||
               strcmp(name, "value") == 0 || strcmp(name, "input") == 0 ||
               strcmp(name, "memory") == 0 || strcmp(name, "sinks") == 0;
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

/* The datatype `s` (NULL: not a string) of input `name`, checked against what the input takes;
 * *json_ok: whether JSON data can carry it. */
int api__v2_input_datatype(const char *name, const char *s, const char *field, api__dtype *out,
                           bool *json_ok, api__error *err)
{
    size_t i = 0;
    if (!s)
        return api__error_invalid(err, field, "%s must be a string such as \"FP32\"", field);
    while (i < sizeof v2_datatypes / sizeof v2_datatypes[0] && strcmp(s, v2_datatypes[i].name) != 0)
        i++;
    if (i == sizeof v2_datatypes / sizeof v2_datatypes[0]) {
        for (size_t j = 0; j < sizeof v2_other_datatypes / sizeof v2_other_datatypes[0]; j++) {
            if (strcmp(s, v2_other_datatypes[j]) == 0)
                return api__error_invalid(err, field,
                                          "input %s does not take datatype %s; it takes %s", name,
                                          s, input_datatypes(name));
        }
        return api__error_invalid(err, field,
                                  "%s \"%.32s\" is not a datatype of the protocol (BOOL, INT32, "
                                  "INT64, FP16, BF16, FP32, ...)",
                                  field, s);
    }
    *out = v2_datatypes[i].dtype;
    if (!input_takes(name, *out, json_ok))
        return api__error_invalid(err, field, "input %s does not take datatype %s; it takes %s",
                                  name, s, input_datatypes(name));
    return 0;
}

/* binary_data_size, the one parameter an input takes; -1 when absent. */
static int input_parameters(const json_t *params, const char *field, int64_t *size, api__error *err)
{
    const char *key;
    json_t *val;
    char name[192];
    *size = -1;
    if (!params || json_is_null(params))
        return 0;
    if (!json_is_object(params))
        return api__error_invalid(err, field, "%s must be an object", field);
    json_object_foreach((json_t *)params, key, val)
    {
        snprintf(name, sizeof name, "%.120s.%.40s", field, key);
        if (strcmp(key, "content_type") == 0) {
            /* MLServer's codec name: every input of attnd's models is a tensor ("np"). */
            const char *ct = json_string_value(val);
            if (!ct || strcmp(ct, "np") != 0)
                return api__error_invalid(err, name,
                                          "%s must be \"np\": the inputs of attnd's models are "
                                          "tensors",
                                          name);
            continue;
        }
        if (strcmp(key, "binary_data_size") != 0)
            return api__error_invalid(err, name,
                                      "unknown input parameter \"%.40s\"; an input takes "
                                      "binary_data_size and content_type",
                                      key);
        if (api__option_int(val, name, 0, INT64_MAX, size, err) != 0)
            return -1;
    }
    return 0;
}

/* "data" of a JSON input: nested (whose nesting must be the shape) or flat. Fills t's form,
 * items and numbers; t's shape is the declared one. */
static int input_data(v2_job *job, const json_t *data, const char *name, api__dtype dtype,
                      api__tensor *t, api__error *err)
{
    char field[96], want[96], got[96];
    api__tensor probe;
    const api__body_span *sp = api__body_span_of(&job->rq.body, data);
    snprintf(field, sizeof field, "%s.data", name);
    if (!json_is_array(data) && !(sp && sp->kind == API_SPAN_NUMBERS))
        return api__error_invalid(
            err, field, "%s must be an array of the tensor's elements, flat or nested", field);
    if (api__tensor_probe(&job->rq.body, data, field, job->rq.limits.max_elements, &probe, err) !=
        0)
        return -1;
    if (probe.count != t->count && probe.rank == 1)
        return api__error_invalid(err, field, "%s has %zu elements but shape %s holds %zu", field,
                                  probe.count, api__tensor_shape_str(t, want, sizeof want),
                                  t->count);
    bool flat = probe.rank == 1 && t->rank != 1;
    if (!flat && (probe.rank != t->rank ||
                  memcmp(probe.shape, t->shape, (size_t)t->rank * sizeof t->shape[0]) != 0))
        return api__error_invalid(err, field,
                                  "%s is nested as %s but the shape is %s; give the data flat or "
                                  "nested as the shape",
                                  field, api__tensor_shape_str(&probe, got, sizeof got),
                                  api__tensor_shape_str(t, want, sizeof want));
    bool bools = probe.dtype == API_DTYPE_BOOL;
    if (bools != (dtype == API_DTYPE_BOOL))
        return api__error_invalid(err, field, "%s holds %s but the datatype is %s", field,
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

static int unknown_input(v2_job *job, const char *name, const char *field, api__error *err)
{
    const char *names[API__V2_MAX_INPUTS], *best;
    char list[160];
    for (size_t i = 0; i < job->kind->n_inputs; i++)
        names[i] = job->kind->inputs[i].name;
    best = api__closest_name(name, names, job->kind->n_inputs);
    input_list(job->kind, list, sizeof list);
    return api__error_invalid(err, field, "unknown input \"%.60s\"%s%s%s; model %.64s takes %s",
                              name, best ? " (did you mean \"" : "", best ? best : "",
                              best ? "\"?)" : "", job->model.name, list);
}

int api__v2_input_begin(v2_job *job, const char *name, const char *field, api__tensor **out,
                        api__error *err)
{
    api__tensor *t = input_slot(job, name);
    if (!t)
        return unknown_input(job, name, field, err);
    if (t->present)
        return api__error_invalid(err, name, "input %s is given twice", name);
    memset(t, 0, sizeof *t);
    t->present = true;
    *out = t;
    return 0;
}

int api__v2_input_raw(api__tensor *t, const char *name, const char *datatype, api__dtype dtype,
                      int64_t size, const char *bytes, api__error *err)
{
    size_t want = t->count * api__dtype_size(dtype); /* count <= max_elements <= 2^59 */
    if (size < 0 || (uint64_t)size != want)
        return api__error_invalid(err, name,
                                  "input %s has binary_data_size %lld but %zu %s elements take "
                                  "%zu bytes",
                                  name, (long long)size, t->count, datatype, want);
    t->form = API_FORM_RAW;
    t->dtype = dtype;
    t->raw = bytes;
    return 0;
}

static int parse_input(v2_job *job, const json_t *in, size_t index, api__error *err)
{
    char field[64], sub[192];
    const char *key, *name = NULL;
    json_t *val, *shape = NULL, *datatype = NULL, *params = NULL, *data = NULL;
    api__tensor *t;
    snprintf(field, sizeof field, "inputs[%zu]", index);
    if (!json_is_object(in))
        return api__error_invalid(err, field,
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
            return api__error_invalid(err, sub,
                                      "unknown key \"%.40s\" in %s; an input has name, shape, "
                                      "datatype, parameters and data",
                                      key, field);
        }
    }
    if (!name)
        return api__error_invalid(err, field, "%s needs a \"name\" (a string)", field);
    if (api__v2_input_begin(job, name, field, &t, err) != 0)
        return -1;
    if (!shape || !datatype)
        return api__error_invalid(err, name, "input %s needs \"shape\" and \"datatype\"", name);
    snprintf(sub, sizeof sub, "%s.shape", name);
    if (api__shape_parse(shape, sub, job->rq.limits.max_elements, t->shape, &t->rank, &t->count,
                         err) != 0)
        return -1;
    snprintf(sub, sizeof sub, "%s.datatype", name);
    api__dtype dtype = API_DTYPE_FLOAT32;
    bool json_ok;
    if (api__v2_input_datatype(name, json_string_value(datatype), sub, &dtype, &json_ok, err) != 0)
        return -1;
    int64_t size;
    snprintf(sub, sizeof sub, "%s.parameters", name);
    if (input_parameters(params, sub, &size, err) != 0)
        return -1;

    if (size >= 0) {
        /* Binary tensor data: the next `size` bytes after the JSON. */
        if (data)
            return api__error_invalid(
                err, name, "input %s has both \"data\" and binary_data_size; give one", name);
        if (!job->has_header_len)
            return api__error_set(err, API_STATUS_MALFORMED_REQUEST, API_REASON_BAD_REQUEST, name,
                                  "input %s has binary_data_size but the request has no "
                                  "Inference-Header-Content-Length header to say where its JSON "
                                  "ends",
                                  name);
        if (api__v2_input_raw(t, name, json_string_value(datatype), dtype, size,
                              job->bin + job->bin_used, err) != 0)
            return -1;
        if ((size_t)size > job->bin_len - job->bin_used)
            return api__error_set(err, API_STATUS_MALFORMED_REQUEST, API_REASON_BAD_REQUEST, name,
                                  "the binary data is truncated: input %s needs bytes %zu to %zu "
                                  "after the JSON, but only %zu follow it",
                                  name, job->bin_used, job->bin_used + (size_t)size, job->bin_len);
        job->bin_used += (size_t)size;
        return 0;
    }
    if (!data)
        return api__error_invalid(err, name,
                                  "input %s needs \"data\" (or binary_data_size with the binary "
                                  "tensor extension)",
                                  name);
    if (!json_ok)
        return api__error_invalid(err, name,
                                  "input %s has datatype %s, which JSON cannot carry: send it as "
                                  "binary data (parameters.binary_data_size and "
                                  "Inference-Header-Content-Length)",
                                  name, json_string_value(datatype));
    return input_data(job, data, name, dtype, t, err);
}

/* ---- Outputs -------------------------------------------------------------------------------- */

int api__v2_output_want(v2_job *job, const char *name, const char *field, int *out, api__error *err)
{
    int o = 0, n_outputs = job->kind->n_outputs;
    while (o < n_outputs && strcmp(name, api__out_names[o]) != 0)
        o++;
    if (o == n_outputs)
        return api__error_invalid(
            err, field, "unknown output \"%.60s\"; model %.64s has %s", name, job->model.name,
            n_outputs == API__N_OUTPUTS ? "output, weights and lse" : "output and weights");
    if (job->want[o])
        return api__error_invalid(err, field, "output %s is asked for twice", name);
    job->want[o] = true;
    job->outputs_given = true;
    *out = o;
    return 0;
}

static int parse_output(v2_job *job, const json_t *out, size_t index, api__error *err)
{
    char field[64], sub[128];
    const char *key, *name = NULL;
    json_t *val, *params = NULL;
    snprintf(field, sizeof field, "outputs[%zu]", index);
    if (!json_is_object(out))
        return api__error_invalid(err, field, "%s must be an object {\"name\", \"parameters\"}",
                                  field);
    json_object_foreach((json_t *)out, key, val)
    {
        if (strcmp(key, "name") == 0)
            name = json_string_value(val);
        else if (strcmp(key, "parameters") == 0)
            params = val;
        else {
            snprintf(sub, sizeof sub, "%s.%.40s", field, key);
            return api__error_invalid(err, sub,
                                      "unknown key \"%.40s\" in %s; an output has name and "
                                      "parameters",
                                      key, field);
        }
    }
    if (!name)
        return api__error_invalid(err, field, "%s needs a \"name\" (a string)", field);
    int o;
    if (api__v2_output_want(job, name, field, &o, err) != 0)
        return -1;
    if (!params || json_is_null(params))
        return 0;
    if (!json_is_object(params))
        return api__error_invalid(err, field, "%s.parameters must be an object", field);
    json_object_foreach(params, key, val)
    {
        snprintf(sub, sizeof sub, "%s.parameters.%.40s", field, key);
        if (strcmp(key, "binary_data") != 0)
            return api__error_invalid(err, sub,
                                      "unknown output parameter \"%.40s\"; an output takes "
                                      "binary_data",
                                      key);
        if (api__option_bool(val, sub, &job->binary[o], err) != 0)
            return -1;
        job->binary_set[o] = true;
    }
    return 0;
}

int api__v2_inputs_complete(v2_job *job, api__error *err)
{
    for (size_t i = 0; i < job->kind->n_inputs; i++) {
        const v2_input *in = &job->kind->inputs[i];
        if (in->required && !((const api__tensor *)v2_req_field(job, in->tensor))->present)
            return api__error_invalid(err, in->name, "input \"%s\" is required (%s)", in->name,
                                      in->required);
    }
    return 0;
}

/* ---- Request -------------------------------------------------------------------------------- */

int api__v2_request_parse(v2_job *job, api__error *err)
{
    const api_call *call = job->rq.call;
    const char *body = call->body ? call->body : "";
    size_t header_len = call->body_len;
    const json_t *root, *inputs = NULL, *outputs = NULL, *params = NULL, *id = NULL;
    const char *key;
    json_t *val;

    if (!api__content_type_v2(call->content_type))
        return api__error_set(err, API_STATUS_UNSUPPORTED_MEDIA_TYPE, API_REASON_BAD_REQUEST, NULL,
                              "Content-Type \"%.80s\" is not supported; send application/json "
                              "(or application/octet-stream with binary tensor data)",
                              call->content_type);
    if (api__req_check_body_size(&job->rq, err) != 0)
        return -1;
    if (call->inference_header_length) {
        if (!api__header_len_parse(call->inference_header_length, &header_len))
            return api__error_set(err, API_STATUS_MALFORMED_REQUEST, API_REASON_BAD_REQUEST, NULL,
                                  "Inference-Header-Content-Length \"%.40s\" is not a byte count",
                                  call->inference_header_length);
        if (header_len > call->body_len)
            return api__error_set(err, API_STATUS_MALFORMED_REQUEST, API_REASON_BAD_REQUEST, NULL,
                                  "Inference-Header-Content-Length is %zu but the body has only "
                                  "%zu bytes",
                                  header_len, call->body_len);
        job->has_header_len = true;
    }
    job->bin = body + header_len;
    job->bin_len = call->body_len - header_len;

    if (api__req_parse(&job->rq, body, header_len, err) != 0)
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
                return api__error_invalid(err, key, "%s must be \"%s\", as in the path", key, want);
        } else {
            return api__error_invalid(err, key,
                                      "unknown field \"%.60s\"; an inference request has id, "
                                      "parameters, inputs and outputs",
                                      key);
        }
    }
    if (id && !json_is_null(id)) {
        const char *s;
        size_t n;
        if (!api__body_string_get(&job->rq.body, id, &s, &n))
            return api__error_invalid(err, "id", "id must be a string");
        job->id = api__req_alloc(&job->rq, n + 1, err);
        if (!job->id)
            return -1;
        memcpy(job->id, s, n);
        job->id[n] = '\0';
        job->id_len = n;
        job->has_id = true;
    } else if (call->request_id) {
        /* KServe's InferenceResponse requires an id: the request's X-Request-Id stands in. */
        size_t n = strlen(call->request_id);
        job->id = api__req_alloc(&job->rq, n + 1, err);
        if (!job->id)
            return -1;
        memcpy(job->id, call->request_id, n + 1);
        job->id_len = n;
        job->has_id = true;
    }
    if (params && !json_is_null(params) && parse_parameters(job, params, err) != 0)
        return -1;
    if (!json_is_array(inputs))
        return api__error_invalid(err, "inputs", "inputs must be an array of input tensors");
    for (size_t i = 0; i < json_array_size(inputs); i++)
        if (parse_input(job, json_array_get(inputs, i), i, err) != 0)
            return -1;
    if (job->bin_used != job->bin_len)
        return api__error_set(err, API_STATUS_MALFORMED_REQUEST, API_REASON_BAD_REQUEST, NULL,
                              "%zu bytes follow the JSON but the inputs' binary_data_size add up "
                              "to %zu",
                              job->bin_len, job->bin_used);
    if (api__v2_inputs_complete(job, err) != 0)
        return -1;
    if (outputs && !json_is_null(outputs)) {
        if (!json_is_array(outputs))
            return api__error_invalid(err, "outputs", "outputs must be an array");
        job->outputs_given = true;
        for (size_t i = 0; i < json_array_size(outputs); i++)
            if (parse_output(job, json_array_get(outputs, i), i, err) != 0)
                return -1;
    }
    return 0;
}

/* What the outputs say to compute: weights and lse only when returned. */
int api__v2_outputs_settle(v2_job *job, api__error *err)
{
    eng_weights_mode *weights = v2_req_field(job, job->kind->weights);
    bool no_lse = false, *return_lse = job->kind->return_lse == V2_NO_FIELD
                                           ? &no_lse
                                           : v2_req_field(job, job->kind->return_lse);
    int64_t *timeout_ms = v2_req_field(job, job->kind->timeout_ms);
    if (!job->outputs_given) {
        /* KServe v2: a request without "outputs" gets every output of the model, as its
         * metadata lists them (never the L x S weights), and return_weights or an explicit
         * return_lse false change that as they say. */
        for (int o = 0; o < job->kind->n_outputs; o++)
            job->want[o] = api__v2_output_listed(&job->model, o);
        if (*weights != ENG_WEIGHTS_NONE)
            job->want[API__OUT_WEIGHTS] = true;
        if (job->lse_param_set)
            job->want[API__OUT_LSE] = *return_lse;
        *return_lse = job->want[API__OUT_LSE];
    } else {
        if (job->want[API__OUT_WEIGHTS] && job->weights_param_off)
            return api__error_invalid(err, "return_weights",
                                      "output weights is asked for but return_weights is false");
        if (job->want[API__OUT_LSE] && job->lse_param_set && !*return_lse)
            return api__error_invalid(err, "return_lse",
                                      "output lse is asked for but return_lse is false");
        if (job->want[API__OUT_WEIGHTS] && *weights == ENG_WEIGHTS_NONE)
            *weights = ENG_WEIGHTS_PER_HEAD;
        if (!job->want[API__OUT_WEIGHTS])
            *weights = ENG_WEIGHTS_NONE;
        *return_lse = job->want[API__OUT_LSE];
    }
    for (int o = 0; o < API__N_OUTPUTS; o++)
        if (!job->binary_set[o])
            job->binary[o] = job->binary_default;
    /* Triton carries BF16 tensors as binary data only: its JSON has no bf16 numbers. */
    for (int o = 0; o < API__N_OUTPUTS && job->bf16_out; o++) {
        if (job->want[o] && job->binary_set[o] && !job->binary[o])
            return api__error_invalid(err, "output_dtype",
                                      "output %s is asked for as JSON, but BF16 outputs "
                                      "(output_dtype bfloat16) travel as binary data only",
                                      api__out_names[o]);
        job->binary[o] = true;
    }
    *timeout_ms = api__v2_timeout_ms(*timeout_ms, job->timeout_us);
    return 0;
}

/* ---- The kinds of model --------------------------------------------------------------------- */

static const v2_input sdpa_inputs[] = {
    {"query", offsetof(api__sdpa_req, q), "the queries"},
    {"key", offsetof(api__sdpa_req, k), "the keys"},
    {"value", offsetof(api__sdpa_req, v), "the values"},
    {"attn_mask", offsetof(api__sdpa_req, mask), NULL},
    {"key_padding_mask", offsetof(api__sdpa_req, kpm), NULL},
    {"kv_lengths", offsetof(api__sdpa_req, kvlen), NULL},
    {"sinks", offsetof(api__sdpa_req, sinks), NULL},
};

static const v2_input layer_inputs[] = {
    {"input", offsetof(api__layer_req, input), "the tokens, [L, E] or [B, L, E]"},
    {"memory", offsetof(api__layer_req, memory), NULL},
    {"attn_mask", offsetof(api__layer_req, mask), NULL},
    {"key_padding_mask", offsetof(api__layer_req, kpm), NULL},
};

_Static_assert(sizeof sdpa_inputs / sizeof sdpa_inputs[0] <= API__V2_MAX_INPUTS &&
                   sizeof layer_inputs / sizeof layer_inputs[0] <= API__V2_MAX_INPUTS,
               "API__V2_MAX_INPUTS bounds every kind's inputs");

/* Not given, causal is off on model sdpa as on /v1/attention (a sequence's step, set up
 * before, reads "not given" as bottom-right). */
static int sdpa_bind(v2_job *job, api__error *err)
{
    (void)err;
    if (job->s.r.causal == API_CAUSAL_UNSET)
        job->s.r.causal = API_CAUSAL_OFF;
    return 0;
}

/* The registered model is the operation's (its parameter "layer" picks the layer); v2's one
 * "memory" input must serve as both keys and values. */
static int layer_bind(v2_job *job, api__error *err)
{
    const eng_layer *l = job->model.model->layer[0];
    if (l->kdim != l->vdim)
        return api__error_invalid(err, "memory",
                                  "model %.64s has kdim %lld and vdim %lld: its keys and "
                                  "values come from different tokens, which the v2 inputs "
                                  "cannot carry; use POST /v1/mha with key and value",
                                  job->model.name, (long long)l->kdim, (long long)l->vdim);
    job->l.model = job->model.model;
    return 0;
}

static const v2_kind sdpa_kind = {
    .op = &api__sdpa_op,
    .state = offsetof(v2_job, s),
    .request = offsetof(v2_job, s.r),
    .params = sdpa_params,
    .n_params = N_SDPA_PARAMS,
    .options = api__sdpa_options,
    .n_options = &api__sdpa_n_options,
    .inputs = sdpa_inputs,
    .n_inputs = sizeof sdpa_inputs / sizeof sdpa_inputs[0],
    .n_outputs = API__N_OUTPUTS,
    .window = offsetof(api__sdpa_req, window),
    .weights = offsetof(api__sdpa_req, weights),
    .timeout_ms = offsetof(api__sdpa_req, timeout_ms),
    .return_lse = offsetof(api__sdpa_req, return_lse),
    .bind = sdpa_bind,
    .sequence = api__v2_sdpa_sequence,
};

static const v2_kind layer_kind = {
    .op = &api__layer_op,
    .state = offsetof(v2_job, l),
    .request = offsetof(v2_job, l.r),
    .params = layer_params,
    .n_params = N_LAYER_PARAMS,
    .options = api__layer_options,
    .n_options = &api__layer_n_options,
    .inputs = layer_inputs,
    .n_inputs = sizeof layer_inputs / sizeof layer_inputs[0],
    .n_outputs = API__OUT_LSE, /* output and weights */
    .window = offsetof(api__layer_req, window),
    .weights = offsetof(api__layer_req, weights),
    .timeout_ms = offsetof(api__layer_req, timeout_ms),
    .return_lse = V2_NO_FIELD,
    .bind = layer_bind,
    .sequence = api__v2_layer_sequence,
};

const v2_kind *api__v2_kind(const model_ref *m)
{
    return m->kind == MODEL_LAYER ? &layer_kind : &sdpa_kind;
}
