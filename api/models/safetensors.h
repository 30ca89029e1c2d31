/*
 * safetensors.h - attnd's one reader of safetensors files (api/models/safetensors.c): the
 * header, read with jansson and checked in full, and the tensors it describes as eng_weight
 * views into the file's bytes. Both a --model FILE (one attention layer in one file, named as
 * api/models/weights.c knows) and a checkpoint's shards (api/models/hf_files.c) use it.
 *
 * Usage:
 *
 *     unsigned char *map; size_t size; hf_error e = {0};
 *     if (api__st_map(path, &map, &size, &e) != 0) ...;         // e.message names the file
 *     api__st st;
 *     if (api__st_parse(&st, map, size, path, &e) != 0) ...;    // every entry checked
 *     eng_weight w;
 *     int found = api__st_tensor(&st, "o_proj.weight", &w, NULL, &e);  // 1, 0 absent, -1
 *     api__st_release(&st);
 *     api__st_unmap(map, size);
 */
#ifndef ATTND_API_MODELS_SAFETENSORS_H
#define ATTND_API_MODELS_SAFETENSORS_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "api/models/hf.h"
#include "engine/engine.h"

/* The safetensors format's own limit on the header (huggingface/safetensors' MAX_HEADER_SIZE). */
#define API_ST_MAX_HEADER_BYTES ((uint64_t)100000000)

/* A parsed file: its bytes (borrowed) and its checked header. */
typedef struct {
    const unsigned char *bytes;
    size_t size;
    json_t *header;    /* the JSON object: tensor name -> entry, and __metadata__ */
    size_t data_start; /* 8 + the header's length */
    const char *file;  /* how messages name the file (borrowed) */
} api__st;

/* Parses and checks the header of `size` bytes: the 8-byte length within the file and the
 * format's limit, a JSON object (no repeated key), each entry exactly {dtype, shape,
 * data_offsets} with a known dtype, a shape of at most 8 non-negative integers whose byte size
 * is the offsets' span inside the data, no two tensors overlapping, and a __metadata__ of
 * strings. 0, or -1 with `e` naming the file (and the tensor where one is at fault). */
int api__st_parse(api__st *st, const unsigned char *bytes, size_t size, const char *file,
                  hf_error *e);

/* Releases what api__st_parse holds (not the bytes). */
void api__st_release(api__st *st);

/* Tensor `name` as a view into the bytes, labelled with its name (valid while st is): 1, or 0
 * when the file has no such tensor, or -1 when it cannot be a weight (a dtype other than F32,
 * F16 and BF16, rank outside 1 to 4). *bytes (may be NULL) gets its byte count. */
int api__st_tensor(const api__st *st, const char *name, eng_weight *out, size_t *bytes,
                   hf_error *e);

/* Maps the regular file at `path` read-only: 0, or -1 with `e` naming it (never blocks on a
 * FIFO: anything but a non-empty regular file is refused before it is read). */
int api__st_map(const char *path, unsigned char **map, size_t *size, hf_error *e);
void api__st_unmap(unsigned char *map, size_t size);

/* The layer of a --model FILE's bytes: every tensor a role by its name (api__weights_by_name),
 * the head counts from the arguments (> 0) or the header's __metadata__ ("num_heads",
 * "num_kv_heads"), the projection matrices kept in 16 bits when all four are one 16-bit
 * dtype. NULL with `err` (EFORMAT naming `file` and the tensor, ENOMEM). For the fuzzer too. */
eng_layer *api__st_layer(const char *name, const char *file, const unsigned char *bytes,
                         size_t size, int64_t num_heads, int64_t num_kv_heads, eng_error *err);

/* api__st_layer of the file at `path`, mapped for the call (EIO when it cannot be read). */
eng_layer *api__st_layer_load(const char *name, const char *path, int64_t num_heads,
                              int64_t num_kv_heads, eng_error *err);

#endif
