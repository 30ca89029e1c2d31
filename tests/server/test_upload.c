/*
 * test_upload.c - the bodies on their way (server/upload.h) and the admission that judges a
 * request from its headers by them: the meter's bytes, work and learned rate with times passed in,
 * so that every case is exact; then a daemon whose clients are raw sockets trickling bytes at a
 * pace the test sets. What the daemon measures of a trickled body can only be slower than the
 * test's pace, so a request whose body would take many times its deadline at that pace is
 * refused on any machine, and the test never reads this machine's speed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "server/upload.h"
#include "tests/support/check.h"
#include "tests/support/daemon.h"
#include "tests/support/grpc.h"

#define MS  ((int64_t)1000 * 1000)
#define SEC ((int64_t)1000 * MS)
#define KiB ((uint64_t)1024)
#define MiB (KiB * KiB)

#define IN_FLIGHT "attnd_upload_bytes_in_flight"
#define RATE      "attnd_upload_rate_bytes_per_second"

/* ---- The meter ------------------------------------------------------------------------------ */

static uint64_t in_flight(srv_uploads *u, int64_t now)
{
    uint64_t bytes, rate;
    srv__uploads_state(u, now, &bytes, &rate);
    return bytes;
}

static uint64_t rate_at(srv_uploads *u, int64_t now)
{
    uint64_t bytes, rate;
    srv__uploads_state(u, now, &bytes, &rate);
    return rate;
}

/* Admits a body of `length` bytes whose bytes arrive from `first` to `last`: the meter learns
 * from it. */
static void arrive(srv_uploads *u, uint64_t length, int64_t first, int64_t last)
{
    srv_upload up = {0};
    srv_upload_outlook look;
    CHECK(srv__uploads_begin(u, &up, length, 0, first, &look));
    srv__uploads_received(u, &up, 1, first);
    srv__uploads_received(u, &up, length - 1, last);
    srv__uploads_end(u, &up, true, last);
}

/* A body admitted from its headers counts from its first byte to its last, by the bytes still
 * to come: announced and not sent, it holds nothing. */
static void test_a_body_counts_from_its_first_byte_to_its_last(void)
{
    srv_uploads *u = srv__uploads_new(10 * MiB);
    srv_upload up = {0};
    srv_upload_outlook look;
    CHECK(srv__uploads_begin(u, &up, MiB, 0, 0, &look));
    CHECK_EQ_INT(look.in_flight, 0);
    CHECK_EQ_INT(in_flight(u, 0), 0);
    srv__uploads_received(u, &up, 400 * KiB, MS);
    CHECK_EQ_INT(in_flight(u, MS), MiB - 400 * KiB);
    srv__uploads_received(u, &up, MiB, 2 * MS); /* never more than it announced */
    CHECK_EQ_INT(in_flight(u, 2 * MS), 0);
    srv__uploads_end(u, &up, true, SEC);
    srv__uploads_end(u, &up, true, SEC); /* a second end does nothing */
    CHECK_EQ_INT(in_flight(u, SEC), 0);
    srv__uploads_free(u);
}

/* A body that would take the bytes on their way past the bound is not admitted (its request is
 * refused); once bytes of the others arrive, or they end unfinished, it fits. Bodies announced
 * and not sent take none of the bound, one that arrives in one read is never refused or
 * counted, and one arriving alone is admitted whatever its size. */
static void test_the_bound_refuses_what_would_pass_it(void)
{
    srv_uploads *u = srv__uploads_new(MiB);
    srv_upload a = {0}, b = {0}, c = {0}, small = {0}, silent[4] = {{0}};
    srv_upload_outlook look;
    for (int i = 0; i < 4; i++)
        CHECK(srv__uploads_begin(u, &silent[i], MiB, 0, 0, &look));
    CHECK(srv__uploads_begin(u, &a, 600 * KiB, 0, 0, &look));
    srv__uploads_received(u, &a, 1, 0);
    CHECK(!srv__uploads_begin(u, &b, 500 * KiB, 0, 0, &look));
    CHECK_EQ_INT(look.in_flight, 600 * KiB - 1);
    CHECK_EQ_INT(look.max, MiB);
    CHECK(!b.admitted);
    srv__uploads_received(u, &a, 200 * KiB - 1, 0);
    CHECK(srv__uploads_begin(u, &b, 500 * KiB, 0, 0, &look));
    srv__uploads_received(u, &b, 1, 0);
    CHECK(!srv__uploads_begin(u, &c, 200 * KiB, 0, 0, &look));
    srv__uploads_end(u, &a, false, SEC); /* cut off: its 400 KiB are no longer coming */
    CHECK_EQ_INT(in_flight(u, SEC), 500 * KiB - 1);
    CHECK(srv__uploads_begin(u, &c, 200 * KiB, 0, 0, &look));
    CHECK(!srv__uploads_begin(u, &a, MiB + 1, 0, 0, &look)); /* past the bound, not alone */
    srv__uploads_received(u, &c, 1, SEC);                    /* 700 KiB - 2 on their way */
    CHECK(!srv__uploads_begin(u, &small, 400 * KiB, 0, 0, &look));
    CHECK(srv__uploads_begin(u, &small, SRV_UPLOAD_COUNT_MIN - 1, 0, 0, &look));
    CHECK(!small.admitted);
    srv__uploads_received(u, &small, 100, SEC);
    CHECK_EQ_INT(in_flight(u, SEC), 700 * KiB - 2);
    srv__uploads_end(u, &b, false, SEC);
    srv__uploads_end(u, &c, false, SEC);
    CHECK_EQ_INT(in_flight(u, SEC), 0);
    CHECK(srv__uploads_begin(u, &a, 2 * MiB, 0, SEC, &look)); /* more than the bound, alone */
    CHECK(a.admitted);
    srv__uploads_free(u);
}

/* The work the bodies on their way bring waits ahead of a body admitted after them, from their
 * first byte until they arrive (and wait with the scheduler) or end unfinished. */
static void test_the_work_of_bodies_on_their_way_is_ahead(void)
{
    srv_uploads *u = srv__uploads_new(100 * MiB);
    srv_upload a = {0}, b = {0}, c = {0};
    srv_upload_outlook look;
    CHECK(srv__uploads_begin(u, &a, MiB, 30 * MS, 0, &look));
    CHECK_EQ_INT(look.ahead_ns, 0);
    CHECK(srv__uploads_begin(u, &b, MiB, 20 * MS, 0, &look));
    CHECK_EQ_INT(look.ahead_ns, 0); /* a has sent nothing yet */
    srv__uploads_received(u, &a, 1, 0);
    srv__uploads_received(u, &b, 1, 0);
    CHECK(srv__uploads_begin(u, &c, MiB, 0, 0, &look));
    CHECK_EQ_INT(look.ahead_ns, 50 * MS);
    srv__uploads_end(u, &a, true, SEC);
    CHECK(srv__uploads_begin(u, &c, MiB, 0, SEC, &look));
    CHECK_EQ_INT(look.ahead_ns, 20 * MS);
    srv__uploads_end(u, &b, false, SEC);
    CHECK(srv__uploads_begin(u, &c, MiB, 0, SEC, &look));
    CHECK_EQ_INT(look.ahead_ns, 0);
    srv__uploads_free(u);
}

/* The rate is the intake: none until a body of SRV_UPLOAD_SAMPLE_MIN or more arrives (no arrival
 * is predicted meanwhile); then one body's bytes per second from its first byte to its last,
 * times the mean number of bodies arriving with it. It rises half of the way to a faster body
 * and falls an eighth of the way to a slower one. */
static void test_the_rate_is_the_intake_bodies_arrived_at(void)
{
    srv_uploads *u = srv__uploads_new(100 * MiB);
    srv_upload a = {0}, b = {0};
    srv_upload_outlook look;
    CHECK(srv__uploads_begin(u, &a, 2 * MiB, 0, 0, &look));
    CHECK_EQ_INT(look.rate, 0);
    CHECK_EQ_INT(look.arrive_ns, 0);
    arrive(u, 2 * MiB, 0, 2 * SEC); /* alone: 1 MiB/s */
    CHECK_EQ_INT(rate_at(u, 2 * SEC), MiB);
    /* Two bodies of 1 MiB arriving side by side over 2 s: 0.5 MiB/s each, 1 MiB/s taken in. */
    CHECK(srv__uploads_begin(u, &a, MiB, 0, 3 * SEC, &look));
    CHECK(srv__uploads_begin(u, &b, MiB, 0, 3 * SEC, &look));
    srv__uploads_received(u, &a, 1, 3 * SEC);
    srv__uploads_received(u, &b, 1, 3 * SEC);
    srv__uploads_received(u, &a, MiB - 1, 5 * SEC);
    srv__uploads_received(u, &b, MiB - 1, 5 * SEC);
    srv__uploads_end(u, &a, true, 5 * SEC);
    srv__uploads_end(u, &b, true, 5 * SEC);
    CHECK_EQ_INT(rate_at(u, 5 * SEC), MiB);
    arrive(u, 3 * MiB, 6 * SEC, 6 * SEC + SEC / 3); /* 9 MiB/s: up half of the way */
    CHECK_EQ_INT(rate_at(u, 7 * SEC), 5 * MiB);
    arrive(u, 3 * MiB, 8 * SEC, 11 * SEC); /* 1 MiB/s: down an eighth of the way */
    CHECK_EQ_INT(rate_at(u, 11 * SEC), 4 * MiB + MiB / 2);
    srv__uploads_free(u);
}

/* A body's arrival is predicted from the bytes still to come on every body arriving, its own
 * included, at the rate: fewer bodies on their way, sooner; alone on its way, none is predicted
 * (the rate was learned in another spell, and only a body let in can teach a better one). */
static void test_arrival_counts_the_bytes_of_every_body_on_its_way(void)
{
    srv_uploads *u = srv__uploads_new(100 * MiB);
    srv_upload a = {0}, b = {0};
    srv_upload_outlook look;
    arrive(u, MiB, 0, SEC); /* 1 MiB/s */
    CHECK(srv__uploads_begin(u, &a, 3 * MiB, 30 * MS, SEC, &look));
    CHECK_EQ_INT(look.arrive_ns, 0); /* alone */
    srv__uploads_received(u, &a, MiB, SEC);
    CHECK(srv__uploads_begin(u, &b, 4 * MiB, 20 * MS, SEC, &look));
    CHECK_EQ_INT(look.arrive_ns, 6 * SEC); /* a's 2 MiB to come and its own 4 */
    srv__uploads_received(u, &b, 3 * MiB, SEC);
    srv__uploads_look(u, &b, SEC, &look);
    CHECK_EQ_INT(look.to_come, MiB);
    CHECK_EQ_INT(look.arrive_ns, 3 * SEC);
    CHECK_EQ_INT(look.ahead_ns, 30 * MS); /* a's */
    srv__uploads_end(u, &a, false, SEC);
    srv__uploads_look(u, &b, SEC, &look);
    CHECK_EQ_INT(look.arrive_ns, 0); /* alone again */
    CHECK_EQ_INT(look.ahead_ns, 0);
    srv__uploads_free(u);
}

/* A body smaller than SRV_UPLOAD_SAMPLE_MIN arrives in one read and measures nothing; one that
 * ends unfinished measures nothing either; and a rate nothing confirmed for
 * SRV_UPLOAD_RATE_TTL_NS is forgotten, so that it predicts no arrival. */
static void test_what_the_rate_does_not_learn_and_forgets(void)
{
    srv_uploads *u = srv__uploads_new(100 * MiB);
    srv_upload up = {0};
    srv_upload_outlook look;
    arrive(u, SRV_UPLOAD_SAMPLE_MIN - 1, 0, SEC);
    CHECK(srv__uploads_begin(u, &up, 8 * MiB, 0, SEC, &look));
    srv__uploads_received(u, &up, 1, SEC);
    srv__uploads_end(u, &up, false, 2 * SEC);
    CHECK_EQ_INT(rate_at(u, 2 * SEC), 0);
    arrive(u, MiB, 3 * SEC, 4 * SEC);
    CHECK_EQ_INT(rate_at(u, 4 * SEC + SRV_UPLOAD_RATE_TTL_NS), MiB);
    CHECK_EQ_INT(rate_at(u, 4 * SEC + SRV_UPLOAD_RATE_TTL_NS + 1), 0);
    srv_upload other = {0};
    CHECK(srv__uploads_begin(u, &other, MiB, 0, 4 * SEC, &look));
    srv__uploads_received(u, &other, 1, 4 * SEC); /* not alone */
    CHECK(srv__uploads_begin(u, &up, 8 * MiB, 0, 4 * SEC + SRV_UPLOAD_RATE_TTL_NS, &look));
    CHECK(look.arrive_ns > 8 * SEC);
    CHECK(srv__uploads_begin(u, &up, 8 * MiB, 0, 4 * SEC + SRV_UPLOAD_RATE_TTL_NS + 1, &look));
    CHECK_EQ_INT(look.arrive_ns, 0);
    srv__uploads_free(u);
}

/* ---- The daemon ----------------------------------------------------------------------------- */

/* A response read, for a message: "(nothing)" when none was. */
static const char *text(const char *resp)
{
    return resp ? resp : "(nothing)";
}

/* Sends the head of a POST /v1/attention announcing `len` bytes, with the `extra` header lines
 * ("Name: value\r\n"... or ""), on a new connection; its socket, or -1. */
static int post_head(int port, uint64_t len, const char *extra)
{
    char head[320];
    int fd = raw_connect(port);
    snprintf(head, sizeof head,
             "POST /v1/attention HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
             "%sContent-Length: %llu\r\n\r\n",
             extra, (unsigned long long)len);
    if (fd >= 0 && raw_send(fd, head, strlen(head)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* A body of `len` bytes of JSON its route answers 422 (a string where a tensor goes), sent
 * in `pieces` pieces `gap_ms` apart: it arrives no faster than len / ((pieces - 1) gap_ms). */
static void trickle(int fd, uint64_t len, int pieces, int gap_ms)
{
    char *body = malloc(len);
    uint64_t piece = len / (uint64_t)pieces, sent = 0;
    if (!body) {
        CHECK(0);
        return;
    }
    memset(body, 'x', len);
    memcpy(body, "{\"query\":\"", 10);
    memcpy(body + len - 2, "\"}", 2);
    for (int i = 0; i < pieces; i++) {
        uint64_t n = i + 1 == pieces ? len - sent : piece;
        if (i > 0)
            sleep_ms(gap_ms);
        CHECK(raw_send(fd, body + sent, n) == 0);
        sent += n;
    }
    free(body);
}

/* Starts a ModelInfer call with `headers` (grpc_start's) whose message is `len` bytes of 'x',
 * sending its prefix and `sent` bytes of it (all of it, and the stream's end, when sent == len).
 * The framed bytes are *framed's until the call is over. */
static void grpc_infer_start(grpc_client *c, grpc_stream *st, const char *const *headers,
                             size_t len, size_t sent, char **framed)
{
    char *msg = malloc(len);
    size_t n = 0;
    memset(st, 0, sizeof *st);
    *framed = NULL;
    if (!msg) {
        CHECK(0);
        return;
    }
    memset(msg, 'x', len);
    *framed = grpc_frame(msg, len, &n);
    free(msg);
    st->body = *framed;
    st->body_len = 5 + sent;
    st->keep_open = sent < len;
    CHECK(*framed && grpc_start(c, "/inference.GRPCInferenceService/ModelInfer", headers, st) == 0);
    for (int i = 0; i < 200 && st->body_off < st->body_len; i++)
        grpc_pump(c, 50);
}

/* A daemon with --grpc-port (*grpc_port) that learned its rate from one trickled body: 512 KiB
 * in 9 pieces 250 ms apart. Returns the seconds the client took from its head to the reply,
 * which bound the time the daemon measured, so that its rate is at least 512 KiB over them; 0
 * when it failed. */
static double start_after_a_trickle(daemon_proc *d, const char *const *args, int *grpc_port)
{
    double t0;
    char *resp;
    int fd;
    if (daemon_start_grpc(d, args, grpc_port) != 0)
        return 0;
    t0 = now_s();
    fd = post_head(d->port, 512 * KiB, "");
    CHECK(fd >= 0);
    if (fd < 0)
        return 0;
    trickle(fd, 512 * KiB, 9, 250);
    resp = raw_read_response(fd, 10000);
    t0 = now_s() - t0;
    CHECKF(raw_status(resp) == 422, "the trickled body got %.120s", text(resp));
    free(resp);
    close(fd);
    printf("  a trickle of 512 KiB in %.2f s: the daemon learned %.0f KiB/s\n", t0,
           metric_value(d->port, RATE) / 1024);
    CHECK(metric_value(d->port, RATE) > 0);
    return t0;
}

/* A body that cannot arrive by its deadline at the rate the daemon takes bodies in, behind the
 * bytes still to come on the bodies before it, gets 429 with Retry-After as soon as its headers
 * are in, naming the deadline and the rate: a client that reads while it sends has the answer
 * before it sends a byte of the body, and one waiting for "100 Continue" never sends it. Nothing
 * of it is counted on its way. Here, behind a stalled upload with 100 KiB to come, 8 MiB would
 * take over 16 s at the trickle's 512 KiB over its two seconds of pauses, against a deadline of
 * 3 s; and so would a gRPC message of 8 MiB against its grpc-timeout of 3 s, refused from its
 * prefix. A body that can arrive in time is read: 128 KiB behind the 100 KiB, within the deadline
 * at 512 KiB over the trickle's time whenever the trickle took less than 6 s. */
static void test_the_learned_rate_judges_a_body_from_its_headers(void)
{
    const char *const args[] = {"--request-timeout-ms", "3000", "--io-threads", "2", NULL};
    const char *const extras[] = {"", "Expect: 100-continue\r\n"};
    const char *const grpc_timeout[] = {"grpc-timeout", "3S", NULL};
    daemon_proc d;
    int grpc_port = 0;
    double trickle_s = start_after_a_trickle(&d, args, &grpc_port);
    grpc_client c;
    grpc_stream st;
    char *resp, *framed = NULL;
    int fd, stalled;
    if (trickle_s <= 0) {
        CHECK(0);
        return;
    }
    stalled = post_head(d.port, 100 * KiB + 1, "");
    CHECK(stalled >= 0 && raw_send(stalled, "{", 1) == 0);
    CHECK(metric_wait(d.port, IN_FLIGHT, 100 * KiB, 5000));
    for (int i = 0; i < 2; i++) {
        fd = post_head(d.port, 8 * MiB, extras[i]);
        resp = fd >= 0 ? raw_read_response(fd, 10000) : NULL;
        CHECKF(raw_status(resp) == 429, "%s: %.200s", extras[i], text(resp));
        CHECKF(resp && strstr(resp, "Retry-After: ") != NULL, "no Retry-After: %.200s", text(resp));
        CHECKF(resp && strstr(resp, "--request-timeout-ms 3000") != NULL, "%.300s", text(resp));
        CHECKF(resp && strstr(resp, "bytes to come here and 102400 on other bodies, at") != NULL,
               "%.300s", text(resp));
        CHECKF(resp && !strstr(resp, "100 Continue"), "%.100s", text(resp));
        CHECK(metric_value(d.port, IN_FLIGHT) == 100 * KiB); /* the stalled one's alone */
        free(resp);
        if (fd >= 0)
            close(fd);
    }
    CHECK(metric_wait(d.port, "attnd_rejected_total{reason=\"queue_full\"}", 2, 2000));
    if (grpc_client_open(&c, grpc_port) == 0) {
        grpc_infer_start(&c, &st, grpc_timeout, 8 * MiB, 0, &framed);
        CHECK(grpc_wait(&c, &st, 10000));
        CHECKF(st.grpc_status == 8 && strstr(st.message, "grpc-timeout of 3000 ms") &&
                   strstr(st.message, "on other bodies, at"),
               "grpc-status %d: %.300s", st.grpc_status, st.message);
        grpc_stream_free(&st);
        free(framed);
        grpc_client_close(&c);
    } else {
        CHECK(0);
    }
    fd = trickle_s < 6 ? post_head(d.port, 128 * KiB, "") : -1;
    if (fd >= 0) {
        trickle(fd, 128 * KiB, 1, 0);
        resp = raw_read_response(fd, 10000);
        CHECKF(raw_status(resp) == 422, "%.200s", text(resp));
        free(resp);
        close(fd);
    }
    if (stalled >= 0)
        close(stalled);
    CHECK_EQ_INT(daemon_stop(&d), 0);
}

/* The body bytes on their way are bounded by --max-upload-bytes: while one upload of 768 KiB
 * stalls after its first 64 KiB, a request announcing 512 KiB gets 429 from its headers, naming
 * the flag, and one announcing 200 KiB is read. Once the stalled client goes away its bytes are
 * no longer on their way, and the 512 KiB request is read too. */
static void test_bodies_on_their_way_are_bounded(void)
{
    const char *const args[] = {"--max-upload-bytes", "1MiB", "--io-threads", "2", NULL};
    daemon_proc d;
    int stalled, fd;
    char *resp;
    if (daemon_start(&d, args) != 0) {
        CHECK(0);
        return;
    }
    stalled = post_head(d.port, 768 * KiB, "");
    CHECK(stalled >= 0 && raw_send(stalled, "{\"query\":\"", 10) == 0);
    CHECK(metric_wait(d.port, IN_FLIGHT, 768 * KiB - 10, 5000));

    fd = post_head(d.port, 512 * KiB, "");
    resp = fd >= 0 ? raw_read_response(fd, 10000) : NULL;
    CHECKF(raw_status(resp) == 429, "%.200s", text(resp));
    CHECKF(resp && strstr(resp, "--max-upload-bytes (1048576)") != NULL, "%.300s", text(resp));
    CHECK(resp && strstr(resp, "Retry-After: 1") != NULL);
    free(resp);
    if (fd >= 0)
        close(fd);

    for (int i = 0; i < 2; i++) {
        uint64_t len = i == 0 ? 200 * KiB : 512 * KiB;
        if (i == 1) {
            close(stalled);
            CHECK(metric_wait_le(d.port, IN_FLIGHT, 0, 5000));
        }
        fd = post_head(d.port, len, "");
        CHECK(fd >= 0);
        if (fd < 0)
            continue;
        trickle(fd, len, 1, 0);
        resp = raw_read_response(fd, 10000);
        CHECKF(raw_status(resp) == 422, "%llu bytes: %.200s", (unsigned long long)len, text(resp));
        free(resp);
        close(fd);
    }
    CHECK_EQ_INT(daemon_stop(&d), 0);
}

/* gRPC's messages are bodies on their way as HTTP's are, each judged from its 5-byte prefix
 * before any of it is read: while a ModelInfer message of 768 KiB stalls after its first 64 KiB,
 * an HTTP body of 512 KiB gets 429 and another call's message of 512 KiB RESOURCE_EXHAUSTED,
 * both naming --max-upload-bytes. Once the stalled call is cancelled its bytes are no longer on
 * their way, and the 512 KiB message is read (and answered as what it is: a ModelInferRequest,
 * all unknown fields, that names no model). */
static void test_grpc_messages_are_bodies_on_their_way(void)
{
    const char *const args[] = {"--max-upload-bytes", "1MiB", "--io-threads", "2", NULL};
    daemon_proc d;
    grpc_client c;
    grpc_stream stalled, refused, read;
    char *framed[3] = {NULL, NULL, NULL}, *resp;
    int grpc_port, fd;
    if (daemon_start_grpc(&d, args, &grpc_port) != 0) {
        CHECK(0);
        return;
    }
    if (grpc_client_open(&c, grpc_port) != 0) {
        CHECK(0);
        daemon_stop(&d);
        return;
    }
    grpc_infer_start(&c, &stalled, NULL, 768 * KiB, 64 * KiB, &framed[0]);
    CHECK(metric_wait(d.port, IN_FLIGHT, 704 * KiB, 5000));

    fd = post_head(d.port, 512 * KiB, "");
    resp = fd >= 0 ? raw_read_response(fd, 10000) : NULL;
    CHECKF(raw_status(resp) == 429, "%.200s", text(resp));
    CHECKF(resp && strstr(resp, "--max-upload-bytes (1048576)") != NULL, "%.300s", text(resp));
    free(resp);
    if (fd >= 0)
        close(fd);

    grpc_infer_start(&c, &refused, NULL, 512 * KiB, 512 * KiB, &framed[1]);
    CHECK(grpc_wait(&c, &refused, 10000));
    CHECKF(refused.grpc_status == 8 && strstr(refused.message, "--max-upload-bytes (1048576)"),
           "grpc-status %d: %.300s", refused.grpc_status, refused.message);
    CHECK(metric_value(d.port, IN_FLIGHT) == 704 * KiB); /* the stalled one's alone */

    grpc_cancel(&c, &stalled);
    CHECK(metric_wait_le(d.port, IN_FLIGHT, 0, 5000));
    grpc_infer_start(&c, &read, NULL, 512 * KiB, 512 * KiB, &framed[2]);
    CHECK(grpc_wait(&c, &read, 10000));
    CHECKF(read.grpc_status == 5 && strstr(read.message, "unknown model"), "grpc-status %d: %.300s",
           read.grpc_status, read.message);

    grpc_stream_free(&stalled);
    grpc_stream_free(&refused);
    grpc_stream_free(&read);
    for (int i = 0; i < 3; i++)
        free(framed[i]);
    grpc_client_close(&c);
    CHECK_EQ_INT(daemon_stop(&d), 0);
}

int main(void)
{
    RUN(test_a_body_counts_from_its_first_byte_to_its_last);
    RUN(test_the_bound_refuses_what_would_pass_it);
    RUN(test_the_work_of_bodies_on_their_way_is_ahead);
    RUN(test_the_rate_is_the_intake_bodies_arrived_at);
    RUN(test_arrival_counts_the_bytes_of_every_body_on_its_way);
    RUN(test_what_the_rate_does_not_learn_and_forgets);
    RUN_WITHIN(test_the_learned_rate_judges_a_body_from_its_headers, 90);
    RUN_WITHIN(test_bodies_on_their_way_are_bounded, 60);
    RUN_WITHIN(test_grpc_messages_are_bodies_on_their_way, 60);
    return check_report();
}
