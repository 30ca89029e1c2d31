/*
 * operation.h - the one interface of api/'s operations (sdpa.h: scaled dot-product attention,
 * layer.h: the multi-head attention layer), so that a route of any protocol runs either the
 * same way: it fills the operation's request from its wire format (tensors probed, not
 * decoded), then check, bytes (to reserve), decode, run, and encodes the outputs in its own
 * format. Names in messages are the request's fields, which every protocol shares.
 */
#ifndef ATTND_API_OPS_OPERATION_H
#define ATTND_API_OPS_OPERATION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api/core/error.h"

/* The shape of an output: its rank follows the operation's main input (a rank-2 query or
 * input drops the batch axis). */
typedef struct {
    int rank;
    int64_t shape[4];
    size_t count;
} api__out_shape;

/* The outputs an operation may compute, in the order replies list them. */
enum { API__OUT_OUTPUT = 0, API__OUT_WEIGHTS, API__OUT_LSE, API__N_OUTPUTS };

/* An operation's steps; each takes its state (api__sdpa, api__layer), whose rq is set. */
typedef struct {
    /* Checks the request against itself and the limits, sets the deadline and the outputs'
     * shapes. 422 names the field; 413 --max-elements. */
    int (*check)(void *op, api__error *err);
    /* Bytes the call will allocate beyond the body: decoded inputs (none for raw tensors used
     * in place), the outputs when `outputs` (a route that places them in its reply counts them
     * there), and the engine's scratch. False when a sum overflows. */
    bool (*bytes)(void *op, bool outputs, size_t *tensors, size_t *scratch);
    /* Allocates and decodes every input, allocates the outputs the route did not place, and
     * frees the body tree (its reservation goes back to the budget). */
    int (*decode)(void *op, api__error *err);
    /* Runs the engine (checking the deadline and the cancel flag first); *compute_ns gets its
     * time. */
    int (*run)(void *op, int64_t *compute_ns, api__error *err);
    /* Output `o` (API__OUT_*) after check: its shape, with *slot (when slot is not NULL) the
     * pointer to its values, which a route may set before decode to place it in its reply.
     * NULL when this request does not compute it. */
    const api__out_shape *(*output)(void *op, int o, float ***slot);
    /* The precision run computes in (after check): what the request asked for, or float32
     * where the kernels in use cannot compute bfloat16 (replies name it). */
    eng_precision (*precision)(const void *op);
    /* The batch size: the inferences the request runs. */
    int64_t (*batch)(const void *op);
    /* Frees what the state owns beyond its rq; safe to call twice. NULL: nothing. */
    void (*free)(void *op);
} api__op;

/* The names of the outputs in messages and replies: "output", "weights", "lse". */
extern const char *const api__out_names[API__N_OUTPUTS];

#endif
