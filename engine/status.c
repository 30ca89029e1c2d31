/* status.c - engine error values, control blocks and per-thread scratch memory. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/internal.h"

static const char *const status_strings[] = {
#define ENG_STATUS_STRING(name, text) text,
    ENG_STATUS_LIST(ENG_STATUS_STRING)
#undef ENG_STATUS_STRING
};

const char *eng_status_str(eng_status status)
{
    size_t i = (size_t)status;
    if (i >= sizeof status_strings / sizeof status_strings[0])
        return "unknown status";
    return status_strings[i];
}

static eng_status fail_v(eng_error *err, eng_cause cause, eng_status status, const char *field,
                         const char *fmt, va_list ap)
{
    if (!err)
        return status;
    err->status = status;
    err->cause = cause;
    snprintf(err->field, sizeof err->field, "%s", field ? field : "");
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    return status;
}

eng_status eng__fail(eng_error *err, eng_status status, const char *field, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fail_v(err, ENG_CAUSE_NONE, status, field, fmt, ap);
    va_end(ap);
    return status;
}

eng_status eng__fail_cause(eng_error *err, eng_cause cause, eng_status status, const char *field,
                           const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fail_v(err, cause, status, field, fmt, ap);
    va_end(ap);
    return status;
}

int64_t eng_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

eng_status eng_ctl_check(eng_ctl *ctl)
{
    if (!ctl)
        return ENG_OK;
    if (atomic_load_explicit(&ctl->cancel, memory_order_relaxed))
        return ENG_ECANCELLED;
    if (ctl->deadline_ns > 0 && eng_now_ns() >= ctl->deadline_ns)
        return ENG_EDEADLINE;
    return ENG_OK;
}

/* ---- Scratch ------------------------------------------------------------------------------
 * A pthread key rather than a plain _Thread_local pointer: its destructor frees the buffer of
 * every thread that ever ran a task, including callers outside the pool. */

typedef struct {
    void *data;
    size_t size;
} scratch_buffer;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_destroy(void *p)
{
    scratch_buffer *s = p;
    free(s->data);
    free(s);
}

static void scratch_key_create(void)
{
    /* Cannot fail short of PTHREAD_KEYS_MAX keys in one process; eng__scratch copes anyway. */
    (void)pthread_key_create(&scratch_key, scratch_destroy);
}

void *eng__scratch(size_t bytes)
{
    pthread_once(&scratch_once, scratch_key_create);
    scratch_buffer *s = pthread_getspecific(scratch_key);
    if (!s) {
        s = calloc(1, sizeof *s);
        if (!s || pthread_setspecific(scratch_key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    if (s->size < bytes) {
        void *p = NULL;
        if (posix_memalign(&p, 64, bytes) != 0)
            return NULL;
        free(s->data);
        s->data = p;
        s->size = bytes;
    }
    return s->data;
}
