/*
 * session_registry.h - the registry's insides, shared by the files of the session module only
 * (session_registry.c, session_order.c); every other file sees sessions.h.
 *
 * One mutex, `lock`, guards every field of the registry and the registry's fields of each
 * session (sessions.h); the functions named *_locked expect it held.
 */
#ifndef ATTND_API_OPS_SESSION_REGISTRY_H
#define ATTND_API_OPS_SESSION_REGISTRY_H

#include <pthread.h>
#include <stddef.h>

#include "api/ops/sessions.h"

#define API_SESSIONS_BUCKETS    1024
#define API_SESSIONS_TOMBSTONES 4096

typedef enum { API_GONE_TTL = 0, API_GONE_PRESSURE } api__gone_reason;

/* A request waiting for its turn (session_order.c). */
struct api__parked {
    struct api__parked *next;
    uint64_t number;
    void (*resume)(void *arg); /* NULL: dropped before its turn; skipped */
    void *arg;
};

/* The order of one v2 sequence's requests (api_sequence_ticket_take), while any has a ticket. */
struct api__line {
    struct api__line *hnext; /* hash chain */
    api__turns turns;
    int64_t tickets; /* outstanding: the last to end frees the line */
    char key[];      /* "<model>/<sequence_id as written>", the name of its session */
};

struct api_sessions {
    pthread_mutex_t lock;
    pthread_cond_t released; /* a busy session was released */
    eng_kv_pool *pool;
    int64_t block_tokens, ttl_s;
    size_t capacity;
    api__session *buckets[API_SESSIONS_BUCKETS];
    struct api__line *lines[API_SESSIONS_BUCKETS]; /* by key */
    api__session *first, *last;                    /* creation order */
    int64_t live, created, evicted_ttl, evicted_pressure, deleted, ended;
    struct {
        char id[API_SESSION_ID_LEN + 1];
        api__gone_reason reason;
    } tomb[API_SESSIONS_TOMBSTONES];
    size_t tomb_next;
    char instance[9]; /* this process's 8 hex digits, the first of every id it makes */
};

/* The hash bucket of a session id or a line key. */
size_t api__sessions_bucket(const char *id);
/* The live session `id`, or NULL. */
api__session *api__sessions_find_locked(api_sessions *reg, const char *id);
/* The line of v2 sequence `key` while it has tickets, or NULL. */
struct api__line *api__sessions_line_find_locked(const api_sessions *reg, const char *key);
/* Frees the parked nodes of `tu`. */
void api__turns_free(api__turns *tu);
/* Drops one reference to `s`; the last frees it (its sequence's blocks go back to the pool). */
void api__session_unref_locked(api__session *s);
/* Frees the idle sessions past their TTL. */
void api__sessions_expire_locked(api_sessions *reg);

#endif
