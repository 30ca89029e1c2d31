/*
 * upload.c - the meter of upload.h: the bytes and the work of the bodies on their way, and the
 * rate at which the daemon takes bodies in.
 */
#include "server/upload.h"

#include <pthread.h>
#include <stdlib.h>

struct srv_uploads {
    pthread_mutex_t mu;
    uint64_t max;       /* bound on in_flight */
    uint64_t in_flight; /* bytes still to arrive on the bodies arriving */
    int64_t ahead_ns;   /* the expected work of the bodies arriving */
    int arriving;       /* how many bodies are arriving */
    double area;        /* the integral of `arriving` over time (ns), up to area_at */
    int64_t area_at;
    double rate;        /* learned intake, bytes per second; 0: none yet */
    int64_t learned_at; /* when it was last taught */
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

/* Brings the integral of the bodies arriving up to `now`. mu held. */
static void area_update(srv_uploads *u, int64_t now)
{
    if (now > u->area_at) {
        u->area += (double)(now - u->area_at) * u->arriving;
        u->area_at = now;
    }
}

/* The rate in force at `now`: 0 once it is older than SRV_UPLOAD_RATE_TTL_NS. mu held. */
static double rate_locked(const srv_uploads *u, int64_t now)
{
    return now - u->learned_at <= SRV_UPLOAD_RATE_TTL_NS ? u->rate : 0;
}

/* Fills *look at `now` for a body with `to_come` bytes to arrive, besides the `others` still to
 * arrive on the other bodies, and `ahead_ns` of work before it. A body alone on its way gets no
 * arrival: the rate was learned in another spell, and refused on one too low, every body would
 * be refused while none arrived to teach a better one. mu held. */
static void look_locked(const srv_uploads *u, int64_t now, uint64_t to_come, uint64_t others,
                        int64_t ahead_ns, srv_upload_outlook *look)
{
    double rate = others > 0 ? rate_locked(u, now) : 0;
    /* both < 2^63 (--max-upload-bytes, --max-body-bytes): a valid time when under 2^63 ns */
    double arrive = rate > 0 ? ((double)to_come + (double)others) / rate * 1e9 : 0;
    look->to_come = to_come;
    look->arrive_ns = arrive < 9e18 ? (int64_t)arrive : INT64_MAX;
    look->ahead_ns = ahead_ns;
    look->rate = (uint64_t)rate;
    look->in_flight = others;
    look->max = u->max;
}

bool srv__uploads_begin(srv_uploads *u, srv_upload *up, uint64_t length, int64_t cost_ns,
                        int64_t now, srv_upload_outlook *look)
{
    bool fits;
    pthread_mutex_lock(&u->mu);
    look_locked(u, now, length, u->in_flight, u->ahead_ns, look);
    /* Alone, a body passes whatever its size: the bound is for bodies arriving together, and a
     * 429 would have its client retry a body that would never fit (the budget judges it, 413). */
    fits = length < SRV_UPLOAD_COUNT_MIN || u->in_flight == 0 ||
           (length <= u->max && u->in_flight <= u->max - length);
    if (fits && length >= SRV_UPLOAD_COUNT_MIN)
        *up = (srv_upload){.admitted = true,
                           .length = length,
                           .cost_ns = cost_ns > 0 ? cost_ns : 0,
                           .ahead0_ns = u->ahead_ns};
    pthread_mutex_unlock(&u->mu);
    return fits;
}

void srv__uploads_look(srv_uploads *u, const srv_upload *up, int64_t now, srv_upload_outlook *look)
{
    pthread_mutex_lock(&u->mu);
    uint64_t to_come = up->length - up->received;
    uint64_t others = u->in_flight - (up->arriving ? to_come : 0);
    int64_t ahead = u->ahead_ns - (up->arriving ? up->cost_ns : 0);
    look_locked(u, now, to_come, others, ahead < up->ahead0_ns ? ahead : up->ahead0_ns, look);
    pthread_mutex_unlock(&u->mu);
}

void srv__uploads_received(srv_uploads *u, srv_upload *up, uint64_t n, int64_t now)
{
    pthread_mutex_lock(&u->mu);
    if (up->admitted) {
        uint64_t k = n < up->length - up->received ? n : up->length - up->received;
        if (!up->arriving) {
            area_update(u, now);
            up->arriving = true;
            up->first_ns = now;
            up->area0 = u->area;
            u->arriving++;
            u->in_flight += up->length;
            u->ahead_ns += up->cost_ns;
        }
        up->received += k;
        u->in_flight -= k;
    }
    pthread_mutex_unlock(&u->mu);
}

/* Moves the rate toward `sample`: half of the way up, an eighth down (upload.h says why); a
 * forgotten one starts again from the sample. mu held. */
static void learn_locked(srv_uploads *u, double sample, int64_t now)
{
    double rate = rate_locked(u, now);
    u->rate = rate <= 0 ? sample : rate + (sample - rate) / (sample > rate ? 2 : 8);
    u->learned_at = now;
}

void srv__uploads_end(srv_uploads *u, srv_upload *up, bool complete, int64_t now)
{
    pthread_mutex_lock(&u->mu);
    if (up->arriving) {
        area_update(u, now);
        u->in_flight -= up->length - up->received;
        u->ahead_ns -= up->cost_ns;
        u->arriving--;
        int64_t took = now - up->first_ns;
        if (complete && up->length >= SRV_UPLOAD_SAMPLE_MIN && took > 0) {
            /* the mean number of bodies arriving while it did, itself included */
            double sharing = (u->area - up->area0) / (double)took;
            learn_locked(u, (double)up->length * 1e9 / (double)took * sharing, now);
        }
    }
    up->admitted = up->arriving = false;
    pthread_mutex_unlock(&u->mu);
}

void srv__uploads_state(srv_uploads *u, int64_t now, uint64_t *in_flight, uint64_t *rate)
{
    pthread_mutex_lock(&u->mu);
    *in_flight = u->in_flight;
    *rate = (uint64_t)rate_locked(u, now);
    pthread_mutex_unlock(&u->mu);
}
