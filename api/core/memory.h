/*
 * memory.h - sizes and aligned buffers: the allocation rules every tier of api/ shares.
 *
 * Sizes come from request data, so every sum and product of them is checked. Two flavours: a
 * sum that must be exact (what is reserved and allocated) says when it overflowed; an upper
 * bound (of a reply's text) saturates at SIZE_MAX, which no budget admits, so "too big" needs
 * no separate path.
 */
#ifndef ATTND_API_CORE_MEMORY_H
#define ATTND_API_CORE_MEMORY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* *acc += n; false when the sum overflows (*acc is then meaningless). */
static inline bool api__size_add(size_t *acc, size_t n)
{
    return !__builtin_add_overflow(*acc, n, acc);
}

/* a + b, or SIZE_MAX when that overflows. */
static inline size_t api__size_add_sat(size_t a, size_t b)
{
    return a > SIZE_MAX - b ? SIZE_MAX : a + b;
}

/* a * b, or SIZE_MAX when that overflows. */
static inline size_t api__size_mul_sat(size_t a, size_t b)
{
    size_t r;
    return __builtin_mul_overflow(a, b, &r) ? SIZE_MAX : r;
}

/* Bytes of a 64-byte-aligned allocation of n bytes (n rounded up), or 0 on overflow. */
size_t api__aligned_size(size_t n);

/* A 64-byte-aligned buffer of n > 0 bytes (free with free()); NULL when out of memory. */
void *api__aligned_alloc(size_t n);

#endif
