/*
 * project.c - the layer's projections (project.h): one weight's product over the rows of every
 * part of a job, on the few-row products or the blocked ones, then RoPE, a decoder layer's
 * norms and the scatter into heads, part by part.
 */
#include <string.h>

#include "engine/layers/project.h"

/* Weight rows (output features) per task of the packing that precedes the projections when
 * several tasks share a weight: a multiple of every kernel set's NR, and small enough that
 * an E=512 layer's three weights make 12 tasks, which two workers share equally. */
#define PACK_ROWS 128

/* Output features per few-row task: at least this many (a multiple of every eng__gemv
 * variant's block of features), else enough for about FEW_TASKS_PER_THREAD tasks per thread,
 * so that tasks of uneven speed even out. */
#define FEW_FEATURES_MIN     16
#define FEW_TASKS_PER_THREAD 8

/* Weight rows (output features) widened per step of a 16-bit weight: the step's fp32 rows are
 * the product's B^T, and the micro-kernels sum each column of C alone, so the sums are those
 * of fp32 weights bit for bit (on the openblas set, multiply steps fp32 weights the same way).
 * A multiple of every kernel set's NR. */
#define WIDEN_ROWS 128

/* Floats of per-thread scratch a projection over a 16-bit weight of out_f x in_f needs for
 * its widened rows. */
static size_t widen_floats(int64_t out_f, int64_t in_f)
{
    return (size_t)((out_f < WIDEN_ROWS ? out_f : WIDEN_ROWS) * in_f);
}

/* count 16-bit values of `dtype` to fp32 (exact). */
static void widen16(eng_dtype dtype, const uint16_t *x, int64_t count, float *dst)
{
    for (int64_t i = 0; i < count; i++)
        dst[i] = dtype == ENG_DTYPE_F16 ? eng_f16_to_f32(x[i]) : eng_bf16_to_f32(x[i]);
}

/* Floats to the next cache line. */
static size_t align16(size_t floats)
{
    return (floats + 15) / 16 * 16;
}

/* Floats of the GEMM's packing space for job j: the set's, or the AMX path's rows of A. */
static size_t pack_floats(const eng__kernels *ks, bool amx, const linear_job *j)
{
    return amx ? (eng__amx_a_elems(j->in_f) + 1) / 2
               : eng__sgemm_pack_floats(ks, j->out_f, j->in_f);
}

/* Floats of per-thread scratch a task of `rows` rows of job j needs, in this order: the GEMM's
 * packing, the widened rows of a 16-bit weight (not on AMX tiles, which read its bits), the
 * staged product of a head-major job or of rows of several parts, and those rows' input
 * gathered into one block (`spans`). */
size_t eng__linear_task_floats(const eng__kernels *ks, bool amx, const linear_job *j, bool w16,
                               int64_t rows, bool spans)
{
    size_t floats = pack_floats(ks, amx, j);
    if (w16 && !amx)
        floats = align16(floats) + widen_floats(j->out_f, j->in_f);
    if (j->head_major || spans)
        floats = align16(floats) + (size_t)(rows * j->out_f);
    if (spans)
        floats = align16(floats) + (size_t)(rows * j->in_f);
    return floats;
}

/* The rows one task of a job multiplies: n rows of `in` (row stride the job's in_f) into
 * `out` (row stride its out_f), added to beta times what `out` holds. */
typedef struct {
    const float *in;
    int64_t n;
    float *out;
    float beta;
} task_rows;

/* out[n x out_f] = in W^T + beta out for job i, on the layer's panels or the weight packed
 * once for the call, or packing it into `pack`, or WIDEN_ROWS output features at a time: a
 * 16-bit weight without panels widened into `wide`, and any weight on the openblas set. */
static void multiply(const linear_batch *lb, int i, const task_rows *r, float *pack, float *wide)
{
    const linear_job *j = &lb->jobs[i];
    const float *in = r->in;
    const int64_t n = r->n, ld = j->out_f;
    const float beta = r->beta;
    float *out = r->out;
    if (lb->amx_packed[i]) {
        eng__amx_gemm t = {.m = n,
                           .n = j->out_f,
                           .k = j->in_f,
                           .alpha = 1.0f,
                           .beta = beta,
                           .a = in,
                           .lda = j->in_f,
                           .b = lb->amx_packed[i],
                           .c = out,
                           .ldc = ld};
        eng__amx_sgemm(lb->amx, &t, (uint16_t *)pack);
        return;
    }
    const float *packed = lb->panels[i] ? lb->panels[i] : lb->packed[i];
    eng__gemm g = {.m = n,
                   .n = j->out_f,
                   .k = j->in_f,
                   .alpha = 1.0f,
                   .beta = beta,
                   .a = in,
                   .lda = j->in_f,
                   .b = j->w,
                   .ldb = j->in_f,
                   .b_trans = true,
                   .c = out,
                   .ldc = ld,
                   .b_packed = packed,
                   .b_panel_stride = j->in_f * lb->ks->nr,
                   .b_round_bf16 = lb->bf16 && !packed};
    /* The micro-kernels sum each column of C alone, whatever the product's width, so one
     * product on panels gives the bits of WIDEN_ROWS-wide ones; cblas_sgemm may not (OpenBLAS
     * 0.3.21's Haswell kernel gave a 160-column product other bits than 128 + 32 columns), so
     * on the openblas set an fp32 weight goes in the steps a 16-bit one does, and layers of
     * either make the same calls. */
    if ((!lb->w16[i] || packed) && lb->ks->tile) {
        eng__sgemm(lb->ks, &g, pack);
        return;
    }
    for (int64_t f0 = 0; f0 < j->out_f; f0 += WIDEN_ROWS) {
        int64_t nf = j->out_f - f0 < WIDEN_ROWS ? j->out_f - f0 : WIDEN_ROWS;
        const float *w = j->w + f0 * j->in_f;
        if (lb->w16[i]) {
            widen16(lb->w16_dtype, lb->w16[i] + f0 * j->in_f, nf * j->in_f, wide);
            w = wide;
        }
        g.n = nf;
        g.b = w;
        g.c = out + f0;
        g.b_packed = NULL;
        g.b_round_bf16 = lb->bf16;
        eng__sgemm(lb->ks, &g, pack);
    }
}

/* The part of job j that holds row r of the job. */
static const linear_part *part_at(const linear_job *j, int64_t r)
{
    int64_t lo = 0, hi = j->nparts - 1;
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (j->parts[mid].first <= r)
            lo = mid;
        else
            hi = mid - 1;
    }
    return &j->parts[lo];
}

/* What follows the product of n rows of part p from its row t0 on, staged at `rows` (row
 * stride out_f): RoPE and a decoder layer's norms at their positions, then a head-major job's
 * scatter into heads or a plain job's copy into the part's rows. */
static void finish_part(const linear_batch *lb, const linear_job *j, const linear_part *p,
                        float *rows, int64_t n, int64_t t0)
{
    const int64_t D = lb->head_dim, ld = j->out_f;
    if (p->rope)
        eng_rope_apply(rows, n, ld, j->rope_heads, D, p->pos0 + t0,
                       p->a->rope_base > 0.0f ? p->a->rope_base : 10000.0f, p->a->rope_style);
    if (j->qk)
        eng__decoder_project(lb->layer, j->qk == DECODER_QUERY, rows, n, ld, p->pos0 + t0);
    if (!j->head_major) {
        memcpy(p->out + t0 * ld, rows, (size_t)(n * ld) * sizeof(float));
        return;
    }
    for (int64_t g = 0; g < j->out_f / D; g++) {
        float *dst = p->out + g * p->out_hstride + t0 * D;
        for (int64_t t = 0; t < n; t++)
            memcpy(dst + t * D, rows + t * ld + g * D, (size_t)D * sizeof(float));
    }
}

/* Rows [r0, r0 + n) of job j, staged at `rows`, finished part by part. */
static void finish_rows(const linear_batch *lb, const linear_job *j, float *rows, int64_t r0,
                        int64_t n)
{
    for (int64_t r = r0; r < r0 + n;) {
        const linear_part *p = part_at(j, r);
        int64_t t0 = r - p->first, m = p->rows - t0 < r0 + n - r ? p->rows - t0 : r0 + n - r;
        finish_part(lb, j, p, rows + (r - r0) * j->out_f, m, t0);
        r += m;
    }
}

/* One chunk of a job's rows. Rows of one part are read where they lie, and a plain job's
 * written there; rows of several parts are gathered into one block of the task's scratch and
 * their product staged, so that the chunk is one product whatever passes its rows belong to. */
static void linear_task(void *arg, int64_t index)
{
    linear_batch *lb = arg;
    const int i = (int)(index / lb->chunks);
    const linear_job *j = &lb->jobs[i];
    const int64_t r0 = index % lb->chunks * lb->chunk_rows;
    if (r0 >= j->rows)
        return; /* a shorter job than the longest */
    const int64_t n = j->rows - r0 < lb->chunk_rows ? j->rows - r0 : lb->chunk_rows;
    const linear_part *p = part_at(j, r0);
    const bool spans = r0 + n > p->first + p->rows, staged = j->head_major || spans;
    const bool amx = lb->amx != ENG__AMX_OFF, w16 = lb->w16[i] != NULL && !amx && !lb->panels[i];
    float *pack =
        eng__scratch(eng__linear_task_floats(lb->ks, amx, j, w16, n, spans) * sizeof(float));
    if (!pack && (lb->ks->tile || w16 || staged)) {
        atomic_store(&lb->no_scratch, true);
        return;
    }
    /* Without scratch (the openblas set's plain products) there is nothing past the packing. */
    float *next = pack ? pack + align16(pack_floats(lb->ks, amx, j)) : NULL;
    float *wide = w16 ? next : NULL;
    if (w16)
        next += align16(widen_floats(j->out_f, j->in_f));
    float *out = staged ? next : p->out + (r0 - p->first) * j->out_f;
    const float *in = p->in + (r0 - p->first) * j->in_f;
    if (spans) {
        float *gathered = next + align16((size_t)(n * j->out_f));
        for (int64_t r = r0; r < r0 + n;) {
            const linear_part *q = part_at(j, r);
            int64_t t0 = r - q->first, m = q->rows - t0 < r0 + n - r ? q->rows - t0 : r0 + n - r;
            memcpy(gathered + (r - r0) * j->in_f, q->in + t0 * j->in_f,
                   (size_t)(m * j->in_f) * sizeof(float));
            r += m;
        }
        in = gathered;
    }
    /* The bias goes in first and the product is added to it (beta = 1): one pass over the
     * output instead of zeroing it (beta = 0) and a second pass adding the bias. */
    float beta = 0.0f;
    if (j->bias) {
        for (int64_t t = 0; t < n; t++)
            memcpy(out + t * j->out_f, j->bias, (size_t)j->out_f * sizeof(float));
        beta = 1.0f;
    }
    task_rows rows = {in, n, out, beta};
    multiply(lb, i, &rows, pack, wide);
    if (staged)
        finish_rows(lb, j, out, r0, n);
}

/* Whether job i's weight is packed once before its tasks run: an fp32 weight without the
 * layer's panels that several tasks multiply, on a set with micro-kernels. */
static bool packs_once(const linear_batch *lb, int i)
{
    return lb->ks->tile && !lb->w16[i] && !lb->panels[i] && lb->chunks > 1 &&
           lb->amx == ENG__AMX_OFF;
}

/* Bytes of job i's weight packed into AMX tile rows. */
size_t eng__linear_amx_weight_bytes(const linear_job *j)
{
    return eng__amx_panels_elems(j->out_f, j->in_f) * sizeof(uint16_t);
}

/* Packs PACK_ROWS output features of one job's weight: its rows are B^T of the product, and
 * rows f0.. are the panels from f0 / NR on. Rounded to bf16 as eng__sgemm would round them. */
static void pack_task(void *arg, int64_t index)
{
    linear_batch *lb = arg;
    int i = (int)(index / lb->pack_parts);
    const linear_job *j = &lb->jobs[i];
    int64_t f0 = index % lb->pack_parts * PACK_ROWS;
    if ((!lb->packed[i] && !lb->amx_packed[i]) || f0 >= j->out_f)
        return;
    int64_t nf = j->out_f - f0 < PACK_ROWS ? j->out_f - f0 : PACK_ROWS;
    if (lb->amx_packed[i]) {
        /* PACK_ROWS is a multiple of the tiles' 32 columns: rows f0.. are whole panels. */
        const void *w = lb->w16[i] ? (const void *)(lb->w16[i] + f0 * j->in_f)
                                   : (const void *)(j->w + f0 * j->in_f);
        eng__amx_pack_b(w, lb->w16[i] ? lb->w16_dtype : ENG_DTYPE_F32, j->in_f, true, j->in_f, nf,
                        lb->amx_packed[i] + eng__amx_panels_elems(f0, j->in_f));
        return;
    }
    float *dst = lb->packed[i] + f0 * j->in_f;
    eng__sgemm_pack_panels(lb->ks, j->w + f0 * j->in_f, j->in_f, true, j->in_f, nf, dst);
    if (lb->bf16)
        lb->ks->round_bf16(dst, (int64_t)eng__sgemm_panels_floats(lb->ks, nf, j->in_f));
}

/* Every weight packed into AMX tile rows, in one buffer (freed by the caller), over the pool. */
static eng_status pack_weights_amx(eng_pool *pool, linear_batch *lb, float **buffer, eng_ctl *ctl)
{
    int64_t most = 0;
    size_t bytes = 0;
    for (int i = 0; i < lb->njobs; i++) {
        bytes += eng__linear_amx_weight_bytes(&lb->jobs[i]);
        most = lb->jobs[i].out_f > most ? lb->jobs[i].out_f : most;
    }
    *buffer = eng_buf_alloc(bytes);
    if (!*buffer)
        return ENG_ENOMEM;
    unsigned char *next = (unsigned char *)*buffer;
    for (int i = 0; i < lb->njobs; i++) {
        lb->amx_packed[i] = (uint16_t *)(void *)next;
        next += eng__linear_amx_weight_bytes(&lb->jobs[i]);
    }
    lb->pack_parts = (most + PACK_ROWS - 1) / PACK_ROWS;
    return eng_pool_run(pool, pack_task, lb, lb->njobs * lb->pack_parts, ctl);
}

/* The weights packed once into one buffer (freed by the caller), split over the pool, rather
 * than by every task of a job. */
static eng_status pack_weights(eng_pool *pool, linear_batch *lb, float **buffer, eng_ctl *ctl)
{
    int64_t most = 0;
    size_t floats = 0;
    if (lb->amx != ENG__AMX_OFF)
        return pack_weights_amx(pool, lb, buffer, ctl);
    for (int i = 0; i < lb->njobs; i++) {
        if (!packs_once(lb, i))
            continue;
        floats += eng__sgemm_panels_floats(lb->ks, lb->jobs[i].out_f, lb->jobs[i].in_f);
        most = lb->jobs[i].out_f > most ? lb->jobs[i].out_f : most;
    }
    if (floats == 0)
        return ENG_OK;
    *buffer = eng_buf_alloc(floats * sizeof(float));
    if (!*buffer)
        return ENG_ENOMEM;
    float *next = *buffer;
    for (int i = 0; i < lb->njobs; i++) {
        if (!packs_once(lb, i))
            continue;
        lb->packed[i] = next;
        next += eng__sgemm_panels_floats(lb->ks, lb->jobs[i].out_f, lb->jobs[i].in_f);
    }
    lb->pack_parts = (most + PACK_ROWS - 1) / PACK_ROWS;
    return eng_pool_run(pool, pack_task, lb, lb->njobs * lb->pack_parts, ctl);
}

/* ---- Few rows ------------------------------------------------------------------------------ */

/* Output features [f0, f0 + few_features) of one job for all its rows (at most
 * FEW_BATCH_ROWS), of whatever parts: the kernel reads each weight once for all of them. */
static void few_task(void *arg, int64_t index)
{
    linear_batch *lb = arg;
    int i = 0;
    while (index >= lb->few_tasks[i])
        index -= lb->few_tasks[i++];
    const linear_job *j = &lb->jobs[i];
    const int64_t f0 = index * lb->few_features;
    const float *x[FEW_BATCH_ROWS];
    float *y[FEW_BATCH_ROWS];
    int rows = 0;
    for (int64_t r = 0; r < j->rows; r++, rows++) {
        const linear_part *p = part_at(j, r);
        const int64_t t = r - p->first;
        x[rows] = p->in + t * j->in_f;
        y[rows] = (lb->stage[i] ? lb->stage[i] + r * j->out_f : p->out + t * j->out_f) + f0;
    }
    eng__gemv g = {.x = x,
                   .y = y,
                   .rows = rows,
                   .dtype = lb->w16[i] ? lb->w16_dtype : ENG_DTYPE_F32,
                   .ldw = j->in_f,
                   .k = j->in_f,
                   .n = j->out_f - f0 < lb->few_features ? j->out_f - f0 : lb->few_features,
                   .bias = j->bias ? j->bias + f0 : NULL,
                   .round_bf16 = lb->bf16};
    g.w = lb->w16[i] ? (const void *)(lb->w16[i] + f0 * j->in_f)
                     : (const void *)(j->w + f0 * j->in_f);
    lb->gemv(&g);
}

/* Whether a job's rows need work after their product (RoPE, norms, the head scatter): the
 * rows of head-major jobs, the only ones turned or normalised, which few_task staged. */
static bool needs_finish(const linear_job *j)
{
    return j->rows > 0 && j->head_major;
}

/* finish_part over all rows of one part, once every feature of them is there. */
static void few_finish_task(void *arg, int64_t index)
{
    linear_batch *lb = arg;
    int i = 0;
    while (index >= lb->jobs[i].nparts)
        index -= lb->jobs[i++].nparts;
    const linear_job *j = &lb->jobs[i];
    const linear_part *p = &j->parts[index];
    if (needs_finish(j))
        finish_part(lb, j, p, lb->stage[i] + p->first * j->out_f, p->rows, 0);
}

/* The jobs' products on eng__gemv, split by output features over the pool, then their rows
 * finished per part. Nothing is packed: the weights are read where they lie, once. */
static eng_status run_few_rows(eng_pool *pool, linear_batch *lb, eng_ctl *ctl)
{
    int64_t features = 0, tasks = 0, parts = 0, threads = eng_pool_threads(pool);
    size_t staged = 0; /* each pass's share is at most what its eng_mha_scratch_bytes counts */
    bool finish = false;
    for (int i = 0; i < lb->njobs; i++) {
        const linear_job *j = &lb->jobs[i];
        features += j->rows > 0 ? j->out_f : 0;
        staged += j->head_major ? (size_t)(j->rows * j->out_f) : 0;
        finish = finish || needs_finish(j);
        parts += j->nparts;
    }
    int64_t per = features / (threads * FEW_TASKS_PER_THREAD);
    lb->few_features = per > FEW_FEATURES_MIN
                           ? (per + FEW_FEATURES_MIN - 1) / FEW_FEATURES_MIN * FEW_FEATURES_MIN
                           : FEW_FEATURES_MIN;
    for (int i = 0; i < lb->njobs; i++) {
        const linear_job *j = &lb->jobs[i];
        lb->few_tasks[i] = j->rows > 0 ? (j->out_f + lb->few_features - 1) / lb->few_features : 0;
        tasks += lb->few_tasks[i];
    }
    float *stage = staged ? eng_buf_alloc(staged * sizeof(float)) : NULL;
    if (staged && !stage)
        return ENG_ENOMEM;
    float *next = stage;
    for (int i = 0; i < lb->njobs; i++) {
        const linear_job *j = &lb->jobs[i];
        lb->stage[i] = j->head_major ? next : NULL;
        next += j->head_major ? j->rows * j->out_f : 0;
    }
    lb->gemv = eng__gemv_of(lb->ks);
    eng_status st = eng_pool_run(pool, few_task, lb, tasks, ctl);
    if (st == ENG_OK && finish)
        st = eng_pool_run(pool, few_finish_task, lb, parts, ctl);
    eng_buf_free(stage);
    return st;
}

/* Whether the few-row products serve the jobs: at most FEW_ROWS rows in all, or, in a batch of
 * passes (parts of distinct eng_mha_args) of at most FEW_BATCH_ROWS, at most FEW_ROWS of each
 * pass in each job, the rows each would take the few-row products with alone. */
static bool takes_few_rows(const linear_batch *lb, int64_t most)
{
    if (most <= FEW_ROWS)
        return true;
    if (most > FEW_BATCH_ROWS)
        return false;
    for (int i = 0; i < lb->njobs; i++) {
        const linear_job *j = &lb->jobs[i];
        int64_t run = 0;
        for (int64_t k = 0; k < j->nparts; k++) {
            run = k > 0 && j->parts[k].a == j->parts[k - 1].a ? run + j->parts[k].rows
                                                              : j->parts[k].rows;
            if (run > FEW_ROWS)
                return false;
        }
    }
    return true;
}

/* Rows per task below which balanced_chunks splits no further: each task streams its weight's
 * panels from memory, and with fewer rows to use each element on, the product would wait on
 * the memory rather than on the FMAs. */
#define BALANCE_ROWS_MIN 64

/* At least `chunks` chunks, and more (of at least BALANCE_ROWS_MIN rows) while the largest task
 * (the widest job's chunk) holds more than a worker's share of all the jobs' work, when every job
 * reads the layer's panels: 256 rows of a q projection four times the width of k and v are then two
 * tasks of 128 rows beside k's and v's, not one that a worker runs alone while the other finishes k
 * and v and waits. Smaller chunks cost nothing there (the panels are read, not packed, per task),
 * and every row's sums are the same in any chunk. Without panels each task packs or widens its
 * weight, and the chunks stay as they are. */
static int64_t balanced_chunks(const linear_batch *lb, int64_t chunks, int64_t most,
                               int64_t threads)
{
    double total = 0;
    for (int i = 0; i < lb->njobs; i++) {
        const linear_job *j = &lb->jobs[i];
        if (j->rows > 0 && !lb->panels[i])
            return chunks;
        total += (double)j->rows * (double)j->out_f * (double)j->in_f;
    }
    for (; chunks < most; chunks++) {
        int64_t rows = (most + chunks - 1) / chunks;
        if (rows < BALANCE_ROWS_MIN)
            break;
        double largest = 0;
        for (int i = 0; i < lb->njobs; i++) {
            const linear_job *j = &lb->jobs[i];
            double task =
                (double)(j->rows < rows ? j->rows : rows) * (double)j->out_f * (double)j->in_f;
            largest = task > largest ? task : largest;
        }
        if (largest <= total / (double)threads)
            break;
    }
    return chunks;
}

/* Splits the longest job into equal chunks of at most CHUNK_ROWS rows, and into more when
 * that is what it takes to give every worker a task (600 rows on two workers are two tasks
 * of 300, not 512 and 88) or, on the layer's panels, to even out jobs of unequal widths. */
eng_status eng__linear_run(eng_pool *pool, linear_batch *lb, eng_ctl *ctl)
{
    int64_t most = 0, threads = eng_pool_threads(pool);
    for (int i = 0; i < lb->njobs; i++)
        most = lb->jobs[i].rows > most ? lb->jobs[i].rows : most;
    if (most == 0)
        return ENG_OK;
    lb->ks = eng__kernels_current();
    if (takes_few_rows(lb, most))
        return run_few_rows(pool, lb, ctl);
    /* The layer's panels hold its weights as they are, packed for one set: bf16 products round
     * the weights as they pack them (and AMX tiles read their own layout), and another set may
     * lay its panels out otherwise. Those calls pack as they go. */
    if (lb->bf16 || lb->panels_kernels != (const void *)lb->ks)
        memset(lb->panels, 0, sizeof lb->panels);
    int64_t chunks = (most + CHUNK_ROWS - 1) / CHUNK_ROWS;
    if (chunks * lb->njobs < threads)
        chunks = (threads + lb->njobs - 1) / lb->njobs;
    chunks = balanced_chunks(lb, chunks, most, threads);
    if (chunks > most)
        chunks = most;
    lb->chunk_rows = (most + chunks - 1) / chunks;
    lb->chunks = (most + lb->chunk_rows - 1) / lb->chunk_rows;
    lb->amx = lb->bf16 ? eng__amx_active() : ENG__AMX_OFF;
    atomic_init(&lb->no_scratch, false);
    float *packed = NULL;
    eng_status st = pack_weights(pool, lb, &packed, ctl);
    if (st == ENG_OK)
        st = eng_pool_run(pool, linear_task, lb, lb->njobs * lb->chunks, ctl);
    eng_buf_free(packed);
    return st == ENG_OK && atomic_load(&lb->no_scratch) ? ENG_ENOMEM : st;
}
