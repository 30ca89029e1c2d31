/*
 * http_header.c - the request header values api/ reads itself: the Content-Types of the native
 * and v2 routes, and Inference-Header-Content-Length.
 */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>

#include "api/api.h"
#include "api/wire/http_header.h"

const char *api__http_skip_blanks(const char *p)
{
    while (*p == ' ' || *p == '\t')
        p++;
    return p;
}

bool api__http_token_is(const char *s, size_t n, const char *word)
{
    while (n > 0 && (*s == ' ' || *s == '\t')) {
        s++;
        n--;
    }
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t'))
        n--;
    return strlen(word) == n && strncasecmp(s, word, n) == 0;
}

bool api_header_token_is(const char *value, const char *word)
{
    return value && api__http_token_is(value, strlen(value), word);
}

/* Where the parameters of `ct` begin (at its first ';', or at its end) when its media type is
 * `type`, any case, blanks around it skipped; NULL for another media type. */
static const char *media_type_params(const char *ct, const char *type)
{
    size_t n = strlen(type);
    ct = api__http_skip_blanks(ct);
    if (strncasecmp(ct, type, n) != 0)
        return NULL;
    ct = api__http_skip_blanks(ct + n);
    return *ct == '\0' || *ct == ';' ? ct : NULL;
}

bool api__content_type_json(const char *ct)
{
    if (!ct)
        return true;
    const char *p = media_type_params(ct, "application/json");
    if (!p)
        return false;
    while (*p == ';') {
        p = api__http_skip_blanks(p + 1);
        const char *name = p;
        while (*p && *p != '=' && *p != ';')
            p++;
        if (*p != '=')
            return false;
        /* The name as written: "charset " with a blank before '=' is not charset. */
        bool charset = (size_t)(p - name) == 7 && strncasecmp(name, "charset", 7) == 0;
        const char *val = ++p;
        while (*p && *p != ';' && *p != ' ' && *p != '\t')
            p++;
        size_t n = (size_t)(p - val);
        if (n >= 2 && val[0] == '"' && val[n - 1] == '"') {
            val++;
            n -= 2;
        }
        if (charset && !api__http_token_is(val, n, "utf-8") && !api__http_token_is(val, n, "utf8"))
            return false;
        p = api__http_skip_blanks(p);
    }
    return *p == '\0';
}

/* JSON; application/octet-stream, which the binary extension's clients send; and
 * application/x-www-form-urlencoded, which `curl -d` sends unless told otherwise and which
 * KServe's own examples rely on (Triton does not look at the Content-Type at all). */
bool api__content_type_v2(const char *ct)
{
    return !ct || api__content_type_json(ct) || media_type_params(ct, "application/octet-stream") ||
           media_type_params(ct, "application/x-www-form-urlencoded");
}

/* Inference-Header-Content-Length: decimal digits, optionally surrounded by blanks. */
bool api__header_len_parse(const char *s, size_t *out)
{
    size_t n = 0;
    int digits = 0;
    s = api__http_skip_blanks(s);
    for (; *s >= '0' && *s <= '9'; s++, digits++) {
        if (n > (SIZE_MAX - 9) / 10)
            return false;
        n = n * 10 + (size_t)(*s - '0');
    }
    s = api__http_skip_blanks(s);
    if (digits == 0 || *s != '\0')
        return false;
    *out = n;
    return true;
}
