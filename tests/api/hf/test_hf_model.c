/* test_hf_model.c - every attention layer of a Hugging Face checkpoint as one model: a
 * directory loaded without :layer=K (api_models_load with layer < 0, what --model NAME=DIR
 * does) serves each of its num_hidden_layers layers under one name, and a request names the
 * layer ("layer" on /v1/mha, the parameter "layer" on KServe v2). Each family of
 * tests/api/hf/cases (two layers each) served whole gives, layer by layer, the same bits as
 * the same checkpoint served with :layer=K (per-layer windows, RoPE bases and GPT-2's scales
 * included), and its captured layer transformers' output. A request of such a model that
 * names no layer, or one past the last, is refused naming "layer". One session holds every
 * layer's cache: a prompt and then tokens stepped through layers 0..N-1 equal per-layer
 * sessions of the :layer=K models bit for bit; expect_length is each layer's own (409 for a
 * layer repeated or skipped); GET shows each layer's length; the pool's bytes count every
 * layer, and an eviction frees them all; truncate and fork take every layer; a KServe v2
 * sequence over the layers equals the same steps. Batching such steps is
 * tests/api/proto/test_batch.c's; the daemon with HTTP and gRPC, tests/server's. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "tests/support/check.h"
#include "tests/support/daemon.h"
#include "tests/support/hf_case.h"
#include "tests/support/route.h"
#include "tests/support/util.h"

#define RTOL    1e-5
#define PREFILL 12 /* tokens of a session's first step; the rest go one at a time */
#define LAYERS  2  /* every case's num_hidden_layers */

static eng_pool *pool;
static api_models *models;
static const char *cases_dir;

typedef test_reply result;

/* ---- Set-up ------------------------------------------------------------------------------- */

/* Registers each family three times: whole as "<family>", and each layer K alone as
 * "<family>_K". */
static bool register_all(void)
{
    for (size_t i = 0; i < HF_FAMILIES; i++) {
        for (int64_t layer = -1; layer < LAYERS; layer++) {
            char name[64];
            if (layer < 0)
                snprintf(name, sizeof name, "%s", hf_families[i]);
            else
                snprintf(name, sizeof name, "%s_%lld", hf_families[i], (long long)layer);
            if (!hf_case_serve(models, cases_dir, hf_families[i], name, layer))
                return false;
        }
    }
    return true;
}

/* A session registry of `bytes` and the llama case into c; NULL (nothing to free) when either
 * cannot be had. */
static api_sessions *llama_registry(size_t bytes, hf_case *c)
{
    api_sessions *reg = test_sessions_new(bytes);
    if (reg && hf_case_read(cases_dir, "llama", c))
        return reg;
    api_sessions_free(reg);
    return NULL;
}

/* ---- Calls -------------------------------------------------------------------------------- */

static result call_route(void (*fn)(const api_call *, api_reply *), api_sessions *reg,
                         const char *path_model, const char *path_session, const char *body)
{
    api_call call = test_json_call(pool, models, reg, body);
    call.model = path_model;
    call.session = path_session;
    return test_route(fn, &call);
}

/* POST /v1/mha {"input": rows [t0, t0 + n) of the case's input, "output_encoding": form,
 * fields}. */
static result mha(api_sessions *reg, const hf_case *c, int64_t t0, int64_t n, const char *form,
                  const char *fields)
{
    int64_t shape[2] = {n, c->E};
    char *t = json_tensor_b64(c->input + t0 * c->E, shape, 2);
    size_t len = strlen(t) + strlen(fields) + 128;
    char *b = malloc(len);
    snprintf(b, len, "{\"input\":%s,\"output_encoding\":\"%s\",%s}", t, form, fields);
    result r = call_route(api_mha, reg, NULL, NULL, b);
    free(b);
    free(t);
    return r;
}

/* The output's base64 text (its bits) of a reply in form "base64", or NULL. */
static const char *bits(const result *r)
{
    return json_string_value(json_object_get(json_object_get(r->json, "output"), "base64"));
}

static bool same_bits(const result *a, const result *b)
{
    return a->status == 200 && b->status == 200 && bits(a) && bits(b) &&
           strcmp(bits(a), bits(b)) == 0;
}

static const char *error_message(const result *r)
{
    const json_t *e = json_object_get(r->json, "error");
    return json_is_string(e) ? json_string_value(e)
                             : json_string_value(json_object_get(e, "message"));
}

static bool message_has(const result *r, const char *text)
{
    return error_message(r) && strstr(error_message(r), text) != NULL;
}

/* max |got - want| / max |want| of a flat reply's rows [t0, t0 + n) against the reference. */
static double rel_error(const result *r, const hf_case *c, int64_t t0, int64_t n)
{
    const json_t *d = json_object_get(json_object_get(r->json, "output"), "data");
    return r->status == 200 ? hf_case_error(d, c, t0, n) : INFINITY;
}

/* POST /v1/sessions {"model": model}: the new id into id[40] (201), else "". */
static void create(api_sessions *reg, const char *model, char id[40])
{
    char body[128];
    snprintf(body, sizeof body, "{\"model\":\"%s\"}", model);
    result r = call_route(api_sessions_create, reg, NULL, NULL, body);
    const char *s = json_string_value(json_object_get(r.json, "id"));
    CHECKF(r.status == 201 && s, "session of %s: %d", model, r.status);
    snprintf(id, 40, "%s", r.status == 201 && s ? s : "");
    json_decref(r.json);
}

/* GET /v1/sessions/{id} (the caller frees r.json). */
static result describe_session(api_sessions *reg, const char *id)
{
    api_reply reply;
    api_sessions_get(reg, id, &reply);
    return test_reply_take(&reply);
}

static int64_t int_of(const json_t *j, const char *key)
{
    return json_integer_value(json_object_get(j, key));
}

/* Whether the session's "layer_lengths" are want[0..LAYERS) and its "length" the least. */
static bool lengths_are(api_sessions *reg, const char *id, const int64_t want[LAYERS])
{
    result r = describe_session(reg, id);
    const json_t *l = json_object_get(r.json, "layer_lengths");
    bool ok = r.status == 200 && json_array_size(l) == LAYERS && int_of(r.json, "layers") == LAYERS;
    int64_t least = want[0];
    for (size_t i = 0; ok && i < LAYERS; i++) {
        ok = json_integer_value(json_array_get(l, i)) == want[i];
        least = want[i] < least ? want[i] : least;
    }
    ok = ok && int_of(r.json, "length") == least;
    json_decref(r.json);
    return ok;
}

/* A step of session `id` over rows [t0, t0 + n) through `layer` (< 0: none named), expecting
 * the layer's cache to hold t0 tokens, in base64. */
static result step(api_sessions *reg, const char *id, const hf_case *c, int64_t t0, int64_t n,
                   int64_t layer)
{
    char fields[160], named[32] = "";
    if (layer >= 0)
        snprintf(named, sizeof named, ",\"layer\":%lld", (long long)layer);
    snprintf(fields, sizeof fields, "\"session\":\"%s\",\"expect_length\":%lld%s", id,
             (long long)t0, named);
    return mha(reg, c, t0, n, "base64", fields);
}

/* ---- Every layer, as its own model serves it ---------------------------------------------- */

static void test_every_layer_is_the_one_layer_models_bits(void)
{
    for (size_t i = 0; i < HF_FAMILIES; i++) {
        hf_case c;
        if (!hf_case_read(cases_dir, hf_families[i], &c))
            continue;
        const api_model *m = api_models_find(models, hf_families[i]);
        CHECKF(m && m->layers == LAYERS && m->about && m->about->layer == 0, "%s: %lld layers",
               hf_families[i], (long long)(m ? m->layers : 0));
        for (int64_t l = 0; l < LAYERS; l++) {
            char whole[128], alone[128];
            snprintf(whole, sizeof whole, "\"model\":\"%s\",\"layer\":%lld", hf_families[i],
                     (long long)l);
            snprintf(alone, sizeof alone, "\"model\":\"%s_%lld\"", hf_families[i], (long long)l);
            result a = mha(NULL, &c, 0, c.L, "base64", whole);
            result b = mha(NULL, &c, 0, c.L, "base64", alone);
            CHECKF(same_bits(&a, &b), "%s layer %lld: %d and %d, not the same bits", hf_families[i],
                   (long long)l, a.status, b.status);
            CHECK_EQ_INT(int_of(json_object_get(a.json, "meta"), "layer"), l);
            json_decref(a.json);
            json_decref(b.json);
        }
        /* The layer transformers captured, through the whole model. */
        char fields[128];
        snprintf(fields, sizeof fields, "\"model\":\"%s\",\"layer\":%lld", hf_families[i],
                 (long long)c.layer);
        result r = mha(NULL, &c, 0, c.L, "flat", fields);
        double e = rel_error(&r, &c, 0, c.L);
        CHECKF(e <= RTOL, "%s layer %lld: %.3g x max|output| from transformers", hf_families[i],
               (long long)c.layer, e);
        json_decref(r.json);
        hf_case_free(&c);
    }
}

/* ---- What the model says of itself -------------------------------------------------------- */

static result get_model(const char *name)
{
    api_reply reply;
    api_models_get(models, name, &reply);
    return test_reply_take(&reply);
}

/* v2 metadata (config false) or configuration of `name`. */
static result get_v2(const char *name, bool config)
{
    api_call call = {.pool = pool, .models = models, .model = name};
    api_reply reply;
    if (config)
        api_v2_model_config(&call, &reply);
    else
        api_v2_model_metadata(&call, &reply);
    return test_reply_take(&reply);
}

static void test_the_model_describes_every_layer(void)
{
    for (size_t i = 0; i < HF_FAMILIES; i++) {
        char name[64];
        result whole = get_model(hf_families[i]);
        const json_t *layers = json_object_get(whole.json, "decoder_layers");
        CHECK_EQ_INT(int_of(whole.json, "layers"), LAYERS);
        CHECK_EQ_INT(json_array_size(layers), LAYERS);
        int64_t params = 0, bytes = 0;
        for (int64_t l = 0; l < LAYERS; l++) {
            snprintf(name, sizeof name, "%s_%lld", hf_families[i], (long long)l);
            result one = get_model(name);
            CHECK_EQ_INT(int_of(one.json, "layers"), 1);
            params += int_of(one.json, "parameters");
            bytes += int_of(one.json, "bytes");
            /* Layer l as the whole model describes it is the one-layer model's layer. */
            CHECKF(
                json_equal(json_array_get(layers, (size_t)l), json_object_get(one.json, "decoder")),
                "%s: decoder_layers[%lld] differs from %s's decoder", hf_families[i], (long long)l,
                name);
            json_decref(one.json);
        }
        CHECK_EQ_INT(int_of(whole.json, "parameters"), params);
        CHECK_EQ_INT(int_of(whole.json, "bytes"), bytes);
        const api_model *m = api_models_find(models, hf_families[i]);
        CHECK(m && (int64_t)api_model_bytes(m) == bytes && api_model_params(m) == params);
        json_decref(whole.json);
    }
    /* Gemma 2 alternates: layer 0 slides a window of 8, layer 1 sees every key. */
    result g = get_model("gemma2");
    const json_t *gl = json_object_get(g.json, "decoder_layers");
    CHECK_EQ_INT(int_of(json_array_get(gl, 0), "sliding_window"), 8);
    CHECK(json_is_null(json_object_get(json_array_get(gl, 1), "sliding_window")));
    CHECK_EQ_INT(int_of(json_array_get(gl, 1), "layer"), 1);
    json_decref(g.json);
    /* The log line says how many layers, and the windows that differ. */
    char line[512];
    api_model_summary(api_models_find(models, "gemma2"), line, sizeof line);
    CHECKF(strstr(line, "gemma2 2 layers (0 to 1)") && strstr(line, "sliding on 1 of 2 layers"),
           "%s", line);
    api_model_summary(api_models_find(models, "gemma2_1"), line, sizeof line);
    CHECKF(strstr(line, "gemma2 layer 1,") && strstr(line, "window none"), "%s", line);
    /* KServe v2: the metadata's parameters and Triton's configuration say it too. */
    result md = get_v2("gemma2", false), cfg = get_v2("gemma2", true),
           one = get_v2("gemma2_1", true);
    CHECK_EQ_INT(int_of(json_object_get(md.json, "parameters"), "layers"), 2);
    const json_t *p = json_object_get(json_object_get(cfg.json, "parameters"), "layers");
    CHECK(json_string_value(json_object_get(p, "string_value")) &&
          strcmp(json_string_value(json_object_get(p, "string_value")), "2") == 0);
    p = json_object_get(json_object_get(one.json, "parameters"), "layers");
    CHECK(json_string_value(json_object_get(p, "string_value")) &&
          strcmp(json_string_value(json_object_get(p, "string_value")), "1") == 0);
    json_decref(md.json);
    json_decref(cfg.json);
    json_decref(one.json);
}

/* ---- Which layer ---------------------------------------------------------------------------- */

/* A v2 inference of `model` on the case's first n rows as [1, n, E] with `params` (or none). */
static result v2_infer(api_sessions *reg, const char *model, const hf_case *c, int64_t t0,
                       int64_t n, const char *params)
{
    char *b = hf_case_v2_body(c, t0, n, params);
    result r = call_route(api_v2_infer, reg, model, NULL, b);
    free(b);
    return r;
}

/* Whether v2 reply `v` holds the same numbers as the flat /v1/mha reply `f`. */
static bool v2_same(const result *v, const result *f)
{
    const json_t *a =
        json_object_get(json_array_get(json_object_get(v->json, "outputs"), 0), "data");
    const json_t *b = json_object_get(json_object_get(f->json, "output"), "data");
    bool ok = v->status == 200 && f->status == 200 && json_array_size(a) == json_array_size(b) &&
              json_array_size(a) > 0;
    for (size_t i = 0; ok && i < json_array_size(a); i++)
        ok = json_number_value(json_array_get(a, i)) == json_number_value(json_array_get(b, i));
    return ok;
}

static void test_a_request_names_its_layer(void)
{
    static const struct {
        const char *fields, *message;
    } refused[] = {
        {"\"model\":\"llama\"", "has 2 layers: name the one to run with layer (0 to 1)"},
        {"\"model\":\"llama\",\"layer\":2", "layer is 2 but model \"llama\" has 2 layers (0 to 1)"},
        {"\"model\":\"llama\",\"layer\":-1", "layer"},
        {"\"model\":\"llama\",\"layer\":\"1\"", "layer"},
        {"\"model\":\"llama_1\",\"layer\":1", "has 1 layer (0 to 0)"},
        {"\"weights\":{\"W_Q.weight\":[[1]],\"W_K.weight\":[[1]],\"W_V.weight\":[[1]],"
         "\"W_O.weight\":[[1]]},\"num_heads\":1,\"layer\":1",
         "inline weights are one layer"},
    };
    hf_case c;
    if (!hf_case_read(cases_dir, "llama", &c))
        return;
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        result r = mha(NULL, &c, 0, 4, "flat", refused[i].fields);
        CHECKF(
            r.status == 422 && test_error_field(&r) && strcmp(test_error_field(&r), "layer") == 0 &&
                message_has(&r, refused[i].message),
            "%s: %d %s", refused[i].fields, r.status, error_message(&r) ? error_message(&r) : "");
        json_decref(r.json);
    }
    /* A model of one layer takes layer 0 or none. */
    result a = mha(NULL, &c, 0, 4, "base64", "\"model\":\"llama_1\",\"layer\":0");
    result b = mha(NULL, &c, 0, 4, "base64", "\"model\":\"llama_1\"");
    CHECK(same_bits(&a, &b));
    json_decref(a.json);
    json_decref(b.json);
    /* KServe v2: the parameter "layer", 400 with the same words. */
    result v = v2_infer(NULL, "llama", &c, 0, 4, "");
    CHECKF(v.status == 400 && message_has(&v, "has 2 layers"), "v2 without layer: %d %s", v.status,
           error_message(&v) ? error_message(&v) : "");
    json_decref(v.json);
    v = v2_infer(NULL, "llama", &c, 0, 4, "\"layer\":7");
    CHECKF(v.status == 400 && message_has(&v, "(0 to 1)"), "v2 layer 7: %d", v.status);
    json_decref(v.json);
    for (int64_t l = 0; l < LAYERS; l++) {
        char params[32], fields[64];
        snprintf(params, sizeof params, "\"layer\":%lld", (long long)l);
        snprintf(fields, sizeof fields, "\"model\":\"llama_%lld\"", (long long)l);
        v = v2_infer(NULL, "llama", &c, 0, 4, params);
        result f = mha(NULL, &c, 0, 4, "flat", fields);
        CHECKF(v2_same(&v, &f), "v2 layer %lld: %d, not /v1/mha's numbers", (long long)l, v.status);
        json_decref(v.json);
        json_decref(f.json);
    }
    hf_case_free(&c);
}

/* ---- One session, every layer ------------------------------------------------------------- */

/* Session `whole` of "llama" and `per[l]` of "llama_l" stepped alike over rows [t0, t0 + n)
 * through every layer: each step of the whole model's session is the bits of the per-layer one. */
static bool step_every_layer(api_sessions *reg, const char *whole, char per[LAYERS][40],
                             const hf_case *c, int64_t t0, int64_t n)
{
    bool ok = true;
    for (int64_t l = 0; l < LAYERS && ok; l++) {
        result a = step(reg, whole, c, t0, n, l), b = step(reg, per[l], c, t0, n, -1);
        ok = same_bits(&a, &b) && int_of(a.json, "length") == t0 + n;
        CHECKF(ok, "layer %lld at %lld: %d %s / %d, not the per-layer session's bits", (long long)l,
               (long long)t0, a.status, error_message(&a) ? error_message(&a) : "", b.status);
        json_decref(a.json);
        json_decref(b.json);
        int64_t want[LAYERS];
        for (int64_t k = 0; k < LAYERS; k++)
            want[k] = k <= l ? t0 + n : t0;
        CHECKF(!ok || lengths_are(reg, whole, want), "lengths after layer %lld at %lld",
               (long long)l, (long long)t0);
    }
    return ok;
}

static void test_one_session_steps_every_layer(void)
{
    hf_case c;
    api_sessions *reg = llama_registry((size_t)32 << 20, &c);
    if (!reg)
        return;
    char whole[40], per[LAYERS][40];
    create(reg, "llama", whole);
    for (int64_t l = 0; l < LAYERS; l++) {
        char name[32];
        snprintf(name, sizeof name, "llama_%lld", (long long)l);
        create(reg, name, per[l]);
    }
    int64_t none[LAYERS] = {0, 0};
    CHECK(lengths_are(reg, whole, none));
    bool ok = step_every_layer(reg, whole, per, &c, 0, PREFILL);
    for (int64_t t = PREFILL; ok && t < c.L; t++)
        ok = step_every_layer(reg, whole, per, &c, t, 1);

    /* The bytes of every layer's cache: the per-layer sessions' together, and with them the
     * pool's. */
    result w = describe_session(reg, whole), p0 = describe_session(reg, per[0]),
           p1 = describe_session(reg, per[1]);
    api_sessions_stats st;
    api_sessions_stats_get(reg, &st);
    int64_t bytes = int_of(w.json, "bytes");
    CHECK(bytes > 0 && bytes == int_of(p0.json, "bytes") + int_of(p1.json, "bytes"));
    CHECK_EQ_INT((int64_t)st.bytes_used, 2 * bytes);
    CHECK_EQ_INT(int_of(w.json, "length"), c.L);
    json_decref(w.json);
    json_decref(p0.json);
    json_decref(p1.json);
    hf_case_free(&c);
    api_sessions_free(reg);
}

/* expect_length is the length of the layer's own cache: a layer stepped twice for one token,
 * or skipped, is 409 on its next step; a step that names no layer, or one past the last, is
 * refused naming "layer"; a session of another number of layers naming "session". */
static void test_each_layer_keeps_its_own_length(void)
{
    hf_case c;
    api_sessions *reg = llama_registry((size_t)32 << 20, &c);
    if (!reg)
        return;
    char id[40];
    create(reg, "llama", id);
    int64_t n = PREFILL;
    for (int64_t l = 0; l < LAYERS; l++) {
        result r = step(reg, id, &c, 0, n, l);
        CHECK_EQ_INT(r.status, 200);
        json_decref(r.json);
    }
    result r = step(reg, id, &c, n, 1, 0); /* token n through layer 0 */
    CHECK_EQ_INT(r.status, 200);
    json_decref(r.json);
    r = step(reg, id, &c, n, 1, 0); /* ... again: layer 0 holds n + 1 */
    CHECKF(r.status == 409 && strcmp(test_error_field(&r), "expect_length") == 0 &&
               message_has(&r, "layer 0 of the session holds 13 tokens"),
           "a repeated layer: %d %s", r.status, error_message(&r) ? error_message(&r) : "");
    json_decref(r.json);
    r = step(reg, id, &c, n + 1, 1, 0); /* token n + 1 through layer 0, layer 1 skipped */
    CHECK_EQ_INT(r.status, 200);
    json_decref(r.json);
    r = step(reg, id, &c, n + 1, 1, 1); /* layer 1 still holds n */
    CHECKF(r.status == 409 && message_has(&r, "layer 1 of the session holds 12 tokens"),
           "a skipped layer: %d %s", r.status, error_message(&r) ? error_message(&r) : "");
    json_decref(r.json);
    int64_t want[LAYERS] = {n + 2, n};
    CHECK(lengths_are(reg, id, want));

    r = step(reg, id, &c, n, 1, -1);
    CHECK(r.status == 422 && strcmp(test_error_field(&r), "layer") == 0);
    json_decref(r.json);
    r = step(reg, id, &c, n, 1, LAYERS);
    CHECK(r.status == 422 && strcmp(test_error_field(&r), "layer") == 0);
    json_decref(r.json);
    /* The session is the whole model's: a one-layer model's steps may not use it, nor may
     * /v1/sessions/{id}/attention, whose steps are one cache's. */
    char fields[128];
    snprintf(fields, sizeof fields, "\"session\":\"%s\",\"model\":\"llama_1\"", id);
    r = mha(reg, &c, n, 1, "flat", fields);
    CHECK(r.status == 422 && strcmp(test_error_field(&r), "session") == 0);
    json_decref(r.json);
    r = call_route(api_session_attention, reg, NULL, id,
                   "{\"query\":[[1,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0]]}");
    CHECK(r.status == 422 && strcmp(test_error_field(&r), "session") == 0);
    json_decref(r.json);
    /* ... and a session of one cache may not be a layer of the whole model. */
    char one[40];
    create(reg, "llama_0", one);
    snprintf(fields, sizeof fields, "\"session\":\"%s\",\"model\":\"llama\",\"layer\":0", one);
    r = mha(reg, &c, 0, 1, "flat", fields);
    CHECKF(r.status == 422 && strcmp(test_error_field(&r), "session") == 0, "%d", r.status);
    json_decref(r.json);
    hf_case_free(&c);
    api_sessions_free(reg);
}

/* Truncate and fork take every layer's cache; the fork steps as the original does. */
static void test_truncate_and_fork_take_every_layer(void)
{
    hf_case c;
    api_sessions *reg = llama_registry((size_t)32 << 20, &c);
    if (!reg)
        return;
    char id[40], path[64];
    create(reg, "llama", id);
    for (int64_t l = 0; l < LAYERS; l++) {
        result r = step(reg, id, &c, 0, PREFILL, l);
        json_decref(r.json);
    }
    result r = step(reg, id, &c, PREFILL, 1, 0);
    json_decref(r.json);
    snprintf(path, sizeof path, "%s", id);
    r = call_route(api_session_truncate, reg, NULL, path, "{\"length\":13}");
    CHECKF(r.status == 422 && message_has(&r, "in every layer"), "past the shortest: %d", r.status);
    json_decref(r.json);
    r = call_route(api_session_truncate, reg, NULL, path, "{\"length\":5,\"expect_length\":12}");
    CHECK_EQ_INT(r.status, 200);
    json_decref(r.json);
    int64_t five[LAYERS] = {5, 5};
    CHECK(lengths_are(reg, id, five));
    r = call_route(api_session_fork, reg, NULL, path, "");
    const char *child = json_string_value(json_object_get(r.json, "id"));
    char kid[40];
    snprintf(kid, sizeof kid, "%s", r.status == 201 && child ? child : "");
    CHECK_EQ_INT(r.status, 201);
    CHECK_EQ_INT(int_of(r.json, "layers"), LAYERS);
    json_decref(r.json);
    CHECK(lengths_are(reg, kid, five));
    for (int64_t l = 0; l < LAYERS; l++) {
        result a = step(reg, id, &c, 5, 1, l), b = step(reg, kid, &c, 5, 1, l);
        CHECKF(same_bits(&a, &b), "the fork's layer %lld: %d %d", (long long)l, a.status, b.status);
        json_decref(a.json);
        json_decref(b.json);
    }
    hf_case_free(&c);
    api_sessions_free(reg);
}

/* The pool counts a session's every layer, and evicting it frees them all. A llama cache block
 * is 16 tokens x 2 kv heads x (16 + 16) x 4 bytes = 4 KiB: the 20 tokens of a session take two
 * blocks per layer, 16 KiB in all, and a pool of 24 KiB holds one such session. */
static void test_eviction_frees_every_layer(void)
{
    enum { BLOCK = 16 * 2 * 32 * 4 };
    hf_case c;
    api_sessions *reg = llama_registry(6 * BLOCK, &c);
    if (!reg)
        return;
    char a[40], b[40];
    api_sessions_stats st;
    create(reg, "llama", a);
    create(reg, "llama", b);
    for (int64_t l = 0; l < LAYERS; l++) {
        result r = step(reg, a, &c, 0, c.L, l);
        CHECK_EQ_INT(r.status, 200);
        json_decref(r.json);
    }
    api_sessions_stats_get(reg, &st);
    CHECK_EQ_INT((int64_t)st.bytes_used, 4 * BLOCK);
    for (int64_t l = 0; l < LAYERS; l++) { /* layer 1's blocks need a's room */
        result r = step(reg, b, &c, 0, c.L, l);
        CHECKF(r.status == 200, "b's layer %lld: %d %s", (long long)l, r.status,
               error_message(&r) ? error_message(&r) : "");
        json_decref(r.json);
    }
    api_sessions_stats_get(reg, &st);
    CHECK_EQ_INT((int64_t)st.bytes_used, 4 * BLOCK);
    CHECK_EQ_INT(st.evicted_pressure, 1);
    CHECK_EQ_INT(st.live, 1);
    result gone = describe_session(reg, a);
    CHECK_EQ_INT(gone.status, 404);
    json_decref(gone.json);
    int64_t full[LAYERS] = {c.L, c.L};
    CHECK(lengths_are(reg, b, full));
    hf_case_free(&c);
    api_sessions_free(reg);
}

/* ---- A KServe v2 sequence over the layers ------------------------------------------------- */

/* A v2 sequence of "llama" stepped like a /v1/mha session of it: the same numbers at every
 * layer of every step. sequence_start makes every layer's cache, sequence_end (on the last
 * layer of the last token) ends the sequence. */
static void test_v2_sequence_steps_every_layer(void)
{
    hf_case c;
    api_sessions *reg = llama_registry((size_t)32 << 20, &c);
    if (!reg)
        return;
    char id[40];
    create(reg, "llama", id);
    bool ok = true;
    for (int64_t t0 = 0; ok && t0 < c.L; t0 += t0 == 0 ? PREFILL : 1) {
        int64_t n = t0 == 0 ? PREFILL : 1;
        for (int64_t l = 0; ok && l < LAYERS; l++) {
            char params[128], fields[128];
            bool last = t0 + n == c.L && l == LAYERS - 1;
            snprintf(params, sizeof params, "\"sequence_id\":7,\"layer\":%lld%s%s", (long long)l,
                     t0 == 0 && l == 0 ? ",\"sequence_start\":true" : "",
                     last ? ",\"sequence_end\":true" : "");
            snprintf(fields, sizeof fields, "\"session\":\"%s\",\"layer\":%lld", id, (long long)l);
            result v = v2_infer(reg, "llama", &c, t0, n, params);
            result f = mha(reg, &c, t0, n, "flat", fields);
            ok = v2_same(&v, &f);
            CHECKF(ok, "sequence layer %lld at %lld: %d %s", (long long)l, (long long)t0, v.status,
                   error_message(&v) ? error_message(&v) : "");
            json_decref(v.json);
            json_decref(f.json);
        }
    }
    /* Ended: a request of the sequence needs a new start. */
    result v = v2_infer(reg, "llama", &c, 0, 1, "\"sequence_id\":7,\"layer\":0");
    CHECKF(v.status == 400 && message_has(&v, "START"), "after the end: %d", v.status);
    json_decref(v.json);
    /* A sequence's request names its layer as any other. */
    v = v2_infer(reg, "llama", &c, 0, 1, "\"sequence_id\":8,\"sequence_start\":true");
    CHECKF(v.status == 400 && message_has(&v, "layer"), "no layer: %d", v.status);
    json_decref(v.json);
    hf_case_free(&c);
    api_sessions_free(reg);
}

int main(void)
{
    eng_error err;
    cases_dir = hf_cases_dir();
    pool = eng_pool_new(2, &err);
    models = api_models_new();
    if (!pool || !models || !register_all()) {
        printf("FAIL set-up\n0 passed, 1 failed\n");
        return 1;
    }
    RUN_WITHIN(test_every_layer_is_the_one_layer_models_bits, 120);
    RUN_WITHIN(test_the_model_describes_every_layer, 30);
    RUN_WITHIN(test_a_request_names_its_layer, 30);
    RUN_WITHIN(test_one_session_steps_every_layer, 60);
    RUN_WITHIN(test_each_layer_keeps_its_own_length, 30);
    RUN_WITHIN(test_truncate_and_fork_take_every_layer, 30);
    RUN_WITHIN(test_eviction_frees_every_layer, 30);
    RUN_WITHIN(test_v2_sequence_steps_every_layer, 60);
    api_models_free(models);
    eng_pool_free(pool);
    return check_report();
}
