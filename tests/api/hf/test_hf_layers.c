/* test_hf_layers.c - the attention of a Hugging Face checkpoint's layer, as transformers
 * computes it: tests/api/hf/cases/<family>/ holds a tiny checkpoint of each family (made by
 * transformers 5.17 from random bf16 weights by tests/api/hf/make_cases.py; cases/README.md) and
 * attnd_case.json with the input and output of one layer's attention module in the model's own
 * forward pass. Each is loaded with api_models_load (what --model NAME=DIR:layer=K does) and
 * must reproduce that output within 1e-5 x max|output|: through POST /v1/mha {"model", "input"},
 * and again by a session (POST /v1/sessions {"model"}) stepped by a prefill and then one token
 * at a time, and through the v2 route with a sequence_id. GET /v1/models/NAME describes the
 * layer, and a request that contradicts it is 422 naming the field. The refusals at load (the
 * config, the index, the shards, the tensors) are tests/api/hf/test_hf_refusals.c's. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "api/models/hf.h"
#include "tests/support/check.h"
#include "tests/support/daemon.h"
#include "tests/support/hf_case.h"
#include "tests/support/rng.h"
#include "tests/support/route.h"
#include "tests/support/safetensors_writer.h"
#include "tests/support/util.h"

#define RTOL    1e-5
#define PREFILL 12 /* tokens of the first session step; the rest go one at a time */

static eng_pool *pool;
static api_models *models;
static const char *cases_dir;

typedef test_reply result;

/* ---- Set-up ------------------------------------------------------------------------------- */

/* Registers every family's layer under its case name. */
static bool register_all(void)
{
    for (size_t i = 0; i < HF_FAMILIES; i++) {
        hf_case c;
        if (!hf_case_read(cases_dir, hf_families[i], &c))
            return false;
        bool ok = hf_case_serve(models, cases_dir, hf_families[i], hf_families[i], c.layer);
        hf_case_free(&c);
        if (!ok)
            return false;
    }
    return true;
}

/* ---- Calls -------------------------------------------------------------------------------- */

static result call_route(void (*fn)(const api_call *, api_reply *), api_sessions *reg,
                         const char *model, const char *body)
{
    api_call call = test_json_call(pool, models, reg, body);
    call.model = model;
    return test_route(fn, &call);
}

/* A body {"model", "input": rows [t0, t0 + n) of x, "output_encoding": "flat", extra}. */
static char *mha_body(const char *model, const hf_case *c, int64_t t0, int64_t n, const char *extra)
{
    int64_t shape[2] = {n, c->E};
    char *t = json_tensor_b64(c->input + t0 * c->E, shape, 2);
    size_t len = strlen(t) + strlen(extra) + 256;
    char *b = malloc(len);
    snprintf(b, len, "{\"model\":\"%s\",\"input\":%s,\"output_encoding\":\"flat\"%s}", model, t,
             extra);
    free(t);
    return b;
}

/* max |got - want| / max |want| of a flat reply over rows [t0, t0 + n) of the reference. */
static double rel_error(const json_t *reply, const hf_case *c, int64_t t0, int64_t n)
{
    return hf_case_error(json_object_get(json_object_get(reply, "output"), "data"), c, t0, n);
}

/* Model `name` over the case's whole input through /v1/mha: max|diff| / max|output| against
 * transformers, INFINITY when the reply (its status in *status) is not 200. */
static double mha_error(const char *name, const hf_case *c, int *status)
{
    char *body = mha_body(name, c, 0, c->L, "");
    result r = call_route(api_mha, NULL, NULL, body);
    double err = r.status == 200 ? rel_error(r.json, c, 0, c->L) : INFINITY;
    *status = r.status;
    json_decref(r.json);
    free(body);
    return err;
}

/* Layer c->layer of the checkpoint in `dir`, loaded and added as model `name`, through
 * /v1/mha (mha_error); INFINITY with the reason in err when it was not served. */
static double checkpoint_error(const char *name, const char *dir, const hf_case *c, int *status,
                               char *err, size_t err_len)
{
    *status = 0;
    eng_layer *l = api_checkpoint_load(name, dir, c->layer, NULL, err, err_len);
    if (!l || !api_models_add(models, l, err, err_len))
        return INFINITY;
    err[0] = '\0';
    return mha_error(name, c, status);
}

/* GET /v1/models/NAME. */
static result describe(const char *name)
{
    api_reply reply;
    api_models_get(models, name, &reply);
    return test_reply_take(&reply);
}

/* ---- The layer ---------------------------------------------------------------------------- */

static void test_each_family_matches_transformers_through_v1_mha(void)
{
    for (size_t i = 0; i < HF_FAMILIES; i++) {
        hf_case c;
        if (!hf_case_read(cases_dir, hf_families[i], &c))
            continue;
        int status;
        double err = mha_error(hf_families[i], &c, &status);
        printf("  %-16s /v1/mha          max|diff|/max|out| = %.2e\n", hf_families[i], err);
        CHECKF(err <= RTOL, "%s: /v1/mha status %d, error %.3g x max|output|", hf_families[i],
               status, err);
        hf_case_free(&c);
    }
}

/* One family through a session: a prefill of PREFILL tokens, then one token per step. */
static double session_error(const char *family, const hf_case *c, api_sessions *reg)
{
    char body[128];
    snprintf(body, sizeof body, "{\"model\":\"%s\"}", family);
    result s = call_route(api_sessions_create, reg, NULL, body);
    const char *id = json_string_value(json_object_get(s.json, "id"));
    CHECKF(s.status == 201 && id, "%s: session create %d", family, s.status);
    double worst = s.status == 201 && id ? 0 : INFINITY;
    char sid[64];
    snprintf(sid, sizeof sid, "%s", id ? id : "");
    json_decref(s.json);
    for (int64_t t0 = 0; t0 < c->L && isfinite(worst);) {
        int64_t n = t0 == 0 ? PREFILL : 1;
        char extra[128];
        snprintf(extra, sizeof extra, ",\"session\":\"%s\",\"expect_length\":%lld", sid,
                 (long long)t0);
        char *b = mha_body(family, c, t0, n, extra);
        result r = call_route(api_mha, reg, NULL, b);
        double e = r.status == 200 ? rel_error(r.json, c, t0, n) : INFINITY;
        CHECKF(r.status == 200, "%s: step at %lld: %d", family, (long long)t0, r.status);
        worst = fmax(worst, e);
        json_decref(r.json);
        free(b);
        t0 += n;
    }
    return worst;
}

static api_sessions *registry(void)
{
    return test_sessions_new((size_t)32 << 20);
}

static void test_each_family_matches_transformers_step_by_step(void)
{
    api_sessions *reg = registry();
    for (size_t i = 0; reg && i < HF_FAMILIES; i++) {
        hf_case c;
        if (!hf_case_read(cases_dir, hf_families[i], &c))
            continue;
        double err = session_error(hf_families[i], &c, reg);
        printf("  %-16s session steps    max|diff|/max|out| = %.2e\n", hf_families[i], err);
        CHECKF(err <= RTOL, "%s: session steps: error %.3g x max|output|", hf_families[i], err);
        hf_case_free(&c);
    }
    api_sessions_free(reg);
}

/* One family through SEQS sessions stepped together: the same prefill in each, then each
 * token's steps as one batch (api_call_batch, one engine call): every session's output is the
 * reference's. */
enum { SEQS = 3 };

static double batched_error(const char *family, const hf_case *c, api_sessions *reg)
{
    char body[128], sid[SEQS][64];
    double worst = 0;
    snprintf(body, sizeof body, "{\"model\":\"%s\"}", family);
    for (int s = 0; s < SEQS; s++) {
        result r = call_route(api_sessions_create, reg, NULL, body);
        const char *id = json_string_value(json_object_get(r.json, "id"));
        CHECKF(r.status == 201 && id, "%s: session create %d", family, r.status);
        snprintf(sid[s], sizeof sid[s], "%s", id ? id : "");
        json_decref(r.json);
    }
    for (int64_t t0 = 0; t0 < c->L && isfinite(worst);) {
        int64_t n = t0 == 0 ? PREFILL : 1;
        char *b[SEQS];
        api_call calls[SEQS];
        api_reply replies[SEQS];
        api_batch_member m[SEQS];
        for (int s = 0; s < SEQS; s++) {
            char extra[256];
            snprintf(extra, sizeof extra, ",\"session\":\"%s\",\"expect_length\":%lld", sid[s],
                     (long long)t0);
            b[s] = mha_body(family, c, t0, n, extra);
            calls[s] = test_json_call(pool, models, reg, b[s]);
            m[s] = (api_batch_member){API_BATCH_MHA, &calls[s], &replies[s]};
        }
        api_call_batch(m, SEQS, 64);
        for (int s = 0; s < SEQS; s++) {
            json_t *j = json_loadb(replies[s].body, replies[s].body_len, 0, NULL);
            double e = replies[s].status == 200 && j ? rel_error(j, c, t0, n) : INFINITY;
            CHECKF(replies[s].status == 200, "%s: batched step at %lld: %d", family, (long long)t0,
                   replies[s].status);
            worst = fmax(worst, e);
            json_decref(j);
            api_reply_free(&replies[s]);
            free(b[s]);
        }
        t0 += n;
    }
    return worst;
}

static void test_each_family_matches_transformers_in_batched_steps(void)
{
    api_sessions *reg = registry();
    for (size_t i = 0; reg && i < HF_FAMILIES; i++) {
        hf_case c;
        if (!hf_case_read(cases_dir, hf_families[i], &c))
            continue;
        double err = batched_error(hf_families[i], &c, reg);
        printf("  %-16s batched steps    max|diff|/max|out| = %.2e\n", hf_families[i], err);
        CHECKF(err <= RTOL, "%s: batched steps: error %.3g x max|output|", hf_families[i], err);
        hf_case_free(&c);
    }
    api_sessions_free(reg);
}

/* ---- What the layer says, and what contradicts it ----------------------------------------- */

static void test_models_describe_the_checkpoint_layer(void)
{
    result r = describe("gemma3");
    const json_t *d = json_object_get(r.json, "decoder");
    CHECK(r.status == 200);
    CHECK(json_is_object(d));
    CHECK(strcmp(json_string_value(json_object_get(d, "family")), "gemma3_text") == 0);
    CHECK_EQ_INT(json_integer_value(json_object_get(d, "layer")), 1);
    CHECK_EQ_INT(json_integer_value(json_object_get(d, "sliding_window")), 8);
    CHECK(strcmp(json_string_value(json_object_get(d, "positional")), "rope") == 0);
    CHECK_EQ_INT(json_integer_value(json_object_get(r.json, "num_kv_heads")), 2);
    CHECK(strcmp(json_string_value(json_object_get(r.json, "dtype")), "BF16") == 0);
    json_decref(r.json);
    r = describe("gpt2");
    d = json_object_get(r.json, "decoder");
    CHECK(strcmp(json_string_value(json_object_get(d, "positional")), "none") == 0);
    CHECK(json_is_null(json_object_get(d, "window")));
    json_decref(r.json);
}

static void test_requests_that_contradict_the_layer_are_422(void)
{
    static const struct {
        const char *model, *extra, *field;
    } cases[] = {
        {"llama", ",\"positional\":\"rope\"", "positional"},
        {"llama", ",\"causal\":false", "causal"},
        {"mistral_window", ",\"window\":[3,0]", "window"},
        {"llama", ",\"window\":[3,0]", "window"},
        {"gpt_oss", ",\"return_weights\":\"per_head\"", "return_weights"},
    };
    hf_case c;
    if (!hf_case_read(cases_dir, "llama", &c))
        return;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *b = mha_body(cases[i].model, &c, 0, 4, cases[i].extra);
        result r = call_route(api_mha, NULL, NULL, b);
        CHECKF(r.status == 422, "%s %s: %d", cases[i].model, cases[i].extra, r.status);
        CHECKF(test_error_field(&r) && strcmp(test_error_field(&r), cases[i].field) == 0,
               "%s %s: field %s", cases[i].model, cases[i].extra,
               test_error_field(&r) ? test_error_field(&r) : "(none)");
        json_decref(r.json);
        free(b);
    }
    /* Nor may a session of the layer carry another window into its steps. */
    char sid[64] = "";
    api_sessions *reg = registry();
    result made = call_route(api_sessions_create, reg, NULL,
                             "{\"model\":\"mistral_window\",\"window\":[2,0]}");
    if (made.status == 201)
        snprintf(sid, sizeof sid, "%s", json_string_value(json_object_get(made.json, "id")));
    json_decref(made.json);
    char extra[128];
    snprintf(extra, sizeof extra, ",\"session\":\"%s\"", sid);
    char *sb = mha_body("mistral_window", &c, 0, 4, extra);
    result step = call_route(api_mha, reg, NULL, sb);
    CHECKF(made.status != 201 || (step.status == 422 && test_error_field(&step) &&
                                  strcmp(test_error_field(&step), "window") == 0),
           "a step of a session with another window: %d", step.status);
    json_decref(step.json);
    free(sb);
    /* ... or make its steps non-causal. */
    made = call_route(api_sessions_create, reg, NULL, "{\"model\":\"llama\",\"causal\":false}");
    if (made.status == 201)
        snprintf(sid, sizeof sid, "%s", json_string_value(json_object_get(made.json, "id")));
    json_decref(made.json);
    snprintf(extra, sizeof extra, ",\"session\":\"%s\"", sid);
    sb = mha_body("llama", &c, 0, 4, extra);
    step = call_route(api_mha, reg, NULL, sb);
    CHECKF(made.status != 201 || (step.status == 422 && test_error_field(&step) &&
                                  strcmp(test_error_field(&step), "causal") == 0),
           "a step of a non-causal session: %d", step.status);
    json_decref(step.json);
    free(sb);
    api_sessions_free(reg);
    /* The layer's own window restated is no contradiction. */
    char *b = mha_body("mistral_window", &c, 0, 4, ",\"window\":[7,0],\"causal\":true");
    result r = call_route(api_mha, NULL, NULL, b);
    CHECK_EQ_INT(r.status, 200);
    json_decref(r.json);
    free(b);
    hf_case_free(&c);
}

/* ---- KServe v2 ---------------------------------------------------------------------------- */

/* A v2 inference of `model` on rows [t0, t0 + n) of the case's input as [1, n, E], with the
 * parameters `params` (or none). */
static result v2_infer(api_sessions *reg, const char *model, const hf_case *c, int64_t t0,
                       int64_t n, const char *params)
{
    char *b = hf_case_v2_body(c, t0, n, params);
    result r = call_route(api_v2_infer, reg, model, b);
    free(b);
    return r;
}

static double v2_error(const result *r, const hf_case *c, int64_t t0, int64_t n)
{
    const json_t *out = json_array_get(json_object_get(r->json, "outputs"), 0);
    return r->status == 200 ? hf_case_error(json_object_get(out, "data"), c, t0, n) : INFINITY;
}

static void test_v2_infers_and_decodes_a_sequence_as_transformers(void)
{
    static const char *const some[] = {"gemma2", "gpt_oss", "phi"};
    api_sessions *reg = registry();
    for (size_t i = 0; reg && i < sizeof some / sizeof some[0]; i++) {
        hf_case c;
        if (!hf_case_read(cases_dir, some[i], &c))
            continue;
        result r = v2_infer(NULL, some[i], &c, 0, c.L, "");
        double whole = v2_error(&r, &c, 0, c.L), steps = 0;
        json_decref(r.json);
        for (int64_t t0 = 0; t0 < c.L; t0 += t0 == 0 ? PREFILL : 1) {
            char params[128];
            snprintf(params, sizeof params, "\"sequence_id\":%zu%s", i + 1,
                     t0 == 0 ? ",\"sequence_start\":true" : "");
            r = v2_infer(reg, some[i], &c, t0, t0 == 0 ? PREFILL : 1, params);
            steps = fmax(steps, v2_error(&r, &c, t0, t0 == 0 ? PREFILL : 1));
            json_decref(r.json);
        }
        CHECKF(whole <= RTOL && steps <= RTOL, "%s: v2 %.3g, v2 sequence %.3g x max|output|",
               some[i], whole, steps);
        hf_case_free(&c);
    }
    api_sessions_free(reg);
}

static void test_v2_metadata_and_config_describe_the_layer(void)
{
    api_call call = {.pool = pool, .models = models, .model = "gpt_oss"};
    api_reply reply;
    api_v2_model_metadata(&call, &reply);
    json_t *j = json_loadb(reply.body, reply.body_len, 0, NULL);
    api_reply_free(&reply);
    const json_t *p = json_object_get(j, "parameters");
    CHECK(strcmp(json_string_value(json_object_get(p, "family")), "gpt_oss") == 0);
    CHECK_EQ_INT(json_integer_value(json_object_get(p, "layer")), 1);
    CHECK_EQ_INT(json_integer_value(json_object_get(p, "window")), 0); /* layer 1 is full */
    CHECK(strcmp(json_string_value(json_object_get(p, "positional")), "rope") == 0);
    CHECK_EQ_INT(json_array_size(json_object_get(j, "inputs")), 3); /* no memory input */
    json_decref(j);
    call.model = "mistral_window";
    api_v2_model_config(&call, &reply);
    j = json_loadb(reply.body, reply.body_len, 0, NULL);
    api_reply_free(&reply);
    p = json_object_get(json_object_get(j, "parameters"), "window");
    CHECK(strcmp(json_string_value(json_object_get(p, "string_value")), "8") == 0);
    json_decref(j);
}

/* ---- transformers 4 configs ---------------------------------------------------------------- */

/* `cfg` (5.x) rewritten as transformers 4 wrote it: rope_theta (GPT-NeoX: rotary_emb_base) and
 * partial_rotary_factor (GPT-NeoX: rotary_pct) at the top, scaling in rope_scaling, Gemma 3's
 * local base in rope_local_base_freq, and no layer_types where the family's older keys say
 * which layers slide. */
static void to_v4(json_t *cfg)
{
    const char *type = json_string_value(json_object_get(cfg, "model_type"));
    bool neox = strcmp(type, "gpt_neox") == 0;
    json_t *p = json_incref(json_object_get(cfg, "rope_parameters"));
    json_object_del(cfg, "rope_parameters");
    if (json_object_get(p, "full_attention")) {
        json_object_set(cfg, "rope_theta",
                        json_object_get(json_object_get(p, "full_attention"), "rope_theta"));
        json_object_set(cfg, "rope_local_base_freq",
                        json_object_get(json_object_get(p, "sliding_attention"), "rope_theta"));
        json_object_set_new(cfg, "sliding_window_pattern", json_integer(6));
    } else if (p) {
        json_object_set(cfg, neox ? "rotary_emb_base" : "rope_theta",
                        json_object_get(p, "rope_theta"));
        if (json_object_get(p, "partial_rotary_factor"))
            json_object_set(cfg, neox ? "rotary_pct" : "partial_rotary_factor",
                            json_object_get(p, "partial_rotary_factor"));
        json_object_del(p, "rope_theta");
        json_object_del(p, "partial_rotary_factor");
        const char *rt = json_string_value(json_object_get(p, "rope_type"));
        if (rt && strcmp(rt, "default") != 0)
            json_object_set(cfg, "rope_scaling", p);
    }
    json_decref(p);
    if (strcmp(type, "gpt_oss") != 0)
        json_object_del(cfg, "layer_types");
}

static void test_transformers_4_configs_give_the_same_layers(void)
{
    static const char *const some[] = {"llama31_scaled", "gemma3", "gemma2",
                                       "gpt_neox",       "phi",    "stablelm",
                                       "gpt_oss",        "qwen2",  "mistral_window"};
    char tmp[] = "/tmp/attnd_hf_v4_XXXXXX";
    CHECK(mkdtemp(tmp) != NULL);
    for (size_t i = 0; i < sizeof some / sizeof some[0]; i++) {
        hf_case c;
        char dir[128], path[256], from[256], name[64], err[600], cmd[800];
        if (!hf_case_read(cases_dir, some[i], &c))
            continue;
        snprintf(dir, sizeof dir, "%s/%s", tmp, some[i]);
        snprintf(from, sizeof from, "%s/%s", cases_dir, some[i]);
        snprintf(cmd, sizeof cmd, "cp -r '%s' '%s' && chmod -R u+w '%s'", from, dir, dir);
        CHECK(system(cmd) == 0);
        snprintf(path, sizeof path, "%s/config.json", dir);
        json_t *cfg = json_load_file(path, 0, NULL);
        to_v4(cfg);
        CHECK(json_dump_file(cfg, path, 0) == 0);
        json_decref(cfg);
        snprintf(name, sizeof name, "v4_%s", some[i]);
        int status;
        double e = checkpoint_error(name, dir, &c, &status, err, sizeof err);
        CHECKF(e <= RTOL, "%s (4.x config): %d, %.3g x max|output| %s", some[i], status, e, err);
        hf_case_free(&c);
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    CHECK(system(cmd) == 0);
}

/* Phi-3's LongRoPE at short factors of 1 (and a context that did not grow: attention factor
 * 1) is the default RoPE: the phi3 reference again. Past original_max_position_embeddings
 * (4096), where transformers would switch to the long factors, a request is 422 "input". */
static void test_longrope_at_its_short_factors(void)
{
    char tmp[] = "/tmp/attnd_hf_longrope_XXXXXX", cmd[400], path[128], err[600];
    hf_case c;
    if (!mkdtemp(tmp) || !hf_case_read(cases_dir, "phi3", &c))
        return;
    snprintf(cmd, sizeof cmd, "cp %s/phi3/* '%s' && chmod -R u+w '%s'", cases_dir, tmp, tmp);
    CHECK(system(cmd) == 0);
    snprintf(path, sizeof path, "%s/config.json", tmp);
    json_t *cfg = json_load_file(path, 0, NULL);
    json_object_set_new(cfg, "rope_parameters",
                        json_pack("{s:s,s:f,s:[f,f,f,f,f,f,f,f],s:[f,f,f,f,f,f,f,f]}", "rope_type",
                                  "longrope", "rope_theta", 10000.0, "short_factor", 1.0, 1.0, 1.0,
                                  1.0, 1.0, 1.0, 1.0, 1.0, "long_factor", 4.0, 4.0, 4.0, 4.0, 4.0,
                                  4.0, 4.0, 4.0));
    CHECK(json_dump_file(cfg, path, 0) == 0);
    json_decref(cfg);
    eng_layer *l = api_checkpoint_load("longrope", tmp, c.layer, NULL, err, sizeof err);
    CHECKF(l != NULL, "%s", err);
    if (l && api_models_add(models, l, err, sizeof err)) {
        char *b = mha_body("longrope", &c, 0, c.L, "");
        result r = call_route(api_mha, NULL, NULL, b);
        double e = r.status == 200 ? rel_error(r.json, &c, 0, c.L) : INFINITY;
        CHECKF(e <= RTOL, "longrope: %d, %.3g x max|output|", r.status, e);
        json_decref(r.json);
        free(b);
        b = mha_body("longrope", &c, 0, c.L, ",\"query_offset\":4090");
        r = call_route(api_mha, NULL, NULL, b);
        CHECKF(r.status == 422 && test_error_field(&r) &&
                   strcmp(test_error_field(&r), "input") == 0,
               "longrope past its context: %d", r.status);
        json_decref(r.json);
        free(b);
    }
    hf_case_free(&c);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    CHECK(system(cmd) == 0);
}

/* Dynamic NTK keeps the default frequencies while the sequence stays within
 * max_position_embeddings (256 here): the llama reference again; past it a request is 422. */
static void test_dynamic_ntk_below_its_context(void)
{
    char tmp[] = "/tmp/attnd_hf_dynamic_XXXXXX", cmd[400], path[128], err[600];
    hf_case c;
    if (!mkdtemp(tmp) || !hf_case_read(cases_dir, "llama31_scaled", &c))
        return;
    snprintf(cmd, sizeof cmd, "cp %s/llama31_scaled/* '%s' && chmod -R u+w '%s'", cases_dir, tmp,
             tmp);
    CHECK(system(cmd) == 0);
    snprintf(path, sizeof path, "%s/config.json", tmp);
    json_t *cfg = json_load_file(path, 0, NULL);
    json_object_set_new(
        cfg, "rope_parameters",
        json_pack("{s:s,s:f,s:f}", "rope_type", "dynamic", "rope_theta", 500000.0, "factor", 4.0));
    CHECK(json_dump_file(cfg, path, 0) == 0);
    json_decref(cfg);
    eng_layer *l = api_checkpoint_load("dynamic", tmp, c.layer, NULL, err, sizeof err);
    CHECKF(l != NULL, "%s", err);
    /* The reference of the llama3-scaled layer differs from plain RoPE: recompute it as the
     * plain layer gives it, then compare dynamic with that. */
    cfg = json_load_file(path, 0, NULL);
    json_object_set_new(cfg, "rope_parameters",
                        json_pack("{s:s,s:f}", "rope_type", "default", "rope_theta", 500000.0));
    CHECK(json_dump_file(cfg, path, 0) == 0);
    json_decref(cfg);
    eng_layer *plain = api_checkpoint_load("plain_rope", tmp, c.layer, NULL, err, sizeof err);
    CHECKF(plain != NULL, "%s", err);
    if (l && plain && api_models_add(models, l, err, sizeof err) &&
        api_models_add(models, plain, err, sizeof err)) {
        char *b = mha_body("plain_rope", &c, 0, c.L, "");
        result r = call_route(api_mha, NULL, NULL, b);
        const json_t *data = json_object_get(json_object_get(r.json, "output"), "data");
        for (int64_t i = 0; i < c.L * c.E && json_array_size(data) == (size_t)(c.L * c.E); i++)
            c.output[i] = (float)json_number_value(json_array_get(data, (size_t)i));
        json_decref(r.json);
        free(b);
        b = mha_body("dynamic", &c, 0, c.L, "");
        r = call_route(api_mha, NULL, NULL, b);
        double e = r.status == 200 ? rel_error(r.json, &c, 0, c.L) : INFINITY;
        CHECKF(e <= 1e-7, "dynamic below its context: %d, %.3g x max|output| from plain", r.status,
               e);
        json_decref(r.json);
        free(b);
        b = mha_body("dynamic", &c, 0, c.L, ",\"query_offset\":240");
        r = call_route(api_mha, NULL, NULL, b);
        CHECKF(r.status == 422 && test_error_field(&r) &&
                   strcmp(test_error_field(&r), "input") == 0,
               "dynamic past its context: %d", r.status);
        json_decref(r.json);
        free(b);
    } else {
        eng_layer_free(plain);
    }
    hf_case_free(&c);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    CHECK(system(cmd) == 0);
}

/* ---- Heads of their own size ----------------------------------------------------------- */

/* A Qwen 3 layer whose heads are wider than the hidden size splits (head_dim 32, 4 heads over
 * a hidden size of 64, as Qwen3-0.6B has 16 x 128 over 1024), written as a checkpoint into
 * `dir`. */
static bool write_wide_qwen3(const char *dir)
{
    enum { HID = 64, HEADS = 4, KV = 2, HDIM = 32 };
    static float q[HEADS * HDIM * HID], k[KV * HDIM * HID], v[KV * HDIM * HID],
        o[HID * HEADS * HDIM];
    static float qn[HDIM], kn[HDIM];
    uint64_t rng = 99;
    float *all[] = {q, k, v, o, qn, kn};
    size_t sizes[] = {sizeof q, sizeof k, sizeof v, sizeof o, sizeof qn, sizeof kn};
    for (int i = 0; i < 6; i++)
        for (size_t j = 0; j < sizes[i] / sizeof(float); j++)
            all[i][j] = (i >= 4 ? 1.0f : 0.0f) + rng_sym(&rng, 0.125);
    const stw_tensor t[] = {
        {"model.layers.0.self_attn.q_proj.weight", STW_BF16, 2, {HEADS * HDIM, HID}, q},
        {"model.layers.0.self_attn.k_proj.weight", STW_BF16, 2, {KV * HDIM, HID}, k},
        {"model.layers.0.self_attn.v_proj.weight", STW_BF16, 2, {KV * HDIM, HID}, v},
        {"model.layers.0.self_attn.o_proj.weight", STW_BF16, 2, {HID, HEADS * HDIM}, o},
        {"model.layers.0.self_attn.q_norm.weight", STW_BF16, 1, {HDIM}, qn},
        {"model.layers.0.self_attn.k_norm.weight", STW_BF16, 1, {HDIM}, kn},
    };
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (!stw_save(path, t, sizeof t / sizeof t[0], NULL, 0))
        return false;
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f)
        return false;
    fprintf(f, "{\"model_type\":\"qwen3\",\"hidden_size\":64,\"num_attention_heads\":4,"
               "\"num_key_value_heads\":2,\"head_dim\":32,\"num_hidden_layers\":1,"
               "\"rms_norm_eps\":1e-6,\"rope_parameters\":{\"rope_type\":\"default\","
               "\"rope_theta\":1000000.0}}");
    return fclose(f) == 0;
}

static void test_heads_wider_than_the_hidden_size_step_as_the_whole(void)
{
    char dir[] = "/tmp/attnd_hf_wide_XXXXXX", err[600];
    CHECK(mkdtemp(dir) != NULL && write_wide_qwen3(dir));
    eng_layer *l = api_checkpoint_load("wide", dir, 0, NULL, err, sizeof err);
    CHECKF(l != NULL, "%s", err);
    if (!l || !api_models_add(models, l, err, sizeof err))
        return;
    result d = describe("wide");
    CHECK_EQ_INT(json_integer_value(json_object_get(d.json, "head_dim")), 32);
    json_decref(d.json);
    /* The reference is the layer over the whole sequence; the steps must give its rows. */
    hf_case c;
    if (!hf_case_read(cases_dir, "qwen3", &c))
        return;
    char *b = mha_body("wide", &c, 0, c.L, "");
    result whole = call_route(api_mha, NULL, NULL, b);
    free(b);
    CHECK_EQ_INT(whole.status, 200);
    const json_t *data = json_object_get(json_object_get(whole.json, "output"), "data");
    for (int64_t i = 0; i < c.L * c.E && json_array_size(data) == (size_t)(c.L * c.E); i++)
        c.output[i] = (float)json_number_value(json_array_get(data, (size_t)i));
    json_decref(whole.json);
    api_sessions *reg = registry();
    double e = reg ? session_error("wide", &c, reg) : INFINITY;
    CHECKF(e <= RTOL, "wide heads: steps %.3g x max|output| from the whole sequence", e);
    api_sessions_free(reg);
    hf_case_free(&c);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

/* ---- Gemma 3 multimodal ------------------------------------------------------------------- */

/* Copies the safetensors file `from` to `to` with every tensor name under "model." moved under
 * `prefix` instead (the data section unchanged, the header padded to 8 bytes again). */
static bool rename_tensors(const char *from, const char *to, const char *prefix)
{
    FILE *f = fopen(from, "rb");
    if (!f)
        return false;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *bytes = size > 8 ? malloc((size_t)size) : NULL;
    bool ok = bytes && fread(bytes, 1, (size_t)size, f) == (size_t)size;
    fclose(f);
    uint64_t n = 0;
    for (int i = 7; ok && i >= 0; i--)
        n = n << 8 | bytes[i];
    json_t *header = ok && n <= (uint64_t)size - 8
                         ? json_loadb((const char *)bytes + 8, (size_t)n, 0, NULL)
                         : NULL;
    json_t *renamed = json_object();
    const char *key;
    json_t *val;
    json_object_foreach(header, key, val)
    {
        char name[256];
        if (strncmp(key, "model.", 6) == 0)
            snprintf(name, sizeof name, "%s%s", prefix, key + 6);
        else
            snprintf(name, sizeof name, "%s", key);
        json_object_set(renamed, name, val);
    }
    char *text = header ? json_dumps(renamed, JSON_COMPACT) : NULL;
    size_t len = text ? strlen(text) : 0, padded = (len + 7) / 8 * 8;
    FILE *out = text ? fopen(to, "wb") : NULL;
    ok = out != NULL;
    for (int i = 0; ok && i < 8; i++)
        ok = fputc((int)((padded >> (8 * i)) & 0xff), out) != EOF;
    ok = ok && fwrite(text, 1, len, out) == len;
    for (size_t i = len; ok && i < padded; i++)
        ok = fputc(' ', out) != EOF;
    ok = ok && fwrite(bytes + 8 + n, 1, (size_t)size - 8 - (size_t)n, out) ==
                   (size_t)size - 8 - (size_t)n;
    if (out)
        ok = fclose(out) == 0 && ok;
    free(text);
    json_decref(renamed);
    json_decref(header);
    free(bytes);
    return ok;
}

/* The gemma3 case as Gemma3ForConditionalGeneration saves it: the text config nested (without
 * the keys whose values are Gemma3TextConfig's defaults, as transformers leaves them out) and
 * the layers under the language model, in both layouts of the tensor names. */
static void test_gemma3_multimodal_checkpoints_serve_their_text_layers(void)
{
    static const char *const prefixes[] = {"model.language_model.", "language_model.model."};
    static const char *const defaults[] = {"rms_norm_eps", "attention_bias",
                                           "attn_logit_softcapping", "rope_parameters"};
    char tmp[] = "/tmp/attnd_hf_gemma3_XXXXXX", path[256], from[256], name[64], err[600];
    hf_case c;
    CHECK(mkdtemp(tmp) != NULL);
    if (!hf_case_read(cases_dir, "gemma3", &c))
        return;
    snprintf(path, sizeof path, "%s/gemma3/config.json", cases_dir);
    json_t *text = json_load_file(path, 0, NULL);
    for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++)
        json_object_del(text, defaults[i]);
    json_t *cfg = json_pack("{s:s, s:[s], s:o}", "model_type", "gemma3", "architectures",
                            "Gemma3ForConditionalGeneration", "text_config", text);
    snprintf(path, sizeof path, "%s/config.json", tmp);
    CHECK(json_dump_file(cfg, path, 0) == 0);
    json_decref(cfg);
    snprintf(from, sizeof from, "%s/gemma3/model.safetensors", cases_dir);
    for (size_t p = 0; p < 2; p++) {
        snprintf(path, sizeof path, "%s/model.safetensors", tmp);
        CHECK(rename_tensors(from, path, prefixes[p]));
        snprintf(name, sizeof name, "gemma3_multimodal_%zu", p);
        int status;
        double e = checkpoint_error(name, tmp, &c, &status, err, sizeof err);
        CHECKF(e <= RTOL, "%s: %d, %.3g x max|output| %s", prefixes[p], status, e, err);
    }
    hf_case_free(&c);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    CHECK(system(cmd) == 0);
}

/* A Gemma 3 text config with nothing in it is Gemma3TextConfig's defaults: 8 heads, 4 kv heads
 * of 256 over a hidden size of 2304, 26 layers of which every sixth is global (RoPE base 1e6,
 * no window) and the rest local (base 1e4, a window of 4096), scale 256^-1/2. */
static void test_gemma3_text_config_defaults_are_transformers(void)
{
    const char *configs[] = {"{\"model_type\":\"gemma3\",\"text_config\":{}}",
                             "{\"model_type\":\"gemma3\"}", "{\"model_type\":\"gemma3_text\"}"};
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++) {
        json_t *cfg = json_loads(configs[i], 0, NULL);
        static hf_config local, global;
        hf_error e = {0};
        CHECKF(api__hf_config_read(cfg, 0, &local, &e) == 0, "%s: %s", configs[i], e.message);
        CHECKF(api__hf_config_read(cfg, 5, &global, &e) == 0, "%s: %s", configs[i], e.message);
        CHECKF(local.E == 2304 && local.H == 8 && local.Hkv == 4 && local.D == 256 &&
                   local.layers == 26,
               "%s: E %lld H %lld Hkv %lld D %lld layers %lld", configs[i], (long long)local.E,
               (long long)local.H, (long long)local.Hkv, (long long)local.D,
               (long long)local.layers);
        CHECKF(local.spec.window == 4096 && local.spec.rope.base == 1e4, "%s: local %lld %g",
               configs[i], (long long)local.spec.window, local.spec.rope.base);
        CHECKF(global.spec.window == 0 && global.spec.rope.base == 1e6, "%s: global %lld %g",
               configs[i], (long long)global.spec.window, global.spec.rope.base);
        CHECKF(local.spec.scale == 1.0f / 16.0f && !local.bias_qkv && local.spec.softcap == 0,
               "%s: scale %g", configs[i], (double)local.spec.scale);
        json_decref(cfg);
    }
    json_t *bad = json_loads("{\"model_type\":\"gemma3\",\"text_config\":[]}", 0, NULL);
    static hf_config c;
    hf_error e = {0};
    CHECK(api__hf_config_read(bad, 0, &c, &e) != 0 && strcmp(e.field, "text_config") == 0);
    json_decref(bad);
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
    RUN_WITHIN(test_each_family_matches_transformers_through_v1_mha, 120);
    RUN_WITHIN(test_each_family_matches_transformers_step_by_step, 120);
    RUN_WITHIN(test_each_family_matches_transformers_in_batched_steps, 120);
    RUN_WITHIN(test_models_describe_the_checkpoint_layer, 30);
    RUN_WITHIN(test_requests_that_contradict_the_layer_are_422, 30);
    RUN_WITHIN(test_v2_infers_and_decodes_a_sequence_as_transformers, 60);
    RUN_WITHIN(test_v2_metadata_and_config_describe_the_layer, 30);
    RUN_WITHIN(test_heads_wider_than_the_hidden_size_step_as_the_whole, 60);
    RUN_WITHIN(test_transformers_4_configs_give_the_same_layers, 60);
    RUN_WITHIN(test_longrope_at_its_short_factors, 60);
    RUN_WITHIN(test_dynamic_ntk_below_its_context, 60);
    RUN_WITHIN(test_gemma3_multimodal_checkpoints_serve_their_text_layers, 60);
    RUN_WITHIN(test_gemma3_text_config_defaults_are_transformers, 10);
    api_models_free(models);
    eng_pool_free(pool);
    return check_report();
}
