/*
 * weights.h - which role a named tensor plays in an attention layer (api/models/weights.c):
 * the names of PyTorch's nn.MultiheadAttention state dict, Hugging Face-style q_proj/k_proj/
 * v_proj/o_proj and the tutorial's W_Q/W_K/W_V/W_O, for --model FILE and a request's inline
 * weights. The engine takes weights by role only (eng_layer_weights).
 *
 * Usage:
 *
 *     eng_weight named[2] = {{"in_proj_weight", ENG_DTYPE_F32, w, 2, {6, 2}},
 *                            {"out_proj.weight", ENG_DTYPE_F32, o, 2, {2, 2}}};
 *     eng_layer_weights roles;
 *     if (api__weights_by_name(named, 2, &roles, &err) != ENG_OK) ...;  // err names the tensor
 *     eng_layer *l = eng_layer_new("m", &roles, 1, 0, false, &err);
 */
#ifndef ATTND_API_MODELS_WEIGHTS_H
#define ATTND_API_MODELS_WEIGHTS_H

#include <stddef.h>

#include "engine/engine.h"

/* Fills `out` from `n` tensors, each named by its label (which stays its label, so that the
 * engine's messages name it): every name known, each role given once, and the output and the
 * query, key and value projections complete (a missing one named in the scheme of those given).
 * EFORMAT naming the tensor otherwise. The tensors are borrowed: `out` points where they do. */
eng_status api__weights_by_name(const eng_weight *named, size_t n, eng_layer_weights *out,
                                eng_error *err);

#endif
