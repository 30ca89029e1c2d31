/*
 * decoder.c - what the decoder layers of Hugging Face checkpoints add to an attention layer:
 * RoPE over part of each head with rescaled frequencies, q/k norms, attention sinks.
 *
 * Each step follows transformers' arithmetic (float32 inverse frequencies, float32 angles
 * pos * inv_freq, cos and sin times the attention factor, then x cos + rotate(x) sin), so that
 * a layer reproduces the module's output to float32 rounding. eng_mha calls
 * eng__decoder_project on the q and k rows of each projection task and eng__decoder_sinks on
 * the attention's output rows.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/internal.h"

#define MAX_ROTARY_DIM 4096

static float get_mscale(double scale, double mscale)
{
    return scale <= 1.0 ? 1.0f : (float)(0.1 * mscale * log(scale) + 1.0);
}

/* Where YaRN's ramp from interpolated to extrapolated frequencies lies, in pair indices. */
static double yarn_correction_dim(double rotations, double dim, double base, double positions)
{
    return dim * log(positions / (rotations * 2.0 * M_PI)) / (2.0 * log(base));
}

static void yarn_inv_freq(const eng_rope_params *r, float *inv)
{
    int64_t dim = r->rotary_dim, half = dim / 2;
    double fast = r->beta_fast > 0 ? r->beta_fast : 32.0;
    double slow = r->beta_slow > 0 ? r->beta_slow : 1.0;
    double low = yarn_correction_dim(fast, (double)dim, r->base, r->original_max_positions);
    double high = yarn_correction_dim(slow, (double)dim, r->base, r->original_max_positions);
    if (r->truncate) {
        low = floor(low);
        high = ceil(high);
    }
    low = low > 0 ? low : 0;
    high = high < (double)(dim - 1) ? high : (double)(dim - 1);
    if (low == high)
        high += 0.001;
    for (int64_t i = 0; i < half; i++) {
        float pos_freq = powf((float)r->base, (float)(2 * i) / (float)dim);
        float extrapolated = 1.0f / pos_freq;
        float interpolated = 1.0f / ((float)r->factor * pos_freq);
        float ramp = ((float)i - (float)low) / (float)(high - low);
        ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
        float keep = 1.0f - ramp; /* the share of the extrapolated frequency */
        inv[i] = interpolated * (1.0f - keep) + extrapolated * keep;
    }
}

static void llama3_inv_freq(const eng_rope_params *r, float *inv, int64_t half)
{
    float old = (float)r->original_max_positions;
    float low_wavelen = old / (float)r->low_freq_factor;
    float high_wavelen = old / (float)r->high_freq_factor;
    float factor = (float)r->factor;
    for (int64_t i = 0; i < half; i++) {
        float wavelen = (float)(2.0 * M_PI) / inv[i];
        float scaled = wavelen > low_wavelen ? inv[i] / factor : inv[i];
        if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
            float smooth = (old / wavelen - (float)r->low_freq_factor) /
                           (float)(r->high_freq_factor - r->low_freq_factor);
            scaled = (1.0f - smooth) * scaled / factor + smooth * scaled;
        }
        inv[i] = scaled;
    }
}

static eng_status check_rope(const eng_rope_params *r, eng_error *err)
{
    if (r->rotary_dim < 0 || r->rotary_dim % 2 != 0 || r->rotary_dim > MAX_ROTARY_DIM)
        return eng__fail(err, ENG_EINVAL, "rotary_dim",
                         "rotary_dim = %lld must be even and in [0, %d]", (long long)r->rotary_dim,
                         MAX_ROTARY_DIM);
    if (r->rotary_dim == 0)
        return ENG_OK;
    if (!(r->base > 1.0) || !isfinite(r->base))
        return eng__fail(err, ENG_EINVAL, "rope_theta", "rope_theta must be finite and > 1");
    if (r->style != ENG_ROPE_HALF && r->style != ENG_ROPE_INTERLEAVED)
        return eng__fail(err, ENG_EINVAL, "rope_style", "unknown rope style");
    if (r->scaling < ENG_ROPE_SCALING_NONE || r->scaling > ENG_ROPE_SCALING_DYNAMIC)
        return eng__fail(err, ENG_EINVAL, "rope_type", "unknown rope scaling");
    if (r->scaling != ENG_ROPE_SCALING_NONE && (!(r->factor > 0.0) || !isfinite(r->factor)))
        return eng__fail(err, ENG_EINVAL, "factor", "the rope scaling factor must be finite, > 0");
    bool needs_context = r->scaling == ENG_ROPE_SCALING_LLAMA3 ||
                         r->scaling == ENG_ROPE_SCALING_YARN ||
                         r->scaling == ENG_ROPE_SCALING_LONGROPE;
    if (needs_context &&
        (!(r->original_max_positions >= 1.0) || !isfinite(r->original_max_positions)))
        return eng__fail(err, ENG_EINVAL, "original_max_position_embeddings",
                         "original_max_position_embeddings must be a positive number");
    if (r->scaling == ENG_ROPE_SCALING_LLAMA3 &&
        (!(r->low_freq_factor > 0.0) || !(r->high_freq_factor > r->low_freq_factor) ||
         !isfinite(r->high_freq_factor)))
        return eng__fail(err, ENG_EINVAL, "high_freq_factor",
                         "llama3 scaling needs 0 < low_freq_factor < high_freq_factor");
    if (r->scaling == ENG_ROPE_SCALING_YARN &&
        (r->beta_fast < 0 || r->beta_slow < 0 || !isfinite(r->beta_fast) ||
         !isfinite(r->beta_slow) || r->attention_factor < 0 || !isfinite(r->attention_factor) ||
         !isfinite(r->mscale) || !isfinite(r->mscale_all_dim)))
        return eng__fail(err, ENG_EINVAL, "attention_factor",
                         "yarn's beta_fast, beta_slow and attention_factor must be finite, >= 0");
    bool bounded =
        r->scaling == ENG_ROPE_SCALING_LONGROPE || r->scaling == ENG_ROPE_SCALING_DYNAMIC;
    if (bounded && r->max_positions <= 0)
        return eng__fail(err, ENG_EINVAL, "max_position_embeddings",
                         "%s RoPE needs the positions it serves below (max_positions > 0)",
                         r->scaling == ENG_ROPE_SCALING_DYNAMIC ? "dynamic" : "longrope");
    if (r->scaling == ENG_ROPE_SCALING_LONGROPE) {
        if (!r->short_factor)
            return eng__fail(err, ENG_EINVAL, "short_factor", "longrope needs its short_factor");
        for (int64_t i = 0; i < r->rotary_dim / 2; i++)
            if (!(r->short_factor[i] > 0) || !isfinite(r->short_factor[i]))
                return eng__fail(err, ENG_EINVAL, "short_factor",
                                 "short_factor[%lld] must be finite and > 0", (long long)i);
        if (r->attention_factor < 0 || !isfinite(r->attention_factor))
            return eng__fail(err, ENG_EINVAL, "attention_factor",
                             "attention_factor must be finite and >= 0");
    }
    return ENG_OK;
}

eng_status eng_rope_inv_freq(const eng_rope_params *r, float *inv, float *attention_factor,
                             eng_error *err)
{
    eng_status st = check_rope(r, err);
    if (st != ENG_OK)
        return st;
    int64_t dim = r->rotary_dim, half = dim / 2;
    *attention_factor = 1.0f;
    if (r->scaling == ENG_ROPE_SCALING_YARN) {
        yarn_inv_freq(r, inv);
        if (r->attention_factor > 0)
            *attention_factor = (float)r->attention_factor;
        else if (r->mscale > 0 && r->mscale_all_dim > 0)
            *attention_factor =
                get_mscale(r->factor, r->mscale) / get_mscale(r->factor, r->mscale_all_dim);
        else
            *attention_factor = get_mscale(r->factor, 1.0);
        return ENG_OK;
    }
    for (int64_t i = 0; i < half; i++)
        inv[i] = 1.0f / powf((float)r->base, (float)(2 * i) / (float)dim);
    if (r->scaling == ENG_ROPE_SCALING_LONGROPE) {
        for (int64_t i = 0; i < half; i++)
            inv[i] =
                1.0f / (r->short_factor[i] * powf((float)r->base, (float)(2 * i) / (float)dim));
        *attention_factor =
            r->attention_factor > 0 ? (float)r->attention_factor
            : r->factor <= 1.0      ? 1.0f
                               : (float)sqrt(1.0 + log(r->factor) / log(r->original_max_positions));
        return ENG_OK;
    }
    if (r->scaling == ENG_ROPE_SCALING_LINEAR)
        for (int64_t i = 0; i < half; i++)
            inv[i] /= (float)r->factor;
    else if (r->scaling == ENG_ROPE_SCALING_LLAMA3)
        llama3_inv_freq(r, inv, half);
    return ENG_OK;
}

/* ---- The layer ---------------------------------------------------------------------------- */

typedef enum { EXTRA_Q_W, EXTRA_Q_B, EXTRA_K_W, EXTRA_K_B, EXTRA_SINKS, EXTRA_COUNT } extra_role;

static const char *const extra_roles[EXTRA_COUNT] = {"q_norm_w", "q_norm_b", "k_norm_w", "k_norm_b",
                                                     "sinks"};

static int64_t numel(const eng_weight *t)
{
    int64_t n = 1;
    for (int d = 0; d < t->rank; d++)
        n *= t->shape[d];
    return n;
}

static float element(const eng_weight *t, int64_t i)
{
    const unsigned char *p = t->data;
    if (t->dtype == ENG_DTYPE_F32) {
        float f;
        memcpy(&f, p + i * 4, sizeof f);
        return f;
    }
    uint16_t h = (uint16_t)(p[i * 2] | (p[i * 2 + 1] << 8));
    return t->dtype == ENG_DTYPE_F16 ? eng_f16_to_f32(h) : eng_bf16_to_f32(h);
}

/* A norm vector [width] from a tensor of D (shared by the heads) or `width` elements. */
static eng_status copy_norm(const eng_weight *t, const char *role, int64_t D, int64_t width,
                            bool whole, float plus, float *dst, eng_error *err)
{
    int64_t n = numel(t);
    const char *name = eng__weight_label(t, role);
    if (t->rank < 1 || (n != width && (whole || n != D)))
        return eng__fail(err, ENG_EFORMAT, name, "tensor '%s' has %lld elements; expected %lld%s",
                         name, (long long)n, (long long)width, whole ? "" : " (or one head's)");
    for (int64_t i = 0; i < width; i++)
        dst[i] = plus + element(t, n == width ? i : i % D);
    return ENG_OK;
}

static eng_status check_spec(const eng_decoder_spec *sp, int64_t D, eng_error *err)
{
    eng_status st = check_rope(&sp->rope, err);
    if (st != ENG_OK)
        return st;
    if (sp->rope.rotary_dim > D)
        return eng__fail(err, ENG_EINVAL, "rotary_dim", "rotary_dim = %lld exceeds head size %lld",
                         (long long)sp->rope.rotary_dim, (long long)D);
    if (sp->qk_norm < ENG_QK_NORM_NONE || sp->qk_norm > ENG_QK_NORM_LAYER ||
        (sp->qk_norm && (!(sp->qk_norm_eps >= 0) || !isfinite(sp->qk_norm_eps))))
        return eng__fail(err, ENG_EINVAL, "qk_norm", "unknown q/k norm or an invalid epsilon");
    if (sp->scale_set && !isfinite(sp->scale))
        return eng__fail(err, ENG_EINVAL, "scale", "the scale must be finite");
    if (!(sp->softcap >= 0) || !isfinite(sp->softcap))
        return eng__fail(err, ENG_EINVAL, "softcap", "softcap must be finite and >= 0");
    if (sp->window < 0 || sp->window > INT32_MAX)
        return eng__fail(err, ENG_EINVAL, "window", "window must be in [0, 2^31)");
    return ENG_OK;
}

/* The decoder's own weights of `w`, by extra_role (NULL when absent). */
static eng_status extra_weights(const eng_layer_weights *w, const eng_weight *extra[EXTRA_COUNT],
                                eng_error *err)
{
    const eng_weight *all[EXTRA_COUNT] = {&w->q_norm_w, &w->q_norm_b, &w->k_norm_w, &w->k_norm_b,
                                          &w->sinks};
    for (int k = 0; k < EXTRA_COUNT; k++) {
        const eng_weight *t = all[k];
        extra[k] = t->data ? t : NULL;
        if (t->data && (t->rank < 1 || t->rank > 4))
            return eng__fail(err, ENG_EFORMAT, eng__weight_label(t, extra_roles[k]),
                             "tensor '%s' has rank %d", eng__weight_label(t, extra_roles[k]),
                             t->rank);
        for (int d = 0; t->data && d < t->rank; d++)
            if (t->shape[d] <= 0 || t->shape[d] > (INT64_C(1) << 31))
                return eng__fail(err, ENG_EFORMAT, eng__weight_label(t, extra_roles[k]),
                                 "tensor '%s' has dimension %lld",
                                 eng__weight_label(t, extra_roles[k]), (long long)t->shape[d]);
    }
    return ENG_OK;
}

static eng_status fill_decoder(eng_layer *l, const eng_weight *const extra[EXTRA_COUNT],
                               const eng_decoder_spec *sp, eng_error *err)
{
    int64_t H = l->num_heads, D = eng_layer_head_dim(l), Q = H * D, W = l->num_kv_heads * D;
    bool norm = sp->qk_norm != ENG_QK_NORM_NONE, bias = sp->qk_norm == ENG_QK_NORM_LAYER;
    if (norm && (!extra[EXTRA_Q_W] || !extra[EXTRA_K_W]))
        return eng__fail(err, ENG_EFORMAT, extra[EXTRA_Q_W] ? "k_norm_w" : "q_norm_w",
                         "the layer's q/k norm has no weight %s",
                         extra[EXTRA_Q_W] ? "k_norm_w" : "q_norm_w");
    for (int k = 0; k < EXTRA_SINKS; k++)
        if (extra[k] && (!norm || (!bias && (k == EXTRA_Q_B || k == EXTRA_K_B))))
            return eng__fail(err, ENG_EFORMAT, eng__weight_label(extra[k], extra_roles[k]),
                             "tensor '%s' does not belong to this layer's q/k norm",
                             eng__weight_label(extra[k], extra_roles[k]));
    const eng_weight *sinks = extra[EXTRA_SINKS];
    const char *sinks_name = eng__weight_label(sinks, "sinks");
    if (sinks && numel(sinks) != H)
        return eng__fail(err, ENG_EFORMAT, sinks_name, "tensor '%s' has %lld elements, not %lld",
                         sinks_name, (long long)numel(sinks), (long long)H);
    int64_t n = sp->rope.rotary_dim / 2 + (norm ? 2 * (Q + W) : 0) + (sinks ? H : 0);
    l->decoder_params = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!l->decoder_params)
        return eng__fail(err, ENG_ENOMEM, "", "out of memory for the decoder's parameters");
    l->decoder_floats = (size_t)n;
    float *at = l->decoder_params;
    l->inv_freq = at;
    at += sp->rope.rotary_dim / 2;
    eng_status st = ENG_OK;
    if (sp->rope.rotary_dim)
        st = eng_rope_inv_freq(&sp->rope, l->inv_freq, &l->rope_factor, err);
    if (norm && st == ENG_OK) {
        float plus = sp->qk_norm_plus_one ? 1.0f : 0.0f;
        struct {
            float **w, **b;
            int64_t width;
            extra_role rw, rb;
        } parts[2] = {{&l->q_norm_w, &l->q_norm_b, Q, EXTRA_Q_W, EXTRA_Q_B},
                      {&l->k_norm_w, &l->k_norm_b, W, EXTRA_K_W, EXTRA_K_B}};
        for (int i = 0; i < 2 && st == ENG_OK; i++) {
            *parts[i].w = at;
            st = copy_norm(extra[parts[i].rw], extra_roles[parts[i].rw], D, parts[i].width,
                           sp->qk_norm_whole, plus, at, err);
            at += parts[i].width;
            if (st == ENG_OK && extra[parts[i].rb]) {
                *parts[i].b = at;
                st = copy_norm(extra[parts[i].rb], extra_roles[parts[i].rb], D, parts[i].width,
                               sp->qk_norm_whole, 0.0f, at, err);
            }
            at += parts[i].width;
        }
    }
    if (sinks && st == ENG_OK) {
        l->sinks = at;
        for (int64_t h = 0; h < H; h++)
            l->sinks[h] = element(sinks, h);
    }
    l->spec = *sp;
    l->spec.rope.short_factor = NULL; /* borrowed: the frequencies are what the layer keeps */
    l->decoder = true;
    return st;
}

eng_layer *eng_layer_decoder(const char *name, const eng_layer_weights *weights, int64_t num_heads,
                             int64_t num_kv_heads, const eng_decoder_spec *spec, eng_error *err)
{
    const eng_weight *extra[EXTRA_COUNT] = {0};
    if (!spec || !weights) {
        eng__fail(err, ENG_EINVAL, spec ? "weights" : "spec", "no decoder spec or no weights");
        return NULL;
    }
    if (extra_weights(weights, extra, err) != ENG_OK)
        return NULL;
    /* The projections alone go to the assembler, which refuses the decoder's own weights. */
    eng_layer_weights projections = *weights;
    memset(&projections.q_norm_w, 0, sizeof projections.q_norm_w);
    memset(&projections.q_norm_b, 0, sizeof projections.q_norm_b);
    memset(&projections.k_norm_w, 0, sizeof projections.k_norm_w);
    memset(&projections.k_norm_b, 0, sizeof projections.k_norm_b);
    memset(&projections.sinks, 0, sizeof projections.sinks);
    eng_layer *l =
        eng__layer_assemble(name, &projections, num_heads, num_kv_heads, spec->head_dim, true, err);
    if (!l)
        return NULL;
    if (l->bias_k || l->kdim != l->embed_dim || l->vdim != l->embed_dim) {
        eng__fail(err, ENG_EFORMAT,
                  l->bias_k ? eng__weight_label(&weights->bias_k, "bias_k")
                            : eng__weight_label(&weights->k_w, "k_w"),
                  "a decoder layer is self-attention without bias_k/bias_v");
        eng_layer_free(l);
        return NULL;
    }
    if (check_spec(spec, eng_layer_head_dim(l), err) != ENG_OK ||
        fill_decoder(l, extra, spec, err) != ENG_OK) {
        eng_layer_free(l);
        return NULL;
    }
    return l;
}

/* ---- The forward pass --------------------------------------------------------------------- */

/* x[0..n) normalised in place as the layer's q/k norm says, with weights w (and bias b). */
static void norm_group(const eng_decoder_spec *sp, float *x, int64_t n, const float *w,
                       const float *b)
{
    double mean = 0.0, sq = 0.0;
    if (sp->qk_norm == ENG_QK_NORM_LAYER) {
        for (int64_t i = 0; i < n; i++)
            mean += x[i];
        mean /= (double)n;
    }
    for (int64_t i = 0; i < n; i++) {
        double d = x[i] - mean;
        sq += d * d;
    }
    float inv = (float)(1.0 / sqrt((double)(float)(sq / (double)n) + sp->qk_norm_eps));
    for (int64_t i = 0; i < n; i++) {
        float y = ((float)(x[i] - mean)) * inv;
        x[i] = b ? w[i] * y + b[i] : w[i] * y;
    }
}

/* Turns the first rotary_dim channels of each of `heads` heads of one row by angles
 * pos * inv_freq[i] (cos and sin times the attention factor). */
static void rope_row(const eng_layer *l, float *row, int64_t heads, int64_t D, int64_t pos,
                     float *cs)
{
    int64_t half = l->spec.rope.rotary_dim / 2;
    for (int64_t i = 0; i < half; i++) {
        float angle = (float)pos * l->inv_freq[i];
        cs[2 * i] = (float)cos((double)angle) * l->rope_factor;
        cs[2 * i + 1] = (float)sin((double)angle) * l->rope_factor;
    }
    bool halves = l->spec.rope.style == ENG_ROPE_HALF;
    for (int64_t h = 0; h < heads; h++) {
        float *v = row + h * D;
        for (int64_t i = 0; i < half; i++) {
            int64_t a = halves ? i : 2 * i, b = halves ? i + half : 2 * i + 1;
            float c = cs[2 * i], s = cs[2 * i + 1], x = v[a], y = v[b];
            v[a] = x * c - y * s;
            v[b] = y * c + x * s;
        }
    }
}

void eng__decoder_project(const eng_layer *l, bool query, float *rows, int64_t n, int64_t ld,
                          int64_t pos0)
{
    int64_t D = eng_layer_head_dim(l), heads = query ? l->num_heads : l->num_kv_heads;
    int64_t width = heads * D;
    const float *w = query ? l->q_norm_w : l->k_norm_w, *b = query ? l->q_norm_b : l->k_norm_b;
    float cs[MAX_ROTARY_DIM];
    for (int64_t t = 0; t < n; t++) {
        float *row = rows + t * ld;
        if (w && l->spec.qk_norm_whole)
            norm_group(&l->spec, row, width, w, b);
        else if (w)
            for (int64_t h = 0; h < heads; h++)
                norm_group(&l->spec, row + h * D, D, w + h * D, b ? b + h * D : NULL);
        if (l->spec.rope.rotary_dim)
            rope_row(l, row, heads, D, pos0 + t, cs);
    }
}

void eng__decoder_sinks(const eng_layer *l, float *o, int64_t B, int64_t L, const float *lse)
{
    int64_t H = l->num_heads, D = eng_layer_head_dim(l), Q = H * D;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t t = 0; t < L; t++) {
                float m = lse[(b * H + h) * L + t];
                float keep = isinf(m) ? 0.0f : (float)(1.0 / (1.0 + exp((double)l->sinks[h] - m)));
                float *row = o + (b * L + t) * Q + h * D;
                for (int64_t d = 0; d < D; d++)
                    row[d] *= keep;
            }
}
