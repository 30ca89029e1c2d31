/* test_hf_sliding.c - the sliding-window layers of Gemma 2 and gpt-oss, served from their
 * reference checkpoints (layer 0 is "sliding_attention" in both configs' layer_types) over a
 * sequence longer than the window, against a float64 forward pass of the same layer written
 * out here from transformers' attention modules:
 *
 *   q, k, v = x W^T (+ b); RoPE (half pairs) at positions 0..L-1 with the config's inverse
 *   frequencies (gpt-oss: YaRN, cos and sin times its attention factor); scores q.k * scale,
 *   Gemma 2: scale query_pre_attn_scalar^-1/2 and cap * tanh(s / cap); gpt-oss: 1/sqrt(D) and
 *   a sink logit per head in the softmax; query i sees keys i-W+1..i; out = attn W_o^T (+ b).
 *
 * The weights and sinks are the loaded layer's (bf16 in the file, widened exactly); the RoPE,
 * scale, softcap and window come from config.json. The reply must match within 1e-5 of
 * max |output|, and be far from the same pass without the window (the test can tell).
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "tests/support/check.h"
#include "tests/support/daemon.h"
#include "tests/support/rng.h"

#define L_SEQ 20 /* tokens: past the window of 8 */

static eng_pool *pool;
static api_models *models;
static const char *cases_dir;

/* What the config says of the attention of one sliding layer. */
typedef struct {
    int64_t E, H, Hkv, D, window;
    double scale, softcap, attention_factor;
    double inv_freq[256];
} layer_config;

static double number(const json_t *obj, const char *key, double fallback)
{
    const json_t *v = json_object_get(obj, key);
    return json_is_number(v) ? json_number_value(v) : fallback;
}

/* YaRN's inverse frequencies: interpolated (/ factor) below the band of beta_slow..beta_fast
 * rotations over the original context, extrapolated above it, a linear ramp between. */
static void yarn(const json_t *rope, layer_config *lc)
{
    double base = number(rope, "rope_theta", 10000), factor = number(rope, "factor", 1);
    double orig = number(rope, "original_max_position_embeddings", 4096);
    double fast = number(rope, "beta_fast", 32), slow = number(rope, "beta_slow", 1);
    double dim = (double)lc->D;
    double low = dim * log(orig / (fast * 2 * M_PI)) / (2 * log(base));
    double high = dim * log(orig / (slow * 2 * M_PI)) / (2 * log(base));
    if (json_is_true(json_object_get(rope, "truncate"))) {
        low = floor(low);
        high = ceil(high);
    }
    low = fmax(low, 0);
    high = fmin(high, dim - 1);
    if (low == high)
        high += 0.001;
    for (int64_t i = 0; i < lc->D / 2; i++) {
        double pos = pow(base, (double)(2 * i) / dim);
        double ramp = fmin(fmax(((double)i - low) / (high - low), 0), 1);
        double extrapolated = 1 - ramp;
        lc->inv_freq[i] = 1 / (factor * pos) * ramp + 1 / pos * extrapolated;
    }
    lc->attention_factor = 0.1 * log(factor) + 1;
}

static bool read_config(const char *family, layer_config *lc)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s/config.json", cases_dir, family);
    json_t *cfg = json_load_file(path, 0, NULL);
    if (!cfg)
        return false;
    const json_t *rope = json_object_get(cfg, "rope_parameters");
    lc->E = (int64_t)number(cfg, "hidden_size", 0);
    lc->H = (int64_t)number(cfg, "num_attention_heads", 0);
    lc->Hkv = (int64_t)number(cfg, "num_key_value_heads", 0);
    lc->D = (int64_t)number(cfg, "head_dim", 0);
    lc->window = (int64_t)number(cfg, "sliding_window", 0);
    lc->softcap = number(cfg, "attn_logit_softcapping", 0);
    lc->scale = pow(number(cfg, "query_pre_attn_scalar", (double)lc->D), -0.5);
    lc->attention_factor = 1;
    const char *type = json_string_value(json_object_get(rope, "rope_type"));
    if (type && strcmp(type, "yarn") == 0) {
        yarn(rope, lc);
    } else {
        for (int64_t i = 0; i < lc->D / 2; i++)
            lc->inv_freq[i] =
                pow(number(rope, "rope_theta", 10000), -(double)(2 * i) / (double)lc->D);
    }
    const char *slides = json_string_value(json_array_get(json_object_get(cfg, "layer_types"), 0));
    bool ok = slides && strcmp(slides, "sliding_attention") == 0 && lc->window > 0 &&
              lc->window < L_SEQ && lc->D <= 512 && lc->E > 0 && lc->H > 0 && lc->Hkv > 0;
    CHECKF(ok, "%s: layer 0 is not a sliding layer with a window below %d", family, L_SEQ);
    json_decref(cfg);
    return ok;
}

/* The layer's matrices in float: its own, or its 16-bit ones widened (exactly). */
typedef struct {
    float *q, *k, *v, *o;
} matrices;

static float *widen(const eng_layer *l, const float *w, const uint16_t *w16, int64_t n)
{
    float *out = malloc((size_t)n * sizeof *out);
    for (int64_t i = 0; i < n; i++)
        out[i] = w                                ? w[i]
                 : l->w16_dtype == ENG_DTYPE_BF16 ? eng_bf16_to_f32(w16[i])
                                                  : eng_f16_to_f32(w16[i]);
    return out;
}

static matrices matrices_of(const eng_layer *l, const layer_config *lc)
{
    int64_t Q = lc->H * lc->D, W = lc->Hkv * lc->D;
    matrices m = {widen(l, l->w_q, l->w16_q, Q * lc->E), widen(l, l->w_k, l->w16_k, W * lc->E),
                  widen(l, l->w_v, l->w16_v, W * lc->E), widen(l, l->w_o, l->w16_o, lc->E * Q)};
    return m;
}

static void matrices_free(matrices *m)
{
    free(m->q);
    free(m->k);
    free(m->v);
    free(m->o);
}

/* y [L, rows] = x [L, cols] W^T + b, in double. */
static void project(const float *x, const float *w, const float *b, int64_t rows, int64_t cols,
                    double *y)
{
    for (int64_t t = 0; t < L_SEQ; t++)
        for (int64_t r = 0; r < rows; r++) {
            double acc = b ? b[r] : 0;
            for (int64_t c = 0; c < cols; c++)
                acc += (double)x[t * cols + c] * w[r * cols + c];
            y[t * rows + r] = acc;
        }
}

/* RoPE over every head of y [L, heads D], pairing channel i with i + D/2. */
static void rotate(double *y, int64_t heads, const layer_config *lc)
{
    int64_t D = lc->D, half = D / 2;
    for (int64_t t = 0; t < L_SEQ; t++)
        for (int64_t h = 0; h < heads; h++) {
            double *v = y + (t * heads + h) * D;
            for (int64_t i = 0; i < half; i++) {
                double a = (double)t * lc->inv_freq[i];
                double c = cos(a) * lc->attention_factor, s = sin(a) * lc->attention_factor;
                double x1 = v[i], x2 = v[i + half];
                v[i] = x1 * c - x2 * s;
                v[i + half] = x2 * c + x1 * s;
            }
        }
}

/* The attention of head h for query i over keys max(0, i-W+1)..i (all up to i when !window). */
static void attend(const double *q, const double *k, const double *v, const eng_layer *l,
                   const layer_config *lc, bool window, int64_t h, int64_t i, double *out)
{
    int64_t D = lc->D, g = h / (lc->H / lc->Hkv), first = window ? i - lc->window + 1 : 0;
    double s[L_SEQ], m = l->sinks ? (double)l->sinks[h] : -INFINITY, z = 0;
    first = first < 0 ? 0 : first;
    for (int64_t j = first; j <= i; j++) {
        double d = 0;
        for (int64_t c = 0; c < D; c++)
            d += q[(i * lc->H + h) * D + c] * k[(j * lc->Hkv + g) * D + c];
        d *= lc->scale;
        s[j] = lc->softcap > 0 ? lc->softcap * tanh(d / lc->softcap) : d;
        m = fmax(m, s[j]);
    }
    for (int64_t j = first; j <= i; j++)
        z += exp(s[j] - m);
    if (l->sinks)
        z += exp((double)l->sinks[h] - m);
    for (int64_t c = 0; c < D; c++) {
        double acc = 0;
        for (int64_t j = first; j <= i; j++)
            acc += exp(s[j] - m) / z * v[(j * lc->Hkv + g) * D + c];
        out[c] = acc;
    }
}

/* The layer's output [L, E] for x [L, E], with or without its window. */
static void forward(const eng_layer *l, const matrices *w, const layer_config *lc, const float *x,
                    bool window, float *y)
{
    int64_t E = lc->E, Q = lc->H * lc->D, W = lc->Hkv * lc->D;
    double *q = calloc((size_t)(L_SEQ * Q), sizeof *q), *k = calloc((size_t)(L_SEQ * W), sizeof *k);
    double *v = calloc((size_t)(L_SEQ * W), sizeof *v), *a = calloc((size_t)(L_SEQ * Q), sizeof *a);
    project(x, w->q, l->b_q, Q, E, q);
    project(x, w->k, l->b_k, W, E, k);
    project(x, w->v, l->b_v, W, E, v);
    rotate(q, lc->H, lc);
    rotate(k, lc->Hkv, lc);
    for (int64_t i = 0; i < L_SEQ; i++)
        for (int64_t h = 0; h < lc->H; h++)
            attend(q, k, v, l, lc, window, h, i, a + (i * lc->H + h) * lc->D);
    for (int64_t t = 0; t < L_SEQ; t++)
        for (int64_t r = 0; r < E; r++) {
            double acc = l->b_o ? l->b_o[r] : 0;
            for (int64_t c = 0; c < Q; c++)
                acc += a[t * Q + c] * w->o[r * Q + c];
            y[t * E + r] = (float)acc;
        }
    free(q);
    free(k);
    free(v);
    free(a);
}

/* max |reply - want| / max |want|. */
static double rel_error(const json_t *reply, const float *want, int64_t n)
{
    const json_t *d = json_object_get(json_object_get(reply, "output"), "data");
    if (json_array_size(d) != (size_t)n)
        return INFINITY;
    double worst = 0, scale = 0;
    for (int64_t i = 0; i < n; i++) {
        scale = fmax(scale, fabs((double)want[i]));
        worst = fmax(worst, fabs(json_number_value(json_array_get(d, (size_t)i)) - want[i]));
    }
    return worst / scale;
}

static json_t *serve(const char *name, const float *x, int64_t E, int *status)
{
    int64_t shape[2] = {L_SEQ, E};
    char *t = json_tensor_b64(x, shape, 2);
    size_t len = strlen(t) + 256;
    char *body = malloc(len);
    snprintf(body, len, "{\"model\":\"%s\",\"input\":%s,\"output_encoding\":\"flat\"}", name, t);
    free(t);
    api_call call = {.body = body,
                     .body_len = strlen(body),
                     .content_type = "application/json",
                     .pool = pool,
                     .models = models};
    api_reply reply;
    api_mha(&call, &reply);
    *status = reply.status;
    json_t *j = json_loadb(reply.body, reply.body_len, 0, NULL);
    api_reply_free(&reply);
    free(body);
    return j;
}

static void check_sliding_layer(const char *family)
{
    static layer_config lc;
    char dir[512], err[600], name[64];
    if (!read_config(family, &lc))
        return;
    snprintf(dir, sizeof dir, "%s/%s", cases_dir, family);
    snprintf(name, sizeof name, "%s_layer0", family);
    eng_layer *l = api_checkpoint_load(name, dir, 0, NULL, err, sizeof err);
    CHECKF(l != NULL, "%s: %s", family, err);
    if (!l)
        return;
    matrices w = matrices_of(l, &lc);
    if (!api_models_add(models, l, err, sizeof err)) {
        matrices_free(&w);
        return;
    }
    int64_t n = L_SEQ * lc.E;
    float *x = malloc((size_t)n * sizeof *x), *want = malloc((size_t)n * sizeof *want);
    float *unwindowed = malloc((size_t)n * sizeof *unwindowed);
    uint64_t rng = 7;
    for (int64_t i = 0; i < n; i++)
        x[i] = rng_sym(&rng, 1.0);
    forward(l, &w, &lc, x, true, want);
    forward(l, &w, &lc, x, false, unwindowed);
    matrices_free(&w);
    int status;
    json_t *reply = serve(name, x, lc.E, &status);
    double e = status == 200 ? rel_error(reply, want, n) : INFINITY;
    double apart = status == 200 ? rel_error(reply, unwindowed, n) : 0;
    CHECKF(e <= 1e-5, "%s: %d, %.3g x max|output| from the float64 pass", family, status, e);
    CHECKF(apart > 1e-3, "%s: only %.3g from the pass without the window", family, apart);
    printf("     %s layer 0 (window %lld, %d tokens): %.2g x max|output|\n", family,
           (long long)lc.window, L_SEQ, e);
    json_decref(reply);
    free(x);
    free(want);
    free(unwindowed);
}

static void test_gemma2_sliding_layer_matches_a_float64_pass(void)
{
    check_sliding_layer("gemma2");
}

static void test_gpt_oss_sliding_layer_matches_a_float64_pass(void)
{
    check_sliding_layer("gpt_oss");
}

int main(void)
{
    eng_error err;
    cases_dir = getenv("ATTND_HF_CASES") ? getenv("ATTND_HF_CASES") : "tests/api/hf/cases";
    pool = eng_pool_new(2, &err);
    models = api_models_new();
    if (!pool || !models) {
        printf("FAIL set-up\n0 passed, 1 failed\n");
        return 1;
    }
    RUN(test_gemma2_sliding_layer_matches_a_float64_pass);
    RUN(test_gpt_oss_sliding_layer_matches_a_float64_pass);
    api_models_free(models);
    eng_pool_free(pool);
    return check_report();
}
