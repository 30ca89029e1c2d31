/*
 * request_check.h - the request line and header block as libmicrohttpd hands them over, read
 * once (request_check.c): the framing fields, the headers the daemon and api/ use, and what
 * RFC 9112 says a server must reject (see request_check.c for why each check exists).
 * MHD thread.
 */
#ifndef ATTND_SERVER_REQUEST_CHECK_H
#define ATTND_SERVER_REQUEST_CHECK_H

#include <microhttpd.h>
#include <stdbool.h>

/* What one pass over a request's header block found. Values point into libmicrohttpd's copy of
 * the headers, valid until the request completes; a value is the first of its fields, NULL when
 * the field is absent. */
typedef struct {
    const char *bad_name; /* the first field name that is not a token, or that extends a framing
                             field (obs-fold glued on by libmicrohttpd); NULL: none */
    int n_host, n_infer_len, n_length, n_transfer, n_encoding; /* how many of each field */
    const char *content_length, *transfer_encoding, *content_encoding;
    const char *expect, *request_id, *content_type, *accept_encoding, *infer_header_len;
    const char *authorization, *if_none_match;
} srv_headers;

/* Reads the request headers of `conn` into `h` in one pass (MHD thread, from the access
 * handler). */
void srv__headers_read(struct MHD_Connection *conn, srv_headers *h);
/* Checks the raw request target as the URI callback receives it: NULL when sound, else what is
 * wrong (a static sentence for the 400). */
const char *srv__target_check(const char *uri);
/* The path of a request target in origin form: `target` itself, or for the absolute form
 * ("http://host:port/path?q") the part from the path on ("/" when empty). */
const char *srv__origin_path(const char *target);

#endif
