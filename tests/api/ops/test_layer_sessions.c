/* test_layer_sessions.c - decoder-layer steps over a KV-cache session through api/ (no daemon):
 * POST /v1/sessions {"model"} makes the cache of a registered layer, and POST /v1/mha
 * {"session"} steps it: a prefill then single-token steps (and a chunk), each equal to what one
 * POST /v1/mha over the whole history gives (causal) for its tokens, with RoPE and with the
 * sinusoidal encoding, whose positions must continue across steps; the same through a KServe
 * v2 sequence on the demo layer (start, steps, end, and then the sequence is unknown); a fork
 * stays the layer's cache. Then the refusals: 409 expect_length, 404 for an id this process
 * never made, 422 for a session of another shape or model and for what a cache step cannot
 * take (each naming its field), 422 for head settings at creation that contradict the layer,
 * 413 past max_tokens. The order of concurrent steps over HTTP is tests/server/test_sessions.c's;
 * the engine's numerics, bf16 included, tests/engine/test_mha_session.c's. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "tests/support/check.h"
#include "tests/support/daemon.h"
#include "tests/support/route.h"
#include "tests/support/util.h"

#define E         64 /* the demo layer: 4 heads of 16 */
#define STEP_RTOL 1e-5

static eng_pool *pool;
static api_models *models;

/* ---- Calls ------------------------------------------------------------------------------- */

typedef test_reply result;

static void result_free(result *r)
{
    json_decref(r->json);
    r->json = NULL;
}

static result call_route(void (*fn)(const api_call *, api_reply *), api_sessions *reg,
                         const char *path_id, const char *model, const char *body)
{
    api_call call = test_json_call(pool, models, reg, body);
    call.session = path_id;
    call.model = model;
    return test_route(fn, &call);
}

static result mha(api_sessions *reg, const char *body)
{
    return call_route(api_mha, reg, NULL, NULL, body);
}

static const char *error_code(const result *r)
{
    return json_string_value(json_object_get(json_object_get(r->json, "error"), "code"));
}

static int64_t length_of(const result *r)
{
    return json_integer_value(json_object_get(r->json, "length"));
}

static api_sessions *registry(void)
{
    return test_sessions_new((size_t)32 << 20);
}

/* POST /v1/sessions with `body`: its status, and its id into id[40] on 201. */
static int create(api_sessions *reg, const char *body, char id[40], result *desc)
{
    result r = call_route(api_sessions_create, reg, NULL, NULL, body);
    const char *s = json_string_value(json_object_get(r.json, "id"));
    id[0] = '\0';
    if (r.status == 201 && s && strlen(s) < 40)
        snprintf(id, 40, "%s", s);
    int status = r.status;
    if (desc)
        *desc = r;
    else
        result_free(&r);
    return status;
}

/* The tokens x[0..n) of the test's sequence: [n, E] in base64 (malloc'd). */
static char *tokens(const float *x, int64_t n)
{
    int64_t shape[2] = {n, E};
    return json_tensor_b64(x, shape, 2);
}

/* A /v1/mha body on `n` tokens of x, with `fields` after them (malloc'd). */
static char *mha_body(const float *x, int64_t n, const char *fields)
{
    char *t = tokens(x, n);
    size_t len = strlen(t) + strlen(fields) + 128;
    char *b = malloc(len);
    snprintf(b, len, "{\"input\":%s,\"output_encoding\":\"flat\",%s}", t, fields);
    free(t);
    return b;
}

/* The flat output data of a reply: its values into out[max]; how many. */
static size_t output_values(const result *r, float *out, size_t max)
{
    const json_t *d = json_object_get(json_object_get(r->json, "output"), "data");
    size_t n = json_array_size(d);
    for (size_t i = 0; i < n && i < max; i++)
        out[i] = (float)json_number_value(json_array_get(d, i));
    return n;
}

/* The reference: one POST /v1/mha of the demo layer over x[0..n), causal, with `positional`;
 * its output rows [n, E] into ref. */
static bool whole_history(const float *x, int64_t n, const char *positional, float *ref)
{
    char fields[160];
    snprintf(fields, sizeof fields, "\"model\":\"demo\",\"causal\":true,\"positional\":\"%s\"",
             positional);
    char *body = mha_body(x, n, fields);
    result r = mha(NULL, body);
    free(body);
    bool ok = r.status == 200 && output_values(&r, ref, (size_t)(n * E)) == (size_t)(n * E);
    CHECKF(ok, "the whole-history /v1/mha over %lld tokens: %d", (long long)n, r.status);
    result_free(&r);
    return ok;
}

/* |got - want| over `count` values, relative to max |want|. */
static double rel_diff(const float *got, const float *want, size_t count)
{
    double worst = 0, scale = 1e-3;
    for (size_t i = 0; i < count; i++) {
        scale = fmax(scale, fabs((double)want[i]));
        worst = fmax(worst, fabs((double)got[i] - (double)want[i]));
    }
    return worst / scale;
}

static void fill(float *x, size_t n, uint64_t *rng)
{
    for (size_t i = 0; i < n; i++)
        x[i] = rng_sym(rng, 1.0);
}

/* One step of tokens [n0, n0 + L) of x through the session, checked against the whole history
 * with `positional`: status 200, "length" n0 + L, and the step's rows within STEP_RTOL. The
 * step's body names `positional` when `given`; `extra` adds fields (or ""). */
static bool step_checked_as(api_sessions *reg, const char *id, const float *x, int64_t n0,
                            int64_t L, const char *positional, bool given, const char *extra)
{
    char fields[256], pos[64] = "";
    if (given)
        snprintf(pos, sizeof pos, ",\"positional\":\"%s\"", positional);
    snprintf(fields, sizeof fields, "\"session\":\"%s\",\"expect_length\":%lld%s%s", id,
             (long long)n0, pos, extra);
    char *body = mha_body(x + n0 * E, L, fields);
    result r = mha(reg, body);
    free(body);
    float *got = xcalloc((size_t)(L * E), sizeof(float));
    float *ref = xcalloc((size_t)((n0 + L) * E), sizeof(float));
    bool ok = r.status == 200 && length_of(&r) == n0 + L &&
              output_values(&r, got, (size_t)(L * E)) == (size_t)(L * E);
    CHECKF(ok, "step of %lld at %lld: status %d, length %lld", (long long)L, (long long)n0,
           r.status, (long long)length_of(&r));
    if (ok && whole_history(x, n0 + L, positional, ref)) {
        double d = rel_diff(got, ref + n0 * E, (size_t)(L * E));
        CHECKF(d <= STEP_RTOL, "%s step at %lld: %.3g x max|out| from the whole history",
               positional, (long long)n0, d);
        ok = d <= STEP_RTOL;
    }
    free(ref);
    free(got);
    result_free(&r);
    return ok;
}

static bool step_checked(api_sessions *reg, const char *id, const float *x, int64_t n0, int64_t L,
                         const char *positional, const char *extra)
{
    return step_checked_as(reg, id, x, n0, L, positional, true, extra);
}

/* ---- Steps against the whole history ----------------------------------------------------- */

static void decode_run(const char *positional)
{
    enum { P = 40, T = 12, CHUNK = 3 };
    uint64_t rng = 31;
    float x[(P + T + CHUNK) * E];
    char id[40];
    fill(x, sizeof x / sizeof x[0], &rng);
    api_sessions *reg = registry();
    result desc;
    CHECK_EQ_INT(create(reg, "{\"model\":\"demo\"}", id, &desc), 201);
    /* The layer's shape, and the model it is the cache of. */
    CHECK(strcmp(json_string_value(json_object_get(desc.json, "model")), "demo") == 0);
    CHECK_EQ_INT(json_integer_value(json_object_get(desc.json, "num_heads")), 4);
    CHECK_EQ_INT(json_integer_value(json_object_get(desc.json, "num_kv_heads")), 4);
    CHECK_EQ_INT(json_integer_value(json_object_get(desc.json, "head_dim")), 16);
    result_free(&desc);
    /* The prefill names the model; the steps may leave it out. */
    bool ok = step_checked(reg, id, x, 0, P, positional, ",\"model\":\"demo\"");
    for (int64_t t = 0; ok && t < T; t++)
        ok = step_checked(reg, id, x, P + t, 1, positional, "");
    if (ok)
        step_checked(reg, id, x, P + T, CHUNK, positional, "");
    api_sessions_free(reg);
}

static void test_rope_steps_equal_one_mha_over_the_history(void)
{
    decode_run("rope");
}

static void test_sinusoidal_steps_equal_one_mha_over_the_history(void)
{
    decode_run("sinusoidal");
}

/* Weights of a step cover the whole cache: [L, n + L] for a rank-2 input. */
static void test_step_weights_cover_the_cache(void)
{
    uint64_t rng = 32;
    float x[6 * E];
    char id[40];
    fill(x, sizeof x / sizeof x[0], &rng);
    api_sessions *reg = registry();
    CHECK_EQ_INT(create(reg, "{\"model\":\"demo\"}", id, NULL), 201);
    char fields[128];
    snprintf(fields, sizeof fields, "\"session\":\"%s\"", id);
    char *body = mha_body(x, 5, fields);
    result r = mha(reg, body);
    free(body);
    CHECK_EQ_INT(r.status, 200);
    result_free(&r);
    snprintf(fields, sizeof fields, "\"session\":\"%s\",\"return_weights\":\"mean\"", id);
    body = mha_body(x + 5 * E, 1, fields);
    r = mha(reg, body);
    free(body);
    CHECK_EQ_INT(r.status, 200);
    const json_t *w = json_object_get(r.json, "weights");
    const json_t *shape = json_object_get(w, "shape");
    CHECK(json_array_size(shape) == 2 && json_integer_value(json_array_get(shape, 0)) == 1 &&
          json_integer_value(json_array_get(shape, 1)) == 6);
    double sum = 0;
    for (size_t i = 0; i < json_array_size(json_object_get(w, "data")); i++)
        sum += json_number_value(json_array_get(json_object_get(w, "data"), i));
    CHECK_NEAR(sum, 1.0, 1e-5);
    result_free(&r);
    api_sessions_free(reg);
}

/* A fork is the same layer's cache: its steps need no model and continue its history. */
static void test_fork_stays_the_layers_cache(void)
{
    uint64_t rng = 33;
    float x[12 * E];
    char id[40], child[40];
    fill(x, sizeof x / sizeof x[0], &rng);
    api_sessions *reg = registry();
    CHECK_EQ_INT(create(reg, "{\"model\":\"demo\"}", id, NULL), 201);
    if (!step_checked(reg, id, x, 0, 10, "rope", "")) {
        api_sessions_free(reg);
        return;
    }
    result f = call_route(api_session_fork, reg, id, NULL, "{}");
    CHECK_EQ_INT(f.status, 201);
    const char *cid = json_string_value(json_object_get(f.json, "id"));
    CHECK(strcmp(json_string_value(json_object_get(f.json, "model")), "demo") == 0);
    snprintf(child, sizeof child, "%s", cid ? cid : "");
    result_free(&f);
    step_checked(reg, child, x, 10, 1, "rope", "");
    api_sessions_free(reg);
}

/* The first step fixes the positions of the session's keys: a later step that gives none takes
 * them (and still equals the whole history), a fork keeps them, and a step that gives others
 * is refused naming the field, with nothing appended. */
static void test_steps_keep_the_first_steps_positions(void)
{
    enum { P = 12 };
    static const char *const others[][2] = {
        {"\"positional\":\"none\"", "positional"},
        {"\"positional\":\"sinusoidal\"", "positional"},
        {"\"positional\":\"rope\",\"rope_base\":500", "rope_base"},
        {"\"positional\":\"rope\",\"rope_style\":\"interleaved\"", "rope_style"},
    };
    uint64_t rng = 35;
    float x[(P + 2) * E];
    char id[40], child[40], fields[192];
    fill(x, sizeof x / sizeof x[0], &rng);
    api_sessions *reg = registry();
    CHECK_EQ_INT(create(reg, "{\"model\":\"demo\"}", id, NULL), 201);
    bool ok = step_checked(reg, id, x, 0, P, "rope", "") &&
              step_checked_as(reg, id, x, P, 1, "rope", false, "");
    for (size_t i = 0; ok && i < sizeof others / sizeof others[0]; i++) {
        snprintf(fields, sizeof fields, "\"session\":\"%s\",%s", id, others[i][0]);
        char *body = mha_body(x + (P + 1) * E, 1, fields);
        result r = mha(reg, body);
        free(body);
        CHECKF(r.status == 422 && test_error_field(&r) &&
                   strcmp(test_error_field(&r), others[i][1]) == 0,
               "a step with %s: %d naming %s", others[i][0], r.status,
               test_error_field(&r) ? test_error_field(&r) : "nothing");
        result_free(&r);
    }
    result f = call_route(api_session_fork, reg, id, NULL, "{}");
    const char *cid = json_string_value(json_object_get(f.json, "id"));
    snprintf(child, sizeof child, "%s", cid ? cid : "");
    CHECK_EQ_INT(f.status, 201);
    result_free(&f);
    if (ok) /* the refused steps appended nothing, and the fork turns its keys as its parent */
        step_checked_as(reg, child, x, P + 1, 1, "rope", false, "");
    api_sessions_free(reg);
}

/* ---- KServe v2 sequences on a layer model ------------------------------------------------- */

/* A v2 inference of model demo on tokens x[n0, n0 + L) as [1, L, E] JSON numbers, with the
 * sequence parameters `params`. */
static result v2_step(api_sessions *reg, const float *x, int64_t n0, int64_t L, const char *params)
{
    size_t cap = (size_t)(L * E) * 24 + 512, len = 0;
    char *b = malloc(cap);
    len += (size_t)snprintf(b, cap,
                            "{\"parameters\":{%s,\"positional\":\"rope\"},\"inputs\":[{\"name\":"
                            "\"input\",\"datatype\":\"FP32\",\"shape\":[1,%lld,%d],\"data\":[",
                            params, (long long)L, E);
    for (int64_t i = 0; i < L * E; i++)
        len += (size_t)snprintf(b + len, cap - len, "%s%.9g", i ? "," : "", (double)x[n0 * E + i]);
    snprintf(b + len, cap - len, "]}]}");
    result r = call_route(api_v2_infer, reg, NULL, "demo", b);
    free(b);
    return r;
}

/* The output rows of a v2 reply ([1, L, E]) against the whole history's rows [n0, n0 + L). */
static void v2_checked(const result *r, const float *x, int64_t n0, int64_t L)
{
    const json_t *out = json_array_get(json_object_get(r->json, "outputs"), 0);
    const json_t *data = json_object_get(out, "data");
    float *ref = xcalloc((size_t)((n0 + L) * E), sizeof(float));
    float *got = xcalloc((size_t)(L * E), sizeof(float));
    CHECKF(r->status == 200 && json_array_size(data) == (size_t)(L * E),
           "v2 step at %lld: status %d", (long long)n0, r->status);
    for (size_t i = 0; i < json_array_size(data) && i < (size_t)(L * E); i++)
        got[i] = (float)json_number_value(json_array_get(data, i));
    if (r->status == 200 && whole_history(x, n0 + L, "rope", ref)) {
        double d = rel_diff(got, ref + n0 * E, (size_t)(L * E));
        CHECKF(d <= STEP_RTOL, "v2 step at %lld: %.3g x max|out| from the whole history",
               (long long)n0, d);
    }
    free(got);
    free(ref);
}

static void test_v2_sequence_on_the_demo_layer(void)
{
    enum { P = 7, T = 4 };
    uint64_t rng = 34;
    float x[(P + T) * E];
    fill(x, sizeof x / sizeof x[0], &rng);
    api_sessions *reg = registry();
    result r = v2_step(reg, x, 0, P, "\"sequence_id\":11,\"sequence_start\":true");
    v2_checked(&r, x, 0, P);
    result_free(&r);
    for (int64_t t = 0; t < T; t++) {
        r = v2_step(reg, x, P + t, 1,
                    t == T - 1 ? "\"sequence_id\":11,\"sequence_end\":true" : "\"sequence_id\":11");
        v2_checked(&r, x, P + t, 1);
        result_free(&r);
    }
    /* The end freed it: the sequence is unknown now, in Triton's words. */
    r = v2_step(reg, x, 0, 1, "\"sequence_id\":11");
    CHECK_EQ_INT(r.status, 400);
    const char *msg = json_string_value(json_object_get(r.json, "error"));
    CHECK(msg && strstr(msg, "must specify the START flag on the first request of the sequence"));
    result_free(&r);
    api_reply list;
    api_sessions_list(reg, NULL, NULL, &list);
    CHECK(list.body && strstr(list.body, "\"live\":0") != NULL);
    api_reply_free(&list);
    /* A start on a live sequence begins it again, empty. */
    r = v2_step(reg, x, 0, 2, "\"sequence_id\":\"chat\",\"sequence_start\":true");
    result_free(&r);
    r = v2_step(reg, x, 0, 1, "\"sequence_id\":\"chat\",\"sequence_start\":true");
    v2_checked(&r, x, 0, 1);
    result_free(&r);
    api_sessions_free(reg);
}

/* ---- Refusals ---------------------------------------------------------------------------- */

/* `body` on /v1/mha must answer `status` with error field `field` (NULL: none). */
static void expect_mha(api_sessions *reg, const char *body, int status, const char *field)
{
    result r = mha(reg, body);
    const char *f = test_error_field(&r);
    CHECKF(r.status == status && (field ? f && strcmp(f, field) == 0 : f == NULL),
           "%.120s...: %d field %s, want %d field %s", body, r.status, f ? f : "null", status,
           field ? field : "null");
    result_free(&r);
}

static void expect_step(api_sessions *reg, const char *id, const float *x, int64_t L,
                        const char *fields, int status, const char *field)
{
    char all[2048];
    snprintf(all, sizeof all, "\"session\":\"%s\"%s", id, fields);
    char *body = mha_body(x, L, all);
    expect_mha(reg, body, status, field);
    free(body);
}

static void test_steps_that_do_not_fit_the_session_are_refused(void)
{
    uint64_t rng = 35;
    float x[4 * E];
    char id[40], shaped[40], capped[40], gone[40];
    fill(x, sizeof x / sizeof x[0], &rng);
    api_sessions *reg = registry();
    CHECK_EQ_INT(create(reg, "{\"model\":\"demo\"}", id, NULL), 201);
    expect_step(reg, id, x, 2, "", 200, NULL);

    /* A retried step: the session holds 2, so nothing is appended. */
    expect_step(reg, id, x, 1, ",\"expect_length\":0", 409, "expect_length");
    /* What a cache step cannot take, each naming its field. */
    expect_step(reg, id, x, 1, ",\"query_offset\":3", 422, "query_offset");
    expect_step(reg, id, x, 1, ",\"causal\":\"top_left\"", 422, "causal");
    expect_step(reg, id, x, 1, ",\"add_zero_attn\":true", 422, "add_zero_attn");
    expect_step(reg, id, x, 1, ",\"key_padding_mask\":[false]", 422, "key_padding_mask");
    char *mem = tokens(x, 1), extra[1024];
    snprintf(extra, sizeof extra, ",\"memory\":%s", mem);
    free(mem);
    expect_step(reg, id, x, 1, extra, 422, "memory");
    int64_t b2[3] = {2, 1, E};
    char *batch = json_tensor_b64(x, b2, 3), body[1024];
    snprintf(body, sizeof body, "{\"session\":\"%s\",\"input\":%s}", id, batch);
    free(batch);
    expect_mha(reg, body, 422, "input");
    /* Inline weights are not the model the session is the cache of. */
    snprintf(body, sizeof body,
             "{\"session\":\"%s\",\"num_heads\":1,\"input\":[[1,0]],\"weights\":{\"W_Q.weight\":"
             "[[1,0],[0,1]],\"W_K.weight\":[[1,0],[0,1]],\"W_V.weight\":[[1,0],[0,1]],"
             "\"W_O.weight\":[[1,0],[0,1]]}}",
             id);
    expect_mha(reg, body, 422, "session");
    api_reply desc;
    api_sessions_get(reg, id, &desc);
    CHECK(desc.body && strstr(desc.body, "\"length\":2,") != NULL); /* none of those appended */
    api_reply_free(&desc);

    /* A session made by its shape: of another shape, 422 "session"; of the layer's, it may be
     * stepped but must name the model. */
    CHECK_EQ_INT(create(reg, "{\"num_heads\":2,\"head_dim\":4}", shaped, NULL), 201);
    expect_step(reg, shaped, x, 1, ",\"model\":\"demo\"", 422, "session");
    CHECK_EQ_INT(create(reg, "{\"num_heads\":4,\"head_dim\":16}", shaped, NULL), 201);
    expect_step(reg, shaped, x, 1, "", 422, "model");
    expect_step(reg, shaped, x, 1, ",\"model\":\"demo\"", 200, NULL);

    /* A layer whose bias_kv keys would sit inside the cache cannot step one. */
    CHECK_EQ_INT(create(reg, "{\"num_heads\":1,\"head_dim\":2}", shaped, NULL), 201);
    snprintf(body, sizeof body,
             "{\"session\":\"%s\",\"num_heads\":1,\"input\":[[1,0]],\"weights\":{\"W_Q.weight\":"
             "[[1,0],[0,1]],\"W_K.weight\":[[1,0],[0,1]],\"W_V.weight\":[[1,0],[0,1]],"
             "\"W_O.weight\":[[1,0],[0,1]],\"bias_k\":[[[1,1]]],\"bias_v\":[[[1,1]]]}}",
             shaped);
    expect_mha(reg, body, 422, "model");

    /* max_tokens: 413 naming the input. */
    CHECK_EQ_INT(create(reg, "{\"model\":\"demo\",\"max_tokens\":3}", capped, NULL), 201);
    expect_step(reg, capped, x, 4, "", 413, "input");
    expect_step(reg, capped, x, 3, "", 200, NULL);

    /* An id this process made that names no session (deleted): 404 session_not_found. */
    CHECK_EQ_INT(create(reg, "{\"model\":\"demo\"}", gone, NULL), 201);
    api_reply del;
    api_sessions_delete(reg, gone, &del);
    api_reply_free(&del);
    char *one = tokens(x, 1);
    snprintf(body, sizeof body, "{\"session\":\"%s\",\"input\":%s}", gone, one);
    free(one);
    result r = mha(reg, body);
    CHECK_EQ_INT(r.status, 404);
    CHECK(error_code(&r) && strcmp(error_code(&r), "session_not_found") == 0);
    result_free(&r);
    api_sessions_free(reg);
}

/* A layer step that finds the pool full evicts the least recently used idle session, as a step
 * of /v1/sessions/{id}/attention does; with every other session pinned by a ticket it is 429;
 * one that could never fit is 413 and evicts no one. A block of the demo layer's cache is 16
 * tokens of 4 kv heads, K and V of 16 floats: 8 KiB; the pool holds three. */
static void test_full_pool_evicts_for_a_layer_step(void)
{
    uint64_t rng = 36;
    float x[64 * E];
    char id[4][40];
    fill(x, sizeof x / sizeof x[0], &rng);
    api_sessions *reg = test_sessions_new(3 * 8192);
    for (int i = 0; i < 3; i++) {
        CHECK_EQ_INT(create(reg, "{\"model\":\"demo\"}", id[i], NULL), 201);
        expect_step(reg, id[i], x, 16, "", 200, NULL);
    }
    expect_step(reg, id[0], x, 1, "", 200, NULL); /* a second block: id[1] goes */
    api_reply g;
    api_sessions_get(reg, id[1], &g);
    CHECK(g.status == 404 && g.body && strstr(g.body, "session_evicted"));
    api_reply_free(&g);
    CHECK_EQ_INT(create(reg, "{\"model\":\"demo\"}", id[3], NULL), 201);
    api_session_ticket t0, t2;
    CHECK(api_session_ticket_take(reg, id[0], &t0));
    CHECK(api_session_ticket_take(reg, id[2], &t2));
    expect_step(reg, id[3], x, 16, "", 429, NULL);
    expect_step(reg, id[3], x, 64, "", 413, "input"); /* four blocks: never */
    api_session_turn_end(reg, &t0);
    api_session_turn_end(reg, &t2);
    api_sessions_get(reg, id[2], &g); /* the 413 evicted no one */
    CHECK_EQ_INT(g.status, 200);
    api_reply_free(&g);
    expect_step(reg, id[3], x, 16, "", 200, NULL);
    api_sessions_free(reg);
}

static void test_sessions_of_a_model_take_its_shape(void)
{
    api_sessions *reg = registry();
    const struct {
        const char *body;
        int status;
        const char *field;
    } cases[] = {
        {"{\"model\":\"demo\",\"num_heads\":4,\"num_kv_heads\":4,\"head_dim\":16}", 201, NULL},
        {"{\"model\":\"demo\",\"num_heads\":3}", 422, "num_heads"},
        {"{\"model\":\"demo\",\"num_kv_heads\":2}", 422, "num_kv_heads"},
        {"{\"model\":\"demo\",\"head_dim\":8}", 422, "head_dim"},
        {"{\"model\":\"demo\",\"value_head_dim\":8}", 422, "value_head_dim"},
        {"{\"model\":\"demo\",\"alibi\":true}", 422, "alibi"},
        {"{\"model\":\"demo\",\"scale\":0.5}", 422, "scale"},
        {"{\"model\":\"nope\"}", 404, "model"},
        {"{\"model\":7}", 422, "model"},
        {"{\"model\":\"demo\",\"cache_dtype\":\"bfloat16\",\"causal\":false,\"window\":[4,0]}", 201,
         NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        result r = call_route(api_sessions_create, reg, NULL, NULL, cases[i].body);
        const char *f = test_error_field(&r);
        CHECKF(r.status == cases[i].status &&
                   (cases[i].field ? f && strcmp(f, cases[i].field) == 0 : true),
               "%s: %d field %s, want %d field %s", cases[i].body, r.status, f ? f : "null",
               cases[i].status, cases[i].field ? cases[i].field : "null");
        result_free(&r);
    }
    api_sessions_free(reg);
}

int main(void)
{
    eng_error err;
    pool = eng_pool_new(2, &err);
    models = api_models_new();
    if (!pool || !models) {
        printf("FAIL set-up\n0 passed, 1 failed\n");
        return 1;
    }
    RUN_WITHIN(test_rope_steps_equal_one_mha_over_the_history, 120);
    RUN_WITHIN(test_sinusoidal_steps_equal_one_mha_over_the_history, 120);
    RUN_WITHIN(test_step_weights_cover_the_cache, 60);
    RUN_WITHIN(test_fork_stays_the_layers_cache, 60);
    RUN_WITHIN(test_steps_keep_the_first_steps_positions, 60);
    RUN_WITHIN(test_v2_sequence_on_the_demo_layer, 60);
    RUN_WITHIN(test_steps_that_do_not_fit_the_session_are_refused, 60);
    RUN_WITHIN(test_full_pool_evicts_for_a_layer_step, 60);
    RUN_WITHIN(test_sessions_of_a_model_take_its_shape, 60);
    api_models_free(models);
    eng_pool_free(pool);
    return check_report();
}
