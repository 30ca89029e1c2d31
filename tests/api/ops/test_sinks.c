/* test_sinks.c - POST /v1/attention with "sinks": a logit per query head that joins each
 * softmax as a key with no value (gpt-oss's attention sinks). The reference is the softmax over
 * the scores and the sink written out in float64: output sum_j exp(s_j - m) / Z v_j with
 * Z = sum_j exp(s_j - m) + exp(sink - m), and lse = m + log Z, which the reply must match within
 * 1e-5 (relative to max |output|) causal and not, grouped heads included. Without the sinks the
 * outputs move by tens of percent. Then the refusals: sinks of another shape, and with
 * return_weights, are 422 naming "sinks". */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "tests/support/check.h"
#include "tests/support/rng.h"

#define B  1
#define H  4
#define HK 2
#define L  5
#define S  7
#define D  8

static eng_pool *pool;

typedef struct {
    int status;
    json_t *json;
} result;

static result attention(const char *body)
{
    api_call call = {
        .body = body, .body_len = strlen(body), .content_type = "application/json", .pool = pool};
    api_reply reply;
    result r = {0};
    api_attention(&call, &reply);
    r.status = reply.status;
    r.json = json_loadb(reply.body, reply.body_len, 0, NULL);
    api_reply_free(&reply);
    return r;
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

static void test_sinks_take_their_share_of_each_softmax(void)
{
    inputs in;
    uint64_t rng = 21;
    float *all[] = {in.q, in.k, in.v, in.sinks};
    size_t n[] = {H * L * D, HK * S * D, HK * S * D, H};
    for (int a = 0; a < 4; a++)
        for (size_t i = 0; i < n[a]; i++)
            all[a][i] = rng_sym(&rng, a == 3 ? 2.0 : 1.0);
    for (int causal = 0; causal < 2; causal++) {
        double out[H * L * D], lse[H * L], worst = 0, scale = 0, lse_worst = 0, moved = 0;
        reference(&in, causal, out, lse);
        char *body = body_of(&in, causal, NULL);
        result r = attention(body);
        free(body);
        CHECKF(r.status == 200, "status %d", r.status);
        const json_t *o = json_object_get(r.json, "output"), *l = json_object_get(r.json, "lse");
        for (int h = 0; h < H; h++)
            for (int i = 0; i < L; i++) {
                for (int c = 0; c < D; c++) {
                    double want = out[(h * L + i) * D + c];
                    scale = fmax(scale, fabs(want));
                    worst = fmax(worst, fabs(value_at(o, h, i, c) - want));
                }
                lse_worst = fmax(lse_worst, fabs(value_at(l, h, i, -1) - lse[h * L + i]));
            }
        CHECKF(worst <= 1e-5 * scale, "causal %d: output %.3g x max|out| off", causal,
               worst / scale);
        CHECKF(lse_worst <= 1e-5, "causal %d: lse %.3g off", causal, lse_worst);
        json_decref(r.json);
        /* The same without sinks is far from it: the test can tell. */
        body = body_of(&in, causal, "null");
        r = attention(body);
        free(body);
        o = json_object_get(r.json, "output");
        for (int h = 0; h < H; h++)
            for (int i = 0; i < L; i++)
                for (int c = 0; c < D; c++)
                    moved = fmax(moved, fabs(value_at(o, h, i, c) - out[(h * L + i) * D + c]));
        CHECKF(moved > 0.05 * scale, "without sinks only %.3g x max|out| away", moved / scale);
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

int main(void)
{
    eng_error err;
    pool = eng_pool_new(2, &err);
    if (!pool) {
        printf("FAIL set-up\n0 passed, 1 failed\n");
        return 1;
    }
    RUN(test_sinks_take_their_share_of_each_softmax);
    RUN(test_sinks_refusals_name_the_field);
    eng_pool_free(pool);
    return check_report();
}
