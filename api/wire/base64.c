/*
 * base64.c - RFC 4648 base64 (standard alphabet), the fast path for big tensors.
 *
 * The decoder is strict, since a lenient one turns a client's encoding bug into wrong numbers:
 * no whitespace, no URL-safe alphabet, '=' only at the end, zero unused bits in the last group.
 * Padding may be left out (some encoders strip it); the tensor shape fixes the length anyway.
 * Long strings go 32 characters <-> 24 bytes at a time through base64_avx2.c where the CPU has
 * AVX2; the ends, and a block with a character outside the alphabet, go four characters <-> three
 * bytes per step with table look-ups, which also finds and reports the offending character.
 */
#include <stdint.h>
#include <string.h>

#include "api/wire/base64.h"

static const char b64_alphabet[64] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* Value of each character, or 255 for characters outside the alphabet ('=' included).
 * The inverse of b64_alphabet, one row per 16 byte values. */
/* clang-format off */
static const uint8_t b64_value[256] = {
    255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255,
    255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255,
    255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255,  62, 255, 255, 255,  63,
     52,  53,  54,  55,  56,  57,  58,  59,  60,  61, 255, 255, 255, 255, 255, 255,
    255,   0,   1,   2,   3,   4,   5,   6,   7,   8,   9,  10,  11,  12,  13,  14,
     15,  16,  17,  18,  19,  20,  21,  22,  23,  24,  25, 255, 255, 255, 255, 255,
    255,  26,  27,  28,  29,  30,  31,  32,  33,  34,  35,  36,  37,  38,  39,  40,
     41,  42,  43,  44,  45,  46,  47,  48,  49,  50,  51, 255, 255, 255, 255, 255,
    255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255,
    255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255,
    255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255,
    255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255,
    255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255,
    255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255,
    255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255,
    255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255,
};
/* clang-format on */

size_t api__base64_encoded_len(size_t n)
{
    return (n / 3 + (n % 3 != 0)) * 4;
}

bool api__base64_avx2(void)
{
    return __builtin_cpu_supports("avx2");
}

char *api__base64_encode(const void *src, size_t n, char *dst)
{
    const uint8_t *s = src;
    size_t i = 0;
    if (api__base64_avx2()) {
        i = api__base64_encode_avx2(s, n, dst);
        dst += i / 3 * 4;
    }
    for (; n - i >= 3; i += 3) {
        uint32_t v = (uint32_t)s[i] << 16 | (uint32_t)s[i + 1] << 8 | s[i + 2];
        dst[0] = b64_alphabet[v >> 18];
        dst[1] = b64_alphabet[(v >> 12) & 63];
        dst[2] = b64_alphabet[(v >> 6) & 63];
        dst[3] = b64_alphabet[v & 63];
        dst += 4;
    }
    if (n - i == 1) {
        uint32_t v = (uint32_t)s[i] << 16;
        dst[0] = b64_alphabet[v >> 18];
        dst[1] = b64_alphabet[(v >> 12) & 63];
        dst[2] = '=';
        dst[3] = '=';
        dst += 4;
    } else if (n - i == 2) {
        uint32_t v = (uint32_t)s[i] << 16 | (uint32_t)s[i + 1] << 8;
        dst[0] = b64_alphabet[v >> 18];
        dst[1] = b64_alphabet[(v >> 12) & 63];
        dst[2] = b64_alphabet[(v >> 6) & 63];
        dst[3] = '=';
        dst += 4;
    }
    return dst;
}

/* Characters of data in `src` once up to two trailing '=' are set aside (a padded string must
 * be a whole number of groups). */
static size_t b64_data_chars(const char *src, size_t len)
{
    if (len % 4 == 0 && len > 0 && src[len - 1] == '=')
        return src[len - 2] == '=' ? len - 2 : len - 1;
    return len;
}

size_t api__base64_decoded_len(const char *src, size_t len)
{
    size_t chars = b64_data_chars(src, len);
    if (chars % 4 == 1)
        return SIZE_MAX;
    return chars / 4 * 3 + (chars % 4 == 0 ? 0 : chars % 4 - 1);
}

/* The offset of the first character in src[0..n) outside the alphabet, or n. */
static size_t b64_first_bad(const uint8_t *src, size_t n)
{
    size_t i = 0;
    while (i < n && b64_value[src[i]] != 255)
        i++;
    return i;
}

api__b64_status api__base64_validate(const char *src, size_t len, size_t *bad_offset)
{
    size_t n;
    return api__base64_decode(src, len, NULL, &n, bad_offset);
}

api__b64_status api__base64_decode(const char *src, size_t len, void *dst, size_t *dst_len,
                                   size_t *bad_offset)
{
    const uint8_t *s = (const uint8_t *)src;
    uint8_t *d = dst;
    size_t chars = b64_data_chars(src, len);
    size_t full = chars / 4 * 4, i = 0;

    *dst_len = 0;
    *bad_offset = 0;
    if (chars % 4 == 1) {
        /* A stray character is the likelier mistake, and the more useful thing to report. */
        *bad_offset = b64_first_bad(s, chars);
        if (*bad_offset < chars)
            return API_B64_BAD_CHAR;
        *bad_offset = len;
        return API_B64_BAD_LENGTH;
    }
    if (d && api__base64_avx2()) {
        i = api__base64_decode_avx2(src, full, d, api__base64_decoded_len(src, len));
        d += i / 4 * 3;
    }
    for (; i < full; i += 4) {
        uint32_t a = b64_value[s[i]], b = b64_value[s[i + 1]], c = b64_value[s[i + 2]],
                 e = b64_value[s[i + 3]];
        if ((a | b | c | e) & 0x80) { /* some character was 255: invalid */
            *bad_offset = i + b64_first_bad(s + i, 4);
            return API_B64_BAD_CHAR;
        }
        uint32_t v = a << 18 | b << 12 | c << 6 | e;
        if (d) {
            d[0] = (uint8_t)(v >> 16);
            d[1] = (uint8_t)(v >> 8);
            d[2] = (uint8_t)v;
            d += 3;
        }
    }
    if (chars > full) {
        /* A tail of 2 or 3 characters: 1 or 2 bytes, whose unused low bits must be zero. */
        size_t tail = chars - full;
        uint32_t v = 0;
        for (size_t k = 0; k < tail; k++) {
            uint32_t x = b64_value[s[full + k]];
            if (x == 255) {
                *bad_offset = full + k;
                return API_B64_BAD_CHAR;
            }
            v |= x << (18 - 6 * k);
        }
        if ((tail == 2 && (v & 0xFFFF)) || (tail == 3 && (v & 0xFF))) {
            *bad_offset = chars - 1;
            return API_B64_BAD_PADDING;
        }
        if (d) {
            d[0] = (uint8_t)(v >> 16);
            if (tail == 3)
                d[1] = (uint8_t)(v >> 8);
            d += tail - 1;
        }
    }
    *dst_len = full / 4 * 3 + (chars > full ? chars - full - 1 : 0);
    return API_B64_OK;
}
