/*
 * fuzz_safetensors.c - libFuzzer harness for the safetensors reader (api/models/safetensors.c)
 * and the layer of a --model FILE.
 *
 * Any bytes go in as a whole file; the reader must answer with a layer or an error, never
 * crash, hang, leak or read out of bounds. Run by `make fuzz` (long) and `make test` (smoke).
 */
#include <stddef.h>
#include <stdint.h>

#include "api/models/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    eng_error err;
    /* Once as a file with its own metadata, once with the head count forced, so that inputs
     * without metadata still reach layer assembly. */
    eng_layer_free(api__st_layer("fuzz", "input", data, size, 0, 0, &err));
    eng_layer_free(api__st_layer("fuzz", "input", data, size, 1, 0, &err));
    return 0;
}
