/*
 * server.h - the attnd daemon: configuration, logging and the HTTP server's life cycle.
 *
 * server/ turns the engine and the api into a service. It owns everything that touches a socket:
 * libmicrohttpd (only this module includes <microhttpd.h>), routing, body accumulation with
 * caps, admission control, the suspend/resume handoff of each request to an engine worker,
 * deadlines, cancellation of work whose client hung up, metrics, request logs, configuration
 * from flags and environment, and the graceful drain on SIGTERM. The life of a request:
 * docs/architecture.md; flags, limits and drain: docs/operations.md.
 *
 * Usage (what main.c does):
 *
 *     srv_config cfg;
 *     char err[256];
 *     if (srv_config_parse(&cfg, argc, argv, err, sizeof err) != SRV_OK) {
 *         fprintf(stderr, "attnd: %s\n", err);           // names the offending flag
 *         return 2;
 *     }
 *     srv_log_set_level(cfg.log_level);
 *     api_models *models = srv_models_load(&cfg, err, sizeof err);   // exit 2 when NULL
 *     srv_server *s = srv_server_start_models(&cfg, models, err, sizeof err);  // listening
 *     if (!s) { ... }
 *     // ... wait for SIGTERM (the handler only writes a pipe) ...
 *     srv_server_drain(s, wake_fd); // readiness 503, stop accepting, finish or cancel
 *     srv_server_free(s);           // stops libmicrohttpd, joins the engine workers
 *     srv_config_free(&cfg);
 *
 * Threads: srv_config_*, srv_models_load and srv_server_start_models/drain/free are for the
 * main thread; srv_log may be called from any thread. Ownership: srv_server_start_models copies
 * what it needs from the config; strings in srv_config are owned by it until srv_config_free.
 */
#ifndef ATTND_SERVER_H
#define ATTND_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "engine/engine.h"

/* ---- Status codes -------------------------------------------------------------------------- */

/* X(name, description): one list so that codes and their strings cannot drift apart. */
#define SRV_STATUS_LIST(X)                                                                         \
    X(SRV_OK, "ok")                                                                                \
    X(SRV_EINVAL, "invalid configuration")                                                         \
    X(SRV_ENOMEM, "out of memory")                                                                 \
    X(SRV_ETOOBIG, "beyond a limit")                                                               \
    X(SRV_EIO, "system call failed")                                                               \
    X(SRV_HELP, "help requested")

typedef enum {
#define SRV_STATUS_ENUM(name, text) name,
    SRV_STATUS_LIST(SRV_STATUS_ENUM)
#undef SRV_STATUS_ENUM
} srv_status;

/* The fixed description of a status; never NULL. */
const char *srv_status_str(srv_status status);

/* ---- Logging ------------------------------------------------------------------------------- */

/* Severity, most severe first: a message is written when its level <= the configured level. */
typedef enum { SRV_LOG_ERROR = 0, SRV_LOG_WARN, SRV_LOG_INFO, SRV_LOG_DEBUG } srv_log_level;

void srv_log_set_level(srv_log_level level);
bool srv_log_enabled(srv_log_level level);

/* Writes one JSON line {"time", "level", "msg"} to stderr; `fmt` is printf-style and the
 * message is JSON-escaped. Any thread; lines never interleave. */
void srv_log(srv_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- Configuration ------------------------------------------------------------------------- */

/* A model to register at start-up (--model NAME=PATH[:heads=N[:kv_heads=M]], or
 * NAME=DIR[:layer=K] for a Hugging Face checkpoint directory). */
typedef struct {
    char *name;
    char *path;
    int64_t heads, kv_heads; /* 0: from the file's __metadata__ */
    int64_t layer;           /* the checkpoint's one layer; -1: not given (every layer) */
} srv_model;

/* Every option of the daemon; see the table in config.c for bounds, defaults and help. */
typedef struct {
    char *host;                      /* --host: address to bind */
    int64_t port;                    /* --port: 0 = an ephemeral port */
    char *port_file;                 /* --port-file: write the bound port here once listening */
    int64_t threads;                 /* --threads: engine workers, 0 = CPUs this process may use */
    int64_t io_threads;              /* --io-threads: libmicrohttpd's threads on --port, 0 = auto */
    eng_options engine;              /* --kernels, ATTND_BF16 */
    eng_precision default_precision; /* --default-precision */
    size_t max_body_bytes;           /* --max-body-bytes */
    int64_t max_elements;            /* --max-elements */
    size_t max_memory_bytes;         /* --max-memory-bytes: the global budget */
    size_t max_upload_bytes;         /* --max-upload-bytes: body bytes on their way; 0 = auto */
    size_t buffer_cache_bytes;       /* --buffer-cache-bytes: freed big buffers kept mapped */
    size_t kv_cache_bytes;           /* --kv-cache-bytes: the KV-cache sessions' pool; 0: off */
    int64_t kv_block_tokens;         /* --kv-block-tokens: tokens per KV-cache block */
    int64_t session_ttl_s;           /* --session-ttl-s: idle expiry of a session (0: none) */
    int64_t max_queue;               /* --max-queue: requests queued or running on workers */
    int64_t max_batch_rows;          /* --max-batch-rows: rows of a batch's engine call; 1: off */
    int64_t priority_levels;         /* --priority-levels: Triton's priority_levels */
    int64_t default_priority_level;  /* --default-priority-level, in [1, priority_levels] */
    int64_t request_timeout_ms;      /* --request-timeout-ms */
    int64_t header_timeout_s;  /* --header-timeout-s: request line to the end of the headers */
    size_t min_upload_rate;    /* --min-upload-rate: body bytes per second, 0 = none */
    int64_t receive_timeout_s; /* --receive-timeout-s: whole header and body */
    int64_t connection_limit;  /* --connection-limit */
    int64_t admin_port;        /* --admin-port: -1 = none, 0 = an ephemeral port */
    char *admin_port_file;     /* --admin-port-file */
    int64_t grpc_port;         /* --grpc-port: -1 = none, 0 = an ephemeral port */
    char *grpc_port_file;      /* --grpc-port-file */
    int64_t send_timeout_s;    /* --send-timeout-s: a reply stalled this long is cut */
    int64_t idle_timeout_s;    /* --idle-timeout-s */
    int64_t drain_timeout_s;   /* --drain-timeout-s */
    srv_model *models;         /* --model NAME=PATH[:heads=N[:kv_heads=M]], repeatable */
    size_t n_models;
    srv_log_level log_level;     /* --log-level */
    char *tls_cert;              /* --tls-cert: PEM chain, leaf first; with --tls-key: HTTPS */
    char *tls_key;               /* --tls-key: PEM private key */
    char *tls_key_password_file; /* --tls-key-password-file: the key's password */
    char *tls_priorities;        /* --tls-priorities: GnuTLS priority string */
    char *tls_client_ca;         /* --tls-client-ca: PEM CA(s) client certificates must chain to */
    char *auth_token_file;       /* --auth-token-file: bearer tokens, one per line */
} srv_config;

/* Fills `cfg` from defaults, then the ATTND_<NAME> environment variables, then argv (a flag
 * wins over its environment mirror). Flags are "--name value" or "--name=value". On failure
 * returns SRV_EINVAL with `err` naming the flag or variable and the accepted values, and leaves
 * `cfg` freed; "--help" returns SRV_HELP. Sizes are whole bytes, optionally followed by KiB,
 * MiB, GiB, TiB or their one-letter forms K, M, G, T (binary: K = KiB = 1024). --model is
 * parsed and stored here (the files are read by srv_models_load). The checks across options
 * are made here too: --default-priority-level within --priority-levels, --tls-cert with
 * --tls-key, --tls-client-ca and --tls-key-password-file with both. Main thread only (getenv). */
srv_status srv_config_parse(srv_config *cfg, int argc, char **argv, char *err, size_t errlen);

/* Frees the strings of `cfg`; safe on a zeroed or already freed config. */
void srv_config_free(srv_config *cfg);

/* Writes --help: every flag with its argument, default, bounds and environment variable. */
void srv_config_usage(FILE *out);

/* `attnd --healthcheck`: GET /v2/health/ready within `timeout_ms`. With an admin listener
 * (cfg->admin_port set) it asks that one in plain HTTP, on the port in cfg->admin_port_file
 * when that file holds one, else cfg->admin_port; otherwise the serving port, over TLS when
 * cfg->tls_cert is set, on the port in cfg->port_file when that file holds one (so that a
 * container's HEALTHCHECK, which shares the environment but not the command line, follows a
 * --port flag), else cfg->port. A wildcard host is probed on loopback. Returns the exit status:
 * 0 when the daemon answers 200, 1 otherwise (with a line on stderr). */
int srv_healthcheck(const srv_config *cfg, int timeout_ms);

/* Parses a size such as "256MiB", "64K" or "1048576" into *out. SRV_OK or SRV_EINVAL. */
srv_status srv_parse_size(const char *text, uint64_t *out);

/* ---- The server ---------------------------------------------------------------------------- */

typedef struct srv_server srv_server;
struct api_models;

/* Loads every --model of `cfg` (safetensors, validated in full) into a registry that also holds
 * the built-in "demo" layer. NULL on failure, with `err` naming the flag, the file and the
 * tensor: a configuration error (attnd exits 2). Main thread. */
struct api_models *srv_models_load(const srv_config *cfg, char *err, size_t errlen);

/* Starts the server with `models` (from srv_models_load; taken over, also on failure): the
 * engine pool, the watcher thread, libmicrohttpd on cfg->host:cfg->port (and the admin and gRPC
 * listeners when set); writes the port files, prints the startup line (address and bound port)
 * on stdout. NULL on failure with `err` filled (attnd exits 1). */
srv_server *srv_server_start_models(const srv_config *cfg, struct api_models *models, char *err,
                                    size_t errlen);

/* Loads what --tls-* and --auth-token-file name and lets it go again, so that a certificate,
 * key or token file that cannot be used is a configuration error (attnd exits 2) found before
 * the server starts. SRV_OK, or SRV_EINVAL with `err` naming the flag and the file. */
srv_status srv_security_check(const srv_config *cfg, char *err, size_t errlen);

/* SIGHUP: reads --auth-token-file and the TLS certificate and key again. New requests and
 * handshakes use them; a file that cannot be used is logged and its previous content stays in
 * force. Main thread. */
void srv_server_reload(srv_server *s);

/* Graceful drain: readiness turns 503 at once, the listener stops accepting, and requests in
 * flight run to completion for up to --drain-timeout-s; past it, remaining work is cancelled and
 * answered 503. Returns once no connection is suspended, so srv_server_free may stop the
 * daemon. `wake_fd`, when >= 0, is polled too: a byte there (a second signal) ends the grace
 * period at once. Main thread. */
void srv_server_drain(srv_server *s, int wake_fd);

/* Stops libmicrohttpd, the watcher and the engine pool and frees everything. Call after
 * srv_server_drain (never with suspended connections). NULL is a no-op. Main thread. */
void srv_server_free(srv_server *s);

#endif
