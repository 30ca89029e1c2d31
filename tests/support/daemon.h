/*
 * daemon.h - integration-test helpers: start a real attnd, talk HTTP to it, stop it.
 *
 * daemon_start runs the binary named by $ATTND_BIN (default build/attnd) on 127.0.0.1 with an
 * ephemeral port (--port 0 --port-file), waits until the port file appears (the daemon writes it
 * once it listens), and keeps its stdout and stderr (the JSON log) in a temporary folder.
 * http_do makes one request with libcurl; raw_* talk bytes over a plain socket for what curl
 * will not send (ambiguous framing, trickled bytes, hang-ups).
 *
 *     daemon_proc d;
 *     const char *args[] = {"--threads", "1", NULL};
 *     if (daemon_start(&d, args) != 0) return;          // prints why
 *     http_resp r;
 *     http_do(NULL, d.port, "GET", "/v2/health/live", NULL, NULL, 0, &r);
 *     CHECK_EQ_INT(r.status, 200);
 *     http_resp_free(&r);
 *     CHECK_EQ_INT(daemon_stop(&d), 0);                 // SIGTERM, then the exit status
 *
 * Threads: http_do and raw_* may be called from any thread; daemon_* from one thread.
 */
#ifndef ATTND_TESTS_DAEMON_H
#define ATTND_TESTS_DAEMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* ---- The daemon ---------------------------------------------------------------------------- */

typedef struct {
    pid_t pid;
    int port;
    bool exited;
    int exit_code; /* after daemon_wait/daemon_stop: 0..255, or 128 + signal */
    char dir[64];  /* temporary folder with port, stdout and stderr */
} daemon_proc;

/* True when ATTND_TEST_QUICK is set (sanitizer builds): tests use smaller sizes. */
bool daemon_quick(void);

/* Starts attnd with --host 127.0.0.1 --port 0 --port-file ... followed by `args` (a
 * NULL-terminated list of extra flags, or NULL). 0 when it listens, -1 on failure (printed). */
int daemon_start(daemon_proc *d, const char *const *args);

/* daemon_start with --grpc-port 0 before `args`: *grpc_port gets the port it took (read from
 * --grpc-port-file). 0 or -1 (printed). */
int daemon_start_grpc(daemon_proc *d, const char *const *args, int *grpc_port);

/* Sends `sig` to the daemon. */
int daemon_signal(daemon_proc *d, int sig);

/* Waits up to timeout_ms for the daemon to exit: its exit code, or -1 if still running. */
int daemon_wait(daemon_proc *d, int timeout_ms);

/* SIGTERM, then waits up to 60 s (SIGKILL after that). Returns the exit code (-1 if it had to
 * be killed), removes the temporary folder (kept when ATTND_TEST_KEEP is set). */
int daemon_stop(daemon_proc *d);

/* The daemon's stderr so far (its JSON log), malloc'd and NUL-terminated; NULL on error. */
char *daemon_log(const daemon_proc *d);

/* Lines of the daemon's log holding both `a` and `b`, once there are `want` of them or
 * timeout_ms has passed (a request's line is written at its completion, which may come after
 * its client has the reply). */
int daemon_log_lines(const daemon_proc *d, const char *a, const char *b, int want, int timeout_ms);

/* Its resident memory (VmRSS) in KiB, and its open descriptors; -1 when /proc cannot say. */
long daemon_rss_kib(const daemon_proc *d);
int daemon_fd_count(const daemon_proc *d);

/* Its user plus system CPU seconds so far, all threads: its CPU-time clock (nanoseconds), else
 * /proc/PID/stat (clock ticks of 10 ms); 0 if unknown. Unlike wall time, neighbours on the
 * machine do not inflate it. */
double daemon_cpu_s(const daemon_proc *d);

/* ---- HTTP with libcurl -------------------------------------------------------------------- */

typedef struct {
    long status; /* 0 when the request failed at the transport level */
    char *body;  /* NUL-terminated */
    size_t body_len;
    char request_id[160], retry_after[32], allow[64], content_type[128], connection[32];
    char www_authenticate[128];
    char server_timing[256];       /* the reply's stage timings (Server-Timing) */
    char inference_header_len[32]; /* Inference-Header-Content-Length (KServe v2 binary) */
    double seconds;
    long new_connections; /* connections curl opened for this request (0: reused) */
    char error[256];      /* curl's message when status is 0 */
} http_resp;

/* The scheme of http_do's URLs: "http", or "https" for a TLS daemon (the handle then carries
 * the CA and any client certificate: tests/support/tls.h). */
extern const char *http_scheme;

/* One request to 127.0.0.1:port. `handle` is a CURL* to reuse (keep-alive), or NULL for a fresh
 * one. `headers` is NULL-terminated ("Name: value") or NULL; "Expect:" is always added so that
 * curl does not wait for 100 Continue. `body` may be NULL for none. Returns r->status. */
long http_do(void *handle, int port, const char *method, const char *path,
             const char *const *headers, const char *body, size_t body_len, http_resp *r);

/* A POST /v1/attention with Content-Type: application/json. */
long http_post_json(void *handle, int port, const char *body, http_resp *r);

void http_resp_free(http_resp *r);

/* The duration in milliseconds of stage `name` in a Server-Timing value ("receive;dur=1.2,
 * queue;dur=0.1, ..."), or -1 when it does not name that stage with a duration. */
double server_timing_ms(const char *value, const char *name);

/* curl_easy_init / curl_easy_cleanup, as void * so that tests need not include curl. */
void *http_handle_new(void);
void http_handle_free(void *handle);

/* GET /metrics and the value of the sample whose line starts with `series` (the name with its
 * labels, exactly as exposed, e.g. `attnd_rejected_total{reason="queue_full"}`); -1 if absent. */
double metric_value(int port, const char *series);

/* Polls metric_value until it is >= `want` or timeout_ms passes; true if it got there.
 * Counters move when a request completes, which libmicrohttpd reports just after the client
 * has its response: tests wait for them instead of reading them once. */
bool metric_wait(int port, const char *series, double want, int timeout_ms);

/* The same, until the value is <= `want` (and present). */
bool metric_wait_le(int port, const char *series, double want, int timeout_ms);

/* ---- Raw sockets ---------------------------------------------------------------------------- */

/* A blocking TCP connection to 127.0.0.1:port; -1 on failure. */
int raw_connect(int port);

/* Sends all of data; 0 or -1. */
int raw_send(int fd, const void *data, size_t len);

/* Reads until the peer closes or timeout_ms passes; returns the bytes (malloc'd,
 * NUL-terminated) and sets *closed when the peer closed (or reset) the connection. */
char *raw_read_all(int fd, int timeout_ms, bool *closed);

/* Reads one response: its head and Content-Length bytes of body (malloc'd, NUL-terminated;
 * what arrived if the peer closes first or timeout_ms passes), leaving the connection open. */
char *raw_read_response(int fd, int timeout_ms);

/* Connects, sends `data`, reads until close or timeout_ms; the response text (malloc'd). */
char *raw_exchange(int port, const char *data, size_t len, int timeout_ms);

/* The status code of a response text "HTTP/1.1 NNN ...", or 0. */
int raw_status(const char *response);

/* ---- Request bodies -------------------------------------------------------------------------- */

/* Standard base64 of n bytes (malloc'd, NUL-terminated). */
char *b64_encode(const void *data, size_t n);

/* A JSON tensor {"shape": [...], "dtype": "float32", "base64": "..."} (malloc'd). */
char *json_tensor_b64(const float *data, const int64_t *shape, int rank);

/* json_tensor_b64 of a [rows, width] tensor of numbers uniform in [-1, 1) from *rng (malloc'd;
 * NULL when out of memory). */
char *json_random_tensor_b64(int64_t rows, int64_t width, uint64_t *rng);

/* A /v1/attention body whose compute visits about rows*keys scores on one worker and whose
 * size stays small: query [1, heads, rows/heads, 8], key/value [1, 1, keys, 8], base64. */
char *slow_attention_body(int64_t rows, int64_t keys, size_t *len);

/* The numbers of the JSON value after `"key":` in `body` (a nested array, a number, or the flat
 * form {"shape", "data"}), in order, into out[0..max-1]; returns how many there are (null counts as
 * NaN), or -1 when the key is absent. A test helper, not a JSON parser: it trusts the daemon's
 * output. */
long json_numbers(const char *body, const char *key, double *out, size_t max);

/* Monotonic seconds. */
double now_s(void);
void sleep_ms(int ms);

#endif
