/*
 * server.c - the daemon's life cycle: start (budget, engine pool, watcher, libmicrohttpd),
 * graceful drain, and stop.
 *
 * Drain order matters. Readiness turns 503 first (a flag read by /v2/health/ready and by
 * admission), then libmicrohttpd stops accepting and the listening socket is shut down so new
 * connections are refused at once instead of waiting in the backlog (closed only once
 * libmicrohttpd's threads are joined: each may still take it out of its epoll set). Requests
 * in flight get up to --drain-timeout-s; then the watcher answers queued ones 503 and cancels
 * running ones, whose workers notice at the next block boundary. MHD_stop_daemon must never run
 * while a connection is suspended, so the drain returns only once every suspended connection has
 * been resumed.
 */
#include "server/daemon.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server/grpc.h"
#include "server/http.h"
#include "server/log.h"
#include "server/request.h"
#include "server/security.h"

static void sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static uint64_t random_seed(void)
{
    uint64_t seed = 0;
    if (getrandom(&seed, sizeof seed, GRND_NONBLOCK) != (ssize_t)sizeof seed)
        seed = (uint64_t)eng_now_ns() ^ ((uint64_t)getpid() << 32);
    return seed;
}

/* Writes the port to `path` atomically (a temporary file, then rename), so that a reader never
 * sees a partial number. */
static srv_status write_port_file(const char *path, int port)
{
    char tmp[4200];
    FILE *f;
    int n = snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (n < 0 || (size_t)n >= sizeof tmp)
        return SRV_EINVAL;
    f = fopen(tmp, "w");
    if (!f)
        return SRV_EIO;
    fprintf(f, "%d\n", port);
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        unlink(tmp);
        return SRV_EIO;
    }
    return SRV_OK;
}

api_models *srv_models_load(const srv_config *cfg, char *err, size_t errlen)
{
    /* The kernel set first: a layer packs its matrices for the set in force when it is made
     * (engine.h eng_layer.panels_*), and a call on another set would ignore them. A set this
     * CPU lacks leaves auto in force here; srv_server_start_models reports it (exit 1). */
    (void)eng_init(&cfg->engine, NULL);
    api_models *models = api_models_new();
    if (!models) {
        snprintf(err, errlen, "out of memory for the built-in demo layer");
        return NULL;
    }
    for (size_t i = 0; i < cfg->n_models; i++) {
        const srv_model *m = &cfg->models[i];
        api_model_source src = {.name = m->name,
                                .path = m->path,
                                .layer = m->layer,
                                .heads = m->heads,
                                .kv_heads = m->kv_heads};
        char why[512];
        int64_t t0 = eng_now_ns();
        const api_model *model = api_models_load(models, &src, why, sizeof why);
        if (!model) {
            /* The message names the file and the tensor or config field. */
            snprintf(err, errlen, "--model %s: %s", m->name, why);
            api_models_free(models);
            return NULL;
        }
        api_model_summary(model, why, sizeof why);
        srv_log(SRV_LOG_INFO,
                "loaded model %s from %s: %s; embed_dim %lld, %lld parameters in %.1f ms",
                model->name, m->path, why, (long long)model->layer[0]->embed_dim,
                (long long)api_model_params(model), (double)(eng_now_ns() - t0) / 1e6);
    }
    return models;
}

/* libmicrohttpd's memory per connection, about half of which it reads a body into per call:
 * enough for reads of over 100 KiB (larger ones saved the I/O threads no more time), and no more,
 * since a connection holds all of it once it has served a request (libmicrohttpd clears it for
 * the next one). */
#define CONNECTION_MEMORY ((size_t)256 * 1024)

/* Connections --admin-port takes at once: a few probes and scrapers, never the traffic. */
#define ADMIN_CONNECTIONS 64u

/* Raises the soft descriptor limit (RLIMIT_NOFILE) to the hard one when it is too low for
 * --connection-limit: containers often start with 1024, and a connection beyond the
 * descriptors would fail at accept() instead of waiting for a slot. Best effort: a limit that
 * stays too low is logged. */
static void raise_fd_limit(const srv_config *cfg)
{
    struct rlimit rl;
    rlim_t need = (rlim_t)cfg->connection_limit + ADMIN_CONNECTIONS + 256;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= need)
        return;
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > need ? need : rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur < need)
        srv_log(SRV_LOG_WARN,
                "the descriptor limit (%llu) is below --connection-limit %lld plus a margin: "
                "raise ulimit -n",
                (unsigned long long)rl.rlim_cur, (long long)cfg->connection_limit);
}

/* One listener: its port (0: ephemeral), how many connections it takes, its threads, its TLS
 * (NULL: plain), the option naming the port in errors, and whether it is --admin-port's. */
typedef struct {
    int port;
    unsigned limit;
    unsigned threads;
    srv_tls *tls;
    const char *flag;
    bool admin;
} listener_spec;

/* Starts a libmicrohttpd listener on cfg->host as `ls` says, and stores its bound port in
 * *bound. NULL on failure, with `err` filled. */
static struct MHD_Daemon *start_listener(srv_server *s, const srv_config *cfg,
                                         const listener_spec *ls, int *bound, char *err,
                                         size_t errlen)
{
    const int port = ls->port;
    struct addrinfo hints, *ai = NULL;
    char port_str[16];
    unsigned flags;
    const union MHD_DaemonInfo *di;
    const struct MHD_OptionItem *tls_opts;
    /* libmicrohttpd warns about a pool of one thread: none is asked for then. */
    const struct MHD_OptionItem pool_opts[] = {
        {ls->threads > 1 ? MHD_OPTION_THREAD_POOL_SIZE : MHD_OPTION_END, ls->threads, NULL},
        {MHD_OPTION_END, 0, NULL}};
    struct MHD_Daemon *mhd;
    int rc;

    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    snprintf(port_str, sizeof port_str, "%d", port);
    rc = getaddrinfo(cfg->host, port_str, &hints, &ai);
    if (rc != 0 || !ai) {
        snprintf(err, errlen, "--host %s: %s", cfg->host, gai_strerror(rc));
        return NULL;
    }
    flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
            MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    tls_opts = srv__tls_options(ls->tls, &flags, err, errlen);
    if (!tls_opts) {
        freeaddrinfo(ai);
        return NULL;
    }
    /* The logger must be the first option, or libmicrohttpd prints the messages about the
     * options before it on its own. */
    mhd = MHD_start_daemon(
        flags, (uint16_t)port, NULL, NULL, srv__mhd_access, s, MHD_OPTION_EXTERNAL_LOGGER,
        srv__log_mhd, s, MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_CONNECTION_LIMIT, ls->limit,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->idle_timeout_s,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, CONNECTION_MEMORY, MHD_OPTION_URI_LOG_CALLBACK,
        ls->admin ? srv__mhd_uri_admin : srv__mhd_uri, s, MHD_OPTION_NOTIFY_COMPLETED,
        srv__mhd_completed, s, MHD_OPTION_NOTIFY_CONNECTION, srv__mhd_connection, s,
        MHD_OPTION_ARRAY, tls_opts, MHD_OPTION_ARRAY, pool_opts, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!mhd) {
        snprintf(err, errlen, "cannot listen on %s port %d (--host, %s): %s", cfg->host, port,
                 ls->flag, errno ? strerror(errno) : "see the log");
        return NULL;
    }
    di = MHD_get_daemon_info(mhd, MHD_DAEMON_INFO_BIND_PORT);
    *bound = di ? (int)di->port : port;
    return mhd;
}

/* What the engine computes with, once at start: the kernel set, the CPU, and the kernel
 * OpenBLAS chose for itself (the `openblas` set's, and a hint when it is a slow one). */
static void log_engine(void)
{
    eng_engine_info info;
    eng_engine_info_get(&info);
    srv_log(SRV_LOG_INFO,
            "engine kernels %s on %s (%s; L1d %zu KiB, L2 %zu KiB, blocks kc=%lld nc=%lld); "
            "bf16 products %s, projections' tiles %s; OpenBLAS core %s",
            info.kernels, info.cpu, info.features, info.l1d_bytes / 1024, info.l2_bytes / 1024,
            (long long)info.kc, (long long)info.nc, info.bf16, info.amx, info.openblas_core);
}

/* The watcher, with the deadlines it enforces and the counters it updates. */
static srv_status start_watcher(srv_server *s, const srv_config *cfg)
{
    srv_watch_config wc = {
        .header_timeout_ns = cfg->header_timeout_s * 1000000000,
        .receive_timeout_ns = cfg->receive_timeout_s * 1000000000,
        .idle_timeout_ns = s->idle_timeout_ns,
        .min_upload_rate = cfg->min_upload_rate,
        .metrics = &s->metrics,
        .drain_expired = &s->drain_expired,
    };
    return srv__watch_start(&wc, &s->watch);
}

/* The memory budget, the engine (its options, the pool with its spare worker, the KV-cache
 * sessions), the scheduler and the batcher. */
static srv_status start_engine(srv_server *s, const srv_config *cfg, char *err, size_t errlen)
{
    eng_error eerr;
    char why[160];

    eng_buf_cache_limit(cfg->buffer_cache_bytes);
    s->budget = api_budget_new(cfg->max_memory_bytes);
    if (!s->budget) {
        snprintf(err, errlen, "cannot create the memory budget (--max-memory-bytes)");
        return SRV_ENOMEM;
    }
    if (eng_init(&cfg->engine, &eerr) != ENG_OK) {
        snprintf(err, errlen, "engine options (--kernels, ATTND_BF16): %s", eerr.message);
        return SRV_EINVAL;
    }
    if (cfg->kv_cache_bytes > 0) {
        api_sessions_config sc = {.capacity_bytes = cfg->kv_cache_bytes,
                                  .block_tokens = cfg->kv_block_tokens,
                                  .ttl_s = cfg->session_ttl_s};
        s->sessions = api_sessions_new(&sc, err, errlen);
        if (!s->sessions)
            return SRV_ENOMEM;
    }
    log_engine();
    s->pool = eng_pool_new((int)cfg->threads, &eerr);
    if (!s->pool) {
        snprintf(err, errlen, "cannot start %lld engine workers (--threads): %s",
                 (long long)cfg->threads, eerr.message);
        return SRV_EIO;
    }
    /* Short requests need not wait for a task of a long one to end (docs/goodput.md). */
    if (eng_pool_add_spare(s->pool, &eerr) != ENG_OK) {
        snprintf(err, errlen, "cannot start the engine's spare worker: %s", eerr.message);
        return SRV_EIO;
    }
    /* ... nor for a CPU the long one's tasks hold (docs/goodput.md). */
    if (eng_pool_set_background(s->pool, srv__sched_pool_priority_long, why, sizeof why))
        srv_log(SRV_LOG_INFO, "long requests' fan-out runs at SCHED_IDLE (background work)");
    else
        srv_log(SRV_LOG_INFO, "long requests' fan-out runs at the workers' own priority: %s", why);
    s->threads = eng_pool_threads(s->pool);
    s->sched = srv__sched_new(s->threads);
    if (!s->sched) {
        snprintf(err, errlen, "cannot allocate the scheduler of %d workers", s->threads);
        return SRV_ENOMEM;
    }
    s->uploads = srv__uploads_new(s->max_upload_bytes);
    if (!s->uploads) {
        snprintf(err, errlen, "cannot allocate the meter of uploads (--max-upload-bytes)");
        return SRV_ENOMEM;
    }
    if (s->max_batch_rows > 1 &&
        !(s->batcher = srv__batcher_new((int)s->max_batch_rows, s->pool, srv__job_run_group, s))) {
        snprintf(err, errlen, "cannot allocate the batcher (--max-batch-rows %lld)",
                 (long long)s->max_batch_rows);
        return SRV_ENOMEM;
    }
    return SRV_OK;
}

/* TLS and the tokens, then the listeners: the serving port, the admin port and gRPC's. */
static srv_status start_listeners(srv_server *s, const srv_config *cfg, char *err, size_t errlen)
{
    if (srv__security_start(cfg, &s->tls, &s->auth, err, errlen) != SRV_OK)
        return SRV_EINVAL;
    raise_fd_limit(cfg);
    /* TLS and tokens guard the serving port; the admin port (probes, metrics) stays plain. */
    listener_spec serving = {
        (int)cfg->port, (unsigned)cfg->connection_limit, (unsigned)s->io_threads, s->tls, "--port",
        false};
    s->mhd = start_listener(s, cfg, &serving, &s->port, err, errlen);
    if (!s->mhd)
        return SRV_EIO;
    if (cfg->admin_port >= 0) {
        listener_spec admin = {
            (int)cfg->admin_port, ADMIN_CONNECTIONS, 1, NULL, "--admin-port", true};
        s->admin_mhd = start_listener(s, cfg, &admin, &s->admin_port, err, errlen);
        if (!s->admin_mhd)
            return SRV_EIO;
    }
    return srv__grpc_start(s, cfg, &s->grpc, err, errlen);
}

/* Writes a port file, naming its flag in `err` when it cannot. */
static srv_status port_file(const char *path, const char *flag, int port, char *err, size_t errlen)
{
    if (!path || write_port_file(path, port) == SRV_OK)
        return SRV_OK;
    snprintf(err, errlen, "%s %s: cannot write it: %s", flag, path, strerror(errno));
    return SRV_EIO;
}

/* Says where the daemon listens: the port files (--port-file last, since whoever waits for it
 * takes it as the readiness signal and then finds the others written), the log and stdout. */
static srv_status announce(const srv_server *s, const srv_config *cfg, char *err, size_t errlen)
{
    if (s->grpc) {
        if (port_file(cfg->grpc_port_file, "--grpc-port-file", srv__grpc_port(s->grpc), err,
                      errlen) != SRV_OK)
            return SRV_EIO;
        srv_log(SRV_LOG_INFO, "gRPC listener (KServe v2, %s) on %s port %d",
                s->tls ? "h2 (TLS, ALPN)" : "h2c", s->host, srv__grpc_port(s->grpc));
    }
    if (s->admin_mhd &&
        port_file(cfg->admin_port_file, "--admin-port-file", s->admin_port, err, errlen) != SRV_OK)
        return SRV_EIO;
    if (port_file(cfg->port_file, "--port-file", s->port, err, errlen) != SRV_OK)
        return SRV_EIO;
    if (s->admin_mhd)
        srv_log(SRV_LOG_INFO, "admin listener (health, metrics) on %s port %d", s->host,
                s->admin_port);
    srv_log(SRV_LOG_INFO,
            "listening on %s port %d with %d I/O threads and %d engine workers (max queue "
            "%lld, max body %zu bytes, memory budget %zu bytes)",
            s->host, s->port, s->io_threads, s->threads, (long long)s->max_queue, s->max_body_bytes,
            s->max_memory_bytes);
    if (strchr(s->host, ':'))
        printf("attnd listening on %s://[%s]:%d\n", s->tls ? "https" : "http", s->host, s->port);
    else
        printf("attnd listening on %s://%s:%d\n", s->tls ? "https" : "http", s->host, s->port);
    fflush(stdout);
    return SRV_OK;
}

srv_server *srv_server_start_models(const srv_config *cfg, api_models *models, char *err,
                                    size_t errlen)
{
    srv_server *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        api_models_free(models);
        return NULL;
    }
    s->models = models;
    s->quiesced_fd = -1;
    s->id_seed = random_seed();
    if (srv__config_settings(cfg, s) != SRV_OK) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    if (start_engine(s, cfg, err, errlen) != SRV_OK)
        goto fail;
    if (start_watcher(s, cfg) != SRV_OK) {
        snprintf(err, errlen, "cannot start the watcher thread: %s", strerror(errno));
        goto fail;
    }
    if (start_listeners(s, cfg, err, errlen) != SRV_OK || announce(s, cfg, err, errlen) != SRV_OK)
        goto fail;
    return s;

fail:
    srv_server_free(s);
    return NULL;
}

void srv_server_drain(srv_server *s, int wake_fd)
{
    int64_t deadline, last_note;
    MHD_socket lfd;

    atomic_store(&s->draining, true);
    srv_log(SRV_LOG_INFO,
            "draining: readiness is 503, no new connections; %lld requests in "
            "flight, up to %lld s to finish (--drain-timeout-s)",
            (long long)atomic_load(&s->active), (long long)(s->drain_timeout_ns / 1000000000));
    srv__grpc_wake(s->grpc); /* GOAWAY on its connections */
    lfd = MHD_quiesce_daemon(s->mhd);
    if (lfd != MHD_INVALID_SOCKET) {
        shutdown(lfd, SHUT_RDWR);
        s->quiesced_fd = lfd;
    }

    deadline = eng_now_ns() + s->drain_timeout_ns;
    while (atomic_load(&s->active) > 0 && eng_now_ns() < deadline) {
        struct pollfd p = {.fd = wake_fd, .events = POLLIN};
        if (wake_fd >= 0 && poll(&p, 1, 10) > 0 && (p.revents & POLLIN)) {
            char c;
            ssize_t r = read(wake_fd, &c, 1);
            (void)r;
            srv_log(SRV_LOG_WARN, "second signal: cancelling the requests in flight now");
            break;
        }
        if (wake_fd < 0)
            sleep_ms(10);
    }
    if (atomic_load(&s->active) > 0) {
        srv_log(SRV_LOG_WARN, "drain timeout: cancelling %lld requests in flight (answered 503)",
                (long long)atomic_load(&s->active));
        atomic_store(&s->drain_expired, true);
        srv__watch_wake(s->watch);
        srv__grpc_wake(s->grpc);
    }
    /* Cancelled work stops at the next block boundary; a decode or encode in progress runs to
     * its end. Waiting is the only safe option: stopping libmicrohttpd with a suspended
     * connection aborts the process. */
    last_note = eng_now_ns();
    while (atomic_load(&s->suspended) > 0) {
        sleep_ms(5);
        if (eng_now_ns() - last_note > INT64_C(5000000000)) {
            srv_log(SRV_LOG_WARN, "still waiting for %lld cancelled requests to stop",
                    (long long)atomic_load(&s->suspended));
            last_note = eng_now_ns();
        }
    }
    /* Give resumed connections a moment to write their replies. */
    deadline = eng_now_ns() + INT64_C(2000000000);
    while (atomic_load(&s->active) > 0 && eng_now_ns() < deadline)
        sleep_ms(5);
    srv_log(SRV_LOG_INFO, "drained");
}

void srv_server_free(srv_server *s)
{
    if (!s)
        return;
    if (s->mhd)
        MHD_stop_daemon(s->mhd);
    s->mhd = NULL;
    if (s->quiesced_fd >= 0)
        close(s->quiesced_fd);
    if (s->admin_mhd)
        MHD_stop_daemon(s->admin_mhd);
    s->admin_mhd = NULL;
    srv__watch_stop(s->watch);
    srv__grpc_stop(s->grpc);
    /* Runs what is still queued: only jobs the watcher already answered, which just drop
     * their reference. */
    eng_pool_free(s->pool);
    srv__grpc_free(s->grpc);        /* after the workers: the jobs they finished */
    srv__sched_free(s->sched);      /* after the workers, the last to give slots back */
    srv__uploads_free(s->uploads);  /* after the listeners: no body arrives */
    srv__batcher_free(s->batcher);  /* after the workers: every lane drained */
    api_sessions_free(s->sessions); /* after the workers: no step is running */
    eng_buf_cache_limit(0);
    api_budget_free(s->budget);
    api_models_free(s->models);
    srv__tls_free(s->tls);
    srv__auth_free(s->auth);
    free(s->host);
    free(s);
}
