/*
 * job.h - one inference between its admission and its answer, whichever edge it came from
 * (HTTP: http.c, gRPC: grpc_call.c): the checks that admit it (the drain, its deadline, the
 * queue's work, --max-queue), its place in a session's or sequence's order, its wait with the
 * scheduler (admission.h), its run on an engine worker, what it teaches the cost model, the
 * server's queued/admitted/running counters, and the reply of a job that ends without running,
 * from the outcome table (outcome.h). The edge embeds an srv_job in its request and says through
 * srv_job_ops how a worker runs it, how an error reply looks in its protocol, and how the
 * finished job goes back to it.
 *
 *     srv__job_init(&req->job, s, &my_job_ops, req, &req->lease, &req->reply);
 *     srv_job_where w = {.route = route, .bytes = len, .level = srv__job_level(s, priority)};
 *     srv_job_refusal no;
 *     if (!srv__job_admit(&req->job, &w, now, &no))
 *         answer no.outcome with no.msg (and no.retry_s), the job never queued;
 *     else {
 *         srv__job_take_turn(&req->job, &order);   // a session step or a v2 sequence's
 *         srv__job_start(&req->job, now);          // ops->end is called once, later
 *     }
 *
 * Threads and ownership: the edge's thread admits and starts a job. From srv__job_start the
 * job holds one reference of the edge's request, and the scheduler, then a worker, owns it;
 * ops->end is called exactly once per started job, last, on the thread that ended it: with
 * SRV_JOB_ANSWERED when the job's reply is final (it ran, expired, or could not be queued), or
 * SRV_JOB_DROPPED when srv__job_abandon answered it meanwhile (the caller of srv__job_abandon
 * delivers that answer). Any thread may call srv__job_abandon and srv__job_cancel.
 */
#ifndef ATTND_SERVER_JOB_H
#define ATTND_SERVER_JOB_H

#include <stdatomic.h>

#include "server/admission.h"
#include "server/batch.h"
#include "server/daemon.h"
#include "server/outcome.h"

typedef enum {
    SRV_JOB_NEW = 0,  /* the edge still reads it: not started */
    SRV_JOB_QUEUED,   /* admitted: with the scheduler, the pool or a lane, no worker yet */
    SRV_JOB_RUNNING,  /* a worker runs ops->work */
    SRV_JOB_FINISHED, /* the reply is final */
} srv_job_state;

/* How a started job comes back to its edge (srv_job_ops.end). */
typedef enum {
    SRV_JOB_ANSWERED, /* its reply is final: deliver it, then drop the job's reference */
    SRV_JOB_DROPPED,  /* srv__job_abandon answered it: only drop the job's reference */
} srv_job_end;

typedef struct srv_job srv_job;

typedef struct {
    /* On a worker: decode, compute and encode, filling *job->reply; the deadline and cancel
     * flag are job->lease's. */
    void (*work)(srv_job *job);
    /* Fills *job->reply with refusal `o` and `msg`, as the edge's protocol writes errors. */
    void (*fail)(srv_job *job, srv_outcome o, const char *msg);
    /* The job is back (see above); the last thing done with it. */
    void (*end)(srv_job *job, srv_job_end how);
    /* What set the job's deadline, for a 504's message ("--request-timeout-ms 60000"). */
    void (*deadline_origin)(const srv_job *job, char *buf, size_t size);
    /* For a job admitted with a batch key, on a worker: fills *m with the call work would make
     * and returns true, and the job runs in a batch (api_call_batch), after which batch_called
     * does what work does after its call; false: it runs alone, with work. NULL: never. */
    bool (*batch_call)(srv_job *job, api_batch_member *m);
    void (*batch_called)(srv_job *job);
} srv_job_ops;

/* Where a job waits: its row in the cost model and its priority level. */
typedef struct {
    int route;          /* the cost model's key: an srv_route, or SRV_JOB_ROUTE_GRPC */
    uint64_t bytes;     /* its request's size */
    uint32_t level;     /* 1 is most urgent (srv__job_level) */
    bool may_run_here;  /* the thread that starts it may run it (SRV_SCHED_HERE): false for a
                           step that may wait for its turn, and for an edge whose thread must
                           not block */
    uint64_t batch_key; /* api_batch_key: jobs with the same nonzero key may run as one batch
                           (--max-batch-rows); 0: alone */
} srv_job_where;

/* The answer to a request refused for the drain: KV-cache sessions live in this process, so they
 * end with it. */
#define SRV_DRAINING_MSG                                                                           \
    "the server is shutting down; retry on another replica (KV-cache sessions end with this "      \
    "process: create them again there)"

/* The cost model's row of gRPC inferences, after HTTP's routes. */
#define SRV_JOB_ROUTE_GRPC SRV_ROUTE_COUNT

/* The order a job runs in, if any: a session's (`session`) or a v2 sequence's (`model` and the
 * sequence id as the request writes it). */
typedef struct {
    const char *session;
    const char *model;
    const char *sequence_id;
    size_t sequence_id_len;
} srv_job_order;

/* Why a job was not admitted: an outcome, its message and, for a full queue, when to retry. */
typedef struct {
    srv_outcome outcome;
    int retry_s; /* > 0: the Retry-After computed from the queue; 0: the outcome's own */
    char msg[240];
} srv_job_refusal;

struct srv_job {
    const srv_job_ops *ops;
    void *owner; /* the edge's request */
    srv_server *s;
    api_lease *lease; /* its memory, deadline and cancel flag */
    api_reply *reply;
    atomic_int state;                   /* srv_job_state */
    atomic_int cancelled;               /* srv_outcome that cancelled it (srv__job_cancel), or 0 */
    api_session_ticket ticket;          /* its place in a session's or sequence's order */
    uint32_t pool_priority;             /* the one the scheduler started it at */
    srv_sched_entry sched;              /* its place with the scheduler */
    srv_batch_item batch;               /* its place in its layer's lane; key 0: runs alone */
    int sharing;                        /* the jobs of its batch, which share its worker time */
    int64_t submit_ns, run_ns, done_ns; /* admitted, began on a worker, reply final */
    int64_t copy_ns; /* the edge's time copying the request's bytes before admission */
};

/* A request's time in the daemon's hands as Triton's statistics count it: admission (its body
 * whole) to its final reply, without the body's arrival before or the reply's sending after;
 * 0 for a job never admitted. */
int64_t srv__job_handler_ns(const srv_job *job);

/* A job not yet admitted, for `owner`, whose lease and reply live in the owner. */
void srv__job_init(srv_job *job, srv_server *s, const srv_job_ops *ops, void *owner,
                   api_lease *lease, api_reply *reply);

/* The priority level of a request that asked for `priority` (Triton's: 1 to --priority-levels;
 * anything else gets --default-priority-level, and a route refuses the out-of-range ones). */
uint32_t srv__job_level(const srv_server *s, uint64_t priority);

/* Whether --max-queue has room for one more job now, else *no says it is full: a check from a
 * request's headers, before its body arrives; it takes no slot. */
bool srv__job_room(srv_server *s, srv_job_refusal *no);

/* A body announced by its request's headers, judged before its first byte (upload.h): its key
 * in the cost model, size and level as srv_job_where's (the level the most urgent the request
 * may turn out to have), the time left to its deadline (INT64_MAX: none), and what set that
 * deadline, for the refusal. */
typedef struct {
    int route;
    uint64_t bytes;
    uint32_t level;
    int64_t left_ns;
    const char *deadline_origin;
} srv_job_upload;

/* Whether the body `up` describes may come: it fits under --max-upload-bytes beside the bodies
 * on their way, and it would arrive at the rate recent bodies arrived at, wait for the work
 * queued and arriving ahead of it, and run, all by its deadline. True counts it in `u` from its
 * first byte until srv__uploads_end; false counts nothing and fills *no (SRV_REFUSE_OVERLOADED,
 * with its Retry-After; SRV_REFUSE_DEADLINE when the deadline has passed). Edge's thread. */
bool srv__job_admit_upload(srv_server *s, srv_upload *u, const srv_job_upload *up, int64_t now,
                           srv_job_refusal *no);

/* The same judgement of a body already arriving, as `look` sees it at `now` (its deadline
 * shortened since, by a timeout in its first bytes): false, with *no, when it would end past
 * that deadline. Counts nothing. */
bool srv__job_upload_in_time(srv_server *s, const srv_job_upload *up,
                             const srv_upload_outlook *look, int64_t now, srv_job_refusal *no);

/* Whether the job may wait with the scheduler: false, with *no, when the drain timeout passed,
 * its deadline (its lease's) has passed, the work queued ahead of it and its own would end past
 * that deadline, or --max-queue jobs are admitted. True takes its slot of --max-queue and
 * makes the job QUEUED (srv__job_abandon may answer it from then on): the caller then starts
 * it. Edge's thread. */
bool srv__job_admit(srv_job *job, const srv_job_where *where, int64_t now, srv_job_refusal *no);

/* Takes the job's place in the order `order` names, if any (edge's thread, after admission). */
void srv__job_take_turn(srv_job *job, const srv_job_order *order);

/* Runs a group of jobs that waited in one lane of s->batcher (batch.h's srv_batch_fn, ctx the
 * server). */
void srv__job_run_group(void *ctx, srv_batch_item **items, int n);

/* Hands an admitted job to the scheduler, which starts it when a worker is free (perhaps on this
 * thread, before this returns, when `where` allowed it). */
void srv__job_start(srv_job *job, int64_t now);

/* Answers a job that still waits with refusal `o` (a client gone, a deadline, the drain): true
 * when it did, and then the caller delivers job->reply; false once a worker has it. */
bool srv__job_abandon(srv_job *job, srv_outcome o, const char *msg);

/* Asks a job that runs or waits to stop (its lease's cancel flag): SRV_REFUSE_CLIENT_GONE for a
 * client gone, SRV_REFUSE_DRAINING for the drain's timeout, whose reply then says so. */
void srv__job_cancel(srv_job *job, srv_outcome why);

#endif
