/* test_v2.c - the KServe v2 routes of api/ (proto/v2_*.c) without a socket: server and model
 * metadata, model readiness, and inference in every shape the Open Inference Protocol and Triton's
 * binary tensor extension define - JSON tensors flat and nested, binary FP32 / FP16 / BF16 / BOOL /
 * INT32 inputs, binary and JSON outputs, selected outputs, the echoed id - each checked against
 * the float64 reference; then every error case with its status and {"error": "..."} body.
 * Layer models ("demo", and a cross-attention layer registered here) run against the float64
 * reference of nn.MultiheadAttention (tests/support/ref_mha.h). */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/proto/v2.h"
#include "tests/support/check.h"
#include "tests/support/ref.h"
#include "tests/support/ref_mha.h"

static eng_pool *pool;
static api_budget *budget;
static api_models *models;

/* ---- Requests ------------------------------------------------------------------------------ */

/* A growing string for request bodies. */
typedef struct {
    char *data;
    size_t len, cap;
} sbuf;

static void sb_mem(sbuf *b, const void *p, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        b->data = realloc(b->data, b->cap);
        if (!b->data)
            abort();
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
}

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void sb_printf(sbuf *b, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof tmp)
        abort();
    sb_mem(b, tmp, (size_t)n);
}

/* One input of a request. */
typedef struct {
    const char *name;
    const char *datatype; /* "FP32", "FP16", "BF16", "BOOL", "INT64", "INT32" */
    int rank;
    int64_t shape[4];
    const float *f;   /* FP32/FP16/BF16 values (converted to the datatype) */
    const uint8_t *b; /* BOOL */
    const int64_t *i; /* INT64 / INT32 */
    bool binary;      /* binary tensor data instead of JSON "data" */
    bool nested;      /* JSON data nested as the shape (else flat) */
} input;

static size_t count_of(const input *in)
{
    size_t n = 1;
    for (int d = 0; d < in->rank; d++)
        n *= (size_t)in->shape[d];
    return n;
}

/* The bytes of a binary input. */
static void binary_bytes(const input *in, sbuf *out)
{
    size_t n = count_of(in);
    for (size_t k = 0; k < n; k++) {
        if (strcmp(in->datatype, "FP32") == 0) {
            sb_mem(out, &in->f[k], 4);
        } else if (strcmp(in->datatype, "FP16") == 0) {
            uint16_t h = eng_f32_to_f16(in->f[k]);
            sb_mem(out, &h, 2);
        } else if (strcmp(in->datatype, "BF16") == 0) {
            uint16_t h = eng_f32_to_bf16(in->f[k]);
            sb_mem(out, &h, 2);
        } else if (strcmp(in->datatype, "BOOL") == 0) {
            sb_mem(out, &in->b[k], 1);
        } else if (strcmp(in->datatype, "INT64") == 0) {
            sb_mem(out, &in->i[k], 8);
        } else {
            int32_t v = (int32_t)in->i[k];
            sb_mem(out, &v, 4);
        }
    }
}

static void json_value(const input *in, size_t k, sbuf *b)
{
    if (in->b)
        sb_printf(b, "%s", in->b[k] ? "true" : "false");
    else if (in->i)
        sb_printf(b, "%lld", (long long)in->i[k]);
    else
        sb_printf(b, "%.9g", (double)in->f[k]);
}

/* Nested data of dimension d starting at flat index *k. */
static void json_nested(const input *in, int d, size_t *k, sbuf *b)
{
    sb_mem(b, "[", 1);
    for (int64_t x = 0; x < in->shape[d]; x++) {
        if (x > 0)
            sb_mem(b, ",", 1);
        if (d == in->rank - 1)
            json_value(in, (*k)++, b);
        else
            json_nested(in, d + 1, k, b);
    }
    sb_mem(b, "]", 1);
}

/* A whole request: {id?, parameters (raw JSON text or NULL), inputs, outputs (raw or NULL)}
 * then the binary data; *header_len gets the JSON's length. */
static char *build(const input *ins, size_t n, const char *id, const char *params,
                   const char *outputs, size_t *len, size_t *header_len)
{
    sbuf b = {0}, bin = {0};
    sb_printf(&b, "{");
    if (id)
        sb_printf(&b, "\"id\":\"%s\",", id);
    if (params)
        sb_printf(&b, "\"parameters\":%s,", params);
    sb_printf(&b, "\"inputs\":[");
    for (size_t i = 0; i < n; i++) {
        const input *in = &ins[i];
        sb_printf(&b, "%s{\"name\":\"%s\",\"datatype\":\"%s\",\"shape\":[", i ? "," : "", in->name,
                  in->datatype);
        for (int d = 0; d < in->rank; d++)
            sb_printf(&b, "%s%lld", d ? "," : "", (long long)in->shape[d]);
        sb_printf(&b, "]");
        if (in->binary) {
            size_t before = bin.len;
            binary_bytes(in, &bin);
            sb_printf(&b, ",\"parameters\":{\"binary_data_size\":%zu}}", bin.len - before);
            continue;
        }
        sb_printf(&b, ",\"data\":");
        size_t k = 0;
        if (in->nested) {
            json_nested(in, 0, &k, &b);
        } else {
            sb_mem(&b, "[", 1);
            for (size_t x = 0; x < count_of(in); x++) {
                if (x > 0)
                    sb_mem(&b, ",", 1);
                json_value(in, x, &b);
            }
            sb_mem(&b, "]", 1);
        }
        sb_printf(&b, "}");
    }
    sb_printf(&b, "]");
    if (outputs)
        sb_printf(&b, ",\"outputs\":%s", outputs);
    sb_printf(&b, "}");
    *header_len = b.len;
    if (bin.len)
        sb_mem(&b, bin.data, bin.len);
    free(bin.data);
    *len = b.len;
    return b.data;
}

typedef struct {
    const char *content_type;
    const char *header_len; /* Inference-Header-Content-Length, NULL: none */
    const char *model, *version;
    const char *request_id; /* X-Request-Id, NULL: none */
    const api_limits *limits;
    api_budget *budget;
    eng_ctl *ctl;
    int64_t start_ns;
} call_opts;

/* The start of a reply's body as a C string, for messages (bodies are not NUL-terminated). */
static const char *snippet(const api_reply *r)
{
    static char buf[320];
    size_t n = r->body ? (r->body_len < sizeof buf - 1 ? r->body_len : sizeof buf - 1) : 0;
    if (n)
        memcpy(buf, r->body, n);
    buf[n] = '\0';
    return buf;
}

static void infer(const char *body, size_t len, const call_opts *o, api_reply *reply)
{
    api_call call = {.body = body,
                     .body_len = len,
                     .content_type = o ? o->content_type : NULL,
                     .pool = pool,
                     .ctl = o ? o->ctl : NULL,
                     .start_ns = o ? o->start_ns : 0,
                     .limits = o ? o->limits : NULL,
                     .budget = o && o->budget ? o->budget : budget,
                     .models = models,
                     .inference_header_length = o ? o->header_len : NULL,
                     .request_id = o ? o->request_id : NULL,
                     .model = o && o->model ? o->model : "sdpa",
                     .version = o ? o->version : NULL};
    size_t before = api_budget_in_use(call.budget);
    api_v2_infer(&call, reply);
    CHECKF(api_budget_in_use(call.budget) == before, "%zu bytes left reserved",
           api_budget_in_use(call.budget) - before);
}

/* Sends a request built from inputs; binary ones get the header length. */
static void infer_inputs(const input *ins, size_t n, const char *id, const char *params,
                         const char *outputs, api_reply *reply)
{
    size_t len, hlen;
    char *body = build(ins, n, id, params, outputs, &len, &hlen);
    char hl[32];
    snprintf(hl, sizeof hl, "%zu", hlen);
    call_opts o = {.header_len = len != hlen ? hl : NULL};
    infer(body, len, &o, reply);
    free(body);
}

/* The JSON part of a reply (all of it without Inference-Header-Content-Length). */
static json_t *reply_json(const api_reply *r)
{
    json_error_t jerr;
    size_t n = r->inference_header_len > 0 ? (size_t)r->inference_header_len : r->body_len;
    json_t *root = r->body ? json_loadb(r->body, n, 0, &jerr) : NULL;
    CHECKF(root != NULL, "reply is not JSON: %s (%.200s)", root ? "" : jerr.text, snippet(r));
    return root;
}

/* The error message of a v2 error reply, checking its form {"error": "..."}. */
static void check_error(const api_reply *r, int status, const char *needle)
{
    CHECKF(r->status == status, "status %d, want %d: %.300s", r->status, status, snippet(r));
    json_t *root = reply_json(r);
    if (!root)
        return;
    json_t *e = json_object_get(root, "error");
    CHECKF(json_is_string(e) && json_object_size(root) == 1, "not {\"error\": string}: %.300s",
           r->body);
    if (needle && json_is_string(e))
        CHECKF(strstr(json_string_value(e), needle) != NULL, "error \"%s\" lacks \"%s\"",
               json_string_value(e), needle);
    json_decref(root);
}

/* The output called `name` of a reply: its shape and its values (from JSON data or from the
 * binary part); NULL when absent. The values are malloc'd. */
static float *reply_output(const api_reply *r, const char *name, int64_t *shape, int *rank,
                           bool *binary)
{
    json_t *root = reply_json(r), *outs, *o;
    float *vals = NULL;
    size_t at = r->inference_header_len > 0 ? (size_t)r->inference_header_len : 0, i;
    if (!root)
        return NULL;
    outs = json_object_get(root, "outputs");
    json_array_foreach(outs, i, o)
    {
        json_t *sh = json_object_get(o, "shape"), *params = json_object_get(o, "parameters");
        json_t *size = params ? json_object_get(params, "binary_data_size") : NULL;
        size_t n = 1;
        *rank = (int)json_array_size(sh);
        for (int d = 0; d < *rank; d++) {
            shape[d] = json_integer_value(json_array_get(sh, (size_t)d));
            n *= (size_t)shape[d];
        }
        if (strcmp(json_string_value(json_object_get(o, "name")), name) != 0) {
            if (size)
                at += (size_t)json_integer_value(size);
            continue;
        }
        CHECK(strcmp(json_string_value(json_object_get(o, "datatype")), "FP32") == 0);
        vals = malloc(n * sizeof *vals + 1);
        *binary = size != NULL;
        if (size) {
            CHECK((size_t)json_integer_value(size) == n * 4);
            CHECK(at + n * 4 <= r->body_len);
            if (at + n * 4 <= r->body_len)
                memcpy(vals, r->body + at, n * 4);
            CHECK(json_object_get(o, "data") == NULL);
        } else {
            json_t *data = json_object_get(o, "data");
            CHECK(json_array_size(data) == n);
            for (size_t k = 0; k < n; k++) {
                json_t *x = json_array_get(data, k);
                vals[k] = json_is_null(x) ? -INFINITY : (float)json_number_value(x);
            }
        }
        break;
    }
    json_decref(root);
    return vals;
}

/* ---- A problem and its reference ----------------------------------------------------------- */

static uint64_t rng = 0x9E3779B97F4A7C15u;

static float frand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) / (double)(1ull << 53) * 2.0 - 1.0);
}

static float *randoms(size_t n)
{
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = frand();
    return x;
}

typedef struct {
    int64_t B, H, Hkv, L, S, D, Dv;
    float *q, *k, *v;
} problem;

static void problem_new(problem *p, int64_t B, int64_t H, int64_t Hkv, int64_t L, int64_t S,
                        int64_t D, int64_t Dv)
{
    *p = (problem){B, H, Hkv, L, S, D, Dv, NULL, NULL, NULL};
    p->q = randoms((size_t)(B * H * L * D));
    p->k = randoms((size_t)(B * Hkv * S * D));
    p->v = randoms((size_t)(B * Hkv * S * Dv));
}

static void problem_free(problem *p)
{
    free(p->q);
    free(p->k);
    free(p->v);
}

/* Rank-4 inputs of the problem in `datatype`. */
static void problem_inputs(const problem *p, input *ins, const char *datatype, bool binary,
                           bool nested)
{
    ins[0] =
        (input){"query", datatype, 4, {p->B, p->H, p->L, p->D}, p->q, NULL, NULL, binary, nested};
    ins[1] =
        (input){"key", datatype, 4, {p->B, p->Hkv, p->S, p->D}, p->k, NULL, NULL, binary, nested};
    ins[2] = (input){"value", datatype, 4,     {p->B, p->Hkv, p->S, p->Dv}, p->v, NULL,
                     NULL,    binary,   nested};
}

/* Rounds x as the datatype would carry it. */
static float *rounded(const float *x, size_t n, const char *dt)
{
    float *y = malloc(n * sizeof *y);
    for (size_t i = 0; i < n; i++)
        y[i] = strcmp(dt, "FP16") == 0   ? eng_f16_to_f32(eng_f32_to_f16(x[i]))
               : strcmp(dt, "BF16") == 0 ? eng_bf16_to_f32(eng_f32_to_bf16(x[i]))
                                         : x[i];
    return y;
}

/* The reference for the problem's rank-4 inputs (rounded to `dt`) with `a` for the options. */
static void reference(const problem *p, const char *dt, eng_sdpa_args a, ref_result *res,
                      float **bufs)
{
    bufs[0] = rounded(p->q, (size_t)(p->B * p->H * p->L * p->D), dt);
    bufs[1] = rounded(p->k, (size_t)(p->B * p->Hkv * p->S * p->D), dt);
    bufs[2] = rounded(p->v, (size_t)(p->B * p->Hkv * p->S * p->Dv), dt);
    a.q = eng_view_contiguous(bufs[0], p->B, p->H, p->L, p->D);
    a.k = eng_view_contiguous(bufs[1], p->B, p->Hkv, p->S, p->D);
    a.v = eng_view_contiguous(bufs[2], p->B, p->Hkv, p->S, p->Dv);
    a.out = eng_view_contiguous(NULL, p->B, p->H, p->L, p->Dv);
    if (!ref_sdpa(&a, res))
        abort();
}

static void check_close(const float *got, const double *want, size_t n, double tol,
                        const char *what)
{
    size_t bad = 0;
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (isinf(want[i]) && got[i] == (float)want[i])
            continue;
        if (!(d <= tol)) {
            bad++;
            if (!(d <= worst))
                worst = d;
        }
    }
    CHECKF(bad == 0, "%s: %zu of %zu values off by up to %g", what, bad, n, worst);
}

/* ---- Metadata ------------------------------------------------------------------------------ */

static void test_server_metadata(void)
{
    api_reply r;
    api_v2_server_metadata(&r);
    CHECK_EQ_INT(r.status, 200);
    json_t *root = reply_json(&r), *ext;
    if (root) {
        CHECK(strcmp(json_string_value(json_object_get(root, "name")), "attnd") == 0);
        CHECK(json_is_string(json_object_get(root, "version")));
        ext = json_object_get(root, "extensions");
        bool binary = false, stats = false;
        size_t i;
        json_t *e;
        json_array_foreach(ext, i, e)
        {
            binary |= strcmp(json_string_value(e), "binary_tensor_data") == 0;
            stats |= strcmp(json_string_value(e), "statistics") == 0;
        }
        CHECK(binary && stats);
        /* The engine as the start-up log names it. */
        json_t *engine = json_object_get(root, "engine");
        const char *kernels = json_string_value(json_object_get(engine, "kernels"));
        CHECK(kernels && strcmp(kernels, eng_kernels_name()) == 0);
        CHECK(json_is_string(json_object_get(engine, "bf16")));
        CHECK(json_is_string(json_object_get(engine, "cpu")));
        CHECK(json_is_string(json_object_get(engine, "openblas_core")));
        json_decref(root);
    }
    api_reply_free(&r);
}

static json_t *find_named(json_t *array, const char *name)
{
    size_t i;
    json_t *x;
    json_array_foreach(array, i, x)
    {
        if (strcmp(json_string_value(json_object_get(x, "name")), name) == 0)
            return x;
    }
    return NULL;
}

static void check_meta_tensor(json_t *list, const char *name, const char *datatype, int rank)
{
    json_t *t = find_named(list, name);
    CHECKF(t != NULL, "no tensor %s", name);
    if (!t)
        return;
    CHECKF(strcmp(json_string_value(json_object_get(t, "datatype")), datatype) == 0, "%s datatype",
           name);
    json_t *shape = json_object_get(t, "shape");
    CHECKF((int)json_array_size(shape) == rank, "%s rank %zu", name, json_array_size(shape));
    for (size_t d = 0; d < json_array_size(shape); d++) {
        json_int_t v = json_integer_value(json_array_get(shape, d));
        CHECKF(v == -1 || v > 0, "%s shape[%zu] = %lld", name, d, (long long)v);
    }
}

static void test_model_metadata(void)
{
    const char *versions[] = {NULL, "1"};
    for (int i = 0; i < 2; i++) {
        api_call call = {.models = models, .model = "sdpa", .version = versions[i]};
        api_reply r;
        api_v2_model_metadata(&call, &r);
        CHECK_EQ_INT(r.status, 200);
        json_t *root = reply_json(&r);
        if (root) {
            CHECK(strcmp(json_string_value(json_object_get(root, "name")), "sdpa") == 0);
            json_t *v = json_object_get(root, "versions");
            CHECK(json_array_size(v) == 1 &&
                  strcmp(json_string_value(json_array_get(v, 0)), "1") == 0);
            CHECK(json_is_string(json_object_get(root, "platform")));
            json_t *in = json_object_get(root, "inputs"), *out = json_object_get(root, "outputs");
            CHECK_EQ_INT(json_array_size(in), 6);
            check_meta_tensor(in, "query", "FP32", 4);
            check_meta_tensor(in, "key", "FP32", 4);
            check_meta_tensor(in, "value", "FP32", 4);
            check_meta_tensor(in, "attn_mask", "BOOL", 4);
            check_meta_tensor(in, "key_padding_mask", "BOOL", 2);
            check_meta_tensor(in, "kv_lengths", "INT64", 1);
            /* The weights are no listed output: a client that asks for every output listed
             * (perf_analyzer) would measure the L x S weights rather than attention. */
            CHECK_EQ_INT(json_array_size(out), 2);
            check_meta_tensor(out, "output", "FP32", 4);
            check_meta_tensor(out, "lse", "FP32", 3);
            CHECK(find_named(out, "weights") == NULL);
            json_decref(root);
        }
        api_reply_free(&r);
    }

    /* A registered layer is a model too, with its widths as fixed dimensions. */
    api_call call = {.models = models, .model = "demo"};
    api_reply r;
    api_v2_model_metadata(&call, &r);
    CHECK_EQ_INT(r.status, 200);
    json_t *root = reply_json(&r);
    if (root) {
        json_t *in = json_object_get(root, "inputs"), *out = json_object_get(root, "outputs");
        CHECK_EQ_INT(json_array_size(in), 4);
        check_meta_tensor(in, "input", "FP32", 3);
        check_meta_tensor(in, "memory", "FP32", 3);
        check_meta_tensor(in, "attn_mask", "BOOL", 4);
        check_meta_tensor(in, "key_padding_mask", "BOOL", 2);
        json_t *x = find_named(in, "input");
        CHECK(x && json_integer_value(json_array_get(json_object_get(x, "shape"), 0)) == -1);
        CHECK(x && json_integer_value(json_array_get(json_object_get(x, "shape"), 2)) == 64);
        CHECK_EQ_INT(json_array_size(out), 1);
        check_meta_tensor(out, "output", "FP32", 3);
        json_t *o = find_named(out, "output");
        CHECK(o && json_integer_value(json_array_get(json_object_get(o, "shape"), 2)) == 64);
        json_decref(root);
    }
    api_reply_free(&r);
}

/* One of Triton's ModelInput / ModelOutput entries: data_type, dims and, for inputs, optional. */
static void check_config_tensor(json_t *list, const char *name, const char *data_type,
                                const int64_t *dims, int rank, int optional)
{
    json_t *t = find_named(list, name);
    CHECKF(t != NULL, "no tensor %s in the config", name);
    if (!t)
        return;
    CHECKF(strcmp(json_string_value(json_object_get(t, "data_type")), data_type) == 0,
           "%s data_type", name);
    json_t *d = json_object_get(t, "dims");
    CHECKF((int)json_array_size(d) == rank, "%s has %zu dims", name, json_array_size(d));
    for (int i = 0; i < rank && i < (int)json_array_size(d); i++)
        CHECKF(json_integer_value(json_array_get(d, (size_t)i)) == dims[i], "%s dims[%d]", name, i);
    CHECK(json_is_false(json_object_get(t, "is_shape_tensor")));
    if (optional >= 0)
        CHECKF(json_is_boolean(json_object_get(t, "optional")) &&
                   json_is_true(json_object_get(t, "optional")) == (optional == 1),
               "%s optional", name);
}

/* Triton's model configuration, as perf_analyzer's model parser reads it: max_batch_size 0 (the
 * shapes keep their batch axis), the metadata's tensors with TYPE_ data types and the optional
 * inputs marked, the priority levels (api_limits_default) in dynamic_batching, no batching, not
 * decoupled, no response cache. */
static void test_model_config(void)
{
    static const int64_t v4[4] = {-1, -1, -1, -1}, v3[3] = {-1, -1, -1}, v2[2] = {-1, -1};
    static const int64_t v1[1] = {-1}, x[3] = {-1, -1, 64};
    const char *versions[] = {NULL, "1"};
    for (int i = 0; i < 2; i++) {
        api_call call = {.models = models, .model = "sdpa", .version = versions[i]};
        api_reply r;
        api_v2_model_config(&call, &r);
        CHECK_EQ_INT(r.status, 200);
        json_t *root = reply_json(&r);
        if (root) {
            CHECK(strcmp(json_string_value(json_object_get(root, "name")), "sdpa") == 0);
            CHECK(json_is_string(json_object_get(root, "platform")));
            CHECK(json_integer_value(json_object_get(root, "max_batch_size")) == 0 &&
                  json_is_integer(json_object_get(root, "max_batch_size")));
            /* Triton's place for the priority levels; no batching (max_batch_size 0). */
            json_t *db = json_object_get(root, "dynamic_batching");
            CHECK(json_integer_value(json_object_get(db, "priority_levels")) == 2);
            CHECK(json_integer_value(json_object_get(db, "default_priority_level")) == 2);
            CHECK(json_integer_value(json_object_get(db, "max_queue_delay_microseconds")) == 0 &&
                  json_is_integer(json_object_get(db, "max_queue_delay_microseconds")));
            CHECK(json_object_get(root, "sequence_batching") == NULL);
            CHECK(json_is_false(
                json_object_get(json_object_get(root, "model_transaction_policy"), "decoupled")));
            CHECK(
                json_is_false(json_object_get(json_object_get(root, "response_cache"), "enable")));
            json_t *in = json_object_get(root, "input"), *out = json_object_get(root, "output");
            CHECK_EQ_INT(json_array_size(in), 6);
            check_config_tensor(in, "query", "TYPE_FP32", v4, 4, 0);
            check_config_tensor(in, "key", "TYPE_FP32", v4, 4, 0);
            check_config_tensor(in, "value", "TYPE_FP32", v4, 4, 0);
            check_config_tensor(in, "attn_mask", "TYPE_BOOL", v4, 4, 1);
            check_config_tensor(in, "key_padding_mask", "TYPE_BOOL", v2, 2, 1);
            check_config_tensor(in, "kv_lengths", "TYPE_INT64", v1, 1, 1);
            CHECK_EQ_INT(json_array_size(out), 2);
            check_config_tensor(out, "output", "TYPE_FP32", v4, 4, -1);
            check_config_tensor(out, "lse", "TYPE_FP32", v3, 3, -1);
            json_decref(root);
        }
        api_reply_free(&r);
    }

    api_call call = {.models = models, .model = "demo"};
    api_reply r;
    api_v2_model_config(&call, &r);
    CHECK_EQ_INT(r.status, 200);
    json_t *root = reply_json(&r);
    if (root) {
        json_t *in = json_object_get(root, "input"), *out = json_object_get(root, "output");
        CHECK_EQ_INT(json_array_size(in), 4);
        check_config_tensor(in, "input", "TYPE_FP32", x, 3, 0);
        check_config_tensor(in, "memory", "TYPE_FP32", x, 3, 1);
        check_config_tensor(in, "attn_mask", "TYPE_BOOL", v4, 4, 1);
        check_config_tensor(in, "key_padding_mask", "TYPE_BOOL", v2, 2, 1);
        CHECK_EQ_INT(json_array_size(out), 1);
        check_config_tensor(out, "output", "TYPE_FP32", x, 3, -1);
        json_decref(root);
    }
    api_reply_free(&r);

    api_call unknown = {.models = models, .model = "nosuch"};
    api_v2_model_config(&unknown, &r);
    check_error(&r, 404, "unknown model");
    api_reply_free(&r);
    api_call version = {.models = models, .model = "sdpa", .version = "2"};
    api_v2_model_config(&version, &r);
    check_error(&r, 404, "no version");
    api_reply_free(&r);
}

static void test_model_unknown(void)
{
    const struct {
        const char *model, *version, *needle;
    } cases[] = {{"nosuch", NULL, "unknown model"},
                 {"sdpa", "2", "no version"},
                 {"demo", "0", "no version"},
                 {"", NULL, "unknown model"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        api_call call = {.models = models, .model = cases[i].model, .version = cases[i].version};
        api_reply r;
        api_v2_model_metadata(&call, &r);
        check_error(&r, 404, cases[i].needle);
        api_reply_free(&r);
        api_v2_model_ready(&call, &r);
        check_error(&r, 404, cases[i].needle);
        api_reply_free(&r);
        infer("{}", 2, &(call_opts){.model = cases[i].model, .version = cases[i].version}, &r);
        check_error(&r, 404, cases[i].needle);
        api_reply_free(&r);
        CHECK(!api_v2_model_known(models, cases[i].model, cases[i].version));
    }
    CHECK(api_v2_model_known(models, "sdpa", NULL));
    CHECK(api_v2_model_known(models, "demo", "1"));
}

static void test_model_ready(void)
{
    api_call call = {.models = models, .model = "sdpa", .version = "1"};
    api_reply r;
    api_v2_model_ready(&call, &r);
    CHECK_EQ_INT(r.status, 200);
    json_t *root = reply_json(&r);
    if (root) {
        CHECK(strcmp(json_string_value(json_object_get(root, "name")), "sdpa") == 0);
        CHECK(json_is_true(json_object_get(root, "ready")));
        json_decref(root);
    }
    api_reply_free(&r);
}

/* ---- Inference ----------------------------------------------------------------------------- */

/* The spec's JSON request: flat and nested data give the reference's output, with the model
 * name, version and echoed id, shapes and FP32 datatype. */
static void test_infer_json(void)
{
    problem p;
    problem_new(&p, 2, 2, 1, 3, 5, 4, 3);
    for (int nested = 0; nested < 2; nested++) {
        input ins[3];
        api_reply r;
        problem_inputs(&p, ins, "FP32", false, nested != 0);
        infer_inputs(ins, 3, "req-42", NULL, NULL, &r);
        CHECK_EQ_INT(r.status, 200);
        CHECK(strcmp(r.content_type, "application/json") == 0);
        CHECK_EQ_INT(r.inference_header_len, 0);
        CHECK_EQ_INT(r.inferences, 2);
        json_t *root = reply_json(&r);
        if (root) {
            CHECK(strcmp(json_string_value(json_object_get(root, "model_name")), "sdpa") == 0);
            CHECK(strcmp(json_string_value(json_object_get(root, "model_version")), "1") == 0);
            CHECK(strcmp(json_string_value(json_object_get(root, "id")), "req-42") == 0);
            CHECK_EQ_INT(json_array_size(json_object_get(root, "outputs")), 1);
            json_decref(root);
        }
        int64_t shape[4];
        int rank = 0;
        bool binary = true;
        float *out = reply_output(&r, "output", shape, &rank, &binary);
        CHECK(out != NULL && !binary);
        CHECK(rank == 4 && shape[0] == 2 && shape[1] == 2 && shape[2] == 3 && shape[3] == 3);
        ref_result ref;
        float *bufs[3];
        reference(&p, "FP32", (eng_sdpa_args){0}, &ref, bufs);
        if (out)
            check_close(out, ref.out, 2 * 2 * 3 * 3, 2e-6, "output");
        ref_result_free(&ref);
        for (int i = 0; i < 3; i++)
            free(bufs[i]);
        free(out);
        api_reply_free(&r);
    }
    problem_free(&p);
}

/* Binary FP32 in and out: the same numbers as the JSON route, bit for bit, the reply framed by
 * Inference-Header-Content-Length with the outputs after the (space-padded) JSON. */
static void test_infer_binary_roundtrip(void)
{
    problem p;
    problem_new(&p, 1, 4, 2, 7, 9, 8, 8);
    input ins[3];
    api_reply rj, rb;
    problem_inputs(&p, ins, "FP32", false, false);
    infer_inputs(ins, 3, NULL, "{\"return_lse\":true}", NULL, &rj);
    problem_inputs(&p, ins, "FP32", true, false);
    infer_inputs(ins, 3, NULL, "{\"return_lse\":true,\"binary_data_output\":true}", NULL, &rb);
    CHECK_EQ_INT(rj.status, 200);
    CHECK_EQ_INT(rb.status, 200);
    CHECK(strcmp(rb.content_type, "application/octet-stream") == 0);
    CHECK(rb.inference_header_len > 0 && rb.inference_header_len % 64 == 0);
    size_t n_out = 4 * 7 * 8, n_lse = 4 * 7;
    CHECK_EQ_INT(rb.body_len, (size_t)rb.inference_header_len + (n_out + n_lse) * 4);
    const char *names[2] = {"output", "lse"};
    for (int i = 0; i < 2; i++) {
        int64_t shape[4];
        int rank;
        bool bj = true, bb = false;
        float *vj = reply_output(&rj, names[i], shape, &rank, &bj);
        float *vb = reply_output(&rb, names[i], shape, &rank, &bb);
        CHECK(vj && vb && !bj && bb);
        if (vj && vb)
            CHECKF(memcmp(vj, vb, (i == 0 ? n_out : n_lse) * 4) == 0, "%s differs", names[i]);
        free(vj);
        free(vb);
    }
    api_reply_free(&rj);
    api_reply_free(&rb);
    problem_free(&p);
}

/* FP16 and BF16 binary inputs, FP32 outputs: the reference computed on the rounded inputs. */
static void test_infer_half_inputs(void)
{
    const char *types[2] = {"FP16", "BF16"};
    problem p;
    problem_new(&p, 1, 2, 2, 6, 6, 4, 4);
    for (int t = 0; t < 2; t++) {
        input ins[3];
        api_reply r;
        problem_inputs(&p, ins, types[t], true, false);
        infer_inputs(ins, 3, NULL, "{\"causal\":true}", NULL, &r);
        CHECKF(r.status == 200, "%s: %d %.200s", types[t], r.status, snippet(&r));
        int64_t shape[4];
        int rank;
        bool binary = true;
        float *out = reply_output(&r, "output", shape, &rank, &binary);
        CHECK(out && !binary);
        ref_result ref;
        float *bufs[3];
        reference(&p, types[t], (eng_sdpa_args){.causal = true}, &ref, bufs);
        if (out)
            check_close(out, ref.out, 2 * 6 * 4, 2e-6, types[t]);
        ref_result_free(&ref);
        for (int i = 0; i < 3; i++)
            free(bufs[i]);
        free(out);
        api_reply_free(&r);
    }
    problem_free(&p);
}

/* FP16 sent as JSON is refused: JSON has no 16-bit floats (the spec says so). */
static void test_infer_half_json_refused(void)
{
    problem p;
    problem_new(&p, 1, 1, 1, 2, 2, 2, 2);
    input ins[3];
    api_reply r;
    problem_inputs(&p, ins, "FP16", false, false);
    infer_inputs(ins, 3, NULL, NULL, NULL, &r);
    check_error(&r, 400, "binary");
    api_reply_free(&r);
    problem_free(&p);
}

/* "outputs" selects what is returned, each in the form asked (binary_data overrides
 * binary_data_output), in the order of the model's outputs. */
static void test_infer_selected_outputs(void)
{
    problem p;
    problem_new(&p, 1, 2, 2, 3, 4, 2, 2);
    input ins[3];
    problem_inputs(&p, ins, "FP32", true, false);
    ref_result ref;
    float *bufs[3];
    reference(&p, "FP32", (eng_sdpa_args){.weights_mode = ENG_WEIGHTS_PER_HEAD}, &ref, bufs);

    const struct {
        const char *params, *outputs;
        bool out, weights, lse;
        bool out_bin, weights_bin, lse_bin;
    } cases[] = {
        {NULL, "[{\"name\":\"lse\"}]", false, false, true, false, false, false},
        {NULL, "[{\"name\":\"weights\",\"parameters\":{\"binary_data\":true}}]", false, true, false,
         false, true, false},
        {"{\"binary_data_output\":true}",
         "[{\"name\":\"lse\",\"parameters\":{\"binary_data\":false}},{\"name\":\"output\"}]", true,
         false, true, true, false, false},
        {"{\"return_weights\":\"per_head\",\"return_lse\":true}", NULL, true, true, true, false,
         false, false},
        {"{\"return_lse\":true}", "[{\"name\":\"output\"}]", true, false, false, false, false,
         false},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        api_reply r;
        infer_inputs(ins, 3, NULL, cases[c].params, cases[c].outputs, &r);
        CHECKF(r.status == 200, "case %zu: %d %.200s", c, r.status, snippet(&r));
        const char *names[3] = {"output", "weights", "lse"};
        bool want[3] = {cases[c].out, cases[c].weights, cases[c].lse};
        bool bin[3] = {cases[c].out_bin, cases[c].weights_bin, cases[c].lse_bin};
        const double *refs[3] = {ref.out, ref.weights, ref.lse};
        size_t counts[3] = {2 * 3 * 2, 2 * 3 * 4, 2 * 3};
        json_t *root = reply_json(&r);
        size_t n_out = 0;
        for (int o = 0; o < 3; o++)
            n_out += want[o];
        CHECKF(root && json_array_size(json_object_get(root, "outputs")) == n_out,
               "case %zu: outputs", c);
        json_decref(root);
        for (int o = 0; o < 3; o++) {
            int64_t shape[4];
            int rank = 0;
            bool binary = false;
            float *v = reply_output(&r, names[o], shape, &rank, &binary);
            CHECKF((v != NULL) == want[o], "case %zu: %s present %d", c, names[o], v != NULL);
            if (v) {
                CHECKF(binary == bin[o], "case %zu: %s binary %d", c, names[o], binary);
                check_close(v, refs[o], counts[o], 2e-6, names[o]);
            }
            free(v);
        }
        api_reply_free(&r);
    }
    ref_result_free(&ref);
    for (int i = 0; i < 3; i++)
        free(bufs[i]);
    problem_free(&p);
}

/* tritonclient writes a float mask's -inf as -Infinity (Python's json module): it is read as
 * -inf, and an lse of -inf (a row that sees no key) is written back the same way, which
 * tritonclient and KServe's client decode as -inf (null, which the OIP schema refuses, became
 * NaN). Other non-finite inputs are refused naming the element. */
static void test_infer_nonfinite_json(void)
{
    const char *body =
        "{\"parameters\":{\"return_lse\":true},\"inputs\":["
        "{\"name\":\"query\",\"datatype\":\"FP32\",\"shape\":[2,2],"
        "\"data\":[1,0,0,1]},"
        "{\"name\":\"key\",\"datatype\":\"FP32\",\"shape\":[2,2],\"data\":[1,0,0,1]},"
        "{\"name\":\"value\",\"datatype\":\"FP32\",\"shape\":[2,2],"
        "\"data\":[1,2,3,4]},"
        "{\"name\":\"attn_mask\",\"datatype\":\"FP32\",\"shape\":[2,2],"
        "\"data\":[-Infinity,-Infinity,0,-Infinity]}]}";
    api_reply r;
    infer(body, strlen(body), NULL, &r);
    CHECKF(r.status == 200, "%d %.300s", r.status, snippet(&r));
    CHECKF(r.body && strstr(r.body, "[-Infinity,0") != NULL, "lse: %.400s", snippet(&r));
    CHECKF(r.body && strstr(r.body, "\"data\":[0,0,1,2]") != NULL, "output: %.400s", snippet(&r));
    api_reply_free(&r);

    const char *bad = "{\"inputs\":["
                      "{\"name\":\"query\",\"datatype\":\"FP32\",\"shape\":[1,2],"
                      "\"data\":[1,NaN]},"
                      "{\"name\":\"key\",\"datatype\":\"FP32\",\"shape\":[1,2],\"data\":[1,0]},"
                      "{\"name\":\"value\",\"datatype\":\"FP32\",\"shape\":[1,2],\"data\":[3,4]}]}";
    infer(bad, strlen(bad), NULL, &r);
    check_error(&r, 400, "is NaN; values must be finite");
    api_reply_free(&r);
}

/* The id comes back as given, escapes and all; a request without one gets its X-Request-Id
 * (KServe's InferenceResponse requires an id); without either, no "id". */
static void test_infer_id_echo(void)
{
    const char *body =
        "{\"id\":\"a\\\"b\\u00e9\\n\",\"inputs\":["
        "{\"name\":\"query\",\"datatype\":\"FP32\",\"shape\":[1,2],\"data\":[1,0]},"
        "{\"name\":\"key\",\"datatype\":\"FP32\",\"shape\":[1,2],\"data\":[1,0]},"
        "{\"name\":\"value\",\"datatype\":\"FP32\",\"shape\":[1,2],\"data\":[3,4]}]}";
    api_reply r;
    infer(body, strlen(body), NULL, &r);
    CHECK_EQ_INT(r.status, 200);
    json_t *root = reply_json(&r);
    if (root) {
        CHECK(strcmp(json_string_value(json_object_get(root, "id")), "a\"b\xc3\xa9\n") == 0);
        json_decref(root);
    }
    api_reply_free(&r);
    const char *no_id = strstr(body, "\"inputs\"");
    char *b2 = malloc(strlen(no_id) + 2);
    snprintf(b2, strlen(no_id) + 2, "{%s", no_id);
    infer(b2, strlen(b2), NULL, &r);
    CHECK_EQ_INT(r.status, 200);
    root = reply_json(&r);
    if (root) {
        CHECK(json_object_get(root, "id") == NULL);
        json_decref(root);
    }
    api_reply_free(&r);
    call_opts with_request_id = {.request_id = "req-7f3a"};
    infer(b2, strlen(b2), &with_request_id, &r);
    CHECK_EQ_INT(r.status, 200);
    root = reply_json(&r);
    if (root) {
        CHECK(json_is_string(json_object_get(root, "id")) &&
              strcmp(json_string_value(json_object_get(root, "id")), "req-7f3a") == 0);
        json_decref(root);
    }
    api_reply_free(&r);
    infer(body, strlen(body), &with_request_id, &r);
    root = reply_json(&r);
    if (root) {
        CHECK(strcmp(json_string_value(json_object_get(root, "id")), "a\"b\xc3\xa9\n") == 0);
        json_decref(root);
    }
    api_reply_free(&r);
    free(b2);
}

/* Masks, lengths and every parameter, against the reference: BOOL attn_mask (binary),
 * key_padding_mask (JSON booleans), kv_lengths (INT32 binary, INT64 JSON), causal
 * bottom_right, window, scale, softcap, alibi, mean weights. */
static void test_infer_parameters(void)
{
    problem p;
    problem_new(&p, 2, 2, 2, 4, 6, 4, 4);
    uint8_t mask[4 * 6], kpm[2 * 6] = {0};
    int64_t kvlen[2] = {5, 6};
    for (int i = 0; i < 24; i++)
        mask[i] = (uint8_t)((i * 7) % 5 != 0);
    kpm[3] = 1;
    kpm[6 + 1] = 1;
    for (int variant = 0; variant < 2; variant++) {
        input ins[6];
        problem_inputs(&p, ins, "FP32", variant == 0, variant == 1);
        ins[3] = (input){"attn_mask", "BOOL", 2, {4, 6}, NULL, mask, NULL, variant == 0, false};
        ins[4] = (input){"key_padding_mask", "BOOL", 2, {2, 6}, NULL, kpm, NULL, false, true};
        ins[5] = (input){
            "kv_lengths", variant == 0 ? "INT32" : "INT64", 1, {2}, NULL, NULL, kvlen, variant == 0,
            false};
        api_reply r;
        infer_inputs(ins, 6, NULL,
                     "{\"causal\":\"bottom_right\",\"window_left\":2,\"window_right\":-1,"
                     "\"scale\":0.7,\"softcap\":5,\"alibi\":true,\"return_weights\":\"mean\","
                     "\"return_lse\":true,\"timeout_ms\":10000,\"priority\":0}",
                     NULL, &r);
        CHECKF(r.status == 200, "variant %d: %d %.300s", variant, r.status, snippet(&r));
        eng_sdpa_args a = {.causal = true,
                           .align = ENG_ALIGN_BOTTOM_RIGHT,
                           .window_left_set = true,
                           .window_left = 2,
                           .scale_set = true,
                           .scale = 0.7f,
                           .softcap = 5,
                           .alibi = true,
                           .key_padding = kpm,
                           .key_padding_stride = 6,
                           .kv_lengths = kvlen,
                           .weights_mode = ENG_WEIGHTS_MEAN,
                           .attn_mask = {ENG_MASK_BOOL, mask, {1, 1, 4, 6}, {24, 24, 6, 1}}};
        ref_result ref;
        float *bufs[3];
        reference(&p, "FP32", a, &ref, bufs);
        int64_t shape[4];
        int rank;
        bool binary;
        float *out = reply_output(&r, "output", shape, &rank, &binary);
        float *w = reply_output(&r, "weights", shape, &rank, &binary);
        CHECK(rank == 3 && shape[0] == 2 && shape[1] == 4 && shape[2] == 6);
        float *lse = reply_output(&r, "lse", shape, &rank, &binary);
        if (out && w && lse) {
            check_close(out, ref.out, 2 * 2 * 4 * 4, 2e-6, "output");
            check_close(w, ref.weights_mean, 2 * 4 * 6, 2e-6, "weights");
            check_close(lse, ref.lse, 2 * 2 * 4, 2e-5, "lse");
        } else {
            CHECK(!"outputs missing");
        }
        free(out);
        free(w);
        free(lse);
        ref_result_free(&ref);
        for (int i = 0; i < 3; i++)
            free(bufs[i]);
        api_reply_free(&r);
    }
    problem_free(&p);
}

/* A float attn_mask: FP32 JSON with null for -inf, and FP16 binary, give the same result;
 * rank-2 query [L, E] with num_heads. */
static void test_infer_float_mask_rank2(void)
{
    float q[2 * 4], k[3 * 4], v[3 * 4], m[2 * 3] = {0, -INFINITY, 0.5f, 0, 0, -1};
    for (int i = 0; i < 8; i++)
        q[i] = frand();
    for (int i = 0; i < 12; i++) {
        k[i] = frand();
        v[i] = frand();
    }
    api_reply r[2];
    for (int variant = 0; variant < 2; variant++) {
        input ins[4] = {
            {"query", "FP32", 2, {2, 4}, q, NULL, NULL, false, true},
            {"key", "FP32", 2, {3, 4}, k, NULL, NULL, false, false},
            {"value", "FP32", 2, {3, 4}, v, NULL, NULL, true, false},
            {"attn_mask", variant ? "FP16" : "FP32", 2, {2, 3}, m, NULL, NULL, variant != 0, false},
        };
        if (variant == 0) {
            /* JSON has no -inf: null stands for it, as in /v1/attention. */
            size_t len, hlen;
            char *body = build(ins, 4, NULL, "{\"num_heads\":2}", NULL, &len, &hlen);
            char *inf = strstr(body, "-inf");
            CHECK(inf != NULL);
            if (inf)
                memcpy(inf, "null", 4);
            char hl[32];
            snprintf(hl, sizeof hl, "%zu", hlen);
            infer(body, len, &(call_opts){.header_len = hl}, &r[variant]);
            free(body);
        } else {
            infer_inputs(ins, 4, NULL, "{\"num_heads\":2}", NULL, &r[variant]);
        }
        CHECKF(r[variant].status == 200, "variant %d: %d %.300s", variant, r[variant].status,
               snippet(&r[variant]));
    }
    int64_t shape[4];
    int rank;
    bool binary;
    float *a = reply_output(&r[0], "output", shape, &rank, &binary);
    CHECK(rank == 2 && shape[0] == 2 && shape[1] == 4);
    float *b = reply_output(&r[1], "output", shape, &rank, &binary);
    CHECK(a && b && memcmp(a, b, 8 * sizeof(float)) == 0);
    free(a);
    free(b);
    api_reply_free(&r[0]);
    api_reply_free(&r[1]);
}

/* Float32 bytes after a JSON of any length: used in place when 4-byte aligned, copied when
 * not; the result is the same either way. */
static void test_infer_alignment(void)
{
    problem p;
    problem_new(&p, 1, 1, 1, 5, 5, 4, 4);
    input ins[3];
    problem_inputs(&p, ins, "FP32", true, false);
    float *first = NULL;
    for (int pad = 0; pad < 4; pad++) {
        char id[8] = "";
        for (int i = 0; i < pad; i++)
            id[i] = 'x';
        api_reply r;
        infer_inputs(ins, 3, id, NULL, NULL, &r);
        CHECK_EQ_INT(r.status, 200);
        int64_t shape[4];
        int rank;
        bool binary;
        float *out = reply_output(&r, "output", shape, &rank, &binary);
        if (!first)
            first = out;
        else {
            CHECK(out && memcmp(out, first, 20 * sizeof(float)) == 0);
            free(out);
        }
        api_reply_free(&r);
    }
    free(first);
    api__tensor t = {.form = API_FORM_RAW, .dtype = API_DTYPE_FLOAT32, .count = 1};
    float f[2] = {1, 2};
    t.raw = f;
    CHECK(api__tensor_in_place(&t, API_ELEM_FLOAT));
    t.raw = (const char *)f + 1;
    CHECK(!api__tensor_in_place(&t, API_ELEM_FLOAT));
    t.dtype = API_DTYPE_FLOAT16;
    t.raw = f;
    CHECK(!api__tensor_in_place(&t, API_ELEM_FLOAT));
    problem_free(&p);
}

/* ---- Errors -------------------------------------------------------------------------------- */

#define IN_Q "{\"name\":\"query\",\"datatype\":\"FP32\",\"shape\":[1,2],\"data\":[1,0]}"
#define IN_K "{\"name\":\"key\",\"datatype\":\"FP32\",\"shape\":[1,2],\"data\":[1,0]}"
#define IN_V "{\"name\":\"value\",\"datatype\":\"FP32\",\"shape\":[1,2],\"data\":[3,4]}"
#define QKV  IN_Q "," IN_K "," IN_V

typedef struct {
    const char *body;
    int status;
    const char *needle;
} json_case;

#define IN_V_NP(ct)                                                                                \
    "{\"name\":\"value\",\"datatype\":\"FP32\",\"shape\":[1,2],\"data\":[3,4],"                    \
    "\"parameters\":{\"content_type\":" ct "}}"

static const json_case json_cases[] = {
    {"{\"inputs\":[" QKV "]}", 200, NULL},
    /* Triton's reserved parameters: honoured (timeout, binary_data_output) or, as Triton does on
     * a model without a sequence batcher, accepted and ignored, once well-formed. */
    {"{\"parameters\":{\"sequence_id\":7,\"sequence_start\":true,\"sequence_end\":false,"
     "\"priority\":1,\"timeout\":1000000,\"headers\":{\"x-trace\":\"1\"},"
     "\"triton_enable_empty_final_response\":true,\"binary_data_output\":false},"
     "\"inputs\":[" QKV "]}",
     200, NULL},
    {"{\"parameters\":{\"sequence_id\":\"conversation-9\"},\"inputs\":[" QKV "]}", 200, NULL},
    /* Triton's priority: 0 (the default level) to priority_levels (2 by default); above it is
     * 400 naming the parameter and the limit, as are a negative or non-integer one. */
    {"{\"parameters\":{\"priority\":2},\"inputs\":[" QKV "]}", 200, NULL},
    {"{\"parameters\":{\"priority\":3},\"inputs\":[" QKV "]}", 400,
     "parameters.priority is 3; this server has 2 priority levels"},
    {"{\"parameters\":{\"priority\":-1},\"inputs\":[" QKV "]}", 400, "parameters.priority"},
    {"{\"parameters\":{\"priority\":1.0},\"inputs\":[" QKV "]}", 400, "parameters.priority"},
    {"{\"parameters\":{\"priority\":\"1\"},\"inputs\":[" QKV "]}", 400, "parameters.priority"},
    {"{\"parameters\":{\"sequence_id\":-1},\"inputs\":[" QKV "]}", 400, "correlation id"},
    {"{\"parameters\":{\"sequence_id\":1.5},\"inputs\":[" QKV "]}", 400, "sequence_id"},
    {"{\"parameters\":{\"sequence_start\":\"yes\"},\"inputs\":[" QKV "]}", 400, "sequence_start"},
    /* MLServer's content_type on an input: "np" (a tensor) is what every input is. */
    {"{\"inputs\":[" IN_Q "," IN_K "," IN_V_NP("\"np\"") "]}", 200, NULL},
    {"{\"inputs\":[" IN_Q "," IN_K "," IN_V_NP("\"str\"") "]}", 400, "content_type"},
    {"{\"inputs\":[" IN_Q "," IN_K "," IN_V_NP("1") "]}", 400, "must be \"np\""},
    {"", 400, NULL},
    {"{\"inputs\":[" QKV "]", 400, NULL},
    {"[1]", 400, NULL},
    {"{}", 400, "inputs"},
    {"{\"inputs\":{}}", 400, "inputs"},
    {"{\"inputs\":[" IN_Q "," IN_K "]}", 400, "value"},
    {"{\"inputs\":[" QKV "," IN_Q "]}", 400, "twice"},
    {"{\"inputs\":[" QKV ",{\"name\":\"quary\",\"datatype\":\"FP32\",\"shape\":[1],"
     "\"data\":[1]}]}",
     400, "did you mean \"query\""},
    {"{\"inputs\":[" QKV "],\"extra\":1}", 400, "unknown field"},
    {"{\"model_name\":\"other\",\"inputs\":[" QKV "]}", 400, "model_name"},
    {"{\"model_name\":\"sdpa\",\"model_version\":\"1\",\"inputs\":[" QKV "]}", 200, NULL},
    {"{\"id\":7,\"inputs\":[" QKV "]}", 400, "id"},
    /* Parameters. */
    {"{\"parameters\":{\"casual\":true},\"inputs\":[" QKV "]}", 400, "did you mean \"causal\""},
    {"{\"parameters\":{\"zzz\":1},\"inputs\":[" QKV "]}", 400, "unknown parameter"},
    {"{\"parameters\":[],\"inputs\":[" QKV "]}", 400, "parameters"},
    {"{\"parameters\":{\"causal\":\"yes\"},\"inputs\":[" QKV "]}", 400, "causal"},
    {"{\"parameters\":{\"scale\":\"x\"},\"inputs\":[" QKV "]}", 400, "scale"},
    {"{\"parameters\":{\"num_heads\":0},\"inputs\":[" QKV "]}", 400, "num_heads"},
    {"{\"parameters\":{\"num_heads\":2},\"inputs\":[" QKV "]}", 200, NULL},
    {"{\"parameters\":{\"num_heads\":3},\"inputs\":[" QKV "]}", 400, "multiple"},
    {"{\"parameters\":{\"window_left\":-2},\"inputs\":[" QKV "]}", 400, "window_left"},
    {"{\"parameters\":{\"softcap\":-1},\"inputs\":[" QKV "]}", 400, "softcap"},
    {"{\"parameters\":{\"return_weights\":\"all\"},\"inputs\":[" QKV "]}", 400, "return_weights"},
    {"{\"parameters\":{\"return_lse\":1},\"inputs\":[" QKV "]}", 400, "return_lse"},
    {"{\"parameters\":{\"timeout_ms\":0},\"inputs\":[" QKV "]}", 400, "timeout_ms"},
    {"{\"parameters\":{\"binary_data_output\":\"yes\"},\"inputs\":[" QKV "]}", 400,
     "binary_data_output"},
    {"{\"parameters\":{\"causal\":\"top_left\",\"query_offset\":1},\"inputs\":[" QKV "]}", 400,
     "query_offset"},
    /* Inputs. */
    {"{\"inputs\":[" IN_Q "," IN_K ",{\"name\":\"value\",\"datatype\":\"FP32\",\"shape\":[1,2]}]}",
     400, "needs \"data\""},
    {"{\"inputs\":[" IN_Q "," IN_K ",{\"name\":\"value\",\"shape\":[1,2],\"data\":[1,2]}]}", 400,
     "datatype"},
    {"{\"inputs\":[" IN_Q "," IN_K
     ",{\"name\":\"value\",\"datatype\":\"FP64\",\"shape\":[1,2],\"data\":[1,2]}]}",
     400, "does not take datatype FP64"},
    {"{\"inputs\":[" IN_Q "," IN_K
     ",{\"name\":\"value\",\"datatype\":\"FLOAT\",\"shape\":[1,2],\"data\":[1,2]}]}",
     400, "not a datatype"},
    {"{\"inputs\":[" IN_Q "," IN_K
     ",{\"name\":\"value\",\"datatype\":\"BOOL\",\"shape\":[1,2],\"data\":[true,false]}]}",
     400, "does not take datatype BOOL"},
    {"{\"inputs\":[" IN_Q "," IN_K
     ",{\"name\":\"value\",\"datatype\":\"FP32\",\"shape\":[1,3],\"data\":[1,2]}]}",
     400, "holds 3"},
    {"{\"inputs\":[" IN_Q "," IN_K
     ",{\"name\":\"value\",\"datatype\":\"FP32\",\"shape\":[2,1],\"data\":[[1,2]]}]}",
     400, "nested as"},
    {"{\"inputs\":[" IN_Q "," IN_K
     ",{\"name\":\"value\",\"datatype\":\"FP32\",\"shape\":[1,2],\"data\":[[1,2]]}]}",
     200, NULL},
    {"{\"inputs\":[" IN_Q "," IN_K
     ",{\"name\":\"value\",\"datatype\":\"FP32\",\"shape\":[1,2],\"data\":[true,false]}]}",
     400, "booleans"},
    {"{\"inputs\":[" IN_Q "," IN_K
     ",{\"name\":\"value\",\"datatype\":\"FP32\",\"shape\":[1,0],\"data\":[]}]}",
     400, "positive"},
    {"{\"inputs\":[" IN_Q "," IN_K
     ",{\"name\":\"value\",\"datatype\":\"FP32\",\"shape\":[1,2],\"data\":{\"shape\":[1,2],"
     "\"data\":[1,2]}}]}",
     400, "array"},
    {"{\"inputs\":[" IN_Q "," IN_K
     ",{\"name\":\"value\",\"datatype\":\"FP32\",\"shape\":[1,2],\"data\":[1,\"2\"]}]}",
     400, "number"},
    {"{\"inputs\":[" IN_Q "," IN_K
     ",{\"name\":\"value\",\"datatype\":\"FP32\",\"shape\":[1,2],\"data\":[1,1e39]}]}",
     400, "float32"},
    {"{\"inputs\":[" IN_Q "," IN_K
     ",{\"name\":\"value\",\"datatype\":\"FP32\",\"shape\":[1,2],\"data\":[1,2],\"x\":1}]}",
     400, "unknown key"},
    {"{\"inputs\":[" IN_Q "," IN_K
     ",{\"name\":\"value\",\"datatype\":\"FP32\",\"shape\":[1,2],\"data\":[1,2],"
     "\"parameters\":{\"foo\":1}}]}",
     400, "binary_data_size"},
    {"{\"inputs\":[" IN_Q "," IN_K ",{\"name\":\"value\",\"datatype\":\"FP32\",\"shape\":[1,2],"
     "\"parameters\":{\"binary_data_size\":8}}]}",
     400, "Inference-Header-Content-Length"},
    {"{\"inputs\":[" QKV ",{\"name\":\"key_padding_mask\",\"datatype\":\"BOOL\",\"shape\":[1],"
     "\"data\":[1]}]}",
     400, "numbers"},
    {"{\"inputs\":[" QKV ",{\"name\":\"key_padding_mask\",\"datatype\":\"BOOL\",\"shape\":[2],"
     "\"data\":[true,false]}]}",
     400, "key_padding_mask"},
    {"{\"inputs\":[" QKV ",{\"name\":\"kv_lengths\",\"datatype\":\"INT64\",\"shape\":[1],"
     "\"data\":[2]}]}",
     400, "kv_lengths"},
    {"{\"inputs\":[" QKV ",{\"name\":\"kv_lengths\",\"datatype\":\"INT64\",\"shape\":[1],"
     "\"data\":[0.5]}]}",
     400, "integer"},
    {"{\"inputs\":[" QKV ",{\"name\":\"kv_lengths\",\"datatype\":\"FP32\",\"shape\":[1],"
     "\"data\":[1]}]}",
     400, "INT64"},
    {"{\"inputs\":[" QKV ",{\"name\":\"attn_mask\",\"datatype\":\"BOOL\",\"shape\":[1,1],"
     "\"data\":[[true]]}]}",
     200, NULL},
    {"{\"inputs\":[" QKV ",{\"name\":\"attn_mask\",\"datatype\":\"BOOL\",\"shape\":[1,3],"
     "\"data\":[true,false,true]}]}",
     400, "attn_mask"},
    /* Outputs. */
    {"{\"inputs\":[" QKV "],\"outputs\":[{\"name\":\"out\"}]}", 400, "unknown output"},
    {"{\"inputs\":[" QKV "],\"outputs\":[{\"name\":\"lse\"},{\"name\":\"lse\"}]}", 400, "twice"},
    {"{\"inputs\":[" QKV "],\"outputs\":{}}", 400, "outputs"},
    {"{\"inputs\":[" QKV "],\"outputs\":[{\"name\":\"lse\",\"parameters\":{\"classification\":"
     "2}}]}",
     400, "binary_data"},
    {"{\"parameters\":{\"return_weights\":false},\"inputs\":[" QKV
     "],\"outputs\":[{\"name\":\"weights\"}]}",
     400, "return_weights"},
    {"{\"parameters\":{\"return_lse\":false},\"inputs\":[" QKV
     "],\"outputs\":[{\"name\":\"lse\"}]}",
     400, "return_lse"},
};

static void test_infer_json_errors(void)
{
    for (size_t i = 0; i < sizeof json_cases / sizeof json_cases[0]; i++) {
        const json_case *c = &json_cases[i];
        api_reply r;
        infer(c->body, strlen(c->body), NULL, &r);
        if (c->status == 200)
            CHECKF(r.status == 200, "case %zu: %d %.300s", i, r.status, snippet(&r));
        else
            check_error(&r, c->status, c->needle);
        if (r.status != c->status)
            printf("  (case %zu: %s)\n", i, c->body);
        api_reply_free(&r);
    }
}

/* The framing of the binary extension: the header length, sizes against shapes, truncation,
 * bytes left over, the content type. */
static void test_infer_binary_errors(void)
{
    const char *json =
        "{\"inputs\":[" IN_Q "," IN_K ",{\"name\":\"value\",\"datatype\":\"FP32\",\"shape\":[1,2],"
        "\"parameters\":{\"binary_data_size\":8}}]}";
    size_t jl = strlen(json);
    char body[1024], hl[64];
    float v[3] = {3, 4, 5};
    memcpy(body, json, jl);
    memcpy(body + jl, v, sizeof v);
    struct {
        size_t len;
        const char *header_len; /* NULL: the JSON's length */
        const char *ct;
        int status;
        const char *needle;
    } cases[] = {
        {jl + 8, NULL, NULL, 200, NULL},
        {jl + 8, NULL, "application/octet-stream", 200, NULL},
        {jl + 8, NULL, "application/json", 200, NULL},
        {jl + 8, NULL, "text/plain", 415, "Content-Type"},
        {jl + 4, NULL, NULL, 400, "truncated"},
        {jl, NULL, NULL, 400, "truncated"},
        {jl + 12, NULL, NULL, 400, "add up"},
        {jl + 8, "abc", NULL, 400, "not a byte count"},
        {jl + 8, "-5", NULL, 400, "not a byte count"},
        {jl + 8, "", NULL, 400, "not a byte count"},
        {jl + 8, "99999999999999999999999999", NULL, 400, "not a byte count"},
        {jl + 8, "100000", NULL, 400, "only"},
        {jl + 8, "10", NULL, 400, NULL}, /* JSON cut short */
        {jl + 8, "0", NULL, 400, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(hl, sizeof hl, "%zu", jl);
        call_opts o = {.header_len = cases[i].header_len ? cases[i].header_len : hl,
                       .content_type = cases[i].ct};
        api_reply r;
        infer(body, cases[i].len, &o, &r);
        if (cases[i].status == 200)
            CHECKF(r.status == 200, "case %zu: %d %.300s", i, r.status, snippet(&r));
        else
            check_error(&r, cases[i].status, cases[i].needle);
        api_reply_free(&r);
    }

    /* binary_data_size that disagrees with shape x datatype. */
    const char *wrong =
        "{\"inputs\":[" IN_Q "," IN_K ",{\"name\":\"value\",\"datatype\":\"FP16\",\"shape\":[1,2],"
        "\"parameters\":{\"binary_data_size\":8}}]}";
    jl = strlen(wrong);
    memcpy(body, wrong, jl);
    memcpy(body + jl, v, 8);
    snprintf(hl, sizeof hl, "%zu", jl);
    api_reply r;
    infer(body, jl + 8, &(call_opts){.header_len = hl}, &r);
    check_error(&r, 400, "binary_data_size 8");
    api_reply_free(&r);

    /* Binary data with both a size and "data". */
    const char *both = "{\"inputs\":[" IN_Q "," IN_K
                       ",{\"name\":\"value\",\"datatype\":\"FP32\",\"shape\":[1,2],\"data\":[1,2],"
                       "\"parameters\":{\"binary_data_size\":8}}]}";
    jl = strlen(both);
    memcpy(body, both, jl);
    memcpy(body + jl, v, 8);
    snprintf(hl, sizeof hl, "%zu", jl);
    infer(body, jl + 8, &(call_opts){.header_len = hl}, &r);
    check_error(&r, 400, "both");
    api_reply_free(&r);

    /* Non-finite binary values, and a bool byte that is not 0 or 1. */
    const char *nan_json =
        "{\"inputs\":[" IN_Q "," IN_K ",{\"name\":\"value\",\"datatype\":\"FP32\",\"shape\":[1,2],"
        "\"parameters\":{\"binary_data_size\":8}},"
        "{\"name\":\"key_padding_mask\",\"datatype\":\"BOOL\",\"shape\":[1],"
        "\"parameters\":{\"binary_data_size\":1}}]}";
    jl = strlen(nan_json);
    memcpy(body, nan_json, jl);
    float bad[2] = {1, NAN};
    memcpy(body + jl, bad, 8);
    body[jl + 8] = 0;
    snprintf(hl, sizeof hl, "%zu", jl);
    infer(body, jl + 9, &(call_opts){.header_len = hl}, &r);
    check_error(&r, 400, "NaN");
    api_reply_free(&r);
    bad[1] = 2;
    memcpy(body + jl, bad, 8);
    body[jl + 8] = 2;
    infer(body, jl + 9, &(call_opts){.header_len = hl}, &r);
    check_error(&r, 400, "bytes 0 and 1");
    api_reply_free(&r);
}

/* Limits: body size, elements, memory budget (413 never, 429 now), deadline (504), cancel. */
static void test_infer_limits(void)
{
    const char *body = "{\"inputs\":[" QKV "]}";
    size_t len = strlen(body);
    api_reply r;

    api_limits limits = api_limits_default();
    limits.max_body_bytes = len - 1;
    infer(body, len, &(call_opts){.limits = &limits}, &r);
    check_error(&r, 413, "--max-body-bytes");
    api_reply_free(&r);

    limits = api_limits_default();
    limits.max_elements = 5;
    infer(body, len, &(call_opts){.limits = &limits}, &r);
    check_error(&r, 413, "--max-elements");
    api_reply_free(&r);

    /* A binary tensor whose shape is beyond the element limit: refused before any size math
     * on the body, even though the body is tiny. */
    const char *huge = "{\"inputs\":[" IN_Q "," IN_K
                       ",{\"name\":\"value\",\"datatype\":\"FP32\",\"shape\":[1000000,1000000],"
                       "\"parameters\":{\"binary_data_size\":4000000000000}}]}";
    char hl[32];
    snprintf(hl, sizeof hl, "%zu", strlen(huge));
    infer(huge, strlen(huge), &(call_opts){.header_len = hl}, &r);
    check_error(&r, 413, "--max-elements");
    api_reply_free(&r);

    api_budget *small = api_budget_new(2048);
    infer(body, len, &(call_opts){.budget = small}, &r);
    check_error(&r, 413, "--max-memory-bytes");
    api_reply_free(&r);
    api_budget_free(small);

    api_budget *busy = api_budget_new((size_t)64 << 20);
    CHECK(api_budget_reserve(busy, ((size_t)64 << 20) - 100) == API_BUDGET_OK);
    infer(body, len, &(call_opts){.budget = busy}, &r);
    check_error(&r, 429, "retry");
    CHECK_EQ_INT(r.retry_after_s, 1);
    api_reply_free(&r);
    api_budget_release(busy, ((size_t)64 << 20) - 100);
    api_budget_free(busy);

    eng_ctl ctl = {0};
    limits = api_limits_default();
    limits.max_timeout_ms = 1;
    infer(body, len,
          &(call_opts){.limits = &limits, .ctl = &ctl, .start_ns = eng_now_ns() - 1000000000}, &r);
    check_error(&r, 504, "deadline");
    api_reply_free(&r);

    eng_ctl cancelled = {0};
    atomic_store(&cancelled.cancel, true);
    infer(body, len, &(call_opts){.ctl = &cancelled}, &r);
    CHECK_EQ_INT(r.status, API_STATUS_CLIENT_CLOSED);
    api_reply_free(&r);
}

/* ---- Layer models -------------------------------------------------------------------------- */

/* The cross-attention layer registered by main: E = 16, 2 heads, kdim = vdim = 24, separate
 * projections with biases. */
#define CROSS_E    16
#define CROSS_KDIM 24

/* Every value within 1e-4 of the reference, relative to the tensor's largest magnitude. */
static void check_rel(const float *got, const double *want, size_t n, const char *what)
{
    double scale = 0, worst = 0;
    for (size_t i = 0; i < n; i++)
        scale = fmax(scale, fabs(want[i]));
    for (size_t i = 0; got && i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (!(d <= worst))
            worst = isnan(d) ? INFINITY : d;
    }
    CHECKF(got && worst <= 1e-4 * fmax(scale, 1e-6), "%s: off by %g (scale %g)", what, worst,
           scale);
}

/* The reference forward pass of layer `name` on x [B, L, E] (memory m [B, S, kdim] or NULL). */
static void layer_reference(const char *name, const eng_mha_args *args, ref_mha_result *res)
{
    const eng_layer *l = api_models_find(models, name);
    ref_mha_weights w = ref_mha_weights_of_layer(l);
    memset(res, 0, sizeof *res);
    if (!ref_mha(&w, args, res))
        abort();
}

/* Self-attention on the demo layer with JSON FP32 tensors, flat and nested, rank 3 and rank 2;
 * causal; the echoed id; JSON outputs. */
static void test_infer_layer_json(void)
{
    const int64_t B = 2, L = 5, E = 64;
    float *x = randoms((size_t)(B * L * E));
    for (int rank = 2; rank <= 3; rank++) {
        int64_t b = rank == 3 ? B : 1;
        input in = {"input", "FP32", rank, {0}, x, NULL, NULL, false, rank == 3};
        if (rank == 3)
            memcpy(in.shape, (int64_t[]){B, L, E}, sizeof(int64_t) * 3);
        else
            memcpy(in.shape, (int64_t[]){L, E}, sizeof(int64_t) * 2);
        size_t len, hlen;
        char *body = build(&in, 1, "layer-1", "{\"causal\":true}", NULL, &len, &hlen);
        api_reply r;
        infer(body, len, &(call_opts){.model = "demo"}, &r);
        free(body);
        CHECKF(r.status == 200, "rank %d: %d %.300s", rank, r.status, snippet(&r));
        json_t *root = reply_json(&r);
        if (root) {
            CHECK(strcmp(json_string_value(json_object_get(root, "model_name")), "demo") == 0);
            CHECK(strcmp(json_string_value(json_object_get(root, "id")), "layer-1") == 0);
            CHECK_EQ_INT(json_array_size(json_object_get(root, "outputs")), 1);
            json_decref(root);
        }
        eng_mha_args a = {.B = b, .L = L, .x = x, .S = L, .causal = true};
        ref_mha_result ref;
        layer_reference("demo", &a, &ref);
        int64_t shape[4];
        int orank = 0;
        bool binary = true;
        float *out = reply_output(&r, "output", shape, &orank, &binary);
        CHECK(!binary && orank == rank && shape[orank - 1] == E && shape[orank - 2] == L);
        check_rel(out, ref.out, (size_t)(b * L * E), "demo output");
        free(out);
        ref_mha_result_free(&ref);
        api_reply_free(&r);
    }
    free(x);
}

/* FP16 and BF16 binary inputs, FP32 binary outputs (binary_data_output), both outputs. */
static void test_infer_layer_binary_half(void)
{
    const int64_t B = 1, L = 7, E = 64;
    const char *dts[2] = {"FP16", "BF16"};
    float *x = randoms((size_t)(B * L * E));
    for (int t = 0; t < 2; t++) {
        input in = {"input", dts[t], 3, {B, L, E}, x, NULL, NULL, true, false};
        api_reply r;
        size_t len, hlen;
        char *body = build(&in, 1, NULL,
                           "{\"binary_data_output\":true,\"return_weights\":\"mean\","
                           "\"positional\":\"rope\",\"window_left\":2}",
                           NULL, &len, &hlen);
        char hl[32];
        snprintf(hl, sizeof hl, "%zu", hlen);
        infer(body, len, &(call_opts){.model = "demo", .header_len = hl}, &r);
        free(body);
        CHECKF(r.status == 200, "%s: %d %.300s", dts[t], r.status, snippet(&r));
        CHECK(r.inference_header_len > 0);
        CHECK(strcmp(r.content_type, "application/octet-stream") == 0);

        float *xr = rounded(x, (size_t)(B * L * E), dts[t]);
        eng_mha_args a = {.B = B,
                          .L = L,
                          .x = xr,
                          .S = L,
                          .window_left_set = true,
                          .window_left = 2,
                          .positional = ENG_POSITIONAL_ROPE,
                          .weights_mode = ENG_WEIGHTS_MEAN};
        ref_mha_result ref;
        layer_reference("demo", &a, &ref);
        int64_t shape[4];
        int rank = 0;
        bool binary = false;
        float *out = reply_output(&r, "output", shape, &rank, &binary);
        CHECK(binary && rank == 3 && shape[0] == B && shape[1] == L && shape[2] == E);
        check_rel(out, ref.out, (size_t)(B * L * E), dts[t]);
        free(out);
        float *w = reply_output(&r, "weights", shape, &rank, &binary);
        CHECK(binary && rank == 3 && shape[0] == B && shape[1] == L && shape[2] == L);
        check_rel(w, ref.weights_mean, (size_t)(B * L * L), "weights (mean)");
        free(w);
        free(xr);
        ref_mha_result_free(&ref);
        api_reply_free(&r);
    }
    free(x);
}

/* Cross-attention through "memory" on a layer whose kdim differs from E, with a boolean
 * key_padding_mask and per-head weights asked for through "outputs" alone. */
static void test_infer_layer_memory(void)
{
    const int64_t B = 2, L = 3, S = 6, E = CROSS_E, K = CROSS_KDIM, H = 2;
    float *x = randoms((size_t)(B * L * E)), *m = randoms((size_t)(B * S * K));
    uint8_t kpm[12] = {0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 1};
    input ins[3] = {
        {"input", "FP32", 3, {B, L, E}, x, NULL, NULL, false, false},
        {"memory", "FP32", 3, {B, S, K}, m, NULL, NULL, true, false},
        {"key_padding_mask", "BOOL", 2, {B, S}, NULL, kpm, NULL, false, true},
    };
    size_t len, hlen;
    char *body = build(ins, 3, NULL, NULL,
                       "[{\"name\":\"output\"},{\"name\":\"weights\",\"parameters\":"
                       "{\"binary_data\":true}}]",
                       &len, &hlen);
    char hl[32];
    snprintf(hl, sizeof hl, "%zu", hlen);
    api_reply r;
    infer(body, len, &(call_opts){.model = "cross", .header_len = hl}, &r);
    free(body);
    CHECKF(r.status == 200, "%d %.300s", r.status, snippet(&r));

    eng_mha_args a = {.B = B,
                      .L = L,
                      .x = x,
                      .S = S,
                      .key_in = m,
                      .value_in = m,
                      .key_padding = kpm,
                      .key_padding_stride = S,
                      .weights_mode = ENG_WEIGHTS_PER_HEAD};
    ref_mha_result ref;
    layer_reference("cross", &a, &ref);
    int64_t shape[4];
    int rank = 0;
    bool binary = true;
    float *out = reply_output(&r, "output", shape, &rank, &binary);
    CHECK(!binary && rank == 3 && shape[0] == B && shape[1] == L && shape[2] == E);
    check_rel(out, ref.out, (size_t)(B * L * E), "cross output");
    free(out);
    float *w = reply_output(&r, "weights", shape, &rank, &binary);
    CHECK(binary && rank == 4 && shape[0] == B && shape[1] == H && shape[2] == L && shape[3] == S);
    check_rel(w, ref.weights, (size_t)(B * H * L * S), "cross weights");
    for (int64_t b = 0; w && b < B; b++) /* padding gets no weight */
        for (int64_t i = 0; i < H * L; i++)
            for (int64_t j = 0; j < S; j++)
                if (kpm[b * S + j])
                    CHECK(w[(b * H * L + i) * S + j] == 0.0f);
    free(w);
    ref_mha_result_free(&ref);
    api_reply_free(&r);

    /* Its metadata shows the memory's width. */
    api_call call = {.models = models, .model = "cross"};
    api_v2_model_metadata(&call, &r);
    json_t *root = reply_json(&r);
    json_t *mem = root ? find_named(json_object_get(root, "inputs"), "memory") : NULL;
    CHECK(mem && json_integer_value(json_array_get(json_object_get(mem, "shape"), 2)) == K);
    json_decref(root);
    api_reply_free(&r);
    free(x);
    free(m);
}

#define LX(shape, data)                                                                            \
    "{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":" shape ",\"data\":" data "}"
#define LX1 LX("[1,64]", "[" Z64 "]")
#define Z8  "0,0,0,0,0,0,0,0"
#define Z64 Z8 "," Z8 "," Z8 "," Z8 "," Z8 "," Z8 "," Z8 "," Z8

/* Every way a layer request can be wrong, with its status and message. */
static void test_infer_layer_errors(void)
{
    static const json_case cases[] = {
        {"{\"inputs\":[" LX1 "]}", 200, NULL},
        {"{\"inputs\":[]}", 400, "\"input\" is required"},
        {"{\"inputs\":[{\"name\":\"memory\",\"datatype\":\"FP32\",\"shape\":[1,64],\"data\":[" Z64
         "]}]}",
         400, "\"input\" is required"},
        {"{\"inputs\":[{\"name\":\"input\",\"datatype\":\"INT64\",\"shape\":[1,64],\"data\":[" Z64
         "]}]}",
         400, "does not take datatype INT64"},
        {"{\"inputs\":[{\"name\":\"input\",\"datatype\":\"BOOL\",\"shape\":[1,2],\"data\":[true,"
         "false]}]}",
         400, "does not take datatype BOOL"},
        {"{\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP16\",\"shape\":[1,64],\"data\":[" Z64
         "]}]}",
         400, "JSON cannot carry"},
        {"{\"inputs\":[" LX("[1,2]", "[1,2]") "]}", 400, "embed_dim (64)"},
        {"{\"inputs\":[" LX("[64]", "[" Z64 "]") "]}", 400, "[L, E] or [B, L, E]"},
        {"{\"inputs\":[" LX1 ",{\"name\":\"memory\",\"datatype\":\"FP32\",\"shape\":[1,2],"
         "\"data\":[1,2]}]}",
         400, "kdim (64)"},
        {"{\"inputs\":[" LX1 ",{\"name\":\"query\",\"datatype\":\"FP32\",\"shape\":[1,2],"
         "\"data\":[1,2]}]}",
         400, "model demo takes input, memory"},
        {"{\"inputs\":[" LX1 "," LX1 "]}", 400, "twice"},
        {"{\"inputs\":[" LX1 ",{\"name\":\"key_padding_mask\",\"datatype\":\"FP32\",\"shape\":[1],"
         "\"data\":[1]}]}",
         400, "does not take datatype FP32"},
        {"{\"inputs\":[" LX1 ",{\"name\":\"key_padding_mask\",\"datatype\":\"BOOL\",\"shape\":[2],"
         "\"data\":[true,false]}]}",
         400, "key_padding_mask"},
        {"{\"inputs\":[" LX1 ",{\"name\":\"attn_mask\",\"datatype\":\"BOOL\",\"shape\":[1,1],"
         "\"data\":[[true]]}]}",
         200, NULL},
        {"{\"inputs\":[" LX1 ",{\"name\":\"attn_mask\",\"datatype\":\"FP32\",\"shape\":[1,1],"
         "\"data\":[null]}]}",
         200, NULL},
        {"{\"inputs\":[" LX1 ",{\"name\":\"attn_mask\",\"datatype\":\"BOOL\",\"shape\":[1,2],"
         "\"data\":[true,true]}]}",
         400, "attn_mask"},
        {"{\"parameters\":{\"scale\":1},\"inputs\":[" LX1 "]}", 400, "unknown parameter \"scale\""},
        {"{\"parameters\":{\"casual\":true},\"inputs\":[" LX1 "]}", 400, "did you mean \"causal\""},
        {"{\"parameters\":{\"positional\":\"learned\"},\"inputs\":[" LX1 "]}", 400, "positional"},
        {"{\"parameters\":{\"rope_base\":500},\"inputs\":[" LX1 "]}", 400,
         "only with positional \"rope\""},
        {"{\"parameters\":{\"positional\":\"rope\",\"rope_base\":0},\"inputs\":[" LX1 "]}", 400,
         "> 0"},
        {"{\"parameters\":{\"positional\":\"rope\",\"rope_style\":\"x\"},\"inputs\":[" LX1 "]}",
         400, "interleaved"},
        {"{\"parameters\":{\"positional\":\"alibi\",\"rope_style\":\"half\"},\"inputs\":[" LX1 "]}",
         400, "rope_style"},
        {"{\"parameters\":{\"add_zero_attn\":1},\"inputs\":[" LX1 "]}", 400, "add_zero_attn"},
        {"{\"parameters\":{\"causal\":\"bottom_right\",\"query_offset\":1},\"inputs\":[" LX1 "]}",
         400, "query_offset"},
        {"{\"parameters\":{\"window_left\":-2},\"inputs\":[" LX1 "]}", 400, "window_left"},
        {"{\"parameters\":{\"timeout_ms\":0},\"inputs\":[" LX1 "]}", 400, "timeout_ms"},
        {"{\"parameters\":{\"return_weights\":false},\"inputs\":[" LX1
         "],\"outputs\":[{\"name\":\"weights\"}]}",
         400, "return_weights"},
        {"{\"inputs\":[" LX1 "],\"outputs\":[{\"name\":\"lse\"}]}", 400,
         "model demo has output and weights"},
        {"{\"model_name\":\"sdpa\",\"inputs\":[" LX1 "]}", 400, "model_name"},
        {"{\"parameters\":{\"positional\":\"sinusoidal\",\"add_zero_attn\":true,\"causal\":true,"
         "\"timeout\":5000000,\"priority\":1},\"inputs\":[" LX1 "]}",
         200, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const json_case *c = &cases[i];
        api_reply r;
        infer(c->body, strlen(c->body), &(call_opts){.model = "demo"}, &r);
        if (c->status == 200)
            CHECKF(r.status == 200, "case %zu: %d %.300s", i, r.status, snippet(&r));
        else
            check_error(&r, c->status, c->needle);
        if (r.status != c->status)
            printf("  (case %zu: %s)\n", i, c->body);
        api_reply_free(&r);
    }

    /* The layer's limits are the route's: elements, deadline. */
    const char *body = "{\"inputs\":[" LX1 "]}";
    api_limits limits = api_limits_default();
    limits.max_elements = 64;
    api_reply r;
    infer(body, strlen(body), &(call_opts){.model = "demo", .limits = &limits}, &r);
    check_error(&r, 413, "--max-elements");
    api_reply_free(&r);
    eng_ctl ctl = {0};
    limits = api_limits_default();
    limits.max_timeout_ms = 1;
    infer(
        body, strlen(body),
        &(call_opts){
            .model = "demo", .limits = &limits, .ctl = &ctl, .start_ns = eng_now_ns() - 1000000000},
        &r);
    check_error(&r, 504, "deadline");
    api_reply_free(&r);
}

/* A layer with kdim = vdim = 24 != E = 16, from separate projections with biases. */
static bool register_cross_layer(void)
{
    const int64_t E = CROSS_E, K = CROSS_KDIM;
    float *wq = randoms((size_t)(E * E)), *wk = randoms((size_t)(E * K)),
          *wv = randoms((size_t)(E * K)), *wo = randoms((size_t)(E * E)), *bq = randoms((size_t)E),
          *bk = randoms((size_t)E), *bv = randoms((size_t)E), *bo = randoms((size_t)E);
    eng_tensor_ref refs[8] = {
        {"q_proj_weight", ENG_DTYPE_F32, wq, 2, {E, E}},
        {"k_proj_weight", ENG_DTYPE_F32, wk, 2, {E, K}},
        {"v_proj_weight", ENG_DTYPE_F32, wv, 2, {E, K}},
        {"out_proj.weight", ENG_DTYPE_F32, wo, 2, {E, E}},
        {"q_proj.bias", ENG_DTYPE_F32, bq, 1, {E}},
        {"k_proj.bias", ENG_DTYPE_F32, bk, 1, {E}},
        {"v_proj.bias", ENG_DTYPE_F32, bv, 1, {E}},
        {"out_proj.bias", ENG_DTYPE_F32, bo, 1, {E}},
    };
    eng_error e;
    char msg[256];
    memset(&e, 0, sizeof e);
    eng_layer *l = eng_layer_from_tensors("cross", refs, 8, 2, 0, &e);
    if (!l)
        fprintf(stderr, "cross layer: %s (%s)\n", e.message, e.field);
    bool ok = l && api_models_add(models, l, msg, sizeof msg);
    void *all[] = {wq, wk, wv, wo, bq, bk, bv, bo};
    for (size_t i = 0; i < 8; i++)
        free(all[i]);
    return ok;
}

int main(void)
{
    eng_error err;
    pool = eng_pool_new(2, &err);
    budget = api_budget_new((size_t)1 << 30);
    models = api_models_new();
    if (!pool || !budget || !models || !register_cross_layer()) {
        fprintf(stderr, "set-up failed\n");
        return 1;
    }
    RUN(test_server_metadata);
    RUN(test_infer_nonfinite_json);
    RUN(test_model_config);
    RUN(test_model_metadata);
    RUN(test_model_unknown);
    RUN(test_model_ready);
    RUN(test_infer_json);
    RUN(test_infer_binary_roundtrip);
    RUN(test_infer_half_inputs);
    RUN(test_infer_half_json_refused);
    RUN(test_infer_selected_outputs);
    RUN(test_infer_id_echo);
    RUN(test_infer_parameters);
    RUN(test_infer_float_mask_rank2);
    RUN(test_infer_alignment);
    RUN(test_infer_json_errors);
    RUN(test_infer_binary_errors);
    RUN(test_infer_limits);
    RUN(test_infer_layer_json);
    RUN(test_infer_layer_binary_half);
    RUN(test_infer_layer_memory);
    RUN(test_infer_layer_errors);
    api_models_free(models);
    api_budget_free(budget);
    eng_pool_free(pool);
    return check_report();
}
