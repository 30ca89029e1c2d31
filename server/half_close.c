/*
 * half_close.c - replies to clients that closed their sending side while their request was
 * suspended (shutdown(SHUT_WR) after the request, as `nc -N` and some proxies do).
 *
 * libmicrohttpd 0.9.75 drops such a reply. A connection is suspended from the handler's final
 * call, and MHD_connection_update_event_loop_info returns early for a suspended connection,
 * so it keeps the READ event-loop state it had while the body arrived. On resume,
 * resume_suspended_connections marks it read-ready, call_handlers reads before anything else,
 * recv returns 0 for the FIN, and MHD_connection_handle_read closes the connection
 * (MHD_REQUEST_TERMINATED_WITH_ERROR) before the access handler is called to queue the reply.
 *
 * So when the peer's FIN is waiting at the moment a worker finishes, the worker writes the
 * reply to the socket itself, before resuming: the connection is suspended, so libmicrohttpd
 * writes nothing meanwhile, and it closes the connection right after (which is what the client
 * asked for). A client that closed its socket for good answers the bytes with a reset, and the
 * request counts as 499 like any hang-up.
 */
#include "server/internal.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

bool srv__peer_sent_fin(srv_req *req)
{
    char byte;
    int fd = -1;
    ssize_t n;
    pthread_mutex_lock(&req->srv->watch_mu);
    if (req->sc)
        fd = req->sc->fd;
    pthread_mutex_unlock(&req->srv->watch_mu);
    if (fd < 0)
        return false;
    /* 0 only at end-of-file with no byte left unread (a pipelined request would be one). */
    n = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0;
}

/* Writes all of data[0..len) to `fd` before `deadline_ns`; false on an error or the deadline. */
static bool write_all_by(int fd, const char *data, size_t len, int64_t deadline_ns)
{
    while (len > 0) {
        ssize_t w = send(fd, data, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            data += w;
            len -= (size_t)w;
            continue;
        }
        if (w < 0 && errno != EAGAIN && errno != EINTR)
            return false;
        int64_t left_ms = (deadline_ns - eng_now_ns()) / 1000000;
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        if (left_ms <= 0)
            return false;
        if (poll(&p, 1, left_ms > 1000 ? 1000 : (int)left_ms) < 0 && errno != EINTR)
            return false;
    }
    return true;
}

/* The status line and headers of `reply` for a connection about to close; its length, or 0
 * when `cap` is too small. */
static size_t reply_head(const srv_req *req, const api_reply *reply, size_t body_len, char *out,
                         size_t cap)
{
    const char *headers[8];
    char num[24];
    const char *phrase = MHD_get_reason_phrase_for((unsigned)reply->status);
    size_t n;
    int w =
        snprintf(out, cap,
                 "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                 "X-Request-Id: %s\r\nConnection: close\r\n",
                 reply->status, phrase ? phrase : "",
                 reply->content_type ? reply->content_type : "application/json", body_len, req->id);
    if (w < 0 || (size_t)w >= cap)
        return 0;
    n = (size_t)w;
    srv__reply_headers(reply, headers, num);
    for (const char *const *h = headers; h[0] && h[1]; h += 2) {
        w = snprintf(out + n, cap - n, "%s: %s\r\n", h[0], h[1]);
        if (w < 0 || (size_t)w >= cap - n)
            return 0;
        n += (size_t)w;
    }
    if (reply->retry_after_s > 0) {
        w = snprintf(out + n, cap - n, "Retry-After: %d\r\n", reply->retry_after_s);
        if (w < 0 || (size_t)w >= cap - n)
            return 0;
        n += (size_t)w;
    }
    if (cap - n < 3)
        return 0;
    memcpy(out + n, "\r\n", 3);
    return n + 2;
}

void srv__reply_direct(srv_req *req)
{
    api_reply *reply = &req->reply;
    char head[1024];
    size_t len = 0, hlen;
    int fd = -1;
    char *body;
    bool sent;

    if (reply->status <= 0)
        reply->status = 500;
    body = api_reply_take_body(reply, &len);
    hlen = reply_head(req, reply, len, head, sizeof head);
    pthread_mutex_lock(&req->srv->watch_mu);
    if (req->sc)
        fd = req->sc->fd;
    pthread_mutex_unlock(&req->srv->watch_mu);
    /* --idle-timeout-s bounds the writing as it bounds libmicrohttpd's. */
    int64_t deadline = eng_now_ns() + req->srv->idle_timeout_ns;
    sent = fd >= 0 && hlen > 0 && write_all_by(fd, head, hlen, deadline) &&
           write_all_by(fd, body ? body : "", len, deadline);
    eng_buf_free(body);
    req->reason = reply->reason;
    req->status = reply->status;
    req->bytes_out = sent ? len : 0;
    req->responded = true;
    req->sent_directly = true;
    if (!sent)
        atomic_store(&req->client_gone, true);
}
