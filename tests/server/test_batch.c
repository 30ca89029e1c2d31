/*
 * test_batch.c - server/batch.c, dynamic batching's lanes: an idle lane runs its first item at
 * once as a group of one; what arrives while a group runs forms the next groups, most urgent
 * priority first and in arrival order within one, at most max_items each; items of different
 * keys never share a group.
 */
#include <pthread.h>
#include <string.h>

#include "server/batch.h"
#include "tests/support/check.h"
#include "tests/support/util.h"

enum { MAX_GROUPS = 16, MAX_ITEMS = 8 };

/* The groups the batcher ran, in order; the first one waits until the test opens the gate. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool gate_open, first_running;
    int groups, sizes[MAX_GROUPS];
    char names[MAX_GROUPS][MAX_ITEMS];
} recorder;

typedef struct {
    srv_batch_item item; /* first */
    char name;
} work;

static void run_group(void *ctx, srv_batch_item **items, int n)
{
    recorder *r = ctx;
    pthread_mutex_lock(&r->mu);
    int g = r->groups++;
    r->sizes[g] = n;
    for (int i = 0; i < n && i < MAX_ITEMS; i++)
        r->names[g][i] = ((work *)items[i])->name;
    if (g == 0) {
        r->first_running = true;
        pthread_cond_broadcast(&r->cv);
        while (!r->gate_open)
            pthread_cond_wait(&r->cv, &r->mu);
    }
    pthread_mutex_unlock(&r->mu);
}

static void wait_first_running(recorder *r)
{
    pthread_mutex_lock(&r->mu);
    while (!r->first_running)
        pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
}

static void open_gate(recorder *r)
{
    pthread_mutex_lock(&r->mu);
    r->gate_open = true;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* The groups as text: "A|CE B|D" style, one '|' between groups. */
static void groups_text(recorder *r, char *out, size_t size)
{
    size_t at = 0;
    for (int g = 0; g < r->groups && at + MAX_ITEMS + 2 < size; g++) {
        if (g)
            out[at++] = '|';
        for (int i = 0; i < r->sizes[g]; i++)
            out[at++] = r->names[g][i];
    }
    out[at] = '\0';
}

static void test_what_waits_runs_by_priority_in_groups_of_max_items(void)
{
    eng_pool *pool;
    int status;
    if (test_engine_start(&pool, &status)) {
        CHECK_EQ_INT(status, 0);
        return;
    }
    recorder r = {.groups = 0};
    pthread_mutex_init(&r.mu, NULL);
    pthread_cond_init(&r.cv, NULL);
    srv_batcher *b = srv__batcher_new(3, pool, run_group, &r);
    work w[] = {{{.key = 7}, 'A'}, {{.key = 7}, 'B'}, {{.key = 7}, 'C'},
                {{.key = 7}, 'D'}, {{.key = 7}, 'E'}, {{.key = 9}, 'X'}};
    const uint32_t priority[] = {2, 2, 1, 2, 1, 2};
    CHECK(b != NULL);
    if (b) {
        CHECK(srv__batcher_add(b, &w[0].item, priority[0]));
        wait_first_running(&r); /* A alone: its lane was idle */
        for (int i = 1; i < 5; i++)
            CHECK(srv__batcher_add(b, &w[i].item, priority[i]));
        open_gate(&r);
        eng_pool_free(pool); /* runs what is queued, then stops */
        pool = NULL;
        char text[64];
        groups_text(&r, text, sizeof text);
        CHECKF(strcmp(text, "A|CEB|D") == 0, "groups %s, want A|CEB|D", text);
        srv__batcher_free(b);
    }
    if (pool)
        eng_pool_free(pool);

    /* Another key is another lane: X never shares A's group. */
    if (test_engine_start(&pool, &status)) {
        CHECK_EQ_INT(status, 0);
        return;
    }
    recorder r2 = {.gate_open = true};
    pthread_mutex_init(&r2.mu, NULL);
    pthread_cond_init(&r2.cv, NULL);
    b = srv__batcher_new(8, pool, run_group, &r2);
    w[0].item.key = 7;
    CHECK(b && srv__batcher_add(b, &w[0].item, 2) && srv__batcher_add(b, &w[5].item, 2));
    eng_pool_free(pool);
    for (int g = 0; g < r2.groups; g++)
        CHECKF(r2.sizes[g] == 1, "group %d holds %d items of two keys", g, r2.sizes[g]);
    CHECK_EQ_INT(r2.groups, 2);
    srv__batcher_free(b);
}

int main(void)
{
    RUN_WITHIN(test_what_waits_runs_by_priority_in_groups_of_max_items, 60);
    return check_report();
}
