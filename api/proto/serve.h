/*
 * serve.h - the one request driver of api/: the stages every inference route runs, in the same
 * order and failing the same way, whatever its protocol. A route is a table of steps and its
 * error style; the native routes (POST /v1/attention, /v1/mha) and the KServe v2 inference
 * route differ only in those; and the same stages for a batch of requests whose engine calls
 * are one. Any thread (an engine worker, for the compute).
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
 * (sizes.text); place; decode, whose end is reply->decode_ns (from rq->call_ns, the body's
 * parse, rq->parse_ns, copied into reply->parse_ns); run; encode,
 * timed from the end of the run; batch into reply->inferences. A failure at any step becomes
 * an error reply in route->style, with decode_ns measured up to the failure when decoding
 * never finished.
 *
 * `job` is the route's zeroed job, whose first member is its api__req (initialised here from
 * `call`); NULL (its allocation failed) is answered 503. The job's own pointers to that
 * api__req are the route's to set. Frees the writer, then the free step, then the api__req;
 * the job itself stays the caller's. Always fills `reply`. */
void api__serve(const api__route *route, void *job, const api_call *call, api_reply *reply);

/* One request of a batch: api__serve's arguments. */
typedef struct {
    const api__route *route;
    void *job;
    const api_call *call;
    api_reply *reply;
} api__serve_member;

/* Serves each member as api__serve would, in the same steps, except that the runs of members
 * whose operations give the same batch_key (operation.h) are one run_batch call of at most
 * `max_rows` rows: every member read, checked, reserved and decoded first, then the runs, then
 * each encoded. The jobs stay the caller's. */
void api__serve_batch(const api__serve_member *members, int n, int64_t max_rows);

/* A route whose requests a batch may serve (api_call_batch): its steps, and how its job for
 * `call` is made: NULL with *answered false when memory ran out, NULL with *answered true when
 * it filled `reply` itself (a v2 request for an unknown model). free(job) frees it. `finish`
 * (may be NULL) completes a reply after the steps; `whole` (may be NULL: the route takes no
 * Content-Encoding) is the route's function, which a compressed body runs through alone. */
typedef struct {
    const api__route *route;
    void *(*job_new)(const api_call *call, api_reply *reply, bool *answered);
    void (*finish)(api_reply *reply);
    api_route_fn whole;
} api__batchable;

extern const api__batchable api__mha_batchable;         /* POST /v1/mha: native_mha.c */
extern const api__batchable api__v2_infer_batchable;    /* v2 inference: v2_infer.c */
extern const api__batchable api__grpc_infer_batchable;  /* ModelInfer: grpc_infer.c */
extern const api__batchable api__grpc_stream_batchable; /* ModelStreamInfer's messages */

#endif
