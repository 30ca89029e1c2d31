/*
 * test_sdpa.c - the specification of eng_sdpa (docs/semantics.md), checked against
 * hand-computed golden cases and against the float64 reference in tests/support/ref.c.
 *
 * Each test names one behaviour. The randomised ones build arguments with a fixed-seed
 * generator (tests/support/rng.h), run the engine and the reference on the very same
 * eng_sdpa_args, and compare as below. The declarative ones (a shape and options per case, no
 * code of their own) are data: tests/engine/cases/sdpa_cases.json, whose format the comment
 * above run_case_file describes; this file keeps the tests that need code (golden values,
 * hand-made inputs, extra properties, concurrency, cancellation, validation). Every comparison:
 *
 * - output: max |engine - reference| <= 1e-5 * max|V|. The engine's scores are fp32, so each
 *   carries a rounding error e of a few 2^-24 |s| (about 1e-6 for the score magnitudes used
 *   here); a weight p_j then moves by p_j * e relative, and the output, a convex combination of
 *   value rows, by at most about 2 e max|V|. The fp32 accumulation of P V adds roughly
 *   sqrt(block + blocks) * 2^-24 max|V|. Both stay near 1e-6 max|V|, so 1e-5 leaves ten times
 *   headroom while a single mis-masked key (weight ~1/S >= 5e-5 here) still fails. Inputs with
 *   extreme scores (+-1e4, late maxima) are built from small dyadic numbers so that fp32 computes
 *   their scores exactly and the same bound holds.
 * - weights: absolute 1e-5 (each weight is within 2e of the truth, and at most 1); exactly 0
 *   where the reference is exactly 0 (invisible keys, and rows with no visible key).
 * - lse: |engine - reference| <= 2e-5 (1 + |lse|): the score error plus the rounding of a float
 *   of magnitude |lse|; -inf exactly where the reference says the row sees no key.
 * - nothing is NaN, and a row with no visible key has output exactly 0.
 *
 * Sizes shrink when ATTND_TEST_QUICK=1 (the ASan and TSan runs).
 */
#include "engine/engine.h"
#include "engine/internal.h" /* eng__sdpa_counted: how many K/V rows a call reads */
#include "tests/support/check.h"
#include "tests/support/ref.h"
#include "tests/support/util.h"

#include <float.h>
#include <jansson.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define GOLDEN_PATH     "tests/engine/cases/seed_cases.json"
#define SDPA_CASES_PATH "tests/engine/cases/sdpa_cases.json"

static eng_pool *pool;
static bool quick;

/* ---- Small helpers ------------------------------------------------------------------------ */

static void appendf(char *buf, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void appendf(char *buf, size_t n, const char *fmt, ...)
{
    size_t len = strlen(buf);
    if (len + 1 >= n)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + len, n - len, fmt, ap);
    va_end(ap);
}

static double seconds_since(int64_t start_ns)
{
    return (double)(eng_now_ns() - start_ns) / 1e9;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

/* A view [n0, n1, n2, n3] with the given strides (the innermost is 1). */
static eng_view view_of(float *data, int64_t n0, int64_t n1, int64_t n2, int64_t n3, int64_t s0,
                        int64_t s1, int64_t s2)
{
    eng_view v = {data, {n0, n1, n2, n3}, {s0, s1, s2, 1}};
    return v;
}

static float *view_ptr(const eng_view *v, int64_t i0, int64_t i1, int64_t i2, int64_t i3)
{
    return v->data + i0 * v->stride[0] + i1 * v->stride[1] + i2 * v->stride[2] + i3 * v->stride[3];
}

static void view_fill(const eng_view *v, float x)
{
    for (int64_t a = 0; a < v->ne[0]; a++)
        for (int64_t b = 0; b < v->ne[1]; b++)
            for (int64_t c = 0; c < v->ne[2]; c++)
                for (int64_t d = 0; d < v->ne[3]; d++)
                    *view_ptr(v, a, b, c, d) = x;
}

static double view_max_abs(const eng_view *v)
{
    double m = 0;
    for (int64_t a = 0; a < v->ne[0]; a++)
        for (int64_t b = 0; b < v->ne[1]; b++)
            for (int64_t c = 0; c < v->ne[2]; c++)
                for (int64_t d = 0; d < v->ne[3]; d++)
                    m = fmax(m, fabs((double)*view_ptr(v, a, b, c, d)));
    return m;
}

/* ---- A problem: one eng_sdpa_args with the buffers it points into -------------------------- */

typedef struct {
    int64_t B, H, Hkv, L, S, D, Dv;
    bool interleaved; /* q, k, v and out viewed from [B, L, H, D] memory (strided heads) */
    int64_t out_pad;  /* gap elements after each output row group: a strided output */
    double q_amp;     /* q entries uniform in [-q_amp, q_amp); 0 means 1 */
} shape;

typedef struct {
    shape sh;
    eng_sdpa_args a;
    float *q, *k, *v, *o, *weights, *lse;
    size_t nq, nk, nv, no, nw, nlse;
    uint8_t *pad;
    int64_t *kvlen;
    void *mask;
    float *slopes;
    float *additive;  /* W_q [A, D], W_k [A, D] and v [A], one block */
    const char *note; /* what the case is about, for failure messages */
} problem;

/* Where no output element lives in a strided output: must survive the call untouched. */
#define GAP_SENTINEL 777.0f
/* A stride for broadcast (extent 1) mask dimensions, which the engine must ignore. */
#define BOGUS_STRIDE (INT64_C(1) << 40)

/* shape_of(B, H, Hkv, L, S, D, Dv): contiguous views, q entries in [-1, 1). */
static shape shape_of(int64_t B, int64_t H, int64_t Hkv, int64_t L, int64_t S, int64_t D,
                      int64_t Dv)
{
    shape sh = {.B = B, .H = H, .Hkv = Hkv, .L = L, .S = S, .D = D, .Dv = Dv};
    return sh;
}

static void problem_init(problem *p, const shape *sh, uint64_t *rng)
{
    memset(p, 0, sizeof *p);
    p->sh = *sh;
    int64_t B = sh->B, H = sh->H, Hkv = sh->Hkv, L = sh->L, S = sh->S, D = sh->D, Dv = sh->Dv;
    int64_t pad = sh->out_pad;
    p->nq = (size_t)(B * H * L * D);
    p->nk = (size_t)(B * Hkv * S * D);
    p->nv = (size_t)(B * Hkv * S * Dv);
    p->q = xcalloc(p->nq, sizeof(float));
    p->k = xcalloc(p->nk, sizeof(float));
    p->v = xcalloc(p->nv, sizeof(float));
    if (!sh->interleaved) {
        p->a.q = eng_view_contiguous(p->q, B, H, L, D);
        p->a.k = eng_view_contiguous(p->k, B, Hkv, S, D);
        p->a.v = eng_view_contiguous(p->v, B, Hkv, S, Dv);
        p->no = (size_t)(B * H * L * (Dv + pad));
        p->o = xcalloc(p->no, sizeof(float));
        p->a.out = view_of(p->o, B, H, L, Dv, H * L * (Dv + pad), L * (Dv + pad), Dv + pad);
    } else {
        /* Memory [B, L, H, D]: the head stride is D and the row stride H * D. */
        p->a.q = view_of(p->q, B, H, L, D, L * H * D, D, H * D);
        p->a.k = view_of(p->k, B, Hkv, S, D, S * Hkv * D, D, Hkv * D);
        p->a.v = view_of(p->v, B, Hkv, S, Dv, S * Hkv * Dv, Dv, Hkv * Dv);
        p->no = (size_t)(B * L * (H * Dv + pad));
        p->o = xcalloc(p->no, sizeof(float));
        p->a.out = view_of(p->o, B, H, L, Dv, L * (H * Dv + pad), Dv, H * Dv + pad);
    }
    double qa = sh->q_amp > 0 ? sh->q_amp : 1.0;
    for (size_t i = 0; i < p->nq; i++)
        p->q[i] = rng_sym(rng, qa);
    for (size_t i = 0; i < p->nk; i++)
        p->k[i] = rng_sym(rng, 1.0);
    for (size_t i = 0; i < p->nv; i++)
        p->v[i] = rng_sym(rng, 1.0);
}

static void problem_outputs(problem *p, eng_weights_mode mode, bool lse)
{
    const shape *s = &p->sh;
    free(p->weights);
    free(p->lse);
    p->weights = NULL;
    p->lse = NULL;
    p->a.weights_mode = mode;
    p->nw = mode == ENG_WEIGHTS_PER_HEAD ? (size_t)(s->B * s->H * s->L * s->S)
            : mode == ENG_WEIGHTS_MEAN   ? (size_t)(s->B * s->L * s->S)
                                         : 0;
    if (p->nw)
        p->weights = xcalloc(p->nw, sizeof(float));
    p->nlse = lse ? (size_t)(s->B * s->H * s->L) : 0;
    if (lse)
        p->lse = xcalloc(p->nlse, sizeof(float));
    p->a.weights = p->weights;
    p->a.lse = p->lse;
}

/* Key padding: [B, S] (or one shared [S] row with stride 0); the first `first_n` keys and a
 * random `fraction` of the others are padding. */
static void problem_padding(problem *p, bool shared, int64_t first_n, double fraction,
                            uint64_t *rng)
{
    /* Padding covers the keys before the open tail (all of them when there is none). */
    int64_t rows = shared ? 1 : p->sh.B, S = p->sh.S - p->a.open_tail_keys;
    free(p->pad);
    p->pad = xcalloc((size_t)(rows * S), 1);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < S; j++)
            p->pad[r * S + j] = (uint8_t)(j < first_n || rng_unit(rng) < fraction);
    p->a.key_padding = p->pad;
    p->a.key_padding_stride = shared ? 0 : S;
}

static void problem_kv_lengths(problem *p, const int64_t *lengths)
{
    free(p->kvlen);
    p->kvlen = xcalloc((size_t)p->sh.B, sizeof(int64_t));
    memcpy(p->kvlen, lengths, (size_t)p->sh.B * sizeof(int64_t));
    p->a.kv_lengths = p->kvlen;
}

/* An attn_mask of extents ne (each 1 or the full dimension), contiguous over those extents;
 * broadcast dimensions get a bogus stride, which the engine must ignore. A boolean mask lets a
 * query attend with probability `density`; a float mask holds values in [-3, 3) and -inf with
 * probability 1 - density. */
static void problem_mask(problem *p, eng_mask_kind kind, const int64_t ne[4], double density,
                         uint64_t *rng)
{
    size_t n = (size_t)(ne[0] * ne[1] * ne[2] * ne[3]);
    free(p->mask);
    p->mask = xcalloc(n, kind == ENG_MASK_BOOL ? 1 : sizeof(float));
    for (size_t i = 0; i < n; i++) {
        bool keep = rng_unit(rng) < density;
        if (kind == ENG_MASK_BOOL)
            ((uint8_t *)p->mask)[i] = (uint8_t)keep;
        else
            ((float *)p->mask)[i] = keep ? rng_sym(rng, 3.0) : -INFINITY;
    }
    eng_mask *m = &p->a.attn_mask;
    m->kind = kind;
    m->data = p->mask;
    int64_t stride = 1;
    for (int d = 3; d >= 0; d--) {
        m->ne[d] = ne[d];
        m->stride[d] = ne[d] == 1 ? BOGUS_STRIDE : stride;
        stride *= ne[d];
    }
}

static void problem_explicit_slopes(problem *p, uint64_t *rng)
{
    free(p->slopes);
    p->slopes = xcalloc((size_t)p->sh.H, sizeof(float));
    for (int64_t h = 0; h < p->sh.H; h++)
        p->slopes[h] = (float)(0.01 + rng_unit(rng));
    p->a.alibi = true;
    p->a.alibi_slopes = p->slopes;
}

/* Additive (Bahdanau) scoring with random W_q, W_k in +-amp and v in +-1. */
static void problem_additive(problem *p, int64_t A, double amp, uint64_t *rng)
{
    int64_t D = p->sh.D;
    free(p->additive);
    p->additive = xcalloc((size_t)(2 * A * D + A), sizeof(float));
    for (int64_t i = 0; i < 2 * A * D; i++)
        p->additive[i] = rng_sym(rng, amp);
    for (int64_t t = 0; t < A; t++)
        p->additive[2 * A * D + t] = rng_sym(rng, 1.0);
    p->a.additive_w_q = p->additive;
    p->a.additive_w_k = p->additive + A * D;
    p->a.additive_v = p->additive + 2 * A * D;
    p->a.additive_dim = A;
}

static void problem_free(problem *p)
{
    free(p->additive);
    free(p->q);
    free(p->k);
    free(p->v);
    free(p->o);
    free(p->weights);
    free(p->lse);
    free(p->pad);
    free(p->kvlen);
    free(p->mask);
    free(p->slopes);
    memset(p, 0, sizeof *p);
}

/* Everything needed to reproduce a case, in one line. */
static void describe(const problem *p, char *buf, size_t n)
{
    const shape *s = &p->sh;
    const eng_sdpa_args *a = &p->a;
    buf[0] = '\0';
    if (p->note)
        appendf(buf, n, "%s: ", p->note);
    appendf(buf, n, "B=%lld H=%lld Hkv=%lld L=%lld S=%lld D=%lld Dv=%lld", (long long)s->B,
            (long long)s->H, (long long)s->Hkv, (long long)s->L, (long long)s->S, (long long)s->D,
            (long long)s->Dv);
    if (s->interleaved)
        appendf(buf, n, " [B,L,H,D]-strided");
    if (s->out_pad)
        appendf(buf, n, " out_pad=%lld", (long long)s->out_pad);
    if (a->scale_set)
        appendf(buf, n, " scale=%g", (double)a->scale);
    if (a->softcap != 0)
        appendf(buf, n, " softcap=%g", (double)a->softcap);
    if (a->causal)
        appendf(buf, n, " causal");
    if (a->align == ENG_ALIGN_BOTTOM_RIGHT)
        appendf(buf, n, " bottom_right");
    if (a->align == ENG_ALIGN_OFFSET)
        appendf(buf, n, " query_offset=%lld", (long long)a->query_offset);
    if (a->window_left_set || a->window_right_set) {
        appendf(buf, n, " window=[");
        if (a->window_left_set)
            appendf(buf, n, "%lld", (long long)a->window_left);
        else
            appendf(buf, n, "null");
        if (a->window_right_set)
            appendf(buf, n, ",%lld]", (long long)a->window_right);
        else
            appendf(buf, n, ",null]");
    }
    if (a->key_padding)
        appendf(buf, n, " key_padding(stride %lld)", (long long)a->key_padding_stride);
    if (a->kv_lengths) {
        appendf(buf, n, " kv_lengths=");
        for (int64_t b = 0; b < s->B && b < 8; b++)
            appendf(buf, n, "%s%lld", b ? "," : "", (long long)a->kv_lengths[b]);
    }
    if (a->attn_mask.kind != ENG_MASK_NONE)
        appendf(buf, n, " %s_mask[%lld,%lld,%lld,%lld] stride=[%lld,%lld,%lld,%lld]",
                a->attn_mask.kind == ENG_MASK_BOOL ? "bool" : "float",
                (long long)a->attn_mask.ne[0], (long long)a->attn_mask.ne[1],
                (long long)a->attn_mask.ne[2], (long long)a->attn_mask.ne[3],
                (long long)a->attn_mask.stride[0], (long long)a->attn_mask.stride[1],
                (long long)a->attn_mask.stride[2], (long long)a->attn_mask.stride[3]);
    if (a->alibi)
        appendf(buf, n, " alibi(%s)", a->alibi_slopes ? "explicit" : "default");
    if (a->additive_w_q)
        appendf(buf, n, " additive(A=%lld)", (long long)a->additive_dim);
    if (a->open_tail_keys)
        appendf(buf, n, " open_tail_keys=%lld", (long long)a->open_tail_keys);
    if (a->weights_mode != ENG_WEIGHTS_NONE)
        appendf(buf, n, " weights=%s", a->weights_mode == ENG_WEIGHTS_MEAN ? "mean" : "per_head");
    if (a->lse)
        appendf(buf, n, " lse");
}

/* ---- Comparing the engine with the reference ----------------------------------------------- */

typedef struct {
    double max_out_err, max_w_err, max_lse_err;
    int64_t rows_empty;
} compare_stats;

/* Runs the engine on p->a and checks it against the reference as the file comment describes.
 * Returns true when everything matched. */
static bool compare_with(problem *p, compare_stats *stats)
{
    char desc[768];
    describe(p, desc, sizeof desc);
    const eng_sdpa_args *a = &p->a;
    const shape *s = &p->sh;
    int64_t B = s->B, H = s->H, L = s->L, S = s->S, Dv = s->Dv;
    int failures_before = check__failures_in_test;

    /* NaN everywhere the engine must write, so that an unwritten element cannot pass. */
    for (size_t i = 0; i < p->no; i++)
        p->o[i] = GAP_SENTINEL;
    view_fill(&a->out, NAN);
    for (size_t i = 0; i < p->nw; i++)
        p->weights[i] = NAN;
    for (size_t i = 0; i < p->nlse; i++)
        p->lse[i] = NAN;

    eng_error err;
    memset(&err, 0, sizeof err);
    eng_status st = eng_sdpa(pool, a, NULL, &err);
    if (st != ENG_OK) {
        CHECKF(st == ENG_OK, "[%s] eng_sdpa returned %s (field '%s': %s)", desc, eng_status_str(st),
               err.field, err.message);
        return false;
    }
    ref_result r;
    if (!ref_sdpa(a, &r)) {
        CHECKF(0, "[%s] the reference ran out of memory", desc);
        return false;
    }

    double maxv = view_max_abs(&a->v);
    double tol_out = 1e-5 * maxv;
    double out_err = 0;
    int64_t bad_at[4] = {-1, -1, -1, -1}, nan_count = 0, empty_nonzero = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < L; i++) {
                int64_t row = (b * H + h) * L + i;
                for (int64_t c = 0; c < Dv; c++) {
                    float e = *view_ptr(&a->out, b, h, i, c);
                    if (isnan(e)) {
                        nan_count++;
                        continue;
                    }
                    if (r.lse[row] == -INFINITY && e != 0.0f)
                        empty_nonzero++;
                    double d = fabs((double)e - r.out[row * Dv + c]);
                    if (d > out_err) {
                        out_err = d;
                        bad_at[0] = b, bad_at[1] = h, bad_at[2] = i, bad_at[3] = c;
                    }
                }
            }
    CHECKF(nan_count == 0, "[%s] %lld output elements are NaN (unwritten or 0/0)", desc,
           (long long)nan_count);
    CHECKF(empty_nonzero == 0, "[%s] %lld output elements of rows with no visible key are not 0",
           desc, (long long)empty_nonzero);
    if (out_err > tol_out) {
        int64_t row = (bad_at[0] * H + bad_at[1]) * L + bad_at[2];
        CHECKF(out_err <= tol_out,
               "[%s] output error %.3g > %.3g at [b=%lld,h=%lld,i=%lld,c=%lld]: engine %.9g, "
               "reference %.9g",
               desc, out_err, tol_out, (long long)bad_at[0], (long long)bad_at[1],
               (long long)bad_at[2], (long long)bad_at[3],
               (double)*view_ptr(&a->out, bad_at[0], bad_at[1], bad_at[2], bad_at[3]),
               r.out[row * Dv + bad_at[3]]);
    }

    /* Nothing outside the output view may change. */
    if (p->sh.out_pad) {
        unsigned char *inside = xcalloc(p->no, 1);
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t i = 0; i < L; i++)
                    for (int64_t c = 0; c < Dv; c++)
                        inside[view_ptr(&a->out, b, h, i, c) - p->o] = 1;
        int64_t clobbered = 0;
        for (size_t i = 0; i < p->no; i++)
            if (!inside[i] && p->o[i] != GAP_SENTINEL)
                clobbered++;
        CHECKF(clobbered == 0, "[%s] %lld elements outside the strided output view were written",
               desc, (long long)clobbered);
        free(inside);
    }

    double lse_err = 0;
    if (p->lse) {
        int64_t mismatched_inf = 0, worst = -1;
        for (int64_t row = 0; row < B * H * L; row++) {
            double e = (double)p->lse[row], want = r.lse[row];
            if (want == -INFINITY || e == -INFINITY || isnan(e)) {
                if (!(e == -INFINITY && want == -INFINITY))
                    mismatched_inf++;
                continue;
            }
            double rel = fabs(e - want) / (1.0 + fabs(want));
            if (rel > lse_err) {
                lse_err = rel;
                worst = row;
            }
        }
        CHECKF(mismatched_inf == 0,
               "[%s] %lld lse values are -inf/NaN where the reference is not, or the reverse", desc,
               (long long)mismatched_inf);
        if (lse_err > 2e-5)
            CHECKF(lse_err <= 2e-5, "[%s] lse row %lld: engine %.9g, reference %.9g", desc,
                   (long long)worst, (double)p->lse[worst], r.lse[worst]);
    }

    double w_err = 0;
    if (p->weights) {
        const double *want = a->weights_mode == ENG_WEIGHTS_MEAN ? r.weights_mean : r.weights;
        int64_t worst = -1, nonzero_hidden = 0, nans = 0;
        for (size_t i = 0; i < p->nw; i++) {
            double e = (double)p->weights[i];
            if (isnan(e)) {
                nans++;
                continue;
            }
            if (want[i] == 0.0 && e != 0.0)
                nonzero_hidden++;
            double d = fabs(e - want[i]);
            if (d > w_err) {
                w_err = d;
                worst = (int64_t)i;
            }
        }
        CHECKF(nans == 0, "[%s] %lld weights are NaN", desc, (long long)nans);
        CHECKF(nonzero_hidden == 0, "[%s] %lld weights are nonzero where the reference has 0", desc,
               (long long)nonzero_hidden);
        if (w_err > 1e-5)
            CHECKF(w_err <= 1e-5, "[%s] weight %lld (row %lld, key %lld): engine %.9g, ref %.9g",
                   desc, (long long)worst, (long long)(worst / S), (long long)(worst % S),
                   (double)p->weights[worst], want[worst]);
    }

    if (stats) {
        stats->max_out_err = out_err;
        stats->max_w_err = w_err;
        stats->max_lse_err = lse_err;
        stats->rows_empty = r.rows_empty;
    }
    ref_result_free(&r);
    return check__failures_in_test == failures_before;
}

static bool compare(problem *p)
{
    return compare_with(p, NULL);
}

/* ---- Golden cases ------------------------------------------------------------------------- */

/* Reads a JSON matrix (or a vector, as one row) into dst; returns false on a shape mismatch. */
static bool json_matrix(const json_t *m, float *dst, size_t cap, int64_t *rows, int64_t *cols)
{
    if (!json_is_array(m) || json_array_size(m) == 0)
        return false;
    bool vector = !json_is_array(json_array_get(m, 0));
    size_t nr = vector ? 1 : json_array_size(m);
    size_t nc = vector ? json_array_size(m) : json_array_size(json_array_get(m, 0));
    if (nr * nc > cap)
        return false;
    for (size_t r = 0; r < nr; r++) {
        const json_t *row = vector ? m : json_array_get(m, r);
        if (!json_is_array(row) || json_array_size(row) != nc)
            return false;
        for (size_t c = 0; c < nc; c++) {
            const json_t *x = json_array_get(row, c);
            if (!json_is_number(x))
                return false;
            dst[r * nc + c] = (float)json_number_value(x);
        }
    }
    *rows = (int64_t)nr;
    *cols = (int64_t)nc;
    return true;
}

/* One single-head attention call from golden matrices; checks weights and output to 1e-5 for
 * the engine and, as a check of the reference itself, for the reference. */
static void golden_call(const char *name, const json_t *query, const json_t *key,
                        const json_t *value, bool causal, const json_t *weights,
                        const json_t *output)
{
    float q[64], k[64], v[64], want_w[64] = {0}, want_o[64] = {0}, out[64], w[64];
    int64_t L = 0, D = 0, S = 0, Dk = 0, Sv = 0, Dv = 0, r = 0, c = 0;
    bool ok = json_matrix(query, q, 64, &L, &D) && json_matrix(key, k, 64, &S, &Dk) &&
              json_matrix(value, v, 64, &Sv, &Dv) && D == Dk && S == Sv;
    CHECKF(ok, "golden '%s': malformed query/key/value", name);
    if (!ok)
        return;
    if (weights) {
        ok = json_matrix(weights, want_w, 64, &r, &c) && r == L && c == S;
        CHECKF(ok, "golden '%s': malformed weights", name);
    }
    if (output) {
        ok = ok && json_matrix(output, want_o, 64, &r, &c) && r == L && c == Dv;
        CHECKF(ok, "golden '%s': malformed output", name);
    }
    if (!ok)
        return;

    eng_sdpa_args a;
    memset(&a, 0, sizeof a);
    a.q = eng_view_contiguous(q, 1, 1, L, D);
    a.k = eng_view_contiguous(k, 1, 1, S, D);
    a.v = eng_view_contiguous(v, 1, 1, S, Dv);
    a.out = eng_view_contiguous(out, 1, 1, L, Dv);
    a.causal = causal;
    a.weights_mode = ENG_WEIGHTS_PER_HEAD;
    a.weights = w;
    eng_error err;
    eng_status st = eng_sdpa(pool, &a, NULL, &err);
    CHECKF(st == ENG_OK, "golden '%s': %s (%s)", name, eng_status_str(st), err.message);
    if (st != ENG_OK)
        return;
    ref_result ref;
    CHECK(ref_sdpa(&a, &ref));
    for (int64_t i = 0; i < L; i++) {
        for (int64_t j = 0; weights && j < S; j++) {
            CHECKF(fabs((double)w[i * S + j] - (double)want_w[i * S + j]) <= 1e-5,
                   "golden '%s' weight [%lld,%lld]: engine %.9g, expected %.9g", name, (long long)i,
                   (long long)j, (double)w[i * S + j], (double)want_w[i * S + j]);
            CHECKF(fabs(ref.weights[i * S + j] - (double)want_w[i * S + j]) <= 1e-5,
                   "golden '%s' weight [%lld,%lld]: reference %.9g, expected %.9g", name,
                   (long long)i, (long long)j, ref.weights[i * S + j], (double)want_w[i * S + j]);
        }
        for (int64_t cc = 0; output && cc < Dv; cc++) {
            CHECKF(fabs((double)out[i * Dv + cc] - (double)want_o[i * Dv + cc]) <= 1e-5,
                   "golden '%s' output [%lld,%lld]: engine %.9g, expected %.9g", name, (long long)i,
                   (long long)cc, (double)out[i * Dv + cc], (double)want_o[i * Dv + cc]);
            CHECKF(fabs(ref.out[i * Dv + cc] - (double)want_o[i * Dv + cc]) <= 1e-5,
                   "golden '%s' output [%lld,%lld]: reference %.9g, expected %.9g", name,
                   (long long)i, (long long)cc, ref.out[i * Dv + cc], (double)want_o[i * Dv + cc]);
        }
    }
    ref_result_free(&ref);
}

/* The "why divide by sqrt(d)" case: d = 64 and raw scores q.k = (8, 4, 0). With V = I the
 * output row equals the weights. scale 1 gives the unscaled softmax; scale 1/8 = 1/sqrt(64),
 * explicit or by default, the scaled one. */
static void golden_scale(const char *name, const json_t *unscaled, const json_t *scaled)
{
    float want_u[3], want_s[3];
    int64_t r = 0, c = 0;
    bool ok = json_matrix(unscaled, want_u, 3, &r, &c) && c == 3 &&
              json_matrix(scaled, want_s, 3, &r, &c) && c == 3;
    CHECKF(ok, "golden '%s': malformed softmax vectors", name);
    if (!ok)
        return;
    float q[64], k[3 * 64], v[9] = {1, 0, 0, 0, 1, 0, 0, 0, 1}, out[3], w[3];
    for (int d = 0; d < 64; d++) {
        q[d] = 1.0f;
        k[d] = 0.125f;       /* q.k0 = 8 */
        k[64 + d] = 0.0625f; /* q.k1 = 4 */
        k[128 + d] = 0.0f;   /* q.k2 = 0 */
    }
    struct {
        bool set;
        float scale;
        const float *want;
    } runs[3] = {{true, 1.0f, want_u}, {true, 0.125f, want_s}, {false, 0.0f, want_s}};
    for (int t = 0; t < 3; t++) {
        eng_sdpa_args a;
        memset(&a, 0, sizeof a);
        a.q = eng_view_contiguous(q, 1, 1, 1, 64);
        a.k = eng_view_contiguous(k, 1, 1, 3, 64);
        a.v = eng_view_contiguous(v, 1, 1, 3, 3);
        a.out = eng_view_contiguous(out, 1, 1, 1, 3);
        a.scale_set = runs[t].set;
        a.scale = runs[t].scale;
        a.weights_mode = ENG_WEIGHTS_PER_HEAD;
        a.weights = w;
        eng_error err;
        eng_status st = eng_sdpa(pool, &a, NULL, &err);
        CHECKF(st == ENG_OK, "golden '%s': %s (%s)", name, eng_status_str(st), err.message);
        if (st != ENG_OK)
            continue;
        for (int j = 0; j < 3; j++) {
            CHECKF(fabs((double)w[j] - (double)runs[t].want[j]) <= 1e-5,
                   "golden '%s' (scale %s %g) weight %d: %.9g vs %.9g", name,
                   runs[t].set ? "=" : "default", (double)runs[t].scale, j, (double)w[j],
                   (double)runs[t].want[j]);
            CHECKF(fabs((double)out[j] - (double)runs[t].want[j]) <= 1e-5,
                   "golden '%s' (scale %s %g) output %d: %.9g vs %.9g", name,
                   runs[t].set ? "=" : "default", (double)runs[t].scale, j, (double)out[j],
                   (double)runs[t].want[j]);
        }
    }
}

static void test_golden_seed_cases(void)
{
    json_error_t jerr;
    json_t *root = json_load_file(GOLDEN_PATH, 0, &jerr);
    CHECKF(root != NULL, "cannot read %s: %s (line %d)", GOLDEN_PATH, jerr.text, jerr.line);
    if (!root)
        return;
    const json_t *cases = json_object_get(root, "cases");
    CHECK(json_is_array(cases));
    int sdpa_cases = 0;
    size_t idx;
    const json_t *c;
    json_array_foreach(cases, idx, c)
    {
        const char *name = json_string_value(json_object_get(c, "name"));
        name = name ? name : "(unnamed)";
        const json_t *queries = json_object_get(c, "queries");
        if (queries) {
            /* One query at a time against the same keys. */
            size_t qi;
            const json_t *one;
            json_array_foreach(queries, qi, one)
            {
                golden_call(name, json_object_get(one, "query"), json_object_get(c, "key"),
                            json_object_get(c, "value"), false, json_object_get(one, "weights"),
                            json_object_get(one, "output"));
            }
            sdpa_cases++;
        } else if (json_object_get(c, "softmax_unscaled")) {
            golden_scale(name, json_object_get(c, "softmax_unscaled"),
                         json_object_get(c, "softmax_scaled_by_8"));
            sdpa_cases++;
        } else if (json_object_get(c, "query")) {
            golden_call(name, json_object_get(c, "query"), json_object_get(c, "key"),
                        json_object_get(c, "value"), json_is_true(json_object_get(c, "causal")),
                        json_object_get(c, "weights"), json_object_get(c, "output"));
            sdpa_cases++;
        }
        /* Other cases (positional encodings, head arithmetic) concern other modules. */
    }
    CHECKF(sdpa_cases >= 4, "expected at least 4 attention cases in %s, found %d", GOLDEN_PATH,
           sdpa_cases);
    json_decref(root);
}

/* ---- Basics ------------------------------------------------------------------------------- */

static void test_view_contiguous_strides(void)
{
    float x[1];
    eng_view v = eng_view_contiguous(x, 2, 3, 5, 7);
    CHECK(v.data == x);
    CHECK_EQ_INT(v.ne[0], 2);
    CHECK_EQ_INT(v.ne[1], 3);
    CHECK_EQ_INT(v.ne[2], 5);
    CHECK_EQ_INT(v.ne[3], 7);
    CHECK_EQ_INT(v.stride[0], 105);
    CHECK_EQ_INT(v.stride[1], 35);
    CHECK_EQ_INT(v.stride[2], 7);
    CHECK_EQ_INT(v.stride[3], 1);
}

static void test_alibi_default_slopes_match_formula(void)
{
    /* The reference formula itself, pinned by hand: 12 heads are the 8-head set
     * 2^-1 .. 2^-8 followed by 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5 (even indices of the 16-head set). */
    double r12[12];
    ref_alibi_default_slopes(12, r12);
    const double hand12[12] = {0.5,        0.25,       0.125,      0.0625,
                               0.03125,    0.015625,   0.0078125,  0.00390625,
                               0.70710678, 0.35355339, 0.17677670, 0.08838835};
    for (int h = 0; h < 12; h++)
        CHECK_NEAR(r12[h], hand12[h], 1e-8);
    double r6[6];
    ref_alibi_default_slopes(6, r6); /* 4-head set 2^-2..2^-8 step 2, then 2^-1, 2^-3 */
    const double hand6[6] = {0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125};
    for (int h = 0; h < 6; h++)
        CHECK_NEAR(r6[h], hand6[h], 1e-12);

    /* The engine against the reference formula, for power-of-two and other head counts. */
    const int64_t counts[] = {1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 20, 24, 32, 40, 48, 64, 96, 100};
    for (size_t t = 0; t < sizeof counts / sizeof counts[0]; t++) {
        int64_t H = counts[t];
        float got[101];
        double want[100];
        for (int h = 0; h < 101; h++)
            got[h] = NAN;
        eng_alibi_default_slopes(H, got);
        ref_alibi_default_slopes(H, want);
        for (int64_t h = 0; h < H; h++)
            CHECKF(fabs((double)got[h] - want[h]) <= 1e-6 * want[h],
                   "H=%lld slope %lld: engine %.9g, formula %.9g", (long long)H, (long long)h,
                   (double)got[h], want[h]);
        CHECKF(isnan(got[H]), "H=%lld: eng_alibi_default_slopes wrote past slopes[H-1]",
               (long long)H);
    }
}

/* ---- Shapes ------------------------------------------------------------------------------- */

/* The lengths test_random_configurations draws L and S from (sdpa_cases.json's grids list the
 * same): block edges (63, 64, 65), several blocks, and the ragged 267, 514 and 1030. */
static const int64_t all_lengths[] = {1, 2, 63, 64, 65, 267, 514, 1030};
static const int64_t quick_lengths[] = {1, 2, 63, 64, 65, 267};

static size_t n_lengths(void)
{
    return quick ? sizeof quick_lengths / sizeof quick_lengths[0]
                 : sizeof all_lengths / sizeof all_lengths[0];
}

static int64_t length_at(size_t i)
{
    return quick ? quick_lengths[i] : all_lengths[i];
}

/* ---- Padding, lengths, masks -------------------------------------------------------------- */

/* A [L, S] mask stored transposed ([S, L] memory) and one with padded rows: the mask strides are
 * free like the views' (only the operands need an inner stride of 1). */
static void test_attn_mask_strided(void)
{
    uint64_t rng = 111;
    const int64_t L = 65, S = 130;
    for (int kind = 0; kind < 2; kind++)
        for (int layout = 0; layout < 2; layout++) {
            problem p;
            shape sh = shape_of(1, 2, 2, L, S, 16, 16);
            sh.q_amp = 2.0;
            problem_init(&p, &sh, &rng);
            int64_t ne[4] = {1, 1, L, S};
            problem_mask(&p, kind ? ENG_MASK_FLOAT : ENG_MASK_BOOL, ne, 0.7, &rng);
            /* Re-make the data in the strided layout from a fresh random [L, S] pattern. */
            size_t n = layout == 0 ? (size_t)(S * L) : (size_t)(L * (S + 7));
            free(p.mask);
            p.mask = xcalloc(n, kind ? sizeof(float) : 1);
            for (size_t i = 0; i < n; i++) {
                bool keep = rng_unit(&rng) < 0.7;
                if (kind)
                    ((float *)p.mask)[i] = keep ? rng_sym(&rng, 2.0) : -INFINITY;
                else
                    ((uint8_t *)p.mask)[i] = (uint8_t)keep;
            }
            p.a.attn_mask.data = p.mask;
            if (layout == 0) { /* transposed: element (i, j) at j * L + i */
                p.a.attn_mask.stride[2] = 1;
                p.a.attn_mask.stride[3] = L;
            } else { /* padded rows */
                p.a.attn_mask.stride[2] = S + 7;
                p.a.attn_mask.stride[3] = 1;
            }
            problem_outputs(&p, ENG_WEIGHTS_PER_HEAD, true);
            p.note = layout == 0 ? "transposed [L,S] mask" : "row-padded [L,S] mask";
            compare(&p);
            problem_free(&p);
        }
}

/* A float mask of large finite negatives does not make a row empty: with scale 0 every score is
 * exactly the mask value, so the row is the plain mean of the values, and lse = mask + log S. */
static void test_large_finite_negative_mask_is_not_empty(void)
{
    uint64_t rng = 112;
    const float values[] = {-1e9f, -1e30f, -FLT_MAX};
    for (int t = 0; t < 3; t++) {
        problem p;
        shape sh = shape_of(1, 1, 1, 4, 100, 8, 8);
        problem_init(&p, &sh, &rng);
        int64_t ne[4] = {1, 1, 4, 100};
        problem_mask(&p, ENG_MASK_FLOAT, ne, 1.0, &rng);
        float *m = p.mask;
        for (int64_t i = 0; i < 400; i++)
            m[i] = values[t];
        m[2 * 100 + 5] = -INFINITY; /* row 2: one key hidden, the rest at the large value */
        for (int64_t j = 0; j < 100; j++)
            m[3 * 100 + j] = j < 50 ? -INFINITY : values[t]; /* row 3: half hidden */
        p.a.scale_set = true;
        p.a.scale = 0.0f;
        problem_outputs(&p, ENG_WEIGHTS_PER_HEAD, true);
        p.note = "large finite negative float mask";
        compare_stats st = {0};
        compare_with(&p, &st);
        CHECK_EQ_INT(st.rows_empty, 0);
        for (int64_t i = 0; i < 4; i++)
            CHECKF(isfinite(p.lse[i]), "mask value %g: row %lld lse %g should be finite",
                   (double)values[t], (long long)i, (double)p.lse[i]);
        problem_free(&p);
    }
}

/* ---- Biases and score transforms ---------------------------------------------------------- */

/* scale 0 gives the plain mean of the visible values; negative scales flip the preference. */
static void test_zero_and_negative_scale(void)
{
    uint64_t rng = 116;
    const float scales[] = {0.0f, -1.0f, -0.125f, 2.0f};
    for (int t = 0; t < 4; t++) {
        problem p;
        shape sh = shape_of(1, 2, 2, 65, 267, 16, 16);
        problem_init(&p, &sh, &rng);
        p.a.scale_set = true;
        p.a.scale = scales[t];
        p.a.causal = true;
        problem_outputs(&p, ENG_WEIGHTS_PER_HEAD, true);
        p.note = "explicit scale";
        compare(&p);
        if (t == 0) {
            /* Row i sees keys 0..i: the output is their mean, independently of the reference. */
            for (int64_t i = 0; i < 65; i += 16) {
                double mean = 0;
                for (int64_t j = 0; j <= i; j++)
                    mean += (double)p.v[j * 16 + 3];
                mean /= (double)(i + 1);
                CHECK_NEAR(*view_ptr(&p.a.out, 0, 0, i, 3), mean, 1e-5);
            }
        }
        problem_free(&p);
    }
}

/* Rows with no visible key, made every way the rules allow: output 0, weights 0, lse -inf. */
static void test_rows_without_visible_keys(void)
{
    uint64_t rng = 118;
    for (int how = 0; how < 5; how++) {
        problem p;
        shape sh = shape_of(2, 2, 2, 20, 70, 16, 16);
        problem_init(&p, &sh, &rng);
        switch (how) {
        case 0: { /* boolean mask rows all false */
            int64_t ne[4] = {1, 2, 20, 70};
            problem_mask(&p, ENG_MASK_BOOL, ne, 0.9, &rng);
            memset((uint8_t *)p.mask + 3 * 70, 0, 70);
            memset((uint8_t *)p.mask + (20 + 7) * 70, 0, 70);
            break;
        }
        case 1: { /* float mask rows all -inf */
            int64_t ne[4] = {2, 1, 20, 70};
            problem_mask(&p, ENG_MASK_FLOAT, ne, 0.9, &rng);
            for (int64_t j = 0; j < 70; j++)
                ((float *)p.mask)[5 * 70 + j] = -INFINITY;
            break;
        }
        case 2: /* causal with queries before every key */
            p.a.causal = true;
            p.a.align = ENG_ALIGN_OFFSET;
            p.a.query_offset = -10;
            break;
        case 3: /* a window that lies past the last key */
            p.a.align = ENG_ALIGN_OFFSET;
            p.a.query_offset = 60;
            p.a.window_left_set = p.a.window_right_set = true;
            p.a.window_left = 0;
            p.a.window_right = 0;
            break;
        case 4: { /* kv_lengths 0 */
            int64_t lengths[2] = {70, 0};
            problem_kv_lengths(&p, lengths);
            break;
        }
        }
        problem_outputs(&p, how % 2 ? ENG_WEIGHTS_MEAN : ENG_WEIGHTS_PER_HEAD, true);
        p.note = "rows with no visible key";
        compare_stats st = {0};
        compare_with(&p, &st);
        CHECKF(st.rows_empty > 0, "case %d made no empty row", how);
        problem_free(&p);
    }
}

/* Scores near +1e4 and -1e4. Inputs are small integers and scale is 1, so fp32 computes every
 * score exactly; a kernel that exponentiates without subtracting the row maximum overflows to
 * inf (or underflows to 0/0) here. */
static void test_scores_near_plus_minus_1e4(void)
{
    uint64_t rng = 119;
    for (int t = 0; t < 2; t++) {
        problem p;
        shape sh = shape_of(1, 2, 2, 65, quick ? 514 : 1030, 16, 16);
        problem_init(&p, &sh, &rng);
        for (int64_t h = 0; h < 2; h++)
            for (int64_t i = 0; i < 65; i++) {
                float *q = view_ptr(&p.a.q, 0, h, i, 0);
                q[0] = (i % 2) ? 100.0f : -100.0f; /* odd rows near +1e4, even near -1e4 */
                for (int d = 1; d < 16; d++)
                    q[d] = (float)rng_int(&rng, -1, 1);
            }
        for (int64_t h = 0; h < 2; h++)
            for (int64_t j = 0; j < sh.S; j++) {
                float *k = view_ptr(&p.a.k, 0, h, j, 0);
                k[0] = 100.0f;
                for (int d = 1; d < 16; d++)
                    k[d] = (float)rng_int(&rng, -1, 1);
            }
        p.a.scale_set = true;
        p.a.scale = 1.0f;
        p.a.causal = t == 1;
        problem_outputs(&p, ENG_WEIGHTS_PER_HEAD, true);
        p.note = "scores near +-1e4";
        compare(&p);
        for (int64_t i = 0; i < 2; i++)
            CHECKF(fabs((double)p.lse[i]) > 9000.0, "row %lld: lse %g should be near +-1e4",
                   (long long)i, (double)p.lse[i]);
        problem_free(&p);
    }
}

/* Builds q and k so that the row maximum arrives late: early keys score within +-2, keys in the
 * middle about 16 and the last six keys about 32. All numbers are dyadic with few bits, so fp32
 * scores are exact. A kernel that forgets to rescale its accumulator when the maximum grows
 * keeps the early keys at weight ~1 and fails by a wide margin. */
static void make_late_maximum(problem *p, uint64_t *rng)
{
    const shape *s = &p->sh;
    int64_t D = s->D, half = D / 2;
    float *u = xcalloc((size_t)half, sizeof(float));
    for (int64_t d = 0; d < half; d++)
        u[d] = rng_unit(rng) < 0.5 ? -1.0f : 1.0f;
    for (int64_t b = 0; b < s->B; b++)
        for (int64_t h = 0; h < s->H; h++)
            for (int64_t i = 0; i < s->L; i++) {
                float *q = view_ptr(&p->a.q, b, h, i, 0);
                for (int64_t d = 0; d < D; d++)
                    q[d] = d < half ? u[d] : (rng_unit(rng) < 0.5 ? -1.0f : 1.0f);
            }
    for (int64_t b = 0; b < s->B; b++)
        for (int64_t h = 0; h < s->Hkv; h++)
            for (int64_t j = 0; j < s->S; j++) {
                float *k = view_ptr(&p->a.k, b, h, j, 0);
                float boost = j >= s->S - 6                          ? 8.0f
                              : (j >= s->S / 2 && j < s->S / 2 + 20) ? 4.0f
                                                                     : 0.0f;
                for (int64_t d = 0; d < D; d++)
                    k[d] =
                        (d < half && boost > 0) ? boost * u[d] : (float)rng_int(rng, -2, 2) / 8.0f;
            }
    p->a.scale_set = true;
    p->a.scale = 1.0f / 8.0f;
    free(u);
}

static void test_row_maximum_arrives_late(void)
{
    uint64_t rng = 120;
    struct {
        int64_t L, S;
    } shapes[] = {{65, 1030}, {1, 20000}, {4, 4097}, {267, 514}};
    for (int t = 0; t < 4; t++) {
        problem p;
        int64_t S = quick ? (shapes[t].S > 4097 ? 4097 : shapes[t].S) : shapes[t].S;
        shape sh = shape_of(1, 2, 1, shapes[t].L, S, 64, 64);
        problem_init(&p, &sh, &rng);
        make_late_maximum(&p, &rng);
        problem_outputs(&p, ENG_WEIGHTS_NONE, true);
        p.note = "late row maximum";
        compare(&p);
        problem_free(&p);
    }
}

/* ---- Layouts ------------------------------------------------------------------------------ */

/* A stride of 0 broadcasts: every query head reading one shared key/value head through
 * head stride 0, and two batches sharing one query through batch stride 0. */
static void test_zero_stride_broadcast_views(void)
{
    uint64_t rng = 122;
    problem p;
    shape sh = shape_of(2, 3, 3, 33, 70, 16, 16);
    problem_init(&p, &sh, &rng);
    p.a.k.stride[1] = 0;
    p.a.v.stride[1] = 0;
    p.a.q.stride[0] = 0;
    problem_outputs(&p, ENG_WEIGHTS_PER_HEAD, true);
    p.note = "zero strides";
    compare(&p);
    problem_free(&p);
}

/* V's rows on cache lines are read where they lie (the avx512 set's wide tile), others are
 * packed first: the output is the reference's either way, and the same bits. Ragged Dv (row
 * strides padded to whole lines), a ragged last key block, causal or not, and query blocks
 * that share K panels packed once per head. */
static void test_value_alignment_never_changes_the_output(void)
{
    static const int64_t dvs[] = {16, 40, 64, 80, 128, 200};
    const int64_t L = quick ? 40 : 600, S = quick ? 300 : 700, H = 2;
    uint64_t rng = 77;
    for (size_t i = 0; i < sizeof dvs / sizeof dvs[0]; i++)
        for (int causal = 0; causal < 2; causal++) {
            const int64_t Dv = dvs[i], ld = (Dv + 15) / 16 * 16, n = H * S * ld;
            shape sh = shape_of(1, H, H, L, S, 32, Dv);
            problem p;
            problem_init(&p, &sh, &rng);
            /* Two copies of V in one block: on cache lines, and one float past them. */
            const size_t lined_floats = (size_t)(n + 16) / 16 * 16;
            float *mem = aligned_alloc(64, (lined_floats + (size_t)n + 16) * sizeof(float));
            CHECK(mem != NULL);
            if (!mem) {
                problem_free(&p);
                return;
            }
            float *lined = mem, *shifted = mem + lined_floats + 1;
            for (int64_t h = 0; h < H; h++)
                for (int64_t j = 0; j < S; j++)
                    for (int64_t c = 0; c < Dv; c++)
                        lined[(h * S + j) * ld + c] = shifted[(h * S + j) * ld + c] =
                            p.v[(h * S + j) * Dv + c];
            p.a.v = view_of(lined, 1, H, S, Dv, H * S * ld, S * ld, ld);
            p.a.causal = causal;
            char note[64];
            snprintf(note, sizeof note, "V on cache lines, Dv %lld causal %d", (long long)Dv,
                     causal);
            p.note = note;
            compare(&p);
            float *first = xcalloc(p.no, sizeof(float));
            memcpy(first, p.o, p.no * sizeof(float));
            p.a.v.data = shifted;
            eng_error err;
            CHECK(eng_sdpa(pool, &p.a, NULL, &err) == ENG_OK);
            CHECKF(memcmp(first, p.o, p.no * sizeof(float)) == 0,
                   "Dv %lld causal %d: V one float off the cache lines gives other bits",
                   (long long)Dv, causal);
            free(first);
            free(mem);
            problem_free(&p);
        }
}

/* A row stride is BLAS's leading dimension: below the row length the rows would overlap, and
 * BLAS itself would refuse it, so the engine refuses it first and names the operand. */
static void test_row_stride_below_row_length_is_refused(void)
{
    uint64_t rng = 129;
    problem p;
    shape sh = shape_of(1, 2, 2, 9, 70, 16, 16);
    problem_init(&p, &sh, &rng);
    eng_error err;
    p.a.q.stride[2] = 0;
    CHECK_EQ_INT(eng_sdpa(pool, &p.a, NULL, &err), ENG_EINVAL);
    CHECK(strcmp(err.field, "q") == 0);
    p.a.q.stride[2] = 16;
    p.a.k.stride[2] = 15;
    CHECK_EQ_INT(eng_sdpa(pool, &p.a, NULL, &err), ENG_EINVAL);
    CHECK(strcmp(err.field, "k") == 0);
    problem_free(&p);
}

/* kv_lengths marks where a KV cache ends: what lies beyond (here NaN, as uninitialised cache
 * memory may hold) is ignored and cannot leak into the result. */
static void test_keys_beyond_kv_lengths_are_ignored(void)
{
    uint64_t rng = 131;
    for (int decode = 0; decode < 2; decode++) {
        problem p;
        shape sh = shape_of(2, 2, 1, decode ? 1 : 65, decode ? 4097 : 267, 64, 64);
        problem_init(&p, &sh, &rng);
        int64_t lengths[2] = {sh.S / 3, sh.S - 1};
        problem_kv_lengths(&p, lengths);
        for (int64_t b = 0; b < 2; b++)
            for (int64_t j = lengths[b]; j < sh.S; j++) {
                for (int64_t d = 0; d < 64; d++) {
                    *view_ptr(&p.a.k, b, 0, j, d) = NAN;
                    *view_ptr(&p.a.v, b, 0, j, d) = NAN;
                }
            }
        /* The reference never reads them either; max|V| must skip the NaN. */
        problem_outputs(&p, ENG_WEIGHTS_NONE, true);
        p.note = "NaN beyond kv_lengths";
        p.a.causal = decode == 0;
        compare(&p);
        problem_free(&p);
    }
}

/* A window that starts past the keys, with open tail keys after them (an MHA layer's bias_kv
 * and zero key) and key padding over exactly the keys before the tail: rows whose window lies
 * past every key see the tail only, the others their window and the tail, with every
 * weights mode; and nothing reads padding past its last key, which ends where an
 * inaccessible page begins. */
static void test_window_past_the_keys_sees_only_the_open_tail(void)
{
    uint64_t rng = 141;
    const eng_weights_mode modes[] = {ENG_WEIGHTS_NONE, ENG_WEIGHTS_PER_HEAD, ENG_WEIGHTS_MEAN};
    for (int m = 0; m < 3; m++) {
        problem p;
        shape sh = shape_of(2, 2, 1, 20, 72, 16, 16);
        problem_init(&p, &sh, &rng);
        p.a.open_tail_keys = 2;
        problem_padding(&p, false, 0, 0.3, &rng);
        size_t bytes = (size_t)(sh.B * (sh.S - p.a.open_tail_keys));
        guarded g;
        uint8_t *pad = guarded_alloc(bytes, &g);
        memcpy(pad, p.pad, bytes);
        p.a.key_padding = pad;
        p.a.align = ENG_ALIGN_OFFSET;
        p.a.query_offset = 60; /* positions 60..79 against keys 0..69: rows 10.. see none */
        p.a.window_left_set = true;
        p.a.window_left = 0;
        problem_outputs(&p, modes[m], true);
        p.note = "window past the keys, open tail";
        compare(&p);
        guarded_free(&g);
        problem_free(&p);
    }
}

/* A NaN or inf in the inputs of a visible key cannot come back as a successful result full of
 * NaN: the engine reports ENG_ENONFINITE (or rejects the input as ENG_EINVAL). */
static void test_nonfinite_inputs_are_reported(void)
{
    uint64_t rng = 132;
    for (int t = 0; t < 3; t++) {
        problem p;
        shape sh = shape_of(1, 1, 1, 4, 70, 16, 16);
        problem_init(&p, &sh, &rng);
        if (t == 0)
            p.v[5 * 16 + 2] = NAN;
        else if (t == 1)
            p.k[7 * 16] = INFINITY;
        else
            p.q[16 + 3] = NAN;
        problem_outputs(&p, ENG_WEIGHTS_NONE, true);
        eng_error err;
        eng_status st = eng_sdpa(pool, &p.a, NULL, &err);
        const char *what[3] = {"NaN in v", "inf in k", "NaN in q"};
        CHECKF(st == ENG_ENONFINITE || st == ENG_EINVAL, "%s: status %s", what[t],
               eng_status_str(st));
        problem_free(&p);
    }
}

/* ---- Random configurations ------------------------------------------------------------------ */

/* Many random combinations of every option, each against the reference. ALiBi is kept to
 * cases where each query has a visible key near its own position: an fp32 bias of magnitude
 * |b| carries an error of 2^-24 |b|, so a row whose nearest visible key is hundreds of
 * positions away cannot match a float64 reference to 1e-5 whatever the kernel does. */
static void test_random_configurations(void)
{
    uint64_t rng = 133;
    const int64_t dims[] = {8, 16, 64, 80, 128};
    const int64_t heads[][2] = {{1, 1}, {2, 1}, {2, 2}, {4, 1},  {4, 2},
                                {6, 2}, {6, 3}, {8, 2}, {12, 4}, {3, 3}};
    int cases = quick ? 100 : 600;
    for (int c = 0; c < cases; c++) {
        shape sh;
        memset(&sh, 0, sizeof sh);
        const int64_t *hh;
        do { /* keep each case below ~4e7 reference multiply-adds */
            sh.L = length_at((size_t)rng_int(&rng, 0, (int64_t)n_lengths() - 1));
            sh.S = length_at((size_t)rng_int(&rng, 0, (int64_t)n_lengths() - 1));
            sh.D = dims[rng_int(&rng, 0, 4)];
            sh.Dv = rng_unit(&rng) < 0.5 ? sh.D : dims[rng_int(&rng, 0, 4)];
            hh = heads[rng_int(&rng, 0, 9)];
            sh.B = rng_int(&rng, 1, 3);
        } while (sh.B * hh[0] * sh.L * sh.S * (sh.D + sh.Dv) > 40000000);
        sh.H = hh[0];
        sh.Hkv = hh[1];
        sh.interleaved = rng_unit(&rng) < 0.3;
        sh.out_pad = rng_unit(&rng) < 0.3 ? 3 : 0;
        sh.q_amp = 0.5 + 2.5 * rng_unit(&rng);
        problem p;
        problem_init(&p, &sh, &rng);
        eng_sdpa_args *a = &p.a;

        bool alibi = rng_unit(&rng) < 0.25 && sh.L <= sh.S;
        a->causal = rng_unit(&rng) < 0.5;
        a->align = (eng_align)rng_int(&rng, 0, alibi ? 1 : 2);
        if (a->align == ENG_ALIGN_OFFSET)
            a->query_offset = rng_int(&rng, -sh.L, sh.S + 10);
        if (rng_unit(&rng) < 0.3) {
            a->window_left_set = rng_unit(&rng) < 0.8;
            a->window_right_set = rng_unit(&rng) < 0.5;
            a->window_left = rng_int(&rng, 0, sh.S);
            a->window_right = rng_int(&rng, 0, 40);
        }
        if (!alibi && rng_unit(&rng) < 0.3)
            problem_padding(&p, rng_unit(&rng) < 0.3, rng_unit(&rng) < 0.3 ? sh.S / 2 : 0,
                            rng_unit(&rng) * 0.5, &rng);
        if (!alibi && rng_unit(&rng) < 0.3) {
            int64_t lengths[3];
            for (int b = 0; b < 3; b++)
                lengths[b] = rng_int(&rng, 0, sh.S);
            problem_kv_lengths(&p, lengths);
        }
        double pm = rng_unit(&rng);
        if (pm < 0.4) {
            int64_t ne[4] = {rng_unit(&rng) < 0.5 ? sh.B : 1, rng_unit(&rng) < 0.5 ? sh.H : 1,
                             rng_unit(&rng) < 0.7 ? sh.L : 1, rng_unit(&rng) < 0.9 ? sh.S : 1};
            bool as_bool = !alibi && pm < 0.2;
            problem_mask(&p, as_bool ? ENG_MASK_BOOL : ENG_MASK_FLOAT, ne,
                         as_bool ? 0.3 + 0.7 * rng_unit(&rng) : 0.9, &rng);
        }
        if (alibi) {
            if (rng_unit(&rng) < 0.5)
                problem_explicit_slopes(&p, &rng);
            else
                a->alibi = true;
        }
        if (rng_unit(&rng) < 0.2)
            a->softcap = (float)(1.0 + 30.0 * rng_unit(&rng));
        if (rng_unit(&rng) < 0.1 && sh.L * sh.S <= 70000)
            problem_additive(&p, rng_int(&rng, 1, 24), 0.5, &rng);
        if (rng_unit(&rng) < 0.2) {
            a->scale_set = true;
            a->scale = (float)(rng_unit(&rng) * 0.6 - 0.2);
        }
        double pw = rng_unit(&rng);
        problem_outputs(&p,
                        pw < 0.3   ? ENG_WEIGHTS_PER_HEAD
                        : pw < 0.5 ? ENG_WEIGHTS_MEAN
                                   : ENG_WEIGHTS_NONE,
                        rng_unit(&rng) < 0.7);
        char note[32];
        snprintf(note, sizeof note, "random case %d", c);
        p.note = note;
        compare(&p);
        problem_free(&p);
    }
}

/* ---- The data cases: tests/engine/cases/sdpa_cases.json ---------------------------------- */

/* The declarative part of this specification lives in a data file (ATTND_SDPA_CASES names
 * another): {"tests": [TEST, ...]}, each TEST one named behaviour, run as one test here:
 *
 *   {"name": "...", "about": "...",  the behaviour, and what it shows
 *    "seed": 101,                    one random sequence for the whole test, drawn case by case
 *    "within_s": 120,                the time limit of the test (RUN_WITHIN)
 *    "grid": {"L": [...], "S": [...]},  optional: every case once per (L, S), L outer, with
 *    "quick_grid": {...},            "$L" and "$S" in its shape; quick_grid under QUICK
 *    "rows_empty_total": {"min": 1}, optional: over all cases, rows with no visible key
 *    "cases": [CASE, ...]}
 *
 *   CASE: {"shape": [B, H, Hkv, L, S, D, Dv],       q entries in [-q_amp, q_amp), k and v in
 *          "q_amp": 2, "k_amp": 5,                  [-1, 1) (k then times k_amp)
 *          "interleaved": true, "out_pad": 5,       [B, L, H, D] memory; gaps in the output
 *          "quick": {"S": 267, ...} | "skip",       under ATTND_TEST_QUICK=1: fields that
 *                                                   replace the case's (L, S: the shape's)
 *          "causal": true, "align": "top_left" | "bottom_right" | "offset", "query_offset": n,
 *          "window": [left | null, right | null], "scale": x, "softcap": x,
 *          "alibi": "default" | "explicit", "open_tail_keys": n,
 *          "additive": {"dim": A, "amp": 0.5},      W_q, W_k in +-amp, v in +-1
 *          "padding": {"shared": false, "first": n, "fraction": f, "padded_batches": [b]},
 *          "kv_lengths": [n, ...],                  one per batch
 *          "mask": {"kind": "bool" | "float", "ne": [1 | "B", 1 | "H", 1 | "L", 1 | "S"],
 *                   "density": d, "zero_prefix": n},  the first n elements hidden
 *          "weights": "none" | "per_head" | "mean", "lse": true,   the outputs compared
 *          "then_weights": "per_head",              the same problem compared once more
 *          "rows_empty": n | {"min": n},            rows with no visible key
 *          "note": "..."}
 *
 * Numbers that depend on the shape may be written as expressions of S, L, B, H and integers
 * with + - * / ("S/2+1", "S-14"). Each case is compared with the reference as compare_with
 * says (the tolerances of the file comment); the random draws happen in a fixed order (q, k,
 * v; additive; padding; mask; explicit slopes), the order the hand-written tests used. */

static const char *const test_keys[] = {"name", "about",      "seed",  "within_s",
                                        "grid", "quick_grid", "cases", "rows_empty_total"};
static const char *const case_keys[] = {
    "note",        "shape",      "quick",        "q_amp", "k_amp",
    "interleaved", "out_pad",    "causal",       "align", "query_offset",
    "window",      "scale",      "softcap",      "alibi", "open_tail_keys",
    "additive",    "padding",    "kv_lengths",   "mask",  "weights",
    "lse",         "rows_empty", "then_weights", "L",     "S"};
static const char *const padding_keys[] = {"shared", "first", "fraction", "padded_batches"};
static const char *const mask_keys[] = {"kind", "ne", "density", "zero_prefix"};
static const char *const additive_keys[] = {"dim", "amp"};

static json_t *case_file;
static const json_t *case_test; /* the TEST being run */
static char case_where[160];    /* "test name, case i", for failure messages */

static bool keys_known(const json_t *obj, const char *const *keys, size_t n, const char *what)
{
    const char *key;
    json_t *v;
    bool ok = json_is_object(obj);
    CHECKF(ok, "%s: %s is not an object", case_where, what);
    json_object_foreach((json_t *)obj, key, v)
    {
        size_t i = 0;
        while (i < n && strcmp(keys[i], key) != 0)
            i++;
        CHECKF(i < n, "%s: unknown key \"%s\" in %s", case_where, key, what);
        ok = ok && i < n;
    }
    return ok;
}
#define KEYS_KNOWN(obj, keys, what) keys_known(obj, keys, sizeof keys / sizeof keys[0], what)

/* An integer expression of the shape: integers, S, L, B, H, + - * / (left to right, * and /
 * first). Sets *ok to false on a syntax error. */
static int64_t expr_primary(const char **s, const shape *sh, bool *ok)
{
    while (**s == ' ')
        (*s)++;
    char c = **s;
    if (c >= '0' && c <= '9') {
        char *end;
        long long v = strtoll(*s, &end, 10);
        *s = end;
        return v;
    }
    (*s)++;
    switch (c) {
    case 'S':
        return sh->S;
    case 'L':
        return sh->L;
    case 'B':
        return sh->B;
    case 'H':
        return sh->H;
    default:
        *ok = false;
        return 0;
    }
}

static int64_t expr_term(const char **s, const shape *sh, bool *ok)
{
    int64_t v = expr_primary(s, sh, ok);
    for (;;) {
        while (**s == ' ')
            (*s)++;
        char op = **s;
        if (op != '*' && op != '/')
            return v;
        (*s)++;
        int64_t r = expr_primary(s, sh, ok);
        if (op == '/' && r == 0) {
            *ok = false;
            return 0;
        }
        v = op == '*' ? v * r : v / r;
    }
}

static int64_t case_int(const json_t *v, const shape *sh, const char *what)
{
    if (json_is_integer(v))
        return json_integer_value(v);
    const char *text = json_string_value(v), *s = text;
    bool ok = text != NULL;
    int64_t x = ok ? expr_term(&s, sh, &ok) : 0;
    while (ok && *s) {
        while (*s == ' ')
            s++;
        char op = *s++;
        if (op != '+' && op != '-') {
            ok = false;
            break;
        }
        int64_t r = expr_term(&s, sh, &ok);
        x = op == '+' ? x + r : x - r;
    }
    CHECKF(ok, "%s: %s is not an integer or an expression of S, L, B, H", case_where, what);
    return ok ? x : 0;
}

static eng_weights_mode weights_mode_of(const json_t *v)
{
    const char *s = json_string_value(v);
    if (!v || (s && strcmp(s, "none") == 0))
        return ENG_WEIGHTS_NONE;
    if (s && strcmp(s, "per_head") == 0)
        return ENG_WEIGHTS_PER_HEAD;
    CHECKF(s && strcmp(s, "mean") == 0, "%s: weights \"%s\"", case_where, s ? s : "?");
    return ENG_WEIGHTS_MEAN;
}

/* Builds the case's shape: the "shape" array, "$L" and "$S" from the grid point, then "L" and
 * "S" fields (which "quick" may bring). */
static bool case_shape(const json_t *c, int64_t grid_l, int64_t grid_s, shape *sh)
{
    const json_t *a = json_object_get(c, "shape");
    memset(sh, 0, sizeof *sh);
    CHECKF(json_array_size(a) == 7, "%s: shape is not [B, H, Hkv, L, S, D, Dv]", case_where);
    if (json_array_size(a) != 7)
        return false;
    int64_t d[7];
    for (size_t i = 0; i < 7; i++) {
        const char *s = json_string_value(json_array_get(a, i));
        if (s && strcmp(s, "$L") == 0)
            d[i] = grid_l;
        else if (s && strcmp(s, "$S") == 0)
            d[i] = grid_s;
        else
            d[i] = json_integer_value(json_array_get(a, i));
        CHECKF(d[i] > 0, "%s: shape[%zu] is not a positive integer (or $L, $S in a grid)",
               case_where, i);
        if (d[i] <= 0)
            return false;
    }
    *sh = shape_of(d[0], d[1], d[2], d[3], d[4], d[5], d[6]);
    if (json_object_get(c, "L"))
        sh->L = json_integer_value(json_object_get(c, "L"));
    if (json_object_get(c, "S"))
        sh->S = json_integer_value(json_object_get(c, "S"));
    sh->interleaved = json_is_true(json_object_get(c, "interleaved"));
    sh->out_pad = json_integer_value(json_object_get(c, "out_pad"));
    sh->q_amp = json_number_value(json_object_get(c, "q_amp"));
    return true;
}

/* Sets the options that draw no random numbers. */
static void case_options(const json_t *c, problem *p)
{
    eng_sdpa_args *a = &p->a;
    const json_t *v;
    a->causal = json_is_true(json_object_get(c, "causal"));
    const char *align = json_string_value(json_object_get(c, "align"));
    if (align && strcmp(align, "bottom_right") == 0)
        a->align = ENG_ALIGN_BOTTOM_RIGHT;
    else if (align && strcmp(align, "offset") == 0)
        a->align = ENG_ALIGN_OFFSET;
    else
        CHECKF(!align || strcmp(align, "top_left") == 0, "%s: align \"%s\"", case_where, align);
    if ((v = json_object_get(c, "query_offset")))
        a->query_offset = case_int(v, &p->sh, "query_offset");
    if ((v = json_object_get(c, "window"))) {
        CHECKF(json_array_size(v) == 2, "%s: window is not [left, right]", case_where);
        const json_t *l = json_array_get(v, 0), *r = json_array_get(v, 1);
        a->window_left_set = l && !json_is_null(l);
        a->window_right_set = r && !json_is_null(r);
        a->window_left = a->window_left_set ? case_int(l, &p->sh, "window[0]") : 0;
        a->window_right = a->window_right_set ? case_int(r, &p->sh, "window[1]") : 0;
    }
    if ((v = json_object_get(c, "scale"))) {
        a->scale_set = true;
        a->scale = (float)json_number_value(v);
    }
    a->softcap = (float)json_number_value(json_object_get(c, "softcap"));
    const char *alibi = json_string_value(json_object_get(c, "alibi"));
    CHECKF(!json_object_get(c, "alibi") ||
               (alibi && (strcmp(alibi, "default") == 0 || strcmp(alibi, "explicit") == 0)),
           "%s: alibi is \"default\" or \"explicit\"", case_where);
    a->alibi = alibi != NULL;
    if ((v = json_object_get(c, "open_tail_keys")))
        a->open_tail_keys = case_int(v, &p->sh, "open_tail_keys");
    double k_amp = json_number_value(json_object_get(c, "k_amp"));
    if (k_amp != 0)
        for (size_t i = 0; i < p->nk; i++)
            p->k[i] *= (float)k_amp;
}

/* The options that draw random numbers, in the order of the file comment. */
static void case_random_options(const json_t *c, problem *p, uint64_t *rng)
{
    const shape *sh = &p->sh;
    const json_t *v;
    if ((v = json_object_get(c, "additive")) && KEYS_KNOWN(v, additive_keys, "additive"))
        problem_additive(p, case_int(json_object_get(v, "dim"), sh, "additive.dim"),
                         json_number_value(json_object_get(v, "amp")), rng);
    if ((v = json_object_get(c, "padding")) && KEYS_KNOWN(v, padding_keys, "padding")) {
        bool shared = json_is_true(json_object_get(v, "shared"));
        problem_padding(p, shared, case_int(json_object_get(v, "first"), sh, "padding.first"),
                        json_number_value(json_object_get(v, "fraction")), rng);
        const json_t *rows = json_object_get(v, "padded_batches");
        int64_t S = sh->S - p->a.open_tail_keys;
        for (size_t i = 0; i < json_array_size(rows); i++) {
            int64_t b = json_integer_value(json_array_get(rows, i));
            CHECKF(!shared && b >= 0 && b < sh->B, "%s: padded_batches[%zu]", case_where, i);
            if (!shared && b >= 0 && b < sh->B)
                memset(p->pad + b * S, 1, (size_t)S);
        }
    }
    if ((v = json_object_get(c, "kv_lengths"))) {
        int64_t lengths[16];
        bool ok = (int64_t)json_array_size(v) == sh->B && sh->B <= 16;
        CHECKF(ok, "%s: kv_lengths needs one length per batch (%lld)", case_where,
               (long long)sh->B);
        for (int64_t b = 0; ok && b < sh->B; b++)
            lengths[b] = case_int(json_array_get(v, (size_t)b), sh, "kv_lengths[]");
        if (ok)
            problem_kv_lengths(p, lengths);
    }
    if ((v = json_object_get(c, "mask")) && KEYS_KNOWN(v, mask_keys, "mask")) {
        const char *kind = json_string_value(json_object_get(v, "kind"));
        const json_t *ne_j = json_object_get(v, "ne");
        int64_t ne[4], full[4] = {sh->B, sh->H, sh->L, sh->S - p->a.open_tail_keys};
        bool ok = kind && (strcmp(kind, "bool") == 0 || strcmp(kind, "float") == 0) &&
                  json_array_size(ne_j) == 4;
        CHECKF(ok, "%s: mask needs kind \"bool\" or \"float\" and ne of 4", case_where);
        for (size_t d = 0; ok && d < 4; d++) {
            const json_t *x = json_array_get(ne_j, d);
            ne[d] = json_is_integer(x) ? json_integer_value(x) : case_int(x, sh, "mask.ne[]");
            ok = ne[d] == 1 || ne[d] == full[d];
            CHECKF(ok, "%s: mask.ne[%zu] is %lld, not 1 or %lld", case_where, d, (long long)ne[d],
                   (long long)full[d]);
        }
        if (ok) {
            bool is_bool = strcmp(kind, "bool") == 0;
            problem_mask(p, is_bool ? ENG_MASK_BOOL : ENG_MASK_FLOAT, ne,
                         json_number_value(json_object_get(v, "density")), rng);
            const json_t *z = json_object_get(v, "zero_prefix");
            int64_t n = z ? case_int(z, sh, "mask.zero_prefix") : 0;
            CHECKF(n >= 0 && n <= ne[0] * ne[1] * ne[2] * ne[3], "%s: zero_prefix %lld", case_where,
                   (long long)n);
            for (int64_t i = 0; i < n && n <= ne[0] * ne[1] * ne[2] * ne[3]; i++) {
                if (is_bool)
                    ((uint8_t *)p->mask)[i] = 0;
                else
                    ((float *)p->mask)[i] = -INFINITY;
            }
        }
    }
    const char *alibi = json_string_value(json_object_get(c, "alibi"));
    if (alibi && strcmp(alibi, "explicit") == 0)
        problem_explicit_slopes(p, rng);
}

/* Runs one CASE at a grid point (0, 0 outside a grid); adds its empty rows to *rows_empty. */
static void run_case(const json_t *c0, int64_t grid_l, int64_t grid_s, uint64_t *rng,
                     int64_t *rows_empty)
{
    if (!KEYS_KNOWN(c0, case_keys, "the case"))
        return;
    const json_t *q = json_object_get(c0, "quick");
    if (quick && json_is_string(q)) {
        CHECKF(strcmp(json_string_value(q), "skip") == 0, "%s: quick is an object or \"skip\"",
               case_where);
        return;
    }
    json_t *c = json_deep_copy(c0);
    if (quick && json_is_object(q))
        json_object_update(c, (json_t *)q);
    json_object_del(c, "quick");
    if (!KEYS_KNOWN(c, case_keys, "the case (quick fields included)")) {
        json_decref(c);
        return;
    }
    shape sh;
    if (!case_shape(c, grid_l, grid_s, &sh)) {
        json_decref(c);
        return;
    }
    problem p;
    problem_init(&p, &sh, rng);
    case_options(c, &p);
    case_random_options(c, &p, rng);
    problem_outputs(&p, weights_mode_of(json_object_get(c, "weights")),
                    json_is_true(json_object_get(c, "lse")));
    const char *note = json_string_value(json_object_get(c, "note"));
    char note_buf[256];
    snprintf(note_buf, sizeof note_buf, "%s%s%s", case_where, note ? ": " : "", note ? note : "");
    p.note = note_buf;
    compare_stats st = {0};
    compare_with(&p, &st);
    *rows_empty += st.rows_empty;
    const json_t *want = json_object_get(c, "rows_empty");
    if (json_is_integer(want))
        CHECKF(st.rows_empty == json_integer_value(want),
               "[%s] %lld rows with no visible key, want %lld", note_buf, (long long)st.rows_empty,
               (long long)json_integer_value(want));
    else if (want)
        CHECKF(st.rows_empty >= json_integer_value(json_object_get(want, "min")),
               "[%s] %lld rows with no visible key, want at least %lld", note_buf,
               (long long)st.rows_empty,
               (long long)json_integer_value(json_object_get(want, "min")));
    if (json_object_get(c, "then_weights")) {
        problem_outputs(&p, weights_mode_of(json_object_get(c, "then_weights")), true);
        snprintf(note_buf + strlen(note_buf), sizeof note_buf - strlen(note_buf),
                 " (then with weights)");
        compare(&p);
    }
    problem_free(&p);
    json_decref(c);
}

static void run_case_test(void)
{
    const json_t *t = case_test;
    const char *name = json_string_value(json_object_get(t, "name"));
    snprintf(case_where, sizeof case_where, "%s", name ? name : "?");
    if (!KEYS_KNOWN(t, test_keys, "the test"))
        return;
    const json_t *cases = json_object_get(t, "cases");
    CHECKF(json_array_size(cases) > 0, "%s: no cases", name);
    uint64_t rng = (uint64_t)json_integer_value(json_object_get(t, "seed"));
    const json_t *grid = json_object_get(t, quick ? "quick_grid" : "grid");
    const json_t *ls = json_object_get(grid, "L"), *ss = json_object_get(grid, "S");
    CHECKF(!grid || (json_array_size(ls) > 0 && json_array_size(ss) > 0),
           "%s: a grid needs lists L and S", name);
    size_t nl = grid ? json_array_size(ls) : 1, ns = grid ? json_array_size(ss) : 1;
    int64_t rows_empty = 0;
    for (size_t li = 0; li < nl; li++)
        for (size_t si = 0; si < ns; si++)
            for (size_t i = 0; i < json_array_size(cases); i++) {
                int64_t gl = grid ? json_integer_value(json_array_get(ls, li)) : 0;
                int64_t gs = grid ? json_integer_value(json_array_get(ss, si)) : 0;
                if (grid)
                    snprintf(case_where, sizeof case_where, "%s, case %zu at L=%lld S=%lld", name,
                             i, (long long)gl, (long long)gs);
                else
                    snprintf(case_where, sizeof case_where, "%s, case %zu", name, i);
                run_case(json_array_get(cases, i), gl, gs, &rng, &rows_empty);
            }
    const json_t *total = json_object_get(t, "rows_empty_total");
    if (total)
        CHECKF(rows_empty >= json_integer_value(json_object_get(total, "min")),
               "%s: %lld rows with no visible key over all cases, want at least %lld", name,
               (long long)rows_empty, (long long)json_integer_value(json_object_get(total, "min")));
}

/* The case file reads as JSON, names only known keys and holds tests. */
static void test_case_file_loads(void)
{
    static const char *const file_keys[] = {"about", "tolerances", "tests"};
    const char *path = getenv("ATTND_SDPA_CASES") ? getenv("ATTND_SDPA_CASES") : SDPA_CASES_PATH;
    json_error_t jerr;
    snprintf(case_where, sizeof case_where, "%s", path);
    case_file = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    CHECKF(case_file != NULL, "%s: %s (run from the repository root)", path, jerr.text);
    CHECKF(!case_file || json_array_size(json_object_get(case_file, "tests")) > 0,
           "%s: no \"tests\"", path);
    if (case_file)
        KEYS_KNOWN(case_file, file_keys, "the file");
}

/* Runs every TEST of the case file as one named test. */
static void run_case_file(void)
{
    RUN(test_case_file_loads);
    const json_t *tests = json_object_get(case_file, "tests");
    if (!case_file || check__failures_in_test > 0) { /* the failures of test_case_file_loads */
        json_decref(case_file);
        return;
    }
    static char test_name[128]; /* the harness keeps pointing at the name */
    for (size_t i = 0; i < json_array_size(tests); i++) {
        case_test = json_array_get(tests, i);
        const char *name = json_string_value(json_object_get(case_test, "name"));
        snprintf(test_name, sizeof test_name, "test_%s", name ? name : "unnamed");
        json_int_t within = json_integer_value(json_object_get(case_test, "within_s"));
        check__run_within(test_name, run_case_test, within > 0 ? (unsigned)within : 120);
    }
    json_decref(case_file);
}

/* ---- Decode-shaped requests --------------------------------------------------------------- */

/* A batch of one decode row whose keys are mostly invisible: one chunk of the key split sees
 * nothing. (The other decode shapes are data cases, test_decode_shapes_split_over_keys.) */
static void test_decode_with_almost_every_key_hidden(void)
{
    uint64_t rng = 135;
    problem p;
    shape sh = shape_of(1, 1, 1, 1, quick ? 5000 : 20000, 64, 64);
    problem_init(&p, &sh, &rng);
    problem_padding(&p, false, sh.S - 100, 0.0, &rng);
    problem_outputs(&p, ENG_WEIGHTS_NONE, true);
    p.note = "decode, all but the last 100 keys padded";
    compare(&p);
    int64_t lengths[1] = {50};
    problem_kv_lengths(&p, lengths);
    p.note = "decode, all but the first 50 keys cut (kv_lengths) and padded";
    compare_stats st = {0};
    compare_with(&p, &st);
    CHECK_EQ_INT(st.rows_empty, 1);
    problem_free(&p);
}

/* K and V of batch 0 of a copied into a block table of T-token blocks, laid out as
 * engine/internal.h says of eng__kv_paged (K [Hkv][T][D], then V [Hkv][T][Dv], fp32). */
typedef struct {
    float *data;
    void **blocks;
    eng__kv_paged kv;
} block_table;

static void block_table_make(block_table *t, const eng_sdpa_args *a, int64_t T)
{
    const int64_t Hkv = a->k.ne[1], S = a->k.ne[2], D = a->k.ne[3], Dv = a->v.ne[3];
    const int64_t n = (S + T - 1) / T, per_block = Hkv * T * (D + Dv);
    t->data = xcalloc((size_t)(n * per_block), sizeof(float));
    t->blocks = xcalloc((size_t)n, sizeof *t->blocks);
    for (int64_t i = 0; i < n; i++)
        t->blocks[i] = t->data + i * per_block;
    for (int64_t j = 0; j < S; j++)
        for (int64_t hk = 0; hk < Hkv; hk++) {
            float *block = t->blocks[j / T];
            memcpy(block + (hk * T + j % T) * D, view_ptr(&a->k, 0, hk, j, 0),
                   (size_t)D * sizeof(float));
            memcpy(block + Hkv * T * D + (hk * T + j % T) * Dv, view_ptr(&a->v, 0, hk, j, 0),
                   (size_t)Dv * sizeof(float));
        }
    t->kv = (eng__kv_paged){.dtype = ENG_DTYPE_F32, .block_tokens = T, .blocks = t->blocks};
}

static void block_table_free(block_table *t)
{
    free(t->data);
    free(t->blocks);
}

/* A grouped-query decode step reads each kv head's keys once for its whole group of query
 * heads: the keys of the blocks whose K and V the tasks took add up to B Hkv S, not B H S (one
 * pass per query head), for groups of 2, 4 and 8, 1, 2 and 5 query rows, one batch or two,
 * few keys or enough to split them over the workers, from views and from a block table of
 * 16-token blocks (batch 1, as a KV cache). */
static void test_grouped_decode_reads_each_kv_block_once(void)
{
    uint64_t rng = 137;
    const int64_t groups[] = {2, 4, 8}, rows[] = {1, 2, 5}, keys[] = {17, 4097}, Hkv = 2;
    for (size_t gi = 0; gi < 3; gi++)
        for (size_t li = 0; li < 3; li++)
            for (size_t si = 0; si < 2; si++)
                for (int64_t B = 1; B <= 2; B++) {
                    problem p;
                    shape sh = shape_of(B, groups[gi] * Hkv, Hkv, rows[li], keys[si], 64, 64);
                    problem_init(&p, &sh, &rng);
                    p.a.causal = true;
                    p.a.align = ENG_ALIGN_BOTTOM_RIGHT;
                    int64_t read = -1;
                    eng_error err;
                    CHECK(eng__sdpa_counted(pool, &p.a, NULL, &read, NULL, &err) == ENG_OK);
                    CHECKF(read == B * Hkv * sh.S,
                           "views H=%lld Hkv=%lld L=%lld S=%lld B=%lld: %lld key rows read, "
                           "want B Hkv S = %lld",
                           (long long)sh.H, (long long)Hkv, (long long)sh.L, (long long)sh.S,
                           (long long)B, (long long)read, (long long)(B * Hkv * sh.S));
                    if (B == 1) {
                        block_table t;
                        block_table_make(&t, &p.a, 16);
                        CHECK(eng__sdpa_counted(pool, &p.a, &t.kv, &read, NULL, &err) == ENG_OK);
                        CHECKF(read == Hkv * sh.S,
                               "block table H=%lld L=%lld S=%lld: %lld key rows read, want %lld",
                               (long long)sh.H, (long long)sh.L, (long long)sh.S, (long long)read,
                               (long long)(Hkv * sh.S));
                        block_table_free(&t);
                    }
                    problem_free(&p);
                }
}

/* ---- Properties of the engine itself --------------------------------------------------------- */

/* docs/semantics.md#outputs: attention over a key set split in two equals the LSE-weighted
 * merge of the two halves' outputs. */
static void test_lse_merges_key_shards(void)
{
    uint64_t rng = 124;
    const int64_t L = 8, S = 300, D = 32, split = 137;
    problem whole;
    shape sh = shape_of(1, 2, 2, L, S, D, D);
    sh.q_amp = 2.0;
    problem_init(&whole, &sh, &rng);
    problem_outputs(&whole, ENG_WEIGHTS_NONE, true);
    eng_error err;
    CHECK(eng_sdpa(pool, &whole.a, NULL, &err) == ENG_OK);

    float *out_a = xcalloc((size_t)(2 * L * D), sizeof(float));
    float *out_b = xcalloc((size_t)(2 * L * D), sizeof(float));
    float lse_a[16], lse_b[16];
    eng_sdpa_args a = whole.a, b = whole.a;
    a.k.ne[2] = a.v.ne[2] = split;
    b.k.ne[2] = b.v.ne[2] = S - split;
    b.k.data += split * D;
    b.v.data += split * D;
    a.out.data = out_a;
    b.out.data = out_b;
    a.lse = lse_a;
    b.lse = lse_b;
    CHECK(eng_sdpa(pool, &a, NULL, &err) == ENG_OK);
    CHECK(eng_sdpa(pool, &b, NULL, &err) == ENG_OK);
    for (int64_t r = 0; r < 2 * L; r++) {
        double m = fmax((double)lse_a[r], (double)lse_b[r]);
        double wa = exp((double)lse_a[r] - m), wb = exp((double)lse_b[r] - m);
        CHECK_NEAR(m + log(wa + wb), whole.lse[r], 1e-5 * (1 + fabs((double)whole.lse[r])));
        for (int64_t c = 0; c < D; c++) {
            double merged =
                (wa * (double)out_a[r * D + c] + wb * (double)out_b[r * D + c]) / (wa + wb);
            CHECK_NEAR(merged, whole.o[r * D + c], 1e-5);
        }
    }
    free(out_a);
    free(out_b);
    problem_free(&whole);
}

/* Memory per worker is O(block): the scratch estimate for a 65,536-token head must not grow
 * with L x S (17 GB of scores), and must not depend on S once S spans many blocks. */
static void test_scratch_is_bounded_by_blocks(void)
{
    float x[1];
    eng_sdpa_args a;
    memset(&a, 0, sizeof a);
    a.q = eng_view_contiguous(x, 1, 1, 65536, 64);
    a.k = eng_view_contiguous(x, 1, 1, 65536, 64);
    a.v = eng_view_contiguous(x, 1, 1, 65536, 64);
    a.out = eng_view_contiguous(x, 1, 1, 65536, 64);
    a.causal = true;
    size_t big = eng_sdpa_scratch_bytes(&a, 2);
    CHECKF(big < (size_t)256 << 20, "scratch for a causal 65536-token head: %zu bytes", big);
    a.k.ne[2] = a.v.ne[2] = 1 << 20;
    size_t bigger = eng_sdpa_scratch_bytes(&a, 2);
    CHECKF(bigger < (size_t)256 << 20, "scratch with 2^20 keys: %zu bytes", bigger);
    /* The kernel needs at least a block of scores; an estimate of 0 would mislead admission. */
    CHECK(big > 0);
}

/* eng_sdpa called from inside a pool task, on a pool of one worker: the caller helps with its
 * own tasks, so the nested call completes. */
typedef struct {
    eng_pool *pool;
    problem *p;
    eng_status status;
    atomic_int done;
} nested_ctx;

static void nested_sdpa_task(void *arg, int64_t index)
{
    (void)index;
    nested_ctx *c = arg;
    eng_error err;
    c->status = eng_sdpa(c->pool, &c->p->a, NULL, &err);
    atomic_store(&c->done, 1);
}

static void test_sdpa_from_inside_a_pool_task(void)
{
    uint64_t rng = 125;
    eng_error err;
    eng_pool *one = eng_pool_new(1, &err);
    CHECK(one != NULL);
    if (!one)
        return;
    problem p;
    shape sh = shape_of(1, 4, 2, 4, 5000, 64, 64);
    problem_init(&p, &sh, &rng);
    problem_outputs(&p, ENG_WEIGHTS_NONE, true);
    nested_ctx c = {.pool = one, .p = &p, .status = ENG_EINVAL};
    atomic_init(&c.done, 0);
    CHECK(eng_pool_submit(one, nested_sdpa_task, &c) == ENG_OK);
    /* A deadlock here is reported by the watchdog, naming this test. */
    while (!atomic_load(&c.done))
        sleep_ms(1);
    CHECK(c.status == ENG_OK);
    /* And the answer is right (the run below repeats it directly, then checks it). */
    eng_pool *shared = pool;
    pool = one;
    p.note = "eng_sdpa on a 1-worker pool";
    compare(&p);
    pool = shared;
    eng_pool_free(one);
    problem_free(&p);
}

/* However the pool splits the query rows into tasks, every row gets the same bits, right
 * against the reference. On one worker, 8 heads of 600 rows are 8 tasks of a whole head each
 * (their output rows fit a quarter of L2 on every CPU with 300 KiB or more), which pack each
 * key block as they reach it; on four, the heads split into query blocks of ~200 rows sharing
 * panels packed before the call. Causal, so that both cut the diagonal. Only the reference is
 * asked for with a window, whose key blocks start where each task's first row looks, and with
 * openblas, whose sgemm may sum a panel of other rows in another order. */
static void test_rows_per_task_never_change_the_output(void)
{
    uint64_t rng = 126;
    eng_error err;
    eng_pool *one = eng_pool_new(1, &err), *four = eng_pool_new(4, &err);
    CHECK(one != NULL && four != NULL);
    if (one && four) {
        for (int window = 0; window < 2; window++) {
            problem p;
            shape sh = shape_of(2, 4, 4, 600, 600, 32, 32);
            problem_init(&p, &sh, &rng);
            problem_outputs(&p, ENG_WEIGHTS_NONE, true);
            p.a.causal = true;
            p.a.window_left_set = window;
            p.a.window_left = 150;
            float *first = xcalloc(p.no, sizeof(float));
            eng_pool *shared = pool;
            eng_pool *pools[2] = {one, four};
            for (int k = 0; k < 2; k++) {
                pool = pools[k];
                p.note = k == 0 ? "one worker: whole heads" : "four workers: query blocks";
                compare(&p);
                if (k == 0)
                    memcpy(first, p.o, p.no * sizeof(float));
                else if (!window && strcmp(eng_kernels_name(), "openblas") != 0)
                    CHECKF(memcmp(first, p.o, p.no * sizeof(float)) == 0,
                           "causal output differs between whole-head tasks and query blocks");
            }
            pool = shared;
            free(first);
            problem_free(&p);
        }
    }
    eng_pool_free(one);
    eng_pool_free(four);
}

/* ---- Concurrency -------------------------------------------------------------------------- */

#define N_CONC_PROBLEMS 4
#define N_CONC_THREADS  6

typedef struct {
    const eng_sdpa_args *args;
    const problem *p;
    const float *want_out, *want_w, *want_lse; /* serial results */
    int rounds;
    pthread_barrier_t *barrier;
    int mismatches, errors;
} conc_job;

static void *conc_thread(void *arg)
{
    conc_job *j = arg;
    const problem *p = j->p;
    float *o = xcalloc(p->no, sizeof(float));
    float *w = p->nw ? xcalloc(p->nw, sizeof(float)) : NULL;
    float *l = p->nlse ? xcalloc(p->nlse, sizeof(float)) : NULL;
    eng_sdpa_args a = *j->args;
    a.out.data = o;
    a.weights = w;
    a.lse = l;
    pthread_barrier_wait(j->barrier);
    for (int r = 0; r < j->rounds; r++) {
        memcpy(o, j->want_out, p->no * sizeof(float)); /* same gaps; view is overwritten */
        eng_error err;
        if (eng_sdpa(pool, &a, NULL, &err) != ENG_OK) {
            j->errors++;
            continue;
        }
        if (memcmp(o, j->want_out, p->no * sizeof(float)) != 0 ||
            (w && memcmp(w, j->want_w, p->nw * sizeof(float)) != 0) ||
            (l && memcmp(l, j->want_lse, p->nlse * sizeof(float)) != 0))
            j->mismatches++;
    }
    free(o);
    free(w);
    free(l);
    return NULL;
}

/* Several threads calling eng_sdpa on the one pool at once get results bit-identical to serial
 * runs: no shared scratch, and merge orders that do not depend on which worker ran what. */
static void test_concurrent_requests_are_bit_identical(void)
{
    uint64_t rng = 126;
    problem ps[N_CONC_PROBLEMS];
    shape shapes[N_CONC_PROBLEMS] = {
        shape_of(1, 4, 2, quick ? 130 : 514, quick ? 130 : 514, 64, 64),
        shape_of(1, 4, 1, 2, quick ? 5000 : 20000, 128, 128),
        shape_of(2, 2, 2, quick ? 65 : 267, quick ? 267 : 1030, 80, 48),
        shape_of(2, 4, 2, 65, 63, 32, 32),
    };
    shapes[3].interleaved = true;
    shapes[3].out_pad = 3;
    float *want_out[N_CONC_PROBLEMS], *want_w[N_CONC_PROBLEMS], *want_lse[N_CONC_PROBLEMS];
    for (int i = 0; i < N_CONC_PROBLEMS; i++) {
        problem_init(&ps[i], &shapes[i], &rng);
        want_w[i] = want_lse[i] = NULL;
    }
    ps[0].a.causal = true;
    problem_outputs(&ps[0], ENG_WEIGHTS_PER_HEAD, true);
    int64_t lengths[1] = {shapes[1].S - 100};
    problem_kv_lengths(&ps[1], lengths);
    problem_outputs(&ps[1], ENG_WEIGHTS_NONE, true);
    int64_t ne[4] = {1, 1, shapes[2].L, shapes[2].S};
    problem_mask(&ps[2], ENG_MASK_FLOAT, ne, 0.9, &rng);
    ps[2].a.alibi = true;
    problem_outputs(&ps[2], ENG_WEIGHTS_MEAN, true);
    int64_t ne3[4] = {2, 1, 65, 63};
    problem_mask(&ps[3], ENG_MASK_BOOL, ne3, 0.8, &rng);
    ps[3].a.window_left_set = true;
    ps[3].a.window_left = 20;
    problem_outputs(&ps[3], ENG_WEIGHTS_NONE, false);

    /* Serial runs, checked against the reference once, kept as the expected bits. */
    for (int i = 0; i < N_CONC_PROBLEMS; i++) {
        ps[i].note = "concurrency (serial run)";
        compare(&ps[i]);
        want_out[i] = xcalloc(ps[i].no, sizeof(float));
        memcpy(want_out[i], ps[i].o, ps[i].no * sizeof(float));
        if (ps[i].nw) {
            want_w[i] = xcalloc(ps[i].nw, sizeof(float));
            memcpy(want_w[i], ps[i].weights, ps[i].nw * sizeof(float));
        }
        if (ps[i].nlse) {
            want_lse[i] = xcalloc(ps[i].nlse, sizeof(float));
            memcpy(want_lse[i], ps[i].lse, ps[i].nlse * sizeof(float));
        }
    }

    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, NULL, N_CONC_THREADS);
    pthread_t th[N_CONC_THREADS];
    conc_job jobs[N_CONC_THREADS];
    for (int t = 0; t < N_CONC_THREADS; t++) {
        int i = t % N_CONC_PROBLEMS;
        jobs[t] = (conc_job){.args = &ps[i].a,
                             .p = &ps[i],
                             .want_out = want_out[i],
                             .want_w = want_w[i],
                             .want_lse = want_lse[i],
                             .rounds = quick ? 2 : 3,
                             .barrier = &barrier};
        CHECK(pthread_create(&th[t], NULL, conc_thread, &jobs[t]) == 0);
    }
    for (int t = 0; t < N_CONC_THREADS; t++) {
        pthread_join(th[t], NULL);
        char desc[768];
        describe(jobs[t].p, desc, sizeof desc);
        CHECKF(jobs[t].errors == 0, "thread %d [%s]: %d calls failed", t, desc, jobs[t].errors);
        CHECKF(jobs[t].mismatches == 0,
               "thread %d [%s]: %d of %d concurrent results differ "
               "from the serial run",
               t, desc, jobs[t].mismatches, jobs[t].rounds);
    }
    pthread_barrier_destroy(&barrier);
    for (int i = 0; i < N_CONC_PROBLEMS; i++) {
        free(want_out[i]);
        free(want_w[i]);
        free(want_lse[i]);
        problem_free(&ps[i]);
    }
}

/* ---- Cancellation and deadlines ----------------------------------------------------------- */

/* A job that takes seconds: about 550 GFLOP (70 GFLOP in quick mode). */
static void make_long_job(problem *p)
{
    uint64_t rng = 127;
    shape sh = shape_of(1, quick ? 4 : 8, quick ? 4 : 8, quick ? 8192 : 16384, quick ? 8192 : 16384,
                        64, 64);
    problem_init(p, &sh, &rng);
    problem_outputs(p, ENG_WEIGHTS_NONE, true);
}

typedef struct {
    eng_ctl *ctl;
    int delay_ms;
    int64_t cancelled_at;
} canceller;

static void *cancel_after_delay(void *arg)
{
    canceller *c = arg;
    sleep_ms(c->delay_ms);
    c->cancelled_at = eng_now_ns();
    atomic_store(&c->ctl->cancel, true);
    return NULL;
}

/* A small problem checked against the reference: the pool still works after a stopped job. */
static void check_pool_still_works(void)
{
    uint64_t rng = 128;
    problem p;
    shape sh = shape_of(1, 2, 2, 65, 267, 32, 32);
    problem_init(&p, &sh, &rng);
    problem_outputs(&p, ENG_WEIGHTS_NONE, true);
    p.note = "after a stopped job";
    compare(&p);
    problem_free(&p);
}

static void test_cancel_from_another_thread(void)
{
    problem p;
    make_long_job(&p);
    eng_ctl ctl;
    atomic_init(&ctl.cancel, false);
    ctl.deadline_ns = 0;
    canceller c = {.ctl = &ctl, .delay_ms = 50};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, cancel_after_delay, &c) == 0);
    eng_error err;
    eng_status st = eng_sdpa(pool, &p.a, &ctl, &err);
    int64_t returned = eng_now_ns();
    pthread_join(th, NULL);
    CHECKF(st == ENG_ECANCELLED, "cancelled long job returned %s", eng_status_str(st));
    double lag = (double)(returned - c.cancelled_at) / 1e9;
    CHECKF(lag < 1.0, "eng_sdpa returned %.3f s after the cancel flag was set", lag);
    problem_free(&p); /* ASan: no task may still touch these buffers */
    check_pool_still_works();
}

static void test_cancel_flag_already_set(void)
{
    problem p;
    make_long_job(&p);
    eng_ctl ctl;
    atomic_init(&ctl.cancel, true);
    ctl.deadline_ns = 0;
    eng_error err;
    int64_t start = eng_now_ns();
    eng_status st = eng_sdpa(pool, &p.a, &ctl, &err);
    CHECKF(st == ENG_ECANCELLED, "pre-cancelled job returned %s", eng_status_str(st));
    CHECKF(seconds_since(start) < 1.0, "pre-cancelled job took %.3f s", seconds_since(start));
    problem_free(&p);
}

static void test_deadline_already_past(void)
{
    problem p;
    make_long_job(&p);
    eng_ctl ctl;
    atomic_init(&ctl.cancel, false);
    ctl.deadline_ns = eng_now_ns() - 1000000;
    eng_error err;
    int64_t start = eng_now_ns();
    eng_status st = eng_sdpa(pool, &p.a, &ctl, &err);
    CHECKF(st == ENG_EDEADLINE, "job past its deadline returned %s", eng_status_str(st));
    CHECKF(seconds_since(start) < 1.0, "job past its deadline took %.3f s", seconds_since(start));
    problem_free(&p);
}

static void test_deadline_stops_a_long_job_early(void)
{
    problem p;
    make_long_job(&p);
    eng_ctl ctl;
    atomic_init(&ctl.cancel, false);
    int64_t start = eng_now_ns();
    ctl.deadline_ns = start + 50 * 1000000LL;
    eng_error err;
    eng_status st = eng_sdpa(pool, &p.a, &ctl, &err);
    double took = seconds_since(start);
    CHECKF(st == ENG_EDEADLINE, "long job with a 50 ms deadline returned %s", eng_status_str(st));
    CHECKF(took < 1.05, "long job with a 50 ms deadline ran %.3f s", took);
    problem_free(&p);
    check_pool_still_works();
}

/* ---- Validation --------------------------------------------------------------------------- */

/* The outcome of one eng_sdpa call made in a child process, so that an engine that crashes or
 * hangs on a bad argument fails this one check instead of the whole binary. The child never
 * starts a thread (the pool's workers do not exist there): a correct engine rejects the
 * arguments before it queues any work. */
typedef struct {
    eng_status status;
    char field[48];
    char message[240];
    int signal; /* the child died of this signal */
    bool hung;
} outcome;

static outcome sdpa_in_child(const eng_sdpa_args *a)
{
    outcome o;
    memset(&o, 0, sizeof o);
    int fds[2];
    if (pipe(fds) != 0) {
        o.hung = true;
        return o;
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        eng_error err;
        memset(&err, 0, sizeof err);
        outcome c;
        memset(&c, 0, sizeof c);
        c.status = eng_sdpa(pool, a, NULL, &err);
        memcpy(c.field, err.field, sizeof c.field);
        memcpy(c.message, err.message, sizeof c.message);
        ssize_t w = write(fds[1], &c, sizeof c);
        _exit(w == (ssize_t)sizeof c ? 0 : 3);
    }
    close(fds[1]);
    struct pollfd pfd = {.fd = fds[0], .events = POLLIN};
    int ready = poll(&pfd, 1, 10000);
    if (ready <= 0) {
        kill(pid, SIGKILL);
        o.hung = true;
    } else if (read(fds[0], &o, sizeof o) != (ssize_t)sizeof o) {
        memset(&o, 0, sizeof o);
    }
    close(fds[0]);
    int wstatus = 0;
    waitpid(pid, &wstatus, 0);
    if (WIFSIGNALED(wstatus) && !o.hung)
        o.signal = WTERMSIG(wstatus);
    o.field[sizeof o.field - 1] = '\0';
    o.message[sizeof o.message - 1] = '\0';
    return o;
}

/* Whether `field` names one of the '|'-separated names in `accepted`: equal to it, or it
 * followed by a non-identifier character ("k.ne[3]" names "k"; "kv_lengths" does not). */
static bool field_names(const char *field, const char *accepted)
{
    const char *s = accepted;
    while (*s) {
        size_t n = strcspn(s, "|");
        if (strncmp(field, s, n) == 0) {
            char next = field[n];
            if (next == '\0' || next == '.' || next == '[' || next == ' ' || next == ':')
                return true;
        }
        s += n;
        if (*s == '|')
            s++;
    }
    return false;
}

/* Checks that eng_sdpa rejects `a` with `want` and a field among `fields`, without crashing. */
#define EXPECT_REJECT(a, want, fields, what) expect_reject(&(a), want, fields, what, __LINE__)

static void expect_reject(const eng_sdpa_args *a, eng_status want, const char *fields,
                          const char *what, int line)
{
    outcome o = sdpa_in_child(a);
    if (o.hung || o.signal) {
        check__fail(__FILE__, line, "%s: eng_sdpa %s", what,
                    o.hung ? "hung (no return within 10 s)" : "crashed");
        if (o.signal)
            printf("     (signal %d)\n", o.signal);
        return;
    }
    if (o.status != want)
        check__fail(__FILE__, line, "%s: status %s, expected %s (field '%s': %s)", what,
                    eng_status_str(o.status), eng_status_str(want), o.field, o.message);
    else if (!field_names(o.field, fields))
        check__fail(__FILE__, line, "%s: err.field is '%s', expected one of '%s' (%s)", what,
                    o.field, fields, o.message);
}

/* A small valid problem to spoil one field at a time: B=2 H=4 Hkv=2 L=5 S=7 D=8 Dv=6. */
typedef struct {
    float q[2 * 4 * 5 * 8], k[2 * 2 * 7 * 8 + 64], v[2 * 2 * 7 * 6], out[2 * 4 * 5 * 6];
    float weights[2 * 4 * 5 * 7], lse[2 * 4 * 5];
    uint8_t mask[2 * 4 * 5 * 7], pad[2 * 7];
    int64_t kvlen[2];
    float slopes[4];
} small_buffers;

static small_buffers sb;

static eng_sdpa_args valid_small(void)
{
    eng_sdpa_args a;
    memset(&a, 0, sizeof a);
    for (size_t i = 0; i < sizeof sb.q / sizeof sb.q[0]; i++)
        sb.q[i] = (float)(i % 7) * 0.1f;
    for (size_t i = 0; i < sizeof sb.k / sizeof sb.k[0]; i++)
        sb.k[i] = (float)(i % 5) * 0.1f;
    for (size_t i = 0; i < sizeof sb.v / sizeof sb.v[0]; i++)
        sb.v[i] = (float)(i % 3);
    memset(sb.mask, 1, sizeof sb.mask);
    sb.kvlen[0] = 7;
    sb.kvlen[1] = 3;
    a.q = eng_view_contiguous(sb.q, 2, 4, 5, 8);
    a.k = eng_view_contiguous(sb.k, 2, 2, 7, 8);
    a.v = eng_view_contiguous(sb.v, 2, 2, 7, 6);
    a.out = eng_view_contiguous(sb.out, 2, 4, 5, 6);
    return a;
}

static void test_valid_small_problem_is_accepted(void)
{
    /* The baseline that every rejection below spoils in one field. */
    eng_sdpa_args a = valid_small();
    a.attn_mask = (eng_mask){ENG_MASK_BOOL, sb.mask, {2, 4, 5, 7}, {140, 35, 7, 1}};
    a.kv_lengths = sb.kvlen;
    a.weights_mode = ENG_WEIGHTS_PER_HEAD;
    a.weights = sb.weights;
    a.lse = sb.lse;
    outcome o = sdpa_in_child(&a);
    CHECKF(!o.hung && !o.signal && o.status == ENG_OK, "baseline: %s (%s: %s)%s",
           eng_status_str(o.status), o.field, o.message, o.hung ? " hung" : "");
    eng_error err;
    CHECK(eng_sdpa(pool, &a, NULL, &err) == ENG_OK);
}

static void test_rejects_missing_pool_or_arguments(void)
{
    eng_sdpa_args a = valid_small();
    eng_error err;
    memset(&err, 0, sizeof err);
    CHECK(eng_sdpa(NULL, &a, NULL, &err) == ENG_EINVAL);
    CHECK(eng_sdpa(pool, NULL, NULL, &err) == ENG_EINVAL);
}

static void test_rejects_nonpositive_dimensions(void)
{
    for (int64_t bad = 0; bad >= -1; bad--) {
        eng_sdpa_args a = valid_small();
        a.q.ne[0] = a.k.ne[0] = a.v.ne[0] = a.out.ne[0] = bad;
        EXPECT_REJECT(a, ENG_EINVAL, "q|k|v|out", "batch <= 0");
        a = valid_small();
        a.q.ne[1] = a.out.ne[1] = bad;
        EXPECT_REJECT(a, ENG_EINVAL, "q|out", "heads <= 0");
        a = valid_small();
        a.k.ne[1] = a.v.ne[1] = bad;
        EXPECT_REJECT(a, ENG_EINVAL, "k|v", "kv heads <= 0");
        a = valid_small();
        a.q.ne[2] = a.out.ne[2] = bad;
        EXPECT_REJECT(a, ENG_EINVAL, "q|out", "L <= 0");
        a = valid_small();
        a.k.ne[2] = a.v.ne[2] = bad;
        EXPECT_REJECT(a, ENG_EINVAL, "k|v", "S <= 0");
        a = valid_small();
        a.q.ne[3] = a.k.ne[3] = bad;
        EXPECT_REJECT(a, ENG_EINVAL, "q|k", "D <= 0");
        a = valid_small();
        a.v.ne[3] = a.out.ne[3] = bad;
        EXPECT_REJECT(a, ENG_EINVAL, "v|out", "Dv <= 0");
    }
}

static void test_rejects_mismatched_shapes(void)
{
    eng_sdpa_args a = valid_small();
    a.k.ne[3] = 9;
    a.k.stride[2] = 9, a.k.stride[1] = 63, a.k.stride[0] = 126;
    EXPECT_REJECT(a, ENG_EINVAL, "k|q", "k head size 9 vs q 8");
    a = valid_small();
    a.k.ne[0] = 1;
    EXPECT_REJECT(a, ENG_EINVAL, "k", "k batch 1 vs q batch 2");
    a = valid_small();
    a.v.ne[0] = 1;
    EXPECT_REJECT(a, ENG_EINVAL, "v", "v batch 1 vs 2");
    a = valid_small();
    a.v.ne[2] = 6;
    EXPECT_REJECT(a, ENG_EINVAL, "v|k", "v has 6 positions, k 7");
    a = valid_small();
    a.v.ne[1] = 1;
    EXPECT_REJECT(a, ENG_EINVAL, "v|k", "v has 1 head, k 2");
    a = valid_small();
    a.out.ne[3] = 5;
    EXPECT_REJECT(a, ENG_EINVAL, "out", "out Dv 5 vs v 6");
    a = valid_small();
    a.out.ne[2] = 4;
    EXPECT_REJECT(a, ENG_EINVAL, "out", "out L 4 vs q 5");
    a = valid_small();
    a.out.ne[1] = 2;
    EXPECT_REJECT(a, ENG_EINVAL, "out", "out H 2 vs q 4");
    a = valid_small();
    a.out.ne[0] = 1;
    EXPECT_REJECT(a, ENG_EINVAL, "out", "out B 1 vs q 2");
}

/* H must be a multiple of Hkv: 6 query heads over 4 kv heads is an error. */
static void test_rejects_heads_not_multiple_of_kv_heads(void)
{
    static float q[1 * 6 * 3 * 8], k[1 * 4 * 3 * 8], v[1 * 4 * 3 * 8], out[1 * 6 * 3 * 8];
    eng_sdpa_args a;
    memset(&a, 0, sizeof a);
    a.q = eng_view_contiguous(q, 1, 6, 3, 8);
    a.k = eng_view_contiguous(k, 1, 4, 3, 8);
    a.v = eng_view_contiguous(v, 1, 4, 3, 8);
    a.out = eng_view_contiguous(out, 1, 6, 3, 8);
    EXPECT_REJECT(a, ENG_EINVAL, "k|q|v", "6 query heads over 4 kv heads");
    a.k.ne[1] = a.v.ne[1] = 12; /* more kv heads than query heads */
    a.k.stride[0] = a.v.stride[0] = 0;
    a.k.stride[1] = a.v.stride[1] = 0;
    EXPECT_REJECT(a, ENG_EINVAL, "k|q|v", "6 query heads over 12 kv heads");
}

static void test_rejects_bad_mask_shapes(void)
{
    eng_sdpa_args a = valid_small();
    a.attn_mask = (eng_mask){ENG_MASK_BOOL, sb.mask, {1, 1, 3, 7}, {0, 0, 7, 1}};
    EXPECT_REJECT(a, ENG_EINVAL, "attn_mask", "mask L extent 3 (neither 1 nor 5)");
    a.attn_mask = (eng_mask){ENG_MASK_BOOL, sb.mask, {1, 1, 5, 8}, {0, 0, 8, 1}};
    EXPECT_REJECT(a, ENG_EINVAL, "attn_mask", "mask S extent 8 (S is 7)");
    a.attn_mask = (eng_mask){ENG_MASK_BOOL, sb.mask, {1, 2, 5, 7}, {0, 35, 7, 1}};
    EXPECT_REJECT(a, ENG_EINVAL, "attn_mask", "mask H extent 2 (H is 4)");
    a.attn_mask = (eng_mask){ENG_MASK_FLOAT, sb.mask, {3, 1, 5, 7}, {35, 0, 7, 1}};
    EXPECT_REJECT(a, ENG_EINVAL, "attn_mask", "mask B extent 3 (B is 2)");
    a.attn_mask = (eng_mask){ENG_MASK_BOOL, sb.mask, {1, 1, 0, 7}, {0, 0, 7, 1}};
    EXPECT_REJECT(a, ENG_EINVAL, "attn_mask", "mask extent 0");
    a.attn_mask = (eng_mask){ENG_MASK_BOOL, NULL, {1, 1, 5, 7}, {0, 0, 7, 1}};
    EXPECT_REJECT(a, ENG_EINVAL, "attn_mask", "mask without data");
    a.attn_mask = (eng_mask){(eng_mask_kind)7, sb.mask, {1, 1, 5, 7}, {0, 0, 7, 1}};
    EXPECT_REJECT(a, ENG_EINVAL, "attn_mask", "unknown mask kind");
    a.attn_mask = (eng_mask){ENG_MASK_BOOL, sb.mask, {1, 1, 5, 7}, {0, 0, -7, 1}};
    EXPECT_REJECT(a, ENG_EINVAL, "attn_mask", "negative mask stride");
}

static void test_rejects_bad_options(void)
{
    eng_sdpa_args a = valid_small();
    a.window_left_set = true;
    a.window_left = -1;
    EXPECT_REJECT(a, ENG_EINVAL, "window_left|window", "window left -1");
    a = valid_small();
    a.window_right_set = true;
    a.window_right = -3;
    EXPECT_REJECT(a, ENG_EINVAL, "window_right|window", "window right -3");

    a = valid_small();
    a.kv_lengths = sb.kvlen;
    sb.kvlen[1] = 8;
    EXPECT_REJECT(a, ENG_EINVAL, "kv_lengths", "kv_lengths 8 > S = 7");
    sb.kvlen[1] = -1;
    EXPECT_REJECT(a, ENG_EINVAL, "kv_lengths", "kv_lengths -1");

    const float nonfinite[] = {NAN, INFINITY, -INFINITY};
    for (int t = 0; t < 3; t++) {
        a = valid_small();
        a.scale_set = true;
        a.scale = nonfinite[t];
        EXPECT_REJECT(a, ENG_EINVAL, "scale", "non-finite scale");
        a = valid_small();
        a.softcap = nonfinite[t];
        EXPECT_REJECT(a, ENG_EINVAL, "softcap", "non-finite softcap");
    }
    a = valid_small();
    a.softcap = -1.0f;
    EXPECT_REJECT(a, ENG_EINVAL, "softcap", "negative softcap");

    a = valid_small();
    a.open_tail_keys = 8;
    EXPECT_REJECT(a, ENG_EINVAL, "open_tail_keys", "open_tail_keys 8 > S = 7");
    a.open_tail_keys = -1;
    EXPECT_REJECT(a, ENG_EINVAL, "open_tail_keys", "open_tail_keys -1");

    float w[8 * 8] = {0}, vv[8] = {0};
    a = valid_small();
    a.additive_w_q = w;
    a.additive_v = vv;
    a.additive_dim = 8;
    EXPECT_REJECT(a, ENG_EINVAL, "additive|additive_w_k", "additive scoring without W_k");
    a.additive_w_k = w;
    a.additive_dim = 0;
    EXPECT_REJECT(a, ENG_EINVAL, "additive|additive_dim", "additive dimension 0");
    a.additive_dim = -4;
    EXPECT_REJECT(a, ENG_EINVAL, "additive|additive_dim", "additive dimension -4");

    a = valid_small();
    a.align = (eng_align)9;
    EXPECT_REJECT(a, ENG_EINVAL, "align", "unknown alignment");

    a = valid_small();
    a.key_padding = sb.pad;
    a.key_padding_stride = -7;
    EXPECT_REJECT(a, ENG_EINVAL, "key_padding|key_padding_mask|key_padding_stride",
                  "negative key padding stride");

    a = valid_small();
    a.weights_mode = ENG_WEIGHTS_PER_HEAD;
    a.weights = NULL;
    EXPECT_REJECT(a, ENG_EINVAL, "weights", "weights requested without a buffer");
    a.weights_mode = (eng_weights_mode)5;
    a.weights = sb.weights;
    EXPECT_REJECT(a, ENG_EINVAL, "weights|weights_mode", "unknown weights mode");
}

static void test_rejects_missing_data_and_bad_strides(void)
{
    const char *names[4] = {"q", "k", "v", "out"};
    for (int t = 0; t < 4; t++) {
        eng_sdpa_args a = valid_small();
        eng_view *views[4] = {&a.q, &a.k, &a.v, &a.out};
        char what[64];
        views[t]->data = NULL;
        snprintf(what, sizeof what, "%s.data NULL", names[t]);
        EXPECT_REJECT(a, ENG_EINVAL, names[t], what);

        a = valid_small();
        views[t]->stride[3] = 2;
        snprintf(what, sizeof what, "%s inner stride 2", names[t]);
        EXPECT_REJECT(a, ENG_EINVAL, names[t], what);

        a = valid_small();
        views[t]->stride[2] = -views[t]->stride[2];
        snprintf(what, sizeof what, "%s negative row stride", names[t]);
        EXPECT_REJECT(a, ENG_EINVAL, names[t], what);
    }
}

/* Sizes whose products overflow int64 are refused before anything is allocated or read. */
static void test_rejects_overflowing_sizes(void)
{
    const int64_t big = INT64_C(1) << 22;
    /* A stride so large that the view's extent overflows. */
    eng_sdpa_args a = valid_small();
    a.q.stride[0] = INT64_MAX / 2 + 1;
    EXPECT_REJECT(a, ENG_ETOOBIG, "q", "q extent overflows int64");
    a = valid_small();
    a.v.stride[1] = INT64_MAX;
    EXPECT_REJECT(a, ENG_ETOOBIG, "v", "v extent overflows int64");

    /* B * H * L * Dv of the output overflows; the inputs broadcast over everything. */
    a = valid_small();
    a.q = view_of(sb.q, big, 1, big, 8, 0, 0, 8);
    a.k = view_of(sb.k, big, 1, 7, 8, 0, 0, 8);
    a.v = view_of(sb.v, big, 1, 7, big, 0, 0, big);
    a.out = view_of(sb.out, big, 1, big, big, big * big, big * big, big);
    EXPECT_REJECT(a, ENG_ETOOBIG, "out", "out of 2^66 elements");

    /* Per-head weights [B, H, L, S] of 2^64 elements, every view modest (head stride 0). */
    a = valid_small();
    a.q = view_of(sb.q, 1, INT64_C(1) << 20, INT64_C(1) << 21, 1, 0, 0, 1);
    a.k = view_of(sb.k, 1, 1, INT64_C(1) << 23, 1, 0, 0, 1);
    a.v = view_of(sb.v, 1, 1, INT64_C(1) << 23, 1, 0, 0, 1);
    a.out = view_of(sb.out, 1, INT64_C(1) << 20, INT64_C(1) << 21, 1, 0, INT64_C(1) << 21, 1);
    a.weights_mode = ENG_WEIGHTS_PER_HEAD;
    a.weights = sb.weights;
    EXPECT_REJECT(a, ENG_ETOOBIG, "weights", "weights of 2^64 elements");
}

/* BLAS takes int dimensions and leading dimensions: a head size beyond INT32_MAX must be
 * refused (with ETOOBIG) rather than truncated. */
static void test_rejects_dims_beyond_blas(void)
{
    const int64_t huge = INT64_C(1) << 31;
    eng_sdpa_args a = valid_small();
    a.q = view_of(sb.q, 1, 1, 1, huge, huge, huge, huge);
    a.k = view_of(sb.k, 1, 1, 1, huge, huge, huge, huge);
    a.v = view_of(sb.v, 1, 1, 1, 6, 6, 6, 6);
    a.out = view_of(sb.out, 1, 1, 1, 6, 6, 6, 6);
    EXPECT_REJECT(a, ENG_ETOOBIG, "q|k", "D = 2^31");
    a = valid_small();
    a.q = view_of(sb.q, 1, 1, 1, 8, 8, 8, 8);
    a.k = view_of(sb.k, 1, 1, 1, 8, 8, 8, 8);
    a.v = view_of(sb.v, 1, 1, 1, huge, huge, huge, huge);
    a.out = view_of(sb.out, 1, 1, 1, huge, huge, huge, huge);
    EXPECT_REJECT(a, ENG_ETOOBIG, "v|out", "Dv = 2^31");
    a = valid_small();
    a.q = view_of(sb.q, 1, 1, 2, 8, 2 * huge, 2 * huge, huge);
    a.k = view_of(sb.k, 1, 1, 1, 8, 8, 8, 8);
    a.v = view_of(sb.v, 1, 1, 1, 6, 6, 6, 6);
    a.out = view_of(sb.out, 1, 1, 2, 6, 12, 12, 6);
    EXPECT_REJECT(a, ENG_ETOOBIG, "q", "q row stride 2^31 (a BLAS leading dimension)");
}

/* ---- main --------------------------------------------------------------------------------- */

int main(void)
{
    int status;
    if (test_engine_start(&pool, &status))
        return status;
    quick = test_quick();

    RUN_WITHIN(test_golden_seed_cases, 30);
    RUN_WITHIN(test_view_contiguous_strides, 30);
    RUN_WITHIN(test_alibi_default_slopes_match_formula, 30);

    RUN_WITHIN(test_valid_small_problem_is_accepted, 30);
    RUN_WITHIN(test_rejects_missing_pool_or_arguments, 30);
    RUN_WITHIN(test_rejects_nonpositive_dimensions, 60);
    RUN_WITHIN(test_rejects_mismatched_shapes, 60);
    RUN_WITHIN(test_rejects_heads_not_multiple_of_kv_heads, 60);
    RUN_WITHIN(test_rejects_bad_mask_shapes, 60);
    RUN_WITHIN(test_rejects_bad_options, 60);
    RUN_WITHIN(test_rejects_missing_data_and_bad_strides, 60);
    RUN_WITHIN(test_rejects_overflowing_sizes, 60);
    RUN_WITHIN(test_rejects_dims_beyond_blas, 60);

    run_case_file(); /* tests/engine/cases/sdpa_cases.json */
    RUN_WITHIN(test_attn_mask_strided, 60);
    RUN_WITHIN(test_large_finite_negative_mask_is_not_empty, 60);
    RUN_WITHIN(test_zero_and_negative_scale, 60);
    RUN_WITHIN(test_rows_without_visible_keys, 60);
    RUN_WITHIN(test_scores_near_plus_minus_1e4, 60);
    RUN_WITHIN(test_row_maximum_arrives_late, 120);
    RUN_WITHIN(test_zero_stride_broadcast_views, 60);
    RUN_WITHIN(test_value_alignment_never_changes_the_output, 120);
    RUN_WITHIN(test_row_stride_below_row_length_is_refused, 60);
    RUN_WITHIN(test_keys_beyond_kv_lengths_are_ignored, 60);
    RUN_WITHIN(test_window_past_the_keys_sees_only_the_open_tail, 60);
    RUN_WITHIN(test_nonfinite_inputs_are_reported, 60);
    RUN_WITHIN(test_random_configurations, 240);
    RUN_WITHIN(test_decode_with_almost_every_key_hidden, 60);
    RUN_WITHIN(test_grouped_decode_reads_each_kv_block_once, 60);
    RUN_WITHIN(test_lse_merges_key_shards, 60);
    RUN_WITHIN(test_scratch_is_bounded_by_blocks, 30);
    RUN_WITHIN(test_sdpa_from_inside_a_pool_task, 60);
    RUN_WITHIN(test_rows_per_task_never_change_the_output, 60);

    RUN_WITHIN(test_concurrent_requests_are_bit_identical, 120);
    RUN_WITHIN(test_cancel_from_another_thread, 60);
    RUN_WITHIN(test_cancel_flag_already_set, 60);
    RUN_WITHIN(test_deadline_already_past, 60);
    RUN_WITHIN(test_deadline_stops_a_long_job_early, 60);

    eng_pool_free(pool);
    return check_report();
}
