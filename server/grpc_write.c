/*
 * grpc_write.c - what a call hands to its connection (grpc.h): response messages, queued per
 * stream and given to nghttp2 as its data source asks for them, the status as trailers (or a
 * trailers-only response when no message went out), and the wake-up of the gRPC thread when
 * a worker finishes an inference. Below grpc_call.c and grpc_conn.c, which both use it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "server/grpc.h"

/* grpc-message is percent-encoded: bytes outside printable ASCII, and '%' itself. */
static void percent_encode(const char *in, char *out, size_t cap)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)in; *p && o + 4 < cap; p++) {
        if (*p >= 0x20 && *p <= 0x7e && *p != '%') {
            out[o++] = (char)*p;
        } else {
            out[o++] = '%';
            out[o++] = hex[*p >> 4];
            out[o++] = hex[*p & 15];
        }
    }
    out[o] = '\0';
}

#define NV(n, v, vlen)                                                                             \
    {                                                                                              \
        (uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, (vlen), NGHTTP2_NV_FLAG_NONE                \
    }

static int submit_trailers(grpc_call *call, bool with_headers)
{
    char status[12], message[3 * sizeof call->grpc_message + 1];
    snprintf(status, sizeof status, "%d", call->grpc_status);
    percent_encode(call->grpc_message, message, sizeof message);
    nghttp2_nv nva[] = {
        NV(":status", "200", 3),
        NV("content-type", "application/grpc", 16),
        NV("grpc-status", status, strlen(status)),
        NV("grpc-message", message, strlen(message)),
    };
    size_t skip = with_headers ? 0 : 2, n = message[0] ? 4 : 3;
    if (with_headers)
        return nghttp2_submit_response(call->conn->session, call->stream_id, nva, n, NULL);
    return nghttp2_submit_trailer(call->conn->session, call->stream_id, nva + skip, n - skip);
}

static ssize_t read_out(nghttp2_session *session, int32_t stream_id, uint8_t *buf, size_t length,
                        uint32_t *flags, nghttp2_data_source *source, void *user_data)
{
    grpc_call *call = source->ptr;
    size_t n = 0;
    (void)session;
    (void)stream_id;
    (void)user_data;
    while (call->out && n < length) {
        grpc_chunk *c = call->out;
        size_t take = c->len - c->off < length - n ? c->len - c->off : length - n;
        memcpy(buf + n, c->data + c->off, take);
        c->off += take;
        n += take;
        if (c->off == c->len) {
            call->out = c->next;
            if (!call->out)
                call->out_tail = NULL;
            srv__grpc_chunk_free(c);
        }
    }
    call->bytes_out += n;
    if (n > 0)
        return (ssize_t)n;
    if (call->finished) {
        *flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
        if (submit_trailers(call, false) != 0)
            return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
        return 0;
    }
    call->deferred = true;
    return NGHTTP2_ERR_DEFERRED;
}

static void start_response(grpc_call *call)
{
    nghttp2_nv nva[] = {NV(":status", "200", 3), NV("content-type", "application/grpc", 16)};
    nghttp2_data_provider dp = {.source.ptr = call, .read_callback = read_out};
    call->response_started = true;
    if (nghttp2_submit_response(call->conn->session, call->stream_id, nva, 2, &dp) != 0)
        call->conn->dead = true;
}

static void queue_chunk(grpc_call *call, grpc_chunk *c)
{
    if (call->out_tail)
        call->out_tail->next = c;
    else
        call->out = c;
    call->out_tail = c;
    if (!call->response_started) {
        start_response(call);
    } else if (call->deferred) {
        call->deferred = false;
        nghttp2_session_resume_data(call->conn->session, call->stream_id);
    }
}

void srv__grpc_send(grpc_call *call, const void *data, size_t len)
{
    grpc_chunk *c = malloc(sizeof *c + len);
    if (!c) {
        srv__grpc_finish_as(call, SRV_REFUSE_NO_MEMORY, "out of memory");
        return;
    }
    *c = (grpc_chunk){.data = c->bytes, .len = len};
    memcpy(c->bytes, data, len);
    queue_chunk(call, c);
}

void srv__grpc_send_owned(grpc_call *call, char *body, size_t len)
{
    grpc_chunk *c = malloc(sizeof *c);
    if (!c) {
        eng_buf_free(body);
        srv__grpc_finish_as(call, SRV_REFUSE_NO_MEMORY, "out of memory");
        return;
    }
    *c = (grpc_chunk){.data = body, .len = len, .owned = body};
    queue_chunk(call, c);
}

void srv__grpc_chunk_free(grpc_chunk *c)
{
    eng_buf_free(c->owned);
    free(c);
}

void srv__grpc_finish_as(grpc_call *call, srv_outcome o, const char *message)
{
    srv__grpc_finish(call, srv__outcome_http(o, API_ERRORS_V2), srv__outcome(o)->reason, message);
}

void srv__grpc_finish(grpc_call *call, int http_status, api_reason reason, const char *message)
{
    if (call->finished)
        return;
    call->finished = true;
    call->http_status = http_status;
    call->reason = reason;
    call->grpc_status = (int)api_grpc_code_of(http_status);
    snprintf(call->grpc_message, sizeof call->grpc_message, "%s", message ? message : "");
    if (!call->response_started) {
        call->response_started = true;
        if (submit_trailers(call, true) != 0)
            call->conn->dead = true;
    } else if (call->deferred) {
        call->deferred = false;
        nghttp2_session_resume_data(call->conn->session, call->stream_id);
    }
}

void srv__grpc_wake(srv_grpc *g)
{
    uint64_t one = 1;
    if (g && g->wake_fd >= 0) {
        ssize_t r = write(g->wake_fd, &one, sizeof one);
        (void)r;
    }
}
