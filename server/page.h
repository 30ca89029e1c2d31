/*
 * page.h - GET /, the attention inspector page (page.c), and the page's bytes that
 * server/assets/embed_page.c generates at build time (build/gen/inspector_page.c).
 */
#ifndef ATTND_SERVER_PAGE_H
#define ATTND_SERVER_PAGE_H

#include <stddef.h>

#include "server/route.h"

/* GET /: the page, with its CSP, ETag (304 on If-None-Match) and caching headers. */
srv_reply srv__answer_page(srv_server *s, const srv_answer_args *args);

/* The page's bytes, a Content-Security-Policy allowing exactly its inline style and script by
 * their SHA-256, and a strong ETag (quotes included). */
extern const unsigned char srv_inspector_page[];
extern const size_t srv_inspector_page_len;
extern const char srv_inspector_csp[];
extern const char srv_inspector_etag[];

#endif
