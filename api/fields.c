/*
 * fields.c - request fields that the JSON attention routes spell the same way, so that they
 * answer the same mistake with the same status and message: scalar fields with their bounds,
 * causal / window / return_weights / output_encoding, the mask shape checks and their engine
 * views, the Content-Type check, and a reply tensor with the non-finite check; tensor fields,
 * booleans and the positional options of a layer. /v1/attention, /v1/mha and the KServe v2
 * route use them, so that their texts agree.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "api/internal.h"

int api_field_invalid(api_error *err, const char *field, const char *fmt, ...)
{
    char msg[sizeof err->message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return api_error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, field, "%s",
                         msg);
}

int api_field_int(const json_t *v, const char *name, int64_t lo, int64_t hi, int64_t *out,
                  api_error *err)
{
    if (json_is_real(v))
        return api_field_invalid(err, name, "%s must be an integer, found %.17g", name,
                                 json_real_value(v));
    if (!json_is_integer(v))
        return api_field_invalid(err, name, "%s must be an integer", name);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return api_field_invalid(err, name, "%s is %lld; it must be in [%lld, %lld]", name,
                                 (long long)x, (long long)lo, (long long)hi);
    *out = (int64_t)x;
    return 0;
}

int api_field_float(const json_t *v, const char *name, float *out, api_error *err)
{
    if (!json_is_number(v))
        return api_field_invalid(err, name, "%s must be a number", name);
    double x = json_number_value(v);
    if (!(fabs(x) < 0x1.ffffffp127))
        return api_field_invalid(err, name, "%s is %g, beyond the float32 range (+-3.40282347e38)",
                                 name, x);
    *out = (float)x;
    return 0;
}

int api_field_softcap(const json_t *v, const char *name, float *out, api_error *err)
{
    if (api_field_float(v, name, out, err) != 0)
        return -1;
    if (*out < 0)
        return api_field_invalid(err, name, "%s must be > 0 (or 0 for none), found %g", name,
                                 (double)*out);
    return 0;
}

int api_field_causal(const json_t *v, const char *name, api_causal *out, api_error *err)
{
    const char *s = json_string_value(v);
    if (json_is_null(v) || json_is_false(v))
        *out = API_CAUSAL_OFF;
    else if (json_is_true(v))
        *out = API_CAUSAL_ON;
    else if (s && strcmp(s, "top_left") == 0)
        *out = API_CAUSAL_TOP_LEFT;
    else if (s && strcmp(s, "bottom_right") == 0)
        *out = API_CAUSAL_BOTTOM_RIGHT;
    else
        return api_field_invalid(err, name,
                                 "%s must be true, false, \"top_left\" or \"bottom_right\"", name);
    return 0;
}

int api_field_window(const json_t *v, const char *name, api_field_window_t *w, api_error *err)
{
    char side[64];
    if (json_is_null(v))
        return 0;
    if (!json_is_array(v) || json_array_size(v) != 2)
        return api_field_invalid(
            err, name, "%s must be [left, right], each a non-negative integer or null", name);
    for (size_t i = 0; i < 2; i++) {
        const json_t *x = json_array_get(v, i);
        int64_t n;
        snprintf(side, sizeof side, "%s[%zu]", name, i);
        if (json_is_null(x))
            continue;
        if (json_is_integer(x) && json_integer_value(x) > API_WINDOW_MAX)
            continue; /* reaches past every position: unbounded */
        if (api_field_int(x, side, 0, API_WINDOW_MAX, &n, err) != 0)
            return -1;
        if (i == 0) {
            w->left_set = true;
            w->left = n;
        } else {
            w->right_set = true;
            w->right = n;
        }
    }
    return 0;
}

int api_field_weights(const json_t *v, const char *name, eng_weights_mode *out, api_error *err)
{
    const char *s = json_string_value(v);
    if (json_is_null(v) || json_is_false(v))
        *out = ENG_WEIGHTS_NONE;
    else if (s && strcmp(s, "per_head") == 0)
        *out = ENG_WEIGHTS_PER_HEAD;
    else if (s && strcmp(s, "mean") == 0)
        *out = ENG_WEIGHTS_MEAN;
    else
        return api_field_invalid(err, name, "%s must be \"per_head\", \"mean\" or false", name);
    return 0;
}

int api_field_encoding(const json_t *v, const char *name, bool *set, api_form *out, api_error *err)
{
    static const struct {
        const char *name;
        api_form form;
    } forms[] = {{"nested", API_FORM_NESTED}, {"flat", API_FORM_FLAT}, {"base64", API_FORM_BASE64}};
    const char *s = json_string_value(v);
    if (json_is_null(v))
        return 0;
    for (size_t i = 0; s && i < sizeof forms / sizeof forms[0]; i++) {
        if (strcmp(s, forms[i].name) == 0) {
            *set = true;
            *out = forms[i].form;
            return 0;
        }
    }
    return api_field_invalid(err, name, "%s must be \"nested\", \"flat\" or \"base64\"", name);
}

/* ---- Shapes and masks -------------------------------------------------------------------- */

const char *api_field_shape_str(const api_tensor *t, char *buf, size_t size)
{
    size_t at = 0;
    buf[0] = '\0';
    for (int d = 0; d < t->rank && at < size; d++) {
        int n = snprintf(buf + at, size - at, "%s%lld", d ? ", " : "[", (long long)t->shape[d]);
        at += n > 0 ? (size_t)n : 0;
    }
    if (at < size)
        snprintf(buf + at, size - at, "]");
    return buf;
}

int api_field_attn_mask(const api_tensor *m, int64_t B, int64_t H, int64_t L, int64_t S,
                        api_error *err)
{
    char ms[96];
    const int64_t full[4] = {B, H, L, S};
    bool ok = m->rank == 2 || m->rank == 4;
    for (int d = 0; ok && d < m->rank; d++) {
        int64_t want = full[4 - m->rank + d];
        ok = m->shape[d] == 1 || m->shape[d] == want;
    }
    if (!ok)
        return api_field_invalid(err, "attn_mask",
                                 "attn_mask has shape %s; it must broadcast to [B, H, L, S] = "
                                 "[%lld, %lld, %lld, %lld] from [L, S] or [B|1, H|1, L|1, S|1]",
                                 api_field_shape_str(m, ms, sizeof ms), (long long)B, (long long)H,
                                 (long long)L, (long long)S);
    return 0;
}

int api_field_key_padding(const api_tensor *m, int64_t B, int64_t S, api_error *err)
{
    char ms[96];
    if (!((m->rank == 1 && m->shape[0] == S) ||
          (m->rank == 2 && m->shape[0] == B && m->shape[1] == S)))
        return api_field_invalid(err, "key_padding_mask",
                                 "key_padding_mask has shape %s; it must be [B, S] = [%lld, %lld] "
                                 "or [S] = [%lld]",
                                 api_field_shape_str(m, ms, sizeof ms), (long long)B, (long long)S,
                                 (long long)S);
    if (m->dtype != API_DTYPE_BOOL)
        return api_field_invalid(err, "key_padding_mask",
                                 "key_padding_mask must hold booleans (true = padding, ignored), "
                                 "found dtype %s",
                                 api_dtype_name(m->dtype));
    return 0;
}

eng_mask api_field_mask_view(const api_tensor *m, const void *data)
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
        em.nb[d] = stride;
        stride *= em.ne[d];
    }
    return em;
}

/* ---- Content type and reply tensors ------------------------------------------------------ */

bool api_field_json_type(const char *ct)
{
    static const char json[] = "application/json";
    if (!ct)
        return true;
    while (*ct == ' ' || *ct == '\t')
        ct++;
    if (strncasecmp(ct, json, sizeof json - 1) != 0)
        return false;
    const char *p = ct + sizeof json - 1;
    while (*p == ' ' || *p == '\t')
        p++;
    while (*p == ';') {
        p++;
        while (*p == ' ' || *p == '\t')
            p++;
        const char *name = p;
        while (*p && *p != '=' && *p != ';')
            p++;
        if (*p != '=')
            return false;
        bool charset = (size_t)(p - name) == 7 && strncasecmp(name, "charset", 7) == 0;
        const char *val = ++p;
        while (*p && *p != ';' && *p != ' ' && *p != '\t')
            p++;
        size_t n = (size_t)(p - val);
        if (n >= 2 && val[0] == '"' && val[n - 1] == '"') {
            val++;
            n -= 2;
        }
        if (charset && !((n == 5 && strncasecmp(val, "utf-8", 5) == 0) ||
                         (n == 4 && strncasecmp(val, "utf8", 4) == 0)))
            return false;
        while (*p == ' ' || *p == '\t')
            p++;
    }
    return *p == '\0';
}

int api_field_writer_error(const api_jsonw *w, api_error *err)
{
    if (w->state == API_JSONW_NOMEM)
        return api_error_set(err, API_STATUS_UNAVAILABLE, API_REASON_MEMORY, NULL,
                             "out of memory for the reply");
    return api_error_set(err, API_STATUS_INTERNAL, API_REASON_INTERNAL, NULL,
                         "the reply outgrew its estimated size (%zu bytes)", w->max);
}

int api_field_encode(api_jsonw *w, const char *name, const float *data, int rank,
                     const int64_t *shape, api_form form, unsigned flags, eng_pool *pool,
                     api_error *err)
{
    size_t bad = 0;
    api_jsonw_char(w, '"');
    api_jsonw_cstr(w, name);
    api_jsonw_cstr(w, "\":");
    switch (api_tensor_encode(w, data, rank, shape, form, flags, pool, &bad)) {
    case API_ENCODE_OK:
        return 0;
    case API_ENCODE_NONFINITE: {
        char idx[128];
        return api_field_invalid(err, name,
                                 "the result %s%s is %s: it does not fit in float32 (inputs too "
                                 "large for float32 arithmetic?)",
                                 name, api_index_format(idx, sizeof idx, bad, rank, shape, rank),
                                 isnan(data[bad]) ? "NaN" : "infinite");
    }
    case API_ENCODE_FULL:
        break;
    }
    return api_field_writer_error(w, err);
}

/* ---- Fields several routes spell alike --------------------------------------------------- */

int api_field_tensor(const api_req *rq, const json_t *v, const char *name, api_tensor *t, bool *has,
                     api_error *err)
{
    if (json_is_null(v))
        return 0;
    *has = true;
    return api_tensor_probe(&rq->body, v, name, rq->limits.max_elements, t, err);
}

int api_field_bool(const json_t *v, const char *name, bool *out, api_error *err)
{
    if (!json_is_boolean(v))
        return api_field_invalid(err, name, "%s must be true or false", name);
    *out = json_is_true(v);
    return 0;
}

int api_field_positional(const json_t *v, const char *name, eng_positional *out, api_error *err)
{
    static const struct {
        const char *name;
        eng_positional p;
    } kinds[] = {{"none", ENG_POSITIONAL_NONE},
                 {"sinusoidal", ENG_POSITIONAL_SINUSOIDAL},
                 {"rope", ENG_POSITIONAL_ROPE},
                 {"alibi", ENG_POSITIONAL_ALIBI}};
    const char *s = json_string_value(v);
    if (json_is_null(v))
        return 0;
    for (size_t i = 0; s && i < sizeof kinds / sizeof kinds[0]; i++) {
        if (strcmp(s, kinds[i].name) == 0) {
            *out = kinds[i].p;
            return 0;
        }
    }
    return api_field_invalid(err, name,
                             "%s must be \"sinusoidal\", \"rope\", \"alibi\" or \"none\"", name);
}

int api_field_rope_base(const json_t *v, const char *name, bool *set, float *out, api_error *err)
{
    if (json_is_null(v))
        return 0;
    if (api_field_float(v, name, out, err) != 0)
        return -1;
    if (!(*out > 0.0f))
        return api_field_invalid(err, name, "%s must be > 0, found %g", name, (double)*out);
    *set = true;
    return 0;
}

int api_field_rope_style(const json_t *v, const char *name, bool *set, eng_rope_style *out,
                         api_error *err)
{
    const char *s = json_string_value(v);
    if (json_is_null(v))
        return 0;
    if (s && strcmp(s, "half") == 0)
        *out = ENG_ROPE_HALF;
    else if (s && strcmp(s, "interleaved") == 0)
        *out = ENG_ROPE_INTERLEAVED;
    else
        return api_field_invalid(err, name, "%s must be \"half\" or \"interleaved\"", name);
    *set = true;
    return 0;
}

int api_field_json_body(const api_req *rq, api_error *err)
{
    const api_call *call = rq->call;
    if (!api_field_json_type(call->content_type))
        return api_error_set(err, API_STATUS_UNSUPPORTED_MEDIA_TYPE, API_REASON_BAD_REQUEST, NULL,
                             "Content-Type \"%.80s\" is not supported; send application/json",
                             call->content_type);
    if (call->body_len > rq->limits.max_body_bytes)
        return api_error_set(err, API_STATUS_TOO_LARGE, API_REASON_TOO_LARGE, NULL,
                             "the body has %zu bytes, more than the %zu that --max-body-bytes "
                             "allows",
                             call->body_len, rq->limits.max_body_bytes);
    return 0;
}
