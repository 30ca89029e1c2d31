/*
 * content_coding.c - HTTP content codings: gzip and deflate request bodies in, compressed replies
 * out.
 *
 * A client may send its body compressed (Content-Encoding: gzip or deflate, as tritonclient's
 * request_compression_algorithm does) and ask for a compressed reply (Accept-Encoding).
 * api_call_encoded wraps a route: it inflates the body, runs the route on the plain bytes, and
 * deflates the reply. Both run on the engine worker that runs the route, never on the server's
 * I/O thread: inflating 256 MiB takes about a second.
 *
 * The danger of a compressed body is its ratio: a megabyte of zeros in gzip is 1 KB, so the cap
 * on what arrives (--max-body-bytes, enforced by the server) says nothing about what it expands
 * to. The inflater therefore writes into a buffer that never grows past --max-body-bytes (one
 * byte more is what tells "exactly the limit" from "beyond it"), reserves each growth in the
 * memory budget before allocating it, and stops at the first byte beyond: a bomb costs at most
 * the limit, in memory and in time, and gets 413.
 *
 * Inference-Header-Content-Length counts the uncompressed JSON of a KServe v2 body, as Triton
 * defines it, so the route sees the plain body and the header unchanged.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <zlib.h>

#include "api/wire/content_coding.h"
#include "api/wire/http_header.h"
#include "api/wire/reply.h"

/* First output buffer of an inflate: four times the input (typical for JSON), at least 64 KiB,
 * at most the cap; doubled as needed. */
#define INFLATE_FIRST ((size_t)64 << 10)

/* zlib takes uInt sizes: feed it at most this much per call. */
#define ZLIB_CHUNK ((size_t)1 << 30)

api__coding api__coding_parse(const char *value)
{
    if (!value)
        return API_CODING_IDENTITY;
    size_t n = strlen(value);
    if (api__http_token_is(value, n, "") || api__http_token_is(value, n, "identity"))
        return API_CODING_IDENTITY;
    if (api__http_token_is(value, n, "gzip") || api__http_token_is(value, n, "x-gzip"))
        return API_CODING_GZIP;
    if (api__http_token_is(value, n, "deflate"))
        return API_CODING_DEFLATE;
    return API_CODING_UNKNOWN;
}

bool api_content_encoding_known(const char *value)
{
    return api__coding_parse(value) != API_CODING_UNKNOWN;
}

/* A qvalue (RFC 9110 section 12.4.2): "0", "0.5", "1", "1.000"; in thousandths, or -1 when
 * malformed. */
static int parse_qvalue(const char *s, size_t n)
{
    int q = 0, scale = 1000;
    if (n == 0 || (s[0] != '0' && s[0] != '1'))
        return -1;
    q = (s[0] - '0') * 1000;
    if (n == 1)
        return q;
    if (s[1] != '.' || n > 5)
        return -1;
    for (size_t i = 2; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        scale /= 10;
        q += (s[i] - '0') * scale;
    }
    return q <= 1000 ? q : -1;
}

api__coding api__accept_encoding_pick(const char *value)
{
    /* q in thousandths of each coding as listed, -1 while not mentioned. */
    int q_gzip = -1, q_deflate = -1, q_star = -1;
    const char *p = value;
    if (!value)
        return API_CODING_IDENTITY;
    while (*p) {
        size_t len = strcspn(p, ","), name_len = strcspn(p, ";,");
        int q = 1000;
        /* Parameters: only q matters; anything malformed drops the whole entry. */
        const char *param = p + name_len;
        while (q >= 0 && param < p + len && *param == ';') {
            param = api__http_skip_blanks(param + 1);
            size_t plen = strcspn(param, ";,");
            const char *end = param + plen;
            while (end > param && (end[-1] == ' ' || end[-1] == '\t'))
                end--;
            if (end - param >= 2 && (param[0] == 'q' || param[0] == 'Q') && param[1] == '=')
                q = parse_qvalue(param + 2, (size_t)(end - param - 2));
            param += plen;
        }
        if (q >= 0) {
            if (api__http_token_is(p, name_len, "gzip") ||
                api__http_token_is(p, name_len, "x-gzip"))
                q_gzip = q;
            else if (api__http_token_is(p, name_len, "deflate"))
                q_deflate = q;
            else if (api__http_token_is(p, name_len, "*"))
                q_star = q;
        }
        p += len;
        if (*p == ',')
            p++;
    }
    if (q_gzip < 0)
        q_gzip = q_star;
    if (q_deflate < 0)
        q_deflate = q_star;
    if (q_gzip <= 0 && q_deflate <= 0)
        return API_CODING_IDENTITY;
    return q_gzip >= q_deflate ? API_CODING_GZIP : API_CODING_DEFLATE;
}

/* ---- Inflate ------------------------------------------------------------------------------ */

static const char *coding_name(api__coding coding)
{
    return coding == API_CODING_GZIP ? "gzip" : "deflate";
}

/* Grows *buf to `cap` bytes, reserving the growth first. */
static int grow(char **buf, size_t *cap, size_t want, api_lease *lease, size_t *reserved,
                api__error *err)
{
    size_t extra = want - *cap;
    switch (api_lease_reserve(lease, extra)) {
    case API_BUDGET_OK:
        *reserved += extra;
        break;
    case API_BUDGET_NEVER:
        return api__error_set(err, API_STATUS_TOO_LARGE, API_REASON_MEMORY, NULL,
                              "the decompressed body needs more memory than "
                              "--max-memory-bytes (%zu) allows",
                              api_budget_total(lease->budget));
    case API_BUDGET_NOT_NOW:
        return api__error_set(err, API_STATUS_OVERLOADED, API_REASON_MEMORY, NULL,
                              "the memory budget (--max-memory-bytes) is in use by other "
                              "requests; retry shortly");
    }
    char *p = realloc(*buf, want);
    if (!p)
        return api__error_set(err, API_STATUS_UNAVAILABLE, API_REASON_MEMORY, NULL,
                              "out of memory for a decompressed body of %zu bytes", want);
    *buf = p;
    *cap = want;
    return 0;
}

static int stream_error(api__coding coding, const z_stream *zs, const char *what, api__error *err)
{
    return api__error_set(err, API_STATUS_MALFORMED_REQUEST, API_REASON_BAD_REQUEST, NULL,
                          "the %s body is %s (at compressed byte %lu%s%s)", coding_name(coding),
                          what, (unsigned long)zs->total_in, zs->msg ? ": " : "",
                          zs->msg ? zs->msg : "");
}

/* The next size of an inflate's output buffer of `cap` bytes, for `n` bytes of input: four
 * times the input at first (at least INFLATE_FIRST), then doubling; never beyond the cap plus
 * one byte (a stream that fills that is beyond the limit). */
static size_t next_size(size_t cap, size_t n, size_t max)
{
    size_t want;
    if (cap == 0)
        want = n < INFLATE_FIRST / 4 ? INFLATE_FIRST : n > SIZE_MAX / 4 ? SIZE_MAX : n * 4;
    else
        want = cap > SIZE_MAX / 2 ? SIZE_MAX : cap * 2;
    return want > max + 1 ? max + 1 : want;
}

/* One inflate pass with zlib window bits `wbits`. *header_bad is set when it failed on the
 * first bytes with a header error (so that raw deflate can be tried instead). */
static int inflate_pass(const api__inflate_job *job, int wbits, char **out, size_t *out_len,
                        size_t *reserved, bool *header_bad, api__error *err)
{
    const api__coding coding = job->coding;
    const char *src = job->src;
    const size_t n = job->n, max = job->max;
    api_lease *lease = job->lease;
    z_stream zs;
    char *buf = NULL;
    size_t cap = 0, len = 0, in_at = 0;
    int rc = Z_OK;
    *header_bad = false;
    memset(&zs, 0, sizeof zs);
    if (inflateInit2(&zs, wbits) != Z_OK)
        return api__error_set(err, API_STATUS_UNAVAILABLE, API_REASON_MEMORY, NULL,
                              "out of memory for inflate");
    for (;;) {
        if (len == cap) {
            /* The cap plus one byte: a stream that fills it is beyond the limit. */
            size_t want = next_size(cap, n, max);
            if (len > max) {
                inflateEnd(&zs);
                free(buf);
                return api__error_set(err, API_STATUS_TOO_LARGE, API_REASON_TOO_LARGE, NULL,
                                      "the body decompresses to more than the %zu bytes that "
                                      "--max-body-bytes allows",
                                      max);
            }
            if (grow(&buf, &cap, want, lease, reserved, err) != 0) {
                inflateEnd(&zs);
                free(buf);
                return -1;
            }
        }
        if (zs.avail_in == 0 && in_at < n) {
            size_t m = n - in_at < ZLIB_CHUNK ? n - in_at : ZLIB_CHUNK;
            zs.next_in = (Bytef *)(uintptr_t)(src + in_at);
            zs.avail_in = (uInt)m;
            in_at += m;
        }
        size_t room = cap - len < ZLIB_CHUNK ? cap - len : ZLIB_CHUNK;
        zs.next_out = (Bytef *)(buf + len);
        zs.avail_out = (uInt)room;
        rc = inflate(&zs, Z_NO_FLUSH);
        len += room - zs.avail_out;
        if (rc == Z_STREAM_END) {
            /* gzip allows several members one after the other (RFC 1952 section 2.2). */
            if (coding == API_CODING_GZIP && (zs.avail_in > 0 || in_at < n)) {
                if (inflateReset(&zs) != Z_OK)
                    break;
                continue;
            }
            if (zs.avail_in > 0 || in_at < n) {
                stream_error(coding, &zs, "followed by extra bytes", err);
                break;
            }
            inflateEnd(&zs);
            if (len > max) {
                free(buf);
                return api__error_set(err, API_STATUS_TOO_LARGE, API_REASON_TOO_LARGE, NULL,
                                      "the body decompresses to more than the %zu bytes that "
                                      "--max-body-bytes allows",
                                      max);
            }
            /* A NUL past the end, for parsers that like one; the cap has the room. */
            if (len == cap && grow(&buf, &cap, cap + 1, lease, reserved, err) != 0) {
                free(buf);
                return -1;
            }
            buf[len] = '\0';
            *out = buf;
            *out_len = len;
            return 0;
        }
        if (rc == Z_BUF_ERROR && zs.avail_in == 0 && in_at == n && zs.avail_out > 0) {
            stream_error(coding, &zs, "truncated", err);
            break;
        }
        if (rc == Z_MEM_ERROR) {
            api__error_set(err, API_STATUS_UNAVAILABLE, API_REASON_MEMORY, NULL,
                           "out of memory for inflate");
            break;
        }
        if (rc != Z_OK && rc != Z_BUF_ERROR) {
            *header_bad = rc == Z_DATA_ERROR && zs.total_out == 0 && zs.total_in <= 2;
            stream_error(coding, &zs, "corrupt", err);
            break;
        }
    }
    inflateEnd(&zs);
    free(buf);
    return -1;
}

int api__inflate(const api__inflate_job *job, char **out, size_t *out_len, size_t *reserved,
                 api__error *err)
{
    const api__coding coding = job->coding;
    api__inflate_job capped = *job;
    bool header_bad = false;
    *out = NULL;
    *out_len = 0;
    *reserved = 0;
    if (coding != API_CODING_GZIP && coding != API_CODING_DEFLATE)
        return api__error_set(err, API_STATUS_INTERNAL, API_REASON_INTERNAL, NULL,
                              "api__inflate: not a coding");
    if (capped.max >= SIZE_MAX - 1)
        capped.max = SIZE_MAX - 2;
    /* HTTP's deflate is the zlib format, but some clients send raw deflate: try that when the
     * zlib header is wrong. */
    int wbits = coding == API_CODING_GZIP ? 15 + 16 : 15;
    if (inflate_pass(&capped, wbits, out, out_len, reserved, &header_bad, err) == 0)
        return 0;
    if (coding == API_CODING_DEFLATE && header_bad) {
        api__error raw_err;
        memset(&raw_err, 0, sizeof raw_err);
        api_lease_give_back(job->lease, *reserved);
        *reserved = 0;
        if (inflate_pass(&capped, -15, out, out_len, reserved, &header_bad, &raw_err) == 0) {
            memset(err, 0, sizeof *err);
            return 0;
        }
        if (raw_err.status == API_STATUS_TOO_LARGE || raw_err.status == API_STATUS_OVERLOADED ||
            raw_err.status == API_STATUS_UNAVAILABLE) {
            memset(err, 0, sizeof *err);
            *err = raw_err;
        }
    }
    return -1;
}

/* ---- Deflate ------------------------------------------------------------------------------ */

bool api__deflate(api__coding coding, const char *src, size_t n, char **out, size_t *out_len)
{
    z_stream zs;
    int wbits = coding == API_CODING_GZIP ? 15 + 16 : 15;
    *out = NULL;
    *out_len = 0;
    memset(&zs, 0, sizeof zs);
    if (deflateInit2(&zs, Z_BEST_SPEED, Z_DEFLATED, wbits, 8, Z_DEFAULT_STRATEGY) != Z_OK)
        return false;
    /* deflateBound takes a uLong: exact on LP64. The gzip header and trailer are 18 bytes. */
    size_t cap = (size_t)deflateBound(&zs, (uLong)n) + 32;
    char *buf = eng_buf_alloc(cap); /* a reply body, as the text it replaces */
    if (!buf) {
        deflateEnd(&zs);
        return false;
    }
    size_t in_at = 0, len = 0;
    int rc;
    do {
        if (zs.avail_in == 0 && in_at < n) {
            size_t m = n - in_at < ZLIB_CHUNK ? n - in_at : ZLIB_CHUNK;
            zs.next_in = (Bytef *)(uintptr_t)(src + in_at);
            zs.avail_in = (uInt)m;
            in_at += m;
        }
        size_t room = cap - len < ZLIB_CHUNK ? cap - len : ZLIB_CHUNK;
        zs.next_out = (Bytef *)(buf + len);
        zs.avail_out = (uInt)room;
        rc = deflate(&zs, in_at == n ? Z_FINISH : Z_NO_FLUSH);
        len += room - zs.avail_out;
    } while ((rc == Z_OK || rc == Z_BUF_ERROR) && len < cap);
    deflateEnd(&zs);
    if (rc != Z_STREAM_END) {
        eng_buf_free(buf); /* defensive: deflateBound guarantees the room */
        return false;
    }
    *out = buf;
    *out_len = len;
    return true;
}

/* ---- The wrapper -------------------------------------------------------------------------- */

static void reply_from_error(api_reply *reply, api_error_style style, const api__error *err)
{
    memset(reply, 0, sizeof *reply);
    api__reply_from_error(reply, style, err);
}

/* Compresses the reply's body in place when the client accepts it and it gets smaller. Only
 * successful replies: error bodies are small, and clients read them on paths that do not
 * decompress (tritonclient's error path decodes the raw bytes as UTF-8, and aiohttp always
 * sends Accept-Encoding), so Triton, too, compresses only successful inference replies. */
void api__reply_compress(const api_call *call, api_error_style style, api_reply *reply)
{
    api_lease *lease = call->lease;
    api__coding coding = api__accept_encoding_pick(call->accept_encoding);
    char *packed;
    size_t packed_len;
    if (coding == API_CODING_IDENTITY || !reply->body || reply->body_len == 0 ||
        reply->status != api_status_http(style, API_STATUS_OK))
        return;
    /* Both bodies exist for a moment: reserve the compressed one's worst case, or send the
     * reply as it is (compression is a favour, not a reason to fail). The smaller body that
     * stays is covered by what the lease holds for the plain one. */
    size_t bound = (size_t)compressBound((uLong)reply->body_len) + 32;
    if (api_lease_reserve(lease, bound) != API_BUDGET_OK)
        return;
    int64_t t0 = eng_now_ns();
    bool ok = api__deflate(coding, reply->body, reply->body_len, &packed, &packed_len);
    api_lease_give_back(lease, bound);
    if (!ok)
        return;
    if (packed_len >= reply->body_len) {
        eng_buf_free(packed);
        return;
    }
    eng_buf_free(reply->body);
    reply->body = packed;
    reply->body_len = packed_len;
    reply->content_encoding = coding_name(coding);
    reply->encode_ns += eng_now_ns() - t0;
}

/* Runs `route` on the plain body (inflating it first when coded), with `lease` the request's. */
static void route_decoded(api_route_fn route, api_error_style style, const api_call *call,
                          api__coding coding, api_reply *reply)
{
    if (coding == API_CODING_IDENTITY) {
        route(call, reply);
        return;
    }
    int64_t t0 = eng_now_ns();
    api_limits limits = call->limits ? *call->limits : api_limits_default();
    char *plain = NULL;
    size_t plain_len = 0, reserved = 0;
    api__error err;
    memset(&err, 0, sizeof err);
    api__inflate_job job = {coding, call->body ? call->body : "", call->body_len,
                            limits.max_body_bytes, call->lease};
    if (api__inflate(&job, &plain, &plain_len, &reserved, &err) != 0) {
        api_lease_give_back(call->lease, reserved);
        reply_from_error(reply, style, &err);
        reply->decode_ns = reply->parse_ns = eng_now_ns() - t0;
        return;
    }
    api_call inner = *call;
    inner.body = plain;
    inner.body_len = plain_len;
    inner.content_encoding = NULL;
    int64_t inflate_ns = eng_now_ns() - t0;
    route(&inner, reply);
    reply->decode_ns += inflate_ns;
    reply->parse_ns += inflate_ns;
    free(plain);
    api_lease_give_back(call->lease, reserved);
}

void api_call_encoded(api_route_fn route, api_error_style style, const api_call *call,
                      api_reply *reply)
{
    api__coding coding = api__coding_parse(call->content_encoding);
    if (coding == API_CODING_UNKNOWN) {
        api__error err;
        memset(&err, 0, sizeof err);
        api__error_set(&err, API_STATUS_UNSUPPORTED_MEDIA_TYPE, API_REASON_BAD_REQUEST, NULL,
                       "unsupported Content-Encoding \"%.64s\": send gzip, deflate or identity",
                       call->content_encoding);
        reply_from_error(reply, style, &err);
        return;
    }
    /* The route, the inflated body and the compressed reply share one lease: the caller's, or
     * one that lives for this call. */
    api_call leased = *call;
    api_lease own;
    if (!leased.lease) {
        api_lease_start(&own, NULL, eng_now_ns(), 0);
        leased.lease = &own;
    }
    route_decoded(route, style, &leased, coding, reply);
    api__reply_compress(&leased, style, reply);
    if (leased.lease == &own)
        api_lease_end(&own);
}
