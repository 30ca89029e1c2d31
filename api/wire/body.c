/*
 * body.c - from request bytes to a jansson tree, without letting jansson near big tensors.
 *
 * jansson is a fine parser for the shape of a request and a slow one for its bulk: it reads a
 * string one character at a time (about 75 MB/s: 0.9 s for the 64 MB of base64 in a
 * (1, 8, 8192, 64) float32 request, longer than the attention itself) and allocates a json_t
 * per number (about 160 ns and 40 bytes each: most of the cost of a small nested request). So
 * a first pass over the body finds the bulk:
 *
 *   - string values of API_BODY_LONG_STRING bytes or more of printable ASCII without escapes
 *     (base64 tensors),
 *     found at memory speed with memchr;
 *   - arrays of API_BODY_MANY_NUMBERS numbers or more, nested rectangularly at most
 *     API_MAX_RANK deep, checked by a strict scanner that accepts exactly JSON's number
 *     grammar, and only numbers jansson would also accept (it refuses doubles that overflow
 *     and integers beyond int64);
 *   - the tokens NaN, Infinity and -Infinity, wherever a value may stand. They are not JSON,
 *     but Python's json module writes them (tritonclient sends a float mask's -inf as
 *     -Infinity), so they are read as the numbers they name, inside the arrays above or, one
 *     by one, as spans of their own; the tensor decoder then decides where a non-finite
 *     value may stand (-inf in a float mask, nothing else).
 *
 * jansson then parses a copy of the body in which each of these spans is a placeholder string:
 * the escape \u0000 (a NUL, allowed with JSON_ALLOW_NUL) followed by the span's index. The
 * tensor decoder reads the spans where they are in the body. Anything the scanner does not
 * accept, however odd, stays in the copy, and jansson reports it as it would have. Arrays are
 * converted number by number as jansson would have (integers through int64, others through a
 * correctly rounded double), so the floats are bit-identical on both paths.
 *
 * A placeholder cannot be confused with a client's string: elision happens only when the rest
 * of the body has no "\u0000" escape, and without one a parsed string cannot start with NUL.
 * (A body that has one is parsed by jansson alone, where a non-finite token is malformed JSON.)
 * The same pass counts values, to estimate the memory jansson will hold (the first item of a
 * request's memory budget).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/core/memory.h"
#include "api/wire/body.h"
#include "api/wire/chunks.h"

/* Bytes jansson may hold per JSON value: a json_t of 24 to 48 bytes as a malloc chunk, a slot
 * in the parent array (8 bytes, up to 16 with doubling) or object (a hash entry). */
#define BODY_BYTES_PER_VALUE 64

/* Characters that matter outside strings: the quote, and the punctuation that starts a value. */
static const unsigned char body_special[256] = {
    ['"'] = 1, [','] = 2, [':'] = 2, ['['] = 3, ['{'] = 2,
};

static bool is_json_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* The length of the token NaN, Infinity or -Infinity at s[i] (its value in *v), or 0 when
 * there is none: the token must end where the body does or at a character that cannot
 * continue a JSON token. */
static size_t nonfinite_read(const char *s, size_t i, size_t len, double *v)
{
    static const struct {
        const char *text;
        size_t len;
        double value;
    } tokens[] = {{"NaN", 3, NAN}, {"Infinity", 8, INFINITY}, {"-Infinity", 9, -INFINITY}};
    for (size_t k = 0; k < sizeof tokens / sizeof tokens[0]; k++) {
        size_t n = tokens[k].len;
        if (len - i < n || memcmp(s + i, tokens[k].text, n) != 0)
            continue;
        if (i + n < len && !is_json_space(s[i + n]) && s[i + n] != ',' && s[i + n] != ']' &&
            s[i + n] != '}')
            return 0;
        *v = tokens[k].value;
        return n;
    }
    return 0;
}

/* Whether s[i] may start one of those tokens (a cheap test before nonfinite_read). */
static bool nonfinite_start(const char *s, size_t i, size_t len)
{
    return s[i] == 'N' || s[i] == 'I' || (s[i] == '-' && i + 1 < len && s[i + 1] == 'I');
}

/* ---- Numbers ----------------------------------------------------------------------------- */

/* One JSON number token, as the scanner and the decoder see it. */
typedef struct {
    size_t end;   /* offset just past the token */
    bool integer; /* no fraction and no exponent: jansson makes it a json_int_t */
    bool negative;
    uint64_t digits; /* the significant digits, while they fit (n_digits <= 19) */
    int n_digits;    /* significant digits (leading zeros of the integer part excluded) */
    int exp10;       /* value = digits * 10^exp10, when n_digits <= 19 */
    int magnitude;   /* about log10 of the value: for the overflow test */
} number_token;

/* Reads the JSON number at s[i] (grammar: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?).
 * False if it is not one, or is one that jansson would refuse (an integer beyond int64, a
 * double beyond DBL_MAX) or that is too long to be worth the fast path: then the array stays
 * with jansson, which reports or reads it. */
static bool number_read(const char *s, size_t i, size_t len, number_token *t)
{
    int frac_len = 0;
    memset(t, 0, sizeof *t);
    t->integer = true;
    if (i < len && s[i] == '-') {
        t->negative = true;
        i++;
    }
    if (i >= len || !is_digit(s[i]))
        return false;
    /* The digits of the integer and fraction parts, read as one integer: the value is that
     * integer times 10^(exponent - fraction length). Zeros before the first nonzero digit do
     * not count as significant. */
    if (s[i] == '0') {
        i++; /* JSON allows no other digit after a leading zero; the caller sees it next */
    } else {
        while (i < len && is_digit(s[i])) {
            if (t->n_digits < 19)
                t->digits = t->digits * 10 + (uint64_t)(s[i] - '0');
            t->n_digits++;
            i++;
        }
    }
    if (i < len && s[i] == '.') {
        t->integer = false;
        i++;
        if (i >= len || !is_digit(s[i]))
            return false;
        while (i < len && is_digit(s[i])) {
            if (t->n_digits > 0 || s[i] != '0') {
                if (t->n_digits < 19)
                    t->digits = t->digits * 10 + (uint64_t)(s[i] - '0');
                t->n_digits++;
            }
            frac_len++;
            i++;
        }
    }
    long e = 0;
    if (i < len && (s[i] == 'e' || s[i] == 'E')) {
        bool eneg = false;
        t->integer = false;
        i++;
        if (i < len && (s[i] == '+' || s[i] == '-'))
            eneg = s[i++] == '-';
        if (i >= len || !is_digit(s[i]))
            return false;
        while (i < len && is_digit(s[i])) {
            if (e < 100000)
                e = e * 10 + (s[i] - '0');
            i++;
        }
        if (eneg)
            e = -e;
    }
    /* Digits past 19 were not kept: such a number is rare in a tensor and goes to jansson. */
    if (t->n_digits > 19 || frac_len > 100000)
        return false;
    if (t->integer && t->n_digits > 18)
        return false; /* maybe beyond int64: jansson says "too big integer" */
    t->exp10 = (int)e - frac_len;
    /* log10 of a nonzero value is within one of (n_digits - 1) + exp10. */
    t->magnitude = t->n_digits == 0 ? 0 : t->n_digits - 1 + t->exp10;
    if (t->magnitude > 300 || t->magnitude < -300)
        return false; /* near the ends of the double range: let jansson and strtod decide */
    t->end = i;
    return true;
}

/* number_read for a token that number_read already accepted, without its checks: the decode
 * pass reads every number a second time, so this is the hot loop of a nested request. The
 * token is followed by ',', ']' or a space inside the span, so nothing is read past it. */
static void number_parse_checked(const char *s, size_t i, number_token *t)
{
    int frac_len = 0, e = 0;
    uint64_t digits = 0;
    int n = 0;
    t->negative = s[i] == '-';
    i += t->negative;
    t->integer = true;
    for (; is_digit(s[i]); i++) {
        if (n > 0 || s[i] != '0') {
            digits = digits * 10 + (uint64_t)(s[i] - '0');
            n++;
        }
    }
    if (s[i] == '.') {
        t->integer = false;
        for (i++; is_digit(s[i]); i++, frac_len++) {
            if (n > 0 || s[i] != '0') {
                digits = digits * 10 + (uint64_t)(s[i] - '0');
                n++;
            }
        }
    }
    if (s[i] == 'e' || s[i] == 'E') {
        t->integer = false;
        i++;
        bool eneg = s[i] == '-';
        i += s[i] == '-' || s[i] == '+';
        for (; is_digit(s[i]); i++)
            if (e < 100000) /* capped as in number_read */
                e = e * 10 + (s[i] - '0');
        if (eneg)
            e = -e;
    }
    t->digits = digits;
    t->n_digits = n;
    t->exp10 = e - frac_len;
    t->end = i;
}

/* 10^0 .. 10^22, exact in double. */
static const double pow10_exact[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                       1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                       1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* The double jansson would have made of token t (text at s + start): integers through
 * int64, others correctly rounded. Clinger's fast path (digits < 2^53, |exp10| <= 22: one
 * exact operation, correctly rounded) covers almost every number a tensor holds; strtod does
 * the rest. */
static double number_value(const char *s, size_t start, const number_token *t)
{
    if (t->integer) {
        int64_t v = (int64_t)t->digits; /* n_digits <= 18 */
        return (double)(t->negative ? -v : v);
    }
    if (t->digits < ((uint64_t)1 << 53) && t->exp10 >= -22 && t->exp10 <= 22) {
        double v = (double)t->digits;
        v = t->exp10 < 0 ? v / pow10_exact[-t->exp10] : v * pow10_exact[t->exp10];
        return t->negative ? -v : v;
    }
    /* strtod stops at the ',' or ']' that follows the token, inside the body. */
    return strtod(s + start, NULL);
}

/* ---- The scan ---------------------------------------------------------------------------- */

/* Checks the array that starts at s[i] == '[': rectangular nesting of numbers only, every
 * number acceptable to number_read. Fills sp (kind, offset, len, rank, shape, count). */
static bool scan_numbers(const char *s, size_t i, size_t len, api__body_span *sp)
{
    size_t count[API_MAX_RANK];
    int depth = 0, rank = 0;
    bool want_value = true; /* after '[' or ',': a value (or, after '[', a ']') */
    size_t start = i;

    memset(sp, 0, sizeof *sp);
    for (;;) {
        while (i < len && is_json_space(s[i]))
            i++;
        if (i >= len)
            return false;
        char c = s[i];
        if (c == '[') {
            if (!want_value || depth == API_MAX_RANK || (rank && depth >= rank))
                return false;
            count[depth++] = 0;
            i++;
        } else if (c == ']') {
            /* An empty array, or a trailing comma: leave both to jansson and the probe. */
            if (want_value)
                return false;
            size_t n = count[depth - 1];
            if (sp->shape[depth - 1] == 0)
                sp->shape[depth - 1] = (int64_t)n;
            else if ((size_t)sp->shape[depth - 1] != n)
                return false; /* not rectangular: jansson's tree gives the better message */
            depth--;
            i++;
            if (depth == 0)
                break;
            count[depth - 1]++;
        } else if (c == ',') {
            if (want_value)
                return false;
            want_value = true;
            i++;
            continue;
        } else {
            number_token t;
            double nonfinite;
            size_t n = 0;
            if (!want_value)
                return false;
            if (number_read(s, i, len, &t))
                n = t.end - i;
            else if ((n = nonfinite_read(s, i, len, &nonfinite)) == 0)
                return false;
            if (rank == 0)
                rank = depth;
            else if (depth != rank)
                return false;
            count[depth - 1]++;
            i += n;
        }
        want_value = c == '[';
    }
    sp->kind = API_SPAN_NUMBERS;
    sp->offset = start;
    sp->len = i - start;
    sp->rank = rank;
    size_t total = 1;
    for (int d = 0; d < rank; d++)
        if (__builtin_mul_overflow(total, (size_t)sp->shape[d], &total))
            return false;
    sp->count = total;
    return true;
}

/* 1 for a byte outside printable ASCII (0x20..0x7E) or a backslash, else 0; branch-free. */
static unsigned char not_plain(unsigned char c)
{
    return (unsigned char)((unsigned char)(c - 0x20) >= 0x5F) | (unsigned char)(c == '\\');
}

/* Bytes per step of plain_printable: a fixed count, so that the compiler turns the step into
 * vector instructions (a 64 MB tensor is checked in a few milliseconds, not tens). */
#define PLAIN_BLOCK 64

/* True when a string's bytes are printable ASCII without escapes: such a string (a base64
 * tensor) means exactly its bytes, so it may bypass jansson. Anything else (escapes, control
 * characters that JSON forbids raw, UTF-8 to validate) is left to jansson to judge. */
static bool plain_printable(const char *p, size_t n)
{
    const unsigned char *s = (const unsigned char *)p;
    unsigned char bad = 0;
    size_t i = 0;
    for (; n - i >= PLAIN_BLOCK; i += PLAIN_BLOCK) {
        unsigned char block = 0;
        for (size_t k = 0; k < PLAIN_BLOCK; k++)
            block |= not_plain(s[i + k]);
        bad |= block;
    }
    for (; i < n; i++)
        bad |= not_plain(s[i]);
    return !bad;
}

size_t api__json_string_end(const char *s, size_t i, size_t len)
{
    size_t from = i;
    for (;;) {
        const char *q = memchr(s + from, '"', len - from);
        if (!q)
            return len;
        size_t at = (size_t)(q - s), k = at;
        while (k > i && s[k - 1] == '\\')
            k--;
        if ((at - k) % 2 == 0)
            return at;
        from = at + 1;
    }
}

void api__body_scan_free(api__body_scan *scan)
{
    free(scan->spans);
    scan->spans = NULL;
    scan->n_spans = 0;
}

/* Appends a span; false (and the list dropped: nothing is elided) when memory runs out. */
static bool scan_add(api__body_scan *scan, size_t *cap, const api__body_span *sp)
{
    if (scan->n_spans == *cap) {
        size_t ncap = *cap ? 2 * *cap : 8;
        api__body_span *p = realloc(scan->spans, ncap * sizeof *p);
        if (!p) {
            api__body_scan_free(scan);
            return false;
        }
        scan->spans = p;
        *cap = ncap;
    }
    scan->spans[scan->n_spans++] = *sp;
    return true;
}

/* After punctuation at s[*i - 1]: when a non-finite token is the value that follows (not a key:
 * no ':' after it), records it as a span and moves *i past it. False only when the span list
 * could not grow (then nothing is elided). */
static bool scan_nonfinite(const char *s, size_t *i, size_t len, api__body_scan *scan, size_t *cap)
{
    size_t j = *i, n, k;
    double v;
    while (j < len && is_json_space(s[j]))
        j++;
    if (j >= len || !nonfinite_start(s, j, len) || (n = nonfinite_read(s, j, len, &v)) == 0)
        return true;
    for (k = j + n; k < len && is_json_space(s[k]);)
        k++;
    if (k < len && s[k] == ':')
        return true; /* jansson's "string or '}' expected" */
    api__body_span sp = {.kind = API_SPAN_NONFINITE, .offset = j, .len = n, .value = v};
    if (!scan_add(scan, cap, &sp))
        return false;
    *i = j + n;
    return true;
}

void api__body_scan_run(const char *body, size_t len, api__body_scan *scan)
{
    size_t values = 1, string_bytes = 0, elided = 0, cap = 0;
    bool elide = true;
    const unsigned char *s = (const unsigned char *)body;

    scan->spans = NULL;
    scan->n_spans = 0;
    /* Arrays are tried only as values of object members (after a ':'): the tensors are there,
     * and an array inside an array that failed the scan (not rectangular, say) must stay whole
     * for jansson, or its error would name the wrong element. */
    bool member_value = false;
    for (size_t i = 0; i < len;) {
        while (i < len && !body_special[s[i]])
            i++;
        if (i >= len)
            break;
        bool after_colon = member_value;
        member_value = s[i] == ':';
        if (s[i] == '[' && after_colon && elide) {
            api__body_span sp;
            if (scan_numbers(body, i, len, &sp) && sp.count >= API_BODY_MANY_NUMBERS) {
                elide = scan_add(scan, &cap, &sp);
                if (elide) {
                    elided += sp.len;
                    values++;
                    i += sp.len;
                    continue;
                }
            }
        }
        if (s[i] != '"') {
            values++;
            i++;
            if (elide)
                elide = scan_nonfinite(body, &i, len, scan, &cap);
            continue;
        }
        size_t start = i + 1, end = api__json_string_end(body, start, len), n = end - start;
        i = end + 1;
        size_t j = i;
        while (j < len && is_json_space(body[j]))
            j++;
        bool key = j < len && body[j] == ':'; /* jansson must see keys */
        if (!elide || key || n < API_BODY_LONG_STRING || !plain_printable(body + start, n)) {
            string_bytes += n;
            continue;
        }
        api__body_span sp = {.kind = API_SPAN_STRING, .offset = start, .len = n};
        elide = scan_add(scan, &cap, &sp);
        if (elide)
            elided += n;
    }
    if (!elide) { /* out of memory for the list: jansson gets everything */
        string_bytes = len;
        elided = 0;
    }

    /* jansson holds each string twice at its peak (lexer buffer, grown by doubling, and the
     * value), plus the compact copy of the body that it parses. */
    size_t est = api__size_mul_sat(values, BODY_BYTES_PER_VALUE);
    est = api__size_add_sat(est, api__size_mul_sat(string_bytes, 3));
    est = api__size_add_sat(est, len - elided);
    est = api__size_add_sat(est, api__size_mul_sat(scan->n_spans, sizeof(api__body_span) + 32));
    scan->parse_bytes = api__size_add_sat(est, 4096);
}

/* ---- The parse --------------------------------------------------------------------------- */

/* The copy of the body that jansson parses: each span becomes a placeholder string. NULL when
 * the body holds a "\u0000" of its own or memory runs out; the caller then parses the body
 * itself. */
static char *compact_body(const char *body, size_t len, const api__body_scan *scan, size_t *out_len)
{
    static const char nul_escape[] = "\\u0000";
    size_t elided = 0;
    for (size_t k = 0; k < scan->n_spans; k++)
        elided += scan->spans[k].len;
    char *out = malloc(len - elided + scan->n_spans * 32 + 1), *p = out;
    if (!out)
        return NULL;
    size_t from = 0;
    for (size_t k = 0; k <= scan->n_spans; k++) {
        const api__body_span *sp = k < scan->n_spans ? &scan->spans[k] : NULL;
        size_t to = sp ? sp->offset : len, n = to - from;
        /* A "\u0000" cannot span two segments: each ends with, or starts with, a quote or a
         * bracket. */
        if (memmem(body + from, n, nul_escape, sizeof nul_escape - 1)) {
            free(out);
            return NULL;
        }
        memcpy(p, body + from, n);
        p += n;
        if (sp) {
            /* A string's quotes stay in the copy; an array needs its own. */
            int w =
                snprintf(p, 32, sp->kind == API_SPAN_STRING ? "%s%zu" : "\"%s%zu\"", nul_escape, k);
            p += w;
            from = to + sp->len;
        }
    }
    *out_len = (size_t)(p - out);
    return out;
}

/* Nesting levels json_path_at follows; deeper values are named by their first levels. */
#define PATH_DEPTH 16

typedef struct {
    bool array;
    size_t index;
    char key[48]; /* a key's raw bytes, cut to fit */
} path_level;

/* Copies the raw bytes of the string starting at body[*i] (its opening quote) into key (cut to
 * fit) and moves *i to its closing quote (or to `end`). */
static void skip_string(const char *body, size_t end, size_t *i, char *key, size_t keylen)
{
    size_t n = 0;
    for (*i += 1; *i < end && body[*i] != '"'; *i += 1) {
        if (body[*i] == '\\' && *i + 1 < end)
            *i += 1;
        if (key && n + 1 < keylen)
            key[n++] = body[*i];
    }
    if (key)
        key[n] = '\0';
}

/* The field path ("window[0]", "query.shape[1]") of the value that ends at byte `pos` of a
 * JSON text that is well-formed up to there: jansson reports where an out-of-range number is,
 * not whose it is. Writes "" for a top-level value. */
static void json_path_at(const char *body, size_t pos, char *out, size_t outlen)
{
    path_level lv[PATH_DEPTH];
    size_t depth = 0, n = 0; /* depth may exceed PATH_DEPTH; only the first levels are kept */
    bool want_key = false;
    for (size_t i = 0; i < pos; i++) {
        char c = body[i];
        path_level *top = depth > 0 && depth <= PATH_DEPTH ? &lv[depth - 1] : NULL;
        if (c == '"') {
            bool is_key = want_key && top && !top->array;
            skip_string(body, pos, &i, is_key ? top->key : NULL, sizeof top->key);
            want_key = false;
        } else if (c == '{' || c == '[') {
            if (depth < PATH_DEPTH) {
                lv[depth].array = c == '[';
                lv[depth].index = 0;
                lv[depth].key[0] = '\0';
            }
            depth++;
            want_key = c == '{';
        } else if ((c == '}' || c == ']') && depth > 0) {
            depth--;
        } else if (c == ',' && top) {
            top->index++;
            want_key = !top->array;
        }
    }
    out[0] = '\0';
    for (size_t d = 0; d < depth && d < PATH_DEPTH && n < outlen; d++) {
        int w = lv[d].array ? snprintf(out + n, outlen - n, "[%zu]", lv[d].index)
                            : snprintf(out + n, outlen - n, "%s%s", n ? "." : "", lv[d].key);
        if (w < 0)
            break;
        n += (size_t)w;
    }
}

static int parse_error(const char *body, const json_error_t *jerr, api__error *err)
{
    if (json_error_code(jerr) == json_error_out_of_memory)
        return api__error_set(err, API_STATUS_UNAVAILABLE, API_REASON_MEMORY, NULL,
                              "out of memory while parsing the request body");
    if (json_error_code(jerr) == json_error_numeric_overflow && jerr->position >= 0) {
        /* JSON itself sets no range on numbers (RFC 8259 section 6): the text is well-formed,
         * the value is out of range, which is 422 as for any other field
         * (docs/http-api.md#errors-and-statuses). */
        char field[128];
        json_path_at(body, (size_t)jerr->position, field, sizeof field);
        return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST,
                              field[0] ? field : NULL,
                              "the number at line %d, column %d is beyond the range of a 64-bit "
                              "integer (integers) or of a double (others): %s",
                              jerr->line, jerr->column, jerr->text);
    }
    return api__error_set(err, API_STATUS_MALFORMED_REQUEST, API_REASON_BAD_REQUEST, NULL,
                          "malformed JSON: %s at line %d, column %d (byte %d)", jerr->text,
                          jerr->line, jerr->column, jerr->position);
}

int api__body_parse(api__body *b, const char *body, size_t len, api__body_scan *scan,
                    api__error *err)
{
    api__body_scan own;
    json_error_t jerr;
    char *compact = NULL;
    size_t compact_len = 0;

    memset(b, 0, sizeof *b);
    b->body = body;
    if (!scan) {
        api__body_scan_run(body, len, &own);
        scan = &own;
    }
    if (scan->n_spans > 0)
        compact = compact_body(body, len, scan, &compact_len);
    if (compact) {
        b->root = json_loadb(compact, compact_len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
        free(compact);
        if (b->root) {
            b->spans = scan->spans;
            b->n_spans = scan->n_spans;
            scan->spans = NULL;
            scan->n_spans = 0;
        }
    }
    api__body_scan_free(scan);
    /* Parse the body itself when nothing was elided, and also when the compact copy failed,
     * so that an error's line, column and byte refer to what the client sent. */
    if (!b->root) {
        b->root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
        if (!b->root)
            return parse_error(body, &jerr, err);
    }
    if (!json_is_object(b->root)) {
        api__body_free(b);
        return api__error_set(err, API_STATUS_INVALID_ARGUMENT, API_REASON_BAD_REQUEST, NULL,
                              "the request body must be a JSON object");
    }
    return 0;
}

void api__body_free(api__body *b)
{
    json_decref(b->root);
    free(b->spans);
    b->root = NULL;
    b->spans = NULL;
    b->n_spans = 0;
}

const api__body_span *api__body_span_of(const api__body *b, const json_t *v)
{
    if (b->n_spans == 0 || !json_is_string(v))
        return NULL;
    const char *s = json_string_value(v);
    size_t len = json_string_length(v), k = 0;
    if (len < 2 || s[0] != '\0')
        return NULL;
    for (size_t i = 1; i < len; i++) {
        if (!is_digit(s[i]) || k > b->n_spans)
            return NULL;
        k = k * 10 + (size_t)(s[i] - '0');
    }
    /* Only this file writes placeholders, so a bad index would be our bug: treat it as text. */
    return k < b->n_spans ? &b->spans[k] : NULL;
}

bool api__body_nonfinite(const api__body *b, const json_t *v, double *out)
{
    const api__body_span *sp = api__body_span_of(b, v);
    if (!sp || sp->kind != API_SPAN_NONFINITE)
        return false;
    *out = sp->value;
    return true;
}

bool api__body_string_get(const api__body *b, const json_t *s, const char **p, size_t *n)
{
    const api__body_span *sp = api__body_span_of(b, s);
    if (sp && sp->kind != API_SPAN_STRING)
        return false;
    if (sp) {
        *p = b->body + sp->offset;
        *n = sp->len;
        return true;
    }
    if (!json_is_string(s))
        return false;
    *p = json_string_value(s);
    *n = json_string_length(s);
    return true;
}

/* Doubles of at least this magnitude round to infinity as float32 (see tensor.c). */
#define FLOAT32_OVERFLOW 0x1.ffffffp127

/* Where a failed decode stopped: the offending number's index, and why. */
typedef struct {
    size_t bad;
    char *why;
    size_t why_size;
} numbers_error;

/* Decodes the numbers of s[i..end), the first of which has index k, into out->dst (at most
 * `count` in all); 0, or -1 with *e filled. */
static int numbers_range(const char *s, size_t i, size_t end, size_t k, size_t count,
                         const api__numbers_out *out, numbers_error *e)
{
    while (i < end && k < count) {
        char c = s[i];
        if (nonfinite_start(s, i, end)) {
            double v;
            size_t n = nonfinite_read(s, i, end, &v);
            if (n == 0) { /* defensive: the scan let no other word into the span */
                i++;
                continue;
            }
            if (out->integers || !(v == -INFINITY && out->neg_inf_ok)) {
                e->bad = k;
                snprintf(e->why, e->why_size,
                         out->integers ? "must be an integer, found %.*s"
                                       : "is %.*s; values must be finite",
                         (int)n, s + i);
                return -1;
            }
            ((float *)out->dst)[k++] = (float)v;
            i += n;
            continue;
        }
        if (c != '-' && !is_digit(c)) { /* brackets, commas, whitespace */
            i++;
            continue;
        }
        number_token t;
        number_parse_checked(s, i, &t);
        if (out->integers) {
            if (!t.integer) {
                e->bad = k;
                snprintf(e->why, e->why_size, "must be an integer, found %.*s",
                         (int)(t.end - i < 40 ? t.end - i : 40), s + i);
                return -1;
            }
            int64_t v = (int64_t)t.digits;
            ((int64_t *)out->dst)[k] = t.negative ? -v : v;
        } else {
            double v = number_value(s, i, &t);
            if (!(fabs(v) < FLOAT32_OVERFLOW)) {
                e->bad = k;
                snprintf(e->why, e->why_size, "is %g, beyond the float32 range (+-3.40282347e38)",
                         v);
                return -1;
            }
            ((float *)out->dst)[k] = (float)v;
        }
        k++;
        i = t.end;
    }
    return 0;
}

/* Span text per pool task: a piece begins just after the first comma at or past a multiple of
 * it, so that no token is split between two pieces. */
#define NUMBERS_TASK_BYTES ((size_t)1 << 18)

/* A span's numbers decoded by the pool in two passes over the same pieces: how many tokens each
 * piece holds, then (their sums giving each piece its first index) the values. */
typedef struct {
    const char *s;
    const api__body_span *sp;
    const api__numbers_out *out;
    size_t *first; /* per piece: its token count (first pass), then its first index */
} numbers_job;

/* Where the piece that owns span offset `at` begins in the body. */
static size_t piece_start(const char *s, const api__body_span *sp, size_t at)
{
    if (at == 0)
        return sp->offset;
    if (at >= sp->len)
        return sp->offset + sp->len;
    const char *comma = memchr(s + sp->offset + at, ',', sp->len - at);
    return comma ? (size_t)(comma - s) + 1 : sp->offset + sp->len;
}

static bool is_separator(char c)
{
    return c == ',' || c == '[' || c == ']' || is_json_space(c);
}

static bool count_piece(void *arg, size_t from, size_t to)
{
    numbers_job *job = arg;
    size_t n = 0, end = piece_start(job->s, job->sp, to);
    bool in_token = false;
    for (size_t i = piece_start(job->s, job->sp, from); i < end; i++) {
        bool sep = is_separator(job->s[i]);
        n += !sep && !in_token;
        in_token = !sep;
    }
    job->first[from / NUMBERS_TASK_BYTES] = n;
    return true;
}

static bool decode_piece(void *arg, size_t from, size_t to)
{
    numbers_job *job = arg;
    char why[96];
    numbers_error e = {0, why, sizeof why};
    return numbers_range(job->s, piece_start(job->s, job->sp, from),
                         piece_start(job->s, job->sp, to), job->first[from / NUMBERS_TASK_BYTES],
                         job->sp->count, job->out, &e) == 0;
}

/* Whether the pool decoded the span without an error. */
static bool numbers_pieces(const char *s, const api__body_span *sp, const api__numbers_out *out)
{
    if (!out->pool || sp->len <= NUMBERS_TASK_BYTES)
        return false;
    size_t pieces = (sp->len - 1) / NUMBERS_TASK_BYTES + 1, total = 0;
    numbers_job job = {s, sp, out, malloc(pieces * sizeof(size_t))};
    bool done =
        job.first && api__chunks_run(out->pool, sp->len, NUMBERS_TASK_BYTES, count_piece, &job);
    for (size_t p = 0; done && p < pieces; p++) {
        size_t n = job.first[p];
        job.first[p] = total;
        total += n;
    }
    done = done && total == sp->count && /* defensive: the scan counted the same tokens */
           api__chunks_run(out->pool, sp->len, NUMBERS_TASK_BYTES, decode_piece, &job);
    free(job.first);
    return done;
}

int api__body_numbers_decode(const api__body *b, const api__body_span *sp,
                             const api__numbers_out *out, size_t *bad, char *why, size_t why_size)
{
    /* Where the pieces fail, one pass in order finds the first error, as for a small span. */
    if (numbers_pieces(b->body, sp, out))
        return 0;
    numbers_error e = {0, why, why_size};
    int rc = numbers_range(b->body, sp->offset, sp->offset + sp->len, 0, sp->count, out, &e);
    *bad = e.bad;
    return rc;
}
