/*
 * tensor_encode.c - tensors into replies (tensor.h): a float buffer with a shape written as
 * nested arrays, {shape, data}, {shape, dtype, base64} or raw little-endian bytes.
 *
 * Every value is checked before anything is written, since a reply must never be a silently
 * shortened array. A large tensor is checked and written by the pool's workers in pieces
 * (chunks.h). Base64 and raw bytes have fixed places; text does not, so each piece of text is
 * written where the most text of the elements before it could end (API_FLOAT_MAX_CHARS per
 * element with its comma, one character per bracket), inside the room that the reply's bound
 * reserved anyway, and the pieces are then moved together in order: the same bytes one thread
 * writes, with no second buffer.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "api/core/memory.h"
#include "api/wire/base64.h"
#include "api/wire/chunks.h"
#include "api/wire/tensor.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "tensor bytes are little-endian on the wire and are copied as they are");

/* Elements per pool task when checking, copying or converting values: a megabyte of float32. */
#define VALUE_TASK_ELEMS ((size_t)1 << 18)

/* Elements per pool task when writing text: about half a millisecond of formatting. */
#define TEXT_TASK_ELEMS ((size_t)1 << 14)

/* Bytes per pool task when encoding float32 base64: 3 * 2^18, so each task's text (2^20
 * characters) starts on a group boundary. */
#define B64_TASK_BYTES ((size_t)3 << 18)

/* bfloat16 values per pool task in base64, and per step through a stack buffer: multiples of 3
 * (6 bytes are 8 characters), so every step starts on a group boundary. */
#define BF16_TASK_ELEMS ((size_t)3 << 17)
#define BF16_STEP       1536

size_t api__tensor_encoded_bound(api__form form, int rank, const int64_t *shape, size_t count)
{
    /* {"shape":[...], with each dimension at most 20 digits and a comma. */
    size_t header = 64 + (size_t)rank * 21;
    switch (form) {
    case API_FORM_NESTED: {
        /* Every array costs its brackets and the comma after it. */
        size_t arrays = 0, outer = 1;
        for (int d = 0; d < rank; d++) {
            arrays = api__size_add_sat(arrays, outer);
            outer = api__size_mul_sat(outer, (size_t)shape[d]);
        }
        return api__size_add_sat(api__size_mul_sat(count, API_FLOAT_MAX_CHARS),
                                 api__size_add_sat(api__size_mul_sat(arrays, 3), 16));
    }
    case API_FORM_FLAT:
        return api__size_add_sat(api__size_mul_sat(count, API_FLOAT_MAX_CHARS), header);
    case API_FORM_BASE64:
        if (count > SIZE_MAX / 8)
            return SIZE_MAX;
        return api__size_add_sat(api__base64_encoded_len(count * 4), header + 32);
    case API_FORM_RAW:
        return api__size_mul_sat(count, 4);
    }
    return SIZE_MAX;
}

/* The value as the reply will hold it: rounded to bfloat16 with API_ENCODE_BF16. */
static float as_written(float v, unsigned flags)
{
    return flags & API_ENCODE_BF16 ? eng_bf16_to_f32(eng_f32_to_bf16(v)) : v;
}

/* What is being encoded: count values of data, written as `flags` say. */
typedef struct {
    const float *data;
    size_t count;
    unsigned flags;
    eng_pool *pool;
} values;

/* ---- The check ---------------------------------------------------------------------------- */

/* The first index in [from, to) whose value cannot be written with `flags`, or `to`. Without
 * bf16 rounding, whole blocks of finite values are passed at once. */
static size_t first_unwritable(const float *data, size_t from, size_t to, unsigned flags)
{
    bool neg_inf_ok = (flags & (API_ENCODE_NEG_INF_NULL | API_ENCODE_NEG_INF_TOKEN)) != 0;
    bool bf16 = (flags & API_ENCODE_BF16) != 0;
    for (size_t i = from; i < to; i++) {
        if (!bf16 && (i - from) % API_FINITE_BLOCK == 0 && to - i >= API_FINITE_BLOCK &&
            api__f32_block_finite(data + i)) {
            i += API_FINITE_BLOCK - 1;
            continue;
        }
        float v = as_written(data[i], flags);
        if (!isfinite(v) && !(neg_inf_ok && v == -INFINITY))
            return i;
    }
    return to;
}

static bool writable_piece(void *arg, size_t from, size_t to)
{
    const values *v = arg;
    return first_unwritable(v->data, from, to, v->flags) == to;
}

bool api__tensor_writable(const float *data, size_t count, unsigned flags, eng_pool *pool,
                          size_t *bad_index)
{
    values v = {data, count, flags, pool};
    if (api__chunks_run(pool, count, VALUE_TASK_ELEMS, writable_piece, &v))
        return true;
    *bad_index = first_unwritable(data, 0, count, flags);
    return *bad_index == count;
}

/* ---- Text --------------------------------------------------------------------------------- */

/* Numbers as text: nested arrays of `dims` = rank dimensions, or (dims 0) the bare list of
 * {"shape", "data"} and of v2, whose brackets the caller writes. */
typedef struct {
    const values *v;
    int dims;
    const int64_t *shape;
    char *base;   /* where the text starts */
    size_t *lens; /* per piece: the characters it wrote */
} text_job;

/* The most characters elements [0, e) can take: 16 each with a comma, and one per bracket of
 * the arrays opened and closed before e. Where a piece that starts at e writes. */
static size_t text_room(const text_job *job, size_t e)
{
    size_t room = e * API_FLOAT_MAX_CHARS, span = job->v->count; /* elements per array */
    for (int d = 0; d < job->dims; d++) {
        room += (e + span - 1) / span + e / span;
        span /= (size_t)job->shape[d];
    }
    return room;
}

/* Writes elements [from, to) at p: each after a comma (but the first of all), opening the
 * arrays whose first element it is and closing those whose last it is. Returns the length. */
static size_t text_range(const text_job *job, char *p, size_t from, size_t to)
{
    const float *data = job->v->data;
    const unsigned flags = job->v->flags;
    char *start = p;
    size_t idx[API_MAX_RANK] = {0}, rest = from;
    for (int d = job->dims - 1; d >= 0; d--) {
        idx[d] = rest % (size_t)job->shape[d];
        rest /= (size_t)job->shape[d];
    }
    for (size_t i = from; i < to; i++) {
        if (i > 0)
            *p++ = ',';
        for (int d = job->dims - 1; d >= 0 && idx[d] == 0; d--)
            *p++ = '[';
        float v = as_written(data[i], flags);
        if ((flags & API_ENCODE_NEG_INF_NULL) && v == -INFINITY) {
            memcpy(p, "null", 4);
            p += 4;
        } else if ((flags & API_ENCODE_NEG_INF_TOKEN) && v == -INFINITY) {
            memcpy(p, "-Infinity", 9);
            p += 9;
        } else {
            p += api__float_format(v, p);
        }
        for (int d = job->dims - 1; d >= 0; d--) {
            if (++idx[d] < (size_t)job->shape[d])
                break;
            idx[d] = 0;
            *p++ = ']';
        }
    }
    return (size_t)(p - start);
}

static bool text_piece(void *arg, size_t from, size_t to)
{
    text_job *job = arg;
    job->lens[from / TEXT_TASK_ELEMS] = text_range(job, job->base + text_room(job, from), from, to);
    return true;
}

static void write_text(api_buf *w, const values *v, int dims, const int64_t *shape)
{
    text_job job = {v, dims, shape, NULL, NULL};
    job.base = api_buf_reserve(w, text_room(&job, v->count));
    if (!job.base)
        return;
    size_t pieces = (v->count - 1) / TEXT_TASK_ELEMS + 1, len = 0;
    job.lens = v->pool && pieces > 1 ? malloc(pieces * sizeof *job.lens) : NULL;
    if (job.lens && api__chunks_run(v->pool, v->count, TEXT_TASK_ELEMS, text_piece, &job)) {
        for (size_t p = 0; p < pieces; p++) {
            memmove(job.base + len, job.base + text_room(&job, p * TEXT_TASK_ELEMS), job.lens[p]);
            len += job.lens[p];
        }
    } else {
        len = text_range(&job, job.base, 0, v->count);
    }
    free(job.lens);
    w->len += len;
}

/* ---- Bytes -------------------------------------------------------------------------------- */

typedef struct {
    const values *v;
    char *dst;
} bytes_job;

static bool f32_base64_piece(void *arg, size_t from, size_t to)
{
    const bytes_job *job = arg;
    api__base64_encode((const uint8_t *)job->v->data + from, to - from, job->dst + from / 3 * 4);
    return true;
}

static bool bf16_base64_piece(void *arg, size_t from, size_t to)
{
    const bytes_job *job = arg;
    uint16_t h[BF16_STEP];
    for (size_t i = from; i < to; i += BF16_STEP) {
        size_t n = to - i < BF16_STEP ? to - i : BF16_STEP;
        for (size_t k = 0; k < n; k++)
            h[k] = eng_f32_to_bf16(job->v->data[i + k]);
        api__base64_encode(h, n * 2, job->dst + i * 2 / 3 * 4);
    }
    return true;
}

static bool f32_raw_piece(void *arg, size_t from, size_t to)
{
    const bytes_job *job = arg;
    memcpy(job->dst + from * 4, job->v->data + from, (to - from) * 4);
    return true;
}

static bool bf16_raw_piece(void *arg, size_t from, size_t to)
{
    const bytes_job *job = arg;
    for (size_t i = from; i < to; i++) {
        uint16_t h = eng_f32_to_bf16(job->v->data[i]);
        memcpy(job->dst + i * 2, &h, 2);
    }
    return true;
}

/* Appends `len` bytes made by fn over the units [0, n), in pieces of `grain` on the pool when
 * they are many. */
typedef struct {
    size_t len, n, grain;
    api__chunk_fn fn;
} bytes_plan;

static void write_bytes(api_buf *w, const values *v, const bytes_plan *plan)
{
    bytes_job job = {v, api_buf_reserve(w, plan->len)};
    if (!job.dst)
        return;
    if (!api__chunks_run(v->pool, plan->n, plan->grain, plan->fn, &job))
        plan->fn(&job, 0, plan->n);
    w->len += plan->len;
}

static void write_base64(api_buf *w, const values *v)
{
    bool bf16 = (v->flags & API_ENCODE_BF16) != 0;
    size_t bytes = v->count * (bf16 ? 2 : 4);
    bytes_plan plan = {api__base64_encoded_len(bytes), bf16 ? v->count : bytes,
                       bf16 ? BF16_TASK_ELEMS : B64_TASK_BYTES,
                       bf16 ? bf16_base64_piece : f32_base64_piece};
    write_bytes(w, v, &plan);
}

static void write_raw(api_buf *w, const values *v)
{
    bool bf16 = (v->flags & API_ENCODE_BF16) != 0;
    bytes_plan plan = {v->count * (bf16 ? 2 : 4), v->count, VALUE_TASK_ELEMS,
                       bf16 ? bf16_raw_piece : f32_raw_piece};
    write_bytes(w, v, &plan);
}

/* ---- The forms ---------------------------------------------------------------------------- */

static void write_shape(api_buf *w, int rank, const int64_t *shape)
{
    api_buf_cstr(w, "{\"shape\":[");
    for (int d = 0; d < rank; d++) {
        if (d > 0)
            api_buf_char(w, ',');
        api_buf_int(w, shape[d]);
    }
    api_buf_char(w, ']');
}

api__encode_status api__tensor_encode(api_buf *w, const float *data, int rank, const int64_t *shape,
                                      api__form form, unsigned flags, eng_pool *pool,
                                      size_t *bad_index)
{
    size_t count = 1;
    for (int d = 0; d < rank; d++)
        count *= (size_t)shape[d];
    if (!api__tensor_writable(data, count, flags, pool, bad_index))
        return API_ENCODE_NONFINITE;
    values v = {data, count, flags, pool};
    switch (form) {
    case API_FORM_NESTED:
        write_text(w, &v, rank, shape);
        break;
    case API_FORM_FLAT:
        write_shape(w, rank, shape);
        api_buf_cstr(w, ",\"data\":[");
        write_text(w, &v, 0, shape);
        api_buf_cstr(w, "]}");
        break;
    case API_FORM_BASE64:
        write_shape(w, rank, shape);
        api_buf_cstr(w, flags & API_ENCODE_BF16 ? ",\"dtype\":\"bfloat16\",\"base64\":\""
                                                : ",\"dtype\":\"float32\",\"base64\":\"");
        write_base64(w, &v);
        api_buf_cstr(w, "\"}");
        break;
    case API_FORM_RAW: /* little-endian, as in memory */
        write_raw(w, &v);
        break;
    }
    return w->state == API_BUF_OK ? API_ENCODE_OK : API_ENCODE_FULL;
}

int api__tensor_nonfinite_result(api__error *err, const char *name, const float *data, size_t index,
                                 int rank, const int64_t *shape)
{
    char idx[128];
    return api__error_invalid(err, name,
                              "the result %s%s is %s: it does not fit in float32 (inputs too "
                              "large for float32 arithmetic?)",
                              name, api__index_format(idx, sizeof idx, index, rank, shape, rank),
                              isnan(data[index]) ? "NaN" : "infinite");
}
