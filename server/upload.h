/*
 * upload.h - the bodies on their way (upload.c): how fast the daemon takes bodies in, and how many
 * bytes and how much work are still to arrive, so that a request is judged from its headers
 * against what its body will take to arrive, and refused before a byte of it is read.
 *
 *     srv_uploads *u = srv__uploads_new(max_bytes);
 *     srv_upload up;                                     // in the request
 *     srv_upload_outlook look;
 *     if (!srv__uploads_begin(u, &up, content_length, cost_ns, now, &look))
 *         refuse 429: others on their way + content_length pass max_bytes;
 *     else if (look.arrive_ns > time left)                // or with look.ahead_ns, the scheduler's
 *         srv__uploads_end(u, &up, false, now), refuse 429;
 *     ...  srv__uploads_received(u, &up, n, now);       // each piece of the body
 *     srv__uploads_end(u, &up, true, now);              // its last byte (or false: abandoned)
 *
 * A body admitted from its headers counts from its first byte to its last: what is still to
 * come of it against the bound (`max_bytes`), and its expected work as work ahead of the bodies
 * after it. Not before its first byte: a Content-Length is a promise, and clients that announce
 * bodies and send nothing must not hold the bound (so a few bodies admitted at the same moment
 * may together pass it by what they announced).
 *
 * The rate is the daemon's intake: the bytes per second it took in while a body arrived, that
 * body's own rate from its first byte to its last times the mean number of bodies arriving
 * meanwhile (itself included), averaged over recent bodies of at least SRV_UPLOAD_SAMPLE_MIN
 * bytes (a smaller one arrives in one read and measures nothing). A body's arrival is predicted
 * as the bytes still to come, its own and those of the bodies arriving, at that rate: so the
 * prediction shrinks as soon as fewer bodies arrive, without waiting for one to teach it. The
 * rate rises fast and falls slowly, since one too low refuses requests that would have arrived
 * in time, while one too high only admits a few that then wait; one learned more than
 * SRV_UPLOAD_RATE_TTL_NS ago is forgotten, so that a slow spell long over refuses nothing. While
 * no rate is known, and for a body that would arrive alone, no arrival is predicted: a rate too
 * low would otherwise refuse every body, and with none arriving nothing would teach it better.
 *
 * Any thread; one mutex inside. A srv_upload belongs to the request that embeds it; its fields
 * are the meter's.
 */
#ifndef ATTND_SERVER_UPLOAD_H
#define ATTND_SERVER_UPLOAD_H

#include <stdbool.h>
#include <stdint.h>

typedef struct srv_uploads srv_uploads;

/* The smallest body whose arrival teaches the rate. */
#define SRV_UPLOAD_SAMPLE_MIN ((uint64_t)256 * 1024)
/* The smallest body admitted and counted: a smaller one arrives with its headers, or in one read,
 * and weighs on no upload; it is judged by what is on its way, never refused by the bound. */
#define SRV_UPLOAD_COUNT_MIN ((uint64_t)64 * 1024)
/* How long a learned rate holds without a body to confirm it. */
#define SRV_UPLOAD_RATE_TTL_NS ((int64_t)10 * 1000 * 1000 * 1000)

/* One body admitted from its headers, from srv__uploads_begin to srv__uploads_end. */
typedef struct {
    bool admitted; /* between begin and end */
    bool arriving; /* its first byte arrived: it counts */
    uint64_t length, received;
    int64_t cost_ns;   /* the work it brings, counted ahead of the bodies after it */
    int64_t ahead0_ns; /* the work on its way when it began */
    int64_t first_ns;  /* its first byte */
    double area0;      /* the meter's integral of bodies arriving, then */
} srv_upload;

/* What the uploads on their way mean for one body. */
typedef struct {
    uint64_t to_come;   /* its bytes still to arrive */
    int64_t arrive_ns;  /* until they are in: theirs and the others' at the rate (0: none known) */
    int64_t ahead_ns;   /* the expected work of the bodies on their way before it */
    uint64_t rate;      /* the learned intake, bytes per second (0: none) */
    uint64_t in_flight; /* bytes still to arrive on the other bodies */
    uint64_t max;       /* the bound on bytes in flight */
} srv_upload_outlook;

/* A meter whose bodies may have at most `max_bytes` still to arrive (>= 1). NULL when out of
 * memory. */
srv_uploads *srv__uploads_new(uint64_t max_bytes);
void srv__uploads_free(srv_uploads *u); /* NULL is a no-op */

/* Fills *look at `now` for a body of `length` bytes and, when it fits under the bound, admits it
 * in `up` (with `cost_ns` of expected work) and returns true; false admits nothing. A body smaller
 * than SRV_UPLOAD_COUNT_MIN always fits, and is not admitted. */
bool srv__uploads_begin(srv_uploads *u, srv_upload *up, uint64_t length, int64_t cost_ns,
                        int64_t now, srv_upload_outlook *look);

/* Fills *look at `now` for `up` (admitted) as it is then: the arrival of the rest of it, and the
 * work of the other bodies on their way, but no more than was on its way when it began: those
 * that began after it are not ahead of it, though once those before it arrive, the meter, which
 * keeps no order, counts the later ones in their place. */
void srv__uploads_look(srv_uploads *u, const srv_upload *up, int64_t now, srv_upload_outlook *look);

/* `n` more bytes of `up` arrived at `now` (ignored when it is not admitted). */
void srv__uploads_received(srv_uploads *u, srv_upload *up, uint64_t n, int64_t now);

/* `up` is no longer on its way: `complete` when its last byte arrived at `now`, which teaches
 * the rate; false for one refused or abandoned. A no-op for one not admitted. */
void srv__uploads_end(srv_uploads *u, srv_upload *up, bool complete, int64_t now);

/* The bytes still to arrive on the bodies that count, and the rate in force at `now` (0: none),
 * for /metrics. */
void srv__uploads_state(srv_uploads *u, int64_t now, uint64_t *in_flight, uint64_t *rate);

#endif
