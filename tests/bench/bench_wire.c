/*
 * bench_wire.c - the tensor codecs of the wire. First the base64 codec alone on one thread: a
 * 48 MiB tensor's bytes (what a 64 MiB base64 body carries) decoded and encoded, in GB/s of
 * base64 text, against a memcpy of the same bytes measured in the same run (vs_memcpy:
 * memcpy's time over the codec's, what moves between machines less than the absolute rate);
 * the path (AVX2 blocks or the scalar loop) is printed. Then each way a tensor travels, decoded
 * (api__tensor_decode) and encoded (api__tensor_encode) as the daemon does it, from a worker of
 * an engine pool of 1 and of 2 threads (the caller is one of the workers, as in the daemon), in
 * turns: the fastest of --reps runs each in GB/s of wire bytes (text, or raw bytes), per core
 * at 2 threads, and 2 threads' speed over 1's:
 *
 *   wire tensor decode form=base64 wire_mb=67.1 gb_s_1=... gb_s_2=... per_core_2=... speedup=...
 *
 * Last, a small tensor (1,024 floats, base64) decoded and encoded with no pool and with the
 * pool of 2, in microseconds a round: a small request's codecs never make a task, so the two
 * are the same. Every decoded tensor and every encoding is checked against the original.
 *
 *     build/tests/bench/bench_wire [--reps N]
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/core/memory.h"
#include "api/wire/base64.h"
#include "api/wire/tensor.h"
#include "engine/engine.h"
#include "tests/support/rng.h"

enum { BYTES = 48 << 20, NUMBERS = 2 << 20, SMALL = 1024, SMALL_ROUNDS = 2000 };

static int reps = 5;

/* The fastest of `reps` runs of fn, in seconds. */
typedef void (*case_fn)(void *ctx);

static double fastest(case_fn fn, void *ctx)
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

static void fail(const char *what)
{
    printf("bench_wire: %s\n", what);
    exit(1);
}

/* ---- The base64 codec alone ---------------------------------------------------------------- */

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

static void codec_lines(void)
{
    buffers b;
    b.text_len = api__base64_encoded_len(BYTES);
    b.bytes = malloc(BYTES);
    b.back = malloc(BYTES);
    b.text = malloc(b.text_len);
    if (!b.bytes || !b.back || !b.text)
        fail("out of memory");
    uint64_t rng = 1;
    for (size_t i = 0; i < BYTES; i++)
        b.bytes[i] = (uint8_t)rng_next(&rng);
    encode(&b); /* the pages, touched once */
    double t_copy = fastest(copy, &b);
    double t_enc = fastest(encode, &b);
    double t_dec = fastest(decode, &b);
    if (memcmp(b.back, b.bytes, BYTES) != 0)
        fail("the decoded bytes differ");
    double gb = (double)b.text_len / 1e9;
    const char *path = api__base64_avx2() ? "avx2" : "scalar";
    printf("wire memcpy bytes=%d gb_s=%.2f\n", BYTES, (double)BYTES / 1e9 / t_copy);
    printf("wire base64 decode path=%s text_mb=%.1f gb_s=%.2f vs_memcpy=%.2f\n", path,
           (double)b.text_len / 1e6, gb / t_dec, t_copy / t_dec);
    printf("wire base64 encode path=%s text_mb=%.1f gb_s=%.2f vs_memcpy=%.2f\n", path,
           (double)b.text_len / 1e6, gb / t_enc, t_copy / t_enc);
    fflush(stdout);
    free(b.bytes);
    free(b.back);
    free(b.text);
}

/* ---- Tensors, as the daemon decodes and encodes them --------------------------------------- */

/* A tensor on the wire: its values, the request body that carries it (parsed and probed) or
 * its raw bytes, the buffer it decodes into, and the reply buffer it encodes into. */
typedef struct {
    const char *form;
    float *values, *out;
    size_t count;
    char *text; /* the body {"t": ...}, or NULL for raw bytes */
    api__body body;
    api__tensor t;
    api__form encode_form;
    api_buf reply;
    eng_pool *pool; /* NULL, or the pool the codec runs on */
    bool decoding, ok;
} tensor_case;

static void run_decode(tensor_case *c)
{
    api__error err = {0};
    c->ok = c->ok &&
            api__tensor_decode(&c->body, &c->t, API_ELEM_FLOAT, 0, c->out, "t", c->pool, &err) == 0;
}

static void run_encode(tensor_case *c)
{
    const int64_t shape[1] = {(int64_t)c->count};
    size_t bad;
    c->reply.len = 0;
    c->ok = c->ok && api__tensor_encode(&c->reply, c->values, 1, shape, c->encode_form, 0, c->pool,
                                        &bad) == API_ENCODE_OK;
}

static void run_case(void *p)
{
    tensor_case *c = p;
    if (c->decoding)
        run_decode(c);
    else
        run_encode(c);
}

/* One run of the case on a worker of `pool`, the calling thread waiting: its seconds. */
typedef struct {
    tensor_case *c;
    double seconds;
    bool done;
    pthread_mutex_t mu;
    pthread_cond_t cv;
} on_worker;

static void worker_task(void *arg, int64_t index)
{
    on_worker *w = arg;
    (void)index;
    int64_t t0 = eng_now_ns();
    run_case(w->c);
    double s = (double)(eng_now_ns() - t0) / 1e9;
    pthread_mutex_lock(&w->mu);
    w->seconds = s;
    w->done = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static double once_on(tensor_case *c, eng_pool *pool)
{
    on_worker w = {.c = c, .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    c->pool = pool;
    if (eng_pool_submit(pool, worker_task, &w) != ENG_OK)
        fail("cannot submit to the pool");
    pthread_mutex_lock(&w.mu);
    while (!w.done)
        pthread_cond_wait(&w.cv, &w.mu);
    pthread_mutex_unlock(&w.mu);
    return w.seconds;
}

/* The body {"t": <the values encoded in `form`>}, parsed and probed. */
static void case_body(tensor_case *c, api__form form)
{
    const int64_t shape[1] = {(int64_t)c->count};
    size_t bad, bound = api__tensor_encoded_bound(form, 1, shape, c->count) + 16;
    api_buf w;
    api__error err = {0};
    api_buf_init(&w, bound);
    api_buf_cstr(&w, "{\"t\":");
    api__tensor_encode(&w, c->values, 1, shape, form, 0, NULL, &bad);
    api_buf_char(&w, '}');
    c->text = api_buf_take(&w, NULL);
    if (!c->text || api__body_parse(&c->body, c->text, strlen(c->text), NULL, &err) != 0 ||
        api__tensor_probe(&c->body, json_object_get(c->body.root, "t"), "t", c->count, &c->t,
                          &err) != 0)
        fail(err.message[0] ? err.message : "cannot build a body");
}

static void case_free(tensor_case *c)
{
    api__body_free(&c->body);
    eng_buf_free(c->text);
    api_buf_free(&c->reply);
}

/* The wire bytes of the case: the body's tensor text, its raw bytes, or the reply. */
static size_t wire_bytes(const tensor_case *c)
{
    if (!c->decoding)
        return c->reply.len;
    return c->t.form == API_FORM_RAW ? c->count * 4 : strlen(c->text);
}

/* One line: the case from a worker of pool1 and of pool2, in turns (the machine's drift weighs
 * on both alike), the fastest of --reps each. */
static void tensor_line(tensor_case *c, eng_pool *pool1, eng_pool *pool2)
{
    double t1 = 1e30, t2 = 1e30;
    c->ok = true;
    once_on(c, pool2); /* the pages, touched once */
    for (int r = 0; r < reps; r++) {
        double s1 = once_on(c, pool1), s2 = once_on(c, pool2);
        t1 = s1 < t1 ? s1 : t1;
        t2 = s2 < t2 ? s2 : t2;
    }
    if (c->decoding)
        c->ok = c->ok && memcmp(c->out, c->values, c->count * 4) == 0;
    double gb = (double)wire_bytes(c) / 1e9;
    printf("wire tensor %s form=%s wire_mb=%.1f gb_s_1=%.2f gb_s_2=%.2f per_core_2=%.2f "
           "speedup=%.2f%s\n",
           c->decoding ? "decode" : "encode", c->form, gb * 1e3, gb / t1, gb / t2, gb / t2 / 2,
           t1 / t2, c->ok ? "" : " FAILED");
    fflush(stdout);
    if (!c->ok)
        exit(1);
}

static void tensor_lines(eng_pool *pool1, eng_pool *pool2)
{
    size_t big = BYTES / 4;
    float *values = api__aligned_alloc(big * 4), *out = api__aligned_alloc(big * 4);
    if (!values || !out)
        fail("out of memory");
    uint64_t rng = 2;
    for (size_t i = 0; i < big; i++)
        values[i] = rng_sym(&rng, 1.0);
    tensor_case c = {.values = values, .out = out, .count = big, .decoding = true};

    c.form = "base64";
    case_body(&c, API_FORM_BASE64);
    tensor_line(&c, pool1, pool2);
    case_free(&c);

    c.form = "raw_copy";
    c.t = (api__tensor){.present = true, .form = API_FORM_RAW, .dtype = API_DTYPE_FLOAT32};
    c.t.rank = 1;
    c.t.shape[0] = (int64_t)big;
    c.t.count = big;
    c.t.raw = values;
    tensor_line(&c, pool1, pool2);
    c.form = "raw_in_place";
    c.out = values; /* checked where it lies */
    tensor_line(&c, pool1, pool2);
    c.out = out;

    c.count = NUMBERS;
    c.form = "json_numbers";
    case_body(&c, API_FORM_FLAT);
    tensor_line(&c, pool1, pool2);
    case_free(&c);

    const struct {
        const char *name;
        api__form form;
        size_t count;
    } encodings[] = {{"base64", API_FORM_BASE64, big},
                     {"raw", API_FORM_RAW, big},
                     {"json_nested", API_FORM_NESTED, NUMBERS}};
    for (size_t e = 0; e < sizeof encodings / sizeof encodings[0]; e++) {
        const int64_t shape[1] = {(int64_t)encodings[e].count};
        tensor_case enc = {.form = encodings[e].name,
                           .values = values,
                           .count = encodings[e].count,
                           .encode_form = encodings[e].form};
        api_buf_init(&enc.reply, api__tensor_encoded_bound(enc.encode_form, 1, shape, enc.count));
        tensor_line(&enc, pool1, pool2);
        case_free(&enc);
    }
    free(values);
    free(out);
}

/* ---- A small tensor ------------------------------------------------------------------------ */

static void small_rounds(void *p)
{
    tensor_case *c = p;
    for (int r = 0; r < SMALL_ROUNDS; r++) {
        run_decode(c);
        run_encode(c);
    }
}

static void small_line(eng_pool *pool2)
{
    static float values[SMALL], out[SMALL];
    uint64_t rng = 3;
    for (size_t i = 0; i < SMALL; i++)
        values[i] = rng_sym(&rng, 1.0);
    const int64_t shape[1] = {SMALL};
    tensor_case c = {.values = values, .out = out, .count = SMALL, .ok = true};
    c.encode_form = API_FORM_BASE64;
    case_body(&c, API_FORM_BASE64);
    api_buf_init(&c.reply, api__tensor_encoded_bound(API_FORM_BASE64, 1, shape, SMALL));
    c.pool = NULL;
    double alone = fastest(small_rounds, &c) / SMALL_ROUNDS;
    c.pool = pool2;
    double pooled = fastest(small_rounds, &c) / SMALL_ROUNDS;
    c.ok = c.ok && memcmp(out, values, sizeof values) == 0;
    printf("wire small decode+encode form=base64 count=%d alone_us=%.2f pool_us=%.2f%s\n", SMALL,
           alone * 1e6, pooled * 1e6, c.ok ? "" : " FAILED");
    case_free(&c);
    if (!c.ok)
        exit(1);
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--reps") == 0)
        reps = (int)strtol(argv[2], NULL, 10);
    if (argc != 1 && argc != 3) {
        printf("usage: bench_wire [--reps N]\n");
        return 2;
    }
    if (reps < 1 || reps > 100)
        fail("--reps takes 1 to 100");
    eng_error err;
    eng_pool *pool1 = eng_pool_new(1, &err), *pool2 = pool1 ? eng_pool_new(2, &err) : NULL;
    if (!pool2)
        fail(err.message);
    codec_lines();
    tensor_lines(pool1, pool2);
    small_line(pool2);
    eng_pool_free(pool1);
    eng_pool_free(pool2);
    return 0;
}
