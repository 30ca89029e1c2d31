/*
 * sessions.c - the KV-cache session registry (api.h api_sessions) and the step operation.
 *
 * The registry is a hash of live sessions by id, a list in creation order (listing, the LRU
 * and TTL scans) and a ring of tombstones, all under one mutex that is held for lookups and
 * bookkeeping only: a request that uses a session marks it busy and computes without the lock.
 * Scans are linear in the live sessions, which is microseconds for the thousands a pool of
 * gigabytes holds.
 *
 * Order of the steps of one session: the server takes a ticket per request at admission (the
 * I/O thread: arrival order); `serving` is the ticket whose turn it is. A worker whose ticket
 * is not served yet parks it (a node in `parked`) and returns: no worker ever waits for a
 * request that has not started, so the two workers of a small pool cannot both block behind a
 * request still in the queue, whatever order the pool dequeues in. The end of a turn advances
 * `serving` past tickets dropped out of turn and resumes the parked one whose turn it is.
 *
 * The requests of one KServe v2 sequence take their turns the same way, in a line of their own
 * keyed by model and sequence_id rather than in a session: the session of a sequence does not
 * exist yet when its START arrives (the start step creates it, from shapes only a worker
 * decodes), and a new START replaces it; the line lasts from its first ticket to the end of
 * its last. While a line has tickets, the session of that name is not idle (never evicted or
 * expired), as a session with tickets is not.
 *
 * A session with a ticket outstanding, acquired, or pinned is never evicted; a deleted one
 * leaves the hash at once and is freed by its last reference.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "api/core/memory.h"
#include "api/ops/sessions.h"
#include "api/wire/buf.h"
#include "api/wire/reply.h"
#include "api/wire/timeout.h"

#define N_BUCKETS    1024
#define N_TOMBSTONES 4096

typedef enum { GONE_TTL = 0, GONE_PRESSURE } gone_reason;

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
    api__session *buckets[N_BUCKETS];
    struct api__line *lines[N_BUCKETS]; /* by key */
    api__session *first, *last;         /* creation order */
    int64_t live, created, evicted_ttl, evicted_pressure, deleted, ended;
    struct {
        char id[API_SESSION_ID_LEN + 1];
        gone_reason reason;
    } tomb[N_TOMBSTONES];
    size_t tomb_next;
    char instance[9]; /* this process's 8 hex digits, the first of every id it makes */
};

static int64_t wall_s(void)
{
    return (int64_t)time(NULL);
}

static size_t bucket_of(const char *id)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *id; id++)
        h = (h ^ (unsigned char)*id) * 1099511628211ull;
    return (size_t)(h % N_BUCKETS);
}

/* The line of v2 sequence `key` while it has tickets, or NULL. */
static struct api__line *line_find_locked(const api_sessions *reg, const char *key)
{
    for (struct api__line *l = reg->lines[bucket_of(key)]; l; l = l->hnext)
        if (strcmp(l->key, key) == 0)
            return l;
    return NULL;
}

static void parked_free(api__turns *tu)
{
    while (tu->parked) {
        struct api__parked *p = tu->parked;
        tu->parked = p->next;
        free(p);
    }
}

/* ---- Life of one session (the lock held) ------------------------------------------------- */

static void session_free(api__session *s)
{
    parked_free(&s->turns); /* defensive: every ticket ends before the last reference goes */
    eng_kv_seq_free(s->seq);
    free(s);
}

static void unref_locked(api__session *s)
{
    if (--s->refs == 0)
        session_free(s);
}

/* Takes `s` out of the hash and the list; the registry's reference goes. */
static void unlink_locked(api_sessions *reg, api__session *s)
{
    api__session **pp = &reg->buckets[bucket_of(s->id)];
    while (*pp && *pp != s)
        pp = &(*pp)->hnext;
    if (*pp)
        *pp = s->hnext;
    if (s->prev)
        s->prev->next = s->next;
    else
        reg->first = s->next;
    if (s->next)
        s->next->prev = s->prev;
    else
        reg->last = s->prev;
    s->prev = s->next = s->hnext = NULL;
    s->live = false;
    reg->live--;
    unref_locked(s);
}

static void tombstone_locked(api_sessions *reg, const char *id, gone_reason why)
{
    memcpy(reg->tomb[reg->tomb_next].id, id, API_SESSION_ID_LEN + 1);
    reg->tomb[reg->tomb_next].reason = why;
    reg->tomb_next = (reg->tomb_next + 1) % N_TOMBSTONES;
}

/* Idle: no request holds it, none is waiting for a turn (of the session, or of the v2 sequence
 * it serves), nothing pins it. */
static bool idle_locked(const api_sessions *reg, const api__session *s)
{
    return !s->busy && s->turns.next_ticket == s->turns.serving && s->refs == 1 &&
           !(s->name[0] && line_find_locked(reg, s->name));
}

static void evict_locked(api_sessions *reg, api__session *s, gone_reason why)
{
    tombstone_locked(reg, s->id, why);
    if (why == GONE_TTL)
        reg->evicted_ttl++;
    else
        reg->evicted_pressure++;
    unlink_locked(reg, s);
}

/* Frees the idle sessions past their TTL. */
static void expire_locked(api_sessions *reg)
{
    int64_t now = eng_now_ns();
    api__session *s = reg->first;
    while (s) {
        api__session *next = s->next;
        if (s->ttl_s > 0 && idle_locked(reg, s) && now - s->last_used_ns > s->ttl_s * 1000000000ll)
            evict_locked(reg, s, GONE_TTL);
        s = next;
    }
}

static bool id_well_formed(const char *id)
{
    if (!id || strlen(id) != API_SESSION_ID_LEN || id[0] != 's')
        return false;
    for (int i = 1; i < API_SESSION_ID_LEN; i++)
        if (!((id[i] >= '0' && id[i] <= '9') || (id[i] >= 'a' && id[i] <= 'f')))
            return false;
    return true;
}

static void random_bytes(unsigned char *raw, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = getrandom(raw + got, n - got, 0);
        if (r > 0) {
            got += (size_t)r;
        } else if (errno != EINTR) { /* defensive: getrandom cannot fail on Linux >= 3.17 */
            uint64_t t = (uint64_t)eng_now_ns() ^ (uint64_t)(uintptr_t)raw;
            for (; got < n; got++, t = t * 6364136223846793005ull + 1)
                raw[got] = (unsigned char)(t >> 56);
        }
    }
}

static void hex(char *out, const unsigned char *raw, size_t n)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[raw[i] >> 4];
        out[2 * i + 1] = digits[raw[i] & 15];
    }
}

static api__session *find_locked(api_sessions *reg, const char *id)
{
    for (api__session *s = reg->buckets[bucket_of(id)]; s; s = s->hnext)
        if (strcmp(s->id, id) == 0)
            return s;
    return NULL;
}

/* The 404 of an id that names no live session. */
static int not_found_locked(api_sessions *reg, const char *id, api__error *err)
{
    if (!id_well_formed(id))
        return api__error_code(err, API_STATUS_NOT_FOUND, "session_not_found", NULL,
                               "\"%.64s\" is not a session id (\"s\" and 32 hex digits, as "
                               "POST /v1/sessions returns)",
                               id ? id : "");
    if (memcmp(id + 1, reg->instance, 8) != 0)
        return api__error_code(err, API_STATUS_NOT_FOUND, "session_evicted", NULL,
                               "session %s was made by another replica or an earlier run of "
                               "this one, and its KV cache is gone (sessions live in one "
                               "process); create it again (POST /v1/sessions) and replay its "
                               "tokens",
                               id);
    for (size_t i = 0; i < N_TOMBSTONES; i++) {
        if (strcmp(reg->tomb[i].id, id) == 0)
            return api__error_code(err, API_STATUS_NOT_FOUND, "session_evicted", NULL,
                                   "session %s was %s; create it again (POST /v1/sessions) and "
                                   "replay its tokens",
                                   id,
                                   reg->tomb[i].reason == GONE_TTL
                                       ? "idle past its ttl_s and expired"
                                       : "evicted to make room in the KV cache "
                                         "(--kv-cache-bytes)");
    }
    return api__error_code(err, API_STATUS_NOT_FOUND, "session_not_found", NULL,
                           "no session %s on this replica (sessions live in one process: "
                           "route its steps by session id, and re-create sessions a restarted "
                           "or lost replica held)",
                           id);
}

/* ---- The registry ------------------------------------------------------------------------ */

api_sessions *api_sessions_new(const api_sessions_config *cfg, char *msg, size_t msglen)
{
    eng_error e;
    api_sessions *reg = calloc(1, sizeof *reg);
    if (!reg) {
        snprintf(msg, msglen, "out of memory");
        return NULL;
    }
    memset(&e, 0, sizeof e);
    reg->pool = eng_kv_pool_new(cfg->capacity_bytes, cfg->block_tokens, &e);
    if (!reg->pool) {
        snprintf(msg, msglen,
                 "cannot create the KV cache (--kv-cache-bytes, --kv-block-tokens): %s", e.message);
        free(reg);
        return NULL;
    }
    pthread_mutex_init(&reg->lock, NULL);
    pthread_cond_init(&reg->released, NULL);
    reg->block_tokens = cfg->block_tokens;
    reg->ttl_s = cfg->ttl_s;
    reg->capacity = cfg->capacity_bytes;
    unsigned char raw[4];
    random_bytes(raw, sizeof raw);
    hex(reg->instance, raw, sizeof raw);
    return reg;
}

void api_sessions_free(api_sessions *reg)
{
    if (!reg)
        return;
    pthread_mutex_lock(&reg->lock);
    while (reg->first)
        unlink_locked(reg, reg->first);
    for (size_t b = 0; b < N_BUCKETS; b++) { /* defensive: no request may still hold one */
        while (reg->lines[b]) {
            struct api__line *l = reg->lines[b];
            reg->lines[b] = l->hnext;
            parked_free(&l->turns);
            free(l);
        }
    }
    pthread_mutex_unlock(&reg->lock);
    eng_kv_pool_free(reg->pool);
    pthread_cond_destroy(&reg->released);
    pthread_mutex_destroy(&reg->lock);
    free(reg);
}

void api_sessions_stats_get(api_sessions *reg, api_sessions_stats *st)
{
    eng_kv_pool_stats ps;
    memset(st, 0, sizeof *st);
    if (!reg)
        return;
    pthread_mutex_lock(&reg->lock);
    expire_locked(reg);
    st->live = reg->live;
    st->created_total = reg->created;
    st->evicted_ttl = reg->evicted_ttl;
    st->evicted_pressure = reg->evicted_pressure;
    st->deleted = reg->deleted;
    st->ended = reg->ended;
    pthread_mutex_unlock(&reg->lock);
    eng_kv_pool_stats_get(reg->pool, &ps);
    st->bytes_used = ps.used_bytes;
    st->bytes_capacity = ps.capacity_bytes;
    st->tokens = ps.tokens;
}

eng_kv_pool *api__sessions_pool(api_sessions *reg)
{
    return reg->pool;
}

int64_t api__sessions_default_ttl(const api_sessions *reg)
{
    return reg->ttl_s;
}

size_t api__session_bytes(const api_sessions *reg, const eng_kv_shape *shape, int64_t length)
{
    size_t elem = shape->dtype == ENG_DTYPE_F32 ? 4 : 2;
    int64_t blocks = (length + reg->block_tokens - 1) / reg->block_tokens;
    int64_t dv = shape->value_head_dim ? shape->value_head_dim : shape->head_dim;
    /* Bounded by the pool's capacity, which the engine checked: no overflow. */
    return (size_t)blocks * (size_t)reg->block_tokens * (size_t)shape->num_kv_heads *
           (size_t)(shape->head_dim + dv) * elem;
}

int api__sessions_off(api__error *err)
{
    return api__error_code(err, API_STATUS_NOT_IMPLEMENTED, "sessions_off", NULL,
                           "KV-cache sessions are off on this server: start attnd with "
                           "--kv-cache-bytes > 0 (ATTND_KV_CACHE_BYTES)");
}

int api__sessions_unordered(api__error *err, const char *field)
{
    return api__error_set(err, API_STATUS_TOO_LARGE, API_REASON_TOO_LARGE, field,
                          "a compressed step of a session or sequence (%s) must inflate to at "
                          "most %zu bytes (API_PEEK_INFLATE_MAX) within the memory budget: its "
                          "place in the order is read from the body as it arrives; send it "
                          "uncompressed",
                          field, API_PEEK_INFLATE_MAX);
}

/* "s", this process's instance (8 hex digits: a replica tells its own ids from another's or
 * an earlier run's), and 96 random bits (24 hex digits): unguessable. */
static void new_id(const api_sessions *reg, char id[API_SESSION_ID_LEN + 1])
{
    unsigned char raw[12];
    random_bytes(raw, sizeof raw);
    id[0] = 's';
    memcpy(id + 1, reg->instance, 8);
    hex(id + 9, raw, sizeof raw);
    id[API_SESSION_ID_LEN] = '\0';
}

int api__sessions_add(api_sessions *reg, eng_kv_seq *seq, int64_t num_heads,
                      const api__session_opts *opts, int64_t ttl_s, api__session **out,
                      api__error *err)
{
    api__session *s = calloc(1, sizeof *s);
    if (!s) {
        eng_kv_seq_free(seq);
        return api__error_set(err, API_STATUS_UNAVAILABLE, API_REASON_MEMORY, NULL,
                              "out of memory for a session");
    }
    s->seq = seq;
    s->num_heads = num_heads;
    s->shape = eng_kv_seq_shape(seq);
    s->opts = *opts;
    s->ttl_s = ttl_s;
    s->created_s = s->last_used_s = wall_s();
    s->last_used_ns = eng_now_ns();
    s->length = eng_kv_seq_length(seq);
    s->bytes = api__session_bytes(reg, &s->shape, s->length);
    s->refs = 2; /* the registry's and the caller's (acquired) */
    s->busy = true;
    s->live = true;
    pthread_mutex_lock(&reg->lock);
    expire_locked(reg);
    do
        new_id(reg, s->id);
    while (find_locked(reg, s->id)); /* 2^-128: never, but cheap to be sure */
    size_t b = bucket_of(s->id);
    s->hnext = reg->buckets[b];
    reg->buckets[b] = s;
    s->prev = reg->last;
    if (reg->last)
        reg->last->next = s;
    else
        reg->first = s;
    reg->last = s;
    reg->live++;
    reg->created++;
    pthread_mutex_unlock(&reg->lock);
    *out = s;
    return 0;
}

int api__session_acquire(api_sessions *reg, const char *id, api__session **out, api__error *err)
{
    if (!reg)
        return api__sessions_off(err);
    pthread_mutex_lock(&reg->lock);
    expire_locked(reg);
    api__session *s = find_locked(reg, id ? id : "");
    if (!s) {
        not_found_locked(reg, id, err);
        pthread_mutex_unlock(&reg->lock);
        return -1;
    }
    s->refs++;
    while (s->busy) /* only an unticketed request (tests, direct callers) ever waits here */
        pthread_cond_wait(&reg->released, &reg->lock);
    if (!s->live) { /* deleted while we waited */
        unref_locked(s);
        not_found_locked(reg, id, err);
        pthread_mutex_unlock(&reg->lock);
        return -1;
    }
    s->busy = true;
    pthread_mutex_unlock(&reg->lock);
    *out = s;
    return 0;
}

void api__session_release(api_sessions *reg, api__session *s)
{
    int64_t length = eng_kv_seq_length(s->seq);
    pthread_mutex_lock(&reg->lock);
    s->length = length;
    s->bytes = api__session_bytes(reg, &s->shape, length);
    s->last_used_s = wall_s();
    s->last_used_ns = eng_now_ns();
    s->busy = false;
    unref_locked(s);
    pthread_cond_broadcast(&reg->released);
    pthread_mutex_unlock(&reg->lock);
}

bool api__sessions_make_room(api_sessions *reg, const api__session *self, size_t bytes)
{
    for (;;) {
        eng_kv_pool_stats ps;
        eng_kv_pool_stats_get(reg->pool, &ps);
        if (ps.capacity_bytes >= ps.used_bytes && ps.capacity_bytes - ps.used_bytes >= bytes)
            return true;
        pthread_mutex_lock(&reg->lock);
        api__session *victim = NULL;
        for (api__session *s = reg->first; s; s = s->next)
            if (s != self && idle_locked(reg, s) &&
                (!victim || s->last_used_ns < victim->last_used_ns))
                victim = s;
        if (victim)
            evict_locked(reg, victim, GONE_PRESSURE);
        pthread_mutex_unlock(&reg->lock);
        if (!victim)
            return false;
    }
}

bool api__sessions_find_name(api_sessions *reg, const char *name, char *id)
{
    bool found = false;
    pthread_mutex_lock(&reg->lock);
    expire_locked(reg);
    for (api__session *s = reg->first; s && !found; s = s->next) {
        if (strcmp(s->name, name) == 0) {
            memcpy(id, s->id, API_SESSION_ID_LEN + 1);
            found = true;
        }
    }
    pthread_mutex_unlock(&reg->lock);
    return found;
}

void api__session_set_name(api_sessions *reg, api__session *s, const char *name)
{
    pthread_mutex_lock(&reg->lock);
    snprintf(s->name, sizeof s->name, "%s", name);
    pthread_mutex_unlock(&reg->lock);
}

void api__session_set_model(api_sessions *reg, api__session *s, const char *model,
                            const api__session_positions *positions)
{
    pthread_mutex_lock(&reg->lock);
    snprintf(s->model, sizeof s->model, "%s", model);
    if (positions)
        s->positions = *positions;
    pthread_mutex_unlock(&reg->lock);
}

void api__sessions_end(api_sessions *reg, const char *id)
{
    pthread_mutex_lock(&reg->lock);
    api__session *s = find_locked(reg, id);
    if (s) {
        reg->ended++;
        unlink_locked(reg, s);
    }
    pthread_mutex_unlock(&reg->lock);
}

/* ---- Tickets ----------------------------------------------------------------------------- */

bool api_session_ticket_take(api_sessions *reg, const char *id, api_session_ticket *t)
{
    memset(t, 0, sizeof *t);
    if (!reg || !id)
        return false;
    pthread_mutex_lock(&reg->lock);
    api__session *s = find_locked(reg, id);
    if (s) {
        s->refs++;
        t->session = s;
        t->number = s->turns.next_ticket++;
    }
    pthread_mutex_unlock(&reg->lock);
    return s != NULL;
}

/* One ticket of `l` has ended; the last frees the line. */
static void line_unref_locked(api_sessions *reg, struct api__line *l)
{
    if (--l->tickets > 0)
        return;
    struct api__line **pp = &reg->lines[bucket_of(l->key)];
    while (*pp != l)
        pp = &(*pp)->hnext;
    *pp = l->hnext;
    parked_free(&l->turns); /* defensive: empty once every ticket ended, unless unordered */
    free(l);
}

bool api_sequence_ticket_take(api_sessions *reg, const char *model, const char *sequence_id,
                              size_t id_len, api_session_ticket *t)
{
    memset(t, 0, sizeof *t);
    if (!reg || !model || !sequence_id || id_len == 0 || memchr(sequence_id, '\0', id_len))
        return false;
    size_t model_len = strlen(model);
    if (id_len > SIZE_MAX - sizeof(struct api__line) - 2 - model_len)
        return false; /* defensive: both lie in the request's buffers */
    /* Made before the lock is taken, in case the sequence has no line yet. */
    struct api__line *fresh = calloc(1, sizeof *fresh + model_len + 1 + id_len + 1), *l;
    if (!fresh)
        return false;
    memcpy(fresh->key, model, model_len);
    fresh->key[model_len] = '/';
    memcpy(fresh->key + model_len + 1, sequence_id, id_len);
    pthread_mutex_lock(&reg->lock);
    l = line_find_locked(reg, fresh->key);
    if (!l) {
        size_t b = bucket_of(fresh->key);
        fresh->hnext = reg->lines[b];
        reg->lines[b] = l = fresh;
        fresh = NULL;
    }
    l->tickets++;
    t->sequence = l;
    t->number = l->turns.next_ticket++;
    pthread_mutex_unlock(&reg->lock);
    free(fresh);
    return true;
}

/* The order a ticket belongs to: its session's or its sequence's; NULL for a zeroed ticket. */
static api__turns *turns_of(const api_session_ticket *t)
{
    if (t->session)
        return &((api__session *)t->session)->turns;
    if (t->sequence)
        return &((struct api__line *)t->sequence)->turns;
    return NULL;
}

/* Adds a parked node; false when memory ran out. */
static bool park_locked(api__turns *tu, uint64_t number, void (*resume)(void *), void *arg)
{
    struct api__parked *p = malloc(sizeof *p);
    if (!p)
        return false;
    p->number = number;
    p->resume = resume;
    p->arg = arg;
    p->next = tu->parked;
    tu->parked = p;
    return true;
}

/* Removes and returns the parked node of `number`, or NULL. */
static struct api__parked *unpark_locked(api__turns *tu, uint64_t number)
{
    for (struct api__parked **pp = &tu->parked; *pp; pp = &(*pp)->next) {
        if ((*pp)->number == number) {
            struct api__parked *p = *pp;
            *pp = p->next;
            return p;
        }
    }
    return NULL;
}

bool api_session_turn(api_sessions *reg, api_session_ticket *t, void (*resume)(void *arg),
                      void *arg)
{
    api__turns *tu = turns_of(t);
    bool now = true;
    if (!tu)
        return true;
    pthread_mutex_lock(&reg->lock);
    /* Out of memory for the node: run out of turn rather than lose the request (acquiring
     * still keeps requests from overlapping). */
    if (!tu->unordered && t->number != tu->serving && park_locked(tu, t->number, resume, arg))
        now = false;
    pthread_mutex_unlock(&reg->lock);
    return now;
}

void api_session_turn_end(api_sessions *reg, api_session_ticket *t)
{
    api__turns *tu = turns_of(t);
    struct api__parked *next = NULL;
    if (!tu)
        return;
    pthread_mutex_lock(&reg->lock);
    if (t->number == tu->serving) {
        tu->serving++;
        while ((next = unpark_locked(tu, tu->serving)) && !next->resume) {
            free(next); /* dropped before its turn */
            tu->serving++;
        }
    } else if (!park_locked(tu, t->number, NULL, NULL)) {
        /* defensive: without the node `serving` would stop at this ticket for good; give the
         * order up instead (requests still never overlap: each acquires the session) */
        tu->unordered = true;
    }
    if (t->session)
        unref_locked(t->session);
    else
        line_unref_locked(reg, t->sequence);
    pthread_mutex_unlock(&reg->lock);
    memset(t, 0, sizeof *t);
    if (next) {
        void (*resume)(void *) = next->resume;
        void *arg = next->arg;
        free(next);
        resume(arg);
    }
}

/* ---- Describing a session ---------------------------------------------------------------- */

static const char *dtype_name(eng_dtype d)
{
    return d == ENG_DTYPE_BF16 ? "bfloat16" : d == ENG_DTYPE_F16 ? "float16" : "float32";
}

static void time_iso(api_buf *w, int64_t t)
{
    struct tm tm;
    char text[32];
    time_t tt = (time_t)t;
    gmtime_r(&tt, &tm);
    strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
    api_buf_char(w, '"');
    api_buf_cstr(w, text);
    api_buf_char(w, '"');
}

void api__session_describe(api_buf *w, const api__session *s, int64_t length, size_t bytes)
{
    api_buf_printf(w,
                   "{\"id\":\"%s\",\"length\":%lld,\"bytes\":%zu,\"cache_dtype\":\"%s\","
                   "\"num_heads\":%lld,\"num_kv_heads\":%lld,\"head_dim\":%lld,"
                   "\"value_head_dim\":%lld,\"max_tokens\":",
                   s->id, (long long)length, bytes, dtype_name(s->shape.dtype),
                   (long long)s->num_heads, (long long)s->shape.num_kv_heads,
                   (long long)s->shape.head_dim, (long long)s->shape.value_head_dim);
    if (s->shape.max_tokens > 0)
        api_buf_int(w, s->shape.max_tokens);
    else
        api_buf_cstr(w, "null");
    api_buf_cstr(w, ",\"model\":");
    if (s->model[0])
        api_buf_json_string(w, s->model, strlen(s->model));
    else
        api_buf_cstr(w, "null");
    api_buf_printf(w, ",\"ttl_s\":%lld,\"created\":", (long long)s->ttl_s);
    time_iso(w, s->created_s);
    api_buf_cstr(w, ",\"last_used\":");
    time_iso(w, s->last_used_s);
    api_buf_char(w, '}');
}

/* ---- The cheap routes -------------------------------------------------------------------- */

void api_sessions_get(api_sessions *reg, const char *id, api_reply *reply)
{
    api__error err = {0};
    api_buf w;
    memset(reply, 0, sizeof *reply);
    if (!reg) {
        api__sessions_off(&err);
        api__reply_from_error(reply, API_ERRORS_NATIVE, &err);
        return;
    }
    api_buf_init(&w, 4096);
    pthread_mutex_lock(&reg->lock);
    expire_locked(reg);
    api__session *s = find_locked(reg, id ? id : "");
    if (s) {
        api__session_describe(&w, s, s->length, s->bytes);
        api_buf_char(&w, '\n');
    } else {
        not_found_locked(reg, id, &err);
    }
    pthread_mutex_unlock(&reg->lock);
    if (!s) {
        api_buf_free(&w);
        api__reply_from_error(reply, API_ERRORS_NATIVE, &err);
        return;
    }
    api__reply_json(reply, &w, API_ERRORS_NATIVE);
}

void api_sessions_list(api_sessions *reg, const char *limit, const char *after, api_reply *reply)
{
    api__error err = {0};
    api_buf w;
    long long n = 100;
    memset(reply, 0, sizeof *reply);
    if (!reg) {
        api__sessions_off(&err);
        api__reply_from_error(reply, API_ERRORS_NATIVE, &err);
        return;
    }
    if (limit) {
        char *end = NULL;
        errno = 0;
        n = strtoll(limit, &end, 10);
        if (errno || end == limit || *end || n < 1 || n > 1000) {
            api__error_invalid(&err, "limit", "limit must be an integer in [1, 1000]");
            api__reply_from_error(reply, API_ERRORS_NATIVE, &err);
            return;
        }
    }
    api_buf_init(&w, (size_t)n * 512 + 256);
    api_buf_cstr(&w, "{\"sessions\":[");
    pthread_mutex_lock(&reg->lock);
    expire_locked(reg);
    api__session *s = reg->first;
    if (after && after[0]) {
        api__session *a = find_locked(reg, after);
        if (!a) {
            pthread_mutex_unlock(&reg->lock);
            api_buf_free(&w);
            api__error_invalid(&err, "after",
                               "after must be the id of a live session (the \"next\" of the "
                               "page before)");
            api__reply_from_error(reply, API_ERRORS_NATIVE, &err);
            return;
        }
        s = a->next;
    }
    for (long long i = 0; s && i < n; i++, s = s->next) {
        if (i)
            api_buf_char(&w, ',');
        api__session_describe(&w, s, s->length, s->bytes);
        if (i == n - 1)
            break;
    }
    /* s is the last one written (or NULL): there is a next page when it has a successor. */
    api_buf_cstr(&w, "],\"next\":");
    if (s && s->next)
        api_buf_printf(&w, "\"%s\"", s->id);
    else
        api_buf_cstr(&w, "null");
    api_buf_printf(&w, ",\"live\":%lld}\n", (long long)reg->live);
    pthread_mutex_unlock(&reg->lock);
    api__reply_json(reply, &w, API_ERRORS_NATIVE);
}

void api_sessions_delete(api_sessions *reg, const char *id, api_reply *reply)
{
    api__error err = {0};
    memset(reply, 0, sizeof *reply);
    if (!reg) {
        api__sessions_off(&err);
        api__reply_from_error(reply, API_ERRORS_NATIVE, &err);
        return;
    }
    pthread_mutex_lock(&reg->lock);
    api__session *s = find_locked(reg, id ? id : "");
    if (s) {
        reg->deleted++;
        unlink_locked(reg, s);
    } else {
        not_found_locked(reg, id, &err);
    }
    pthread_mutex_unlock(&reg->lock);
    if (!s) {
        api__reply_from_error(reply, API_ERRORS_NATIVE, &err);
        return;
    }
    reply->status = api_status_http(API_ERRORS_NATIVE, API_STATUS_NO_CONTENT);
    reply->content_type = "application/json";
}

/* ---- The step ---------------------------------------------------------------------------- */

/* Checks that tensor `t` (field `name`) is rank 2 [n, heads * d] or rank 3 [heads, n, d] and
 * sets *n. */
static int step_rows(const api__tensor *t, const char *name, int64_t heads, int64_t d,
                     const char *heads_name, int64_t *n, api__error *err)
{
    char shape[96];
    api__tensor_shape_str(t, shape, sizeof shape);
    if (t->rank == 2 && t->shape[1] == heads * d) {
        *n = t->shape[0];
        return 0;
    }
    if (t->rank == 3 && t->shape[0] == heads && t->shape[2] == d) {
        *n = t->shape[1];
        return 0;
    }
    return api__error_invalid(err, name,
                              "%s has shape %s; this session takes [n, %lld] (n tokens of %lld "
                              "%s of %lld) or [%lld, n, %lld]",
                              name, shape, (long long)(heads * d), (long long)heads, heads_name,
                              (long long)d, (long long)heads, (long long)d);
}

/* A [n, heads * d] (rank 2) or [heads, n, d] (rank 3) buffer as [1, heads, n, d]. */
static eng_view step_view(float *data, int rank, int64_t heads, int64_t n, int64_t d)
{
    if (rank == 3)
        return eng_view_contiguous(data, 1, heads, n, d);
    eng_view v = {data, {1, heads, n, d}, {n * heads * d, d, heads * d, 1}};
    return v;
}

static int step_shapes(api__session_step *st, api__error *err)
{
    api__sdpa_req *r = &st->r;
    const api__session *s = st->s;
    st->H = s->num_heads;
    st->Hkv = s->shape.num_kv_heads;
    st->D = s->shape.head_dim;
    st->Dv = s->shape.value_head_dim;
    if (r->num_heads && r->num_heads != st->H)
        return api__error_invalid(err, "num_heads", "num_heads is %lld but the session has %lld",
                                  (long long)r->num_heads, (long long)st->H);
    if (r->num_kv_heads && r->num_kv_heads != st->Hkv)
        return api__error_invalid(err, "num_kv_heads",
                                  "num_kv_heads is %lld but the session has %lld",
                                  (long long)r->num_kv_heads, (long long)st->Hkv);
    if (r->has_k != r->has_v)
        return api__error_invalid(err, r->has_k ? "value" : "key",
                                  "key and value are appended together: give both or neither");
    if (!r->has_q && !r->has_k)
        return api__error_invalid(err, "query",
                                  "a step needs a query (attend), key and value (append), or "
                                  "all three");
    int64_t nv = 0;
    if (r->has_k && (step_rows(&r->k, "key", st->Hkv, st->D, "kv heads", &st->n_new, err) != 0 ||
                     step_rows(&r->v, "value", st->Hkv, st->Dv, "kv heads", &nv, err) != 0))
        return -1;
    if (r->has_k && nv != st->n_new)
        return api__error_invalid(err, "value", "value has %lld tokens but key %lld", (long long)nv,
                                  (long long)st->n_new);
    if (r->has_q && step_rows(&r->q, "query", st->H, st->D, "heads", &st->n_q, err) != 0)
        return -1;
    int64_t length;
    if (api__session_check_append(s, st->expect_set, st->expect_length, st->n_new, "key", &length,
                                  err) != 0)
        return -1;
    st->S = length + st->n_new;
    if (r->has_q && st->S == 0)
        return api__error_invalid(err, "query",
                                  "the session is empty: append key and value before attending");
    if (r->has_mask || r->has_kpm || r->has_kvlen || r->additive)
        return api__error_invalid(err, "attn_mask", "a session step takes no masks");
    return r->has_sinks ? api__sinks_check(&r->sinks, st->H, r->weights, err) : 0;
}

static int step_elements(api__session_step *st, api__error *err)
{
    const api__sdpa_req *r = &st->r;
    size_t max = st->rq->limits.max_elements, total = 0;
    bool ok = api__size_add(&total, r->q.count) && api__size_add(&total, r->k.count) &&
              api__size_add(&total, r->v.count);
    if (r->has_q) {
        size_t o = 0;
        ok = ok && !__builtin_mul_overflow((size_t)(st->H * st->n_q), (size_t)st->Dv, &o) &&
             api__size_add(&total, o);
        if (r->weights != ENG_WEIGHTS_NONE) {
            size_t heads = r->weights == ENG_WEIGHTS_PER_HEAD ? (size_t)st->H : 1;
            ok = ok && !__builtin_mul_overflow(heads * (size_t)st->n_q, (size_t)st->S, &o) &&
                 api__size_add(&total, o);
        }
        if (r->return_lse || r->has_sinks)
            ok = ok && api__size_add(&total, (size_t)(st->H * st->n_q));
    }
    if (!ok || total > max)
        return api__error_set(err, API_STATUS_TOO_LARGE, API_REASON_TOO_LARGE, NULL,
                              "the step has %s%zu input and output elements (weights included), "
                              "more than the %zu that --max-elements allows",
                              ok ? "" : "over ", total, max);
    return 0;
}

/* Puts a batch axis of 1 in front of `sh`. */
static void batch_axis(api__out_shape *sh)
{
    memmove(sh->shape + 1, sh->shape, sizeof sh->shape - sizeof sh->shape[0]);
    sh->shape[0] = 1;
    sh->rank++;
}

static void step_out_shapes(api__session_step *st)
{
    int64_t n = st->n_q, S = st->S, H = st->H;
    if (st->r.q.rank == 3)
        st->os = (api__out_shape){3, {H, n, st->Dv}, (size_t)(H * n * st->Dv)};
    else
        st->os = (api__out_shape){2, {n, H * st->Dv}, (size_t)(H * n * st->Dv)};
    if (st->r.weights == ENG_WEIGHTS_PER_HEAD)
        st->ws = (api__out_shape){3, {H, n, S}, (size_t)(H * n * S)};
    else
        st->ws = (api__out_shape){2, {n, S}, (size_t)(n * S)};
    st->ls = (api__out_shape){2, {H, n}, (size_t)(H * n)};
    if (st->batch_axis) {
        batch_axis(&st->os);
        batch_axis(&st->ws);
        batch_axis(&st->ls);
    }
}

/* The step's options over the session's: what the step sets wins. */
static void step_args(api__session_step *st)
{
    const api__sdpa_req *r = &st->r;
    const api__session_opts *o = &st->s->opts;
    eng_sdpa_args *a = &st->args;
    memset(a, 0, sizeof *a);
    a->q = step_view(st->q, r->q.rank, st->H, st->n_q, st->D);
    a->out = step_view(st->out, r->q.rank, st->H, st->n_q, st->Dv);
    a->scale_set = r->scale_set || o->scale_set;
    a->scale = r->scale_set ? r->scale : o->scale;
    a->softcap = r->softcap > 0 ? r->softcap : o->softcap;
    a->precision = r->precision_set   ? r->precision
                   : o->precision_set ? o->precision
                                      : st->rq->limits.default_precision;
    api__causal c = st->causal_set ? r->causal : o->causal_set ? o->causal : API_CAUSAL_ON;
    a->causal = c != API_CAUSAL_OFF;
    if (r->offset_set) {
        a->align = ENG_ALIGN_OFFSET;
        a->query_offset = r->query_offset;
    } else {
        a->align = c == API_CAUSAL_TOP_LEFT ? ENG_ALIGN_TOP_LEFT : ENG_ALIGN_BOTTOM_RIGHT;
    }
    const api__window *w = r->window.left_set || r->window.right_set ? &r->window : &o->window;
    a->window_left_set = w->left_set;
    a->window_left = w->left;
    a->window_right_set = w->right_set;
    a->window_right = w->right;
    a->alibi = r->alibi || o->alibi;
    a->weights_mode = r->weights;
    a->weights = st->weights;
    a->lse = st->lse;
}

static int step_check(void *op, api__error *err)
{
    api__session_step *st = op;
    if (api__session_acquire(st->reg, st->id, &st->s, err) != 0)
        return -1;
    if (step_shapes(st, err) != 0 || step_elements(st, err) != 0)
        return -1;
    api__req_set_deadline(st->rq, st->r.timeout_ms);
    if (st->r.has_q) {
        step_out_shapes(st);
        step_args(st);
    }
    return 0;
}

enum { STEP_INPUTS = 4 };

static void step_inputs(api__session_step *st, api__input in[STEP_INPUTS])
{
    api__sdpa_req *r = &st->r;
    const api__input defs[STEP_INPUTS] = {
        {&r->q, r->has_q, API_ELEM_FLOAT, 0, (void **)&st->q, "query"},
        {&r->k, r->has_k, API_ELEM_FLOAT, 0, (void **)&st->k, "key"},
        {&r->v, r->has_v, API_ELEM_FLOAT, 0, (void **)&st->v, "value"},
        {&r->sinks, r->has_sinks, API_ELEM_FLOAT, 0, (void **)&st->sinks, "sinks"},
    };
    memcpy(in, defs, sizeof defs);
}

static bool step_bytes(void *op, bool outputs, size_t *tensors, size_t *scratch)
{
    api__session_step *st = op;
    api__input in[STEP_INPUTS];
    step_inputs(st, in);
    *tensors = 0;
    *scratch = 0;
    bool ok = api__input_bytes(in, STEP_INPUTS, tensors);
    if (!st->r.has_q)
        return ok;
    if (outputs) {
        ok = ok && api__req_output_bytes(st->os.count, tensors);
        if (st->r.weights != ENG_WEIGHTS_NONE)
            ok = ok && api__req_output_bytes(st->ws.count, tensors);
        if (st->r.return_lse || st->r.has_sinks)
            ok = ok && api__req_output_bytes(st->ls.count, tensors);
    }
    *scratch = eng_kv_attend_scratch_bytes(st->s->seq, &st->args, st->n_new,
                                           eng_pool_threads(st->rq->call->pool));
    return ok;
}

static int step_decode(void *op, api__error *err)
{
    api__session_step *st = op;
    api__input in[STEP_INPUTS];
    step_inputs(st, in);
    for (size_t i = 0; i < STEP_INPUTS; i++)
        if (in[i].present && api__req_decode_input(st->rq, &in[i], err) != 0)
            return -1;
    if (st->r.has_q &&
        (api__req_alloc_output(st->rq, &st->out, st->os.count, err) != 0 ||
         (st->r.weights != ENG_WEIGHTS_NONE &&
          api__req_alloc_output(st->rq, &st->weights, st->ws.count, err) != 0) ||
         ((st->r.return_lse || st->r.has_sinks) &&
          api__req_alloc_output(st->rq, &st->lse, st->ls.count, err) != 0)))
        return -1;
    if (st->r.has_sinks && api__sinks_check_values(st->sinks, st->H, err) != 0)
        return -1;
    api__req_parse_done(st->rq);
    if (st->r.has_q) {
        st->args.q.data = st->q;
        st->args.out.data = st->out;
        st->args.weights = st->weights;
        st->args.lse = st->lse;
    }
    return 0;
}

static double mib(size_t bytes)
{
    return (double)bytes / (1024.0 * 1024.0);
}

int api__session_with_room(api_sessions *reg, api__session *s, int64_t new_tokens,
                           eng_status (*step)(void *arg, eng_error *e), void *arg, eng_status *st,
                           eng_error *e, api__error *err)
{
    /* The step first: one that could never fit fails as such (413) without evicting anyone. */
    for (;;) {
        memset(e, 0, sizeof *e);
        *st = step(arg, e);
        if (*st != ENG_ENOMEM || e->cause != ENG_CAUSE_KV_CACHE_FULL)
            return 0;
        if (!api__sessions_make_room(reg, s, eng_kv_seq_append_bytes(s->seq, new_tokens)))
            return api__error_set(err, API_STATUS_OVERLOADED, API_REASON_MEMORY, NULL,
                                  "the KV cache (--kv-cache-bytes, %.1f MiB) is full of "
                                  "sessions with steps in flight; retry shortly",
                                  mib(reg->capacity));
    }
}

int api__session_check_append(const api__session *s, bool expect_set, int64_t expect_length,
                              int64_t n_new, const char *field, int64_t *length, api__error *err)
{
    *length = eng_kv_seq_length(s->seq);
    if (expect_set && expect_length != *length)
        return api__error_set(err, API_STATUS_CONFLICT, API_REASON_BAD_REQUEST, "expect_length",
                              "the session holds %lld tokens but the step expects %lld (a retry "
                              "of a step that was applied?); nothing was appended",
                              (long long)*length, (long long)expect_length);
    if (s->shape.max_tokens > 0 && n_new > s->shape.max_tokens - *length)
        return api__error_set(err, API_STATUS_TOO_LARGE, API_REASON_TOO_LARGE, field,
                              "appending %lld tokens to the %lld the session holds would pass "
                              "its max_tokens (%lld)",
                              (long long)n_new, (long long)*length, (long long)s->shape.max_tokens);
    return 0;
}

int api__session_too_long(api_sessions *reg, const api__session *s, eng_status st,
                          const eng_error *e, const char *field, api__error *err)
{
    if (st != ENG_ETOOBIG)
        return 0;
    if (e->cause == ENG_CAUSE_MAX_TOKENS)
        return api__error_set(err, API_STATUS_TOO_LARGE, API_REASON_TOO_LARGE, field,
                              "the step would pass the session's max_tokens (%lld): %s",
                              (long long)s->shape.max_tokens, e->message);
    return api__error_set(err, API_STATUS_TOO_LARGE, API_REASON_TOO_LARGE, field,
                          "the session could never fit the KV cache (--kv-cache-bytes, "
                          "%.1f MiB): %s",
                          mib(reg->capacity), e->message);
}

/* The engine call of a step: append and attend. */
static eng_status step_engine(void *op, eng_error *e)
{
    api__session_step *st = op;
    api__req *rq = st->rq;
    eng_kv_rows kr, vr;
    if (st->r.has_k) {
        kr = eng_kv_rows_f32(step_view(st->k, st->r.k.rank, st->Hkv, st->n_new, st->D));
        vr = eng_kv_rows_f32(step_view(st->v, st->r.v.rank, st->Hkv, st->n_new, st->Dv));
    }
    return eng_kv_step(rq->call->pool, st->s->seq, st->r.has_k ? &kr : NULL,
                       st->r.has_k ? &vr : NULL, st->r.has_q ? &st->args : NULL, &rq->lease->ctl,
                       e);
}

static int step_run(void *op, int64_t *compute_ns, api__error *err)
{
    api__session_step *st = op;
    api__req *rq = st->rq;
    eng_error e;
    eng_status rc;
    if (api__req_check_ctl(rq, err) != 0)
        return -1;
    int64_t t0 = eng_now_ns();
    int fail = api__session_with_room(st->reg, st->s, st->n_new, step_engine, st, &rc, &e, err);
    *compute_ns = eng_now_ns() - t0;
    if (fail)
        return -1;
    st->length = eng_kv_seq_length(st->s->seq);
    if (rc == ENG_OK && st->r.has_q && st->r.has_sinks)
        api__sinks_apply(st->sinks, &st->args.out, st->lse);
    if (rc == ENG_OK)
        return 0;
    if (api__session_too_long(st->reg, st->s, rc, &e, "key", err))
        return -1;
    const char *field = e.field[0] == 'q'   ? "query"
                        : e.field[0] == 'k' ? "key"
                        : e.field[0] == 'v' ? "value"
                                            : NULL;
    return api__req_engine_error(rq, rc, &e, field, err);
}

static const api__out_shape *step_output(void *op, int o, float ***slot)
{
    api__session_step *st = op;
    float **data = NULL;
    const api__out_shape *shape = NULL;
    if (!st->r.has_q) {
    } else if (o == API__OUT_OUTPUT) {
        data = &st->out;
        shape = &st->os;
    } else if (o == API__OUT_WEIGHTS && st->r.weights != ENG_WEIGHTS_NONE) {
        data = &st->weights;
        shape = &st->ws;
    } else if (o == API__OUT_LSE && st->r.return_lse) {
        data = &st->lse;
        shape = &st->ls;
    }
    if (slot)
        *slot = data;
    return shape;
}

static int64_t step_batch(const void *op)
{
    (void)op;
    return 1;
}

static void step_free(void *op)
{
    api__session_step *st = op;
    if (st->s) {
        api__session_release(st->reg, st->s);
        st->s = NULL;
    }
}

static eng_precision step_precision(const void *op)
{
    return eng_sdpa_precision(&((const api__session_step *)op)->args);
}

const api__op api__session_step_op = {
    .check = step_check,
    .bytes = step_bytes,
    .decode = step_decode,
    .run = step_run,
    .output = step_output,
    .precision = step_precision,
    .batch = step_batch,
    .free = step_free,
};
