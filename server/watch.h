/*
 * watch.h - the watcher thread (watch.c) and the connection list it guards: what
 * libmicrohttpd cannot see by itself (hang-ups of suspended requests, queue deadlines, slow
 * clients, the drain timeout, missed end-of-file).
 *
 * The watcher knows nothing of requests but this interface: the owner of a request (http.c)
 * embeds a srv_watched in it, links it to the connection it arrived on, lists it while it is
 * suspended, and supplies srv_watch_ops, through which the watcher finishes, cancels and
 * resumes it. So watch.c neither chooses an HTTP status nor calls libmicrohttpd.
 *
 * Locking: one lock inside the watcher guards the connection list, the watched list and the
 * watcher's fields of both. The functions below take it; none is called with it held.
 */
#ifndef ATTND_SERVER_WATCH_H
#define ATTND_SERVER_WATCH_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "server/metrics.h"

typedef struct srv_watch srv_watch;
typedef struct srv_conn srv_conn; /* one client connection, owned by watch.c */

/* Where a connection is in its request cycle; each phase but BUSY has a deadline. */
typedef enum {
    CONN_NEW = 0,   /* connected: its first request line must arrive within the header timeout */
    CONN_IDLE,      /* between requests: a request line must arrive within the idle timeout */
    CONN_HEADERS,   /* request line seen: headers within the header timeout */
    CONN_RECEIVING, /* headers seen: the body within the receive timeout (from the request line) */
    CONN_BUSY,      /* request complete: computing or answering; no deadline of ours */
} srv_conn_phase;

/* Why the watcher finishes or cancels a request. */
typedef enum {
    SRV_WATCH_HANGUP,   /* the client went away */
    SRV_WATCH_DEADLINE, /* its deadline passed while it waited for a worker */
    SRV_WATCH_DRAIN,    /* the drain timeout passed */
} srv_watch_why;

/* What the watcher may do to a suspended request `req` (the owner's pointer). */
typedef struct {
    void (*ref)(void *req);
    void (*unref)(void *req);
    /* Whether it still waits for a worker. */
    bool (*queued)(void *req);
    /* Finishes it with the error for `why` if it still waits for a worker (true), so that the
     * worker skips it; false when a worker has it. Called with the watcher's lock held. */
    bool (*abandon)(void *req, srv_watch_why why);
    /* Asks a running request to stop (the engine checks between blocks). */
    void (*cancel)(void *req, srv_watch_why why);
    /* Hands an abandoned request back to libmicrohttpd to be answered. */
    void (*resume)(void *req);
} srv_watch_ops;

/* The watcher's part of one request, embedded in it. The owner sets ops, req, deadline_ns and
 * may_probe before srv__watch_add and does not change them while it is listed; the rest is the
 * watcher's (under its lock). */
typedef struct srv_watched {
    const srv_watch_ops *ops;
    void *req;
    int64_t deadline_ns; /* > 0: finish it (SRV_WATCH_DEADLINE) if still queued by then */
    bool may_probe;      /* HTTP/1.1: an interim "100 Continue" may be written (watch.c, 1) */
    srv_conn *conn;      /* the connection it arrived on; NULL once that is gone */
    bool slow;           /* its connection was shut for a slow client */
    bool listed, hup, probed;
    struct srv_watched *prev, *next;
} srv_watched;

typedef struct {
    int64_t header_timeout_ns, receive_timeout_ns, idle_timeout_ns;
    size_t min_upload_rate;           /* --min-upload-rate: bytes per second, 0: none */
    srv_metrics *metrics;             /* slow clients and hang-ups are counted here */
    const atomic_bool *drain_expired; /* set once the drain timeout has passed */
} srv_watch_config;

/* Starts the watcher thread (*out), borrowing `cfg`'s pointers for its lifetime. Main thread. */
srv_status srv__watch_start(const srv_watch_config *cfg, srv_watch **out);
/* Stops and frees it, with any connection still listed; NULL is a no-op. Main thread, after
 * libmicrohttpd has stopped. */
void srv__watch_stop(srv_watch *w);
/* Wakes the watcher to look at everything again (after the drain flag is set). Any thread. */
void srv__watch_wake(srv_watch *w);

/* Starts watching a suspended request (its I/O thread, after MHD_suspend_connection). */
void srv__watch_add(srv_watch *w, srv_watched *r);
/* Stops watching it; afterwards the watcher never touches it. Any thread. */
void srv__watch_remove(srv_watch *w, srv_watched *r);

/* Connections, from libmicrohttpd's callbacks (the connection's I/O thread: the callbacks of one
 * connection never run at once, those of different ones may). A connection opens with no
 * request; srv__conn_begin links the request that arrives on it, srv__conn_end unlinks it. */
srv_conn *srv__conn_open(srv_watch *w, int fd); /* NULL when out of memory */
void srv__conn_close(srv_watch *w, srv_conn *c);
/* A request line arrived on `c` at `start_ns`: phase CONN_HEADERS, `r` linked to it. */
void srv__conn_begin(srv_watch *w, srv_conn *c, srv_watched *r, int64_t start_ns);
/* The headers of `r` are in: from here the receive timeout applies (counted from the request
 * line). */
void srv__conn_headers_done(srv_watch *w, srv_watched *r);
/* `r` is complete or answered: no deadline of ours until it completes. */
void srv__conn_busy(srv_watch *w, srv_watched *r);
/* `n` more body bytes of `r` arrived (for --min-upload-rate). */
void srv__conn_received(srv_watched *r, uint64_t n);
/* `r` completed at `now`: its connection goes back to CONN_IDLE and `r` is unlinked. Returns
 * whether the watcher shut the connection for a slow client. */
bool srv__conn_end(srv_watch *w, srv_watched *r, int64_t now);
/* The socket of `r`'s connection, or -1 when it is gone. Any thread. */
int srv__conn_fd(srv_watch *w, srv_watched *r);

#endif
