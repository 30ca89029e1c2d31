/*
 * grpc.h - the gRPC edge (--grpc-port): KServe v2's inference.GRPCInferenceService over HTTP/2
 * (nghttp2), plain (h2c) or TLS with ALPN h2 (the HTTPS port's certificate). grpc_conn.c owns the
 * listener, the connections and their thread (one poll loop: every nghttp2 call happens on it);
 * grpc_call.c owns the calls: headers, messages, the cheap methods, their status, metrics and log
 * lines, and their inferences as jobs, which job.c admits, schedules and runs on the engine pool
 * as it does HTTP's requests; grpc_write.c queues what a call sends on its stream
 * (HEADERS, the messages, the status as trailers) and wakes the thread. The replies themselves
 * come from api/ (api_grpc_*), as HTTP's do.
 *
 * Threads: the gRPC thread runs everything here except a grpc_job's run (job.h: an engine
 * worker, or the scheduler when it expires), which touches only its job and hands it back
 * through the completion list.
 */
#ifndef ATTND_SERVER_GRPC_H
#define ATTND_SERVER_GRPC_H

#include <nghttp2/nghttp2.h>
#include <pthread.h>

#include "server/daemon.h"
#include "server/job.h"

typedef struct srv_grpc srv_grpc;
typedef struct grpc_conn grpc_conn;
typedef struct grpc_call grpc_call;
typedef struct grpc_job grpc_job;

/* Bytes waiting to be written on a stream, in order. */
typedef struct grpc_chunk {
    struct grpc_chunk *next;
    const char *data; /* `bytes` below, or `owned` */
    size_t len, off;
    char *owned; /* a reply body handed over (eng_buf_free), or NULL */
    char bytes[];
} grpc_chunk;

/* A message of a stream waiting for the inference before it to finish. */
typedef struct grpc_msg {
    struct grpc_msg *next;
    char *data; /* eng_buf_alloc */
    size_t len, held;
} grpc_msg;

struct grpc_call {
    grpc_call *prev, *next; /* the connection's calls */
    grpc_conn *conn;
    int32_t stream_id;
    api_grpc_method method;
    char path[128];
    char id[40]; /* for the log line: "<connection>-<stream>" */
    bool auth_seen, auth_ok, bad_content_type;
    size_t header_bytes;
    int64_t timeout_ms; /* grpc-timeout; 0: none; -1: malformed */
    api_lease lease;    /* the messages' bytes as they arrive; its deadline is the call's */
    api_grpc_reader reader;
    srv_upload upload;     /* an inference's message being read, in the upload meter (upload.h) */
    int64_t recv_since_ns; /* the call's start, or the first byte of the message being read */
    grpc_msg *queue, *queue_tail; /* messages not yet served (ModelStreamInfer) */
    size_t messages;              /* messages read so far */
    grpc_job *job;                /* the inference in flight, or NULL */
    grpc_chunk *out, *out_tail;   /* response bytes not yet handed to nghttp2 */
    bool half_closed;             /* the client sent END_STREAM */
    bool response_started;        /* response HEADERS submitted */
    bool finished;                /* the status is decided: trailers follow the data */
    bool deferred;                /* the data source is waiting for bytes */
    int grpc_status;
    char grpc_message[240];
    int http_status; /* what the log and metrics count (200 or the failure's) */
    api_reason reason;
    uint64_t bytes_in, bytes_out;
    int64_t queue_ns;         /* the last inference's wait for a worker */
    api_reply last;           /* timings of the last reply, for the log line (body freed) */
    srv_sched_entry answered; /* a unary call's inference, to tell the scheduler its sending */
    int64_t answered_ns;      /* when that inference's worker ended; 0: none ran */
    bool counted;             /* active (s->active) counted */
};

struct grpc_job {
    grpc_job *next;  /* the completion list */
    grpc_call *call; /* NULL once the stream is gone: the reply is dropped */
    srv_grpc *g;
    srv_job job;     /* its admission, wait and run, beside HTTP's requests (job.h) */
    api_lease lease; /* the inference's memory, deadline and cancel flag */
    grpc_msg msg;
    api_call api; /* what a batch serves it with, while its batch runs */
    bool stream;
    int slot;               /* the model's statistics slot, or -1 */
    bool pending;           /* counted in the model's pending gauge */
    int64_t own_timeout_ms; /* the message's own timeout when it set the deadline, else 0 */
    api_reply reply;
};

struct grpc_conn {
    grpc_conn *prev, *next;
    srv_grpc *g;
    int fd;
    uint64_t number;
    nghttp2_session *session;
    gnutls_session_t tls;  /* NULL: h2c */
    bool handshaken;       /* TLS: the handshake finished with ALPN h2 */
    int64_t last_io_ns;    /* the last byte read or written */
    int64_t stalled_since; /* there were bytes to write that the socket would not take */
    char *wbuf;            /* frames collected from nghttp2, written from woff to wlen */
    size_t wlen, woff, wcap;
    grpc_call *calls; /* open streams with a call */
    bool goaway_sent;
    bool dead; /* close at the end of this loop turn */
};

struct srv_grpc {
    srv_server *s;
    int listen_fd, wake_fd; /* wake_fd: an eventfd the workers and the main thread write */
    int port;
    pthread_t thread;
    bool started;
    atomic_bool stop;
    grpc_conn *conns;
    size_t n_conns, max_conns;
    uint64_t conn_counter;
    int64_t receive_timeout_ns;
    pthread_mutex_t done_lock;
    grpc_job *done; /* finished jobs for the gRPC thread */
    bool goaway;    /* the drain's GOAWAY went out */
};

/* Starts the listener on cfg->host:cfg->grpc_port and its thread (*out NULL when the port is
 * -1). SRV_EIO with `err` when it cannot listen. Main thread. */
srv_status srv__grpc_start(srv_server *s, const srv_config *cfg, srv_grpc **out, char *err,
                           size_t errlen);
int srv__grpc_port(const srv_grpc *g);
/* Stops the thread and closes every connection (calls in flight are cancelled); their jobs
 * are finished by the pool. Then, after eng_pool_free, srv__grpc_free frees what is left. */
void srv__grpc_stop(srv_grpc *g);
void srv__grpc_free(srv_grpc *g);

/* grpc_write.c, for grpc_call.c and grpc_conn.c: srv__grpc_send queues `len` bytes for the
 * call's stream, and srv__grpc_finish ends it with the call's status (trailers; trailers-only
 * when no data went out). */
void srv__grpc_send(grpc_call *call, const void *data, size_t len);
/* srv__grpc_send of a body from eng_buf_alloc, taken over without a copy. */
void srv__grpc_send_owned(grpc_call *call, char *body, size_t len);
/* Frees a chunk and what it owns. */
void srv__grpc_chunk_free(grpc_chunk *c);
void srv__grpc_finish(grpc_call *call, int http_status, api_reason reason, const char *message);
/* srv__grpc_finish with server/'s own outcome `o`: its status from the outcome table (outcome.h),
 * as HTTP's refusals take theirs. */
void srv__grpc_finish_as(grpc_call *call, srv_outcome o, const char *message);
/* Wakes the thread (a job finished, the stop, the drain began or expired); NULL is a no-op.
 * Any thread. */
void srv__grpc_wake(srv_grpc *g);

/* grpc_call.c, for grpc_conn.c: a stream's events and the completion of its jobs. */
grpc_call *srv__grpc_call_new(grpc_conn *conn, int32_t stream_id);
/* -1: the header block is past its cap (the stream is reset). */
int srv__grpc_call_header(grpc_call *call, const uint8_t *name, size_t namelen,
                          const uint8_t *value, size_t valuelen);
void srv__grpc_call_headers_done(grpc_call *call);
void srv__grpc_call_data(grpc_call *call, const uint8_t *data, size_t len);
void srv__grpc_call_end_stream(grpc_call *call);
/* The stream closed (done, reset or the connection went): cancels its job, logs, frees. */
void srv__grpc_call_closed(grpc_call *call, uint32_t error_code);
/* Takes the finished jobs off the completion list and answers their calls. */
void srv__grpc_jobs_done(srv_grpc *g);
/* Cancels every job in flight (the drain timeout passed). */
void srv__grpc_cancel_all(srv_grpc *g);

#endif
