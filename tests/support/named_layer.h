/*
 * named_layer.h - layers from named tensors for the tests, as a file or a request names them:
 * the projections through the api's names (api/models/weights.c), and, for decoder layers,
 * "q_norm.weight", "q_norm.bias", "k_norm.weight", "k_norm.bias" and "sinks" for the roles
 * the engine's eng_layer_weights has beside them. The names stay the weights' labels, so that
 * the engine's errors name the tensors as before.
 *
 *     eng_weight t[2] = {{"in_proj_weight", ENG_DTYPE_F32, w, 2, {3 * E, E}},
 *                        {"out_proj.weight", ENG_DTYPE_F32, o, 2, {E, E}}};
 *     eng_layer *l = named_layer("m", t, 2, H, 0, &err);
 */
#ifndef ATTND_TESTS_SUPPORT_NAMED_LAYER_H
#define ATTND_TESTS_SUPPORT_NAMED_LAYER_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"

/* eng_layer_new (fp32 copies) of the roles the names give; NULL with err on failure. */
eng_layer *named_layer(const char *name, const eng_weight *t, size_t n, int64_t heads,
                       int64_t kv_heads, eng_error *err);

/* As named_layer, keeping 16-bit projection matrices in 16 bits (what a --model FILE gets). */
eng_layer *named_layer16(const char *name, const eng_weight *t, size_t n, int64_t heads,
                         int64_t kv_heads, eng_error *err);

/* eng_layer_decoder of the roles the names give. */
eng_layer *named_decoder(const char *name, const eng_weight *t, size_t n, int64_t heads,
                         int64_t kv_heads, const eng_decoder_spec *spec, eng_error *err);

#endif
