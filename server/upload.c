/*
 * upload.c - the meter of upload.h: the bytes and the work of the bodies on their way, and the
 * rate at which recent bodies arrived.
 */
#include "server/upload.h"

#include <pthread.h>
#include <stdlib.h>

struct srv_uploads {
    pthread_mutex_t mu;
    uint64_t max;       /* bound on in_flight */
    uint64_t in_flight; /* bytes still to arrive on the bodies arriving */
    int64_t ahead_ns;   /* the expected work of the bodies arriving */
    double rate;        /* learned bytes per second of one body; 0: none yet */
};

srv_uploads *srv__uploads_new(uint64_t max_bytes)
{
    srv_uploads *u;
    if (max_bytes == 0)
        return NULL;
    u = calloc(1, sizeof *u);
    if (!u)
        return NULL;
    pthread_mutex_init(&u->mu, NULL);
    u->max = max_bytes;
    return u;
}

void srv__uploads_free(srv_uploads *u)
{
    if (!u)
        return;
    pthread_mutex_destroy(&u->mu);
    free(u);
}

/* Fills what *look says of `to_come` more bytes with `ahead_ns` of work before them. mu held. */
static void look_locked(const srv_uploads *u, uint64_t to_come, int64_t ahead_ns,
                        srv_upload_outlook *look)
{
    /* to_come < 2^63 (--max-body-bytes): the quotient is a valid time when it is under 2^63 */
    double arrive = u->rate > 0 ? (double)to_come / u->rate * 1e9 : 0;
    look->to_come = to_come;
    look->arrive_ns = arrive < 9e18 ? (int64_t)arrive : INT64_MAX;
    look->ahead_ns = ahead_ns;
    look->rate = (uint64_t)u->rate;
    look->in_flight = u->in_flight;
    look->max = u->max;
}

bool srv__uploads_begin(srv_uploads *u, srv_upload *up, uint64_t length, int64_t cost_ns,
                        int64_t now, srv_upload_outlook *look)
{
    bool fits;
    pthread_mutex_lock(&u->mu);
    look_locked(u, length, u->ahead_ns, look);
    fits = length < SRV_UPLOAD_COUNT_MIN || (length <= u->max && u->in_flight <= u->max - length);
    if (fits && length >= SRV_UPLOAD_COUNT_MIN)
        *up = (srv_upload){.admitted = true,
                           .length = length,
                           .cost_ns = cost_ns > 0 ? cost_ns : 0,
                           .ahead0_ns = u->ahead_ns,
                           .start_ns = now};
    pthread_mutex_unlock(&u->mu);
    return fits;
}

void srv__uploads_look(srv_uploads *u, const srv_upload *up, srv_upload_outlook *look)
{
    pthread_mutex_lock(&u->mu);
    int64_t others = u->ahead_ns - (up->arriving ? up->cost_ns : 0);
    look_locked(u, up->length - up->received, others < up->ahead0_ns ? others : up->ahead0_ns,
                look);
    pthread_mutex_unlock(&u->mu);
}

void srv__uploads_received(srv_uploads *u, srv_upload *up, uint64_t n)
{
    pthread_mutex_lock(&u->mu);
    if (up->admitted) {
        uint64_t k = n < up->length - up->received ? n : up->length - up->received;
        if (!up->arriving) {
            up->arriving = true;
            u->in_flight += up->length;
            u->ahead_ns += up->cost_ns;
        }
        up->received += k;
        u->in_flight -= k;
    }
    pthread_mutex_unlock(&u->mu);
}

/* Moves the rate toward `sample`: half of the way up, an eighth down (upload.h says why).
 * mu held. */
static void learn_locked(srv_uploads *u, double sample)
{
    if (u->rate <= 0)
        u->rate = sample;
    else
        u->rate += (sample - u->rate) / (sample > u->rate ? 2 : 8);
}

void srv__uploads_end(srv_uploads *u, srv_upload *up, bool complete, int64_t now)
{
    pthread_mutex_lock(&u->mu);
    if (up->arriving) {
        u->in_flight -= up->length - up->received;
        u->ahead_ns -= up->cost_ns;
    }
    if (up->admitted && complete && up->length >= SRV_UPLOAD_SAMPLE_MIN && now > up->start_ns)
        learn_locked(u, (double)up->length * 1e9 / (double)(now - up->start_ns));
    up->admitted = up->arriving = false;
    pthread_mutex_unlock(&u->mu);
}

void srv__uploads_state(srv_uploads *u, uint64_t *in_flight, uint64_t *rate)
{
    pthread_mutex_lock(&u->mu);
    *in_flight = u->in_flight;
    *rate = (uint64_t)u->rate;
    pthread_mutex_unlock(&u->mu);
}
