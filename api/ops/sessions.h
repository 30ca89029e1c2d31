/*
 * sessions.h - the KV-cache session registry (api_sessions in api.h) as the operations tier
 * sees it: a session held busy by one request at a time, its shape and default step options,
 * eviction when the pool is full, and the step operation (operation.h) that appends to a
 * session's cache and attends over it. The routes (proto/native_sessions.c; KServe v2
 * sequences later) read their format into these and write the replies.
 *
 * Its files: session_registry.c (sessions by id, their life, room in the pool),
 * session_order.c (the tickets and turns server/ drives), session_step.c (the step operation).
 * The routes, GET and DELETE included, are proto/native_sessions.c's.
 *
 *     api__session *s;
 *     if (api__session_acquire(reg, id, &s, &err) != 0) return -1;   // 404s, sessions off
 *     ... eng_kv_step(pool, s->cache[l].seq, ...) ...                 // nobody else changes it
 *     api__session_release(reg, s);                                  // lengths, bytes, last use
 */
#ifndef ATTND_API_OPS_SESSIONS_H
#define ATTND_API_OPS_SESSIONS_H

#include <stdbool.h>
#include <stdint.h>

#include "api/ops/operation.h"
#include "api/ops/options.h"
#include "api/ops/sdpa.h"

/* "s" and 32 lower-case hex digits. */
#define API_SESSION_ID_LEN 33

/* The options a session applies to each of its steps unless the step sets its own. */
typedef struct {
    bool scale_set;
    float scale, softcap;
    api__window window;
    bool alibi;
    bool precision_set;
    eng_precision precision;
    bool causal_set;
    api__causal causal; /* default: bottom_right */
} api__session_opts;

/* The positions the first layer step of a session gave the keys it cached (RoPE turns k before
 * it is cached, so every later step must turn its keys the same way): `set` once that step
 * succeeded. Read and written while the session is acquired. */
typedef struct {
    bool set;
    eng_positional positional;
    float rope_base; /* 0: the engine's default */
    eng_rope_style rope_style;
} api__session_positions;

/* The order of the ticketed requests of one session or one v2 sequence (api.h
 * api_session_ticket): the next ticket to give, the one whose turn it is, and the tickets
 * parked until their turn or dropped out of turn. The registry's, under its lock. */
typedef struct {
    uint64_t next_ticket, serving;
    struct api__parked *parked;
    bool unordered; /* defensive: a node could not be allocated; turns are no longer kept */
} api__turns;

/* The KV cache of one layer of a session. */
typedef struct {
    eng_kv_seq *seq;
    int64_t length; /* as of the session's last release (or api__session_update): the registry's,
                       under its lock, for GET without acquiring */
} api__session_cache;

/* What a session is; the fields from `layers` to `positions` are fixed at creation. Read them
 * while the session is acquired (or pinned). */
typedef struct api__session api__session;
struct api__session {
    char id[API_SESSION_ID_LEN + 1];
    char name[160];     /* a KServe v2 sequence's key ("<model>/<sequence_id>"), or "" */
    char model[64];     /* the model whose caches these are (POST /v1/sessions "model", a layer
                           model's v2 sequence): its /v1/mha steps must name it; "" for none */
    int64_t layers;     /* caches: one per layer of its model (1 without one) */
    int64_t num_heads;  /* query heads: a multiple of shape.num_kv_heads */
    eng_kv_shape shape; /* every cache's */
    api__session_opts opts;
    int64_t ttl_s;
    int64_t created_s;   /* wall clock, seconds since the epoch */
    int64_t last_used_s; /* wall clock */
    int64_t last_used_ns;
    api__session_positions positions; /* of a layer's cache: set by its first step */

    /* The registry's, under its lock. */
    api__session *hnext, *prev, *next; /* hash chain; creation order */
    int refs;                          /* the registry's while live, one per ticket and acquirer */
    bool live;                         /* findable by id */
    bool busy;                         /* acquired by a request */
    int64_t length;   /* the shortest cache's (the tokens every layer holds) and the bytes of */
    size_t bytes;     /* all of them, as the caches' lengths are (for GET without acquiring) */
    api__turns turns; /* its requests' order (native routes' tickets) */
    api__session_cache cache[]; /* [layers] */
};

/* Looks up `id` and makes the session this request's until api__session_release: a request
 * that finds it busy (another, unticketed, request is using it) waits for that one to release
 * it. 501 when reg is NULL, 404 session_not_found / session_evicted, 404 for an id that is not
 * one (the message says so). */
int api__session_acquire(api_sessions *reg, const char *id, api__session **out, api__error *err);
/* Records the session's lengths, bytes and last use, and lets the next request have it. */
void api__session_release(api_sessions *reg, api__session *s);
/* Records the acquired session's lengths and bytes now, as its release will. */
void api__session_update(api_sessions *reg, api__session *s);

/* The default TTL (--session-ttl-s). */
int64_t api__sessions_default_ttl(const api_sessions *reg);
/* `layers` empty caches of `shape` in the registry's pool, as an array (the caller frees it;
 * api__sessions_add takes the caches); NULL with `e` filled (eng_kv_seq_new's failure, or
 * ENOMEM) when one cannot be made. */
eng_kv_seq **api__session_caches_new(api_sessions *reg, const eng_kv_shape *shape, int64_t layers,
                                     eng_error *e);
/* Registers a new session of `layers` caches seqs[0..layers), one shape, under a fresh id: the
 * caches are taken over (freed on failure too), the array is not. The session is returned
 * acquired. 503 when memory runs out. */
int api__sessions_add(api_sessions *reg, eng_kv_seq *const *seqs, int64_t layers, int64_t num_heads,
                      const api__session_opts *opts, int64_t ttl_s, api__session **out,
                      api__error *err);
/* The bytes of the pool one cache of `shape` with `length` tokens references. */
size_t api__session_bytes(const api_sessions *reg, const eng_kv_shape *shape, int64_t length);

/* The session named `name` (a v2 sequence), its id into id[API_SESSION_ID_LEN + 1]; false when
 * there is none. */
bool api__sessions_find_name(api_sessions *reg, const char *name, char *id);
/* Names the acquired session `s` (the v2 sequence it serves). */
void api__session_set_name(api_sessions *reg, api__session *s, const char *name);
/* Makes the acquired session `s` the cache of the layer `model` (its name, kept), with the
 * positions of the session it was forked from (NULL: none yet). */
void api__session_set_model(api_sessions *reg, api__session *s, const char *model,
                            const api__session_positions *positions);
/* The layer model of session `id` into model[len] ("" when there is none, or no such
 * session). */
void api__session_model(api_sessions *reg, const char *id, char *model, size_t len);
/* Ends the session `id` as its sequence ended (sequence_end, or a new sequence_start): counted
 * as ended, no tombstone. A step in flight finishes first (the blocks go with the last
 * reference). No-op when there is no such session. */
void api__sessions_end(api_sessions *reg, const char *id);

/* A look at a live session under the registry's lock, for the routes that describe sessions
 * without acquiring them: `fn` reads the session's fields (its length and bytes as of its last
 * release) and must not call the registry. */
typedef void (*api__session_view_fn)(void *ctx, const api__session *s);

/* Shows session `id` to fn, once what is idle past its TTL has expired. 404 session_not_found
 * or session_evicted when there is none. */
int api__sessions_view(api_sessions *reg, const char *id, api__session_view_fn fn, void *ctx,
                       api__error *err);

/* A page of the live sessions in creation order: up to `n` from the one after `after` (NULL or
 * "": from the first); api__sessions_view_page sets `more` (others follow the last one shown)
 * and `live` (how many there are). */
typedef struct {
    const char *after;
    int64_t n;
    bool more;
    int64_t live;
} api__session_page;

/* Shows the sessions of `page` to fn, in order, once what is idle past its TTL has expired.
 * 400 naming "after" when it is not the id of a live session. */
int api__sessions_view_page(api_sessions *reg, api__session_page *page, api__session_view_fn fn,
                            void *ctx, api__error *err);

/* Ends session `id` at once (DELETE), counted as deleted: a step in flight finishes first.
 * 404 session_not_found or session_evicted when there is none. */
int api__sessions_delete(api_sessions *reg, const char *id, api__error *err);

/* The 501 of a route while sessions are off. */
int api__sessions_off(api__error *err);

/* The 413 of a step (naming `field`, its session or sequence) whose compressed body the server
 * could not read as it arrived (api_call.body_unread): it has no place in the order. */
int api__sessions_unordered(api__error *err, const char *field);

/* Runs step(arg, e), an engine call that appends to a cache of the acquired session s what
 * takes `room` bytes of the pool (eng_kv_seq_append_bytes); while it finds the pool full (ENOMEM
 * on field "kv_cache_bytes"), evicts least recently used idle sessions to make that room and
 * tries again. 0 with the last try's status in *st and *e; -1 with a 429 in err when the pool is
 * full of sessions it may not evict. */
int api__session_with_room(api_sessions *reg, api__session *s, size_t room,
                           eng_status (*step)(void *arg, eng_error *e), void *arg, eng_status *st,
                           eng_error *e, api__error *err);
/* The 413 of a step the engine refused as too long (ETOOBIG: past the session's max_tokens,
 * or beyond what the pool could ever hold), naming `field` (the new tokens); 0, with nothing
 * set, for any other failure. */
int api__session_too_long(api_sessions *reg, const api__session *s, eng_status st,
                          const eng_error *e, const char *field, api__error *err);

/* Whether the cache of layer `layer` of the acquired session s takes `n_new` tokens (named
 * `field`) as a step that expects its length to be expect_length (when expect_set): 409 when it
 * is not (a retried step, a layer skipped or repeated), 413 past max_tokens. 0 with that
 * cache's length in *length. */
int api__session_check_append(const api__session *s, int64_t layer, bool expect_set,
                              int64_t expect_length, int64_t n_new, const char *field,
                              int64_t *length, api__error *err);

/* ---- The step --------------------------------------------------------------------------- */

/* One step of a session: a route fills r (tensors probed; options), expect_length, sets
 * id and reg, then runs api__session_step_op. query is rank 2 [n, H*D] or rank 3 [H, n, D]
 * (key [n, Hkv*D] / [Hkv, n, D], value likewise with Dv); either the query or key and value
 * may be absent. check acquires the session (held until free). */
typedef struct {
    api__req *rq;
    api_sessions *reg;
    const char *id;
    api__sdpa_req r; /* query, key, value, options; num_heads must match the session's */
    bool expect_set;
    int64_t expect_length;
    bool causal_set; /* the step set causal itself */
    bool batch_axis; /* the outputs get a leading batch axis of 1 (v2: the inputs had one) */

    /* Derived by check. */
    api__session *s;
    int64_t H, Hkv, D, Dv, n_new, n_q, S; /* S: the length after the append */
    api__out_shape os, ws, ls;
    float *q, *k, *v, *sinks, *out, *weights, *lse;
    eng_sdpa_args args;
    int64_t length; /* after run */
} api__session_step;

extern const api__op api__session_step_op;

#endif
