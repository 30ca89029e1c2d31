/*
 * base64_avx2.c - the base64 codec's AVX2 blocks: 32 characters <-> 24 bytes per step, for the
 * long strings of base64 tensors. base64.c calls them only where the CPU has AVX2 and runs the
 * ends (and any block with a character outside the alphabet) itself, so that every error and
 * every tail is the scalar code's.
 *
 * Decoding classifies each character by its two nibbles: it is in the alphabet when the bit
 * sets LO[low nibble] and HI[high nibble] share no bit (five classes of high nibble, each with the
 * low nibbles its alphabet ranges leave out), and its value is the character plus an offset
 * picked by its high nibble ('/' apart, the only character of its class). Encoding spreads three
 * bytes over four 6-bit fields with two multiplies and maps each field to its character by the
 * offset of its range.
 */
#include <immintrin.h>
#include <stdint.h>

#include "api/wire/base64.h"

#define AVX2 __attribute__((target("avx2")))

/* Decodes 32 characters into values 0..63; false when one is outside the alphabet. */
AVX2 static inline bool decode_values(__m256i in, __m256i *values)
{
    const __m256i lo_lut = _mm256_setr_epi8(11, 3, 3, 3, 3, 3, 3, 3, 3, 3, 7, 21, 23, 23, 23, 21,
                                            11, 3, 3, 3, 3, 3, 3, 3, 3, 3, 7, 21, 23, 23, 23, 21);
    const __m256i hi_lut = _mm256_setr_epi8(1, 1, 2, 4, 8, 16, 8, 16, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 4, 8, 16, 8, 16, 1, 1, 1, 1, 1, 1, 1, 1);
    /* By high nibble: '+' 43 -> 62, '/' 47 -> 63 (index 1), '0' 48 -> 52, 'A' 65 -> 0, 'a' 97
     * -> 26. */
    const __m256i roll_lut =
        _mm256_setr_epi8(0, 16, 19, 4, -65, -65, -71, -71, 0, 0, 0, 0, 0, 0, 0, 0, 0, 16, 19, 4,
                         -65, -65, -71, -71, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m256i nibble = _mm256_set1_epi8(0x0f);
    __m256i hi = _mm256_and_si256(_mm256_srli_epi32(in, 4), nibble);
    __m256i lo = _mm256_and_si256(in, nibble);
    __m256i bad =
        _mm256_and_si256(_mm256_shuffle_epi8(lo_lut, lo), _mm256_shuffle_epi8(hi_lut, hi));
    if (!_mm256_testz_si256(bad, bad))
        return false;
    __m256i slash = _mm256_cmpeq_epi8(in, _mm256_set1_epi8('/'));
    __m256i roll = _mm256_shuffle_epi8(roll_lut, _mm256_add_epi8(slash, hi));
    *values = _mm256_add_epi8(in, roll);
    return true;
}

/* Packs 32 values of 6 bits into 24 bytes, in the low 24 bytes of the result. */
AVX2 static inline __m256i pack_values(__m256i v)
{
    /* a b c d -> (a << 6 | b), (c << 6 | d) as 16-bit words, then (ab << 12 | cd) as 32 bits. */
    __m256i pairs = _mm256_maddubs_epi16(v, _mm256_set1_epi32(0x01400140));
    __m256i quads = _mm256_madd_epi16(pairs, _mm256_set1_epi32(0x00011000));
    /* Each 32-bit word holds its 3 bytes big-endian in bytes 2, 1, 0. */
    const __m256i order = _mm256_setr_epi8(2, 1, 0, 6, 5, 4, 10, 9, 8, 14, 13, 12, -1, -1, -1, -1,
                                           2, 1, 0, 6, 5, 4, 10, 9, 8, 14, 13, 12, -1, -1, -1, -1);
    __m256i bytes = _mm256_shuffle_epi8(quads, order);
    return _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 1, 2, 4, 5, 6, 3, 7));
}

AVX2 size_t api__base64_decode_avx2(const char *src, size_t chars, uint8_t *dst, size_t dst_cap)
{
    size_t i = 0;
    /* A step stores 32 bytes for its 24, so it needs 8 bytes of room past them. */
    for (; i + 32 <= chars && i / 4 * 3 + 32 <= dst_cap; i += 32) {
        __m256i values;
        if (!decode_values(_mm256_loadu_si256((const __m256i *)(src + i)), &values))
            break;
        _mm256_storeu_si256((__m256i *)(dst + i / 4 * 3), pack_values(values));
    }
    return i;
}

/* Maps 32 values 0..63 to their characters. */
AVX2 static inline __m256i encode_chars(__m256i idx)
{
    /* The offset of each value's range, by the range's index: 0 for 0..25 (A-Z, +65), 13 for
     * 26..51 (a-z, +71), value - 51 for 52..63 (0-9 -4, '+' -19, '/' -16). */
    const __m256i shift_lut =
        _mm256_setr_epi8(65, -4, -4, -4, -4, -4, -4, -4, -4, -4, -4, -19, -16, 71, 0, 0, 65, -4, -4,
                         -4, -4, -4, -4, -4, -4, -4, -4, -19, -16, 71, 0, 0);
    __m256i range = _mm256_subs_epu8(idx, _mm256_set1_epi8(51));
    __m256i below26 = _mm256_cmpgt_epi8(_mm256_set1_epi8(26), idx);
    __m256i below52 = _mm256_cmpgt_epi8(_mm256_set1_epi8(52), idx);
    __m256i lower_case = _mm256_andnot_si256(below26, below52);
    range = _mm256_or_si256(range, _mm256_and_si256(lower_case, _mm256_set1_epi8(13)));
    return _mm256_add_epi8(_mm256_shuffle_epi8(shift_lut, range), idx);
}

/* Spreads 24 bytes (12 in each 128-bit lane, at its bytes 0..11) over 32 6-bit values. */
AVX2 static inline __m256i unpack_bytes(__m256i in)
{
    const __m256i order = _mm256_setr_epi8(1, 0, 2, 1, 4, 3, 5, 4, 7, 6, 8, 7, 10, 9, 11, 10, 1, 0,
                                           2, 1, 4, 3, 5, 4, 7, 6, 8, 7, 10, 9, 11, 10);
    in = _mm256_shuffle_epi8(in, order);
    /* Per 32 bits (bytes b1 b0 b2 b1): fields a, c by a multiply-high, b, d by a multiply-low. */
    __m256i ac = _mm256_mulhi_epu16(_mm256_and_si256(in, _mm256_set1_epi32(0x0fc0fc00)),
                                    _mm256_set1_epi32(0x04000040));
    __m256i bd = _mm256_mullo_epi16(_mm256_and_si256(in, _mm256_set1_epi32(0x003f03f0)),
                                    _mm256_set1_epi32(0x01000010));
    return _mm256_or_si256(ac, bd);
}

AVX2 size_t api__base64_encode_avx2(const uint8_t *src, size_t n, char *dst)
{
    size_t i = 0;
    /* A step reads 28 bytes for its 24 (two 16-byte loads, 12 bytes apart). */
    for (; i + 28 <= n; i += 24) {
        __m128i lo = _mm_loadu_si128((const __m128i *)(src + i));
        __m128i hi = _mm_loadu_si128((const __m128i *)(src + i + 12));
        __m256i in = _mm256_set_m128i(hi, lo);
        _mm256_storeu_si256((__m256i *)(dst + i / 3 * 4), encode_chars(unpack_bytes(in)));
    }
    return i;
}
