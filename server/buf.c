/*
 * buf.c - growable byte buffers with a size cap, for request bodies, metrics text and log lines.
 *
 * The cap is given at init (as curl's dynbuf does), so no caller can forget to bound a buffer
 * that grows with client input; the check is written `n > limit - len` so it cannot overflow.
 */
#include "server/buf.h"

#include "engine/engine.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void srv__buf_init(srv_buf *b, size_t limit)
{
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
    b->limit = limit;
    b->failed = false;
    b->pooled = false;
}

void srv__buf_free(srv_buf *b)
{
    if (!b)
        return;
    if (b->pooled)
        eng_buf_free(b->data);
    else
        free(b->data);
    srv__buf_init(b, b->limit);
}

/* Moves the data to an allocation of `cap` bytes, from eng_buf_alloc when `pooled`. */
static srv_status resize(srv_buf *b, size_t cap, bool pooled)
{
    char *grown;
    if (!pooled && !b->pooled) {
        grown = realloc(b->data, cap);
    } else {
        grown = eng_buf_alloc(cap);
        if (grown) {
            if (b->len > 0)
                memcpy(grown, b->data, b->len);
            if (b->pooled)
                eng_buf_free(b->data);
            else
                free(b->data);
        }
    }
    if (!grown) {
        b->failed = true;
        return SRV_ENOMEM;
    }
    b->data = grown;
    b->cap = cap;
    b->pooled = pooled || b->pooled;
    return SRV_OK;
}

srv_status srv__buf_reserve(srv_buf *b, size_t extra)
{
    size_t want, cap;
    if (extra > b->limit - b->len) {
        b->failed = true;
        return SRV_ETOOBIG;
    }
    want = b->len + extra;
    if (want < b->cap)
        return SRV_OK; /* strictly less: one byte always stays free for a terminating NUL */
    cap = b->cap < 256 ? 256 : b->cap;
    while (cap <= want)
        cap = cap > SIZE_MAX / 2 ? SIZE_MAX : cap * 2;
    /* +1 for the NUL, which the limit does not count. */
    if (cap > b->limit)
        cap = b->limit + 1;
    return resize(b, cap, b->pooled);
}

srv_status srv__buf_grow_to(srv_buf *b, size_t cap)
{
    if (cap <= b->cap)
        return SRV_OK;
    if (cap - 1 > b->limit) {
        b->failed = true;
        return SRV_ETOOBIG;
    }
    return resize(b, cap, true);
}

srv_status srv__buf_append(srv_buf *b, const void *data, size_t n)
{
    srv_status st = srv__buf_reserve(b, n);
    if (st != SRV_OK)
        return st;
    if (n > 0)
        memcpy(b->data + b->len, data, n);
    b->len += n;
    b->data[b->len] = '\0';
    return SRV_OK;
}

srv_status srv__buf_puts(srv_buf *b, const char *s)
{
    return srv__buf_append(b, s, strlen(s));
}

srv_status srv__buf_printf(srv_buf *b, const char *fmt, ...)
{
    va_list ap;
    int n;
    char small[256];

    va_start(ap, fmt);
    n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->failed = true;
        return SRV_EINVAL;
    }
    if ((size_t)n < sizeof small)
        return srv__buf_append(b, small, (size_t)n);

    /* Longer than the stack buffer: format straight into the buffer. */
    {
        srv_status st = srv__buf_reserve(b, (size_t)n);
        if (st != SRV_OK)
            return st;
        va_start(ap, fmt);
        vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
        va_end(ap);
        b->len += (size_t)n;
    }
    return SRV_OK;
}

srv_status srv__buf_json_str(srv_buf *b, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    srv_status st = srv__buf_append(b, "\"", 1);
    size_t run = 0; /* start of the current run of bytes that need no escape */
    for (size_t i = 0; i < n && st == SRV_OK; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[6];
        size_t esc_len = 2;
        if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\')
            continue;
        st = srv__buf_append(b, s + run, i - run);
        run = i + 1;
        esc[0] = '\\';
        switch (c) {
        case '"':
            esc[1] = '"';
            break;
        case '\\':
            esc[1] = '\\';
            break;
        case '\n':
            esc[1] = 'n';
            break;
        case '\r':
            esc[1] = 'r';
            break;
        case '\t':
            esc[1] = 't';
            break;
        default:
            esc[1] = 'u';
            esc[2] = '0';
            esc[3] = '0';
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 15];
            esc_len = 6;
            break;
        }
        if (st == SRV_OK)
            st = srv__buf_append(b, esc, esc_len);
    }
    if (st == SRV_OK)
        st = srv__buf_append(b, s + run, n - run);
    if (st == SRV_OK)
        st = srv__buf_append(b, "\"", 1);
    return st;
}

char *srv__buf_take(srv_buf *b, size_t *len)
{
    char *data;
    assert(!b->pooled); /* its data is not malloc's: our bug */
    if (b->failed) {
        srv__buf_free(b);
        return NULL;
    }
    if (!b->data && srv__buf_reserve(b, 0) != SRV_OK)
        return NULL;
    b->data[b->len] = '\0';
    data = b->data;
    if (len)
        *len = b->len;
    srv__buf_init(b, b->limit);
    return data;
}
