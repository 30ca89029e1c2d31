/*
 * attention_bodies.h - one attention problem as the bodies of the daemon's routes for large
 * tensors, and its output read back from their replies: POST /v1/attention with base64 float32
 * tensors and "output_encoding": "base64", POST /v2/models/sdpa/infer with the binary tensor
 * extension, and gRPC ModelInfer with raw tensors, asking for the output alone, in binary. For
 * the benchmarks and tests that send the same problem several ways.
 *
 *     attn_problem p = {.q = q, .k = k, .v = v, .shape = {1, 16, 1024, 64}, .causal = true};
 *     size_t len, header_len;
 *     char *native = attn_body_native(&p, &len);          // POST /v1/attention
 *     char *v2 = attn_body_v2(&p, &len, &header_len);     // Inference-Header-Content-Length
 *     char *grpc = attn_body_grpc(&p, "sdpa", &len);      // framed, for grpc_start
 *     ...
 *     if (!attn_reply_output(&reply, want, count)) ...     // bit for bit
 *
 * The bodies are malloc'd (free them); NULL when memory runs out. Any thread.
 */
#ifndef ATTND_TESTS_ATTENTION_BODIES_H
#define ATTND_TESTS_ATTENTION_BODIES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    const float *q, *k, *v; /* contiguous [B, H, L, D] each, borrowed */
    int64_t shape[4];
    bool causal;
} attn_problem;

/* Elements of one of p's tensors. */
size_t attn_problem_count(const attn_problem *p);

/* The /v1/attention body: {"output_encoding": "base64", "causal"?, "query", "key", "value"}. */
char *attn_body_native(const attn_problem *p, size_t *len);

/* The /v2/models/sdpa/infer body: its JSON header (*header_len bytes, the value of
 * Inference-Header-Content-Length) with "binary_data_output" and "causal" parameters, then
 * the three tensors' bytes. */
char *attn_body_v2(const attn_problem *p, size_t *len, size_t *header_len);

/* A ModelInferRequest for `model` with raw FP32 inputs query, key and value of p's shape, the
 * bool parameter "causal" when p->causal, asking for "output" alone, framed with gRPC's prefix. */
char *attn_body_grpc(const attn_problem *p, const char *model, size_t *len);

/* Whether a ModelInferResponse message (`msg`, `len` bytes, prefix stripped) holds exactly the
 * `count` floats of `want` as its one raw output; want NULL: any one raw output. */
bool attn_grpc_output(const char *msg, size_t len, const float *want, size_t count);

/* A reply to one of the HTTP bodies: its bytes, and for v2 its Inference-Header-Content-Length. */
typedef struct {
    const char *body;
    size_t len;
    size_t header_len; /* v2: the JSON part, after which the output's bytes come */
    bool v2;
} attn_reply;

/* Whether reply `r` holds exactly the `count` floats of `want`: the bytes after the v2 JSON
 * header, or the native reply's base64 "output". */
bool attn_reply_output(const attn_reply *r, const float *want, size_t count);

#endif
