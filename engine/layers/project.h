/*
 * project.h - the layer's projections, y = x W^T + b over the rows of one or several passes,
 * which mha.c runs and nothing else of engine/ includes.
 *
 * A projection job multiplies the rows of its parts (one batch of one pass each) by one weight:
 * few rows on the few-row products (eng__gemv, every weight read once where it lies), more on
 * the blocked product over chunks of rows (on the panels the layer packed when it was made,
 * else the weight packed once per call, or per task); then each
 * part's rows are turned (RoPE), normalised (a decoder layer's q/k norms) at its own positions
 * and scattered into its heads. The functions here carry the eng__linear_ prefix.
 */
#ifndef ATTND_ENGINE_LAYERS_PROJECT_H
#define ATTND_ENGINE_LAYERS_PROJECT_H

#include <stdatomic.h>

#include "engine/kernels/amx.h"
#include "engine/kernels/kernels.h"

/* Tokens per projection task, at most (512 rows: E=512 layer ratio 0.87-0.89 causal, 128
 * rows: 0.83-0.86, when each task packed its weight itself). */
#define CHUNK_ROWS 512

/* Products of at most this many rows, all batches together (a decode step, a speculative
 * verification, a short prompt), read the weights where they lie (eng__gemv, kernels.h), split
 * by output features; longer ones pack them for the blocked product, which then does more work
 * per weight byte. One bound for fp32 and 16-bit weights, so that a 16-bit layer keeps computing
 * the bits of its fp32 twin. */
#define FEW_ROWS 16

/* A batch of passes (eng_mha_batch) that would each take the few-row products alone takes
 * them too while its rows are at most this many in all, all rows in one call of the kernel:
 * each pass then computes the bits it computes alone, and a batch of decode steps reads the
 * weights once, where the blocked product would widen and pack every weight for a few dozen
 * rows. Past it the blocked product, which does more work per weight byte, is the better.
 * At most the rows one few-row task keeps pointers to. */
#define FEW_BATCH_ROWS 64

/* Which rows a projection makes, for a decoder layer's q/k norms and RoPE. */
typedef enum { DECODER_NONE = 0, DECODER_QUERY, DECODER_KEY } decoder_rows;

/* A run of a projection's rows that share their source, destination and positions: one batch
 * of one pass. A job's rows are its parts' rows one after another, so that the passes of a
 * batched call (eng_mha_batch) share one product, each weight read once for all of them. */
typedef struct {
    const eng_mha_args *a; /* the pass: its RoPE style and base */
    const float *in;       /* `rows` rows of the job's in_f floats, one after another */
    /* Plain jobs: rows of out_f floats one after another. Head-major: head g's head_dim
     * columns of row t at out + g*out_hstride + t*head_dim. */
    float *out;
    int64_t out_hstride;
    int64_t rows;
    int64_t first; /* the job's index of its first row (set by the job's caller) */
    int64_t pos0;  /* the position of its first token (RoPE, a decoder layer's norms) */
    bool rope;     /* RoPE turns these rows (eng_mha_args.positional) */
} linear_part;

/* One projection y = x W^T + b over the rows of its parts, optionally rotated. */
typedef struct {
    const float *w;    /* [out_f, in_f] */
    const float *bias; /* [out_f] or NULL */
    int64_t out_f, in_f;
    bool head_major;
    int64_t rope_heads;
    decoder_rows qk; /* a decoder layer's norm and RoPE on these rows */
    const linear_part *parts;
    int64_t nparts;
    int64_t rows; /* the parts' rows, all together */
} linear_job;

typedef struct {
    const eng_layer *layer;
    const eng__kernels *ks; /* read once per call */
    atomic_bool no_scratch; /* some task could not get its packing space */
    linear_job jobs[3];
    int njobs;
    int64_t chunks; /* chunks of the longest job */
    int64_t chunk_rows;
    int64_t head_dim;
    bool bf16; /* weights rounded to bf16 as they are packed (the inputs come rounded) */
    /* Job i's weight in 16 bits instead of jobs[i].w (a layer's w16_*), or NULL. */
    const uint16_t *w16[3];
    eng_dtype w16_dtype;
    /* Job i's weight as the layer packed it when it was made (eng_layer.panels_*, the
     * b_packed layout, panel stride in_f * NR), for the kernel set panels_kernels; or NULL.
     * eng__linear_run drops them for another set, for bf16 products and for few rows. */
    const float *panels[3];
    const void *panels_kernels;
    /* Job i's fp32 weight packed once for all its tasks of this call (the same layout), or
     * NULL: each task packs it, or it has panels. */
    float *packed[3];
    /* bf16 products on AMX tiles (eng__amx_active, when the layer computes in bf16): every
     * weight, fp32 or 16-bit, packed once into tile rows, and each task's rows of the input
     * rounded into the A scratch. */
    eng__amx_mode amx;
    uint16_t *amx_packed[3];
    int64_t pack_parts; /* packing tasks per job */
    /* Few-row products (run_few_rows): the set's variant, output features per task, each
     * job's tasks, and each head-major job's product rows [rows, out_f] before they are
     * turned and scattered into heads (else NULL: the rows are written in place). */
    eng__gemv_fn gemv;
    int64_t few_features;
    int64_t few_tasks[3]; /* feature blocks */
    float *stage[3];
} linear_batch;

/* Runs the batch's jobs (lb's jobs, njobs, layer, head_dim, bf16, w16, w16_dtype, panels and
 * panels_kernels set; the rest zero), splitting the longest job into equal chunks of at most
 * CHUNK_ROWS rows, and into more when that is what it takes to give every worker a task. ENG_ENOMEM
 * when a buffer or a task's scratch cannot be had; else what eng_pool_run returns for ctl. */
eng_status eng__linear_run(eng_pool *pool, linear_batch *lb, eng_ctl *ctl);

/* Floats of per-thread scratch a task of `rows` rows of job j needs (on AMX tiles when `amx`,
 * over a 16-bit weight when `w16`), with the rows of several parts when `spans`. */
size_t eng__linear_task_floats(const eng__kernels *ks, bool amx, const linear_job *j, bool w16,
                               int64_t rows, bool spans);

/* Bytes of job j's weight packed into AMX tile rows. */
size_t eng__linear_amx_weight_bytes(const linear_job *j);

#endif
