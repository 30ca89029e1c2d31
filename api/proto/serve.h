/*
 * serve.h - the one request driver of api/: the stages every inference route runs, in the same
 * order and failing the same way, whatever its protocol. A route is a table of steps and its
 * error style; the native routes (POST /v1/attention, /v1/mha) and the KServe v2 inference
 * route differ only in those. Any thread (an engine worker, for the compute).
 */
#ifndef ATTND_API_PROTO_SERVE_H
#define ATTND_API_PROTO_SERVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api/ops/request.h"
#include "api/wire/buf.h"

/* The steps of a route. Each takes the route's job (see api__serve) and returns 0, or -1 with
 * `err` filled. */
typedef struct {
    api_error_style style; /* of every error reply */
    /* Reads the body into rq->body before `parse` (framing, Content-Type, size, JSON); NULL
     * when `parse` reads it itself. */
    int (*read)(void *job, api__error *err);
    /* Reads the request into the job and checks it: fields, shapes, limits, the deadline. */
    int (*parse)(void *job, api__error *err);
    /* Bytes of the decoded tensors, the engine's scratch and an upper bound of the reply
     * (also its writer's maximum); false when a sum overflowed. */
    bool (*size)(void *job, size_t *tensors, size_t *scratch, size_t *text);
    /* After the reservation, before decoding: points outputs into the reply when the route
     * sends them as they are (into `w` or a buffer of its own). NULL: none. */
    int (*place)(void *job, api_buf *w, api__error *err);
    /* Allocates and decodes the inputs and frees the body tree. */
    int (*decode)(void *job, api__error *err);
    /* Runs the engine; *compute_ns gets its time. */
    int (*compute)(void *job, int64_t *compute_ns, api__error *err);
    /* Fills the status, content type and body of `reply` (from `w`, or what `place` made),
     * whose decode_ns and compute_ns are set. */
    int (*encode)(void *job, api_buf *w, api_reply *reply, api__error *err);
    /* The batch the reply counts in reply->inferences; NULL: none counted. */
    int64_t (*inferences)(const void *job);
    /* Frees what the job owns beyond its api__req, on every path; NULL: nothing. */
    void (*free)(void *job);
} api__route;

/* Serves one request with `route`: route->read, route->parse; the sizes from route->size
 * reserved at once (api__req_reserve_run) before anything is allocated; a writer capped at the
 * reply bound; route->place; route->decode, whose end is reply->decode_ns (from rq->call_ns);
 * route->compute; route->encode, timed from the end of the compute. A failure at any stage
 * becomes an error reply in route->style, with decode_ns measured up to the failure when
 * decoding never finished.
 *
 * `job` is the route's zeroed job, whose first member is its api__req (initialised here from
 * `call`); NULL (its allocation failed) is answered 503. The job's own pointers to that
 * api__req are the route's to set. Frees the writer, then route->free(job), then the api__req;
 * the job itself stays the caller's. Always fills `reply`. */
void api__serve(const api__route *route, void *job, const api_call *call, api_reply *reply);

#endif
