/*
 * session_order.c - the order of the steps of one session or one KServe v2 sequence: the
 * tickets and turns (api.h api_session_ticket) that server/ drives.
 *
 * The server takes a ticket per request at admission (the I/O thread: arrival order);
 * `serving` is the ticket whose turn it is. A worker whose ticket is not served yet parks it (a
 * node in `parked`) and returns: no worker ever waits for a request that has not started, so
 * the two workers of a small pool cannot both block behind a request still in the queue,
 * whatever order the pool dequeues in. The end of a turn advances `serving` past tickets
 * dropped out of turn and resumes the parked one whose turn it is.
 *
 * The requests of one KServe v2 sequence take their turns the same way, in a line of their own
 * keyed by model and sequence_id rather than in a session: the session of a sequence does not
 * exist yet when its START arrives (the start step creates it, from shapes only a worker
 * decodes), and a new START replaces it; the line lasts from its first ticket to the end of
 * its last. While a line has tickets, the session of that name is not idle (never evicted or
 * expired), as a session with tickets is not.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/ops/session_registry.h"

bool api_session_ticket_take(api_sessions *reg, const char *id, api_session_ticket *t)
{
    memset(t, 0, sizeof *t);
    if (!reg || !id)
        return false;
    pthread_mutex_lock(&reg->lock);
    /* A session idle past its TTL is gone before it is pinned: the ticket would keep it. */
    api__sessions_expire_locked(reg);
    api__session *s = api__sessions_find_locked(reg, id);
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
    struct api__line **pp = &reg->lines[api__sessions_bucket(l->key)];
    while (*pp != l)
        pp = &(*pp)->hnext;
    *pp = l->hnext;
    api__turns_free(&l->turns); /* defensive: empty once every ticket ended, unless unordered */
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
    l = api__sessions_line_find_locked(reg, fresh->key);
    if (!l) {
        size_t b = api__sessions_bucket(fresh->key);
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
        api__session_unref_locked(t->session);
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
