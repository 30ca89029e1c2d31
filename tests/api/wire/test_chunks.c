/* test_chunks.c - api/wire/chunks.c and the codecs that split their work with it: small work
 * never leaves the calling thread, and every codec on a pool of two workers gives what it gives
 * on one thread, byte for byte, at each piece boundary (one element short of a piece, a piece,
 * one more, two pieces and one), and the same first error, message and offset included,
 * wherever the error lies. */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/wire/base64.h"
#include "api/wire/chunks.h"
#include "api/wire/tensor.h"
#include "tests/support/check.h"
#include "tests/support/rng.h"

static eng_pool *pool;

/* The pieces of the codecs (api/wire/tensor.c, tensor_encode.c, body.c): what the sizes below
 * straddle. */
enum {
    B64_DECODE_CHARS = 1 << 20,
    RAW_ELEMS = 1 << 18,
    NUMBER_BYTES = 1 << 18,
    TEXT_ELEMS = 1 << 14,
    B64_ENCODE_FLOATS = (3 << 18) / 4,
    BF16_B64_ELEMS = 3 << 17,
};

/* Piece counts around `piece` units: each size a test runs at. */
static size_t boundary(size_t piece, int i)
{
    const size_t sizes[4] = {piece - 1, piece, piece + 1, 2 * piece + 1};
    return sizes[i];
}

/* ---- The runner -------------------------------------------------------------------------- */

typedef struct {
    atomic_size_t calls, units;
    size_t fail_from; /* a piece starting here fails */
} counted;

static bool count_piece(void *arg, size_t from, size_t to)
{
    counted *c = arg;
    atomic_fetch_add(&c->calls, 1);
    atomic_fetch_add(&c->units, to - from);
    CHECK(from % 100 == 0 && to > from && to - from <= 100);
    return from != c->fail_from;
}

static void test_small_work_or_no_pool_is_left_to_the_caller(void)
{
    counted c = {.fail_from = SIZE_MAX};
    CHECK(!api__chunks_run(pool, 100, 100, count_piece, &c)); /* one grain: no task */
    CHECK(!api__chunks_run(NULL, 1000, 100, count_piece, &c));
    CHECK_EQ_INT(atomic_load(&c.calls), 0);
}

static void test_large_work_is_done_in_pieces_of_a_grain(void)
{
    counted c = {.fail_from = SIZE_MAX};
    CHECK(api__chunks_run(pool, 1001, 100, count_piece, &c));
    CHECK_EQ_INT(atomic_load(&c.calls), 11);
    CHECK_EQ_INT(atomic_load(&c.units), 1001);
    counted f = {.fail_from = 500};
    CHECK(!api__chunks_run(pool, 1001, 100, count_piece, &f));
}

/* ---- Decoding ---------------------------------------------------------------------------- */

/* A request body {"t": tensor} parsed, and the tensor probed: the text is the body's. */
typedef struct {
    char *text;
    api__body b;
    api__tensor t;
} parsed;

static bool parse(parsed *p, char *text)
{
    api__error err = {0};
    p->text = text;
    if (api__body_parse(&p->b, text, strlen(text), NULL, &err) != 0 ||
        api__tensor_probe(&p->b, json_object_get(p->b.root, "t"), "t", (size_t)1 << 30, &p->t,
                          &err) != 0) {
        CHECKF(false, "%s", err.message);
        return false;
    }
    return true;
}

static void parsed_free(parsed *p)
{
    api__body_free(&p->b);
    free(p->text);
}

/* Decodes t on the pool and on this thread: the same result, bytes and error. */
static void decodes_alike(const api__body *b, const api__tensor *t, api__elem elem, unsigned flags,
                          const char *what)
{
    size_t bytes = t->count * api__elem_size(elem);
    char *a = calloc(1, bytes), *s = calloc(1, bytes);
    api__error ea = {0}, es = {0};
    int ra = api__tensor_decode(b, t, elem, flags, a, "t", pool, &ea);
    int rs = api__tensor_decode(b, t, elem, flags, s, "t", NULL, &es);
    CHECKF(ra == rs, "%s: %d on the pool, %d alone", what, ra, rs);
    if (rs == 0)
        CHECKF(memcmp(a, s, bytes) == 0, "%s: the decoded values differ", what);
    else
        CHECKF(ea.status == es.status && strcmp(ea.field, es.field) == 0 &&
                   strcmp(ea.message, es.message) == 0,
               "%s: \"%s\" on the pool, \"%s\" alone", what, ea.message, es.message);
    free(a);
    free(s);
}

static float *random_floats(size_t n, uint64_t seed)
{
    float *x = malloc(n * sizeof *x + 1);
    for (size_t i = 0; i < n; i++)
        x[i] = rng_sym(&seed, 1.0) * powf(10.0f, (float)(int)(i % 20) - 10.0f);
    return x;
}

/* {"t": {"shape": [n], "dtype": dtype, "base64": "..."}} of `bytes` at data (malloc'd). */
static char *base64_body(const void *data, size_t bytes, size_t n, const char *dtype)
{
    size_t chars = api__base64_encoded_len(bytes);
    char *text = malloc(chars + 128);
    int at = snprintf(text, 128, "{\"t\": {\"shape\": [%zu], \"dtype\": \"%s\", \"base64\": \"", n,
                      dtype);
    char *end = api__base64_encode(data, bytes, text + at);
    memcpy(end, "\"}}", 4);
    return text;
}

static void test_base64_decodes_alike_at_every_boundary(void)
{
    for (int i = 0; i < 4; i++) {
        size_t n = boundary(B64_DECODE_CHARS / 4 * 3 / 4, i); /* float32s: text around pieces */
        float *x = random_floats(n, 1 + (uint64_t)i);
        parsed p;
        if (!parse(&p, base64_body(x, n * 4, n, "float32")))
            continue;
        decodes_alike(&p.b, &p.t, API_ELEM_FLOAT, 0, "base64 float32");
        /* A bad character at the start of each piece and in the last one. */
        char *b64 = (char *)(uintptr_t)p.t.b64;
        for (size_t at = 0; at + 7 < p.t.b64_len; at += B64_DECODE_CHARS) {
            char keep = b64[at + 7];
            b64[at + 7] = '!';
            decodes_alike(&p.b, &p.t, API_ELEM_FLOAT, 0, "a '!' in a piece");
            b64[at + 7] = keep;
        }
        b64[p.t.b64_len - 9] = '\n';
        decodes_alike(&p.b, &p.t, API_ELEM_FLOAT, 0, "a line break in the last piece");
        /* Two errors: the first is named. */
        b64[p.t.b64_len - 100] = '#';
        b64[40] = '*';
        decodes_alike(&p.b, &p.t, API_ELEM_FLOAT, 0, "two bad characters");
        parsed_free(&p);
        free(x);
    }
}

static void test_float16_base64_widens_alike(void)
{
    size_t n = boundary(B64_DECODE_CHARS, 3) / 4 * 3 / 2;
    uint16_t *h = malloc(n * sizeof *h);
    uint64_t rng = 5;
    for (size_t i = 0; i < n; i++)
        h[i] = eng_f32_to_f16(rng_sym(&rng, 100.0));
    h[n - 3] = 0x7c00; /* +inf in the last piece */
    parsed p;
    if (parse(&p, base64_body(h, n * 2, n, "float16"))) {
        decodes_alike(&p.b, &p.t, API_ELEM_FLOAT, 0, "float16 with an inf");
        parsed_free(&p);
    }
    h[n - 3] = 0;
    if (parse(&p, base64_body(h, n * 2, n, "bfloat16"))) {
        decodes_alike(&p.b, &p.t, API_ELEM_FLOAT, 0, "bfloat16 widened");
        decodes_alike(&p.b, &p.t, API_ELEM_BF16, 0, "bfloat16 kept");
        parsed_free(&p);
    }
    free(h);
}

/* A raw tensor of n elements of `dtype` at data. */
static api__tensor raw_tensor(const void *data, api__dtype dtype, size_t n)
{
    api__tensor t = {.present = true, .form = API_FORM_RAW, .dtype = dtype, .rank = 1};
    t.shape[0] = (int64_t)n;
    t.count = n;
    t.raw = data;
    return t;
}

static void test_raw_bytes_convert_alike_at_every_boundary(void)
{
    for (int i = 0; i < 4; i++) {
        size_t n = boundary(RAW_ELEMS, i);
        float *x = random_floats(n, 10 + (uint64_t)i);
        api__tensor t = raw_tensor(x, API_DTYPE_FLOAT32, n);
        decodes_alike(NULL, &t, API_ELEM_FLOAT, 0, "raw float32");
        /* A NaN in each piece, then -inf where it is allowed and where it is not. */
        for (size_t at = 0; at + 3 < n; at += RAW_ELEMS) {
            float keep = x[at + 3];
            x[at + 3] = NAN;
            decodes_alike(NULL, &t, API_ELEM_FLOAT, 0, "a NaN in a piece");
            x[at + 3] = keep;
        }
        x[n - 1] = -INFINITY;
        decodes_alike(NULL, &t, API_ELEM_FLOAT, API_DECODE_NEG_INF, "-inf allowed");
        decodes_alike(NULL, &t, API_ELEM_FLOAT, 0, "-inf refused");
        free(x);
    }
    size_t n = boundary(RAW_ELEMS, 3);
    uint8_t *bools = calloc(n, 1);
    bools[n - 2] = 2;
    api__tensor t = raw_tensor(bools, API_DTYPE_BOOL, n);
    decodes_alike(NULL, &t, API_ELEM_BOOL, 0, "a bool byte of 2");
    decodes_alike(NULL, &t, API_ELEM_FLOAT, 0, "bools where floats are asked");
    free(bools);
    int64_t *ints = calloc(n, sizeof *ints);
    ints[n - 1] = -5;
    t = raw_tensor(ints, API_DTYPE_INT64, n);
    decodes_alike(NULL, &t, API_ELEM_INT64, 0, "int64");
    free(ints);
}

static void test_raw_bytes_checked_in_place_alike(void)
{
    size_t n = boundary(RAW_ELEMS, 3);
    float *x = random_floats(n, 20), *copy = malloc(n * sizeof *copy);
    memcpy(copy, x, n * sizeof *x);
    api__tensor t = raw_tensor(x, API_DTYPE_FLOAT32, n);
    api__error ea = {0}, es = {0};
    CHECK(api__tensor_in_place(&t, API_ELEM_FLOAT));
    CHECK_EQ_INT(api__tensor_decode(NULL, &t, API_ELEM_FLOAT, 0, x, "t", pool, &ea), 0);
    CHECK(memcmp(x, copy, n * sizeof *x) == 0); /* read, never written */
    x[RAW_ELEMS + 9] = INFINITY;
    x[2 * RAW_ELEMS] = NAN;
    CHECK_EQ_INT(api__tensor_decode(NULL, &t, API_ELEM_FLOAT, 0, x, "t", pool, &ea), -1);
    CHECK_EQ_INT(api__tensor_decode(NULL, &t, API_ELEM_FLOAT, 0, x, "t", NULL, &es), -1);
    CHECKF(strcmp(ea.message, es.message) == 0 && strstr(ea.message, "element 262153 is inf"),
           "%s / %s", ea.message, es.message);
    free(x);
    free(copy);
}

/* {"t": {"shape": [n], "data": [...]}} or the nested [[...], ...] of rows of `width`, with the
 * numbers of x written as %.9g, `what` at index `bad` (SIZE_MAX: none). */
static char *numbers_body(const float *x, size_t n, size_t width, size_t bad, const char *what)
{
    size_t cap = n * 20 + 128, at = 0;
    char *text = malloc(cap);
    at += (size_t)(width ? snprintf(text, cap, "{\"t\": [")
                         : snprintf(text, cap, "{\"t\": {\"shape\": [%zu], \"data\": [", n));
    for (size_t i = 0; i < n; i++) {
        const char *sep = !width ? (i ? "," : "") : i % width ? "," : i ? ",[" : "[";
        at += (size_t)(i == bad ? snprintf(text + at, cap - at, "%s%s", sep, what)
                                : snprintf(text + at, cap - at, "%s%.9g", sep, (double)x[i]));
        if (width && (i + 1) % width == 0)
            text[at++] = ']';
    }
    snprintf(text + at, cap - at, "%s", width ? "]}" : "]}}");
    return text;
}

static void test_json_numbers_decode_alike_at_every_boundary(void)
{
    /* About 14 characters a number: sizes around whole pieces of text. */
    for (int i = 0; i < 4; i++) {
        size_t n = boundary(NUMBER_BYTES, i) / 14;
        float *x = random_floats(n, 30 + (uint64_t)i);
        parsed p;
        if (parse(&p, numbers_body(x, n, 0, SIZE_MAX, NULL))) {
            decodes_alike(&p.b, &p.t, API_ELEM_FLOAT, 0, "flat numbers");
            parsed_free(&p);
        }
        free(x);
    }
    size_t n = 3 * NUMBER_BYTES / 14 / 7 * 7;
    float *x = random_floats(n, 40);
    parsed p;
    if (parse(&p, numbers_body(x, n, 7, SIZE_MAX, NULL))) {
        decodes_alike(&p.b, &p.t, API_ELEM_FLOAT, 0, "nested rows of 7");
        parsed_free(&p);
    }
    /* An error in the first, a middle and the last piece, and where -inf is allowed. */
    const struct {
        size_t at;
        const char *what;
        unsigned flags;
    } errors[] = {{5, "1e39", 0},
                  {n / 2, "NaN", 0},
                  {n - 2, "-3.5e38", 0},
                  {n / 2, "-Infinity", 0},
                  {n / 2, "-Infinity", API_DECODE_NEG_INF}};
    for (size_t e = 0; e < sizeof errors / sizeof errors[0]; e++) {
        if (!parse(&p, numbers_body(x, n, e % 2 ? 7 : 0, errors[e].at, errors[e].what)))
            continue;
        decodes_alike(&p.b, &p.t, API_ELEM_FLOAT, errors[e].flags, errors[e].what);
        parsed_free(&p);
    }
    free(x);
}

static void test_json_integers_decode_alike(void)
{
    size_t n = 3 * NUMBER_BYTES / 7;
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(i * 7919 % 100003) - 50000.0f;
    parsed p;
    if (parse(&p, numbers_body(x, n, 0, SIZE_MAX, NULL))) {
        decodes_alike(&p.b, &p.t, API_ELEM_INT64, 0, "integers");
        parsed_free(&p);
    }
    if (parse(&p, numbers_body(x, n, 0, n - 10, "2.5"))) {
        decodes_alike(&p.b, &p.t, API_ELEM_INT64, 0, "a fraction in the last piece");
        parsed_free(&p);
    }
    free(x);
}

/* ---- Encoding ---------------------------------------------------------------------------- */

/* Encodes data[shape] on the pool and on this thread: the same status, bytes and bad index. */
static void encodes_alike(const float *data, int rank, const int64_t *shape, api__form form,
                          unsigned flags)
{
    size_t count = 1, bad_a = 0, bad_s = 0;
    for (int d = 0; d < rank; d++)
        count *= (size_t)shape[d];
    size_t bound = api__tensor_encoded_bound(form, rank, shape, count);
    api_buf a, s;
    api_buf_init(&a, bound);
    api_buf_init(&s, bound);
    api__encode_status sa = api__tensor_encode(&a, data, rank, shape, form, flags, pool, &bad_a);
    api__encode_status ss = api__tensor_encode(&s, data, rank, shape, form, flags, NULL, &bad_s);
    CHECKF(sa == ss, "form %d rank %d count %zu: status %d on the pool, %d alone", form, rank,
           count, sa, ss);
    if (ss == API_ENCODE_OK)
        CHECKF(a.len == s.len && memcmp(a.data, s.data, s.len) == 0,
               "form %d rank %d count %zu flags %u: the text differs", form, rank, count, flags);
    else
        CHECK_EQ_INT(bad_a, bad_s);
    api_buf_free(&a);
    api_buf_free(&s);
}

static void test_text_encodes_alike_at_every_boundary(void)
{
    /* Shapes whose counts straddle pieces of text, rows crossing the pieces' edges. */
    static const int64_t shapes[][4] = {{TEXT_ELEMS - 1, 1, 1, 1}, {TEXT_ELEMS, 1, 1, 1},
                                        {5, 29, 113, 1},           {3, 3, 11, 331},
                                        {2, 8192, 1, 1},           {7, 1, 3, 3121}};
    static const int ranks[] = {1, 1, 3, 4, 2, 4};
    float *x = random_floats(5 * TEXT_ELEMS, 50);
    x[3 * TEXT_ELEMS / 2] = -INFINITY;
    for (size_t k = 0; k < sizeof ranks / sizeof ranks[0]; k++) {
        encodes_alike(x, ranks[k], shapes[k], API_FORM_NESTED, API_ENCODE_NEG_INF_NULL);
        encodes_alike(x, ranks[k], shapes[k], API_FORM_FLAT, API_ENCODE_NEG_INF_TOKEN);
        encodes_alike(x, ranks[k], shapes[k], API_FORM_NESTED,
                      API_ENCODE_BF16 | API_ENCODE_NEG_INF_NULL);
        encodes_alike(x, ranks[k], shapes[k], API_FORM_NESTED, 0); /* -inf refused */
    }
    free(x);
}

static void test_bytes_encode_alike_at_every_boundary(void)
{
    float *x = random_floats(2 * BF16_B64_ELEMS + 1, 60);
    for (int i = 0; i < 4; i++) {
        int64_t f32 = (int64_t)boundary(B64_ENCODE_FLOATS, i);
        int64_t bf16 = (int64_t)boundary(BF16_B64_ELEMS, i);
        int64_t raw = (int64_t)boundary(RAW_ELEMS, i);
        encodes_alike(x, 1, &f32, API_FORM_BASE64, 0);
        encodes_alike(x, 1, &bf16, API_FORM_BASE64, API_ENCODE_BF16);
        encodes_alike(x, 1, &raw, API_FORM_RAW, 0);
        encodes_alike(x, 1, &raw, API_FORM_RAW, API_ENCODE_BF16);
    }
    free(x);
}

static void test_the_first_unwritable_value_is_found_wherever_it_lies(void)
{
    size_t n = boundary(RAW_ELEMS, 3), bad_a = 0, bad_s = 0;
    float *x = random_floats(n, 70);
    x[2 * RAW_ELEMS] = NAN;
    x[RAW_ELEMS + 5] = INFINITY;
    CHECK(!api__tensor_writable(x, n, 0, pool, &bad_a));
    CHECK(!api__tensor_writable(x, n, 0, NULL, &bad_s));
    CHECK_EQ_INT(bad_a, RAW_ELEMS + 5);
    CHECK_EQ_INT(bad_s, RAW_ELEMS + 5);
    x[RAW_ELEMS + 5] = -INFINITY;
    CHECK(!api__tensor_writable(x, n, API_ENCODE_NEG_INF_TOKEN, pool, &bad_a));
    CHECK_EQ_INT(bad_a, 2 * RAW_ELEMS);
    x[2 * RAW_ELEMS] = 3.4e38f; /* finite, but not as bf16 */
    CHECK(api__tensor_writable(x, n, API_ENCODE_NEG_INF_TOKEN, pool, &bad_a));
    CHECK(!api__tensor_writable(x, n, API_ENCODE_BF16 | API_ENCODE_NEG_INF_TOKEN, pool, &bad_a));
    CHECK_EQ_INT(bad_a, 2 * RAW_ELEMS);
    int64_t shape = (int64_t)n;
    encodes_alike(x, 1, &shape, API_FORM_BASE64, API_ENCODE_BF16 | API_ENCODE_NEG_INF_TOKEN);
    free(x);
}

int main(void)
{
    eng_error err;
    pool = eng_pool_new(2, &err);
    if (!pool) {
        printf("FAIL no pool: %s\n0 passed, 1 failed\n", err.message);
        return 1;
    }
    RUN(test_small_work_or_no_pool_is_left_to_the_caller);
    RUN(test_large_work_is_done_in_pieces_of_a_grain);
    RUN(test_base64_decodes_alike_at_every_boundary);
    RUN(test_float16_base64_widens_alike);
    RUN(test_raw_bytes_convert_alike_at_every_boundary);
    RUN(test_raw_bytes_checked_in_place_alike);
    RUN(test_json_numbers_decode_alike_at_every_boundary);
    RUN(test_json_integers_decode_alike);
    RUN(test_text_encodes_alike_at_every_boundary);
    RUN(test_bytes_encode_alike_at_every_boundary);
    RUN(test_the_first_unwritable_value_is_found_wherever_it_lies);
    eng_pool_free(pool);
    return check_report();
}
