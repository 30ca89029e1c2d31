/* test_v2.c - the KServe v2 routes of api/ (proto/v2_*.c) without a socket, where a case needs
 * code: inference on random tensors in every shape the Open Inference Protocol and Triton's
 * binary tensor extension define - JSON tensors flat and nested, binary FP32 / FP16 / BF16 / BOOL /
 * INT32 inputs, binary and JSON outputs, selected outputs, alignment - each checked against the
 * float64 reference, and the server metadata, which names the engine's kernel set. Layer models
 * ("demo", and a cross-attention layer registered here) run against the float64 reference of
 * nn.MultiheadAttention (tests/support/ref_mha.h).
 *
 * Every request-in / reply-out case (model metadata, configuration and readiness, unknown
 * models, every error with its status and {"error": "..."} body, the binary framing, limits,
 * budgets, deadlines, the echoed id, non-finite JSON) is a data case in tests/api/cases/v2, run
 * by tests/api/test_cases.c. */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/proto/v2.h"
#include "tests/support/check.h"
#include "tests/support/named_layer.h"
#include "tests/support/ref.h"
#include "tests/support/ref_mha.h"
#include "tests/support/rng.h"

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

/* How infer() calls: the model ("sdpa" when NULL) and Inference-Header-Content-Length. The
 * limits, budgets, deadlines, ids and content types are data cases (tests/api/cases/v2). */
typedef struct {
    const char *header_len; /* NULL: none */
    const char *model;
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

/* The one place this file builds an api_call: the shared pool, budget (through a lease
 * ended after the call: every byte comes back) and registry. */
static void infer(const char *body, size_t len, const call_opts *o, api_reply *reply)
{
    api_lease lease;
    api_lease_start(&lease, budget, eng_now_ns(), 0);
    api_call call = {.body = body,
                     .body_len = len,
                     .pool = pool,
                     .lease = &lease,
                     .models = models,
                     .inference_header_length = o ? o->header_len : NULL,
                     .model = o && o->model ? o->model : "sdpa"};
    size_t before = api_budget_in_use(budget);
    api_v2_infer(&call, reply);
    CHECKF(reply->status != 200 || lease.held >= reply->body_len,
           "the lease holds %zu bytes for a reply of %zu", lease.held, reply->body_len);
    api_lease_end(&lease);
    CHECKF(api_budget_in_use(budget) == before, "%zu bytes left reserved",
           api_budget_in_use(budget) - before);
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
    return rng_sym(&rng, 1.0);
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

/* The lookup the server's routes use before answering (the replies of unknown models and
 * versions are data cases, tests/api/cases/v2/model_unknown_*). */
static void test_model_known(void)
{
    const struct {
        const char *model, *version;
    } unknown[] = {{"nosuch", NULL}, {"sdpa", "2"}, {"demo", "0"}, {"", NULL}};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++)
        CHECKF(!api_v2_model_known(models, unknown[i].model, unknown[i].version), "%s/%s",
               unknown[i].model, unknown[i].version ? unknown[i].version : "-");
    CHECK(api_v2_model_known(models, "sdpa", NULL));
    CHECK(api_v2_model_known(models, "demo", "1"));
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
            /* No "outputs": every output the metadata lists, output then lse. */
            json_t *outs = json_object_get(root, "outputs");
            CHECK_EQ_INT(json_array_size(outs), 2);
            const char *first = json_string_value(json_object_get(json_array_get(outs, 0), "name"));
            const char *second =
                json_string_value(json_object_get(json_array_get(outs, 1), "name"));
            CHECK(first && strcmp(first, "output") == 0);
            CHECK(second && strcmp(second, "lse") == 0);
            json_decref(root);
        }
        int64_t shape[4];
        int rank = 0;
        bool binary = true;
        float *out = reply_output(&r, "output", shape, &rank, &binary);
        CHECK(out != NULL && !binary);
        CHECK(rank == 4 && shape[0] == 2 && shape[1] == 2 && shape[2] == 3 && shape[3] == 3);
        binary = true;
        float *lse = reply_output(&r, "lse", shape, &rank, &binary);
        CHECK(lse != NULL && !binary);
        CHECK(rank == 3 && shape[0] == 2 && shape[1] == 2 && shape[2] == 3);
        ref_result ref;
        float *bufs[3];
        reference(&p, "FP32", (eng_sdpa_args){0}, &ref, bufs);
        if (out)
            check_close(out, ref.out, 2 * 2 * 3 * 3, 2e-6, "output");
        if (lse)
            check_close(lse, ref.lse, 2 * 2 * 3, 2e-5, "lse");
        ref_result_free(&ref);
        for (int i = 0; i < 3; i++)
            free(bufs[i]);
        free(out);
        free(lse);
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

/* "outputs" selects what is returned, each in the form asked (binary_data overrides
 * binary_data_output), in the order of the model's outputs. Without it, every output the
 * model's metadata lists (output and lse), as the KServe v2 protocol says: return_weights adds
 * the weights, which never come unasked, return_lse false drops lse, binary_data_output makes
 * them all binary. */
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
        {NULL, NULL, true, false, true, false, false, false},
        {"{\"binary_data_output\":true}", NULL, true, false, true, true, false, true},
        {"{\"return_lse\":false}", NULL, true, false, false, false, false, false},
        {"{\"return_weights\":\"per_head\",\"binary_data_output\":true}", NULL, true, true, true,
         true, true, true},
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
    const eng_layer *l = api_models_find(models, name)->layer[0];
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

/* A layer with kdim = vdim = 24 != E = 16, from separate projections with biases. */
static bool register_cross_layer(void)
{
    const int64_t E = CROSS_E, K = CROSS_KDIM;
    float *wq = randoms((size_t)(E * E)), *wk = randoms((size_t)(E * K)),
          *wv = randoms((size_t)(E * K)), *wo = randoms((size_t)(E * E)), *bq = randoms((size_t)E),
          *bk = randoms((size_t)E), *bv = randoms((size_t)E), *bo = randoms((size_t)E);
    eng_weight refs[8] = {
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
    eng_layer *l = named_layer("cross", refs, 8, 2, 0, &e);
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
    RUN(test_model_known);
    RUN(test_infer_json);
    RUN(test_infer_binary_roundtrip);
    RUN(test_infer_half_inputs);
    RUN(test_infer_selected_outputs);
    RUN(test_infer_parameters);
    RUN(test_infer_float_mask_rank2);
    RUN(test_infer_alignment);
    RUN(test_infer_layer_json);
    RUN(test_infer_layer_binary_half);
    RUN(test_infer_layer_memory);
    api_models_free(models);
    api_budget_free(budget);
    eng_pool_free(pool);
    return check_report();
}
