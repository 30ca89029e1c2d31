/*
 * safetensors_writer.c - the test-fixture writer of safetensors_writer.h.
 *
 * The header is assembled as text in a growable buffer (JSON-escaping the names), padded with
 * spaces to a multiple of 8, and followed by the tensors converted to their stored dtype.
 */
#include "tests/support/safetensors_writer.h"

#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- Conversions -------------------------------------------------------------------------- */

uint16_t stw_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint32_t sign = (x >> 16) & 0x8000u, exp = (x >> 23) & 0xFFu, man = x & 0x7FFFFFu;
    if (exp == 0xFF) /* infinity, or NaN kept a (quiet) NaN */
        return (uint16_t)(sign | 0x7C00u | (man ? 0x200u | (man >> 13) : 0u));
    int32_t e = (int32_t)exp - 127 + 15; /* the binary16 exponent field */
    if (e >= 31)
        return (uint16_t)(sign | 0x7C00u); /* beyond 65504 rounds to infinity */
    if (e <= 0) {                          /* a binary16 subnormal (or zero) */
        if (e < -10)
            return (uint16_t)sign; /* below half the smallest subnormal */
        uint32_t m = man | 0x800000u;
        uint32_t shift = (uint32_t)(14 - e); /* m * 2^(exp - 150) in units of 2^-24 */
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u)))
            q++;
        return (uint16_t)(sign | q);
    }
    uint32_t h = sign | (uint32_t)e << 10 | (man >> 13), rem = man & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h++; /* a carry into the exponent is the right answer, up to infinity */
    return (uint16_t)h;
}

uint16_t stw_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7F800000u) == 0x7F800000u && (x & 0x7FFFFFu))
        return (uint16_t)((x >> 16) | 0x40u); /* NaN: keep it one (quiet) */
    x += 0x7FFFu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* ---- A growable text buffer --------------------------------------------------------------- */

typedef struct {
    char *s;
    size_t len, cap;
    bool failed;
} text;

static void text_append(text *t, const char *p, size_t n)
{
    if (t->failed)
        return;
    if (n + 1 > t->cap - t->len) {
        size_t cap = t->cap ? t->cap : 256;
        while (n + 1 > cap - t->len)
            cap *= 2;
        char *s = realloc(t->s, cap);
        if (!s) {
            t->failed = true;
            return;
        }
        t->s = s;
        t->cap = cap;
    }
    memcpy(t->s + t->len, p, n);
    t->len += n;
    t->s[t->len] = '\0';
}

static void text_printf(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void text_printf(text *t, const char *fmt, ...)
{
    char buf[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof buf)
        t->failed = true;
    else
        text_append(t, buf, (size_t)n);
}

/* A JSON string literal: quotes, backslashes and control characters escaped. */
static void text_json_string(text *t, const char *s)
{
    text_append(t, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') {
            char esc[2] = {'\\', (char)*p};
            text_append(t, esc, 2);
        } else if (*p < 0x20) {
            text_printf(t, "\\u%04x", (unsigned)*p);
        } else {
            text_append(t, (const char *)p, 1);
        }
    }
    text_append(t, "\"", 1);
}

/* ---- Files -------------------------------------------------------------------------------- */

static size_t dtype_size(stw_dtype d)
{
    return d == STW_F32 ? 4 : 2;
}

static const char *dtype_name(stw_dtype d)
{
    return d == STW_F32 ? "F32" : d == STW_F16 ? "F16" : "BF16";
}

static uint64_t element_count(const stw_tensor *t)
{
    uint64_t n = 1;
    for (int d = 0; d < t->rank; d++)
        n *= (uint64_t)t->shape[d];
    return n;
}

void stw_bytes_free(stw_bytes *b)
{
    free(b->data);
    b->data = NULL;
    b->len = 0;
}

bool stw_build_raw(uint64_t declared_len, const char *header, size_t header_len, const void *data,
                   size_t data_len, stw_bytes *out)
{
    out->len = 8 + header_len + data_len;
    out->data = malloc(out->len ? out->len : 1);
    if (!out->data)
        return false;
    for (int i = 0; i < 8; i++)
        out->data[i] = (unsigned char)(declared_len >> (8 * i));
    if (header_len)
        memcpy(out->data + 8, header, header_len);
    if (data_len)
        memcpy(out->data + 8 + header_len, data, data_len);
    return true;
}

bool stw_build(const stw_tensor *tensors, size_t count, const stw_meta *meta, size_t nmeta,
               stw_bytes *out)
{
    text h = {0};
    uint64_t offset = 0;
    text_append(&h, "{", 1);
    for (size_t i = 0; i < count; i++) {
        const stw_tensor *t = &tensors[i];
        uint64_t bytes = element_count(t) * dtype_size(t->dtype);
        if (i > 0)
            text_append(&h, ",", 1);
        text_json_string(&h, t->name);
        text_printf(&h, ":{\"dtype\":\"%s\",\"shape\":[", dtype_name(t->dtype));
        for (int d = 0; d < t->rank; d++)
            text_printf(&h, "%s%lld", d ? "," : "", (long long)t->shape[d]);
        text_printf(&h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)offset,
                    (unsigned long long)(offset + bytes));
        offset += bytes;
    }
    if (nmeta > 0) {
        if (count > 0)
            text_append(&h, ",", 1);
        text_json_string(&h, "__metadata__");
        text_append(&h, ":{", 2);
        for (size_t i = 0; i < nmeta; i++) {
            if (i > 0)
                text_append(&h, ",", 1);
            text_json_string(&h, meta[i].key);
            text_append(&h, ":", 1);
            text_json_string(&h, meta[i].value);
        }
        text_append(&h, "}", 1);
    }
    text_append(&h, "}", 1);
    while (!h.failed && h.len % 8 != 0)
        text_append(&h, " ", 1);
    if (h.failed) {
        free(h.s);
        return false;
    }

    unsigned char *data = malloc(offset ? (size_t)offset : 1);
    if (!data) {
        free(h.s);
        return false;
    }
    unsigned char *at = data;
    for (size_t i = 0; i < count; i++) {
        const stw_tensor *t = &tensors[i];
        uint64_t n = element_count(t);
        for (uint64_t e = 0; e < n; e++) {
            float f = t->values[e];
            if (t->dtype == STW_F32) {
                uint32_t bits;
                memcpy(&bits, &f, sizeof bits);
                for (int k = 0; k < 4; k++)
                    *at++ = (unsigned char)(bits >> (8 * k));
            } else {
                uint16_t bits = t->dtype == STW_F16 ? stw_f32_to_f16(f) : stw_f32_to_bf16(f);
                *at++ = (unsigned char)(bits & 0xFFu);
                *at++ = (unsigned char)(bits >> 8);
            }
        }
    }
    bool ok = stw_build_raw(h.len, h.s, h.len, data, (size_t)offset, out);
    free(h.s);
    free(data);
    return ok;
}

bool stw_write_file(const char *path, const void *bytes, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return false;
    const unsigned char *p = bytes;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n <= 0) {
            close(fd);
            return false;
        }
        p += n;
        len -= (size_t)n;
    }
    return close(fd) == 0;
}

bool stw_save(const char *path, const stw_tensor *tensors, size_t count, const stw_meta *meta,
              size_t nmeta)
{
    stw_bytes b;
    if (!stw_build(tensors, count, meta, nmeta, &b))
        return false;
    bool ok = stw_write_file(path, b.data, b.len);
    stw_bytes_free(&b);
    return ok;
}
