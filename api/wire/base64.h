/*
 * base64.h - the byte-level codec of RFC 4648 (standard alphabet), for base64 tensors; the
 * fp16/bf16 conversions are the engine's. Pure functions; any thread.
 */
#ifndef ATTND_API_WIRE_BASE64_H
#define ATTND_API_WIRE_BASE64_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    API_B64_OK = 0,
    API_B64_BAD_LENGTH,  /* length % 4 == 1: no byte string encodes to that */
    API_B64_BAD_CHAR,    /* outside A-Z a-z 0-9 + / (whitespace included), or misplaced '=' */
    API_B64_BAD_PADDING, /* the unused bits of the last group are not zero (non-canonical) */
} api__b64_status;

/* Characters needed to encode n bytes, with padding: 4 * ceil(n / 3). */
size_t api__base64_encoded_len(size_t n);

/* Encodes n bytes into dst (api__base64_encoded_len(n) bytes, no NUL added); returns dst's end. */
char *api__base64_encode(const void *src, size_t n, char *dst);

/* Bytes that `len` characters of base64 decode to, from the length and the trailing '='s;
 * SIZE_MAX when no valid string has that length. Padding is optional (unpadded tails of 2 or 3
 * characters are accepted). */
size_t api__base64_decoded_len(const char *src, size_t len);

/* Decodes src into dst, which holds api__base64_decoded_len(src, len) bytes, and stores how many
 * it wrote in *dst_len. On failure *bad_offset is the offset of the first offending character
 * (for BAD_LENGTH: len); a stray character is reported before a bad length. dst may be NULL:
 * then nothing is written (api__base64_validate). */
api__b64_status api__base64_decode(const char *src, size_t len, void *dst, size_t *dst_len,
                                   size_t *bad_offset);

/* The checks of api__base64_decode without the output: for error messages. */
api__b64_status api__base64_validate(const char *src, size_t len, size_t *bad_offset);

/* The AVX2 blocks (base64_avx2.c), for CPUs with AVX2 only: the decoder's takes 32 characters
 * at a time from src[0..chars) into dst (dst_cap bytes) while all of a block's are in the
 * alphabet and 32 bytes of room remain, the encoder's 24 bytes at a time while 28 of src are
 * readable; each returns the characters (bytes) it consumed, a multiple of 32 (24), and the
 * scalar code does the rest. */
size_t api__base64_decode_avx2(const char *src, size_t chars, uint8_t *dst, size_t dst_cap);
size_t api__base64_encode_avx2(const uint8_t *src, size_t n, char *dst);

/* Whether api__base64_decode and api__base64_encode use the AVX2 blocks on this CPU. */
bool api__base64_avx2(void);

#endif
