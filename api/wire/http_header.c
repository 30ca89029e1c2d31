/*
 * http_header.c - the request header values api/ reads itself: the Content-Types of the native
 * and v2 routes, and Inference-Header-Content-Length.
 */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>

#include "api/wire/http_header.h"

bool api__content_type_json(const char *ct)
{
    static const char json[] = "application/json";
    if (!ct)
        return true;
    while (*ct == ' ' || *ct == '\t')
        ct++;
    if (strncasecmp(ct, json, sizeof json - 1) != 0)
        return false;
    const char *p = ct + sizeof json - 1;
    while (*p == ' ' || *p == '\t')
        p++;
    while (*p == ';') {
        p++;
        while (*p == ' ' || *p == '\t')
            p++;
        const char *name = p;
        while (*p && *p != '=' && *p != ';')
            p++;
        if (*p != '=')
            return false;
        bool charset = (size_t)(p - name) == 7 && strncasecmp(name, "charset", 7) == 0;
        const char *val = ++p;
        while (*p && *p != ';' && *p != ' ' && *p != '\t')
            p++;
        size_t n = (size_t)(p - val);
        if (n >= 2 && val[0] == '"' && val[n - 1] == '"') {
            val++;
            n -= 2;
        }
        if (charset && !((n == 5 && strncasecmp(val, "utf-8", 5) == 0) ||
                         (n == 4 && strncasecmp(val, "utf8", 4) == 0)))
            return false;
        while (*p == ' ' || *p == '\t')
            p++;
    }
    return *p == '\0';
}

/* `ct` is the media type `type`, any case, with any parameters. */
static bool media_type_is(const char *ct, const char *type)
{
    size_t n = strlen(type);
    while (*ct == ' ' || *ct == '\t')
        ct++;
    if (strncasecmp(ct, type, n) != 0)
        return false;
    ct += n;
    while (*ct == ' ' || *ct == '\t')
        ct++;
    return *ct == '\0' || *ct == ';';
}

/* JSON; application/octet-stream, which the binary extension's clients send; and
 * application/x-www-form-urlencoded, which `curl -d` sends unless told otherwise and which
 * KServe's own examples rely on (Triton does not look at the Content-Type at all). */
bool api__content_type_v2(const char *ct)
{
    return !ct || api__content_type_json(ct) || media_type_is(ct, "application/octet-stream") ||
           media_type_is(ct, "application/x-www-form-urlencoded");
}

/* Inference-Header-Content-Length: decimal digits, optionally surrounded by blanks. */
bool api__header_len_parse(const char *s, size_t *out)
{
    size_t n = 0;
    int digits = 0;
    while (*s == ' ' || *s == '\t')
        s++;
    for (; *s >= '0' && *s <= '9'; s++, digits++) {
        if (n > (SIZE_MAX - 9) / 10)
            return false;
        n = n * 10 + (size_t)(*s - '0');
    }
    while (*s == ' ' || *s == '\t')
        s++;
    if (digits == 0 || *s != '\0')
        return false;
    *out = n;
    return true;
}
