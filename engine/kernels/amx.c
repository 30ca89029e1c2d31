/*
 * amx.c - the AMX path's set-up and driver: whether this process may use the tiles (cpuid,
 * XCR0, the kernel's permission), the tile configuration loaded once per thread, the packing
 * of B into tile rows, and the loop of 32 x 32 blocks around the micro-kernel (amx_body.h).
 *
 * Linux keeps the 8 KiB of tile data out of every thread's signal frame until the process asks
 * for it: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) once, after which each thread
 * that executes LDTILECFG gets the state (Documentation/arch/x86/xstate.rst). Without that
 * permission the first tile instruction raises SIGILL, so the hardware path runs only once
 * the request has succeeded, and otherwise the reason is kept for the start-up log.
 */
#include <assert.h>
#include <cpuid.h>
#include <immintrin.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "engine/kernels/amx.h"

#define ARCH_GET_XCOMP_PERM 0x1022
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA  18
/* XCR0's tile bits: XTILECFG (17) and XTILEDATA (18). */
#define XCR0_TILE 0x60000u

static pthread_once_t once = PTHREAD_ONCE_INIT;
static bool hw_ok;
/* What each bf16 path gives, worked out once by probe(): its mode, and why the hardware tiles
 * do not run with it. Switching paths is then one atomic store. */
static eng__amx_mode path_mode[ENG_BF16_PATH_COUNT];
static char path_reason[ENG_BF16_PATH_COUNT][160];
static _Atomic eng_bf16_path path;                /* zero: auto */
static _Thread_local eng__amx_mode thread_config; /* the mode whose config this thread holds */

/* The row loops around the tiles (rounding A, scaling C): AVX2 where the CPU has it (every CPU
 * with AMX does), else plain C, with the same bits either way. */
typedef struct {
    void (*to_bf16)(const float *x, int64_t n, uint16_t *dst);
    void (*store_row)(const float *s, int64_t n, float alpha, float beta, float *c);
} row_ops;
static row_ops rows;

static uint64_t read_xcr0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

/* Whether the CPU, the OS and the kernel's permission allow the tiles; else why not. */
static bool probe_hw(char *why, size_t len)
{
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid_max(0, NULL) < 7) {
        snprintf(why, len, "the CPU has no cpuid leaf 7");
        return false;
    }
    __cpuid_count(7, 0, eax, ebx, ecx, edx);
    if (!(edx & (1u << 24)) || !(edx & (1u << 22))) {
        snprintf(why, len, "the CPU has no AMX-TILE and AMX-BF16");
        return false;
    }
    __get_cpuid(1, &eax, &ebx, &ecx, &edx);
    if (!(ecx & bit_OSXSAVE) || (read_xcr0() & XCR0_TILE) != XCR0_TILE) {
        snprintf(why, len, "the OS does not enable the tile state (XCR0 bits 17-18)");
        return false;
    }
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) {
        snprintf(why, len, "the kernel refused arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA)");
        return false;
    }
    unsigned long granted = 0;
    if (syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &granted) != 0 ||
        !(granted & (1ul << XFEATURE_XTILEDATA))) {
        snprintf(why, len, "the kernel did not grant the tile data state");
        return false;
    }
    return true;
}

static void to_bf16_scalar(const float *x, int64_t n, uint16_t *dst);
static void to_bf16_avx2(const float *x, int64_t n, uint16_t *dst);
static void store_row_scalar(const float *s, int64_t n, float alpha, float beta, float *c);
static void store_row_avx2(const float *s, int64_t n, float alpha, float beta, float *c);

#define PATH_NAME(value, name) name,
static const char *const path_names[ENG_BF16_PATH_COUNT] = {ENG_BF16_PATH_LIST(PATH_NAME)};
#undef PATH_NAME

/* The mode of path `p` and its reason. The hardware tiles run only when asked for until a run
 * on an AMX CPU has checked them against the emulation (tests/bench/device_amx.sh): no bf16
 * request is served by code not yet seen to be right there. */
static void describe_path(eng_bf16_path p, const char *why_not_hw)
{
    char *why = path_reason[p];
    size_t len = sizeof path_reason[p];
    path_mode[p] = p == ENG_BF16_AMX_EMULATED   ? ENG__AMX_EMULATED
                   : p == ENG_BF16_AMX && hw_ok ? ENG__AMX_HW
                                                : ENG__AMX_OFF;
    if (path_mode[p] == ENG__AMX_HW)
        why[0] = '\0';
    else if (path_mode[p] == ENG__AMX_EMULATED)
        snprintf(why, len, "bf16 path %s; hardware tiles: %s", path_names[p],
                 hw_ok ? "granted" : why_not_hw);
    else if (!hw_ok)
        snprintf(why, len, "%s", why_not_hw);
    else if (p == ENG_BF16_AUTO)
        snprintf(why, len, "the tiles are granted; bf16 path amx uses them");
    else
        snprintf(why, len, "bf16 path %s runs no tiles", path_names[p]);
}

static void probe(void)
{
    char why[128] = "";
    bool avx2 = __builtin_cpu_supports("avx2");
    rows =
        (row_ops){avx2 ? to_bf16_avx2 : to_bf16_scalar, avx2 ? store_row_avx2 : store_row_scalar};
    hw_ok = probe_hw(why, sizeof why);
    for (int p = 0; p < ENG_BF16_PATH_COUNT; p++)
        describe_path((eng_bf16_path)p, why);
}

void eng__amx_configure(eng_bf16_path p)
{
    assert((unsigned)p < ENG_BF16_PATH_COUNT);
    pthread_once(&once, probe);
    atomic_store(&path, p);
}

eng__amx_mode eng__amx_active(void)
{
    pthread_once(&once, probe);
    return path_mode[atomic_load(&path)];
}

const char *eng__amx_reason(void)
{
    pthread_once(&once, probe);
    return path_reason[atomic_load(&path)];
}

bool eng__amx_hw_available(void)
{
    pthread_once(&once, probe);
    return hw_ok;
}

void eng__amx_config_fill(eng__amx_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg->rows[t] = 16;
        cfg->colsb[t] = 64;
    }
}

/* Loads the configuration for `m` on this thread unless it holds it already. */
static void config_thread(eng__amx_mode m)
{
    if (thread_config == m)
        return;
    eng__amx_config cfg;
    eng__amx_config_fill(&cfg);
    if (m == ENG__AMX_HW)
        eng__amx_config_load_hw(&cfg);
    else
        eng__amx_config_load_emu(&cfg);
    thread_config = m;
}

int64_t eng__amx_depth(int64_t k)
{
    return (k + ENG__AMX_DEPTH - 1) / ENG__AMX_DEPTH * ENG__AMX_DEPTH;
}

size_t eng__amx_panels_elems(int64_t n, int64_t k)
{
    return (size_t)((n + ENG__AMX_NR - 1) / ENG__AMX_NR) *
           (size_t)(eng__amx_depth(k) * ENG__AMX_NR);
}

static uint16_t bf16_of(const void *b, eng_dtype dtype, int64_t at)
{
    switch (dtype) {
    case ENG_DTYPE_BF16:
        return ((const uint16_t *)b)[at];
    case ENG_DTYPE_F16:
        return eng_f32_to_bf16(eng_f16_to_f32(((const uint16_t *)b)[at]));
    case ENG_DTYPE_F32:
    default:
        return eng_f32_to_bf16(((const float *)b)[at]);
    }
}

void eng__amx_pack_b(const void *b, eng_dtype dtype, int64_t ldb, bool b_trans, int64_t k,
                     int64_t n, uint16_t *dst)
{
    const int64_t panel = eng__amx_depth(k) * ENG__AMX_NR;
    memset(dst, 0, eng__amx_panels_elems(n, k) * sizeof *dst);
    for (int64_t j = 0; j < n; j++) {
        uint16_t *col = dst + j / ENG__AMX_NR * panel + (j % ENG__AMX_NR) / 16 * 512 + j % 16 * 2;
        for (int64_t p = 0; p < k; p++) {
            int64_t at = b_trans ? j * ldb + p : p * ldb + j;
            col[p / ENG__AMX_DEPTH * 1024 + p % ENG__AMX_DEPTH / 2 * 32 + p % 2] =
                bf16_of(b, dtype, at);
        }
    }
}

size_t eng__amx_a_elems(int64_t k)
{
    return (size_t)(ENG__AMX_MR * eng__amx_depth(k));
}

/* n fp32 to bf16 bits, as eng_f32_to_bf16: nearest even, a NaN kept as a quiet NaN. */
static void to_bf16_scalar(const float *x, int64_t n, uint16_t *dst)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = eng_f32_to_bf16(x[i]);
}

/* The same bit operations on 8 lanes; the 16-bit results fit packus's unsigned saturation. */
__attribute__((target("avx2"))) static void to_bf16_avx2(const float *x, int64_t n, uint16_t *dst)
{
    const __m256i one = _mm256_set1_epi32(1), half = _mm256_set1_epi32(0x7FFF),
                  quiet = _mm256_set1_epi32(0x40);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256i u = _mm256_castps_si256(v), high = _mm256_srli_epi32(u, 16);
        __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, half), _mm256_and_si256(high, one));
        r = _mm256_srli_epi32(r, 16);
        __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
        r = _mm256_castps_si256(_mm256_blendv_ps(
            _mm256_castsi256_ps(r), _mm256_castsi256_ps(_mm256_or_si256(high, quiet)), nan));
        __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
        _mm_storeu_si128((__m128i *)(void *)(dst + i), _mm256_castsi256_si128(packed));
    }
    to_bf16_scalar(x + i, n - i, dst + i);
}

/* c[j] = alpha s[j] + beta c[j], or alpha s[j] when beta == 0 (c not read). */
static void store_row_scalar(const float *s, int64_t n, float alpha, float beta, float *c)
{
    for (int64_t j = 0; j < n; j++)
        c[j] = beta == 0.0f ? alpha * s[j] : alpha * s[j] + beta * c[j];
}

/* The same multiplies and add, unfused, on 8 lanes. */
__attribute__((target("avx2"))) static void store_row_avx2(const float *s, int64_t n, float alpha,
                                                           float beta, float *c)
{
    const __m256 a = _mm256_set1_ps(alpha), b = _mm256_set1_ps(beta);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 v = _mm256_mul_ps(a, _mm256_loadu_ps(s + j));
        if (beta != 0.0f)
            v = _mm256_add_ps(v, _mm256_mul_ps(b, _mm256_loadu_ps(c + j)));
        _mm256_storeu_ps(c + j, v);
    }
    store_row_scalar(s + j, n - j, alpha, beta, c + j);
}

/* Rows [i0, i0 + n) of A rounded to bf16 into 32 rows of kp, zero past k and n. */
static void pack_a(const eng__amx_gemm *g, int64_t i0, int64_t n, int64_t kp, uint16_t *dst)
{
    for (int64_t r = 0; r < n; r++) {
        rows.to_bf16(g->a + (i0 + r) * g->lda, g->k, dst + r * kp);
        memset(dst + r * kp + g->k, 0, (size_t)(kp - g->k) * sizeof *dst);
    }
    memset(dst + n * kp, 0, (size_t)((ENG__AMX_MR - n) * kp) * sizeof *dst);
}

void eng__amx_sgemm(eng__amx_mode m, const eng__amx_gemm *g, uint16_t *a_scratch)
{
    if (g->m <= 0 || g->n <= 0)
        return;
    pthread_once(&once, probe);
    config_thread(m);
    const int64_t kp = eng__amx_depth(g->k), steps = kp / ENG__AMX_DEPTH,
                  panel = g->b_panel_stride ? g->b_panel_stride : kp * ENG__AMX_NR;
    void (*kernel)(int64_t, const uint16_t *, int64_t, const uint16_t *, float *) =
        m == ENG__AMX_HW ? eng__amx_kernel_hw : eng__amx_kernel_emu;
    _Alignas(64) float acc[ENG__AMX_MR * ENG__AMX_NR];
    for (int64_t i0 = 0; i0 < g->m; i0 += ENG__AMX_MR) {
        int64_t n = g->m - i0 < ENG__AMX_MR ? g->m - i0 : ENG__AMX_MR;
        pack_a(g, i0, n, kp, a_scratch);
        for (int64_t q = 0; q < g->n; q += ENG__AMX_NR) {
            int64_t cols = g->n - q < ENG__AMX_NR ? g->n - q : ENG__AMX_NR;
            kernel(steps, a_scratch, kp, g->b + q / ENG__AMX_NR * panel, acc);
            for (int64_t r = 0; r < n; r++)
                rows.store_row(acc + r * ENG__AMX_NR, cols, g->alpha, g->beta,
                               g->c + (i0 + r) * g->ldc + q);
        }
    }
}
