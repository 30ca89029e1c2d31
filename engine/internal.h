/*
 * internal.h - what the engine's own files share and nothing outside engine/ may include.
 *
 * Names here carry the eng__ prefix: they are implementation details that may change freely.
 */
#ifndef ATTND_ENGINE_INTERNAL_H
#define ATTND_ENGINE_INTERNAL_H

#include "engine/engine.h"

/* Fills `err` (when not NULL) and returns `status`, so that failures read as one statement:
 *     return eng__fail(err, ENG_EINVAL, "q", "q.ne[3] = %lld must equal k.ne[3]", ...); */
eng_status eng__fail(eng_error *err, eng_status status, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* eng__fail with a cause (eng_cause) other than ENG_CAUSE_NONE. */
eng_status eng__fail_cause(eng_error *err, eng_cause cause, eng_status status, const char *field,
                           const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Per-thread scratch memory, 64-byte aligned, at least `bytes` long; NULL if it cannot be had.
 * Valid until the next eng__scratch call on the same thread; freed when the thread exits.
 * Only leaf tasks (those that start no nested job) may use it. */
void *eng__scratch(size_t bytes);

/* Query rows that dots_rows and axpys_rows take at once: up to 8 rows of a 128-long head keep
 * their dot products' accumulators (and a K row's chunk) in the 32 zmm registers. */
#define ENG__STREAM_ROWS 8

/* The vector kernels of the softmax, chosen once for the CPU (AVX-512, AVX2 or scalar). Every
 * variant computes exp with the same polynomial, maps -inf and anything below -87 to exactly
 * 0, and needs no alignment. */
typedef struct {
    const char *name;
    /* max(x[0..n-1]); -inf for n == 0; NaN when any element is NaN. */
    float (*max)(const float *x, int64_t n);
    /* x[i] = exp(d), d = x[i] - shift, in place; returns the sum. shift must be finite. For
     * the online softmax, whose d are at most a few units above 0: each within
     * (2 + 0.75 |d|) FLT_EPSILON of e^d (AVX-512 spends less on the range reduction; the
     * others are within 1.4 FLT_EPSILON), which is below 0.3 FLT_EPSILON of e^0 for d <= 0. */
    float (*exp_sum)(float *x, int64_t n, float shift);
    /* exp_sum, and *max = the maximum of x before the call (NaN if any is NaN), in one pass. */
    float (*exp_sum_max)(float *x, int64_t n, float shift, float *max);
    /* dst[i] = exp(x[i] - shift) * mul, or dst[i] += that when `accumulate`. */
    void (*exp_store)(const float *x, float *dst, int64_t n, float shift, float mul,
                      bool accumulate);
    /* x[i] = cap * tanh(x[i] / cap); cap > 0. */
    void (*softcap)(float *x, int64_t n, float cap);
    /* sum of v[i] * tanh(x[i] + y[i]): one additive (Bahdanau) score. */
    float (*tanh_dot)(const float *x, const float *y, const float *v, int64_t n);
    /* Decoding: `rows` query rows (1 <= rows <= ENG__STREAM_ROWS) against n K rows, then n V
     * rows, each K or V row loaded once for all of them, so that few rows read the cache at
     * memory speed. K and V rows are of `dtype` (F32, BF16 or F16, widened exactly), row
     * stride ld elements, d long; q[r] and o[r] are fp32 rows of d. A row's result does not
     * depend on the other rows or on `rows`: one row recomputed alone gets the same bits; and
     * 16-bit rows give the bits of fp32 rows of the same values (the same sums, in the same
     * order, of exactly widened elements).
     * dots_rows: s[r lds + c] = scale * (q[r] . k_c). axpys_rows: o[r] += sum_c p[r ldp + c] v_c,
     * keys in order. */
    void (*dots_rows)(const float *const *q, int rows, const void *k, eng_dtype dtype, int64_t ldk,
                      int64_t n, int64_t d, float scale, float *s, int64_t lds);
    void (*axpys_rows)(float *const *o, int rows, const float *p, int64_t ldp, const void *v,
                       eng_dtype dtype, int64_t ldv, int64_t n, int64_t d);
    /* One query row against n bf16 rows of a multiple of 32 elements, faster than dots_rows
     * and axpys_rows for that case (a decode step without grouped heads over a bf16 cache)
     * but summing in another order, so not with the bits of fp32 rows; NULL where the set
     * has none. dots_bf16_pairs: s[c] = scale * (q . k_c). axpys_bf16_pairs: o += sum_c p[c]
     * v_c. */
    void (*dots_bf16_pairs)(const float *q, const uint16_t *k, int64_t ldk, int64_t n, int64_t d,
                            float scale, float *s);
    void (*axpys_bf16_pairs)(float *o, const float *p, const uint16_t *v, int64_t ldv, int64_t n,
                             int64_t d);
} eng__vec_ops;

/* The named variant, or NULL when this CPU lacks it (for tests). */
const eng__vec_ops *eng__vec_variant(const char *name);

/* The argument checks of eng_sdpa alone (data pointers must be non-NULL but are not read), so
 * that callers which build the operands first can fail before doing that work. */
eng_status eng__sdpa_validate(const eng_sdpa_args *args, eng_error *err);

/* K and V read through a block table (the paged KV cache, engine/layers/kvcache.c) instead of the
 * views args->k and args->v, which then give the shape only ([1, Hkv, S, D] and [1, Hkv, S,
 * Dv]; their data is never read). Block t holds tokens [t T, t T + T), T = block_tokens:
 * K as [Hkv][T][D], then V as [Hkv][T][Dv], elements of `dtype` (F32, BF16 or F16). */
typedef struct {
    eng_dtype dtype;
    int64_t block_tokens;
    void *const *blocks; /* ceil(S / T) of them */
} eng__kv_paged;

/* eng_sdpa with K and V from `kv` (NULL: from args->k and args->v, which is eng_sdpa). The one
 * flash loop serves both: each key block lies inside one cache block and is read in place. */
eng_status eng__sdpa_paged(eng_pool *pool, const eng_sdpa_args *args, const eng__kv_paged *kv,
                           eng_ctl *ctl, eng_error *err);

/* eng__sdpa_paged that also sets *kv_rows to the keys of every key block whose K and V a task
 * took for its products (from their source, or from the prepacked panels), summed over the
 * blocks: B Hkv S when each kv head's keys are read once (a grouped-query decode step), more
 * when several tasks read them (one per query head, the weights' second pass), less when
 * blocks are skipped. For tests of how a plan reads the cache, which timings cannot show. */
eng_status eng__sdpa_counted(eng_pool *pool, const eng_sdpa_args *args, const eng__kv_paged *kv,
                             int64_t *kv_rows, eng_ctl *ctl, eng_error *err);

/* eng_sdpa_scratch_bytes for eng__sdpa_paged (kv NULL: eng_sdpa's). */
size_t eng__sdpa_paged_scratch_bytes(const eng_sdpa_args *args, const eng__kv_paged *kv,
                                     int threads);

/* eng_layer_new with heads of head_dim (0: E / num_heads), for decoder layers. */
eng_layer *eng__layer_assemble(const char *name, const eng_layer_weights *weights,
                               int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                               bool keep16, eng_error *err);

/* What an error calls weight `w` of role `role` (its field name): its label, else the role. */
const char *eng__weight_label(const eng_weight *w, const char *role);

/* A decoder layer's q/k norm and RoPE on n projected rows (row stride ld) of q (`query`) or k,
 * token t at position pos0 + t. */
void eng__decoder_project(const eng_layer *layer, bool query, float *rows, int64_t n, int64_t ld,
                          int64_t pos0);

/* Scales each head's output rows o [B, L, H D] by the share the layer's sinks leave them:
 * 1 / (1 + exp(sink_h - lse)), lse [B, H, L] the attention's log-sum-exp. */
void eng__decoder_sinks(const eng_layer *layer, float *o, int64_t B, int64_t L, const float *lse);

/* Bytes of the level-2 cache of one core (kernels.c: cpuid, else sysfs or sysconf; 1 MiB when
 * none says, or says less than 256 KiB or more than 64 MiB). */
size_t eng__l2_bytes(void);

#endif
