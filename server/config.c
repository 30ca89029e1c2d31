/*
 * config.c - the daemon's options: one table row per option, parsed from defaults, then the
 * environment, then the command line.
 *
 * Every option is a row of `options` below (name, environment mirror, type, bounds, default,
 * accepted values, help), Redis-style: parsing, validation and --help are all driven by the
 * table, so an option cannot be documented with one default and run with another, nor accept a
 * value its help does not list. Defaults are written as text and go through the same parser as
 * user input; tests/server/test_config.c checks that each one parses and lies within its bounds.
 * A variable without a flag (ATTND_BF16, a knob for tests and benchmarks more than for
 * operators) is a row too, so that --help lists every knob from this one table. The engine's
 * options are parsed here into eng_options, which the server hands to eng_init: the engine
 * reads no environment. Named values (--kernels, --default-precision, ATTND_BF16) take their
 * names from the engine's lists, so that no other file parses them again.
 *
 * Checks across options are made here too, at parse time (exit 2); srv__config_settings then
 * turns an accepted configuration into the settings the server runs with (server.c starts
 * things, it checks nothing).
 */
#include "server/daemon.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

typedef enum {
    OPT_STR,   /* char *, any non-empty text */
    OPT_INT,   /* int64_t within [min, max] */
    OPT_SIZE,  /* size_t within [min, max]: bytes, or KiB, MiB, GiB, TiB (srv_parse_size) */
    OPT_ENUM,  /* an enum (int-sized, see below): the index of its name in `choices` */
    OPT_MODEL, /* NAME=PATH, repeatable, appended to models[] */
} opt_type;

typedef struct {
    const char *name; /* the flag without its leading "--"; NULL: a variable without a flag */
    const char *env;  /* environment mirror */
    opt_type type;
    size_t offset; /* of the field in srv_config */
    int64_t min, max;
    const char *def; /* default, as text; NULL: none (OPT_STR may stay NULL, OPT_MODEL empty) */
    const char *arg; /* placeholder shown by --help */
    const char *help;
    const char *const *choices; /* the accepted values, NULL-terminated (OPT_ENUM);
                                   NULL for the other types */
} srv_option;

#define GiB        (INT64_C(1) << 30)
#define OFF(field) offsetof(srv_config, field)

/* OPT_ENUM stores a name's index through an int: the enum types it fills must be int-sized
 * (their values all lie in [0, INT_MAX], so int and the enum's own type alias). */
_Static_assert(sizeof(srv_log_level) == sizeof(int), "OPT_ENUM field");
_Static_assert(sizeof(eng_kernel_choice) == sizeof(int), "OPT_ENUM field");
_Static_assert(sizeof(eng_bf16_path) == sizeof(int), "OPT_ENUM field");
_Static_assert(sizeof(eng_precision) == sizeof(int), "OPT_ENUM field");

#define ENGINE_NAME(value, name) name,
/* In the order of the engine's enums (engine.h), from the same lists. */
static const char *const kernel_sets[] = {ENG_KERNEL_CHOICE_LIST(ENGINE_NAME) NULL};
static const char *const bf16_paths[] = {ENG_BF16_PATH_LIST(ENGINE_NAME) NULL};
static const char *const precisions[] = {ENG_PRECISION_LIST(ENGINE_NAME) NULL};
#undef ENGINE_NAME
/* In srv_log_level's order. */
static const char *const level_names[] = {"error", "warn", "info", "debug", NULL};

/* clang-format off */
static const srv_option options[] = {
    {"host", "ATTND_HOST", OPT_STR, OFF(host), 0, 0, "127.0.0.1", "ADDR",
     "address to listen on (IPv4 or IPv6 literal, or a name)", NULL},
    {"port", "ATTND_PORT", OPT_INT, OFF(port), 0, 65535, "8080", "N",
     "TCP port; 0 picks an ephemeral port (see --port-file)", NULL},
    {"port-file", "ATTND_PORT_FILE", OPT_STR, OFF(port_file), 0, 0, NULL, "PATH",
     "once listening, write the bound port to this file (for tests and supervisors)", NULL},
    {"threads", "ATTND_THREADS", OPT_INT, OFF(threads), 0, 1024, "0", "N",
     "engine worker threads; 0 = the CPUs this process may use (affinity, cgroup quota)", NULL},
    {"io-threads", "ATTND_IO_THREADS", OPT_INT, OFF(io_threads), 0, 64, "0", "N",
     "libmicrohttpd threads that read and write --port's connections, each with its own share "
     "of --connection-limit; 0 = the CPUs this process may use, at most 4; 1 = one thread",
     NULL},
    {"kernels", "ATTND_KERNELS", OPT_ENUM, OFF(engine.kernels), 0, 0, "auto", "SET",
     "the engine's kernel set: auto (the best this CPU and OS run), avx512, avx2, generic "
     "(portable C) or openblas; a set the CPU lacks stops the start (exit 1)", kernel_sets},
    {"default-precision", "ATTND_DEFAULT_PRECISION", OPT_ENUM, OFF(default_precision), 0, 0,
     "float32", "NAME", "precision of the products for requests that do not say "
     "(\"precision\" on /v1/attention, the v2 sdpa parameter): float32, or bfloat16 (bf16 "
     "operands, fp32 sums and softmax; the openblas kernel set computes float32)", precisions},
    {"max-body-bytes", "ATTND_MAX_BODY_BYTES", OPT_SIZE, OFF(max_body_bytes), 1, 16 * GiB,
     "256MiB", "SIZE", "largest request body; larger ones get 413 (from Content-Length, or "
     "once a chunked body passes it)", NULL},
    {"max-elements", "ATTND_MAX_ELEMENTS", OPT_INT, OFF(max_elements), 1, INT64_C(1) << 40,
     "268435456", "N", "most tensor elements in one request (inputs and outputs); beyond: 413", NULL},
    {"max-memory-bytes", "ATTND_MAX_MEMORY_BYTES", OPT_SIZE, OFF(max_memory_bytes), 1 << 20,
     INT64_C(1) << 50, "4GiB", "SIZE", "memory budget shared by all requests (bodies, "
     "tensors, scratch); a request that can never fit gets 413, one that cannot fit now 429", NULL},
    {"max-upload-bytes", "ATTND_MAX_UPLOAD_BYTES", OPT_SIZE, OFF(max_upload_bytes), 0,
     INT64_C(1) << 50, "0", "SIZE", "body bytes still to arrive on all connections at once (HTTP "
     "bodies, gRPC inference messages): one whose Content-Length or gRPC length prefix would pass "
     "it while others arrive gets 429 (RESOURCE_EXHAUSTED) before it is read; 0 = a quarter of "
     "--max-memory-bytes", NULL},
    {"buffer-cache-bytes", "ATTND_BUFFER_CACHE_BYTES", OPT_SIZE, OFF(buffer_cache_bytes), 0,
     INT64_C(1) << 50, "256MiB", "SIZE", "freed request buffers of 1 MiB and more kept mapped "
     "for the next requests (fresh pages cost about 0.3 ms per MiB to fault in), on top of "
     "--max-memory-bytes; released after 10 s unused; 0 keeps none", NULL},
    {"kv-cache-bytes", "ATTND_KV_CACHE_BYTES", OPT_SIZE, OFF(kv_cache_bytes), 0,
     INT64_C(1) << 50, "1GiB", "SIZE", "the KV cache of the sessions (/v1/sessions, v2 "
     "sequence_id): one pool of paged blocks, a budget of its own next to --max-memory-bytes "
     "(which the steps' tensors and scratch count against); a full pool evicts the least "
     "recently used idle session; 0 turns sessions off (their routes answer 501)", NULL},
    {"kv-block-tokens", "ATTND_KV_BLOCK_TOKENS", OPT_INT, OFF(kv_block_tokens), 1, 65536, "64",
     "N", "tokens per KV-cache block (multiples of 32 let prefills prepack); a session's "
     "last block is what it may waste", NULL},
    {"session-ttl-s", "ATTND_SESSION_TTL_S", OPT_INT, OFF(session_ttl_s), 0, INT64_C(1) << 31,
     "600", "S", "a session idle this long is freed (its id then answers 404 session_evicted); "
     "a session's own \"ttl_s\" overrides it; 0: never", NULL},
    {"max-queue", "ATTND_MAX_QUEUE", OPT_INT, OFF(max_queue), 1, 1000000, "64", "N",
     "requests queued or running on the engine at once; beyond: 429 with Retry-After", NULL},
    {"max-batch-rows", "ATTND_MAX_BATCH_ROWS", OPT_INT, OFF(max_batch_rows), 1, 65536, "64",
     "N", "dynamic batching: layer passes of one model that wait while the engine is busy run "
     "as one engine call (the weights read once) of at most N input rows; 1 runs every request "
     "alone", NULL},
    {"priority-levels", "ATTND_PRIORITY_LEVELS", OPT_INT, OFF(priority_levels), 1, 255, "2",
     "N", "Triton's priority_levels: a v2 request with parameters.priority P in [1, N] waits "
     "ahead of every request with a larger P (1 is the most urgent), in arrival order within a "
     "level; P above N is 400; 0 or none means --default-priority-level; native /v1 routes "
     "always run at the default level", NULL},
    {"default-priority-level", "ATTND_DEFAULT_PRIORITY_LEVEL", OPT_INT,
     OFF(default_priority_level), 1, 255, "2", "N", "Triton's default_priority_level: the "
     "level of requests that name none, in [1, --priority-levels]", NULL},
    {"request-timeout-ms", "ATTND_REQUEST_TIMEOUT_MS", OPT_INT, OFF(request_timeout_ms), 1,
     INT64_C(86400000), "60000", "MS", "deadline of a request from its arrival, queue and "
     "compute included (a request's \"timeout_ms\" may only shorten it); a miss gets 504", NULL},
    {"header-timeout-s", "ATTND_HEADER_TIMEOUT_S", OPT_INT, OFF(header_timeout_s), 1, 86400,
     "10", "S", "time a client has to send its headers once its request line arrives, and a "
     "new connection its first request line; slower clients are disconnected (a connection "
     "trickling its request line or headers holds a slot only this long)", NULL},
    {"min-upload-rate", "ATTND_MIN_UPLOAD_RATE", OPT_SIZE, OFF(min_upload_rate), 0,
     INT64_C(1) << 40, "1KiB", "BYTES", "bytes per second a body must average, counted from "
     "--header-timeout-s after its request line; slower uploads are disconnected; 0: none", NULL},
    {"receive-timeout-s", "ATTND_RECEIVE_TIMEOUT_S", OPT_INT, OFF(receive_timeout_s), 1, 86400,
     "60", "S", "time a client has to send the whole request (headers and body) once its "
     "request line arrives; slower clients are disconnected", NULL},
    {"connection-limit", "ATTND_CONNECTION_LIMIT", OPT_INT, OFF(connection_limit), 1, 1000000,
     "4096", "N", "open client connections on --port at once (attnd raises its descriptor "
     "limit to fit); beyond it new connections are not refused: they wait in the kernel's "
     "listen backlog until one closes, and are refused only once the backlog is full", NULL},
    {"admin-port", "ATTND_ADMIN_PORT", OPT_INT, OFF(admin_port), -1, 65535, "-1", "N",
     "a second listener serving only /v2/health/live, /v2/health/ready and /metrics, with its "
     "own 64 connections, so that probes and scrapes answer while --port is saturated; 0 picks "
     "an ephemeral port (see --admin-port-file); -1: none", NULL},
    {"admin-port-file", "ATTND_ADMIN_PORT_FILE", OPT_STR, OFF(admin_port_file), 0, 0, NULL,
     "PATH", "once listening, write the bound --admin-port to this file", NULL},
    {"grpc-port", "ATTND_GRPC_PORT", OPT_INT, OFF(grpc_port), -1, 65535, "-1", "N",
     "serve KServe v2 over gRPC (inference.GRPCInferenceService over HTTP/2; TLS with ALPN h2 "
     "when --tls-cert is set) on this port too, with the same models, limits, tokens and "
     "metrics (docs/grpc.md); 0 picks an "
     "ephemeral port (see --grpc-port-file); -1 (the default): off", NULL},
    {"grpc-port-file", "ATTND_GRPC_PORT_FILE", OPT_STR, OFF(grpc_port_file), 0, 0, NULL, "PATH",
     "once listening, write the bound --grpc-port to this file", NULL},
    {"send-timeout-s", "ATTND_SEND_TIMEOUT_S", OPT_INT, OFF(send_timeout_s), 1, 86400, "10", "S",
     "time a reply may go without the client accepting a byte; then the connection is cut "
     "(logged as 499 with reply_cut_off) and the reply's memory freed", NULL},
    {"idle-timeout-s", "ATTND_IDLE_TIMEOUT_S", OPT_INT, OFF(idle_timeout_s), 1, 86400, "60",
     "S", "close a connection with no traffic (or no complete request line) for this long", NULL},
    {"drain-timeout-s", "ATTND_DRAIN_TIMEOUT_S", OPT_INT, OFF(drain_timeout_s), 0, 86400, "30",
     "S", "on SIGTERM/SIGINT, time in-flight requests get to finish before they are "
     "cancelled (answered 503)", NULL},
    {"model", "ATTND_MODEL", OPT_MODEL, OFF(models), 0, 0, NULL,
     "NAME=PATH[:heads=N[:kv_heads=M]] or NAME=DIR[:layer=K]",
     "serve the safetensors layer at PATH (F32, F16 or BF16; nn.MultiheadAttention, "
     "q_proj/k_proj/v_proj/o_proj or W_Q/W_K/W_V/W_O names) as model NAME, loaded at "
     "start-up; heads and kv_heads override the file's __metadata__ num_heads and "
     "num_kv_heads; or the attention of every layer (a request names one with \"layer\"), "
     "or of layer K alone, of the Hugging Face checkpoint in directory DIR (config.json and "
     "model.safetensors or an index and shards; see docs/huggingface.md); a model that "
     "cannot be loaded stops the start (exit 2); repeatable (the variable takes a "
     "comma-separated list)", NULL},
    {"log-level", "ATTND_LOG_LEVEL", OPT_ENUM, OFF(log_level), 0, 0, "info", "LEVEL",
     "error, warn, info or debug", level_names},
    {"tls-cert", "ATTND_TLS_CERT", OPT_STR, OFF(tls_cert), 0, 0, NULL, "FILE",
     "serve HTTPS with this PEM certificate chain (leaf first); needs --tls-key; re-read on "
     "SIGHUP (new handshakes get the new one); a file that cannot be loaded stops the start "
     "(exit 2)", NULL},
    {"tls-key", "ATTND_TLS_KEY", OPT_STR, OFF(tls_key), 0, 0, NULL, "FILE",
     "the PEM private key of --tls-cert (PKCS#1, PKCS#8, encrypted with "
     "--tls-key-password-file); re-read on SIGHUP", NULL},
    {"tls-key-password-file", "ATTND_TLS_KEY_PASSWORD_FILE", OPT_STR,
     OFF(tls_key_password_file), 0, 0, NULL, "FILE",
     "file holding the password of an encrypted --tls-key (a final line break is ignored)", NULL},
    {"tls-priorities", "ATTND_TLS_PRIORITIES", OPT_STR, OFF(tls_priorities), 0, 0,
     "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2:-CIPHER-ALL:+AES-128-GCM:+AES-256-GCM:"
     "+CHACHA20-POLY1305:-MAC-ALL:+AEAD:-KX-ALL:+ECDHE-RSA:+ECDHE-ECDSA:-GROUP-ALL:"
     "+GROUP-X25519:+GROUP-SECP256R1:+GROUP-SECP384R1:+GROUP-SECP521R1:%SERVER_PRECEDENCE",
     "STRING", "GnuTLS priority string of --tls-cert; the default allows TLS 1.2 and 1.3 only, "
     "AEAD ciphers only (AES-GCM, ChaCha20-Poly1305) and forward-secret key exchange only, on "
     "X25519 first (the key share OpenSSL, curl and Go clients send: preferring P-256, as "
     "GnuTLS' NORMAL does, cost them a HelloRetryRequest round trip per handshake), then P-256, "
     "P-384, P-521", NULL},
    {"tls-client-ca", "ATTND_TLS_CLIENT_CA", OPT_STR, OFF(tls_client_ca), 0, 0, NULL, "FILE",
     "mutual TLS: clients must present a certificate that chains to a CA in this PEM file, "
     "or the handshake fails; re-read on SIGHUP (new handshakes verify against the new CAs)", NULL},
    {"auth-token-file", "ATTND_AUTH_TOKEN_FILE", OPT_STR, OFF(auth_token_file), 0, 0, NULL,
     "FILE", "require \"Authorization: Bearer TOKEN\" on every route but /v2/health/live, "
     "/v2/health/ready and the page shell at /, TOKEN being a line of this file (at least 16 "
     "of A-Z a-z 0-9 - . _ ~ + / =; blank and # lines skipped; several allow rotation); "
     "others get 401; re-read on SIGHUP", NULL},
    {NULL, "ATTND_BF16", OPT_ENUM, OFF(engine.bf16), 0, 0, "auto", "PATH",
     "which code computes the bf16 products of requests in precision bfloat16 (no flag: a knob "
     "for tests and benchmarks). auto: VDPBF16PS on AMD CPUs with AVX512-BF16 (avx512 kernel "
     "set), where it runs at the FMA rate; elsewhere the operands rounded to bf16 for the fp32 "
     "micro-kernels, which on Intel's CPUs is the faster of the two; no AMX tiles. native: "
     "VDPBF16PS on any CPU with AVX512-BF16 (avx512 kernel set; rounding elsewhere), slower "
     "than rounding on Intel. emulated: rounding, always. amx: as auto, and the layer "
     "projections and both attention products on AMX tiles where the CPU and the OS grant "
     "them (experimental; off otherwise, and the start-up log says why). amx-emulated: as "
     "auto, and the same tile code over a portable scalar emulation of the tile instructions "
     "(many times slower: for tests). Another value stops the start (exit 2). The start-up "
     "log line and attnd_engine_info's bf16 label say which path runs", bf16_paths},
};
/* clang-format on */

#define N_OPTIONS (sizeof options / sizeof options[0])

const char *srv_status_str(srv_status status)
{
    switch (status) {
#define SRV_STATUS_CASE(name, text)                                                                \
    case name:                                                                                     \
        return text;
        SRV_STATUS_LIST(SRV_STATUS_CASE)
#undef SRV_STATUS_CASE
    }
    return "unknown status";
}

/* ---- Value parsers ----------------------------------------------------------------------- */

/* A decimal integer with nothing around it: strtoll alone would accept leading blanks and a
 * '+', which a config value has no business carrying. */
static srv_status parse_int(const char *text, int64_t *out)
{
    char *end = NULL;
    long long v;
    if (!isdigit((unsigned char)text[0]) && !(text[0] == '-' && isdigit((unsigned char)text[1])))
        return SRV_EINVAL;
    errno = 0;
    v = strtoll(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0')
        return SRV_EINVAL;
    *out = (int64_t)v;
    return SRV_OK;
}

/* The suffixes a size may end with, and what each multiplies by: the binary units the help
 * and docs/operations.md write, and their one-letter forms. Nothing else: "1GB" or "1gb" would
 * read as a decimal gigabyte to some and a gibibyte to others, so neither is taken. */
static const struct {
    const char *suffix;
    unsigned shift;
} size_suffixes[] = {
    {"", 0},   {"K", 10},   {"KiB", 10}, {"M", 20},   {"MiB", 20},
    {"G", 30}, {"GiB", 30}, {"T", 40},   {"TiB", 40},
};

srv_status srv_parse_size(const char *text, uint64_t *out)
{
    char *end = NULL;
    unsigned long long v;
    if (!text || !isdigit((unsigned char)text[0]))
        return SRV_EINVAL;
    errno = 0;
    v = strtoull(text, &end, 10);
    if (errno != 0 || end == text)
        return SRV_EINVAL;
    for (size_t i = 0; i < sizeof size_suffixes / sizeof size_suffixes[0]; i++) {
        unsigned shift = size_suffixes[i].shift;
        if (strcmp(end, size_suffixes[i].suffix) != 0)
            continue;
        if (v > (ULLONG_MAX >> shift))
            return SRV_EINVAL;
        *out = (uint64_t)v << shift;
        return SRV_OK;
    }
    return SRV_EINVAL;
}

/* Copies `n` bytes of `s` into a new NUL-terminated string. */
static char *dup_n(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

static bool model_name_ok(const char *s, size_t n)
{
    if (n == 0 || n > 63)
        return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!isalnum(c) && c != '_' && c != '-' && c != '.')
            return false;
    }
    return true;
}

/* Strips a trailing ":KEY=N" from text[0..*n) into *value (an integer in [min, 2^20]).
 * Returns 1 when stripped, 0 when there is no such suffix, -1 for a ":KEY=" suffix whose value
 * is not such a number (a ":KEY=" followed by a '/' belongs to the path instead). */
static int strip_suffix(const char *text, size_t *n, const char *key, int64_t min, int64_t *value)
{
    size_t klen = strlen(key), at = SIZE_MAX, digits = 0;
    char num[16];
    for (size_t i = 0; i + klen + 2 <= *n; i++) {
        if (text[i] == ':' && memcmp(text + i + 1, key, klen) == 0 && text[i + klen + 1] == '=')
            at = i;
    }
    if (at == SIZE_MAX)
        return 0;
    const char *v = text + at + klen + 2;
    size_t vlen = *n - (at + klen + 2);
    if (memchr(v, '/', vlen))
        return 0;
    while (digits < vlen && v[digits] >= '0' && v[digits] <= '9')
        digits++;
    if (vlen == 0 || digits != vlen || vlen >= sizeof num)
        return -1;
    memcpy(num, v, vlen);
    num[vlen] = '\0';
    if (parse_int(num, value) != SRV_OK || *value < min || *value > (1 << 20))
        return -1;
    *n = at;
    return 1;
}

/* Appends one NAME=PATH[:heads=N[:kv_heads=M]] or NAME=DIR[:layer=K] (the first `n` bytes of
 * `text`) to cfg->models. The suffixes are read from the end, so a PATH may itself contain
 * ':'. */
static srv_status add_model(srv_config *cfg, const char *text, size_t n, const char *who, char *err,
                            size_t errlen)
{
    const char *eq = memchr(text, '=', n);
    srv_model *grown;
    size_t name_len, path_end = n;
    int64_t heads = 0, kv_heads = 0, layer = -1;
    int has_kv = 0, has_heads = 0, has_layer = 0;
    if (eq) {
        has_layer = strip_suffix(text, &path_end, "layer", 0, &layer);
        if (has_layer == 0)
            has_kv = strip_suffix(text, &path_end, "kv_heads", 1, &kv_heads);
        if (has_layer == 0 && has_kv >= 0)
            has_heads = strip_suffix(text, &path_end, "heads", 1, &heads);
    }
    if (has_layer < 0 || has_kv < 0 || has_heads < 0 || (has_kv > 0 && has_heads == 0)) {
        snprintf(err, errlen,
                 "%s: \"%.*s\": the suffixes are :heads=N or :heads=N:kv_heads=M (each a "
                 "positive integer) for a file, :layer=K (K >= 0) for a checkpoint directory",
                 who, (int)(n > 200 ? 200 : n), text);
        return SRV_EINVAL;
    }
    if (!eq || !model_name_ok(text, (size_t)(eq - text)) || eq + 1 >= text + path_end) {
        snprintf(err, errlen,
                 "%s: \"%.*s\" is not NAME=PATH[:heads=N[:kv_heads=M]] (NAME: 1 to 63 of A-Z "
                 "a-z 0-9 _ - .; PATH: not empty)",
                 who, (int)(n > 200 ? 200 : n), text);
        return SRV_EINVAL;
    }
    name_len = (size_t)(eq - text);
    for (size_t i = 0; i < cfg->n_models; i++) {
        if (strlen(cfg->models[i].name) == name_len &&
            memcmp(cfg->models[i].name, text, name_len) == 0) {
            snprintf(err, errlen, "%s: model \"%.*s\" is given twice", who, (int)name_len, text);
            return SRV_EINVAL;
        }
    }
    grown = realloc(cfg->models, (cfg->n_models + 1) * sizeof *grown);
    if (!grown)
        return SRV_ENOMEM;
    cfg->models = grown;
    grown[cfg->n_models].name = dup_n(text, name_len);
    grown[cfg->n_models].path = dup_n(eq + 1, path_end - name_len - 1);
    grown[cfg->n_models].heads = heads;
    grown[cfg->n_models].kv_heads = kv_heads;
    grown[cfg->n_models].layer = layer;
    if (!grown[cfg->n_models].name || !grown[cfg->n_models].path) {
        free(grown[cfg->n_models].name);
        free(grown[cfg->n_models].path);
        return SRV_ENOMEM;
    }
    cfg->n_models++;
    return SRV_OK;
}

/* The accepted values of `o`, as "a, b or c", into buf. */
static void choices_text(const srv_option *o, char *buf, size_t len)
{
    size_t n = 0, at = 0;
    while (o->choices[n])
        n++;
    buf[0] = '\0';
    for (size_t i = 0; i < n && at < len; i++) {
        const char *sep = i == 0 ? "" : i + 1 == n ? " or " : ", ";
        int w = snprintf(buf + at, len - at, "%s%s", sep, o->choices[i]);
        if (w < 0)
            return;
        at += (size_t)w;
    }
}

/* Parses `text` for option `o` into `cfg`. `who` names the source ("--port", "ATTND_PORT") in
 * the error message. */
static srv_status set_option(srv_config *cfg, const srv_option *o, const char *text,
                             const char *who, char *err, size_t errlen)
{
    char *field = (char *)cfg + o->offset;
    switch (o->type) {
    case OPT_STR: {
        char **slot = (char **)(void *)field;
        char *copy;
        if (text[0] == '\0' || strlen(text) > 4096) {
            snprintf(err, errlen, "%s: expected a non-empty value of at most 4096 bytes", who);
            return SRV_EINVAL;
        }
        copy = dup_n(text, strlen(text));
        if (!copy)
            return SRV_ENOMEM;
        free(*slot);
        *slot = copy;
        return SRV_OK;
    }
    case OPT_INT: {
        int64_t v;
        if (parse_int(text, &v) != SRV_OK || v < o->min || v > o->max) {
            snprintf(err, errlen, "%s: \"%.64s\" is not an integer in [%lld, %lld]", who, text,
                     (long long)o->min, (long long)o->max);
            return SRV_EINVAL;
        }
        *(int64_t *)(void *)field = v;
        return SRV_OK;
    }
    case OPT_SIZE: {
        uint64_t v;
        if (srv_parse_size(text, &v) != SRV_OK || v < (uint64_t)o->min || v > (uint64_t)o->max ||
            v > SIZE_MAX) {
            snprintf(err, errlen,
                     "%s: \"%.64s\" is not a size in [%lld, %lld] bytes: write a whole number "
                     "of bytes, or one followed by KiB, MiB, GiB or TiB (or K, M, G, T)",
                     who, text, (long long)o->min, (long long)o->max);
            return SRV_EINVAL;
        }
        *(size_t *)(void *)field = (size_t)v;
        return SRV_OK;
    }
    case OPT_ENUM: {
        size_t i = 0;
        while (o->choices[i] && strcmp(text, o->choices[i]) != 0)
            i++;
        if (!o->choices[i]) {
            char names[160];
            choices_text(o, names, sizeof names);
            snprintf(err, errlen, "%s: \"%.64s\" is not accepted; use %s", who, text, names);
            return SRV_EINVAL;
        }
        *(int *)(void *)field = (int)i;
        return SRV_OK;
    }
    case OPT_MODEL: {
        /* The environment form carries a comma-separated list; a flag carries one model. */
        bool list = strncmp(who, "--", 2) != 0;
        const char *p = text;
        if (!list)
            return add_model(cfg, text, strlen(text), who, err, errlen);
        for (;;) {
            const char *comma = strchr(p, ',');
            size_t n = comma ? (size_t)(comma - p) : strlen(p);
            srv_status st = add_model(cfg, p, n, who, err, errlen);
            if (st != SRV_OK)
                return st;
            if (!comma)
                return SRV_OK;
            p = comma + 1;
        }
    }
    }
    return SRV_EINVAL; /* defensive: every type is handled above */
}

static const srv_option *find_option(const char *name, size_t len)
{
    for (size_t i = 0; i < N_OPTIONS; i++) {
        if (options[i].name && strlen(options[i].name) == len &&
            memcmp(options[i].name, name, len) == 0)
            return &options[i];
    }
    return NULL;
}

/* The checks that take more than one option: the default priority level is one of the levels,
 * and the TLS flags come with what they need (the files themselves are read by
 * srv_security_check). */
static srv_status check_across(const srv_config *cfg, char *err, size_t errlen)
{
    if (cfg->default_priority_level > cfg->priority_levels) {
        snprintf(err, errlen,
                 "--default-priority-level %lld is above --priority-levels %lld: the default "
                 "must be one of the levels, 1 to --priority-levels",
                 (long long)cfg->default_priority_level, (long long)cfg->priority_levels);
        return SRV_EINVAL;
    }
    if (!cfg->tls_cert != !cfg->tls_key) {
        snprintf(err, errlen, "%s needs %s as well", cfg->tls_cert ? "--tls-cert" : "--tls-key",
                 cfg->tls_cert ? "--tls-key" : "--tls-cert");
        return SRV_EINVAL;
    }
    if (!cfg->tls_cert && (cfg->tls_client_ca || cfg->tls_key_password_file)) {
        snprintf(err, errlen, "%s needs --tls-cert and --tls-key",
                 cfg->tls_client_ca ? "--tls-client-ca" : "--tls-key-password-file");
        return SRV_EINVAL;
    }
    return SRV_OK;
}

void srv_config_free(srv_config *cfg)
{
    if (!cfg)
        return;
    free(cfg->host);
    free(cfg->port_file);
    free(cfg->admin_port_file);
    free(cfg->grpc_port_file);
    for (size_t i = 0; i < cfg->n_models; i++) {
        free(cfg->models[i].name);
        free(cfg->models[i].path);
    }
    free(cfg->models);
    free(cfg->tls_cert);
    free(cfg->tls_key);
    free(cfg->tls_key_password_file);
    free(cfg->tls_priorities);
    free(cfg->tls_client_ca);
    free(cfg->auth_token_file);
    memset(cfg, 0, sizeof *cfg);
}

srv_status srv_config_parse(srv_config *cfg, int argc, char **argv, char *err, size_t errlen)
{
    srv_status st = SRV_OK;
    bool model_from_flags = false;
    char who[96];

    memset(cfg, 0, sizeof *cfg);
    if (errlen > 0)
        err[0] = '\0';

    for (size_t i = 0; i < N_OPTIONS && st == SRV_OK; i++) {
        if (options[i].def) {
            snprintf(who, sizeof who, "default of %s%s", options[i].name ? "--" : "",
                     options[i].name ? options[i].name : options[i].env);
            st = set_option(cfg, &options[i], options[i].def, who, err, errlen);
        }
    }
    for (size_t i = 0; i < N_OPTIONS && st == SRV_OK; i++) {
        const char *v = getenv(options[i].env);
        if (v)
            st = set_option(cfg, &options[i], v, options[i].env, err, errlen);
    }
    for (int i = 1; i < argc && st == SRV_OK; i++) {
        const char *arg = argv[i];
        const char *name, *eq, *value;
        const srv_option *o;
        size_t name_len;
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            st = SRV_HELP;
            break;
        }
        if (strncmp(arg, "--", 2) != 0) {
            snprintf(err, errlen,
                     "unexpected argument \"%.64s\" (options start with --; see "
                     "--help)",
                     arg);
            st = SRV_EINVAL;
            break;
        }
        name = arg + 2;
        eq = strchr(name, '=');
        name_len = eq ? (size_t)(eq - name) : strlen(name);
        o = find_option(name, name_len);
        if (!o) {
            snprintf(err, errlen, "unknown option --%.*s (see --help)",
                     (int)(name_len > 64 ? 64 : name_len), name);
            st = SRV_EINVAL;
            break;
        }
        if (eq) {
            value = eq + 1;
        } else if (i + 1 < argc) {
            value = argv[++i];
        } else {
            snprintf(err, errlen, "--%s needs a value (%s)", o->name, o->arg);
            st = SRV_EINVAL;
            break;
        }
        /* Models given as flags replace those from the environment, as any flag does. */
        if (o->type == OPT_MODEL && !model_from_flags) {
            for (size_t m = 0; m < cfg->n_models; m++) {
                free(cfg->models[m].name);
                free(cfg->models[m].path);
            }
            cfg->n_models = 0;
            model_from_flags = true;
        }
        snprintf(who, sizeof who, "--%s", o->name);
        st = set_option(cfg, o, value, who, err, errlen);
    }
    if (st == SRV_OK)
        st = check_across(cfg, err, errlen);
    if (st == SRV_ENOMEM)
        snprintf(err, errlen, "out of memory while reading the configuration");
    if (st != SRV_OK)
        srv_config_free(cfg);
    return st;
}

/* The I/O threads of --io-threads 0: one per CPU the process may use, up to IO_THREADS_AUTO_MAX.
 * Each reads bodies at a core's copy speed, so a few are enough to keep the engine fed; more only
 * take CPU from the workers. */
#define IO_THREADS_AUTO_MAX 4

static int io_threads_auto(void)
{
    int n = eng_cpu_count();
    return n < IO_THREADS_AUTO_MAX ? n : IO_THREADS_AUTO_MAX;
}

srv_status srv__config_settings(const srv_config *cfg, srv_server *s)
{
    assert(cfg->default_priority_level >= 1 &&
           cfg->default_priority_level <= cfg->priority_levels); /* srv_config_parse's check */
    s->host = dup_n(cfg->host, strlen(cfg->host));
    if (!s->host)
        return SRV_ENOMEM;
    s->io_threads = cfg->io_threads > 0 ? (int)cfg->io_threads : io_threads_auto();
    s->max_body_bytes = cfg->max_body_bytes;
    s->max_queue = cfg->max_queue;
    s->max_batch_rows = cfg->max_batch_rows;
    s->max_memory_bytes = cfg->max_memory_bytes;
    /* Bodies on their way hold budget as they arrive: three quarters stay for the requests they
     * would wait behind, which decode and compute. */
    s->max_upload_bytes =
        cfg->max_upload_bytes > 0 ? cfg->max_upload_bytes : cfg->max_memory_bytes / 4;
    s->request_timeout_ns = cfg->request_timeout_ms * 1000000;
    s->send_timeout_s = (unsigned)cfg->send_timeout_s;
    s->idle_timeout_s = (unsigned)cfg->idle_timeout_s;
    s->idle_timeout_ns = cfg->idle_timeout_s * 1000000000;
    s->drain_timeout_ns = cfg->drain_timeout_s * 1000000000;
    s->limits = api_limits_default();
    s->limits.max_body_bytes = cfg->max_body_bytes;
    s->limits.max_elements = (size_t)cfg->max_elements;
    s->limits.max_timeout_ms = cfg->request_timeout_ms;
    s->limits.default_precision = cfg->default_precision;
    s->limits.priority_levels = (uint32_t)cfg->priority_levels;
    s->limits.default_priority_level = (uint32_t)cfg->default_priority_level;
    return SRV_OK;
}

/* One entry of --help: the flag (or the variable, for a row without one), its help, and a
 * line of facts from the row itself. */
static void usage_option(FILE *out, const srv_option *o)
{
    if (o->name)
        fprintf(out, "  --%s %s\n", o->name, o->arg);
    else
        fprintf(out, "  %s=%s\n", o->env, o->arg);
    fprintf(out, "      %s\n      default: %s", o->help, o->def ? o->def : "(none)");
    if (o->type == OPT_INT || o->type == OPT_SIZE)
        fprintf(out, "; range: %lld..%lld", (long long)o->min, (long long)o->max);
    for (size_t i = 0; o->choices && o->choices[i]; i++)
        fprintf(out, "%s%s", i == 0 ? "; one of: " : ", ", o->choices[i]);
    fprintf(out, "; env: %s\n", o->env);
}

void srv_config_usage(FILE *out)
{
    fprintf(
        out,
        "usage: attnd [--option value | --option=value]...\n"
        "       attnd --healthcheck [--option value | --option=value]...\n\n"
        "Serves transformer attention over HTTP: scaled dot-product attention (POST\n"
        "/v1/attention), multi-head attention layers from safetensors files (POST /v1/mha,\n"
        "GET /v1/models), the Open Inference Protocol / KServe v2 with Triton's binary\n"
        "tensors (/v2/...), Prometheus metrics (/metrics) and an inspector page (GET /).\n"
        "Each option may also be set by its environment variable; a flag wins. A SIZE or\n"
        "BYTES value is a whole number of bytes, or one followed by KiB, MiB, GiB or TiB\n"
        "(K, M, G, T alone mean the same); nothing else (no 1GB, 1gb, 1.5GiB).\n"
        "Exit status: 0 after a drain, 1 when the server cannot start, 2 for a bad\n"
        "configuration (a value its option does not accept, a model, certificate or token\n"
        "file that cannot be used).\n\n"
        "  --healthcheck\n"
        "      a mode, not an option: read the other options (flags and variables) as the daemon "
        "would, ask GET /v2/health/ready of the daemon they describe, and exit 0 when it "
        "answers 200 within 2 s, else 1 (2 for a bad configuration). It connects to --host "
        "(0.0.0.0 and :: through loopback). With --admin-port set (not -1) it asks that "
        "listener, in plain HTTP: on the port in --admin-port-file when that file holds one, "
        "else on --admin-port. Otherwise it asks the serving port: the port in --port-file "
        "when that file holds one, else --port, over TLS when --tls-cert is set (presenting "
        "--tls-cert as its client certificate when --tls-client-ca is set and "
        "--tls-key-password-file is not)\n");
    for (size_t i = 0; i < N_OPTIONS; i++)
        if (options[i].name)
            usage_option(out, &options[i]);
    fprintf(out, "  --help\n      print this text and exit\n\n"
                 "Set by the environment only (no flag):\n");
    for (size_t i = 0; i < N_OPTIONS; i++)
        if (!options[i].name)
            usage_option(out, &options[i]);
}
