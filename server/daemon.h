/*
 * daemon.h - the state of one running daemon (srv_server): its settings, fixed after the start,
 * the shared resources (budget, pool, listeners, watcher, TLS, tokens), and the counters that
 * admission, the handlers and /metrics read. Created and freed by server.c; http.c admits and
 * answers requests with it; route handlers read it.
 *
 * Threads of a running daemon:
 *   main     parses the config, starts everything, waits for a signal, runs the drain;
 *   I/O      libmicrohttpd's epoll threads (--io-threads on --port, one on --admin-port): each
 *            owns its connections, and every callback of http.c for a connection runs on that
 *            connection's thread, so that the callbacks of different connections run at once
 *            (everything they share here is atomic or behind its owner's lock);
 *   watcher  watch.c: polls the sockets of suspended requests for a hang-up, enforces the
 *            receive deadline of slow clients and the queue deadline, applies the drain timeout;
 *   workers  the engine pool: decode, compute and encode one request each (job.c's job_run).
 */
#ifndef ATTND_SERVER_DAEMON_H
#define ATTND_SERVER_DAEMON_H

#include <microhttpd.h>
#include <stdatomic.h>

#include "api/api.h"
#include "engine/engine.h"
#include "server/admission.h"
#include "server/auth.h"
#include "server/batch.h"
#include "server/metrics.h"
#include "server/tls.h"
#include "server/upload.h"
#include "server/watch.h"

struct srv_server {
    /* Settings, fixed after start (srv__config_settings, but for the bound ports and threads). */
    char *host;
    int port;
    int threads;
    int io_threads; /* libmicrohttpd's threads on --port (--io-threads, resolved) */
    size_t max_body_bytes;
    int64_t max_queue;
    int64_t request_timeout_ns, idle_timeout_ns, drain_timeout_ns;
    unsigned send_timeout_s, idle_timeout_s; /* libmicrohttpd's idle timer while a reply is
                                                written, and otherwise */
    size_t max_memory_bytes;
    api_limits limits;
    api_models *models; /* the registered layers: built before listening, read-only after */

    api_budget *budget;
    eng_pool *pool;
    srv_sched *sched;          /* admitted requests until a worker starts them (admission.h) */
    srv_uploads *uploads;      /* the bodies on their way and how fast they arrive (upload.h) */
    uint64_t max_upload_bytes; /* --max-upload-bytes, resolved */
    srv_batcher *batcher;      /* the lanes of jobs that may share engine calls; NULL: off */
    int64_t max_batch_rows;    /* --max-batch-rows: input rows of one engine call of a batch */
    api_sessions *sessions;    /* the KV-cache sessions; NULL: --kv-cache-bytes 0 */
    struct MHD_Daemon *mhd;
    int quiesced_fd;              /* the listening socket the drain took back, or -1 */
    struct MHD_Daemon *admin_mhd; /* --admin-port's listener, or NULL */
    int admin_port;
    srv_metrics metrics;
    srv_watch *watch; /* the watcher thread and the connection list (watch.c) */

    atomic_bool draining;      /* readiness 503, new requests 503 */
    atomic_bool drain_expired; /* the drain timeout passed: cancel what is left */
    /* The jobs of both edges; only job.c changes these three. */
    atomic_int_fast64_t active;    /* requests between the URI callback and completion */
    atomic_int_fast64_t admitted;  /* jobs waiting or running (--max-queue) */
    atomic_int_fast64_t queued;    /* jobs waiting for a worker, not yet answered */
    atomic_int_fast64_t running;   /* jobs a worker is running */
    atomic_int_fast64_t suspended; /* connections suspended and not yet resumed */
    atomic_int_fast64_t admitting; /* HTTP requests between their body's end and admission */
    uint64_t id_seed;
    atomic_uint_fast64_t id_counter;

    struct srv_grpc *grpc; /* --grpc-port's listener and thread (grpc.h), or NULL */

    srv_tls *tls;   /* NULL: plain HTTP */
    srv_auth *auth; /* NULL: no bearer tokens */
};

/* config.c: fills the settings of `s` that come from `cfg` alone (the host, the limits api/
 * checks requests against with the precision and priority level of those that name none, the
 * queue and batch bounds, the timeouts in the units their users count in). `cfg` is one
 * srv_config_parse accepted: the checks across options are its. SRV_ENOMEM when the host
 * cannot be copied. Main thread, before anything starts. */
srv_status srv__config_settings(const srv_config *cfg, srv_server *s);

#endif
