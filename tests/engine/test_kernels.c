/*
 * test_kernels.c - the specification of the engine's own kernels (engine/kernels/kernels.h): every
 * kernel set this CPU supports computes the same products as a float64 reference, on ragged
 * sizes and unaligned strides, and every vector exponential agrees with the scalar one on the
 * edge cases the softmax relies on. A set this CPU lacks is skipped with a line naming it.
 *
 * Products: |C - reference| <= 4 K eps max|A| max|B| + eps |reference| per element (fp32
 * accumulation of K terms, each rounded once, plus the final scaling): a dropped or doubled
 * term of magnitude ~1/4 would exceed it by far.
 */
#include "engine/kernels/kernels.h"
#include "engine/kernels/tile_avx512.h"
#include "tests/support/check.h"
#include "tests/support/util.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *const set_names[] = {"avx512", "avx2", "generic", "openblas"};
#define N_SETS ((int)(sizeof set_names / sizeof set_names[0]))

static bool quick;

/* ---- Options ------------------------------------------------------------------------------- */

/* set_names's sets as eng_init's choices. */
static const eng_kernel_choice set_choices[] = {ENG_KERNELS_AVX512, ENG_KERNELS_AVX2,
                                                ENG_KERNELS_GENERIC, ENG_KERNELS_OPENBLAS};

/* The set auto must pick: the widest this CPU and OS run. */
static const char *widest_set(void)
{
    return eng_kernels_supported("avx512") ? "avx512"
           : eng_kernels_supported("avx2") ? "avx2"
                                           : "openblas";
}

static bool same_options(const eng_options *a, const eng_options *b)
{
    return a->kernels == b->kernels && a->bf16 == b->bf16;
}

static void test_values_outside_the_lists_are_refused(void)
{
    eng_options before, after;
    eng_options_get(&before);
    const char *name = eng_kernels_name();
    eng_options bad_set = {ENG_KERNEL_CHOICE_COUNT, ENG_BF16_AUTO};
    eng_options bad_path = {ENG_KERNELS_AUTO, ENG_BF16_PATH_COUNT};
    eng_error err;
    memset(&err, 0, sizeof err);
    CHECK_EQ_INT(eng_init(&bad_set, &err), ENG_EINVAL);
    CHECK(strcmp(err.field, "kernels") == 0 && strstr(err.message, "openblas") != NULL);
    memset(&err, 0, sizeof err);
    CHECK_EQ_INT(eng_init(&bad_path, &err), ENG_EINVAL);
    CHECK(strcmp(err.field, "bf16") == 0 && strstr(err.message, "amx-emulated") != NULL);
    /* The options in force stay. */
    eng_options_get(&after);
    CHECK(same_options(&before, &after));
    CHECK(strcmp(eng_kernels_name(), name) == 0);
}

static void test_each_supported_set_can_be_chosen(void)
{
    eng_options before;
    eng_options_get(&before);
    for (int i = 0; i < N_SETS; i++) {
        eng_options opts = {set_choices[i], before.bf16}, now;
        eng_error err;
        memset(&err, 0, sizeof err);
        eng_status st = eng_init(&opts, &err);
        eng_options_get(&now);
        if (eng_kernels_supported(set_names[i])) {
            CHECK_EQ_INT(st, ENG_OK);
            CHECK(strcmp(eng_kernels_name(), set_names[i]) == 0);
            CHECK(same_options(&now, &opts));
        } else {
            /* The message says what the CPU lacks and what it has; the set in use stays. */
            CHECK_EQ_INT(st, ENG_EINVAL);
            CHECK(strcmp(err.field, "kernels") == 0);
            CHECK(strstr(err.message, set_names[i]) != NULL);
            CHECK(strstr(err.message, "it has") != NULL);
            CHECK(!same_options(&now, &opts));
        }
    }
    /* generic and openblas run anywhere. */
    CHECK(eng_kernels_supported("generic"));
    CHECK(eng_kernels_supported("openblas"));
    CHECK(!eng_kernels_supported("auto"));
    CHECK_EQ_INT(eng_init(&before, NULL), ENG_OK);
}

static void test_auto_picks_the_widest_supported_set(void)
{
    eng_options before, now;
    eng_options_get(&before);
    eng_options opts = {ENG_KERNELS_AUTO, before.bf16};
    CHECK_EQ_INT(eng_init(&opts, NULL), ENG_OK);
    CHECK(strcmp(eng_kernels_name(), widest_set()) == 0);
    /* NULL is the defaults: auto for both. */
    CHECK_EQ_INT(eng_init(&(eng_options){ENG_KERNELS_GENERIC, ENG_BF16_EMULATED}, NULL), ENG_OK);
    CHECK_EQ_INT(eng_init(NULL, NULL), ENG_OK);
    eng_options_get(&now);
    CHECK(now.kernels == ENG_KERNELS_AUTO && now.bf16 == ENG_BF16_AUTO);
    CHECK(strcmp(eng_kernels_name(), widest_set()) == 0);
    CHECK_EQ_INT(eng_init(&before, NULL), ENG_OK);
}

/* Each bf16 path picks the code that eng_engine_info names: rounding for emulated, VDPBF16PS
 * for native in the avx512 set where the CPU has it, the emulated tiles for amx-emulated. */
static void test_bf16_path_picks_the_products(void)
{
    eng_options before;
    eng_options_get(&before);
    for (int i = 0; i < N_SETS; i++) {
        if (!eng_kernels_supported(set_names[i]) || set_choices[i] == ENG_KERNELS_OPENBLAS)
            continue; /* openblas computes bf16 requests in float32 */
        static const struct {
            eng_bf16_path path;
            const char *bf16;
        } paths[] = {{ENG_BF16_EMULATED, "emulated"},
                     {ENG_BF16_NATIVE, "avx512bf16"},
                     {ENG_BF16_AMX_EMULATED, "amx-emulated"}};
        for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++) {
            eng_options opts = {set_choices[i], paths[p].path};
            CHECK_EQ_INT(eng_init(&opts, NULL), ENG_OK);
            eng_engine_info info;
            eng_engine_info_get(&info);
            const char *want = paths[p].bf16;
            if (paths[p].path == ENG_BF16_NATIVE &&
                (set_choices[i] != ENG_KERNELS_AVX512 || !strstr(info.features, "avx512bf16")))
                want = "emulated"; /* native falls back to rounding */
            CHECKF(strcmp(info.bf16, want) == 0, "%s, bf16 path %d: bf16 '%s', want '%s'",
                   set_names[i], (int)paths[p].path, info.bf16, want);
            /* Under the tiles, the set's own bf16 products are auto's, which depend on the
             * CPU's vendor: only the two paths that name them are checked. */
            if (paths[p].path != ENG_BF16_AMX_EMULATED)
                CHECK((eng__kernels_current()->tile_bf16 != NULL) ==
                      (strcmp(want, "avx512bf16") == 0));
        }
    }
    CHECK_EQ_INT(eng_init(&before, NULL), ENG_OK);
}

/* What a process that never calls eng_init runs on (main's --defaults mode). */
static int print_defaults(void)
{
    eng_options o;
    eng_options_get(&o);
    eng_engine_info info;
    eng_engine_info_get(&info);
    printf("%s %d %d %s\n", eng_kernels_name(), (int)o.kernels, (int)o.bf16, info.bf16);
    return 0;
}

/* A process that never calls eng_init runs on the defaults, whatever its environment says:
 * this binary again, in its --defaults mode, with both variables naming something else. */
static void test_without_eng_init_the_defaults_run(void)
{
    int fds[2];
    CHECK(pipe(fds) == 0);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], STDOUT_FILENO);
        close(fds[0]);
        setenv("ATTND_KERNELS", "generic", 1);
        setenv("ATTND_BF16", "amx-emulated", 1);
        execl("/proc/self/exe", "test_kernels", "--defaults", (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    char out[256] = "";
    size_t got = 0;
    ssize_t n;
    while (got < sizeof out - 1 && (n = read(fds[0], out + got, sizeof out - 1 - got)) > 0)
        got += (size_t)n;
    close(fds[0]);
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
          WEXITSTATUS(status) == 0);
    char want[64];
    snprintf(want, sizeof want, "%s 0 0 ", widest_set());
    CHECKF(strncmp(out, want, strlen(want)) == 0, "without eng_init: '%s', want '%s...'", out,
           want);
    CHECKF(!strstr(out, "amx"), "without eng_init: '%s' runs tiles", out);
}

static void test_engine_info_names_set_cpu_and_openblas(void)
{
    eng_engine_info info;
    eng_engine_info_get(&info);
    CHECK(strcmp(info.kernels, eng_kernels_name()) == 0);
    CHECK(info.cpu[0] != '\0');
    CHECK(info.openblas_core[0] != '\0');
    CHECK(info.kc > 0 && info.nc > 0);
}

/* ---- Cache sizes and blocking ---------------------------------------------------------------- */

/* A size no source gave blocks as a typical cache would, never as a zero one: the blocking of
 * unknown sizes equals that of 32 KiB and 1 MiB, and each known size moves it. */
static void test_blocking_never_comes_from_a_zero(void)
{
    const int tiles[][2] = {{12, 32}, {6, 16}, {4, 16}, {1, 1}};
    for (size_t t = 0; t < sizeof tiles / sizeof tiles[0]; t++) {
        const int mr = tiles[t][0], nr = tiles[t][1];
        int64_t kc0, nc0, kc, nc;
        const eng__cache_sizes unknown = {0, 0}, typical = {32768, 1 << 20};
        eng__blocking(&unknown, mr, nr, &kc0, &nc0);
        eng__blocking(&typical, mr, nr, &kc, &nc);
        CHECKF(kc0 == kc && nc0 == nc,
               "tile %dx%d: unknown caches block as kc=%lld nc=%lld, "
               "typical ones as kc=%lld nc=%lld",
               mr, nr, (long long)kc0, (long long)nc0, (long long)kc, (long long)nc);
        CHECK(kc0 > 0 && nc0 > 0 && nc0 % nr == 0);
        const eng__cache_sizes only_l2 = {0, 4 << 20}, only_l1 = {49152, 0};
        eng__blocking(&only_l2, mr, nr, &kc, &nc);
        CHECK(kc == kc0 && nc > nc0); /* L1 still typical, the larger L2 widens nc */
        eng__blocking(&only_l1, mr, nr, &kc, &nc);
        CHECK(kc >= kc0 && nc > 0);
    }
}

/* Each size comes from the first source that names it; a later source fills only zeros. */
static void test_cache_sizes_fall_through_sources(void)
{
    eng__cache_sizes c = {0, 0};
    const eng__cache_sizes leaf = {0, 0}, legacy = {49152, 0}, system = {32768, 1 << 20};
    eng__cache_fill(&c, &leaf);
    eng__cache_fill(&c, &legacy);
    eng__cache_fill(&c, &system);
    CHECK_EQ_INT(c.l1d, 49152);
    CHECK_EQ_INT(c.l2, 1 << 20);
    /* This process's sizes: some source names them on Linux, and the sets block from them. */
    eng_engine_info info;
    eng_engine_info_get(&info);
    CHECKF(info.l1d_bytes > 0 && info.l2_bytes > 0, "L1d %zu, L2 %zu bytes", info.l1d_bytes,
           info.l2_bytes);
    const eng__kernels *ks = eng__kernels_current();
    const eng__cache_sizes found = {info.l1d_bytes, info.l2_bytes};
    int64_t kc, nc;
    eng__blocking(&found, ks->mr, ks->nr, &kc, &nc);
    CHECK(kc == info.kc && nc == info.nc);
}

/* ---- Products ------------------------------------------------------------------------------ */

/* One product with its own buffers, offset by one float so that no row starts aligned. */
typedef struct {
    int64_t m, n, k, lda, ldb, ldc;
    bool b_trans;
    bool prepacked; /* B handed to eng__sgemm packed already (b_packed), as the layer does */
    float *a, *b, *c, *a_mem, *b_mem, *c_mem;
} product;

static product product_new(int64_t m, int64_t n, int64_t k, bool b_trans, uint64_t *rng)
{
    product p = {.m = m, .n = n, .k = k, .b_trans = b_trans};
    p.lda = k + 3;
    p.ldb = (b_trans ? k : n) + 5;
    p.ldc = n + 1;
    int64_t brows = b_trans ? n : k;
    p.a_mem = xcalloc((size_t)(m * p.lda + 1), sizeof(float));
    p.b_mem = xcalloc((size_t)(brows * p.ldb + 1), sizeof(float));
    p.c_mem = xcalloc((size_t)(m * p.ldc + 1), sizeof(float));
    p.a = p.a_mem + 1;
    p.b = p.b_mem + 1;
    p.c = p.c_mem + 1;
    for (int64_t i = 0; i < m * p.lda; i++)
        p.a[i] = rng_sym(rng, 1.0);
    for (int64_t i = 0; i < brows * p.ldb; i++)
        p.b[i] = rng_sym(rng, 1.0);
    return p;
}

static void product_free(product *p)
{
    free(p->a_mem);
    free(p->b_mem);
    free(p->c_mem);
}

static double b_at(const product *p, int64_t kk, int64_t j)
{
    return p->b_trans ? p->b[j * p->ldb + kk] : p->b[kk * p->ldb + j];
}

/* Runs C = alpha A op(B) + beta C0 on set `ks` and compares with float64; C0 is NaN when beta
 * is 0 (the kernels must not read it) and random otherwise. Returns the failures. */
static int product_check(const eng__kernels *ks, product *p, float alpha, float beta, uint64_t *rng)
{
    float *c0 = xcalloc((size_t)(p->m * p->ldc), sizeof(float));
    for (int64_t i = 0; i < p->m * p->ldc; i++) {
        c0[i] = beta == 0.0f ? NAN : rng_sym(rng, 1.0);
        p->c[i] = c0[i];
    }
    float *pack = NULL;
    size_t pack_floats = eng__sgemm_pack_floats(ks, p->n, p->k);
    if (pack_floats && posix_memalign((void **)&pack, 64, pack_floats * sizeof(float)) != 0)
        pack = NULL;
    if (pack_floats && !pack) {
        free(c0);
        return 1;
    }
    eng__gemm g = {.m = p->m,
                   .n = p->n,
                   .k = p->k,
                   .alpha = alpha,
                   .beta = beta,
                   .a = p->a,
                   .lda = p->lda,
                   .b = p->b,
                   .ldb = p->ldb,
                   .b_trans = p->b_trans,
                   .c = p->c,
                   .ldc = p->ldc};
    float *panels = NULL;
    if (p->prepacked && ks->tile) {
        size_t floats = eng__sgemm_panels_floats(ks, p->n, p->k);
        if (posix_memalign((void **)&panels, 64, floats * sizeof(float)) != 0) {
            free(pack);
            free(c0);
            return 1;
        }
        eng__sgemm_pack_panels(ks, p->b, p->ldb, p->b_trans, p->k, p->n, panels);
        g.b = NULL;
        g.b_packed = panels;
        g.b_panel_stride = p->k * ks->nr;
    }
    eng__sgemm(ks, &g, pack);
    free(panels);
    int bad = 0;
    double tol_k = 4.0 * (double)p->k * FLT_EPSILON;
    for (int64_t i = 0; i < p->m && bad < 3; i++) {
        for (int64_t j = 0; j < p->ldc && bad < 3; j++) {
            float got = p->c[i * p->ldc + j];
            if (j >= p->n) { /* the gap between rows is never written */
                if (!(got == c0[i * p->ldc + j] || (isnan(got) && isnan(c0[i * p->ldc + j])))) {
                    CHECKF(false, "%s: m=%lld n=%lld k=%lld: gap element (%lld, %lld) written",
                           ks->name, (long long)p->m, (long long)p->n, (long long)p->k,
                           (long long)i, (long long)j);
                    bad++;
                }
                continue;
            }
            double ref = 0;
            for (int64_t kk = 0; kk < p->k; kk++)
                ref += (double)p->a[i * p->lda + kk] * b_at(p, kk, j);
            ref = alpha * ref + (beta == 0.0f ? 0.0 : beta * (double)c0[i * p->ldc + j]);
            double tol = tol_k * fabs((double)alpha) + FLT_EPSILON * (fabs(ref) + 1.0);
            if (!(fabs((double)got - ref) <= tol)) {
                CHECKF(false,
                       "%s: m=%lld n=%lld k=%lld trans=%d alpha=%g beta=%g: C(%lld,%lld) = %.9g, "
                       "reference %.9g",
                       ks->name, (long long)p->m, (long long)p->n, (long long)p->k, p->b_trans,
                       (double)alpha, (double)beta, (long long)i, (long long)j, (double)got, ref);
                bad++;
            }
        }
    }
    free(pack);
    free(c0);
    return bad;
}

static const int64_t ragged[] = {1, 7, 15, 16, 17, 63, 65, 257};
#define N_RAGGED ((int)(sizeof ragged / sizeof ragged[0]))

/* Every M, N, K of the ragged list against the reference on set ks, with B as given or packed
 * once beforehand (`prepacked`); the layout of B, alpha and beta vary with the sizes, and the
 * two runs pair them differently. At most three failures are reported. */
static void check_ragged_products(const eng__kernels *ks, bool prepacked, uint64_t *rng)
{
    const int v = prepacked ? 1 : 0;
    int failures = 0;
    for (int im = 0; im < N_RAGGED && failures < 3; im++)
        for (int in = 0; in < N_RAGGED && failures < 3; in++)
            for (int ik = 0; ik < N_RAGGED && failures < 3; ik++) {
                /* Quick runs (sanitizers) skip the largest cubes, not the ragged edges. */
                if (quick && ragged[im] * ragged[in] * ragged[ik] > 300000)
                    continue;
                bool trans = (im + in + ik + v) % 2 == 0;
                product p = product_new(ragged[im], ragged[in], ragged[ik], trans, rng);
                p.prepacked = prepacked;
                failures += product_check(ks, &p, (ik % 3) == v ? 0.125f : 1.0f,
                                          ((prepacked ? im : in) % 2) ? 1.0f : 0.0f, rng);
                product_free(&p);
            }
}

/* Every M, N, K of the ragged list, both layouts of B, beta 0 and 1, on every set. */
static void test_sgemm_ragged_sizes_unaligned_strides(void)
{
    for (int s = 0; s < N_SETS; s++) {
        const eng__kernels *ks = eng__kernels_named(set_names[s]);
        if (!ks) {
            printf("skip: kernel set %s: this CPU or OS does not support it\n", set_names[s]);
            continue;
        }
        uint64_t rng = 1000 + (uint64_t)s;
        check_ragged_products(ks, false, &rng);
    }
}

/* The same sizes with B packed once beforehand (b_packed, as the layer's projections and the
 * attention's shared panels hand it over), depth past one block included. */
static void test_sgemm_prepacked_ragged_sizes(void)
{
    for (int s = 0; s < N_SETS; s++) {
        const eng__kernels *ks = eng__kernels_named(set_names[s]);
        if (!ks || !ks->tile) {
            printf("skip: prepacked B on kernel set %s: %s\n", set_names[s],
                   ks ? "it has no register tile (OpenBLAS packs for itself)"
                      : "this CPU or OS does not support it");
            continue;
        }
        uint64_t rng = 2000 + (uint64_t)s;
        check_ragged_products(ks, true, &rng);
        product deep = product_new(ks->mr + 1, ks->nc + 7, 2 * ks->kc + 3, true, &rng);
        deep.prepacked = true;
        product_check(ks, &deep, 1.0f, 1.0f, &rng);
        product_free(&deep);
    }
}

/* More columns than one packed block and more depth than one panel, so that the driver's
 * outer loops and the beta of later depth blocks are exercised. */
static void test_sgemm_beyond_one_block(void)
{
    for (int s = 0; s < N_SETS; s++) {
        const eng__kernels *ks = eng__kernels_named(set_names[s]);
        if (!ks || !ks->tile)
            continue;
        uint64_t rng = 77;
        product p = product_new(ks->mr + 1, ks->nc + 7, 2 * ks->kc + 3, true, &rng);
        product_check(ks, &p, 0.5f, 1.0f, &rng);
        product_free(&p);
        product q = product_new(2, ks->nc + 7, ks->kc + 1, false, &rng);
        product_check(ks, &q, 1.0f, 0.0f, &rng);
        product_free(&q);
    }
}

/* ---- Packing ------------------------------------------------------------------------------- */

/* B's element (depth p, column j) in a [k x n] B of row stride ldb, or in its [n x k] B^T. */
static size_t b_index(bool trans, int64_t ldb, int64_t p, int64_t j)
{
    return (size_t)(trans ? j * ldb + p : p * ldb + j);
}

/* Elements of the packed B out of place: fp32 panels hold (p, j) at panel j / NR, row p,
 * column j % NR; pair panels at pair row p / 2, lane 2 (j % NR) + p % 2; both zero past
 * column n, and the pair panels past depth k. */
static int64_t packed_misplaced(int64_t nr, int64_t k, int64_t n, bool trans, int64_t ldb,
                                const uint16_t *b16, const float *pf, const uint16_t *pp)
{
    const int64_t width = (n + nr - 1) / nr * nr, pair_stride = eng__bf16_panel_stride(nr, k);
    int64_t misplaced = 0;
    for (int64_t j = 0; j < width; j++) {
        const float *panel = pf + j / nr * k * nr;
        const uint16_t *pairs = pp + j / nr * pair_stride + 2 * (j % nr);
        for (int64_t p = 0; p < k + k % 2; p++) {
            uint16_t want = j < n && p < k ? b16[b_index(trans, ldb, p, j)] : 0;
            if (p < k)
                misplaced += panel[p * nr + j % nr] != eng_bf16_to_f32(want);
            misplaced += pairs[p / 2 * 2 * nr + p % 2] != want;
        }
    }
    return misplaced;
}

/* One B of k x n random bf16 values: its bits and their widening packed both ways. */
static void check_packing(const eng__kernels *ks, int64_t k, int64_t n, bool trans, uint64_t *rng)
{
    const int64_t nr = ks->nr, ldb = (trans ? k : n) + 3;
    const size_t nb = b_index(trans, ldb, k - 1, n - 1) + 1;
    const size_t nf = eng__sgemm_panels_floats(ks, n, k), np = eng__bf16_panels_elems(nr, n, k);
    uint16_t *b16 = xcalloc(nb, sizeof *b16);
    float *b = xcalloc(nb, sizeof *b);
    for (size_t i = 0; i < nb; i++) {
        b16[i] = eng_f32_to_bf16(rng_sym(rng, 4.0));
        b[i] = eng_bf16_to_f32(b16[i]);
    }
    float *pf = aligned_alloc(64, (nf * sizeof(float) + 63) / 64 * 64),
          *pf16 = aligned_alloc(64, (nf * sizeof(float) + 63) / 64 * 64);
    uint16_t *pp = aligned_alloc(64, (np * 2 + 63) / 64 * 64),
             *pp16 = aligned_alloc(64, (np * 2 + 63) / 64 * 64);
    memset(pf16, 0xFF, nf * sizeof(float)); /* NaN: an unwritten float shows */
    memset(pp16, 0xFF, np * 2);
    eng__sgemm_pack_panels(ks, b, ldb, trans, k, n, pf);
    eng__sgemm_pack_panels16(ks, b16, ldb, trans, k, n, pf16);
    eng__bf16_pack_panels(nr, b, ldb, trans, k, n, pp);
    eng__bf16_pack_panels16(nr, b16, ldb, trans, k, n, pp16);
    CHECKF(memcmp(pf, pf16, nf * sizeof(float)) == 0 && memcmp(pp, pp16, np * 2) == 0,
           "%s: panels of bf16 bits differ from those of their widening (k=%lld n=%lld trans=%d)",
           ks->name, (long long)k, (long long)n, trans);
    int64_t misplaced = packed_misplaced(nr, k, n, trans, ldb, b16, pf16, pp16);
    CHECKF(misplaced == 0, "%s: %lld packed elements misplaced (k=%lld n=%lld trans=%d)", ks->name,
           (long long)misplaced, (long long)k, (long long)n, trans);
    free(b16);
    free(b);
    free(pf);
    free(pf16);
    free(pp);
    free(pp16);
}

/* The packers of B's bf16 bits (bf16 views, KV caches) pack what their exact widening packs,
 * bit for bit and in the layout the micro-kernels read, for ragged depths and widths, both
 * layouts of B, on every set with a micro-kernel. */
static void test_packing_bf16_bits_matches_their_widening(void)
{
    static const int64_t sizes[] = {1, 7, 15, 16, 17, 63, 65};
    for (int s = 0; s < N_SETS; s++) {
        const eng__kernels *ks = eng__kernels_named(set_names[s]);
        if (!ks || !ks->tile)
            continue;
        uint64_t rng = 300 + (uint64_t)s;
        for (size_t ik = 0; ik < 7; ik++)
            for (size_t in = 0; in < 7; in++)
                for (int trans = 0; trans < 2; trans++)
                    check_packing(ks, sizes[ik], sizes[in], trans, &rng);
    }
}

/* n floats that end where an inaccessible page begins. */
static float *guarded_floats(size_t n, guarded *g)
{
    return guarded_alloc(n * sizeof(float), g);
}

/* The flash loop's 6 x 64 tile (tile_avx512.h) on every ragged m, n, k: A of exactly m rows
 * (an unaligned buffer, so that a read past row m - 1 is caught by ASan); B as two packed panels
 * with an uneven panel stride (one panel for n <= 32), or, in_place (the _rows entry), as k rows
 * of exactly n floats at an odd row stride, unaligned, the last one ending where an inaccessible
 * page begins (a read past column n faults); C with a gap after each row that must stay untouched;
 * beta 0 (C starts as NaN, never read) and beta 1. */
static int wide_tile_check(int m, int n, int64_t k, float alpha, float beta, bool in_place,
                           uint64_t *rng)
{
    const int64_t lda = k + 3, ldc = n + 1;
    const int64_t ldb = in_place ? n + 5 : 32, half = in_place ? 32 : n > 32 ? k * 32 + 16 : 0;
    const int64_t b_floats = in_place ? (k - 1) * ldb + n : half + k * 32;
    float *a_mem = xcalloc((size_t)((m - 1) * lda + k + 1), sizeof(float)), *a = a_mem + 1;
    float *c = xcalloc((size_t)(m * ldc), sizeof(float));
    float *c0 = xcalloc((size_t)(m * ldc), sizeof(float));
    guarded b_map;
    float *b = guarded_floats((size_t)b_floats, &b_map);
    for (int64_t i = 0; i < (m - 1) * lda + k; i++)
        a[i] = rng_sym(rng, 1.0);
    for (int64_t i = 0; i < b_floats; i++)
        b[i] = rng_sym(rng, 1.0);
    for (int64_t i = 0; i < m * ldc; i++)
        c[i] = c0[i] = beta == 0.0f ? NAN : rng_sym(rng, 1.0);
    if (in_place)
        eng__tile_avx512_wide_rows(k, a, lda, b, ldb, c, ldc, alpha, beta, m, n);
    else
        eng__tile_avx512_wide(k, a, lda, b, half, c, ldc, alpha, beta, m, n);
    int bad = 0;
    double tol_k = 4.0 * (double)k * FLT_EPSILON * fabs((double)alpha);
    for (int i = 0; i < m && bad < 3; i++)
        for (int j = 0; j < ldc && bad < 3; j++) {
            float got = c[i * ldc + j], before = c0[i * ldc + j];
            if (j >= n) {
                if (!(got == before || (isnan(got) && isnan(before)))) {
                    CHECKF(false, "wide tile m=%d n=%d k=%lld: gap (%d, %d) written", m, n,
                           (long long)k, i, j);
                    bad++;
                }
                continue;
            }
            const float *bj = b + (j < 32 ? j : half + j - 32);
            double ref = 0;
            for (int64_t p = 0; p < k; p++)
                ref += (double)a[i * lda + p] * bj[p * ldb];
            ref = alpha * ref + (beta == 0.0f ? 0.0 : beta * (double)before);
            if (!(fabs((double)got - ref) <= tol_k + FLT_EPSILON * (fabs(ref) + 1.0))) {
                CHECKF(false,
                       "wide tile m=%d n=%d k=%lld alpha=%g beta=%g in_place=%d: C(%d,%d) = %.9g, "
                       "reference %.9g",
                       m, n, (long long)k, (double)alpha, (double)beta, in_place, i, j, (double)got,
                       ref);
                bad++;
            }
        }
    free(a_mem);
    guarded_free(&b_map);
    free(c);
    free(c0);
    return bad;
}

static void test_wide_tile_ragged_sizes(void)
{
    if (!eng_kernels_supported("avx512")) {
        printf("skip: avx512 wide tile: this CPU or OS does not support it\n");
        return;
    }
    static const int cols[] = {1, 7, 15, 16, 17, 32, 33, 63, 64};
    uint64_t rng = 4242;
    int failures = 0;
    for (int m = 1; m <= ENG__AVX512_WIDE_MR && failures < 3; m++)
        for (int in = 0; in < (int)(sizeof cols / sizeof cols[0]) && failures < 3; in++)
            for (int ik = 0; ik < N_RAGGED && failures < 3; ik++) {
                for (int in_place = 0; in_place < 2; in_place++) {
                    failures +=
                        wide_tile_check(m, cols[in], ragged[ik], 0.125f, 0.0f, in_place, &rng);
                    failures +=
                        wide_tile_check(m, cols[in], ragged[ik], 1.0f, 1.0f, in_place, &rng);
                }
            }
}

/* ---- Vector exponential -------------------------------------------------------------------- */

static bool same_exp(float got, float want)
{
    if (isnan(want))
        return isnan(got);
    if (want == 0.0f || isinf(want))
        return got == want;
    return fabsf(got - want) <= 4.0f * FLT_EPSILON * want;
}

/* Every variant against the scalar one and against expf's meaning: -inf and anything below
 * -87 give exactly 0, denormal arguments give 1, +-88.7 stay finite or tiny as expf says, 104
 * and +inf overflow to +inf, NaN stays NaN. */
static void test_vector_exp_edge_cases(void)
{
    const float x[] = {-INFINITY, -104.0f,      -88.7f,        -87.5f, -87.0f,   -86.9f, -1.0e-40f,
                       1.0e-40f,  FLT_TRUE_MIN, -FLT_TRUE_MIN, 0.0f,   -0.0f,    -1.0f,  1.0f,
                       -20.5f,    8.0f,         80.0f,         88.3f,  88.7f,    88.72f, 104.0f,
                       INFINITY,  NAN,          -NAN,          3.25f,  -0.6931f, 0.25f};
    const int64_t n = (int64_t)(sizeof x / sizeof x[0]);
    const eng__vec_ops *scalar = eng__vec_variant("scalar");
    float want[sizeof x / sizeof x[0]];
    scalar->exp_store(x, want, n, 0.0f, 1.0f, false);
    for (int64_t i = 0; i < n; i++) {
        double e = exp((double)x[i]);
        if (isnan(x[i]))
            CHECKF(isnan(want[i]), "scalar exp(NaN) = %g", (double)want[i]);
        else if (x[i] < -87.0f)
            CHECKF(want[i] == 0.0f, "scalar exp(%g) = %g, not 0", (double)x[i], (double)want[i]);
        else if (e > FLT_MAX)
            CHECKF(isinf(want[i]) && want[i] > 0, "scalar exp(%g) = %g, not +inf", (double)x[i],
                   (double)want[i]);
        else
            CHECKF(fabs((double)want[i] - e) <= 4.0 * FLT_EPSILON * e, "scalar exp(%g) = %.9g",
                   (double)x[i], (double)want[i]);
    }
    static const char *const variants[] = {"avx2", "avx512"};
    for (int v = 0; v < 2; v++) {
        const eng__vec_ops *ops = eng__vec_variant(variants[v]);
        if (!ops) {
            printf("skip: vector exp %s: this CPU does not support it\n", variants[v]);
            continue;
        }
        /* Every length up to n, so that full vectors and masked tails both see each value. */
        for (int64_t len = 1; len <= n; len++) {
            float got[sizeof x / sizeof x[0]];
            ops->exp_store(x, got, len, 0.0f, 1.0f, false);
            for (int64_t i = 0; i < len; i++)
                CHECKF(same_exp(got[i], want[i]), "%s exp(%g) = %.9g, scalar %.9g (length %lld)",
                       variants[v], (double)x[i], (double)got[i], (double)want[i], (long long)len);
        }
        /* exp_sum over the finite part: the same sum as the scalar variant. */
        float a[8] = {-1, -2, -3, 0, -INFINITY, -90, -0.5f, -7}, b[8];
        memcpy(b, a, sizeof a);
        float sa = ops->exp_sum(a, 8, 0.0f), sb = scalar->exp_sum(b, 8, 0.0f);
        CHECK_NEAR(sa, sb, 8 * FLT_EPSILON * sb);
        CHECK(a[4] == 0.0f && a[5] == 0.0f);
    }
}

/* Whether got is e^d as the softmax's exp_sum and exp_sum_max promise (internal.h): within
 * (2 + 0.75 |d|) FLT_EPSILON, exactly 0 below -87, NaN for NaN. */
static bool softmax_exp_ok(float got, float d)
{
    if (isnan(d))
        return isnan(got);
    if (d < -87.0f)
        return got == 0.0f;
    double want = exp((double)d);
    return fabs((double)got - want) <= (2.0 + 0.75 * fabs((double)d)) * FLT_EPSILON * want;
}

/* The flash loop's exponentials over the whole range a score can take from its row's
 * reference: one row of 20001 arguments from -90 to 10 (full vectors and a masked tail; a
 * shift that is not 0, so that d is x - shift as the kernel rounds it), each within its bound
 * and the sum the sum of them; the bound is 2 FLT_EPSILON near 0, where the terms that count
 * lie. */
static void test_vector_softmax_exp_within_its_bound(void)
{
    enum { N = 20001 };
    static const char *const variants[] = {"scalar", "avx2", "avx512"};
    static float x[N], y[N];
    const float shift = 0.75f;
    for (int i = 0; i < N; i++)
        x[i] = -90.0f + 100.0f * (float)i / (float)(N - 1) + shift;
    for (int v = 0; v < 3; v++) {
        const eng__vec_ops *ops = eng__vec_variant(variants[v]);
        if (!ops) {
            printf("skip: softmax exp %s: this CPU does not support it\n", variants[v]);
            continue;
        }
        for (int pass = 0; pass < 2; pass++) {
            memcpy(y, x, sizeof y);
            float bmax,
                sum = pass ? ops->exp_sum_max(y, N, shift, &bmax) : ops->exp_sum(y, N, shift);
            double want_sum = 0;
            int bad = 0;
            for (int i = 0; i < N; i++) {
                float d = x[i] - shift;
                want_sum += (double)y[i];
                if (!softmax_exp_ok(y[i], d) && bad++ < 3)
                    CHECKF(false, "%s %s: e^%.9g = %.9g, want %.9g", variants[v],
                           pass ? "exp_sum_max" : "exp_sum", (double)d, (double)y[i], exp(d));
            }
            CHECKF(fabs(sum - want_sum) <= 8 * FLT_EPSILON * want_sum, "%s: sum %.9g of %.9g",
                   variants[v], (double)sum, want_sum);
        }
    }
}

/* The online softmax's one-pass kernel: for every variant, length (full vectors and tails) and
 * position of a NaN, the same block maximum as `max` and the same sums and exponentials as
 * `exp_sum` (each exponential within its bound), and a NaN anywhere reported as the maximum
 * even though no compare per vector looks for it; +inf and -inf are plain scores. */
static void test_vector_exp_sum_max_reports_the_maximum_and_nan(void)
{
    enum { LEN = 37 };
    static const char *const variants[] = {"scalar", "avx2", "avx512"};
    const eng__vec_ops *scalar = eng__vec_variant("scalar");
    uint64_t rng = 11;
    float base[LEN];
    for (int i = 0; i < LEN; i++)
        base[i] = (float)rng_sym(&rng, 6.0);
    base[3] = -INFINITY;
    base[20] = 7.5f;
    for (int v = 0; v < 3; v++) {
        const eng__vec_ops *ops = eng__vec_variant(variants[v]);
        if (!ops) {
            printf("skip: exp_sum_max %s: this CPU does not support it\n", variants[v]);
            continue;
        }
        for (int64_t len = 1; len <= LEN; len++) {
            float x[LEN], y[LEN], bmax;
            memcpy(x, base, sizeof x);
            memcpy(y, base, sizeof y);
            float sum = ops->exp_sum_max(x, len, 1.25f, &bmax);
            float want = scalar->exp_sum(y, len, 1.25f);
            CHECKF(bmax == scalar->max(base, len), "%s: block max %g (length %lld)", variants[v],
                   (double)bmax, (long long)len);
            CHECKF(fabsf(sum - want) <= 8 * FLT_EPSILON * want, "%s: sum %.9g, scalar %.9g",
                   variants[v], (double)sum, (double)want);
            for (int64_t i = 0; i < len; i++)
                CHECKF(softmax_exp_ok(x[i], base[i] - 1.25f), "%s: exp at %lld: %.9g, scalar %.9g",
                       variants[v], (long long)i, (double)x[i], (double)y[i]);
            for (int64_t at = 0; at < len; at++) {
                memcpy(x, base, sizeof x);
                x[at] = NAN;
                ops->exp_sum_max(x, len, 1.25f, &bmax);
                CHECKF(isnan(bmax), "%s: NaN at %lld of %lld not reported (max %g)", variants[v],
                       (long long)at, (long long)len, (double)bmax);
            }
        }
        float inf_row[3] = {0.0f, INFINITY, -1.0f}, bmax;
        ops->exp_sum_max(inf_row, 3, 0.0f, &bmax);
        CHECKF(isinf(bmax) && bmax > 0, "%s: +inf score gives max %g", variants[v], (double)bmax);
    }
}

/* A value of `dtype` near x: its bits at *bits (16-bit dtypes), its exact value returned. */
static float kv_value(eng_dtype dtype, float x, uint16_t *bits)
{
    if (dtype == ENG_DTYPE_BF16) {
        *bits = eng_f32_to_bf16(x);
        return eng_bf16_to_f32(*bits);
    }
    if (dtype == ENG_DTYPE_F16) {
        *bits = eng_f32_to_f16(x);
        return eng_f16_to_f32(*bits);
    }
    return x;
}

#define ROWS_N  13  /* keys per call: a whole group of eight keys and a short one */
#define ROWS_D  260 /* longest row: past the widening buffer of the avx512 kernels (256) */
#define ROWS_LD 263 /* row stride: rows start unaligned */

/* The decoding kernels of one variant and dtype on one row length d: every row count up to
 * ENG__STREAM_ROWS against float64, and each row computed alone gives the same bits (a row
 * alone is the first, which reads the keys in another order than the rows after it). */
static void check_rows_kernels(const eng__vec_ops *ops, eng_dtype dtype, int64_t d, uint64_t *rng)
{
    static float q[ENG__STREAM_ROWS][ROWS_D], o[ENG__STREAM_ROWS][ROWS_D],
        p[ENG__STREAM_ROWS][ROWS_N];
    static float kf[ROWS_N * ROWS_LD];
    static uint16_t k16[ROWS_N * ROWS_LD];
    for (int64_t i = 0; i < ROWS_N * ROWS_LD; i++)
        kf[i] = kv_value(dtype, (float)rng_sym(rng, 1.0), &k16[i]);
    const void *k = dtype == ENG_DTYPE_F32 ? (const void *)kf : (const void *)k16;
    const float *qp[ENG__STREAM_ROWS];
    float *op[ENG__STREAM_ROWS];
    for (int r = 0; r < ENG__STREAM_ROWS; r++) {
        for (int64_t i = 0; i < d; i++)
            q[r][i] = (float)rng_sym(rng, 1.0);
        for (int c = 0; c < ROWS_N; c++)
            p[r][c] = (float)rng_sym(rng, 1.0);
        qp[r] = q[r];
        op[r] = o[r];
    }
    for (int rows = 1; rows <= ENG__STREAM_ROWS; rows++) {
        float s[ENG__STREAM_ROWS * ROWS_N], alone[ROWS_N];
        ops->dots_rows(qp, rows, k, dtype, ROWS_LD, ROWS_N, d, 0.5f, s, ROWS_N);
        memset(o, 0, sizeof o);
        ops->axpys_rows(op, rows, &p[0][0], ROWS_N, k, dtype, ROWS_LD, ROWS_N, d);
        for (int r = 0; r < rows; r++) {
            static float o_alone[ROWS_D];
            memset(o_alone, 0, sizeof o_alone);
            float *oa = o_alone;
            ops->axpys_rows(&oa, 1, p[r], ROWS_N, k, dtype, ROWS_LD, ROWS_N, d);
            CHECKF(memcmp(o_alone, o[r], sizeof o_alone) == 0,
                   "%s axpys_rows dtype %d d=%lld: row %d alone differs with %d rows", ops->name,
                   (int)dtype, (long long)d, r, rows);
            ops->dots_rows(&qp[r], 1, k, dtype, ROWS_LD, ROWS_N, d, 0.5f, alone, ROWS_N);
            for (int c = 0; c < ROWS_N; c++) {
                double ref = 0;
                for (int64_t i = 0; i < d; i++)
                    ref += (double)q[r][i] * kf[c * ROWS_LD + i];
                CHECKF(fabs(s[r * ROWS_N + c] - 0.5 * ref) <= 2 * (double)(d + 1) * FLT_EPSILON,
                       "%s dots_rows dtype %d d=%lld rows=%d: row %d key %d = %.9g, want %.9g",
                       ops->name, (int)dtype, (long long)d, rows, r, c, (double)s[r * ROWS_N + c],
                       0.5 * ref);
                CHECKF(memcmp(&alone[c], &s[r * ROWS_N + c], sizeof(float)) == 0,
                       "%s dots_rows dtype %d d=%lld: row %d alone differs with %d rows", ops->name,
                       (int)dtype, (long long)d, r, rows);
            }
            for (int64_t i = 0; i < ROWS_D; i++) {
                double ref = 0;
                for (int c = 0; c < ROWS_N && i < d; c++)
                    ref += (double)p[r][c] * kf[c * ROWS_LD + i];
                CHECKF(fabs(o[r][i] - ref) <= 2 * ROWS_N * FLT_EPSILON,
                       "%s axpys_rows dtype %d d=%lld rows=%d: o[%d][%lld] = %.9g, want %.9g",
                       ops->name, (int)dtype, (long long)d, rows, r, (long long)i, (double)o[r][i],
                       ref);
            }
        }
        if (dtype != ENG_DTYPE_F32) { /* 16-bit rows: the bits of fp32 rows of their values */
            float s32[ENG__STREAM_ROWS * ROWS_N], o16[ENG__STREAM_ROWS][ROWS_D];
            memcpy(o16, o, sizeof o);
            memset(o, 0, sizeof o);
            ops->dots_rows(qp, rows, kf, ENG_DTYPE_F32, ROWS_LD, ROWS_N, d, 0.5f, s32, ROWS_N);
            ops->axpys_rows(op, rows, &p[0][0], ROWS_N, kf, ENG_DTYPE_F32, ROWS_LD, ROWS_N, d);
            CHECKF(memcmp(s, s32, (size_t)(rows * ROWS_N) * sizeof(float)) == 0 &&
                       memcmp(o16, o, sizeof o) == 0,
                   "%s dtype %d d=%lld rows=%d: 16-bit rows differ from fp32 rows of their values",
                   ops->name, (int)dtype, (long long)d, rows);
        }
        for (int r = rows; r < ENG__STREAM_ROWS; r++) /* rows past `rows` are never written */
            for (int64_t i = 0; i < d; i++)
                CHECKF(o[r][i] == 0.0f, "%s axpys_rows wrote row %d of %d", ops->name, r, rows);
    }
}

/* dots_rows and axpys_rows (the decoding path) agree with float64 for fp32, bf16 and f16 rows,
 * on lengths around the vector widths, with unaligned row strides. */
static void test_vector_rows_dots_and_axpys(void)
{
    static const char *const variants[] = {"scalar", "avx2", "avx512"};
    static const int64_t lengths[] = {1, 7, 8, 15, 16, 17, 33, 64, 128, 130, 256, 257};
    static const eng_dtype dtypes[] = {ENG_DTYPE_F32, ENG_DTYPE_BF16, ENG_DTYPE_F16};
    uint64_t rng = 5;
    for (int v = 0; v < 3; v++) {
        const eng__vec_ops *ops = eng__vec_variant(variants[v]);
        if (!ops) {
            printf("skip: vector rows %s: this CPU does not support it\n", variants[v]);
            continue;
        }
        for (size_t t = 0; t < sizeof dtypes / sizeof dtypes[0]; t++)
            for (size_t n = 0; n < sizeof lengths / sizeof lengths[0]; n++)
                check_rows_kernels(ops, dtypes[t], lengths[n], &rng);
    }
}

/* The bf16 pair kernels (one query row over a bf16 cache, heads of a multiple of 32) agree
 * with float64, on lengths of one to four chunks of 128 and a ragged last one, with unaligned
 * row strides; axpys_bf16_pairs adds to what o holds. */
static void test_vector_bf16_pairs(void)
{
    enum { N = 37, LD = 523 };
    static const int64_t lengths[] = {32, 64, 96, 128, 160, 256, 288, 512};
    static float q[512], o[512], o0[512], p[N], s[N], kf[N * LD];
    static uint16_t k16[N * LD];
    const eng__vec_ops *ops = eng__vec_variant("avx512");
    uint64_t rng = 8;
    if (!ops || !ops->dots_bf16_pairs) {
        printf("skip: bf16 pair kernels: this CPU has no AVX-512\n");
        return;
    }
    for (int64_t i = 0; i < N * LD; i++)
        kf[i] = kv_value(ENG_DTYPE_BF16, (float)rng_sym(&rng, 1.0), &k16[i]);
    for (size_t t = 0; t < sizeof lengths / sizeof lengths[0]; t++) {
        const int64_t d = lengths[t];
        for (int64_t i = 0; i < d; i++) {
            q[i] = (float)rng_sym(&rng, 1.0);
            o[i] = o0[i] = (float)rng_sym(&rng, 1.0);
        }
        for (int c = 0; c < N; c++)
            p[c] = (float)rng_sym(&rng, 1.0);
        ops->dots_bf16_pairs(q, k16, LD, N, d, 0.25f, s);
        ops->axpys_bf16_pairs(o, p, k16, LD, N, d);
        for (int c = 0; c < N; c++) {
            double ref = 0;
            for (int64_t i = 0; i < d; i++)
                ref += (double)q[i] * kf[c * LD + i];
            CHECKF(fabs(s[c] - 0.25 * ref) <= (double)(d + 1) * FLT_EPSILON,
                   "dots_bf16_pairs d=%lld key %d = %.9g, want %.9g", (long long)d, c, (double)s[c],
                   0.25 * ref);
        }
        for (int64_t i = 0; i < d; i++) {
            double ref = o0[i];
            for (int c = 0; c < N; c++)
                ref += (double)p[c] * kf[c * LD + i];
            CHECKF(fabs(o[i] - ref) <= 2 * (N + 1) * FLT_EPSILON,
                   "axpys_bf16_pairs d=%lld o[%lld] = %.9g, want %.9g", (long long)d, (long long)i,
                   (double)o[i], ref);
        }
    }
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--defaults") == 0)
        return print_defaults();
    if (test_kernels_skip())
        return 0;
    const char *q = getenv("ATTND_TEST_QUICK");
    quick = q && strcmp(q, "1") == 0;
    RUN_WITHIN(test_values_outside_the_lists_are_refused, 30);
    RUN_WITHIN(test_each_supported_set_can_be_chosen, 30);
    RUN_WITHIN(test_auto_picks_the_widest_supported_set, 30);
    RUN_WITHIN(test_bf16_path_picks_the_products, 30);
    RUN_WITHIN(test_without_eng_init_the_defaults_run, 30);
    RUN_WITHIN(test_engine_info_names_set_cpu_and_openblas, 30);
    RUN_WITHIN(test_blocking_never_comes_from_a_zero, 30);
    RUN_WITHIN(test_cache_sizes_fall_through_sources, 30);
    RUN_WITHIN(test_sgemm_ragged_sizes_unaligned_strides, 300);
    RUN_WITHIN(test_sgemm_prepacked_ragged_sizes, 300);
    RUN_WITHIN(test_sgemm_beyond_one_block, 120);
    RUN_WITHIN(test_packing_bf16_bits_matches_their_widening, 60);
    RUN_WITHIN(test_wide_tile_ragged_sizes, 60);
    RUN_WITHIN(test_vector_exp_edge_cases, 30);
    RUN_WITHIN(test_vector_softmax_exp_within_its_bound, 30);
    RUN_WITHIN(test_vector_exp_sum_max_reports_the_maximum_and_nan, 30);
    RUN_WITHIN(test_vector_rows_dots_and_axpys, 30);
    RUN_WITHIN(test_vector_bf16_pairs, 30);
    return check_report();
}
