/*
 * engine.h - the compute core of attnd: scaled dot-product attention on a thread pool.
 *
 * The engine knows nothing of HTTP or JSON. It takes fp32 tensors as strided views, runs a
 * flash-style kernel (two block products per key block, fused masks, online softmax) whose
 * tasks fan out over one pool of workers, and reports failures as eng_status values with a
 * message naming the offending field. Semantics: docs/semantics.md.
 *
 * The engine owns its hot kernels: the block products and projections run on attnd's own
 * packed GEMM micro-kernels (AVX-512F, AVX2+FMA or portable C, engine/kernels/kernels.h), chosen
 * per process from cpuid and xgetbv, whatever CPU OpenBLAS's tables know. OpenBLAS remains as the
 * `openblas` kernel set: fallback, test reference and benchmark baseline. What a process may
 * choose (the kernel set, the bf16 path) it passes as values to eng_init; the engine reads no
 * environment.
 *
 * Usage:
 *
 *     eng_error err;
 *     eng_options opts = {.kernels = ENG_KERNELS_AUTO, .bf16 = ENG_BF16_AUTO}; // the defaults
 *     if (eng_init(&opts, &err) != ENG_OK) { fprintf(stderr, "%s\n", err.message); return 1; }
 *     eng_pool *pool = eng_pool_new(0, &err);          // 0: one worker per usable CPU
 *     if (!pool) { fprintf(stderr, "%s\n", err.message); return 1; }
 *
 *     // One head, L = S = 3, D = Dv = 2, contiguous [1,1,3,2] tensors.
 *     float q[6] = {1, 0, 0, 1, 1, 1}, k[6] = {1, 0, 0, 1, 1, 1}, v[6] = {1, 0, 0, 2, 3, 1};
 *     float out[6], lse[3];
 *     eng_sdpa_args a = {0};                             // zero = defaults: no mask, 1/sqrt(D)
 *     a.q = eng_view_contiguous(q, 1, 1, 3, 2);
 *     a.k = eng_view_contiguous(k, 1, 1, 3, 2);
 *     a.v = eng_view_contiguous(v, 1, 1, 3, 2);
 *     a.out = eng_view_contiguous(out, 1, 1, 3, 2);
 *     a.causal = true;
 *     a.lse = lse;
 *     if (eng_sdpa(pool, &a, NULL, &err) != ENG_OK)
 *         fprintf(stderr, "%s: %s\n", err.field, err.message);
 *     eng_pool_free(pool);
 *
 * Layers take their weights by role, never by file or tensor name (api/models/ reads files and
 * knows the names):
 *
 *     eng_layer_weights w = {0};                      // E = 2, one head, packed in_proj
 *     float in_w[12] = {...}, out_w[4] = {...};
 *     w.in_proj_w = (eng_weight){"in_proj_weight", ENG_DTYPE_F32, in_w, 2, {6, 2}};
 *     w.o_w = (eng_weight){"out_proj.weight", ENG_DTYPE_F32, out_w, 2, {2, 2}};
 *     eng_layer *layer = eng_layer_new("mine", &w, 1, 0, false, &err);  // copies the weights
 *
 * Sessions (incremental decoding over a paged KV cache) are the last section: eng_kv_*.
 *
 * Threads: every function may be called from any thread, including from inside a pool task
 * (the caller then helps run its own tasks, so nested calls cannot deadlock). Ownership: the
 * engine never takes ownership of caller memory; every pointer in an argument struct is
 * borrowed for the duration of the call.
 */
#ifndef ATTND_ENGINE_H
#define ATTND_ENGINE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- Errors ------------------------------------------------------------------------------ */

/* X(name, description). One list so that codes and their strings cannot drift apart. */
#define ENG_STATUS_LIST(X)                                                                         \
    X(ENG_OK, "ok")                                                                                \
    X(ENG_EINVAL, "invalid argument")                                                              \
    X(ENG_ETOOBIG, "size beyond what the engine or BLAS accepts")                                  \
    X(ENG_ENOMEM, "out of memory")                                                                 \
    X(ENG_ECANCELLED, "cancelled")                                                                 \
    X(ENG_EDEADLINE, "deadline exceeded")                                                          \
    X(ENG_ENONFINITE, "result is not finite")                                                      \
    X(ENG_EIO, "input/output error")                                                               \
    X(ENG_EFORMAT, "malformed file")

typedef enum {
#define ENG_STATUS_ENUM(name, text) name,
    ENG_STATUS_LIST(ENG_STATUS_ENUM)
#undef ENG_STATUS_ENUM
} eng_status;

/* What ran out or which argument a failure is about, for callers that act on it (compare
 * this, never `field`, which is for people). */
typedef enum {
    ENG_CAUSE_NONE = 0,
    ENG_CAUSE_KV_CACHE_FULL,     /* ENG_ENOMEM: the KV cache has no room now (evict, or retry) */
    ENG_CAUSE_KV_CACHE_CAPACITY, /* ENG_ETOOBIG: more than the KV cache could ever hold */
    ENG_CAUSE_MAX_TOKENS,        /* ENG_ETOOBIG: past a sequence's max_tokens */
    ENG_CAUSE_HEAD_COUNT,        /* a layer's num_heads or num_kv_heads, not one of its tensors */
} eng_cause;

/* A failure: the status, the argument field it concerns ("q", "attn_mask", ...; empty when it
 * concerns no field), a human-readable sentence and the cause. Filled only when a call fails. */
typedef struct {
    eng_status status;
    char field[48];
    char message[240];
    eng_cause cause;
} eng_error;

/* The fixed description of a status ("invalid argument"); never NULL. */
const char *eng_status_str(eng_status status);

/* ---- Cancellation and deadlines ----------------------------------------------------------- */

/* Control block of one request, shared by its tasks. A worker checks it between blocks and
 * abandons the rest of the request once `cancel` is set or `deadline_ns` (CLOCK_MONOTONIC
 * nanoseconds, 0 = none) has passed. Any thread may set `cancel` at any time. */
typedef struct {
    atomic_bool cancel;
    int64_t deadline_ns;
} eng_ctl;

/* CLOCK_MONOTONIC now, in nanoseconds. */
int64_t eng_now_ns(void);

/* ENG_OK, ENG_ECANCELLED or ENG_EDEADLINE for `ctl` now (NULL ctl: ENG_OK). */
eng_status eng_ctl_check(eng_ctl *ctl);

/* ---- Thread pool -------------------------------------------------------------------------- */

typedef struct eng_pool eng_pool;

/* Starts a pool of `threads` workers (0: the CPUs this process may use, see eng_cpu_count) and
 * switches OpenBLAS to one thread, since the pool supplies the parallelism. NULL on failure,
 * with `err` filled. */
eng_pool *eng_pool_new(int threads, eng_error *err);

/* Stops the workers after the tasks already queued have run, and frees the pool. NULL is a
 * no-op. No other thread may use the pool during or after this call. */
void eng_pool_free(eng_pool *pool);

/* Adds one spare thread to the pool that runs a queued job only while every worker is busy with
 * less urgent work (a higher priority value): an urgent request then need not wait for a long
 * one's task to end. It sleeps otherwise, so it takes no core from work the workers can do. A
 * second call is a no-op. Not counted by eng_pool_threads. */
eng_status eng_pool_add_spare(eng_pool *pool, eng_error *err);

/* Background work: the fan-out (eng_pool_run) of a submitted job whose priority `is_background`
 * accepts runs at the OS's idle priority (SCHED_IDLE); the submitted task itself, and all other
 * work, at the thread's own. Any other thread that wakes (the daemon's I/O thread, the spare
 * with a short request) then takes the CPU at once, where among equals it could wait for the
 * next scheduler tick. Only where a thread may leave SCHED_IDLE again (CAP_SYS_NICE, or an
 * RLIMIT_NICE of 20 or more): otherwise false, nothing changes, and `why` says so. Call before
 * any job is submitted. */
bool eng_pool_set_background(eng_pool *pool, bool (*is_background)(uint32_t priority), char *why,
                             size_t why_len);

int eng_pool_threads(const eng_pool *pool);

/* Tasks queued but not yet started, over all requests (for metrics and admission). */
int64_t eng_pool_pending(eng_pool *pool);

/* A task: runs item `index` of a job. Tasks of one job may run concurrently, in any order. */
typedef void (*eng_task_fn)(void *arg, int64_t index);

/* Runs fn(arg, 0..count-1) on the pool and returns when all have run or been skipped. Jobs run
 * in FIFO order of the request they belong to, within its priority (eng_pool_submit_at): a job
 * started from inside a task inherits its parent's place and priority; one started outside any
 * task is a new request of priority 0. The calling thread runs
 * tasks of this job itself while it waits. Once `ctl` is cancelled or past its deadline, tasks not
 * yet started are skipped and the result is ENG_ECANCELLED or ENG_EDEADLINE; tasks should also
 * check `ctl` themselves between blocks. */
eng_status eng_pool_run(eng_pool *pool, eng_task_fn fn, void *arg, int64_t count, eng_ctl *ctl);

/* Queues fn(arg, 0) to run once on a worker and returns at once (the daemon's handoff: decode,
 * compute and encode one request there). Never blocks; the caller bounds the queue. The same as
 * eng_pool_submit_at with priority 0. */
eng_status eng_pool_submit(eng_pool *pool, eng_task_fn fn, void *arg);

/* eng_pool_submit with a priority: lower values run first (0 before 1 before 2 ...), and
 * submissions of one priority in the order they were submitted. The job and everything it
 * starts with eng_pool_run keep that priority. Strict, with no ageing: a job of a later
 * priority waits while earlier ones keep arriving (the daemon bounds that wait with each
 * request's deadline). ENG_ENOMEM when the job cannot be allocated. */
eng_status eng_pool_submit_at(eng_pool *pool, uint32_t priority, eng_task_fn fn, void *arg);

/* The CPUs this process may use: the affinity mask, capped by a cgroup v2 cpu.max (or v1
 * cfs_quota) quota rounded up; at least 1. */
int eng_cpu_count(void);

/* ---- Options ------------------------------------------------------------------------------ */

/* What a process chooses for the engine, as values: the daemon reads them from its flags and
 * variables (server/config.c), the tests from theirs (tests/support/engine_env.c). Each list is
 * X(value, name); the names are those --kernels and ATTND_BF16 take. */

/* The kernel set the products and exponentials run on: "auto" (the widest this CPU and OS run:
 * avx512, else avx2, else openblas), "avx512" (AVX-512F micro-kernels), "avx2" (AVX2 + FMA),
 * "generic" (portable C) or "openblas" (cblas_sgemm: fallback and reference). */
#define ENG_KERNEL_CHOICE_LIST(X)                                                                  \
    X(ENG_KERNELS_AUTO, "auto")                                                                    \
    X(ENG_KERNELS_AVX512, "avx512")                                                                \
    X(ENG_KERNELS_AVX2, "avx2")                                                                    \
    X(ENG_KERNELS_GENERIC, "generic")                                                              \
    X(ENG_KERNELS_OPENBLAS, "openblas")

/* Which code computes the bf16 products of bfloat16 requests: "auto" (VDPBF16PS in the avx512
 * set on AMD CPUs with AVX512-BF16, which run it at the FMA rate; elsewhere the operands rounded
 * to bf16 for the fp32 micro-kernels), "native" (VDPBF16PS wherever the CPU has AVX512-BF16),
 * "emulated" (rounding, always), "amx" (as auto, and the layer projections and both attention
 * products on AMX tiles where the CPU and the OS grant them) or "amx-emulated" (as auto, and
 * the same tile code over a portable emulation of the tile instructions: slow, for tests). */
#define ENG_BF16_PATH_LIST(X)                                                                      \
    X(ENG_BF16_AUTO, "auto")                                                                       \
    X(ENG_BF16_NATIVE, "native")                                                                   \
    X(ENG_BF16_EMULATED, "emulated")                                                               \
    X(ENG_BF16_AMX, "amx")                                                                         \
    X(ENG_BF16_AMX_EMULATED, "amx-emulated")

#define ENG_OPTION_ENUM(value, name) value,
typedef enum { ENG_KERNEL_CHOICE_LIST(ENG_OPTION_ENUM) ENG_KERNEL_CHOICE_COUNT } eng_kernel_choice;
typedef enum { ENG_BF16_PATH_LIST(ENG_OPTION_ENUM) ENG_BF16_PATH_COUNT } eng_bf16_path;
#undef ENG_OPTION_ENUM

/* The engine's options; zero is "auto" for each, the engine's own choice. */
typedef struct {
    eng_kernel_choice kernels;
    eng_bf16_path bf16;
} eng_options;

/* Applies `opts` (NULL: the defaults) to the engine calls that start after it: a call in flight
 * keeps the kernel set it began with, so tests switch sets between calls. A process that never
 * calls it runs on the defaults. ENG_EINVAL, with `err` (field "kernels" or "bf16") naming what
 * is missing and the options in force unchanged, for a kernel set this CPU or OS cannot run or
 * a value outside the lists above. A bf16 path the CPU cannot take is not an error: native
 * falls back to rounding, amx to no tiles, and eng_engine_info_get says which path runs and
 * why. Call it at start-up, before the first engine call (tests call it again between calls);
 * not concurrently with itself. */
eng_status eng_init(const eng_options *opts, eng_error *err);

/* The options in force: the defaults until eng_init takes others. Any thread. */
void eng_options_get(eng_options *opts);

/* The name of the set in use ("avx512", "avx2", "generic" or "openblas"). */
const char *eng_kernels_name(void);

/* True when this CPU and OS can run the named set ("avx512", ...; "auto" is not a set). */
bool eng_kernels_supported(const char *name);

/* What the engine runs on, for the start-up log line and the info metric. */
typedef struct {
    char kernels[16]; /* the set in use */
    char bf16[16];    /* bf16 products: "amx", "amx-emulated", "avx512bf16", "emulated" or
                       * "float32" (none) */
    /* The layer projections' bf16 tiles: "amx", "amx-emulated (why)" or "off (why)". */
    char amx[192];
    char cpu[64];               /* the CPU's brand string */
    char features[160];         /* the vector features found usable ("avx2 fma avx512f ...") */
    char openblas_core[32];     /* openblas_get_corename(): the kernel OpenBLAS picked */
    size_t l1d_bytes, l2_bytes; /* per core: cpuid, AMD legacy leaves, sysfs, sysconf; 0: none */
    int64_t kc, nc;             /* the GEMM blocking derived from them */
} eng_engine_info;

void eng_engine_info_get(eng_engine_info *info);

/* ---- Big buffers -------------------------------------------------------------------------- */

/* Buffers for request-sized data (bodies, tensors, outputs) that keep their pages: a freed
 * buffer of 1 MiB or more stays mapped in a process-wide cache while it fits the limit, and
 * the next similar request reuses it without page faults. Any thread; never blocks on I/O. */

/* `bytes` of uninitialised, 64-byte-aligned memory; NULL when out of memory. */
void *eng_buf_alloc(size_t bytes);

/* Returns a buffer from eng_buf_alloc (NULL: no-op) to the cache, or to the system when the
 * cache is full. */
void eng_buf_free(void *p);

/* How many bytes freed buffers may keep mapped; 0 (the default) keeps none. Lowering it
 * releases the excess at once. */
void eng_buf_cache_limit(size_t bytes);

/* Releases cached buffers freed at least `idle_ns` ago; returns the bytes released. */
size_t eng_buf_trim(int64_t idle_ns);

/* Bytes the cache holds now. */
size_t eng_buf_cached(void);

/* ---- Tensor views ------------------------------------------------------------------------- */

/* Element types of tensors the caller holds: views, layer tensors, KV-cache rows. */
typedef enum { ENG_DTYPE_F32 = 0, ENG_DTYPE_F16, ENG_DTYPE_BF16 } eng_dtype;

/* A rank-4 fp32 view [n0, n1, n2, n3] with strides in elements (not bytes), so that [B,L,H,D]
 * memory is viewed as [B,H,L,D] without a copy. For the SDPA operands rows are contiguous
 * (stride[3] = 1), the row stride stride[2] is at least the row length (it is BLAS's leading
 * dimension), and the batch and head strides may be any non-negative value: 0 broadcasts one
 * batch or head of the inputs (never of the output). eng_sdpa's q, k and v may instead be
 * bfloat16: the view then gives their shape and strides, and eng_sdpa_args their data. */
typedef struct {
    float *data;
    int64_t ne[4];
    int64_t stride[4];
} eng_view;

/* A contiguous row-major view of `data` with shape [n0,n1,n2,n3]. */
eng_view eng_view_contiguous(float *data, int64_t n0, int64_t n1, int64_t n2, int64_t n3);

/* ---- Scaled dot-product attention -------------------------------------------------------- */

typedef enum {
    ENG_ALIGN_TOP_LEFT = 0, /* query i sits at position i (PyTorch is_causal)              */
    ENG_ALIGN_BOTTOM_RIGHT, /* query i sits at i + S - L (flash-attn, KV-cache decoding)   */
    ENG_ALIGN_OFFSET,       /* query i sits at i + query_offset                             */
} eng_align;

typedef enum {
    ENG_MASK_NONE = 0,
    ENG_MASK_BOOL,  /* uint8_t, nonzero = may attend (PyTorch SDPA polarity) */
    ENG_MASK_FLOAT, /* float, added to the score; -inf hides the key         */
} eng_mask_kind;

/* An attention mask broadcast to [B, H, L, S]: each ne[i] is 1 or the full dimension, and
 * stride[i] is the stride in elements (ignored where ne[i] is 1). */
typedef struct {
    eng_mask_kind kind;
    const void *data;
    int64_t ne[4];
    int64_t stride[4];
} eng_mask;

typedef enum {
    ENG_WEIGHTS_NONE = 0,
    ENG_WEIGHTS_PER_HEAD, /* weights is [B, H, L, S], contiguous */
    ENG_WEIGHTS_MEAN,     /* weights is [B, L, S], the mean over heads */
} eng_weights_mode;

/* The precision of the two products. BFLOAT16 rounds Q, K, V (to nearest even) and the
 * probabilities P to bf16 for Q K^T and P V and accumulates in fp32; the scores, masks and
 * biases, the softmax and the output stay fp32. The avx512, avx2 and generic sets compute it
 * (with VDPBF16PS where that is fast, else by rounding the operands for the fp32 kernel: the
 * same products); the openblas set, and additive scoring, compute FLOAT32 instead, which
 * eng_sdpa_precision tells beforehand. X(value, name), the names being those requests and
 * --default-precision take. */
#define ENG_PRECISION_LIST(X)                                                                      \
    X(ENG_PRECISION_FLOAT32, "float32")                                                            \
    X(ENG_PRECISION_BFLOAT16, "bfloat16")

#define ENG_PRECISION_ENUM(value, name) value,
typedef enum { ENG_PRECISION_LIST(ENG_PRECISION_ENUM) ENG_PRECISION_COUNT } eng_precision;
#undef ENG_PRECISION_ENUM

/* One SDPA call. Zero-initialise, then set what is needed: every zero field is the default. */
typedef struct {
    eng_view q;   /* [B, H, L, D]    */
    eng_view k;   /* [B, Hkv, S, D]  H must be a multiple of Hkv (grouped-query attention) */
    eng_view v;   /* [B, Hkv, S, Dv] */
    eng_view out; /* [B, H, L, Dv], written; may be strided like the inputs */

    bool scale_set; /* false: scale = 1/sqrt(D) */
    float scale;    /* any finite value */
    float softcap;  /* > 0: s = softcap * tanh(s / softcap), before masks and biases; 0: off */

    bool causal;          /* key j visible to query i only if j <= p_i */
    eng_align align;      /* where queries sit: p_i = i + offset */
    int64_t query_offset; /* used with ENG_ALIGN_OFFSET; may be negative */

    bool window_left_set, window_right_set; /* unset side: unbounded */
    int64_t window_left, window_right;      /* p_i - left <= j <= p_i + right; each >= 0 */

    const uint8_t *key_padding; /* [B, S] (or [S] with stride 0): nonzero = ignore key */
    int64_t key_padding_stride; /* elements between batches */
    const int64_t *kv_lengths;  /* [B]: keys j >= kv_lengths[b] ignored; each in [0, S] */

    eng_mask attn_mask;

    bool alibi;                /* add -slope_h * |p_i - j| */
    const float *alibi_slopes; /* [H]; NULL: the default geometric slopes */

    /* Additive (Bahdanau) scoring instead of the dot product, when additive_w_q is set:
     * s = v . tanh(W_q q + W_k k), with W_q and W_k [A, D] and v [A]; no scale is applied.
     * Masks, positions, softcap and the outputs work as for the dot product. */
    const float *additive_w_q, *additive_w_k, *additive_v;
    int64_t additive_dim; /* A */

    /* The last `open_tail_keys` keys are appended ones (an MHA layer's bias_kv and zero
     * attention): every query sees them, whatever causal, window, kv_lengths, ALiBi and the
     * masks say; masks and key_padding then cover only the first S - open_tail_keys keys. */
    int64_t open_tail_keys;

    eng_precision precision;

    /* bfloat16 inputs, read as they are (no fp32 copy of a tensor is ever made): q_dtype
     * ENG_DTYPE_BF16 takes Q from q16 (the raw bits, 2-byte aligned) with the shape and
     * strides (in elements) of the view q, whose data is then unused; kv_dtype does the same
     * for K and V (k16, v16) together. Q rows are copied into each task's bf16 rows (or
     * widened for fp32 products), K and V packed a block at a time from their bits. The
     * result is bit for bit that of fp32 views of the same values: with BFLOAT16 they round to
     * themselves, with FLOAT32 they widen exactly. Every option works with them except
     * additive scoring (EINVAL: it takes fp32 q and k). ENG_DTYPE_F32 (zero): fp32 views. */
    eng_dtype q_dtype, kv_dtype;
    const uint16_t *q16, *k16, *v16;

    eng_weights_mode weights_mode;
    float *weights; /* see eng_weights_mode; zeros where a key is invisible */
    float *lse;     /* [B, H, L] natural-log sum of exp; -inf for a row with no visible key */
} eng_sdpa_args;

/* Computes attention as docs/semantics.md specifies. A query row with no visible key gets
 * output 0, weights 0 and lse -inf. Validates every argument (shapes, strides, overflow of every
 * size product, BLAS index limits) before it allocates or computes; on failure returns the
 * status with `err` naming the field, and leaves the outputs unspecified. Scratch memory is
 * O(block size) per worker unless weights are requested. `ctl` may be NULL. */
eng_status eng_sdpa(eng_pool *pool, const eng_sdpa_args *args, eng_ctl *ctl, eng_error *err);

/* The precision eng_sdpa computes `args` in with the kernel set in use now. */
eng_precision eng_sdpa_precision(const eng_sdpa_args *args);

/* Bytes of scratch (beyond the caller's inputs and outputs) that eng_sdpa may allocate for
 * `args` on a pool of `threads` workers: for admission control. Valid only for arguments that
 * eng_sdpa would accept. */
size_t eng_sdpa_scratch_bytes(const eng_sdpa_args *args, int threads);

/* Writes the default ALiBi slopes for `heads` heads into slopes[0..heads-1]: 2^(-8(h+1)/H) for
 * a power of two H, else the slopes of the nearest lower power of two followed by every other
 * slope of the doubled set (as in the ALiBi paper's reference code). */
void eng_alibi_default_slopes(int64_t heads, float *slopes);

/* ---- Positional encodings ----------------------------------------------------------------- */

typedef enum {
    ENG_ROPE_HALF = 0,    /* rotate (x[d], x[d + D/2]) pairs: GPT-NeoX / Hugging Face */
    ENG_ROPE_INTERLEAVED, /* rotate (x[2d], x[2d + 1]) pairs: the original RoFormer */
} eng_rope_style;

/* Rotates each head vector of x in place: x is [T, heads * D] with row stride `ld`, token t at
 * position pos0 + t, pair d turned by (pos0 + t) * base^(-2d/D). D must be even. */
void eng_rope_apply(float *x, int64_t tokens, int64_t ld, int64_t heads, int64_t head_dim,
                    int64_t pos0, float base, eng_rope_style style);

/* Adds the sinusoidal encoding to x [T, E] (row stride ld), token t at position pos0 + t:
 * PE(p, 2i) = sin(p / 10000^(2i/E)), PE(p, 2i+1) = cos(p / 10000^(2i/E)). */
void eng_sinusoidal_add(float *x, int64_t tokens, int64_t ld, int64_t dim, int64_t pos0);

/* ---- Multi-head attention layers ---------------------------------------------------------- */

/* ---- Decoder layers (causal, with their own positions and norms) ------------------------- */

/* How a decoder layer's RoPE frequencies are rescaled (transformers' rope_type). */
typedef enum {
    ENG_ROPE_SCALING_NONE = 0, /* "default" */
    ENG_ROPE_SCALING_LINEAR,   /* every frequency / factor */
    ENG_ROPE_SCALING_LLAMA3,   /* Llama 3.1: low frequencies / factor, a smooth band between */
    ENG_ROPE_SCALING_YARN,     /* YaRN: ramped interpolation, cos and sin times attention_factor */
    ENG_ROPE_SCALING_LONGROPE, /* Phi-3's LongRoPE at its short factors: frequencies divided by
                                  short_factor[i], cos and sin times attention_factor */
    ENG_ROPE_SCALING_DYNAMIC,  /* dynamic NTK below max_positions: the default frequencies */
} eng_rope_scaling;

/* A decoder layer's rotary embedding: the first rotary_dim channels of each head turn (pairs
 * in `style`), the rest pass. Frequencies base^(-2i/rotary_dim), rescaled as `scaling` says. */
typedef struct {
    int64_t rotary_dim; /* even, at most the head size; 0: no RoPE */
    eng_rope_style style;
    double base;
    eng_rope_scaling scaling;
    double factor;                            /* linear, llama3, yarn: > 0 */
    double low_freq_factor, high_freq_factor; /* llama3 */
    double original_max_positions;            /* llama3, yarn, longrope */
    double beta_fast, beta_slow;              /* yarn (0: 32 and 1) */
    bool truncate;                            /* yarn: round the ramp's ends outwards */
    double attention_factor;                  /* yarn: 0 derives it from factor and mscale */
    double mscale, mscale_all_dim;            /* yarn: 0 when absent */
    /* longrope: rotary_dim / 2 factors, borrowed by eng_rope_inv_freq and eng_layer_decoder
     * (the layer keeps the frequencies, not the pointer); attention_factor 0 derives it from
     * factor (the context's growth): sqrt(1 + ln factor / ln original_max_positions). */
    const float *short_factor;
    /* longrope, dynamic: the layer serves positions below this only (> 0), since past it
     * transformers turns every position, earlier ones included, by other frequencies. */
    int64_t max_positions;
} eng_rope_params;

typedef enum {
    ENG_QK_NORM_NONE = 0,
    ENG_QK_NORM_RMS,   /* x / sqrt(mean(x^2) + eps) * w */
    ENG_QK_NORM_LAYER, /* (x - mean) / sqrt(var + eps) * w + b */
} eng_qk_norm;

/* What a decoder layer adds to the projections and the attention (eng_layer_decoder). */
typedef struct {
    int64_t head_dim; /* D when H D is not the hidden size (Qwen 3, Gemma); 0: E / H */
    eng_rope_params rope;
    eng_qk_norm qk_norm;   /* on q and k after their projections, before RoPE */
    bool qk_norm_whole;    /* over the whole projection (OLMo 2); else over each head */
    bool qk_norm_plus_one; /* the weights are 1 + w (Gemma) */
    double qk_norm_eps;
    bool scale_set; /* false: 1/sqrt(D) */
    float scale;
    float softcap;  /* > 0: scores capped as eng_sdpa_args.softcap */
    int64_t window; /* W > 0: a query sees only the W keys up to its own; 0: every earlier key */
} eng_decoder_spec;

/* A multi-head attention layer with the parameters of PyTorch's nn.MultiheadAttention
 * (batch_first), generalised to grouped-query heads. Weights are row-major [out_features,
 * in_features] as torch stores them, all in one block owned by the layer: fp32, or, for a
 * layer built from F16 or BF16 weights with keep16 (eng_layer_new, eng_layer_decoder), the
 * four projection matrices kept in their 16 bits (w16_*; w_q, w_k, w_v and w_o are then NULL),
 * half the memory and nothing lost: F16 and BF16 widen to fp32 exactly, so every product is the one
 * fp32 weights of the same values give, bit for bit (bfloat16 requests round them to bf16
 * as they pack them, which leaves BF16 weights as they are). Biases stay fp32. Beside them the
 * layer keeps the matrices packed for long inputs (panels_*): 4 bytes per matrix element more. */
typedef struct {
    char name[64];
    char dtype[8];                /* the weights' dtype as given ("F32", "F16", "BF16") */
    int64_t embed_dim;            /* E */
    int64_t num_heads;            /* H */
    int64_t head_dim;             /* D: a decoder layer's own (q is H D wide); 0: E / H */
    int64_t num_kv_heads;         /* Hkv; H is a multiple of it; the k/v width is W = Hkv * D */
    int64_t kdim, vdim;           /* widths of the key and value inputs (E for self-attention) */
    float *w_q;                   /* [H D, E] ([E, E] but for some decoder layers) */
    float *w_k;                   /* [W, kdim] */
    float *w_v;                   /* [W, vdim] */
    float *w_o;                   /* [E, H D] */
    float *b_q, *b_k, *b_v, *b_o; /* [H D], [W], [W], [E]; each NULL when the layer has none */
    float *bias_k, *bias_v;       /* [W] each (add_bias_kv), or both NULL */
    float *params;                /* the block every pointer above points into */
    eng_dtype w16_dtype;          /* F16 or BF16 when w16_* hold the matrices; else F32 */
    const uint16_t *w16_q, *w16_k, *w16_v, *w16_o; /* as w_q, w_k, w_v, w_o, in 16 bits */
    uint16_t *params16;                            /* the block w16_* point into, or NULL */
    /* The four matrices packed once, when the layer is made, for the blocked products of long
     * inputs (a prefill): fp32 panels in the layout of the kernel set in force then
     * (panels_kernels, which callers only compare), so that no call widens or packs them
     * again. NULL on the openblas set, which packs nothing; a call on another set than
     * panels_kernels, or in bfloat16 precision, packs as it goes, with the same bits. Few-row
     * products (a decode step) read w_* or w16_* where they lie. */
    const float *panels_q, *panels_k, *panels_v, *panels_o;
    float *panels;              /* the block panels_* point into, or NULL */
    size_t panels_floats;       /* its length */
    const void *panels_kernels; /* the kernel set the panels are packed for */
    /* A causal decoder layer (eng_layer_decoder) when `decoder`: its spec, the RoPE inverse
     * frequencies [rotary_dim / 2] and the factor cos and sin take, the q/k norm weights
     * ([H D] and [W], per head repeated; biases NULL unless LayerNorm has them) and the
     * attention sinks [H] (a logit per head that takes a share of the softmax), or NULL. */
    bool decoder;
    eng_decoder_spec spec;
    float *inv_freq;
    float rope_factor;
    float *q_norm_w, *q_norm_b, *k_norm_w, *k_norm_b;
    float *sinks;
    float *decoder_params; /* the block the pointers above point into */
    size_t decoder_floats; /* its length (0 for other layers) */
} eng_layer;

/* One weight the caller holds (little-endian, any alignment), borrowed for the call; absent
 * when `data` is NULL. `label` is only what an error calls it (the caller's own name, say a
 * checkpoint's tensor); NULL: the role's field name in eng_layer_weights. */
typedef struct {
    const char *label;
    eng_dtype dtype;
    const void *data;
    int rank; /* 1 to 4 */
    int64_t shape[4];
} eng_weight;

/* A layer's weights by role, each [out_features, in_features] as torch stores them (W = Hkv D
 * is the k/v width, Q = H D the query's). Zero-initialise and set the roles the layer has:
 * either the packed in_proj (rows [W_q; W_k; W_v], needs Q = E) or q_w, k_w and v_w; o_w
 * always. The q/k norms and the sinks belong to decoder layers (eng_layer_decoder) only. */
typedef struct {
    eng_weight in_proj_w; /* [E + 2W, E] */
    eng_weight in_proj_b; /* [Q + 2W]: packed biases, also beside separate weights (torch) */
    eng_weight q_w, k_w, v_w, o_w; /* [Q, E], [W, kdim], [W, vdim], [E, Q] */
    eng_weight q_b, k_b, v_b, o_b; /* [Q], [W], [W], [E] */
    eng_weight bias_k, bias_v;     /* add_bias_kv: W elements each, both or neither */
    eng_weight q_norm_w, q_norm_b; /* D elements shared by the heads, or Q (whole, or per head) */
    eng_weight k_norm_w, k_norm_b; /* D or W; the biases for ENG_QK_NORM_LAYER only */
    eng_weight sinks;              /* [H] */
} eng_layer_weights;

/* Half-precision conversions: widening is exact for every fp16/bf16 value (NaN and -0 kept);
 * narrowing rounds to nearest, ties to even (overflow gives infinity, NaN stays NaN). */
float eng_f16_to_f32(uint16_t h);
float eng_bf16_to_f32(uint16_t h);
uint16_t eng_f32_to_f16(float f);
uint16_t eng_f32_to_bf16(float f);

/* Frees the layer's weights and the layer. NULL is a no-op. */
void eng_layer_free(eng_layer *layer);

/* D: the layer's head_dim, or E / H when that is 0. */
int64_t eng_layer_head_dim(const eng_layer *layer);

/* The layer's parameter count. */
int64_t eng_layer_params(const eng_layer *layer);

/* Bytes of the layer's parameter blocks (fp32 and 16-bit) and of its packed panels (4 bytes per
 * matrix element, where the kernel set packs), for logs and memory reports. */
size_t eng_layer_bytes(const eng_layer *layer);

/* The built-in layer "demo": E = 64, 4 heads, biases, weights from a fixed-seed generator
 * (uniform in +-1/sqrt(E)). NULL when memory runs out. */
eng_layer *eng_layer_demo(void);

/* Builds a layer from weights by role: the roles present must make exactly one consistent
 * layer with num_heads heads (and num_kv_heads; 0 = num_heads), each weight's shape its role's.
 * Every weight is converted to fp32 and copied, except that with `keep16` the four projection
 * matrices stay in their 16 bits when all four have one 16-bit dtype (see eng_layer). Which
 * names a file or a request gives its weights is the caller's business: the engine reads roles.
 * NULL on failure (EFORMAT for weights, EINVAL for head counts), with err naming the weight by
 * its label. */
eng_layer *eng_layer_new(const char *name, const eng_layer_weights *weights, int64_t num_heads,
                         int64_t num_kv_heads, bool keep16, eng_error *err);

/* A decoder layer: the projection weights as eng_layer_new takes them (16-bit matrices kept in
 * 16 bits), self-attention without bias_k/bias_v, plus the q/k norm weights the spec's qk_norm
 * needs (q_norm_b and k_norm_b for LayerNorm only) and the sinks when given; with the
 * positions, norms, scale, softcap and window of `spec`. eng_mha then applies them all: its
 * positional must be NONE, and its window, when unset, is the layer's. NULL on failure, with
 * err naming the weight (by its label) or the spec's field (rotary_dim, rope.factor, ...). */
eng_layer *eng_layer_decoder(const char *name, const eng_layer_weights *weights, int64_t num_heads,
                             int64_t num_kv_heads, const eng_decoder_spec *spec, eng_error *err);

/* The RoPE inverse frequencies of `rope` (rotary_dim / 2 of them) in transformers' float32
 * arithmetic, and the factor cos and sin take (1 unless YaRN). EINVAL naming the field. */
eng_status eng_rope_inv_freq(const eng_rope_params *rope, float *inv_freq, float *attention_factor,
                             eng_error *err);

typedef enum {
    ENG_POSITIONAL_NONE = 0,
    ENG_POSITIONAL_SINUSOIDAL, /* added to the layer input(s) before projection */
    ENG_POSITIONAL_ROPE,       /* rotates q and k per head after projection */
    ENG_POSITIONAL_ALIBI,      /* linear biases on the scores (default slopes) */
} eng_positional;

/* A KV-cache sequence (the last section, eng_kv_*): what a layer step appends to. Declared
 * here too (C11 allows the repeated typedef) so that this section reads on its own. */
typedef struct eng_kv_seq eng_kv_seq;

/* One forward pass. Zero-initialise, then set what is needed. */
typedef struct {
    const eng_layer *layer;
    int64_t B, L; /* x is [B, L, E] contiguous */
    const float *x;
    int64_t S;           /* key/value inputs are [B, S, kdim] and [B, S, vdim] */
    const float *key_in; /* NULL: self-attention (keys and values come from x, S = L) */
    const float *value_in;
    float *out; /* [B, L, E], written */

    /* Masks and positions exactly as in eng_sdpa_args (S counts the input keys). A decoder
     * layer (eng_layer_decoder) brings its scale, softcap and window: the window applies
     * when neither side is set here. */
    bool causal;
    eng_align align;
    int64_t query_offset;
    bool window_left_set, window_right_set;
    int64_t window_left, window_right;
    const uint8_t *key_padding; /* [B, S] or [S] (stride 0): nonzero = ignore */
    int64_t key_padding_stride;
    eng_mask attn_mask; /* broadcast to [B, H, L, S] */
    bool add_zero_attn; /* append a zero key and value, as torch's add_zero_attn */

    eng_positional positional; /* NONE for a decoder layer, which turns q and k itself */
    float rope_base;           /* 0: 10000 */
    eng_rope_style rope_style;

    eng_weights_mode weights_mode; /* as eng_sdpa_args, with S' = S + extra keys */
    float *weights;

    /* BFLOAT16: every product of the layer (the three projections, the attention, the output
     * projection) takes bf16-rounded operands with fp32 sums; biases, RoPE and the softmax
     * stay fp32. As eng_sdpa_precision says, the openblas set computes FLOAT32. */
    eng_precision precision;

    /* A decoder-layer step over a KV cache (the sequence of a session, below) when set: the
     * L tokens of x are the next ones of that sequence, at positions n .. n+L-1 where n is
     * its length before the call. Their keys and values are projected (RoPE turns k and q at
     * those positions; sinusoidal encodings are added to x at them), appended to the
     * sequence, and the L queries attend over all n+L cached tokens through its block table
     * (never copied); then the output projection. Self-attention on one sequence only: B = 1,
     * key_in and value_in NULL, align ENG_ALIGN_BOTTOM_RIGHT (the queries are the last
     * positions; causal, windows and ALiBi count from there), and the cache's num_kv_heads,
     * head_dim and value_head_dim must be the layer's. Refused (EINVAL, naming the option):
     * bias_k/bias_v layers ("layer"), add_zero_attn, key_padding, attn_mask. Weights are
     * [1, H, L, n+L] (or the mean). Borrowed and changed: nobody else may use the sequence
     * during the call. On any failure the sequence is left as it was (an append already made
     * is truncated away); a full pool is ENG_ENOMEM with field "kv_cache_bytes", as
     * eng_kv_seq_append says, and eng_kv_seq_append_bytes(cache, L) is what the step takes. */
    eng_kv_seq *kv_cache;
} eng_mha_args;

/* The precision eng_mha computes `args` in with the kernel set in use now. */
eng_precision eng_mha_precision(const eng_mha_args *args);

/* Keys the layer appends to the S input keys (bias_kv and zero attention): S' = S + this. */
int64_t eng_mha_extra_keys(const eng_mha_args *args);

/* Runs the layer: projections as sgemms over chunks of tokens (split over the pool) into
 * head-major buffers, eng_sdpa over their heads, then the output projection. Validates
 * everything first, as eng_sdpa does. Appended keys (bias_kv, zero attention) are visible to
 * every query whatever the masks say, as in PyTorch (which pads its masks with zeros). */
eng_status eng_mha(eng_pool *pool, const eng_mha_args *args, eng_ctl *ctl, eng_error *err);

/* Bytes eng_mha allocates for `args` (projections, intermediates, scratch), for admission;
 * over a kv_cache, the attention's scratch over the cache as it will be after the append
 * (the append's blocks are the cache pool's: eng_kv_seq_append_bytes). It also covers the
 * pass's share of an eng_mha_batch call. */
size_t eng_mha_scratch_bytes(const eng_mha_args *args, int threads);

/* One member of a batched call (eng_mha_batch): its own pass, control block and error. */
typedef struct {
    const eng_mha_args *args; /* its layer must be the batch's */
    eng_ctl *ctl;             /* its deadline and cancel flag; may be NULL */
    eng_error *err;           /* may be NULL */
    eng_status status;        /* written: what eng_mha(pool, args, ctl, err) would return */
} eng_mha_member;

/* Runs `count` passes of one layer as one call (dynamic batching): each projection is one
 * product over the rows of every member (the weights read once, or once per 16 steps of a
 * large batch of decode steps: see below), positions, RoPE, a decoder
 * layer's norms and KV-cache appends are per member, the attentions run in parallel across
 * members and heads, then one output projection. Every option of eng_mha works in a batch;
 * members computing in BFLOAT16 and in FLOAT32 (eng_mha_precision) read the weights rounded
 * and not, so each precision is a product of its own.
 *
 * Every member computes what eng_mha computes for it alone: the same checks and errors, and
 * the same bits when its products take the same path: few-row products, whose bits do not
 * depend on the rows beside them, which a member of at most 16 rows takes alone and in a
 * batch whose members of its precision have at most 16 rows each and 64 in all (in groups of
 * 16 rows, each reading the weights once); else within float rounding. A member that fails its
 * checks, is cancelled or passes its deadline, or whose cache cannot grow fails alone with its
 * status, its sequence left as it was; the others go on. A product several members share runs to
 * its end: each member's ctl is checked before and between the stages, and inside its own attention
 * (a lone member's also inside its products, as in eng_mha). Refused, as the member's EINVAL: a
 * layer other than the first valid member's (field "layer"), a kv_cache another member steps too
 * ("kv_cache").
 *
 * It allocates at most the sum of its members' eng_mha_scratch_bytes, so that what each
 * member reserved alone covers the batch. Returns ENG_OK when every member succeeded (and for
 * count 0), else the first failing member's status; EINVAL for count < 0 or NULL members,
 * writing no member. Borrowed for the call: `members` and what they point to (each args as
 * eng_mha borrows it). Any thread, as eng_mha. */
eng_status eng_mha_batch(eng_pool *pool, eng_mha_member *members, int count);

/* ---- KV-cache sessions -------------------------------------------------------------------- */

/* Paged KV caches for incremental decoding (docs/sessions.md). A pool holds fixed-size blocks of
 * block_tokens tokens under a byte budget; a sequence keeps its K and V in blocks of the pool
 * (not contiguous: a block table), in float32, bfloat16 or float16. Attention over a sequence
 * is eng_sdpa's, every option included, with K and V read through the block table by the same
 * flash loop (never copied into one buffer); a decode step's keys are split over the pool's
 * workers. Appending costs O(new tokens); truncating frees whole blocks; a fork shares every
 * block by reference count and copies the partly filled last block on its first append
 * (copy-on-write).
 *
 *     eng_kv_pool *kvp = eng_kv_pool_new((size_t)1 << 30, 64, &err);  // 1 GiB, 64 tokens/block
 *     eng_kv_shape shape = {.num_kv_heads = 8, .head_dim = 64, .dtype = ENG_DTYPE_BF16};
 *     eng_kv_seq *seq = eng_kv_seq_new(kvp, &shape, &err);
 *     // Prefill: append the prompt's K and V ([1, 8, n, 64] fp32) and attend to them causally.
 *     eng_kv_rows k = eng_kv_rows_f32(eng_view_contiguous(kbuf, 1, 8, n, 64));
 *     eng_kv_rows v = eng_kv_rows_f32(eng_view_contiguous(vbuf, 1, 8, n, 64));
 *     eng_sdpa_args a = {0};                          // k and v stay unset: the cache has them
 *     a.q = eng_view_contiguous(qbuf, 1, 32, n, 64);  // 32 query heads over 8 kv heads
 *     a.out = eng_view_contiguous(obuf, 1, 32, n, 64);
 *     a.causal = true;
 *     a.align = ENG_ALIGN_BOTTOM_RIGHT;               // queries are the last n positions
 *     if (eng_kv_step(pool, seq, &k, &v, &a, NULL, &err) != ENG_OK) { ... err.message ... }
 *     // Then one token per step the same way (n = 1); or append only (args NULL), or attend
 *     // only (k, v NULL); eng_kv_seq_truncate(seq, len, &err) rolls back;
 *     eng_kv_seq *branch = eng_kv_seq_fork(seq, &err); // diverges copy-on-write
 *     eng_kv_seq_free(branch);
 *     eng_kv_seq_free(seq);
 *     eng_kv_pool_free(kvp);
 *
 * Threads: the pool's functions may be called from any thread. A sequence is used by one
 * thread at a time (appends, truncates and forks change it or read its table; attends only
 * read it, so several may run at once with no change in between); different sequences, even
 * forks sharing blocks, may be used from different threads at once. Errors: a limit is
 * ENG_ETOOBIG with cause ENG_CAUSE_MAX_TOKENS or ENG_CAUSE_KV_CACHE_CAPACITY (the request could
 * never fit: HTTP 413), a full cache is ENG_ENOMEM with ENG_CAUSE_KV_CACHE_FULL (evict idle
 * sequences, or 429); a failed call leaves the sequence as it was. */

typedef struct eng_kv_pool eng_kv_pool;
typedef struct eng_kv_seq eng_kv_seq;

/* A pool of `capacity_bytes` (the budget every block of every sequence counts against) with
 * blocks of `block_tokens` tokens (1 to 65536; multiples of 32 let prefills prepack). NULL on
 * failure with `err` filled. */
eng_kv_pool *eng_kv_pool_new(size_t capacity_bytes, int64_t block_tokens, eng_error *err);

/* Frees the pool; every sequence of it must have been freed. NULL is a no-op. */
void eng_kv_pool_free(eng_kv_pool *pool);

/* What the pool holds now, for metrics: bytes of the blocks alive (shared blocks once),
 * blocks, live sequences and the tokens they cache (a fork counts its shared prefix too). */
typedef struct {
    size_t capacity_bytes, used_bytes;
    int64_t block_tokens, blocks, sequences, tokens;
} eng_kv_pool_stats;

void eng_kv_pool_stats_get(eng_kv_pool *pool, eng_kv_pool_stats *stats);

/* The shape of a sequence's cache. */
typedef struct {
    int64_t num_kv_heads;   /* Hkv; queries may have any multiple of it (grouped-query) */
    int64_t head_dim;       /* D of the keys (and of the queries) */
    int64_t value_head_dim; /* Dv; 0: head_dim */
    eng_dtype dtype;        /* the cache's element type: F32, BF16 or F16 */
    int64_t max_tokens;     /* a cap on the length; 0: only the pool's capacity */
} eng_kv_shape;

/* An empty sequence in `pool`. Each dimension must be in [1, 65536]; ENG_ETOOBIG (field
 * "kv_cache_bytes") when one block of this shape exceeds the capacity. NULL on failure. */
eng_kv_seq *eng_kv_seq_new(eng_kv_pool *pool, const eng_kv_shape *shape, eng_error *err);

/* Releases the sequence's blocks (a block others share stays for them). NULL is a no-op. */
void eng_kv_seq_free(eng_kv_seq *seq);

int64_t eng_kv_seq_length(const eng_kv_seq *seq);

/* The shape, with value_head_dim resolved. */
eng_kv_shape eng_kv_seq_shape(const eng_kv_seq *seq);

/* Bytes of the pool that appending `tokens` tokens would take now (new blocks, and a copy of a
 * shared last block): what an eviction must free. 0 for tokens <= 0. */
size_t eng_kv_seq_append_bytes(const eng_kv_seq *seq, int64_t tokens);

/* New K or V rows, borrowed for the call: [1, Hkv, n, D] (or Dv) in float32, bfloat16 or
 * float16, strides in elements as eng_view's (rows contiguous; any head and row stride). */
typedef struct {
    eng_dtype dtype;
    const void *data;
    int64_t ne[4];
    int64_t stride[4];
} eng_kv_rows;

/* The float32 rows of an eng_view. */
eng_kv_rows eng_kv_rows_f32(eng_view view);

/* Appends the n rows of k and v as tokens [length, length + n), converted to the cache dtype
 * (rounded to nearest even). Fails, changing nothing, when the shapes differ from the
 * sequence's (EINVAL, field "k" or "v"), when the length would pass max_tokens or the
 * sequence alone would not fit the capacity (ETOOBIG), or when the pool has no room now
 * (ENOMEM, field "kv_cache_bytes"). */
eng_status eng_kv_seq_append(eng_kv_seq *seq, const eng_kv_rows *k, const eng_kv_rows *v,
                             eng_error *err);

/* Keeps the first `length` tokens (0 <= length <= the length; else EINVAL, field "length"),
 * releasing the blocks past them. */
eng_status eng_kv_seq_truncate(eng_kv_seq *seq, int64_t length, eng_error *err);

/* A new sequence with the same tokens, sharing every block (copy-on-write). NULL on failure. */
eng_kv_seq *eng_kv_seq_fork(const eng_kv_seq *seq, eng_error *err);

/* Attention of args->q over the sequence's tokens: eng_sdpa with K = the cached keys and V =
 * the cached values (S = the length), every option of eng_sdpa_args except additive scoring;
 * args->k and args->v must be left unset, and q has batch 1. Causal attention of new queries
 * at the last positions is align ENG_ALIGN_BOTTOM_RIGHT; cross-attention over a stored memory
 * is causal false. A bf16 cache with precision BFLOAT16 feeds the bf16 products its values as
 * stored. EINVAL for an empty sequence. */
eng_status eng_kv_attend(eng_pool *pool, const eng_kv_seq *seq, const eng_sdpa_args *args,
                         eng_ctl *ctl, eng_error *err);

/* Bytes of scratch eng_kv_attend may allocate for `args` over the sequence once it holds
 * `new_tokens` more tokens, on a pool of `threads` workers (as eng_sdpa_scratch_bytes: for
 * admission control). Valid only for arguments that eng_kv_attend would accept. */
size_t eng_kv_attend_scratch_bytes(const eng_kv_seq *seq, const eng_sdpa_args *args,
                                   int64_t new_tokens, int threads);

/* One step of a session: appends k and v (both, or neither: NULL) and then, when args is not
 * NULL, attends as eng_kv_attend over the sequence with them. The query is checked before the
 * append; if the attention fails the append is undone, so a failed step changes nothing. */
eng_status eng_kv_step(eng_pool *pool, eng_kv_seq *seq, const eng_kv_rows *k, const eng_kv_rows *v,
                       const eng_sdpa_args *args, eng_ctl *ctl, eng_error *err);

#endif
