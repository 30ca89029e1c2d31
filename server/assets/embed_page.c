/*
 * embed_page.c - build-time generator: turns the inspector page (server/assets/inspector.html)
 * into a C file that defines the bytes attnd serves at GET / (server/page.c), together with the
 * two headers that depend on those bytes:
 *
 *   srv_inspector_page[], srv_inspector_page_len   the page, byte for byte;
 *   srv_inspector_csp[]    a Content-Security-Policy that allows exactly the page's own inline
 *                          <style> and <script> elements, by their SHA-256 ('sha256-...'
 *                          sources), and nothing else but fetch() to the same origin;
 *   srv_inspector_etag[]   a strong ETag: the first 128 bits of the page's SHA-256, in hex.
 *
 *   embed_page INPUT.html OUTPUT.c
 *
 * Hashes instead of 'unsafe-inline' mean that a script injected into the page (a token label
 * that escaped its text node, say) would not run. The element contents are hashed exactly as
 * the browser sees them: the bytes between "<script>" and "</script>" (likewise for style), so
 * the opening tags must carry no attributes; an element the generator cannot find is an error,
 * and a page without one would simply get no source for it. The output is written to a
 * temporary file and renamed, so a failed run never leaves a half-written OUTPUT.c.
 *
 * It is a host tool with no dependency but libc (no xxd, no scripting language), built and run
 * by the Makefile before libserver.a is linked. Exit status 0, or 1 with a message on stderr.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PAGE_MAX      ((size_t)4 << 20) /* the page is served from memory: keep it small */
#define HASHES_MAX    8                 /* inline elements of one kind */
#define SHA256_BYTES  32
#define SHA256_BASE64 45 /* 44 characters and the NUL */

/* ---- SHA-256 (FIPS 180-4) ------------------------------------------------------------------ */

static const uint32_t sha256_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static uint32_t rotr(uint32_t x, unsigned n)
{
    return (x >> n) | (x << (32u - n));
}

/* Mixes one 64-byte block into the state `h`. */
static void sha256_block(uint32_t h[8], const unsigned char *p)
{
    uint32_t w[64], a, b, c, d, e, f, g, hh;
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
               (uint32_t)p[4 * i + 2] << 8 | (uint32_t)p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) +
                      sha256_k[i] + w[i];
        uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        hh = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += hh;
}

/* The SHA-256 digest of `n` bytes at `data` into out[32]. */
static void sha256(const unsigned char *data, size_t n, unsigned char out[SHA256_BYTES])
{
    uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                     0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    unsigned char tail[128] = {0};
    size_t full = n - n % 64, rest = n % 64, tail_len = rest < 56 ? 64 : 128;
    uint64_t bits = (uint64_t)n * 8u;

    for (size_t off = 0; off < full; off += 64)
        sha256_block(h, data + off);
    memcpy(tail, data + full, rest);
    tail[rest] = 0x80;
    for (int i = 0; i < 8; i++)
        tail[tail_len - 1 - (size_t)i] = (unsigned char)(bits >> (8 * i));
    for (size_t off = 0; off < tail_len; off += 64)
        sha256_block(h, tail + off);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (unsigned char)(h[i] >> 24);
        out[4 * i + 1] = (unsigned char)(h[i] >> 16);
        out[4 * i + 2] = (unsigned char)(h[i] >> 8);
        out[4 * i + 3] = (unsigned char)h[i];
    }
}

/* Standard base64 (RFC 4648, with padding) of a digest, as CSP hash sources spell it. */
static void base64_digest(const unsigned char in[SHA256_BYTES], char out[SHA256_BASE64])
{
    static const char alphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0;
    for (size_t i = 0; i < SHA256_BYTES; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16;
        size_t left = SHA256_BYTES - i;
        if (left > 1)
            v |= (uint32_t)in[i + 1] << 8;
        if (left > 2)
            v |= in[i + 2];
        out[o++] = alphabet[(v >> 18) & 63];
        out[o++] = alphabet[(v >> 12) & 63];
        out[o++] = left > 1 ? alphabet[(v >> 6) & 63] : '=';
        out[o++] = left > 2 ? alphabet[v & 63] : '=';
    }
    out[o] = '\0';
}

/* ---- The page ------------------------------------------------------------------------------ */

/* Reads the whole file into a malloc'd buffer; NULL with a message on failure. */
static unsigned char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    unsigned char *buf;
    size_t n;
    if (!f) {
        perror(path);
        return NULL;
    }
    buf = malloc(PAGE_MAX + 1);
    if (!buf) {
        fclose(f);
        fprintf(stderr, "embed_page: out of memory\n");
        return NULL;
    }
    n = fread(buf, 1, PAGE_MAX + 1, f);
    if (ferror(f) || n == 0 || n > PAGE_MAX) {
        fprintf(stderr, "embed_page: %s: %s\n", path,
                ferror(f) ? "read error"
                : n == 0  ? "empty"
                          : "larger than 4 MiB");
        fclose(f);
        free(buf);
        return NULL;
    }
    fclose(f);
    *len = n;
    return buf;
}

/* The first occurrence of `needle` in the `n` bytes at `hay`, or NULL. */
static const unsigned char *find(const unsigned char *hay, size_t n, const char *needle)
{
    size_t m = strlen(needle);
    for (size_t i = 0; m <= n && i <= n - m; i++) {
        if (memcmp(hay + i, needle, m) == 0)
            return hay + i;
    }
    return NULL;
}

/* Hashes the contents of every <tag>...</tag> element into `sources` as " 'sha256-...'"
 * (appended). Returns the number of elements, or -1 (with a message) for an unclosed element
 * or too many. */
static int hash_elements(const unsigned char *page, size_t len, const char *tag, char *sources,
                         size_t cap)
{
    char open[16], close[16];
    const unsigned char *p = page, *end = page + len;
    int count = 0;
    snprintf(open, sizeof open, "<%s>", tag);
    snprintf(close, sizeof close, "</%s>", tag);
    for (;;) {
        const unsigned char *start = find(p, (size_t)(end - p), open), *stop;
        unsigned char digest[SHA256_BYTES];
        char b64[SHA256_BASE64];
        size_t used = strlen(sources);
        if (!start)
            return count;
        start += strlen(open);
        stop = find(start, (size_t)(end - start), close);
        if (!stop) {
            fprintf(stderr, "embed_page: a %s element is not closed\n", open);
            return -1;
        }
        if (++count > HASHES_MAX) {
            fprintf(stderr, "embed_page: more than %d %s elements\n", HASHES_MAX, open);
            return -1;
        }
        sha256(start, (size_t)(stop - start), digest);
        base64_digest(digest, b64);
        snprintf(sources + used, cap - used, " 'sha256-%s'", b64);
        p = stop + strlen(close);
    }
}

int main(int argc, char **argv)
{
    unsigned char *page, digest[SHA256_BYTES];
    char scripts[HASHES_MAX * 64 + 1] = "", styles[HASHES_MAX * 64 + 1] = "", tmp[4096];
    size_t len = 0;
    FILE *out;
    int ok;

    if (argc != 3) {
        fprintf(stderr, "usage: embed_page INPUT.html OUTPUT.c\n");
        return 1;
    }
    page = read_file(argv[1], &len);
    if (!page)
        return 1;
    if (hash_elements(page, len, "script", scripts, sizeof scripts) < 1 ||
        hash_elements(page, len, "style", styles, sizeof styles) < 1) {
        fprintf(stderr,
                "embed_page: %s needs at least one <script> and one <style> element "
                "without attributes\n",
                argv[1]);
        free(page);
        return 1;
    }
    sha256(page, len, digest);

    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", argv[2]) >= sizeof tmp) {
        fprintf(stderr, "embed_page: output path too long\n");
        free(page);
        return 1;
    }
    out = fopen(tmp, "w");
    if (!out) {
        perror(tmp);
        free(page);
        return 1;
    }
    fprintf(out,
            "/* Generated from %s by server/assets/embed_page.c: do not edit. */\n"
            "#include \"server/page.h\"\n\n"
            "const unsigned char srv_inspector_page[] = {",
            argv[1]);
    for (size_t i = 0; i < len; i++)
        fprintf(out, "%s0x%02x,", i % 16 == 0 ? "\n    " : " ", page[i]);
    fprintf(out,
            "\n};\n"
            "const size_t srv_inspector_page_len = %zu;\n"
            "const char srv_inspector_csp[] =\n"
            "    \"default-src 'none'; script-src%s; style-src%s; connect-src 'self'; \"\n"
            "    \"img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'\";\n"
            "const char srv_inspector_etag[] = \"\\\"",
            len, scripts, styles);
    for (int i = 0; i < 16; i++)
        fprintf(out, "%02x", digest[i]);
    fprintf(out, "\\\"\";\n");
    ok = !ferror(out);
    ok = fclose(out) == 0 && ok;
    free(page);
    if (!ok || rename(tmp, argv[2]) != 0) {
        perror(argv[2]);
        remove(tmp);
        return 1;
    }
    return 0;
}
