/*
 * admission.h - the scheduler between admission and the engine pool (admission.c): what a
 * request is expected to cost, how long it is expected to wait, and which waiting request a
 * free worker starts next.
 *
 * Admitted requests wait here, not in the pool's queue, and at most as many run at once as the
 * pool has workers; of those, at most one is long (a request that fans out over the whole pool
 * gains nothing from sharing it, and two long ones sharing it both finish late). While a long
 * one runs, one short request more may run, on the pool's spare thread (eng_pool_add_spare). The
 * next one to start is the most urgent level's, short before long; within that, oldest first while
 * the queue is healthy, newest first (adaptive LIFO) once the oldest waiting request has spent half
 * of its deadline waiting. A request that cannot finish by its deadline (its reply written) is
 * never started: it is answered 504 at once and the worker goes to one that can.
 *
 * A tiny request (expected to take at most SRV_SCHED_HERE_NS) that starts while a long one runs
 * runs on the thread that queued it, when its entry allows (srv_sched_where): every worker
 * thread is busy then, and a hand-off waits for the kernel to schedule one.
 *
 * Costs are learned: each finished request teaches the estimate of its route and body size
 * (a quarter of an octave of bytes), as the time it took divided by the mean number of
 * requests that shared the pool with it, and the time its reply took to be written after it.
 * The server asks for a cost from Content-Length before the body is read, so it can refuse
 * (429) a request whose expected wait plus cost is past its deadline.
 *
 * The scheduler knows requests only through srv_sched_entry and the srv_sched_ops it names:
 * The jobs of both edges (job.h: HTTP requests and gRPC inferences) embed an entry and wait in
 * the same list. Any thread; one mutex inside.
 */
#ifndef ATTND_SERVER_ADMISSION_H
#define ATTND_SERVER_ADMISSION_H

#include <stdbool.h>
#include <stdint.h>

typedef struct srv_sched srv_sched;

typedef enum {
    SRV_SCHED_OFF = 0, /* not with the scheduler */
    SRV_SCHED_WAITING, /* in the waiting list */
    SRV_SCHED_STARTED, /* handed to the pool: holds a slot until srv__sched_done */
} srv_sched_state;

/* Where a started request runs. */
typedef enum {
    SRV_SCHED_ON_POOL = 0, /* handed to the pool at its priority */
    SRV_SCHED_HERE,        /* run by the thread in srv__sched_enqueue, before it returns */
} srv_sched_where;

/* The most a request may be expected to cost to run SRV_SCHED_HERE: the thread that queues
 * requests (an I/O thread) serves none of its other connections meanwhile. */
#define SRV_SCHED_HERE_NS ((int64_t)500 * 1000)

/* What the scheduler does to a request, always without its lock held; each takes over the
 * reference the waiting list held. start: run it `where` says, at `pool_priority` on the pool
 * (whoever runs it ends with srv__sched_done); expire: answer 504 now without running it,
 * unless it was answered meanwhile. */
typedef struct {
    void (*start)(void *req, uint32_t pool_priority, srv_sched_where where);
    void (*expire)(void *req);
} srv_sched_ops;

/* A request as the scheduler sees it; the caller fills the fields above `state`. */
typedef struct srv_sched_entry {
    const srv_sched_ops *ops; /* how to start or expire req */
    void *req;
    int route;           /* the cost model's key, with bytes */
    uint64_t bytes;      /* the body's size */
    uint32_t level;      /* 1 is most urgent */
    int64_t deadline_ns; /* absolute, eng_now_ns clock */
    int64_t cost_ns;     /* srv__sched_cost's estimate (0: unknown) */
    bool may_run_here;   /* the thread that queues it may run it (SRV_SCHED_HERE) */

    srv_sched_state state;
    bool lng;           /* long: runs alone among long ones, after short ones of its level */
    int64_t tail_ns;    /* the time its reply is expected to take after its worker */
    int64_t arrival_ns; /* entered the waiting list */
    int64_t start_ns;   /* handed to the pool */
    int64_t run_ns;     /* a worker began it (srv__sched_begin), or its start */
    int64_t area0_ns;   /* the scheduler's integral of requests running, at run_ns */
    struct srv_sched_entry *prev, *next;
} srv_sched_entry;

/* `slots` requests run at once at most (the pool's workers, 1 to 1024), one more beside a long
 * one (the spare's). NULL when out of memory or out of range. */
srv_sched *srv__sched_new(int slots);
void srv__sched_free(srv_sched *s);

/* The expected worker time of a request of `route` with a body of `bytes`, from what requests of
 * that route and a similar size took: 0 when nothing is known yet. *margin (may be NULL) gets
 * three times the usual deviation of that bucket: the scheduler starts a request beside others
 * only when its deadline leaves room for both. */
int64_t srv__sched_cost(srv_sched *s, int route, uint64_t bytes, int64_t *margin);

/* The expected time until a request of `cost_ns` at `level` would start, from the requests
 * waiting ahead of it and the rest of those running. */
int64_t srv__sched_wait(srv_sched *s, int64_t cost_ns, uint32_t level, int64_t now);

/* A request asking to be admitted: its key in the cost model, its level and its time; and, for
 * one judged from its headers, the time its body takes to arrive and the work of the bodies
 * arriving before it, which will wait ahead of it (upload.h). */
typedef struct {
    int route;
    uint64_t bytes;
    uint32_t level;
    int64_t left_ns;   /* until its deadline */
    int64_t arrive_ns; /* until its body is in; 0: it is */
    int64_t ahead_ns;  /* work not queued yet that will be ahead of it */
} srv_sched_ask;

/* What an overloaded queue tells the request it refuses. */
typedef struct {
    int retry_s;   /* seconds after which the queue should have room for it */
    char msg[240]; /* the queued work, its own cost and its time left */
} srv_sched_refusal;

/* Whether the request would wait (for the work ahead of it and for its body, whichever is
 * longer) and run past its deadline (then *r says why); false while nothing is learned of its
 * size, so that the scheduler decides. */
bool srv__sched_overloaded(srv_sched *s, const srv_sched_ask *ask, int64_t now,
                           srv_sched_refusal *r);

/* Queues `e` (filled above `state`) and starts what the free slots allow, `e` perhaps on this
 * thread (SRV_SCHED_HERE). The list holds the request's job reference until it is started,
 * expired, or removed. */
void srv__sched_enqueue(srv_sched *s, srv_sched_entry *e, int64_t now);

/* Takes `e` out of the waiting list, for a request answered while it waited (the watcher);
 * true when it was there (the caller then owns the reference the list held). */
bool srv__sched_remove(srv_sched *s, srv_sched_entry *e);

/* A worker began running started request `e`: its cost is measured from now, so that the time
 * it waited in the pool's queue (behind a task of a long request) does not count. */
void srv__sched_begin(srv_sched *s, srv_sched_entry *e, int64_t now);

/* What a request that gave its slot back teaches about the cost of its size. */
typedef enum {
    SRV_SCHED_LEARN_NOTHING = 0, /* it failed early, or was parked for its turn in a session */
    SRV_SCHED_LEARN_COST,        /* it ran to the end: its time is a sample of the cost */
    SRV_SCHED_LEARN_AT_LEAST,    /* it was stopped at its deadline: the cost is at least its time */
} srv_sched_learn;

/* A started request gave its slot back; starts what the slot allows. */
void srv__sched_done(srv_sched *s, srv_sched_entry *e, srv_sched_learn learn, int64_t now);

/* Gives started request `e`'s slot back, learning nothing and starting nothing: for its
 * srv_sched_ops.start, whose caller goes on to start what the slot allows. */
void srv__sched_release(srv_sched *s, srv_sched_entry *e, int64_t now);

/* The reply of started request `e` was written to its client `send_ns` after its worker ended:
 * the time a reply of its size takes, which its deadline must leave room for too. */
void srv__sched_sent(srv_sched *s, const srv_sched_entry *e, int64_t send_ns);

/* Whether a pool priority is a long request's: the pool runs its tasks as background work. */
bool srv__sched_pool_priority_long(uint32_t pool_priority);

#endif
