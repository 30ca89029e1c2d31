/*
 * http_header.h - the values of the request headers api/ reads itself: the blanks and tokens
 * of every header value (content_coding.c reads codings with them), which Content-Types a
 * route takes, and Inference-Header-Content-Length. Pure functions on NUL-terminated values
 * (NULL: the header is absent); any thread.
 */
#ifndef ATTND_API_WIRE_HTTP_HEADER_H
#define ATTND_API_WIRE_HTTP_HEADER_H

#include <stdbool.h>
#include <stddef.h>

/* p past any blanks (SP, HTAB): the optional white space around header tokens. */
const char *api__http_skip_blanks(const char *p);

/* Whether s[0..n), trimmed of blanks, is `word`, ignoring case. */
bool api__http_token_is(const char *s, size_t n, const char *word);

/* application/json, any case; a charset parameter must be UTF-8. NULL (no header) is JSON. */
bool api__content_type_json(const char *ct);

/* Whether a v2 inference takes a body of Content-Type `ct` (NULL: none given). */
bool api__content_type_v2(const char *ct);

/* Reads an Inference-Header-Content-Length value (decimal digits, optionally surrounded by
 * blanks) into *out; false when it is not one. */
bool api__header_len_parse(const char *s, size_t *out);

#endif
