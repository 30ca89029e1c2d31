/*
 * watch.c - the watcher thread: what libmicrohttpd cannot see by itself.
 *
 * 1. Hang-ups. A suspended connection is out of libmicrohttpd's event loop, so a client that
 *    closes (or resets) while its request waits or computes goes unnoticed. The watcher polls
 *    the socket of every suspended request for POLLRDHUP/POLLHUP/POLLERR: a request still in the
 *    queue is finished at once (its worker will skip it), a running one gets ctl.cancel set,
 *    which the engine checks between blocks. poll() wakes on the event, so this takes
 *    microseconds, well within the 100 ms the issue asks for.
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
 * 4. The drain timeout: once srv_server.drain_expired is set, queued requests are answered 503
 *    and running ones cancelled (their worker then answers 503).
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
 * Locking: watch_mu guards the connection list, the watched-request list and their watcher
 * fields. libmicrohttpd's callbacks take watch_mu, so the watcher never calls into
 * libmicrohttpd while holding it: it collects the connections to resume and resumes them after
 * unlocking (the requests are referenced, and a suspended connection cannot go away).
 */
#include "server/internal.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

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

void srv__watch_wake(srv_server *s)
{
    uint64_t one = 1;
    ssize_t w;
    do {
        w = write(s->wake_fd, &one, sizeof one);
    } while (w < 0 && errno == EINTR);
    /* EAGAIN means the counter is already non-zero: the watcher is awake anyway. */
}

void srv__watch_add(srv_server *s, srv_req *req)
{
    pthread_mutex_lock(&s->watch_mu);
    req->watched = true;
    req->hup = false;
    req->wprev = NULL;
    req->wnext = s->watched;
    if (s->watched)
        s->watched->wprev = req;
    s->watched = req;
    pthread_mutex_unlock(&s->watch_mu);
    srv__watch_wake(s);
}

/* watch_mu held. */
static void unlink_watched(srv_server *s, srv_req *req)
{
    if (!req->watched)
        return;
    if (req->wprev)
        req->wprev->wnext = req->wnext;
    else
        s->watched = req->wnext;
    if (req->wnext)
        req->wnext->wprev = req->wprev;
    req->wprev = req->wnext = NULL;
    req->watched = false;
}

void srv__watch_remove(srv_server *s, srv_req *req)
{
    pthread_mutex_lock(&s->watch_mu);
    unlink_watched(s, req);
    pthread_mutex_unlock(&s->watch_mu);
}

/* A growable list of referenced requests, used to act on them outside the lock. */
typedef struct {
    srv_req **items;
    size_t n, cap;
} req_list;

static bool req_list_push(req_list *l, srv_req *req)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        srv_req **grown = realloc(l->items, cap * sizeof *grown);
        if (!grown)
            return false;
        l->items = grown;
        l->cap = cap;
    }
    l->items[l->n++] = req;
    return true;
}

/* Finishes a request that is still in the queue with an error reply, on the watcher thread.
 * watch_mu held. Returns true when the caller must resume it (after unlocking). */
static bool abandon_queued(srv_server *s, srv_req *req, req_list *resume, int status,
                           api_reason reason, const char *msg)
{
    int expected = REQ_QUEUED;
    if (!atomic_compare_exchange_strong(&req->state, &expected, REQ_DONE))
        return false; /* a worker has it (or has finished it) */
    atomic_fetch_sub(&s->queued, 1);
    srv__req_fail(req, status, reason, "%s", msg);
    req->done_ns = eng_now_ns();
    unlink_watched(s, req);
    /* The worker that eventually dequeues the job sees REQ_DONE and only drops its reference;
     * this one is the connection's, handed back on resume. */
    atomic_fetch_add(&req->refs, 1);
    if (!req_list_push(resume, req)) {
        /* Out of memory for the list: resume under the lock instead. This cannot deadlock
         * with libmicrohttpd's callbacks, because resume only flags the connection and
         * signals the MHD thread, but it is kept off the normal path. */
        MHD_resume_connection(req->conn);
        atomic_fetch_sub(&s->suspended, 1);
        atomic_fetch_sub(&req->refs, 1);
    }
    return true;
}

/* Applies hang-up, deadline and drain rules to the watched requests. watch_mu held. */
static void check_requests(srv_server *s, int64_t now, req_list *resume)
{
    bool expired = atomic_load(&s->drain_expired);
    char msg[160], origin[64];
    srv_req *next;
    for (srv_req *req = s->watched; req; req = next) {
        next = req->wnext;
        if (expired) {
            if (abandon_queued(s, req, resume, 503, API_REASON_DRAINING,
                               "the server is shutting down (--drain-timeout-s passed)"))
                continue;
            if (!atomic_load(&req->drain_cancelled)) {
                atomic_store(&req->drain_cancelled, true);
                atomic_store(&req->ctl.cancel, true);
            }
        }
        if (req->queue_deadline_ns > 0 && now >= req->queue_deadline_ns &&
            atomic_load(&req->state) == REQ_QUEUED) {
            srv__deadline_origin(s, req, origin, sizeof origin);
            snprintf(msg, sizeof msg, "deadline exceeded while waiting for a worker (%s)", origin);
            abandon_queued(s, req, resume, 504, API_REASON_DEADLINE, msg);
        }
    }
}

/* How long a connection may stay in `phase` (not CONN_BUSY, which has none of ours). */
static int64_t phase_limit(const srv_server *s, srv_conn_phase phase)
{
    switch (phase) {
    case CONN_IDLE:
        return s->idle_timeout_ns + IDLE_GRACE_NS;
    case CONN_HEADERS:
        return s->header_timeout_ns < s->receive_timeout_ns ? s->header_timeout_ns
                                                            : s->receive_timeout_ns;
    case CONN_RECEIVING:
    case CONN_BUSY:
        break;
    }
    return s->receive_timeout_ns;
}

static const char *phase_flag(srv_conn_phase phase)
{
    if (phase == CONN_IDLE)
        return "--idle-timeout-s";
    return phase == CONN_HEADERS ? "--header-timeout-s" : "--receive-timeout-s";
}

/* A body arriving slower than --min-upload-rate on average, counted from --header-timeout-s
 * after the request line: each trickling upload would otherwise hold its slot (and what it
 * has reserved) for the whole --receive-timeout-s. */
static bool upload_too_slow(const srv_server *s, srv_conn *c, int64_t now)
{
    int64_t counted = now - c->since_ns - s->header_timeout_ns;
    uint64_t got = atomic_load_explicit(&c->received, memory_order_relaxed);
    if (c->phase != CONN_RECEIVING || s->min_upload_rate == 0 || counted <= 0)
        return false;
    /* counted < 86400 s and the rate < 2^40, so the product fits in a double exactly enough */
    return (double)got < (double)counted / 1e9 * (double)s->min_upload_rate;
}

/* Shuts down connections past their phase deadline. watch_mu held. */
static void check_connections(srv_server *s, int64_t now)
{
    for (srv_conn *c = s->conns; c; c = c->next) {
        bool slow_upload;
        if (c->shut || c->phase == CONN_BUSY)
            continue;
        slow_upload = upload_too_slow(s, c, now);
        if (!slow_upload && now - c->since_ns < phase_limit(s, c->phase))
            continue;
        /* libmicrohttpd closes the socket only after our CLOSED callback, which needs this
         * lock, so `fd` is still this connection's. */
        shutdown(c->fd, SHUT_RDWR);
        c->shut = true;
        if (c->req)
            c->req->dropped_slow = true;
        atomic_fetch_add_explicit(&s->metrics.slow_clients, 1, memory_order_relaxed);
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
 * watch_mu held. */
static void check_missed_eof(srv_server *s, int64_t now)
{
    if (now - s->eof_scan_ns < EOF_SCAN_NS)
        return;
    s->eof_scan_ns = now;
    for (srv_conn *c = s->conns; c; c = c->next) {
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
        atomic_fetch_add_explicit(&s->metrics.hangups, 1, memory_order_relaxed);
        srv_log(SRV_LOG_DEBUG, "closed a connection whose client had closed it (%s)",
                c->phase == CONN_IDLE ? "between requests" : "with its request incomplete");
    }
}

/* Milliseconds until the next deadline, capped. watch_mu held. */
static int next_timeout_ms(srv_server *s, int64_t now)
{
    int64_t next = now + (int64_t)WATCH_MAX_SLEEP_MS * 1000000;
    for (srv_conn *c = s->conns; c; c = c->next) {
        int64_t due;
        if (c->shut || c->phase == CONN_BUSY)
            continue;
        if (s->eof_scan_ns + EOF_SCAN_NS < next)
            next = s->eof_scan_ns + EOF_SCAN_NS;
        due = c->since_ns + phase_limit(s, c->phase);
        if (due < next)
            next = due;
    }
    for (srv_req *r = s->watched; r; r = r->wnext) {
        if (r->queue_deadline_ns > 0 && atomic_load(&r->state) == REQ_QUEUED &&
            r->queue_deadline_ns < next)
            next = r->queue_deadline_ns;
    }
    if (next <= now)
        return 0;
    return (int)((next - now + 999999) / 1000000);
}

/* The peer of a suspended request sent a FIN (POLLRDHUP without POLLHUP/POLLERR): whether it
 * is gone is still open (1. above). Returns true when it counts as gone now. watch_mu held. */
static bool fin_means_gone(srv_req *req)
{
    static const char probe[] = "HTTP/1.1 100 Continue\r\n\r\n";
    if (!req->http11 || req->probed || !req->sc)
        return true;
    req->probed = true;
    return send(req->sc->fd, probe, sizeof probe - 1, MSG_NOSIGNAL | MSG_DONTWAIT) !=
           (ssize_t)(sizeof probe - 1);
}

/* A client is gone: cancel its request. watch_mu held. */
static void on_hangup(srv_server *s, srv_req *req, req_list *resume)
{
    req->hup = true;
    atomic_store(&req->client_gone, true);
    atomic_store(&req->ctl.cancel, true);
    atomic_fetch_add_explicit(&s->metrics.hangups, 1, memory_order_relaxed);
    abandon_queued(s, req, resume, 499, API_REASON_CANCELLED,
                   "the client closed the connection while the request was queued");
}

static void *watch_main(void *arg)
{
    srv_server *s = arg;
    struct pollfd *pfd = NULL;
    srv_req **polled = NULL;
    size_t pcap = 0;
    req_list resume = {0};

    pthread_mutex_lock(&s->watch_mu);
    while (!s->watch_stop) {
        int64_t now = eng_now_ns();
        size_t n = 1, watched = 0;
        int timeout, rc;

        check_requests(s, now, &resume);
        check_connections(s, now);
        check_missed_eof(s, now);

        for (srv_req *r = s->watched; r; r = r->wnext)
            watched++;
        if (watched + 1 > pcap) {
            size_t cap = (watched + 1) * 2;
            struct pollfd *p2 = realloc(pfd, cap * sizeof *p2);
            srv_req **q2 = p2 ? realloc(polled, cap * sizeof *q2) : NULL;
            if (p2)
                pfd = p2;
            if (q2) {
                polled = q2;
                pcap = cap;
            }
        }
        if (pcap == 0) {
            /* Out of memory for even the wake-up entry: try again shortly. */
            pthread_mutex_unlock(&s->watch_mu);
            poll(NULL, 0, 10);
            pthread_mutex_lock(&s->watch_mu);
            continue;
        }
        pfd[0].fd = s->wake_fd;
        pfd[0].events = POLLIN;
        pfd[0].revents = 0;
        for (srv_req *r = s->watched; r && n < pcap; r = r->wnext) {
            /* After a hang-up the socket stays readable-at-EOF; polling it again would spin. */
            if (r->hup)
                continue;
            pfd[n].fd = r->sc ? r->sc->fd : -1;
            /* Once probed, only the reset (POLLERR/POLLHUP, always reported) matters: the FIN
             * stays readable and would wake the poll at once, over and over. */
            pfd[n].events = r->probed ? 0 : POLLRDHUP;
            pfd[n].revents = 0;
            polled[n] = r;
            atomic_fetch_add(&r->refs, 1);
            n++;
        }
        timeout = next_timeout_ms(s, now);
        pthread_mutex_unlock(&s->watch_mu);

        for (size_t i = 0; i < resume.n; i++) {
            srv_req *req = resume.items[i];
            MHD_resume_connection(req->conn);
            atomic_fetch_sub(&s->suspended, 1);
            srv__req_unref(req);
        }
        resume.n = 0;
        eng_buf_trim(BUFFER_IDLE_NS);

        rc = poll(pfd, (nfds_t)n, timeout);
        if (rc > 0 && (pfd[0].revents & POLLIN)) {
            uint64_t v;
            ssize_t r = read(s->wake_fd, &v, sizeof v);
            (void)r; /* EAGAIN: another read got it first; nothing to do */
        }

        pthread_mutex_lock(&s->watch_mu);
        for (size_t i = 1; i < n; i++) {
            srv_req *r = polled[i];
            short ev = rc > 0 ? pfd[i].revents : 0;
            if (!r->watched || r->hup)
                continue;
            if ((ev & (POLLHUP | POLLERR)) || ((ev & POLLRDHUP) && fin_means_gone(r)))
                on_hangup(s, r, &resume);
        }
        pthread_mutex_unlock(&s->watch_mu);
        /* Dropping a reference may free a request (taking no lock); do it unlocked. */
        for (size_t i = 1; i < n; i++)
            srv__req_unref(polled[i]);
        pthread_mutex_lock(&s->watch_mu);
    }
    pthread_mutex_unlock(&s->watch_mu);

    for (size_t i = 0; i < resume.n; i++) {
        MHD_resume_connection(resume.items[i]->conn);
        atomic_fetch_sub(&s->suspended, 1);
        srv__req_unref(resume.items[i]);
    }
    free(resume.items);
    free(pfd);
    free(polled);
    return NULL;
}

srv_status srv__watch_start(srv_server *s)
{
    int rc;
    s->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s->wake_fd < 0)
        return SRV_EIO;
    s->watch_stop = false;
    rc = pthread_create(&s->watch_thread, NULL, watch_main, s);
    if (rc != 0) {
        close(s->wake_fd);
        s->wake_fd = -1;
        errno = rc;
        return SRV_EIO;
    }
    s->watch_started = true;
    return SRV_OK;
}

void srv__watch_stop(srv_server *s)
{
    if (!s->watch_started)
        return;
    pthread_mutex_lock(&s->watch_mu);
    s->watch_stop = true;
    pthread_mutex_unlock(&s->watch_mu);
    srv__watch_wake(s);
    pthread_join(s->watch_thread, NULL);
    s->watch_started = false;
    close(s->wake_fd);
    s->wake_fd = -1;
}
