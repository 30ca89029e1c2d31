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

#include "api/ops/operation.h"
#include "api/ops/request.h"
#include "api/wire/buf.h"

/* A route: its steps (operation.h: read, check, size, place, decode, run, encode, batch,
 * free; read, place, batch and free may be NULL) and the style of its error replies. */
typedef struct {
    api_error_style style;
    api__steps steps;
} api__route;

/* Serves one request with route->steps: read, check; the sizes from size reserved at once
 * (api__req_reserve_run) before anything is allocated; a writer capped at the reply bound
 * (sizes.text); place; decode, whose end is reply->decode_ns (from rq->call_ns); run; encode,
 * timed from the end of the run; batch into reply->inferences. A failure at any step becomes
 * an error reply in route->style, with decode_ns measured up to the failure when decoding
 * never finished.
 *
 * `job` is the route's zeroed job, whose first member is its api__req (initialised here from
 * `call`); NULL (its allocation failed) is answered 503. The job's own pointers to that
 * api__req are the route's to set. Frees the writer, then the free step, then the api__req;
 * the job itself stays the caller's. Always fills `reply`. */
void api__serve(const api__route *route, void *job, const api_call *call, api_reply *reply);

#endif
