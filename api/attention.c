/*
 * attention.c - POST /v1/attention: request body -> validated eng_sdpa call -> reply body.
 *
 * The request is a JSON object with these fields (DESIGN.md section 5); any other field is
 * refused with 422 naming it, because a typo such as "casual" silently ignored would return a
 * plausible wrong answer:
 *
 *   query, key, value   tensors (any wire form). Rank 4 [B, H, L, D] / [B, Hkv, S, D|Dv];
 *                       rank 3 [B, L, E]; rank 2 [L, E] (B = 1). The three share one rank.
 *   num_heads           H for ranks 2 and 3 (default 1): E = H * D. With rank 4, if given,
 *                       it must match. num_kv_heads likewise (default num_heads).
 *   scale               any finite number (default 1/sqrt(D)). softcap: > 0, or 0 for off.
 *   score               "dot" (default) | "additive": Bahdanau scoring s = w . tanh(W_q q +
 *                       W_k k), no scale, with additive_weights {"w_q": [A, D], "w_k": [A, D],
 *                       "w": [A]} (tensors in any form).
 *   causal              false | true | "top_left" | "bottom_right".
 *   query_offset        integer: query i sits at i + query_offset (with causal true, or on its
 *                       own for window/alibi; it conflicts with an explicit alignment string).
 *   window              [left, right], each a non-negative integer or null (unbounded).
 *   key_padding_mask    booleans [B, S] or [S]; true = padding, ignored. Boolean masks take
 *                       true/false (or dtype "bool" bytes), never 0/1 numbers: tokenizers'
 *                       attention_mask uses 1 = keep, the opposite polarity, and a silent
 *                       reading of it would hide exactly the real tokens.
 *   kv_lengths          integers [B], each in [0, S].
 *   attn_mask           booleans (true = may attend) or numbers (added to the score; -inf may
 *                       be written null, or -inf in base64), of shape [L, S] or
 *                       [B|1, H|1, L|1, S|1]; size-1 dimensions broadcast.
 *   alibi               true (default slopes), false, or a tensor of H slopes.
 *   return_weights      "per_head" | "mean" | false. return_lse: boolean.
 *   output_encoding     "nested" | "flat" | "base64" (float32); default: the query's form.
 *   timeout_ms          positive integer, capped by --request-timeout-ms.
 * Every optional field may also be null, meaning its default.
 *
 * The reply is {"output": T, "weights"?: T, "lse"?: T, "meta": {shapes, scale, timings}}, with
 * output [B, H, L, Dv], [B, L, H*Dv] or [L, H*Dv] after the query's rank, weights [B, H, L, S]
 * or (mean) [B, L, S], lse [B, H, L] (leading B dropped for a rank-2 query); an lse of -inf (a
 * query row that sees no key) is null in JSON.
 *
 * Rank 2 and 3 tensors are handed to the engine as strided views of the decoded buffers
 * ([B, L, H, D] memory seen as [B, H, L, D]): no head is ever copied.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "api/internal.h"

/* Bounds that keep the engine's position arithmetic (i + query_offset - left, ...) far from
 * int64 overflow. A window side beyond API_WINDOW_MAX reaches past any position and is the
 * same as null. */
#define API_QUERY_OFFSET_MAX ((int64_t)1 << 48)
#define API_WINDOW_MAX       ((int64_t)1 << 50)

typedef enum { CAUSAL_OFF = 0, CAUSAL_ON, CAUSAL_TOP_LEFT, CAUSAL_BOTTOM_RIGHT } causal_mode;

/* The request as parsed: tensors probed (not yet decoded) and options. */
typedef struct {
    api_tensor q, k, v, mask, kpm, kvlen, slopes, wq, wk, ww;
    bool has_q, has_k, has_v, has_mask, has_kpm, has_kvlen, has_slopes, has_wq, has_wk, has_ww;
    bool additive, has_additive_weights;

    int64_t num_heads, num_kv_heads; /* 0: not given */
    bool scale_set;
    float scale, softcap;
    causal_mode causal;
    bool offset_set;
    int64_t query_offset;
    bool window_left_set, window_right_set;
    int64_t window_left, window_right;
    bool alibi;
    eng_weights_mode weights;
    bool return_lse;
    bool encoding_set;
    api_form encoding;
    int64_t timeout_ms; /* 0: not given */

    /* Derived by check_shapes. */
    int64_t B, H, Hkv, L, S, D, Dv;
} attn_req;

/* One request in flight: what it owns, so that one function frees it all on every path. */
typedef struct {
    const api_call *call;
    api_limits limits;
    eng_ctl own_ctl, *ctl;
    int64_t start_ns; /* arrival: deadlines count from it */
    int64_t call_ns;  /* when api_attention began: stage timings count from it */
    api_body body;
    attn_req r;
    size_t parse_reserved, reserved; /* bytes held in the budget */
    float *q, *k, *v, *out, *weights, *lse, *slopes, *mask_f, *wq, *wk, *ww;
    uint8_t *mask_b, *kpm;
    int64_t *kvlen;
    eng_sdpa_args args;
    api_jsonw w;
} attn_job;

/* ---- Field parsers ----------------------------------------------------------------------- */

typedef int (*field_parser)(attn_job *job, const json_t *v, const char *name, api_error *err);

static int invalid(api_error *err, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int invalid(api_error *err, const char *field, const char *fmt, ...)
{
    char msg[sizeof err->message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return api_error_set(err, 422, API_REASON_BAD_REQUEST, field, "%s", msg);
}

static int parse_tensor(attn_job *job, const json_t *v, const char *name, api_tensor *t, bool *has,
                        api_error *err)
{
    if (json_is_null(v))
        return 0;
    *has = true;
    return api_tensor_probe(&job->body, v, name, job->limits.max_elements, t, err);
}

static int f_query(attn_job *job, const json_t *v, const char *name, api_error *err)
{
    return parse_tensor(job, v, name, &job->r.q, &job->r.has_q, err);
}

static int f_key(attn_job *job, const json_t *v, const char *name, api_error *err)
{
    return parse_tensor(job, v, name, &job->r.k, &job->r.has_k, err);
}

static int f_value(attn_job *job, const json_t *v, const char *name, api_error *err)
{
    return parse_tensor(job, v, name, &job->r.v, &job->r.has_v, err);
}

static int f_attn_mask(attn_job *job, const json_t *v, const char *name, api_error *err)
{
    return parse_tensor(job, v, name, &job->r.mask, &job->r.has_mask, err);
}

static int f_key_padding_mask(attn_job *job, const json_t *v, const char *name, api_error *err)
{
    return parse_tensor(job, v, name, &job->r.kpm, &job->r.has_kpm, err);
}

static int f_kv_lengths(attn_job *job, const json_t *v, const char *name, api_error *err)
{
    return parse_tensor(job, v, name, &job->r.kvlen, &job->r.has_kvlen, err);
}

/* A JSON integer in [lo, hi]. */
static int get_int(const json_t *v, const char *name, int64_t lo, int64_t hi, int64_t *out,
                   api_error *err)
{
    if (json_is_real(v))
        return invalid(err, name, "%s must be an integer, found %.17g", name, json_real_value(v));
    if (!json_is_integer(v))
        return invalid(err, name, "%s must be an integer", name);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return invalid(err, name, "%s is %lld; it must be in [%lld, %lld]", name, (long long)x,
                       (long long)lo, (long long)hi);
    *out = (int64_t)x;
    return 0;
}

/* A JSON number that is finite as float32. */
static int get_float(const json_t *v, const char *name, float *out, api_error *err)
{
    if (!json_is_number(v))
        return invalid(err, name, "%s must be a number", name);
    double x = json_number_value(v);
    if (!(fabs(x) < 0x1.ffffffp127))
        return invalid(err, name, "%s is %g, beyond the float32 range (+-3.40282347e38)", name, x);
    *out = (float)x;
    return 0;
}

static int f_num_heads(attn_job *job, const json_t *v, const char *name, api_error *err)
{
    if (json_is_null(v))
        return 0;
    return get_int(v, name, 1, INT32_MAX, &job->r.num_heads, err);
}

static int f_num_kv_heads(attn_job *job, const json_t *v, const char *name, api_error *err)
{
    if (json_is_null(v))
        return 0;
    return get_int(v, name, 1, INT32_MAX, &job->r.num_kv_heads, err);
}

static int f_scale(attn_job *job, const json_t *v, const char *name, api_error *err)
{
    if (json_is_null(v))
        return 0;
    job->r.scale_set = true;
    return get_float(v, name, &job->r.scale, err);
}

static int f_softcap(attn_job *job, const json_t *v, const char *name, api_error *err)
{
    if (json_is_null(v))
        return 0;
    if (get_float(v, name, &job->r.softcap, err) != 0)
        return -1;
    if (job->r.softcap < 0)
        return invalid(err, name, "%s must be > 0 (or 0 for none), found %g", name,
                       (double)job->r.softcap);
    return 0;
}

static int f_score(attn_job *job, const json_t *v, const char *name, api_error *err)
{
    const char *s = json_string_value(v);
    if (json_is_null(v) || (s && strcmp(s, "dot") == 0))
        job->r.additive = false;
    else if (s && strcmp(s, "additive") == 0)
        job->r.additive = true;
    else
        return invalid(err, name, "%s must be \"dot\" or \"additive\"", name);
    return 0;
}

static int f_additive_weights(attn_job *job, const json_t *v, const char *name, api_error *err)
{
    static const char *const keys[3] = {"w_q", "w_k", "w"};
    attn_req *r = &job->r;
    api_tensor *tensors[3] = {&r->wq, &r->wk, &r->ww};
    bool *has[3] = {&r->has_wq, &r->has_wk, &r->has_ww};
    char field[64];
    const char *key;
    json_t *val;
    if (json_is_null(v))
        return 0;
    if (!json_is_object(v))
        return invalid(err, name, "%s must be an object {\"w_q\", \"w_k\", \"w\"}", name);
    r->has_additive_weights = true;
    json_object_foreach((json_t *)v, key, val)
    {
        size_t i = 0;
        while (i < 3 && strcmp(key, keys[i]) != 0)
            i++;
        snprintf(field, sizeof field, "%s.%.40s", name, key);
        if (i == 3)
            return invalid(err, field, "unknown key \"%.40s\"; %s has w_q, w_k and w", key, name);
        if (parse_tensor(job, val, field, tensors[i], has[i], err) != 0)
            return -1;
    }
    for (size_t i = 0; i < 3; i++) {
        if (!*has[i]) {
            snprintf(field, sizeof field, "%s.%s", name, keys[i]);
            return invalid(err, field, "%s is required", field);
        }
    }
    return 0;
}

static int f_causal(attn_job *job, const json_t *v, const char *name, api_error *err)
{
    const char *s = json_string_value(v);
    if (json_is_null(v) || json_is_false(v))
        job->r.causal = CAUSAL_OFF;
    else if (json_is_true(v))
        job->r.causal = CAUSAL_ON;
    else if (s && strcmp(s, "top_left") == 0)
        job->r.causal = CAUSAL_TOP_LEFT;
    else if (s && strcmp(s, "bottom_right") == 0)
        job->r.causal = CAUSAL_BOTTOM_RIGHT;
    else
        return invalid(err, name, "%s must be true, false, \"top_left\" or \"bottom_right\"", name);
    return 0;
}

static int f_query_offset(attn_job *job, const json_t *v, const char *name, api_error *err)
{
    if (json_is_null(v))
        return 0;
    job->r.offset_set = true;
    return get_int(v, name, -API_QUERY_OFFSET_MAX, API_QUERY_OFFSET_MAX, &job->r.query_offset, err);
}

static int f_window(attn_job *job, const json_t *v, const char *name, api_error *err)
{
    char side[64];
    if (json_is_null(v))
        return 0;
    if (!json_is_array(v) || json_array_size(v) != 2)
        return invalid(err, name, "%s must be [left, right], each a non-negative integer or null",
                       name);
    for (size_t i = 0; i < 2; i++) {
        const json_t *x = json_array_get(v, i);
        int64_t n;
        snprintf(side, sizeof side, "%s[%zu]", name, i);
        if (json_is_null(x))
            continue;
        if (json_is_integer(x) && json_integer_value(x) > API_WINDOW_MAX)
            continue; /* reaches past every position: unbounded */
        if (get_int(x, side, 0, API_WINDOW_MAX, &n, err) != 0)
            return -1;
        if (i == 0) {
            job->r.window_left_set = true;
            job->r.window_left = n;
        } else {
            job->r.window_right_set = true;
            job->r.window_right = n;
        }
    }
    return 0;
}

static int f_alibi(attn_job *job, const json_t *v, const char *name, api_error *err)
{
    if (json_is_null(v) || json_is_false(v))
        return 0;
    job->r.alibi = true;
    if (json_is_true(v))
        return 0;
    if (!json_is_array(v) && !json_is_object(v))
        return invalid(err, name, "%s must be true, false or an array of one slope per head", name);
    return parse_tensor(job, v, name, &job->r.slopes, &job->r.has_slopes, err);
}

static int f_return_weights(attn_job *job, const json_t *v, const char *name, api_error *err)
{
    const char *s = json_string_value(v);
    if (json_is_null(v) || json_is_false(v))
        job->r.weights = ENG_WEIGHTS_NONE;
    else if (s && strcmp(s, "per_head") == 0)
        job->r.weights = ENG_WEIGHTS_PER_HEAD;
    else if (s && strcmp(s, "mean") == 0)
        job->r.weights = ENG_WEIGHTS_MEAN;
    else
        return invalid(err, name, "%s must be \"per_head\", \"mean\" or false", name);
    return 0;
}

static int f_return_lse(attn_job *job, const json_t *v, const char *name, api_error *err)
{
    if (json_is_null(v))
        return 0;
    if (!json_is_boolean(v))
        return invalid(err, name, "%s must be true or false", name);
    job->r.return_lse = json_is_true(v);
    return 0;
}

static int f_output_encoding(attn_job *job, const json_t *v, const char *name, api_error *err)
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
            job->r.encoding_set = true;
            job->r.encoding = forms[i].form;
            return 0;
        }
    }
    return invalid(err, name, "%s must be \"nested\", \"flat\" or \"base64\"", name);
}

static int f_timeout_ms(attn_job *job, const json_t *v, const char *name, api_error *err)
{
    if (json_is_null(v))
        return 0;
    return get_int(v, name, 1, (int64_t)1 << 40, &job->r.timeout_ms, err);
}

/* Every field of the request, in the order the reference above lists them. */
static const struct {
    const char *name;
    field_parser parse;
} attn_fields[] = {
    {"query", f_query},
    {"key", f_key},
    {"value", f_value},
    {"num_heads", f_num_heads},
    {"num_kv_heads", f_num_kv_heads},
    {"scale", f_scale},
    {"softcap", f_softcap},
    {"score", f_score},
    {"additive_weights", f_additive_weights},
    {"causal", f_causal},
    {"query_offset", f_query_offset},
    {"window", f_window},
    {"key_padding_mask", f_key_padding_mask},
    {"kv_lengths", f_kv_lengths},
    {"attn_mask", f_attn_mask},
    {"alibi", f_alibi},
    {"return_weights", f_return_weights},
    {"return_lse", f_return_lse},
    {"output_encoding", f_output_encoding},
    {"timeout_ms", f_timeout_ms},
};

#define N_FIELDS (sizeof attn_fields / sizeof attn_fields[0])

/* Edit distance, for "did you mean": names are short, so the quadratic table is fine. */
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

static int unknown_field(const char *key, api_error *err)
{
    const char *best = NULL;
    size_t best_d = 3; /* suggest only close names */
    for (size_t i = 0; i < N_FIELDS; i++) {
        size_t d = edit_distance(key, attn_fields[i].name);
        if (d < best_d) {
            best_d = d;
            best = attn_fields[i].name;
        }
    }
    if (best)
        return invalid(err, key, "unknown field \"%.60s\"; did you mean \"%s\"?", key, best);
    return invalid(err, key,
                   "unknown field \"%.60s\"; /v1/attention takes query, key, value, num_heads, "
                   "num_kv_heads, scale, softcap, score, additive_weights, causal, query_offset, "
                   "window, "
                   "key_padding_mask, kv_lengths, attn_mask, alibi, return_weights, return_lse, "
                   "output_encoding and timeout_ms",
                   key);
}

static int parse_fields(attn_job *job, api_error *err)
{
    const char *key;
    json_t *val;
    json_object_foreach(job->body.root, key, val)
    {
        size_t i = 0;
        while (i < N_FIELDS && strcmp(attn_fields[i].name, key) != 0)
            i++;
        if (i == N_FIELDS)
            return unknown_field(key, err);
        if (attn_fields[i].parse(job, val, key, err) != 0)
            return -1;
    }
    if (!job->r.has_q || !job->r.has_k || !job->r.has_v) {
        const char *missing = !job->r.has_q ? "query" : !job->r.has_k ? "key" : "value";
        return invalid(err, missing, "%s is required", missing);
    }
    return 0;
}

/* ---- Shapes ------------------------------------------------------------------------------ */

static const char *shape_str(const api_tensor *t, char *buf, size_t size)
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

/* Splits a width E into `heads` heads: D = E / heads, or an error naming both fields. */
static int split_heads(int64_t width, int64_t heads, const char *tensor, const char *heads_name,
                       int64_t *d, api_error *err)
{
    if (width % heads != 0)
        return invalid(err, heads_name, "the width of %s (%lld) is not a multiple of %s (%lld)",
                       tensor, (long long)width, heads_name, (long long)heads);
    *d = width / heads;
    return 0;
}

/* Derives B, H, Hkv, L, S, D, Dv and checks that every tensor fits them. */
static int check_shapes(attn_req *r, api_error *err)
{
    char qs[96], ks[96], vs[96], ms[96];
    const api_tensor *q = &r->q, *k = &r->k, *v = &r->v;
    int rank = q->rank;
    if (rank < 2 || rank > 4)
        return invalid(err, "query",
                       "query has shape %s; it must be [L, E], [B, L, E] or [B, H, L, D]",
                       shape_str(q, qs, sizeof qs));
    if (k->rank != rank || v->rank != rank) {
        const char *which = k->rank != rank ? "key" : "value";
        return invalid(err, which,
                       "%s has rank %d but query has rank %d; query, key and value share one "
                       "layout",
                       which, (k->rank != rank ? k : v)->rank, rank);
    }
    shape_str(q, qs, sizeof qs);
    shape_str(k, ks, sizeof ks);
    shape_str(v, vs, sizeof vs);

    int64_t Dk = 0;
    if (rank == 4) {
        r->B = q->shape[0];
        r->H = q->shape[1];
        r->L = q->shape[2];
        r->D = q->shape[3];
        r->Hkv = k->shape[1];
        r->S = k->shape[2];
        Dk = k->shape[3];
        r->Dv = v->shape[3];
        if (r->num_heads && r->num_heads != r->H)
            return invalid(err, "num_heads",
                           "num_heads is %lld but query %s has %lld heads (dimension 1)",
                           (long long)r->num_heads, qs, (long long)r->H);
        if (r->num_kv_heads && r->num_kv_heads != r->Hkv)
            return invalid(err, "num_kv_heads",
                           "num_kv_heads is %lld but key %s has %lld heads (dimension 1)",
                           (long long)r->num_kv_heads, ks, (long long)r->Hkv);
        if (v->shape[1] != r->Hkv)
            return invalid(err, "value", "value %s and key %s differ in heads (dimension 1)", vs,
                           ks);
    } else {
        r->B = rank == 3 ? q->shape[0] : 1;
        r->L = q->shape[rank - 2];
        r->S = k->shape[rank - 2];
        r->H = r->num_heads ? r->num_heads : 1;
        r->Hkv = r->num_kv_heads ? r->num_kv_heads : r->H;
        if (split_heads(q->shape[rank - 1], r->H, "query", "num_heads", &r->D, err) != 0 ||
            split_heads(k->shape[rank - 1], r->Hkv, "key", "num_kv_heads", &Dk, err) != 0 ||
            split_heads(v->shape[rank - 1], r->Hkv, "value", "num_kv_heads", &r->Dv, err) != 0)
            return -1;
    }
    if (k->shape[0] != q->shape[0] && rank >= 3)
        return invalid(err, "key", "key %s and query %s differ in batch size (dimension 0)", ks,
                       qs);
    if (v->shape[0] != q->shape[0] && rank >= 3)
        return invalid(err, "value", "value %s and query %s differ in batch size (dimension 0)", vs,
                       qs);
    if (v->shape[rank - 2] != r->S)
        return invalid(err, "value", "value %s and key %s differ in length (dimension %d)", vs, ks,
                       rank - 2);
    if (r->H % r->Hkv != 0)
        return invalid(err, rank == 4 ? "key" : "num_kv_heads",
                       "%lld query heads cannot be shared among %lld key/value heads: H must "
                       "be a multiple of Hkv",
                       (long long)r->H, (long long)r->Hkv);
    if (Dk != r->D)
        return invalid(err, "key",
                       "key heads have size %lld but query heads %lld (key %s, query %s)",
                       (long long)Dk, (long long)r->D, ks, qs);

    if (r->has_mask) {
        const api_tensor *m = &r->mask;
        const int64_t full[4] = {r->B, r->H, r->L, r->S};
        bool ok = m->rank == 2 || m->rank == 4;
        for (int d = 0; ok && d < m->rank; d++) {
            int64_t want = full[4 - m->rank + d];
            ok = m->shape[d] == 1 || m->shape[d] == want;
        }
        if (!ok)
            return invalid(err, "attn_mask",
                           "attn_mask has shape %s; it must broadcast to [B, H, L, S] = [%lld, "
                           "%lld, %lld, %lld] from [L, S] or [B|1, H|1, L|1, S|1]",
                           shape_str(m, ms, sizeof ms), (long long)r->B, (long long)r->H,
                           (long long)r->L, (long long)r->S);
    }
    if (r->has_kpm) {
        const api_tensor *m = &r->kpm;
        if (!((m->rank == 1 && m->shape[0] == r->S) ||
              (m->rank == 2 && m->shape[0] == r->B && m->shape[1] == r->S)))
            return invalid(err, "key_padding_mask",
                           "key_padding_mask has shape %s; it must be [B, S] = [%lld, %lld] or "
                           "[S] = [%lld]",
                           shape_str(m, ms, sizeof ms), (long long)r->B, (long long)r->S,
                           (long long)r->S);
        if (m->dtype != API_DTYPE_BOOL)
            return invalid(err, "key_padding_mask",
                           "key_padding_mask must hold booleans (true = padding, ignored), "
                           "found dtype %s",
                           api_dtype_name(m->dtype));
    }
    if (r->has_kvlen && !(r->kvlen.rank == 1 && r->kvlen.shape[0] == r->B))
        return invalid(err, "kv_lengths", "kv_lengths has shape %s; it must be [B] = [%lld]",
                       shape_str(&r->kvlen, ms, sizeof ms), (long long)r->B);
    if (r->has_slopes && !(r->slopes.rank == 1 && r->slopes.shape[0] == r->H))
        return invalid(err, "alibi",
                       "alibi has shape %s; explicit slopes are one per query head: [%lld]",
                       shape_str(&r->slopes, ms, sizeof ms), (long long)r->H);
    if (r->additive != r->has_additive_weights)
        return invalid(err, "additive_weights",
                       r->additive ? "score \"additive\" needs additive_weights {\"w_q\": [A, "
                                     "D], \"w_k\": [A, D], \"w\": [A]}"
                                   : "additive_weights are given but score is not \"additive\"");
    if (r->additive) {
        int64_t A = r->ww.shape[0];
        if (r->scale_set)
            return invalid(err, "scale", "additive scoring applies no scale; leave scale out");
        if (r->ww.rank != 1)
            return invalid(err, "additive_weights.w",
                           "additive_weights.w has shape %s; it must "
                           "be [A]",
                           shape_str(&r->ww, ms, sizeof ms));
        const api_tensor *w2[2] = {&r->wq, &r->wk};
        const char *w2name[2] = {"additive_weights.w_q", "additive_weights.w_k"};
        for (int i = 0; i < 2; i++)
            if (!(w2[i]->rank == 2 && w2[i]->shape[0] == A && w2[i]->shape[1] == r->D))
                return invalid(err, w2name[i], "%s has shape %s; it must be [A, D] = [%lld, %lld]",
                               w2name[i], shape_str(w2[i], ms, sizeof ms), (long long)A,
                               (long long)r->D);
    }
    if (r->offset_set && (r->causal == CAUSAL_TOP_LEFT || r->causal == CAUSAL_BOTTOM_RIGHT))
        return invalid(err, "query_offset",
                       "query_offset conflicts with causal \"%s\", which sets the alignment "
                       "itself; use causal: true with query_offset",
                       r->causal == CAUSAL_TOP_LEFT ? "top_left" : "bottom_right");
    return 0;
}

/* ---- Sizes and the budget ---------------------------------------------------------------- */

static bool add_size(size_t *acc, size_t n)
{
    return !__builtin_add_overflow(*acc, n, acc);
}

/* Elements of the outputs: out, weights, lse. */
static size_t count_product(int64_t a, int64_t b, int64_t c, int64_t d, bool *overflow)
{
    size_t r = 1;
    const int64_t dims[4] = {a, b, c, d};
    for (int i = 0; i < 4; i++)
        *overflow |= __builtin_mul_overflow(r, (size_t)dims[i], &r);
    return r;
}

/* The shapes of the reply's tensors: rank follows the query; rank 2 drops the batch axis. */
typedef struct {
    int rank;
    int64_t shape[4];
    size_t count;
} out_shape;

static void out_shapes(const attn_req *r, out_shape *out, out_shape *weights, out_shape *lse)
{
    int rank = r->q.rank, drop = rank == 2 ? 1 : 0;
    if (rank == 4)
        *out = (out_shape){4, {r->B, r->H, r->L, r->Dv}, 0};
    else if (rank == 3)
        *out = (out_shape){3, {r->B, r->L, r->H * r->Dv}, 0};
    else
        *out = (out_shape){2, {r->L, r->H * r->Dv}, 0};
    if (r->weights == ENG_WEIGHTS_PER_HEAD)
        *weights = (out_shape){4, {r->B, r->H, r->L, r->S}, 0};
    else
        *weights = (out_shape){3, {r->B, r->L, r->S}, 0};
    *lse = (out_shape){3, {r->B, r->H, r->L}, 0};
    if (drop) {
        weights->rank--;
        memmove(weights->shape, weights->shape + 1, sizeof weights->shape - sizeof(int64_t));
        lse->rank--;
        memmove(lse->shape, lse->shape + 1, sizeof lse->shape - sizeof(int64_t));
    }
    out_shape *all[3] = {out, weights, lse};
    for (int i = 0; i < 3; i++) {
        size_t c = 1;
        for (int d = 0; d < all[i]->rank; d++)
            c *= (size_t)all[i]->shape[d]; /* checked by check_elements first */
        all[i]->count = c;
    }
}

/* The element limit over inputs and outputs together. */
static int check_elements(attn_job *job, api_error *err)
{
    attn_req *r = &job->r;
    size_t max = job->limits.max_elements, in = 0, out;
    bool overflow = false;
    const api_tensor *inputs[] = {&r->q,     &r->k,      &r->v,  &r->mask, &r->kpm,
                                  &r->kvlen, &r->slopes, &r->wq, &r->wk,   &r->ww};
    for (size_t i = 0; i < sizeof inputs / sizeof inputs[0]; i++)
        overflow |= !add_size(&in, inputs[i]->count); /* absent tensors count 0 */
    out = count_product(r->B, r->H, r->L, r->Dv, &overflow);
    if (r->weights == ENG_WEIGHTS_PER_HEAD)
        overflow |= !add_size(&out, count_product(r->B, r->H, r->L, r->S, &overflow));
    else if (r->weights == ENG_WEIGHTS_MEAN)
        overflow |= !add_size(&out, count_product(r->B, 1, r->L, r->S, &overflow));
    if (r->return_lse)
        overflow |= !add_size(&out, count_product(r->B, r->H, r->L, 1, &overflow));
    size_t total = in;
    overflow |= !add_size(&total, out);
    if (overflow || total > max)
        return api_error_set(err, 413, API_REASON_TOO_LARGE, NULL,
                             "the request has %zu input and %s%zu output elements (weights "
                             "included), more than the %zu that --max-elements allows",
                             in, overflow ? "over " : "", overflow ? SIZE_MAX : out, max);
    return 0;
}

static double mib(size_t bytes)
{
    return (double)bytes / (1024.0 * 1024.0);
}

/* Reserves `bytes` more in the budget, on top of what the job holds. */
static int reserve(attn_job *job, size_t bytes, size_t *held, const char *what, api_error *err)
{
    api_budget *budget = job->call->budget;
    if (!budget)
        return 0;
    size_t total = api_budget_total(budget);
    size_t holding = job->parse_reserved + job->reserved;
    holding =
        holding > SIZE_MAX - job->call->budget_held ? SIZE_MAX : holding + job->call->budget_held;
    if (bytes > total || holding > total - bytes)
        return api_error_set(err, 413, API_REASON_MEMORY, NULL,
                             "the request needs about %.1f MiB (%s), more than the %.1f MiB "
                             "that --max-memory-bytes allows",
                             mib(holding > SIZE_MAX - bytes ? SIZE_MAX : holding + bytes), what,
                             mib(total));
    switch (api_budget_reserve(budget, bytes)) {
    case API_BUDGET_OK:
        *held += bytes;
        return 0;
    case API_BUDGET_NEVER:
        break;
    case API_BUDGET_NOT_NOW:
        return api_error_set(err, 429, API_REASON_MEMORY, NULL,
                             "the memory budget (--max-memory-bytes) is in use by other "
                             "requests; retry shortly");
    }
    return api_error_set(err, 500, API_REASON_INTERNAL, NULL, "memory budget inconsistent");
}

static size_t input_bytes(const api_tensor *t, size_t esize)
{
    return t->count ? api_aligned_size(t->count * esize) : 0; /* count <= max_elements */
}

/* The form of the reply's tensors: output_encoding, or else the query's. */
static api_form reply_form(const attn_req *r)
{
    return r->encoding_set ? r->encoding : r->q.form;
}

/* The request's peak memory beyond the body and its parse: decoded inputs and outputs (in
 * *tensors), and the reply text (in *text: an upper bound, which is also the reply writer's
 * maximum). False when a sum overflows. */
static bool estimate(const attn_job *job, const out_shape *os, const out_shape *ws,
                     const out_shape *ls, size_t *tensors, size_t *text)
{
    const attn_req *r = &job->r;
    const struct {
        const api_tensor *t;
        size_t esize;
    } in[] = {{&r->q, 4},      {&r->k, 4},
              {&r->v, 4},      {&r->mask, r->mask.dtype == API_DTYPE_BOOL ? 1 : 4},
              {&r->kpm, 1},    {&r->kvlen, 8},
              {&r->slopes, 4}, {&r->wq, 4},
              {&r->wk, 4},     {&r->ww, 4}};
    const out_shape *out[3] = {os, r->weights != ENG_WEIGHTS_NONE ? ws : NULL,
                               r->return_lse ? ls : NULL};
    api_form form = reply_form(r);
    bool ok = true;
    *tensors = 0;
    *text = 1024; /* the reply's braces, keys and meta */
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++)
        ok = ok && add_size(tensors, input_bytes(in[i].t, in[i].esize));
    for (size_t i = 0; i < 3; i++)
        if (out[i])
            ok = ok && add_size(tensors, api_aligned_size(out[i]->count * 4)) &&
                 add_size(text, api_tensor_encoded_bound(form, out[i]->rank, out[i]->shape,
                                                         out[i]->count));
    return ok;
}

/* ---- Engine arguments -------------------------------------------------------------------- */

/* A [B, L, heads * d] buffer (rank 2 or 3) seen as [B, heads, L, d]. */
static eng_view view_bld(float *data, int64_t B, int64_t heads, int64_t L, int64_t d)
{
    eng_view v = {data, {B, heads, L, d}, {L * heads * d, d, heads * d, 1}};
    return v;
}

/* Fills job->args from the request, with the data pointers of the job's buffers (NULL before
 * they exist, which is enough for eng_sdpa_scratch_bytes). */
static void build_args(attn_job *job)
{
    const attn_req *r = &job->r;
    eng_sdpa_args *a = &job->args;
    memset(a, 0, sizeof *a);
    if (r->q.rank == 4) {
        a->q = eng_view_contiguous(job->q, r->B, r->H, r->L, r->D);
        a->k = eng_view_contiguous(job->k, r->B, r->Hkv, r->S, r->D);
        a->v = eng_view_contiguous(job->v, r->B, r->Hkv, r->S, r->Dv);
        a->out = eng_view_contiguous(job->out, r->B, r->H, r->L, r->Dv);
    } else {
        a->q = view_bld(job->q, r->B, r->H, r->L, r->D);
        a->k = view_bld(job->k, r->B, r->Hkv, r->S, r->D);
        a->v = view_bld(job->v, r->B, r->Hkv, r->S, r->Dv);
        a->out = view_bld(job->out, r->B, r->H, r->L, r->Dv);
    }
    a->scale_set = r->scale_set;
    a->scale = r->scale;
    a->softcap = r->softcap;
    a->causal = r->causal != CAUSAL_OFF;
    if (r->offset_set) {
        a->align = ENG_ALIGN_OFFSET;
        a->query_offset = r->query_offset;
    } else {
        a->align = r->causal == CAUSAL_BOTTOM_RIGHT ? ENG_ALIGN_BOTTOM_RIGHT : ENG_ALIGN_TOP_LEFT;
    }
    a->window_left_set = r->window_left_set;
    a->window_left = r->window_left;
    a->window_right_set = r->window_right_set;
    a->window_right = r->window_right;
    if (r->has_kpm) {
        a->key_padding = job->kpm;
        a->key_padding_stride = r->kpm.rank == 2 ? r->S : 0;
    }
    a->kv_lengths = job->kvlen;
    if (r->has_mask) {
        const api_tensor *m = &r->mask;
        eng_mask *em = &a->attn_mask;
        em->kind = m->dtype == API_DTYPE_BOOL ? ENG_MASK_BOOL : ENG_MASK_FLOAT;
        em->data =
            em->kind == ENG_MASK_BOOL ? (const void *)job->mask_b : (const void *)job->mask_f;
        for (int d = 0; d < 4; d++)
            em->ne[d] = 1;
        for (int d = 0; d < m->rank; d++)
            em->ne[4 - m->rank + d] = m->shape[d];
        int64_t stride = 1;
        for (int d = 3; d >= 0; d--) {
            em->nb[d] = stride;
            stride *= em->ne[d];
        }
    }
    a->alibi = r->alibi;
    a->alibi_slopes = job->slopes;
    if (r->additive) {
        a->additive_w_q = job->wq;
        a->additive_w_k = job->wk;
        a->additive_v = job->ww;
        a->additive_dim = r->ww.shape[0];
    }
    a->weights_mode = r->weights;
    a->weights = job->weights;
    a->lse = job->lse;
}

/* ---- Decoding ---------------------------------------------------------------------------- */

static int alloc_buffer(void **p, size_t count, size_t esize, api_error *err)
{
    *p = api_aligned_alloc(count * esize);
    if (!*p)
        return api_error_set(err, 503, API_REASON_MEMORY, NULL,
                             "out of memory for a buffer of %zu bytes", count * esize);
    return 0;
}

/* Allocates a buffer for tensor t and decodes it there (on every worker of the pool, for big
 * base64 tensors). */
static int decode_into(attn_job *job, const api_tensor *t, api_elem elem, unsigned flags,
                       void **dst, const char *field, api_error *err)
{
    size_t esize = elem == API_ELEM_BOOL ? 1 : elem == API_ELEM_INT64 ? 8 : 4;
    if (alloc_buffer(dst, t->count, esize, err) != 0)
        return -1;
    return api_tensor_decode(&job->body, t, elem, flags, *dst, field, job->call->pool, err);
}

static int decode_inputs(attn_job *job, const out_shape *os, const out_shape *ws,
                         const out_shape *ls, api_error *err)
{
    attn_req *r = &job->r;
    if (decode_into(job, &r->q, API_ELEM_FLOAT, 0, (void **)&job->q, "query", err) != 0 ||
        decode_into(job, &r->k, API_ELEM_FLOAT, 0, (void **)&job->k, "key", err) != 0 ||
        decode_into(job, &r->v, API_ELEM_FLOAT, 0, (void **)&job->v, "value", err) != 0)
        return -1;
    if (r->has_mask) {
        bool is_bool = r->mask.dtype == API_DTYPE_BOOL;
        if (decode_into(job, &r->mask, is_bool ? API_ELEM_BOOL : API_ELEM_FLOAT,
                        is_bool ? 0 : API_DECODE_NEG_INF,
                        is_bool ? (void **)&job->mask_b : (void **)&job->mask_f, "attn_mask",
                        err) != 0)
            return -1;
    }
    if (r->has_kpm && decode_into(job, &r->kpm, API_ELEM_BOOL, 0, (void **)&job->kpm,
                                  "key_padding_mask", err) != 0)
        return -1;
    if (r->has_kvlen) {
        if (decode_into(job, &r->kvlen, API_ELEM_INT64, 0, (void **)&job->kvlen, "kv_lengths",
                        err) != 0)
            return -1;
        for (size_t i = 0; i < r->kvlen.count; i++) {
            if (job->kvlen[i] < 0 || job->kvlen[i] > r->S) {
                char name[48];
                snprintf(name, sizeof name, "kv_lengths[%zu]", i);
                return invalid(err, name, "%s is %lld; it must be in [0, S] = [0, %lld]", name,
                               (long long)job->kvlen[i], (long long)r->S);
            }
        }
    }
    if (r->has_slopes &&
        decode_into(job, &r->slopes, API_ELEM_FLOAT, 0, (void **)&job->slopes, "alibi", err) != 0)
        return -1;
    if (r->additive && (decode_into(job, &r->wq, API_ELEM_FLOAT, 0, (void **)&job->wq,
                                    "additive_weights.w_q", err) != 0 ||
                        decode_into(job, &r->wk, API_ELEM_FLOAT, 0, (void **)&job->wk,
                                    "additive_weights.w_k", err) != 0 ||
                        decode_into(job, &r->ww, API_ELEM_FLOAT, 0, (void **)&job->ww,
                                    "additive_weights.w", err) != 0))
        return -1;
    if (alloc_buffer((void **)&job->out, os->count, 4, err) != 0)
        return -1;
    if (r->weights != ENG_WEIGHTS_NONE &&
        alloc_buffer((void **)&job->weights, ws->count, 4, err) != 0)
        return -1;
    if (r->return_lse && alloc_buffer((void **)&job->lse, ls->count, 4, err) != 0)
        return -1;
    return 0;
}

/* ---- Reply ------------------------------------------------------------------------------- */

/* The failure of a reply writer as an error: out of memory, or our estimate was wrong. */
static int writer_error(const api_jsonw *w, api_error *err)
{
    if (w->state == API_JSONW_NOMEM)
        return api_error_set(err, 503, API_REASON_MEMORY, NULL, "out of memory for the reply");
    return api_error_set(err, 500, API_REASON_INTERNAL, NULL,
                         "the reply outgrew its estimated size (%zu bytes)", w->max);
}

static int encode_tensor(attn_job *job, const char *name, const float *data, const out_shape *s,
                         api_form form, unsigned flags, api_error *err)
{
    size_t bad = 0;
    api_jsonw_char(&job->w, '"');
    api_jsonw_cstr(&job->w, name);
    api_jsonw_cstr(&job->w, "\":");
    switch (
        api_tensor_encode(&job->w, data, s->rank, s->shape, form, flags, job->call->pool, &bad)) {
    case API_ENCODE_OK:
        return 0;
    case API_ENCODE_NONFINITE: {
        char idx[128];
        return invalid(err, name,
                       "the result %s%s is %s: it does not fit in float32 (inputs too large "
                       "for float32 arithmetic?)",
                       name, api_index_format(idx, sizeof idx, bad, s->rank, s->shape, s->rank),
                       isnan(data[bad]) ? "NaN" : "infinite");
    }
    case API_ENCODE_FULL:
        break;
    }
    return writer_error(&job->w, err);
}

static double ms(int64_t ns)
{
    return (double)ns / 1e6;
}

static int encode_reply(attn_job *job, const out_shape *os, const out_shape *ws,
                        const out_shape *ls, int64_t decode_ns, int64_t compute_ns, api_error *err)
{
    const attn_req *r = &job->r;
    api_form form = reply_form(r);
    api_jsonw *w = &job->w;
    api_jsonw_char(w, '{');
    if (encode_tensor(job, "output", job->out, os, form, 0, err) != 0)
        return -1;
    if (r->weights != ENG_WEIGHTS_NONE) {
        api_jsonw_char(w, ',');
        if (encode_tensor(job, "weights", job->weights, ws, form, 0, err) != 0)
            return -1;
    }
    if (r->return_lse) {
        api_jsonw_char(w, ',');
        if (encode_tensor(job, "lse", job->lse, ls, form, API_ENCODE_NEG_INF_NULL, err) != 0)
            return -1;
    }
    float scale = r->additive ? 1.0f : r->scale_set ? r->scale : (float)(1.0 / sqrt((double)r->D));
    api_jsonw_printf(w,
                     ",\"meta\":{\"batch\":%lld,\"num_heads\":%lld,\"num_kv_heads\":%lld,"
                     "\"query_len\":%lld,\"key_len\":%lld,\"head_dim\":%lld,"
                     "\"value_head_dim\":%lld,\"scale\":",
                     (long long)r->B, (long long)r->H, (long long)r->Hkv, (long long)r->L,
                     (long long)r->S, (long long)r->D, (long long)r->Dv);
    api_jsonw_float(w, scale);
    api_jsonw_printf(w, ",\"decode_ms\":%.3f,\"compute_ms\":%.3f}}\n", ms(decode_ns),
                     ms(compute_ns));
    if (w->state != API_JSONW_OK)
        return writer_error(w, err);
    return 0;
}

/* ---- The call ---------------------------------------------------------------------------- */

/* application/json, any case, optionally with parameters; a charset must be UTF-8 (RFC 8259
 * allows nothing else). A missing header is taken as JSON. */
static bool content_type_is_json(const char *ct)
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

static int check_ctl(attn_job *job, api_error *err)
{
    switch (eng_ctl_check(job->ctl)) {
    case ENG_OK:
        return 0;
    case ENG_ECANCELLED:
        return api_error_set(err, API_STATUS_CLIENT_CLOSED, API_REASON_CANCELLED, NULL,
                             "the request was cancelled");
    default:
        return api_error_set(err, 504, API_REASON_DEADLINE, NULL,
                             "the request did not finish within its deadline of %lld ms "
                             "(--request-timeout-ms, or timeout_ms)",
                             (long long)((job->ctl->deadline_ns - job->start_ns) / 1000000));
    }
}

/* Sets the deadline: the request's own timeout_ms if given, capped by the limit. */
static void set_deadline(attn_job *job)
{
    int64_t cap = job->limits.max_timeout_ms, t = job->r.timeout_ms;
    if (cap > 0 && (t == 0 || t > cap))
        t = cap;
    if (t > 0)
        job->ctl->deadline_ns = job->start_ns + t * 1000000;
}

/* The engine's argument names, in the request's words. */
static const char *request_field(const char *engine_field)
{
    static const char *const map[][2] = {
        {"q", "query"},
        {"k", "key"},
        {"v", "value"},
        {"out", "output"},
        {"key_padding", "key_padding_mask"},
        {"alibi_slopes", "alibi"},
        {"window_left", "window"},
        {"window_right", "window"},
        {"weights_mode", "return_weights"},
        {"additive", "additive_weights"},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (strcmp(engine_field, map[i][0]) == 0)
            return map[i][1];
    return engine_field;
}

static int engine_error(attn_job *job, eng_status st, const eng_error *e, api_error *err)
{
    const char *field = e->field[0] ? request_field(e->field) : NULL;
    switch (st) {
    case ENG_OK:
        return 0;
    case ENG_EINVAL:
        return api_error_set(err, 422, API_REASON_BAD_REQUEST, field, "%s", e->message);
    case ENG_ENONFINITE:
        return api_error_set(err, 422, API_REASON_BAD_REQUEST, field ? field : "output",
                             "%s (inputs too large for float32 arithmetic?)", e->message);
    case ENG_ETOOBIG:
        return api_error_set(err, 413, API_REASON_TOO_LARGE, field, "%s", e->message);
    case ENG_ENOMEM:
        return api_error_set(err, 503, API_REASON_MEMORY, NULL, "out of memory: %s", e->message);
    case ENG_ECANCELLED:
    case ENG_EDEADLINE:
        if (check_ctl(job, err) != 0)
            return -1;
        /* The engine saw what eng_ctl_check no longer does: trust the engine. */
        return st == ENG_ECANCELLED
                   ? api_error_set(err, API_STATUS_CLIENT_CLOSED, API_REASON_CANCELLED, NULL,
                                   "the request was cancelled")
                   : api_error_set(err, 504, API_REASON_DEADLINE, NULL,
                                   "the request did not finish within its deadline");
    case ENG_EIO:
    case ENG_EFORMAT:
        break;
    }
    return api_error_set(err, 500, API_REASON_INTERNAL, field, "engine: %s: %s", eng_status_str(st),
                         e->message);
}

static int run(attn_job *job, api_reply *reply, api_error *err)
{
    const api_call *call = job->call;
    attn_req *r = &job->r;

    if (check_ctl(job, err) != 0)
        return -1;
    if (!content_type_is_json(call->content_type))
        return api_error_set(err, 415, API_REASON_BAD_REQUEST, NULL,
                             "Content-Type \"%.80s\" is not supported; send application/json",
                             call->content_type);
    if (call->body_len > job->limits.max_body_bytes)
        return api_error_set(err, 413, API_REASON_TOO_LARGE, NULL,
                             "the body has %zu bytes, more than the %zu that --max-body-bytes "
                             "allows",
                             call->body_len, job->limits.max_body_bytes);

    /* Parse: the tree's memory is reserved before jansson allocates it. */
    const char *body = call->body ? call->body : "";
    api_body_scan scan;
    api_body_scan_run(body, call->body_len, &scan);
    if (reserve(job, scan.parse_bytes, &job->parse_reserved, "to parse the body", err) != 0) {
        api_body_scan_free(&scan);
        return -1;
    }
    if (api_body_parse(&job->body, body, call->body_len, &scan, err) != 0 ||
        parse_fields(job, err) != 0 || check_shapes(r, err) != 0 || check_elements(job, err) != 0)
        return -1;
    set_deadline(job);

    /* Size everything, reserve it, then allocate and decode. */
    out_shape os, ws, ls;
    out_shapes(r, &os, &ws, &ls);
    build_args(job);
    size_t tensors, text,
        scratch = eng_sdpa_scratch_bytes(&job->args, eng_pool_threads(call->pool));
    bool ok = estimate(job, &os, &ws, &ls, &tensors, &text);
    size_t need = tensors;
    ok = ok && add_size(&need, text) && add_size(&need, scratch);
    char what[160];
    snprintf(what, sizeof what, "%.1f MiB of tensors, %.1f MiB of reply, %.1f MiB of scratch",
             mib(tensors), mib(text), mib(scratch));
    if (reserve(job, ok ? need : SIZE_MAX, &job->reserved, what, err) != 0)
        return -1;
    api_jsonw_init(&job->w, text);

    if (decode_inputs(job, &os, &ws, &ls, err) != 0)
        return -1;
    /* The tree is no longer needed: give its memory back before the long part. */
    api_body_free(&job->body);
    if (call->budget && job->parse_reserved) {
        api_budget_release(call->budget, job->parse_reserved);
        job->parse_reserved = 0;
    }
    build_args(job);
    int64_t t_decoded = eng_now_ns();
    reply->decode_ns = t_decoded - job->call_ns;

    if (check_ctl(job, err) != 0)
        return -1;
    eng_error eerr;
    memset(&eerr, 0, sizeof eerr);
    eng_status st = eng_sdpa(call->pool, &job->args, job->ctl, &eerr);
    int64_t t_computed = eng_now_ns();
    reply->compute_ns = t_computed - t_decoded;
    if (st != ENG_OK)
        return engine_error(job, st, &eerr, err);

    if (encode_reply(job, &os, &ws, &ls, reply->decode_ns, reply->compute_ns, err) != 0)
        return -1;
    reply->status = 200;
    reply->content_type = "application/json";
    reply->reason = API_REASON_NONE;
    reply->body = job->w.data;
    reply->body_len = job->w.len;
    job->w.data = NULL;
    reply->encode_ns = eng_now_ns() - t_computed;
    return 0;
}

void api_attention(const api_call *call, api_reply *reply)
{
    attn_job *job = calloc(1, sizeof *job);
    api_error err;
    memset(&err, 0, sizeof err);
    memset(reply, 0, sizeof *reply);
    if (!job) {
        api_error_set(&err, 503, API_REASON_MEMORY, NULL, "out of memory");
        api_reply_from_error(reply, &err);
        return;
    }
    job->call = call;
    job->limits = call->limits ? *call->limits : api_limits_default();
    /* Sizes below are element counts times at most 16 bytes: keep them far from overflow
     * whatever the flag says (2^59 elements is beyond any machine anyway). */
    if (job->limits.max_elements > SIZE_MAX / 32)
        job->limits.max_elements = SIZE_MAX / 32;
    job->ctl = call->ctl ? call->ctl : &job->own_ctl;
    job->call_ns = eng_now_ns();
    job->start_ns = call->start_ns ? call->start_ns : job->call_ns;
    api_jsonw_init(&job->w, 0);
    set_deadline(job); /* the cap for now; the request's timeout_ms once it is parsed */

    if (run(job, reply, &err) != 0) {
        api_reply_from_error(reply, &err);
        if (reply->decode_ns == 0)
            reply->decode_ns = eng_now_ns() - job->call_ns;
    }

    api_body_free(&job->body);
    api_jsonw_free(&job->w);
    void *buffers[] = {job->q,     job->k,      job->v,      job->out,    job->weights,
                       job->lse,   job->slopes, job->mask_f, job->mask_b, job->kpm,
                       job->kvlen, job->wq,     job->wk,     job->ww};
    for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; i++)
        free(buffers[i]);
    if (call->budget && job->parse_reserved + job->reserved > 0)
        api_budget_release(call->budget, job->parse_reserved + job->reserved);
    free(job);
}
