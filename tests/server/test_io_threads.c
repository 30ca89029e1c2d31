/*
 * test_io_threads.c - a daemon with four I/O threads (--io-threads 4) under many connections at
 * once, each client doing something else at each turn: probes, scrapes and listings answered on
 * the I/O threads, small computations, bodies trickled in pieces, a body refused from its headers
 * by --max-upload-bytes, and clients that hang up mid-upload or while their request computes.
 * Every answer is one its request may get, and once the clients are done nothing is left on its
 * way, queued, running or reserved, and the daemon drains and exits 0.
 *
 * Its point is the TSan build (make tsan runs it against build/tsan/attnd with halt_on_error):
 * the callbacks of connections on different I/O threads run at once, and a data race between
 * them stops the daemon, which then fails the exit check.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/support/check.h"
#include "tests/support/daemon.h"

#define CLIENTS 32
#define KINDS   8
#define KiB     ((size_t)1024)

static const char seed[] = "{\"query\": [[1, 0], [0, 1], [1, 1]], \"key\": [[1, 0], [0, 1], "
                           "[1, 1]], \"value\": [[1, 0], [0, 2], [3, 1]], \"causal\": true}";
static const char *const json[] = {"Content-Type: application/json", NULL};

static daemon_proc d;
static char *compute_body, *upload_body;
static size_t compute_len;

/* What one client saw: turns whose answer was not one its request may get. */
typedef struct {
    pthread_t thread;
    int index, rounds;
    int wrong;
    char first_wrong[200];
} client_t;

static void wrong(client_t *c, int kind, const char *what)
{
    if (c->wrong++ == 0)
        snprintf(c->first_wrong, sizeof c->first_wrong, "kind %d: %.160s", kind,
                 what ? what : "(nothing)");
}

/* A request on its own connection announcing `len` bytes; -1 when it cannot connect. */
static int post_head(size_t len)
{
    char head[256];
    int fd = raw_connect(d.port);
    snprintf(head, sizeof head,
             "POST /v1/attention HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
             "Content-Length: %zu\r\n\r\n",
             len);
    if (fd >= 0 && raw_send(fd, head, strlen(head)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* A body of 300 KiB in four pieces 20 ms apart, then its answer: 422 for what it holds, or 429
 * when the uploads on their way or the work queued leave no room for it. */
static void slow_upload(client_t *c, int kind)
{
    const size_t len = 300 * KiB, piece = len / 4;
    int fd = post_head(len);
    char *resp = NULL;
    if (fd < 0) {
        wrong(c, kind, "cannot connect");
        return;
    }
    for (size_t at = 0; at < len; at += piece) {
        if (at > 0)
            sleep_ms(20);
        if (raw_send(fd, upload_body + at, at + piece <= len ? piece : len - at) != 0)
            break;
    }
    resp = raw_read_response(fd, 60000);
    if (raw_status(resp) != 422 && raw_status(resp) != 429)
        wrong(c, kind, resp);
    free(resp);
    close(fd);
}

/* A request that computes for a while, whose client hangs up once it is sent. */
static void hang_up_mid_compute(client_t *c, int kind)
{
    int fd = post_head(compute_len);
    if (fd < 0 || raw_send(fd, compute_body, compute_len) != 0)
        wrong(c, kind, "the upload failed");
    sleep_ms(10);
    if (fd >= 0)
        close(fd);
}

/* Half of a 1 MiB body, then the client goes away. */
static void hang_up_mid_upload(client_t *c, int kind)
{
    int fd = post_head(1024 * KiB);
    if (fd < 0 || raw_send(fd, upload_body, 200 * KiB) != 0)
        wrong(c, kind, "the upload failed");
    if (fd >= 0)
        close(fd);
}

/* A body larger than --max-upload-bytes (8 MiB) while another is on its way (this client's own
 * 1 MiB upload, stalled after its first 128 KiB): 429 from its headers, none of it sent. (Alone,
 * it would be admitted and judged by the memory budget.) */
static void refused_from_headers(client_t *c, int kind)
{
    int held = post_head(1024 * KiB);
    if (held < 0 || raw_send(held, upload_body, 128 * KiB) != 0) {
        wrong(c, kind, "the held upload failed");
        if (held >= 0)
            close(held);
        return;
    }
    sleep_ms(200); /* the daemon reads the held upload's first bytes: it is on its way */
    int fd = post_head(9 * 1024 * KiB);
    char *resp = fd >= 0 ? raw_read_response(fd, 60000) : NULL;
    if (raw_status(resp) != 429 || !strstr(resp, "--max-upload-bytes"))
        wrong(c, kind, resp);
    free(resp);
    if (fd >= 0)
        close(fd);
    close(held);
}

/* One request through libcurl on the client's kept-alive handle, answered `want` (or 429 when
 * `or_429`). */
static void curl_turn(client_t *c, int kind, void *h, const char *method, const char *path,
                      long want, bool or_429)
{
    http_resp r;
    long status = http_do(h, d.port, method, path, strcmp(method, "POST") == 0 ? json : NULL,
                          strcmp(method, "POST") == 0 ? seed : NULL,
                          strcmp(method, "POST") == 0 ? strlen(seed) : 0, &r);
    if (status != want && !(or_429 && status == 429))
        wrong(c, kind, status ? r.body : r.error);
    http_resp_free(&r);
}

static void *client_main(void *arg)
{
    client_t *c = arg;
    void *h = http_handle_new();
    for (int round = 0; round < c->rounds; round++) {
        int kind = (c->index + round) % KINDS;
        switch (kind) {
        case 0:
            curl_turn(c, kind, h, "GET", "/v2/health/ready", 200, false);
            break;
        case 1:
            curl_turn(c, kind, h, "GET", "/metrics", 200, false);
            break;
        case 2:
            curl_turn(c, kind, h, "POST", "/v1/attention", 200, true);
            break;
        case 3:
            curl_turn(c, kind, h, "GET", (round & 1) ? "/v1/models" : "/v2/models/sdpa", 200,
                      false);
            break;
        case 4:
            slow_upload(c, kind);
            break;
        case 5:
            hang_up_mid_compute(c, kind);
            break;
        case 6:
            hang_up_mid_upload(c, kind);
            break;
        default:
            refused_from_headers(c, kind);
        }
    }
    http_handle_free(h);
    return NULL;
}

static void test_many_connections_on_four_io_threads(void)
{
    const char *const args[] = {"--io-threads",
                                "4",
                                "--max-upload-bytes",
                                "8MiB",
                                "--request-timeout-ms",
                                "60000",
                                "--log-level",
                                "warn",
                                NULL};
    static client_t clients[CLIENTS];
    char *log;
    if (daemon_start(&d, args) != 0) {
        CHECK(0);
        return;
    }
    CHECK(metric_value(d.port, "attnd_io_threads") == 4);
    for (int i = 0; i < CLIENTS; i++) {
        clients[i] = (client_t){.index = i, .rounds = daemon_quick() ? KINDS : 3 * KINDS};
        CHECK(pthread_create(&clients[i].thread, NULL, client_main, &clients[i]) == 0);
    }
    for (int i = 0; i < CLIENTS; i++) {
        pthread_join(clients[i].thread, NULL);
        CHECKF(clients[i].wrong == 0, "client %d: %d wrong answers, the first %s", i,
               clients[i].wrong, clients[i].first_wrong);
    }
    CHECK(metric_wait_le(d.port, "attnd_upload_bytes_in_flight", 0, 30000));
    CHECK(metric_wait_le(d.port, "attnd_running_requests", 0, 60000));
    CHECK(metric_wait_le(d.port, "attnd_queue_depth", 0, 30000));
    CHECK(metric_wait_le(d.port, "attnd_memory_reserved_bytes", 0, 30000));
    CHECK(metric_value(d.port, "attnd_rejected_total{reason=\"cancelled\"}") > 0);
    log = daemon_log(&d);
    CHECKF(log && !strstr(log, "ThreadSanitizer"), "the daemon's log reports a race");
    free(log);
    CHECK_EQ_INT(daemon_stop(&d), 0);
}

int main(void)
{
    compute_body = slow_attention_body(512, 8192, &compute_len);
    upload_body = malloc(1024 * KiB);
    if (!compute_body || !upload_body) {
        printf("out of memory\n0 passed, 1 failed\n");
        return 1;
    }
    /* JSON its route answers 422: a string where a tensor goes. */
    memset(upload_body, 'x', 1024 * KiB);
    memcpy(upload_body, "{\"query\":\"", 10);
    memcpy(upload_body + 300 * KiB - 2, "\"}", 2);
    RUN_WITHIN(test_many_connections_on_four_io_threads, 600);
    free(compute_body);
    free(upload_body);
    return check_report();
}
