/*
 * test_v2_sequences.c - the steps of one KServe v2 sequence (Triton's sequence_id on model sdpa)
 * apply in the order they arrive at a real daemon, with one worker and with two, whatever
 * their priorities: 32 steps sent on 32 connections while the workers are busy, the first a
 * sequence_start and the last a sequence_end, each step's output checked against the history
 * of the steps that arrived before it. A step that fails (a shape the session refuses), one
 * that passes its deadline while it waits, and one whose client hangs up each give the next
 * step its turn; so does every step of a sequence that is still waiting when SIGTERM drains
 * the daemon.
 *
 * How the arrival order is known: a step is sent only once the one before it is admitted
 * (nv_inference_pending_request_count has counted it), and while every worker is held by a
 * long /v1/attention request (a "blocker"), so that all the steps wait together; nothing of
 * the sequence starts before the test hangs the blockers up. A blocker or a step that answers
 * before the steps are all in (a machine faster than the blocker is long) makes the round void,
 * and it is run again with blockers four times as long. Each round after the first, and the
 * drain, has a daemon of its own: one that has run a blocker knows it to be long, and runs long
 * requests one at a time with short ones (the steps) beside them.
 *
 * What the outputs say: every query is zero, so each head's output is the mean of the values
 * the session holds; the START token's value has a 1 where the others have 0, which makes the
 * output say how many tokens were there (1 / length) and the rest which ones.
 */
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/support/check.h"
#include "tests/support/daemon.h"
#include "tests/support/util.h"

enum {
    HEADS = 2,
    HEAD_DIM = 4,
    WIDTH = HEADS * HEAD_DIM, /* query, key and value rows: [1, WIDTH] */
    STEPS = 32,
    BAD_STEP = 7,       /* a key the session refuses: 400, nothing appended */
    LATE_STEP = 10,     /* a timeout that passes while it waits: 504, nothing appended */
    HUNG_UP_STEP = 13,  /* its client hangs up while it waits: nothing appended */
    DRAIN_STEPS = 6,    /* steps waiting when SIGTERM arrives */
    BLOCKER_ROUNDS = 4, /* tries with ever longer blockers */
};

#define PENDING "nv_inference_pending_request_count{model=\"sdpa\",version=\"1\"}"

static daemon_proc d;
static int threads;
static int64_t blocker_rows = 32768; /* grows when a round is void */
static int blockers[2] = {-1, -1};   /* their connections, one per worker */

typedef struct {
    bool start, end, bad_shape;
    bool gzip;          /* sent with Content-Encoding: gzip */
    size_t pad;         /* spaces before the body's last brace */
    int priority;       /* 0: none (the default level) */
    int64_t timeout_ms; /* 0: none */
    float value[WIDTH];
} step;

/* The values a sequence holds, in order. */
typedef struct {
    int n;
    float value[STEPS][WIDTH];
} history;

/* Step i's value: per head, 1 (the START token) or 0, then random numbers. */
static void step_value(step *st, bool first, uint64_t *rng)
{
    for (int h = 0; h < HEADS; h++) {
        st->value[h * HEAD_DIM] = first ? 1.0f : 0.0f;
        for (int j = 1; j < HEAD_DIM; j++)
            st->value[h * HEAD_DIM + j] = (float)rng_sym(rng, 1.0);
    }
}

static void put_row(char *buf, size_t cap, size_t *len, const char *name, const float *x, int n)
{
    *len += (size_t)snprintf(buf + *len, cap - *len,
                             "%s{\"name\":\"%s\",\"datatype\":\"FP32\",\"shape\":[1,%d],\"data\":[",
                             strcmp(name, "query") ? "," : "", name, n);
    for (int i = 0; i < n; i++)
        *len += (size_t)snprintf(buf + *len, cap - *len, "%s%.9g", i ? "," : "", (double)x[i]);
    *len += (size_t)snprintf(buf + *len, cap - *len, "]}");
}

/* Sends step `st` of sequence `seq` (its JSON text: 42 or "chat") on a connection of its own;
 * the connection, or -1. */
static int send_step(const char *seq, const step *st)
{
    static const float zeros[WIDTH] = {0};
    char body[4096], head[512];
    size_t len = 0, n;
    len += (size_t)snprintf(body, sizeof body,
                            "{\"parameters\":{\"sequence_id\":%s,\"num_heads\":%d,"
                            "\"num_kv_heads\":%d%s%s",
                            seq, HEADS, HEADS, st->start ? ",\"sequence_start\":true" : "",
                            st->end ? ",\"sequence_end\":true" : "");
    if (st->priority)
        len += (size_t)snprintf(body + len, sizeof body - len, ",\"priority\":%d", st->priority);
    if (st->timeout_ms)
        len += (size_t)snprintf(body + len, sizeof body - len, ",\"timeout_ms\":%lld",
                                (long long)st->timeout_ms);
    len += (size_t)snprintf(body + len, sizeof body - len, "},\"inputs\":[");
    put_row(body, sizeof body, &len, "query", zeros, WIDTH);
    put_row(body, sizeof body, &len, "key", st->value, st->bad_shape ? WIDTH - 2 : WIDTH);
    put_row(body, sizeof body, &len, "value", st->value, WIDTH);
    len += (size_t)snprintf(body + len, sizeof body - len, "]");
    char *text = xcalloc(len + st->pad + 2, 1);
    memcpy(text, body, len);
    memset(text + len, ' ', st->pad);
    text[len + st->pad] = '}';
    len += st->pad + 1;
    char *payload = st->gzip ? zlib_pack(text, len, 31, &n) : text;
    if (!st->gzip)
        n = len;
    int h = snprintf(head, sizeof head,
                     "POST /v2/models/sdpa/infer HTTP/1.1\r\nHost: t\r\n"
                     "Content-Type: application/json\r\n%sContent-Length: %zu\r\n"
                     "Connection: close\r\n\r\n",
                     st->gzip ? "Content-Encoding: gzip\r\n" : "", n);
    int fd = raw_connect(d.port);
    if (fd >= 0 && (raw_send(fd, head, (size_t)h) != 0 || raw_send(fd, payload, n) != 0)) {
        close(fd);
        fd = -1;
    }
    if (payload != text)
        free(payload);
    free(text);
    CHECKF(fd >= 0, "cannot send a step of sequence %s", seq);
    return fd;
}

/* The status of the reply on `fd` (0: none) and its output row into out[WIDTH]; closes fd. */
static int read_reply(int fd, float out[WIDTH])
{
    bool closed = false;
    char *resp = raw_read_all(fd, 120000, &closed);
    const char *body = resp ? strstr(resp, "\r\n\r\n") : NULL;
    double x[WIDTH];
    int status = raw_status(resp);
    close(fd);
    memset(out, 0, WIDTH * sizeof *out);
    if (status == 200 && body && json_numbers(body, "data", x, WIDTH) == WIDTH) {
        for (int i = 0; i < WIDTH; i++)
            out[i] = (float)x[i];
    } else if (status == 200) {
        CHECKF(0, "a 200 without its output: %.300s", body ? body : "");
        status = 0;
    }
    free(resp);
    return status;
}

/* Checks step `i`'s output against the mean of each head's values in `h`. */
static void check_output(const char *seq, int i, const history *h, const float out[WIDTH])
{
    for (int c = 0; c < WIDTH; c++) {
        double mean = 0;
        for (int t = 0; t < h->n; t++)
            mean += h->value[t][c] / (double)h->n;
        if (!(out[c] > mean - 1e-5 && out[c] < mean + 1e-5)) {
            CHECKF(0,
                   "sequence %s, step %d (in arrival order): output[%d] = %.7g, want %.7g; it saw "
                   "about %.3g tokens, the steps before it had appended %d",
                   seq, i, c, (double)out[c], mean, out[0] > 0 ? 1.0 / out[0] : 0.0, h->n);
            return;
        }
    }
}

/* ---- The daemons -------------------------------------------------------------------------- */

static bool start(int n)
{
    char t[8];
    snprintf(t, sizeof t, "%d", n);
    /* A deadline far beyond the blockers': admission never refuses a step for the wait behind
     * them, however slowly a busy machine runs them. */
    const char *const args[] = {"--threads",
                                t,
                                "--kv-cache-bytes",
                                "64MiB",
                                "--drain-timeout-s",
                                "20",
                                "--request-timeout-ms",
                                "600000",
                                NULL};
    threads = n;
    if (daemon_start(&d, args) != 0) {
        CHECKF(0, "cannot start attnd --threads %d", n);
        return false;
    }
    return true;
}

/* A daemon of its own for a round: one that has run a blocker has learned its cost, and a
 * request it knows to be long runs one at a time, short ones (the steps) beside it. */
static bool fresh_daemon(void)
{
    CHECK_EQ_INT(daemon_stop(&d), 0);
    return start(threads);
}

/* ---- Holding the workers ------------------------------------------------------------------ */

typedef enum { WAIT_OK, WAIT_STARTED, WAIT_TIMEOUT } wait_result;

/* Whether connection fd (-1: none) has something to read, a reply or its close. */
static bool answered(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return fd >= 0 && poll(&p, 1, 0) > 0;
}

/* Whether a blocker has answered: it ended on its own, and a worker is free. */
static bool blocker_ended(void)
{
    for (int b = 0; b < threads; b++)
        if (answered(blockers[b]))
            return true;
    return false;
}

/* Whether one of the n steps sent (connections sent[], -1: read or closed) was answered. */
static bool step_answered(const int *sent, int n)
{
    for (int i = 0; i < n; i++)
        if (answered(sent[i]))
            return true;
    return false;
}

/* Waits until the v2 requests admitted and not started number `want`. A count below `floor`,
 * a blocker that answered or a step that did means a step may have started: the round is void
 * (and a step answered otherwise than by running is a failure, which its reader reports). */
static wait_result wait_pending(double want, double floor, const int *sent, int n)
{
    double deadline = now_s() + 60;
    while (now_s() < deadline) {
        double pending = metric_value(d.port, PENDING);
        bool ended = blocker_ended() || step_answered(sent, n);
        if (pending == want && !ended)
            return WAIT_OK;
        if ((pending >= 0 && pending < floor) || ended)
            return WAIT_STARTED;
        sleep_ms(1);
    }
    return WAIT_TIMEOUT;
}

/* Reads the replies of a void round's steps 0..last: each ran (200), or is the step with a bad
 * key, which fails when it runs (400); any other status is a refusal, a failure. */
static void void_round_replies(const char *seq, int fds[], int last)
{
    float out[WIDTH];
    for (int j = 0; j <= last; j++) {
        if (fds[j] < 0)
            continue;
        int status = read_reply(fds[j], out);
        CHECKF(status == 200 || (j == BAD_STEP && status == 400),
               "step %d of sequence %s, sent behind the blockers: status %d", j, seq, status);
    }
}

/* Sends one long /v1/attention request per worker (each about blocker_rows^2 scores, far
 * longer than the test takes to send its steps) and waits until they hold every worker;
 * WAIT_STARTED when one ended before they did (the round is void). */
static wait_result blockers_start(void)
{
    size_t len = 0;
    char *body = slow_attention_body(blocker_rows, blocker_rows, &len);
    char head[256];
    bool ok = body != NULL;
    for (int b = 0; b < threads; b++) {
        int n = snprintf(head, sizeof head,
                         "POST /v1/attention HTTP/1.1\r\nHost: t\r\nContent-Type: "
                         "application/json\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
                         len);
        blockers[b] = ok ? raw_connect(d.port) : -1;
        ok = ok && blockers[b] >= 0 && raw_send(blockers[b], head, (size_t)n) == 0 &&
             raw_send(blockers[b], body, len) == 0;
    }
    free(body);
    double deadline = now_s() + 60;
    while (ok && now_s() < deadline && !blocker_ended() &&
           metric_value(d.port, "attnd_running_requests") +
                   metric_value(d.port, "attnd_queue_depth") <
               threads)
        sleep_ms(2);
    if (ok && blocker_ended())
        return WAIT_STARTED;
    CHECKF(ok && now_s() < deadline, "the blockers did not start");
    return ok && now_s() < deadline ? WAIT_OK : WAIT_TIMEOUT;
}

/* Hangs the blockers up: the daemon cancels them, and the steps behind them run. */
static void blockers_stop(void)
{
    for (int b = 0; b < threads; b++) {
        if (blockers[b] >= 0)
            close(blockers[b]);
        blockers[b] = -1;
    }
}

/* ---- The order ---------------------------------------------------------------------------- */

/* The steps of one burst, in the order they are sent. */
static void burst_steps(step st[STEPS], uint64_t *rng)
{
    memset(st, 0, STEPS * sizeof *st);
    for (int i = 0; i < STEPS; i++) {
        step_value(&st[i], i == 0, rng);
        /* Every third step jumps the queue: a pool that ran them by priority alone would run
         * step 2 before the START. */
        st[i].priority = i % 3 == 2 ? 1 : 0;
    }
    st[0].start = true;
    st[STEPS - 1].end = true;
    st[BAD_STEP].bad_shape = true;
    st[LATE_STEP].timeout_ms = 100;
}

/* Sends the burst of sequence `seq` behind the blockers, one step once the one before it is in;
 * false when the round is void (a blocker ended on its own; fds[i] are then all read). */
static bool burst_send(const char *seq, const step st[STEPS], int fds[STEPS])
{
    double pending = 0;
    float out[WIDTH];
    for (int i = 0; i < STEPS; i++)
        fds[i] = -1;
    for (int i = 0; i < STEPS; i++) {
        wait_result w;
        fds[i] = send_step(seq, &st[i]);
        if (fds[i] < 0)
            return false;
        if (i == LATE_STEP) {
            /* Answered 504 while it waits (its ticket outlives it); then no longer pending. A
             * 200 says it ran: the round is void. */
            int status = read_reply(fds[i], out);
            fds[i] = -1;
            CHECKF(status == 504 || status == 200, "the step that times out waiting: status %d",
                   status);
            w = status == 504 ? wait_pending(pending, pending, fds, i + 1) : WAIT_STARTED;
        } else {
            pending++;
            w = wait_pending(pending, pending - 1, fds, i + 1);
        }
        if (w == WAIT_OK && i == HUNG_UP_STEP) {
            close(fds[i]); /* the watcher notices the hang-up and answers it */
            fds[i] = -1;
            pending--;
            w = wait_pending(pending, pending, fds, i + 1);
        }
        if (w != WAIT_OK) {
            CHECKF(w != WAIT_TIMEOUT, "step %d of sequence %s was never admitted", i, seq);
            void_round_replies(seq, fds, i);
            return false;
        }
    }
    return true;
}

/* Reads the burst's replies and checks each against the history in arrival order. */
static void burst_check(const char *seq, const step st[STEPS], int fds[STEPS])
{
    history h = {0};
    float out[WIDTH];
    for (int i = 0; i < STEPS; i++) {
        if (fds[i] < 0)
            continue; /* read already (LATE_STEP) or hung up */
        int status = read_reply(fds[i], out);
        if (i == BAD_STEP) {
            CHECKF(status == 400, "sequence %s, the step with a bad key: %d", seq, status);
            continue;
        }
        CHECKF(status == 200, "sequence %s, step %d (in arrival order): status %d", seq, i, status);
        memcpy(h.value[h.n++], st[i].value, sizeof st[i].value);
        if (status == 200)
            check_output(seq, i, &h, out);
    }
}

/* After its END the sequence is gone: the next request needs START, in Triton's words. */
static void check_ended(const char *seq)
{
    step st = {0};
    float out[WIDTH];
    int fd = send_step(seq, &st);
    if (fd >= 0)
        CHECK_EQ_INT(read_reply(fd, out), 400);
}

/* Sequence `n`'s id as JSON text: 100 or "chat-100" (each round names its own, which its log
 * lines and failures then tell apart). */
static void sequence_id(char id[32], bool string_ids, int n)
{
    if (string_ids)
        snprintf(id, 32, "\"chat-%d\"", n);
    else
        snprintf(id, 32, "%d", n);
}

/* Runs the burst (on sequence ids 100, 101... or "chat-100"...) until a round is valid. */
static void run_order(bool string_ids)
{
    uint64_t rng = 16;
    step st[STEPS];
    int fds[STEPS];
    burst_steps(st, &rng);
    for (int round = 0; round < BLOCKER_ROUNDS; round++, blocker_rows *= 2) {
        char id[32];
        if (round > 0 && !fresh_daemon())
            return;
        sequence_id(id, string_ids, 100 + round);
        /* Before any step of the round can have run. */
        double steps_before = fmax(0, metric_value(d.port, "attnd_session_step_seconds_count"));
        double admitted_before = metric_value(d.port, "attnd_session_steps_admitted_total");
        wait_result held = blockers_start();
        if (held == WAIT_TIMEOUT)
            return;
        bool valid = held == WAIT_OK && burst_send(id, st, fds);
        blockers_stop();
        if (valid) {
            burst_check(id, st, fds);
            /* Every step of the burst was admitted in its place, the failed ones included. */
            CHECK(metric_value(d.port, "attnd_session_steps_admitted_total") ==
                  admitted_before + STEPS);
            check_ended(id);
            /* All but the refused, timed-out and abandoned steps count as session steps, and the
             * access log names their session. */
            CHECK(metric_wait(d.port, "attnd_session_step_seconds_count", steps_before + STEPS - 3,
                              5000));
            CHECK(daemon_log_lines(&d, "/infer\"", "\"session\":\"", STEPS - 3, 5000) >= STEPS - 3);
            return;
        }
        printf("note: a blocker of %lld rows ended before the steps were in; again, longer\n",
               (long long)blocker_rows);
    }
    CHECKF(0, "no blocker outlasted the sending of %d steps", STEPS);
}

/* ---- The drain ---------------------------------------------------------------------------- */

/* Reads the drain's replies: each step ran, in order, on the history before it. */
static void drain_check(const char *seq, const step st[DRAIN_STEPS], int fds[DRAIN_STEPS])
{
    history h = {0};
    float out[WIDTH];
    for (int i = 0; i < DRAIN_STEPS; i++) {
        int status = read_reply(fds[i], out);
        CHECKF(status == 200, "draining, step %d: status %d", i, status);
        memcpy(h.value[h.n++], st[i].value, sizeof st[i].value);
        if (status == 200)
            check_output(seq, i, &h, out);
    }
}

/* Sends the drain's steps behind the blockers, one once the one before it is in; false when
 * the round is void (a blocker ended on its own; the replies are then all read). */
static bool drain_send(const char *seq, const step st[DRAIN_STEPS], int fds[DRAIN_STEPS])
{
    for (int i = 0; i < DRAIN_STEPS; i++) {
        fds[i] = send_step(seq, &st[i]);
        wait_result w = fds[i] < 0 ? WAIT_STARTED : wait_pending(i + 1, i, fds, i + 1);
        if (w != WAIT_OK) {
            CHECKF(w != WAIT_TIMEOUT, "draining, step %d of sequence %s was never admitted", i,
                   seq);
            void_round_replies(seq, fds, i);
            return false;
        }
    }
    return true;
}

/* SIGTERM while a sequence's steps wait behind the blockers (sequence ids 200, 201... or
 * "chat-200"...): every step still runs, in order, and the daemon exits 0 (a ticket that never
 * ended would hold the drain to its timeout and answer the steps after it 503). */
static void run_drain(bool string_ids)
{
    uint64_t rng = 17;
    step st[DRAIN_STEPS];
    int fds[DRAIN_STEPS];
    memset(st, 0, sizeof st);
    for (int i = 0; i < DRAIN_STEPS; i++) {
        step_value(&st[i], i == 0, &rng);
        st[i].priority = i % 2 ? 1 : 0;
    }
    st[0].start = true;
    for (int round = 0; round < BLOCKER_ROUNDS; round++, blocker_rows *= 2) {
        char id[32];
        if (!fresh_daemon())
            return;
        sequence_id(id, string_ids, 200 + round);
        wait_result held = blockers_start();
        if (held == WAIT_TIMEOUT)
            break;
        if (held == WAIT_OK && drain_send(id, st, fds)) {
            CHECK_EQ_INT(daemon_signal(&d, SIGTERM), 0);
            blockers_stop();
            drain_check(id, st, fds);
            CHECK_EQ_INT(daemon_wait(&d, 30000), 0);
            CHECK_EQ_INT(daemon_stop(&d), 0);
            return;
        }
        blockers_stop();
        printf("note: a blocker of %lld rows ended before the steps were in; again, longer\n",
               (long long)blocker_rows);
        if (round == BLOCKER_ROUNDS - 1)
            CHECKF(0, "no blocker outlasted the sending of %d steps", DRAIN_STEPS);
    }
    CHECK_EQ_INT(daemon_stop(&d), 0);
}

static void test_steps_keep_arrival_order_on_one_worker(void)
{
    if (!start(1))
        return;
    run_order(false);
    run_drain(false); /* stops the daemon */
}

static void test_steps_keep_arrival_order_on_two_workers(void)
{
    if (!start(2))
        return;
    run_order(true);
    run_drain(true); /* stops the daemon */
}

/* Compressed steps take their place in the sequence as they arrive (the server inflates them
 * there): a gzip START and END around a step that inflates past API_PEEK_INFLATE_MAX, which
 * could not and is refused with 413 naming parameters.sequence_id; the END's output is then
 * the mean of the START's value and its own, the refused step's absent. */
static void test_compressed_steps_keep_their_place(void)
{
    if (!start(1))
        return;
    uint64_t rng = 18;
    step st[3];
    float out[WIDTH];
    memset(st, 0, sizeof st);
    for (int i = 0; i < 3; i++) {
        step_value(&st[i], i == 0, &rng);
        st[i].gzip = true;
    }
    st[0].start = true;
    st[1].pad = ((size_t)4 << 20) + 1;
    st[2].end = true;
    double admitted = metric_value(d.port, "attnd_session_steps_admitted_total");
    CHECK_EQ_INT(read_reply(send_step("500", &st[0]), out), 200);
    CHECK(metric_value(d.port, "attnd_session_steps_admitted_total") == admitted + 1);
    int fd = send_step("500", &st[1]);
    bool closed = false;
    char *resp = fd >= 0 ? raw_read_all(fd, 60000, &closed) : NULL;
    CHECKF(raw_status(resp) == 413 && strstr(resp, "parameters.sequence_id") &&
               strstr(resp, "4194304 bytes"),
           "a gzip step past the cap: %.400s", resp ? resp : "(none)");
    free(resp);
    if (fd >= 0)
        close(fd);
    history h = {.n = 1};
    memcpy(h.value[0], st[0].value, sizeof st[0].value);
    CHECK_EQ_INT(read_reply(send_step("500", &st[2]), out), 200);
    memcpy(h.value[h.n++], st[2].value, sizeof st[2].value);
    check_output("500", 2, &h, out);
    CHECK(metric_value(d.port, "attnd_session_steps_admitted_total") == admitted + 2);
    CHECK_EQ_INT(daemon_stop(&d), 0);
}

int main(void)
{
    RUN_WITHIN(test_steps_keep_arrival_order_on_one_worker, 300);
    RUN_WITHIN(test_steps_keep_arrival_order_on_two_workers, 300);
    RUN_WITHIN(test_compressed_steps_keep_their_place, 120);
    return check_report();
}
