/*
 * bench_wire.c - the tensor codecs of the wire, per core: base64 decoding and encoding of a
 * 48 MiB tensor's bytes (what a 64 MiB base64 body carries) on one thread, in GB/s of base64
 * text, against a memcpy of the same bytes measured in the same run (vs_memcpy: memcpy's time
 * over the codec's, what moves between machines less than the absolute rate). The path (AVX2 blocks
 * or the scalar loop) is printed; the decoded bytes are checked against the original.
 *
 *     build/tests/bench/bench_wire [--reps N]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/wire/base64.h"
#include "engine/engine.h"
#include "tests/support/rng.h"

enum { BYTES = 48 << 20 };

/* The fastest of `reps` runs of fn, in seconds. */
typedef void (*case_fn)(void *ctx);

static double fastest(case_fn fn, void *ctx, int reps)
{
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        int64_t t0 = eng_now_ns();
        fn(ctx);
        double s = (double)(eng_now_ns() - t0) / 1e9;
        if (s < best)
            best = s;
    }
    return best;
}

typedef struct {
    uint8_t *bytes, *back;
    char *text;
    size_t text_len;
} buffers;

static void copy(void *p)
{
    buffers *b = p;
    memcpy(b->back, b->bytes, BYTES);
}

static void encode(void *p)
{
    buffers *b = p;
    api__base64_encode(b->bytes, BYTES, b->text);
}

static void decode(void *p)
{
    buffers *b = p;
    size_t n, bad;
    if (api__base64_decode(b->text, b->text_len, b->back, &n, &bad) != API_B64_OK || n != BYTES)
        abort();
}

int main(int argc, char **argv)
{
    int reps = argc == 3 && strcmp(argv[1], "--reps") == 0 ? atoi(argv[2]) : 5;
    buffers b;
    b.text_len = api__base64_encoded_len(BYTES);
    b.bytes = malloc(BYTES);
    b.back = malloc(BYTES);
    b.text = malloc(b.text_len);
    if (!b.bytes || !b.back || !b.text || reps < 1) {
        printf("bench_wire: out of memory or a bad --reps\n");
        return 1;
    }
    uint64_t rng = 1;
    for (size_t i = 0; i < BYTES; i++)
        b.bytes[i] = (uint8_t)rng_next(&rng);
    encode(&b); /* the pages, touched once */
    double t_copy = fastest(copy, &b, reps);
    double t_enc = fastest(encode, &b, reps);
    double t_dec = fastest(decode, &b, reps);
    if (memcmp(b.back, b.bytes, BYTES) != 0) {
        printf("bench_wire: the decoded bytes differ\n");
        return 1;
    }
    double gb = (double)b.text_len / 1e9;
    const char *path = api__base64_avx2() ? "avx2" : "scalar";
    printf("wire memcpy bytes=%d gb_s=%.2f\n", BYTES, (double)BYTES / 1e9 / t_copy);
    printf("wire base64 decode path=%s text_mb=%.1f gb_s=%.2f vs_memcpy=%.2f\n", path,
           (double)b.text_len / 1e6, gb / t_dec, t_copy / t_dec);
    printf("wire base64 encode path=%s text_mb=%.1f gb_s=%.2f vs_memcpy=%.2f\n", path,
           (double)b.text_len / 1e6, gb / t_enc, t_copy / t_enc);
    free(b.bytes);
    free(b.back);
    free(b.text);
    return 0;
}
