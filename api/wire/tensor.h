/*
 * tensor.h - tensors on the wire: nested arrays, {shape, data}, {shape, dtype, base64}, or raw
 * bytes of the KServe v2 binary extension. A tensor is probed first (form, dtype, shape;
 * nothing allocated), then decoded straight into a caller's aligned buffer (or used in place),
 * and encoded from a float buffer and a shape (tensor_encode.c). Given the engine's pool, a
 * large tensor is decoded or encoded by its workers in pieces (chunks.h), with the same bytes
 * and the same first error as on one thread; a small one never leaves the calling thread.
 * Borrows the body; any thread.
 */
#ifndef ATTND_API_WIRE_TENSOR_H
#define ATTND_API_WIRE_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api/wire/body.h"
#include "api/wire/buf.h"

/* Element types on the wire. JSON numbers are FLOAT32, JSON booleans BOOL. The integer types
 * exist only as raw bytes (KServe v2 binary tensors, for kv_lengths); the native "dtype" field
 * takes the first four. */
#define API_DTYPE_LIST(X)                                                                          \
    X(API_DTYPE_FLOAT32, "float32", 4)                                                             \
    X(API_DTYPE_FLOAT16, "float16", 2)                                                             \
    X(API_DTYPE_BFLOAT16, "bfloat16", 2)                                                           \
    X(API_DTYPE_BOOL, "bool", 1)                                                                   \
    X(API_DTYPE_INT32, "int32", 4)                                                                 \
    X(API_DTYPE_INT64, "int64", 8)

typedef enum {
#define API_DTYPE_ENUM(name, text, size) name,
    API_DTYPE_LIST(API_DTYPE_ENUM)
#undef API_DTYPE_ENUM
} api__dtype;

const char *api__dtype_name(api__dtype dtype);
size_t api__dtype_size(api__dtype dtype);

typedef enum {
    API_FORM_NESTED = 0, /* [[1, 0], [0, 1]] */
    API_FORM_FLAT,       /* {"shape": [2, 2], "data": [1, 0, 0, 1]} */
    API_FORM_BASE64,     /* {"shape": [2, 2], "dtype": "float32", "base64": "..."} */
    API_FORM_RAW,        /* little-endian bytes in the body: KServe v2 binary tensor data */
} api__form;

/* What a decoder writes into the destination buffer. */
typedef enum {
    API_ELEM_FLOAT, /* float; the tensor must hold numbers */
    API_ELEM_BOOL,  /* uint8_t 0/1; the tensor must hold booleans (not 0/1 numbers: a mask's
                       polarity is easy to get wrong, and numbers suggest the HF 1 = keep one) */
    API_ELEM_INT64, /* int64_t; JSON integers in the text forms only */
    API_ELEM_BF16,  /* uint16_t bfloat16 bits as sent: a bfloat16 tensor in base64 or raw bytes
                       only (the engine reads them as they are, no float32 copy) */
} api__elem;

/* Bytes of one decoded element. */
size_t api__elem_size(api__elem elem);

/* Decode flags. */
#define API_DECODE_NEG_INF 1u /* -inf is allowed (float masks): base64 -inf, JSON null */

/* Whether the API_FINITE_BLOCK little-endian float32s at `bytes` (any alignment) are all
 * finite: a loop of fixed trip count that the compiler vectorises, so that checking values
 * keeps up with copying them; the caller looks at a block's values one by one only when it
 * says false. */
#define API_FINITE_BLOCK 64
bool api__f32_block_finite(const void *bytes);

/* A tensor found in a request: where its values are and what shape they claim. */
typedef struct {
    bool present; /* the request gave it: set by a probe (a zeroed tensor is absent) */
    api__form form;
    api__dtype dtype; /* for the text forms, from the first element */
    int rank;
    int64_t shape[API_MAX_RANK];
    size_t count;        /* product of shape, at most the max_elements given to the probe */
    const json_t *items; /* NESTED: the outer array; FLAT: the "data" array */
    const api__body_span *numbers; /* NESTED or FLAT read from the body instead of `items` */
    const char *b64;               /* BASE64: the text (in the body or in jansson's tree) */
    size_t b64_len;
    const void *raw; /* RAW: count * api__dtype_size(dtype) bytes, any alignment, borrowed */
} api__tensor;

/* Reads the form, dtype and shape of the tensor `v` (field name `field`, e.g. "query") without
 * decoding values; for nested arrays the shape comes from the first element at each depth and
 * the decoder checks that the rest match. Errors: 422 for a malformed tensor or a shape that
 * is not positive integers, 413 (--max-elements) when its element count exceeds max_elements
 * or overflows. */
int api__tensor_probe(const api__body *b, const json_t *v, const char *field, size_t max_elements,
                      api__tensor *t, api__error *err);

/* Checks the n dimensions `dims` of a shape given as numbers (gRPC's) and copies them into
 * shape[], *rank and *count: 422 for a rank of 0 or above API_MAX_RANK or a dimension that is not
 * positive (naming "<field>[i]"), 413 as api__tensor_probe for the count. */
int api__shape_dims(const int64_t *dims, size_t n, const char *field, size_t max_elements,
                    int64_t *shape, int *rank, size_t *count, api__error *err);

/* Reads a shape array ("shape" of the flat and base64 forms, or a KServe v2 "shape") into
 * shape[], *rank and *count with the same checks as api__tensor_probe (api__shape_dims once its
 * elements are integers). */
int api__shape_parse(const json_t *v, const char *field, size_t max_elements, int64_t *shape,
                     int *rank, size_t *count, api__error *err);

/* Whether tensor `t` can be used where it is, as `elem` elements, without a decoded copy: raw
 * bytes of the destination's type, aligned for it (float32 on a 4-byte boundary, bfloat16 on
 * a 2-byte one, bool). */
bool api__tensor_in_place(const api__tensor *t, api__elem elem);

/* Decodes tensor `t` into dst: t->count elements of the type `elem` says, contiguous row-major
 * (a RAW tensor that api__tensor_in_place allows may be checked where it lies: dst = t->raw).
 * Checks every value: numbers finite as float32 (after narrowing; -inf too with
 * API_DECODE_NEG_INF), booleans where BOOL is asked, rectangular nesting, data length equal to
 * the shape. Errors are 422 naming the element ("query[0][2][1]", "mask.data[7]",
 * "key.base64"). With a `pool` (may be NULL), base64 of more than a megabyte, JSON numbers of
 * more than a quarter of a megabyte and raw data of more than 2^18 elements are decoded by all
 * its workers; the caller may itself be one of them. An error is the same, message and
 * offset, with or without the pool. */
int api__tensor_decode(const api__body *b, const api__tensor *t, api__elem elem, unsigned flags,
                       void *dst, const char *field, eng_pool *pool, api__error *err);

/* `count` little-endian elements of `dtype` at `data`; `first` is the index of data[0] in the
 * whole tensor, for messages. */
typedef struct {
    const void *data;
    api__dtype dtype;
    size_t count, first;
} api__raw_elems;

/* Converts the elements `in` into dst as `elem` (the binary path: base64 after decoding, and
 * KServe binary tensor data), with the checks above. INT64 takes int32 and int64 (the raw form
 * only); FLOAT takes float32, float16 and bfloat16; BF16 takes bfloat16 alone (the bits copied,
 * each checked finite); BOOL takes bool bytes 0 and 1.
 * dst may be in->data when the widths match (then nothing is written: a check in place). */
int api__tensor_convert(const api__raw_elems *in, api__elem elem, unsigned flags, void *dst,
                        const char *field, api__error *err);

/* Encode flags. */
/* -inf is allowed (lse), and kept as it is in base64 and binary. In text the two protocols'
 * clients differ, so each route says how: the native API's callers parse strict JSON (Go, JS,
 * jansson in the shard client), which has no -inf, so null stands for it; v2's clients are
 * tritonclient and KServe's, which read JSON with Python's json module: there -Infinity is -inf
 * and null became NaN (and the OIP schema refuses null in tensor data). */
#define API_ENCODE_NEG_INF_NULL  1u /* -inf in text as null */
#define API_ENCODE_NEG_INF_TOKEN 2u /* -inf in text as -Infinity */
/* The values as bfloat16 (rounded to nearest even): bf16 numbers in text, two bytes each in
 * base64 ("dtype": "bfloat16") and raw. A value beyond bf16's range is NONFINITE. */
#define API_ENCODE_BF16 4u

typedef enum {
    API_ENCODE_OK = 0,
    API_ENCODE_NONFINITE, /* a value is not finite (or is -inf without the flag) */
    API_ENCODE_FULL,      /* the writer failed: see w->state */
} api__encode_status;

/* Bytes that api__tensor_encode writes at most for `count` elements of this shape and form. */
size_t api__tensor_encoded_bound(api__form form, int rank, const int64_t *shape, size_t count);

/* Whether every value of data[0..count) can be written with `flags`: finite as written (after
 * bf16 rounding with API_ENCODE_BF16), or -inf where a NEG_INF flag allows it. When not,
 * *bad_index is the first that cannot. With a `pool` (may be NULL), more than 2^18 values are
 * checked by its workers. */
bool api__tensor_writable(const float *data, size_t count, unsigned flags, eng_pool *pool,
                          size_t *bad_index);

/* Appends the float32 tensor data[shape] to `w` in `form` (base64 as float32; RAW as its
 * little-endian bytes, for KServe v2 binary outputs), needing at most
 * api__tensor_encoded_bound bytes of room. On NONFINITE, *bad_index is the flat index of the
 * first offending value and nothing is written. With a `pool` (may be NULL), the check, text
 * of more than 2^14 values, and base64 and raw bytes of more than 2^18 are written by its
 * workers, byte for byte as one thread writes them. */
api__encode_status api__tensor_encode(api_buf *w, const float *data, int rank, const int64_t *shape,
                                      api__form form, unsigned flags, eng_pool *pool,
                                      size_t *bad_index);

/* Formats the multi-index of flat index `flat` in `shape` as "[i0][i1]..." (`dims` leading
 * dimensions only) into buf; returns buf. */
char *api__index_format(char *buf, size_t size, size_t flat, int rank, const int64_t *shape,
                        int dims);

/* A 422 naming `name` for the non-finite result data[index] (flat; the message gives its
 * multi-index in shape): the engine's float32 arithmetic overflowed. Returns -1. */
int api__tensor_nonfinite_result(api__error *err, const char *name, const float *data, size_t index,
                                 int rank, const int64_t *shape);

/* Writes "[2, 3]" for t's shape into buf; returns buf. */
const char *api__tensor_shape_str(const api__tensor *t, char *buf, size_t size);

#endif
