/* test_tensor.c - api/wire/tensor.c and body.c: every wire form of a tensor decodes to the
 * same floats, every malformed one is refused with 422 (413 for a limit) naming the exact
 * element, and every form encodes back to what decodes to the same bits. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/wire/base64.h"
#include "api/wire/tensor.h"
#include "tests/support/check.h"
#include "tests/support/rng.h"

#define MAX_ELEMENTS ((size_t)1 << 20)

/* Parses {"t": <tensor>} and probes t; returns the probe's result. The body text must stay
 * alive while `b` is used, hence the static buffer. */
static char text[1 << 20];

/* The HTTP code a native reply of `err` has: the tables below list what clients see. */
static int native_http(const api__error *err)
{
    return api_status_http(API_ERRORS_NATIVE, err->status);
}

static int probe(const char *tensor, api__body *b, api__tensor *t, api__error *err)
{
    snprintf(text, sizeof text, "{\"t\": %s}", tensor);
    memset(err, 0, sizeof *err);
    if (api__body_parse(b, text, strlen(text), NULL, err) != 0)
        return -1;
    return api__tensor_probe(b, json_object_get(b->root, "t"), "t", MAX_ELEMENTS, t, err);
}

/* Probes and decodes `tensor` into out (room for 64 elements of any type). */
static int decode(const char *tensor, api__elem elem, unsigned flags, void *out, api__tensor *t,
                  api__error *err)
{
    api__body b;
    int rc = probe(tensor, &b, t, err);
    if (rc == 0)
        rc = api__tensor_decode(&b, t, elem, flags, out, "t", NULL, err);
    api__body_free(&b);
    return rc;
}

static void test_nested_arrays_decode_in_row_major_order(void)
{
    float out[64];
    api__tensor t;
    api__error err;
    CHECK_EQ_INT(
        decode("[[[1, 2], [3, 4.5]], [[-5, 6e-3], [7, 8]]]", API_ELEM_FLOAT, 0, out, &t, &err), 0);
    CHECK_EQ_INT(t.form, API_FORM_NESTED);
    CHECK_EQ_INT(t.dtype, API_DTYPE_FLOAT32);
    CHECK_EQ_INT(t.rank, 3);
    CHECK(t.shape[0] == 2 && t.shape[1] == 2 && t.shape[2] == 2);
    CHECK_EQ_INT(t.count, 8);
    const float want[8] = {1, 2, 3, 4.5f, -5, 6e-3f, 7, 8};
    CHECK(memcmp(out, want, sizeof want) == 0);
}

static void test_numbers_narrow_to_the_nearest_float(void)
{
    float out[64];
    api__tensor t;
    api__error err;
    CHECK_EQ_INT(decode("[0.1, 3.4028235e38, -3.4028235e38, 1e-50, 16777217, 1.40129846e-45]",
                        API_ELEM_FLOAT, 0, out, &t, &err),
                 0);
    CHECK(out[0] == 0.1f);
    CHECK(out[1] == FLT_MAX); /* above FLT_MAX, but below the midpoint to 2^128 */
    CHECK(out[2] == -FLT_MAX);
    CHECK(out[3] == 0.0f); /* underflow is rounding, not an error */
    CHECK(out[4] == 16777216.0f);
    CHECK(out[5] == FLT_TRUE_MIN);
}

static void test_flat_form_takes_shape_and_data(void)
{
    float out[64];
    uint8_t mask[64];
    api__tensor t;
    api__error err;
    CHECK_EQ_INT(decode("{\"shape\": [2, 3], \"data\": [1, 2, 3, 4, 5, 6]}", API_ELEM_FLOAT, 0, out,
                        &t, &err),
                 0);
    CHECK_EQ_INT(t.form, API_FORM_FLAT);
    CHECK(t.rank == 2 && t.shape[0] == 2 && t.shape[1] == 3);
    CHECK(out[0] == 1 && out[5] == 6);
    CHECK_EQ_INT(decode("{\"shape\": [3], \"dtype\": \"bool\", \"data\": [true, false, true]}",
                        API_ELEM_BOOL, 0, mask, &t, &err),
                 0);
    CHECK(mask[0] == 1 && mask[1] == 0 && mask[2] == 1);
    CHECK_EQ_INT(decode("{\"dtype\": \"float32\", \"data\": [7], \"shape\": [1, 1]}",
                        API_ELEM_FLOAT, 0, out, &t, &err),
                 0);
    CHECK(out[0] == 7);
}

static void test_base64_decodes_every_dtype(void)
{
    float out[64];
    uint8_t mask[64];
    api__tensor t;
    api__error err;
    /* float32 1.0, -2.0 little-endian: 00 00 80 3f 00 00 00 c0 */
    CHECK_EQ_INT(decode("{\"shape\": [2], \"dtype\": \"float32\", \"base64\": \"AACAPwAAAMA=\"}",
                        API_ELEM_FLOAT, 0, out, &t, &err),
                 0);
    CHECK_EQ_INT(t.form, API_FORM_BASE64);
    CHECK(out[0] == 1.0f && out[1] == -2.0f);
    /* float16 1.0 (0x3c00), -2.0 (0xc000), 65504 (0x7bff): 00 3c 00 c0 ff 7b */
    CHECK_EQ_INT(decode("{\"shape\": [3], \"dtype\": \"float16\", \"base64\": \"ADwAwP97\"}",
                        API_ELEM_FLOAT, 0, out, &t, &err),
                 0);
    CHECK(out[0] == 1.0f && out[1] == -2.0f && out[2] == 65504.0f);
    /* bfloat16 1.0 (0x3f80), -3.0 (0xc040): 80 3f 40 c0 */
    CHECK_EQ_INT(decode("{\"shape\": [2], \"dtype\": \"bfloat16\", \"base64\": \"gD9AwA==\"}",
                        API_ELEM_FLOAT, 0, out, &t, &err),
                 0);
    CHECK(out[0] == 1.0f && out[1] == -3.0f);
    /* bool 1 0 1: 01 00 01 */
    CHECK_EQ_INT(decode("{\"shape\": [3], \"dtype\": \"bool\", \"base64\": \"AQAB\"}",
                        API_ELEM_BOOL, 0, mask, &t, &err),
                 0);
    CHECK(mask[0] == 1 && mask[1] == 0 && mask[2] == 1);
}

/* Float32 bytes (the binary path) are checked a block at a time: a non-finite value anywhere,
 * first or last in a block or in the tail, is found at its index, copying or in place; -inf
 * passes only where allowed, and every other value arrives unchanged. */
static void test_float32_bytes_find_a_non_finite_value_at_any_index(void)
{
    enum { N = 300 };
    static const size_t at[] = {0, 1, 63, 64, 127, 128, 255, 256, 299};
    float src[N], out[N];
    uint64_t rng = 5;
    for (size_t k = 0; k < sizeof at / sizeof at[0]; k++) {
        for (int bad = 0; bad < 3; bad++) {
            for (size_t i = 0; i < N; i++)
                src[i] = (float)rng_sym(&rng, 100.0);
            src[at[k]] = bad == 0 ? NAN : bad == 1 ? INFINITY : -INFINITY;
            api__raw_elems raw = {.data = src, .dtype = API_DTYPE_FLOAT32, .count = N, .first = 7};
            api__error err = {0};
            char want[32];
            snprintf(want, sizeof want, "x element %zu ", 7 + at[k]);
            for (int in_place = 0; in_place < 2; in_place++) {
                void *dst = in_place ? (void *)src : out;
                CHECKF(api__tensor_convert(&raw, API_ELEM_FLOAT, 0, dst, "x", &err) == -1 &&
                           strstr(err.message, want) != NULL,
                       "value %d at %zu (in place %d): %s", bad, at[k], in_place, err.message);
                memset(&err, 0, sizeof err);
                bool allowed = bad == 2;
                int rc =
                    api__tensor_convert(&raw, API_ELEM_FLOAT, API_DECODE_NEG_INF, dst, "x", &err);
                CHECKF(rc == (allowed ? 0 : -1), "value %d at %zu with -inf allowed: %d", bad,
                       at[k], rc);
                memset(&err, 0, sizeof err);
                if (allowed && !in_place)
                    CHECK(memcmp(out, src, sizeof src) == 0);
            }
        }
    }
}

static void test_integers_decode_exactly(void)
{
    int64_t out[64];
    api__tensor t;
    api__error err;
    CHECK_EQ_INT(decode("[0, 5, 9007199254740993]", API_ELEM_INT64, 0, out, &t, &err), 0);
    CHECK(out[0] == 0 && out[1] == 5 && out[2] == 9007199254740993LL);
}

static void test_negative_infinity_only_where_allowed(void)
{
    float out[64];
    api__tensor t;
    api__error err;
    CHECK_EQ_INT(
        decode("[[0, null], [-1e9, 2]]", API_ELEM_FLOAT, API_DECODE_NEG_INF, out, &t, &err), 0);
    CHECK(out[1] == -INFINITY && out[2] == -1e9f);
    /* -inf as float32 bytes: 00 00 80 ff */
    CHECK_EQ_INT(decode("{\"shape\": [1], \"dtype\": \"float32\", \"base64\": \"AACA/w==\"}",
                        API_ELEM_FLOAT, API_DECODE_NEG_INF, out, &t, &err),
                 0);
    CHECK(out[0] == -INFINITY);
    CHECK_EQ_INT(decode("{\"shape\": [1], \"dtype\": \"float32\", \"base64\": \"AACA/w==\"}",
                        API_ELEM_FLOAT, 0, out, &t, &err),
                 -1);
    CHECK_EQ_INT(decode("[null]", API_ELEM_FLOAT, 0, out, &t, &err), -1);
    /* +inf stays an error even in a float mask. */
    CHECK_EQ_INT(decode("{\"shape\": [1], \"dtype\": \"float32\", \"base64\": \"AACAfw==\"}",
                        API_ELEM_FLOAT, API_DECODE_NEG_INF, out, &t, &err),
                 -1);
}

/* Every malformed tensor: the status and the field its error names. */
static const struct {
    const char *tensor;
    api__elem elem;
    int status;
    const char *field;
} bad_tensors[] = {
    /* Not a tensor at all. */
    {"5", API_ELEM_FLOAT, 422, "t"},
    {"\"abc\"", API_ELEM_FLOAT, 422, "t"},
    {"true", API_ELEM_FLOAT, 422, "t"},
    /* Nested arrays: empty, too deep, not rectangular, wrong leaves. */
    {"[]", API_ELEM_FLOAT, 422, "t"},
    {"[[]]", API_ELEM_FLOAT, 422, "t[0]"},
    {"[[1, 2], []]", API_ELEM_FLOAT, 422, "t[1]"},
    {"[[[[[[[[[1]]]]]]]]]", API_ELEM_FLOAT, 422, "t"},
    {"[[1, 2], [3]]", API_ELEM_FLOAT, 422, "t[1]"},
    {"[[1, 2], [3, 4, 5]]", API_ELEM_FLOAT, 422, "t[1]"},
    {"[[1, 2], 3]", API_ELEM_FLOAT, 422, "t[1]"},
    {"[[1, 2], [3, [4]]]", API_ELEM_FLOAT, 422, "t[1][1]"},
    {"[1, [2]]", API_ELEM_FLOAT, 422, "t[1]"},
    {"[[[1], [2]], [[3], [4], [5]]]", API_ELEM_FLOAT, 422, "t[1]"},
    {"[\"a\"]", API_ELEM_FLOAT, 422, "t[0]"},
    {"[[1, \"a\"]]", API_ELEM_FLOAT, 422, "t[0][1]"},
    {"[{\"a\": 1}]", API_ELEM_FLOAT, 422, "t[0]"},
    /* Numbers beyond float32, and null where -inf is not allowed. */
    {"[1, 3.5e38]", API_ELEM_FLOAT, 422, "t[1]"},
    {"[[1e39]]", API_ELEM_FLOAT, 422, "t[0][0]"},
    {"[-3.5e38]", API_ELEM_FLOAT, 422, "t[0]"},
    {"[1.7976931348623157e308]", API_ELEM_FLOAT, 422, "t[0]"},
    {"[1, null]", API_ELEM_FLOAT, 422, "t[1]"},
    /* Booleans and numbers where the other is expected. */
    {"[1, 0]", API_ELEM_BOOL, 422, "t"},
    {"[true, 1]", API_ELEM_BOOL, 422, "t[1]"},
    {"[true, null]", API_ELEM_BOOL, 422, "t[1]"},
    {"[true]", API_ELEM_FLOAT, 422, "t"},
    {"[1, true]", API_ELEM_FLOAT, 422, "t[1]"},
    {"[1.5]", API_ELEM_INT64, 422, "t[0]"},
    /* Shapes. */
    {"{\"data\": [1]}", API_ELEM_FLOAT, 422, "t.shape"},
    {"{\"shape\": 2, \"data\": [1, 2]}", API_ELEM_FLOAT, 422, "t.shape"},
    {"{\"shape\": [], \"data\": []}", API_ELEM_FLOAT, 422, "t.shape"},
    {"{\"shape\": [2.5], \"data\": [1, 2]}", API_ELEM_FLOAT, 422, "t.shape[0]"},
    {"{\"shape\": [2.0], \"data\": [1, 2]}", API_ELEM_FLOAT, 422, "t.shape[0]"},
    {"{\"shape\": [1, 0], \"data\": []}", API_ELEM_FLOAT, 422, "t.shape[1]"},
    {"{\"shape\": [-1], \"data\": []}", API_ELEM_FLOAT, 422, "t.shape[0]"},
    {"{\"shape\": [\"2\"], \"data\": [1, 2]}", API_ELEM_FLOAT, 422, "t.shape[0]"},
    {"{\"shape\": [null], \"data\": [1]}", API_ELEM_FLOAT, 422, "t.shape[0]"},
    {"{\"shape\": [1, 1, 1, 1, 1, 1, 1, 1, 1], \"data\": [1]}", API_ELEM_FLOAT, 422, "t.shape"},
    {"{\"shape\": [1000000000000], \"data\": [1]}", API_ELEM_FLOAT, 413, "t.shape"},
    {"{\"shape\": [4294967296, 4294967296, 4294967296], \"data\": [1]}", API_ELEM_FLOAT, 413,
     "t.shape"},
    {"{\"shape\": [9223372036854775807, 9223372036854775807], \"data\": []}", API_ELEM_FLOAT, 413,
     "t.shape"},
    {"{\"shape\": [-5, 9223372036854775807], \"data\": []}", API_ELEM_FLOAT, 422, "t.shape[0]"},
    /* The flat form's data. */
    {"{\"shape\": [2], \"data\": [1]}", API_ELEM_FLOAT, 422, "t.data"},
    {"{\"shape\": [2], \"data\": [1, 2, 3]}", API_ELEM_FLOAT, 422, "t.data"},
    {"{\"shape\": [2], \"data\": [[1], [2]]}", API_ELEM_FLOAT, 422, "t.data[0]"},
    {"{\"shape\": [2], \"data\": [1, [2]]}", API_ELEM_FLOAT, 422, "t.data[1]"},
    {"{\"shape\": [2], \"data\": [1, 4e38]}", API_ELEM_FLOAT, 422, "t.data[1]"},
    {"{\"shape\": [2], \"data\": \"ab\"}", API_ELEM_FLOAT, 422, "t.data"},
    {"{\"shape\": [1], \"data\": [1], \"extra\": 1}", API_ELEM_FLOAT, 422, "t.extra"},
    {"{\"shape\": [1], \"data\": [1], \"base64\": \"AACAPw==\"}", API_ELEM_FLOAT, 422, "t"},
    {"{\"shape\": [1]}", API_ELEM_FLOAT, 422, "t"},
    {"{\"shape\": [1], \"dtype\": \"float64\", \"data\": [1]}", API_ELEM_FLOAT, 422, "t.dtype"},
    {"{\"shape\": [1], \"dtype\": \"float16\", \"data\": [1]}", API_ELEM_FLOAT, 422, "t.dtype"},
    {"{\"shape\": [1], \"dtype\": \"bool\", \"data\": [1]}", API_ELEM_BOOL, 422, "t.dtype"},
    {"{\"shape\": [1], \"dtype\": \"float32\", \"data\": [true]}", API_ELEM_BOOL, 422, "t.dtype"},
    /* Base64. */
    {"{\"shape\": [1], \"base64\": \"AACAPw==\"}", API_ELEM_FLOAT, 422, "t.dtype"},
    {"{\"shape\": [1], \"dtype\": 7, \"base64\": \"AACAPw==\"}", API_ELEM_FLOAT, 422, "t.dtype"},
    {"{\"shape\": [1], \"dtype\": \"float32\", \"base64\": 5}", API_ELEM_FLOAT, 422, "t.base64"},
    {"{\"shape\": [2], \"dtype\": \"float32\", \"base64\": \"AACAPw==\"}", API_ELEM_FLOAT, 422,
     "t.base64"},
    {"{\"shape\": [1], \"dtype\": \"float32\", \"base64\": \"AACAPwA=\"}", API_ELEM_FLOAT, 422,
     "t.base64"},
    {"{\"shape\": [1], \"dtype\": \"float32\", \"base64\": \"AACA Pw==\"}", API_ELEM_FLOAT, 422,
     "t.base64"},
    {"{\"shape\": [1], \"dtype\": \"float32\", \"base64\": \"AACAPw\\n==\"}", API_ELEM_FLOAT, 422,
     "t.base64"},
    {"{\"shape\": [1], \"dtype\": \"float32\", \"base64\": \"AACAPx==\"}", API_ELEM_FLOAT, 422,
     "t.base64"},
    {"{\"shape\": [1], \"dtype\": \"float32\", \"base64\": \"AACAfw==\"}", API_ELEM_FLOAT, 422,
     "t.base64"},
    {"{\"shape\": [1], \"dtype\": \"float32\", \"base64\": \"AADAfw==\"}", API_ELEM_FLOAT, 422,
     "t.base64"},
    {"{\"shape\": [1], \"dtype\": \"float16\", \"base64\": \"AHw=\"}", API_ELEM_FLOAT, 422,
     "t.base64"},
    {"{\"shape\": [1], \"dtype\": \"bfloat16\", \"base64\": \"wH8=\"}", API_ELEM_FLOAT, 422,
     "t.base64"},
    {"{\"shape\": [1], \"dtype\": \"bool\", \"base64\": \"Ag==\"}", API_ELEM_BOOL, 422, "t.base64"},
    {"{\"shape\": [1], \"dtype\": \"bool\", \"base64\": \"AQ==\"}", API_ELEM_FLOAT, 422,
     "t.base64"},
    {"{\"shape\": [1], \"dtype\": \"float32\", \"base64\": \"AACAPw==\"}", API_ELEM_BOOL, 422,
     "t.base64"},
    {"{\"shape\": [1], \"dtype\": \"float32\", \"base64\": \"AACAPw==\"}", API_ELEM_INT64, 422,
     "t"},
};

static void test_every_malformed_tensor_names_its_field(void)
{
    union {
        float f[64];
        int64_t i[64];
    } out;
    for (size_t i = 0; i < sizeof bad_tensors / sizeof bad_tensors[0]; i++) {
        api__tensor t;
        api__error err;
        int rc = decode(bad_tensors[i].tensor, bad_tensors[i].elem, 0, &out, &t, &err);
        CHECKF(rc == -1, "%s was accepted", bad_tensors[i].tensor);
        CHECKF(native_http(&err) == bad_tensors[i].status, "%s: status %d, want %d (%s)",
               bad_tensors[i].tensor, native_http(&err), bad_tensors[i].status, err.message);
        CHECKF(strcmp(err.field, bad_tensors[i].field) == 0, "%s: field \"%s\", want \"%s\" (%s)",
               bad_tensors[i].tensor, err.field, bad_tensors[i].field, err.message);
        CHECKF(err.message[0] != '\0', "%s: no message", bad_tensors[i].tensor);
    }
}

static void test_messages_say_what_is_wrong(void)
{
    float out[64];
    api__tensor t;
    api__error err;
    decode("[1, 3.5e38]", API_ELEM_FLOAT, 0, out, &t, &err);
    CHECKF(strstr(err.message, "float32") != NULL, "%s", err.message);
    decode("{\"shape\": [100000000], \"data\": [1]}", API_ELEM_FLOAT, 0, out, &t, &err);
    CHECKF(strstr(err.message, "--max-elements") != NULL, "%s", err.message);
    decode("{\"shape\": [1], \"dtype\": \"float32\", \"base64\": \"AACA Pw==\"}", API_ELEM_FLOAT, 0,
           out, &t, &err);
    CHECKF(strstr(err.message, "offset 4") != NULL, "%s", err.message);
    decode("[[1, 2], [3]]", API_ELEM_FLOAT, 0, out, &t, &err);
    CHECKF(strstr(err.message, "rectangular") != NULL, "%s", err.message);
    decode("[true, 1]", API_ELEM_BOOL, 0, out, &t, &err);
    CHECKF(strstr(err.message, "0/1") != NULL, "%s", err.message);
}

/* ---- Big base64 tensors: chunked widening and the body's long-string path ---------------- */

/* Builds {"t": {"shape": [n], "dtype": dtype, "base64": ...}} from bytes, optionally with a
 * "pad": "\\u0000" (a backslash and "u0000": valid JSON that looks like a NUL escape). */
static size_t base64_request(const char *dtype, const void *bytes, size_t nbytes, size_t n,
                             bool nul_elsewhere)
{
    size_t at =
        (size_t)snprintf(text, sizeof text,
                         "{\"t\": {\"shape\": [%zu], \"dtype\": \"%s\", \"base64\": \"", n, dtype);
    at = (size_t)(api__base64_encode(bytes, nbytes, text + at) - text);
    at += (size_t)snprintf(text + at, sizeof text - at, "\"}%s}",
                           nul_elsewhere ? ", \"pad\": \"\\\\u0000\"" : "");
    return at;
}

static void test_big_float16_tensors_widen_across_chunks(void)
{
    enum { N = 5000 }; /* several 1536-element chunks and a padded tail */
    static uint16_t halves[N];
    static float out[N];
    for (int i = 0; i < N; i++)
        halves[i] = eng_f32_to_f16((float)(i % 2000 - 1000) * 0.25f); /* exact in fp16 */
    size_t len = base64_request("float16", halves, sizeof halves, N, false);
    api__body b;
    api__tensor t;
    api__error err = {0};
    CHECK_EQ_INT(api__body_parse(&b, text, len, NULL, &err), 0);
    CHECK_EQ_INT(b.n_spans, 1); /* read in place, not by jansson */
    CHECK_EQ_INT(api__tensor_probe(&b, json_object_get(b.root, "t"), "t", MAX_ELEMENTS, &t, &err),
                 0);
    CHECK_EQ_INT(api__tensor_decode(&b, &t, API_ELEM_FLOAT, 0, out, "t", NULL, &err), 0);
    int wrong = 0;
    for (int i = 0; i < N; i++)
        wrong += out[i] != (float)(i % 2000 - 1000) * 0.25f;
    CHECK_EQ_INT(wrong, 0);
    api__body_free(&b);
}

static void test_long_strings_decode_the_same_with_or_without_elision(void)
{
    enum { N = 3000 };
    static float in[N], out[2][N];
    for (int i = 0; i < N; i++)
        in[i] = sinf((float)i) * 1000.0f;
    for (int pass = 0; pass < 2; pass++) {
        /* Pass 1 puts a "\\u0000" elsewhere in the body, which turns elision off. */
        size_t len = base64_request("float32", in, sizeof in, N, pass == 1);
        api__body b;
        api__tensor t;
        api__error err = {0};
        CHECK_EQ_INT(api__body_parse(&b, text, len, NULL, &err), 0);
        CHECK_EQ_INT(b.n_spans, pass == 0 ? 1 : 0);
        CHECK_EQ_INT(
            api__tensor_probe(&b, json_object_get(b.root, "t"), "t", MAX_ELEMENTS, &t, &err), 0);
        CHECK_EQ_INT(api__tensor_decode(&b, &t, API_ELEM_FLOAT, 0, out[pass], "t", NULL, &err), 0);
        CHECK(memcmp(out[pass], in, sizeof in) == 0);
        api__body_free(&b);
    }
}

/* A printable character that base64 does not use is found in place, at its offset; a raw
 * control character makes the body malformed JSON, so the long string goes to jansson. */
static void test_a_bad_character_in_a_long_string_is_found_in_place(void)
{
    enum { N = 1000 };
    static float in[N], out[N];
    size_t len = base64_request("float32", in, sizeof in, N, false);
    char *b64 = strstr(text, "\"base64\": \"") + 11;
    api__body b;
    api__tensor t;
    api__error err = {0};
    b64[2000] = '*';
    CHECK_EQ_INT(api__body_parse(&b, text, len, NULL, &err), 0);
    CHECK_EQ_INT(api__tensor_probe(&b, json_object_get(b.root, "t"), "t", MAX_ELEMENTS, &t, &err),
                 0);
    CHECK_EQ_INT(api__tensor_decode(&b, &t, API_ELEM_FLOAT, 0, out, "t", NULL, &err), -1);
    CHECK_EQ_INT(err.status, API_STATUS_INVALID_ARGUMENT);
    CHECKF(strstr(err.message, "'*' at offset 2000") != NULL, "%s", err.message);
    api__body_free(&b);

    b64[2000] = '\n';
    memset(&err, 0, sizeof err);
    if (api__body_parse(&b, text, len, NULL, &err) == 0) {
        CHECK(!"a raw newline in a string was accepted");
        api__body_free(&b);
        return;
    }
    CHECK_EQ_INT(err.status, API_STATUS_MALFORMED_REQUEST);
    CHECKF(strstr(err.message, "malformed JSON") != NULL, "%s", err.message);
}

static void test_long_keys_and_escaped_strings_stay_with_jansson(void)
{
    static char key[3000];
    memset(key, 'k', sizeof key - 1);
    snprintf(text, sizeof text, "{\"%s\": 1, \"s\": \"%s\\n\"}", key, key);
    api__body b;
    api__error err = {0};
    CHECK_EQ_INT(api__body_parse(&b, text, strlen(text), NULL, &err), 0);
    CHECK_EQ_INT(b.n_spans, 0);
    CHECK(json_object_get(b.root, key) != NULL);
    api__body_free(&b);
}

/* A number beyond int64 (integers) or double (others) is well-formed JSON with a value out of
 * range: 422, naming the field where it is. */
static void test_out_of_range_numbers_are_422_naming_the_field(void)
{
    static const struct {
        const char *body, *field;
    } cases[] = {
        {"{\"a\": 1e999}", "a"},
        {"{\"window\": [9223372036854775808, 0]}", "window[0]"},
        {"{\"timeout_ms\": 9223372036854775808}", "timeout_ms"},
        {"{\"x\": 1, \"q\": {\"shape\": [2, 123456789012345678901234567890]}}", "q.shape[1]"},
        {"{\"q\": [[1, 0], [0, -1e400]]}", "q[1][1]"},
        {"{\"k\\\"ey\": [{\"a\": \"[,\", \"b\": [1e400]}]}", "k\"ey[0].b[0]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        api__body b;
        api__error err = {0};
        CHECKF(api__body_parse(&b, cases[i].body, strlen(cases[i].body), NULL, &err) == -1,
               "%s accepted", cases[i].body);
        CHECKF(err.status == API_STATUS_INVALID_ARGUMENT, "%s: status %d", cases[i].body,
               err.status);
        CHECKF(strcmp(err.field, cases[i].field) == 0, "%s: field %s, want %s", cases[i].body,
               err.field, cases[i].field);
        CHECKF(strstr(err.message, "beyond the range") != NULL, "%s: %s", cases[i].body,
               err.message);
    }
}

static void test_malformed_bodies_are_400_with_a_position(void)
{
    static const char *bodies[] = {
        "",
        "{",
        "{\"a\": 1,}",
        "{\"a\": NaNa}",
        "{\"a\": -Inf}",
        "{\"a\": 1, Infinity: 2}",
        "{\"a\": 1, \"a\": 2}",
        "{\"a\": \"\xff\"}",
        "{\"a\": \"\\u0000\"}",
        "{\"a\": 1} trailing",
        "[1",
    };
    for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
        api__body b;
        api__error err = {0};
        CHECKF(api__body_parse(&b, bodies[i], strlen(bodies[i]), NULL, &err) == -1, "%s accepted",
               bodies[i]);
        CHECKF(err.status == API_STATUS_MALFORMED_REQUEST, "%s: status %d", bodies[i], err.status);
        CHECKF(strstr(err.message, "line 1") != NULL, "%s: %s", bodies[i], err.message);
    }
}

/* NaN, Infinity and -Infinity (not JSON, but what Python's json module writes: tritonclient sends
 * a float mask's -inf so) are read wherever a value may stand, alone or in big arrays, and never
 * inside strings; a tensor takes only -Infinity, and only where -inf is allowed (float masks). */
static void test_nonfinite_tokens_are_read(void)
{
    static const struct {
        const char *text;
        double want;
    } alone[] = {{"{\"a\": NaN}", NAN},
                 {"{\"a\": Infinity}", INFINITY},
                 {"{\"a\" :\n-Infinity }", -INFINITY},
                 {"{\"b\": [1, -Infinity, 2], \"a\": -Infinity}", -INFINITY}};
    for (size_t i = 0; i < sizeof alone / sizeof alone[0]; i++) {
        api__body b;
        api__error err = {0};
        double v = 0;
        CHECKF(api__body_parse(&b, alone[i].text, strlen(alone[i].text), NULL, &err) == 0, "%s: %s",
               alone[i].text, err.message);
        CHECKF(api__body_nonfinite(&b, json_object_get(b.root, "a"), &v) &&
                   (isnan(alone[i].want) ? isnan(v) : v == alone[i].want),
               "%s: read as %g", alone[i].text, v);
        api__body_free(&b);
    }
    /* Inside a string it is text. */
    api__body b;
    api__error err = {0};
    const char *quoted = "{\"a\": \"-Infinity\"}";
    double v;
    CHECK(api__body_parse(&b, quoted, strlen(quoted), NULL, &err) == 0);
    CHECK(!api__body_nonfinite(&b, json_object_get(b.root, "a"), &v));
    CHECK(strcmp(json_string_value(json_object_get(b.root, "a")), "-Infinity") == 0);
    api__body_free(&b);

    /* In tensors, short (jansson's tree) and long (the fast path). */
    static const struct {
        const char *tensor;
        unsigned flags;
        int status;       /* 0: decodes */
        const char *what; /* in the message */
    } tensors[] = {
        {"[[0, -Infinity]]", API_DECODE_NEG_INF, 0, NULL},
        {"[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, -Infinity]", API_DECODE_NEG_INF, 0,
         NULL},
        {"[[0, -Infinity]]", 0, 422, "is -Infinity; values must be finite"},
        {"[[0, Infinity]]", API_DECODE_NEG_INF, 422, "is Infinity"},
        {"[[NaN, 1]]", API_DECODE_NEG_INF, 422, "is NaN"},
        {"[NaN, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]", 0, 422, "is NaN"},
        {"[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, Infinity]", API_DECODE_NEG_INF, 422,
         "is Infinity"},
        {"{\"shape\": [2], \"data\": [-Infinity, 0]}", API_DECODE_NEG_INF, 0, NULL},
    };
    for (size_t i = 0; i < sizeof tensors / sizeof tensors[0]; i++) {
        float out[16];
        api__tensor t;
        char doc[256];
        snprintf(doc, sizeof doc, "{\"t\": %s}", tensors[i].tensor);
        memset(&err, 0, sizeof err);
        CHECKF(api__body_parse(&b, doc, strlen(doc), NULL, &err) == 0, "%s: %s", doc, err.message);
        int rc = api__tensor_probe(&b, json_object_get(b.root, "t"), "t", MAX_ELEMENTS, &t, &err);
        if (rc == 0)
            rc = api__tensor_decode(&b, &t, API_ELEM_FLOAT, tensors[i].flags, out, "t", NULL, &err);
        if (tensors[i].status == 0) {
            CHECKF(rc == 0, "%s: %s", tensors[i].tensor, err.message);
            CHECK(rc != 0 || out[0] == -INFINITY || out[t.count - 1] == -INFINITY);
        } else {
            CHECKF(rc != 0 && native_http(&err) == tensors[i].status &&
                       strstr(err.message, tensors[i].what) != NULL,
                   "%s: %d %s", tensors[i].tensor, native_http(&err), err.message);
        }
        api__body_free(&b);
    }
    /* Integers never take one. */
    {
        int64_t out[16];
        api__tensor t;
        const char *doc = "{\"t\": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, Infinity]}";
        CHECK(api__body_parse(&b, doc, strlen(doc), NULL, &err) == 0);
        int rc = api__tensor_probe(&b, json_object_get(b.root, "t"), "t", MAX_ELEMENTS, &t, &err);
        if (rc == 0)
            rc = api__tensor_decode(&b, &t, API_ELEM_INT64, 0, out, "t", NULL, &err);
        CHECKF(rc != 0 && strstr(err.message, "must be an integer"), "%s", err.message);
        api__body_free(&b);
    }
}

static void test_errors_after_a_long_string_point_into_the_original_body(void)
{
    static float in[1000];
    size_t len = base64_request("float32", in, sizeof in, 1000, false);
    text[len - 1] = ','; /* {"t": {...}, -> the closing brace becomes a dangling comma */
    api__body b;
    api__error err = {0};
    CHECK_EQ_INT(api__body_parse(&b, text, len, NULL, &err), -1);
    char want[64];
    snprintf(want, sizeof want, "(byte %zu)", len);
    CHECKF(strstr(err.message, want) != NULL, "%s (want %s)", err.message, want);
}

static void test_deep_nesting_is_refused_not_recursed(void)
{
    enum { DEPTH = 150000 };
    static char deep[2 * DEPTH + 16];
    size_t at = (size_t)snprintf(deep, sizeof deep, "{\"t\": ");
    memset(deep + at, '[', DEPTH);
    memset(deep + at + DEPTH, ']', DEPTH);
    at += 2 * DEPTH;
    deep[at++] = '}';
    api__body b;
    api__error err = {0};
    CHECK_EQ_INT(api__body_parse(&b, deep, at, NULL, &err), -1);
    CHECK_EQ_INT(err.status, API_STATUS_MALFORMED_REQUEST);
}

static void test_a_body_must_be_an_object(void)
{
    api__body b;
    api__error err = {0};
    CHECK_EQ_INT(api__body_parse(&b, "[1, 2]", 6, NULL, &err), -1);
    CHECK_EQ_INT(err.status, API_STATUS_INVALID_ARGUMENT);
}

static void test_the_scan_estimates_parse_memory(void)
{
    api__body_scan scan;
    const char *small = "{\"a\": [1, 2, 3]}";
    api__body_scan_run(small, strlen(small), &scan);
    CHECK(scan.parse_bytes >= 4 * 64);
    CHECK(scan.parse_bytes < 64 * 1024);
    api__body_scan_free(&scan);
    /* A million numbers cost jansson tens of megabytes; the estimate must say so. */
    size_t n = 1000000, at = 0;
    char *big = malloc(2 * n + 2);
    big[at++] = '[';
    for (size_t i = 0; i < n; i++) {
        big[at++] = '0';
        big[at++] = ',';
    }
    big[at - 1] = ']';
    api__body_scan_run(big, at, &scan);
    CHECK(scan.parse_bytes >= n * 48);
    api__body_scan_free(&scan);
    free(big);
}

static void test_big_base64_is_the_same_on_a_pool(void)
{
    enum { N = 1 << 20 }; /* 4 MiB of float32: 5.6 MB of text, six tasks */
    float *in = malloc(N * sizeof *in), *out = malloc(N * sizeof *out);
    uint16_t *halves = malloc(N * sizeof *halves);
    for (int i = 0; i < N; i++) {
        in[i] = (float)(i % 4099) * 0.125f - 100.0f;
        halves[i] = eng_f32_to_f16(in[i]);
    }
    eng_error eerr;
    eng_pool *pool = eng_pool_new(2, &eerr);
    for (int dt = 0; dt < 2; dt++) {
        /* Encode on the pool, decode on the pool, compare with the serial encoding. */
        api_buf w, serial;
        size_t bad;
        const int64_t shape[1] = {N};
        api_buf_init(&w, (size_t)N * 6 + 1024);
        api_buf_init(&serial, (size_t)N * 6 + 1024);
        api_buf_cstr(&w, "{\"t\":");
        if (dt == 0) {
            CHECK_EQ_INT(api__tensor_encode(&w, in, 1, shape, API_FORM_BASE64, 0, pool, &bad),
                         API_ENCODE_OK);
            api__tensor_encode(&serial, in, 1, shape, API_FORM_BASE64, 0, NULL, &bad);
            CHECK(memcmp(w.data + 5, serial.data, serial.len) == 0);
        } else {
            api_buf_printf(&w, "{\"shape\":[%d],\"dtype\":\"float16\",\"base64\":\"", N);
            char *p = api_buf_reserve(&w, api__base64_encoded_len(N * 2));
            w.len += (size_t)(api__base64_encode(halves, N * 2, p) - p);
            api_buf_cstr(&w, "\"}");
        }
        api_buf_char(&w, '}');
        api__body b;
        api__tensor t;
        api__error err = {0};
        CHECK_EQ_INT(api__body_parse(&b, w.data, w.len, NULL, &err), 0);
        CHECK_EQ_INT(api__tensor_probe(&b, json_object_get(b.root, "t"), "t", (size_t)N, &t, &err),
                     0);
        memset(out, 0, N * sizeof *out);
        CHECK_EQ_INT(api__tensor_decode(&b, &t, API_ELEM_FLOAT, 0, out, "t", pool, &err), 0);
        int wrong = 0;
        for (int i = 0; i < N; i++)
            wrong += out[i] != (dt == 0 ? in[i] : eng_f16_to_f32(halves[i]));
        CHECK_EQ_INT(wrong, 0);
        /* A bad character in the third task's range: the same message as decoding in order. */
        ((char *)t.b64)[(2 << 20) + 1001] = '*';
        api__error on_pool = {0}, serial_err = {0};
        CHECK_EQ_INT(api__tensor_decode(&b, &t, API_ELEM_FLOAT, 0, out, "t", pool, &on_pool), -1);
        CHECK_EQ_INT(api__tensor_decode(&b, &t, API_ELEM_FLOAT, 0, out, "t", NULL, &serial_err),
                     -1);
        CHECKF(strcmp(on_pool.message, serial_err.message) == 0 &&
                   strstr(on_pool.message, "offset 2098153"),
               "%s / %s", on_pool.message, serial_err.message);
        api__body_free(&b);
        api_buf_free(&w);
        api_buf_free(&serial);
    }
    eng_pool_free(pool);
    free(in);
    free(out);
    free(halves);
}

/* ---- The strict number scanner: the same floats and the same errors as through jansson ---- */

/* Parses {"t": <tensor>} twice, with number arrays scanned in place and (the body carrying a
 * "\\u0000" elsewhere, which turns elision off) through jansson, and checks that both give
 * the same status, field and floats. Returns how many spans the first parse elided. */
static size_t same_both_ways(const char *tensor, api__elem elem)
{
    static char text2[1 << 16];
    static float out[2][4096];
    api__error err[2];
    int rc[2];
    size_t spans = 0;
    for (int pass = 0; pass < 2; pass++) {
        snprintf(text2, sizeof text2, "{\"t\": %s%s}", tensor,
                 pass ? ", \"pad\": \"\\\\u0000\"" : "");
        api__body b;
        api__tensor t;
        memset(&err[pass], 0, sizeof err[pass]);
        memset(out[pass], 0, sizeof out[pass]);
        rc[pass] = api__body_parse(&b, text2, strlen(text2), NULL, &err[pass]);
        if (pass == 0 && rc[pass] == 0)
            spans = b.n_spans;
        if (pass == 1 && rc[pass] == 0)
            CHECK_EQ_INT(b.n_spans, 0);
        if (rc[pass] == 0)
            rc[pass] = api__tensor_probe(&b, json_object_get(b.root, "t"), "t", MAX_ELEMENTS, &t,
                                         &err[pass]);
        if (rc[pass] == 0 && t.count <= 4096)
            rc[pass] = api__tensor_decode(&b, &t, elem, 0, out[pass], "t", NULL, &err[pass]);
        if (rc[pass] == 0 || err[pass].status != 400)
            api__body_free(&b);
    }
    CHECKF(rc[0] == rc[1] && err[0].status == err[1].status &&
               strcmp(err[0].field, err[1].field) == 0,
           "%.80s: %d %d \"%s\" vs %d %d \"%s\" (%s / %s)", tensor, rc[0], err[0].status,
           err[0].field, rc[1], err[1].status, err[1].field, err[0].message, err[1].message);
    CHECKF(memcmp(out[0], out[1], sizeof out[0]) == 0, "%.80s: the values differ", tensor);
    return spans;
}

static void test_number_arrays_are_read_in_place(void)
{
    /* 16 or more numbers, rectangular: elided, and identical to jansson's reading. */
    CHECK_EQ_INT(same_both_ways("[[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16]]",
                                API_ELEM_FLOAT),
                 1);
    CHECK_EQ_INT(same_both_ways("{\"shape\": [2, 8], \"data\": [0.1, -0.0, 1e-45, 1.5E+3, "
                                "0.000123, -7, 3.4028235e38, 2.5e-39, 1e22, 1e23, 123456789012, "
                                "9007199254740993, 0.30000000000000004, 4.9e-300, -1E-7, 0]}",
                                API_ELEM_FLOAT),
                 1);
    CHECK_EQ_INT(
        same_both_ways("[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, -0]", API_ELEM_INT64),
        1);
    /* Fewer than 16 numbers stay with jansson. */
    CHECK_EQ_INT(same_both_ways("[1, 2, 3]", API_ELEM_FLOAT), 0);
}

static void test_number_arrays_fail_as_through_jansson(void)
{
    static const char *const arrays[] = {
        /* Out of float32 range: elided, then refused naming the element. */
        "[[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 3.5e38, 16]]",
        "{\"shape\": [16], \"data\": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 1e39]}",
        /* Not rectangular, or mixed depths: left whole to jansson, which names the element. */
        "[[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6, 7, 8, 9]]",
        "[[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6, 7], 9]",
        "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, [16]]",
        "[[[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]], [[1]]]",
        /* Not numbers, or not JSON numbers: jansson's errors (400) or the probe's (422). */
        "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, true]",
        "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, null]",
        "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, \"16\"]",
        "[01, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]",
        "[1., 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]",
        "[.5, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]",
        "[+1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]",
        "[1e, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]",
        "[-, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]",
        "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,]",
        "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15 16]",
        "[1e999, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]",
        "[99999999999999999999, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]",
        "[0x10, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]",
        /* Valid, but near the ends of the double range: read by jansson and strtod. */
        "[5e-324, 1e-310, 1.7976931348623157e308, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]",
        "[1.00000000000000000000001, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]",
        "[0e99999999999, -0E-99999999999, 0.0000000000000000000000000000000000000000001e42, 4, 5, "
        "6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]",
        "[1e0000000000000000000000001, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]",
        "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16",
    };
    for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; i++)
        same_both_ways(arrays[i], API_ELEM_FLOAT);
    /* Integers where integers are needed. */
    same_both_ways("[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 1.5]", API_ELEM_INT64);
    same_both_ways("[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 1e2]", API_ELEM_INT64);
    same_both_ways("[true, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]", API_ELEM_BOOL);
    same_both_ways("[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]", API_ELEM_BOOL);
}

static void test_random_numbers_read_the_same_both_ways(void)
{
    /* Numbers in every shape the grammar allows, and some it does not. */
    static const char *const parts[] = {"0", "1", "9", "-", ".", "e", "E", "+", "5", "0"};
    static char arr[8192];
    uint64_t rng = 12345;
    for (int round = 0; round < 400; round++) {
        size_t at = 0;
        arr[at++] = '[';
        for (int k = 0; k < 20; k++) {
            if (k)
                arr[at++] = ',';
            /* Mostly well-formed: sign, digits, fraction, exponent; sometimes a random token. */
            uint64_t x = rng_next(&rng);
            if (x % 17 == 0) {
                for (int j = 0; j < 3; j++)
                    at += (size_t)snprintf(arr + at, 8, "%s", parts[(x >> (8 * j)) % 10]);
                continue;
            }
            double mant = (double)(x >> 11) / (double)(1ull << 53) * 2.0 - 1.0;
            int e = (int)((x >> 3) % 90) - 45;
            double v = mant * pow(10.0, e);
            char *p = arr + at;
            switch ((x >> 30) % 5) {
            case 0:
                at += (size_t)snprintf(p, 64, "%.9g", v);
                break;
            case 1:
                at += (size_t)snprintf(p, 64, "%.17g", v);
                break;
            case 2:
                at += (size_t)snprintf(p, 64, "%.3e", v);
                break;
            case 3:
                at += (size_t)snprintf(p, 64, "%.0f", v);
                break;
            default:
                at += (size_t)snprintf(p, 64, "%.12f", v);
                break;
            }
        }
        arr[at++] = ']';
        arr[at] = '\0';
        same_both_ways(arr, API_ELEM_FLOAT);
        if (check__failures_in_test > 5)
            return;
    }
}

/* ---- Encoding ---------------------------------------------------------------------------- */

static bool encodes_to(const float *data, int rank, const int64_t *shape, api__form form,
                       unsigned flags, const char *want)
{
    api_buf w;
    size_t bad, count = 1;
    for (int d = 0; d < rank; d++)
        count *= (size_t)shape[d];
    size_t bound = api__tensor_encoded_bound(form, rank, shape, count);
    api_buf_init(&w, bound);
    api__encode_status st = api__tensor_encode(&w, data, rank, shape, form, flags, NULL, &bad);
    bool ok = st == API_ENCODE_OK && w.len == strlen(want) && memcmp(w.data, want, w.len) == 0;
    CHECKF(ok, "wrote %.*s, want %s", (int)w.len, w.data ? w.data : "", want);
    api_buf_free(&w);
    return ok;
}

static void test_encodes_nested_arrays_of_any_rank(void)
{
    const float v[] = {1, 2.5f, -3, 4, 5, 6};
    encodes_to(v, 1, (const int64_t[]){3}, API_FORM_NESTED, 0, "[1,2.5,-3]");
    encodes_to(v, 2, (const int64_t[]){2, 3}, API_FORM_NESTED, 0, "[[1,2.5,-3],[4,5,6]]");
    encodes_to(v, 3, (const int64_t[]){2, 1, 2}, API_FORM_NESTED, 0, "[[[1,2.5]],[[-3,4]]]");
    encodes_to(v, 3, (const int64_t[]){1, 1, 1}, API_FORM_NESTED, 0, "[[[1]]]");
    encodes_to(v, 4, (const int64_t[]){1, 2, 1, 3}, API_FORM_NESTED, 0,
               "[[[[1,2.5,-3]],[[4,5,6]]]]");
    encodes_to(v, 3, (const int64_t[]){3, 2, 1}, API_FORM_NESTED, 0,
               "[[[1],[2.5]],[[-3],[4]],[[5],[6]]]");
}

static void test_encodes_flat_and_base64(void)
{
    const float v[] = {1, 2, 3, 4};
    encodes_to(v, 2, (const int64_t[]){2, 2}, API_FORM_FLAT, 0,
               "{\"shape\":[2,2],\"data\":[1,2,3,4]}");
    encodes_to(v, 1, (const int64_t[]){1}, API_FORM_BASE64, 0,
               "{\"shape\":[1],\"dtype\":\"float32\",\"base64\":\"AACAPw==\"}");
}

/* API_ENCODE_BF16: bf16 values in text, two little-endian bytes each in base64 and raw (3.14159
 * is 0x4049 as bf16, 3.140625), -inf kept where asked, and a value that only bf16 cannot hold
 * (FLT_MAX rounds to +inf) refused like any non-finite one. */
static void test_encodes_bfloat16(void)
{
    const float v[] = {1.00390625f, 3.14159f, -2};
    encodes_to(v, 1, (const int64_t[]){3}, API_FORM_NESTED, API_ENCODE_BF16, "[1,3.140625,-2]");
    encodes_to(v, 1, (const int64_t[]){2}, API_FORM_BASE64, API_ENCODE_BF16,
               "{\"shape\":[2],\"dtype\":\"bfloat16\",\"base64\":\"gD9JQA==\"}");
    encodes_to(v + 1, 1, (const int64_t[]){1}, API_FORM_RAW, API_ENCODE_BF16, "I@");
    const float lse[] = {-INFINITY, 0.5f};
    encodes_to(lse, 1, (const int64_t[]){2}, API_FORM_FLAT,
               API_ENCODE_BF16 | API_ENCODE_NEG_INF_NULL, "{\"shape\":[2],\"data\":[null,0.5]}");
    const float big[] = {1, FLT_MAX};
    api_buf w;
    size_t bad = 0;
    api_buf_init(&w, 1000);
    CHECK_EQ_INT(api__tensor_encode(&w, big, 1, (const int64_t[]){2}, API_FORM_BASE64,
                                    API_ENCODE_BF16, NULL, &bad),
                 API_ENCODE_NONFINITE);
    CHECK_EQ_INT(bad, 1);
    CHECK_EQ_INT(
        api__tensor_encode(&w, big, 1, (const int64_t[]){2}, API_FORM_BASE64, 0, NULL, &bad),
        API_ENCODE_OK);
    api_buf_free(&w);
}

static void test_non_finite_values_are_refused_or_written_as_asked(void)
{
    const float v[] = {1, 2, -INFINITY, 4, INFINITY, NAN};
    api_buf w;
    size_t bad = 0;
    api_buf_init(&w, 1000);
    CHECK_EQ_INT(api__tensor_encode(&w, v, 1, (const int64_t[]){6}, API_FORM_NESTED, 0, NULL, &bad),
                 API_ENCODE_NONFINITE);
    CHECK_EQ_INT(bad, 2);
    CHECK_EQ_INT(api__tensor_encode(&w, v, 1, (const int64_t[]){6}, API_FORM_FLAT,
                                    API_ENCODE_NEG_INF_NULL, NULL, &bad),
                 API_ENCODE_NONFINITE);
    CHECK_EQ_INT(bad, 4);
    CHECK_EQ_INT(api__tensor_encode(&w, v + 5, 1, (const int64_t[]){1}, API_FORM_BASE64,
                                    API_ENCODE_NEG_INF_NULL, NULL, &bad),
                 API_ENCODE_NONFINITE);
    api_buf_free(&w);
    encodes_to(v, 1, (const int64_t[]){4}, API_FORM_NESTED, API_ENCODE_NEG_INF_NULL,
               "[1,2,null,4]");
    encodes_to(v, 1, (const int64_t[]){4}, API_FORM_FLAT, API_ENCODE_NEG_INF_TOKEN,
               "{\"shape\":[4],\"data\":[1,2,-Infinity,4]}");
}

static void test_every_form_round_trips_bit_exactly(void)
{
    enum { N = 2 * 3 * 5 * 7 };
    static float v[N], back[N];
    const int64_t shape[4] = {2, 3, 5, 7};
    uint64_t rng = 11;
    for (int i = 0; i < N; i++)
        v[i] = rng_sym(&rng, 0.5) * powf(10.0f, (float)(i % 30 - 15));
    for (int form = API_FORM_NESTED; form <= API_FORM_BASE64; form++) {
        for (int rank = 1; rank <= 4; rank++) {
            const int64_t *sh = shape + 4 - rank;
            size_t count = 1;
            for (int d = 0; d < rank; d++)
                count *= (size_t)sh[d];
            api_buf w;
            size_t bad, bound = api__tensor_encoded_bound((api__form)form, rank, sh, count);
            api_buf_init(&w, bound);
            api_buf_cstr(&w, "{\"t\":");
            CHECK_EQ_INT(api__tensor_encode(&w, v, rank, sh, (api__form)form, 0, NULL, &bad),
                         API_ENCODE_OK);
            api_buf_char(&w, '}');
            CHECKF(w.state == API_BUF_OK, "form %d rank %d outgrew its bound %zu", form, rank,
                   bound);
            api__body b;
            api__tensor t;
            api__error err = {0};
            CHECK_EQ_INT(api__body_parse(&b, w.data, w.len, NULL, &err), 0);
            CHECK_EQ_INT(
                api__tensor_probe(&b, json_object_get(b.root, "t"), "t", MAX_ELEMENTS, &t, &err),
                0);
            CHECK_EQ_INT(t.form, form);
            CHECK_EQ_INT(t.rank, rank);
            CHECK_EQ_INT(t.count, count);
            CHECK_EQ_INT(api__tensor_decode(&b, &t, API_ELEM_FLOAT, 0, back, "t", NULL, &err), 0);
            CHECKF(memcmp(back, v, count * sizeof(float)) == 0, "form %d rank %d", form, rank);
            api__body_free(&b);
            api_buf_free(&w);
        }
    }
}

static void test_index_format_names_elements(void)
{
    char buf[64];
    const int64_t shape[3] = {2, 3, 4};
    CHECK(strcmp(api__index_format(buf, sizeof buf, 0, 3, shape, 3), "[0][0][0]") == 0);
    CHECK(strcmp(api__index_format(buf, sizeof buf, 23, 3, shape, 3), "[1][2][3]") == 0);
    CHECK(strcmp(api__index_format(buf, sizeof buf, 17, 3, shape, 2), "[1][1]") == 0);
    CHECK(strcmp(api__index_format(buf, sizeof buf, 17, 3, shape, 0), "") == 0);
}

int main(void)
{
    RUN(test_nested_arrays_decode_in_row_major_order);
    RUN(test_numbers_narrow_to_the_nearest_float);
    RUN(test_flat_form_takes_shape_and_data);
    RUN(test_base64_decodes_every_dtype);
    RUN(test_float32_bytes_find_a_non_finite_value_at_any_index);
    RUN(test_integers_decode_exactly);
    RUN(test_negative_infinity_only_where_allowed);
    RUN(test_every_malformed_tensor_names_its_field);
    RUN(test_messages_say_what_is_wrong);
    RUN(test_big_float16_tensors_widen_across_chunks);
    RUN(test_long_strings_decode_the_same_with_or_without_elision);
    RUN(test_a_bad_character_in_a_long_string_is_found_in_place);
    RUN(test_big_base64_is_the_same_on_a_pool);
    RUN(test_number_arrays_are_read_in_place);
    RUN(test_number_arrays_fail_as_through_jansson);
    RUN(test_random_numbers_read_the_same_both_ways);
    RUN(test_long_keys_and_escaped_strings_stay_with_jansson);
    RUN(test_malformed_bodies_are_400_with_a_position);
    RUN(test_nonfinite_tokens_are_read);
    RUN(test_out_of_range_numbers_are_422_naming_the_field);
    RUN(test_errors_after_a_long_string_point_into_the_original_body);
    RUN(test_deep_nesting_is_refused_not_recursed);
    RUN(test_a_body_must_be_an_object);
    RUN(test_the_scan_estimates_parse_memory);
    RUN(test_encodes_nested_arrays_of_any_rank);
    RUN(test_encodes_flat_and_base64);
    RUN(test_encodes_bfloat16);
    RUN(test_non_finite_values_are_refused_or_written_as_asked);
    RUN(test_every_form_round_trips_bit_exactly);
    RUN(test_index_format_names_elements);
    return check_report();
}
