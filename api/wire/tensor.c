/*
 * tensor.c - tensors from requests: nested arrays, {shape, data}, {shape, dtype, base64} and
 * raw bytes (their encoding into replies is tensor_encode.c's).
 *
 * Decoding runs in two steps so that nothing is allocated for a request that is going to be
 * refused: api__tensor_probe reads a tensor's form, dtype and claimed shape (a few nodes of the
 * tree), the route checks shapes against each other and against its limits and memory budget,
 * and only then api__tensor_decode writes every value, checked, into a buffer the route
 * allocated (64-byte aligned for the engine). Base64 is decoded straight into that buffer
 * (float32 and bool) or through a small stack buffer (float16 and bfloat16 are widened). Large
 * base64, raw and JSON-number tensors are decoded in pieces by the pool's workers (chunks.h).
 *
 * The host must be little-endian, like the wire format of base64 and binary tensors.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/core/memory.h"
#include "api/wire/base64.h"
#include "api/wire/chunks.h"
#include "api/wire/tensor.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "tensor bytes are little-endian on the wire and are copied as they are");

/* Doubles of at least this magnitude round to infinity as float32: the midpoint between
 * FLT_MAX and 2^128 (ties go to even, and FLT_MAX's mantissa is odd). */
#define FLOAT32_OVERFLOW 0x1.ffffffp127

const char *api__dtype_name(api__dtype dtype)
{
    switch (dtype) {
#define API_DTYPE_NAME(name, text, size)                                                           \
    case name:                                                                                     \
        return text;
        API_DTYPE_LIST(API_DTYPE_NAME)
#undef API_DTYPE_NAME
    }
    return "unknown";
}

size_t api__dtype_size(api__dtype dtype)
{
    switch (dtype) {
#define API_DTYPE_SIZE(name, text, size)                                                           \
    case name:                                                                                     \
        return size;
        API_DTYPE_LIST(API_DTYPE_SIZE)
#undef API_DTYPE_SIZE
    }
    return 0;
}

static bool dtype_parse(const char *s, size_t n, api__dtype *out)
{
    static const api__dtype all[] = {
#define API_DTYPE_ALL(name, text, size) name,
        API_DTYPE_LIST(API_DTYPE_ALL)
#undef API_DTYPE_ALL
    };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        const char *name = api__dtype_name(all[i]);
        if (all[i] == API_DTYPE_INT32 || all[i] == API_DTYPE_INT64)
            continue; /* raw bytes only (KServe v2): the native forms take JSON integers */
        if (strlen(name) == n && memcmp(name, s, n) == 0) {
            *out = all[i];
            return true;
        }
    }
    return false;
}

/* "a string", "an object"...: for messages that say what was found instead. */
static const char *json_kind(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
    case JSON_REAL:
        return "a number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    case JSON_NULL:
        return "null";
    }
    return "something else";
}

char *api__index_format(char *buf, size_t size, size_t flat, int rank, const int64_t *shape,
                        int dims)
{
    size_t idx[API_MAX_RANK] = {0};
    for (int d = rank - 1; d >= 0; d--) {
        idx[d] = flat % (size_t)shape[d];
        flat /= (size_t)shape[d];
    }
    size_t at = 0;
    buf[0] = '\0';
    for (int d = 0; d < dims && at < size; d++) {
        int n = snprintf(buf + at, size - at, "[%zu]", idx[d]);
        if (n < 0)
            break;
        at += (size_t)n;
    }
    return buf;
}

/* json_kind, knowing what the body's placeholders stand for. */
static const char *value_kind(const api__body *b, const json_t *v)
{
    const api__body_span *sp = api__body_span_of(b, v);
    if (sp && sp->kind == API_SPAN_NUMBERS)
        return "an array";
    if (sp && sp->kind == API_SPAN_NONFINITE)
        return "a non-finite number";
    return json_kind(v);
}

/* ---- Shapes ------------------------------------------------------------------------------ */

/* The element count of shape[0..rank), or an error: 413 naming --max-elements past the limit
 * (an overflow of size_t is past it too). */
static int shape_count(const int64_t *shape, int rank, const char *field, size_t max_elements,
                       size_t *count, api__error *err)
{
    size_t n = 1;
    for (int d = 0; d < rank; d++) {
        if ((uint64_t)shape[d] > SIZE_MAX || __builtin_mul_overflow(n, (size_t)shape[d], &n) ||
            n > max_elements)
            return api__error_set(err, API_STATUS_TOO_LARGE, API_REASON_TOO_LARGE, field,
                                  "%s has more than %zu elements, the limit set by "
                                  "--max-elements",
                                  field, max_elements);
    }
    *count = n;
    return 0;
}

/* The checks of a shape's rank: at least 1, at most API_MAX_RANK. */
static int shape_rank(size_t n, const char *field, api__error *err)
{
    if (n == 0)
        return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, field,
                              "%s is empty: scalars are not tensors here, use [1]", field);
    if (n > API_MAX_RANK)
        return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, field,
                              "%s has %zu dimensions; at most %d are supported", field, n,
                              API_MAX_RANK);
    return 0;
}

int api__shape_dims(const int64_t *dims, size_t n, const char *field, size_t max_elements,
                    int64_t *shape, int *rank, size_t *count, api__error *err)
{
    char name[160];
    if (shape_rank(n, field, err) != 0)
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (dims[i] <= 0) {
            snprintf(name, sizeof name, "%s[%zu]", field, i);
            return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, name,
                                  "%s must be a positive integer, found %lld", name,
                                  (long long)dims[i]);
        }
        shape[i] = dims[i];
    }
    *rank = (int)n;
    return shape_count(shape, *rank, field, max_elements, count, err);
}

int api__shape_parse(const json_t *v, const char *field, size_t max_elements, int64_t *shape,
                     int *rank, size_t *count, api__error *err)
{
    char name[160];
    int64_t dims[API_MAX_RANK];
    if (!json_is_array(v))
        return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, field,
                              "%s must be an array of positive integers, found %s", field,
                              json_kind(v));
    size_t n = json_array_size(v);
    if (shape_rank(n, field, err) != 0)
        return -1;
    for (size_t i = 0; i < n; i++) {
        const json_t *d = json_array_get(v, i);
        snprintf(name, sizeof name, "%s[%zu]", field, i);
        if (json_is_real(d))
            return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, name,
                                  "%s must be an integer, found %.17g", name, json_real_value(d));
        if (!json_is_integer(d))
            return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, name,
                                  "%s must be a positive integer, found %s", name, json_kind(d));
        dims[i] = (int64_t)json_integer_value(d);
    }
    return api__shape_dims(dims, n, field, max_elements, shape, rank, count, err);
}

/* ---- Probe ------------------------------------------------------------------------------- */

/* The dtype of a text tensor from one of its elements. */
static int text_dtype(const api__body *b, const json_t *x, const char *where, api__dtype *dtype,
                      api__error *err)
{
    double ignored;
    if (json_is_boolean(x))
        *dtype = API_DTYPE_BOOL;
    else if (json_is_number(x) || json_is_null(x) || api__body_nonfinite(b, x, &ignored))
        *dtype = API_DTYPE_FLOAT32;
    else
        return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, where,
                              "%s must be a number or a boolean, found %s", where, json_kind(x));
    return 0;
}

static int probe_nested(const api__body *b, const json_t *v, const char *field, size_t max_elements,
                        api__tensor *t, api__error *err)
{
    char where[192];
    const json_t *cur = v;
    int rank = 0;
    snprintf(where, sizeof where, "%s", field);
    while (json_is_array(cur)) {
        if (rank == API_MAX_RANK)
            return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, field,
                                  "%s is nested more than %d levels deep", field, API_MAX_RANK);
        size_t n = json_array_size(cur);
        if (n == 0)
            return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, where,
                                  "%s is an empty array: every dimension must be positive", where);
        t->shape[rank++] = (int64_t)n;
        cur = json_array_get(cur, 0);
        size_t used = strlen(where);
        snprintf(where + used, sizeof where - used, "[0]");
    }
    t->form = API_FORM_NESTED;
    t->rank = rank;
    t->items = v;
    if (text_dtype(b, cur, where, &t->dtype, err) != 0)
        return -1;
    return shape_count(t->shape, rank, field, max_elements, &t->count, err);
}

/* A "dtype" given with "data" must say what the data holds. */
static int dtype_match(api__dtype given, api__dtype found, const char *field, api__error *err)
{
    char name[160];
    if (given == found)
        return 0;
    snprintf(name, sizeof name, "%s.dtype", field);
    if (given == API_DTYPE_FLOAT16 || given == API_DTYPE_BFLOAT16)
        return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, name,
                              "%s \"%s\" applies to base64 data; \"data\" holds JSON numbers, "
                              "read as float32",
                              name, api__dtype_name(given));
    return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, name,
                          "%s is \"%s\" but \"data\" holds %s", name, api__dtype_name(given),
                          found == API_DTYPE_BOOL ? "booleans" : "numbers");
}

static int probe_object(const api__body *b, const json_t *v, const char *field, size_t max_elements,
                        api__tensor *t, api__error *err)
{
    char name[160];
    const json_t *shape = NULL, *data = NULL, *dtype = NULL, *b64 = NULL;
    const char *key;
    json_t *val;

    json_object_foreach((json_t *)v, key, val)
    {
        if (strcmp(key, "shape") == 0)
            shape = val;
        else if (strcmp(key, "data") == 0)
            data = val;
        else if (strcmp(key, "dtype") == 0)
            dtype = val;
        else if (strcmp(key, "base64") == 0)
            b64 = val;
        else {
            snprintf(name, sizeof name, "%s.%s", field, key);
            return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, name,
                                  "unknown key \"%.40s\" in tensor %s: a tensor object has "
                                  "\"shape\" and either \"data\" or \"dtype\" and \"base64\"",
                                  key, field);
        }
    }
    snprintf(name, sizeof name, "%s.shape", field);
    if (!shape)
        return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, name,
                              "%s is missing: a tensor object needs a shape", name);
    const api__body_span *shape_span = api__body_span_of(b, shape);
    if (shape_span && shape_span->kind == API_SPAN_NUMBERS)
        return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, name,
                              "%s has %zu dimensions; at most %d are supported", name,
                              shape_span->count, API_MAX_RANK);
    if (api__shape_parse(shape, name, max_elements, t->shape, &t->rank, &t->count, err) != 0)
        return -1;
    if (data && b64)
        return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, field,
                              "%s has both \"data\" and \"base64\"; give one", field);
    if (!data && !b64)
        return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, field,
                              "%s needs \"data\" (numbers) or \"base64\" (with \"dtype\")", field);

    bool dtype_given = dtype != NULL;
    snprintf(name, sizeof name, "%s.dtype", field);
    if (dtype_given) {
        const char *s;
        size_t n;
        if (!api__body_string_get(b, dtype, &s, &n) || !dtype_parse(s, n, &t->dtype))
            return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, name,
                                  "%s must be one of \"float32\", \"float16\", \"bfloat16\", "
                                  "\"bool\"",
                                  name);
    }

    if (b64) {
        t->form = API_FORM_BASE64;
        if (!dtype_given)
            return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, name,
                                  "%s is missing: base64 data needs a dtype (\"float32\", "
                                  "\"float16\", \"bfloat16\" or \"bool\")",
                                  name);
        snprintf(name, sizeof name, "%s.base64", field);
        if (!api__body_string_get(b, b64, &t->b64, &t->b64_len))
            return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, name,
                                  "%s must be a string, found %s", name, value_kind(b, b64));
        return 0;
    }

    t->form = API_FORM_FLAT;
    t->items = data;
    api__dtype given = t->dtype;
    snprintf(name, sizeof name, "%s.data", field);
    const api__body_span *sp = api__body_span_of(b, data);
    if (sp && sp->kind == API_SPAN_NUMBERS) {
        /* Numbers read in place by the body's scanner, which checked their grammar. */
        t->items = NULL;
        t->numbers = sp;
        t->dtype = API_DTYPE_FLOAT32;
        if (sp->count != t->count)
            return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, name,
                                  "%s has %zu elements but the shape holds %zu", name,
                                  (size_t)sp->shape[0], t->count);
        if (sp->rank != 1) {
            snprintf(name, sizeof name, "%s.data[0]", field);
            return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, name,
                                  "%s is an array: \"data\" is flat, in row-major order", name);
        }
        return dtype_given ? dtype_match(given, t->dtype, field, err) : 0;
    }
    if (!json_is_array(data))
        return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, name,
                              "%s must be a flat array of numbers, found %s", name,
                              json_kind(data));
    size_t n = json_array_size(data);
    if (n != t->count)
        return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, name,
                              "%s has %zu elements but the shape holds %zu", name, n, t->count);
    snprintf(name, sizeof name, "%s.data[0]", field);
    const json_t *first = json_array_get(data, 0);
    if (json_is_array(first))
        return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, name,
                              "%s is an array: \"data\" is flat, in row-major order", name);
    if (text_dtype(b, first, name, &t->dtype, err) != 0)
        return -1;
    return dtype_given ? dtype_match(given, t->dtype, field, err) : 0;
}

int api__tensor_probe(const api__body *b, const json_t *v, const char *field, size_t max_elements,
                      api__tensor *t, api__error *err)
{
    memset(t, 0, sizeof *t);
    t->present = true;
    const api__body_span *sp = api__body_span_of(b, v);
    if (sp && sp->kind == API_SPAN_NUMBERS) {
        /* Nested arrays of numbers, checked (grammar, rectangular) by the body's scanner. */
        t->form = API_FORM_NESTED;
        t->dtype = API_DTYPE_FLOAT32;
        t->numbers = sp;
        t->rank = sp->rank;
        memcpy(t->shape, sp->shape, sizeof t->shape);
        return shape_count(t->shape, t->rank, field, max_elements, &t->count, err);
    }
    if (json_is_array(v))
        return probe_nested(b, v, field, max_elements, t, err);
    if (json_is_object(v))
        return probe_object(b, v, field, max_elements, t, err);
    return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, field,
                          "%s must be a tensor (nested arrays, {\"shape\", \"data\"} or "
                          "{\"shape\", \"dtype\", \"base64\"}), found %s",
                          field, value_kind(b, v));
}

/* ---- Decode: text forms ------------------------------------------------------------------ */

/* Where decoding is, for messages: the tensor, its field name, and how to name element i. */
typedef struct {
    const api__tensor *t;
    const char *field;
    api__elem elem;
    unsigned flags;
    void *dst;
    api__error *err;
    const api__body *body; /* for the NaN, Infinity and -Infinity tokens it holds */
} decode_ctx;

/* The name of element (or sub-array at depth `dims`) whose first element is flat index i. */
static const char *element_name(const decode_ctx *c, size_t i, int dims, char *buf, size_t size)
{
    char idx[128];
    if (c->t->form == API_FORM_NESTED)
        snprintf(buf, size, "%s%s", c->field,
                 api__index_format(idx, sizeof idx, i, c->t->rank, c->t->shape, dims));
    else
        snprintf(buf, size, "%s.data[%zu]", c->field, i);
    return buf;
}

static int decode_leaf(const decode_ctx *c, const json_t *x, size_t i)
{
    char name[192];
    switch (c->elem) {
    case API_ELEM_FLOAT: {
        double v;
        bool neg_inf_ok = (c->flags & API_DECODE_NEG_INF) != 0, token = false;
        if (json_is_real(x))
            v = json_real_value(x);
        else if (json_is_integer(x))
            v = (double)json_integer_value(x);
        else if (json_is_null(x) && neg_inf_ok)
            v = -INFINITY;
        else if (!(token = api__body_nonfinite(c->body, x, &v)))
            return api__error_set(c->err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST,
                                  element_name(c, i, c->t->rank, name, sizeof name),
                                  "%s must be a number%s, found %s", name,
                                  neg_inf_ok ? " or -Infinity (or null)" : "",
                                  value_kind(c->body, x));
        if (v == -INFINITY && neg_inf_ok) {
            ((float *)c->dst)[i] = -INFINITY;
            return 0;
        }
        if (token)
            return api__error_set(c->err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST,
                                  element_name(c, i, c->t->rank, name, sizeof name),
                                  "%s is %s; values must be finite%s", name,
                                  isnan(v) ? "NaN" : (v < 0 ? "-Infinity" : "Infinity"),
                                  neg_inf_ok ? " or -Infinity" : "");
        if (!(fabs(v) < FLOAT32_OVERFLOW))
            return api__error_set(c->err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST,
                                  element_name(c, i, c->t->rank, name, sizeof name),
                                  "%s is %g, beyond the float32 range (+-3.40282347e38)", name, v);
        ((float *)c->dst)[i] = (float)v;
        return 0;
    }
    case API_ELEM_BOOL:
        if (!json_is_boolean(x))
            return api__error_set(c->err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST,
                                  element_name(c, i, c->t->rank, name, sizeof name),
                                  "%s must be true or false, found %s (boolean masks do not "
                                  "take 0/1 numbers)",
                                  name, value_kind(c->body, x));
        ((uint8_t *)c->dst)[i] = json_is_true(x) ? 1 : 0;
        return 0;
    case API_ELEM_INT64:
        if (!json_is_integer(x))
            return api__error_set(c->err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST,
                                  element_name(c, i, c->t->rank, name, sizeof name),
                                  "%s must be an integer, found %s", name, value_kind(c->body, x));
        ((int64_t *)c->dst)[i] = (int64_t)json_integer_value(x);
        return 0;
    case API_ELEM_BF16: /* defensive: api__tensor_decode refuses the text forms for it */
        break;
    }
    return -1;
}

/* Array `a` at depth `dim`, whose first element has flat index *pos. */
static int decode_nested(const decode_ctx *c, const json_t *a, int dim, size_t *pos)
{
    char name[192];
    const api__tensor *t = c->t;
    size_t n = (size_t)t->shape[dim];
    if (!json_is_array(a) || json_array_size(a) != n) {
        element_name(c, *pos, dim, name, sizeof name);
        if (!json_is_array(a))
            return api__error_set(c->err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, name,
                                  "%s must be an array of %zu, found %s (nested arrays must be "
                                  "rectangular)",
                                  name, n, json_kind(a));
        return api__error_set(c->err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, name,
                              "%s has %zu elements where the first array at its depth has %zu "
                              "(nested arrays must be rectangular)",
                              name, json_array_size(a), n);
    }
    if (dim == t->rank - 1) {
        for (size_t i = 0; i < n; i++) {
            const json_t *x = json_array_get(a, i);
            if (json_is_array(x))
                return api__error_set(c->err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST,
                                      element_name(c, *pos, t->rank, name, sizeof name),
                                      "%s is an array, but %s has %d dimensions (nested arrays "
                                      "must be rectangular)",
                                      name, c->field, t->rank);
            if (decode_leaf(c, x, (*pos)++) != 0)
                return -1;
        }
        return 0;
    }
    for (size_t i = 0; i < n; i++)
        if (decode_nested(c, json_array_get(a, i), dim + 1, pos) != 0)
            return -1;
    return 0;
}

static int decode_flat(const decode_ctx *c)
{
    for (size_t i = 0; i < c->t->count; i++)
        if (decode_leaf(c, json_array_get(c->t->items, i), i) != 0)
            return -1;
    return 0;
}

/* ---- Decode: binary ---------------------------------------------------------------------- */

static int nonfinite_error(const char *field, size_t index, float v, api__error *err)
{
    return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, field,
                          "%s element %zu is %s; values must be finite", field, index,
                          isnan(v) ? "NaN" : (v < 0 ? "-inf" : "inf"));
}

bool api__f32_block_finite(const void *bytes)
{
    const uint8_t *s = bytes;
    uint32_t inf_or_nan = 0;
    for (size_t i = 0; i < API_FINITE_BLOCK; i++) {
        uint32_t u;
        memcpy(&u, s + 4 * i, 4);
        inf_or_nan |= (uint32_t)((u & 0x7F800000u) == 0x7F800000u);
    }
    return inf_or_nan == 0;
}

size_t api__elem_size(api__elem elem)
{
    switch (elem) {
    case API_ELEM_FLOAT:
        return sizeof(float);
    case API_ELEM_BOOL:
        return 1;
    case API_ELEM_INT64:
        return sizeof(int64_t);
    case API_ELEM_BF16:
        return sizeof(uint16_t);
    }
    return 0;
}

int api__tensor_convert(const api__raw_elems *in, api__elem elem, unsigned flags, void *dst,
                        const char *field, api__error *err)
{
    const void *src = in->data;
    const api__dtype dtype = in->dtype;
    const size_t count = in->count, first = in->first;
    bool neg_inf_ok = (flags & API_DECODE_NEG_INF) != 0;
    if (elem == API_ELEM_BOOL) {
        if (dtype != API_DTYPE_BOOL)
            return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, field,
                                  "%s must be booleans (dtype \"bool\"), found dtype \"%s\"", field,
                                  api__dtype_name(dtype));
        const uint8_t *s = src;
        for (size_t i = 0; i < count; i++)
            if (s[i] > 1)
                return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST,
                                      field, "%s byte %zu is %u; a bool tensor holds bytes 0 and 1",
                                      field, first + i, (unsigned)s[i]);
        if (dst != src)
            memcpy(dst, src, count);
        return 0;
    }
    if (elem == API_ELEM_INT64 && (dtype == API_DTYPE_INT64 || dtype == API_DTYPE_INT32)) {
        const uint8_t *s = src;
        for (size_t i = 0; dst != src && i < count; i++) {
            int64_t v;
            if (dtype == API_DTYPE_INT64) {
                memcpy(&v, s + 8 * i, 8);
            } else {
                int32_t v32;
                memcpy(&v32, s + 4 * i, 4);
                v = v32;
            }
            ((int64_t *)dst)[i] = v;
        }
        return 0;
    }
    if (elem == API_ELEM_BF16 && dtype == API_DTYPE_BFLOAT16) {
        const uint8_t *s = src;
        for (size_t i = 0; i < count; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            if ((h & 0x7F80u) == 0x7F80u && !(neg_inf_ok && h == 0xFF80u))
                return nonfinite_error(field, first + i, eng_bf16_to_f32(h), err);
        }
        if (dst != src)
            memcpy(dst, src, 2 * count);
        return 0;
    }
    if (elem == API_ELEM_BF16)
        return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, field,
                              "%s must hold bfloat16 values here, found dtype \"%s\"", field,
                              api__dtype_name(dtype));
    if (elem != API_ELEM_FLOAT || dtype == API_DTYPE_BOOL || dtype == API_DTYPE_INT32 ||
        dtype == API_DTYPE_INT64)
        return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, field,
                              "%s must hold %s, found dtype \"%s\"", field,
                              elem == API_ELEM_INT64 ? "integers as JSON numbers" : "numbers",
                              api__dtype_name(dtype));
    float *d = dst;
    const uint8_t *s = src;
    for (size_t i = 0; i < count; i++) {
        /* Whole float32 blocks without a non-finite value are copied (in place: only checked)
         * at once; the element loop finds which value of a block stops it. */
        if (dtype == API_DTYPE_FLOAT32 && i % API_FINITE_BLOCK == 0 &&
            count - i >= API_FINITE_BLOCK && api__f32_block_finite(s + 4 * i)) {
            if (dst != src)
                memcpy(d + i, s + 4 * i, 4 * API_FINITE_BLOCK);
            i += API_FINITE_BLOCK - 1;
            continue;
        }
        float v;
        if (dtype == API_DTYPE_FLOAT32) {
            memcpy(&v, s + 4 * i, 4);
        } else {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            v = dtype == API_DTYPE_FLOAT16 ? eng_f16_to_f32(h) : eng_bf16_to_f32(h);
        }
        if (!isfinite(v) && !(neg_inf_ok && v == -INFINITY))
            return nonfinite_error(field, first + i, v, err);
        if (dst != src)
            d[i] = v;
    }
    return 0;
}

static int b64_error(const char *field, const char *src, api__b64_status st, size_t at,
                     api__error *err)
{
    unsigned char c = (unsigned char)src[at];
    switch (st) {
    case API_B64_BAD_LENGTH:
        return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, field,
                              "%s has %zu characters, not a valid base64 length", field, at);
    case API_B64_BAD_CHAR:
        if (c == '=')
            return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, field,
                                  "%s has '=' padding at offset %zu, before its end", field, at);
        if (c > 0x20 && c < 0x7F)
            return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, field,
                                  "%s has the character '%c' at offset %zu; base64 uses "
                                  "A-Z a-z 0-9 + / and '=' padding",
                                  field, c, at);
        return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, field,
                              "%s has the byte 0x%02x at offset %zu; base64 uses A-Z a-z 0-9 "
                              "+ / and '=' padding (no whitespace)",
                              field, (unsigned)c, at);
    case API_B64_BAD_PADDING:
        return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, field,
                              "%s does not end canonically: the unused bits of its last "
                              "character (offset %zu) must be zero",
                              field, at);
    case API_B64_OK:
        break;
    }
    return 0;
}

/* Base64 characters per step when widening: 4096 characters = 3072 bytes = 1536 halves, so
 * steps end on group and element boundaries. */
#define B64_STEP_CHARS 4096

/* Characters per pool task: a multiple of 16, so that every task starts on a group and an
 * element boundary (16 characters are 12 bytes: 3 float32s or 6 halves). */
#define B64_TASK_CHARS ((size_t)1 << 20)

/* Decodes characters [at, at + n) of t's base64, a whole number of groups starting on an
 * element boundary, into the elements they hold. Padding may only end the whole string. */
static int decode_base64_range(const api__tensor *t, size_t at, size_t n, api__elem elem,
                               unsigned flags, void *dst, const char *name, api__error *err)
{
    size_t esize = api__dtype_size(t->dtype), got, bad;
    size_t first = at / 4 * 3 / esize; /* the element index of character `at` */
    bool last = at + n == t->b64_len;
    api__b64_status st;
    if (esize == 4 || esize == 1 || elem == API_ELEM_BF16) {
        /* float32, bool and bfloat16 kept as such have the width of the destination: decode
         * in place, then check. */
        uint8_t *d = (uint8_t *)dst + first * esize;
        st = api__base64_decode(t->b64 + at, n, d, &got, &bad);
        if (st != API_B64_OK)
            return b64_error(name, t->b64, st, at + bad, err);
        if (!last && got != n / 4 * 3)
            goto inner_padding;
        api__raw_elems decoded = {d, t->dtype, got / esize, first};
        return api__tensor_convert(&decoded, elem, flags, d, name, err);
    }
    uint8_t buf[B64_STEP_CHARS / 4 * 3];
    for (size_t end = at + n; at < end; at += B64_STEP_CHARS) {
        size_t m = end - at < B64_STEP_CHARS ? end - at : B64_STEP_CHARS;
        st = api__base64_decode(t->b64 + at, m, buf, &got, &bad);
        if (st != API_B64_OK)
            return b64_error(name, t->b64, st, at + bad, err);
        if (at + m != t->b64_len && got != sizeof buf)
            goto inner_padding;
        api__raw_elems decoded = {buf, t->dtype, got / esize, first};
        if (api__tensor_convert(&decoded, elem, flags, (float *)dst + first, name, err) != 0)
            return -1;
        first += got / esize;
    }
    return 0;

inner_padding : {
    /* A group that ends in '=' before the end of the string: name the '='. */
    const char *eq = memchr(t->b64 + at, '=', n);
    return b64_error(name, t->b64, API_B64_BAD_CHAR, eq ? (size_t)(eq - t->b64) : at, err);
}
}

typedef struct {
    const api__tensor *t;
    api__elem elem;
    unsigned flags;
    void *dst;
} b64_job;

static bool decode_base64_piece(void *arg, size_t from, size_t to)
{
    const b64_job *job = arg;
    api__error ignored = {0};
    return decode_base64_range(job->t, from, to - from, job->elem, job->flags, job->dst, "",
                               &ignored) == 0;
}

static int decode_base64(const api__tensor *t, api__elem elem, unsigned flags, void *dst,
                         const char *field, eng_pool *pool, api__error *err)
{
    char name[160];
    snprintf(name, sizeof name, "%s.base64", field);
    size_t esize = api__dtype_size(t->dtype), want = t->count * esize; /* count <= 2^62 */
    size_t have = api__base64_decoded_len(t->b64, t->b64_len), bad;
    if (have != want) {
        /* A stray character (a line break, say) explains a wrong length best. */
        api__b64_status vst = api__base64_validate(t->b64, t->b64_len, &bad);
        if (vst != API_B64_OK)
            return b64_error(name, t->b64, vst, bad, err);
        return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, name,
                              "%s decodes to %zu bytes, but %zu %s elements take %zu", name, have,
                              t->count, api__dtype_name(t->dtype), want);
    }
    /* Check the element type first: nothing is decoded into a buffer of the wrong kind. */
    api__raw_elems none = {t->b64, t->dtype, 0, 0};
    if (api__tensor_convert(&none, elem, flags, dst, name, err) != 0)
        return -1;
    /* Big tensors are decoded by every worker of the pool, a megabyte of text per task. When a
     * task fails, the tensor is decoded again in order, which finds the first error and says
     * what it is: errors are rare, and their message must not depend on the schedule. */
    b64_job job = {.t = t, .elem = elem, .flags = flags, .dst = dst};
    if (api__chunks_run(pool, t->b64_len, B64_TASK_CHARS, decode_base64_piece, &job))
        return 0;
    return decode_base64_range(t, 0, t->b64_len, elem, flags, dst, name, err);
}

bool api__tensor_in_place(const api__tensor *t, api__elem elem)
{
    if (t->form != API_FORM_RAW)
        return false;
    if (elem == API_ELEM_BOOL)
        return t->dtype == API_DTYPE_BOOL;
    if (elem == API_ELEM_FLOAT)
        return t->dtype == API_DTYPE_FLOAT32 && ((uintptr_t)t->raw & (sizeof(float) - 1)) == 0;
    if (elem == API_ELEM_BF16)
        return t->dtype == API_DTYPE_BFLOAT16 && ((uintptr_t)t->raw & 1) == 0;
    return t->dtype == API_DTYPE_INT64 && ((uintptr_t)t->raw & (sizeof(int64_t) - 1)) == 0;
}

/* Raw elements per pool task: a megabyte of float32. */
#define RAW_TASK_ELEMS ((size_t)1 << 18)

typedef struct {
    const api__raw_elems *in;
    api__elem elem;
    unsigned flags;
    void *dst; /* in->data: checked in place */
} convert_job;

static bool convert_piece(void *arg, size_t from, size_t to)
{
    const convert_job *job = arg;
    const api__raw_elems *in = job->in;
    const uint8_t *src = (const uint8_t *)in->data + from * api__dtype_size(in->dtype);
    api__raw_elems part = {src, in->dtype, to - from, in->first + from};
    void *dst = job->dst == in->data ? (void *)(uintptr_t)src
                                     : (uint8_t *)job->dst + from * api__elem_size(job->elem);
    api__error ignored = {0};
    return api__tensor_convert(&part, job->elem, job->flags, dst, "", &ignored) == 0;
}

/* api__tensor_convert of all of job->in, by the pool's workers when it is large. */
static int convert_all(const convert_job *job, const char *field, eng_pool *pool, api__error *err)
{
    /* The element types first: nothing is converted into a buffer of the wrong kind. */
    api__raw_elems none = {job->in->data, job->in->dtype, 0, 0};
    if (api__tensor_convert(&none, job->elem, job->flags, job->dst, field, err) != 0)
        return -1;
    if (api__chunks_run(pool, job->in->count, RAW_TASK_ELEMS, convert_piece, (void *)job))
        return 0;
    return api__tensor_convert(job->in, job->elem, job->flags, job->dst, field, err);
}

int api__tensor_decode(const api__body *b, const api__tensor *t, api__elem elem, unsigned flags,
                       void *dst, const char *field, eng_pool *pool, api__error *err)
{
    if (t->form == API_FORM_RAW) {
        api__raw_elems raw = {t->raw, t->dtype, t->count, 0};
        convert_job job = {&raw, elem, flags, dst};
        return convert_all(&job, field, pool, err);
    }
    if (t->form == API_FORM_BASE64) {
        if (elem == API_ELEM_INT64)
            return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, field,
                                  "%s takes integers as JSON numbers (nested arrays or "
                                  "{\"shape\", \"data\"}), not base64",
                                  field);
        return decode_base64(t, elem, flags, dst, field, pool, err);
    }
    if (elem == API_ELEM_BF16) /* defensive: callers ask for it only in the binary forms */
        return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, field,
                              "%s must be bfloat16 in base64 or binary form here", field);
    if (elem == API_ELEM_BOOL && t->dtype != API_DTYPE_BOOL)
        return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, field,
                              "%s must hold booleans (true/false), found numbers", field);
    if (elem != API_ELEM_BOOL && t->dtype == API_DTYPE_BOOL)
        return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, field,
                              "%s must hold numbers, found booleans", field);
    decode_ctx c = {
        .t = t, .field = field, .elem = elem, .flags = flags, .dst = dst, .err = err, .body = b};
    if (t->numbers) {
        char why[96], name[192];
        size_t bad = 0;
        api__numbers_out out = {.dst = dst,
                                .integers = elem == API_ELEM_INT64,
                                .neg_inf_ok = (flags & API_DECODE_NEG_INF) != 0,
                                .pool = pool};
        if (api__body_numbers_decode(b, t->numbers, &out, &bad, why, sizeof why) == 0)
            return 0;
        element_name(&c, bad, t->rank, name, sizeof name);
        return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, name,
                              "%s %s", name, why);
    }
    if (t->form == API_FORM_FLAT)
        return decode_flat(&c);
    size_t pos = 0;
    return decode_nested(&c, t->items, 0, &pos);
}

/* ---- Memory ------------------------------------------------------------------------------ */

const char *api__tensor_shape_str(const api__tensor *t, char *buf, size_t size)
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
