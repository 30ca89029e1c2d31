/*
 * request.h - one HTTP request to the daemon (srv_req) and the parts of its life cycle that
 * http.c (headers, body, replies) and http_job.c (its run as a job: job.h) share.
 *
 * Ownership: created by the URI callback when the request line arrives, it belongs to the I/O
 * thread of its connection until the body is complete. It is then suspended and started as a job
 * (job.h) with a second reference (the job's); that thread does not touch it while it is
 * suspended.
 * Whoever finishes it (the job: a worker, or the scheduler when it cannot finish by its
 * deadline; or the watcher through srv_watch_ops when it abandons a request still waiting) fills
 * `reply`, marks the job SRV_JOB_FINISHED and resumes the connection, and after that never
 * touches it again except to drop its reference. The I/O thread then queues the reply and, at
 * NOTIFY_COMPLETED, logs, counts and drops its reference; the last reference frees it.
 */
#ifndef ATTND_SERVER_REQUEST_H
#define ATTND_SERVER_REQUEST_H

#include <stdatomic.h>

#include "server/daemon.h"
#include "server/job.h"
#include "server/outcome.h"
#include "server/request_check.h"
#include "server/routes.h"
#include "server/upload.h"

#define REQUEST_ID_MAX 128
#define PATH_MAX_LEN   256 /* a longer path matches no route (404) */

typedef struct srv_req {
    atomic_int refs;
    srv_job job; /* its state (SRV_JOB_NEW while headers and body arrive), times and place with
                    the scheduler once admitted */
    srv_server *srv;
    struct MHD_Connection *conn;
    srv_watched watch; /* what the watcher sees of it (watch.h) */
    srv_headers hdr;   /* the header block, read once on the first call */

    /* Set on its I/O thread while receiving. */
    bool framing_checked; /* the first call of the access handler ran */
    bool seen_headers;    /* routing and header checks ran */
    srv_route route;
    bool path_too_long;     /* longer than PATH_MAX_LEN - 1: matches no route */
    const char *bad_target; /* srv__target_check's finding, answered 400 (static text) */
    srv_params params;      /* filled by the route matcher */
    char method[12];
    char path[PATH_MAX_LEN];
    char id[REQUEST_ID_MAX + 1];
    /* Worker routes: the headers api/ needs, copied for the worker ("" when absent). */
    char content_type[256], content_encoding[32], accept_encoding[256], infer_header_len[32];
    bool has_content_type; /* even an empty one: api/ tells "" from an absent header */
    srv_route_stats stats; /* the route's statistics hooks' state */
    bool body_expected; /* Content-Length > 0 or chunked: an early answer closes the connection */
    bool has_length;    /* a Content-Length header was given */
    bool seen_body_end; /* the last upload call arrived */
    size_t content_length;
    srv_upload upload; /* its place among the bodies on their way (upload.h) */
    api_buf body;
    size_t body_held;  /* the body buffer's share of the lease, given back when it is freed */
    uint64_t bytes_in; /* body bytes received, including those drained after a rejection */
    bool refused;      /* refused while receiving: answer `refusal` once the body is in */
    srv_outcome refusal;
    char refusal_msg[240];
    bool body_unread;  /* compressed past what admission inflates, on a route that orders by its
                          body (api_call.body_unread) */
    bool early_peeked; /* the start of a long body was read for its timeout */
    bool answered_mid_body; /* refused and answered while the body still arrived */
    int64_t own_timeout_ms; /* the body's own timeout when it is tighter than
                               --request-timeout-ms, else 0; set when the body's start
                               is read, or with the queue deadline */
    uint32_t priority;      /* its Triton level (1 most urgent), --default-priority-level unless
                               the body says */
    int refusal_retry_s;    /* > 0: the Retry-After of `refusal`, computed from the queue */

    /* Handed between threads as the state machine says. */
    api_lease lease; /* its memory, deadline and cancel flag, from arrival to completion */
    api_reply reply;
    api_call call;           /* what a batch serves it with (http_job.c), while its batch runs */
    atomic_bool client_gone; /* the client hung up while the request was suspended */

    /* Set when the response is queued (its I/O thread). */
    int status;
    api_reason reason;
    uint64_t bytes_out;
    bool responded;

    bool sent_directly; /* a worker wrote the reply to the socket (half_close.c) */
    bool admin;         /* arrived on --admin-port: only health and metrics are served */
    bool send_timer;    /* the connection's timeout is --send-timeout-s until completion */
    int cut_status;     /* > 0: a reply of this status was queued but never delivered whole */
} srv_req;

/* Frees the body and gives its share of the lease back (the thread that owns the request). */
void srv__req_release_body(srv_req *req);

/* Drops one reference; the last one frees the request. Any thread. */
void srv__req_unref(srv_req *req);

/* Fills req->reply with refusal `o` for a request that ends without running (watcher, worker,
 * scheduler). */
void srv__req_fail(srv_req *req, srv_outcome o, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* What set the deadline of a queued request, for the message of its 504 (64 bytes are enough). */
void srv__req_deadline_origin(const srv_req *req, char *buf, size_t size);

/* Gives a finished request back to libmicrohttpd, which then calls the access handler. */
void srv__req_resume(srv_req *req);

/* Writes req->reply straight to the socket (a client that half-closed: half_close.c). */
void srv__req_send_direct(srv_req *req);

/* The captured headers, as api/ takes them. */
void srv__req_call_headers(const srv_req *req, api_call *call);

/* ---- http_job.c ---------------------------------------------------------------------------- */

/* How an HTTP request runs as a job. */
extern const srv_job_ops srv__http_job_ops;

/* Takes the request's place in the session's or sequence's order its route names (I/O thread,
 * at admission). */
void srv__req_take_turn(srv_req *req, const api_peek *peek);

#endif
