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
#include "server/half_close.h"

#include <errno.h>
#include <microhttpd.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "engine/engine.h"

bool srv__peer_sent_fin(int fd)
{
    char byte;
    if (fd < 0)
        return false;
    /* 0 only at end-of-file with no byte left unread (a pipelined request would be one). */
    return recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
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

/* The header block being formatted: out[0..n) of `cap` bytes. */
typedef struct {
    char *out;
    size_t n, cap;
} head_text;

static bool head_line(void *cls, const char *name, const char *value)
{
    head_text *h = cls;
    int w = snprintf(h->out + h->n, h->cap - h->n, "%s: %s\r\n", name, value);
    if (w < 0 || (size_t)w >= h->cap - h->n)
        return false;
    h->n += (size_t)w;
    return true;
}

/* The status line and headers of `r` for a connection about to close; its length, or 0 when
 * `cap` is too small. */
static size_t reply_head(const srv_reply *r, const char *request_id, char *out, size_t cap)
{
    const char *phrase = MHD_get_reason_phrase_for((unsigned)r->status);
    char num[24];
    head_text h = {.out = out, .cap = cap};
    int w = snprintf(out, cap,
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                     "X-Request-Id: %s\r\nConnection: close\r\n",
                     r->status, phrase ? phrase : "",
                     r->content_type ? r->content_type : "application/json", r->len, request_id);
    if (w < 0 || (size_t)w >= cap)
        return 0;
    h.n = (size_t)w;
    if (!srv__reply_each_header(r, num, head_line, &h) || cap - h.n < 3)
        return 0;
    memcpy(out + h.n, "\r\n", 3);
    return h.n + 2;
}

bool srv__reply_direct(int fd, srv_reply *r, const char *request_id, int64_t deadline_ns)
{
    char head[1024];
    size_t hlen = reply_head(r, request_id, head, sizeof head);
    bool sent = fd >= 0 && hlen > 0 && write_all_by(fd, head, hlen, deadline_ns) &&
                write_all_by(fd, r->body ? r->body : "", r->len, deadline_ns);
    srv__reply_free(r);
    return sent;
}
