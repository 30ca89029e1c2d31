/*
 * fuzz_hf_checkpoint.c - libFuzzer harness for the Hugging Face checkpoint readers
 * (api/models/hf_config.c, hf_files.c): the first byte picks the reader, the rest is its input.
 *
 *   0: config.json, read for layers 0 and 1 (every family's fields, RoPE, windows, norms);
 *   1: model.safetensors.index.json of a directory without shards (the weight map's checks);
 *   2: a shard's bytes (header JSON, dtypes, shapes, offsets, overlaps).
 *
 * Each must answer with a description or an error, never crash, hang, leak or read out of
 * bounds. Run by `make fuzz` (long) and `make test` (smoke).
 */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "api/models/hf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    hf_error e;
    const char *text = (const char *)data + 1;
    size_t n = size - 1;
    memset(&e, 0, sizeof e);
    switch (data[0] % 3) {
    case 0: {
        json_t *cfg = json_loadb(text, n, 0, NULL);
        hf_config c;
        for (int64_t layer = 0; cfg && layer < 2; layer++) {
            memset(&e, 0, sizeof e);
            if (api__hf_config_read(cfg, layer, &c, &e) == 0 && c.spec.rope.rotary_dim > 0) {
                float inv[2048], factor;
                eng_error err;
                if (c.spec.rope.rotary_dim / 2 <= 2048)
                    eng_rope_inv_freq(&c.spec.rope, inv, &factor, &err);
            }
        }
        json_decref(cfg);
        break;
    }
    case 1:
        api__hf_index_check("/nonexistent-attnd-fuzz", text, n, &e);
        break;
    default:
        api__hf_shard_check((const unsigned char *)text, n, "input", &e);
        break;
    }
    return 0;
}
