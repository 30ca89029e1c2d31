/* test_base64.c - api/wire/base64.c: RFC 4648 vectors, round trips, and every way to be invalid;
 * the AVX2 blocks (base64_avx2.c) against a reference written here, one character at a time. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/wire/base64.h"
#include "tests/support/check.h"
#include "tests/support/rng.h"

static const struct {
    const char *plain, *encoded;
} rfc4648[] = {
    {"", ""},
    {"f", "Zg=="},
    {"fo", "Zm8="},
    {"foo", "Zm9v"},
    {"foob", "Zm9vYg=="},
    {"fooba", "Zm9vYmE="},
    {"foobar", "Zm9vYmFy"},
};

/* Decodes `s`; returns the status and leaves the bytes in out (size >= 64). */
static api__b64_status decode(const char *s, uint8_t *out, size_t *n, size_t *bad)
{
    return api__base64_decode(s, strlen(s), out, n, bad);
}

static void test_encodes_the_rfc4648_vectors(void)
{
    for (size_t i = 0; i < sizeof rfc4648 / sizeof rfc4648[0]; i++) {
        char out[16];
        size_t n = strlen(rfc4648[i].plain);
        char *end = api__base64_encode(rfc4648[i].plain, n, out);
        CHECK_EQ_INT(end - out, api__base64_encoded_len(n));
        CHECKF((size_t)(end - out) == strlen(rfc4648[i].encoded) &&
                   memcmp(out, rfc4648[i].encoded, (size_t)(end - out)) == 0,
               "encode(\"%s\") != \"%s\"", rfc4648[i].plain, rfc4648[i].encoded);
    }
}

static void test_decodes_the_rfc4648_vectors_padded_or_not(void)
{
    for (size_t i = 0; i < sizeof rfc4648 / sizeof rfc4648[0]; i++) {
        char unpadded[16];
        snprintf(unpadded, sizeof unpadded, "%s", rfc4648[i].encoded);
        char *eq = strchr(unpadded, '=');
        if (eq)
            *eq = '\0';
        const char *forms[2] = {rfc4648[i].encoded, unpadded};
        for (int f = 0; f < 2; f++) {
            uint8_t out[16];
            size_t n = 99, bad = 99;
            CHECK_EQ_INT(api__base64_decoded_len(forms[f], strlen(forms[f])),
                         strlen(rfc4648[i].plain));
            CHECK_EQ_INT(decode(forms[f], out, &n, &bad), API_B64_OK);
            CHECK_EQ_INT(n, strlen(rfc4648[i].plain));
            CHECKF(memcmp(out, rfc4648[i].plain, n) == 0, "decode(\"%s\")", forms[f]);
        }
    }
}

static void test_round_trips_every_length_and_byte(void)
{
    uint8_t src[300], back[300];
    char text[400];
    uint64_t rng = 7;
    for (size_t n = 0; n <= 300; n++) {
        for (size_t i = 0; i < n; i++)
            src[i] = (uint8_t)(n < 256 ? i + n : rng_next(&rng));
        char *end = api__base64_encode(src, n, text);
        size_t len = (size_t)(end - text), got, bad;
        CHECK_EQ_INT(api__base64_decoded_len(text, len), n);
        CHECK_EQ_INT(api__base64_decode(text, len, back, &got, &bad), API_B64_OK);
        CHECK_EQ_INT(got, n);
        CHECKF(memcmp(src, back, n) == 0, "round trip of %zu bytes", n);
    }
}

static void test_rejects_characters_outside_the_alphabet(void)
{
    static const struct {
        const char *text;
        size_t offset;
    } bad_chars[] = {
        {"Zm 9v", 2},                       /* whitespace */
        {"Zm9v\nYmFy", 4},                  /* a MIME line break */
        {"Zm9-", 3},                        /* URL-safe alphabet */
        {"Zm9_", 3},                        /* URL-safe alphabet */
        {"Zm9v!mFy", 4},   {"Zg==Zm9v", 2}, /* padding in the middle */
        {"Z===", 1},                        /* three '=' */
        {"====", 0},       {"Zm9\x80", 3},  /* a byte with the high bit set */
        {"Zm9\xff", 3},    {"Zg=", 2},      /* '=' in an unpadded-length string */
    };
    for (size_t i = 0; i < sizeof bad_chars / sizeof bad_chars[0]; i++) {
        uint8_t out[64];
        size_t n, bad = 99;
        api__b64_status st = decode(bad_chars[i].text, out, &n, &bad);
        CHECKF(st == API_B64_BAD_CHAR, "\"%s\": status %d", bad_chars[i].text, (int)st);
        CHECKF(bad == bad_chars[i].offset, "\"%s\": offset %zu, want %zu", bad_chars[i].text, bad,
               bad_chars[i].offset);
    }
}

static void test_rejects_impossible_lengths(void)
{
    uint8_t out[16];
    size_t n, bad;
    CHECK(api__base64_decoded_len("Z", 1) == SIZE_MAX);
    CHECK(api__base64_decoded_len("Zm9vY", 5) == SIZE_MAX);
    CHECK_EQ_INT(decode("Zm9vY", out, &n, &bad), API_B64_BAD_LENGTH);
    CHECK_EQ_INT(bad, 5);
    CHECK_EQ_INT(decode("Z", out, &n, &bad), API_B64_BAD_LENGTH);
}

static void test_rejects_non_canonical_padding_bits(void)
{
    uint8_t out[16];
    size_t n, bad;
    /* "Zg==" is "f"; "Zh==" encodes the same byte with a stray bit in the unused part. */
    CHECK_EQ_INT(decode("Zh==", out, &n, &bad), API_B64_BAD_PADDING);
    CHECK_EQ_INT(decode("Zh", out, &n, &bad), API_B64_BAD_PADDING);
    CHECK_EQ_INT(decode("Zm9=", out, &n, &bad), API_B64_BAD_PADDING);
    CHECK_EQ_INT(decode("Zm8=", out, &n, &bad), API_B64_OK);
}

static void test_validate_checks_without_writing(void)
{
    size_t bad = 99;
    CHECK_EQ_INT(api__base64_validate("Zm9vYmFy", 8, &bad), API_B64_OK);
    CHECK_EQ_INT(api__base64_validate("Zm9v\nYmFy", 9, &bad), API_B64_BAD_CHAR);
    CHECK_EQ_INT(bad, 4);
    CHECK_EQ_INT(api__base64_validate("Zh==", 4, &bad), API_B64_BAD_PADDING);
}

/* ---- The AVX2 blocks ------------------------------------------------------------------------ */

static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* The value of c in the alphabet, or -1. */
static int value_of(uint8_t c)
{
    const char *at = c ? memchr(alphabet, c, 64) : NULL;
    return at ? (int)(at - alphabet) : -1;
}

static bool avx2_or_skip(const char *what)
{
    if (api__base64_avx2())
        return true;
    printf("skip %s: this CPU lacks AVX2 (the blocks never run here)\n", what);
    return false;
}

/* Every byte value at every place of the blocks of a 160-character string: in the alphabet it
 * decodes to the reference's bytes, outside it the error names its offset, as the scalar code
 * reports it. */
static void test_avx2_decoding_matches_the_reference_at_every_place(void)
{
    enum { CHARS = 160, BYTES = CHARS / 4 * 3 };
    char text[CHARS];
    uint8_t out[BYTES], want[BYTES];
    uint64_t rng = 3;
    if (!avx2_or_skip("test_avx2_decoding_matches_the_reference_at_every_place"))
        return;
    for (int i = 0; i < CHARS; i++)
        text[i] = alphabet[rng_next(&rng) % 64];
    int wrong = 0;
    for (int at = 0; at < CHARS && wrong < 5; at++) {
        char keep = text[at];
        for (int c = 0; c < 256 && wrong < 5; c++) {
            if (c == '=' && at >= CHARS - 2)
                continue; /* padding there: test_rejects_non_canonical_padding_bits's case */
            text[at] = (char)c;
            size_t n, bad;
            api__b64_status st = api__base64_decode(text, CHARS, out, &n, &bad);
            if (value_of((uint8_t)c) < 0) {
                wrong += st != API_B64_BAD_CHAR || bad != (size_t)at;
                CHECKF(st == API_B64_BAD_CHAR && bad == (size_t)at,
                       "byte %d at %d: status %d at %zu", c, at, st, bad);
                continue;
            }
            for (int g = 0; g < CHARS / 4; g++) {
                uint32_t v = 0;
                for (int k = 0; k < 4; k++)
                    v = v << 6 | (uint32_t)value_of((uint8_t)text[4 * g + k]);
                want[3 * g] = (uint8_t)(v >> 16);
                want[3 * g + 1] = (uint8_t)(v >> 8);
                want[3 * g + 2] = (uint8_t)v;
            }
            wrong += st != API_B64_OK || n != BYTES || memcmp(out, want, BYTES) != 0;
            CHECKF(st == API_B64_OK && n == BYTES && memcmp(out, want, BYTES) == 0,
                   "byte %d at %d: decoded differently", c, at);
        }
        text[at] = keep;
    }
}

/* Every length from 0 to 400 bytes of random data encodes to the reference's characters, and
 * the blocks write nothing past the encoding. */
static void test_avx2_encoding_matches_the_reference_at_every_length(void)
{
    enum { MAX = 400 };
    uint8_t src[MAX];
    char got[MAX / 3 * 4 + 8 + 64], want[MAX / 3 * 4 + 8];
    uint64_t rng = 4;
    if (!avx2_or_skip("test_avx2_encoding_matches_the_reference_at_every_length"))
        return;
    for (size_t n = 0; n <= MAX; n++) {
        for (size_t i = 0; i < n; i++)
            src[i] = (uint8_t)rng_next(&rng);
        size_t len = 0;
        for (size_t i = 0; i < n; i += 3) {
            uint32_t v = (uint32_t)src[i] << 16 | (i + 1 < n ? (uint32_t)src[i + 1] << 8 : 0) |
                         (i + 2 < n ? src[i + 2] : 0);
            for (int k = 0; k < 4; k++)
                want[len + (size_t)k] =
                    (size_t)k <= n - i ? alphabet[(v >> (18 - 6 * k)) & 63] : '=';
            len += 4;
        }
        memset(got, '#', sizeof got);
        char *end = api__base64_encode(src, n, got);
        CHECKF((size_t)(end - got) == len && memcmp(got, want, len) == 0 && got[len] == '#',
               "%zu bytes encoded differently", n);
    }
}

int main(void)
{
    RUN(test_encodes_the_rfc4648_vectors);
    RUN(test_decodes_the_rfc4648_vectors_padded_or_not);
    RUN(test_round_trips_every_length_and_byte);
    RUN(test_rejects_characters_outside_the_alphabet);
    RUN(test_rejects_impossible_lengths);
    RUN(test_rejects_non_canonical_padding_bits);
    RUN(test_validate_checks_without_writing);
    RUN(test_avx2_decoding_matches_the_reference_at_every_place);
    RUN(test_avx2_encoding_matches_the_reference_at_every_length);
    return check_report();
}
