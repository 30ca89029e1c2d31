/*
 * memory.h - sizes and aligned buffers: the allocation rules every tier of api/ shares.
 */
#ifndef ATTND_API_CORE_MEMORY_H
#define ATTND_API_CORE_MEMORY_H

#include <stddef.h>

/* Bytes of a 64-byte-aligned allocation of n bytes (n rounded up), or 0 on overflow. */
size_t api__aligned_size(size_t n);

/* A 64-byte-aligned buffer of n > 0 bytes (free with free()); NULL when out of memory. */
void *api__aligned_alloc(size_t n);

#endif
