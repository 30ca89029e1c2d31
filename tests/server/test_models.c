/*
 * test_models.c - registered layers over HTTP: attnd started with --model flags pointing at
 * safetensors fixtures written at test time (tests/support/safetensors_writer.h) in F32, F16
 * and BF16; GET /v1/models and /v1/models/{name}; POST /v1/mha on the demo layer and on the
 * loaded models, checked against the float64 reference; num_heads from the file's metadata or
 * from the flag's :heads=N:kv_heads=M suffix; a malformed file stopping the start with exit 2
 * and a message naming the file and the tensor, and so a checkpoint directory's layer that
 * cannot be served (tests/api/hf covers the checkpoint reader itself); a checkpoint directory
 * served whole, every layer under one name.
 *
 * Fixture values are multiples of 1/256 in [-0.5, 0.5], which F16 and BF16 hold exactly, so
 * the reference can use the very floats the test wrote.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "tests/support/check.h"
#include "tests/support/daemon.h"
#include "tests/support/ref_mha.h"
#include "tests/support/safetensors_writer.h"
#include "tests/support/util.h"

static char dir[64];
static daemon_proc d;
static bool up;

/* A layer's tensors in torch layout (row-major [out, in]), values k / 256. */
typedef struct {
    int64_t E, H, Hkv, W;
    float *wq, *wk, *wv, *wo, *bq, *bk, *bv, *bo, *in_w, *in_b;
} fixture;

static float *exact_values(int64_t n, uint64_t *rng)
{
    float *p = xcalloc((size_t)n, sizeof *p);
    for (int64_t i = 0; i < n; i++)
        p[i] = (float)rng_int(rng, -128, 128) / 256.0f;
    return p;
}

static fixture fixture_make(int64_t E, int64_t H, int64_t Hkv, uint64_t seed)
{
    fixture f;
    memset(&f, 0, sizeof f);
    f.E = E;
    f.H = H;
    f.Hkv = Hkv;
    f.W = Hkv * (E / H);
    uint64_t rng = seed;
    f.wq = exact_values(E * E, &rng);
    f.wk = exact_values(f.W * E, &rng);
    f.wv = exact_values(f.W * E, &rng);
    f.wo = exact_values(E * E, &rng);
    f.bq = exact_values(E, &rng);
    f.bk = exact_values(f.W, &rng);
    f.bv = exact_values(f.W, &rng);
    f.bo = exact_values(E, &rng);
    /* The packed form of the same values, for the nn.MultiheadAttention names. */
    if (Hkv == H) {
        f.in_w = xcalloc((size_t)(3 * E * E), sizeof(float));
        f.in_b = xcalloc((size_t)(3 * E), sizeof(float));
        memcpy(f.in_w, f.wq, (size_t)(E * E) * 4);
        memcpy(f.in_w + E * E, f.wk, (size_t)(E * E) * 4);
        memcpy(f.in_w + 2 * E * E, f.wv, (size_t)(E * E) * 4);
        memcpy(f.in_b, f.bq, (size_t)E * 4);
        memcpy(f.in_b + E, f.bk, (size_t)E * 4);
        memcpy(f.in_b + 2 * E, f.bv, (size_t)E * 4);
    }
    return f;
}

static void fixture_free(fixture *f)
{
    float *all[] = {f->wq, f->wk, f->wv, f->wo, f->bq, f->bk, f->bv, f->bo, f->in_w, f->in_b};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
}

static ref_mha_weights fixture_ref(const fixture *f, bool bias)
{
    ref_mha_weights w = {f->E,
                         f->H,
                         f->Hkv,
                         f->E,
                         f->E,
                         f->wq,
                         f->wk,
                         f->wv,
                         f->wo,
                         bias ? f->bq : NULL,
                         bias ? f->bk : NULL,
                         bias ? f->bv : NULL,
                         bias ? f->bo : NULL,
                         NULL,
                         NULL};
    return w;
}

/* enc: packed names with biases, F32, num_heads 4 in the metadata. */
static fixture enc, gqa, tut;

static void path_of(char *out, size_t size, const char *name)
{
    snprintf(out, size, "%s/%s", dir, name);
}

static bool write_fixtures(void)
{
    char p[160];
    bool ok = true;
    enc = fixture_make(32, 4, 4, 11);
    gqa = fixture_make(32, 4, 2, 22);
    tut = fixture_make(64, 8, 8, 33);
    {
        stw_tensor t[] = {{"in_proj_weight", STW_F32, 2, {96, 32}, enc.in_w},
                          {"in_proj_bias", STW_F32, 1, {96}, enc.in_b},
                          {"out_proj.weight", STW_F32, 2, {32, 32}, enc.wo},
                          {"out_proj.bias", STW_F32, 1, {32}, enc.bo}};
        stw_meta meta[] = {{"num_heads", "4"}};
        path_of(p, sizeof p, "enc.safetensors");
        ok = ok && stw_save(p, t, 4, meta, 1);
    }
    {
        /* Hugging Face names, F16, no metadata: the heads come from the flag. */
        stw_tensor t[] = {{"q_proj.weight", STW_F16, 2, {32, 32}, gqa.wq},
                          {"k_proj.weight", STW_F16, 2, {16, 32}, gqa.wk},
                          {"v_proj.weight", STW_F16, 2, {16, 32}, gqa.wv},
                          {"o_proj.weight", STW_F16, 2, {32, 32}, gqa.wo},
                          {"q_proj.bias", STW_F16, 1, {32}, gqa.bq},
                          {"k_proj.bias", STW_F16, 1, {16}, gqa.bk},
                          {"v_proj.bias", STW_F16, 1, {16}, gqa.bv},
                          {"o_proj.bias", STW_F16, 1, {32}, gqa.bo}};
        path_of(p, sizeof p, "gqa.safetensors");
        ok = ok && stw_save(p, t, 8, NULL, 0);
    }
    {
        /* The tutorial's names, BF16, no bias; metadata says 2 heads, the flag 8 wins. */
        stw_tensor t[] = {{"W_Q.weight", STW_BF16, 2, {64, 64}, tut.wq},
                          {"W_K.weight", STW_BF16, 2, {64, 64}, tut.wk},
                          {"W_V.weight", STW_BF16, 2, {64, 64}, tut.wv},
                          {"W_O.weight", STW_BF16, 2, {64, 64}, tut.wo}};
        stw_meta meta[] = {{"num_heads", "2"}};
        path_of(p, sizeof p, "tut.safetensors");
        ok = ok && stw_save(p, t, 4, meta, 1);
    }
    {
        /* Malformed: out_proj.weight's data runs past the end of the file. */
        static const char header[] =
            "{\"in_proj_weight\":{\"dtype\":\"F32\",\"shape\":[6,2],\"data_offsets\":[0,48]},"
            "\"out_proj.weight\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[48,64]}}";
        float data[12] = {0};
        stw_bytes b;
        path_of(p, sizeof p, "broken.safetensors");
        ok = ok &&
             stw_build_raw(sizeof header - 1, header, sizeof header - 1, data, sizeof data, &b);
        ok = ok && stw_write_file(p, b.data, b.len);
        stw_bytes_free(&b);
    }
    return ok;
}

/* ---- Helpers ----------------------------------------------------------------------------- */

static json_t *get_json(const char *path, long want_status)
{
    http_resp r;
    json_error_t jerr;
    long st = http_do(NULL, d.port, "GET", path, NULL, NULL, 0, &r);
    CHECKF(st == want_status, "GET %s: %ld, want %ld: %.200s", path, st, want_status, r.body);
    json_t *j = json_loadb(r.body, r.body_len, 0, &jerr);
    CHECKF(j != NULL, "GET %s: not JSON: %.200s", path, r.body);
    http_resp_free(&r);
    return j;
}

/* POST /v1/mha on `model` with input x [B, L, E] (base64) and `extra` fields; compares the
 * output with the reference for weights `w` and options `a` (x and sizes filled here). */
static void check_mha(const char *model, const ref_mha_weights *w, eng_mha_args *a,
                      const char *extra)
{
    int64_t shape[3] = {a->B, a->L, w->embed_dim};
    char *t = json_tensor_b64(a->x, shape, 3);
    size_t n = strlen(t) + strlen(extra) + 256;
    char *body = xcalloc(n, 1);
    http_resp r;
    snprintf(body, n, "{\"model\":\"%s\",\"input\":%s,\"output_encoding\":\"flat\"%s}", model, t,
             extra);
    long st = http_do(NULL, d.port, "POST", "/v1/mha",
                      (const char *const[]){"Content-Type: application/json", NULL}, body,
                      strlen(body), &r);
    CHECKF(st == 200, "%s: %ld: %.300s", model, st, r.body);
    ref_mha_result ref;
    memset(&ref, 0, sizeof ref);
    CHECK(ref_mha(w, a, &ref));
    size_t count = (size_t)(a->B * a->L * w->embed_dim);
    double *got = xcalloc(count + 1, sizeof *got);
    long k = json_numbers(r.body, "output", got, count + 1);
    CHECKF(k == (long)count, "%s: %ld output numbers, want %zu", model, k, count);
    double scale = 0, worst = 0;
    for (size_t i = 0; ref.out && i < count; i++)
        scale = fmax(scale, fabs(ref.out[i]));
    for (size_t i = 0; ref.out && k == (long)count && i < count; i++) {
        double dd = fabs(got[i] - ref.out[i]);
        worst = dd <= worst ? worst : (isnan(dd) ? INFINITY : dd);
    }
    CHECKF(worst <= 1e-4 * scale, "%s: output off by %g (scale %g)", model, worst, scale);
    CHECKF(strstr(r.body, "\"model\":\"") != NULL, "%s: meta names no model", model);
    free(got);
    ref_mha_result_free(&ref);
    http_resp_free(&r);
    free(body);
    free(t);
}

/* ---- Tests ------------------------------------------------------------------------------- */

static void test_listing(void)
{
    static const struct {
        const char *name, *dtype;
        long long E, H, Hkv, params;
        bool bias;
    } want[] = {{"demo", "F32", 64, 4, 4, 4 * 64 * 64 + 4 * 64, true},
                {"enc", "F32", 32, 4, 4, 4 * 32 * 32 + 4 * 32, true},
                {"gqa", "F16", 32, 4, 2, 2 * 32 * 32 + 2 * 16 * 32 + 2 * 32 + 2 * 16, true},
                {"tut", "BF16", 64, 8, 8, 4 * 64 * 64, false}};
    json_t *j = get_json("/v1/models", 200);
    const json_t *list = json_object_get(j, "models");
    CHECK_EQ_INT(json_array_size(list), 4);
    for (size_t i = 0; i < 4 && i < json_array_size(list); i++) {
        const json_t *m = json_array_get(list, i);
        const char *name = json_string_value(json_object_get(m, "name"));
        CHECKF(name && strcmp(name, want[i].name) == 0, "model %zu is %s", i, name);
        CHECK(strcmp(json_string_value(json_object_get(m, "dtype")), want[i].dtype) == 0);
        CHECK_EQ_INT(json_integer_value(json_object_get(m, "embed_dim")), want[i].E);
        CHECK_EQ_INT(json_integer_value(json_object_get(m, "num_heads")), want[i].H);
        CHECK_EQ_INT(json_integer_value(json_object_get(m, "num_kv_heads")), want[i].Hkv);
        CHECK_EQ_INT(json_integer_value(json_object_get(m, "head_dim")), want[i].E / want[i].H);
        CHECK_EQ_INT(json_integer_value(json_object_get(m, "kdim")), want[i].E);
        CHECK_EQ_INT(json_integer_value(json_object_get(m, "parameters")), want[i].params);
        CHECK(json_is_boolean(json_object_get(m, "bias")) &&
              json_is_true(json_object_get(m, "bias")) == want[i].bias);
        CHECK(json_is_false(json_object_get(m, "bias_kv")));
    }
    json_decref(j);

    j = get_json("/v1/models/gqa", 200);
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "num_kv_heads")), 2);
    CHECK(strcmp(json_string_value(json_object_get(j, "dtype")), "F16") == 0);
    json_decref(j);
    j = get_json("/v1/models/nope", 404);
    const json_t *e = json_object_get(j, "error");
    CHECK(strcmp(json_string_value(json_object_get(e, "code")), "not_found") == 0);
    CHECK(strstr(json_string_value(json_object_get(e, "message")), "nope") != NULL);
    json_decref(j);
    j = get_json("/v1/models/no%20spaces", 400);
    json_decref(j);

    http_resp r;
    CHECK_EQ_INT(http_do(NULL, d.port, "DELETE", "/v1/models/demo", NULL, NULL, 0, &r), 405);
    CHECK(strcmp(r.allow, "GET, HEAD") == 0);
    http_resp_free(&r);
    CHECK_EQ_INT(http_do(NULL, d.port, "GET", "/v1/models/demo/x", NULL, NULL, 0, &r), 404);
    http_resp_free(&r);
    CHECK_EQ_INT(http_do(NULL, d.port, "GET", "/v1/mha", NULL, NULL, 0, &r), 405);
    CHECK(strcmp(r.allow, "POST") == 0);
    http_resp_free(&r);
    CHECK_EQ_INT(http_do(NULL, d.port, "GET", "/v2/health/ready", NULL, NULL, 0, &r), 200);
    http_resp_free(&r);
}

static void test_mha_on_models(void)
{
    uint64_t rng = 7;
    int64_t B = 2, L = 6;
    float *x32 = exact_values(B * L * 32, &rng), *x64 = exact_values(B * L * 64, &rng);
    eng_mha_args a;

    eng_layer *demo = eng_layer_demo();
    ref_mha_weights wd = ref_mha_weights_of_layer(demo);
    memset(&a, 0, sizeof a);
    a.B = B;
    a.L = L;
    a.x = x64;
    a.causal = true;
    check_mha("demo", &wd, &a, ",\"causal\":true");

    ref_mha_weights we = fixture_ref(&enc, true);
    memset(&a, 0, sizeof a);
    a.B = B;
    a.L = L;
    a.x = x32;
    a.positional = ENG_POSITIONAL_ROPE;
    check_mha("enc", &we, &a, ",\"positional\":\"rope\"");

    ref_mha_weights wg = fixture_ref(&gqa, true);
    memset(&a, 0, sizeof a);
    a.B = B;
    a.L = L;
    a.x = x32;
    a.add_zero_attn = true;
    check_mha("gqa", &wg, &a, ",\"add_zero_attn\":true");

    ref_mha_weights wt = fixture_ref(&tut, false);
    memset(&a, 0, sizeof a);
    a.B = B;
    a.L = L;
    a.x = x64;
    a.positional = ENG_POSITIONAL_ALIBI;
    a.causal = true;
    check_mha("tut", &wt, &a, ",\"positional\":\"alibi\",\"causal\":true");

    /* Errors over HTTP keep the native form and the request's field names. */
    http_resp r;
    static const char bad[] = "{\"model\":\"enc\",\"input\":[[1,2,3]]}";
    CHECK_EQ_INT(http_do(NULL, d.port, "POST", "/v1/mha",
                         (const char *const[]){"Content-Type: application/json", NULL}, bad,
                         sizeof bad - 1, &r),
                 422);
    CHECK(strstr(r.body, "\"field\":\"input\"") != NULL);
    http_resp_free(&r);
    static const char unknown[] = "{\"model\":\"dec\",\"input\":[[1,2,3]]}";
    CHECK_EQ_INT(http_do(NULL, d.port, "POST", "/v1/mha",
                         (const char *const[]){"Content-Type: application/json", NULL}, unknown,
                         sizeof unknown - 1, &r),
                 404);
    http_resp_free(&r);

    /* Per-route metrics use the route's pattern, never the raw path. */
    CHECK(metric_wait(d.port, "attnd_requests_total{route=\"/v1/mha\",code=\"200\"}", 4, 2000));
    CHECK(metric_wait(d.port, "attnd_requests_total{route=\"/v1/models/{name}\",code=\"404\"}", 1,
                      2000));
    CHECK(metric_value(d.port, "attnd_requests_total{route=\"/v1/models/nope\"") < 0);
    eng_layer_free(demo);
    free(x32);
    free(x64);
}

/* A malformed file stops the start: exit 2, the file and the tensor named on stderr. */
static void test_malformed_file_stops_start(void)
{
    char p[160], arg[200];
    daemon_proc bad;
    path_of(p, sizeof p, "broken.safetensors");
    snprintf(arg, sizeof arg, "x=%s", p);
    const char *args[] = {"--model", arg, NULL};
    CHECK(daemon_start(&bad, args) != 0);
    CHECK_EQ_INT(daemon_wait(&bad, 10000), 2);
    char *log = daemon_log(&bad);
    CHECKF(log && strstr(log, p) && strstr(log, "out_proj.weight") && strstr(log, "--model"),
           "stderr: %s", log ? log : "(none)");
    free(log);
    daemon_stop(&bad);

    /* A file that does not exist, and heads that do not divide the width, too. */
    snprintf(arg, sizeof arg, "x=%s/missing.safetensors", dir);
    CHECK(daemon_start(&bad, args) != 0);
    CHECK_EQ_INT(daemon_wait(&bad, 10000), 2);
    log = daemon_log(&bad);
    CHECKF(log && strstr(log, "missing.safetensors"), "stderr: %s", log ? log : "(none)");
    free(log);
    daemon_stop(&bad);
    path_of(p, sizeof p, "enc.safetensors");
    snprintf(arg, sizeof arg, "x=%s:heads=5", p);
    CHECK(daemon_start(&bad, args) != 0);
    CHECK_EQ_INT(daemon_wait(&bad, 10000), 2);
    log = daemon_log(&bad);
    CHECKF(log && strstr(log, "enc.safetensors") && strstr(log, "heads"), "stderr: %s",
           log ? log : "(none)");
    free(log);
    daemon_stop(&bad);
}

/* A checkpoint directory's layer that cannot be served stops the start the same way: exit 2,
 * the directory and the config field named. */
static void test_checkpoint_refusal_stops_start(void)
{
    daemon_proc bad;
    const char *args[] = {"--model", "x=tests/api/hf/cases/llama:layer=2", NULL};
    CHECK(daemon_start(&bad, args) != 0);
    CHECK_EQ_INT(daemon_wait(&bad, 10000), 2);
    char *log = daemon_log(&bad);
    CHECKF(log && strstr(log, "tests/api/hf/cases/llama") && strstr(log, "num_hidden_layers"),
           "stderr: %s", log ? log : "(none)");
    free(log);
    daemon_stop(&bad);
}

/* A checkpoint directory without :layer=K is every layer of it under one name: the start-up
 * line says how many and their bytes; GET /v1/models/NAME says "layers", and its parameters
 * and bytes are those of every layer (here twice those of one layer of the same shape). */
static void test_checkpoint_serves_every_layer(void)
{
    daemon_proc g;
    const char *args[] = {"--model", "llama=tests/api/hf/cases/llama", "--model",
                          "llama1=tests/api/hf/cases/llama:layer=1", NULL};
    if (daemon_start(&g, args) != 0) {
        CHECK(false);
        return;
    }
    CHECK(daemon_log_lines(&g,
                           "loaded model llama from tests/api/hf/cases/llama: llama 2 layers "
                           "(0 to 1), 4 heads (2 kv) of 16",
                           "bytes of weights", 1, 5000) == 1);
    CHECK(daemon_log_lines(&g, "loaded model llama1 from tests/api/hf/cases/llama: llama layer 1,",
                           "bytes of weights", 1, 5000) == 1);
    json_t *m[2] = {NULL, NULL};
    const char *paths[2] = {"/v1/models/llama", "/v1/models/llama1"};
    for (int i = 0; i < 2; i++) {
        http_resp r;
        CHECK_EQ_INT(http_do(NULL, g.port, "GET", paths[i], NULL, NULL, 0, &r), 200);
        m[i] = json_loadb(r.body, r.body_len, 0, NULL);
        http_resp_free(&r);
    }
    CHECK_EQ_INT(json_integer_value(json_object_get(m[0], "layers")), 2);
    CHECK_EQ_INT(json_integer_value(json_object_get(m[1], "layers")), 1);
    const char *sums[2] = {"parameters", "bytes"};
    for (int i = 0; i < 2; i++) {
        json_int_t one = json_integer_value(json_object_get(m[1], sums[i]));
        CHECK(one > 0);
        CHECK_EQ_INT(json_integer_value(json_object_get(m[0], sums[i])), 2 * one);
    }
    CHECK_EQ_INT(json_array_size(json_object_get(m[0], "decoder_layers")), 2);
    json_decref(m[0]);
    json_decref(m[1]);
    CHECK_EQ_INT(daemon_stop(&g), 0);
}

static void test_started(void)
{
    CHECKF(up, "the daemon did not start with the fixtures");
}

static void test_stops_cleanly(void)
{
    CHECK_EQ_INT(daemon_stop(&d), 0);
}

int main(void)
{
    char enc_arg[200], gqa_arg[200], tut_arg[200];
    snprintf(dir, sizeof dir, "/tmp/attnd-models-XXXXXX");
    if (!mkdtemp(dir) || !write_fixtures()) {
        printf("cannot write the fixtures in %s\n0 passed, 1 failed\n", dir);
        return 1;
    }
    snprintf(enc_arg, sizeof enc_arg, "enc=%s/enc.safetensors", dir);
    snprintf(gqa_arg, sizeof gqa_arg, "gqa=%s/gqa.safetensors:heads=4:kv_heads=2", dir);
    snprintf(tut_arg, sizeof tut_arg, "tut=%s/tut.safetensors:heads=8", dir);
    const char *args[] = {"--threads", "2",       "--model", enc_arg, "--model",
                          gqa_arg,     "--model", tut_arg,   NULL};
    up = daemon_start(&d, args) == 0;
    RUN(test_started);
    if (up) {
        RUN(test_listing);
        RUN(test_mha_on_models);
        RUN(test_stops_cleanly);
    }
    RUN(test_malformed_file_stops_start);
    RUN(test_checkpoint_refusal_stops_start);
    RUN(test_checkpoint_serves_every_layer);

    const char *names[] = {"enc", "gqa", "tut", "broken"};
    for (size_t i = 0; i < 4; i++) {
        char p[160];
        snprintf(p, sizeof p, "%s/%s.safetensors", dir, names[i]);
        unlink(p);
    }
    rmdir(dir);
    fixture_free(&enc);
    fixture_free(&gqa);
    fixture_free(&tut);
    return check_report();
}
