/*
 * operation.h - the one interface of api/'s operations (sdpa.h: scaled dot-product attention,
 * layer.h: the multi-head attention layer), so that a route of any protocol runs either the
 * same way: it fills the operation's request from its wire format (tensors probed, not
 * decoded), then runs the operation's steps (check, size to reserve, decode, run) inside its
 * own (api__steps: the one table both share) and encodes the outputs in its own format. Names
 * in messages are the request's fields, which every protocol shares.
 */
#ifndef ATTND_API_OPS_OPERATION_H
#define ATTND_API_OPS_OPERATION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api/core/error.h"
#include "api/wire/buf.h"

/* The shape of an output: its rank follows the operation's main input (a rank-2 query or
 * input drops the batch axis). */
typedef struct {
    int rank;
    int64_t shape[4];
    size_t count;
} api__out_shape;

/* The outputs an operation may compute, in the order replies list them. */
enum { API__OUT_OUTPUT = 0, API__OUT_WEIGHTS, API__OUT_LSE, API__N_OUTPUTS };

/* What a request reserves before anything is allocated (api__req_reserve_run), each step
 * adding its part: an operation its decoded inputs, buffers of its own and the engine's
 * scratch; a route the outputs, wherever it puts them, and an upper bound of its reply. */
typedef struct {
    size_t tensors, scratch, text;
} api__sizes;

struct api__op;

/* The steps of serving one request, in their order, one vocabulary for the routes of every
 * protocol (serve.h) and the operations they run. An operation has check, size, decode, run,
 * batch and free; a route adds read, place and encode, and its check, size, decode and run
 * are its operation's with its wire format around them. Each takes its job (a route's) or its
 * state (an operation's: api__sdpa, api__layer, whose rq is set); NULL: nothing to do. */
typedef struct {
    /* Reads the body (framing, Content-Type, size, JSON) before check reads its fields. */
    int (*read)(void *job, api__error *err);
    /* Reads the request and checks it against itself and the limits: fields, shapes, the
     * deadline, the outputs' shapes. 422 names the field; 413 --max-elements. */
    int (*check)(void *job, api__error *err);
    /* Adds the bytes the call will allocate beyond the body to *sz; false when a sum
     * overflows. */
    bool (*size)(void *job, api__sizes *sz);
    /* After the reservation, before decode: points outputs into the reply when the route sends
     * them as they are. */
    int (*place)(void *job, api_buf *w, api__error *err);
    /* Allocates and decodes every input, allocates the outputs not placed, and frees the body
     * tree (its reservation goes back to the budget). */
    int (*decode)(void *job, api__error *err);
    /* Runs the engine (checking the deadline and the cancel flag first); *compute_ns gets its
     * time. */
    int (*run)(void *job, int64_t *compute_ns, api__error *err);
    /* Fills the status, content type and body of `reply` (from `w`, or what place made). */
    int (*encode)(void *job, api_buf *w, api_reply *reply, api__error *err);
    /* The inferences the request runs (its batch), which the v2 models' metrics count. */
    int64_t (*batch)(const void *job);
    /* Frees what the job owns beyond its api__req, on every path; safe to call twice. */
    void (*free)(void *job);
    /* A route's operation and its state, for a batch (api__serve_batch); NULL: the route's
     * requests run alone. */
    void *(*operation)(void *job, const struct api__op **op);
} api__steps;

/* An operation: its steps, and what a route asks of it between them. */
typedef struct api__op {
    api__steps steps;
    /* Output `o` (API__OUT_*) after check: its shape, with *slot (when slot is not NULL) the
     * pointer to its values, which a route may set before decode to place it in its reply.
     * NULL when this request does not compute it. */
    const api__out_shape *(*output)(void *op, int o, float ***slot);
    /* The precision run computes in (after check): what the request asked for, or float32
     * where the kernels in use cannot compute bfloat16 (replies name it). */
    eng_precision (*precision)(const void *op);
    /* After decode: what requests whose run may share one engine call have in common (those
     * with the same key run as one, run_batch), and *rows, the input rows this one adds; NULL
     * (or no batch_key): it runs alone. */
    const void *(*batch_key)(const void *op, int64_t *rows);
    /* The run step of n requests of one batch_key as one engine call: rc[i] (0 or -1),
     * compute_ns[i] and errs[i] as run gives them for ops[i] alone. */
    void (*run_batch)(void *const *ops, int n, int64_t *compute_ns, int *rc, api__error *errs);
} api__op;

/* The names of the outputs in messages and replies: "output", "weights", "lse". */
extern const char *const api__out_names[API__N_OUTPUTS];

#endif
