/*
 * batch.h - lanes of waiting work that run in groups (batch.c): dynamic batching's queue. Work
 * items with the same key wait in one lane. Adding an item to a lane nobody drains hands the
 * lane to an engine worker (one pool task), which takes what waits (at most `max_items`), runs
 * the group with the batcher's function, and goes on with what queued meanwhile until the lane
 * is empty. So an idle lane adds no delay but the hand-off (its first item runs at once, a group
 * of one), and a busy one forms its next group of what arrived during the group before. Items
 * enter their lane where the scheduler starts them, not from the pool's queue, so a group is
 * everything started meanwhile. Keys are opaque (job.c: the layer a request runs, api_batch_key).
 *
 *     srv_batcher *b = srv__batcher_new(64, pool, run_group, ctx);
 *     item->key = key;
 *     if (!srv__batcher_add(b, item, pool_priority))
 *         run it alone;           // no memory for a new lane
 *     // run_group(ctx, items, n) is called on a worker with item among the items of a group
 *     srv__batcher_free(b);       // after the pool: every lane drained
 *
 * Any thread; one mutex inside, never held while a group runs.
 */
#ifndef ATTND_SERVER_BATCH_H
#define ATTND_SERVER_BATCH_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/engine.h"

/* A work item, embedded in its owner; the batcher links it while it waits. */
typedef struct srv_batch_item {
    uint64_t key;      /* nonzero */
    uint32_t priority; /* set by srv__batcher_add */
    struct srv_batch_item *next;
} srv_batch_item;

/* Runs items[0..n) (n >= 1) as one group; the items are the function's from then on. */
typedef void (*srv_batch_fn)(void *ctx, srv_batch_item **items, int n);

typedef struct srv_batcher srv_batcher;

/* NULL when out of memory; max_items from 1 up. The lanes are drained on `pool`. */
srv_batcher *srv__batcher_new(int max_items, eng_pool *pool, srv_batch_fn run, void *ctx);
void srv__batcher_free(srv_batcher *b);

/* Queues `item` in its key's lane, behind the items of its pool priority or a more urgent one
 * (lower), ahead of the others, and hands the lane to the pool at `pool_priority` unless a
 * worker drains it already (a stopping pool: this thread drains it). False, with nothing
 * queued, when memory for a new lane ran out. */
bool srv__batcher_add(srv_batcher *b, srv_batch_item *item, uint32_t pool_priority);

#endif
