/*
 * page.c - GET / : the attention inspector, a self-contained page (server/assets/inspector.html)
 * that draws attention weights as heatmaps using only the public API (GET /v1/models,
 * POST /v1/mha, POST /v1/attention) from the browser.
 *
 * The page's bytes, its Content-Security-Policy and its ETag are generated at build time by
 * server/assets/embed_page.c into build/gen/inspector_page.c (declared in page.h), so the
 * binary needs no asset files at run time and the policy always matches the page it guards.
 * Answered on the MHD thread: a copy of a few tens of KB, no engine work.
 *
 * Headers: the hash-based CSP (no 'unsafe-inline': only the page's own style and script run,
 * and the page may fetch from its own origin only); Cache-Control: no-cache with the ETag, so
 * a browser revalidates on every load - a new binary's page is never stale - and an unchanged
 * page costs a 304 without a body; nosniff, no referrer, and X-Frame-Options for browsers that
 * predate frame-ancestors.
 */
#include "server/page.h"

#include <microhttpd.h>
#include <stdlib.h>
#include <string.h>

#define PAGE_CONTENT_TYPE "text/html; charset=utf-8"

static const char *const page_headers[] = {
    MHD_HTTP_HEADER_CONTENT_SECURITY_POLICY,
    srv_inspector_csp,
    MHD_HTTP_HEADER_CACHE_CONTROL,
    "no-cache",
    MHD_HTTP_HEADER_ETAG,
    srv_inspector_etag,
    MHD_HTTP_HEADER_X_CONTENT_TYPE_OPTIONS,
    "nosniff",
    "Referrer-Policy",
    "no-referrer",
    "X-Frame-Options",
    "DENY",
    NULL,
};

/* Whether the If-None-Match value `header` names `etag`: "*", or a comma-separated list of
 * entity tags, each possibly weak ("W/..."; RFC 9110 section 13.1.2 compares weakly). */
static bool etag_listed(const char *header, const char *etag)
{
    size_t n = strlen(etag);
    const char *p = header;
    for (;;) {
        p += strspn(p, " \t,");
        if (*p == '\0')
            return false;
        if (*p == '*')
            return true;
        if (strncmp(p, "W/", 2) == 0)
            p += 2;
        if (strncmp(p, etag, n) == 0 && strchr(" \t,", p[n]))
            return true; /* strchr also finds the terminating NUL: the last tag */
        p += strcspn(p, ",");
    }
}

srv_reply srv__answer_page(srv_server *s, const srv_answer_args *args)
{
    srv_reply r;
    char *body;
    (void)s;

    if (args->if_none_match && etag_listed(args->if_none_match, srv_inspector_etag)) {
        r = srv__reply_body(SRV_ANSWER_NOT_MODIFIED, PAGE_CONTENT_TYPE, NULL, 0);
    } else if ((body = eng_buf_alloc(srv_inspector_page_len)) != NULL) {
        memcpy(body, srv_inspector_page, srv_inspector_page_len);
        r = srv__reply_body(SRV_ANSWER_OK, PAGE_CONTENT_TYPE, body, srv_inspector_page_len);
    } else {
        return srv__reply_refusal(args->style, SRV_REFUSE_INTERNAL, "out of memory");
    }
    r.headers = page_headers;
    return r;
}
