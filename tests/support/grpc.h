/*
 * grpc.h - a small gRPC client over nghttp2 for the tests and bench_e2e: one HTTP/2 connection
 * (h2c) to 127.0.0.1, calls as streams, messages framed with gRPC's 5-byte prefix, the status
 * from the trailers. Blocking: every function pumps the connection until what it waits for
 * arrives or its time runs out. One thread per client.
 *
 *     grpc_client c;
 *     if (grpc_client_open(&c, port) != 0) return;
 *     grpc_stream st;
 *     grpc_call(&c, "/inference.GRPCInferenceService/ServerLive", NULL, "", 0, 5000, &st);
 *     CHECK_EQ_INT(st.grpc_status, 0);
 *     grpc_stream_free(&st);
 *     grpc_client_close(&c);
 */
#ifndef ATTND_TESTS_GRPC_H
#define ATTND_TESTS_GRPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    int32_t id;
    int http_status;   /* :status of the response headers; 0 before them */
    int grpc_status;   /* from grpc-status; -1 before it arrives */
    char message[512]; /* grpc-message (still percent-encoded) */
    char *data;        /* every DATA byte of the response (malloc'd) */
    size_t len, cap;
    bool closed;       /* the stream is over */
    uint32_t rst_code; /* the error code when it was reset; 0 otherwise */
    const char *body;  /* the request bytes to send (prefix included) */
    size_t body_len, body_off;
    bool keep_open; /* do not end the request stream after `body` */
} grpc_stream;

typedef struct {
    int fd;
    void *session; /* nghttp2_session */
    bool goaway;   /* the server sent GOAWAY */
    bool dead;     /* the connection failed or was closed */
    char *wbuf;    /* frames waiting for grpc_flush */
    size_t wlen, wcap;
} grpc_client;

/* Connects and sends the preface; 0 or -1 (printed). */
int grpc_client_open(grpc_client *c, int port);
void grpc_client_close(grpc_client *c);

/* A message with its gRPC prefix (malloc'd), *out_len bytes. */
char *grpc_frame(const void *msg, size_t len, size_t *out_len);

/* Starts a call of `path` sending st->body (already framed; the stream ends after it unless
 * st->keep_open). `headers` is NULL or "name", "value", ... , NULL. 0 or -1. */
int grpc_start(grpc_client *c, const char *path, const char *const *headers, grpc_stream *st);
/* Pumps the connection until st's status arrives (or it is reset) or timeout_ms passes; true
 * when it did. */
bool grpc_wait(grpc_client *c, grpc_stream *st, int timeout_ms);
/* Writes every frame nghttp2 has for the server (waiting for the socket when it must), without
 * reading anything. */
void grpc_flush(grpc_client *c);
/* Pumps the connection once for up to timeout_ms. */
void grpc_pump(grpc_client *c, int timeout_ms);
/* grpc_frame(msg) + grpc_start + grpc_wait; returns once the request is all sent too. */
bool grpc_call(grpc_client *c, const char *path, const char *const *headers, const void *msg,
               size_t len, int timeout_ms, grpc_stream *st);
/* Sends `len` more framed bytes on an open stream (keep_open), then ends it when `end`. The
 * bytes must stay valid until sent (grpc_pump until st->body_off == st->body_len). */
void grpc_send_more(grpc_client *c, grpc_stream *st, const char *bytes, size_t len, bool end);
/* Resets the stream (CANCEL). */
void grpc_cancel(grpc_client *c, grpc_stream *st);
/* The i-th response message of st (its bytes after the prefix), or NULL. */
const char *grpc_message_at(const grpc_stream *st, size_t i, size_t *len);
void grpc_stream_free(grpc_stream *st);

#endif
