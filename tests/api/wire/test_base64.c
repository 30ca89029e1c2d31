/* test_base64.c - api/wire/base64.c: RFC 4648 vectors, round trips, and every way to be invalid. */
#include <stdint.h>
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

int main(void)
{
    RUN(test_encodes_the_rfc4648_vectors);
    RUN(test_decodes_the_rfc4648_vectors_padded_or_not);
    RUN(test_round_trips_every_length_and_byte);
    RUN(test_rejects_characters_outside_the_alphabet);
    RUN(test_rejects_impossible_lengths);
    RUN(test_rejects_non_canonical_padding_bits);
    RUN(test_validate_checks_without_writing);
    return check_report();
}
