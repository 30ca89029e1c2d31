/*
 * masks.h - the shapes an attention mask and a key padding mask may have against an
 * operation's [B, H, L, S], and the engine's view of a decoded mask. Shared by sdpa.c and
 * layer.c, so both operations accept and refuse the same masks with the same messages.
 */
#ifndef ATTND_API_OPS_MASKS_H
#define ATTND_API_OPS_MASKS_H

#include <stdint.h>

#include "api/wire/tensor.h"

/* attn_mask must broadcast to [B, H, L, S] from [L, S] or a rank-4 shape (422 otherwise). */
int api__mask_check_attn(const api__tensor *m, int64_t B, int64_t H, int64_t L, int64_t S,
                         api__error *err);
/* key_padding_mask must be booleans of shape [B, S] or [S] (422 otherwise). */
int api__mask_check_key_padding(const api__tensor *m, int64_t B, int64_t S, api__error *err);
/* The engine's view of a decoded attn_mask (bool bytes or floats, contiguous). */
eng_mask api__mask_view(const api__tensor *m, const void *data);

#endif
