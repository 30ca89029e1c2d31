/*
 * test_native_mha.c - POST /v1/mha (api/proto/native_mha.c) without a server: the registry of
 * models, request decoding and validation with every error path, the budget given back on every
 * path, and numerics against the float64 reference of tests/support/ref_mha.c.
 *
 * Each numeric case builds a layer's tensors in torch's layout from a fixed seed, sends them
 * inline under one of the accepted naming schemes (the nn.MultiheadAttention state dict packed
 * or with separate q/k/v weights, Hugging Face q_proj/k_proj/v_proj/o_proj, the tutorial's
 * W_Q/W_K/W_V/W_O), and hands the same arrays to the reference directly, so that a wrong name
 * mapping, a transposed weight or a dropped option shows as a numeric difference.
 * Tolerances as tests/engine/test_mha.c explains: output within 1e-4 of the reference output's
 * scale, weights within 2e-5 absolute. The layer-level numbers are the engine's (tested there);
 * what this suite is after is the wire: names, shapes, ranks, options and their defaults.
 * Sizes shrink when ATTND_TEST_QUICK=1.
 */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/models/models.h"
#include "api/ops/options.h"
#include "api/proto/native.h"
#include "api/wire/base64.h"
#include "tests/support/check.h"
#include "tests/support/daemon.h"
#include "tests/support/ref_mha.h"
#include "tests/support/util.h"

#define OUT_RTOL    1e-4
#define WEIGHT_ATOL 2e-5

static eng_pool *pool;
static api_models *models;
static bool quick;

/* ---- A growing string ------------------------------------------------------------------- */

typedef struct {
    char *s;
    size_t len, cap;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void sb_printf(sbuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        abort();
    if (b->len + (size_t)n + 1 > b->cap) {
        b->cap = (b->len + (size_t)n + 1) * 2;
        b->s = realloc(b->s, b->cap);
        if (!b->s)
            abort();
    }
    va_start(ap, fmt);
    vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

/* Appends "name": base64 tensor (name NULL: the tensor alone). */
static void sb_tensor(sbuf *b, const char *name, const float *data, const int64_t *shape, int rank)
{
    char *t = json_tensor_b64(data, shape, rank);
    if (!t)
        abort();
    if (name)
        sb_printf(b, "\"%s\":%s", name, t);
    else
        sb_printf(b, "%s", t);
    free(t);
}

/* ---- Calling the route ------------------------------------------------------------------- */

typedef struct {
    size_t max_elements;  /* 0: default */
    size_t budget;        /* 0: no budget */
    size_t budget_in_use; /* reserved by "others" before the call */
    bool cancelled;
    const char *content_type;
} call_opts;

/* Calls api_mha; returns the status and the parsed reply (NULL if not JSON). Checks that the
 * lease still holds the reply text after the call and that ending it gives the budget back
 * exactly. */
static int call_mha(const char *body, const call_opts *o, json_t **reply)
{
    call_opts none = {0};
    api_limits limits = api_limits_default();
    api_lease lease;
    api_budget *budget = NULL;
    api_reply r;
    if (!o)
        o = &none;
    if (o->max_elements)
        limits.max_elements = o->max_elements;
    if (o->budget) {
        budget = api_budget_new(o->budget);
        if (o->budget_in_use)
            api_budget_reserve(budget, o->budget_in_use);
    }
    api_lease_start(&lease, budget, eng_now_ns(), 0);
    if (o->cancelled)
        atomic_store(&lease.ctl.cancel, true);
    api_call call = {.body = body,
                     .body_len = strlen(body),
                     .content_type = o->content_type ? o->content_type : "application/json",
                     .pool = pool,
                     .lease = &lease,
                     .limits = &limits,
                     .models = models};
    api_mha(&call, &r);
    if (budget) {
        CHECKF(r.status != 200 || lease.held >= r.body_len,
               "the lease holds %zu bytes for a reply of %zu", lease.held, r.body_len);
        api_lease_end(&lease);
        CHECKF(api_budget_in_use(budget) == o->budget_in_use, "budget: %zu held after the call",
               api_budget_in_use(budget) - o->budget_in_use);
        api_budget_free(budget);
    }
    json_error_t jerr;
    *reply = r.body ? json_loadb(r.body, r.body_len, 0, &jerr) : NULL;
    CHECKF(*reply != NULL, "reply is not JSON: %.200s", r.body ? r.body : "(none)");
    int status = r.status;
    api_reply_free(&r);
    return status;
}

/* Expects an error reply with this status, field (NULL: null) and a message containing `msg`. */
static void expect_error(const char *body, const call_opts *o, int status, const char *field,
                         const char *msg)
{
    json_t *reply;
    int got = call_mha(body, o, &reply);
    const json_t *e = json_object_get(reply, "error");
    const char *m = json_string_value(json_object_get(e, "message"));
    const json_t *f = json_object_get(e, "field");
    CHECKF(got == status, "status %d, want %d: %s (body %.120s)", got, status, m ? m : "?", body);
    CHECKF(m && strstr(m, msg), "message \"%s\" lacks \"%s\"", m ? m : "(none)", msg);
    if (field)
        CHECKF(json_is_string(f) && strcmp(json_string_value(f), field) == 0,
               "field %s, want %s (%s)", json_string_value(f) ? json_string_value(f) : "null",
               field, m ? m : "");
    else
        CHECKF(json_is_null(f), "field %s, want null", json_string_value(f));
    json_decref(reply);
}

/* Decodes tensor `name` of the reply (base64 float32) into a malloc'd array; its shape into
 * shape[]/rank. */
static float *reply_tensor(const json_t *reply, const char *name, int64_t *shape, int *rank)
{
    const json_t *t = json_object_get(reply, name);
    const json_t *sh = json_object_get(t, "shape");
    const char *b64 = json_string_value(json_object_get(t, "base64"));
    size_t n = 1, len, got, bad;
    if (!b64 || !json_is_array(sh)) {
        CHECKF(0, "reply has no base64 tensor %s", name);
        return NULL;
    }
    *rank = (int)json_array_size(sh);
    for (int d = 0; d < *rank; d++) {
        shape[d] = json_integer_value(json_array_get(sh, (size_t)d));
        n *= (size_t)shape[d];
    }
    len = strlen(b64);
    float *x = xcalloc(n + 1, sizeof *x);
    bool ok = api__base64_decode(b64, len, x, &got, &bad) == API_B64_OK && got == n * 4;
    CHECKF(ok, "%s: base64 of %zu bytes for %zu floats", name, got, n);
    if (!ok) {
        free(x);
        return NULL;
    }
    return x;
}

/* ---- The registry ------------------------------------------------------------------------ */

static void test_registry(void)
{
    char err[256];
    api_models *m = api_models_new();
    CHECK(m != NULL);
    if (!m)
        return;
    CHECK_EQ_INT(api_models_count(m), 1);
    const api_model *demo = api_models_find(m, "demo");
    CHECK(demo != NULL && demo == api_models_at(m, 0));
    CHECK(demo && demo->layers == 1 && strcmp(demo->layer[0]->name, "demo") == 0 && !demo->about);
    CHECK(api_models_find(m, "Demo") == NULL);
    CHECK(api_models_at(m, 1) == NULL);
    /* A second demo under the same name is refused (and freed: ASan would see a leak). */
    CHECK(!api_models_add(m, eng_layer_demo(), err, sizeof err));
    CHECKF(strstr(err, "taken") != NULL, "%s", err);
    eng_layer *l = eng_layer_demo();
    snprintf(l->name, sizeof l->name, "bad name");
    CHECK(!api_models_add(m, l, err, sizeof err));
    CHECKF(strstr(err, "not valid") != NULL, "%s", err);
    l = eng_layer_demo();
    snprintf(l->name, sizeof l->name, "%s",
             "a123456789b123456789c123456789d123456789e123456789f12345678");
    CHECK(api_models_add(m, l, err, sizeof err)); /* 59 characters: fine */
    l = eng_layer_demo();
    memset(l->name, 'x', 63);
    l->name[63] = '\0';
    CHECK(api_models_add(m, l, err, sizeof err)); /* 63: the longest */
    CHECK(!api_models_add(m, NULL, err, sizeof err));
    CHECK_EQ_INT(api_models_count(m), 3);
    CHECK(!api__model_name_ok(""));
    CHECK(!api__model_name_ok("a/b"));
    CHECK(api__model_name_ok("enc-1.v2_x"));

    api_reply r;
    api_models_list(m, &r);
    CHECK_EQ_INT(r.status, 200);
    json_error_t jerr;
    json_t *j = json_loadb(r.body, r.body_len, 0, &jerr);
    const json_t *list = json_object_get(j, "models");
    CHECK_EQ_INT(json_array_size(list), 3);
    const json_t *d = json_array_get(list, 0);
    CHECK(strcmp(json_string_value(json_object_get(d, "name")), "demo") == 0);
    CHECK_EQ_INT(json_integer_value(json_object_get(d, "embed_dim")), 64);
    CHECK_EQ_INT(json_integer_value(json_object_get(d, "num_heads")), 4);
    CHECK_EQ_INT(json_integer_value(json_object_get(d, "num_kv_heads")), 4);
    CHECK_EQ_INT(json_integer_value(json_object_get(d, "head_dim")), 16);
    CHECK_EQ_INT(json_integer_value(json_object_get(d, "kdim")), 64);
    CHECK_EQ_INT(json_integer_value(json_object_get(d, "vdim")), 64);
    CHECK(json_is_true(json_object_get(d, "bias")));
    CHECK(json_is_false(json_object_get(d, "bias_kv")));
    CHECK(strcmp(json_string_value(json_object_get(d, "dtype")), "F32") == 0);
    CHECK_EQ_INT(json_integer_value(json_object_get(d, "parameters")), 4 * 64 * 64 + 4 * 64);
    CHECK_EQ_INT(json_integer_value(json_object_get(d, "layers")), 1);
    CHECK_EQ_INT(json_integer_value(json_object_get(d, "bytes")),
                 eng_layer_bytes(api_models_find(m, "demo")->layer[0]));
    json_decref(j);
    api_reply_free(&r);

    api_models_get(m, "demo", &r);
    CHECK_EQ_INT(r.status, 200);
    CHECK(r.body && strstr(r.body, "\"name\":\"demo\"") != NULL);
    api_reply_free(&r);
    api_models_get(m, "nope", &r);
    CHECK_EQ_INT(r.status, 404);
    CHECK(r.body && strstr(r.body, "not_found") != NULL && strstr(r.body, "nope") != NULL);
    api_reply_free(&r);
    api_models_free(m);
    api_models_free(NULL);
}

/* ---- Validation and errors --------------------------------------------------------------- */

#define I2                                                                                         \
    "{\"W_Q.weight\":[[1,0],[0,1]],\"W_K.weight\":[[1,0],[0,1]],\"W_V.weight\":[[1,0],[0,1]],"     \
    "\"W_O.weight\":[[1,0],[0,1]]}"
#define X2 "[[1,0],[0,1]]"

static void test_request_errors(void)
{
    /* Body, type, JSON. */
    expect_error("{\"weights\":" I2 ",\"num_heads\":1,\"input\":" X2 "}",
                 &(call_opts){.content_type = "text/csv"}, 415, NULL, "text/csv");
    expect_error("{\"input\": [1,", NULL, 400, NULL, "");
    expect_error("[1]", NULL, 422, NULL, "object");
    /* Which layer. */
    expect_error("{\"input\":" X2 "}", NULL, 422, "model", "required");
    expect_error("{\"model\":\"nope\",\"input\":" X2 "}", NULL, 404, "model", "nope");
    expect_error("{\"model\":7,\"input\":" X2 "}", NULL, 422, "model", "name of a model");
    expect_error("{\"model\":\"demo\",\"weights\":" I2 ",\"input\":" X2 "}", NULL, 422, "weights",
                 "not both");
    expect_error("{\"weights\":" I2 ",\"input\":" X2 "}", NULL, 422, "num_heads", "required");
    expect_error("{\"weights\":[1],\"num_heads\":1,\"input\":" X2 "}", NULL, 422, "weights",
                 "object of tensors");
    expect_error("{\"weights\":{},\"num_heads\":1,\"input\":" X2 "}", NULL, 422, "weights",
                 "object of tensors");
    expect_error("{\"weights\":{\"W_Q.weight\":[[true]]},\"num_heads\":1,\"input\":" X2 "}", NULL,
                 422, "weights.W_Q.weight", "numbers");
    expect_error("{\"weights\":{\"W_Q.weight\":null},\"num_heads\":1,\"input\":" X2 "}", NULL, 422,
                 "weights.W_Q.weight", "tensor");
    expect_error("{\"weights\":{\"W_Q.weight\":[[1,0],[0,1]],\"W_K.weight\":[[1,0],[0,1]],"
                 "\"W_O.weight\":[[1,0],[0,1]]},\"num_heads\":1,\"input\":" X2 "}",
                 NULL, 422, "weights.W_V.weight", "W_V.weight");
    expect_error("{\"weights\":{\"W_Q.weight\":[[1,0],[0,1]],\"W_K.weight\":[[1,0],[0,1]],"
                 "\"W_V.weight\":[[1,0],[0,1]],\"W_O.weight\":[[1,0,0],[0,1,0]]},"
                 "\"num_heads\":1,\"input\":" X2 "}",
                 NULL, 422, "weights.W_O.weight", "W_O.weight");
    expect_error("{\"weights\":" I2 ",\"num_heads\":3,\"input\":" X2 "}", NULL, 422, "num_heads",
                 "");
    {
        sbuf b = {0};
        sb_printf(&b, "{\"weights\":{");
        for (int i = 0; i < 17; i++)
            sb_printf(&b, "%s\"t%d\":[1]", i ? "," : "", i);
        sb_printf(&b, "},\"num_heads\":1,\"input\":" X2 "}");
        expect_error(b.s, NULL, 422, "weights", "at most 16");
        free(b.s);
    }
    expect_error("{\"model\":\"demo\",\"num_heads\":2,\"input\":[[0]]}", NULL, 422, "num_heads",
                 "has 4 heads");
    expect_error("{\"model\":\"demo\",\"num_kv_heads\":2,\"input\":[[0]]}", NULL, 422,
                 "num_kv_heads", "has 4");
    /* Fields. */
    expect_error("{\"model\":\"demo\"}", NULL, 422, "input", "required");
    expect_error("{\"model\":\"demo\",\"input\":" X2 ",\"casual\":true}", NULL, 422, "casual",
                 "did you mean \"causal\"");
    expect_error("{\"model\":\"demo\",\"input\":" X2 ",\"zzzzzzzz\":true}", NULL, 422, "zzzzzzzz",
                 "/v1/mha takes");
    expect_error("{\"weights\":" I2 ",\"num_heads\":1,\"input\":" X2 ",\"causal\":\"yes\"}", NULL,
                 422, "causal", "bottom_right");
    expect_error("{\"weights\":" I2 ",\"num_heads\":1,\"input\":" X2
                 ",\"causal\":\"top_left\",\"query_offset\":1}",
                 NULL, 422, "query_offset", "conflicts");
    expect_error("{\"weights\":" I2 ",\"num_heads\":1,\"input\":" X2 ",\"query_offset\":1.5}", NULL,
                 422, "query_offset", "integer");
    expect_error("{\"weights\":" I2 ",\"num_heads\":1,\"input\":" X2 ",\"window\":[1]}", NULL, 422,
                 "window", "[left, right]");
    expect_error("{\"weights\":" I2 ",\"num_heads\":1,\"input\":" X2 ",\"window\":[-1,0]}", NULL,
                 422, "window[0]", "");
    expect_error("{\"weights\":" I2 ",\"num_heads\":1,\"input\":" X2 ",\"positional\":\"learned\"}",
                 NULL, 422, "positional", "sinusoidal");
    expect_error("{\"weights\":" I2 ",\"num_heads\":1,\"input\":" X2 ",\"rope_base\":100}", NULL,
                 422, "rope_base", "only with positional");
    expect_error("{\"weights\":" I2 ",\"num_heads\":1,\"input\":" X2
                 ",\"positional\":\"rope\",\"rope_base\":0}",
                 NULL, 422, "rope_base", "> 0");
    expect_error("{\"weights\":" I2 ",\"num_heads\":1,\"input\":" X2
                 ",\"positional\":\"rope\",\"rope_style\":\"neox\"}",
                 NULL, 422, "rope_style", "interleaved");
    expect_error("{\"weights\":" I2 ",\"num_heads\":1,\"input\":" X2 ",\"rope_style\":\"half\"}",
                 NULL, 422, "rope_style", "only with positional");
    expect_error("{\"weights\":" I2 ",\"num_heads\":1,\"input\":" X2 ",\"add_zero_attn\":1}", NULL,
                 422, "add_zero_attn", "true or false");
    expect_error("{\"weights\":" I2 ",\"num_heads\":1,\"input\":" X2 ",\"return_weights\":true}",
                 NULL, 422, "return_weights", "per_head");
    expect_error("{\"weights\":" I2 ",\"num_heads\":1,\"input\":" X2
                 ",\"output_encoding\":\"csv\"}",
                 NULL, 422, "output_encoding", "base64");
    expect_error("{\"weights\":" I2 ",\"num_heads\":1,\"input\":" X2 ",\"timeout_ms\":0}", NULL,
                 422, "timeout_ms", "");
    /* Shapes. */
    expect_error("{\"weights\":" I2 ",\"num_heads\":1,\"input\":[1,0]}", NULL, 422, "input",
                 "[L, E] or [B, L, E]");
    expect_error("{\"weights\":" I2 ",\"num_heads\":1,\"input\":[[[[1,0]]]]}", NULL, 422, "input",
                 "[L, E] or [B, L, E]");
    expect_error("{\"weights\":" I2 ",\"num_heads\":1,\"input\":[[1,0,0]]}", NULL, 422, "input",
                 "embed_dim (2)");
    expect_error("{\"weights\":" I2 ",\"num_heads\":1,\"input\":[[true,false]]}", NULL, 422,
                 "input", "numbers");
    expect_error("{\"weights\":" I2 ",\"num_heads\":1,\"input\":" X2 ",\"memory\":[[[1,0]]]}", NULL,
                 422, "memory", "rank 2");
    expect_error("{\"weights\":" I2 ",\"num_heads\":1,\"input\":[" X2
                 "],\"memory\":[[[1,0]],[[0,1]]]}",
                 NULL, 422, "memory", "batch size");
    expect_error("{\"weights\":" I2 ",\"num_heads\":1,\"input\":" X2 ",\"memory\":[[1,0,0]]}", NULL,
                 422, "memory", "kdim (2)");
    expect_error("{\"weights\":" I2 ",\"num_heads\":1,\"input\":" X2 ",\"key\":[[1,0]]}", NULL, 422,
                 "value", "come together");
    expect_error("{\"weights\":" I2 ",\"num_heads\":1,\"input\":" X2
                 ",\"memory\":[[1,0]],\"key\":[[1,0]],\"value\":[[1,0]]}",
                 NULL, 422, "key", "not both");
    expect_error("{\"weights\":" I2 ",\"num_heads\":1,\"input\":" X2
                 ",\"key\":[[1,0]],\"value\":[[1,0],[0,1]]}",
                 NULL, 422, "value", "tokens");
    expect_error("{\"weights\":" I2 ",\"num_heads\":1,\"input\":" X2
                 ",\"attn_mask\":[[true,true,true]]}",
                 NULL, 422, "attn_mask", "broadcast");
    expect_error("{\"weights\":" I2 ",\"num_heads\":1,\"input\":" X2 ",\"key_padding_mask\":[1,0]}",
                 NULL, 422, "key_padding_mask", "booleans");
    expect_error("{\"weights\":" I2 ",\"num_heads\":1,\"input\":" X2
                 ",\"key_padding_mask\":[true,false,true]}",
                 NULL, 422, "key_padding_mask", "[S]");
    expect_error("{\"weights\":" I2 ",\"num_heads\":1,\"input\":[[1,1e39]]}", NULL, 422,
                 "input[0][1]", "");
    /* An odd head size cannot rotate: the engine's message, under the request's field name. */
    expect_error(
        "{\"weights\":{\"W_Q.weight\":[[1,0,0],[0,1,0],[0,0,1]],\"W_K.weight\":[[1,0,0],"
        "[0,1,0],[0,0,1]],\"W_V.weight\":[[1,0,0],[0,1,0],[0,0,1]],\"W_O.weight\":[[1,0,0],"
        "[0,1,0],[0,0,1]]},\"num_heads\":1,\"input\":[[1,0,0]],\"positional\":\"rope\"}",
        NULL, 422, "positional", "even");
}

/* Layers with kdim or vdim other than embed_dim need key/value tokens of those widths. */
static void test_kdim_vdim_errors(void)
{
    static const char sep[] =
        "{\"weights\":{\"q_proj_weight\":[[1,0],[0,1]],\"k_proj_weight\":[[1,0,0],[0,1,0]],"
        "\"v_proj_weight\":[[1],[0]],\"out_proj.weight\":[[1,0],[0,1]]},\"num_heads\":1,"
        "\"input\":[[1,0]]";
    char body[512];
    snprintf(body, sizeof body, "%s}", sep);
    expect_error(body, NULL, 422, "memory", "give memory");
    snprintf(body, sizeof body, "%s,\"memory\":[[1,0,0]]}", sep);
    expect_error(body, NULL, 422, "memory", "separately");
    snprintf(body, sizeof body, "%s,\"key\":[[1,0,0]],\"value\":[[1,0]]}", sep);
    expect_error(body, NULL, 422, "value", "vdim (1)");
    json_t *reply;
    snprintf(body, sizeof body, "%s,\"key\":[[1,0,0],[0,1,0]],\"value\":[[2],[4]]}", sep);
    CHECK_EQ_INT(call_mha(body, NULL, &reply), 200);
    /* q = [1, 0]; keys [1,0], [0,1]: softmax([1, 0] / sqrt 2); v = [2, 0] and [4, 0]. */
    double w0 = 1.0 / (1.0 + exp(-1.0 / sqrt(2.0)));
    const json_t *out = json_array_get(json_object_get(reply, "output"), 0);
    CHECK_NEAR(json_number_value(json_array_get(out, 0)), 2 * w0 + 4 * (1 - w0), 1e-6);
    CHECK_NEAR(json_number_value(json_array_get(out, 1)), 0, 1e-7);
    json_decref(reply);
}

static void test_limits_budget_deadline(void)
{
    static const char body[] = "{\"weights\":" I2 ",\"num_heads\":1,\"input\":" X2 "}";
    json_t *reply;
    /* 16 weight elements + 4 input: inline weights count. */
    expect_error(body, &(call_opts){.max_elements = 19}, 413, NULL, "--max-elements");
    /* + 4 output elements: 24 fit exactly, 23 do not. */
    expect_error(body, &(call_opts){.max_elements = 23}, 413, NULL, "--max-elements");
    CHECK_EQ_INT(call_mha(body, &(call_opts){.max_elements = 24}, &reply), 200);
    json_decref(reply);
    expect_error(body, &(call_opts){.budget = 1024}, 413, NULL, "--max-memory-bytes");
    expect_error(
        body, &(call_opts){.budget = (size_t)64 << 20, .budget_in_use = ((size_t)64 << 20) - 2048},
        429, NULL, "retry");
    CHECK_EQ_INT(call_mha(body, &(call_opts){.budget = (size_t)64 << 20}, &reply), 200);
    json_decref(reply);
    expect_error(body, &(call_opts){.cancelled = true}, API_STATUS_CLIENT_CLOSED, NULL,
                 "cancelled");
    /* A deadline already past when the request arrived. */
    api_limits limits = api_limits_default();
    limits.max_timeout_ms = 1000;
    api_lease late;
    api_lease_start(&late, NULL, eng_now_ns() - INT64_C(5000000000), 0);
    api_call call = {.body = body,
                     .body_len = strlen(body),
                     .pool = pool,
                     .lease = &late,
                     .limits = &limits,
                     .models = models};
    api_reply r;
    api_mha(&call, &r);
    CHECK_EQ_INT(r.status, 504);
    CHECK(r.body && strstr(r.body, "1000 ms") != NULL);
    api_reply_free(&r);
    /* The body cap. */
    limits = api_limits_default();
    limits.max_body_bytes = 10;
    call = (api_call){.body = body, .body_len = strlen(body), .pool = pool, .limits = &limits};
    api_mha(&call, &r);
    CHECK_EQ_INT(r.status, 413);
    CHECK(r.body && strstr(r.body, "--max-body-bytes") != NULL);
    api_reply_free(&r);
}

/* ---- Numerics against the reference ------------------------------------------------------ */

typedef enum { NAMES_PACKED, NAMES_TORCH_SEPARATE, NAMES_HF, NAMES_TUTORIAL } naming;
typedef enum { SELF, CROSS_MEMORY, CROSS_KEY_VALUE } source;

typedef struct {
    const char *what;
    naming names;
    int64_t E, H, Hkv, kdim, vdim; /* Hkv, kdim, vdim 0: defaults */
    bool bias, bias_kv;
    int rank; /* of input: 2 (B must be 1) or 3 */
    int64_t B, L, S;
    source src;
    api__causal causal;
    bool offset_set;
    int64_t query_offset;
    eng_positional positional;
    float rope_base;
    eng_rope_style rope_style;
    bool add_zero_attn, kpm, bool_mask;
    eng_weights_mode weights;
    bool model_demo; /* use the registered demo layer instead of inline weights */
} mha_case;

static void fill(float *p, int64_t n, double amp, uint64_t *rng)
{
    for (int64_t i = 0; i < n; i++)
        p[i] = rng_sym(rng, amp);
}

static void run_case(const mha_case *c)
{
    uint64_t rng = 0x5eed0000u + (uint64_t)c->E * 131u + (uint64_t)c->L;
    int64_t E = c->E, H = c->H, Hkv = c->Hkv ? c->Hkv : H, D = E / H, W = Hkv * D;
    int64_t kdim = c->kdim ? c->kdim : E, vdim = c->vdim ? c->vdim : E;
    int64_t B = c->B, L = c->L, S = c->src == SELF ? L : c->S;
    bool cross = c->src != SELF;
    float *wq = xcalloc((size_t)(E * E), 4), *wk = xcalloc((size_t)(W * kdim), 4);
    float *wv = xcalloc((size_t)(W * vdim), 4), *wo = xcalloc((size_t)(E * E), 4);
    float *bq = xcalloc((size_t)E, 4), *bk = xcalloc((size_t)W, 4), *bv = xcalloc((size_t)W, 4);
    float *bo = xcalloc((size_t)E, 4), *bkk = xcalloc((size_t)W, 4), *bvv = xcalloc((size_t)W, 4);
    float *x = xcalloc((size_t)(B * L * E), 4);
    float *km = xcalloc((size_t)(B * S * kdim) + 1, 4),
          *vm = xcalloc((size_t)(B * S * vdim) + 1, 4);
    uint8_t *kpm = xcalloc((size_t)(B * S), 1), *mask = xcalloc((size_t)(L * S), 1);
    ref_mha_weights rw;

    if (c->model_demo) {
        const eng_layer *demo = api_models_find(models, "demo")->layer[0];
        rw = ref_mha_weights_of_layer(demo);
    } else {
        fill(wq, E * E, 1.0 / sqrt((double)E), &rng);
        fill(wk, W * kdim, 1.0 / sqrt((double)kdim), &rng);
        fill(wv, W * vdim, 1.0 / sqrt((double)vdim), &rng);
        fill(wo, E * E, 1.0 / sqrt((double)E), &rng);
        if (c->bias) {
            fill(bq, E, 0.5, &rng);
            fill(bk, W, 0.5, &rng);
            fill(bv, W, 0.5, &rng);
            fill(bo, E, 0.5, &rng);
        }
        if (c->bias_kv) {
            fill(bkk, W, 1.0, &rng);
            fill(bvv, W, 1.0, &rng);
        }
        rw = (ref_mha_weights){E,
                               H,
                               Hkv,
                               kdim,
                               vdim,
                               wq,
                               wk,
                               wv,
                               wo,
                               c->bias ? bq : NULL,
                               c->bias ? bk : NULL,
                               c->bias ? bv : NULL,
                               c->bias ? bo : NULL,
                               c->bias_kv ? bkk : NULL,
                               c->bias_kv ? bvv : NULL};
    }
    fill(x, B * L * E, 1.0, &rng);
    if (cross) {
        fill(km, B * S * kdim, 1.0, &rng);
        if (c->src == CROSS_KEY_VALUE)
            fill(vm, B * S * vdim, 1.0, &rng);
        else
            memcpy(vm, km, (size_t)(B * S * kdim) * 4);
    }
    /* Padding: the last key of batch 0 and the first of the others; the mask hides a band. */
    for (int64_t b = 0; b < B; b++)
        kpm[b * S + (b == 0 ? S - 1 : 0)] = 1;
    for (int64_t i = 0; i < L; i++)
        for (int64_t j = 0; j < S; j++)
            mask[i * S + j] = (uint8_t)((i + 2 * j) % 5 != 1 || j == i % S);

    /* The request. */
    sbuf b = {0};
    int64_t xs[3] = {B, L, E}, ks[3] = {B, S, kdim}, vs[3] = {B, S, vdim};
    int off = c->rank == 2 ? 1 : 0;
    sb_printf(&b, "{");
    if (c->model_demo) {
        sb_printf(&b, "\"model\":\"demo\"");
    } else {
        int64_t s_ee[2] = {E, E}, s_wk[2] = {W, kdim}, s_wv[2] = {W, vdim}, s_e[1] = {E};
        int64_t s_w[1] = {W}, s_kv3[3] = {1, 1, W};
        sb_printf(&b, "\"num_heads\":%lld,", (long long)H);
        if (c->Hkv)
            sb_printf(&b, "\"num_kv_heads\":%lld,", (long long)Hkv);
        sb_printf(&b, "\"weights\":{");
        if (c->names == NAMES_PACKED) {
            float *in = xcalloc((size_t)(3 * E * E), 4), *inb = xcalloc((size_t)(3 * E), 4);
            int64_t s_in[2] = {3 * E, E}, s_inb[1] = {3 * E};
            memcpy(in, wq, (size_t)(E * E) * 4);
            memcpy(in + E * E, wk, (size_t)(E * E) * 4);
            memcpy(in + 2 * E * E, wv, (size_t)(E * E) * 4);
            memcpy(inb, bq, (size_t)E * 4);
            memcpy(inb + E, bk, (size_t)E * 4);
            memcpy(inb + 2 * E, bv, (size_t)E * 4);
            sb_tensor(&b, "in_proj_weight", in, s_in, 2);
            sb_printf(&b, ",");
            sb_tensor(&b, "out_proj.weight", wo, s_ee, 2);
            if (c->bias) {
                sb_printf(&b, ",");
                sb_tensor(&b, "in_proj_bias", inb, s_inb, 1);
                sb_printf(&b, ",");
                sb_tensor(&b, "out_proj.bias", bo, s_e, 1);
            }
            free(in);
            free(inb);
        } else if (c->names == NAMES_TORCH_SEPARATE) {
            float *inb = xcalloc((size_t)(3 * E), 4);
            int64_t s_inb[1] = {3 * E};
            memcpy(inb, bq, (size_t)E * 4);
            memcpy(inb + E, bk, (size_t)E * 4);
            memcpy(inb + 2 * E, bv, (size_t)E * 4);
            sb_tensor(&b, "q_proj_weight", wq, s_ee, 2);
            sb_printf(&b, ",");
            sb_tensor(&b, "k_proj_weight", wk, s_wk, 2);
            sb_printf(&b, ",");
            sb_tensor(&b, "v_proj_weight", wv, s_wv, 2);
            sb_printf(&b, ",");
            sb_tensor(&b, "out_proj.weight", wo, s_ee, 2);
            if (c->bias) {
                sb_printf(&b, ",");
                sb_tensor(&b, "in_proj_bias", inb, s_inb, 1);
                sb_printf(&b, ",");
                sb_tensor(&b, "out_proj.bias", bo, s_e, 1);
            }
            free(inb);
        } else {
            bool hf = c->names == NAMES_HF;
            sb_tensor(&b, hf ? "q_proj.weight" : "W_Q.weight", wq, s_ee, 2);
            sb_printf(&b, ",");
            sb_tensor(&b, hf ? "k_proj.weight" : "W_K.weight", wk, s_wk, 2);
            sb_printf(&b, ",");
            sb_tensor(&b, hf ? "v_proj.weight" : "W_V.weight", wv, s_wv, 2);
            sb_printf(&b, ",");
            sb_tensor(&b, hf ? "o_proj.weight" : "W_O.weight", wo, s_ee, 2);
            if (c->bias) {
                sb_printf(&b, ",");
                sb_tensor(&b, hf ? "q_proj.bias" : "W_Q.bias", bq, s_e, 1);
                sb_printf(&b, ",");
                sb_tensor(&b, hf ? "k_proj.bias" : "W_K.bias", bk, s_w, 1);
                sb_printf(&b, ",");
                sb_tensor(&b, hf ? "v_proj.bias" : "W_V.bias", bv, s_w, 1);
                sb_printf(&b, ",");
                sb_tensor(&b, hf ? "o_proj.bias" : "W_O.bias", bo, s_e, 1);
            }
        }
        if (c->bias_kv) {
            sb_printf(&b, ",");
            sb_tensor(&b, "bias_k", bkk, s_kv3, 3); /* torch's [1, 1, E] */
            sb_printf(&b, ",");
            sb_tensor(&b, "bias_v", bvv, s_kv3, 3);
        }
        sb_printf(&b, "}");
    }
    sb_printf(&b, ",");
    sb_tensor(&b, "input", x, xs + off, c->rank);
    if (c->src == CROSS_MEMORY) {
        sb_printf(&b, ",");
        sb_tensor(&b, "memory", km, ks + off, c->rank);
    } else if (c->src == CROSS_KEY_VALUE) {
        sb_printf(&b, ",");
        sb_tensor(&b, "key", km, ks + off, c->rank);
        sb_printf(&b, ",");
        sb_tensor(&b, "value", vm, vs + off, c->rank);
    }
    static const char *const causal_text[] = {"false", "true", "\"top_left\"", "\"bottom_right\""};
    sb_printf(&b, ",\"causal\":%s", causal_text[c->causal]);
    if (c->offset_set)
        sb_printf(&b, ",\"query_offset\":%lld", (long long)c->query_offset);
    static const char *const pos_text[] = {"\"none\"", "\"sinusoidal\"", "\"rope\"", "\"alibi\""};
    sb_printf(&b, ",\"positional\":%s", pos_text[c->positional]);
    if (c->positional == ENG_POSITIONAL_ROPE) {
        if (c->rope_base > 0)
            sb_printf(&b, ",\"rope_base\":%.9g", (double)c->rope_base);
        sb_printf(&b, ",\"rope_style\":\"%s\"",
                  c->rope_style == ENG_ROPE_HALF ? "half" : "interleaved");
    }
    if (c->add_zero_attn)
        sb_printf(&b, ",\"add_zero_attn\":true");
    if (c->kpm) {
        sb_printf(&b, ",\"key_padding_mask\":[");
        for (int64_t bb = 0; bb < B; bb++) {
            sb_printf(&b, "%s%s", bb ? "," : "", c->rank == 3 ? "[" : "");
            for (int64_t j = 0; j < S; j++)
                sb_printf(&b, "%s%s", j ? "," : "", kpm[bb * S + j] ? "true" : "false");
            sb_printf(&b, "%s", c->rank == 3 ? "]" : "");
        }
        sb_printf(&b, "]");
    }
    if (c->bool_mask) {
        sb_printf(&b, ",\"attn_mask\":[");
        for (int64_t i = 0; i < L; i++) {
            sb_printf(&b, "%s[", i ? "," : "");
            for (int64_t j = 0; j < S; j++)
                sb_printf(&b, "%s%s", j ? "," : "", mask[i * S + j] ? "true" : "false");
            sb_printf(&b, "]");
        }
        sb_printf(&b, "]");
    }
    if (c->weights != ENG_WEIGHTS_NONE)
        sb_printf(&b, ",\"return_weights\":\"%s\"",
                  c->weights == ENG_WEIGHTS_MEAN ? "mean" : "per_head");
    sb_printf(&b, "}");

    /* The reference. */
    eng_mha_args a;
    memset(&a, 0, sizeof a);
    a.B = B;
    a.L = L;
    a.x = x;
    a.S = S;
    a.key_in = cross ? km : NULL;
    a.value_in = cross ? vm : NULL;
    a.causal = c->causal != API_CAUSAL_OFF;
    a.align = c->offset_set                          ? ENG_ALIGN_OFFSET
              : c->causal == API_CAUSAL_BOTTOM_RIGHT ? ENG_ALIGN_BOTTOM_RIGHT
                                                     : ENG_ALIGN_TOP_LEFT;
    a.query_offset = c->query_offset;
    if (c->kpm) {
        a.key_padding = kpm;
        a.key_padding_stride = S;
    }
    if (c->bool_mask)
        a.attn_mask = (eng_mask){ENG_MASK_BOOL, mask, {1, 1, L, S}, {0, 0, S, 1}};
    a.add_zero_attn = c->add_zero_attn;
    a.positional = c->positional;
    a.rope_base = c->rope_base;
    a.rope_style = c->rope_style;
    a.weights_mode = c->weights;
    ref_mha_result ref;
    memset(&ref, 0, sizeof ref);
    CHECK(ref_mha(&rw, &a, &ref));

    json_t *reply;
    int status = call_mha(b.s, NULL, &reply);
    CHECKF(status == 200, "%s: status %d: %.300s", c->what, status,
           json_string_value(json_object_get(json_object_get(reply, "error"), "message")));
    if (status == 200 && ref.out) {
        int64_t shape[4];
        int rank = 0;
        float *out = reply_tensor(reply, "output", shape, &rank);
        CHECKF(rank == c->rank, "%s: output rank %d", c->what, rank);
        CHECKF(shape[rank - 1] == E && shape[rank - 2] == L && (rank == 2 || shape[0] == B),
               "%s: output shape", c->what);
        double scale = 0, worst = 0;
        for (int64_t i = 0; i < B * L * E; i++)
            scale = fmax(scale, fabs(ref.out[i]));
        for (int64_t i = 0; out && i < B * L * E; i++) {
            double d = fabs((double)out[i] - ref.out[i]);
            if (!(d <= worst))
                worst = isnan(d) ? INFINITY : d;
        }
        CHECKF(out && worst <= OUT_RTOL * scale, "%s: output off by %g (scale %g)", c->what, worst,
               scale);
        free(out);
        const json_t *meta = json_object_get(reply, "meta");
        CHECK_EQ_INT(json_integer_value(json_object_get(meta, "key_len")), S);
        CHECK_EQ_INT(json_integer_value(json_object_get(meta, "keys_appended")), ref.S_ext - S);
        if (c->weights != ENG_WEIGHTS_NONE) {
            float *w = reply_tensor(reply, "weights", shape, &rank);
            bool per_head = c->weights == ENG_WEIGHTS_PER_HEAD;
            int want_rank = (per_head ? 4 : 3) - (c->rank == 2 ? 1 : 0);
            CHECKF(rank == want_rank && shape[rank - 1] == ref.S_ext && shape[rank - 2] == L,
                   "%s: weights shape (rank %d, last %lld)", c->what, rank,
                   (long long)shape[rank - 1]);
            const double *rwts = per_head ? ref.weights : ref.weights_mean;
            int64_t n = B * (per_head ? H : 1) * L * ref.S_ext;
            double wworst = 0;
            for (int64_t i = 0; w && rwts && i < n; i++) {
                double d = fabs((double)w[i] - rwts[i]);
                if (!(d <= wworst))
                    wworst = isnan(d) ? INFINITY : d;
                if (rwts[i] == 0.0 && w[i] != 0.0f)
                    wworst = INFINITY;
            }
            CHECKF(w && wworst <= WEIGHT_ATOL, "%s: weights off by %g", c->what, wworst);
            free(w);
        }
    }
    json_decref(reply);
    ref_mha_result_free(&ref);
    free(b.s);
    void *all[] = {wq, wk, wv, wo, bq, bk, bv, bo, bkk, bvv, x, km, vm, kpm, mask};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
}

static void test_packed_self_attention(void)
{
    mha_case c = {.what = "packed, biases, causal, per-head weights",
                  .names = NAMES_PACKED,
                  .E = 32,
                  .H = 4,
                  .bias = true,
                  .rank = 2,
                  .B = 1,
                  .L = 9,
                  .causal = API_CAUSAL_ON,
                  .weights = ENG_WEIGHTS_PER_HEAD};
    run_case(&c);
    c = (mha_case){.what = "packed, bias_kv, add_zero_attn, batch 3, padding, mean weights",
                   .names = NAMES_PACKED,
                   .E = 32,
                   .H = 2,
                   .bias = true,
                   .bias_kv = true,
                   .rank = 3,
                   .B = 3,
                   .L = 7,
                   .add_zero_attn = true,
                   .kpm = true,
                   .weights = ENG_WEIGHTS_MEAN};
    run_case(&c);
}

static void test_separate_projections_cross(void)
{
    mha_case c = {.what = "torch kdim/vdim: separate key and value tokens, bool mask",
                  .names = NAMES_TORCH_SEPARATE,
                  .E = 32,
                  .H = 4,
                  .kdim = 24,
                  .vdim = 40,
                  .bias = true,
                  .rank = 3,
                  .B = 2,
                  .L = 5,
                  .S = 11,
                  .src = CROSS_KEY_VALUE,
                  .bool_mask = true,
                  .weights = ENG_WEIGHTS_PER_HEAD};
    run_case(&c);
    c = (mha_case){.what = "cross-attention from memory, bottom-right causal, rank 2",
                   .names = NAMES_PACKED,
                   .E = 16,
                   .H = 2,
                   .bias = true,
                   .rank = 2,
                   .B = 1,
                   .L = 4,
                   .S = 10,
                   .src = CROSS_MEMORY,
                   .causal = API_CAUSAL_BOTTOM_RIGHT,
                   .weights = ENG_WEIGHTS_MEAN};
    run_case(&c);
}

static void test_grouped_query(void)
{
    mha_case c = {.what = "Hugging Face names, 8 query heads over 2 kv heads, memory",
                  .names = NAMES_HF,
                  .E = 64,
                  .H = 8,
                  .Hkv = 2,
                  .bias = true,
                  .rank = 3,
                  .B = 2,
                  .L = 6,
                  .S = 9,
                  .src = CROSS_MEMORY,
                  .kpm = true,
                  .weights = ENG_WEIGHTS_PER_HEAD};
    run_case(&c);
    c = (mha_case){.what = "Hugging Face names, GQA self-attention, causal",
                   .names = NAMES_HF,
                   .E = 48,
                   .H = 6,
                   .Hkv = 3,
                   .rank = 2,
                   .B = 1,
                   .L = 12,
                   .causal = API_CAUSAL_TOP_LEFT};
    run_case(&c);
}

static void test_positional(void)
{
    mha_case c = {.what = "sinusoidal, causal with query_offset 3",
                  .names = NAMES_PACKED,
                  .E = 32,
                  .H = 4,
                  .bias = true,
                  .rank = 2,
                  .B = 1,
                  .L = 8,
                  .causal = API_CAUSAL_ON,
                  .offset_set = true,
                  .query_offset = 3,
                  .positional = ENG_POSITIONAL_SINUSOIDAL,
                  .weights = ENG_WEIGHTS_MEAN};
    run_case(&c);
    c = (mha_case){.what = "rope half, default base",
                   .names = NAMES_HF,
                   .E = 32,
                   .H = 4,
                   .rank = 3,
                   .B = 2,
                   .L = 10,
                   .causal = API_CAUSAL_ON,
                   .positional = ENG_POSITIONAL_ROPE,
                   .rope_style = ENG_ROPE_HALF};
    run_case(&c);
    c = (mha_case){.what = "rope interleaved, base 500, cross",
                   .names = NAMES_PACKED,
                   .E = 32,
                   .H = 2,
                   .rank = 2,
                   .B = 1,
                   .L = 5,
                   .S = 7,
                   .src = CROSS_MEMORY,
                   .positional = ENG_POSITIONAL_ROPE,
                   .rope_style = ENG_ROPE_INTERLEAVED,
                   .rope_base = 500.0f,
                   .weights = ENG_WEIGHTS_PER_HEAD};
    run_case(&c);
    c = (mha_case){.what = "alibi, causal",
                   .names = NAMES_PACKED,
                   .E = 48,
                   .H = 6,
                   .bias = true,
                   .rank = 3,
                   .B = 1,
                   .L = 9,
                   .causal = API_CAUSAL_ON,
                   .positional = ENG_POSITIONAL_ALIBI,
                   .weights = ENG_WEIGHTS_PER_HEAD};
    run_case(&c);
}

static void test_demo_model(void)
{
    mha_case c = {.what = "the registered demo layer",
                  .E = 64,
                  .H = 4,
                  .rank = 3,
                  .B = 2,
                  .L = 5,
                  .causal = API_CAUSAL_ON,
                  .kpm = true,
                  .weights = ENG_WEIGHTS_MEAN,
                  .model_demo = true};
    run_case(&c);
}

/* The classic tutorial MultiHeadAttention: W_Q, W_K, W_V, W_O without bias, d_model 512,
 * 8 heads, weights inline (4 x 512 x 512 floats in base64). */
static void test_tutorial_layer(void)
{
    mha_case c = {.what = "tutorial W_Q/W_K/W_V/W_O, d_model 512, 8 heads",
                  .names = NAMES_TUTORIAL,
                  .E = 512,
                  .H = 8,
                  .rank = 3,
                  .B = quick ? 1 : 2,
                  .L = quick ? 8 : 24,
                  .weights = ENG_WEIGHTS_PER_HEAD};
    run_case(&c);
    c.what = "tutorial layer, causal, cross-attention";
    c.src = CROSS_MEMORY;
    c.S = quick ? 5 : 17;
    c.causal = API_CAUSAL_BOTTOM_RIGHT;
    c.weights = ENG_WEIGHTS_NONE;
    run_case(&c);
}

/* The reply's form follows the input's unless output_encoding says otherwise. */
static void test_reply_forms(void)
{
    json_t *reply;
    CHECK_EQ_INT(call_mha("{\"weights\":" I2 ",\"num_heads\":1,\"input\":{\"shape\":[2,2],"
                          "\"data\":[1,0,0,1]}}",
                          NULL, &reply),
                 200);
    const json_t *out = json_object_get(reply, "output");
    CHECK(json_is_array(json_object_get(out, "data")) &&
          json_is_array(json_object_get(out, "shape")));
    json_decref(reply);
    CHECK_EQ_INT(call_mha("{\"weights\":" I2 ",\"num_heads\":1,\"input\":" X2
                          ",\"output_encoding\":\"base64\",\"return_weights\":\"per_head\"}",
                          NULL, &reply),
                 200);
    int64_t shape[4];
    int rank = 0;
    float *w = reply_tensor(reply, "weights", shape, &rank);
    CHECK_EQ_INT(rank, 3); /* [H, L, S] for a rank-2 input */
    CHECK(w && fabs(w[0] - 0.66976154) < 1e-6 && fabs(w[1] - 0.33023846) < 1e-6);
    free(w);
    const json_t *meta = json_object_get(reply, "meta");
    CHECK(json_is_null(json_object_get(meta, "model")));
    CHECK_EQ_INT(json_integer_value(json_object_get(meta, "num_heads")), 1);
    json_decref(reply);
}

int main(void)
{
    eng_error err;
    quick = getenv("ATTND_TEST_QUICK") != NULL;
    pool = eng_pool_new(2, &err);
    models = api_models_new();
    if (!pool || !models) {
        printf("cannot start: no pool or registry\n0 passed, 1 failed\n");
        return 1;
    }
    RUN(test_registry);
    RUN(test_request_errors);
    RUN(test_kdim_vdim_errors);
    RUN(test_limits_budget_deadline);
    RUN(test_packed_self_attention);
    RUN(test_separate_projections_cross);
    RUN(test_grouped_query);
    RUN(test_positional);
    RUN(test_demo_model);
    RUN(test_tutorial_layer);
    RUN(test_reply_forms);
    api_models_free(models);
    eng_pool_free(pool);
    return check_report();
}
