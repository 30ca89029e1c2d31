/*
 * safetensors_writer.h - writes safetensors files, so that tests make their model fixtures at
 * test time (in a temporary folder; nothing is downloaded or checked in).
 *
 * The format, as huggingface/safetensors defines it (all integers little-endian):
 *
 *   bytes [0, 8)         N: an unsigned 64-bit integer, the byte length of the header.
 *   bytes [8, 8 + N)     the header: one UTF-8 JSON object. Each key but one is a tensor name,
 *                        mapping to {"dtype": "F32", "shape": [d0, d1, ...],
 *                        "data_offsets": [begin, end]} where begin and end (exclusive) are byte
 *                        offsets into the data section and end - begin = product(shape) times
 *                        the dtype's size (F32 4 bytes; F16 and BF16 2; the format also knows
 *                        F64, I32, ... which attnd refuses). The optional key "__metadata__"
 *                        maps to an object of string values; attnd reads "num_heads" and
 *                        "num_kv_heads" from it. The official writer pads the header with
 *                        spaces to a multiple of 8 bytes so the data section stays aligned;
 *                        this writer does the same. Readers refuse N above 100,000,000.
 *   bytes [8 + N, end)   the data section: each tensor's elements, row-major, little-endian.
 *                        This writer lays the tensors out in the order given, back to back.
 *
 * F16 is IEEE 754 binary16; BF16 is the top 16 bits of a binary32. Values are converted with
 * round-to-nearest-even (NaN stays NaN, overflow becomes infinity); tests that compare a load
 * bit for bit choose values that both formats hold exactly.
 *
 *     stw_tensor t[] = {{"in_proj_weight", STW_F16, 2, {3 * E, E}, w},
 *                       {"out_proj.weight", STW_F16, 2, {E, E}, wo}};
 *     stw_meta meta[] = {{"num_heads", "4"}};
 *     if (!stw_save("/tmp/x/layer.safetensors", t, 2, meta, 1)) { ... }
 *
 * Malformed files for the loader's error paths are written with stw_build_raw (any header text,
 * any declared length, any data bytes) and stw_write_file. Functions return false only when
 * memory runs out or the file cannot be written. Ownership: arguments are borrowed; a
 * stw_bytes result belongs to the caller (stw_bytes_free).
 */
#ifndef ATTND_TESTS_SAFETENSORS_WRITER_H
#define ATTND_TESTS_SAFETENSORS_WRITER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { STW_F32 = 0, STW_F16, STW_BF16 } stw_dtype;

/* A tensor to write: product(shape) float values, stored as `dtype`. */
typedef struct {
    const char *name; /* any UTF-8 text; escaped as JSON needs */
    stw_dtype dtype;
    int rank; /* 0 to 8 (the writer does not judge; the reader may refuse) */
    int64_t shape[8];
    const float *values;
} stw_tensor;

/* One "__metadata__" entry (both strings). */
typedef struct {
    const char *key, *value;
} stw_meta;

/* A file's bytes. */
typedef struct {
    unsigned char *data;
    size_t len;
} stw_bytes;

/* Builds a whole file in memory: the header (tensors in the given order, then __metadata__
 * when nmeta > 0, padded with spaces to a multiple of 8) and the data. */
bool stw_build(const stw_tensor *tensors, size_t count, const stw_meta *meta, size_t nmeta,
               stw_bytes *out);

/* A file from a hand-written header: the 8-byte length `declared_len` (which need not be
 * header_len: that is how "header length beyond the file" is made), then header_len bytes of
 * `header` as given (no padding, no validation), then data_len bytes of `data`. */
bool stw_build_raw(uint64_t declared_len, const char *header, size_t header_len, const void *data,
                   size_t data_len, stw_bytes *out);

/* Writes `len` bytes to `path` (created or truncated, mode 0644). */
bool stw_write_file(const char *path, const void *bytes, size_t len);

/* stw_build, then stw_write_file. */
bool stw_save(const char *path, const stw_tensor *tensors, size_t count, const stw_meta *meta,
              size_t nmeta);

void stw_bytes_free(stw_bytes *b);

/* Round-to-nearest-even conversions of a float to the stored 16-bit patterns. */
uint16_t stw_f32_to_f16(float f);
uint16_t stw_f32_to_bf16(float f);

#endif
