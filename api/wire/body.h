/*
 * body.h - the request body parsed by jansson, with long plain strings (base64 tensors), big
 * arrays of numbers and the non-finite tokens kept out of jansson and read in place: one cheap
 * scan first (its estimate is the first item of a request's memory budget), then the parse.
 * Borrowed body bytes must outlive the api__body; any thread.
 */
#ifndef ATTND_API_WIRE_BODY_H
#define ATTND_API_WIRE_BODY_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api/core/error.h"

#define API_MAX_RANK 8

/* A part of the body that jansson does not parse: a long string value, a big array of
 * numbers, or one of the tokens NaN, Infinity and -Infinity, which JSON lacks. The compact copy
 * that jansson parses holds a placeholder string instead. */
typedef enum { API_SPAN_STRING = 0, API_SPAN_NUMBERS, API_SPAN_NONFINITE } api__span_kind;

typedef struct {
    api__span_kind kind;
    size_t offset, len; /* STRING: the characters between the quotes; NUMBERS: '[' to ']';
                           NONFINITE: the token */
    double value;       /* NONFINITE: NaN, inf or -inf */
    /* NUMBERS only, checked by the scan: rectangular nesting of this shape, rank <= 8, every
     * leaf a JSON number that jansson would also accept (as a double, or as an int64 when it
     * has no fraction or exponent), or one of the non-finite tokens. */
    int rank;
    int64_t shape[API_MAX_RANK];
    size_t count;
} api__body_span;

/* What one cheap pass over the body learnt before jansson sees it. */
typedef struct {
    size_t parse_bytes;    /* upper estimate of the memory that parsing will hold */
    api__body_span *spans; /* owned until api__body_parse takes it; NULL if none */
    size_t n_spans;
} api__body_scan;

/* String values at least this long, without escapes, are kept out of jansson; so are arrays
 * of at least this many numbers. */
#define API_BODY_LONG_STRING  1024
#define API_BODY_MANY_NUMBERS 16

typedef struct {
    json_t *root; /* owned */
    const char *body;
    api__body_span *spans; /* owned: the parts read in place */
    size_t n_spans;
} api__body;

/* The offset in s[0..len) of the quote that closes the JSON string whose first character (the
 * one after its opening quote) is at `i`, or len when the text ends first. A quote closes the
 * string unless an odd number of backslashes precede it; quotes are found with memchr and each
 * run of backslashes is counted once, by the quote after it, so the scan stays linear. The one
 * string scanner of the body scan and the timeout peek. */
size_t api__json_string_end(const char *s, size_t i, size_t len);

/* Scans `body` (not NUL-terminated) in one pass at close to memory speed: counts values to
 * estimate what jansson will allocate (~64 bytes per value; it is the budget's first item),
 * lists long string values, and checks big arrays of numbers with a strict scanner (JSON's
 * number grammar exactly; anything it does not accept is left to jansson, which then reports
 * it). Never fails: a malformed body still gets an estimate, and without memory for the list
 * nothing is elided. */
void api__body_scan_run(const char *body, size_t len, api__body_scan *scan);
void api__body_scan_free(api__body_scan *scan); /* for a scan never given to api__body_parse */

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
int api__body_parse(api__body *b, const char *body, size_t len, api__body_scan *scan,
                    api__error *err);

/* Frees what api__body_parse made; a zeroed or failed `b` is fine. */
void api__body_free(api__body *b);

/* The span that value `v` stands for, or NULL when it is an ordinary value. */
const api__body_span *api__body_span_of(const api__body *b, const json_t *v);

/* The bytes of string `s`, long strings in place; false if `s` is not a string (an elided
 * array of numbers or a non-finite token is not one). */
bool api__body_string_get(const api__body *b, const json_t *s, const char **p, size_t *n);

/* Where and how api__body_numbers_decode writes a span's numbers. */
typedef struct {
    void *dst;       /* count elements: int64_t with `integers`, else float */
    bool integers;   /* every number must be an integer */
    bool neg_inf_ok; /* -Infinity may stand for a float */
    eng_pool *pool;  /* may be NULL; with one, a span of more than a quarter of a megabyte of
                        text is decoded by its workers (the caller may be one of them) */
} api__numbers_out;

/* Decodes the numbers of span `sp` in order into out->dst. FLOAT: float, checked finite as
 * float32 after narrowing, as for jansson's values; a non-finite token only when it is
 * -Infinity and neg_inf_ok. INT64: int64_t; every number must be an integer. On an error,
 * *bad is the index of the first offending number, whatever the pool did. Returns 0, or -1
 * with a reason in `why` (at least 64 bytes). */
int api__body_numbers_decode(const api__body *b, const api__body_span *sp,
                             const api__numbers_out *out, size_t *bad, char *why, size_t why_size);

/* Whether `v` is a NaN, Infinity or -Infinity token of the body; its value in *out. */
bool api__body_nonfinite(const api__body *b, const json_t *v, double *out);

#endif
