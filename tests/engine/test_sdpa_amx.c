/*
 * test_sdpa_amx.c - attention's bf16 products on AMX tiles (sdpa_products.c SDPA_BF16_AMX).
 *
 * Where the tiles run (the hardware's, or ATTND_BF16=amx-emulated, as the Makefile runs this
 * binary), a bf16 call plans the AMX products, packs each key block once into eng__amx_pack_b's
 * layout, and its two products give the bits of eng__amx_sgemm on the same operands packed
 * apart (test_amx holds eng__amx_sgemm to the TDPBF16PS semantics), at ragged depths, block
 * widths and panel offsets. Accuracy against float64 is test_sdpa_bf16's, run the same way.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/sdpa/plan.h"
#include "tests/support/check.h"
#include "tests/support/util.h"

/* One call's tensors: Q [1, 1, L, D], K [1, 1, S, D], V [1, 1, S, Dv]. */
typedef struct {
    int64_t L, S, D, Dv;
    float *q, *k, *v, *out;
    eng_sdpa_args a;
} amx_call;

static void call_init(amx_call *c, int64_t L, int64_t S, int64_t D, int64_t Dv, uint64_t seed)
{
    uint64_t rng = seed;
    *c = (amx_call){.L = L, .S = S, .D = D, .Dv = Dv};
    c->q = xcalloc((size_t)(L * D), sizeof(float));
    c->k = xcalloc((size_t)(S * D), sizeof(float));
    c->v = xcalloc((size_t)(S * Dv), sizeof(float));
    c->out = xcalloc((size_t)(L * Dv), sizeof(float));
    for (int64_t i = 0; i < L * D; i++)
        c->q[i] = rng_sym(&rng, 1.0);
    for (int64_t i = 0; i < S * D; i++)
        c->k[i] = rng_sym(&rng, 1.0);
    for (int64_t i = 0; i < S * Dv; i++)
        c->v[i] = rng_sym(&rng, 1.0);
    c->a.q = eng_view_contiguous(c->q, 1, 1, L, D);
    c->a.k = eng_view_contiguous(c->k, 1, 1, S, D);
    c->a.v = eng_view_contiguous(c->v, 1, 1, S, Dv);
    c->a.out = eng_view_contiguous(c->out, 1, 1, L, Dv);
    c->a.precision = ENG_PRECISION_BFLOAT16;
}

static void call_free(amx_call *c)
{
    free(c->q);
    free(c->k);
    free(c->v);
    free(c->out);
}

/* Whether this run has tiles: otherwise each test says so and checks nothing. */
static bool tiles_run(const char *what)
{
    if (eng__amx_active() != ENG__AMX_OFF && eng__kernels_current()->tile)
        return true;
    printf("skip: %s: no AMX tiles in this run (%s); ATTND_BF16=amx-emulated runs them\n", what,
           eng__amx_reason());
    return false;
}

static void test_bf16_calls_plan_the_tile_products(void)
{
    if (!tiles_run("plan"))
        return;
    amx_call c;
    call_init(&c, 300, 500, 64, 64, 1);
    plan p;
    eng__sdpa_plan_init(&p, &c.a, NULL, 2);
    CHECK_EQ_INT(p.products, SDPA_BF16_AMX);
    CHECK_EQ_INT(p.amx, eng__amx_active());
    CHECK_EQ_INT(p.path, SDPA_PANELS);
    CHECK(!p.prepack); /* each task packs its key blocks into the tiles' layout */
    c.a.precision = ENG_PRECISION_FLOAT32;
    eng__sdpa_plan_init(&p, &c.a, NULL, 2);
    CHECK_EQ_INT(p.products, SDPA_FP32);
    CHECK_EQ_INT(p.amx, ENG__AMX_OFF);
    call_free(&c);
}

static void *aligned_floats(size_t n)
{
    void *x = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
    CHECK(x != NULL);
    memset(x, 0, (n * sizeof(float) + 63) / 64 * 64);
    return x;
}

/* c (ldc) = alpha A B with A fp32 rows (lda) rounded by the tiles, and B's rows (ldb) packed
 * apart: b_trans for K (n keys of depth k), else V (k keys of n columns). */
static void model_product(const float *a, int64_t lda, const float *b, int64_t ldb, bool b_trans,
                          int64_t m, int64_t n, int64_t k, float alpha, float beta, float *c,
                          int64_t ldc)
{
    uint16_t *bp = aligned_floats((eng__amx_panels_elems(n, k) + 1) / 2);
    uint16_t *as = aligned_floats((eng__amx_a_elems(k) + 1) / 2);
    eng__amx_pack_b(b, ENG_DTYPE_F32, ldb, b_trans, k, n, bp);
    eng__amx_gemm g = {.m = m,
                       .n = n,
                       .k = k,
                       .alpha = alpha,
                       .beta = beta,
                       .a = a,
                       .lda = lda,
                       .b = bp,
                       .c = c,
                       .ldc = ldc};
    eng__amx_sgemm(eng__amx_active(), &g, as);
    free(bp);
    free(as);
}

/* One panel of `rows` query rows against keys [c0, cols) of a block of `cols` keys: the scores
 * and then o = P V (P: the scores themselves) are eng__amx_sgemm's bits on the same values. */
static void check_panel(int64_t D, int64_t Dv, int64_t cols, int64_t c0, int64_t rows)
{
    amx_call c;
    call_init(&c, rows, cols, D, Dv, (uint64_t)(D * 1000 + cols * 10 + c0 + rows));
    plan p;
    eng__sdpa_plan_init(&p, &c.a, NULL, 1);
    float *scratch = aligned_floats(p.lay.total);
    const q_rows q = {0, 0, 0, rows, 0};
    eng__sdpa_round_queries(&p, &q, scratch);
    key_block kb = {.j0 = 0, .cols = cols, .kind = KEYS_INSIDE, .c0 = c0, .n = cols - c0};
    block_panels bp = eng__sdpa_block_operands(&p, 0, 0, &kb, scratch);
    float *s = xcalloc((size_t)(rows * cols), sizeof *s), *o = xcalloc((size_t)(rows * Dv), 4);
    float *want_s = xcalloc((size_t)(rows * cols), sizeof *s);
    float *want_o = xcalloc((size_t)(rows * Dv), sizeof *o);
    eng__sdpa_panel_scores(&p, &q, &kb, &bp, (mat){s, cols}, scratch);
    model_product(c.q, D, c.k + c0 * D, D, true, rows, kb.n, D, p.scale, 0.0f, want_s, cols);
    CHECKF(memcmp(s, want_s, (size_t)(rows * cols) * sizeof *s) == 0,
           "scores D=%lld cols=%lld c0=%lld rows=%lld: not the tiles' bits", (long long)D,
           (long long)cols, (long long)c0, (long long)rows);
    for (int64_t i = 0; i < rows * Dv; i++)
        o[i] = want_o[i] = (float)i * 0.25f; /* P V adds to what the rows hold */
    eng__sdpa_panel_values(&p, rows, &kb, &bp, (mat){s, cols}, (mat){o, Dv}, scratch);
    model_product(want_s, cols, c.v + c0 * Dv, Dv, false, rows, Dv, kb.n, 1.0f, 1.0f, want_o, Dv);
    CHECKF(memcmp(o, want_o, (size_t)(rows * Dv) * sizeof *o) == 0,
           "P V D=%lld Dv=%lld cols=%lld c0=%lld rows=%lld: not the tiles' bits", (long long)D,
           (long long)Dv, (long long)cols, (long long)c0, (long long)rows);
    free(s);
    free(o);
    free(want_s);
    free(want_o);
    free(scratch);
    call_free(&c);
}

static void test_panel_products_are_the_tiles_bits(void)
{
    if (!tiles_run("panel products"))
        return;
    static const int64_t depths[][2] = {{64, 64}, {33, 17}, {80, 80}, {128, 40}};
    static const int64_t widths[] = {17, 32, 64, 100};
    for (size_t d = 0; d < sizeof depths / sizeof depths[0]; d++)
        for (size_t w = 0; w < sizeof widths / sizeof widths[0]; w++)
            for (int64_t c0 = 0; c0 < widths[w]; c0 += ENG__AMX_NR)
                for (int64_t rows = 1; rows <= 6; rows += 5)
                    check_panel(depths[d][0], depths[d][1], widths[w], c0, rows);
}

/* Panels of keys start on whole tile panels, whatever the kernel set's NR. */
static void test_panel_keys_start_on_tile_panels(void)
{
    if (!tiles_run("panel keys"))
        return;
    amx_call c;
    call_init(&c, 200, 200, 64, 64, 3);
    c.a.causal = true;
    c.a.window_left_set = true; /* rows from i see keys from i - 20 on */
    c.a.window_left = 20;
    plan p;
    eng__sdpa_plan_init(&p, &c.a, NULL, 1);
    for (int64_t i = 40; i < 200; i += 7) {
        key_block kb = {.j0 = 0, .cols = 200, .kind = KEYS_BOUNDARY};
        CHECK(eng__sdpa_panel_keys(&p, 0, i, 4, &kb));
        CHECKF(kb.c0 % ENG__AMX_NR == 0 && kb.c0 <= i - 20 && kb.c0 + ENG__AMX_NR > i - 20,
               "rows from %lld: keys from %lld, want the tile panel of key %lld", (long long)i,
               (long long)kb.c0, (long long)(i - 20));
    }
    call_free(&c);
}

int main(void)
{
    if (test_kernels_skip())
        return 0;
    RUN(test_bf16_calls_plan_the_tile_products);
    RUN(test_panel_products_are_the_tiles_bits);
    RUN(test_panel_keys_start_on_tile_panels);
    return check_report();
}
