/*
 * request.h - one request in flight, as every operation and route holds it: limits, its lease
 * (memory and deadline), the parsed body and owned buffers, all freed by one call; and
 * its inputs, decoded into owned buffers or used where they lie in the body. The base of the
 * operations tier (sdpa.h, layer.h), below the protocols.
 */
#ifndef ATTND_API_OPS_REQUEST_H
#define ATTND_API_OPS_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api/core/error.h"
#include "api/wire/body.h"
#include "api/wire/tensor.h"

/* What every route holds for one request, so that one function frees it all on every path:
 * its limits, its lease (call->lease: the memory it holds, the deadline, the cancel flag), the
 * parsed body and the buffers it allocated. A route fills an api__error on failure and calls
 * api__req_free last. */
#define API_REQ_MAX_OWNED 24

typedef struct {
    const api_call *call;
    api_limits limits; /* call->limits or the defaults; max_elements capped at SIZE_MAX / 32 so
                          that element counts times 16 bytes never overflow */
    api_lease own_lease, *lease; /* call->lease, or own_lease when the caller gave none */
    int64_t call_ns;             /* when the route began: stage timings count from it */
    int64_t parse_ns;            /* spent in api__req_parse (reply->parse_ns) */
    api__body body;
    size_t parse_held, run_held;    /* of the lease: the parse tree, and the decoded tensors and
                                       scratch; given back as they are freed */
    size_t text_held;               /* of the lease: the reply text's estimate, trimmed to the
                                       reply (api__req_keep_text); it stays held until the
                                       lease ends */
    void *owned[API_REQ_MAX_OWNED]; /* buffers from api__req_alloc */
    size_t n_owned;
} api__req;

/* Starts a request: limits, and the lease (call->lease, or a private one without a budget),
 * whose deadline it shortens to --request-timeout-ms. Allocates nothing. */
void api__req_init(api__req *rq, const api_call *call);

/* Frees the body tree and every owned buffer and gives back what they held of the lease (and
 * ends a private lease). */
void api__req_free(api__req *rq);

/* Reserves `bytes` more through the lease, for the parse tree (`parse`) or the run: 413 naming
 * --max-memory-bytes when with what the lease holds it could never fit, 429 when it cannot fit
 * now. `what` says what the bytes are for, in the 413 message. */
int api__req_reserve(api__req *rq, size_t bytes, bool parse, const char *what, api__error *err);

/* Reserves the decoded tensors, the reply text and the engine scratch of a request together,
 * naming the three in a 413 message; `sized` false (a size overflowed) reserves everything,
 * which is a 413. The text's share stays in the lease after api__req_free: the reply outlives
 * the request's buffers until it is sent. */
int api__req_reserve_run(api__req *rq, bool sized, size_t tensors, size_t text, size_t scratch,
                         api__error *err);

/* Gives back what the lease holds for the reply text beyond `len` bytes, the reply's actual
 * size (0 for an error reply, whose small body is not accounted). */
void api__req_keep_text(api__req *rq, size_t len);

/* 413 for a body past --max-body-bytes, in the words every route uses. */
int api__req_check_body_size(const api__req *rq, api__error *err);

/* Scans `json` (len bytes), reserves what parsing it holds, and parses it into rq->body. */
int api__req_parse(api__req *rq, const char *json, size_t len, api__error *err);

/* Frees the body tree and gives its share of the lease back (once the tensors are decoded). */
void api__req_parse_done(api__req *rq);

/* A 64-byte-aligned buffer of `bytes` > 0 owned by the request; 503 when memory runs out. */
void *api__req_alloc(api__req *rq, size_t bytes, api__error *err);

/* One input tensor of a request and what it decodes to. sdpa.c and layer.c each list theirs,
 * then size, decode and place them with the three functions below. */
typedef struct {
    const api__tensor *t; /* probed */
    bool present;         /* false: the request has no such input; it is skipped */
    api__elem elem;
    unsigned flags; /* API_DECODE_* */
    void **dst;     /* gets the address of the decoded values */
    const char *field;
} api__input;

/* Adds to *bytes the buffers api__req_decode_input will allocate for in[0..n): none for absent
 * or empty inputs, nor for those used in place. False when a sum overflows (the inputs after
 * it are then not added). */
bool api__input_bytes(const api__input *in, size_t n, size_t *bytes);

/* Decodes the present input `in` into a buffer owned by rq, or, when api__tensor_in_place
 * allows, checks it where it lies in the body (the engine only reads its inputs) and uses it
 * there; sets *in->dst either way. Errors as api__tensor_decode and api__req_alloc. */
int api__req_decode_input(api__req *rq, const api__input *in, api__error *err);

/* Adds to *bytes the buffer api__req_alloc_output allocates for `count` floats; false when the
 * sum overflows. */
bool api__req_output_bytes(size_t count, size_t *bytes);

/* Points *out at a float buffer of `count` elements owned by rq, unless the route already
 * placed the output (*out not NULL: in its reply). 503 when memory runs out. */
int api__req_alloc_output(api__req *rq, float **out, size_t count, api__error *err);

/* 0 while the request may go on; else 504 (deadline) or API_STATUS_CLIENT_CLOSED (cancelled). */
int api__req_check_ctl(api__req *rq, api__error *err);

/* Shortens the deadline to the request's own `timeout_ms` (0: none given); the lease's deadline
 * (at most --request-timeout-ms) holds when it is earlier. */
void api__req_set_deadline(api__req *rq, int64_t timeout_ms);

/* An engine failure as an error: 422 invalid, 413 too big, 503 out of memory, 504 / cancelled,
 * 500 for the rest. `field` is the request's name for the engine's field (may be NULL). */
int api__req_engine_error(api__req *rq, eng_status st, const eng_error *e, const char *field,
                          api__error *err);

#endif
