/*
 * internal.h - api/'s module-private interface: the pieces its routes share.
 *
 * server/ never includes this file; api.h is the module's whole public interface. The routes of
 * api/ (today POST /v1/attention; later /v1/mha and the KServe v2 JSON and binary formats) are
 * built from the layers below, and tests/api/ tests each layer on its own:
 *
 *   api_error    a failure on its way to becoming a reply: HTTP status, metric reason, field
 *                path ("query.shape[1]") and message. Functions return 0 or -1 and fill one.
 *   base64       the byte-level codec of RFC 4648 (fp16/bf16 conversions are the engine's).
 *   api_jsonw    a growable output buffer with a hard maximum, and a float writer that gives
 *                9 significant digits (exact float32 round trip) without a json_t per number.
 *   api_body     the request body parsed by jansson, with long plain strings (base64 tensors)
 *                kept out of jansson and read in place: the boundary where a strict numeric-
 *                array scanner can later replace jansson for big number arrays too.
 *   api_tensor   a tensor on the wire (nested arrays, {shape, data}, {shape, dtype, base64},
 *                or raw bytes of the KServe v2 binary extension): probed first (form, dtype,
 *                shape; nothing allocated), then decoded straight into a caller's aligned
 *                buffer (or used in place), and encoded from a float buffer and a shape.
 *   api_req      one request in flight: limits, deadline, the parsed body, budget
 *                reservations and owned buffers, all freed by one call; its inputs decoded
 *                into owned buffers; and api_req_serve, the stages every native JSON route
 *                runs, around the route's own steps (request.c).
 *   api_sdpa     the one path from a parsed attention request to eng_sdpa, shared by
 *                /v1/attention and the v2 "sdpa" model (sdpa.c).
 *   codings      gzip / deflate bodies and replies (encoding.c).
 *
 * Ownership: nothing here takes ownership of an argument unless its comment says so. Threads:
 * every function may run on any thread; none keeps global mutable state.
 */
#ifndef ATTND_API_INTERNAL_H
#define ATTND_API_INTERNAL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api/api.h"

/* ---- Errors ------------------------------------------------------------------------------ */

typedef struct {
    api_status status; /* API_STATUS_OK while there is no error */
    api_reason reason; /* for the rejection metric */
    int retry_after_s; /* > 0: the reply carries Retry-After */
    char field[128];   /* JSON-path-like name of the offending field, "" for none */
    char message[400]; /* one sentence; names the limit or flag where one applies */
} api_error;

/* Fills `err` and returns -1, so that a check reads `return api_error_set(err, ...)`. `field`
 * may be NULL. The first error wins: a second call on a filled `err` changes nothing. */
int api_error_set(api_error *err, api_status status, api_reason reason, const char *field,
                  const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Turns `err` into an error reply in `style` (api.h), freeing any body `reply` held; its other
 * fields must be initialised. */
void api_reply_from_error(api_reply *reply, api_error_style style, const api_error *err);

/* ---- Base64 (RFC 4648, standard alphabet) ------------------------------------------------ */

typedef enum {
    API_B64_OK = 0,
    API_B64_BAD_LENGTH,  /* length % 4 == 1: no byte string encodes to that */
    API_B64_BAD_CHAR,    /* outside A-Z a-z 0-9 + / (whitespace included), or misplaced '=' */
    API_B64_BAD_PADDING, /* the unused bits of the last group are not zero (non-canonical) */
} api_b64_status;

/* Characters needed to encode n bytes, with padding: 4 * ceil(n / 3). */
size_t api_base64_encoded_len(size_t n);

/* Encodes n bytes into dst (api_base64_encoded_len(n) bytes, no NUL added); returns dst's end. */
char *api_base64_encode(const void *src, size_t n, char *dst);

/* Bytes that `len` characters of base64 decode to, from the length and the trailing '='s;
 * SIZE_MAX when no valid string has that length. Padding is optional (unpadded tails of 2 or 3
 * characters are accepted). */
size_t api_base64_decoded_len(const char *src, size_t len);

/* Decodes src into dst, which holds api_base64_decoded_len(src, len) bytes, and stores how many
 * it wrote in *dst_len. On failure *bad_offset is the offset of the first offending character
 * (for BAD_LENGTH: len); a stray character is reported before a bad length. dst may be NULL:
 * then nothing is written (api_base64_validate). */
api_b64_status api_base64_decode(const char *src, size_t len, void *dst, size_t *dst_len,
                                 size_t *bad_offset);

/* The checks of api_base64_decode without the output: for error messages. */
api_b64_status api_base64_validate(const char *src, size_t len, size_t *bad_offset);

/* ---- JSON output ------------------------------------------------------------------------- */

/* Most characters api_float_format writes: "-1.23456789e-38" is 15. */
#define API_FLOAT_MAX_CHARS 16

/* Writes finite `f` as printf("%.9g") would, without its cost: 9 significant digits, which
 * read back (strtof) as exactly `f`. No NUL; returns the length. `f` must be finite. */
size_t api_float_format(float f, char *out);

typedef enum {
    API_JSONW_OK = 0,
    API_JSONW_FULL,  /* a write would have passed the maximum size */
    API_JSONW_NOMEM, /* the allocator failed */
} api_jsonw_state;

/* A growable byte buffer for building a reply. Errors are sticky: once a write fails, later
 * writes do nothing and `state` says why, so a writer checks once at the end. */
typedef struct {
    char *data;
    size_t len, cap, max;
    api_jsonw_state state;
} api_jsonw;

/* An empty buffer that never grows beyond `max` bytes. Allocates nothing yet. */
void api_jsonw_init(api_jsonw *w, size_t max);
void api_jsonw_free(api_jsonw *w);

/* Makes room for n more bytes and returns where they go (then advance w->len yourself), or
 * NULL (state set) when that is impossible. */
char *api_jsonw_reserve(api_jsonw *w, size_t n);

void api_jsonw_mem(api_jsonw *w, const void *src, size_t n);
void api_jsonw_cstr(api_jsonw *w, const char *s); /* raw, not quoted */
void api_jsonw_char(api_jsonw *w, char c);
void api_jsonw_string(api_jsonw *w, const char *s, size_t n); /* quoted and escaped */
void api_jsonw_int(api_jsonw *w, int64_t v);
void api_jsonw_float(api_jsonw *w, float f); /* f must be finite (checked by the caller) */
void api_jsonw_printf(api_jsonw *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- The parsed request body ------------------------------------------------------------- */

#define API_MAX_RANK 8

/* A part of the body that jansson does not parse: a long string value, a big array of
 * numbers, or one of the tokens NaN, Infinity and -Infinity, which JSON lacks. The compact copy
 * that jansson parses holds a placeholder string instead. */
typedef enum { API_SPAN_STRING = 0, API_SPAN_NUMBERS, API_SPAN_NONFINITE } api_span_kind;

typedef struct {
    api_span_kind kind;
    size_t offset, len; /* STRING: the characters between the quotes; NUMBERS: '[' to ']';
                           NONFINITE: the token */
    double value;       /* NONFINITE: NaN, inf or -inf */
    /* NUMBERS only, checked by the scan: rectangular nesting of this shape, rank <= 8, every
     * leaf a JSON number that jansson would also accept (as a double, or as an int64 when it
     * has no fraction or exponent), or one of the non-finite tokens. */
    int rank;
    int64_t shape[API_MAX_RANK];
    size_t count;
} api_body_span;

/* What one cheap pass over the body learnt before jansson sees it. */
typedef struct {
    size_t parse_bytes;   /* upper estimate of the memory that parsing will hold */
    api_body_span *spans; /* owned until api_body_parse takes it; NULL if none */
    size_t n_spans;
} api_body_scan;

/* String values at least this long, without escapes, are kept out of jansson; so are arrays
 * of at least this many numbers. */
#define API_BODY_LONG_STRING  1024
#define API_BODY_MANY_NUMBERS 16

typedef struct {
    json_t *root; /* owned */
    const char *body;
    api_body_span *spans; /* owned: the parts read in place */
    size_t n_spans;
} api_body;

/* Scans `body` (not NUL-terminated) in one pass at close to memory speed: counts values to
 * estimate what jansson will allocate (~64 bytes per value; it is the budget's first item),
 * lists long string values, and checks big arrays of numbers with a strict scanner (JSON's
 * number grammar exactly; anything it does not accept is left to jansson, which then reports
 * it). Never fails: a malformed body still gets an estimate, and without memory for the list
 * nothing is elided. */
void api_body_scan_run(const char *body, size_t len, api_body_scan *scan);
void api_body_scan_free(api_body_scan *scan); /* for a scan never given to api_body_parse */

/* Parses `body` with jansson (JSON_REJECT_DUPLICATES) into b->root, which must be an object.
 * jansson copies strings character by character (~75 MB/s, 0.9 s for a 64 MB base64 tensor)
 * and allocates a json_t per number (~160 ns each), so the spans of `scan` are replaced by
 * short placeholders (the escape \u0000 and an index) in a copy of the body; the tensor
 * decoder reads them in place. The body is first checked not to contain "\u0000" itself; when
 * it does, the body is parsed as it is. `scan` may be NULL: the body is then scanned here. A
 * long string's UTF-8 is not checked: every field that takes one (base64) accepts ASCII only
 * and rejects it there. Takes over scan->spans; `body` must outlive `b`. Errors: 400 malformed
 * (jansson's text, line, column and byte in the body as sent), 422 for a body that is not an
 * object, 503 when memory runs out. */
int api_body_parse(api_body *b, const char *body, size_t len, api_body_scan *scan, api_error *err);

/* Frees what api_body_parse made; a zeroed or failed `b` is fine. */
void api_body_free(api_body *b);

/* The span that value `v` stands for, or NULL when it is an ordinary value. */
const api_body_span *api_body_span_of(const api_body *b, const json_t *v);

/* The bytes of string `s`, long strings in place; false if `s` is not a string (an elided
 * array of numbers or a non-finite token is not one). */
bool api_body_string_get(const api_body *b, const json_t *s, const char **p, size_t *n);

/* Decodes the numbers of span `sp` in order. FLOAT: float, checked finite as float32 after
 * narrowing, as for jansson's values; a non-finite token only when it is -Infinity and
 * `neg_inf_ok`. INT64: int64_t; every number must be an integer. On an error, *bad is the
 * index of the offending number. Returns 0, or -1 with a reason in `why` (at least 64 bytes). */
int api_body_numbers_decode(const api_body *b, const api_body_span *sp, bool integers,
                            bool neg_inf_ok, void *dst, size_t *bad, char *why, size_t why_size);

/* Whether `v` is a NaN, Infinity or -Infinity token of the body; its value in *out. */
bool api_body_nonfinite(const api_body *b, const json_t *v, double *out);

/* ---- Tensors ----------------------------------------------------------------------------- */

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
} api_dtype;

const char *api_dtype_name(api_dtype dtype);
size_t api_dtype_size(api_dtype dtype);

typedef enum {
    API_FORM_NESTED = 0, /* [[1, 0], [0, 1]] */
    API_FORM_FLAT,       /* {"shape": [2, 2], "data": [1, 0, 0, 1]} */
    API_FORM_BASE64,     /* {"shape": [2, 2], "dtype": "float32", "base64": "..."} */
    API_FORM_RAW,        /* little-endian bytes in the body: KServe v2 binary tensor data */
} api_form;

/* What a decoder writes into the destination buffer. */
typedef enum {
    API_ELEM_FLOAT, /* float; the tensor must hold numbers */
    API_ELEM_BOOL,  /* uint8_t 0/1; the tensor must hold booleans (not 0/1 numbers: a mask's
                       polarity is easy to get wrong, and numbers suggest the HF 1 = keep one) */
    API_ELEM_INT64, /* int64_t; JSON integers in the text forms only */
} api_elem;

/* Decode flags. */
#define API_DECODE_NEG_INF 1u /* -inf is allowed (float masks): base64 -inf, JSON null */

/* A tensor found in a request: where its values are and what shape they claim. */
typedef struct {
    api_form form;
    api_dtype dtype; /* for the text forms, from the first element */
    int rank;
    int64_t shape[API_MAX_RANK];
    size_t count;        /* product of shape, at most the max_elements given to the probe */
    const json_t *items; /* NESTED: the outer array; FLAT: the "data" array */
    const api_body_span *numbers; /* NESTED or FLAT read from the body instead of `items` */
    const char *b64;              /* BASE64: the text (in the body or in jansson's tree) */
    size_t b64_len;
    const void *raw; /* RAW: count * api_dtype_size(dtype) bytes, any alignment, borrowed */
} api_tensor;

/* Reads the form, dtype and shape of the tensor `v` (field name `field`, e.g. "query") without
 * decoding values; for nested arrays the shape comes from the first element at each depth and
 * the decoder checks that the rest match. Errors: 422 for a malformed tensor or a shape that
 * is not positive integers, 413 (--max-elements) when its element count exceeds max_elements
 * or overflows. */
int api_tensor_probe(const api_body *b, const json_t *v, const char *field, size_t max_elements,
                     api_tensor *t, api_error *err);

/* Reads a shape array ("shape" of the flat and base64 forms, or a KServe v2 "shape") into
 * shape[], *rank and *count with the same checks as api_tensor_probe. */
int api_shape_parse(const json_t *v, const char *field, size_t max_elements, int64_t *shape,
                    int *rank, size_t *count, api_error *err);

/* Whether tensor `t` can be used where it is, as `elem` elements, without a decoded copy: raw
 * bytes of the destination's type, aligned for it (float32 on a 4-byte boundary, bool). */
bool api_tensor_in_place(const api_tensor *t, api_elem elem);

/* Decodes tensor `t` into dst: t->count elements of the type `elem` says, contiguous row-major.
 * Checks every value: numbers finite as float32 (after narrowing; -inf too with
 * API_DECODE_NEG_INF), booleans where BOOL is asked, rectangular nesting, data length equal to
 * the shape. Errors are 422 naming the element ("query[0][2][1]", "mask.data[7]",
 * "key.base64"). With a `pool` (may be NULL), base64 of more than a megabyte is decoded by all
 * its workers; the caller may itself be one of them. */
int api_tensor_decode(const api_body *b, const api_tensor *t, api_elem elem, unsigned flags,
                      void *dst, const char *field, eng_pool *pool, api_error *err);

/* Converts `count` little-endian elements of `dtype` at `src` into dst as `elem` (the binary
 * path: base64 after decoding, and KServe binary tensor data), with the checks above. `first`
 * is the index of src[0] in the whole tensor, for messages. INT64 takes int32 and int64 (the
 * raw form only); FLOAT takes float32, float16 and bfloat16; BOOL takes bool bytes 0 and 1.
 * dst may be src when the widths match (then nothing is written: a check in place). */
int api_tensor_convert(const void *src, api_dtype dtype, size_t count, size_t first, api_elem elem,
                       unsigned flags, void *dst, const char *field, api_error *err);

/* Encode flags. */
/* -inf is allowed (lse), and kept as it is in base64 and binary. In text the two protocols'
 * clients differ, so each route says how: the native API's callers parse strict JSON (Go, JS,
 * jansson in the shard client), which has no -inf, so null stands for it; v2's clients are
 * tritonclient and KServe's, which read JSON with Python's json module: there -Infinity is -inf
 * and null became NaN (and the OIP schema refuses null in tensor data). */
#define API_ENCODE_NEG_INF_NULL  1u /* -inf in text as null */
#define API_ENCODE_NEG_INF_TOKEN 2u /* -inf in text as -Infinity */

typedef enum {
    API_ENCODE_OK = 0,
    API_ENCODE_NONFINITE, /* a value is not finite (or is -inf without the flag) */
    API_ENCODE_FULL,      /* the writer failed: see w->state */
} api_encode_status;

/* Bytes that api_tensor_encode writes at most for `count` elements of this shape and form. */
size_t api_tensor_encoded_bound(api_form form, int rank, const int64_t *shape, size_t count);

/* Appends the float32 tensor data[shape] to `w` in `form` (base64 as float32; RAW as its
 * little-endian bytes, for KServe v2 binary outputs). On NONFINITE,
 * *bad_index is the flat index of the first offending value and nothing is written. With a
 * `pool` (may be NULL), base64 of more than a megabyte is encoded by all its workers. */
api_encode_status api_tensor_encode(api_jsonw *w, const float *data, int rank, const int64_t *shape,
                                    api_form form, unsigned flags, eng_pool *pool,
                                    size_t *bad_index);

/* Formats the multi-index of flat index `flat` in `shape` as "[i0][i1]..." (`dims` leading
 * dimensions only) into buf; returns buf. */
char *api_index_format(char *buf, size_t size, size_t flat, int rank, const int64_t *shape,
                       int dims);

/* ---- Memory ------------------------------------------------------------------------------ */

/* Bytes of a 64-byte-aligned allocation of n bytes (n rounded up), or 0 on overflow. */
size_t api_aligned_size(size_t n);

/* A 64-byte-aligned buffer of n > 0 bytes (free with free()); NULL when out of memory. */
void *api_aligned_alloc(size_t n);

/* ---- Models (models.c) ------------------------------------------------------------------- */

#define API_MODEL_NAME_MAX 63

/* [A-Za-z0-9_.-], 1 to API_MODEL_NAME_MAX bytes. */
bool api_model_name_ok(const char *name);
/* Appends the JSON description of layer `l` (as GET /v1/models/{name} answers). */
void api_model_describe(api_jsonw *w, const eng_layer *l);

/* ---- One request in flight (request.c) --------------------------------------------------- */

/* What every route holds for one request, so that one function frees it all on every path:
 * its limits and deadline, the parsed body, its reservations in the memory budget, and the
 * buffers it allocated. A route fills an api_error on failure and calls api_req_free last. */
#define API_REQ_MAX_OWNED 24

typedef struct {
    const api_call *call;
    api_limits limits; /* call->limits or the defaults; max_elements capped at SIZE_MAX / 32 so
                          that element counts times 16 bytes never overflow */
    eng_ctl own_ctl, *ctl;
    int64_t start_ns; /* arrival: deadlines count from it */
    int64_t call_ns;  /* when the route began: stage timings count from it */
    api_body body;
    size_t parse_reserved, reserved; /* bytes held in the budget: the parse, and the rest */
    void *owned[API_REQ_MAX_OWNED];  /* buffers from api_req_alloc */
    size_t n_owned;
} api_req;

/* Starts a request: limits, the control block (call->ctl or a private one) and the deadline
 * cap (--request-timeout-ms). Allocates nothing. */
void api_req_init(api_req *rq, const api_call *call);

/* Frees the body tree and every owned buffer and returns every reservation. */
void api_req_free(api_req *rq);

/* Reserves `bytes` more in the budget (into parse_reserved when `parse`): 413 naming
 * --max-memory-bytes when the request's total (with call->budget_held) could never fit, 429 when
 * it cannot fit now. `what` says what the bytes are for, in the 413 message. */
int api_req_reserve(api_req *rq, size_t bytes, bool parse, const char *what, api_error *err);

/* Reserves the decoded tensors, the reply text and the engine scratch of a request together,
 * naming the three in a 413 message; `sized` false (a size overflowed) reserves everything,
 * which is a 413. */
int api_req_reserve_run(api_req *rq, bool sized, size_t tensors, size_t text, size_t scratch,
                        api_error *err);

/* Fills a 200 application/json reply with the text of `w`, taking its buffer; a 503 in `style`
 * when the writer ran out of memory. */
void api_reply_json(api_reply *reply, api_jsonw *w, api_error_style style);

/* The steps of a native JSON route (POST /v1/attention, /v1/mha) between the stages that
 * api_req_serve runs for every one of them. Each step takes the route's job (see
 * api_req_serve) and returns 0, or -1 with `err` filled. */
typedef struct {
    /* Reads rq->body (parsed, an object) into the job and checks it: fields, shapes, limits,
     * the deadline. */
    int (*parse)(void *job, api_error *err);
    /* Bytes of the decoded tensors, the engine's scratch and an upper bound of the reply's
     * text (also its writer's maximum); false when a sum overflowed. */
    bool (*size)(void *job, size_t *tensors, size_t *scratch, size_t *text);
    /* Allocates and decodes the inputs and frees the body tree. */
    int (*decode)(void *job, api_error *err);
    /* Runs the engine; *compute_ns gets its time. */
    int (*compute)(void *job, int64_t *compute_ns, api_error *err);
    /* Writes the reply into `w`, with the stage timings in its meta. */
    int (*encode)(void *job, api_jsonw *w, int64_t decode_ns, int64_t compute_ns, api_error *err);
    /* The batch the reply counts in reply->inferences; NULL: none counted. */
    int64_t (*inferences)(const void *job);
    /* Frees what the job owns beyond its api_req, on every path; NULL: nothing. */
    void (*free)(void *job);
} api_req_steps;

/* Serves one native JSON request with `steps`, so that every route runs the same stages in
 * the same order and fails the same way: the cancel flag and deadline, the Content-Type and
 * body size (api_field_json_body), the JSON parse (api_req_parse), then steps->parse; sizes
 * from steps->size reserved at once (api_req_reserve_run) before anything is allocated;
 * steps->decode, whose end is reply->decode_ns (from rq->call_ns); steps->compute; and
 * steps->encode into a writer capped at the reply bound, timed from the end of the compute
 * (api_reply_json). A failure at any stage becomes a native error reply, with decode_ns
 * measured up to the failure when decoding never finished.
 *
 * `job` is the route's zeroed job, whose first member is its api_req (initialised here from
 * `call`); NULL (its allocation failed) is answered 503. The job's own pointers to that
 * api_req are the route's to set. Frees the reply writer, then steps->free(job), then the
 * api_req; the job itself stays the caller's. Always fills `reply`. */
void api_req_serve(const api_req_steps *steps, void *job, const api_call *call, api_reply *reply);

/* Scans `json` (len bytes), reserves what parsing it holds, and parses it into rq->body. */
int api_req_parse(api_req *rq, const char *json, size_t len, api_error *err);

/* Frees the body tree and gives its reservation back (once the tensors are decoded). */
void api_req_parse_done(api_req *rq);

/* A 64-byte-aligned buffer of `bytes` > 0 owned by the request; 503 when memory runs out. */
void *api_req_alloc(api_req *rq, size_t bytes, api_error *err);

/* One input tensor of a request and what it decodes to. sdpa.c and layer.c each list theirs,
 * then size, decode and place them with the three functions below. */
typedef struct {
    const api_tensor *t; /* probed */
    bool present;        /* false: the request has no such input; it is skipped */
    api_elem elem;
    unsigned flags; /* API_DECODE_* */
    void **dst;     /* gets the address of the decoded values */
    const char *field;
} api_input;

/* Adds to *bytes the buffers api_req_decode_input will allocate for in[0..n): none for absent
 * or empty inputs, nor for those used in place. False when a sum overflows (the inputs after
 * it are then not added). */
bool api_input_bytes(const api_input *in, size_t n, size_t *bytes);

/* Decodes the present input `in` into a buffer owned by rq, or, when api_tensor_in_place
 * allows, checks it where it lies in the body (the engine only reads its inputs) and uses it
 * there; sets *in->dst either way. Errors as api_tensor_decode and api_req_alloc. */
int api_req_decode_input(api_req *rq, const api_input *in, api_error *err);

/* Points *out at a float buffer of `count` elements owned by rq, unless the route already
 * placed the output (*out not NULL: in its reply). 503 when memory runs out. */
int api_req_alloc_output(api_req *rq, float **out, size_t count, api_error *err);

/* 0 while the request may go on; else 504 (deadline) or API_STATUS_CLIENT_CLOSED (cancelled). */
int api_req_check_ctl(api_req *rq, api_error *err);

/* Sets the deadline: `timeout_ms` (0: none given) capped by --request-timeout-ms. */
void api_req_set_deadline(api_req *rq, int64_t timeout_ms);

/* The ranges of a request's own timeout: "timeout_ms" on every route, and Triton's "timeout"
 * in microseconds on KServe v2 (where 0 means none). api_timeout_peek reads the same ranges. */
#define API_TIMEOUT_MS_MAX ((int64_t)1 << 40)
#define API_TIMEOUT_US_MAX ((int64_t)1 << 50)

/* An engine failure as an error: 422 invalid, 413 too big, 503 out of memory, 504 / cancelled,
 * 500 for the rest. `field` is the request's name for the engine's field (may be NULL). */
int api_req_engine_error(api_req *rq, eng_status st, const eng_error *e, const char *field,
                         api_error *err);

/* The closest of `names[0..n)` to `key` within an edit distance of 2, or NULL: for "did you
 * mean" in messages about unknown fields. */
const char *api_closest_name(const char *key, const char *const *names, size_t n);

/* ---- Scaled dot-product attention requests (sdpa.c) -------------------------------------- */

/* One path from a decoded request to eng_sdpa, shared by the native JSON route and the KServe
 * v2 route: a route fills an api_sdpa_req from its wire format (tensors probed, not decoded),
 * then calls api_sdpa_check, api_sdpa_bytes (to reserve), api_sdpa_decode and api_sdpa_run,
 * and encodes s->out, s->weights and s->lse in its own format. Tensor names in messages are the
 * request's: query, key, value, attn_mask, key_padding_mask, kv_lengths, alibi, num_heads... */

typedef enum {
    API_CAUSAL_OFF = 0,
    API_CAUSAL_ON,
    API_CAUSAL_TOP_LEFT,
    API_CAUSAL_BOTTOM_RIGHT,
} api_causal;

/* Bounds that keep the engine's position arithmetic (i + query_offset - left, ...) far from
 * int64 overflow. A window side beyond API_WINDOW_MAX reaches past any position and is the
 * same as none. */
#define API_QUERY_OFFSET_MAX ((int64_t)1 << 48)
#define API_WINDOW_MAX       ((int64_t)1 << 50)

typedef struct {
    api_tensor q, k, v, mask, kpm, kvlen, slopes, wq, wk, ww;
    bool has_q, has_k, has_v, has_mask, has_kpm, has_kvlen, has_slopes, has_wq, has_wk, has_ww;
    bool additive, has_additive_weights;

    int64_t num_heads, num_kv_heads; /* 0: not given */
    bool scale_set;
    float scale, softcap;
    api_causal causal;
    bool offset_set;
    int64_t query_offset;
    bool window_left_set, window_right_set;
    int64_t window_left, window_right;
    bool alibi;
    eng_weights_mode weights;
    bool return_lse;
    int64_t timeout_ms; /* 0: not given */

    /* Derived by api_sdpa_check. */
    int64_t B, H, Hkv, L, S, D, Dv;
} api_sdpa_req;

/* The shape of an output: its rank follows the query's; a rank-2 query drops the batch axis. */
typedef struct {
    int rank;
    int64_t shape[4];
    size_t count;
} api_out_shape;

typedef struct {
    api_req *rq;
    api_sdpa_req r;
    api_out_shape os, ws, ls; /* output, weights, lse: filled by api_sdpa_check */
    /* Decoded inputs: owned by rq, or pointing into the body (raw tensors used in place). */
    float *q, *k, *v, *slopes, *mask_f, *wq, *wk, *ww;
    uint8_t *mask_b, *kpm;
    int64_t *kvlen;
    /* Outputs: a route may point them into its reply before api_sdpa_decode (which allocates
     * those still NULL); weights and lse only when requested. */
    float *out, *weights, *lse;
    eng_sdpa_args args;
} api_sdpa;

/* Derives B, H, Hkv, L, S, D, Dv, checks every tensor against them, the element limit over
 * inputs and outputs (413, --max-elements), sets the deadline (timeout_ms) and the output
 * shapes. 422 names the field. */
int api_sdpa_check(api_sdpa *s, api_error *err);

/* Bytes the call will allocate beyond the body: decoded inputs (none for raw tensors used in
 * place), the outputs when `outputs` (a route that places them in its reply counts them there),
 * and the engine's scratch. False when a sum overflows. */
bool api_sdpa_bytes(api_sdpa *s, bool outputs, size_t *tensors, size_t *scratch);

/* Allocates and decodes every input (in place where api_tensor_in_place allows), checks
 * kv_lengths against S, allocates the outputs the route did not place, and frees the body tree
 * (its reservation goes back to the budget). */
int api_sdpa_decode(api_sdpa *s, api_error *err);

/* Runs eng_sdpa (checking the deadline and the cancel flag first); *compute_ns gets its time. */
int api_sdpa_run(api_sdpa *s, int64_t *compute_ns, api_error *err);

/* ---- Content codings (encoding.c) -------------------------------------------------------- */

typedef enum {
    API_CODING_IDENTITY = 0,
    API_CODING_GZIP,    /* RFC 1952 (one or more members) */
    API_CODING_DEFLATE, /* HTTP's "deflate": a zlib stream (RFC 1950); raw RFC 1951 accepted */
    API_CODING_UNKNOWN,
} api_coding;

/* The coding a Content-Encoding value names (NULL or empty: identity). One coding only: a list
 * ("gzip, gzip") is UNKNOWN. */
api_coding api_coding_parse(const char *value);

/* The coding to answer with under an Accept-Encoding value (RFC 9110 section 12.5.3): gzip or
 * deflate when its q (or that of "*") is above 0, the higher q winning and gzip on a tie;
 * identity when neither is acceptable, the header is absent (NULL) or unparsable. */
api_coding api_accept_encoding_pick(const char *value);

/* Decompresses src[0..n) of `coding` (gzip or deflate) into a malloc'd buffer (*out, *out_len,
 * NUL-terminated past its end), never growing it beyond `max` bytes: 413 naming
 * --max-body-bytes past it. Every growth is reserved in `budget` first (may be NULL), after
 * `held` bytes the request holds already; *reserved gets the total to release later, also on
 * failure. 400 for a corrupt or truncated stream, 429/413 from the budget, 503 out of memory. */
int api_inflate(api_coding coding, const char *src, size_t n, size_t max, api_budget *budget,
                size_t held, char **out, size_t *out_len, size_t *reserved, api_error *err);

/* Compresses src[0..n) as `coding` (gzip or deflate, zlib's fastest level) into a buffer from
 * eng_buf_alloc (it becomes a reply body); false when memory runs out. */
bool api_deflate(api_coding coding, const char *src, size_t n, char **out, size_t *out_len);

/* ---- KServe v2 (v2.c, v2_request.c) ------------------------------------------------------- */

/* Whether a v2 inference takes a body of Content-Type `ct` (NULL: none given). */
bool api_v2_content_type_ok(const char *ct);

/* Reads an Inference-Header-Content-Length value (decimal digits, optionally surrounded by
 * blanks) into *out; false when it is not one. */
bool api_v2_header_len_parse(const char *s, size_t *out);

/* The timeout a v2 inference asks for: the tighter of "timeout_ms" and Triton's "timeout"
 * (microseconds, rounded up to whole milliseconds), where 0 means not given; 0 when neither is. */
int64_t api_v2_timeout_ms(int64_t timeout_ms, int64_t timeout_us);

/* ---- Fields the JSON attention routes share (fields.c) ----------------------------------- */

/* Fills `err` with a 422 naming `field` and returns -1. */
int api_field_invalid(api_error *err, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A JSON integer in [lo, hi], or a 422 naming `name`. */
int api_field_int(const json_t *v, const char *name, int64_t lo, int64_t hi, int64_t *out,
                  api_error *err);
/* A JSON number finite as float32, or a 422 naming `name`. */
int api_field_float(const json_t *v, const char *name, float *out, api_error *err);
/* A softcap: a number >= 0 finite as float32, 0 meaning none. */
int api_field_softcap(const json_t *v, const char *name, float *out, api_error *err);
/* false | null | true | "top_left" | "bottom_right". */
int api_field_causal(const json_t *v, const char *name, api_causal *out, api_error *err);

typedef struct {
    bool left_set, right_set;
    int64_t left, right;
} api_field_window_t;

/* [left, right], each a non-negative integer or null (unbounded); null is no window. */
int api_field_window(const json_t *v, const char *name, api_field_window_t *w, api_error *err);
/* "per_head" | "mean" | false | null. */
int api_field_weights(const json_t *v, const char *name, eng_weights_mode *out, api_error *err);
/* "nested" | "flat" | "base64" (sets *set) | null. */
int api_field_encoding(const json_t *v, const char *name, bool *set, api_form *out, api_error *err);
/* Writes "[2, 3]" for t's shape into buf; returns buf. */
const char *api_field_shape_str(const api_tensor *t, char *buf, size_t size);
/* attn_mask must broadcast to [B, H, L, S] from [L, S] or a rank-4 shape (422 otherwise). */
int api_field_attn_mask(const api_tensor *m, int64_t B, int64_t H, int64_t L, int64_t S,
                        api_error *err);
/* key_padding_mask must be booleans of shape [B, S] or [S] (422 otherwise). */
int api_field_key_padding(const api_tensor *m, int64_t B, int64_t S, api_error *err);
/* The engine's view of a decoded attn_mask (bool bytes or floats, contiguous). */
eng_mask api_field_mask_view(const api_tensor *m, const void *data);
/* application/json, any case; a charset parameter must be UTF-8. NULL (no header) is JSON. */
bool api_field_json_type(const char *ct);
/* The failure of a reply writer: 503 out of memory, or 500 when the estimate was wrong. */
int api_field_writer_error(const api_jsonw *w, api_error *err);
/* Appends "name": tensor to `w`; a non-finite value is a 422 naming its index. */
int api_field_encode(api_jsonw *w, const char *name, const float *data, int rank,
                     const int64_t *shape, api_form form, unsigned flags, eng_pool *pool,
                     api_error *err);
/* A tensor field: null leaves it absent; otherwise *has is set and the tensor probed (not
 * decoded) with the request's element limit. */
int api_field_tensor(const api_req *rq, const json_t *v, const char *name, api_tensor *t, bool *has,
                     api_error *err);
/* true | false (null is the caller's to handle). */
int api_field_bool(const json_t *v, const char *name, bool *out, api_error *err);
/* "sinusoidal" | "rope" | "alibi" | "none" | null (unchanged). */
int api_field_positional(const json_t *v, const char *name, eng_positional *out, api_error *err);
/* A number > 0, finite as float32 (sets *set) | null. */
int api_field_rope_base(const json_t *v, const char *name, bool *set, float *out, api_error *err);
/* "half" | "interleaved" (sets *set) | null. */
int api_field_rope_style(const json_t *v, const char *name, bool *set, eng_rope_style *out,
                         api_error *err);
/* The checks of a native JSON route before parsing: 415 for a Content-Type other than JSON,
 * 413 for a body past --max-body-bytes. */
int api_field_json_body(const api_req *rq, api_error *err);

/* ---- Multi-head attention layer requests (layer.c) --------------------------------------- */

/* One path from a decoded layer request to eng_mha, shared by POST /v1/mha and the KServe v2
 * route of a layer model: a route fills an api_layer_req from its wire format (tensors probed,
 * not decoded; s->layer set when the route already knows the layer), then calls
 * api_layer_check, api_layer_bytes (to reserve), api_layer_decode and api_layer_run, encodes
 * s->out and s->weights in its own format, and ends with api_layer_free. Tensor names in
 * messages are the request's: input, memory, key, value, attn_mask, key_padding_mask,
 * weights.*; options: query_offset, rope_base, rope_style, num_heads, num_kv_heads. */

#define API_LAYER_MAX_WEIGHTS 16

typedef struct {
    const char *model; /* a registered layer's name (borrowed), or NULL */
    /* Inline weights under a model file's tensor names (/v1/mha only). */
    bool has_weights;
    size_t n_weights;
    api_tensor wt[API_LAYER_MAX_WEIGHTS];
    char wt_name[API_LAYER_MAX_WEIGHTS][80];
    char wt_field[API_LAYER_MAX_WEIGHTS][96]; /* "weights.<name>", for messages */
    int64_t num_heads, num_kv_heads;          /* 0: not given (must match a model's) */

    api_tensor input, memory, key, value, mask, kpm;
    bool has_input, has_memory, has_key, has_value, has_mask, has_kpm;
    api_causal causal;
    bool offset_set;
    int64_t query_offset;
    api_field_window_t window;
    eng_positional positional;
    bool rope_base_set, rope_style_set;
    float rope_base;
    eng_rope_style rope_style;
    bool add_zero_attn;
    eng_weights_mode weights;
    int64_t timeout_ms; /* 0: not given */
} api_layer_req;

typedef struct {
    api_req *rq;
    api_layer_req r;
    const eng_layer *layer;  /* borrowed from the registry, or inline_layer; set by check */
    eng_layer *inline_layer; /* built from r.wt; owned, freed by api_layer_free */
    int64_t B, L, S, Sx;     /* Sx: S plus the keys the layer appends */
    api_out_shape os, ws;    /* output and weights: filled by api_layer_check */
    /* Decoded inputs: owned by rq, or pointing into the body (raw tensors used in place). */
    float *x, *k_in, *v_in, *mask_f;
    uint8_t *mask_b, *kpm;
    /* Outputs: a route may point them into its reply before api_layer_decode (which allocates
     * those still NULL); weights only when requested. */
    float *out, *weights;
    float placeholder; /* stands in for buffers not allocated yet when sizing */
    eng_mha_args args;
} api_layer;

/* Checks the options that exclude each other, the element limit over the inputs (413,
 * --max-elements), sets the deadline (timeout_ms), finds the layer (s->layer if the route set
 * it, else r.model in call->models: 404; or builds it from inline weights, reserving them in
 * the budget), checks every tensor against it and the element limit over inputs and outputs,
 * and fills the output shapes. 422 names the field. */
int api_layer_check(api_layer *s, api_error *err);

/* Bytes the call will allocate beyond the body: decoded inputs (none for raw tensors used in
 * place), the outputs when `outputs` (a route that places them in its reply counts them there),
 * and the engine's scratch. False when a sum overflows. */
bool api_layer_bytes(api_layer *s, bool outputs, size_t *tensors, size_t *scratch);

/* Allocates and decodes every input (in place where api_tensor_in_place allows), allocates the
 * outputs the route did not place, and frees the body tree (its reservation goes back). */
int api_layer_decode(api_layer *s, api_error *err);

/* Runs eng_mha (checking the deadline and the cancel flag first); *compute_ns gets its time. */
int api_layer_run(api_layer *s, int64_t *compute_ns, api_error *err);

/* Frees what the request owns beyond rq (the inline layer). Safe to call twice. */
void api_layer_free(api_layer *s);

/* "none", "sinusoidal", "rope" or "alibi". */
const char *api_layer_positional_name(eng_positional p);

#endif
