/*
 * named_layer.c - layers from named tensors for the tests (named_layer.h).
 */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "api/models/weights.h"
#include "tests/support/named_layer.h"

#define MAX_NAMED 32

/* Splits the decoder's own tensors off into their roles; the rest go to the api's names. */
static bool roles_of(const eng_weight *t, size_t n, bool decoder, eng_layer_weights *w,
                     eng_error *err)
{
    eng_weight rest[MAX_NAMED];
    size_t k = 0;
    eng_layer_weights extra;
    memset(&extra, 0, sizeof extra);
    for (size_t i = 0; i < n; i++) {
        const char *name = t[i].label ? t[i].label : "";
        eng_weight *slot = !decoder                             ? NULL
                           : strcmp(name, "q_norm.weight") == 0 ? &extra.q_norm_w
                           : strcmp(name, "q_norm.bias") == 0   ? &extra.q_norm_b
                           : strcmp(name, "k_norm.weight") == 0 ? &extra.k_norm_w
                           : strcmp(name, "k_norm.bias") == 0   ? &extra.k_norm_b
                           : strcmp(name, "sinks") == 0         ? &extra.sinks
                                                                : NULL;
        if (slot)
            *slot = t[i];
        else if (k < MAX_NAMED)
            rest[k++] = t[i];
    }
    if (api__weights_by_name(rest, k, w, err) != ENG_OK)
        return false;
    w->q_norm_w = extra.q_norm_w;
    w->q_norm_b = extra.q_norm_b;
    w->k_norm_w = extra.k_norm_w;
    w->k_norm_b = extra.k_norm_b;
    w->sinks = extra.sinks;
    return true;
}

eng_layer *named_layer(const char *name, const eng_weight *t, size_t n, int64_t heads,
                       int64_t kv_heads, eng_error *err)
{
    eng_layer_weights w;
    return roles_of(t, n, false, &w, err) ? eng_layer_new(name, &w, heads, kv_heads, false, err)
                                          : NULL;
}

eng_layer *named_layer16(const char *name, const eng_weight *t, size_t n, int64_t heads,
                         int64_t kv_heads, eng_error *err)
{
    eng_layer_weights w;
    return roles_of(t, n, false, &w, err) ? eng_layer_new(name, &w, heads, kv_heads, true, err)
                                          : NULL;
}

eng_layer *named_decoder(const char *name, const eng_weight *t, size_t n, int64_t heads,
                         int64_t kv_heads, const eng_decoder_spec *spec, eng_error *err)
{
    eng_layer_weights w;
    return roles_of(t, n, true, &w, err) ? eng_layer_decoder(name, &w, heads, kv_heads, spec, err)
                                         : NULL;
}
