/*
 * timeout_peek.c - a request's own timeout and priority, a v2 request's sequence and layer and
 * the session, model and layer of a /v1/mha step, read from its body before any worker decodes
 * it.
 *
 * A request may shorten its deadline: "timeout_ms" at the top level of a native body, or in
 * the top-level "parameters" object of a KServe v2 one, with Triton's "timeout" (microseconds)
 * beside it; and a v2 request may ask for a priority level, Triton's "priority" in the same
 * object. A route reads them once a worker decodes the body, which is too late for a request
 * waiting in the queue behind long ones: the server needs the deadline and the priority when it
 * queues the request, so that its watcher can answer 504 on time and the pool can put it ahead
 * of less urgent ones. A v2 request may also be a step of a sequence, Triton's "sequence_id" in
 * the same object, and a POST /v1/mha one of a session, its top-level "session", which the
 * server needs as it admits the request: only there is its place in the order of the sequence
 * (or session) the order of arrival. The model a /v1/mha request names ("model", or its
 * session's) and its "layer" (v2's parameter "layer") let waiting requests of one layer run as
 * one batch (api_batch_key). It asks here, on its I/O thread, where parsing a 64 MB body would
 * cost everyone else what it saves one request. So this reads only what it must, every value in
 * one walk:
 *
 *   1. a gate: memchr over the quotes of a native body for one that opens "timeout_ms",
 *      "session", "model" or "layer" (tensors in base64 or numbers hold few quotes), memmem for
 *      "parameters" in a v2 one (where its values live): a body that does not contain them (most
 *      of them) costs one pass at memory speed, and nothing is parsed;
 *   2. otherwise the top level is walked, skipping values without parsing them: strings with
 *      memchr for the closing quote (one preceded by an odd number of backslashes is escaped),
 *      arrays and objects by their bracket depth outside strings. Only a member of the top-level
 *      object (native) or of the top-level "parameters" object (v2) counts, so a "timeout_ms"
 *      inside a string or a nested object never does.
 *
 * For a valid body the answer is the timeout its route applies, or 0, which the server reads
 * as "none" and which is never wrong, only late: a route then applies the timeout when a worker
 * reaches the request, as before. 0 comes back for a body that names no timeout, a value that
 * is not an integer in the route's range, a key written with escapes ("timeout\u005fms"), a
 * Content-Type the route refuses, and a gzip or deflate body that inflates past
 * API_PEEK_INFLATE_MAX (out->unread: inflating that much is a worker's job, not the I/O
 * thread's; a smaller one is inflated here, since a step's place in its order is only known
 * as it arrives). The walk stops at the first member that answers, so a malformed body may
 * still give a timeout; its route then reports the error as always.
 *
 * A sequence_id is the text as written: an integer's digits, or a string's bytes with escapes
 * not undone, which is what keys the order (7 and "7" are one sequence, here as for the route;
 * "a" and "\u0061" are one for the route and two orders here, which no client needs). One it
 * cannot read, for the same reasons as a timeout, gives its request no place in the order: it
 * runs as a request of no sequence would, when a worker takes it.
 */
#include <stdlib.h>
#include <string.h>

#include "api/wire/body.h"
#include "api/wire/content_coding.h"
#include "api/wire/http_header.h"
#include "api/wire/timeout.h"

/* The unread part of the JSON text. */
typedef struct {
    const char *p, *end;
} cursor;

static bool at(const cursor *c, char ch)
{
    return c->p < c->end && *c->p == ch;
}

static bool is_space(char ch)
{
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r';
}

static void skip_space(cursor *c)
{
    while (c->p < c->end && is_space(*c->p))
        c->p++;
}

/* Where a scalar ends: a separator or a blank (or the end of the text). */
static bool ends_scalar(const cursor *c)
{
    return c->p == c->end || is_space(*c->p) || *c->p == ',' || *c->p == '}' || *c->p == ']';
}

/* Skips the string starting at c->p (its opening quote), as the body scan reads strings. False
 * for an unterminated string. */
static bool skip_string(cursor *c)
{
    size_t len = (size_t)(c->end - c->p), close = api__json_string_end(c->p, 1, len);
    if (close == len)
        return false;
    c->p += close + 1;
    return true;
}

/* What the bracket walk stops at: a quote, or a bracket that opens or closes a level. */
enum { PLAIN = 0, QUOTE, OPEN, CLOSE };
static const unsigned char nesting[256] = {
    ['"'] = QUOTE, ['['] = OPEN, ['{'] = OPEN, [']'] = CLOSE, ['}'] = CLOSE,
};

/* Whether any of p[0..8) is a quote or a bracket. */
static bool any_structural8(const unsigned char *p)
{
    return nesting[p[0]] | nesting[p[1]] | nesting[p[2]] | nesting[p[3]] | nesting[p[4]] |
           nesting[p[5]] | nesting[p[6]] | nesting[p[7]];
}

/* Skips the array or object starting at c->p by bracket depth, strings skipped whole. Which
 * bracket closes which is not checked: a body that mixes them is the route's to refuse. */
static bool skip_nested(cursor *c)
{
    size_t depth = 0;
    while (c->p < c->end) {
        switch (nesting[(unsigned char)*c->p]) {
        case PLAIN:
            c->p++;
            /* Most of a tensor is digits and separators: one test passes 8 bytes with no
             * quote or bracket, so that a large body is not skipped a byte at a time. */
            while (c->end - c->p >= 8 && !any_structural8((const unsigned char *)c->p))
                c->p += 8;
            break;
        case QUOTE:
            if (!skip_string(c))
                return false;
            break;
        case OPEN:
            depth++;
            c->p++;
            break;
        case CLOSE:
            c->p++;
            if (--depth == 0)
                return true;
            break;
        }
    }
    return false;
}

/* Skips one value: a string, an array or object, or a scalar (number, true, false, null), which
 * ends where a separator or blank begins. False when there is none. */
static bool skip_value(cursor *c)
{
    const char *start = c->p;
    if (at(c, '"'))
        return skip_string(c);
    if (at(c, '[') || at(c, '{'))
        return skip_nested(c);
    while (!ends_scalar(c))
        c->p++;
    return c->p > start;
}

/* Consumes the '{' that opens an object; false when the value is not one. */
static bool enter_object(cursor *c)
{
    skip_space(c);
    if (!at(c, '{'))
        return false;
    c->p++;
    return true;
}

/* Moves to the next member of the object being walked: past the ',' after the previous member
 * (none before the first), the key and the ':', to the value. The key's bytes as written (escapes
 * not undone) go to *key and *key_len. False at the end of the object, or on malformed text. */
static bool next_member(cursor *c, bool first, const char **key, size_t *key_len)
{
    skip_space(c);
    if (!first) {
        if (!at(c, ','))
            return false;
        c->p++;
        skip_space(c);
    }
    if (!at(c, '"'))
        return false;
    *key = c->p + 1;
    if (!skip_string(c))
        return false;
    *key_len = (size_t)(c->p - 1 - *key);
    skip_space(c);
    if (!at(c, ':'))
        return false;
    c->p++;
    skip_space(c);
    return true;
}

static bool key_is(const char *key, size_t key_len, const char *name)
{
    return key_len == strlen(name) && memcmp(key, name, key_len) == 0;
}

/* Reads the value at c->p if it is an integer in [lo, hi] (lo >= 0) as jansson reads one: JSON's
 * grammar (no leading zeros), no fraction or exponent. False for anything else: a negative
 * number, a real such as 100.0 (the routes refuse it), null, a string, a value out of range;
 * the cursor is then left anywhere, and the caller gives up. */
static bool read_int(cursor *c, int64_t lo, int64_t hi, int64_t *out)
{
    const char *first = c->p;
    int64_t v = 0;
    for (; c->p < c->end && *c->p >= '0' && *c->p <= '9'; c->p++) {
        v = v * 10 + (*c->p - '0');
        if (v > hi) /* also keeps the next step from overflowing: hi < INT64_MAX / 10 */
            return false;
    }
    if (c->p == first || (*first == '0' && c->p - first > 1))
        return false; /* no digits, or a leading zero */
    if (!ends_scalar(c) || v < lo)
        return false; /* a fraction, an exponent, junk, or too small */
    *out = v;
    return true;
}

/* The plain text of the call's body into *text, *len: the body itself, or a gzip or deflate
 * one inflated into out->inflated (at most API_PEEK_INFLATE_MAX bytes, reserved through the
 * call's lease). False when there is none to read: no body, an unknown coding (the route
 * answers 415), or one that cannot be inflated here (out->unread). */
static bool plain_text(const api_call *call, api_peek *out, const char **text, size_t *len)
{
    api__coding coding = api__coding_parse(call->content_encoding);
    api__error err;
    api_lease own;
    *text = call->body;
    *len = call->body_len;
    if (!call->body || coding == API_CODING_UNKNOWN)
        return false;
    if (coding == API_CODING_IDENTITY)
        return true;
    memset(&err, 0, sizeof err);
    out->lease = call->lease;
    if (!out->lease)
        api_lease_start(&own, NULL, 0, 0); /* no budget: nothing to give back */
    api__inflate_job job = {coding, call->body, call->body_len, API_PEEK_INFLATE_MAX,
                            out->lease ? out->lease : &own};
    if (api__inflate(&job, &out->inflated, len, &out->reserved, &err) != 0) {
        api_peek_free(out);
        out->unread = true;
        return false;
    }
    *text = out->inflated;
    return true;
}

void api_peek_free(api_peek *p)
{
    free(p->inflated);
    if (p->lease)
        api_lease_give_back(p->lease, p->reserved);
    p->inflated = NULL;
    p->reserved = 0;
    p->lease = NULL;
}

/* Whether a quote in text[0..len) is followed by one of the n words: a key the walk could read
 * opens so. One memchr pass over the quotes, whatever n. */
static bool any_quoted(const char *text, size_t len, const char *const *words, size_t n)
{
    const char *p = text, *end = text + len;
    while ((p = memchr(p, '"', (size_t)(end - p))) != NULL) {
        p++;
        for (size_t i = 0; i < n; i++) {
            size_t wl = strlen(words[i]);
            if ((size_t)(end - p) >= wl && memcmp(p, words[i], wl) == 0)
                return true;
        }
    }
    return false;
}

/* Reads the string at c->p into out[cap] when it is one of 1 to cap - 1 bytes without escapes
 * (a session id is "s" and hex digits, a model a --model name); false for anything else. */
static bool read_plain_string(cursor *c, char *out, size_t cap)
{
    if (!at(c, '"'))
        return false;
    const char *start = c->p + 1;
    if (!skip_string(c))
        return false;
    size_t len = (size_t)(c->p - 1 - start);
    if (len == 0 || len >= cap || memchr(start, '\\', len))
        return false;
    memcpy(out, start, len);
    out[len] = '\0';
    return true;
}

/* A session id or model name at c->p into out[cap] (read_plain_string), or "" past a value that
 * is not one (a number, an escape: no ticket, no batch, and the walk goes on for the timeout);
 * false only for a value that cannot be skipped. */
static bool read_name(cursor *c, char *out, size_t cap)
{
    const char *value = c->p;
    if (read_plain_string(c, out, cap))
        return true;
    out[0] = '\0';
    c->p = value;
    return skip_value(c);
}

void api_peek_native(const api_call *call, api_peek *out)
{
    static const char *const words[] = {"timeout_ms\"", "session\"", "model\"", "layer\""};
    const char *key;
    size_t key_len;
    int64_t ms, layer;
    bool timeout_seen = false, session_seen = false, model_seen = false, layer_seen = false;
    cursor c;
    const char *text;
    size_t len;
    *out = (api_peek){0};
    if (!api__content_type_json(call->content_type) || !plain_text(call, out, &text, &len) ||
        !any_quoted(text, len, words, 4))
        return;
    c.p = text;
    c.end = text + len;
    if (!enter_object(&c))
        return;
    /* Until all four are read; a value none can be read as ends the walk (its route refuses
     * it). */
    for (bool first = true; !(timeout_seen && session_seen && model_seen && layer_seen) &&
                            next_member(&c, first, &key, &key_len);
         first = false) {
        bool ok;
        if (key_is(key, key_len, "timeout_ms")) {
            timeout_seen = true;
            ok = read_int(&c, 1, API_TIMEOUT_MS_MAX, &ms);
            if (ok)
                out->timeout_ms = ms;
        } else if (key_is(key, key_len, "session")) {
            session_seen = true;
            ok = read_name(&c, out->session, sizeof out->session);
        } else if (key_is(key, key_len, "model")) {
            model_seen = true;
            ok = read_name(&c, out->model, sizeof out->model);
        } else if (key_is(key, key_len, "layer")) {
            layer_seen = true;
            ok = read_int(&c, 0, INT32_MAX, &layer);
            if (ok)
                out->layer = layer;
        } else {
            ok = skip_value(&c);
        }
        if (!ok)
            return;
    }
}

/* Reads Triton's "sequence_id" at c->p as v2_request.c reads it: a string (its bytes between
 * the quotes, as written: unescaping is the route's job, and a client spells one sequence one
 * way) or an integer in JSON's grammar (its digits), where "" and 0 mean none (*id NULL). False
 * for anything else (a negative or real number, null...), which the route refuses. */
static bool read_sequence_id(cursor *c, const char **id, size_t *len)
{
    const char *first = c->p, *end;
    *id = NULL;
    *len = 0;
    if (at(c, '"')) {
        if (!skip_string(c))
            return false;
        first++; /* the bytes between the quotes */
        end = c->p - 1;
    } else {
        while (c->p < c->end && *c->p >= '0' && *c->p <= '9')
            c->p++;
        if (c->p == first || (*first == '0' && c->p - first > 1) || !ends_scalar(c))
            return false; /* not an integer, a leading zero, a fraction or an exponent */
        if (*first == '0')
            return true; /* 0: none */
        end = c->p;
    }
    if (end > first) { /* "": none */
        *id = first;
        *len = (size_t)(end - first);
    }
    return true;
}

/* The timeout (as api__v2_timeout_ms combines them), the priority, the sequence_id and the
 * layer named in the "parameters" object at c->p. Any value it cannot read leaves them all
 * unset: the route refuses such a body. */
static void v2_parameters_peek(cursor *c, api_peek *out)
{
    const char *key, *seq = NULL;
    size_t key_len, seq_len = 0;
    int64_t ms = 0, us = 0, priority = 0, layer = 0;
    if (!enter_object(c))
        return;
    for (bool first = true; next_member(c, first, &key, &key_len); first = false) {
        bool ok;
        if (key_is(key, key_len, "timeout_ms"))
            ok = read_int(c, 1, API_TIMEOUT_MS_MAX, &ms);
        else if (key_is(key, key_len, "timeout"))
            ok = read_int(c, 0, API_TIMEOUT_US_MAX, &us);
        else if (key_is(key, key_len, "priority"))
            ok = read_int(c, 0, UINT32_MAX, &priority);
        else if (key_is(key, key_len, "sequence_id"))
            ok = read_sequence_id(c, &seq, &seq_len);
        else if (key_is(key, key_len, "layer"))
            ok = read_int(c, 0, INT32_MAX, &layer);
        else
            ok = skip_value(c);
        if (!ok)
            return;
    }
    out->timeout_ms = api__v2_timeout_ms(ms, us);
    out->priority = (uint64_t)priority;
    out->sequence_id = seq;
    out->sequence_id_len = seq_len;
    out->layer = layer;
}

void api_peek_v2(const api_call *call, api_peek *out)
{
    const char *text, *key;
    size_t len, json_len, key_len;
    cursor c;
    *out = (api_peek){0};
    if (!api__content_type_v2(call->content_type) || !plain_text(call, out, &text, &len))
        return;
    /* With binary tensor data (its length is that of the plain body), only the JSON before it
     * can name a timeout, a priority or a sequence. */
    json_len = len;
    if (call->inference_header_length &&
        (!api__header_len_parse(call->inference_header_length, &json_len) || json_len > len))
        return;
    if (!memmem(text, json_len, "parameters", strlen("parameters")))
        return;
    c.p = text;
    c.end = text + json_len;
    if (!enter_object(&c))
        return;
    for (bool first = true; next_member(&c, first, &key, &key_len); first = false) {
        if (key_is(key, key_len, "parameters")) {
            v2_parameters_peek(&c, out);
            return;
        }
        if (!skip_value(&c))
            return;
    }
}

int64_t api_timeout_peek(const api_call *call)
{
    api_peek p;
    api_peek_native(call, &p);
    api_peek_free(&p);
    return p.timeout_ms;
}

int64_t api_v2_timeout_peek(const api_call *call)
{
    api_peek p;
    api_peek_v2(call, &p);
    api_peek_free(&p);
    return p.timeout_ms;
}

int64_t api__v2_timeout_ms(int64_t timeout_ms, int64_t timeout_us)
{
    int64_t ms = (timeout_us + 999) / 1000;
    if (timeout_us > 0 && (timeout_ms == 0 || ms < timeout_ms))
        return ms;
    return timeout_ms;
}
