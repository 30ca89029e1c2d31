/*
 * watch.c - the watcher thread: what libmicrohttpd cannot see by itself.
 *
 * 1. Hang-ups. A suspended connection is out of libmicrohttpd's event loop, so a client that
 *    closes (or resets) while its request waits or computes goes unnoticed. The watcher polls
 *    the socket of every suspended request for POLLRDHUP/POLLHUP/POLLERR: a request still in the
 *    queue is finished at once (its worker will skip it), a running one gets ctl.cancel set,
 *    which the engine checks between blocks. poll() wakes on the event, so a hang-up is
 *    seen at once, not at the next tick.
 *    A FIN alone (POLLRDHUP) does not say whether the client closed its socket or only its
 *    sending side (shutdown(SHUT_WR), `nc -N`), still waiting for the reply. Only a write can
 *    tell: an HTTP/1.1 request gets an interim "100 Continue" (RFC 9110 section 15.2: a client
 *    must accept unexpected 1xx replies; libmicrohttpd writes nothing while the connection is
 *    suspended, so the bytes cannot interleave with its reply). A closed socket answers it with
 *    a reset, seen as POLLERR/POLLHUP; a half-closed one reads it and waits on. An HTTP/1.0
 *    request may not get a 1xx reply, so its FIN counts as a hang-up.
 * 2. Queue deadlines. A request whose deadline (--request-timeout-ms from its arrival, or the
 *    tighter timeout its body sets, read before it was queued) passes while it still waits for
 *    a worker is answered 504 at that moment, not when a worker finally reaches it.
 * 3. Slow clients. libmicrohttpd's timeout only measures idleness, so a client trickling a byte
 *    a second keeps a connection forever. Each connection has a phase (see srv_conn_phase) and
 *    a deadline per phase (--idle-timeout-s, --header-timeout-s, --receive-timeout-s), and a
 *    body must also average --min-upload-rate; past either, the watcher shuts the socket
 *    down, and libmicrohttpd then sees end-of-file and closes the connection on its own
 *    thread.
 * 4. The drain timeout: once the drain flag (srv_watch_config.drain_expired) is set, queued
 *    requests are finished and running ones cancelled (their owner then answers 503).
 * 5. Idle buffers: request buffers kept for reuse (eng_buf_alloc) go back to the system once
 *    nobody has needed them for BUFFER_IDLE_NS; the watcher wakes at least once a second.
 * 6. Missed end-of-file. libmicrohttpd 0.9.75's epoll mode is edge-triggered, and its recv
 *    wrapper (recv_param_adapter in connection.c) clears the connection's read-ready flag as
 *    soon as recv returns fewer bytes than asked for. When a FIN arrives together with the last
 *    bytes of a partial request (send "GET /v2/heal", close), the one epoll edge is spent on
 *    the bytes, the FIN raises no new edge, and the connection sits in CLOSE-WAIT, holding its
 *    slot and any body reservation, until a timeout. Every EOF_SCAN_NS the watcher peeks at
 *    each connection that is not busy: recv(MSG_PEEK) returning 0 means the peer closed and
 *    libmicrohttpd has consumed every byte. Seen twice with no phase change in between (so
 *    that bytes libmicrohttpd has read but not yet parsed are never cut off), the connection
 *    is shut down, which wakes libmicrohttpd to read the end-of-file and close it.
 *
 * Requests are reached only through srv_watch_ops (watch.h): the watcher says why it finishes
 * or cancels one, and the request's owner chooses the reply.
 *
 * Locking: mu guards the connection list, the watched-request list and their watcher fields.
 * libmicrohttpd's callbacks take mu (through srv__conn_*), so the watcher never resumes a
 * connection while holding it: it collects the requests to resume and resumes them after
 * unlocking (the requests are referenced, and a suspended connection cannot go away).
 */
#include "server/watch.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "engine/engine.h"

/* The longest the watcher sleeps when nothing is due; it is woken for anything new. */
#define WATCH_MAX_SLEEP_MS 1000
/* Cached request buffers unused this long are given back (--buffer-cache-bytes). */
#define BUFFER_IDLE_NS INT64_C(10000000000)
/* How often connections that are not busy are checked for an end-of-file that libmicrohttpd
 * missed (6. above); one recv per such connection per scan. */
#define EOF_SCAN_NS INT64_C(200000000)
/* MHD's own idle timeout normally closes an idle connection first; ours, a little later,
 * catches a request line trickled slowly enough to keep resetting MHD's timer. */
#define IDLE_GRACE_NS INT64_C(1000000000)

/* One client connection, from libmicrohttpd's STARTED notification to its CLOSED one. Fields
 * after `fd` are guarded by mu. libmicrohttpd closes the socket only after the CLOSED
 * notification, so the watcher may shutdown() `fd` while holding the lock. */
struct srv_conn {
    int fd;
    srv_conn_phase phase;
    int64_t since_ns;
    bool shut;                /* the watcher shut it down (slow client, or end-of-file missed) */
    bool eof_seen;            /* the watcher saw end-of-file with no unread byte (6. above) */
    int64_t eof_since_ns;     /* since_ns when it was seen: unchanged means no progress since */
    srv_conn_phase eof_phase; /* and the phase then */
    atomic_uint_fast64_t received; /* body bytes of the current request (its I/O thread adds) */
    srv_watched *req;              /* the request being received on it, if any */
    struct srv_conn *prev, *next;
};

struct srv_watch {
    srv_watch_config cfg;
    pthread_t thread;
    pthread_mutex_t mu;
    int wake_fd; /* eventfd: wakes the watcher's poll */
    bool stop;
    srv_conn *conns;     /* every open connection */
    srv_watched *listed; /* every suspended request */
    int64_t eof_scan_ns; /* when the watcher last looked for missed end-of-file */
};

void srv__watch_wake(srv_watch *w)
{
    uint64_t one = 1;
    ssize_t n;
    do {
        n = write(w->wake_fd, &one, sizeof one);
    } while (n < 0 && errno == EINTR);
    /* EAGAIN means the counter is already non-zero: the watcher is awake anyway. */
}

void srv__watch_add(srv_watch *w, srv_watched *r)
{
    pthread_mutex_lock(&w->mu);
    r->listed = true;
    r->hup = false;
    r->prev = NULL;
    r->next = w->listed;
    if (w->listed)
        w->listed->prev = r;
    w->listed = r;
    pthread_mutex_unlock(&w->mu);
    srv__watch_wake(w);
}

/* mu held. */
static void unlink_watched(srv_watch *w, srv_watched *r)
{
    if (!r->listed)
        return;
    if (r->prev)
        r->prev->next = r->next;
    else
        w->listed = r->next;
    if (r->next)
        r->next->prev = r->prev;
    r->prev = r->next = NULL;
    r->listed = false;
}

void srv__watch_remove(srv_watch *w, srv_watched *r)
{
    pthread_mutex_lock(&w->mu);
    unlink_watched(w, r);
    pthread_mutex_unlock(&w->mu);
}

/* ---- Connections ---------------------------------------------------------------------------- */

srv_conn *srv__conn_open(srv_watch *w, int fd)
{
    srv_conn *c = calloc(1, sizeof *c);
    if (!c)
        return NULL; /* the connection works, without deadlines or hang-up detection */
    c->fd = fd;
    c->phase = CONN_NEW;
    c->since_ns = eng_now_ns();
    pthread_mutex_lock(&w->mu);
    c->next = w->conns;
    if (w->conns)
        w->conns->prev = c;
    w->conns = c;
    pthread_mutex_unlock(&w->mu);
    return c;
}

void srv__conn_close(srv_watch *w, srv_conn *c)
{
    pthread_mutex_lock(&w->mu);
    if (c->prev)
        c->prev->next = c->next;
    else
        w->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    if (c->req && c->req->conn == c)
        c->req->conn = NULL;
    pthread_mutex_unlock(&w->mu);
    free(c);
}

void srv__conn_begin(srv_watch *w, srv_conn *c, srv_watched *r, int64_t start_ns)
{
    pthread_mutex_lock(&w->mu);
    r->conn = c;
    if (c) {
        c->phase = CONN_HEADERS;
        atomic_store_explicit(&c->received, 0, memory_order_relaxed);
        c->since_ns = start_ns;
        c->req = r;
    }
    pthread_mutex_unlock(&w->mu);
}

void srv__conn_headers_done(srv_watch *w, srv_watched *r)
{
    pthread_mutex_lock(&w->mu);
    if (r->conn && r->conn->phase == CONN_HEADERS)
        r->conn->phase = CONN_RECEIVING;
    pthread_mutex_unlock(&w->mu);
}

void srv__conn_busy(srv_watch *w, srv_watched *r)
{
    pthread_mutex_lock(&w->mu);
    if (r->conn) {
        r->conn->phase = CONN_BUSY;
        r->conn->since_ns = eng_now_ns();
    }
    pthread_mutex_unlock(&w->mu);
}

void srv__conn_received(srv_watched *r, uint64_t n)
{
    /* Only the connection's I/O thread, which is the caller, changes r->conn (its callbacks:
     * srv__conn_begin, srv__conn_end, srv__conn_close). */
    if (r->conn)
        atomic_fetch_add_explicit(&r->conn->received, n, memory_order_relaxed);
}

bool srv__conn_end(srv_watch *w, srv_watched *r, int64_t now)
{
    bool slow;
    pthread_mutex_lock(&w->mu);
    if (r->conn) {
        r->conn->phase = CONN_IDLE;
        r->conn->since_ns = now;
        if (r->conn->req == r)
            r->conn->req = NULL;
        r->conn = NULL;
    }
    slow = r->slow;
    pthread_mutex_unlock(&w->mu);
    return slow;
}

int srv__conn_fd(srv_watch *w, srv_watched *r)
{
    int fd = -1;
    pthread_mutex_lock(&w->mu);
    if (r->conn)
        fd = r->conn->fd;
    pthread_mutex_unlock(&w->mu);
    return fd;
}

/* ---- The watcher ---------------------------------------------------------------------------- */

/* A growable list of referenced requests, used to act on them outside the lock. */
typedef struct {
    srv_watched **items;
    size_t n, cap;
} req_list;

static bool req_list_push(req_list *l, srv_watched *r)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        srv_watched **grown = realloc(l->items, cap * sizeof *grown);
        if (!grown)
            return false;
        l->items = grown;
        l->cap = cap;
    }
    l->items[l->n++] = r;
    return true;
}

/* Hands the requests of `l` back to their owners to be answered, and empties it. mu not held. */
static void resume_all(req_list *l)
{
    for (size_t i = 0; i < l->n; i++) {
        srv_watched *r = l->items[i];
        r->ops->resume(r->req);
        r->ops->unref(r->req);
    }
    l->n = 0;
}

/* Has the owner finish a request that is still in the queue, for `why`. mu held. Returns true
 * when it did; the request is then resumed once the lock is released. */
static bool abandon_queued(srv_watch *w, srv_watched *r, req_list *resume, srv_watch_why why)
{
    if (!r->ops->abandon(r->req, why))
        return false; /* a worker has it (or has finished it) */
    unlink_watched(w, r);
    /* The worker that eventually dequeues the job sees it finished and only drops its
     * reference; this one is the connection's, handed back on resume. */
    r->ops->ref(r->req);
    if (!req_list_push(resume, r)) {
        /* Out of memory for the list: resume under the lock instead. This cannot deadlock
         * with libmicrohttpd's callbacks, because resume only flags the connection and
         * signals an I/O thread, but it is kept off the normal path. */
        r->ops->resume(r->req);
        r->ops->unref(r->req);
    }
    return true;
}

/* Applies the deadline and drain rules to the watched requests. mu held. */
static void check_requests(srv_watch *w, int64_t now, req_list *resume)
{
    bool expired = atomic_load(w->cfg.drain_expired);
    srv_watched *next;
    for (srv_watched *r = w->listed; r; r = next) {
        next = r->next;
        if (expired) {
            if (abandon_queued(w, r, resume, SRV_WATCH_DRAIN))
                continue;
            r->ops->cancel(r->req, SRV_WATCH_DRAIN);
        }
        if (r->deadline_ns > 0 && now >= r->deadline_ns && r->ops->queued(r->req))
            abandon_queued(w, r, resume, SRV_WATCH_DEADLINE);
    }
}

/* How long a connection may stay in `phase` (not CONN_BUSY, which has none of ours). */
static int64_t phase_limit(const srv_watch_config *cfg, srv_conn_phase phase)
{
    switch (phase) {
    case CONN_NEW:
        /* A new connection that trickles its request line (or sends nothing) would keep
         * resetting libmicrohttpd's idle timer and hold its slot for --idle-timeout-s and
         * more; the request line is part of the header, so --header-timeout-s bounds it, as
         * nginx's client_header_timeout does. Between requests of a kept-alive connection
         * the idle timeout applies. */
        return cfg->header_timeout_ns < cfg->idle_timeout_ns + IDLE_GRACE_NS
                   ? cfg->header_timeout_ns
                   : cfg->idle_timeout_ns + IDLE_GRACE_NS;
    case CONN_IDLE:
        return cfg->idle_timeout_ns + IDLE_GRACE_NS;
    case CONN_HEADERS:
        return cfg->header_timeout_ns < cfg->receive_timeout_ns ? cfg->header_timeout_ns
                                                                : cfg->receive_timeout_ns;
    case CONN_RECEIVING:
    case CONN_BUSY:
        break;
    }
    return cfg->receive_timeout_ns;
}

static const char *phase_flag(srv_conn_phase phase)
{
    if (phase == CONN_NEW)
        return "--header-timeout-s";
    if (phase == CONN_IDLE)
        return "--idle-timeout-s";
    return phase == CONN_HEADERS ? "--header-timeout-s" : "--receive-timeout-s";
}

/* A body arriving slower than --min-upload-rate on average, counted from --header-timeout-s
 * after the request line: each trickling upload would otherwise hold its slot (and what it
 * has reserved) for the whole --receive-timeout-s. */
static bool upload_too_slow(const srv_watch_config *cfg, srv_conn *c, int64_t now)
{
    int64_t counted = now - c->since_ns - cfg->header_timeout_ns;
    uint64_t got = atomic_load_explicit(&c->received, memory_order_relaxed);
    if (c->phase != CONN_RECEIVING || cfg->min_upload_rate == 0 || counted <= 0)
        return false;
    /* counted < 86400 s and the rate < 2^40, so the product fits in a double exactly enough */
    return (double)got < (double)counted / 1e9 * (double)cfg->min_upload_rate;
}

/* Shuts down connections past their phase deadline. mu held. */
static void check_connections(srv_watch *w, int64_t now)
{
    for (srv_conn *c = w->conns; c; c = c->next) {
        bool slow_upload;
        if (c->shut || c->phase == CONN_BUSY)
            continue;
        slow_upload = upload_too_slow(&w->cfg, c, now);
        if (!slow_upload && now - c->since_ns < phase_limit(&w->cfg, c->phase))
            continue;
        /* libmicrohttpd closes the socket only after our CLOSED callback, which needs this
         * lock, so `fd` is still this connection's. */
        shutdown(c->fd, SHUT_RDWR);
        c->shut = true;
        if (c->req)
            c->req->slow = true;
        srv__metrics_slow_client(w->cfg.metrics);
        srv_log(SRV_LOG_INFO,
                "closed a connection whose client did not send its request in "
                "time (%s)",
                slow_upload ? "--min-upload-rate" : phase_flag(c->phase));
    }
}

/* Whether the peer of `fd` has closed its side and no unread byte is left: recv with MSG_PEEK
 * returns 0 at end-of-file, data when bytes wait (libmicrohttpd will read them), EAGAIN when
 * the connection is merely quiet. A reset counts as closed. */
static bool peer_closed(int fd)
{
    char byte;
    ssize_t n = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && (errno == ECONNRESET || errno == ENOTCONN));
}

/* Shuts down connections whose client closed while libmicrohttpd did not notice (6. above).
 * mu held. */
static void check_missed_eof(srv_watch *w, int64_t now)
{
    if (now - w->eof_scan_ns < EOF_SCAN_NS)
        return;
    w->eof_scan_ns = now;
    for (srv_conn *c = w->conns; c; c = c->next) {
        if (c->shut || c->phase == CONN_BUSY || c->fd < 0 || !peer_closed(c->fd)) {
            c->eof_seen = false;
            continue;
        }
        if (!c->eof_seen || c->eof_since_ns != c->since_ns || c->eof_phase != c->phase) {
            c->eof_seen = true;
            c->eof_since_ns = c->since_ns;
            c->eof_phase = c->phase;
            continue;
        }
        /* As in check_connections, `fd` is still this connection's while we hold the lock. */
        shutdown(c->fd, SHUT_RDWR);
        c->shut = true;
        srv__metrics_hangup(w->cfg.metrics);
        srv_log(SRV_LOG_DEBUG, "closed a connection whose client had closed it (%s)",
                c->phase == CONN_IDLE || c->phase == CONN_NEW ? "between requests"
                                                              : "with its request incomplete");
    }
}

/* Milliseconds until the next deadline, capped. mu held. */
static int next_timeout_ms(srv_watch *w, int64_t now)
{
    int64_t next = now + (int64_t)WATCH_MAX_SLEEP_MS * 1000000;
    for (srv_conn *c = w->conns; c; c = c->next) {
        int64_t due;
        if (c->shut || c->phase == CONN_BUSY)
            continue;
        if (w->eof_scan_ns + EOF_SCAN_NS < next)
            next = w->eof_scan_ns + EOF_SCAN_NS;
        due = c->since_ns + phase_limit(&w->cfg, c->phase);
        if (due < next)
            next = due;
    }
    for (srv_watched *r = w->listed; r; r = r->next) {
        if (r->deadline_ns > 0 && r->deadline_ns < next && r->ops->queued(r->req))
            next = r->deadline_ns;
    }
    if (next <= now)
        return 0;
    return (int)((next - now + 999999) / 1000000);
}

/* The peer of a suspended request sent a FIN (POLLRDHUP without POLLHUP/POLLERR): whether it
 * is gone is still open (1. above). Returns true when it counts as gone now. mu held. */
static bool fin_means_gone(srv_watched *r)
{
    static const char probe[] = "HTTP/1.1 100 Continue\r\n\r\n";
    if (!r->may_probe || r->probed || !r->conn)
        return true;
    r->probed = true;
    return send(r->conn->fd, probe, sizeof probe - 1, MSG_NOSIGNAL | MSG_DONTWAIT) !=
           (ssize_t)(sizeof probe - 1);
}

/* A client is gone: cancel its request. mu held. */
static void on_hangup(srv_watch *w, srv_watched *r, req_list *resume)
{
    r->hup = true;
    r->ops->cancel(r->req, SRV_WATCH_HANGUP);
    srv__metrics_hangup(w->cfg.metrics);
    abandon_queued(w, r, resume, SRV_WATCH_HANGUP);
}

/* Grows the poll arrays to hold `n` entries; false when even that failed. */
static bool poll_arrays_fit(struct pollfd **pfd, srv_watched ***polled, size_t *cap, size_t n)
{
    if (n > *cap) {
        size_t cap2 = n * 2;
        struct pollfd *p2 = realloc(*pfd, cap2 * sizeof *p2);
        srv_watched **q2 = p2 ? realloc(*polled, cap2 * sizeof *q2) : NULL;
        if (p2)
            *pfd = p2;
        if (q2) {
            *polled = q2;
            *cap = cap2;
        }
    }
    return *cap > 0;
}

static void *watch_main(void *arg)
{
    srv_watch *w = arg;
    struct pollfd *pfd = NULL;
    srv_watched **polled = NULL;
    size_t pcap = 0;
    req_list resume = {0};

    pthread_mutex_lock(&w->mu);
    while (!w->stop) {
        int64_t now = eng_now_ns();
        size_t n = 1, watched = 0;
        int timeout, rc;

        check_requests(w, now, &resume);
        check_connections(w, now);
        check_missed_eof(w, now);

        for (srv_watched *r = w->listed; r; r = r->next)
            watched++;
        if (!poll_arrays_fit(&pfd, &polled, &pcap, watched + 1)) {
            /* Out of memory for even the wake-up entry: try again shortly. */
            pthread_mutex_unlock(&w->mu);
            poll(NULL, 0, 10);
            pthread_mutex_lock(&w->mu);
            continue;
        }
        pfd[0].fd = w->wake_fd;
        pfd[0].events = POLLIN;
        pfd[0].revents = 0;
        for (srv_watched *r = w->listed; r && n < pcap; r = r->next) {
            /* After a hang-up the socket stays readable-at-EOF; polling it again would spin. */
            if (r->hup)
                continue;
            pfd[n].fd = r->conn ? r->conn->fd : -1;
            /* Once probed, only the reset (POLLERR/POLLHUP, always reported) matters: the FIN
             * stays readable and would wake the poll at once, over and over. */
            pfd[n].events = r->probed ? 0 : POLLRDHUP;
            pfd[n].revents = 0;
            polled[n] = r;
            r->ops->ref(r->req);
            n++;
        }
        timeout = next_timeout_ms(w, now);
        pthread_mutex_unlock(&w->mu);

        resume_all(&resume);
        eng_buf_trim(BUFFER_IDLE_NS);

        rc = poll(pfd, (nfds_t)n, timeout);
        if (rc > 0 && (pfd[0].revents & POLLIN)) {
            uint64_t v;
            ssize_t got = read(w->wake_fd, &v, sizeof v);
            (void)got; /* EAGAIN: another read got it first; nothing to do */
        }

        pthread_mutex_lock(&w->mu);
        for (size_t i = 1; i < n; i++) {
            srv_watched *r = polled[i];
            short ev = rc > 0 ? pfd[i].revents : 0;
            if (!r->listed || r->hup)
                continue;
            if ((ev & (POLLHUP | POLLERR)) || ((ev & POLLRDHUP) && fin_means_gone(r)))
                on_hangup(w, r, &resume);
        }
        pthread_mutex_unlock(&w->mu);
        /* Dropping a reference may free a request (taking no lock); do it unlocked. */
        for (size_t i = 1; i < n; i++)
            polled[i]->ops->unref(polled[i]->req);
        pthread_mutex_lock(&w->mu);
    }
    pthread_mutex_unlock(&w->mu);

    resume_all(&resume);
    free(resume.items);
    free(pfd);
    free(polled);
    return NULL;
}

srv_status srv__watch_start(const srv_watch_config *cfg, srv_watch **out)
{
    srv_watch *w = calloc(1, sizeof *w);
    int rc;
    *out = NULL;
    if (!w)
        return SRV_ENOMEM;
    w->cfg = *cfg;
    pthread_mutex_init(&w->mu, NULL);
    w->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (w->wake_fd < 0) {
        pthread_mutex_destroy(&w->mu);
        free(w);
        return SRV_EIO;
    }
    rc = pthread_create(&w->thread, NULL, watch_main, w);
    if (rc != 0) {
        close(w->wake_fd);
        pthread_mutex_destroy(&w->mu);
        free(w);
        errno = rc;
        return SRV_EIO;
    }
    *out = w;
    return SRV_OK;
}

void srv__watch_stop(srv_watch *w)
{
    if (!w)
        return;
    pthread_mutex_lock(&w->mu);
    w->stop = true;
    pthread_mutex_unlock(&w->mu);
    srv__watch_wake(w);
    pthread_join(w->thread, NULL);
    close(w->wake_fd);
    while (w->conns) {
        srv_conn *c = w->conns;
        w->conns = c->next;
        free(c);
    }
    pthread_mutex_destroy(&w->mu);
    free(w);
}
