/*
 * pool.c - the engine's one pool of workers.
 *
 * A job is a function run over indices 0..count-1. Jobs wait in one queue ordered by priority,
 * then ticket: every request gets the next ticket when it enters the pool (with the priority it
 * was submitted at, eng_pool_submit_at), and a job started from inside a task inherits the
 * priority and ticket of the task's job. Workers always take the next index of the first job,
 * so the pool serves the most urgent requests first and, within a priority, first come, first
 * served; a request's own sub-jobs run before anything of its priority that arrived after it.
 * The priority is strict: there is no ageing of waiting jobs, because the daemon gives every
 * request a deadline, which ends a starved request's wait (504) as Triton's priority queue
 * policy timeouts do; ageing would make a level's meaning depend on the load. A thread that waits
 * in eng_pool_run runs indices of its own job meanwhile, which is what makes nested jobs
 * deadlock-free: even with every worker blocked in a nested call, each caller can finish its own
 * job alone. Before each of its own indices it takes one of a more urgent job at the head of the
 * queue, if there is one, so that urgent work does not wait for a worker while the pool's
 * threads are all busy with a less urgent request. An optional spare thread
 * (eng_pool_add_spare) takes the head job while every worker is busy with less urgent work.
 * The jobs that tasks of background jobs start (eng_pool_set_background) run at SCHED_IDLE, so
 * that the threads that wake for other work need not wait for a scheduler tick to get a CPU.
 */
#include <cblas.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/internal.h"

typedef struct job {
    eng_task_fn fn;
    void *arg;
    eng_ctl *ctl;
    uint32_t priority; /* lower first */
    uint64_t ticket;
    int64_t count;
    int64_t next;     /* next index to hand out */
    int64_t finished; /* indices run or skipped */
    eng_status status;
    bool detached; /* from eng_pool_submit: the worker that finishes it frees it */
    bool nested;   /* started by a task of another job, whose ticket and priority it keeps */
    struct job *link;
} job;

struct eng_pool {
    pthread_mutex_t mu;
    pthread_cond_t work; /* a job was queued, or the pool is stopping */
    pthread_cond_t done; /* some waited-for job finished */
    job *head;
    int64_t pending; /* indices queued and not yet handed out */
    uint64_t last_ticket;
    bool stopping;
    int threads;
    pthread_t *workers;
    /* What each worker runs: the priority of the job of its current task, or IDLE. */
    uint32_t *running;
    int idle; /* workers waiting for work */
    bool has_spare;
    pthread_cond_t spare_wake; /* the spare may have work, or the pool is stopping */
    pthread_t spare;
    bool (*is_background)(uint32_t priority); /* NULL: no background work */
};

#define IDLE UINT32_MAX

/* The ticket and priority of the job whose task this thread is running; ticket 0 outside any
 * task. */
static _Thread_local uint64_t current_ticket;
static _Thread_local uint32_t current_priority;
/* The scheduling policy this thread runs at: SCHED_OTHER, or SCHED_IDLE in background work. */
static _Thread_local int current_policy = SCHED_OTHER;

/* ---- Background work ------------------------------------------------------------------------ */

static void use_policy(int policy)
{
    struct sched_param none = {.sched_priority = 0};
    if (policy != current_policy && pthread_setschedparam(pthread_self(), policy, &none) == 0)
        current_policy = policy;
}

/* Whether `j` runs at SCHED_IDLE: a job that a background job's task started (its fan-out). A
 * submitted task itself (a request's decoding and encoding, on one thread) keeps its policy:
 * at SCHED_IDLE any other runnable thread held it up, for up to five times its time. */
static bool runs_in_background(const eng_pool *pool, const job *j)
{
    return j->nested && pool->is_background(j->priority);
}

/* Whether a thread may enter SCHED_IDLE and leave it again, tried on a thread of its own: the
 * kernel refuses the way back without CAP_SYS_NICE or RLIMIT_NICE >= 20, and a thread left at
 * SCHED_IDLE would starve. */
static void *try_idle_and_back(void *arg)
{
    struct sched_param none = {.sched_priority = 0};
    int *rc = arg;
    *rc = pthread_setschedparam(pthread_self(), SCHED_IDLE, &none);
    if (*rc == 0)
        *rc = pthread_setschedparam(pthread_self(), SCHED_OTHER, &none);
    return NULL;
}

/* ---- Queue (callers hold pool->mu) ---------------------------------------------------------- */

/* True when the head job is more urgent than every task the workers are running and none of
 * them is free to take it: the spare's turn. */
static bool spare_has_work(const eng_pool *pool)
{
    if (!pool->has_spare || !pool->head || pool->idle > 0)
        return false;
    for (int w = 0; w < pool->threads; w++)
        if (pool->running[w] <= pool->head->priority)
            return false;
    return true;
}

static void queue_insert(eng_pool *pool, job *j)
{
    /* Behind every job of a more urgent priority, and of the same priority with the same or an
     * earlier ticket. New requests go to the tail of their priority; a nested job usually lands
     * right behind its own request's jobs. */
    job **at = &pool->head;
    while (*at && ((*at)->priority < j->priority ||
                   ((*at)->priority == j->priority && (*at)->ticket <= j->ticket)))
        at = &(*at)->link;
    j->link = *at;
    *at = j;
    pool->pending += j->count;
    if (spare_has_work(pool))
        pthread_cond_signal(&pool->spare_wake);
}

static void queue_remove(eng_pool *pool, job *j)
{
    job **at = &pool->head;
    while (*at && *at != j)
        at = &(*at)->link;
    if (*at)
        *at = j->link;
    j->link = NULL;
}

/* Hands out the next index of `j`, or -1 when there is none. Once the job's control block says
 * stop, the indices not yet handed out are skipped and counted as finished at once. */
static int64_t job_claim(eng_pool *pool, job *j)
{
    if (j->next >= j->count)
        return -1;
    eng_status st = eng_ctl_check(j->ctl);
    if (st != ENG_OK) {
        int64_t skipped = j->count - j->next;
        if (j->status == ENG_OK)
            j->status = st;
        pool->pending -= skipped;
        j->finished += skipped;
        j->next = j->count;
        queue_remove(pool, j);
        return -1;
    }
    int64_t index = j->next++;
    pool->pending--;
    if (j->next == j->count)
        queue_remove(pool, j);
    return index;
}

/* Runs one index of `j` with the lock released, then records it. Returns true when that
 * finished the job. */
static bool job_run_one(eng_pool *pool, job *j, int64_t index)
{
    pthread_mutex_unlock(&pool->mu);
    uint64_t outer = current_ticket;
    uint32_t outer_priority = current_priority;
    int outer_policy = current_policy;
    current_ticket = j->ticket;
    current_priority = j->priority;
    if (pool->is_background)
        use_policy(runs_in_background(pool, j) ? SCHED_IDLE : SCHED_OTHER);
    j->fn(j->arg, index);
    if (pool->is_background)
        use_policy(outer_policy);
    current_ticket = outer;
    current_priority = outer_priority;
    pthread_mutex_lock(&pool->mu);
    j->finished++;
    return j->finished == j->count;
}

static void job_complete(eng_pool *pool, job *j)
{
    if (j->detached)
        free(j);
    else
        pthread_cond_broadcast(&pool->done);
}

/* Runs one index of the job at the head of the queue when it is more urgent than `own` (a
 * request of a better priority, or its fan-out), so that a thread helping with a long job does
 * not leave a short urgent one waiting for a worker. True when it ran or skipped one. */
static bool run_urgent(eng_pool *pool, job *own)
{
    job *u = pool->head;
    if (!u || u == own || u->priority >= own->priority)
        return false;
    int64_t index = job_claim(pool, u);
    if (index < 0) {
        if (u->finished == u->count)
            job_complete(pool, u);
        return true;
    }
    if (job_run_one(pool, u, index))
        job_complete(pool, u);
    return true;
}

/* ---- Workers -------------------------------------------------------------------------------- */

/* Takes the next index of the head job and runs it (or finds the job stopped), completing the
 * job when that was its last index. `slot` is the worker's entry in running[], or NULL. */
static void run_head(eng_pool *pool, uint32_t *slot)
{
    job *j = pool->head;
    int64_t index = job_claim(pool, j);
    if (index < 0) {
        /* Skipped to the end because its request stopped. */
        if (j->finished == j->count)
            job_complete(pool, j);
        return;
    }
    if (slot)
        *slot = j->priority;
    if (job_run_one(pool, j, index))
        job_complete(pool, j);
}

typedef struct {
    eng_pool *pool;
    int index;
} worker_arg;

static void *worker_main(void *arg)
{
    eng_pool *pool = ((worker_arg *)arg)->pool;
    int w = ((worker_arg *)arg)->index;
    free(arg);
    pthread_mutex_lock(&pool->mu);
    uint32_t *slot = &pool->running[w];
    for (;;) {
        if (!pool->head && !pool->stopping) {
            *slot = IDLE;
            pool->idle++;
            while (!pool->head && !pool->stopping)
                pthread_cond_wait(&pool->work, &pool->mu);
            pool->idle--;
        }
        if (!pool->head)
            break; /* stopping, and the queue is empty */
        run_head(pool, slot);
    }
    *slot = IDLE;
    pthread_mutex_unlock(&pool->mu);
    return NULL;
}

/* The spare: runs head jobs only while spare_has_work, so it never competes with the workers
 * for work they are free to take. It leaves the queue to the workers when the pool stops. */
static void *spare_main(void *arg)
{
    eng_pool *pool = arg;
    pthread_mutex_lock(&pool->mu);
    for (;;) {
        while (!pool->stopping && !spare_has_work(pool))
            pthread_cond_wait(&pool->spare_wake, &pool->mu);
        if (pool->stopping)
            break;
        run_head(pool, NULL);
    }
    pthread_mutex_unlock(&pool->mu);
    return NULL;
}

static bool start_worker(eng_pool *pool, int index)
{
    worker_arg *a = malloc(sizeof *a);
    if (!a)
        return false;
    *a = (worker_arg){pool, index};
    if (pthread_create(&pool->workers[index], NULL, worker_main, a) != 0) {
        free(a);
        return false;
    }
    return true;
}

eng_pool *eng_pool_new(int threads, eng_error *err)
{
    if (threads < 0 || threads > 1024) {
        eng__fail(err, ENG_EINVAL, "threads", "threads = %d must be in [0, 1024]", threads);
        return NULL;
    }
    if (threads == 0)
        threads = eng_cpu_count();
    /* The pool supplies the parallelism; a multi-threaded BLAS inside each worker would
     * oversubscribe the cores. */
    openblas_set_num_threads(1);

    eng_pool *pool = calloc(1, sizeof *pool);
    pthread_t *workers = calloc((size_t)threads, sizeof *workers);
    uint32_t *running = malloc((size_t)threads * sizeof *running);
    if (!pool || !workers || !running) {
        free(pool);
        free(workers);
        free(running);
        eng__fail(err, ENG_ENOMEM, "threads", "cannot allocate a pool of %d threads", threads);
        return NULL;
    }
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->work, NULL);
    pthread_cond_init(&pool->done, NULL);
    pthread_cond_init(&pool->spare_wake, NULL);
    pool->workers = workers;
    pool->running = running;
    /* Busy until each worker reaches its loop, so the spare does not start early. */
    for (int i = 0; i < threads; i++)
        running[i] = 0;
    for (int i = 0; i < threads; i++) {
        if (!start_worker(pool, i)) {
            pthread_mutex_lock(&pool->mu);
            pool->threads = i;
            pthread_mutex_unlock(&pool->mu);
            eng_pool_free(pool);
            eng__fail(err, ENG_ENOMEM, "threads", "cannot start worker %d", i);
            return NULL;
        }
    }
    pthread_mutex_lock(&pool->mu);
    pool->threads = threads;
    pthread_mutex_unlock(&pool->mu);
    return pool;
}

eng_status eng_pool_add_spare(eng_pool *pool, eng_error *err)
{
    /* Under the lock, so that concurrent calls start one spare (which then waits for the lock). */
    pthread_mutex_lock(&pool->mu);
    if (!pool->has_spare) {
        int rc = pthread_create(&pool->spare, NULL, spare_main, pool);
        if (rc != 0) {
            pthread_mutex_unlock(&pool->mu);
            return eng__fail(err, ENG_ENOMEM, "spare", "cannot start the spare thread: %s",
                             strerror(rc));
        }
        pool->has_spare = true;
    }
    pthread_mutex_unlock(&pool->mu);
    return ENG_OK;
}

void eng_pool_free(eng_pool *pool)
{
    if (!pool)
        return;
    pthread_mutex_lock(&pool->mu);
    pool->stopping = true;
    pthread_cond_broadcast(&pool->work);
    pthread_cond_broadcast(&pool->spare_wake);
    bool spare = pool->has_spare;
    pthread_mutex_unlock(&pool->mu);
    if (spare)
        pthread_join(pool->spare, NULL);
    for (int i = 0; i < pool->threads; i++)
        pthread_join(pool->workers[i], NULL);
    pthread_mutex_destroy(&pool->mu);
    pthread_cond_destroy(&pool->work);
    pthread_cond_destroy(&pool->done);
    pthread_cond_destroy(&pool->spare_wake);
    free(pool->running);
    free(pool->workers);
    free(pool);
}

bool eng_pool_set_background(eng_pool *pool, bool (*is_background)(uint32_t priority), char *why,
                             size_t why_len)
{
    pthread_t t;
    int rc = 0;
    if (pthread_create(&t, NULL, try_idle_and_back, &rc) != 0) {
        snprintf(why, why_len, "cannot start a thread to try SCHED_IDLE");
        return false;
    }
    pthread_join(t, NULL);
    if (rc != 0) {
        snprintf(why, why_len,
                 "a thread cannot leave SCHED_IDLE again (%s: needs CAP_SYS_NICE or "
                 "RLIMIT_NICE >= 20)",
                 strerror(rc));
        return false;
    }
    pthread_mutex_lock(&pool->mu);
    pool->is_background = is_background;
    pthread_mutex_unlock(&pool->mu);
    return true;
}

int eng_pool_threads(const eng_pool *pool)
{
    return pool->threads;
}

int64_t eng_pool_pending(eng_pool *pool)
{
    pthread_mutex_lock(&pool->mu);
    int64_t n = pool->pending;
    pthread_mutex_unlock(&pool->mu);
    return n;
}

/* ---- Jobs ----------------------------------------------------------------------------------- */

eng_status eng_pool_run(eng_pool *pool, eng_task_fn fn, void *arg, int64_t count, eng_ctl *ctl)
{
    eng_status st = eng_ctl_check(ctl);
    if (st != ENG_OK || count <= 0)
        return st;
    job j = {.fn = fn, .arg = arg, .ctl = ctl, .count = count};

    pthread_mutex_lock(&pool->mu);
    j.ticket = current_ticket ? current_ticket : ++pool->last_ticket;
    j.priority = current_ticket ? current_priority : 0;
    j.nested = current_ticket != 0;
    queue_insert(pool, &j);
    if (count > 1)
        pthread_cond_broadcast(&pool->work);
    /* Help with our own job, and first with any more urgent job at the head of the queue; the
     * workers take the rest. */
    for (;;) {
        if (run_urgent(pool, &j))
            continue;
        int64_t index = job_claim(pool, &j);
        if (index < 0)
            break;
        job_run_one(pool, &j, index);
    }
    while (j.finished < j.count)
        pthread_cond_wait(&pool->done, &pool->mu);
    st = j.status;
    pthread_mutex_unlock(&pool->mu);
    /* A task may have stopped early on the control block after the last index was claimed. */
    if (st == ENG_OK)
        st = eng_ctl_check(ctl);
    return st;
}

eng_status eng_pool_submit(eng_pool *pool, eng_task_fn fn, void *arg)
{
    return eng_pool_submit_at(pool, 0, fn, arg);
}

eng_status eng_pool_submit_at(eng_pool *pool, uint32_t priority, eng_task_fn fn, void *arg)
{
    job *j = calloc(1, sizeof *j);
    if (!j)
        return ENG_ENOMEM;
    j->fn = fn;
    j->arg = arg;
    j->priority = priority;
    j->count = 1;
    j->detached = true;
    pthread_mutex_lock(&pool->mu);
    j->ticket = ++pool->last_ticket;
    queue_insert(pool, j);
    pthread_cond_signal(&pool->work);
    pthread_mutex_unlock(&pool->mu);
    return ENG_OK;
}

/* ---- CPUs ----------------------------------------------------------------------------------- */

/* The cgroup CPU quota in whole CPUs (rounded up), or 0 when there is none. */
static int cgroup_cpu_quota(void)
{
    long long quota = -1, period = 0;
    FILE *f = fopen("/sys/fs/cgroup/cpu.max", "r"); /* cgroup v2: "max 100000" or "Q P" */
    if (f) {
        char q[32] = "";
        if (fscanf(f, "%31s %lld", q, &period) == 2 && strcmp(q, "max") != 0) {
            char *end;
            errno = 0;
            quota = strtoll(q, &end, 10);
            if (errno || *end)
                quota = -1;
        }
        fclose(f);
    } else {
        f = fopen("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "r"); /* cgroup v1 */
        if (f) {
            if (fscanf(f, "%lld", &quota) != 1)
                quota = -1;
            fclose(f);
        }
        f = fopen("/sys/fs/cgroup/cpu/cpu.cfs_period_us", "r");
        if (f) {
            if (fscanf(f, "%lld", &period) != 1)
                period = 0;
            fclose(f);
        }
    }
    if (quota <= 0 || period <= 0)
        return 0;
    long long cpus = (quota + period - 1) / period;
    return cpus > 1024 ? 1024 : (int)cpus;
}

int eng_cpu_count(void)
{
    int n = 1;
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        n = CPU_COUNT(&set);
    int quota = cgroup_cpu_quota();
    if (quota > 0 && quota < n)
        n = quota;
    return n > 0 ? n : 1;
}
