/*
 * request_check.c - the checks of a request line and header block that libmicrohttpd 0.9.75
 * does not make, or makes differently from the proxies in front of us.
 *
 * Whenever two HTTP parsers on one path disagree about a message, a client can smuggle a
 * request past the first one (RFC 9112 section 11.2). libmicrohttpd 0.9.75 accepts, and
 * reinterprets, several forms that RFC 9112 says a server must reject or normalise:
 *   - whitespace between a field name and its colon ("Transfer-Encoding : chunked"): its check
 *     runs only when MHD_OPTION_STRICT_FOR_CLIENT is -1 or less (process_header_line), which
 *     is the lenient end of the scale, and otherwise keeps "Transfer-Encoding " as the name;
 *   - obs-fold ("Transfer-Encoding:\r\n chunked"): process_broken_line appends the
 *     continuation to the field *name*, giving "Transfer-Encodingchunked" with an empty value;
 *   - a NUL byte in the request line, which cuts the URI short ("/v1/attention\0x");
 *   - percent-decoding before routing: "%00" cuts the path short and "%2F" becomes a '/'.
 * The functions here spot each of these from what libmicrohttpd hands over, so that the
 * access handler can answer 400 before any body byte is read. The same single pass over the
 * header block keeps every other header value the daemon reads (srv_headers).
 */
#include "server/request_check.h"

#include <string.h>
#include <strings.h>

/* RFC 9110 section 5.6.2: the characters of a token (a field name). */
static bool is_tchar(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           (c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

static bool is_token(const char *s, size_t n)
{
    if (n == 0)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!is_tchar((unsigned char)s[i]))
            return false;
    return true;
}

/* `name` is longer than `field` and starts with it (case-insensitively): a folded line glued
 * onto a framing field by libmicrohttpd (see the top of the file). */
static bool extends(const char *name, size_t n, const char *field)
{
    size_t f = strlen(field);
    return n > f && strncasecmp(name, field, f) == 0;
}

/* Keeps the first value of a field in *slot. */
static void keep_first(const char **slot, const char *value)
{
    if (!*slot)
        *slot = value;
}

/* One field of the header block; every header the daemon reads is picked up here, so that the
 * block is walked once per request. */
static enum MHD_Result read_one(void *cls, enum MHD_ValueKind kind, const char *key,
                                size_t key_size, const char *value, size_t value_size)
{
    srv_headers *h = cls;
    (void)kind;
    (void)value_size;
    if (!key)
        return MHD_YES;
    if (!h->bad_name &&
        (!is_token(key, key_size) || extends(key, key_size, MHD_HTTP_HEADER_TRANSFER_ENCODING) ||
         extends(key, key_size, MHD_HTTP_HEADER_CONTENT_LENGTH)))
        h->bad_name = key;
    if (strcasecmp(key, MHD_HTTP_HEADER_HOST) == 0) {
        h->n_host++;
    } else if (strcasecmp(key, "Inference-Header-Content-Length") == 0) {
        h->n_infer_len++;
        keep_first(&h->infer_header_len, value);
    } else if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0) {
        h->n_length++;
        keep_first(&h->content_length, value);
    } else if (strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING) == 0) {
        h->n_transfer++;
        keep_first(&h->transfer_encoding, value);
    } else if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_ENCODING) == 0) {
        h->n_encoding++;
        keep_first(&h->content_encoding, value);
    } else if (strcasecmp(key, MHD_HTTP_HEADER_EXPECT) == 0) {
        keep_first(&h->expect, value);
    } else if (strcasecmp(key, "X-Request-Id") == 0) {
        keep_first(&h->request_id, value);
    } else if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_TYPE) == 0) {
        keep_first(&h->content_type, value);
    } else if (strcasecmp(key, MHD_HTTP_HEADER_ACCEPT_ENCODING) == 0) {
        keep_first(&h->accept_encoding, value);
    } else if (strcasecmp(key, MHD_HTTP_HEADER_AUTHORIZATION) == 0) {
        keep_first(&h->authorization, value);
    } else if (strcasecmp(key, MHD_HTTP_HEADER_IF_NONE_MATCH) == 0) {
        keep_first(&h->if_none_match, value);
    }
    return MHD_YES;
}

void srv__headers_read(struct MHD_Connection *conn, srv_headers *h)
{
    memset(h, 0, sizeof *h);
    MHD_get_connection_values_n(conn, MHD_HEADER_KIND, read_one, h);
}

/* The request line held a NUL inside its target. libmicrohttpd hands the URI callback a
 * pointer into its copy of the line, where the blank before the version has been replaced
 * by the terminator, so a well-formed target is followed by exactly one NUL and "HTTP/". The
 * comparison stops at the first byte that differs, so it never reads past the line (whose
 * line break libmicrohttpd also turned into NULs). */
static bool target_has_nul(const char *uri)
{
    return strncmp(uri + strlen(uri) + 1, "HTTP/", 5) != 0;
}

/* A percent-escape in the path (before any '?') that decodes to NUL or '/': the first cuts
 * the decoded path short, the second changes its segments, so the path routed would not be
 * the one a proxy or a log saw. */
static bool path_has_bad_escape(const char *uri)
{
    for (const char *p = uri; *p && *p != '?'; p++) {
        if (p[0] != '%' || !p[1] || !p[2])
            continue;
        if (p[1] == '0' && p[2] == '0')
            return true;
        if (p[1] == '2' && (p[2] == 'f' || p[2] == 'F'))
            return true;
    }
    return false;
}

const char *srv__target_check(const char *uri)
{
    if (!uri)
        return NULL;
    if (target_has_nul(uri))
        return "the request target contains a NUL byte";
    if (path_has_bad_escape(uri))
        return "the path contains %00 or %2F, which would change the path that is routed";
    return NULL;
}

const char *srv__origin_path(const char *target)
{
    const char *p;
    if (strncasecmp(target, "http://", 7) == 0)
        p = target + 7;
    else if (strncasecmp(target, "https://", 8) == 0)
        p = target + 8;
    else
        return target;
    /* RFC 9112 section 3.2.2: a server must accept the absolute form; the path starts after
     * the authority, and an empty one is "/". */
    p += strcspn(p, "/?");
    return *p == '/' ? p : "/";
}
