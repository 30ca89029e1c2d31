/*
 * kernels.c - which kernel set the engine runs: what the CPU and the OS support (cpuid,
 * xgetbv), the cache blocking each set gets from the cache sizes cpuid reports, the choice the
 * process passes to eng_init (a set by name, or auto) and the description the daemon logs.
 *
 * cpuid alone is not enough for AVX: the OS must also save the wider registers on a context
 * switch, which XCR0 (read with xgetbv) says. A CPU with AVX-512F under an OS that does not
 * enable the zmm state gets the AVX2 set, never a kernel that would fault.
 */
#include <cblas.h>
#include <cpuid.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/kernels/amx.h"
#include "engine/kernels/kernels.h"
#include "engine/kernels/tile_avx512.h"
#include "engine/kernels/vmath.h"

/* XCR0 bits: SSE and AVX state (1, 2), then the AVX-512 opmask and zmm state (5, 6, 7). */
#define XCR0_AVX    0x6u
#define XCR0_AVX512 0xE0u
/* Blocking bounds, whatever the caches claim (a virtual machine may report nonsense). */
#define KC_MIN 64
#define KC_MAX 512
#define NC_MIN 256
#define NC_MAX 4096
/* Query rows per flash-loop panel of the openblas set, which has no register tile: the causal
 * diagonal is trimmed per panel of this many rows. */
#define BLAS_PANEL_ROWS 32

typedef struct {
    bool avx2_fma, avx512f, avx512bf16, amd;
    char features[160];
    char model[64];
    eng__cache_sizes caches; /* bytes per core; 0 when no source says */
} cpu_info;

static uint64_t read_xcr0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static void append_feature(cpu_info *c, bool has, const char *name)
{
    size_t len = strlen(c->features);
    if (has && len + strlen(name) + 2 < sizeof c->features)
        snprintf(c->features + len, sizeof c->features - len, "%s%s", len ? " " : "", name);
}

/* The brand string of cpuid leaves 0x80000002-4, spaces trimmed. */
static void read_model(cpu_info *c)
{
    unsigned regs[12] = {0};
    if (__get_cpuid_max(0x80000000u, NULL) < 0x80000004u) {
        snprintf(c->model, sizeof c->model, "unknown x86-64");
        return;
    }
    for (unsigned i = 0; i < 3; i++)
        __get_cpuid(0x80000002u + i, &regs[4 * i], &regs[4 * i + 1], &regs[4 * i + 2],
                    &regs[4 * i + 3]);
    char brand[49];
    memcpy(brand, regs, 48);
    brand[48] = '\0';
    const char *s = brand;
    while (*s == ' ')
        s++;
    snprintf(c->model, sizeof c->model, "%s", s);
    for (size_t n = strlen(c->model); n > 0 && c->model[n - 1] == ' '; n--)
        c->model[n - 1] = '\0';
}

/* Data and unified cache sizes from the deterministic cache leaf: 4 on Intel, 0x8000001D on
 * AMD (the same layout). A virtual machine may answer it with nothing. */
static eng__cache_sizes caches_deterministic(bool amd)
{
    eng__cache_sizes c = {0, 0};
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0, leaf = amd ? 0x8000001Du : 4;
    __get_cpuid(0, &eax, &ebx, &ecx, &edx);
    if ((amd ? __get_cpuid_max(0x80000000u, NULL) : eax) < leaf)
        return c;
    for (unsigned i = 0; i < 16; i++) {
        __cpuid_count(leaf, i, eax, ebx, ecx, edx);
        unsigned type = eax & 0x1Fu, level = (eax >> 5) & 0x7u;
        if (type == 0)
            break;
        if (type == 2) /* instruction cache */
            continue;
        size_t ways = ((ebx >> 22) & 0x3FFu) + 1, parts = ((ebx >> 12) & 0x3FFu) + 1;
        size_t line = (ebx & 0xFFFu) + 1, sets = (size_t)ecx + 1;
        size_t bytes = ways * parts * line * sets;
        if (level == 1)
            c.l1d = bytes;
        else if (level == 2)
            c.l2 = bytes;
    }
    return c;
}

/* AMD's legacy leaves: 0x80000005 ECX[31:24] L1d KiB, 0x80000006 ECX[31:16] L2 KiB. */
static eng__cache_sizes caches_amd_legacy(void)
{
    eng__cache_sizes c = {0, 0};
    unsigned eax, ebx, ecx, edx, top = __get_cpuid_max(0x80000000u, NULL);
    if (top >= 0x80000005u && __get_cpuid(0x80000005u, &eax, &ebx, &ecx, &edx))
        c.l1d = (size_t)(ecx >> 24) * 1024;
    if (top >= 0x80000006u && __get_cpuid(0x80000006u, &eax, &ebx, &ecx, &edx))
        c.l2 = (size_t)(ecx >> 16) * 1024;
    return c;
}

/* The first line of file `dir`/`name` into buf; false when it cannot be read. */
static bool read_line(const char *dir, const char *name, char *buf, size_t size)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    bool ok = fgets(buf, (int)size, f) != NULL;
    fclose(f);
    return ok;
}

/* What Linux reports for CPU 0 (sysfs, "48K"), else glibc's sysconf. */
static eng__cache_sizes caches_system(void)
{
    eng__cache_sizes c = {0, 0};
    for (int i = 0; i < 16; i++) {
        char dir[96], level[16], type[32], size[32];
        snprintf(dir, sizeof dir, "/sys/devices/system/cpu/cpu0/cache/index%d", i);
        if (!read_line(dir, "level", level, sizeof level) ||
            !read_line(dir, "type", type, sizeof type) ||
            !read_line(dir, "size", size, sizeof size))
            break;
        char *end;
        long long n = strtoll(size, &end, 10);
        size_t bytes = n > 0 ? (size_t)n * (*end == 'M' ? 1024 * 1024 : *end == 'K' ? 1024 : 1) : 0;
        if (level[0] == '1' && strncmp(type, "Data", 4) == 0)
            c.l1d = bytes;
        else if (level[0] == '2' && strncmp(type, "Instruction", 11) != 0)
            c.l2 = bytes;
    }
    long l1 = sysconf(_SC_LEVEL1_DCACHE_SIZE), l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    eng__cache_sizes from_sysconf = {l1 > 0 ? (size_t)l1 : 0, l2 > 0 ? (size_t)l2 : 0};
    eng__cache_fill(&c, &from_sysconf);
    return c;
}

void eng__cache_fill(eng__cache_sizes *sizes, const eng__cache_sizes *from)
{
    if (!sizes->l1d)
        sizes->l1d = from->l1d;
    if (!sizes->l2)
        sizes->l2 = from->l2;
}

static void read_caches(cpu_info *c)
{
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    __get_cpuid(0, &eax, &ebx, &ecx, &edx);
    c->amd = ebx == 0x68747541u; /* "Auth"enticAMD */
    c->caches = caches_deterministic(c->amd);
    if (c->amd) {
        eng__cache_sizes legacy = caches_amd_legacy();
        eng__cache_fill(&c->caches, &legacy);
    }
    if (!c->caches.l1d || !c->caches.l2) {
        eng__cache_sizes system = caches_system();
        eng__cache_fill(&c->caches, &system);
    }
}

static void read_cpu(cpu_info *c)
{
    memset(c, 0, sizeof *c);
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    read_model(c);
    read_caches(c);
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx))
        return;
    bool fma = ecx & bit_FMA, osxsave = ecx & bit_OSXSAVE;
    uint64_t xcr0 = osxsave ? read_xcr0() : 0;
    bool os_avx = (xcr0 & XCR0_AVX) == XCR0_AVX, os_avx512 = (xcr0 & XCR0_AVX512) == XCR0_AVX512;
    unsigned b7 = 0, c7 = 0, d7 = 0, a71 = 0;
    if (__get_cpuid_max(0, NULL) >= 7) {
        __cpuid_count(7, 0, eax, b7, c7, d7);
        __cpuid_count(7, 1, a71, ebx, ecx, edx);
    }
    c->avx2_fma = os_avx && fma && (b7 & bit_AVX2);
    c->avx512f = c->avx2_fma && os_avx512 && (b7 & bit_AVX512F);
    append_feature(c, c->avx2_fma, "avx2 fma");
    append_feature(c, c->avx512f, "avx512f");
    append_feature(c, os_avx512 && (b7 & bit_AVX512DQ), "avx512dq");
    append_feature(c, os_avx512 && (b7 & bit_AVX512BW), "avx512bw");
    append_feature(c, os_avx512 && (b7 & bit_AVX512VL), "avx512vl");
    c->avx512bf16 = c->avx512f && (b7 & bit_AVX512BW) && (a71 & (1u << 5));
    append_feature(c, os_avx512 && (a71 & (1u << 5)), "avx512bf16");
    append_feature(c, os_avx512 && (d7 & (1u << 23)), "avx512fp16");
    /* AMX needs XCR0's tile bits (17, 18) and the kernel's permission on top; only listed. */
    append_feature(c, (d7 & (1u << 24)) && (xcr0 & 0x60000u) == 0x60000u, "amx-tile");
    append_feature(c, (d7 & (1u << 22)) && (xcr0 & 0x60000u) == 0x60000u, "amx-bf16");
    if (!c->features[0])
        snprintf(c->features, sizeof c->features, "sse2");
}

/* ---- Sets ------------------------------------------------------------------------------- */

typedef enum { SET_AVX512, SET_AVX2, SET_GENERIC, SET_OPENBLAS, SET_COUNT } set_id;

static const char *const set_names[SET_COUNT] = {"avx512", "avx2", "generic", "openblas"};

static cpu_info cpu;
static eng__kernels sets[SET_COUNT];
/* The avx512 set with the VDPBF16PS micro-kernel for bf16 products, for the bf16 paths that
 * take it; a set of its own, so that a call in flight keeps the products it began with. */
static eng__kernels avx512_bf16;
static bool set_supported[SET_COUNT];
static pthread_once_t sets_once = PTHREAD_ONCE_INIT;
static _Atomic(const eng__kernels *) current;
/* The options in force (eng_options_get); zero: auto, until eng_init takes others. */
static _Atomic eng_kernel_choice kernels_in_force;
static _Atomic eng_bf16_path bf16_in_force;

static int set_index(const char *name)
{
    for (int i = 0; i < SET_COUNT; i++)
        if (strcmp(name, set_names[i]) == 0)
            return i;
    return -1;
}

/* The choice "auto" makes: the widest set this CPU and OS run. */
static set_id set_auto(void)
{
    return set_supported[SET_AVX512] ? SET_AVX512
           : set_supported[SET_AVX2] ? SET_AVX2
                                     : SET_OPENBLAS;
}

/* The set `choice` names; auto's for auto. */
static set_id set_of(eng_kernel_choice choice)
{
    switch (choice) {
    case ENG_KERNELS_AVX512:
        return SET_AVX512;
    case ENG_KERNELS_AVX2:
        return SET_AVX2;
    case ENG_KERNELS_GENERIC:
        return SET_GENERIC;
    case ENG_KERNELS_OPENBLAS:
        return SET_OPENBLAS;
    case ENG_KERNELS_AUTO:
    case ENG_KERNEL_CHOICE_COUNT:
        break;
    }
    return set_auto();
}

static int64_t clamp_block(int64_t x, int64_t lo, int64_t hi, int64_t multiple)
{
    x = x < lo ? lo : x > hi ? hi : x;
    return x / multiple * multiple;
}

/* One tile's A rows (MR x kc) and the B panel it multiplies (kc x NR) share ~60% of L1, so
 * both stay there for the whole tile; a packed B block (kc x nc) takes half of L2, where it
 * stays while every row tile passes over it. Sizes no source gave (0) or implausibly small
 * ones count as 32 KiB and 1 MiB. */
void eng__blocking(const eng__cache_sizes *caches, int mr, int nr, int64_t *kc, int64_t *nc)
{
    size_t l1 = caches->l1d >= 16384 ? caches->l1d : 32768;
    size_t l2 = caches->l2 >= 131072 ? caches->l2 : 1 << 20;
    int64_t l1_floats = (int64_t)(l1 / sizeof(float)) * 3 / 5;
    *kc = clamp_block(l1_floats / (mr + nr), KC_MIN, KC_MAX, 16);
    *nc = clamp_block((int64_t)(l2 / 2 / sizeof(float)) / *kc, NC_MIN, NC_MAX, nr);
}

/* Whether bf16 requests use VDPBF16PS (where the CPU has it) or round their operands and run
 * the fp32 micro-kernel: AMD retires VDPBF16PS at the FMA rate (twice the fp32 work), Intel's
 * Xeons at a fraction of it, where rounding and fp32 FMA give the same result faster. The
 * native and emulated paths override that (tests, benchmarks). */
static bool bf16_native(eng_bf16_path path)
{
    if (path == ENG_BF16_EMULATED)
        return false;
    if (path == ENG_BF16_NATIVE)
        return cpu.avx512bf16;
    return cpu.avx512bf16 && cpu.amd;
}

/* The set engine calls run on with kernel set `id` and bf16 path `path`. */
static const eng__kernels *set_with_path(set_id id, eng_bf16_path path)
{
    return id == SET_AVX512 && bf16_native(path) ? &avx512_bf16 : &sets[id];
}

/* The named vector kernels when this CPU runs them, else NULL. */
const eng__vec_ops *eng__vec_variant(const char *name)
{
    if (strcmp(name, "scalar") == 0)
        return &eng__vec_scalar;
    if (strcmp(name, "avx2") == 0)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? &eng__vec_avx2
                                                                               : NULL;
    if (strcmp(name, "avx512") == 0)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq")
                   ? &eng__vec_avx512
                   : NULL;
    return NULL;
}

static void init_sets(void)
{
    /* The openblas set's products run inside the engine's tasks, on however many threads the
     * caller brings (a pool's workers, or a test's one): OpenBLAS's own threads would
     * oversubscribe the cores, before any pool exists to say so (eng_pool_new says it again,
     * for a process that changed it in between). */
    openblas_set_num_threads(1);
    read_cpu(&cpu);
    sets[SET_AVX512] = (eng__kernels){
        .name = "avx512",
        .tile = eng__tile_avx512,
        .wide = {ENG__AVX512_WIDE_MR, eng__tile_avx512_wide, eng__tile_avx512_wide_rows},
        .pack_trans = eng__pack_trans_avx512,
        .mr = ENG__AVX512_MR,
        .nr = ENG__AVX512_NR,
        .vec = eng__vec_variant("avx512"),
        .round_bf16 = eng__bf16_round_floats_avx512};
    sets[SET_AVX2] = (eng__kernels){.name = "avx2",
                                    .tile = eng__tile_avx2,
                                    .mr = ENG__AVX2_MR,
                                    .nr = ENG__AVX2_NR,
                                    .vec = eng__vec_variant("avx2"),
                                    .round_bf16 = eng__bf16_round_floats_avx2};
    sets[SET_GENERIC] = (eng__kernels){.name = "generic",
                                       .tile = eng__tile_generic,
                                       .mr = ENG__GENERIC_MR,
                                       .nr = ENG__GENERIC_NR,
                                       .vec = eng__vec_variant("scalar"),
                                       .round_bf16 = eng__bf16_round_floats};
    /* OpenBLAS runs its own products; the softmax still uses the best vector kernels. */
    const eng__vec_ops *best = cpu.avx512f ? eng__vec_variant("avx512") : NULL;
    if (!best && cpu.avx2_fma)
        best = eng__vec_variant("avx2");
    if (!best)
        best = eng__vec_variant("scalar");
    sets[SET_OPENBLAS] = (eng__kernels){.name = "openblas", .mr = 1, .nr = 1, .vec = best};
    set_supported[SET_AVX512] = cpu.avx512f && sets[SET_AVX512].vec;
    set_supported[SET_AVX2] = cpu.avx2_fma && sets[SET_AVX2].vec;
    set_supported[SET_GENERIC] = set_supported[SET_OPENBLAS] = true;
    for (int i = 0; i < SET_COUNT; i++) {
        eng__blocking(&cpu.caches, sets[i].mr, sets[i].nr, &sets[i].kc, &sets[i].nc);
        sets[i].panel_rows = sets[i].tile ? sets[i].mr : BLAS_PANEL_ROWS;
    }
    avx512_bf16 = sets[SET_AVX512];
    avx512_bf16.tile_bf16 = eng__tile_bf16_avx512;
    avx512_bf16.to_bf16 = eng__to_bf16_avx512;
    /* The defaults, for a process that never calls eng_init. */
    atomic_store(&current, set_with_path(set_auto(), ENG_BF16_AUTO));
}

const eng__kernels *eng__kernels_named(const char *name)
{
    pthread_once(&sets_once, init_sets);
    int i = set_index(name);
    return i >= 0 && set_supported[i] ? set_with_path((set_id)i, atomic_load(&bf16_in_force))
                                      : NULL;
}

const eng__kernels *eng__kernels_current(void)
{
    pthread_once(&sets_once, init_sets);
    return atomic_load(&current);
}

/* ---- Public ----------------------------------------------------------------------------- */

bool eng_kernels_supported(const char *name)
{
    return name && eng__kernels_named(name) != NULL;
}

eng_status eng_init(const eng_options *opts, eng_error *err)
{
    const eng_options o = opts ? *opts : (eng_options){ENG_KERNELS_AUTO, ENG_BF16_AUTO};
    pthread_once(&sets_once, init_sets);
    if ((unsigned)o.kernels >= ENG_KERNEL_CHOICE_COUNT)
        return eng__fail(err, ENG_EINVAL, "kernels",
                         "kernel choice %u is not one of auto, avx512, avx2, generic or openblas",
                         (unsigned)o.kernels);
    if ((unsigned)o.bf16 >= ENG_BF16_PATH_COUNT)
        return eng__fail(err, ENG_EINVAL, "bf16",
                         "bf16 path %u is not one of auto, native, emulated, amx or amx-emulated",
                         (unsigned)o.bf16);
    set_id id = set_of(o.kernels);
    if (!set_supported[id])
        return eng__fail(err, ENG_EINVAL, "kernels",
                         "kernel set '%s' needs %s, which this CPU or OS does not provide "
                         "(it has: %s)",
                         set_names[id],
                         id == SET_AVX512 ? "AVX-512F and DQ with the zmm state enabled"
                                          : "AVX2 and FMA",
                         cpu.features);
    eng__amx_configure(o.bf16);
    atomic_store(&current, set_with_path(id, o.bf16));
    atomic_store(&kernels_in_force, o.kernels);
    atomic_store(&bf16_in_force, o.bf16);
    return ENG_OK;
}

void eng_options_get(eng_options *opts)
{
    opts->kernels = atomic_load(&kernels_in_force);
    opts->bf16 = atomic_load(&bf16_in_force);
}

const char *eng_kernels_name(void)
{
    return eng__kernels_current()->name;
}

void eng_engine_info_get(eng_engine_info *info)
{
    const eng__kernels *k = eng__kernels_current();
    memset(info, 0, sizeof *info);
    snprintf(info->kernels, sizeof info->kernels, "%s", k->name);
    eng__amx_mode amx = eng__amx_active();
    snprintf(info->bf16, sizeof info->bf16, "%s",
             !k->tile                   ? "float32"
             : amx == ENG__AMX_HW       ? "amx"
             : amx == ENG__AMX_EMULATED ? "amx-emulated"
             : k->tile_bf16             ? "avx512bf16"
                                        : "emulated");
    snprintf(info->amx, sizeof info->amx, "%s%s%s%s",
             amx == ENG__AMX_HW         ? "amx"
             : amx == ENG__AMX_EMULATED ? "amx-emulated"
                                        : "off",
             amx == ENG__AMX_HW ? "" : " (", eng__amx_reason(), amx == ENG__AMX_HW ? "" : ")");
    snprintf(info->cpu, sizeof info->cpu, "%s", cpu.model);
    snprintf(info->features, sizeof info->features, "%s", cpu.features);
    const char *core = openblas_get_corename();
    snprintf(info->openblas_core, sizeof info->openblas_core, "%s", core ? core : "unknown");
    info->l1d_bytes = cpu.caches.l1d;
    info->l2_bytes = cpu.caches.l2;
    info->kc = k->kc;
    info->nc = k->nc;
}

size_t eng__l2_bytes(void)
{
    pthread_once(&sets_once, init_sets);
    size_t l2 = cpu.caches.l2;
    return l2 >= 256 * 1024 && l2 <= (size_t)64 << 20 ? l2 : 1024 * 1024;
}
