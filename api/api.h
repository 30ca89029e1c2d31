/*
 * api.h - the wire contract of attnd: request bodies in, engine calls, response bodies out.
 *
 * api/ turns the bytes of a request into validated engine arguments, runs the engine, and turns
 * the result (or the failure) into the bytes and HTTP status of the reply. It is pure functions
 * on byte buffers: no sockets, so every path is testable without a server. Only api/ includes
 * <jansson.h>, and only api/ maps statuses to HTTP codes. Semantics: docs/semantics.md; routes
 * and statuses: docs/http-api.md.
 *
 * Usage (what the daemon does on an engine worker for POST /v1/attention):
 *
 *     api_budget *budget = api_budget_new((size_t)8 << 30); // once, at start-up
 *     api_limits limits = api_limits_default();
 *
 *     api_lease lease;                  // when the request arrives
 *     api_lease_start(&lease, budget, eng_now_ns(), limits.max_timeout_ms);
 *     api_call call = {.body = body, .body_len = len, .content_type = "application/json",
 *                      .pool = pool, .lease = &lease, .limits = &limits};
 *     api_reply reply;
 *     api_attention(&call, &reply);     // always fills reply, success or not
 *     send(reply.status, reply.content_type, reply.body, reply.body_len);
 *     api_reply_free(&reply);
 *     api_lease_end(&lease);            // the request is complete
 *
 * At start-up, each --model (a safetensors file or a checkpoint directory) joins the registry
 * that routes naming a model read:
 *
 *     api_models *models = api_models_new();           // holds "demo"
 *     api_model_source src = {.name = "enc", .path = "enc.safetensors", .layer = -1};
 *     char err[512];
 *     if (!api_models_load(models, &src, err, sizeof err))
 *         fprintf(stderr, "--model enc: %s\n", err);
 *
 * Threads: every function is safe to call from any thread; api_budget is shared and
 * internally synchronised. Ownership: an api_call borrows everything it points to for the
 * call; an api_reply owns its body until api_reply_free (or api_reply_take_body).
 */
#ifndef ATTND_API_H
#define ATTND_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api/status.h"
#include "engine/engine.h"

/* ---- Text buffers ------------------------------------------------------------------------- */

/* The daemon's one growable byte buffer: reply bodies, request bodies, metrics, statistics and
 * log lines are built in it. Its maximum is given at init (as curl's dynbuf does), so no caller
 * can forget to bound a buffer that grows with client input. Errors are sticky: once a write
 * fails, later writes do nothing and `state` says why, so a writer checks once at the end. The
 * storage comes from eng_buf_alloc (big buffers keep their pages for the next request). A
 * buffer belongs to one thread at a time.
 *
 *     api_buf b;
 *     api_buf_init(&b, 4096);
 *     api_buf_cstr(&b, "{\"path\":");
 *     api_buf_json_string(&b, path, strlen(path));
 *     api_buf_char(&b, '}');
 *     if (b.state == API_BUF_OK) write(fd, b.data, b.len);
 *     api_buf_free(&b);
 */
typedef enum {
    API_BUF_OK = 0,
    API_BUF_FULL,  /* a write would have passed the maximum size */
    API_BUF_NOMEM, /* the allocator failed */
} api_buf_state;

typedef struct {
    char *data; /* not NUL-terminated (api_buf_take terminates it) */
    size_t len, cap, max;
    api_buf_state state;
} api_buf;

/* An empty buffer that never grows beyond `max` bytes. Allocates nothing yet. */
void api_buf_init(api_buf *w, size_t max);
void api_buf_free(api_buf *w); /* and empty again, with the same maximum */

/* Makes room for n more bytes and returns where they go (then advance w->len yourself), or
 * NULL (state set) when that is impossible. Grows geometrically up to 1 MiB, then to the
 * maximum at once. */
char *api_buf_reserve(api_buf *w, size_t n);
/* Grows the allocation to exactly `cap` bytes (at most the maximum), for a caller that
 * accounts for every allocated byte (a request body against the memory budget). */
bool api_buf_grow_to(api_buf *w, size_t cap);

void api_buf_mem(api_buf *w, const void *src, size_t n);
void api_buf_cstr(api_buf *w, const char *s); /* raw, not quoted */
void api_buf_char(api_buf *w, char c);
/* `s` (n bytes) as a JSON string with its quotes: ", \ and control characters escaped,
 * well-formed UTF-8 kept, any other byte written as U+FFFD (JSON must be UTF-8). */
void api_buf_json_string(api_buf *w, const char *s, size_t n);
void api_buf_int(api_buf *w, int64_t v);
void api_buf_float(api_buf *w, float f); /* f must be finite (checked by the caller) */
void api_buf_printf(api_buf *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Hands the data over (NUL-terminated; free it with eng_buf_free), its length in *len, and
 * empties the buffer; NULL when a write failed or memory ran out. */
char *api_buf_take(api_buf *w, size_t *len);

/* ---- Limits and the memory budget --------------------------------------------------------- */

/* Per-request limits. Each message that reports a violation names the flag that sets it. */
typedef struct {
    size_t max_body_bytes;  /* --max-body-bytes: 413 beyond it */
    size_t max_elements;    /* --max-elements: tensor elements in one request, inputs and
                               outputs (output, weights, lse) added up: 413 beyond it */
    int64_t max_timeout_ms; /* --request-timeout-ms: the deadline of a request, counted from
                               its lease's start, and the cap of its "timeout_ms"; <= 0: none */
    eng_precision default_precision; /* --default-precision: for requests that do not say */
    uint32_t priority_levels;        /* --priority-levels: a v2 "priority" above it is 400 */
    uint32_t default_priority_level; /* --default-priority-level: for "priority" 0 or absent,
                                        in [1, priority_levels] */
} api_limits;

/* Defaults matching the daemon's flag defaults: 256 MiB of body, 2^28 elements (1 GiB as
 * float32; more numbers than a 256 MiB JSON body can hold), 60 s, two priority levels with the
 * lower one (2) the default. */
api_limits api_limits_default(void);

/* A global byte budget shared by all requests (--max-memory-bytes). A request reserves, through
 * its lease (below), its estimated peak before it allocates: its body, what parsing the body
 * holds (counted by a quick scan, ~64 bytes per JSON value), the decoded inputs, the outputs,
 * the reply text, and the engine's scratch (eng_sdpa_scratch_bytes). Lock-free; never waits. */
typedef struct api_budget api_budget;

typedef enum {
    API_BUDGET_OK = 0,  /* reserved; release it when the request ends */
    API_BUDGET_NEVER,   /* larger than the whole budget: 413 */
    API_BUDGET_NOT_NOW, /* would fit in an idle daemon, not now: 429 + Retry-After */
} api_budget_result;

api_budget *api_budget_new(size_t total_bytes); /* NULL on allocation failure */
void api_budget_free(api_budget *budget);       /* NULL is a no-op */
/* Reserves `bytes` if they fit now; never blocks. */
api_budget_result api_budget_reserve(api_budget *budget, size_t bytes);
/* Gives back bytes reserved earlier (exactly what was reserved, in any number of calls). */
void api_budget_release(api_budget *budget, size_t bytes);
size_t api_budget_in_use(api_budget *budget);      /* for metrics */
size_t api_budget_total(const api_budget *budget); /* the total given to api_budget_new */

/* ---- One request's lease ------------------------------------------------------------------ */

/* What one request holds of the daemon from its arrival to its completion: its bytes in the
 * memory budget, its arrival time, and its control block (the cancel flag and the one
 * deadline). The server starts it when the request arrives; every layer reserves through it
 * the bytes it is about to allocate (body, parse tree, decoded tensors, scratch, reply text),
 * may give back early what it has freed, and api_lease_end returns the rest once, when the
 * request completes. The deadline is set when the lease starts; the layers below may only
 * shorten it (a request's own timeout). A request that, with what its lease holds, could never
 * fit in the whole budget is told so (API_BUDGET_NEVER: 413), not asked to retry.
 *
 * One thread at a time uses a lease (the request's owner: the I/O thread while the body
 * arrives, a worker while it computes); any thread may set ctl.cancel. */
typedef struct {
    api_budget *budget; /* NULL: no budget; every reservation succeeds */
    size_t held;        /* bytes held in `budget` now */
    int64_t start_ns;   /* eng_now_ns() at arrival: deadlines count from it */
    eng_ctl ctl;        /* what the engine checks: cancel, and deadline_ns (0: none) */
} api_lease;

/* Starts a lease holding nothing, not cancelled, with the deadline `timeout_ms` after
 * `start_ns` (<= 0: none). */
void api_lease_start(api_lease *lease, api_budget *budget, int64_t start_ns, int64_t timeout_ms);
/* Adds `bytes` to what the lease holds if they fit now (see api_budget_reserve). */
api_budget_result api_lease_reserve(api_lease *lease, size_t bytes);
/* Gives back `bytes` (at most what it holds) whose memory was freed before the end. */
void api_lease_give_back(api_lease *lease, size_t bytes);
/* Moves the deadline to `timeout_ms` after the start when that is earlier (<= 0: no change). */
void api_lease_shorten(api_lease *lease, int64_t timeout_ms);
/* Returns everything the lease still holds; a second call does nothing. */
void api_lease_end(api_lease *lease);

/* ---- Registered models -------------------------------------------------------------------- */

/* The models the daemon serves by name: the built-in "demo" and every --model. Built once at
 * start-up on the main thread, read-only afterwards (so any thread may read). */
typedef struct api_models api_models;

/* What describes a model read from a checkpoint: its family (config.json's model_type) and the
 * index in the checkpoint of the model's first layer (K of :layer=K; 0 for every layer). */
typedef struct {
    char family[32];
    int64_t layer;
} api_model_about;

/* A registered model: one attention layer (the demo, a file's, a checkpoint's :layer=K) or the
 * attention layers of a whole checkpoint, in their order. Every layer bears the model's name and
 * has its embed_dim, heads, kv heads and head size (their positions, windows and scales may
 * differ); layer[i] is layer about->layer + i of its checkpoint. */
typedef struct {
    const char *name;
    int64_t layers;                /* N >= 1 */
    const eng_layer *const *layer; /* [N] */
    const api_model_about *about; /* NULL: no checkpoint's (the demo, a file's, api_models_add's) */
} api_model;

/* A registry holding the demo layer; NULL when memory runs out. */
api_models *api_models_new(void);
void api_models_free(api_models *models); /* NULL is a no-op; frees the layers too */

/* Registers `layer` as a one-layer model under its name, taking ownership of it (also on
 * failure, when it is freed). Fails, with `err` filled, when the name is taken or not a valid
 * model name ([A-Za-z0-9_.-], 1 to 63 bytes). */
bool api_models_add(api_models *models, eng_layer *layer, char *err, size_t errlen);

/* What a --model names: a safetensors file with one attention layer (its tensors named as
 * nn.MultiheadAttention's state dict, q_proj/k_proj/v_proj/o_proj or W_Q/W_K/W_V/W_O, its head
 * counts from the header's __metadata__ unless given) or a Hugging Face checkpoint directory
 * (config.json plus model.safetensors, or model.safetensors.index.json and its shards), of
 * which every decoder layer's attention is served, or one. Which of the two a path is, api
 * decides. */
typedef struct {
    const char *name;        /* the model's name */
    const char *path;        /* a file or a checkpoint directory */
    int64_t layer;           /* a directory's one layer; < 0: not given (every layer) */
    int64_t heads, kv_heads; /* a file's head counts; 0: from the file */
} api_model_source;

/* Loads `src` and registers it under src->name. The files are mapped for the call and only the
 * layers' attention tensors read. The registered model, or NULL with `err` filled: a sentence
 * naming the path and the tensor or config field that stops the load, or why the name cannot
 * be registered. Main thread, at start-up (as api_models_add). */
const api_model *api_models_load(api_models *models, const api_model_source *src, char *err,
                                 size_t errlen);

/* The attention of layer `layer` of the Hugging Face checkpoint in directory `dir`
 * (config.json plus model.safetensors, or model.safetensors.index.json and its shards; the
 * files are mapped and only that layer's attention tensors read), as a decoder layer named
 * `name`. *bytes_read (may be NULL) gets the bytes of the tensors read. NULL on failure, with
 * `err` naming the config field, file or tensor that stops it. api_models_add registers it
 * without its description (api_models_load keeps it). */
eng_layer *api_checkpoint_load(const char *name, const char *dir, int64_t layer, size_t *bytes_read,
                               char *err, size_t errlen);

/* One line describing a registered model for logs: family, layers, heads, kv heads, head size,
 * positions, windows, dtype, bytes of weights (every layer's, panels included). */
void api_model_summary(const api_model *model, char *buf, size_t len);

/* The parameters of every layer of the model, and the bytes they and their packed panels take
 * (eng_layer_params, eng_layer_bytes summed). */
int64_t api_model_params(const api_model *model);
size_t api_model_bytes(const api_model *model);

/* The model called `name`, or NULL. */
const api_model *api_models_find(const api_models *models, const char *name);

/* The number of models and the i-th (in registration order, "demo" first). */
size_t api_models_count(const api_models *models);
const api_model *api_models_at(const api_models *models, size_t i);

/* ---- One call ------------------------------------------------------------------------------ */

typedef struct api_sessions api_sessions; /* the KV-cache sessions (below) */

typedef struct {
    const char *body; /* the request body, not NUL-terminated */
    size_t body_len;
    const char *content_type; /* the Content-Type header value; NULL if absent (taken as JSON) */
    eng_pool *pool;
    api_lease *lease;         /* the request's memory, deadline and cancel flag; the call reserves
                                 through it and shortens its deadline to the request's own timeout.
                                 What it reserved for the reply text stays held until the caller ends
                                 the lease. NULL: a private one, ended by the call (no budget, no
                                 cancellation, the deadline from the limits counted from the call) */
    const api_limits *limits; /* NULL: api_limits_default() */
    const api_models *models; /* the registered models (routes that name a model) */
    /* HTTP details some routes need (NULL when absent), captured by the server: */
    const char *content_encoding; /* Content-Encoding: undone by api_call_encoded */
    const char *accept_encoding;  /* Accept-Encoding: api_call_encoded compresses the reply */
    const char *inference_header_length; /* Inference-Header-Content-Length (KServe v2 binary
                                            tensors): the length of the JSON part of the body */
    const char *request_id; /* X-Request-Id, the client's or one the server made up: the id of a
                               v2 reply whose request has none */
    const char *model;      /* path parameters of /v2/models/{model}[/versions/{version}]/... */
    const char *version;    /* NULL: no /versions/ segment */
    api_sessions *sessions; /* the KV-cache sessions; NULL: --kv-cache-bytes 0 (sessions off) */
    const char *session;    /* the {id} of /v1/sessions/{id}/...; NULL elsewhere */
    bool body_unread;       /* the server could not read the compressed body as it admitted the
                               request (api_peek.unread): a step it names a session or a v2
                               sequence for has no place in that order, and is refused (413) */
    bool body_movable;      /* the caller owns body's buffer, frees it after the call and reads
                               nothing of it meanwhile: the route may move bytes within it
                               (gRPC moves a raw tensor onto its alignment, to use it in place) */
} api_call;

/* Why a request failed, for the attnd_rejected_total{reason} metric. */
#define API_REASON_LIST(X)                                                                         \
    X(API_REASON_NONE, "none")                                                                     \
    X(API_REASON_QUEUE_FULL, "queue_full")                                                         \
    X(API_REASON_MEMORY, "memory")                                                                 \
    X(API_REASON_DEADLINE, "deadline")                                                             \
    X(API_REASON_CANCELLED, "cancelled")                                                           \
    X(API_REASON_DRAINING, "draining")                                                             \
    X(API_REASON_TOO_LARGE, "too_large")                                                           \
    X(API_REASON_BAD_REQUEST, "bad_request")                                                       \
    X(API_REASON_INTERNAL, "internal")                                                             \
    X(API_REASON_UNAUTHORIZED, "unauthorized")

typedef enum {
#define API_REASON_ENUM(name, text) name,
    API_REASON_LIST(API_REASON_ENUM)
#undef API_REASON_ENUM
} api_reason;

const char *api_reason_str(api_reason reason);

/* The status of a reply to a request that was cancelled (ENG_ECANCELLED: the client went
 * away), after nginx's "499 client closed request". The server drops such a reply instead of
 * sending it; it exists so that metrics and logs can count it. */
#define API_STATUS_CLIENT_CLOSED 499

/* A finished reply: the HTTP status and an owned body ready to send. */
typedef struct {
    int status;               /* HTTP status code */
    const char *content_type; /* static string */
    char *body;               /* from eng_buf_alloc (reused pages); owned by the reply */
    size_t body_len;
    int retry_after_s; /* > 0: send Retry-After with this value (429 and 503 get 1) */
    api_reason reason; /* API_REASON_NONE on success */
    /* Where the request's time went, in nanoseconds, each stage apart from the others (0: it
     * did not happen). api/ measures decode_ns (from the route's start to its tensors decoded,
     * parse_ns included), parse_ns (undoing a content coding and parsing the JSON), compute_ns
     * and encode_ns; the server adds what preceded the route when the job ends: receive_ns
     * (from the request's first byte to its last, copy_ns excluded), copy_ns (the edge's copying
     * of the body into one buffer) and queue_ns (admitted until a worker took it). */
    int64_t decode_ns, compute_ns, encode_ns;
    int64_t parse_ns;
    int64_t receive_ns, copy_ns, queue_ns;
    /* Response headers some routes add (zero / NULL: none): */
    const char *content_encoding; /* static "gzip" or "deflate": the body is compressed */
    int64_t inference_header_len; /* > 0: Inference-Header-Content-Length (KServe v2 binary
                                     outputs: the length of the JSON part, uncompressed) */
    int64_t inferences; /* inferences the request ran (its batch size; 0 when none ran): for
                           nv_inference_count */
    char location[96];  /* non-empty: a Location header (201 of POST /v1/sessions and fork) */
    char session[40];   /* non-empty: the id of the session the request stepped (a session's
                           attention, /v1/mha over a session, a step of a v2 sequence), for
                           the access log and the step metric */
} api_reply;

/* Frees the body (if still owned); NULL is a no-op, and so is a second call. */
void api_reply_free(api_reply *reply);

/* Hands the body over to the caller (free it with eng_buf_free; NULL if there is none) and
 * stores its length in *len (when len is not NULL): for a zero-copy response with a free
 * callback. */
char *api_reply_take_body(api_reply *reply, size_t *len);

/* POST /v1/attention: decodes, validates, reserves memory, runs eng_sdpa and encodes the
 * reply. Always fills `reply` (an error reply is {"error": {"code", "message", "field"}}; its
 * body is NULL only if even that could not be allocated). Runs on an engine worker; the engine
 * call fans out over `pool` and returns when done, so this blocks for the request's compute.
 *
 * The request format is docs/semantics.md's; api/proto/native_attention.c opens
 * with the exact field list.
 * Statuses: 200; 400 malformed JSON (jansson's message with line, column and byte; this
 * includes numbers too large for a double, like 1e999, and nesting deeper than 2048); 413 body,
 * elements or memory past a limit (the message names --max-body-bytes, --max-elements or
 * --max-memory-bytes); 415 a Content-Type other than application/json (a charset parameter
 * other than utf-8 too; a missing one is accepted); 422 well-formed but invalid, with "field"
 * naming the part ("query.shape[1]", "attn_mask[0][3]"); 429 memory budget full now
 * (Retry-After: 1); 503 out of memory despite the budget (Retry-After: 1); 504 deadline
 * (--request-timeout-ms or "timeout_ms"); API_STATUS_CLIENT_CLOSED when lease->ctl.cancel was
 * set;
 * 500 only for a bug. */
void api_attention(const api_call *call, api_reply *reply);

/* GET /v1/models: fills `reply` (200, {"models": [...]}: name, embed_dim, num_heads,
 * num_kv_heads, head_dim, kdim, vdim, bias, bias_kv, dtype, parameters of each layer). Cheap:
 * meant for the server's own thread. Always fills `reply`. */
void api_models_list(const api_models *models, api_reply *reply);

/* GET /v1/models/{name}: one layer's description as above, or 404 with a native error. */
void api_models_get(const api_models *models, const char *name, api_reply *reply);

/* POST /v1/mha: a multi-head attention layer (call->models by "model", or inline "weights")
 * on token embeddings, self- or cross-attention. The request format is docs/semantics.md's;
 * api/proto/native_mha.c opens with the exact field list. Statuses and behaviour as api_attention,
 * plus 404 for an unknown model. With "session" (call->sessions) it is one decoder-layer step
 * of that KV-cache session: the input's keys and values are appended and its queries attend
 * over the whole cache; the reply adds "length", and the statuses of
 * api_session_attention apply (404 session_not_found / session_evicted, 409 expect_length,
 * 413 max_tokens, 422 a session of another model or shape, 429 a full pool, 501 sessions off). */
void api_mha(const api_call *call, api_reply *reply);

/* Fills `reply` (which need not be initialised) with an error body in `style` for failures
 * found outside the routes (unknown route, wrong method, body over the cap, queue full...):
 * the server's refusals on /v2 paths take the KServe form. `field` may be NULL (the v2 form has
 * none). The reply's HTTP code is api_status_http(style, status) and the native "code" is
 * api_status_name(status); 429 and 503 get retry_after_s = 1, which the caller may change. */
void api_reply_error_status(api_reply *reply, api_error_style style, api_status status,
                            api_reason reason, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/* ---- KV-cache sessions (docs/sessions.md) ---------------------------------------------- */

/* The registry of a daemon's sessions: each a KV cache of one sequence (engine.h eng_kv_*) in
 * one pool of --kv-cache-bytes, under an id that is random, URL-safe and unguessable ("s" and
 * 32 hex digits: 8 naming this process, drawn at start-up, then 96 bits from getrandom). A session
 * keeps its shape, its default step options, its created and last-used times and its idle TTL. Idle
 * sessions past their TTL are freed (lazily: by every registry call, and by the stats the metrics
 * scrape reads); when the pool is full a step evicts the least recently used idle session (never
 * one with a step admitted or running). The ids of the last 4096 sessions evicted or expired are
 * remembered, so that they answer 404 "session_evicted" (create it again) rather than
 * "session_not_found"; so do the ids of another process (a lost or restarted replica, reached
 * through the load balancer's consistent hash).
 *
 * Order: steps of one session apply in arrival order. The server takes a ticket for each
 * request on a session as it admits it (its I/O thread: arrival order), and a worker asks for
 * the ticket's turn before it runs the request: a request whose turn has not come is parked in
 * the session (the worker returns at once; nothing blocks on a step that has not started) and
 * resumed by the end of the one before it. Every ticket taken must end (api_session_turn_end),
 * whether its request ran or not. The requests of one KServe v2 sequence (Triton's
 * sequence_id) keep their order the same way, with tickets of the sequence
 * (api_sequence_ticket_take), since its session is made by its START request only once that
 * runs.
 *
 *     api_sessions_config cfg = {.capacity_bytes = (size_t)1 << 30, .block_tokens = 64,
 *                                .ttl_s = 600};
 *     api_sessions *reg = api_sessions_new(&cfg, msg, sizeof msg);   // once, at start-up
 *     api_session_ticket t;                                           // I/O thread, admission
 *     if (api_session_ticket_take(reg, id, &t)) {
 *         if (!api_session_turn(reg, &t, resubmit, job)) return;     // worker: parked
 *         call.sessions = reg; call.session = id;
 *         api_session_attention(&call, &reply);                      // the step
 *         api_session_turn_end(reg, &t);                             // may call resubmit(next)
 *     }
 *     api_sessions_free(reg);                                         // at exit
 *
 * Threads: every function may be called from any thread; one mutex guards the registry (held
 * for lookups, never for a computation: a step marks its session busy and computes unlocked). */

typedef struct {
    size_t capacity_bytes; /* --kv-cache-bytes: the pool of every session's blocks */
    int64_t block_tokens;  /* --kv-block-tokens */
    int64_t ttl_s;         /* --session-ttl-s: the idle expiry of a session that sets none */
} api_sessions_config;

/* A registry over a new KV pool; NULL with `msg` filled when the pool cannot be made. */
api_sessions *api_sessions_new(const api_sessions_config *cfg, char *msg, size_t msglen);
/* Frees every session and the pool; no request may be using it. NULL is a no-op. */
void api_sessions_free(api_sessions *reg);

/* Counters and gauges for /metrics (and the TTL sweep, which it runs first). */
typedef struct {
    int64_t live, created_total;
    int64_t evicted_ttl, evicted_pressure, deleted, ended; /* sessions ended, by reason */
    size_t bytes_used, bytes_capacity;
    int64_t tokens;
} api_sessions_stats;
void api_sessions_stats_get(api_sessions *reg, api_sessions_stats *stats);

/* A place in the order of one session's requests, or of one v2 sequence's. */
typedef struct {
    void *session;  /* pinned until api_session_turn_end; NULL: no ticket of a session */
    void *sequence; /* the v2 sequence's order, held until api_session_turn_end; NULL: none */
    uint64_t number;
} api_session_ticket;

/* Takes the next ticket of session `id` (pinning it: it is not evicted while the ticket is
 * outstanding). False, with *t zeroed, when there is no such live session (the route answers
 * the 404 itself). */
bool api_session_ticket_take(api_sessions *reg, const char *id, api_session_ticket *t);
/* Takes the next ticket of the KServe v2 sequence `sequence_id` (id_len bytes, as the request
 * writes it: an integer's digits or a string's bytes between its quotes, escapes not undone;
 * api_peek_v2 reads it) of model `model`, so that its requests run in arrival order whether or
 * not its session exists yet: a sequence_start waits for the steps before it and the steps
 * after it wait for it. While a sequence has tickets outstanding its session is not evicted or
 * expired. False, with *t zeroed, only when reg is NULL, the id is empty (or holds a NUL) or
 * memory runs out (the request then runs in no particular order, as it would without a
 * ticket). Any thread; the server calls it on its I/O thread as it admits the request. */
bool api_sequence_ticket_take(api_sessions *reg, const char *model, const char *sequence_id,
                              size_t id_len, api_session_ticket *t);
/* True when it is t's turn; otherwise parks t and returns false: resume(arg) is called once,
 * from the thread that ends the step before it, without the registry's lock held. */
bool api_session_turn(api_sessions *reg, api_session_ticket *t, void (*resume)(void *arg),
                      void *arg);
/* The request of t is over (answered, or dropped without running): the next in line may run.
 * Unpins the session and zeroes *t; a zeroed ticket is a no-op. */
void api_session_turn_end(api_sessions *reg, api_session_ticket *t);

/* The routes. Each answers 501 with a message when call->sessions (or `reg`) is NULL
 * (sessions off), 404 {"error": {"code": "session_not_found"}} for an unknown id and 404
 * "session_evicted" for one evicted or expired. The POST routes run on an engine worker and
 * reserve through call->lease like api_attention; the others are cheap (MHD thread).
 *
 * POST /v1/sessions: {num_heads, num_kv_heads?, head_dim, value_head_dim?, cache_dtype?
 * ("float32" | "bfloat16" | "float16"), max_tokens?, ttl_s?, scale?, softcap?, window?,
 * alibi?, precision?, causal?} -> 201 with the session's description and reply->location. Or
 * {model, ...} (call->models): the cache of that layer, stepped by api_mha, its heads and head
 * size the layer's (given ones must match it: 422 naming the field; 404 for no such model). */
void api_sessions_create(const api_call *call, api_reply *reply);
/* GET /v1/sessions/{id}: {id, length, bytes, cache_dtype, num_heads, ..., created, last_used,
 * ttl_s}. */
void api_sessions_get(api_sessions *reg, const char *id, api_reply *reply);
/* GET /v1/sessions?limit=N&after=ID: {"sessions": [...], "next": ID or null}, in creation
 * order, at most `limit` (1-1000; NULL: 100) after the session `after` (NULL: from the
 * first); a malformed limit is 422. */
void api_sessions_list(api_sessions *reg, const char *limit, const char *after, api_reply *reply);
/* DELETE /v1/sessions/{id}: 204. A step in flight finishes; the blocks go with the last. */
void api_sessions_delete(api_sessions *reg, const char *id, api_reply *reply);
/* POST /v1/sessions/{id}/attention (call->session): {query?, key?, value?, expect_length?,
 * the step options of /v1/attention (scale, softcap, precision, causal, query_offset, window,
 * alibi, return_weights, return_lse, output_encoding, output_dtype, timeout_ms)}: appends
 * key/value, then attends query (bottom-right causal by default) over the whole cache.
 * Replies like api_attention plus "length". 409 when expect_length differs from the length;
 * 413 past max_tokens or what --kv-cache-bytes could ever hold; 422 for shapes that do not
 * match the session; 429 when the cache is full of sessions with steps in flight. */
void api_session_attention(const api_call *call, api_reply *reply);
/* POST /v1/sessions/{id}/truncate {"length": n, "expect_length"?}: keeps the first n tokens. */
void api_session_truncate(const api_call *call, api_reply *reply);
/* POST /v1/sessions/{id}/fork {"ttl_s"?} (the body may be empty): 201, a new session sharing
 * the tokens copy-on-write, with reply->location. */
void api_session_fork(const api_call *call, api_reply *reply);

/* ---- Open Inference Protocol (KServe v2) --------------------------------------------------- */

/* The route functions of the v2 protocol (api/proto/v2_infer.c opens with the exact formats). Every
 * reply is JSON; errors are {"error": "message"}. Models: "sdpa" (the bare operation) and every
 * layer of call->models, each with the one version "1". call->model and call->version are the path
 * parameters; an unknown model or version is 404. Cheap ones (metadata, ready) may run on the
 * server's own thread; api_v2_infer runs on an engine worker like api_attention. */

#define API_V2_VERSION "1" /* the version of every model */

/* GET /v2: {"name": "attnd", "version", "extensions": [...]}. */
void api_v2_server_metadata(api_reply *reply);

/* GET /v2/models/{m}[/versions/{v}]: name, versions, platform, inputs and outputs (name,
 * datatype, shape with -1 for variable dimensions). */
void api_v2_model_metadata(const api_call *call, api_reply *reply);

/* GET /v2/models/{m}[/versions/{v}]/config: Triton's model configuration of the same tensors
 * (data_type, dims, optional inputs), max_batch_size 0, no batching, not decoupled. */
void api_v2_model_config(const api_call *call, api_reply *reply);

/* GET /v2/models/{m}[/versions/{v}]/ready: {"name", "ready": true} (404 for no such model). */
void api_v2_model_ready(const api_call *call, api_reply *reply);

/* Whether {model, version} (version may be NULL) names a model: for metrics labels. */
bool api_v2_model_known(const api_models *models, const char *model, const char *version);

/* One model's counters for Triton's statistics extension, as the server keeps them: the data of
 * both GET /v2/models[/{m}]/stats and gRPC's ModelStatistics. */
typedef struct {
    uint64_t count, ns;
} api_stat_duration;

typedef struct {
    const char *name; /* borrowed for the call */
    uint64_t last_inference_ms, inference_count, execution_count;
    api_stat_duration success, fail, queue, compute_input, compute_infer, compute_output;
} api_model_stats;

/* Appends GET /v2/models[/{m}]/stats's body, {"model_stats": [...]}, for the n models `st` (in
 * their order; each of version API_V2_VERSION, its cache_hit and cache_miss 0 and no batch_stats),
 * to `b`. Any thread. */
void api_v2_statistics_json(const api_model_stats *st, size_t n, api_buf *b);

/* POST /v2/models/{m}[/versions/{v}]/infer: the inference request, JSON or with the binary
 * tensor extension (call->inference_header_length), to eng_sdpa (model "sdpa") or eng_mha (a
 * layer). The same limits, budget, deadlines and cancellation as api_attention. Statuses: 200;
 * 400 malformed JSON, a bad Inference-Header-Content-Length or binary data that does not add
 * up; 404 unknown model or version; 413 body, elements or memory past a limit; 415 a
 * Content-Type other than JSON or application/octet-stream; 422 well-formed but invalid
 * (inputs, datatypes, shapes, parameters); 429 memory budget full now; 503 out of memory;
 * 504 deadline; API_STATUS_CLIENT_CLOSED when cancelled; 500 only for a bug. A 200 with binary
 * outputs sets reply->inference_header_len and is application/octet-stream. Pure function of
 * its arguments: the fuzz harness calls it with any bytes and header value. */
void api_v2_infer(const api_call *call, api_reply *reply);

/* ---- Header values ------------------------------------------------------------------------ */

/* Whether the header `value` (NUL-terminated; NULL: absent) is the one token `word`, ignoring
 * case and the blanks (SP, HTAB) around it: "Chunked " is chunked, "chunked, gzip" is not. */
bool api_header_token_is(const char *value, const char *word);

/* ---- Content codings ----------------------------------------------------------------------- */

/* Whether a Content-Encoding header value is one api_call_encoded undoes: identity, gzip
 * (x-gzip) or deflate, any case. The server may answer 415 early for anything else. */
bool api_content_encoding_known(const char *value);

typedef void (*api_route_fn)(const api_call *call, api_reply *reply);

/* Runs `route` on the body with its Content-Encoding undone (gzip or deflate, by zlib), then
 * compresses the reply when call->accept_encoding allows gzip or deflate (q > 0) and that makes
 * it smaller (reply->content_encoding says which). The decompressed size counts against
 * --max-body-bytes (a bigger one is 413, read no further: a decompression bomb costs at most
 * the limit) and is reserved in the budget for the call. Errors of its own, in `style`: 415 an
 * unknown coding, 400 a corrupt or truncated stream, 413, 429. Runs on an engine worker: both
 * directions are CPU work. */
void api_call_encoded(api_route_fn route, api_error_style style, const api_call *call,
                      api_reply *reply);

/* ---- A request's own timeout and priority, before decoding -------------------------------- */

/* What a body says about queueing its request, read before a worker decodes it. */
typedef struct {
    int64_t timeout_ms;      /* the request's own timeout; 0: none (or not readable cheaply) */
    uint64_t priority;       /* v2 "parameters.priority" as written; 0: not given, or not readable
                                cheaply (the route's default level). Not range-checked: the route
                                refuses one above --priority-levels with 400 */
    const char *sequence_id; /* v2 "parameters.sequence_id" as written, inside call->body (an
                                integer's digits, or a string's bytes between its quotes with
                                escapes not undone); NULL: none (not given, 0 or "", which
                                Triton reads as none, or not readable cheaply) */
    size_t sequence_id_len;
    char session[40]; /* native: the top-level "session" string (POST /v1/mha's session, so
                         that the server can take the step's ticket at admission), when it is
                         one of 1 to 39 bytes without escapes; "" otherwise. Not checked: the
                         route answers for an id that names no session */
    char model[64];   /* native: the top-level "model" string on the same terms (the model a
                         /v1/mha request names, for api_batch_key); "" otherwise */
    int64_t layer;    /* the layer of a multi-layer model the request names, for api_batch_key:
                         native the top-level "layer", v2 "parameters.layer" (gRPC's
                         parameters["layer"]), an integer below 2^31; 0 when not given or not
                         readable cheaply */
    bool unread;      /* a gzip or deflate body that could not be inflated here (more than
                         API_PEEK_INFLATE_MAX bytes of it, a corrupt stream, or no memory for it
                         in the budget now): nothing above was read */
    /* A compressed body's plain text (sequence_id points into it) and its share of the lease:
     * api_peek_free gives them back. */
    char *inflated;
    size_t reserved;
    api_lease *lease;
} api_peek;

/* The most a compressed body is inflated to on the server's I/O thread (about a millisecond
 * of zlib per MiB): enough for any decode step, which is a few tokens' rows. */
#define API_PEEK_INFLATE_MAX ((size_t)4 << 20)

/* The timeout in milliseconds a request sets for itself, and (v2) its priority, read from
 * call->body without parsing it, so that the server can hold a request's deadline while it
 * waits for a worker and queue it at its priority (the route applies the same values once a
 * worker decodes the body). Reads call->body, body_len, content_type, content_encoding, lease
 * and (v2) inference_header_length; nothing else. Fills all of *out; api_peek_free releases it.
 *
 * api_peek_native is for the native routes: the top-level "timeout_ms" (the native routes take
 * no priority), "session", "model" and "layer" (which only /v1/mha has) in one walk. api_peek_v2
 * is for KServe v2 inference: the top-level "parameters" object's "timeout_ms" and Triton's
 * "timeout" (microseconds), the tighter of the two, Triton's "priority", Triton's "sequence_id"
 * (for api_sequence_ticket_take) and "layer", in one walk over the JSON before the binary tensor
 * data.
 *
 * Exact about structure: a "timeout_ms" inside a string or a nested object does not count.
 * A value that is not an integer in the route's range reads as 0. Never an error: the route
 * validates the body and reports what is wrong. Cheap: a native body where no quote opens
 * "timeout", "session", "model" or "layer" costs one memchr pass over its quotes, a v2 body
 * without the text "parameters" one memmem; otherwise one pass over the top level, which skips
 * strings with memchr. A gzip or deflate body is inflated first, at most API_PEEK_INFLATE_MAX bytes
 * of it, reserved through call->lease (when it has one); past that, or when it cannot be,
 * out->unread is set and nothing else. A plain body allocates nothing. Any thread. */
void api_peek_native(const api_call *call, api_peek *out);
void api_peek_v2(const api_call *call, api_peek *out);
/* Frees what a peek inflated and gives its reservation back; *p is zeroed (and a zeroed peek
 * is a no-op). */
void api_peek_free(api_peek *p);

/* The timeout_ms of api_peek_native and api_peek_v2 alone. */
int64_t api_timeout_peek(const api_call *call);
int64_t api_v2_timeout_peek(const api_call *call);

/* ---- Dynamic batching --------------------------------------------------------------------- */

/* The routes whose requests may run together: layer passes (POST /v1/mha, session steps
 * included, and KServe v2 inference of a layer model over HTTP or gRPC) that name the same
 * layer of the same model. */
typedef enum {
    API_BATCH_NONE = 0,    /* runs alone */
    API_BATCH_MHA,         /* api_mha */
    API_BATCH_V2_INFER,    /* api_v2_infer */
    API_BATCH_GRPC_INFER,  /* api_grpc_infer, not a stream */
    API_BATCH_GRPC_STREAM, /* api_grpc_infer, a ModelStreamInfer message */
} api_batch_route;

/* One request of a batch: what its route's function would take and fill. */
typedef struct {
    api_batch_route route;
    const api_call *call; /* with a lease, as the server's calls have */
    api_reply *reply;
} api_batch_member;

/* The layer a waiting request of `route` runs, as a key that the requests which may share one
 * engine call have in common: the model from call->model (v2 and gRPC: the model the path or the
 * message names), or the body's "model" or the model of its "session" (peek, api_peek_native),
 * and its layer peek->layer. 0 when it cannot be known cheaply (no peek, an inline layer, an
 * unknown name, a layer past the model's): the request then runs alone. Requests of one key
 * may still run apart: api_call_batch groups them by the layer their check finds. Any thread
 * (the server's I/O thread). */
uint64_t api_batch_key(api_batch_route route, const api_call *call, const api_peek *peek);

/* Serves `n` requests as their routes would one by one, each with its own reply, status,
 * deadline and errors, except that the layer passes of those that name the same layer run as
 * one engine call (eng_mha_batch) of at most `max_rows` input rows, their projections' weights
 * read once. A member that fails (its request, its deadline, its cancellation, its session)
 * fails alone. A member with a Content-Encoding runs alone, as api_call_encoded runs it; the
 * replies are compressed as api_call_encoded compresses them. No member's route is
 * API_BATCH_NONE. On an engine worker. */
void api_call_batch(const api_batch_member *members, int n, int64_t max_rows);

/* ---- KServe v2 over gRPC (inference.GRPCInferenceService) ---------------------------------- */

/* The gRPC side of the v2 protocol (api/proto/grpc_*.c): Triton's grpc_service.proto messages
 * in and out, through the same routes as HTTP (api_v2_*): a ModelInferRequest becomes the v2
 * request with binary tensors that api_v2_infer serves, and its reply a ModelInferResponse
 * with raw_output_contents. Request messages are call->body (the message without gRPC's
 * 5-byte prefix); a reply with status 200 holds the response message (content type
 * "application/grpc"), any other its error message as plain text ("text/plain"), whose gRPC
 * status is api_grpc_code_of(reply.status). */

/* The methods served; API_GRPC_UNIMPLEMENTED for every other path. */
typedef enum {
    API_GRPC_UNIMPLEMENTED = 0,
    API_GRPC_SERVER_LIVE,
    API_GRPC_SERVER_READY,
    API_GRPC_MODEL_READY,
    API_GRPC_SERVER_METADATA,
    API_GRPC_MODEL_METADATA,
    API_GRPC_MODEL_INFER,
    API_GRPC_MODEL_STREAM_INFER,
    API_GRPC_MODEL_CONFIG,
    API_GRPC_MODEL_STATISTICS,
    API_GRPC_REPOSITORY_INDEX,
    API_GRPC_HEALTH_CHECK, /* grpc.health.v1.Health/Check: SERVING, NOT_SERVING while draining */
} api_grpc_method;

/* The method of a :path ("/inference.GRPCInferenceService/ModelInfer",
 * "/grpc.health.v1.Health/Check"), n bytes. */
api_grpc_method api_grpc_method_of(const char *path, size_t n);
/* "ModelInfer", ...; "unimplemented" for API_GRPC_UNIMPLEMENTED. */
const char *api_grpc_method_name(api_grpc_method method);

/* gRPC status codes (the ones attnd sends). */
typedef enum {
    API_GRPC_OK = 0,
    API_GRPC_CANCELLED = 1,
    API_GRPC_UNKNOWN = 2,
    API_GRPC_INVALID_ARGUMENT = 3,
    API_GRPC_DEADLINE_EXCEEDED = 4,
    API_GRPC_NOT_FOUND = 5,
    API_GRPC_PERMISSION_DENIED = 7,
    API_GRPC_RESOURCE_EXHAUSTED = 8,
    API_GRPC_FAILED_PRECONDITION = 9,
    API_GRPC_CODE_UNIMPLEMENTED = 12,
    API_GRPC_INTERNAL = 13,
    API_GRPC_UNAVAILABLE = 14,
    API_GRPC_UNAUTHENTICATED = 16,
} api_grpc_code;

/* The gRPC status of a reply's HTTP status (the status table's v2 codes): 400 and 415
 * INVALID_ARGUMENT, 401 UNAUTHENTICATED, 404 NOT_FOUND, 409 FAILED_PRECONDITION, 413 and 429
 * RESOURCE_EXHAUSTED, 499 CANCELLED, 501 UNIMPLEMENTED, 503 UNAVAILABLE, 504
 * DEADLINE_EXCEEDED, others INTERNAL. */
api_grpc_code api_grpc_code_of(int http_status);

/* Fills `reply` with an error of `http_status` and message `msg` (plain text), as the gRPC
 * routes do, for refusals the server decides. */
void api_grpc_error(api_reply *reply, int http_status, api_reason reason, const char *msg);

/* The cheap methods: ServerLive, ServerReady and HealthCheck (`ready` says which answer),
 * ModelReady, ServerMetadata, ModelMetadata, ModelConfig and RepositoryIndex, from call->body's
 * request message (call->models, call->limits). Statistics come from the server's counters (the
 * n models `st`, as for api_v2_statistics_json) as a ModelStatisticsResponse. Any thread. */
void api_grpc_unary(api_grpc_method method, bool ready, const api_call *call, api_reply *reply);
void api_grpc_statistics(const api_model_stats *st, size_t n, api_reply *reply);

/* What a ModelInferRequest says about queueing it, read on the I/O thread without decoding
 * its tensors: its model and version (NUL-terminated, truncated to fit), and its timeout,
 * priority, sequence_id and layer as api_peek has them (sequence_id points into the message). */
typedef struct {
    char model[64], version[16];
    api_peek peek;
    char sequence_digits[24]; /* an integer sequence_id's digits (peek.sequence_id points here) */
} api_grpc_infer_peek;

/* False when the message is not a well-formed ModelInferRequest (the route says why). */
bool api_grpc_infer_peek_read(const char *msg, size_t len, api_grpc_infer_peek *out);

/* ModelInfer: call->body is a ModelInferRequest; the reply a ModelInferResponse whose outputs
 * are all raw_output_contents (FP32, or BF16 with output_dtype). The v2 inference route's job,
 * checks and steps read from protobuf, so every limit, reservation (through call->lease),
 * deadline, status and message is the HTTP route's; with call->body_movable, raw FP32 and INT64
 * inputs may be moved within the body onto their alignment.
 * `stream`: ModelStreamInfer's form, a ModelStreamInferResponse holding the response or, on
 * failure, the error_message (reply.status still says what failed). Engine worker. */
void api_grpc_infer(const api_call *call, bool stream, api_reply *reply);

/* Reads gRPC's length-prefixed messages from a stream's DATA, as bytes arrive. A message's
 * declared length reserves nothing: its bytes are reserved in `lease` as they arrive (so a
 * client that declares 2 GiB and sends nothing holds nothing). */
typedef struct {
    unsigned char prefix[5];
    size_t prefix_len; /* bytes of the prefix read (5: reading the message) */
    size_t length;     /* the message's declared length */
    api_buf msg;       /* its bytes so far */
    size_t held;       /* what msg holds of the lease */
} api_grpc_reader;

typedef enum {
    API_GRPC_READ_MORE = 0, /* every byte consumed; the message is not complete */
    API_GRPC_READ_MESSAGE,  /* a message is complete: take it (api_grpc_reader_take) */
    API_GRPC_READ_ERROR,    /* `reply` holds the error (compressed, too large, no memory) */
} api_grpc_read_result;

void api_grpc_reader_init(api_grpc_reader *r);
/* Consumes bytes of `data` (len) up to the end of the next message; *used says how many. A
 * message above max_message bytes is 413 (RESOURCE_EXHAUSTED) before any of it is kept; a
 * compressed one 501 (attnd offers no message compression); a reservation that fails 413 or
 * 429 as api_lease_reserve says. */
api_grpc_read_result api_grpc_read(api_grpc_reader *r, const unsigned char *data, size_t len,
                                   size_t max_message, api_lease *lease, size_t *used,
                                   api_reply *reply);
/* The complete message (eng_buf_free it), its length in *len and its reservation in *held;
 * the reader starts on the next message. */
char *api_grpc_reader_take(api_grpc_reader *r, size_t *len, size_t *held);
/* Frees a partial message and gives its reservation back to `lease`. */
void api_grpc_reader_free(api_grpc_reader *r, api_lease *lease);

/* gRPC's timeout header ("grpc-timeout": 1 to 8 digits and a unit of H, M, S, m, u, n) in
 * milliseconds, rounded up; -1 when malformed. */
int64_t api_grpc_timeout_ms(const char *value);

#endif
