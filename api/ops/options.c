/*
 * options.c - the options of the operations as every route spells them, so that the same
 * mistake gets the same status and message: scalars with their bounds, causal / window /
 * return_weights / output_encoding, tensor fields, booleans and the positional options of a
 * layer, and the "did you mean" of unknown names. /v1/attention, /v1/mha and the KServe v2
 * route use them, so that their texts agree.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "api/ops/options.h"

int api__option_int(const json_t *v, const char *name, int64_t lo, int64_t hi, int64_t *out,
                    api__error *err)
{
    if (json_is_real(v))
        return api__error_invalid(err, name, "%s must be an integer, found %.17g", name,
                                  json_real_value(v));
    if (!json_is_integer(v))
        return api__error_invalid(err, name, "%s must be an integer", name);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return api__error_invalid(err, name, "%s is %lld; it must be in [%lld, %lld]", name,
                                  (long long)x, (long long)lo, (long long)hi);
    *out = (int64_t)x;
    return 0;
}

int api__option_float(const json_t *v, const char *name, float *out, api__error *err)
{
    if (!json_is_number(v))
        return api__error_invalid(err, name, "%s must be a number", name);
    double x = json_number_value(v);
    if (!(fabs(x) < 0x1.ffffffp127))
        return api__error_invalid(err, name, "%s is %g, beyond the float32 range (+-3.40282347e38)",
                                  name, x);
    *out = (float)x;
    return 0;
}

int api__option_softcap(const json_t *v, const char *name, float *out, api__error *err)
{
    if (api__option_float(v, name, out, err) != 0)
        return -1;
    if (*out < 0)
        return api__error_invalid(err, name, "%s must be > 0 (or 0 for none), found %g", name,
                                  (double)*out);
    return 0;
}

#define PRECISION_NAME(value, name) [value] = name,
/* Indexed by eng_precision, from the engine's list (the names --default-precision takes too). */
static const char *const precision_names[] = {ENG_PRECISION_LIST(PRECISION_NAME)};
#undef PRECISION_NAME

int api__option_precision(const json_t *v, const char *name, eng_precision *out, api__error *err)
{
    const char *s = json_string_value(v);
    for (int i = 0; s && i < ENG_PRECISION_COUNT; i++) {
        if (strcmp(s, precision_names[i]) == 0) {
            *out = (eng_precision)i;
            return 0;
        }
    }
    return api__error_invalid(err, name, "%s must be \"float32\" or \"bfloat16\"", name);
}

const char *api__precision_name(eng_precision precision)
{
    return (unsigned)precision < ENG_PRECISION_COUNT ? precision_names[precision] : "float32";
}

int api__option_causal(const json_t *v, const char *name, api__causal *out, api__error *err)
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
        return api__error_invalid(err, name,
                                  "%s must be true, false, \"top_left\" or \"bottom_right\"", name);
    return 0;
}

int api__option_window(const json_t *v, const char *name, api__window *w, api__error *err)
{
    char side[64];
    if (json_is_null(v))
        return 0;
    if (!json_is_array(v) || json_array_size(v) != 2)
        return api__error_invalid(
            err, name, "%s must be [left, right], each a non-negative integer or null", name);
    for (size_t i = 0; i < 2; i++) {
        const json_t *x = json_array_get(v, i);
        int64_t n;
        snprintf(side, sizeof side, "%s[%zu]", name, i);
        if (json_is_null(x))
            continue;
        if (json_is_integer(x) && json_integer_value(x) > API_WINDOW_MAX)
            continue; /* reaches past every position: unbounded */
        if (api__option_int(x, side, 0, API_WINDOW_MAX, &n, err) != 0)
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

int api__option_weights(const json_t *v, const char *name, eng_weights_mode *out, api__error *err)
{
    const char *s = json_string_value(v);
    if (json_is_null(v) || json_is_false(v))
        *out = ENG_WEIGHTS_NONE;
    else if (s && strcmp(s, "per_head") == 0)
        *out = ENG_WEIGHTS_PER_HEAD;
    else if (s && strcmp(s, "mean") == 0)
        *out = ENG_WEIGHTS_MEAN;
    else
        return api__error_invalid(err, name, "%s must be \"per_head\", \"mean\" or false", name);
    return 0;
}

int api__option_encoding(const json_t *v, const char *name, bool *set, api__form *out,
                         api__error *err)
{
    static const struct {
        const char *name;
        api__form form;
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
    return api__error_invalid(err, name, "%s must be \"nested\", \"flat\" or \"base64\"", name);
}

/* ---- Shapes and masks -------------------------------------------------------------------- */

/* ---- Content type and reply tensors ------------------------------------------------------ */

/* ---- Fields several routes spell alike --------------------------------------------------- */

int api__req_tensor(const api__req *rq, const json_t *v, const char *name, api__tensor *t,
                    api__error *err)
{
    if (json_is_null(v))
        return 0;
    return api__tensor_probe(&rq->body, v, name, rq->limits.max_elements, t, err);
}

int api__option_bool(const json_t *v, const char *name, bool *out, api__error *err)
{
    if (!json_is_boolean(v))
        return api__error_invalid(err, name, "%s must be true or false", name);
    *out = json_is_true(v);
    return 0;
}

int api__option_positional(const json_t *v, const char *name, eng_positional *out, api__error *err)
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
    return api__error_invalid(err, name,
                              "%s must be \"sinusoidal\", \"rope\", \"alibi\" or \"none\"", name);
}

int api__option_rope_base(const json_t *v, const char *name, bool *set, float *out, api__error *err)
{
    if (json_is_null(v))
        return 0;
    if (api__option_float(v, name, out, err) != 0)
        return -1;
    if (!(*out > 0.0f))
        return api__error_invalid(err, name, "%s must be > 0, found %g", name, (double)*out);
    *set = true;
    return 0;
}

int api__option_rope_style(const json_t *v, const char *name, bool *set, eng_rope_style *out,
                           api__error *err)
{
    const char *s = json_string_value(v);
    if (json_is_null(v))
        return 0;
    if (s && strcmp(s, "half") == 0)
        *out = ENG_ROPE_HALF;
    else if (s && strcmp(s, "interleaved") == 0)
        *out = ENG_ROPE_INTERLEAVED;
    else
        return api__error_invalid(err, name, "%s must be \"half\" or \"interleaved\"", name);
    *set = true;
    return 0;
}

/* Edit distance: names are short, so the quadratic table is fine. */
static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b), row[40];
    if (la >= 40 || lb >= 40)
        return SIZE_MAX;
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

const char *api__closest_name(const char *key, const char *const *names, size_t n)
{
    const char *best = NULL;
    size_t best_d = 3; /* suggest only close names */
    for (size_t i = 0; i < n; i++) {
        size_t d = edit_distance(key, names[i]);
        if (d < best_d) {
            best_d = d;
            best = names[i];
        }
    }
    return best;
}

const api__option_def *api__option_find(const api__option_def *defs, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(defs[i].name, name) == 0)
            return &defs[i];
    return NULL;
}

/* Room for the names of the largest route (a protocol's own and its operation's options). */
#define MAX_NAMES 48

int api__unknown_name(const char *key, const char *field, const api__names *known, api__error *err)
{
    const char *names[MAX_NAMES];
    const char *kind = known->kind, *what = known->what;
    size_t n = 0;
    for (size_t i = 0; i < known->n_own && n < MAX_NAMES; i++)
        names[n++] = known->own[i];
    for (size_t i = 0; i < known->n_opts && n < MAX_NAMES; i++)
        names[n++] = known->opts[i].name;
    const char *best = api__closest_name(key, names, n);
    if (best)
        return api__error_invalid(err, field, "unknown %s \"%.60s\"; did you mean \"%s\"?", kind,
                                  key, best);
    char list[1024];
    size_t at = 0;
    list[0] = '\0';
    for (size_t i = 0; i < n && at < sizeof list; i++) {
        const char *sep = i == 0 ? "" : i + 1 == n ? " and " : ", ";
        int w = snprintf(list + at, sizeof list - at, "%s%s", sep, names[i]);
        if (w < 0)
            break;
        at += (size_t)w;
    }
    return api__error_invalid(err, field, "unknown %s \"%.60s\"; %s takes %s", kind, key, what,
                              list);
}
