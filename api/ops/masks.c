/*
 * masks.c - the mask shapes an operation accepts, and the engine's view of a decoded mask.
 */
#include <string.h>

#include "api/ops/masks.h"

int api__mask_check_attn(const api__tensor *m, int64_t B, int64_t H, int64_t L, int64_t S,
                         api__error *err)
{
    char ms[96];
    const int64_t full[4] = {B, H, L, S};
    bool ok = m->rank == 2 || m->rank == 4;
    for (int d = 0; ok && d < m->rank; d++) {
        int64_t want = full[4 - m->rank + d];
        ok = m->shape[d] == 1 || m->shape[d] == want;
    }
    if (!ok)
        return api__error_invalid(err, "attn_mask",
                                  "attn_mask has shape %s; it must broadcast to [B, H, L, S] = "
                                  "[%lld, %lld, %lld, %lld] from [L, S] or [B|1, H|1, L|1, S|1]",
                                  api__tensor_shape_str(m, ms, sizeof ms), (long long)B,
                                  (long long)H, (long long)L, (long long)S);
    return 0;
}

int api__mask_check_key_padding(const api__tensor *m, int64_t B, int64_t S, api__error *err)
{
    char ms[96];
    if (!((m->rank == 1 && m->shape[0] == S) ||
          (m->rank == 2 && m->shape[0] == B && m->shape[1] == S)))
        return api__error_invalid(err, "key_padding_mask",
                                  "key_padding_mask has shape %s; it must be [B, S] = [%lld, %lld] "
                                  "or [S] = [%lld]",
                                  api__tensor_shape_str(m, ms, sizeof ms), (long long)B,
                                  (long long)S, (long long)S);
    if (m->dtype != API_DTYPE_BOOL)
        return api__error_invalid(err, "key_padding_mask",
                                  "key_padding_mask must hold booleans (true = padding, ignored), "
                                  "found dtype %s",
                                  api__dtype_name(m->dtype));
    return 0;
}

eng_mask api__mask_view(const api__tensor *m, const void *data)
{
    eng_mask em;
    memset(&em, 0, sizeof em);
    em.kind = m->dtype == API_DTYPE_BOOL ? ENG_MASK_BOOL : ENG_MASK_FLOAT;
    em.data = data;
    for (int d = 0; d < 4; d++)
        em.ne[d] = 1;
    for (int d = 0; d < m->rank; d++)
        em.ne[4 - m->rank + d] = m->shape[d];
    int64_t stride = 1;
    for (int d = 3; d >= 0; d--) {
        em.stride[d] = stride;
        stride *= em.ne[d];
    }
    return em;
}
