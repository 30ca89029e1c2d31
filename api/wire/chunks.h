/*
 * chunks.h - a tensor's decoding or encoding split into tasks of the engine's pool when it is
 * large, and left to the calling thread when it is small: the one place where the wire's codecs
 * decide to go parallel.
 *
 *     if (api__chunks_run(pool, count, 1 << 18, check_range, &job))
 *         return 0;                                   // every piece done, none failed
 *     return check_all(..., err);                     // small, or an error: one thread, in order
 *
 * A codec's pieces write disjoint parts of their output and report an error only as false,
 * never with a message: which piece fails first depends on the schedule, so a codec whose
 * pieces fail runs again on one thread, which finds the first error and says it exactly as it
 * does for a small tensor. Any thread, a pool worker included.
 */
#ifndef ATTND_API_WIRE_CHUNKS_H
#define ATTND_API_WIRE_CHUNKS_H

#include <stdbool.h>
#include <stddef.h>

#include "engine/engine.h"

/* Work on units [from, to) of a codec's input; false when it found an error. */
typedef bool (*api__chunk_fn)(void *ctx, size_t from, size_t to);

/* Calls fn over [0, n) in pieces of `grain` units (each starts at a multiple of grain, the last
 * may be shorter), each a task of `pool`, and returns true when every piece returned true. Does
 * nothing and returns false when the caller must do the work itself: no pool, n within one
 * grain (a small tensor costs no task), a piece that returned false, or a pool that could not
 * run them. */
bool api__chunks_run(eng_pool *pool, size_t n, size_t grain, api__chunk_fn fn, void *ctx);

#endif
