/*
 * buf.c - the daemon's text buffer (api_buf: capped and growable) and a fast float writer.
 *
 * Replies are written straight into one buffer that becomes the HTTP body, never through a
 * json_t per number (jansson would allocate ~40 bytes and run printf for each). The buffer
 * takes its maximum size at init, so a reply can never grow past what was budgeted for it; the
 * server builds request bodies, metrics and log lines in the same buffer.
 *
 * Floats get 9 significant digits, the fewest that make every float32 read back exactly. The
 * writer scales the value by a power of ten in double precision and rounds it to a 9-digit
 * integer; the scaling is exact to within ~4e-16 relative, so the rounding is right unless the
 * scaled value lies within 1e-6 of a half-way point. For those (about one value in 10^6) it
 * asks snprintf, which rounds the exact binary value. The output is therefore identical to
 * "%.9g" for every float, at a fraction of the cost.
 */
#include <assert.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/wire/buf.h"

/* ---- The buffer -------------------------------------------------------------------------- */

#define PRESIZE_FROM ((size_t)1 << 20)

void api_buf_init(api_buf *w, size_t max)
{
    w->data = NULL;
    w->len = 0;
    w->cap = 0;
    w->max = max;
    w->state = API_BUF_OK;
}

void api_buf_free(api_buf *w)
{
    eng_buf_free(w->data);
    api_buf_init(w, w->max);
}

/* Moves the data to an allocation of exactly `cap` bytes (>= len). */
static bool resize(api_buf *w, size_t cap)
{
    /* eng_buf: a big buffer's pages are reused by the next one (see engine/buffers.c). */
    char *p = eng_buf_alloc(cap);
    if (!p) {
        w->state = API_BUF_NOMEM;
        return false;
    }
    if (w->len > 0)
        memcpy(p, w->data, w->len);
    eng_buf_free(w->data);
    w->data = p;
    w->cap = cap;
    return true;
}

bool api_buf_grow_to(api_buf *w, size_t cap)
{
    if (w->state != API_BUF_OK)
        return false;
    if (cap <= w->cap)
        return true;
    if (cap > w->max) {
        w->state = API_BUF_FULL;
        return false;
    }
    return resize(w, cap);
}

char *api_buf_reserve(api_buf *w, size_t n)
{
    if (w->state != API_BUF_OK)
        return NULL;
    if (n <= w->cap - w->len)
        return w->data + w->len;
    if (n > w->max - w->len) {
        w->state = API_BUF_FULL;
        return NULL;
    }
    /* Grow geometrically up to a megabyte, then take max at once: it is budgeted anyway, and a
     * big reply (a base64 tensor) would otherwise be copied at every doubling. Never past max:
     * the caller budgeted for max, not for 2 max. */
    size_t want = w->len + n; /* <= max */
    size_t cap = w->max;
    if (want <= PRESIZE_FROM) {
        cap = w->cap < 4096 ? 4096 : w->cap;
        while (cap < want)
            cap *= 2;
        if (cap > w->max)
            cap = w->max;
    }
    return resize(w, cap) ? w->data + w->len : NULL;
}

void api_buf_mem(api_buf *w, const void *src, size_t n)
{
    char *p = api_buf_reserve(w, n);
    if (p && n > 0) {
        memcpy(p, src, n);
        w->len += n;
    }
}

void api_buf_cstr(api_buf *w, const char *s)
{
    api_buf_mem(w, s, strlen(s));
}

void api_buf_char(api_buf *w, char c)
{
    char *p = api_buf_reserve(w, 1);
    if (p) {
        *p = c;
        w->len++;
    }
}

/* The length (2 to 4) of the well-formed UTF-8 sequence that starts s[0] (of n bytes), or 0
 * when there is none there: a stray continuation byte, a truncated sequence, an overlong form,
 * a surrogate, or a code point beyond U+10FFFF (RFC 3629). */
static size_t utf8_sequence_len(const unsigned char *s, size_t n)
{
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF; /* the range of the second byte */
    if (s[0] >= 0xC2 && s[0] <= 0xDF)
        len = 2;
    else if (s[0] >= 0xE0 && s[0] <= 0xEF) {
        len = 3;
        if (s[0] == 0xE0)
            lo = 0xA0; /* overlong */
        else if (s[0] == 0xED)
            hi = 0x9F; /* surrogates */
    } else if (s[0] >= 0xF0 && s[0] <= 0xF4) {
        len = 4;
        if (s[0] == 0xF0)
            lo = 0x90; /* overlong */
        else if (s[0] == 0xF4)
            hi = 0x8F; /* beyond U+10FFFF */
    } else
        return 0;
    if (n < len || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++) {
        if (s[i] < 0x80 || s[i] > 0xBF)
            return 0;
    }
    return len;
}

/* Error messages quote request text (jansson's "near '...'", an unknown key cut to 40 bytes),
 * which need not be UTF-8, and JSON must be (RFC 8259): a byte that does not start a
 * well-formed sequence is written as U+FFFD, as a UTF-8 decoder replacing errors would. */
void api_buf_json_string(api_buf *w, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    /* Worst case every byte becomes \u00XX or \ufffd: reserve it once, then write without
     * checks. */
    if (n > (SIZE_MAX - 2) / 6) {
        w->state = API_BUF_FULL;
        return;
    }
    char *p = api_buf_reserve(w, 6 * n + 2), *start = p;
    if (!p)
        return;
    *p++ = '"';
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            *p++ = '\\';
            *p++ = (char)c;
        } else if (c == '\n') {
            *p++ = '\\';
            *p++ = 'n';
        } else if (c == '\t') {
            *p++ = '\\';
            *p++ = 't';
        } else if (c < 0x20 || c == 0x7F) {
            *p++ = '\\';
            *p++ = 'u';
            *p++ = '0';
            *p++ = '0';
            *p++ = hex[c >> 4];
            *p++ = hex[c & 15];
        } else if (c < 0x80) {
            *p++ = (char)c;
        } else {
            size_t k = utf8_sequence_len((const unsigned char *)s + i, n - i);
            if (k == 0) {
                memcpy(p, "\\ufffd", 6);
                p += 6;
            } else {
                memcpy(p, s + i, k);
                p += k;
                i += k - 1;
            }
        }
    }
    *p++ = '"';
    w->len += (size_t)(p - start);
}

void api_buf_int(api_buf *w, int64_t v)
{
    char buf[24];
    int n = snprintf(buf, sizeof buf, "%lld", (long long)v);
    api_buf_mem(w, buf, (size_t)n);
}

void api_buf_float(api_buf *w, float f)
{
    char *p = api_buf_reserve(w, API_FLOAT_MAX_CHARS);
    if (p)
        w->len += api__float_format(f, p);
}

void api_buf_printf(api_buf *w, const char *fmt, ...)
{
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) {
        w->state = API_BUF_FULL; /* an encoding error: nothing sensible to write */
        return;
    }
    if ((size_t)n < sizeof small) {
        api_buf_mem(w, small, (size_t)n);
        return;
    }
    /* Longer than the stack buffer: format straight into the buffer (with room for the NUL
     * vsnprintf writes, which is not counted). */
    char *p = api_buf_reserve(w, (size_t)n + 1);
    if (!p)
        return;
    va_start(ap, fmt);
    vsnprintf(p, (size_t)n + 1, fmt, ap);
    va_end(ap);
    w->len += (size_t)n;
}

char *api_buf_take(api_buf *w, size_t *len)
{
    if (w->state != API_BUF_OK || !api_buf_reserve(w, 1)) {
        api_buf_free(w);
        return NULL;
    }
    char *data = w->data;
    data[w->len] = '\0';
    if (len)
        *len = w->len;
    api_buf_init(w, w->max);
    return data;
}

/* ---- The float writer -------------------------------------------------------------------- */

/* 10^0 .. 10^22: the powers of ten that double holds exactly. */
static const double pow10_exact[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                       1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                       1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* x * 10^p for x a positive float32 value and p in [-31, 54]: at most three roundings. */
static double scale_pow10(double x, int p)
{
    if (p >= 0) {
        while (p > 22) {
            x *= 1e22;
            p -= 22;
        }
        return x * pow10_exact[p];
    }
    p = -p;
    while (p > 22) {
        x /= 1e22;
        p -= 22;
    }
    return x / pow10_exact[p];
}

static size_t float_format_slow(float f, char *out)
{
    char buf[32];
    int n = snprintf(buf, sizeof buf, "%.9g", (double)f);
    assert(n > 0 && n < API_FLOAT_MAX_CHARS);
    memcpy(out, buf, (size_t)n);
    return (size_t)n;
}

size_t api__float_format(float f, char *out)
{
    assert(isfinite(f));
    double x = f;
    char *p = out;
    if (signbit(x)) {
        *p++ = '-';
        x = -x;
    }
    if (x == 0) {
        *p++ = '0';
        return (size_t)(p - out);
    }

    /* Decimal exponent e10 with 10^8 <= x * 10^(8 - e10) < 10^9. floor(log10(2) * e2), e2 the
     * binary exponent (read from the bits: x is a normal double, even for a subnormal float),
     * is within one of it; the branches below correct the estimate. 1233 / 4096 is log10(2)
     * to 4 digits, enough for |e2| <= 150; >> on a negative int is a floor in GCC and Clang. */
    uint64_t bits;
    memcpy(&bits, &x, sizeof bits);
    int e2 = (int)((bits >> 52) & 0x7FF) - 1023;
    int e10 = (e2 * 1233) >> 12;
    double y = scale_pow10(x, 8 - e10);
    if (y >= 1e9) {
        e10++;
        y = scale_pow10(x, 8 - e10);
    } else if (y < 1e8) {
        e10--;
        y = scale_pow10(x, 8 - e10);
    }
    uint32_t n = (uint32_t)y; /* floor: y is positive */
    double frac = y - (double)n;
    if (frac > 0.5 - 1e-6 && frac < 0.5 + 1e-6)
        return float_format_slow(f, out);
    n += frac > 0.5;
    if (n >= 1000000000u) { /* 999999999.6 rounded up to the next decade */
        n /= 10;
        e10++;
    }

    /* The 9 digits, and how many remain once trailing zeros go (as %g drops them). */
    char d[9];
    static const char pairs[201] = "00010203040506070809101112131415161718192021222324"
                                   "25262728293031323334353637383940414243444546474849"
                                   "50515253545556575859606162636465666768697071727374"
                                   "75767778798081828384858687888990919293949596979899";
    d[0] = (char)('0' + n / 100000000);
    n %= 100000000;
    for (int i = 1; i < 9; i += 2) {
        /* Two digits at a time, from the most significant pair of the remaining eight. */
        static const uint32_t div[4] = {1000000, 10000, 100, 1};
        uint32_t q = n / div[i / 2];
        n %= div[i / 2];
        d[i] = pairs[2 * q];
        d[i + 1] = pairs[2 * q + 1];
    }
    int nd = 9;
    while (nd > 1 && d[nd - 1] == '0')
        nd--;

    if (e10 < -4 || e10 >= 9) {
        /* Scientific: d.ddde+XX, at least two exponent digits. */
        *p++ = d[0];
        if (nd > 1) {
            *p++ = '.';
            memcpy(p, d + 1, (size_t)(nd - 1));
            p += nd - 1;
        }
        *p++ = 'e';
        *p++ = e10 < 0 ? '-' : '+';
        int ae = e10 < 0 ? -e10 : e10;
        if (ae >= 100) /* unreachable for float32 (|e10| <= 45), kept for safety */
            *p++ = (char)('0' + ae / 100);
        *p++ = (char)('0' + ae / 10 % 10);
        *p++ = (char)('0' + ae % 10);
    } else if (e10 >= 0) {
        /* Fixed, >= 1: the first e10 + 1 digits, then the rest after a point. */
        int ip = e10 + 1;
        memcpy(p, d, (size_t)ip);
        p += ip;
        if (nd > ip) {
            *p++ = '.';
            memcpy(p, d + ip, (size_t)(nd - ip));
            p += nd - ip;
        }
    } else {
        /* Fixed, < 1: 0.000ddd. */
        *p++ = '0';
        *p++ = '.';
        for (int z = 0; z < -e10 - 1; z++)
            *p++ = '0';
        memcpy(p, d, (size_t)nd);
        p += nd;
    }
    return (size_t)(p - out);
}

int api__buf_error(const api_buf *w, api__error *err)
{
    if (w->state == API_BUF_NOMEM)
        return api__error_set(err, API_STATUS_UNAVAILABLE, API_REASON_MEMORY, NULL,
                              "out of memory for the reply");
    return api__error_set(err, API_STATUS_INTERNAL, API_REASON_INTERNAL, NULL,
                          "the reply outgrew its estimated size (%zu bytes)", w->max);
}
