/*
 * kvcache.c - paged KV caches for incremental decoding: a block pool with a byte budget,
 * sequences that hold their K and V in blocks through a block table, and attention over them.
 *
 * A block holds T tokens (the pool's block_tokens) of one sequence shape: K as [Hkv][T][D],
 * then V as [Hkv][T][Dv], in the cache dtype (float32, bfloat16 or float16), so that the rows
 * of one key head inside a block are contiguous and the flash loop reads them in place
 * (eng__sdpa_paged in sdpa.c; its key blocks end at cache-block boundaries). Blocks are
 * reference counted: a fork copies the block table and takes a reference on every block;
 * whoever writes into a block that others share copies it first (copy-on-write, needed only
 * for the partly filled last block, since full blocks are never written again). Appending
 * costs the new tokens' rows plus, at most, one block copy; truncating releases whole blocks.
 *
 * The pool only accounts: each block is its own aligned allocation, and the bytes of the
 * blocks alive are held under the capacity with a compare-and-swap, so that any thread may
 * allocate and free without a lock.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "engine/internal.h"

/* In front of every block's data, one cache line (the data stays 64-byte aligned). */
#define BLOCK_HEADER 64

typedef struct {
    atomic_int refs;
    eng_kv_pool *pool;
    size_t bytes; /* what the block counts against the capacity */
} block_header;

_Static_assert(sizeof(block_header) <= BLOCK_HEADER, "the block header fits its cache line");

struct eng_kv_pool {
    size_t capacity;
    int64_t block_tokens;
    atomic_size_t used;
    atomic_int_fast64_t blocks, sequences, tokens;
};

struct eng_kv_seq {
    eng_kv_pool *pool;
    eng_kv_shape shape; /* value_head_dim resolved */
    size_t elem;        /* bytes per cache element */
    size_t block_bytes; /* K and V of one block */
    int64_t length;
    int64_t nblocks, cap;
    void **blocks; /* the data of each block, BLOCK_HEADER bytes after its header */
};

/* ---- Pool ------------------------------------------------------------------------------------ */

eng_kv_pool *eng_kv_pool_new(size_t capacity_bytes, int64_t block_tokens, eng_error *err)
{
    if (block_tokens < 1 || block_tokens > 65536) {
        eng__fail(err, ENG_EINVAL, "block_tokens",
                  "block_tokens = %lld must be in [1, 65536] (16 to 64 suit decoding)",
                  (long long)block_tokens);
        return NULL;
    }
    if (capacity_bytes == 0) {
        eng__fail(err, ENG_EINVAL, "kv_cache_bytes", "the KV cache capacity must be positive");
        return NULL;
    }
    eng_kv_pool *pool = calloc(1, sizeof *pool);
    if (!pool) {
        eng__fail(err, ENG_ENOMEM, "", "cannot allocate the KV cache pool");
        return NULL;
    }
    pool->capacity = capacity_bytes;
    pool->block_tokens = block_tokens;
    atomic_init(&pool->used, 0);
    atomic_init(&pool->blocks, 0);
    atomic_init(&pool->sequences, 0);
    atomic_init(&pool->tokens, 0);
    return pool;
}

void eng_kv_pool_free(eng_kv_pool *pool)
{
    if (!pool)
        return;
    /* Blocks point back at their pool: freeing it under a live sequence is our own bug. */
    assert(atomic_load(&pool->sequences) == 0);
    free(pool);
}

void eng_kv_pool_stats_get(eng_kv_pool *pool, eng_kv_pool_stats *stats)
{
    stats->capacity_bytes = pool->capacity;
    stats->used_bytes = atomic_load(&pool->used);
    stats->block_tokens = pool->block_tokens;
    stats->blocks = (int64_t)atomic_load(&pool->blocks);
    stats->sequences = (int64_t)atomic_load(&pool->sequences);
    stats->tokens = (int64_t)atomic_load(&pool->tokens);
}

/* Holds `bytes` more under the capacity; false (nothing held) when they do not fit now. */
static bool pool_reserve(eng_kv_pool *pool, size_t bytes)
{
    size_t cur = atomic_load(&pool->used);
    do {
        if (bytes > pool->capacity - cur)
            return false;
    } while (!atomic_compare_exchange_weak(&pool->used, &cur, cur + bytes));
    return true;
}

static void pool_release(eng_kv_pool *pool, size_t bytes)
{
    atomic_fetch_sub(&pool->used, bytes);
}

/* A block of `bytes` already reserved, with one reference; NULL when memory runs out (the
 * reservation is then still the caller's). */
static void *block_new(eng_kv_pool *pool, size_t bytes)
{
    size_t total = BLOCK_HEADER + (bytes + 63) / 64 * 64;
    char *base = aligned_alloc(64, total);
    if (!base)
        return NULL;
    block_header *h = (block_header *)base;
    atomic_init(&h->refs, 1);
    h->pool = pool;
    h->bytes = bytes;
    atomic_fetch_add(&pool->blocks, 1);
    return base + BLOCK_HEADER;
}

static block_header *header_of(void *data)
{
    return (block_header *)((char *)data - BLOCK_HEADER);
}

static void block_ref(void *data)
{
    atomic_fetch_add(&header_of(data)->refs, 1);
}

/* Drops one reference; the last one frees the block and its bytes. Any thread. */
static void block_unref(void *data)
{
    block_header *h = header_of(data);
    if (atomic_fetch_sub(&h->refs, 1) != 1)
        return;
    eng_kv_pool *pool = h->pool;
    size_t bytes = h->bytes;
    free(h);
    atomic_fetch_sub(&pool->blocks, 1);
    pool_release(pool, bytes);
}

/* ---- Sequences ------------------------------------------------------------------------------- */

static size_t dtype_bytes(eng_dtype dtype)
{
    return dtype == ENG_DTYPE_F32 ? sizeof(float) : sizeof(uint16_t);
}

static bool dtype_known(eng_dtype dtype)
{
    return dtype == ENG_DTYPE_F32 || dtype == ENG_DTYPE_BF16 || dtype == ENG_DTYPE_F16;
}

eng_kv_seq *eng_kv_seq_new(eng_kv_pool *pool, const eng_kv_shape *shape, eng_error *err)
{
    if (!pool || !shape) {
        eng__fail(err, ENG_EINVAL, "", "no pool or no shape");
        return NULL;
    }
    eng_kv_shape s = *shape;
    if (s.value_head_dim == 0)
        s.value_head_dim = s.head_dim;
    const struct {
        const char *name;
        int64_t value;
    } dims[] = {{"num_kv_heads", s.num_kv_heads},
                {"head_dim", s.head_dim},
                {"value_head_dim", s.value_head_dim}};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (dims[i].value < 1 || dims[i].value > 65536) {
            eng__fail(err, ENG_EINVAL, dims[i].name, "%s = %lld must be in [1, 65536]",
                      dims[i].name, (long long)dims[i].value);
            return NULL;
        }
    if (!dtype_known(s.dtype)) {
        eng__fail(err, ENG_EINVAL, "cache_dtype",
                  "cache_dtype must be float32, bfloat16 or float16");
        return NULL;
    }
    if (s.max_tokens < 0) {
        eng__fail(err, ENG_EINVAL, "max_tokens", "max_tokens must be >= 0 (0: no cap)");
        return NULL;
    }
    /* Each factor is at most 2^16 and elem 4: the product stays below 2^52. */
    size_t elem = dtype_bytes(s.dtype);
    size_t block_bytes = (size_t)pool->block_tokens * (size_t)s.num_kv_heads *
                         (size_t)(s.head_dim + s.value_head_dim) * elem;
    if (block_bytes > pool->capacity) {
        eng__fail_cause(err, ENG_CAUSE_KV_CACHE_CAPACITY, ENG_ETOOBIG, "kv_cache_bytes",
                        "one block of this shape takes %zu bytes, beyond the KV cache capacity of "
                        "%zu bytes",
                        block_bytes, pool->capacity);
        return NULL;
    }
    eng_kv_seq *seq = calloc(1, sizeof *seq);
    if (!seq) {
        eng__fail(err, ENG_ENOMEM, "", "cannot allocate a KV sequence");
        return NULL;
    }
    seq->pool = pool;
    seq->shape = s;
    seq->elem = elem;
    seq->block_bytes = block_bytes;
    atomic_fetch_add(&pool->sequences, 1);
    return seq;
}

void eng_kv_seq_free(eng_kv_seq *seq)
{
    if (!seq)
        return;
    for (int64_t i = 0; i < seq->nblocks; i++)
        block_unref(seq->blocks[i]);
    atomic_fetch_sub(&seq->pool->tokens, seq->length);
    atomic_fetch_sub(&seq->pool->sequences, 1);
    free(seq->blocks);
    free(seq);
}

int64_t eng_kv_seq_length(const eng_kv_seq *seq)
{
    return seq->length;
}

eng_kv_shape eng_kv_seq_shape(const eng_kv_seq *seq)
{
    return seq->shape;
}

static int64_t blocks_for(const eng_kv_seq *seq, int64_t tokens)
{
    return tokens / seq->pool->block_tokens + (tokens % seq->pool->block_tokens != 0);
}

/* True when the last block is partly filled and shared: the next append copies it first. */
static bool tail_shared(const eng_kv_seq *seq)
{
    return seq->length % seq->pool->block_tokens != 0 &&
           atomic_load(&header_of(seq->blocks[seq->nblocks - 1])->refs) > 1;
}

size_t eng_kv_seq_append_bytes(const eng_kv_seq *seq, int64_t tokens)
{
    if (tokens <= 0 || tokens > INT64_MAX - seq->length)
        return 0;
    int64_t fresh = blocks_for(seq, seq->length + tokens) - seq->nblocks + tail_shared(seq);
    return (size_t)fresh * seq->block_bytes;
}

eng_kv_rows eng_kv_rows_f32(eng_view view)
{
    eng_kv_rows r = {.dtype = ENG_DTYPE_F32, .data = view.data};
    memcpy(r.ne, view.ne, sizeof r.ne);
    memcpy(r.stride, view.stride, sizeof r.stride);
    return r;
}

/* Input rows [1, Hkv, n, width] with contiguous rows and addressable strides. */
static eng_status check_rows(const eng_kv_rows *r, const char *name, int64_t heads, int64_t width,
                             eng_error *err)
{
    if (!r->data)
        return eng__fail(err, ENG_EINVAL, name, "%s has no data", name);
    if (!dtype_known(r->dtype))
        return eng__fail(err, ENG_EINVAL, name, "%s dtype must be float32, bfloat16 or float16",
                         name);
    if (r->ne[0] != 1 || r->ne[1] != heads || r->ne[2] < 1 || r->ne[3] != width)
        return eng__fail(err, ENG_EINVAL, name,
                         "%s is [%lld,%lld,%lld,%lld]; the session takes [1,%lld,n,%lld] (n >= 1)",
                         name, (long long)r->ne[0], (long long)r->ne[1], (long long)r->ne[2],
                         (long long)r->ne[3], (long long)heads, (long long)width);
    int64_t last = 0;
    for (int d = 0; d < 4; d++) {
        int64_t span;
        if (r->stride[d] < 0)
            return eng__fail(err, ENG_EINVAL, name, "%s stride %d is negative", name, d);
        if (__builtin_mul_overflow(r->ne[d] - 1, r->stride[d], &span) ||
            __builtin_add_overflow(last, span, &last))
            return eng__fail(err, ENG_ETOOBIG, name, "%s spans more than 2^63 elements", name);
    }
    if (r->stride[3] != 1)
        return eng__fail(err, ENG_EINVAL, name, "%s rows must be contiguous (stride 1)", name);
    if ((uint64_t)last >= SIZE_MAX / sizeof(float))
        return eng__fail(err, ENG_ETOOBIG, name, "%s is larger than memory", name);
    return ENG_OK;
}

static float load_elem(eng_dtype dtype, const void *row, int64_t i)
{
    if (dtype == ENG_DTYPE_F32)
        return ((const float *)row)[i];
    uint16_t h = ((const uint16_t *)row)[i];
    return dtype == ENG_DTYPE_BF16 ? eng_bf16_to_f32(h) : eng_f16_to_f32(h);
}

/* n elements from src (dtype `from`) into dst (dtype `to`), rounding to nearest even. */
static void convert_row(void *dst, eng_dtype to, const void *src, eng_dtype from, int64_t n)
{
    if (to == from) {
        memcpy(dst, src, (size_t)n * dtype_bytes(to));
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        float x = load_elem(from, src, i);
        if (to == ENG_DTYPE_F32)
            ((float *)dst)[i] = x;
        else
            ((uint16_t *)dst)[i] = to == ENG_DTYPE_BF16 ? eng_f32_to_bf16(x) : eng_f32_to_f16(x);
    }
}

/* Writes the rows of `in` (K when !values) as tokens [length, length + n) of the blocks. */
static void write_rows(eng_kv_seq *seq, const eng_kv_rows *in, bool values)
{
    const int64_t T = seq->pool->block_tokens, heads = seq->shape.num_kv_heads;
    const int64_t D = seq->shape.head_dim, width = values ? seq->shape.value_head_dim : D;
    const size_t in_elem = dtype_bytes(in->dtype);
    for (int64_t h = 0; h < heads; h++)
        for (int64_t i = 0; i < in->ne[2]; i++) {
            int64_t pos = seq->length + i, t = pos % T;
            char *block = seq->blocks[pos / T];
            size_t at = (size_t)((values ? heads * T * D : 0) + (h * T + t) * width);
            const char *src =
                (const char *)in->data + (size_t)(h * in->stride[1] + i * in->stride[2]) * in_elem;
            convert_row(block + at * seq->elem, seq->shape.dtype, src, in->dtype, width);
        }
}

/* The rows an append takes: k and v of the sequence's shape with as many tokens. */
static eng_status check_append(const eng_kv_seq *seq, const eng_kv_rows *k, const eng_kv_rows *v,
                               eng_error *err)
{
    eng_status st;
    if (!seq || !k || !v)
        return eng__fail(err, ENG_EINVAL, !seq ? "" : !k ? "k" : "v", "append needs k and v");
    const eng_kv_shape *s = &seq->shape;
    if ((st = check_rows(k, "k", s->num_kv_heads, s->head_dim, err)) != ENG_OK ||
        (st = check_rows(v, "v", s->num_kv_heads, s->value_head_dim, err)) != ENG_OK)
        return st;
    if (v->ne[2] != k->ne[2])
        return eng__fail(err, ENG_EINVAL, "v", "v has %lld tokens but k has %lld",
                         (long long)v->ne[2], (long long)k->ne[2]);
    return ENG_OK;
}

eng_status eng_kv_seq_append(eng_kv_seq *seq, const eng_kv_rows *k, const eng_kv_rows *v,
                             eng_error *err)
{
    eng_status st = check_append(seq, k, v, err);
    if (st != ENG_OK)
        return st;
    const eng_kv_shape *s = &seq->shape;
    const int64_t n = k->ne[2];
    if (s->max_tokens > 0 && n > s->max_tokens - seq->length)
        return eng__fail_cause(err, ENG_CAUSE_MAX_TOKENS, ENG_ETOOBIG, "max_tokens",
                               "appending %lld tokens to %lld would pass max_tokens = %lld",
                               (long long)n, (long long)seq->length, (long long)s->max_tokens);
    if (n > INT64_MAX / 2 - seq->length)
        return eng__fail(err, ENG_ETOOBIG, "k", "the sequence would be too long");
    const int64_t total = seq->length + n, need = blocks_for(seq, total);
    if ((uint64_t)need > seq->pool->capacity / seq->block_bytes)
        return eng__fail_cause(err, ENG_CAUSE_KV_CACHE_CAPACITY, ENG_ETOOBIG, "kv_cache_bytes",
                               "%lld tokens take %lld blocks of %zu bytes, beyond the KV cache "
                               "capacity of %zu bytes",
                               (long long)total, (long long)need, seq->block_bytes,
                               seq->pool->capacity);
    const bool cow = tail_shared(seq);
    const int64_t fresh = need - seq->nblocks;
    const size_t bytes = (size_t)(fresh + cow) * seq->block_bytes;
    if (!pool_reserve(seq->pool, bytes))
        return eng__fail_cause(err, ENG_CAUSE_KV_CACHE_FULL, ENG_ENOMEM, "kv_cache_bytes",
                               "the KV cache is full: %zu of %zu bytes in use, %zu more needed",
                               atomic_load(&seq->pool->used), seq->pool->capacity, bytes);
    /* Everything that may fail comes before the first change to the sequence. */
    if (need > seq->cap) {
        int64_t cap = seq->cap ? seq->cap : 4;
        while (cap < need)
            cap *= 2;
        void **table = realloc(seq->blocks, (size_t)cap * sizeof *table);
        if (!table) {
            pool_release(seq->pool, bytes);
            return eng__fail(err, ENG_ENOMEM, "", "cannot grow the block table");
        }
        seq->blocks = table;
        seq->cap = cap;
    }
    void *copy = NULL;
    int64_t made = 0;
    if (cow && !(copy = block_new(seq->pool, seq->block_bytes)))
        goto out_of_memory;
    for (; made < fresh; made++) {
        void *b = block_new(seq->pool, seq->block_bytes);
        if (!b)
            goto out_of_memory;
        seq->blocks[seq->nblocks + made] = b;
    }
    if (cow) {
        void *tail = seq->blocks[seq->nblocks - 1];
        memcpy(copy, tail, seq->block_bytes);
        seq->blocks[seq->nblocks - 1] = copy;
        block_unref(tail);
    }
    write_rows(seq, k, false);
    write_rows(seq, v, true);
    seq->nblocks = need;
    seq->length = total;
    atomic_fetch_add(&seq->pool->tokens, n);
    return ENG_OK;

out_of_memory:
    /* Blocks made here count their bytes once freed: hand back only the rest. */
    for (int64_t i = 0; i < made; i++)
        block_unref(seq->blocks[seq->nblocks + i]);
    if (copy)
        block_unref(copy);
    pool_release(seq->pool, bytes - (size_t)(made + (copy != NULL)) * seq->block_bytes);
    return eng__fail(err, ENG_ENOMEM, "", "cannot allocate %zu bytes of KV blocks", bytes);
}

eng_status eng_kv_seq_truncate(eng_kv_seq *seq, int64_t length, eng_error *err)
{
    if (!seq)
        return eng__fail(err, ENG_EINVAL, "", "no sequence");
    if (length < 0 || length > seq->length)
        return eng__fail(err, ENG_EINVAL, "length", "length = %lld must be in [0, %lld]",
                         (long long)length, (long long)seq->length);
    int64_t keep = blocks_for(seq, length);
    for (int64_t i = keep; i < seq->nblocks; i++)
        block_unref(seq->blocks[i]);
    atomic_fetch_sub(&seq->pool->tokens, seq->length - length);
    seq->nblocks = keep;
    seq->length = length;
    return ENG_OK;
}

eng_kv_seq *eng_kv_seq_fork(const eng_kv_seq *seq, eng_error *err)
{
    if (!seq) {
        eng__fail(err, ENG_EINVAL, "", "no sequence");
        return NULL;
    }
    eng_kv_seq *f = calloc(1, sizeof *f);
    void **table = seq->nblocks ? malloc((size_t)seq->nblocks * sizeof *table) : NULL;
    if (!f || (seq->nblocks && !table)) {
        free(f);
        free(table);
        eng__fail(err, ENG_ENOMEM, "", "cannot allocate the forked sequence");
        return NULL;
    }
    *f = *seq;
    f->blocks = table;
    f->cap = seq->nblocks;
    for (int64_t i = 0; i < seq->nblocks; i++) {
        table[i] = seq->blocks[i];
        block_ref(table[i]);
    }
    atomic_fetch_add(&seq->pool->sequences, 1);
    atomic_fetch_add(&seq->pool->tokens, seq->length);
    return f;
}

/* ---- Attention ------------------------------------------------------------------------------- */

/* The eng_sdpa arguments over the sequence's first `length` tokens: K and V views that give
 * the shape only (the kernel reads the blocks). */
static eng_sdpa_args cache_args(const eng_kv_seq *seq, const eng_sdpa_args *args, int64_t length)
{
    static float shape_only; /* a non-NULL data pointer that is never read */
    eng_sdpa_args a = *args;
    const eng_kv_shape *s = &seq->shape;
    a.k = eng_view_contiguous(&shape_only, 1, s->num_kv_heads, length, s->head_dim);
    a.v = eng_view_contiguous(&shape_only, 1, s->num_kv_heads, length, s->value_head_dim);
    return a;
}

static eng_status check_step(const eng_kv_seq *seq, const eng_sdpa_args *args, int64_t length,
                             eng_error *err)
{
    if (args->k.data || args->v.data)
        return eng__fail(err, ENG_EINVAL, args->k.data ? "k" : "v",
                         "k and v come from the session: leave them unset");
    if (args->additive_w_q || args->additive_w_k || args->additive_v)
        return eng__fail(err, ENG_EINVAL, "additive",
                         "attention over a session takes dot-product scoring");
    if (length == 0)
        return eng__fail(err, ENG_EINVAL, "q", "the session holds no tokens to attend to");
    eng_sdpa_args a = cache_args(seq, args, length);
    return eng__sdpa_validate(&a, err);
}

static eng__kv_paged paged_of(const eng_kv_seq *seq)
{
    eng__kv_paged kv = {
        .dtype = seq->shape.dtype, .block_tokens = seq->pool->block_tokens, .blocks = seq->blocks};
    return kv;
}

eng_status eng_kv_attend(eng_pool *pool, const eng_kv_seq *seq, const eng_sdpa_args *args,
                         eng_ctl *ctl, eng_error *err)
{
    if (!pool || !seq || !args)
        return eng__fail(err, ENG_EINVAL, "", "no pool, sequence or arguments");
    eng_status st = check_step(seq, args, seq->length, err);
    if (st != ENG_OK)
        return st;
    eng_sdpa_args a = cache_args(seq, args, seq->length);
    eng__kv_paged kv = paged_of(seq);
    return eng__sdpa_paged(pool, &a, &kv, ctl, err);
}

size_t eng_kv_attend_scratch_bytes(const eng_kv_seq *seq, const eng_sdpa_args *args,
                                   int64_t new_tokens, int threads)
{
    eng_sdpa_args a = cache_args(seq, args, seq->length + new_tokens);
    eng__kv_paged kv = paged_of(seq);
    return eng__sdpa_paged_scratch_bytes(&a, &kv, threads);
}

eng_status eng_kv_step(eng_pool *pool, eng_kv_seq *seq, const eng_kv_rows *k, const eng_kv_rows *v,
                       const eng_sdpa_args *args, eng_ctl *ctl, eng_error *err)
{
    if (!pool || !seq || (!k && !args))
        return eng__fail(err, ENG_EINVAL, "", "a step needs a pool, a sequence, and k/v or q");
    if (!k != !v)
        return eng__fail(err, ENG_EINVAL, k ? "v" : "k", "k and v come together");
    const int64_t before = seq->length;
    eng_status st;
    /* The rows, then the query against the length after the append, are checked before
     * anything changes. */
    if (k && args) {
        if ((st = check_append(seq, k, v, err)) != ENG_OK)
            return st;
        if (k->ne[2] > INT64_MAX / 2 - before)
            return eng__fail(err, ENG_ETOOBIG, "k", "the sequence would be too long");
        if ((st = check_step(seq, args, before + k->ne[2], err)) != ENG_OK)
            return st;
    }
    if (k && (st = eng_kv_seq_append(seq, k, v, err)) != ENG_OK)
        return st;
    if (!args)
        return ENG_OK;
    st = eng_kv_attend(pool, seq, args, ctl, err);
    if (st != ENG_OK && k)
        eng_kv_seq_truncate(seq, before, NULL); /* cannot fail: before <= length */
    return st;
}
