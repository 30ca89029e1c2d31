/* test_native_attention.c - POST /v1/attention end to end against the float64 reference: each
 * option of docs/semantics.md, in each rank and wire form, gives through the API what ref_sdpa
 * gives for the same problem set up directly in [B, H, L, D] layout. This pins down the mapping
 * from the request to the engine (strided rank-2/3 views, mask shapes and polarity, alignments,
 * output shapes and forms), independently of how api/ builds its arguments. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/proto/native.h"
#include "api/wire/base64.h"
#include "tests/support/check.h"
#include "tests/support/ref.h"
#include "tests/support/rng.h"

static eng_pool *pool;

enum { CAUSAL_NONE, CAUSAL_TRUE, CAUSAL_TOP_LEFT, CAUSAL_BOTTOM_RIGHT };
enum { MASK_NONE, MASK_BOOL_LS, MASK_FLOAT_B1LS, MASK_BOOL_1H1S };
enum { KPM_NONE, KPM_BS, KPM_S };
enum { ALIBI_NONE, ALIBI_DEFAULT, ALIBI_SLOPES };

typedef struct {
    const char *about;
    int rank;
    api__form form;
    api__dtype dtype; /* of q, k and v in the base64 form */
    int64_t B, H, Hkv, L, S, D, Dv;
    int causal;
    bool offset_set;
    int64_t query_offset;
    int64_t window_left, window_right; /* -1: null */
    bool scale_set;
    float scale, softcap;
    int kpm, mask, alibi;
    bool kv_lengths, additive;
    eng_weights_mode weights;
    bool lse;
    const char *encoding; /* NULL: the query's form */
} sdpa_case;

static const sdpa_case cases[] = {
    {.about = "rank 4, nested, weights per head and lse",
     .rank = 4,
     .form = API_FORM_NESTED,
     .B = 2,
     .H = 2,
     .Hkv = 2,
     .L = 3,
     .S = 4,
     .D = 4,
     .Dv = 3,
     .window_left = -1,
     .window_right = -1,
     .weights = ENG_WEIGHTS_PER_HEAD,
     .lse = true},
    {.about = "rank 3, flat, grouped-query, causal, mean weights",
     .rank = 3,
     .form = API_FORM_FLAT,
     .B = 2,
     .H = 4,
     .Hkv = 2,
     .L = 5,
     .S = 5,
     .D = 2,
     .Dv = 3,
     .causal = CAUSAL_TRUE,
     .window_left = -1,
     .window_right = -1,
     .weights = ENG_WEIGHTS_MEAN,
     .lse = true},
    {.about = "rank 2, base64 float32, multi-query, causal bottom_right (decoding shape)",
     .rank = 2,
     .form = API_FORM_BASE64,
     .dtype = API_DTYPE_FLOAT32,
     .B = 1,
     .H = 2,
     .Hkv = 1,
     .L = 2,
     .S = 6,
     .D = 4,
     .Dv = 4,
     .causal = CAUSAL_BOTTOM_RIGHT,
     .window_left = -1,
     .window_right = -1,
     .weights = ENG_WEIGHTS_PER_HEAD,
     .lse = true},
    {.about = "rank 4, sliding window, default ALiBi, query_offset",
     .rank = 4,
     .form = API_FORM_NESTED,
     .B = 1,
     .H = 4,
     .Hkv = 4,
     .L = 4,
     .S = 7,
     .D = 3,
     .Dv = 2,
     .causal = CAUSAL_TRUE,
     .offset_set = true,
     .query_offset = 3,
     .window_left = 2,
     .window_right = 0,
     .alibi = ALIBI_DEFAULT,
     .weights = ENG_WEIGHTS_PER_HEAD},
    {.about = "rank 3, key padding [B, S] and kv_lengths, rows that see no key",
     .rank = 3,
     .form = API_FORM_NESTED,
     .B = 3,
     .H = 2,
     .Hkv = 2,
     .L = 2,
     .S = 5,
     .D = 2,
     .Dv = 2,
     .window_left = -1,
     .window_right = -1,
     .kpm = KPM_BS,
     .kv_lengths = true,
     .weights = ENG_WEIGHTS_MEAN,
     .lse = true},
    {.about = "rank 2, key padding [S] and a boolean [L, S] mask",
     .rank = 2,
     .form = API_FORM_NESTED,
     .B = 1,
     .H = 1,
     .Hkv = 1,
     .L = 4,
     .S = 4,
     .D = 3,
     .Dv = 3,
     .window_left = -1,
     .window_right = -1,
     .kpm = KPM_S,
     .mask = MASK_BOOL_LS,
     .weights = ENG_WEIGHTS_MEAN,
     .lse = true},
    {.about = "rank 4, float mask [B, 1, L, S] with -inf, softcap and scale",
     .rank = 4,
     .form = API_FORM_FLAT,
     .B = 2,
     .H = 3,
     .Hkv = 1,
     .L = 3,
     .S = 4,
     .D = 2,
     .Dv = 2,
     .window_left = -1,
     .window_right = -1,
     .scale_set = true,
     .scale = 0.7f,
     .softcap = 2.0f,
     .mask = MASK_FLOAT_B1LS,
     .weights = ENG_WEIGHTS_PER_HEAD,
     .lse = true},
    {.about = "rank 3, base64 float16, explicit ALiBi slopes, mask [1, H, 1, S], nested out",
     .rank = 3,
     .form = API_FORM_BASE64,
     .dtype = API_DTYPE_FLOAT16,
     .B = 2,
     .H = 2,
     .Hkv = 2,
     .L = 3,
     .S = 3,
     .D = 4,
     .Dv = 2,
     .window_left = -1,
     .window_right = -1,
     .alibi = ALIBI_SLOPES,
     .mask = MASK_BOOL_1H1S,
     .weights = ENG_WEIGHTS_MEAN,
     .encoding = "nested"},
    {.about = "rank 4, base64 bfloat16, additive scoring",
     .rank = 4,
     .form = API_FORM_BASE64,
     .dtype = API_DTYPE_BFLOAT16,
     .B = 1,
     .H = 2,
     .Hkv = 2,
     .L = 3,
     .S = 4,
     .D = 3,
     .Dv = 2,
     .window_left = -1,
     .window_right = -1,
     .additive = true,
     .weights = ENG_WEIGHTS_PER_HEAD,
     .lse = true},
    {.about = "rank 2, non-causal window [null, 1] with a negative offset, base64 out",
     .rank = 2,
     .form = API_FORM_NESTED,
     .B = 1,
     .H = 2,
     .Hkv = 2,
     .L = 3,
     .S = 5,
     .D = 2,
     .Dv = 3,
     .offset_set = true,
     .query_offset = -1,
     .window_left = -1,
     .window_right = 1,
     .lse = true,
     .encoding = "base64"},
    {.about = "rank 3, causal top_left with more queries than keys, flat out",
     .rank = 3,
     .form = API_FORM_NESTED,
     .B = 1,
     .H = 3,
     .Hkv = 3,
     .L = 5,
     .S = 3,
     .D = 2,
     .Dv = 2,
     .causal = CAUSAL_TOP_LEFT,
     .window_left = -1,
     .window_right = -1,
     .weights = ENG_WEIGHTS_PER_HEAD,
     .lse = true,
     .encoding = "flat"},
};

/* ---- Problem data ------------------------------------------------------------------------ */

static uint64_t rng = 88172645463325252u;

static float uniform(float lo, float hi)
{
    return (float)rng_range(&rng, lo, hi);
}

/* A problem in canonical layout, the engine's and the reference's. */
typedef struct {
    float *q, *k, *v;    /* [B, H, L, D], [B, Hkv, S, D], [B, Hkv, S, Dv] */
    uint8_t *kpm;        /* [B, S] or [S] */
    int64_t *kv_lengths; /* [B] */
    uint8_t *mask_b;     /* [L, S] or [1, H, 1, S] */
    float *mask_f;       /* [B, 1, L, S] */
    float *slopes;       /* [H] */
    float *wq, *wk, *ww; /* [A, D], [A, D], [A] */
    int64_t A;
} problem;

/* Rounds like the wire dtype does, so that the reference sees what the API decodes. */
static float wire_round(float x, api__dtype dtype)
{
    if (dtype == API_DTYPE_FLOAT16)
        return eng_f16_to_f32(eng_f32_to_f16(x));
    if (dtype == API_DTYPE_BFLOAT16)
        return eng_bf16_to_f32(eng_f32_to_bf16(x));
    return x;
}

static float *random_floats(size_t n, api__dtype dtype)
{
    float *p = malloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++)
        p[i] = wire_round(uniform(-1.5f, 1.5f), dtype);
    return p;
}

static void problem_make(const sdpa_case *c, problem *p)
{
    memset(p, 0, sizeof *p);
    api__dtype dt = c->form == API_FORM_BASE64 ? c->dtype : API_DTYPE_FLOAT32;
    p->q = random_floats((size_t)(c->B * c->H * c->L * c->D), dt);
    p->k = random_floats((size_t)(c->B * c->Hkv * c->S * c->D), dt);
    p->v = random_floats((size_t)(c->B * c->Hkv * c->S * c->Dv), dt);
    if (c->kpm) {
        size_t n = (size_t)((c->kpm == KPM_BS ? c->B : 1) * c->S);
        p->kpm = malloc(n);
        for (size_t i = 0; i < n; i++)
            p->kpm[i] = uniform(0, 1) < 0.3f;
        if (c->kpm == KPM_BS && c->B > 1)
            memset(p->kpm + c->S, 1, (size_t)c->S); /* batch 1 is all padding: empty rows */
    }
    if (c->kv_lengths) {
        p->kv_lengths = malloc((size_t)c->B * sizeof *p->kv_lengths);
        for (int64_t b = 0; b < c->B; b++)
            p->kv_lengths[b] = (b * 2 + 3) % (c->S + 1);
        p->kv_lengths[c->B - 1] = 0;
    }
    if (c->mask == MASK_BOOL_LS || c->mask == MASK_BOOL_1H1S) {
        size_t n = (size_t)(c->mask == MASK_BOOL_LS ? c->L * c->S : c->H * c->S);
        p->mask_b = malloc(n);
        for (size_t i = 0; i < n; i++)
            p->mask_b[i] = uniform(0, 1) < 0.7f;
    }
    if (c->mask == MASK_FLOAT_B1LS) {
        size_t n = (size_t)(c->B * c->L * c->S);
        p->mask_f = malloc(n * sizeof *p->mask_f);
        for (size_t i = 0; i < n; i++)
            p->mask_f[i] = uniform(0, 1) < 0.25f ? -INFINITY : uniform(-2, 2);
    }
    if (c->alibi == ALIBI_SLOPES)
        p->slopes = random_floats((size_t)c->H, API_DTYPE_FLOAT32);
    if (c->additive) {
        p->A = 3;
        p->wq = random_floats((size_t)(p->A * c->D), API_DTYPE_FLOAT32);
        p->wk = random_floats((size_t)(p->A * c->D), API_DTYPE_FLOAT32);
        p->ww = random_floats((size_t)p->A, API_DTYPE_FLOAT32);
    }
}

static void problem_free(problem *p)
{
    void *all[] = {p->q,      p->k,      p->v,  p->kpm, p->kv_lengths, p->mask_b,
                   p->mask_f, p->slopes, p->wq, p->wk,  p->ww};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
}

/* The reference's arguments, built directly from the canonical buffers. */
static eng_sdpa_args reference_args(const sdpa_case *c, const problem *p)
{
    eng_sdpa_args a;
    memset(&a, 0, sizeof a);
    a.q = eng_view_contiguous(p->q, c->B, c->H, c->L, c->D);
    a.k = eng_view_contiguous(p->k, c->B, c->Hkv, c->S, c->D);
    a.v = eng_view_contiguous(p->v, c->B, c->Hkv, c->S, c->Dv);
    a.out = eng_view_contiguous(NULL, c->B, c->H, c->L, c->Dv);
    a.scale_set = c->scale_set;
    a.scale = c->scale;
    a.softcap = c->softcap;
    a.causal = c->causal != CAUSAL_NONE;
    a.align = c->offset_set                      ? ENG_ALIGN_OFFSET
              : c->causal == CAUSAL_BOTTOM_RIGHT ? ENG_ALIGN_BOTTOM_RIGHT
                                                 : ENG_ALIGN_TOP_LEFT;
    a.query_offset = c->query_offset;
    a.window_left_set = c->window_left >= 0;
    a.window_left = c->window_left;
    a.window_right_set = c->window_right >= 0;
    a.window_right = c->window_right;
    a.key_padding = p->kpm;
    a.key_padding_stride = c->kpm == KPM_BS ? c->S : 0;
    a.kv_lengths = p->kv_lengths;
    if (c->mask == MASK_BOOL_LS)
        a.attn_mask = (eng_mask){ENG_MASK_BOOL, p->mask_b, {1, 1, c->L, c->S}, {0, 0, c->S, 1}};
    if (c->mask == MASK_BOOL_1H1S)
        a.attn_mask = (eng_mask){ENG_MASK_BOOL, p->mask_b, {1, c->H, 1, c->S}, {0, c->S, 0, 1}};
    if (c->mask == MASK_FLOAT_B1LS)
        a.attn_mask =
            (eng_mask){ENG_MASK_FLOAT, p->mask_f, {c->B, 1, c->L, c->S}, {c->L * c->S, 0, c->S, 1}};
    a.alibi = c->alibi != ALIBI_NONE;
    a.alibi_slopes = p->slopes;
    a.additive_w_q = p->wq;
    a.additive_w_k = p->wk;
    a.additive_v = p->ww;
    a.additive_dim = p->A;
    a.weights_mode = c->weights;
    return a;
}

/* ---- The request ------------------------------------------------------------------------- */

/* Canonical [B, heads, n, d] as the rank's layout: itself, [B, n, heads*d] or [n, heads*d]. */
static float *to_layout(const float *x, int rank, int64_t B, int64_t heads, int64_t n, int64_t d,
                        int64_t *shape, int *out_rank)
{
    size_t count = (size_t)(B * heads * n * d);
    float *y = malloc(count * sizeof *y);
    if (rank == 4) {
        memcpy(y, x, count * sizeof *y);
        shape[0] = B, shape[1] = heads, shape[2] = n, shape[3] = d;
    } else {
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < heads; h++)
                for (int64_t i = 0; i < n; i++)
                    for (int64_t c = 0; c < d; c++)
                        y[((b * n + i) * heads + h) * d + c] = x[((b * heads + h) * n + i) * d + c];
        int at = 0;
        if (rank == 3)
            shape[at++] = B;
        shape[at++] = n;
        shape[at++] = heads * d;
    }
    *out_rank = rank;
    return y;
}

static void write_floats(api_buf *w, const char *name, const float *x, int rank,
                         const int64_t *shape, api__form form, api__dtype dtype)
{
    size_t bad, count = 1;
    for (int d = 0; d < rank; d++)
        count *= (size_t)shape[d];
    api_buf_printf(w, "\"%s\":", name);
    if (form == API_FORM_BASE64 && dtype != API_DTYPE_FLOAT32) {
        uint16_t *h = malloc(count * 2);
        for (size_t i = 0; i < count; i++)
            h[i] = dtype == API_DTYPE_FLOAT16 ? eng_f32_to_f16(x[i]) : eng_f32_to_bf16(x[i]);
        api_buf_cstr(w, "{\"shape\":[");
        for (int d = 0; d < rank; d++)
            api_buf_printf(w, "%s%lld", d ? "," : "", (long long)shape[d]);
        api_buf_printf(w, "],\"dtype\":\"%s\",\"base64\":\"", api__dtype_name(dtype));
        char *p = api_buf_reserve(w, api__base64_encoded_len(count * 2));
        w->len += (size_t)(api__base64_encode(h, count * 2, p) - p);
        api_buf_cstr(w, "\"}");
        free(h);
    } else {
        CHECK_EQ_INT(
            api__tensor_encode(w, x, rank, shape, form, API_ENCODE_NEG_INF_NULL, NULL, &bad),
            API_ENCODE_OK);
    }
    api_buf_char(w, ',');
}

static void write_bools(api_buf *w, const char *name, const uint8_t *x, int rank,
                        const int64_t *shape)
{
    size_t count = 1;
    for (int d = 0; d < rank; d++)
        count *= (size_t)shape[d];
    api_buf_printf(w, "\"%s\":{\"shape\":[", name);
    for (int d = 0; d < rank; d++)
        api_buf_printf(w, "%s%lld", d ? "," : "", (long long)shape[d]);
    api_buf_cstr(w, "],\"data\":[");
    for (size_t i = 0; i < count; i++)
        api_buf_cstr(w, i ? (x[i] ? ",true" : ",false") : (x[i] ? "true" : "false"));
    api_buf_cstr(w, "]},");
}

static void build_request(const sdpa_case *c, const problem *p, api_buf *w)
{
    int64_t shape[4];
    int rank;
    api__dtype dt = c->form == API_FORM_BASE64 ? c->dtype : API_DTYPE_FLOAT32;
    api_buf_char(w, '{');
    float *x = to_layout(p->q, c->rank, c->B, c->H, c->L, c->D, shape, &rank);
    write_floats(w, "query", x, rank, shape, c->form, dt);
    free(x);
    x = to_layout(p->k, c->rank, c->B, c->Hkv, c->S, c->D, shape, &rank);
    write_floats(w, "key", x, rank, shape, c->form, dt);
    free(x);
    x = to_layout(p->v, c->rank, c->B, c->Hkv, c->S, c->Dv, shape, &rank);
    write_floats(w, "value", x, rank, shape, c->form, dt);
    free(x);
    if (c->rank != 4)
        api_buf_printf(w, "\"num_heads\":%lld,\"num_kv_heads\":%lld,", (long long)c->H,
                       (long long)c->Hkv);
    static const char *const causal[] = {"false", "true", "\"top_left\"", "\"bottom_right\""};
    api_buf_printf(w, "\"causal\":%s,", causal[c->causal]);
    if (c->offset_set)
        api_buf_printf(w, "\"query_offset\":%lld,", (long long)c->query_offset);
    if (c->window_left >= 0 || c->window_right >= 0) {
        api_buf_cstr(w, "\"window\":[");
        api_buf_printf(w, c->window_left >= 0 ? "%lld," : "null,", (long long)c->window_left);
        api_buf_printf(w, c->window_right >= 0 ? "%lld]," : "null],", (long long)c->window_right);
    }
    if (c->scale_set) {
        api_buf_cstr(w, "\"scale\":");
        api_buf_float(w, c->scale);
        api_buf_char(w, ',');
    }
    if (c->softcap > 0) {
        api_buf_cstr(w, "\"softcap\":");
        api_buf_float(w, c->softcap);
        api_buf_char(w, ',');
    }
    if (c->kpm == KPM_BS)
        write_bools(w, "key_padding_mask", p->kpm, 2, (int64_t[]){c->B, c->S});
    if (c->kpm == KPM_S)
        write_bools(w, "key_padding_mask", p->kpm, 1, (int64_t[]){c->S});
    if (c->kv_lengths) {
        api_buf_cstr(w, "\"kv_lengths\":[");
        for (int64_t b = 0; b < c->B; b++)
            api_buf_printf(w, "%s%lld", b ? "," : "", (long long)p->kv_lengths[b]);
        api_buf_cstr(w, "],");
    }
    if (c->mask == MASK_BOOL_LS)
        write_bools(w, "attn_mask", p->mask_b, 2, (int64_t[]){c->L, c->S});
    if (c->mask == MASK_BOOL_1H1S)
        write_bools(w, "attn_mask", p->mask_b, 4, (int64_t[]){1, c->H, 1, c->S});
    if (c->mask == MASK_FLOAT_B1LS)
        write_floats(w, "attn_mask", p->mask_f, 4, (int64_t[]){c->B, 1, c->L, c->S},
                     API_FORM_NESTED, API_DTYPE_FLOAT32);
    if (c->alibi == ALIBI_DEFAULT)
        api_buf_cstr(w, "\"alibi\":true,");
    if (c->alibi == ALIBI_SLOPES)
        write_floats(w, "alibi", p->slopes, 1, (int64_t[]){c->H}, API_FORM_NESTED,
                     API_DTYPE_FLOAT32);
    if (c->additive) {
        api_buf_cstr(w, "\"score\":\"additive\",\"additive_weights\":{");
        write_floats(w, "w_q", p->wq, 2, (int64_t[]){p->A, c->D}, API_FORM_FLAT, API_DTYPE_FLOAT32);
        write_floats(w, "w_k", p->wk, 2, (int64_t[]){p->A, c->D}, API_FORM_NESTED,
                     API_DTYPE_FLOAT32);
        write_floats(w, "w", p->ww, 1, (int64_t[]){p->A}, API_FORM_BASE64, API_DTYPE_FLOAT32);
        w->len--; /* the last comma */
        api_buf_cstr(w, "},");
    }
    if (c->weights != ENG_WEIGHTS_NONE)
        api_buf_printf(w, "\"return_weights\":\"%s\",",
                       c->weights == ENG_WEIGHTS_MEAN ? "mean" : "per_head");
    if (c->lse)
        api_buf_cstr(w, "\"return_lse\":true,");
    if (c->encoding)
        api_buf_printf(w, "\"output_encoding\":\"%s\",", c->encoding);
    w->len--; /* the last comma */
    api_buf_char(w, '}');
}

/* ---- Checking the reply ------------------------------------------------------------------ */

/* Decodes reply tensor `name` (which must have `rank` and `shape`) into a new buffer. */
static float *reply_tensor(const api__body *b, const char *name, api__form form, int rank,
                           const int64_t *shape)
{
    api__tensor t;
    api__error err = {0};
    json_t *v = json_object_get(b->root, name);
    if (api__tensor_probe(b, v, name, (size_t)1 << 30, &t, &err) != 0) {
        CHECKF(0, "reply %s: %s", name, err.message);
        return NULL;
    }
    CHECKF(t.form == form, "%s has form %d, want %d", name, (int)t.form, (int)form);
    bool same = t.rank == rank;
    for (int d = 0; same && d < rank; d++)
        same = t.shape[d] == shape[d];
    CHECKF(same, "%s has rank %d shape [%lld, %lld, ...], want rank %d [%lld, %lld, ...]", name,
           t.rank, (long long)t.shape[0], (long long)t.shape[1], rank, (long long)shape[0],
           (long long)shape[1]);
    if (!same)
        return NULL;
    float *x = malloc(t.count * sizeof *x);
    if (api__tensor_decode(b, &t, API_ELEM_FLOAT, API_DECODE_NEG_INF, x, name, NULL, &err) != 0) {
        CHECKF(0, "reply %s: %s", name, err.message);
        free(x);
        return NULL;
    }
    return x;
}

static bool close_to(double got, double want)
{
    if (isinf(want) || isinf(got))
        return got == want;
    return fabs(got - want) <= 2e-5 + 2e-4 * fabs(want);
}

static void compare(const char *about, const char *what, const float *got, const double *want,
                    size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (!close_to(got[i], want[i])) {
            CHECKF(0, "%s: %s[%zu] = %.9g, reference %.9g", about, what, i, (double)got[i],
                   want[i]);
            return;
        }
    }
}

static void run_case(const sdpa_case *c)
{
    problem p;
    problem_make(c, &p);
    eng_sdpa_args args = reference_args(c, &p);
    ref_result ref;
    CHECK(ref_sdpa(&args, &ref));

    api_buf req;
    api_buf_init(&req, (size_t)1 << 24);
    build_request(c, &p, &req);
    api_call call = {.body = req.data, .body_len = req.len, .pool = pool};
    api_reply r;
    api_attention(&call, &r);
    CHECKF(r.status == 200, "%s: %d %.*s", c->about, r.status, (int)r.body_len, r.body);

    api__body body;
    api__error err = {0};
    if (r.status == 200 && api__body_parse(&body, r.body, r.body_len, NULL, &err) == 0) {
        api__form form = c->form;
        if (c->encoding)
            form = c->encoding[0] == 'n'   ? API_FORM_NESTED
                   : c->encoding[0] == 'f' ? API_FORM_FLAT
                                           : API_FORM_BASE64;
        int drop = c->rank == 2; /* rank-2 queries have no batch axis in the reply */
        int64_t os[4];
        int orank = c->rank;
        if (c->rank == 4)
            os[0] = c->B, os[1] = c->H, os[2] = c->L, os[3] = c->Dv;
        else if (c->rank == 3)
            os[0] = c->B, os[1] = c->L, os[2] = c->H * c->Dv;
        else
            os[0] = c->L, os[1] = c->H * c->Dv;
        float *out = reply_tensor(&body, "output", form, orank, os);
        if (out) {
            /* Back to [B, H, L, Dv] to compare with the reference. */
            float *canon = malloc((size_t)(c->B * c->H * c->L * c->Dv) * sizeof *canon);
            for (int64_t b = 0; b < c->B; b++)
                for (int64_t h = 0; h < c->H; h++)
                    for (int64_t i = 0; i < c->L; i++)
                        for (int64_t d = 0; d < c->Dv; d++)
                            canon[((b * c->H + h) * c->L + i) * c->Dv + d] =
                                c->rank == 4 ? out[((b * c->H + h) * c->L + i) * c->Dv + d]
                                             : out[((b * c->L + i) * c->H + h) * c->Dv + d];
            compare(c->about, "output", canon, ref.out, (size_t)(c->B * c->H * c->L * c->Dv));
            free(canon);
            free(out);
        }
        if (c->weights == ENG_WEIGHTS_PER_HEAD) {
            int64_t ws[4] = {c->B, c->H, c->L, c->S};
            float *w = reply_tensor(&body, "weights", form, 4 - drop, ws + drop);
            if (w)
                compare(c->about, "weights", w, ref.weights, (size_t)(c->B * c->H * c->L * c->S));
            free(w);
        } else if (c->weights == ENG_WEIGHTS_MEAN) {
            int64_t ws[3] = {c->B, c->L, c->S};
            float *w = reply_tensor(&body, "weights", form, 3 - drop, ws + drop);
            if (w)
                compare(c->about, "mean weights", w, ref.weights_mean,
                        (size_t)(c->B * c->L * c->S));
            free(w);
        } else {
            CHECK(json_object_get(body.root, "weights") == NULL);
        }
        if (c->lse) {
            int64_t ls[3] = {c->B, c->H, c->L};
            float *l = reply_tensor(&body, "lse", form, 3 - drop, ls + drop);
            if (l)
                compare(c->about, "lse", l, ref.lse, (size_t)(c->B * c->H * c->L));
            free(l);
        } else {
            CHECK(json_object_get(body.root, "lse") == NULL);
        }
        api__body_free(&body);
    }
    api_reply_free(&r);
    api_buf_free(&req);
    ref_result_free(&ref);
    problem_free(&p);
}

static void test_every_option_matches_the_reference(void)
{
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_case(&cases[i]);
}

static void test_rows_without_visible_keys_are_zero_with_null_lse(void)
{
    const char *body = "{\"query\": [[1, 0], [0, 1]], \"key\": [[1, 0], [0, 1]], "
                       "\"value\": [[1, 2], [3, 4]], \"attn_mask\": [[false, false], "
                       "[true, false]], \"return_lse\": true, \"return_weights\": \"mean\"}";
    api_call call = {.body = body, .body_len = strlen(body), .pool = pool};
    api_reply r;
    api_attention(&call, &r);
    CHECK_EQ_INT(r.status, 200);
    CHECKF(r.body && strstr(r.body, "\"output\":[[0,0],[1,2]]") &&
               strstr(r.body, "\"weights\":[[0,0],[1,0]]") && strstr(r.body, "\"lse\":[[null,0]]"),
           "%.*s", (int)r.body_len, r.body);
    api_reply_free(&r);
}

static void test_a_result_beyond_float32_is_422_not_a_short_array(void)
{
    /* q . k overflows float32 (1e30 * 1e30): the engine or the encoder must refuse it. */
    const char *body = "{\"query\": [[1e30, 1e30]], \"key\": [[1e30, 1e30]], "
                       "\"value\": [[3e38, 3e38]], \"scale\": 1}";
    api_call call = {.body = body, .body_len = strlen(body), .pool = pool};
    api_reply r;
    api_attention(&call, &r);
    CHECKF(r.status == 200 || r.status == 422, "%d %.*s", r.status, (int)r.body_len, r.body);
    if (r.status == 200) /* then it must be a full, finite answer */
        CHECKF(r.body && strstr(r.body, "\"output\":[[3e+38,3e+38]]"), "%.*s", (int)r.body_len,
               r.body);
    api_reply_free(&r);
}

int main(void)
{
    eng_error err;
    pool = eng_pool_new(2, &err);
    if (!pool) {
        fprintf(stderr, "eng_pool_new: %s\n", err.message);
        return 1;
    }
    RUN(test_every_option_matches_the_reference);
    RUN(test_rows_without_visible_keys_are_zero_with_null_lse);
    RUN(test_a_result_beyond_float32_is_422_not_a_short_array);
    eng_pool_free(pool);
    return check_report();
}
