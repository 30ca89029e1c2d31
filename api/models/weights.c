/*
 * weights.c - the names of an attention layer's tensors, and the role each plays.
 *
 * Three naming schemes are accepted: PyTorch's nn.MultiheadAttention state dict (in_proj_weight,
 * q_proj_weight, out_proj.weight, bias_k, ...), Hugging Face-style q_proj/k_proj/v_proj/o_proj
 * (.weight, .bias) and the tutorial's W_Q/W_K/W_V/W_O. Each name maps to a field of
 * eng_layer_weights; the engine then checks that the roles make one layer, and its messages
 * name each tensor by the label it keeps (its name here).
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "api/models/weights.h"

static const struct {
    const char *name;
    size_t role; /* offset of the field in eng_layer_weights */
} known_names[] = {
    {"in_proj_weight", offsetof(eng_layer_weights, in_proj_w)},
    {"in_proj_bias", offsetof(eng_layer_weights, in_proj_b)},
    {"q_proj_weight", offsetof(eng_layer_weights, q_w)},
    {"k_proj_weight", offsetof(eng_layer_weights, k_w)},
    {"v_proj_weight", offsetof(eng_layer_weights, v_w)},
    {"out_proj.weight", offsetof(eng_layer_weights, o_w)},
    {"out_proj.bias", offsetof(eng_layer_weights, o_b)},
    {"bias_k", offsetof(eng_layer_weights, bias_k)},
    {"bias_v", offsetof(eng_layer_weights, bias_v)},
    {"q_proj.weight", offsetof(eng_layer_weights, q_w)},
    {"q_proj.bias", offsetof(eng_layer_weights, q_b)},
    {"k_proj.weight", offsetof(eng_layer_weights, k_w)},
    {"k_proj.bias", offsetof(eng_layer_weights, k_b)},
    {"v_proj.weight", offsetof(eng_layer_weights, v_w)},
    {"v_proj.bias", offsetof(eng_layer_weights, v_b)},
    {"o_proj.weight", offsetof(eng_layer_weights, o_w)},
    {"o_proj.bias", offsetof(eng_layer_weights, o_b)},
    {"W_Q.weight", offsetof(eng_layer_weights, q_w)},
    {"W_Q.bias", offsetof(eng_layer_weights, q_b)},
    {"W_K.weight", offsetof(eng_layer_weights, k_w)},
    {"W_K.bias", offsetof(eng_layer_weights, k_b)},
    {"W_V.weight", offsetof(eng_layer_weights, v_w)},
    {"W_V.bias", offsetof(eng_layer_weights, v_b)},
    {"W_O.weight", offsetof(eng_layer_weights, o_w)},
    {"W_O.bias", offsetof(eng_layer_weights, o_b)},
};

static eng_status fail(eng_error *err, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static eng_status fail(eng_error *err, const char *field, const char *fmt, ...)
{
    if (!err)
        return ENG_EFORMAT;
    va_list ap;
    memset(err, 0, sizeof *err);
    err->status = ENG_EFORMAT;
    snprintf(err->field, sizeof err->field, "%s", field);
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return ENG_EFORMAT;
}

static eng_weight *role_at(eng_layer_weights *w, size_t offset)
{
    return (eng_weight *)((char *)w + offset);
}

/* The name a missing q/k/v weight (slot 0, 1 or 2) has in the scheme of those present. */
static const char *missing_weight_name(const eng_layer_weights *w, int slot)
{
    static const char *const schemes[][3] = {
        {"q_proj.weight", "k_proj.weight", "v_proj.weight"},
        {"q_proj_weight", "k_proj_weight", "v_proj_weight"},
        {"W_Q.weight", "W_K.weight", "W_V.weight"},
    };
    const eng_weight *given[3] = {&w->q_w, &w->k_w, &w->v_w};
    for (size_t s = 0; s < sizeof schemes / sizeof schemes[0]; s++)
        for (int k = 0; k < 3; k++)
            if (given[k]->data && given[k]->label && strcmp(given[k]->label, schemes[s][k]) == 0)
                return schemes[s][slot];
    return schemes[0][slot];
}

eng_status api__weights_by_name(const eng_weight *named, size_t n, eng_layer_weights *out,
                                eng_error *err)
{
    memset(out, 0, sizeof *out);
    for (size_t i = 0; i < n; i++) {
        const char *name = named[i].label ? named[i].label : "";
        size_t k = 0;
        while (k < sizeof known_names / sizeof known_names[0] &&
               strcmp(known_names[k].name, name) != 0)
            k++;
        if (k == sizeof known_names / sizeof known_names[0])
            return fail(err, name, "tensor '%s' is not a multi-head attention parameter", name);
        eng_weight *slot = role_at(out, known_names[k].role);
        if (slot->data)
            return fail(err, name, "tensor '%s' repeats '%s'", name, slot->label);
        if (!named[i].data)
            return fail(err, name, "tensor '%s' has no data", name);
        *slot = named[i];
    }
    if (!out->o_w.data)
        return fail(err, "out_proj.weight",
                    "no output projection (out_proj.weight, o_proj.weight or W_O.weight)");
    const eng_weight *qkv[3] = {&out->q_w, &out->k_w, &out->v_w};
    bool packed_conflict =
        out->in_proj_w.data && (out->q_w.data || out->k_w.data || out->v_w.data || out->q_b.data ||
                                out->k_b.data || out->v_b.data);
    if (!out->in_proj_w.data && !packed_conflict)
        for (int i = 0; i < 3; i++)
            if (!qkv[i]->data) {
                const char *name = missing_weight_name(out, i);
                return fail(err, name,
                            "no tensor '%s': the query, key and value projection weights are "
                            "incomplete",
                            name);
            }
    return ENG_OK;
}
