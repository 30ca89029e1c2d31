/*
 * test_layer16.c - layers read from F16 and BF16 safetensors files keep their projection
 * matrices in 16 bits (engine.h eng_layer: w16_*), half the memory, and lose nothing.
 *
 * F16 and BF16 values widen to fp32 exactly, so a 16-bit layer must compute bit for bit what a
 * layer of fp32 weights of the same values computes: in float32 precision (the weights widened
 * as they are packed) and in bfloat16 (rounding a BF16 weight to bf16 is the identity; an F16
 * one is rounded as its fp32 copy was), for self- and cross-attention, packed in_proj and
 * separate projections, grouped-query heads, biases, bias_kv, zero attention, RoPE and weights.
 * Each case prints the two layers' bytes. The Makefile runs it once per kernel set.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api/models/safetensors.h"
#include "engine/engine.h"
#include "tests/support/check.h"
#include "tests/support/named_layer.h"
#include "tests/support/safetensors_writer.h"
#include "tests/support/util.h"

static char dir[] = "/tmp/attnd_layer16_XXXXXX";

typedef struct {
    const char *name;
    int64_t E, H, Hkv, kdim, vdim; /* kdim = vdim = E: a packed in_proj_weight */
    bool cross;
} layer_case;

static const layer_case cases[] = {
    {"torch packed in_proj, bias_kv, E 160 (two widening steps)", 160, 4, 4, 160, 160, false},
    {"separate projections, GQA, cross-attention (kdim 40, vdim 72)", 128, 8, 2, 40, 72, true},
};

static float *values(size_t n, stw_dtype dt, uint64_t *rng, double amp)
{
    float *x = xcalloc(n, sizeof *x);
    for (size_t i = 0; i < n; i++) {
        float f = rng_sym(rng, amp);
        x[i] =
            dt == STW_F16 ? eng_f16_to_f32(eng_f32_to_f16(f)) : eng_bf16_to_f32(eng_f32_to_bf16(f));
    }
    return x;
}

typedef struct {
    float *w[4], *b[4], *bias_kv[2];
} raw_weights;

/* Writes case c's file in dtype dt and builds the same layer from fp32 tensors of its values;
 * *loaded is the file's layer. */
static eng_layer *make_layers(const layer_case *c, stw_dtype dt, eng_layer **loaded)
{
    uint64_t rng = 77 + (uint64_t)dt;
    int64_t E = c->E, W = c->Hkv * (E / c->H);
    raw_weights r;
    double amp = 1.0 / 8.0;
    r.w[0] = values((size_t)(E * E), dt, &rng, amp);
    r.w[1] = values((size_t)(W * c->kdim), dt, &rng, amp);
    r.w[2] = values((size_t)(W * c->vdim), dt, &rng, amp);
    r.w[3] = values((size_t)(E * E), dt, &rng, amp);
    r.b[0] = values((size_t)E, dt, &rng, amp);
    r.b[1] = values((size_t)W, dt, &rng, amp);
    r.b[2] = values((size_t)W, dt, &rng, amp);
    r.b[3] = values((size_t)E, dt, &rng, amp);
    r.bias_kv[0] = values((size_t)W, dt, &rng, 1.0);
    r.bias_kv[1] = values((size_t)W, dt, &rng, 1.0);
    char path[128];
    snprintf(path, sizeof path, "%s/layer_%d.safetensors", dir, (int)dt);
    stw_meta meta[2] = {{"num_heads", c->H == 4 ? "4" : "8"},
                        {"num_kv_heads", c->Hkv == 4 ? "4" : "2"}};
    eng_weight refs[10];
    size_t n;
    float *packed_w = NULL, *packed_b = NULL;
    if (!c->cross) {
        packed_w = xcalloc((size_t)(3 * E * E), sizeof(float));
        packed_b = xcalloc((size_t)(3 * E), sizeof(float));
        for (int i = 0; i < 3; i++) {
            memcpy(packed_w + i * E * E, r.w[i], (size_t)(E * E) * sizeof(float));
            memcpy(packed_b + i * E, r.b[i], (size_t)E * sizeof(float));
        }
        stw_tensor t[6] = {{"in_proj_weight", dt, 2, {3 * E, E}, packed_w},
                           {"in_proj_bias", dt, 1, {3 * E}, packed_b},
                           {"out_proj.weight", dt, 2, {E, E}, r.w[3]},
                           {"out_proj.bias", dt, 1, {E}, r.b[3]},
                           {"bias_k", dt, 3, {1, 1, W}, r.bias_kv[0]},
                           {"bias_v", dt, 3, {1, 1, W}, r.bias_kv[1]}};
        CHECK(stw_save(path, t, 6, meta, 2));
        eng_weight f[6] = {{"in_proj_weight", ENG_DTYPE_F32, packed_w, 2, {3 * E, E}},
                           {"in_proj_bias", ENG_DTYPE_F32, packed_b, 1, {3 * E}},
                           {"out_proj.weight", ENG_DTYPE_F32, r.w[3], 2, {E, E}},
                           {"out_proj.bias", ENG_DTYPE_F32, r.b[3], 1, {E}},
                           {"bias_k", ENG_DTYPE_F32, r.bias_kv[0], 3, {1, 1, W}},
                           {"bias_v", ENG_DTYPE_F32, r.bias_kv[1], 3, {1, 1, W}}};
        memcpy(refs, f, sizeof f);
        n = 6;
    } else {
        stw_tensor t[8] = {{"q_proj.weight", dt, 2, {E, E}, r.w[0]},
                           {"k_proj.weight", dt, 2, {W, c->kdim}, r.w[1]},
                           {"v_proj.weight", dt, 2, {W, c->vdim}, r.w[2]},
                           {"o_proj.weight", dt, 2, {E, E}, r.w[3]},
                           {"q_proj.bias", dt, 1, {E}, r.b[0]},
                           {"k_proj.bias", dt, 1, {W}, r.b[1]},
                           {"v_proj.bias", dt, 1, {W}, r.b[2]},
                           {"o_proj.bias", dt, 1, {E}, r.b[3]}};
        CHECK(stw_save(path, t, 8, meta, 2));
        eng_weight f[8] = {{"q_proj.weight", ENG_DTYPE_F32, r.w[0], 2, {E, E}},
                           {"k_proj.weight", ENG_DTYPE_F32, r.w[1], 2, {W, c->kdim}},
                           {"v_proj.weight", ENG_DTYPE_F32, r.w[2], 2, {W, c->vdim}},
                           {"o_proj.weight", ENG_DTYPE_F32, r.w[3], 2, {E, E}},
                           {"q_proj.bias", ENG_DTYPE_F32, r.b[0], 1, {E}},
                           {"k_proj.bias", ENG_DTYPE_F32, r.b[1], 1, {W}},
                           {"v_proj.bias", ENG_DTYPE_F32, r.b[2], 1, {W}},
                           {"o_proj.bias", ENG_DTYPE_F32, r.b[3], 1, {E}}};
        memcpy(refs, f, sizeof f);
        n = 8;
    }
    eng_error err;
    *loaded = api__st_layer_load("file", path, 0, 0, &err);
    CHECKF(*loaded != NULL, "[%s] load: %s", c->name, *loaded ? "" : err.message);
    eng_layer *fp32 = named_layer("fp32", refs, n, c->H, c->Hkv, &err);
    CHECKF(fp32 != NULL, "[%s] from tensors: %s", c->name, fp32 ? "" : err.message);
    unlink(path);
    for (int i = 0; i < 4; i++)
        free(r.w[i]), free(r.b[i]);
    free(r.bias_kv[0]), free(r.bias_kv[1]), free(packed_w), free(packed_b);
    return fp32;
}

static int64_t first_difference(const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof a[i]) != 0)
            return (int64_t)i;
    return -1;
}

/* One forward pass of each layer on the same inputs: the same bits out. */
static void check_forward(eng_pool *pool, const layer_case *c, const eng_layer *fp32,
                          const eng_layer *half, eng_precision precision, eng_positional pos,
                          const char *about)
{
    const int64_t B = 2, L = 67, S = c->cross ? 45 : L, E = c->E;
    uint64_t rng = 5;
    float *x = xcalloc((size_t)(B * L * E), sizeof(float));
    float *kin = xcalloc((size_t)(B * S * c->kdim), sizeof(float));
    float *vin = xcalloc((size_t)(B * S * c->vdim), sizeof(float));
    for (int64_t i = 0; i < B * L * E; i++)
        x[i] = rng_sym(&rng, 1.0);
    for (int64_t i = 0; i < B * S * c->kdim; i++)
        kin[i] = rng_sym(&rng, 1.0);
    for (int64_t i = 0; i < B * S * c->vdim; i++)
        vin[i] = rng_sym(&rng, 1.0);
    size_t no = (size_t)(B * L * E);
    float *out[2];
    float *w[2];
    for (int k = 0; k < 2; k++) {
        eng_mha_args a = {0};
        a.layer = k == 0 ? fp32 : half;
        a.B = B;
        a.L = L;
        a.x = x;
        if (c->cross) {
            a.S = S;
            a.key_in = kin;
            a.value_in = vin;
        } else {
            a.causal = true;
        }
        a.add_zero_attn = true;
        a.positional = pos;
        a.precision = precision;
        size_t nw = (size_t)(B * L * (S + eng_mha_extra_keys(&a)));
        out[k] = xcalloc(no, sizeof(float));
        w[k] = xcalloc(nw, sizeof(float));
        a.out = out[k];
        a.weights_mode = ENG_WEIGHTS_MEAN;
        a.weights = w[k];
        eng_error err;
        CHECKF(eng_mha(pool, &a, NULL, &err) == ENG_OK, "[%s, %s] layer %d: %s", c->name, about, k,
               err.message);
        if (k == 1) {
            int64_t d = first_difference(out[0], out[1], no);
            CHECKF(d < 0, "[%s, %s] out[%lld]: %a with 16-bit weights, %a with fp32 ones", c->name,
                   about, (long long)d, d < 0 ? 0.0 : (double)out[1][d],
                   d < 0 ? 0.0 : (double)out[0][d]);
            d = first_difference(w[0], w[1], nw);
            CHECKF(d < 0, "[%s, %s] weights[%lld] differ", c->name, about, (long long)d);
            CHECKF(eng_mha_scratch_bytes(&a, eng_pool_threads(pool)) > 0, "scratch bytes");
        }
    }
    for (int k = 0; k < 2; k++)
        free(out[k]), free(w[k]);
    free(x), free(kin), free(vin);
}

static void test_16bit_layers_compute_what_fp32_layers_do(void)
{
    eng_error err;
    eng_pool *pool = eng_pool_new(2, &err);
    CHECK(pool != NULL);
    const stw_dtype dts[2] = {STW_BF16, STW_F16};
    const char *names[2] = {"BF16", "F16"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int d = 0; d < 2; d++) {
            const layer_case *c = &cases[i];
            eng_layer *half = NULL, *fp32 = make_layers(c, dts[d], &half);
            if (!half || !fp32) {
                eng_layer_free(half);
                eng_layer_free(fp32);
                continue;
            }
            CHECKF(half->params16 && !half->w_q && !half->w_o &&
                       half->w16_dtype == (dts[d] == STW_BF16 ? ENG_DTYPE_BF16 : ENG_DTYPE_F16),
                   "[%s] a %s file's matrices are not kept in 16 bits", c->name, names[d]);
            CHECK_EQ_INT(eng_layer_params(half), eng_layer_params(fp32));
            int64_t E = c->E, W = c->Hkv * (E / c->H);
            size_t matrices = (size_t)(2 * E * E + W * (c->kdim + c->vdim));
            CHECK_EQ_INT(eng_layer_bytes(fp32) - eng_layer_bytes(half), 2 * matrices);
            printf("  %s, %s: %zu bytes with 16-bit matrices, %zu with fp32 (%.3f)\n", c->name,
                   names[d], eng_layer_bytes(half), eng_layer_bytes(fp32),
                   (double)eng_layer_bytes(half) / (double)eng_layer_bytes(fp32));
            check_forward(pool, c, fp32, half, ENG_PRECISION_FLOAT32, ENG_POSITIONAL_NONE,
                          "float32");
            check_forward(pool, c, fp32, half, ENG_PRECISION_BFLOAT16, ENG_POSITIONAL_NONE,
                          "bfloat16");
            check_forward(pool, c, fp32, half, ENG_PRECISION_FLOAT32, ENG_POSITIONAL_ROPE,
                          "float32, rope");
            check_forward(pool, c, fp32, half, ENG_PRECISION_BFLOAT16, ENG_POSITIONAL_SINUSOIDAL,
                          "bfloat16, sinusoidal");
            eng_layer_free(half);
            eng_layer_free(fp32);
        }
    eng_pool_free(pool);
}

/* A file whose matrices mix dtypes keeps them fp32, as before. */
static void test_mixed_dtypes_stay_fp32(void)
{
    enum { E = 8 };
    float w[E * E];
    for (int i = 0; i < E * E; i++)
        w[i] = (float)(i % 7) / 8.0f;
    stw_tensor t[4] = {{"q_proj.weight", STW_BF16, 2, {E, E}, w},
                       {"k_proj.weight", STW_F16, 2, {E, E}, w},
                       {"v_proj.weight", STW_BF16, 2, {E, E}, w},
                       {"o_proj.weight", STW_BF16, 2, {E, E}, w}};
    stw_meta meta[1] = {{"num_heads", "2"}};
    char path[128];
    snprintf(path, sizeof path, "%s/mixed.safetensors", dir);
    CHECK(stw_save(path, t, 4, meta, 1));
    eng_error err;
    eng_layer *l = api__st_layer_load("mixed", path, 0, 0, &err);
    CHECK(l && l->w_q && !l->params16 && l->w16_dtype == ENG_DTYPE_F32);
    if (l)
        CHECK_EQ_INT(eng_layer_bytes(l), 4 * 4 * E * E + l->panels_floats * sizeof(float));
    eng_layer_free(l);
    unlink(path);
}

int main(void)
{
    if (test_kernels_skip())
        return 0;
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    RUN_WITHIN(test_16bit_layers_compute_what_fp32_layers_do, 300);
    RUN(test_mixed_dtypes_stay_fp32);
    rmdir(dir);
    return check_report();
}
