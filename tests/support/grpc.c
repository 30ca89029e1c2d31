/*
 * grpc.c - the tests' gRPC client over nghttp2 (grpc.h).
 */
#include "tests/support/grpc.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <nghttp2/nghttp2.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* nghttp2's frames are collected and written together by grpc_flush: one write per burst. */
static ssize_t on_send(nghttp2_session *s, const uint8_t *data, size_t len, int flags, void *user)
{
    grpc_client *c = user;
    (void)s;
    (void)flags;
    if (c->wlen + len > c->wcap) {
        size_t cap = (c->wlen + len) * 2;
        char *w = realloc(c->wbuf, cap);
        if (!w)
            return NGHTTP2_ERR_CALLBACK_FAILURE;
        c->wbuf = w;
        c->wcap = cap;
    }
    memcpy(c->wbuf + c->wlen, data, len);
    c->wlen += len;
    return (ssize_t)len;
}

static int on_header(nghttp2_session *s, const nghttp2_frame *frame, const uint8_t *name,
                     size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags,
                     void *user)
{
    grpc_stream *st = nghttp2_session_get_stream_user_data(s, frame->hd.stream_id);
    char v[sizeof st->message];
    size_t n = valuelen < sizeof v - 1 ? valuelen : sizeof v - 1;
    (void)flags;
    (void)user;
    if (!st)
        return 0;
    memcpy(v, value, n);
    v[n] = '\0';
    if (namelen == 7 && memcmp(name, ":status", 7) == 0)
        st->http_status = (int)strtol(v, NULL, 10);
    else if (namelen == 11 && memcmp(name, "grpc-status", 11) == 0)
        st->grpc_status = (int)strtol(v, NULL, 10);
    else if (namelen == 12 && memcmp(name, "grpc-message", 12) == 0)
        memcpy(st->message, v, n + 1);
    return 0;
}

static int on_data(nghttp2_session *s, uint8_t flags, int32_t id, const uint8_t *data, size_t len,
                   void *user)
{
    grpc_stream *st = nghttp2_session_get_stream_user_data(s, id);
    (void)flags;
    (void)user;
    if (!st)
        return 0;
    if (st->len + len > st->cap) {
        size_t cap = (st->len + len) * 2;
        char *p = realloc(st->data, cap);
        if (!p)
            return NGHTTP2_ERR_CALLBACK_FAILURE;
        st->data = p;
        st->cap = cap;
    }
    memcpy(st->data + st->len, data, len);
    st->len += len;
    return 0;
}

static int on_close(nghttp2_session *s, int32_t id, uint32_t code, void *user)
{
    grpc_stream *st = nghttp2_session_get_stream_user_data(s, id);
    (void)user;
    if (st) {
        st->closed = true;
        st->rst_code = code;
    }
    return 0;
}

static int on_frame(nghttp2_session *s, const nghttp2_frame *frame, void *user)
{
    grpc_client *c = user;
    (void)s;
    if (frame->hd.type == NGHTTP2_GOAWAY)
        c->goaway = true;
    return 0;
}

int grpc_client_open(grpc_client *c, int port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    nghttp2_session_callbacks *cb;
    nghttp2_session *s;
    int one = 1;
    memset(c, 0, sizeof *c);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    c->fd = socket(AF_INET, SOCK_STREAM, 0);
    if (c->fd < 0 || connect(c->fd, (struct sockaddr *)&a, sizeof a) != 0) {
        fprintf(stderr, "grpc: cannot connect to port %d: %s\n", port, strerror(errno));
        if (c->fd >= 0)
            close(c->fd);
        return -1;
    }
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    nghttp2_session_callbacks_new(&cb);
    nghttp2_session_callbacks_set_send_callback(cb, on_send);
    nghttp2_session_callbacks_set_on_header_callback(cb, on_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, on_data);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, on_close);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, on_frame);
    nghttp2_session_client_new(&s, cb, c);
    nghttp2_session_callbacks_del(cb);
    c->session = s;
    nghttp2_settings_entry iv[] = {{NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 1 << 30}};
    nghttp2_submit_settings(s, NGHTTP2_FLAG_NONE, iv, 1);
    nghttp2_session_set_local_window_size(s, NGHTTP2_FLAG_NONE, 0, 1 << 30);
    grpc_flush(c);
    return 0;
}

void grpc_flush(grpc_client *c)
{
    size_t off = 0;
    if (c->dead || nghttp2_session_send(c->session) != 0) {
        c->dead = true;
        return;
    }
    while (off < c->wlen) {
        struct pollfd p = {.fd = c->fd, .events = POLLOUT};
        ssize_t n = send(c->fd, c->wbuf + off, c->wlen - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            off += (size_t)n;
        } else if (n < 0 && errno == EAGAIN) {
            poll(&p, 1, 100);
        } else {
            c->dead = true;
            break;
        }
    }
    c->wlen = 0;
}

void grpc_client_close(grpc_client *c)
{
    free(c->wbuf);
    c->wbuf = NULL;
    c->wlen = c->wcap = 0;
    if (c->session)
        nghttp2_session_del(c->session);
    if (c->fd >= 0)
        close(c->fd);
    c->session = NULL;
    c->fd = -1;
}

char *grpc_frame(const void *msg, size_t len, size_t *out_len)
{
    char *f = malloc(len + 5);
    if (!f)
        return NULL;
    f[0] = 0;
    f[1] = (char)(len >> 24);
    f[2] = (char)(len >> 16);
    f[3] = (char)(len >> 8);
    f[4] = (char)len;
    if (len)
        memcpy(f + 5, msg, len);
    *out_len = len + 5;
    return f;
}

static ssize_t read_body(nghttp2_session *s, int32_t id, uint8_t *buf, size_t length,
                         uint32_t *flags, nghttp2_data_source *src, void *user)
{
    grpc_stream *st = src->ptr;
    size_t n = st->body_len - st->body_off < length ? st->body_len - st->body_off : length;
    (void)s;
    (void)id;
    (void)user;
    memcpy(buf, st->body + st->body_off, n);
    st->body_off += n;
    if (st->body_off == st->body_len) {
        if (!st->keep_open)
            *flags |= NGHTTP2_DATA_FLAG_EOF;
        else if (n == 0)
            return NGHTTP2_ERR_DEFERRED;
    }
    return (ssize_t)n;
}

int grpc_start(grpc_client *c, const char *path, const char *const *headers, grpc_stream *st)
{
    nghttp2_nv nva[24];
    size_t n = 0;
    const char *fixed[] = {":method",   "POST",    ":scheme", "http",         ":authority",
                           "127.0.0.1", ":path",   path,      "content-type", "application/grpc",
                           "te",        "trailers"};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i += 2) {
        bool overridden = false;
        for (size_t j = 0; headers && headers[j]; j += 2)
            overridden |= strcmp(headers[j], fixed[i]) == 0;
        if (!overridden)
            nva[n++] = (nghttp2_nv){(uint8_t *)fixed[i], (uint8_t *)fixed[i + 1], strlen(fixed[i]),
                                    strlen(fixed[i + 1]), 0};
    }
    for (size_t j = 0; headers && headers[j] && n < 24; j += 2)
        nva[n++] = (nghttp2_nv){(uint8_t *)headers[j], (uint8_t *)headers[j + 1],
                                strlen(headers[j]), strlen(headers[j + 1]), 0};
    st->id = 0;
    st->http_status = 0;
    st->grpc_status = -1;
    st->message[0] = '\0';
    st->data = NULL;
    st->len = st->cap = 0;
    st->closed = false;
    st->rst_code = 0;
    st->body_off = 0;
    nghttp2_data_provider dp = {.source.ptr = st, .read_callback = read_body};
    st->id = nghttp2_submit_request(c->session, NULL, nva, n, &dp, st);
    if (st->id < 0)
        return -1;
    grpc_pump(c, 0);
    return 0;
}

void grpc_pump(grpc_client *c, int timeout_ms)
{
    struct pollfd p = {.fd = c->fd, .events = POLLIN};
    uint8_t buf[65536];
    if (c->dead)
        return;
    if (nghttp2_session_want_write(c->session))
        p.events |= POLLOUT;
    if (poll(&p, 1, timeout_ms) > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR))) {
        ssize_t n = recv(c->fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN))
            c->dead = true;
        else if (n > 0 && nghttp2_session_mem_recv(c->session, buf, (size_t)n) < 0)
            c->dead = true;
    }
    grpc_flush(c);
}

bool grpc_wait(grpc_client *c, grpc_stream *st, int timeout_ms)
{
    int64_t end = now_ms() + timeout_ms;
    while (!st->closed && st->grpc_status < 0 && !c->dead && now_ms() < end)
        grpc_pump(c, 20);
    return st->closed || st->grpc_status >= 0;
}

bool grpc_call(grpc_client *c, const char *path, const char *const *headers, const void *msg,
               size_t len, int timeout_ms, grpc_stream *st)
{
    size_t n;
    char *framed = grpc_frame(msg, len, &n);
    bool ok;
    st->body = framed;
    st->body_len = n;
    st->keep_open = false;
    ok = framed && grpc_start(c, path, headers, st) == 0 && grpc_wait(c, st, timeout_ms);
    /* The status may come before the request is all sent: send the rest before the body goes. */
    while (!st->closed && !c->dead && st->body_off < st->body_len)
        grpc_pump(c, 10);
    free(framed);
    st->body = NULL;
    return ok;
}

void grpc_send_more(grpc_client *c, grpc_stream *st, const char *bytes, size_t len, bool end)
{
    st->body = bytes;
    st->body_len = len;
    st->body_off = 0;
    st->keep_open = !end;
    nghttp2_session_resume_data(c->session, st->id);
    grpc_pump(c, 0);
}

void grpc_cancel(grpc_client *c, grpc_stream *st)
{
    nghttp2_submit_rst_stream(c->session, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_CANCEL);
    grpc_flush(c);
}

const char *grpc_message_at(const grpc_stream *st, size_t i, size_t *len)
{
    size_t off = 0;
    for (;;) {
        size_t n;
        if (st->len - off < 5)
            return NULL;
        n = (size_t)(unsigned char)st->data[off + 1] << 24 |
            (size_t)(unsigned char)st->data[off + 2] << 16 |
            (size_t)(unsigned char)st->data[off + 3] << 8 | (unsigned char)st->data[off + 4];
        if (n > st->len - off - 5)
            return NULL;
        if (i-- == 0) {
            *len = n;
            return st->data + off + 5;
        }
        off += 5 + n;
    }
}

void grpc_stream_free(grpc_stream *st)
{
    free(st->data);
    st->data = NULL;
    st->len = st->cap = 0;
}
