/*
 * admission.c - the scheduler of admission.h: a learned cost per route and body size, the
 * expected wait in front of a request, and the choice of the next request to start.
 */
#include "server/admission.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

/* Buckets per octave of body bytes, and octaves (bodies up to 2^64 bytes). */
#define SUB_BUCKETS 4
#define OCTAVES     64
#define N_BUCKETS   (OCTAVES * SUB_BUCKETS)
#define N_ROUTES    64 /* routes beyond it share the last row */
/* How far from a learned size an estimate reaches, in buckets. */
#define EXTRAPOLATE_BUCKETS SUB_BUCKETS

/* The longest Retry-After an overloaded queue suggests. */
#define RETRY_AFTER_MAX_S 3600

/* The share of a request's time left at the end for what its client does outside the daemon's
 * view (waiting to be accepted, receiving the last of the reply), which the deadline must cover
 * too: it grows with the client's own load, a few percent with hundreds of uploads in flight. */
#define CLIENT_SLACK_DIV 20

/* A request starts beside others only when its deadline leaves this many times its cost's mean
 * deviation to spare (TCP's retransmission timer leaves four, RFC 6298): a long request's cost
 * has a long tail, since its background tasks yield to every other thread that runs. */
#define DEV_MARGIN 3

/* A request expected to take this much worker time or more is long: it fans out over the
 * pool, and short requests of its level go first. */
#define LONG_COST_NS ((int64_t)5 * 1000 * 1000)

struct srv_sched {
    pthread_mutex_t mu;
    int slots; /* the pool's workers; one more while a long request runs (its spare) */
    int running, running_long;
    int64_t area_ns, area_at;       /* the integral of `running` over time, and when it was taken */
    srv_sched_entry *head, *tail;   /* waiting, oldest first */
    srv_sched_entry *started[1025]; /* running, for their remaining time: slots + 1 */
    struct {
        int64_t mean, dev; /* learned worker ns and its mean deviation; mean 0: none yet */
        int64_t tail;      /* learned ns from the worker's end until the reply was written */
    } cost[N_ROUTES][N_BUCKETS];
};

/* ---- Cost model --------------------------------------------------------------------------- */

static int bucket_of(uint64_t bytes)
{
    int octave = 0, sub;
    if (bytes < 2)
        return 0;
    while (octave < OCTAVES - 1 && (bytes >> (octave + 1)) > 0)
        octave++;
    /* The two bits below the top one split the octave in four. */
    sub = octave >= 2 ? (int)((bytes >> (octave - 2)) & 3) : 0;
    return octave * SUB_BUCKETS + sub;
}

static int route_row(int route)
{
    return route < 0 ? 0 : route >= N_ROUTES ? N_ROUTES - 1 : route;
}

/* The learned cost of the bucket, else the nearest learned one within an octave each way,
 * scaled by the size ratio (each bucket is 2^(1/4) apart): linear in bytes, an underestimate
 * for quadratic attention, so that a size not seen yet is rather admitted than refused; 0 past
 * that. mu held. */
static int64_t cost_locked(const srv_sched *s, int route, uint64_t bytes, int64_t *margin)
{
    int64_t row[N_BUCKETS];
    int b = bucket_of(bytes);
    for (int i = 0; i < N_BUCKETS; i++)
        row[i] = s->cost[route_row(route)][i].mean;
    *margin = DEV_MARGIN * s->cost[route_row(route)][b].dev;
    for (int d = 0; d <= EXTRAPOLATE_BUCKETS; d++) {
        int at = -1;
        if (b - d >= 0 && row[b - d] > 0)
            at = b - d;
        else if (b + d < N_BUCKETS && row[b + d] > 0)
            at = b + d;
        if (at < 0)
            continue;
        return (int64_t)((double)row[at] * exp2((double)(b - at) / SUB_BUCKETS));
    }
    return 0;
}

int64_t srv__sched_cost(srv_sched *s, int route, uint64_t bytes, int64_t *margin)
{
    int64_t unused;
    pthread_mutex_lock(&s->mu);
    int64_t c = cost_locked(s, route, bytes, margin ? margin : &unused);
    pthread_mutex_unlock(&s->mu);
    return c;
}

/* Moves the average *avg toward `sample`: half of the way up, an eighth down. */
static void average_up_fast(int64_t *avg, int64_t sample)
{
    int64_t diff = sample - *avg;
    *avg += diff > 0 ? diff / 2 : diff / 8;
}

/* Exponential averages over the last few requests of the bucket, of the cost and of its
 * deviation (as TCP estimates a round trip). The mean rises fast and falls slowly: a request
 * started on an estimate that is too low is stopped at its deadline, its work wasted, while
 * one that is too high is only refused. A request stopped at its deadline only raises the
 * estimate. mu held. */
static void learn_locked(srv_sched *s, const srv_sched_entry *e, srv_sched_learn how, int64_t now)
{
    int64_t *mean = &s->cost[route_row(e->route)][bucket_of(e->bytes)].mean;
    int64_t *dev = &s->cost[route_row(e->route)][bucket_of(e->bytes)].dev;
    int64_t wall = now - e->run_ns, shared = s->area_ns - e->area0_ns, diff;
    /* Its wall time over the mean number of requests running meanwhile (itself included). */
    int64_t sample = shared > 0 ? (int64_t)((double)wall * (double)wall / (double)shared) : wall;
    if (sample <= 0 || how == SRV_SCHED_LEARN_NOTHING ||
        (how == SRV_SCHED_LEARN_AT_LEAST && sample <= *mean))
        return;
    if (*mean == 0) {
        *mean = sample;
        *dev = sample / 4;
        return;
    }
    diff = sample - *mean;
    average_up_fast(mean, sample);
    *dev += ((diff < 0 ? -diff : diff) - *dev) / 4;
}

/* The deviation of the cost of e's bucket. mu held. */
static int64_t dev_locked(const srv_sched *s, const srv_sched_entry *e)
{
    return s->cost[route_row(e->route)][bucket_of(e->bytes)].dev;
}

/* The learned time a reply of the size of `bytes` takes after its worker. mu held. */
static int64_t tail_locked(const srv_sched *s, int route, uint64_t bytes)
{
    return s->cost[route_row(route)][bucket_of(bytes)].tail;
}

/* Brings the integral of the running count up to `now`. mu held. */
static void area_update(srv_sched *s, int64_t now)
{
    if (now > s->area_at)
        s->area_ns += (now - s->area_at) * s->running;
    s->area_at = now > s->area_at ? now : s->area_at;
}

/* ---- Waiting list (mu held) ----------------------------------------------------------------- */

static void list_push(srv_sched *s, srv_sched_entry *e)
{
    e->prev = s->tail;
    e->next = NULL;
    if (s->tail)
        s->tail->next = e;
    else
        s->head = e;
    s->tail = e;
    e->state = SRV_SCHED_WAITING;
}

static void list_unlink(srv_sched *s, srv_sched_entry *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        s->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        s->tail = e->prev;
    e->prev = e->next = NULL;
    e->state = SRV_SCHED_OFF;
}

/* Whether `a` starts before `b` (both may start now): the more urgent level, then short before
 * long, then the older one, or the newer one in LIFO mode. */
static bool goes_before(const srv_sched_entry *a, const srv_sched_entry *b, bool lifo)
{
    if (a->level != b->level)
        return a->level < b->level;
    if (a->lng != b->lng)
        return !a->lng;
    return lifo ? a->arrival_ns > b->arrival_ns : a->arrival_ns < b->arrival_ns;
}

/* It is unlikely to finish by its deadline even if it starts now: a worker is better spent on
 * one that will. With others running it must leave room for DEV_MARGIN times its cost's
 * deviation and its client's slack too; on an idle pool the expected cost alone decides, so
 * that an estimate too high is still corrected by the requests that run. mu held. */
static bool hopeless(const srv_sched *s, const srv_sched_entry *e, int64_t now)
{
    if (e->deadline_ns <= 0 || e->cost_ns <= 0)
        return false;
    int64_t slack = (e->deadline_ns - e->arrival_ns) / CLIENT_SLACK_DIV;
    int64_t margin = s->running > 0 ? DEV_MARGIN * dev_locked(s, e) + slack : 0;
    return now + e->cost_ns + e->tail_ns + margin > e->deadline_ns;
}

/* How many requests may run now: one per worker, and while a long one runs one short more, on
 * the pool's spare thread, so that a short request need not wait for a worker the long one
 * holds (with one worker, for the whole of it). mu held. */
static int room_locked(const srv_sched *s)
{
    return s->slots + (s->running_long > 0 ? 1 : 0);
}

/* A list of entries to act on once mu is released. */
typedef struct {
    srv_sched_entry *e[64];
    int n;
} batch;

/* Where started request `e` runs: on this thread when it was just queued here, allows it, is
 * known to be tiny and a long one holds the workers. Handed to the pool's spare thread instead,
 * a tiny request would wait longer for that thread to be scheduled beside the long one, and
 * again for its I/O thread to send its reply, than its work takes. mu held. */
static srv_sched_where where_locked(const srv_sched *s, const srv_sched_entry *e,
                                    const srv_sched_entry *queued_here)
{
    bool tiny = e->cost_ns > 0 && e->cost_ns <= SRV_SCHED_HERE_NS;
    return e == queued_here && e->may_run_here && tiny && !e->lng && s->running_long > 0
               ? SRV_SCHED_HERE
               : SRV_SCHED_ON_POOL;
}

/* Picks the next request to start into *go, moving hopeless ones to *expired; false when none
 * may start now (no slot, or nothing waiting that may run beside those running). */
static bool pick_locked(srv_sched *s, int64_t now, batch *expired, srv_sched_entry **go)
{
    srv_sched_entry *best = NULL, *next;
    bool lifo;
    if (s->running >= room_locked(s) || !s->head)
        return false;
    /* Adaptive LIFO: once the oldest has waited half of its deadline, the queue is past its
     * target, and the newest (most likely to finish in time) go first. */
    lifo = s->head->deadline_ns > 0 &&
           now - s->head->arrival_ns > (s->head->deadline_ns - s->head->arrival_ns) / 2;
    for (srv_sched_entry *e = s->head; e; e = next) {
        next = e->next;
        if (hopeless(s, e, now) && expired->n < (int)(sizeof expired->e / sizeof expired->e[0])) {
            list_unlink(s, e);
            expired->e[expired->n++] = e;
            continue;
        }
        if (e->lng && (s->running_long > 0 || s->running >= s->slots))
            continue;
        if (!best || goes_before(e, best, lifo))
            best = e;
    }
    if (!best)
        return false;
    list_unlink(s, best);
    best->state = SRV_SCHED_STARTED;
    best->start_ns = best->run_ns = now;
    area_update(s, now);
    best->area0_ns = s->area_ns;
    s->running++;
    if (best->lng)
        s->running_long++;
    for (int i = 0; i <= s->slots; i++)
        if (!s->started[i]) {
            s->started[i] = best;
            break;
        }
    *go = best;
    return true;
}

/* The pool priority of a request at `level`: short requests of a level run before long ones. */
static uint32_t priority_of(uint32_t level, bool lng)
{
    return level * 2 + (lng ? 1 : 0);
}

/* Starts what the free slots allow and answers the hopeless; takes mu. `queued_here` (or NULL)
 * is the entry this thread just queued. */
static void dispatch(srv_sched *s, int64_t now, const srv_sched_entry *queued_here)
{
    for (;;) {
        batch expired = {.n = 0};
        srv_sched_entry *go = NULL;
        srv_sched_where where = SRV_SCHED_ON_POOL;
        pthread_mutex_lock(&s->mu);
        bool any = pick_locked(s, now, &expired, &go);
        if (any)
            where = where_locked(s, go, queued_here);
        pthread_mutex_unlock(&s->mu);
        for (int i = 0; i < expired.n; i++)
            expired.e[i]->ops->expire(expired.e[i]->req);
        if (any)
            go->ops->start(go->req, priority_of(go->level, go->lng), where);
        if (!any && expired.n == 0)
            return;
    }
}

/* ---- Public --------------------------------------------------------------------------------- */

srv_sched *srv__sched_new(int slots)
{
    srv_sched *s;
    if (slots < 1 || slots >= (int)(sizeof s->started / sizeof s->started[0]))
        return NULL;
    s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    pthread_mutex_init(&s->mu, NULL);
    s->slots = slots;
    return s;
}

void srv__sched_free(srv_sched *s)
{
    if (!s)
        return;
    pthread_mutex_destroy(&s->mu);
    free(s);
}

bool srv__sched_pool_priority_long(uint32_t pool_priority)
{
    return pool_priority % 2 == 1;
}

int64_t srv__sched_wait(srv_sched *s, int64_t cost_ns, uint32_t level, int64_t now)
{
    bool lng = cost_ns >= LONG_COST_NS;
    int64_t ahead = 0, soonest = INT64_MAX;
    pthread_mutex_lock(&s->mu);
    for (const srv_sched_entry *e = s->head; e; e = e->next)
        if (e->level < level || (e->level == level && (lng || !e->lng)))
            ahead += e->cost_ns;
    for (int i = 0; i <= s->slots; i++) {
        const srv_sched_entry *e = s->started[i];
        int64_t left;
        if (!e)
            continue;
        left = e->cost_ns - (now - e->start_ns);
        left = left > 0 ? left : 0;
        if (lng && e->lng)
            ahead += left; /* one long at a time: it waits for the running one */
        soonest = left < soonest ? left : soonest;
    }
    if (!lng && s->running >= room_locked(s) && soonest != INT64_MAX)
        ahead += soonest;
    pthread_mutex_unlock(&s->mu);
    return ahead;
}

bool srv__sched_overloaded(srv_sched *s, const srv_sched_ask *ask, int64_t now,
                           srv_sched_refusal *r)
{
    int64_t margin = 0, cost = srv__sched_cost(s, ask->route, ask->bytes, &margin), wait, start,
            tail, over;
    if (cost <= 0)
        return false;
    wait = srv__sched_wait(s, cost, ask->level, now) + ask->ahead_ns;
    start = wait > ask->arrive_ns ? wait : ask->arrive_ns;
    /* As pick_locked judges it: no margin when it starts on an idle pool. */
    margin = wait > 0 ? margin + ask->left_ns / CLIENT_SLACK_DIV : 0;
    pthread_mutex_lock(&s->mu);
    tail = tail_locked(s, ask->route, ask->bytes);
    pthread_mutex_unlock(&s->mu);
    if (start + cost + tail + margin <= ask->left_ns)
        return false;
    over = start + cost + tail + margin - ask->left_ns;
    r->retry_s = (int)(over / 1000000000 + 1);
    r->retry_s = r->retry_s > RETRY_AFTER_MAX_S ? RETRY_AFTER_MAX_S : r->retry_s;
    if (ask->arrive_ns > wait)
        snprintf(r->msg, sizeof r->msg,
                 "overloaded: its body would take about %lld ms to arrive, plus %lld ms of work, "
                 "past its deadline (%lld ms left); retry later",
                 (long long)(ask->arrive_ns / 1000000), (long long)(cost / 1000000),
                 (long long)(ask->left_ns / 1000000));
    else {
        char uploading[48] = "";
        if (ask->ahead_ns > 0)
            snprintf(uploading, sizeof uploading, " (%lld ms of it still uploading)",
                     (long long)(ask->ahead_ns / 1000000));
        snprintf(r->msg, sizeof r->msg,
                 "overloaded: about %lld ms of queued work%s plus %lld ms for this request would "
                 "end past its deadline (%lld ms left); retry later",
                 (long long)(wait / 1000000), uploading, (long long)(cost / 1000000),
                 (long long)(ask->left_ns / 1000000));
    }
    return true;
}

void srv__sched_enqueue(srv_sched *s, srv_sched_entry *e, int64_t now)
{
    e->lng = e->cost_ns >= LONG_COST_NS;
    e->arrival_ns = now;
    pthread_mutex_lock(&s->mu);
    e->tail_ns = tail_locked(s, e->route, e->bytes);
    list_push(s, e);
    pthread_mutex_unlock(&s->mu);
    dispatch(s, now, e);
}

bool srv__sched_remove(srv_sched *s, srv_sched_entry *e)
{
    bool was = false;
    pthread_mutex_lock(&s->mu);
    if (e->state == SRV_SCHED_WAITING) {
        list_unlink(s, e);
        was = true;
    }
    pthread_mutex_unlock(&s->mu);
    return was;
}

void srv__sched_begin(srv_sched *s, srv_sched_entry *e, int64_t now)
{
    pthread_mutex_lock(&s->mu);
    if (e->state == SRV_SCHED_STARTED) {
        area_update(s, now);
        e->run_ns = now;
        e->area0_ns = s->area_ns;
    }
    pthread_mutex_unlock(&s->mu);
}

/* Gives e's slot back, having learned what `learn` says; false when it held none. */
static bool release(srv_sched *s, srv_sched_entry *e, srv_sched_learn learn, int64_t now)
{
    pthread_mutex_lock(&s->mu);
    if (e->state != SRV_SCHED_STARTED) {
        pthread_mutex_unlock(&s->mu);
        return false;
    }
    area_update(s, now);
    learn_locked(s, e, learn, now);
    for (int i = 0; i <= s->slots; i++)
        if (s->started[i] == e)
            s->started[i] = NULL;
    s->running--;
    if (e->lng)
        s->running_long--;
    e->state = SRV_SCHED_OFF;
    pthread_mutex_unlock(&s->mu);
    return true;
}

void srv__sched_done(srv_sched *s, srv_sched_entry *e, srv_sched_learn learn, int64_t now)
{
    if (release(s, e, learn, now))
        dispatch(s, now, NULL);
}

void srv__sched_release(srv_sched *s, srv_sched_entry *e, int64_t now)
{
    release(s, e, SRV_SCHED_LEARN_NOTHING, now);
}

void srv__sched_sent(srv_sched *s, const srv_sched_entry *e, int64_t send_ns)
{
    if (send_ns <= 0)
        return;
    pthread_mutex_lock(&s->mu);
    int64_t *tail = &s->cost[route_row(e->route)][bucket_of(e->bytes)].tail;
    if (*tail == 0)
        *tail = send_ns;
    else
        average_up_fast(tail, send_ns);
    pthread_mutex_unlock(&s->mu);
}
