/*
 * session_registry.c - the KV-cache session registry (api.h api_sessions): sessions by id,
 * their life (acquire, release, eviction, expiry, end) and the room a step makes in the pool.
 *
 * The registry is a hash of live sessions by id, a list in creation order (listing, the LRU
 * and TTL scans) and a ring of tombstones, all under one mutex that is held for lookups and
 * bookkeeping only: a request that uses a session marks it busy and computes without the lock.
 * Scans are linear in the live sessions, which is microseconds for the thousands a pool of
 * gigabytes holds.
 *
 * A session with a ticket outstanding (session_order.c), acquired, or pinned is never evicted;
 * a deleted one leaves the hash at once and is freed by its last reference.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "api/ops/session_registry.h"
#include "api/wire/timeout.h"

static int64_t wall_s(void)
{
    return (int64_t)time(NULL);
}

size_t api__sessions_bucket(const char *id)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *id; id++)
        h = (h ^ (unsigned char)*id) * 1099511628211ull;
    return (size_t)(h % API_SESSIONS_BUCKETS);
}

struct api__line *api__sessions_line_find_locked(const api_sessions *reg, const char *key)
{
    for (struct api__line *l = reg->lines[api__sessions_bucket(key)]; l; l = l->hnext)
        if (strcmp(l->key, key) == 0)
            return l;
    return NULL;
}

void api__turns_free(api__turns *tu)
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
    api__turns_free(&s->turns); /* defensive: every ticket ends before the last reference goes */
    for (int64_t i = 0; i < s->layers; i++)
        eng_kv_seq_free(s->cache[i].seq);
    free(s);
}

void api__session_unref_locked(api__session *s)
{
    if (--s->refs == 0)
        session_free(s);
}

/* Takes `s` out of the hash and the list; the registry's reference goes. */
static void unlink_locked(api_sessions *reg, api__session *s)
{
    api__session **pp = &reg->buckets[api__sessions_bucket(s->id)];
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
    api__session_unref_locked(s);
}

static void tombstone_locked(api_sessions *reg, const char *id, api__gone_reason why)
{
    memcpy(reg->tomb[reg->tomb_next].id, id, API_SESSION_ID_LEN + 1);
    reg->tomb[reg->tomb_next].reason = why;
    reg->tomb_next = (reg->tomb_next + 1) % API_SESSIONS_TOMBSTONES;
}

/* Idle: no request holds it, none is waiting for a turn (of the session, or of the v2 sequence
 * it serves), nothing pins it. */
static bool idle_locked(const api_sessions *reg, const api__session *s)
{
    return !s->busy && s->turns.next_ticket == s->turns.serving && s->refs == 1 &&
           !(s->name[0] && api__sessions_line_find_locked(reg, s->name));
}

static void evict_locked(api_sessions *reg, api__session *s, api__gone_reason why)
{
    tombstone_locked(reg, s->id, why);
    if (why == API_GONE_TTL)
        reg->evicted_ttl++;
    else
        reg->evicted_pressure++;
    unlink_locked(reg, s);
}

void api__sessions_expire_locked(api_sessions *reg)
{
    int64_t now = eng_now_ns();
    api__session *s = reg->first;
    while (s) {
        api__session *next = s->next;
        if (s->ttl_s > 0 && idle_locked(reg, s) && now - s->last_used_ns > s->ttl_s * 1000000000ll)
            evict_locked(reg, s, API_GONE_TTL);
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

void api__session_model(api_sessions *reg, const char *id, char *model, size_t len)
{
    pthread_mutex_lock(&reg->lock);
    const api__session *s = api__sessions_find_locked(reg, id);
    snprintf(model, len, "%s", s ? s->model : "");
    pthread_mutex_unlock(&reg->lock);
}

api__session *api__sessions_find_locked(api_sessions *reg, const char *id)
{
    for (api__session *s = reg->buckets[api__sessions_bucket(id)]; s; s = s->hnext)
        if (strcmp(s->id, id) == 0)
            return s;
    return NULL;
}

/* The 404 of an id that names no live session; returns -1. */
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
    for (size_t i = 0; i < API_SESSIONS_TOMBSTONES; i++) {
        if (strcmp(reg->tomb[i].id, id) == 0)
            return api__error_code(err, API_STATUS_NOT_FOUND, "session_evicted", NULL,
                                   "session %s was %s; create it again (POST /v1/sessions) and "
                                   "replay its tokens",
                                   id,
                                   reg->tomb[i].reason == API_GONE_TTL
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
    for (size_t b = 0; b < API_SESSIONS_BUCKETS;
         b++) { /* defensive: no request may still hold one */
        while (reg->lines[b]) {
            struct api__line *l = reg->lines[b];
            reg->lines[b] = l->hnext;
            api__turns_free(&l->turns);
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
    api__sessions_expire_locked(reg);
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

int64_t api__sessions_default_ttl(const api_sessions *reg)
{
    return reg->ttl_s;
}

/* Records the lengths of s's caches, the shortest of them and the bytes of all: the lock held,
 * or s acquired before anyone else may see it. */
static void measure_locked(const api_sessions *reg, api__session *s)
{
    s->bytes = 0;
    for (int64_t i = 0; i < s->layers; i++) {
        int64_t n = eng_kv_seq_length(s->cache[i].seq);
        s->cache[i].length = n;
        s->length = i == 0 || n < s->length ? n : s->length;
        s->bytes += api__session_bytes(reg, &s->shape, n);
    }
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

eng_kv_seq **api__session_caches_new(api_sessions *reg, const eng_kv_shape *shape, int64_t layers,
                                     eng_error *e)
{
    eng_kv_seq **seqs = calloc((size_t)layers, sizeof *seqs);
    if (!seqs) {
        memset(e, 0, sizeof *e);
        e->status = ENG_ENOMEM;
        snprintf(e->message, sizeof e->message, "out of memory for %lld caches", (long long)layers);
        return NULL;
    }
    for (int64_t i = 0; i < layers; i++) {
        if (!(seqs[i] = eng_kv_seq_new(reg->pool, shape, e))) {
            while (i > 0)
                eng_kv_seq_free(seqs[--i]);
            free(seqs);
            return NULL;
        }
    }
    return seqs;
}

int api__sessions_add(api_sessions *reg, eng_kv_seq *const *seqs, int64_t layers, int64_t num_heads,
                      const api__session_opts *opts, int64_t ttl_s, api__session **out,
                      api__error *err)
{
    api__session *s = calloc(1, sizeof *s + (size_t)layers * sizeof s->cache[0]);
    if (!s) {
        for (int64_t i = 0; i < layers; i++)
            eng_kv_seq_free(seqs[i]);
        return api__error_set(err, API_STATUS_UNAVAILABLE, API_REASON_MEMORY, NULL,
                              "out of memory for a session");
    }
    s->layers = layers;
    for (int64_t i = 0; i < layers; i++)
        s->cache[i].seq = seqs[i];
    s->num_heads = num_heads;
    s->shape = eng_kv_seq_shape(seqs[0]);
    s->opts = *opts;
    s->ttl_s = ttl_s;
    s->created_s = s->last_used_s = wall_s();
    s->last_used_ns = eng_now_ns();
    measure_locked(reg, s);
    s->refs = 2; /* the registry's and the caller's (acquired) */
    s->busy = true;
    s->live = true;
    pthread_mutex_lock(&reg->lock);
    api__sessions_expire_locked(reg);
    do
        new_id(reg, s->id);
    while (api__sessions_find_locked(reg, s->id)); /* 2^-128: never, but cheap to be sure */
    size_t b = api__sessions_bucket(s->id);
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
    api__sessions_expire_locked(reg);
    api__session *s = api__sessions_find_locked(reg, id ? id : "");
    if (!s) {
        not_found_locked(reg, id, err);
        pthread_mutex_unlock(&reg->lock);
        return -1;
    }
    s->refs++;
    while (s->busy) /* only an unticketed request (tests, direct callers) ever waits here */
        pthread_cond_wait(&reg->released, &reg->lock);
    if (!s->live) { /* deleted while we waited */
        api__session_unref_locked(s);
        not_found_locked(reg, id, err);
        pthread_mutex_unlock(&reg->lock);
        return -1;
    }
    s->busy = true;
    pthread_mutex_unlock(&reg->lock);
    *out = s;
    return 0;
}

void api__session_update(api_sessions *reg, api__session *s)
{
    pthread_mutex_lock(&reg->lock);
    measure_locked(reg, s);
    pthread_mutex_unlock(&reg->lock);
}

void api__session_release(api_sessions *reg, api__session *s)
{
    pthread_mutex_lock(&reg->lock);
    measure_locked(reg, s);
    s->last_used_s = wall_s();
    s->last_used_ns = eng_now_ns();
    s->busy = false;
    api__session_unref_locked(s);
    pthread_cond_broadcast(&reg->released);
    pthread_mutex_unlock(&reg->lock);
}

/* Evicts least recently used idle sessions (not `self`, none with a ticket outstanding or
 * acquired) until `bytes` of the pool are free or none is left; true when they are. */
static bool make_room(api_sessions *reg, const api__session *self, size_t bytes)
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
            evict_locked(reg, victim, API_GONE_PRESSURE);
        pthread_mutex_unlock(&reg->lock);
        if (!victim)
            return false;
    }
}

bool api__sessions_find_name(api_sessions *reg, const char *name, char *id)
{
    bool found = false;
    pthread_mutex_lock(&reg->lock);
    api__sessions_expire_locked(reg);
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
    api__session *s = api__sessions_find_locked(reg, id);
    if (s) {
        reg->ended++;
        unlink_locked(reg, s);
    }
    pthread_mutex_unlock(&reg->lock);
}

int api__sessions_view(api_sessions *reg, const char *id, api__session_view_fn fn, void *ctx,
                       api__error *err)
{
    pthread_mutex_lock(&reg->lock);
    api__sessions_expire_locked(reg);
    api__session *s = api__sessions_find_locked(reg, id ? id : "");
    if (s)
        fn(ctx, s);
    else
        not_found_locked(reg, id, err);
    pthread_mutex_unlock(&reg->lock);
    return s ? 0 : -1;
}

int api__sessions_view_page(api_sessions *reg, api__session_page *page, api__session_view_fn fn,
                            void *ctx, api__error *err)
{
    pthread_mutex_lock(&reg->lock);
    api__sessions_expire_locked(reg);
    api__session *s = reg->first;
    if (page->after && page->after[0]) {
        api__session *a = api__sessions_find_locked(reg, page->after);
        if (!a) {
            pthread_mutex_unlock(&reg->lock);
            return api__error_invalid(err, "after",
                                      "after must be the id of a live session (the \"next\" of "
                                      "the page before)");
        }
        s = a->next;
    }
    page->more = false;
    for (int64_t i = 0; s && i < page->n; i++, s = s->next) {
        fn(ctx, s);
        page->more = s->next != NULL;
    }
    page->live = reg->live;
    pthread_mutex_unlock(&reg->lock);
    return 0;
}

int api__sessions_delete(api_sessions *reg, const char *id, api__error *err)
{
    pthread_mutex_lock(&reg->lock);
    api__session *s = api__sessions_find_locked(reg, id ? id : "");
    if (s) {
        reg->deleted++;
        unlink_locked(reg, s);
    } else {
        not_found_locked(reg, id, err);
    }
    pthread_mutex_unlock(&reg->lock);
    return s ? 0 : -1;
}

static double mib(size_t bytes)
{
    return (double)bytes / (1024.0 * 1024.0);
}

int api__session_with_room(api_sessions *reg, api__session *s, size_t room,
                           eng_status (*step)(void *arg, eng_error *e), void *arg, eng_status *st,
                           eng_error *e, api__error *err)
{
    /* The step first: one that could never fit fails as such (413) without evicting anyone. */
    for (;;) {
        memset(e, 0, sizeof *e);
        *st = step(arg, e);
        if (*st != ENG_ENOMEM || e->cause != ENG_CAUSE_KV_CACHE_FULL)
            return 0;
        if (!make_room(reg, s, room))
            return api__error_set(err, API_STATUS_OVERLOADED, API_REASON_MEMORY, NULL,
                                  "the KV cache (--kv-cache-bytes, %.1f MiB) is full of "
                                  "sessions with steps in flight; retry shortly",
                                  mib(reg->capacity));
    }
}

int api__session_check_append(const api__session *s, int64_t layer, bool expect_set,
                              int64_t expect_length, int64_t n_new, const char *field,
                              int64_t *length, api__error *err)
{
    *length = eng_kv_seq_length(s->cache[layer].seq);
    if (expect_set && expect_length != *length && s->layers > 1)
        return api__error_set(err, API_STATUS_CONFLICT, API_REASON_BAD_REQUEST, "expect_length",
                              "layer %lld of the session holds %lld tokens but the step expects "
                              "%lld (a retry of a step that was applied, or a layer skipped?); "
                              "nothing was appended",
                              (long long)layer, (long long)*length, (long long)expect_length);
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
