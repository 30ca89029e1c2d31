/*
 * grpc_conn.c - the gRPC listener and its connections: one thread polls the listening socket,
 * every connection and an eventfd (finished inferences, the drain), feeds what arrives to each
 * connection's nghttp2 server session and writes what nghttp2 has to send. With --tls-cert the
 * port speaks TLS (GnuTLS, the HTTPS port's certificate, priorities and client CA) and requires
 * ALPN h2; the handshake runs in the same loop, non-blocking. Streams become calls
 * (grpc_call.c), whose responses (HEADERS, length-prefixed DATA from the call's queue, the
 * grpc-status trailers) grpc_write.c hands to nghttp2; this file collects the frames nghttp2
 * makes of them and writes them to the socket.
 *
 * What a hostile peer can hold: streams (SETTINGS_MAX_CONCURRENT_STREAMS), header bytes
 * (grpc_call.c's cap, and nghttp2's HPACK table limits), buffered control frames (nghttp2's
 * outbound ACK limit ends a SETTINGS or PING flood: the connection is dropped), a stream's
 * message bytes (reserved in the memory budget as they arrive, within --max-body-bytes), time
 * (--receive-timeout-s until a call's messages are in, --send-timeout-s for a peer that stops
 * reading, --idle-timeout-s for a connection doing nothing) and connections
 * (--connection-limit: past it new ones wait in the listen backlog).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "server/grpc.h"
#include "server/log.h"

#define MAX_STREAMS      100
#define READ_CHUNK       ((size_t)64 * 1024)
#define POLL_MS          100
#define MAX_OUTBOUND_ACK 64
#define WRITE_BATCH      ((size_t)64 * 1024) /* bytes of frames collected for one write */

/* ---- nghttp2's callbacks ------------------------------------------------------------------- */

static grpc_call *stream_call(nghttp2_session *session, int32_t stream_id)
{
    return nghttp2_session_get_stream_user_data(session, stream_id);
}

static int on_begin_headers(nghttp2_session *session, const nghttp2_frame *frame, void *user_data)
{
    grpc_conn *conn = user_data;
    grpc_call *call;
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0;
    call = srv__grpc_call_new(conn, frame->hd.stream_id);
    if (!call)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE; /* resets the stream */
    call->next = conn->calls;
    if (conn->calls)
        conn->calls->prev = call;
    conn->calls = call;
    nghttp2_session_set_stream_user_data(session, frame->hd.stream_id, call);
    return 0;
}

static int on_header(nghttp2_session *session, const nghttp2_frame *frame, const uint8_t *name,
                     size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags,
                     void *user_data)
{
    grpc_call *call = stream_call(session, frame->hd.stream_id);
    (void)flags;
    (void)user_data;
    if (call && frame->hd.type == NGHTTP2_HEADERS && frame->headers.cat == NGHTTP2_HCAT_REQUEST &&
        srv__grpc_call_header(call, name, namelen, value, valuelen) != 0)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    return 0;
}

static int on_frame_recv(nghttp2_session *session, const nghttp2_frame *frame, void *user_data)
{
    grpc_call *call = stream_call(session, frame->hd.stream_id);
    (void)user_data;
    if (!call)
        return 0;
    if (frame->hd.type == NGHTTP2_HEADERS && frame->headers.cat == NGHTTP2_HCAT_REQUEST)
        srv__grpc_call_headers_done(call);
    if ((frame->hd.type == NGHTTP2_HEADERS || frame->hd.type == NGHTTP2_DATA) &&
        (frame->hd.flags & NGHTTP2_FLAG_END_STREAM))
        srv__grpc_call_end_stream(call);
    return 0;
}

static int on_data(nghttp2_session *session, uint8_t flags, int32_t stream_id, const uint8_t *data,
                   size_t len, void *user_data)
{
    grpc_call *call = stream_call(session, stream_id);
    (void)flags;
    (void)user_data;
    if (call)
        srv__grpc_call_data(call, data, len);
    return 0;
}

static void unlink_call(grpc_conn *conn, grpc_call *call)
{
    if (call->prev)
        call->prev->next = call->next;
    else
        conn->calls = call->next;
    if (call->next)
        call->next->prev = call->prev;
    call->prev = call->next = NULL;
}

static int on_stream_close(nghttp2_session *session, int32_t stream_id, uint32_t error_code,
                           void *user_data)
{
    grpc_call *call = stream_call(session, stream_id);
    grpc_conn *conn = user_data;
    if (!call)
        return 0;
    nghttp2_session_set_stream_user_data(session, stream_id, NULL);
    unlink_call(conn, call);
    srv__grpc_call_closed(call, error_code);
    return 0;
}

/* ---- Connections ---------------------------------------------------------------------------- */

static nghttp2_session *session_new(grpc_conn *conn)
{
    nghttp2_session_callbacks *cb;
    nghttp2_option *opt;
    nghttp2_session *session = NULL;
    if (nghttp2_session_callbacks_new(&cb) != 0)
        return NULL;
    if (nghttp2_option_new(&opt) != 0) {
        nghttp2_session_callbacks_del(cb);
        return NULL;
    }
    nghttp2_session_callbacks_set_on_begin_headers_callback(cb, on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(cb, on_header);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, on_frame_recv);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, on_data);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, on_stream_close);
    nghttp2_option_set_max_outbound_ack(opt, MAX_OUTBOUND_ACK);
    nghttp2_option_set_max_settings(opt, 32);
    nghttp2_option_set_max_deflate_dynamic_table_size(opt, 4096);
    if (nghttp2_session_server_new2(&session, cb, conn, opt) != 0)
        session = NULL;
    nghttp2_option_del(opt);
    nghttp2_session_callbacks_del(cb);
    if (session) {
        nghttp2_settings_entry iv[] = {
            {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, MAX_STREAMS},
            {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 1 << 20},
            {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, 16384},
        };
        nghttp2_submit_settings(session, NGHTTP2_FLAG_NONE, iv, sizeof iv / sizeof iv[0]);
        nghttp2_session_set_local_window_size(session, NGHTTP2_FLAG_NONE, 0, 8 << 20);
    }
    return session;
}

static void conn_free(srv_grpc *g, grpc_conn *conn)
{
    while (conn->calls) {
        grpc_call *call = conn->calls;
        nghttp2_session_set_stream_user_data(conn->session, call->stream_id, NULL);
        unlink_call(conn, call);
        srv__grpc_call_closed(call, NGHTTP2_CANCEL);
    }
    nghttp2_session_del(conn->session);
    free(conn->wbuf);
    if (conn->tls)
        gnutls_deinit(conn->tls);
    close(conn->fd);
    if (conn->prev)
        conn->prev->next = conn->next;
    else
        g->conns = conn->next;
    if (conn->next)
        conn->next->prev = conn->prev;
    g->n_conns--;
    free(conn);
}

static void accept_one(srv_grpc *g)
{
    int fd = accept4(g->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    grpc_conn *conn;
    int one = 1;
    if (fd < 0)
        return;
    if (g->n_conns >= g->max_conns) {
        srv_log(SRV_LOG_WARN, "grpc: connection refused: --connection-limit %zu reached",
                g->max_conns);
        close(fd);
        return;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    conn = calloc(1, sizeof *conn);
    if (!conn) {
        close(fd);
        return;
    }
    conn->g = g;
    conn->fd = fd;
    conn->number = ++g->conn_counter;
    conn->last_io_ns = eng_now_ns();
    conn->session = session_new(conn);
    conn->handshaken = !g->s->tls;
    if (g->s->tls)
        conn->tls = srv__tls_grpc_session(g->s->tls, fd);
    if (!conn->session || (g->s->tls && !conn->tls)) {
        if (conn->session)
            nghttp2_session_del(conn->session);
        close(fd);
        free(conn);
        return;
    }
    if (g->goaway)
        nghttp2_submit_goaway(conn->session, NGHTTP2_FLAG_NONE, 0, NGHTTP2_NO_ERROR, NULL, 0);
    conn->next = g->conns;
    if (g->conns)
        g->conns->prev = conn;
    g->conns = conn;
    g->n_conns++;
}

/* TLS: advances the handshake; once done, ALPN must have chosen h2. */
static void handshake(grpc_conn *conn)
{
    gnutls_datum_t proto;
    int rc = gnutls_handshake(conn->tls);
    if (rc == GNUTLS_E_AGAIN || rc == GNUTLS_E_INTERRUPTED)
        return;
    if (rc < 0 || gnutls_alpn_get_selected_protocol(conn->tls, &proto) < 0 || proto.size != 2 ||
        memcmp(proto.data, "h2", 2) != 0) {
        srv_log(SRV_LOG_DEBUG, "grpc: connection %llu: TLS handshake failed: %s",
                (unsigned long long)conn->number, rc < 0 ? gnutls_strerror(rc) : "no ALPN h2");
        conn->dead = true;
        return;
    }
    conn->handshaken = true;
    conn->last_io_ns = eng_now_ns();
}

/* What arrived: read (and decrypted) bytes fed to nghttp2. */
static ssize_t conn_recv(grpc_conn *conn, uint8_t *buf, size_t cap)
{
    ssize_t n;
    if (conn->tls) {
        n = gnutls_record_recv(conn->tls, buf, cap);
        if (n == GNUTLS_E_AGAIN || n == GNUTLS_E_INTERRUPTED)
            return -2;
        return n < 0 ? -1 : n;
    }
    n = recv(conn->fd, buf, cap, MSG_DONTWAIT);
    if (n < 0)
        return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? -2 : -1;
    return n;
}

static void conn_read(grpc_conn *conn)
{
    uint8_t buf[READ_CHUNK];
    if (!conn->handshaken) {
        handshake(conn);
        return;
    }
    do {
        ssize_t n = conn_recv(conn, buf, sizeof buf);
        if (n == -2)
            return;
        if (n <= 0) {
            conn->dead = true;
            return;
        }
        conn->last_io_ns = eng_now_ns();
        ssize_t used = nghttp2_session_mem_recv(conn->session, buf, (size_t)n);
        if (used < 0) {
            if (used == NGHTTP2_ERR_FLOODED)
                srv_log(SRV_LOG_WARN, "grpc: connection %llu dropped: control frame flood",
                        (unsigned long long)conn->number);
            conn->dead = true;
            return;
        }
    } while (conn->tls && gnutls_record_check_pending(conn->tls) > 0);
}

/* Writes what the connection has buffered; false when the socket takes no more now (or
 * failed: conn->dead). */
static bool write_buffered(grpc_conn *conn)
{
    while (conn->woff < conn->wlen) {
        const char *p = conn->wbuf + conn->woff;
        size_t left = conn->wlen - conn->woff;
        ssize_t n;
        if (conn->tls) {
            n = gnutls_record_send(conn->tls, p, left);
            if (n == GNUTLS_E_AGAIN || n == GNUTLS_E_INTERRUPTED)
                return false;
        } else {
            n = send(conn->fd, p, left, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
                return false;
        }
        if (n <= 0) {
            conn->dead = true;
            return false;
        }
        conn->woff += (size_t)n;
        conn->last_io_ns = eng_now_ns();
        conn->stalled_since = 0;
    }
    conn->woff = conn->wlen = 0;
    return true;
}

/* Collects nghttp2's frames into the connection's buffer (up to about WRITE_BATCH bytes), so
 * that a response's HEADERS, DATA and trailers leave in one write. */
static void collect_frames(grpc_conn *conn)
{
    while (conn->wlen < WRITE_BATCH) {
        const uint8_t *data;
        ssize_t n = nghttp2_session_mem_send(conn->session, &data);
        if (n < 0) {
            conn->dead = true;
            return;
        }
        if (n == 0)
            return;
        if (conn->wlen + (size_t)n > conn->wcap) {
            size_t cap = conn->wlen + (size_t)n + WRITE_BATCH;
            char *w = realloc(conn->wbuf, cap);
            if (!w) {
                conn->dead = true;
                return;
            }
            conn->wbuf = w;
            conn->wcap = cap;
        }
        memcpy(conn->wbuf + conn->wlen, data, (size_t)n);
        conn->wlen += (size_t)n;
    }
}

static void conn_flush(grpc_conn *conn)
{
    if (!conn->handshaken)
        return;
    while (!conn->dead && write_buffered(conn)) {
        collect_frames(conn);
        if (conn->wlen == 0)
            break;
    }
    if (!conn->dead && conn->wlen == 0 && !nghttp2_session_want_read(conn->session) &&
        !nghttp2_session_want_write(conn->session))
        conn->dead = true;
}

/* Whether the connection has bytes to write. */
static bool conn_wants_write(grpc_conn *conn)
{
    return conn->woff < conn->wlen || nghttp2_session_want_write(conn->session);
}

/* ---- Time limits ------------------------------------------------------------------------------
 */

static bool conn_busy(const grpc_conn *conn)
{
    for (const grpc_call *c = conn->calls; c; c = c->next)
        if (c->job)
            return true;
    return false;
}

/* Calls whose message is not in --receive-timeout-s after its first byte (or the call's start),
 * or by their deadline, end with DEADLINE_EXCEEDED; a peer that takes nothing for --send-timeout-s,
 * or a connection idle for --idle-timeout-s, is closed. */
static void check_times(srv_grpc *g, grpc_conn *conn, int64_t now)
{
    const srv_server *s = g->s;
    for (grpc_call *c = conn->calls; c; c = c->next) {
        /* A stream waiting between messages is idle, not slow: --idle-timeout-s covers it. */
        bool between = c->method == API_GRPC_MODEL_STREAM_INFER && c->reader.prefix_len == 0;
        if (c->finished || c->job || c->half_closed || between)
            continue;
        if (now - c->recv_since_ns > g->receive_timeout_ns)
            srv__grpc_finish_as(c, SRV_REFUSE_DEADLINE,
                                "the request's messages did not arrive within --receive-timeout-s");
        else if (c->lease.ctl.deadline_ns > 0 && now >= c->lease.ctl.deadline_ns)
            srv__grpc_finish_as(c, SRV_REFUSE_DEADLINE,
                                "deadline exceeded while receiving the request");
    }
    if (conn->handshaken && conn_wants_write(conn)) {
        if (conn->stalled_since == 0)
            conn->stalled_since = now;
        else if (now - conn->stalled_since > (int64_t)s->send_timeout_s * 1000000000)
            conn->dead = true;
    }
    if (now - conn->last_io_ns > s->idle_timeout_ns && !conn_busy(conn))
        conn->dead = true;
}

/* The drain: GOAWAY on every connection once (new streams are refused), and the streams still
 * open finish. */
static void check_drain(srv_grpc *g)
{
    if (g->goaway || !atomic_load(&g->s->draining))
        return;
    g->goaway = true;
    if (g->listen_fd >= 0) {
        close(g->listen_fd);
        g->listen_fd = -1;
    }
    for (grpc_conn *c = g->conns; c; c = c->next)
        nghttp2_submit_goaway(c->session, NGHTTP2_FLAG_NONE,
                              nghttp2_session_get_last_proc_stream_id(c->session), NGHTTP2_NO_ERROR,
                              NULL, 0);
}

/* ---- The thread ----------------------------------------------------------------------------- */

static void loop_turn(srv_grpc *g, struct pollfd *pfd, size_t cap)
{
    size_t n = 0;
    pfd[n++] = (struct pollfd){.fd = g->wake_fd, .events = POLLIN};
    /* At --connection-limit new connections wait in the listen backlog, as on --port. */
    pfd[n++] =
        (struct pollfd){.fd = g->n_conns < g->max_conns ? g->listen_fd : -1, .events = POLLIN};
    for (grpc_conn *c = g->conns; c && n < cap; c = c->next) {
        short ev = POLLIN;
        if (!c->handshaken ? gnutls_record_get_direction(c->tls) == 1 : conn_wants_write(c))
            ev |= POLLOUT;
        pfd[n++] = (struct pollfd){.fd = c->fd, .events = ev};
    }
    if (poll(pfd, n, POLL_MS) < 0 && errno != EINTR)
        return;
    if (pfd[0].revents & POLLIN) {
        uint64_t v;
        ssize_t r = read(g->wake_fd, &v, sizeof v);
        (void)r;
    }
    srv__grpc_jobs_done(g);
    check_drain(g);
    if (atomic_load(&g->s->drain_expired))
        srv__grpc_cancel_all(g);
    size_t i = 2;
    int64_t now = eng_now_ns();
    for (grpc_conn *c = g->conns; c && i < n; c = c->next, i++)
        if ((pfd[i].revents & (POLLIN | POLLHUP | POLLERR)) ||
            (!c->handshaken && (pfd[i].revents & POLLOUT)))
            conn_read(c);
    for (grpc_conn *c = g->conns, *next; c; c = next) {
        next = c->next;
        check_times(g, c, now);
        conn_flush(c);
        if (c->dead)
            conn_free(g, c);
    }
    if (pfd[1].fd >= 0 && (pfd[1].revents & POLLIN))
        accept_one(g);
}

static void *grpc_thread(void *arg)
{
    srv_grpc *g = arg;
    size_t cap = g->max_conns + 2;
    struct pollfd *pfd = calloc(cap, sizeof *pfd);
    if (!pfd) {
        srv_log(SRV_LOG_ERROR, "grpc: out of memory; the gRPC port stops serving");
        return NULL;
    }
    while (!atomic_load(&g->stop))
        loop_turn(g, pfd, cap);
    free(pfd);
    return NULL;
}

static int listen_on(const char *host, int port, int *bound, char *err, size_t errlen)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    char service[8];
    int fd = -1, one = 1;
    snprintf(service, sizeof service, "%d", port);
    if (getaddrinfo(host, service, &hints, &res) != 0 || !res) {
        snprintf(err, errlen, "--grpc-port: cannot resolve --host %s", host);
        return -1;
    }
    fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd >= 0)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, 128) != 0) {
        snprintf(err, errlen, "--grpc-port %d: cannot listen on %s: %s", port, host,
                 strerror(errno));
        if (fd >= 0)
            close(fd);
        freeaddrinfo(res);
        return -1;
    }
    freeaddrinfo(res);
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &len);
    *bound = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                            : ((struct sockaddr_in *)&ss)->sin_port);
    return fd;
}

srv_status srv__grpc_start(srv_server *s, const srv_config *cfg, srv_grpc **out, char *err,
                           size_t errlen)
{
    srv_grpc *g;
    *out = NULL;
    if (cfg->grpc_port < 0)
        return SRV_OK;
    g = calloc(1, sizeof *g);
    if (!g) {
        snprintf(err, errlen, "out of memory");
        return SRV_ENOMEM;
    }
    g->s = s;
    g->wake_fd = -1;
    g->max_conns = (size_t)cfg->connection_limit;
    g->receive_timeout_ns = cfg->receive_timeout_s * 1000000000;
    atomic_init(&g->stop, false);
    pthread_mutex_init(&g->done_lock, NULL);
    *out = g;
    g->listen_fd = listen_on(cfg->host, (int)cfg->grpc_port, &g->port, err, errlen);
    if (g->listen_fd < 0)
        return SRV_EIO;
    g->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (g->wake_fd < 0 || pthread_create(&g->thread, NULL, grpc_thread, g) != 0) {
        snprintf(err, errlen, "--grpc-port: cannot start its thread: %s", strerror(errno));
        return SRV_EIO;
    }
    g->started = true;
    return SRV_OK;
}

int srv__grpc_port(const srv_grpc *g)
{
    return g ? g->port : -1;
}

void srv__grpc_stop(srv_grpc *g)
{
    if (!g)
        return;
    atomic_store(&g->stop, true);
    srv__grpc_wake(g);
    if (g->started)
        pthread_join(g->thread, NULL);
    g->started = false;
    while (g->conns)
        conn_free(g, g->conns);
    if (g->listen_fd >= 0)
        close(g->listen_fd);
    g->listen_fd = -1;
}

void srv__grpc_free(srv_grpc *g)
{
    if (!g)
        return;
    srv__grpc_stop(g);
    srv__grpc_jobs_done(g); /* jobs the pool finished after the stop: their calls are gone */
    if (g->wake_fd >= 0)
        close(g->wake_fd);
    pthread_mutex_destroy(&g->done_lock);
    free(g);
}
