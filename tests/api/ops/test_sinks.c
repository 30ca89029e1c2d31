/* test_sinks.c - "sinks": a logit per query head that joins each softmax as a key with no value
 * (gpt-oss's attention sinks), wherever attention options are taken: POST /v1/attention, the
 * v2 model sdpa (an input "sinks" [H]) and a session step (POST /v1/sessions/{id}/attention).
 * The reference is the softmax over the scores and the sink written out in float64: output
 * sum_j exp(s_j - m) / Z v_j with Z = sum_j exp(s_j - m) + exp(sink - m), and lse = m + log Z,
 * which each reply must match within 1e-5 (relative to max |output|), grouped heads included.
 * Without the sinks the outputs move by tens of percent. Then the refusals: sinks of another
 * shape, a sink that is not finite, and sinks with return_weights are 422 naming "sinks". */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "tests/support/check.h"
#include "tests/support/rng.h"
#include "tests/support/route.h"

#define B  1
#define H  4
#define HK 2
#define L  5
#define S  7
#define D  8

static eng_pool *pool;
static api_sessions *reg;

typedef test_reply result;

static result attention(const char *body)
{
    api_call call = {
        .body = body, .body_len = strlen(body), .content_type = "application/json", .pool = pool};
    return test_route(api_attention, &call);
}

/* A nested JSON array of n values of x in the shape [1, heads, rows, D]. */
static json_t *nested(const float *x, int64_t heads, int64_t rows)
{
    json_t *b = json_array(), *hs = json_array();
    for (int64_t h = 0; h < heads; h++) {
        json_t *rs = json_array();
        for (int64_t i = 0; i < rows; i++) {
            json_t *row = json_array();
            for (int64_t d = 0; d < D; d++)
                json_array_append_new(row, json_real(x[(h * rows + i) * D + d]));
            json_array_append_new(rs, row);
        }
        json_array_append_new(hs, rs);
    }
    json_array_append_new(b, hs);
    return b;
}

typedef struct {
    float q[H * L * D], k[HK * S * D], v[HK * S * D], sinks[H];
} inputs;

static char *body_of(const inputs *in, bool causal, const char *extra_sinks)
{
    json_t *j = json_object();
    json_object_set_new(j, "query", nested(in->q, H, L));
    json_object_set_new(j, "key", nested(in->k, HK, S));
    json_object_set_new(j, "value", nested(in->v, HK, S));
    json_object_set_new(j, "causal", causal ? json_string("bottom_right") : json_false());
    json_object_set_new(j, "return_lse", json_true());
    if (extra_sinks) {
        json_object_set_new(j, "sinks", json_loads(extra_sinks, JSON_DECODE_ANY, NULL));
    } else {
        json_t *s = json_array();
        for (int h = 0; h < H; h++)
            json_array_append_new(s, json_real(in->sinks[h]));
        json_object_set_new(j, "sinks", s);
    }
    char *text = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return text;
}

/* The reference output [H, L, D] and lse [H, L]. */
static void reference(const inputs *in, bool causal, double *out, double *lse)
{
    double scale = 1.0 / sqrt((double)D);
    for (int h = 0; h < H; h++)
        for (int i = 0; i < L; i++) {
            int g = h / (H / HK), last = causal ? i + S - L : S - 1;
            double s[S], m = in->sinks[h], z = 0;
            for (int j = 0; j <= last; j++) {
                double d = 0;
                for (int c = 0; c < D; c++)
                    d += (double)in->q[(h * L + i) * D + c] * in->k[(g * S + j) * D + c];
                s[j] = d * scale;
                m = fmax(m, s[j]);
            }
            for (int j = 0; j <= last; j++)
                z += exp(s[j] - m);
            z += exp(in->sinks[h] - m);
            for (int c = 0; c < D; c++) {
                double acc = 0;
                for (int j = 0; j <= last; j++)
                    acc += exp(s[j] - m) / z * in->v[(g * S + j) * D + c];
                out[(h * L + i) * D + c] = acc;
            }
            lse[h * L + i] = m + log(z);
        }
}

static double value_at(const json_t *t, int h, int i, int c)
{
    const json_t *row = json_array_get(json_array_get(json_array_get(t, 0), (size_t)h), (size_t)i);
    return c < 0 ? json_number_value(row) : json_number_value(json_array_get(row, (size_t)c));
}

/* Reads element (h, i, c) of an output (c < 0: of the lse) as one route lays it out. */
typedef double (*reader)(const json_t *reply, int h, int i, int c);

static double native_at(const json_t *reply, int h, int i, int c)
{
    return value_at(json_object_get(reply, c < 0 ? "lse" : "output"), h, i, c);
}

/* v2: the outputs' flat data, output [1, H, L, D] and lse [1, H, L]. */
static double v2_at(const json_t *reply, int h, int i, int c)
{
    const json_t *outs = json_object_get(reply, "outputs");
    for (size_t o = 0; o < json_array_size(outs); o++) {
        const json_t *out = json_array_get(outs, o);
        if (strcmp(json_string_value(json_object_get(out, "name")), c < 0 ? "lse" : "output") != 0)
            continue;
        size_t at = c < 0 ? (size_t)(h * L + i) : (size_t)((h * L + i) * D + c);
        return json_number_value(json_array_get(json_object_get(out, "data"), at));
    }
    return NAN;
}

/* A session step with a query [H, L, D]: output [H, L, D] and lse [H, L]. */
static double step_at(const json_t *reply, int h, int i, int c)
{
    const json_t *t = json_object_get(reply, c < 0 ? "lse" : "output");
    const json_t *row = json_array_get(json_array_get(t, (size_t)h), (size_t)i);
    return c < 0 ? json_number_value(row) : json_number_value(json_array_get(row, (size_t)c));
}

/* The largest error of the output relative to max |output|, and of the lse when lse_err is
 * given, against the reference (a value missing from the reply counts as infinitely off). */
static void compare(const json_t *reply, reader at, const double *out, const double *lse,
                    double *output_err, double *lse_err)
{
    double worst = 0, scale = 0, lse_worst = 0;
    for (int h = 0; h < H; h++)
        for (int i = 0; i < L; i++) {
            for (int c = 0; c < D; c++) {
                double want = out[(h * L + i) * D + c];
                scale = fmax(scale, fabs(want));
                double d = fabs(at(reply, h, i, c) - want);
                worst = isnan(d) ? INFINITY : fmax(worst, d);
            }
            if (lse_err) {
                double d = fabs(at(reply, h, i, -1) - lse[h * L + i]);
                lse_worst = isnan(d) ? INFINITY : fmax(lse_worst, d);
            }
        }
    *output_err = worst / scale;
    if (lse_err)
        *lse_err = lse_worst;
}

static void random_inputs(inputs *in, uint64_t seed)
{
    float *all[] = {in->q, in->k, in->v, in->sinks};
    size_t n[] = {H * L * D, HK * S * D, HK * S * D, H};
    for (int a = 0; a < 4; a++)
        for (size_t i = 0; i < n[a]; i++)
            all[a][i] = rng_sym(&seed, a == 3 ? 2.0 : 1.0);
}

static void test_sinks_take_their_share_of_each_softmax(void)
{
    inputs in;
    random_inputs(&in, 21);
    for (int causal = 0; causal < 2; causal++) {
        double out[H * L * D], lse[H * L], output_err, lse_err, moved;
        reference(&in, causal, out, lse);
        char *body = body_of(&in, causal, NULL);
        result r = attention(body);
        free(body);
        CHECKF(r.status == 200, "status %d", r.status);
        compare(r.json, native_at, out, lse, &output_err, &lse_err);
        CHECKF(output_err <= 1e-5, "causal %d: output %.3g x max|out| off", causal, output_err);
        CHECKF(lse_err <= 1e-5, "causal %d: lse %.3g off", causal, lse_err);
        json_decref(r.json);
        /* The same without sinks is far from it: the test can tell. */
        body = body_of(&in, causal, "null");
        r = attention(body);
        free(body);
        compare(r.json, native_at, out, NULL, &moved, NULL);
        CHECKF(moved > 0.05, "without sinks only %.3g x max|out| away", moved);
        json_decref(r.json);
    }
}

static void test_sinks_refusals_name_the_field(void)
{
    inputs in;
    memset(&in, 0, sizeof in);
    const char *bad[] = {"[1, 2, 3]", "[[1, 2, 3, 4]]"};
    for (int i = 0; i < 2; i++) {
        char *body = body_of(&in, false, bad[i]);
        result r = attention(body);
        free(body);
        const char *f =
            json_string_value(json_object_get(json_object_get(r.json, "error"), "field"));
        CHECKF(r.status == 422 && f && strcmp(f, "sinks") == 0, "%s: %d %s", bad[i], r.status,
               f ? f : "");
        json_decref(r.json);
    }
    char *body = body_of(&in, false, NULL);
    json_t *j = json_loads(body, 0, NULL);
    free(body);
    json_object_set_new(j, "return_weights", json_string("per_head"));
    body = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    result r = attention(body);
    free(body);
    const char *f = json_string_value(json_object_get(json_object_get(r.json, "error"), "field"));
    CHECKF(r.status == 422 && f && strcmp(f, "sinks") == 0, "with weights: %d", r.status);
    json_decref(r.json);
}

/* A body with the string "SINKS" made the raw text `sinks` (which JSON could not carry: NaN,
 * Infinity); body is freed. */
static const char *const mark = "\"SINKS\"";

static char *spliced(char *body, const char *sinks)
{
    char *at = strstr(body, mark);
    CHECK(at != NULL);
    size_t n = strlen(body) + strlen(sinks) + 1;
    char *out = malloc(n);
    snprintf(out, n, "%.*s%s%s", (int)(at - body), body, sinks, at + strlen(mark));
    free(body);
    return out;
}

/* NaN and Infinity tokens, which the body reader takes as tensor values, are no sink logits:
 * 422 naming the sink (sinks[h]). */
static void test_a_sink_that_is_not_finite_is_refused(void)
{
    inputs in;
    random_inputs(&in, 5);
    const char *bad[] = {"[0, NaN, 1, 2]", "[0, 1, Infinity, 2]"};
    for (int i = 0; i < 2; i++) {
        char *patched = spliced(body_of(&in, false, mark), bad[i]);
        result r = attention(patched);
        free(patched);
        const json_t *e = json_object_get(r.json, "error");
        const char *f = json_string_value(json_object_get(e, "field"));
        const char *m = json_string_value(json_object_get(e, "message"));
        CHECKF(r.status == 422 && f && strncmp(f, "sinks", 5) == 0 && m && strstr(m, "finite"),
               "%s: %d %s", bad[i], r.status, m ? m : "");
        json_decref(r.json);
    }
}

/* A flat JSON array of n floats. */
static json_t *flat(const float *x, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_real(x[i]));
    return a;
}

static json_t *v2_input(const char *name, const float *x, int64_t h, int64_t rows)
{
    json_t *in = json_object(), *shape = json_array();
    if (rows) {
        int64_t dims[4] = {1, h, rows, D};
        for (int d = 0; d < 4; d++)
            json_array_append_new(shape, json_integer(dims[d]));
    } else {
        json_array_append_new(shape, json_integer(h));
    }
    json_object_set_new(in, "name", json_string(name));
    json_object_set_new(in, "shape", shape);
    json_object_set_new(in, "datatype", json_string("FP32"));
    json_object_set_new(in, "data", flat(x, (size_t)(h * (rows ? rows * D : 1))));
    return in;
}

static result v2_infer(const inputs *in, bool causal, bool sinks)
{
    json_t *j = json_object(), *ins = json_array(), *params = json_object();
    json_array_append_new(ins, v2_input("query", in->q, H, L));
    json_array_append_new(ins, v2_input("key", in->k, HK, S));
    json_array_append_new(ins, v2_input("value", in->v, HK, S));
    if (sinks)
        json_array_append_new(ins, v2_input("sinks", in->sinks, H, 0));
    json_object_set_new(params, "causal", causal ? json_string("bottom_right") : json_false());
    json_object_set_new(params, "return_lse", json_true());
    json_object_set_new(j, "inputs", ins);
    json_object_set_new(j, "parameters", params);
    char *body = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    api_call call = {.body = body,
                     .body_len = strlen(body),
                     .content_type = "application/json",
                     .pool = pool,
                     .model = "sdpa"};
    result r = test_route(api_v2_infer, &call);
    free(body);
    return r;
}

static void test_v2_model_sdpa_takes_sinks_as_an_input(void)
{
    inputs in;
    random_inputs(&in, 33);
    for (int causal = 0; causal < 2; causal++) {
        double out[H * L * D], lse[H * L], output_err, lse_err, moved;
        reference(&in, causal, out, lse);
        result r = v2_infer(&in, causal, true);
        CHECKF(r.status == 200, "status %d: %s", r.status,
               json_string_value(json_object_get(r.json, "error")));
        compare(r.json, v2_at, out, lse, &output_err, &lse_err);
        CHECKF(output_err <= 1e-5, "causal %d: output %.3g x max|out| off", causal, output_err);
        CHECKF(lse_err <= 1e-5, "causal %d: lse %.3g off", causal, lse_err);
        json_decref(r.json);
        r = v2_infer(&in, causal, false);
        compare(r.json, v2_at, out, NULL, &moved, NULL);
        CHECKF(moved > 0.05, "without sinks only %.3g x max|out| away", moved);
        json_decref(r.json);
    }
}

static result session_call(void (*fn)(const api_call *, api_reply *), const char *id,
                           const char *body)
{
    api_call call = {.body = body,
                     .body_len = strlen(body),
                     .content_type = "application/json",
                     .pool = pool,
                     .sessions = reg,
                     .session = id};
    return test_route(fn, &call);
}

/* The one batch of a nested [1, ...] array. */
static json_t *unbatched(json_t *batch)
{
    json_t *first = json_incref(json_array_get(batch, 0));
    json_decref(batch);
    return first;
}

/* A step on a new session: key and value [HK, S, D] appended, the query [H, L, D] attending
 * (bottom-right causal, a session's default), with `sinks` (raw JSON) unless NULL. */
static result session_step(const inputs *in, const char *sinks)
{
    result c = session_call(api_sessions_create, NULL,
                            "{\"num_heads\":4,\"num_kv_heads\":2,\"head_dim\":8}");
    CHECKF(c.status == 201, "create: %d", c.status);
    char id[64];
    snprintf(id, sizeof id, "%s", json_string_value(json_object_get(c.json, "id")));
    json_decref(c.json);
    json_t *j = json_object();
    json_object_set_new(j, "query", unbatched(nested(in->q, H, L)));
    json_object_set_new(j, "key", unbatched(nested(in->k, HK, S)));
    json_object_set_new(j, "value", unbatched(nested(in->v, HK, S)));
    json_object_set_new(j, "return_lse", json_true());
    if (sinks)
        json_object_set_new(j, "sinks", json_string("SINKS"));
    char *body = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (sinks)
        body = spliced(body, sinks);
    result r = session_call(api_session_attention, id, body);
    free(body);
    api_reply reply;
    api_sessions_delete(reg, id, &reply);
    api_reply_free(&reply);
    return r;
}

static void test_session_steps_take_sinks(void)
{
    inputs in;
    random_inputs(&in, 44);
    double out[H * L * D], lse[H * L], output_err, lse_err, moved;
    reference(&in, true, out, lse);
    char sinks[128];
    snprintf(sinks, sizeof sinks, "[%.9g, %.9g, %.9g, %.9g]", (double)in.sinks[0],
             (double)in.sinks[1], (double)in.sinks[2], (double)in.sinks[3]);
    result r = session_step(&in, sinks);
    CHECKF(r.status == 200, "status %d", r.status);
    compare(r.json, step_at, out, lse, &output_err, &lse_err);
    CHECKF(output_err <= 1e-5, "output %.3g x max|out| off", output_err);
    CHECKF(lse_err <= 1e-5, "lse %.3g off", lse_err);
    json_decref(r.json);
    r = session_step(&in, NULL);
    CHECKF(r.status == 200, "without sinks: status %d", r.status);
    compare(r.json, step_at, out, NULL, &moved, NULL);
    CHECKF(moved > 0.05, "without sinks only %.3g x max|out| away", moved);
    json_decref(r.json);
}

static void test_session_sinks_refusals_name_the_field(void)
{
    inputs in;
    random_inputs(&in, 45);
    const char *bad[] = {"[1, 2, 3]", "[[1, 2, 3, 4]]", "[1, 2, NaN, 4]"};
    for (int i = 0; i < 3; i++) {
        result r = session_step(&in, bad[i]);
        const json_t *e = json_object_get(r.json, "error");
        const char *f = json_string_value(json_object_get(e, "field"));
        CHECKF(r.status == 422 && f && strncmp(f, "sinks", 5) == 0, "%s: %d %s", bad[i], r.status,
               f ? f : "");
        json_decref(r.json);
    }
}

int main(void)
{
    eng_error err;
    pool = eng_pool_new(2, &err);
    char msg[256];
    api_sessions_config cfg = {.capacity_bytes = (size_t)1 << 24, .block_tokens = 16, .ttl_s = 60};
    reg = api_sessions_new(&cfg, msg, sizeof msg);
    if (!pool || !reg) {
        printf("FAIL set-up\n0 passed, 1 failed\n");
        return 1;
    }
    RUN(test_sinks_take_their_share_of_each_softmax);
    RUN(test_sinks_refusals_name_the_field);
    RUN(test_a_sink_that_is_not_finite_is_refused);
    RUN(test_v2_model_sdpa_takes_sinks_as_an_input);
    RUN(test_session_steps_take_sinks);
    RUN(test_session_sinks_refusals_name_the_field);
    api_sessions_free(reg);
    eng_pool_free(pool);
    return check_report();
}
