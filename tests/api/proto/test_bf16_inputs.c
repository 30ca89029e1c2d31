/* test_bf16_inputs.c - bfloat16 query, key and value used as sent: base64 "dtype":
 * "bfloat16" on POST /v1/attention and BF16 binary tensors on the KServe v2 route, with
 * "precision": "bfloat16", reach eng_sdpa as bfloat16 without a float32 copy in memory.
 *
 * Two promises, each checked on both protocols:
 *   - the reply is bit for bit what the float32 copy gave (eng_sdpa on fp32 views of the same
 *     values, which is what api/ computed before), options included;
 *   - the request reserves less: the smallest --max-memory-bytes budget it fits in is lower
 *     than that of the same request with float16 inputs (which are widened to a float32 copy,
 *     as bfloat16 ones were) by the bytes of that copy, less the engine's extra per-block
 *     scratch for reading bf16; a float32-precision request keeps the copy and needs the same
 *     budget as the float16 one. */
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/proto/native.h"
#include "api/proto/v2.h"
#include "api/wire/base64.h"
#include "tests/support/check.h"
#include "tests/support/rng.h"

static eng_pool *pool;
static api_models *models;

/* ---- Problems --------------------------------------------------------------------------- */

typedef struct {
    int64_t B, H, Hkv, L, S, D, Dv;
} dims;

/* q, k, v as bfloat16 bits in the request's layout, and a key padding mask [B, S]. */
typedef struct {
    dims d;
    uint16_t *q, *k, *v;
    uint8_t *kpm;
    size_t nq, nk, nv;
} problem;

static uint16_t *random_bf16(size_t n, uint64_t *rng)
{
    uint16_t *x = malloc(n * sizeof *x);
    if (!x)
        abort();
    for (size_t i = 0; i < n; i++)
        x[i] = eng_f32_to_bf16(rng_sym(rng, 1.5));
    return x;
}

static void problem_make(problem *p, dims d, uint64_t seed)
{
    uint64_t rng = seed;
    p->d = d;
    p->nq = (size_t)(d.B * d.H * d.L * d.D);
    p->nk = (size_t)(d.B * d.Hkv * d.S * d.D);
    p->nv = (size_t)(d.B * d.Hkv * d.S * d.Dv);
    p->q = random_bf16(p->nq, &rng);
    p->k = random_bf16(p->nk, &rng);
    p->v = random_bf16(p->nv, &rng);
    p->kpm = calloc((size_t)(d.B * d.S), 1);
    if (!p->kpm)
        abort();
    for (int64_t i = 0; i < d.B * d.S; i++)
        p->kpm[i] = rng_unit(&rng) < 0.1;
}

static void problem_free(problem *p)
{
    free(p->q);
    free(p->k);
    free(p->v);
    free(p->kpm);
}

static float *widen(const uint16_t *h, size_t n)
{
    float *f = malloc(n * sizeof *f);
    if (!f)
        abort();
    for (size_t i = 0; i < n; i++)
        f[i] = eng_bf16_to_f32(h[i]);
    return f;
}

/* What the float32 copy gave: eng_sdpa on fp32 views of the widened values, laid out as the
 * request's rank says (4: [B, H, L, D]; 3: [B, L, H * D] seen as [B, H, L, D]). */
typedef struct {
    float *out, *lse, *weights;
} expected;

static eng_view layout_view(float *x, int rank, int64_t B, int64_t heads, int64_t n, int64_t d)
{
    if (rank == 4)
        return eng_view_contiguous(x, B, heads, n, d);
    eng_view v = {x, {B, heads, n, d}, {n * heads * d, d, heads * d, 1}};
    return v;
}

/* The options both protocols send: causal, softcap, ALiBi, a left window, key padding, lse
 * and per-head weights. */
static void expected_run(const problem *p, int rank, eng_precision precision, expected *e)
{
    const dims *d = &p->d;
    float *q = widen(p->q, p->nq), *k = widen(p->k, p->nk), *v = widen(p->v, p->nv);
    e->out = calloc((size_t)(d->B * d->H * d->L * d->Dv), sizeof(float));
    e->lse = calloc((size_t)(d->B * d->H * d->L), sizeof(float));
    e->weights = calloc((size_t)(d->B * d->H * d->L * d->S), sizeof(float));
    eng_sdpa_args a = {0};
    a.q = layout_view(q, rank, d->B, d->H, d->L, d->D);
    a.k = layout_view(k, rank, d->B, d->Hkv, d->S, d->D);
    a.v = layout_view(v, rank, d->B, d->Hkv, d->S, d->Dv);
    a.out = layout_view(e->out, rank, d->B, d->H, d->L, d->Dv);
    a.causal = true;
    a.softcap = 30.0f;
    a.alibi = true;
    a.window_left_set = true;
    a.window_left = 20;
    a.key_padding = p->kpm;
    a.key_padding_stride = d->S;
    a.precision = precision;
    a.lse = e->lse;
    a.weights_mode = ENG_WEIGHTS_PER_HEAD;
    a.weights = e->weights;
    eng_error err;
    CHECKF(eng_sdpa(pool, &a, NULL, &err) == ENG_OK, "reference call: %s", err.message);
    free(q);
    free(k);
    free(v);
}

static void expected_free(expected *e)
{
    free(e->out);
    free(e->lse);
    free(e->weights);
}

/* ---- Bodies ------------------------------------------------------------------------------ */

static void put_shape(api_buf *w, int rank, const int64_t *shape)
{
    api_buf_char(w, '[');
    for (int i = 0; i < rank; i++)
        api_buf_printf(w, "%s%lld", i ? "," : "", (long long)shape[i]);
    api_buf_char(w, ']');
}

/* 16-bit values as base64 of dtype "bfloat16" or "float16" (f16: the bf16 values converted,
 * for the memory comparison, which needs only the same shapes and lengths). */
static void put_base64(api_buf *w, const char *name, const uint16_t *h, size_t n, int rank,
                       const int64_t *shape, bool f16)
{
    uint16_t *x = malloc(n * sizeof *x);
    if (!x)
        abort();
    for (size_t i = 0; i < n; i++)
        x[i] = f16 ? eng_f32_to_f16(eng_bf16_to_f32(h[i])) : h[i];
    /* "float16" is a character shorter than "bfloat16": a space keeps the bodies alike. */
    api_buf_printf(w, "\"%s\":{\"shape\":", name);
    put_shape(w, rank, shape);
    api_buf_printf(w, ",\"dtype\":%s,\"base64\":\"", f16 ? " \"float16\"" : "\"bfloat16\"");
    char *p = api_buf_reserve(w, api__base64_encoded_len(n * 2));
    w->len += (size_t)(api__base64_encode(x, n * 2, p) - p);
    api_buf_cstr(w, "\"},");
    free(x);
}

static const char *const OPTIONS = "\"causal\":true,\"softcap\":30,\"alibi\":true,"
                                   "\"window\":[20,null],\"return_lse\":true,"
                                   "\"return_weights\":\"per_head\"";

/* POST /v1/attention with rank-4 base64 inputs; precision "bfloat16" or "float32 " (the space
 * keeps the two bodies the same length). */
static void native_body(const problem *p, bool f16, bool bf16_precision, api_buf *w)
{
    const dims *d = &p->d;
    api_buf_char(w, '{');
    put_base64(w, "query", p->q, p->nq, 4, (int64_t[]){d->B, d->H, d->L, d->D}, f16);
    put_base64(w, "key", p->k, p->nk, 4, (int64_t[]){d->B, d->Hkv, d->S, d->D}, f16);
    put_base64(w, "value", p->v, p->nv, 4, (int64_t[]){d->B, d->Hkv, d->S, d->Dv}, f16);
    api_buf_cstr(w, "\"key_padding_mask\":{\"shape\":");
    put_shape(w, 2, (int64_t[]){d->B, d->S});
    api_buf_cstr(w, ",\"data\":[");
    for (int64_t i = 0; i < d->B * d->S; i++)
        api_buf_cstr(w, i ? (p->kpm[i] ? ",true" : ",false") : (p->kpm[i] ? "true" : "false"));
    api_buf_cstr(w, "]},");
    api_buf_printf(w, "\"precision\":%s,%s,\"output_encoding\":\"base64\"}",
                   bf16_precision ? "\"bfloat16\"" : "\"float32\" ", OPTIONS);
}

/* The KServe v2 request with rank-3 binary inputs (BF16, or FP16 for the comparison); the
 * JSON header is padded to 8 bytes so that the tensors after it are aligned (used in place).
 * *header_len gets its length. */
static char *v2_body(const problem *p, bool f16, bool bf16_precision, size_t *len,
                     size_t *header_len)
{
    const dims *d = &p->d;
    api_buf w;
    api_buf_init(&w, (size_t)1 << 28);
    const char *dt = f16 ? "FP16" : "BF16";
    api_buf_printf(&w,
                   "{\"parameters\":{\"precision\":%s,\"num_heads\":%lld,"
                   "\"num_kv_heads\":%lld,\"causal\":true,\"softcap\":30,\"alibi\":true,"
                   "\"window_left\":20,\"return_lse\":true,\"return_weights\":\"per_head\"},"
                   "\"inputs\":[",
                   bf16_precision ? "\"bfloat16\"" : "\"float32\" ", (long long)d->H,
                   (long long)d->Hkv);
    const char *names[3] = {"query", "key", "value"};
    const int64_t shapes[3][3] = {
        {d->B, d->L, d->H * d->D}, {d->B, d->S, d->Hkv * d->D}, {d->B, d->S, d->Hkv * d->Dv}};
    const size_t counts[3] = {p->nq, p->nk, p->nv};
    for (int i = 0; i < 3; i++) {
        api_buf_printf(&w, "{\"name\":\"%s\",\"datatype\":\"%s\",\"shape\":", names[i], dt);
        put_shape(&w, 3, shapes[i]);
        api_buf_printf(&w, ",\"parameters\":{\"binary_data_size\":%zu}},", counts[i] * 2);
    }
    api_buf_cstr(&w, "{\"name\":\"key_padding_mask\",\"datatype\":\"BOOL\",\"shape\":");
    put_shape(&w, 2, (int64_t[]){d->B, d->S});
    api_buf_cstr(&w, ",\"data\":[");
    for (int64_t i = 0; i < d->B * d->S; i++)
        api_buf_cstr(&w, i ? (p->kpm[i] ? ",true" : ",false") : (p->kpm[i] ? "true" : "false"));
    api_buf_cstr(&w, "]}]}");
    while (w.len % 8)
        api_buf_char(&w, ' ');
    *header_len = w.len;
    const uint16_t *data[3] = {p->q, p->k, p->v};
    for (int i = 0; i < 3; i++)
        for (size_t j = 0; j < counts[i]; j++) {
            uint16_t h = f16 ? eng_f32_to_f16(eng_bf16_to_f32(data[i][j])) : data[i][j];
            api_buf_mem(&w, &h, 2);
        }
    CHECK(w.state == API_BUF_OK);
    *len = w.len;
    char *body = malloc(w.len);
    if (!body)
        abort();
    memcpy(body, w.data, w.len);
    api_buf_free(&w);
    return body;
}

/* ---- Calls ------------------------------------------------------------------------------- */

/* One call under a budget of `budget_bytes` (0: none); the reply is the caller's. */
static void call_native(const char *body, size_t len, size_t budget_bytes, api_reply *r)
{
    api_budget *budget = budget_bytes ? api_budget_new(budget_bytes) : NULL;
    api_lease lease;
    api_lease_start(&lease, budget, eng_now_ns(), 0);
    api_call call = {.body = body, .body_len = len, .pool = pool, .lease = &lease};
    api_attention(&call, r);
    api_lease_end(&lease);
    api_budget_free(budget);
}

static void call_v2(const char *body, size_t len, size_t header_len, size_t budget_bytes,
                    api_reply *r)
{
    api_budget *budget = budget_bytes ? api_budget_new(budget_bytes) : NULL;
    api_lease lease;
    api_lease_start(&lease, budget, eng_now_ns(), 0);
    char hl[32];
    snprintf(hl, sizeof hl, "%zu", header_len);
    api_call call = {.body = body,
                     .body_len = len,
                     .pool = pool,
                     .lease = &lease,
                     .models = models,
                     .inference_header_length = hl,
                     .model = "sdpa"};
    api_v2_infer(&call, r);
    api_lease_end(&lease);
    api_budget_free(budget);
}

/* The bits of a and b differ first at (or -1). */
static int64_t first_difference(const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof a[i]) != 0)
            return (int64_t)i;
    return -1;
}

/* Reply tensor `name` of a native reply, decoded exactly (base64 float32), into dst[n]. */
static void native_tensor(const api__body *b, const char *name, float *dst, size_t n)
{
    api__tensor t;
    api__error err = {0};
    json_t *v = json_object_get(b->root, name);
    if (api__tensor_probe(b, v, name, (size_t)1 << 30, &t, &err) != 0 || t.count != n ||
        api__tensor_decode(b, &t, API_ELEM_FLOAT, API_DECODE_NEG_INF, dst, name, NULL, &err) != 0) {
        CHECKF(0, "reply %s: %s (count %zu, want %zu)", name, err.message, t.count, n);
        memset(dst, 0, n * sizeof *dst);
    }
}

/* Output `name` of a v2 JSON reply into dst[n] (numbers printed to round-trip exactly). */
static void v2_tensor(json_t *root, const char *name, float *dst, size_t n)
{
    json_t *outs = json_object_get(root, "outputs"), *o;
    size_t i;
    memset(dst, 0, n * sizeof *dst);
    json_array_foreach(outs, i, o)
    {
        if (strcmp(json_string_value(json_object_get(o, "name")), name) != 0)
            continue;
        json_t *data = json_object_get(o, "data");
        CHECKF(json_array_size(data) == n, "v2 %s has %zu values, want %zu", name,
               json_array_size(data), n);
        for (size_t j = 0; j < n && j < json_array_size(data); j++) {
            json_t *x = json_array_get(data, j);
            dst[j] = json_is_number(x) ? (float)json_number_value(x) : -INFINITY;
        }
        return;
    }
    CHECKF(0, "v2 reply has no output %s", name);
}

static void compare(const char *about, const char *what, const float *got, const float *want,
                    size_t n)
{
    int64_t d = first_difference(got, want, n);
    CHECKF(d < 0, "%s: %s[%lld] is %a, the float32 copy gave %a", about, what, (long long)d,
           d < 0 ? 0.0 : (double)got[d], d < 0 ? 0.0 : (double)want[d]);
}

static const dims exact_dims = {2, 4, 2, 37, 70, 64, 32};

static void test_native_base64_bf16_is_bit_identical(void)
{
    for (int prec = 0; prec < 2; prec++) {
        problem p;
        problem_make(&p, exact_dims, 21);
        const dims *d = &p.d;
        api_buf w;
        api_buf_init(&w, (size_t)1 << 26);
        native_body(&p, false, prec == 0, &w);
        api_reply r;
        call_native(w.data, w.len, 0, &r);
        const char *about = prec == 0 ? "native, bfloat16" : "native, float32";
        CHECKF(r.status == 200, "%s: status %d: %.300s", about, r.status, r.body);
        expected e;
        expected_run(&p, 4, prec == 0 ? ENG_PRECISION_BFLOAT16 : ENG_PRECISION_FLOAT32, &e);
        api__body body;
        api__error err = {0};
        if (r.status == 200 && api__body_parse(&body, r.body, r.body_len, NULL, &err) == 0) {
            size_t no = (size_t)(d->B * d->H * d->L * d->Dv), nl = (size_t)(d->B * d->H * d->L),
                   nw = nl * (size_t)d->S;
            float *got = malloc(nw * sizeof *got);
            native_tensor(&body, "output", got, no);
            compare(about, "output", got, e.out, no);
            native_tensor(&body, "lse", got, nl);
            compare(about, "lse", got, e.lse, nl);
            native_tensor(&body, "weights", got, nw);
            compare(about, "weights", got, e.weights, nw);
            free(got);
            api__body_free(&body);
        }
        expected_free(&e);
        api_reply_free(&r);
        api_buf_free(&w);
        problem_free(&p);
    }
}

static void test_v2_binary_bf16_is_bit_identical(void)
{
    for (int prec = 0; prec < 2; prec++) {
        problem p;
        problem_make(&p, exact_dims, 22);
        const dims *d = &p.d;
        size_t len, hlen;
        char *body = v2_body(&p, false, prec == 0, &len, &hlen);
        api_reply r;
        call_v2(body, len, hlen, 0, &r);
        const char *about = prec == 0 ? "v2, bfloat16" : "v2, float32";
        CHECKF(r.status == 200, "%s: status %d: %.300s", about, r.status, r.body);
        expected e;
        expected_run(&p, 3, prec == 0 ? ENG_PRECISION_BFLOAT16 : ENG_PRECISION_FLOAT32, &e);
        json_error_t jerr;
        json_t *root = r.status == 200 ? json_loadb(r.body, r.body_len, 0, &jerr) : NULL;
        if (root) {
            size_t no = (size_t)(d->B * d->H * d->L * d->Dv), nl = (size_t)(d->B * d->H * d->L),
                   nw = nl * (size_t)d->S;
            float *got = malloc(nw * sizeof *got);
            v2_tensor(root, "output", got, no);
            compare(about, "output", got, e.out, no);
            v2_tensor(root, "lse", got, nl);
            compare(about, "lse", got, e.lse, nl);
            v2_tensor(root, "weights", got, nw);
            compare(about, "weights", got, e.weights, nw);
            free(got);
            json_decref(root);
        }
        expected_free(&e);
        api_reply_free(&r);
        free(body);
        problem_free(&p);
    }
}

/* ---- Memory ------------------------------------------------------------------------------ */

typedef struct {
    const char *body;
    size_t len, header_len; /* header_len 0: the native route */
} request;

static int status_under(const request *rq, size_t budget_bytes)
{
    api_reply r;
    if (rq->header_len)
        call_v2(rq->body, rq->len, rq->header_len, budget_bytes, &r);
    else
        call_native(rq->body, rq->len, budget_bytes, &r);
    int status = r.status;
    CHECKF(status == 200 || status == 413, "status %d under a budget of %zu: %.200s", status,
           budget_bytes, r.body);
    api_reply_free(&r);
    return status;
}

/* The smallest budget the request runs in (it is refused with 413 below it). */
static size_t smallest_budget(const request *rq)
{
    size_t lo = 1, hi = (size_t)1 << 30; /* 413 at lo, 200 at hi */
    CHECK_EQ_INT(status_under(rq, hi), 200);
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (status_under(rq, mid) == 200)
            hi = mid;
        else
            lo = mid;
    }
    return hi;
}

/* What eng_sdpa's scratch grows by when it reads q, k and v as bf16 (per-block widening). */
static size_t bf16_scratch_extra(const dims *d, int rank)
{
    eng_sdpa_args a = {0};
    a.q = layout_view(NULL, rank, d->B, d->H, d->L, d->D);
    a.k = layout_view(NULL, rank, d->B, d->Hkv, d->S, d->D);
    a.v = layout_view(NULL, rank, d->B, d->Hkv, d->S, d->Dv);
    a.out = layout_view(NULL, rank, d->B, d->H, d->L, d->Dv);
    a.causal = true;
    a.softcap = 30.0f;
    a.alibi = true;
    a.window_left_set = true;
    a.window_left = 20;
    a.weights_mode = ENG_WEIGHTS_PER_HEAD;
    a.precision = ENG_PRECISION_BFLOAT16;
    int threads = eng_pool_threads(pool);
    size_t fp32 = eng_sdpa_scratch_bytes(&a, threads);
    a.q_dtype = a.kv_dtype = ENG_DTYPE_BF16;
    size_t bf16 = eng_sdpa_scratch_bytes(&a, threads);
    return bf16 - fp32;
}

/* Element counts here are multiples of 64, so buffers need no alignment padding, and the two
 * bodies compared have the same length: budgets differ by exactly the buffers saved. */
static const dims memory_dims = {1, 4, 2, 64, 1024, 64, 64};

static void check_budgets(const char *about, const request *bf16, const request *f16,
                          const request *bf16_fp32, const request *f16_fp32, size_t saved,
                          size_t extra)
{
    if (eng_sdpa_precision(&(eng_sdpa_args){.precision = ENG_PRECISION_BFLOAT16}) !=
        ENG_PRECISION_BFLOAT16) {
        printf("skip: %s: kernel set %s computes bfloat16 requests in float32\n", about,
               eng_kernels_name());
        return;
    }
    size_t a = smallest_budget(bf16), b = smallest_budget(f16);
    size_t c = smallest_budget(bf16_fp32), e = smallest_budget(f16_fp32);
    /* With float32 precision both keep the float32 copy: what differs is the parse of the
     * dtype names alone ("float16" is shorter than "bfloat16"), a few bytes. */
    long long names = (long long)e - (long long)c;
    CHECKF(names > -64 && names < 64,
           "%s, float32 precision: bfloat16 inputs need %zu bytes, float16 %zu (both keep the "
           "float32 copy)",
           about, c, e);
    long long less = (long long)b - (long long)a - names;
    CHECKF(less == (long long)saved - (long long)extra,
           "%s: the bfloat16 request needs %zu bytes, the float16 one %zu: %lld less (dtype "
           "names aside), want the %zu of the float32 copy less the engine's %zu of bf16 scratch",
           about, a, b, less, saved, extra);
    printf("  %s: smallest budget %zu bytes, float16 inputs %zu: %lld saved (the float32 copy: "
           "%zu; engine scratch for bf16: +%zu)\n",
           about, a, b, less, saved, extra);
}

static void test_bf16_requests_reserve_less(void)
{
    problem p;
    problem_make(&p, memory_dims, 23);
    const size_t n = p.nq + p.nk + p.nv;
    api_buf w[4];
    request native[4];
    for (int i = 0; i < 4; i++) {
        api_buf_init(&w[i], (size_t)1 << 26);
        native_body(&p, i % 2 == 1, i < 2, &w[i]);
        native[i] = (request){w[i].data, w[i].len, 0};
    }
    /* base64: bfloat16 decodes into 2-byte buffers where float16 decodes into 4-byte ones. */
    check_budgets("native base64", &native[0], &native[1], &native[2], &native[3], 2 * n,
                  bf16_scratch_extra(&p.d, 4));
    request v2[4];
    char *bodies[4];
    for (int i = 0; i < 4; i++) {
        size_t len, hlen;
        bodies[i] = v2_body(&p, i % 2 == 1, i < 2, &len, &hlen);
        v2[i] = (request){bodies[i], len, hlen};
    }
    /* raw: bfloat16 is used in place where float16 decodes into 4-byte buffers. */
    check_budgets("v2 binary", &v2[0], &v2[1], &v2[2], &v2[3], 4 * n, bf16_scratch_extra(&p.d, 3));
    for (int i = 0; i < 4; i++) {
        api_buf_free(&w[i]);
        free(bodies[i]);
    }
    problem_free(&p);
}

int main(void)
{
    eng_error err;
    pool = eng_pool_new(2, &err);
    models = api_models_new();
    if (!pool || !models) {
        fprintf(stderr, "set-up failed\n");
        return 1;
    }
    RUN(test_native_base64_bf16_is_bit_identical);
    RUN(test_v2_binary_bf16_is_bit_identical);
    RUN_WITHIN(test_bf16_requests_reserve_less, 300);
    api_models_free(models);
    eng_pool_free(pool);
    return check_report();
}
