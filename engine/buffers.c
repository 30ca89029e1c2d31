/*
 * buffers.c - big buffers that keep their pages between requests.
 *
 * A request of a long sequence allocates tens of megabytes (its body, its decoded tensors, its
 * output) and frees them a second later. Fresh memory is not free: every 4 KiB page faults on
 * first touch, which on a virtual machine costs about as much as the HTTP transfer of the same
 * bytes (`make bench`'s e2e lines). So freed buffers of 1 MiB and more stay mapped in
 * a small cache, up to a limit the embedder sets (0, the default, keeps nothing), and the next
 * request of a similar size takes one over with its pages already present. Buffers nobody asked
 * for in a while are given back (eng_buf_trim), so an idle process returns to its small size.
 *
 * Each buffer is preceded by a 64-byte header (its mapping length and kind), so eng_buf_free
 * needs no size, and the data stays 64-byte aligned for the kernels.
 */
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "engine/internal.h"

/* Under AddressSanitizer, mapped buffers are poisoned while cached and beyond what was asked
 * for, so a use after free or an overflow is still reported as it would be for malloc. */
#if defined(__SANITIZE_ADDRESS__)
#define ATTND_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ATTND_ASAN 1
#endif
#endif
#ifdef ATTND_ASAN
#include <sanitizer/asan_interface.h>
#define POISON(p, n)   ASAN_POISON_MEMORY_REGION(p, n)
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define POISON(p, n)   ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#define HEADER 64
#define BIG    ((size_t)1 << 20) /* smaller requests come from malloc */
#define GRAIN  ((size_t)1 << 20) /* mappings are whole MiBs, so near sizes share buffers */
#define SLOTS  16
/* A cached buffer serves a request of at least this fraction of its size: a 1 GiB buffer
 * should not go to a 1 MiB request while a 1 GiB one may follow. */
#define FIT_RATIO 2

enum { KIND_HEAP = 1, KIND_MAPPED = 2 };

typedef struct {
    size_t length; /* of the allocation, header included */
    int kind;
} buf_header;

typedef struct {
    void *base;
    size_t length;
    int64_t freed_ns;
} slot;

static struct {
    pthread_mutex_t mu;
    slot slots[SLOTS];
    int n;
    size_t cached, limit;
} cache = {.mu = PTHREAD_MUTEX_INITIALIZER};

_Static_assert(sizeof(buf_header) <= HEADER, "the header fits in front of the data");

static void *data_of(void *base)
{
    return (char *)base + HEADER;
}

static buf_header *header_of(void *data)
{
    return (buf_header *)((char *)data - HEADER);
}

/* Unpoisons first: the addresses may come back from another mmap (OpenBLAS's, say). */
static void unmap(void *base, size_t length)
{
    UNPOISON(base, length);
    munmap(base, length);
}

/* Takes the smallest cached buffer of at least `length` bytes that fits well; NULL if none. */
static void *take_cached(size_t length, size_t *got)
{
    int best = -1;
    pthread_mutex_lock(&cache.mu);
    for (int i = 0; i < cache.n; i++) {
        size_t l = cache.slots[i].length;
        if (l >= length && l / FIT_RATIO <= length && (best < 0 || l < cache.slots[best].length))
            best = i;
    }
    void *base = NULL;
    if (best >= 0) {
        base = cache.slots[best].base;
        *got = cache.slots[best].length;
        cache.cached -= *got;
        cache.slots[best] = cache.slots[--cache.n];
    }
    pthread_mutex_unlock(&cache.mu);
    return base;
}

/* Unmaps everything cached; true if anything was. For when a mapping fails. */
static bool drop_cache(void)
{
    slot dropped[SLOTS];
    int n;
    pthread_mutex_lock(&cache.mu);
    n = cache.n;
    for (int i = 0; i < n; i++)
        dropped[i] = cache.slots[i];
    cache.n = 0;
    cache.cached = 0;
    pthread_mutex_unlock(&cache.mu);
    for (int i = 0; i < n; i++)
        unmap(dropped[i].base, dropped[i].length);
    return n > 0;
}

static void *map_new(size_t length)
{
    void *base = mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED && drop_cache())
        base = mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED)
        return NULL;
    POISON(base, length);
    return base;
}

void *eng_buf_alloc(size_t bytes)
{
    if (bytes > SIZE_MAX - HEADER - GRAIN)
        return NULL;
    if (bytes < BIG) {
        void *base = aligned_alloc(HEADER, (bytes + HEADER + HEADER - 1) / HEADER * HEADER);
        if (!base)
            return NULL;
        *(buf_header *)base = (buf_header){.length = bytes + HEADER, .kind = KIND_HEAP};
        return data_of(base);
    }
    size_t length = (bytes + HEADER + GRAIN - 1) / GRAIN * GRAIN, got = length;
    void *base = take_cached(length, &got);
    if (!base)
        base = map_new(length);
    if (!base)
        return NULL;
    UNPOISON(base, HEADER + bytes);
    *(buf_header *)base = (buf_header){.length = got, .kind = KIND_MAPPED};
    return data_of(base);
}

/* Makes room for one more slot and `length` more bytes by evicting the longest unused buffers;
 * cache.mu held. The evicted ones are listed in `out` for the caller to unmap unlocked. */
static int evict_for(size_t length, slot *out)
{
    int n = 0;
    while (cache.n > 0 && (cache.n == SLOTS || cache.cached + length > cache.limit)) {
        int oldest = 0;
        for (int i = 1; i < cache.n; i++)
            if (cache.slots[i].freed_ns < cache.slots[oldest].freed_ns)
                oldest = i;
        out[n++] = cache.slots[oldest];
        cache.cached -= cache.slots[oldest].length;
        cache.slots[oldest] = cache.slots[--cache.n];
    }
    return n;
}

void eng_buf_free(void *data)
{
    if (!data)
        return;
    buf_header *h = header_of(data);
    if (h->kind == KIND_HEAP) {
        free(h);
        return;
    }
    slot evicted[SLOTS];
    int n_evicted = 0;
    void *base = h;
    size_t length = h->length;
    POISON(data, length - HEADER);
    pthread_mutex_lock(&cache.mu);
    if (length <= cache.limit) {
        n_evicted = evict_for(length, evicted);
        cache.slots[cache.n++] = (slot){.base = base, .length = length, .freed_ns = eng_now_ns()};
        cache.cached += length;
        base = NULL;
    }
    pthread_mutex_unlock(&cache.mu);
    for (int i = 0; i < n_evicted; i++)
        unmap(evicted[i].base, evicted[i].length);
    if (base)
        unmap(base, length);
}

void eng_buf_cache_limit(size_t bytes)
{
    slot evicted[SLOTS];
    int n;
    pthread_mutex_lock(&cache.mu);
    cache.limit = bytes;
    n = evict_for(0, evicted);
    pthread_mutex_unlock(&cache.mu);
    for (int i = 0; i < n; i++)
        unmap(evicted[i].base, evicted[i].length);
}

size_t eng_buf_trim(int64_t idle_ns)
{
    slot released[SLOTS];
    int n = 0;
    size_t bytes = 0;
    int64_t now = eng_now_ns();
    pthread_mutex_lock(&cache.mu);
    for (int i = 0; i < cache.n;) {
        if (now - cache.slots[i].freed_ns >= idle_ns) {
            released[n++] = cache.slots[i];
            cache.cached -= cache.slots[i].length;
            cache.slots[i] = cache.slots[--cache.n];
        } else {
            i++;
        }
    }
    pthread_mutex_unlock(&cache.mu);
    for (int i = 0; i < n; i++) {
        unmap(released[i].base, released[i].length);
        bytes += released[i].length;
    }
    return bytes;
}

size_t eng_buf_cached(void)
{
    pthread_mutex_lock(&cache.mu);
    size_t bytes = cache.cached;
    pthread_mutex_unlock(&cache.mu);
    return bytes;
}
