/*
 * memory.c - aligned buffers for the engine's tensors.
 */
#include <stdint.h>
#include <stdlib.h>

#include "api/core/memory.h"

/* 64 bytes: a cache line, and what the engine's vector loads like. Not huge pages (2 MiB
 * alignment and MADV_HUGEPAGE): the compaction a first touch can set off costs a request more
 * than they save a warm process on large tensors. */
size_t api__aligned_size(size_t n)
{
    if (n > SIZE_MAX - 63)
        return 0;
    return (n + 63) & ~(size_t)63;
}

void *api__aligned_alloc(size_t n)
{
    size_t size = api__aligned_size(n);
    return size ? aligned_alloc(64, size) : NULL;
}
