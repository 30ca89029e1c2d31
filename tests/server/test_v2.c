/*
 * test_v2.c - the KServe v2 routes of a real attnd over HTTP (libcurl): metadata and readiness
 * in the spec's shapes, inference with JSON and binary tensors (FP32 and FP16 in, FP32 out)
 * against the float64 reference, Inference-Header-Content-Length on both sides, gzip and
 * deflate bodies and replies, the protocol's error form, the statistics extension, the layer
 * model "demo" (JSON and binary, against the float64 nn.MultiheadAttention reference), and Triton's
 * nv_inference_* metric families with their model and version labels. One daemon serves every
 * test.
 */
#include <curl/curl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <zlib.h>

#include "tests/support/check.h"
#include "tests/support/daemon.h"
#include "tests/support/ref.h"
#include "tests/support/ref_mha.h"
#include "tests/support/rng.h"
#include "tests/support/util.h"

static daemon_proc d;

/* ---- HTTP ---------------------------------------------------------------------------------- */

typedef struct {
    long status;
    char *body;
    size_t len;
    char headers[4096]; /* every response header line, as received */
} resp;

static size_t on_data(char *p, size_t size, size_t n, void *u)
{
    resp *r = u;
    size_t k = size * n;
    char *b = realloc(r->body, r->len + k + 1);
    if (!b)
        return 0;
    memcpy(b + r->len, p, k);
    r->len += k;
    b[r->len] = '\0';
    r->body = b;
    return k;
}

static size_t on_head(char *p, size_t size, size_t n, void *u)
{
    resp *r = u;
    size_t k = size * n, used = strlen(r->headers);
    if (used + k + 1 < sizeof r->headers) {
        memcpy(r->headers + used, p, k);
        r->headers[used + k] = '\0';
    }
    return k;
}

/* The value of response header `name` (trimmed) into out, or "" when absent. */
static const char *header(const resp *r, const char *name, char *out, size_t size)
{
    size_t n = strlen(name);
    const char *p = r->headers;
    out[0] = '\0';
    while (p && *p) {
        if (strncasecmp(p, name, n) == 0 && p[n] == ':') {
            const char *v = p + n + 1;
            while (*v == ' ')
                v++;
            size_t len = strcspn(v, "\r\n");
            if (len >= size)
                len = size - 1;
            memcpy(out, v, len);
            out[len] = '\0';
            break;
        }
        p = strchr(p, '\n');
        if (p)
            p++;
    }
    return out;
}

/* One request; `headers` NULL-terminated. curl is not asked to decode the reply. */
static long request(const char *method, const char *path, const char *const *headers,
                    const char *body, size_t len, resp *r)
{
    CURL *h = curl_easy_init();
    struct curl_slist *hl = curl_slist_append(NULL, "Expect:");
    char url[512];
    memset(r, 0, sizeof *r);
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", d.port, path);
    for (int i = 0; headers && headers[i]; i++)
        hl = curl_slist_append(hl, headers[i]);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_head);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, r);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 60000L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    if (body) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    }
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    if (curl_easy_perform(h) == CURLE_OK)
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->status);
    curl_slist_free_all(hl);
    curl_easy_cleanup(h);
    if (!r->body)
        r->body = calloc(1, 1);
    return r->status;
}

static void resp_free(resp *r)
{
    free(r->body);
    r->body = NULL;
}

static json_t *json_of(const char *p, size_t n)
{
    json_error_t e;
    json_t *j = json_loadb(p, n, 0, &e);
    CHECKF(j != NULL, "not JSON: %s: %.200s", e.text, p);
    return j;
}

/* A v2 error: the status and {"error": "..."} containing `needle`. */
static void check_v2_error(const resp *r, long status, const char *needle)
{
    CHECKF(r->status == status, "status %ld, want %ld: %.300s", r->status, status, r->body);
    json_t *j = json_of(r->body, r->len);
    if (!j)
        return;
    json_t *e = json_object_get(j, "error");
    CHECKF(json_is_string(e) && json_object_size(j) == 1, "not {\"error\": string}: %.300s",
           r->body);
    if (needle && json_is_string(e))
        CHECKF(strstr(json_string_value(e), needle) != NULL, "\"%s\" lacks \"%s\"",
               json_string_value(e), needle);
    json_decref(j);
}

/* ---- Bodies -------------------------------------------------------------------------------- */

typedef struct {
    char *data;
    size_t len, cap;
} sbuf;

static void sb_mem(sbuf *b, const void *p, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        b->data = realloc(b->data, b->cap);
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
}

static void sb_str(sbuf *b, const char *s)
{
    sb_mem(b, s, strlen(s));
}

static uint64_t rng = 0x2545F4914F6CDD1Du;

static float frand(void)
{
    return rng_sym(&rng, 1.0);
}

static uint16_t to_half(float f)
{
    /* Round to nearest even for normal values in range (the test's values are in [-1, 1]). */
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    int32_t e = (int32_t)((x >> 23) & 0xff) - 127 + 15;
    uint32_t m = x & 0x7fffffu;
    if (e <= 0) {
        if (e < -10)
            return (uint16_t)sign;
        m |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - e);
        uint32_t h = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1)))
            h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)e << 10) | (m >> 13), rem = m & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1)))
        h++;
    return (uint16_t)(sign | h);
}

static float from_half(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
    if (e == 0) {
        float f = ldexpf((float)m, -24);
        return sign ? -f : f;
    }
    x = sign | ((e - 15 + 127) << 23) | (m << 13);
    float f;
    memcpy(&f, &x, 4);
    return f;
}

typedef struct {
    int64_t B, H, L, S, D;
    float *q, *k, *v;
} problem;

static void problem_new(problem *p, int64_t B, int64_t H, int64_t L, int64_t S, int64_t D)
{
    *p = (problem){B, H, L, S, D, NULL, NULL, NULL};
    size_t nq = (size_t)(B * H * L * D), nk = (size_t)(B * H * S * D);
    p->q = malloc(nq * 4);
    p->k = malloc(nk * 4);
    p->v = malloc(nk * 4);
    for (size_t i = 0; i < nq; i++)
        p->q[i] = frand();
    for (size_t i = 0; i < nk; i++) {
        p->k[i] = frand();
        p->v[i] = frand();
    }
}

static void problem_free(problem *p)
{
    free(p->q);
    free(p->k);
    free(p->v);
}

/* A v2 inference body for the problem: JSON data, or binary (`dtype` "FP32"/"FP16"); the
 * output binary or not. *header_len is the JSON's length. */
static char *infer_body(const problem *p, const char *dtype, bool binary_in, bool binary_out,
                        const char *id, size_t *len, size_t *header_len)
{
    sbuf b = {0}, bin = {0};
    const char *names[3] = {"query", "key", "value"};
    const float *data[3] = {p->q, p->k, p->v};
    int64_t rows[3] = {p->L, p->S, p->S};
    char tmp[256];
    sb_str(&b, "{");
    if (id) {
        snprintf(tmp, sizeof tmp, "\"id\":\"%s\",", id);
        sb_str(&b, tmp);
    }
    snprintf(tmp, sizeof tmp, "\"parameters\":{\"causal\":true,\"binary_data_output\":%s},",
             binary_out ? "true" : "false");
    sb_str(&b, tmp);
    sb_str(&b, "\"inputs\":[");
    for (int t = 0; t < 3; t++) {
        size_t n = (size_t)(p->B * p->H * rows[t] * p->D);
        snprintf(tmp, sizeof tmp,
                 "%s{\"name\":\"%s\",\"datatype\":\"%s\",\"shape\":[%lld,%lld,%lld,%lld]",
                 t ? "," : "", names[t], dtype, (long long)p->B, (long long)p->H,
                 (long long)rows[t], (long long)p->D);
        sb_str(&b, tmp);
        if (binary_in) {
            size_t esize = strcmp(dtype, "FP16") == 0 ? 2 : 4;
            snprintf(tmp, sizeof tmp, ",\"parameters\":{\"binary_data_size\":%zu}}", n * esize);
            sb_str(&b, tmp);
            for (size_t i = 0; i < n; i++) {
                if (esize == 2) {
                    uint16_t h = to_half(data[t][i]);
                    sb_mem(&bin, &h, 2);
                } else {
                    sb_mem(&bin, &data[t][i], 4);
                }
            }
        } else {
            sb_str(&b, ",\"data\":[");
            for (size_t i = 0; i < n; i++) {
                snprintf(tmp, sizeof tmp, "%s%.9g", i ? "," : "", (double)data[t][i]);
                sb_str(&b, tmp);
            }
            sb_str(&b, "]}");
        }
    }
    sb_str(&b, "]}");
    *header_len = b.len;
    if (bin.len)
        sb_mem(&b, bin.data, bin.len);
    free(bin.data);
    *len = b.len;
    return b.data;
}

/* The reference output [B, H, L, D] of the causal problem (inputs rounded to FP16 if asked). */
static double *reference(const problem *p, bool half)
{
    size_t nq = (size_t)(p->B * p->H * p->L * p->D), nk = (size_t)(p->B * p->H * p->S * p->D);
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4);
    for (size_t i = 0; i < nq; i++)
        q[i] = half ? from_half(to_half(p->q[i])) : p->q[i];
    for (size_t i = 0; i < nk; i++) {
        k[i] = half ? from_half(to_half(p->k[i])) : p->k[i];
        v[i] = half ? from_half(to_half(p->v[i])) : p->v[i];
    }
    eng_sdpa_args a = {.causal = true};
    a.q = eng_view_contiguous(q, p->B, p->H, p->L, p->D);
    a.k = eng_view_contiguous(k, p->B, p->H, p->S, p->D);
    a.v = eng_view_contiguous(v, p->B, p->H, p->S, p->D);
    a.out = eng_view_contiguous(NULL, p->B, p->H, p->L, p->D);
    ref_result res;
    double *out = NULL;
    if (ref_sdpa(&a, &res)) {
        out = malloc(nq * sizeof *out);
        memcpy(out, res.out, nq * sizeof *out);
        ref_result_free(&res);
    }
    free(q);
    free(k);
    free(v);
    return out;
}

/* The "output" of a 200 reply (JSON data, or binary after the header at the offset the binary
 * outputs listed before it leave); malloc'd floats. The binary outputs must fill the rest of
 * the body exactly. */
static float *output_of(const resp *r, size_t header_len, size_t n, bool *binary)
{
    json_t *j = json_of(r->body, header_len ? header_len : r->len), *o;
    float *out = NULL;
    size_t i, at = header_len;
    bool any_binary = false;
    if (!j)
        return NULL;
    json_array_foreach(json_object_get(j, "outputs"), i, o)
    {
        json_t *data = json_object_get(o, "data");
        size_t bytes = (size_t)json_integer_value(
            json_object_get(json_object_get(o, "parameters"), "binary_data_size"));
        any_binary |= data == NULL;
        if (strcmp(json_string_value(json_object_get(o, "name")), "output") != 0) {
            at += data ? 0 : bytes;
            continue;
        }
        CHECK(strcmp(json_string_value(json_object_get(o, "datatype")), "FP32") == 0);
        out = malloc(n * 4);
        *binary = data == NULL;
        if (data) {
            CHECK(json_array_size(data) == n);
            for (size_t k = 0; k < n && k < json_array_size(data); k++)
                out[k] = (float)json_number_value(json_array_get(data, k));
        } else {
            CHECK(bytes == n * 4);
            CHECK(r->len >= at + n * 4);
            if (r->len >= at + n * 4)
                memcpy(out, r->body + at, n * 4);
            at += bytes;
        }
    }
    if (any_binary)
        CHECKF(r->len == at, "the binary outputs end at %zu of %zu bytes", at, r->len);
    json_decref(j);
    CHECK(out != NULL);
    return out;
}

static void check_close(const float *got, const double *want, size_t n, double tol)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += !(fabs((double)got[i] - want[i]) <= tol);
    CHECKF(bad == 0, "%zu of %zu values differ from the reference", bad, n);
}

/* ---- Tests --------------------------------------------------------------------------------- */

static void test_metadata(void)
{
    resp r;
    char ct[128];
    json_t *j;
    /* Server metadata at /v2 and at /v2/, the path the OIP's OpenAPI document writes. */
    for (int slash = 0; slash < 2; slash++) {
        CHECK_EQ_INT(request("GET", slash ? "/v2/" : "/v2", NULL, NULL, 0, &r), 200);
        CHECK(strstr(header(&r, "Content-Type", ct, sizeof ct), "application/json") != NULL);
        j = json_of(r.body, r.len);
        if (j) {
            CHECK(strcmp(json_string_value(json_object_get(j, "name")), "attnd") == 0);
            CHECK(strstr(r.body, "\"binary_tensor_data\"") && strstr(r.body, "\"statistics\""));
            json_decref(j);
        }
        resp_free(&r);
    }

    const char *paths[] = {"/v2/models/sdpa", "/v2/models/sdpa/versions/1"};
    for (int i = 0; i < 2; i++) {
        CHECK_EQ_INT(request("GET", paths[i], NULL, NULL, 0, &r), 200);
        j = json_of(r.body, r.len);
        if (j) {
            json_t *in = json_object_get(j, "inputs");
            CHECK(strcmp(json_string_value(json_object_get(j, "name")), "sdpa") == 0);
            CHECK(json_array_size(in) == 7);
            json_t *q = json_array_get(in, 0);
            CHECK(strcmp(json_string_value(json_object_get(q, "name")), "query") == 0);
            CHECK(strcmp(json_string_value(json_object_get(q, "datatype")), "FP32") == 0);
            CHECK(json_integer_value(json_array_get(json_object_get(q, "shape"), 0)) == -1);
            json_t *sinks = json_array_get(in, 6);
            CHECK(strcmp(json_string_value(json_object_get(sinks, "name")), "sinks") == 0);
            CHECK(json_array_size(json_object_get(j, "outputs")) == 2);
            json_decref(j);
        }
        resp_free(&r);
    }
    CHECK_EQ_INT(request("GET", "/v2/models/demo", NULL, NULL, 0, &r), 200);
    CHECK(strstr(r.body, "\"input\"") && strstr(r.body, "\"memory\""));
    resp_free(&r);

    /* Triton's model configuration, which tritonclient's get_model_config and perf_analyzer
     * read before anything else. */
    const char *configs[] = {"/v2/models/sdpa/config", "/v2/models/sdpa/versions/1/config",
                             "/v2/models/demo/config"};
    for (int i = 0; i < 3; i++) {
        CHECK_EQ_INT(request("GET", configs[i], NULL, NULL, 0, &r), 200);
        j = json_of(r.body, r.len);
        if (j) {
            CHECK(json_is_integer(json_object_get(j, "max_batch_size")));
            CHECK(json_array_size(json_object_get(j, "input")) >= 4);
            CHECK(json_array_size(json_object_get(j, "output")) >= 1);
            json_decref(j);
        }
        resp_free(&r);
    }
    request("GET", "/v2/models/nosuch/config", NULL, NULL, 0, &r);
    check_v2_error(&r, 404, "nosuch");
    resp_free(&r);

    CHECK_EQ_INT(request("GET", "/v2/models/sdpa/ready", NULL, NULL, 0, &r), 200);
    j = json_of(r.body, r.len);
    CHECK(j && json_is_true(json_object_get(j, "ready")));
    json_decref(j);
    resp_free(&r);
    CHECK_EQ_INT(request("GET", "/v2/models/sdpa/versions/1/ready", NULL, NULL, 0, &r), 200);
    resp_free(&r);

    request("GET", "/v2/models/nosuch", NULL, NULL, 0, &r);
    check_v2_error(&r, 404, "nosuch");
    resp_free(&r);
    request("GET", "/v2/models/sdpa/versions/7/ready", NULL, NULL, 0, &r);
    check_v2_error(&r, 404, "version");
    resp_free(&r);
    request("POST", "/v2/models/sdpa/infer/x", NULL, "{}", 2, &r);
    check_v2_error(&r, 404, NULL);
    resp_free(&r);
    char allow[64];
    request("POST", "/v2/models/sdpa", NULL, "{}", 2, &r);
    check_v2_error(&r, 405, NULL);
    CHECK(strstr(header(&r, "Allow", allow, sizeof allow), "GET") != NULL);
    resp_free(&r);
    request("GET", "/v2/models/sdpa/infer", NULL, NULL, 0, &r);
    check_v2_error(&r, 405, NULL);
    resp_free(&r);
}

/* "output_dtype": "bfloat16": the outputs (without "outputs", output and lse) come back as
 * BF16 binary data (two little-endian bytes per value, the result rounded to nearest even), and
 * one asked for as JSON is refused. */
static void test_bf16_outputs_are_binary(void)
{
    static const char *const json_h[] = {"Content-Type: application/json", NULL};
    static const char body[] =
        "{\"inputs\":[{\"name\":\"query\",\"datatype\":\"FP32\",\"shape\":[1,2],\"data\":[0,0]},"
        "{\"name\":\"key\",\"datatype\":\"FP32\",\"shape\":[2,2],\"data\":[1,0,0,1]},"
        "{\"name\":\"value\",\"datatype\":\"FP32\",\"shape\":[2,2],\"data\":[1.00390625,3,1,5]}],"
        "\"parameters\":{\"output_dtype\":\"bfloat16\"}%s}";
    char req[1024], got[64];
    resp r;
    snprintf(req, sizeof req, body, "");
    request("POST", "/v2/models/sdpa/infer", json_h, req, strlen(req), &r);
    CHECKF(r.status == 200, "%ld %.300s", r.status, r.body);
    size_t hlen =
        (size_t)strtoull(header(&r, "Inference-Header-Content-Length", got, sizeof got), NULL, 10);
    CHECKF(hlen > 0 && hlen + 6 == r.len, "JSON part %zu of %zu bytes", hlen, r.len);
    if (hlen > 0 && hlen + 6 == r.len) {
        /* output: bf16 1.0 and 4.0; lse: log 2 = 0.693 rounds to bf16 0x3F31 */
        const unsigned char want[6] = {0x80, 0x3F, 0x80, 0x40, 0x31, 0x3F};
        CHECK(memcmp(r.body + hlen, want, 6) == 0);
        json_t *j = json_of(r.body, hlen);
        const char *names[2] = {"output", "lse"};
        for (int o = 0; o < 2; o++) {
            json_t *out = j ? json_array_get(json_object_get(j, "outputs"), (size_t)o) : NULL;
            CHECK(out && strcmp(json_string_value(json_object_get(out, "name")), names[o]) == 0);
            CHECK(out && strcmp(json_string_value(json_object_get(out, "datatype")), "BF16") == 0);
            CHECK(out && json_integer_value(json_object_get(json_object_get(out, "parameters"),
                                                            "binary_data_size")) == 4 - 2 * o);
        }
        json_decref(j);
    }
    resp_free(&r);
    snprintf(req, sizeof req, body,
             ",\"outputs\":[{\"name\":\"output\",\"parameters\":{\"binary_data\":false}}]");
    request("POST", "/v2/models/sdpa/infer", json_h, req, strlen(req), &r);
    check_v2_error(&r, 400, "binary data only");
    resp_free(&r);
}

/* The spec's JSON request and response, then the same through the binary extension: equal
 * numbers, Inference-Header-Content-Length and application/octet-stream on the reply. */
static void test_infer_json_and_binary(void)
{
    static const char *const json_h[] = {"Content-Type: application/json", NULL};
    problem p;
    problem_new(&p, 1, 2, 5, 7, 8);
    size_t n = 2 * 5 * 8, len, hlen;
    double *ref = reference(&p, false);
    float *outs[2] = {NULL, NULL};
    for (int binary = 0; binary < 2; binary++) {
        char *body = infer_body(&p, "FP32", binary, binary, "abc", &len, &hlen);
        char hl[64], got[64], ct[128];
        snprintf(hl, sizeof hl, "Inference-Header-Content-Length: %zu", hlen);
        const char *bin_h[] = {"Content-Type: application/octet-stream", hl, NULL};
        resp r;
        request("POST", binary ? "/v2/models/sdpa/versions/1/infer" : "/v2/models/sdpa/infer",
                binary ? bin_h : json_h, body, len, &r);
        CHECKF(r.status == 200, "%ld %.300s", r.status, r.body);
        size_t reply_hlen = 0;
        if (binary) {
            reply_hlen = (size_t)strtoull(
                header(&r, "Inference-Header-Content-Length", got, sizeof got), NULL, 10);
            CHECK(reply_hlen > 0 && reply_hlen < r.len);
            CHECK(strcmp(header(&r, "Content-Type", ct, sizeof ct), "application/octet-stream") ==
                  0);
        } else {
            CHECK(header(&r, "Inference-Header-Content-Length", got, sizeof got)[0] == '\0');
        }
        json_t *j = json_of(r.body, binary ? reply_hlen : r.len);
        if (j) {
            CHECK(strcmp(json_string_value(json_object_get(j, "id")), "abc") == 0);
            CHECK(strcmp(json_string_value(json_object_get(j, "model_name")), "sdpa") == 0);
            json_decref(j);
        }
        bool is_bin = false;
        outs[binary] = output_of(&r, reply_hlen, n, &is_bin);
        CHECK(is_bin == (binary != 0));
        if (outs[binary] && ref)
            check_close(outs[binary], ref, n, 2e-6);
        resp_free(&r);
        free(body);
    }
    if (outs[0] && outs[1])
        CHECK(memcmp(outs[0], outs[1], n * 4) == 0);
    free(outs[0]);
    free(outs[1]);
    free(ref);
    problem_free(&p);
}

/* FP16 binary inputs, FP32 outputs (JSON), against the reference on the rounded inputs. */
static void test_infer_fp16(void)
{
    problem p;
    problem_new(&p, 2, 2, 4, 6, 4);
    size_t n = 2 * 2 * 4 * 4, len, hlen;
    char *body = infer_body(&p, "FP16", true, false, NULL, &len, &hlen);
    char hl[64];
    snprintf(hl, sizeof hl, "Inference-Header-Content-Length: %zu", hlen);
    const char *h[] = {"Content-Type: application/octet-stream", hl, NULL};
    resp r;
    request("POST", "/v2/models/sdpa/infer", h, body, len, &r);
    CHECKF(r.status == 200, "%ld %.300s", r.status, r.body);
    double *ref = reference(&p, true);
    bool binary = true;
    float *out = output_of(&r, 0, n, &binary);
    CHECK(!binary);
    if (out && ref)
        check_close(out, ref, n, 2e-6);
    free(out);
    free(ref);
    resp_free(&r);
    free(body);
    problem_free(&p);
}

/* The demo layer as a model: its metadata in full, then POST /v2/models/demo/infer with JSON
 * FP32 and with binary FP16 in / FP32 out, each against the reference of the same layer built
 * here (the demo's weights come from a fixed seed). */
static void test_layer_model(void)
{
    static const char *const json_h[] = {"Content-Type: application/json", NULL};
    resp r;
    CHECK_EQ_INT(request("GET", "/v2/models/demo/versions/1", NULL, NULL, 0, &r), 200);
    json_t *j = json_of(r.body, r.len);
    if (j) {
        static const struct {
            const char *name, *datatype;
            int rank;
            int64_t last;
        } want_in[4] = {{"input", "FP32", 3, 64},
                        {"memory", "FP32", 3, 64},
                        {"attn_mask", "BOOL", 4, -1},
                        {"key_padding_mask", "BOOL", 2, -1}},
          want_out[1] = {{"output", "FP32", 3, 64}}; /* weights: by return_weights */
        json_t *in = json_object_get(j, "inputs"), *out = json_object_get(j, "outputs");
        CHECK(strcmp(json_string_value(json_object_get(j, "name")), "demo") == 0);
        CHECK_EQ_INT(json_array_size(in), 4);
        CHECK_EQ_INT(json_array_size(out), 1);
        for (size_t i = 0; i < 5; i++) {
            json_t *t = i < 4 ? json_array_get(in, i) : json_array_get(out, i - 4);
            const char *name = i < 4 ? want_in[i].name : want_out[i - 4].name;
            const char *dt = i < 4 ? want_in[i].datatype : want_out[i - 4].datatype;
            int rank = i < 4 ? want_in[i].rank : want_out[i - 4].rank;
            int64_t last = i < 4 ? want_in[i].last : want_out[i - 4].last;
            json_t *sh = json_object_get(t, "shape");
            CHECKF(t && strcmp(json_string_value(json_object_get(t, "name")), name) == 0 &&
                       strcmp(json_string_value(json_object_get(t, "datatype")), dt) == 0 &&
                       (int)json_array_size(sh) == rank,
                   "metadata tensor %zu (%s)", i, name);
            CHECK(json_integer_value(json_array_get(sh, 0)) == -1);
            CHECK(json_integer_value(json_array_get(sh, (size_t)rank - 1)) == last);
        }
        json_decref(j);
    }
    resp_free(&r);

    const int64_t B = 2, L = 5, E = 64;
    size_t n = (size_t)(B * L * E);
    float *x = malloc(n * sizeof *x), *xh = malloc(n * sizeof *xh);
    for (size_t i = 0; i < n; i++) {
        x[i] = frand();
        xh[i] = from_half(to_half(x[i]));
    }
    eng_layer *demo = eng_layer_demo();
    ref_mha_weights w = ref_mha_weights_of_layer(demo);
    for (int binary = 0; binary < 2; binary++) {
        sbuf b = {0};
        char tmp[64], hl[80], got[64];
        sb_str(&b, "{\"id\":\"L\",\"parameters\":{\"causal\":true");
        sb_str(&b, binary ? ",\"binary_data_output\":true}" : "}");
        sb_str(&b, ",\"inputs\":[{\"name\":\"input\",\"shape\":[2,5,64],\"datatype\":");
        if (binary) {
            snprintf(tmp, sizeof tmp, "\"FP16\",\"parameters\":{\"binary_data_size\":%zu}}]}",
                     n * 2);
            sb_str(&b, tmp);
        } else {
            sb_str(&b, "\"FP32\",\"data\":[");
            for (size_t i = 0; i < n; i++) {
                snprintf(tmp, sizeof tmp, "%s%.9g", i ? "," : "", (double)x[i]);
                sb_str(&b, tmp);
            }
            sb_str(&b, "]}]}");
        }
        size_t hlen = b.len;
        for (size_t i = 0; binary && i < n; i++) {
            uint16_t h = to_half(x[i]);
            sb_mem(&b, &h, 2);
        }
        snprintf(hl, sizeof hl, "Inference-Header-Content-Length: %zu", hlen);
        const char *bin_h[] = {"Content-Type: application/octet-stream", hl, NULL};
        request("POST", "/v2/models/demo/infer", binary ? bin_h : json_h, b.data, b.len, &r);
        free(b.data);
        CHECKF(r.status == 200, "%ld %.300s", r.status, r.body);
        size_t reply_hlen = 0;
        if (binary)
            reply_hlen = (size_t)strtoull(
                header(&r, "Inference-Header-Content-Length", got, sizeof got), NULL, 10);
        j = json_of(r.body, binary ? reply_hlen : r.len);
        if (j) {
            CHECK(strcmp(json_string_value(json_object_get(j, "model_name")), "demo") == 0);
            CHECK(strcmp(json_string_value(json_object_get(j, "id")), "L") == 0);
            json_decref(j);
        }
        bool is_bin = false;
        float *out = r.status == 200 ? output_of(&r, reply_hlen, n, &is_bin) : NULL;
        CHECK(is_bin == (binary != 0));
        eng_mha_args a = {.B = B, .L = L, .x = binary ? xh : x, .S = L, .causal = true};
        ref_mha_result ref;
        memset(&ref, 0, sizeof ref);
        CHECK(demo && ref_mha(&w, &a, &ref));
        if (out && ref.out) {
            double scale = 0;
            for (size_t i = 0; i < n; i++)
                scale = fmax(scale, fabs(ref.out[i]));
            check_close(out, ref.out, n, 1e-4 * scale);
        }
        ref_mha_result_free(&ref);
        free(out);
        resp_free(&r);
    }
    eng_layer_free(demo);
    free(x);
    free(xh);

    /* The protocol's error form for a layer request. */
    const char *bad = "{\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":"
                      "[1,2],\"data\":[1,2]}]}";
    request("POST", "/v2/models/demo/infer", json_h, bad, strlen(bad), &r);
    check_v2_error(&r, 400, "embed_dim");
    resp_free(&r);
}

static char *gunzip(const char *src, size_t n, int wbits, size_t *out_len)
{
    z_stream zs;
    size_t cap = 1 << 20;
    char *out = malloc(cap);
    memset(&zs, 0, sizeof zs);
    inflateInit2(&zs, wbits);
    zs.next_in = (Bytef *)(uintptr_t)src;
    zs.avail_in = (uInt)n;
    zs.next_out = (Bytef *)out;
    zs.avail_out = (uInt)cap;
    int rc = inflate(&zs, Z_FINISH);
    *out_len = zs.total_out;
    inflateEnd(&zs);
    if (rc != Z_STREAM_END) {
        free(out);
        return NULL;
    }
    return out;
}

/* A gzip request with binary tensors and a gzip reply: the header lengths count the JSON
 * uncompressed, on both sides; deflate likewise; and the native route takes gzip too. */
static void test_compression(void)
{
    problem p;
    problem_new(&p, 1, 1, 16, 16, 16);
    size_t n = 16 * 16, len, hlen;
    double *ref = reference(&p, false);
    const struct {
        const char *name;
        int wbits;
    } codings[] = {{"gzip", 31}, {"deflate", 15}};
    for (int c = 0; c < 2; c++) {
        char *body = infer_body(&p, "FP32", true, true, NULL, &len, &hlen);
        size_t packed_len;
        char *packed = zlib_pack(body, len, codings[c].wbits, &packed_len);
        char hl[64], ce[64], ae[64], got[64];
        snprintf(hl, sizeof hl, "Inference-Header-Content-Length: %zu", hlen);
        snprintf(ce, sizeof ce, "Content-Encoding: %s", codings[c].name);
        snprintf(ae, sizeof ae, "Accept-Encoding: %s", codings[c].name);
        const char *h[] = {"Content-Type: application/octet-stream", hl, ce, ae, NULL};
        resp r;
        request("POST", "/v2/models/sdpa/infer", h, packed, packed_len, &r);
        CHECKF(r.status == 200, "%s: %ld %.200s", codings[c].name, r.status, r.body);
        CHECK(strcmp(header(&r, "Content-Encoding", got, sizeof got), codings[c].name) == 0);
        CHECK(strstr(header(&r, "Vary", got, sizeof got), "Accept-Encoding") != NULL);
        size_t reply_hlen = (size_t)strtoull(
            header(&r, "Inference-Header-Content-Length", got, sizeof got), NULL, 10);
        size_t plain_len = 0;
        char *plain = gunzip(r.body, r.len, codings[c].wbits, &plain_len);
        CHECK(plain != NULL);
        if (plain) {
            resp u = {.status = 200, .body = plain, .len = plain_len};
            bool binary = false;
            float *out = output_of(&u, reply_hlen, n, &binary);
            CHECK(binary);
            if (out && ref)
                check_close(out, ref, n, 2e-6);
            free(out);
        }
        free(plain);
        resp_free(&r);
        free(packed);
        free(body);
    }

    /* The native route: a gzip body, an uncompressed reply (no Accept-Encoding). */
    const char *native = "{\"query\": [[1, 0]], \"key\": [[1, 0], [0, 1]], "
                         "\"value\": [[1, 2], [3, 4]]}";
    size_t packed_len;
    char *packed = zlib_pack(native, strlen(native), 31, &packed_len);
    const char *h[] = {"Content-Type: application/json", "Content-Encoding: gzip", NULL};
    resp r;
    char got[64];
    CHECK_EQ_INT(request("POST", "/v1/attention", h, packed, packed_len, &r), 200);
    CHECK(header(&r, "Content-Encoding", got, sizeof got)[0] == '\0');
    CHECK(strstr(r.body, "\"output\"") != NULL);
    resp_free(&r);
    free(packed);

    /* Unknown codings: 415 before the body is read; a bomb: 413 (--max-body-bytes 4MiB). */
    const char *br[] = {"Content-Type: application/json", "Content-Encoding: br", NULL};
    request("POST", "/v2/models/sdpa/infer", br, "{}", 2, &r);
    check_v2_error(&r, 415, "Content-Encoding");
    resp_free(&r);
    size_t zn = (size_t)16 << 20;
    char *zeros = calloc(zn, 1);
    packed = zlib_pack(zeros, zn, 31, &packed_len);
    free(zeros);
    const char *gz[] = {"Content-Type: application/json", "Content-Encoding: gzip", NULL};
    request("POST", "/v2/models/sdpa/infer", gz, packed, packed_len, &r);
    check_v2_error(&r, 413, "--max-body-bytes");
    resp_free(&r);
    request("POST", "/v2/models/sdpa/infer", gz, "not gzip", 8, &r);
    check_v2_error(&r, 400, "gzip");
    resp_free(&r);

    /* A client that accepts gzip (as aiohttp always does) reads error replies as plain JSON:
     * only successful replies are compressed, as Triton does. */
    const char *accepts[] = {"Content-Type: application/json", "Accept-Encoding: gzip, deflate",
                             NULL};
    /* Errors whose messages compress (a repetitive name, a long shape message). */
    const char *bad[][2] = {
        {"/v2/models/sdpa/infer",
         "{\"inputs\": [{\"name\": \"queryqueryqueryqueryqueryqueryqueryquery\", "
         "\"datatype\": \"FP32\", \"shape\": [1, 2], \"data\": [1, 0]}]}"},
        {"/v1/attention", "{\"query\": [[1, 0]], \"key\": [[1, 0, 0]], \"value\": [[1, 2]]}"}};
    for (int i = 0; i < 2; i++) {
        request("POST", bad[i][0], accepts, bad[i][1], strlen(bad[i][1]), &r);
        CHECKF(r.status >= 400 && r.status < 500, "%s: %ld", bad[i][0], r.status);
        CHECKF(header(&r, "Content-Encoding", got, sizeof got)[0] == '\0',
               "%s: a %ld reply sent as %s", bad[i][0], r.status, got);
        CHECKF(r.body && strstr(r.body, "\"error\"") != NULL, "%s: %.200s", bad[i][0], r.body);
        resp_free(&r);
    }
    free(packed);
    free(ref);
    problem_free(&p);
}

/* Every reply has an id (KServe's InferenceResponse requires one): a request without one gets
 * its X-Request-Id, the client's or the one the server made up and sent back in the header. */
/* One query, key and value row of 2: the smallest inference of model sdpa. */
static const char tiny_body[] =
    "{\"inputs\":["
    "{\"name\":\"query\",\"datatype\":\"FP32\",\"shape\":[1,2],\"data\":[1,0]},"
    "{\"name\":\"key\",\"datatype\":\"FP32\",\"shape\":[1,2],\"data\":[1,0]},"
    "{\"name\":\"value\",\"datatype\":\"FP32\",\"shape\":[1,2],\"data\":[3,4]}]}";

static void test_reply_id_without_request_id(void)
{
    const char *body = tiny_body;
    const char *given[] = {"Content-Type: application/json", "X-Request-Id: trace-0042", NULL};
    const char *none[] = {"Content-Type: application/json", NULL};
    for (int i = 0; i < 2; i++) {
        resp r;
        char header_id[128];
        CHECK_EQ_INT(
            request("POST", "/v2/models/sdpa/infer", i == 0 ? given : none, body, strlen(body), &r),
            200);
        header(&r, "X-Request-Id", header_id, sizeof header_id);
        CHECK(header_id[0] != '\0');
        if (i == 0)
            CHECK(strcmp(header_id, "trace-0042") == 0);
        json_t *j = json_of(r.body, r.len);
        json_t *id = j ? json_object_get(j, "id") : NULL;
        CHECKF(json_is_string(id) && strcmp(json_string_value(id), header_id) == 0,
               "id %s, X-Request-Id %s", json_is_string(id) ? json_string_value(id) : "(none)",
               header_id);
        json_decref(j);
        resp_free(&r);
    }
}

/* Model sdpa's successful inferences from its statistics: their count and summed duration (ns). */
static void sdpa_success(int64_t *count, int64_t *ns)
{
    resp r;
    *count = *ns = -1;
    if (request("GET", "/v2/models/sdpa/stats", NULL, NULL, 0, &r) == 200) {
        json_t *j = json_of(r.body, r.len);
        json_t *st = json_array_get(json_object_get(j, "model_stats"), 0);
        json_t *ok = json_object_get(json_object_get(st, "inference_stats"), "success");
        *count = json_integer_value(json_object_get(ok, "count"));
        *ns = json_integer_value(json_object_get(ok, "ns"));
        json_decref(j);
    }
    resp_free(&r);
}

/* A request's duration in the statistics is its handler's, as in Triton's (the request's
 * start to its end, after the body is read and before the reply is sent): the PAUSE_MS that
 * half its body waited is not in it, and is in attnd's own receive stage. */
static void test_request_duration_leaves_out_the_wire(void)
{
    enum { PAUSE_MS = 400 };
    static const char receive_sum[] = "attnd_request_stage_seconds_sum{stage=\"receive\"}";
    const size_t len = strlen(tiny_body), half = len / 2;
    int64_t count0, ns0, count, ns;
    sdpa_success(&count0, &ns0);
    double receive0 = metric_value(d.port, receive_sum);
    char head[256];
    int n = snprintf(head, sizeof head,
                     "POST /v2/models/sdpa/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n\r\n",
                     len);
    int fd = raw_connect(d.port);
    CHECK(fd >= 0 && raw_send(fd, head, (size_t)n) == 0 && raw_send(fd, tiny_body, half) == 0);
    sleep_ms(PAUSE_MS);
    CHECK(fd >= 0 && raw_send(fd, tiny_body + half, len - half) == 0);
    char *reply = fd >= 0 ? raw_read_response(fd, 10000) : NULL;
    CHECKF(raw_status(reply) == 200, "%.300s", reply ? reply : "(no reply)");
    free(reply);
    if (fd >= 0)
        close(fd);
    /* Counted once the reply is written, which may be after the client has read it. */
    CHECK(metric_wait(d.port, "nv_inference_request_success{model=\"sdpa\",version=\"1\"}",
                      (double)(count0 + 1), 5000));
    sdpa_success(&count, &ns);
    CHECKF(count == count0 + 1, "%lld successes after %lld", (long long)count, (long long)count0);
    CHECKF(ns - ns0 < PAUSE_MS * 1000000LL, "duration %lld ns", (long long)(ns - ns0));
    double receive = metric_value(d.port, receive_sum) - receive0;
    CHECKF(receive >= PAUSE_MS / 1e3, "receive stage %g s", receive);
}

/* Errors over HTTP, each in the protocol's form. */
static void test_errors(void)
{
    const char *json = "{\"inputs\":["
                       "{\"name\":\"query\",\"datatype\":\"FP32\",\"shape\":[1,2],\"data\":[1,0]},"
                       "{\"name\":\"key\",\"datatype\":\"FP32\",\"shape\":[1,2],\"data\":[1,0]},"
                       "{\"name\":\"value\",\"datatype\":\"FP32\",\"shape\":[1,2],"
                       "\"parameters\":{\"binary_data_size\":8}}]}";
    size_t jl = strlen(json);
    char body[1024], hl[64];
    float v[2] = {3, 4};
    memcpy(body, json, jl);
    memcpy(body + jl, v, 8);
    resp r;

    snprintf(hl, sizeof hl, "Inference-Header-Content-Length: %zu", jl + 100);
    const char *beyond[] = {hl, NULL};
    request("POST", "/v2/models/sdpa/infer", beyond, body, jl + 8, &r);
    check_v2_error(&r, 400, "Inference-Header-Content-Length");
    resp_free(&r);

    snprintf(hl, sizeof hl, "Inference-Header-Content-Length: %zu", jl);
    const char *ok[] = {hl, NULL};
    request("POST", "/v2/models/sdpa/infer", ok, body, jl + 4, &r);
    check_v2_error(&r, 400, "truncated");
    resp_free(&r);
    request("POST", "/v2/models/sdpa/infer", ok, body, jl + 8, &r);
    CHECKF(r.status == 200, "%ld %.300s", r.status, r.body);
    resp_free(&r);

    const char *bad_json = "{\"inputs\": [";
    request("POST", "/v2/models/sdpa/infer", NULL, bad_json, strlen(bad_json), &r);
    check_v2_error(&r, 400, NULL);
    resp_free(&r);
    const char *typo = "{\"parameters\":{\"casual\":true},\"inputs\":[]}";
    request("POST", "/v2/models/sdpa/infer", NULL, typo, strlen(typo), &r);
    check_v2_error(&r, 400, "causal");
    resp_free(&r);
    request("POST", "/v2/models/nosuch/infer", NULL, typo, strlen(typo), &r);
    check_v2_error(&r, 404, "nosuch");
    resp_free(&r);
    const char *text[] = {"Content-Type: text/plain", NULL};
    request("POST", "/v2/models/sdpa/infer", text, typo, strlen(typo), &r);
    check_v2_error(&r, 415, "Content-Type");
    resp_free(&r);
}

/* The statistics extension and Triton's metric families count what the tests above sent. */
static void test_stats_and_metrics(void)
{
    static const char *const families[] = {
        "nv_inference_request_success{model=\"sdpa\",version=\"1\"}",
        "nv_inference_count{model=\"sdpa\",version=\"1\"}",
        "nv_inference_exec_count{model=\"sdpa\",version=\"1\"}",
        "nv_inference_request_duration_us{model=\"sdpa\",version=\"1\"}",
        "nv_inference_queue_duration_us{model=\"sdpa\",version=\"1\"}",
        "nv_inference_compute_input_duration_us{model=\"sdpa\",version=\"1\"}",
        "nv_inference_compute_infer_duration_us{model=\"sdpa\",version=\"1\"}",
        "nv_inference_compute_output_duration_us{model=\"sdpa\",version=\"1\"}",
    };
    /* At least the 2 + 1 + 2 + 1 successful inferences above; their compute took time. */
    CHECK(metric_wait(d.port, families[0], 6, 5000));
    for (size_t i = 1; i < sizeof families / sizeof families[0]; i++) {
        double v = metric_value(d.port, families[i]);
        CHECKF(v >= (i == 4 ? 0 : 1), "%s = %g", families[i], v);
    }
    /* The batch of the FP16 request counted 2 inferences in one execution. */
    CHECK(metric_value(d.port, families[1]) > metric_value(d.port, families[2]));
    CHECK(metric_value(d.port, "nv_inference_request_failure{model=\"sdpa\",reason=\"OTHER\","
                               "version=\"1\"}") >= 3);
    CHECK(metric_value(d.port,
                       "nv_inference_pending_request_count{model=\"sdpa\",version=\"1\"}") == 0);
    /* The layer model's own series: its 2 successful requests of batch 2 (test_layer_model). */
    CHECK(
        metric_wait(d.port, "nv_inference_request_success{model=\"demo\",version=\"1\"}", 2, 5000));
    CHECK(metric_value(d.port, "nv_inference_request_success{model=\"demo\",version=\"1\"}") == 2);
    CHECK(metric_value(d.port, "nv_inference_count{model=\"demo\",version=\"1\"}") == 4);

    resp r;
    CHECK_EQ_INT(request("GET", "/v2/models/sdpa/stats", NULL, NULL, 0, &r), 200);
    json_t *j = json_of(r.body, r.len);
    if (j) {
        json_t *st = json_array_get(json_object_get(j, "model_stats"), 0);
        json_t *is = json_object_get(st, "inference_stats");
        CHECK(strcmp(json_string_value(json_object_get(st, "name")), "sdpa") == 0);
        CHECK(strcmp(json_string_value(json_object_get(st, "version")), "1") == 0);
        CHECK(json_integer_value(json_object_get(json_object_get(is, "success"), "count")) >= 6);
        CHECK(json_integer_value(json_object_get(json_object_get(is, "compute_infer"), "ns")) > 0);
        CHECK(json_integer_value(json_object_get(json_object_get(is, "fail"), "count")) >= 3);
        CHECK(json_integer_value(json_object_get(st, "last_inference")) > 1600000000000LL);
        CHECK(json_integer_value(json_object_get(st, "inference_count")) >=
              json_integer_value(json_object_get(st, "execution_count")));
        json_decref(j);
    }
    resp_free(&r);
    CHECK_EQ_INT(request("GET", "/v2/models/stats", NULL, NULL, 0, &r), 200);
    CHECK(strstr(r.body, "\"sdpa\"") && strstr(r.body, "\"demo\""));
    resp_free(&r);
    request("GET", "/v2/models/nosuch/stats", NULL, NULL, 0, &r);
    check_v2_error(&r, 404, "nosuch");
    resp_free(&r);
}

int main(void)
{
    const char *const args[] = {"--threads", "2", "--max-body-bytes", "4MiB", NULL};
    curl_global_init(CURL_GLOBAL_DEFAULT);
    if (daemon_start(&d, args) != 0) {
        printf("FAIL cannot start attnd\n0 passed, 1 failed\n");
        return 1;
    }
    RUN(test_metadata);
    RUN(test_infer_json_and_binary);
    RUN(test_bf16_outputs_are_binary);
    RUN(test_infer_fp16);
    RUN(test_layer_model);
    RUN(test_compression);
    RUN(test_errors);
    RUN(test_reply_id_without_request_id);
    RUN(test_request_duration_leaves_out_the_wire);
    RUN(test_stats_and_metrics);
    CHECK_EQ_INT(daemon_stop(&d), 0);
    curl_global_cleanup();
    return check_report();
}
