/*
 * request.c - the parts of a request's life cycle that http.c and http_job.c share
 * (request.h): its references, its body's memory, the refusal of a request that never runs,
 * resuming its connection, and writing its reply to a client that half-closed.
 */
#include "server/request.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "server/half_close.h"
#include "server/reply.h"

/* Frees the body and gives its share of the lease back. The thread that owns the request at
 * the time calls it (see request.h). */
void srv__req_release_body(srv_req *req)
{
    api_buf_free(&req->body);
    api_lease_give_back(&req->lease, req->body_held);
    req->body_held = 0;
}

/* Drops one reference; the last one frees the request. Its lease ends at completion
 * (srv__mhd_completed), once the reply is sent or given up; ending it here again is a no-op,
 * and covers a request that never got as far. Any thread. */
void srv__req_unref(srv_req *req)
{
    if (!req || atomic_fetch_sub(&req->refs, 1) != 1)
        return;
    srv__req_release_body(req);
    api_reply_free(&req->reply);
    api_lease_end(&req->lease);
    free(req);
}

/* Fills req->reply with refusal `o` for a request that ends without running (watcher,
 * worker). */
void srv__req_fail(srv_req *req, srv_outcome o, const char *fmt, ...)
{
    const srv_outcome_info *info = srv__outcome(o);
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    api_reply_free(&req->reply);
    api_reply_error_status(&req->reply, srv__route_style(req->route, req->path), info->status,
                           info->reason, NULL, "%s", msg);
}

/* What set the deadline of a queued request, for the message of its 504 (64 bytes are
 * enough): "--request-timeout-ms 60000", or "the request's timeout of 100 ms" when its body's
 * own timeout was tighter. */
void srv__req_deadline_origin(const srv_req *req, char *buf, size_t size)
{
    if (req->own_timeout_ms > 0)
        snprintf(buf, size, "the request's timeout of %lld ms", (long long)req->own_timeout_ms);
    else
        snprintf(buf, size, "--request-timeout-ms %lld",
                 (long long)(req->srv->request_timeout_ns / 1000000));
}

/* Gives a finished request back to libmicrohttpd, which then calls the access handler. */
void srv__req_resume(srv_req *req)
{
    MHD_resume_connection(req->conn);
    atomic_fetch_sub(&req->srv->suspended, 1);
}

/* Writes req->reply straight to the socket and records it as the response (half_close.c);
 * the connection must then close. */
void srv__req_send_direct(srv_req *req)
{
    srv_reply r = srv__reply_computed(&req->reply);
    size_t len = r.len;
    int fd = srv__conn_fd(req->srv->watch, &req->watch);
    /* --idle-timeout-s bounds the writing as it bounds libmicrohttpd's. */
    bool sent = srv__reply_direct(fd, &r, req->id, eng_now_ns() + req->srv->idle_timeout_ns);
    req->reason = r.reason;
    req->status = r.status;
    req->bytes_out = sent ? len : 0;
    req->responded = true;
    req->sent_directly = true;
    if (!sent)
        atomic_store(&req->client_gone, true);
}

/* The captured headers, as api/ takes them. */
void srv__req_call_headers(const srv_req *req, api_call *call)
{
    call->content_type = req->has_content_type ? req->content_type : NULL;
    call->content_encoding = req->content_encoding[0] ? req->content_encoding : NULL;
    call->accept_encoding = req->accept_encoding[0] ? req->accept_encoding : NULL;
    call->inference_header_length = req->infer_header_len[0] ? req->infer_header_len : NULL;
    call->request_id = req->id[0] ? req->id : NULL;
}
