/*
 * batch.c - dynamic batching's lanes (batch.h). Few keys are busy at once (one per layer being
 * stepped), so lanes are a short list, each freed when its drainer finds it empty.
 */
#include <pthread.h>
#include <stdlib.h>

#include "server/batch.h"

typedef struct lane {
    srv_batcher *b;
    uint64_t key;
    srv_batch_item *head; /* by priority, then arrival */
    struct lane *next;
} lane;

struct srv_batcher {
    pthread_mutex_t mu;
    int max_items;
    eng_pool *pool;
    srv_batch_fn run;
    void *ctx;
    lane *lanes; /* the lanes being drained: each has exactly one drainer */
};

srv_batcher *srv__batcher_new(int max_items, eng_pool *pool, srv_batch_fn run, void *ctx)
{
    if (max_items < 1)
        return NULL;
    srv_batcher *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    pthread_mutex_init(&b->mu, NULL);
    b->max_items = max_items;
    b->pool = pool;
    b->run = run;
    b->ctx = ctx;
    return b;
}

void srv__batcher_free(srv_batcher *b)
{
    if (!b)
        return;
    pthread_mutex_destroy(&b->mu);
    free(b);
}

static lane *lane_find_locked(srv_batcher *b, uint64_t key)
{
    for (lane *l = b->lanes; l; l = l->next)
        if (l->key == key)
            return l;
    return NULL;
}

static void lane_unlink_locked(srv_batcher *b, lane *gone)
{
    for (lane **p = &b->lanes; *p; p = &(*p)->next)
        if (*p == gone) {
            *p = gone->next;
            return;
        }
}

/* Moves up to max of l's waiting items into group[]; their count. mu held. */
static int take_locked(lane *l, srv_batch_item **group, int max)
{
    int n = 0;
    while (l->head && n < max) {
        group[n++] = l->head;
        l->head = l->head->next;
    }
    return n;
}

/* A worker runs lane l's groups until it is empty, then frees it. */
static void drain(void *arg, int64_t index)
{
    lane *l = arg;
    srv_batcher *b = l->b;
    srv_batch_item **group = calloc((size_t)b->max_items, sizeof *group);
    int max = group ? b->max_items : 1;
    srv_batch_item *one;
    (void)index;
    pthread_mutex_lock(&b->mu);
    for (;;) {
        int n = take_locked(l, group ? group : &one, max);
        if (n == 0)
            break;
        pthread_mutex_unlock(&b->mu);
        b->run(b->ctx, group ? group : &one, n);
        pthread_mutex_lock(&b->mu);
    }
    lane_unlink_locked(b, l);
    pthread_mutex_unlock(&b->mu);
    free(group);
    free(l);
}

/* Puts item in l's queue by its priority, in arrival order within one. mu held. */
static void insert_locked(lane *l, srv_batch_item *item)
{
    srv_batch_item **at = &l->head;
    while (*at && (*at)->priority <= item->priority)
        at = &(*at)->next;
    item->next = *at;
    *at = item;
}

bool srv__batcher_add(srv_batcher *b, srv_batch_item *item, uint32_t pool_priority)
{
    item->next = NULL;
    item->priority = pool_priority;
    pthread_mutex_lock(&b->mu);
    lane *l = lane_find_locked(b, item->key);
    if (l) { /* its drainer takes it with the next group */
        insert_locked(l, item);
        pthread_mutex_unlock(&b->mu);
        return true;
    }
    l = calloc(1, sizeof *l);
    if (!l) {
        pthread_mutex_unlock(&b->mu);
        return false;
    }
    l->b = b;
    l->key = item->key;
    l->head = item;
    l->next = b->lanes;
    b->lanes = l;
    pthread_mutex_unlock(&b->mu);
    if (eng_pool_submit_at(b->pool, pool_priority, drain, l) != ENG_OK)
        drain(l, 0); /* the pool is stopping: drain here, in order */
    return true;
}
