#!/usr/bin/env bash
# Fails when a C file of tests/ carries a random generator of its own instead of the one in
# tests/support/rng.h (one seeded generator, so that a case names its seed and every suite
# draws from the same, known sequence).
#
# What counts as a generator of its own, by the marks each kind leaves in the source:
#   - the C library's: rand(), srand(), rand_r(), random(), srandom(), drand48() and kin;
#   - a linear congruential step: the multipliers 1103515245, 1664525, 1013904223,
#     2654435761 and 6364136223846793005;
#   - xorshift: a state updated with "^=" and one of the shifts 13, 7, 17, 12, 25, 27;
#   - xorshift64*: a product with 0x2545F4914F6CDD1D (as a seed value it is fine);
#   - splitmix64: its mixing constants 0xBF58476D1CE4E5B9 and 0x94D049BB133111EB, or a state
#     advanced by 0x9E3779B97F4A7C15 (as a seed value it is fine).
# Only tests/support/rng.c may hold them. Before looking at the tree the script plants one of
# each kind in a scratch folder and checks that it finds every one (and nothing in a clean
# file), so that it cannot pass by not looking.
#
#   tests/check_rng.sh [DIR]   (default: tests)
# Ends with "N passed, N failed" like every suite (tests/run.sh). JavaScript (tests/browser)
# is not C and draws its own numbers in the page's tests; it is not scanned.
set -u

dir=${1:-tests}
. "$(dirname "$0")/support/check.sh"

pattern='(^|[^A-Za-z0-9_.>])(s?rand|rand_r|s?random|[dejlmn]rand48|arc4random)\('
pattern+='|1103515245|1664525[^0-9]|1013904223|2654435761|6364136223846793005'
pattern+='|\^=[^;]*(<<|>>)[[:space:]]*(13|7|17|12|25|27)([^0-9]|$)'
pattern+='|\*[[:space:]]*(UINT64_C\()?0x2545F4914F6CDD1D'
pattern+='|BF58476D1CE4E5B9|94D049BB133111EB'
pattern+='|\+=[[:space:]]*(UINT64_C\()?0x9E3779B97F4A7C15'

# Prints "file:line: text" for every generator mark in the C files under $1, except the one
# generator, tests/support/rng.c.
scan() {
    find "$1" \( -name node_modules -prune \) -o \( -name '*.[ch]' -type f -print \) |
        grep -v '/support/rng\.c$' | sort |
        while read -r f; do
            grep -HniE "$pattern" "$f"
        done
}

result() { # name, ok (0 or 1), detail
    if [ "$2" -eq 1 ]; then
        ok "$1"
    else
        fail "$1: $3"
    fi
}

# ---- The check catches what it should ----------------------------------------------------

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/support"
plant() { # name, line of C
    printf '/* planted */\nstatic unsigned x;\nstatic void f(void)\n{\n    %s\n}\n' "$2" \
        >"$scratch/$1.c"
}
plant libc_rand 'x = (unsigned)rand();'
plant libc_srand 'srand(7);'
plant libc_rand_r 'x = (unsigned)rand_r(&x);'
plant libc_random 'x = (unsigned)random();'
plant libc_drand48 'double d = drand48();'
plant lcg_glibc 'x = x * 1103515245u + 12345u;'
plant lcg_numerical_recipes 'x = x * 1664525u + 1013904223u;'
plant lcg_knuth 'uint64_t s = s * 6364136223846793005u + 1442695040888963407u;'
plant xorshift 'x ^= x << 13;'
plant xorshift_comma 'x ^= x << 13, x ^= x >> 7, x ^= x << 17;'
plant xorshift64star 'uint64_t r = (s * 0x2545F4914F6CDD1Du) >> 32;'
plant splitmix_mix 'z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);'
plant splitmix_step 'uint64_t z = (*s += UINT64_C(0x9E3779B97F4A7C15));'
for f in "$scratch"/*.c; do
    name=$(basename "$f" .c)
    found=$(scan "$scratch" | grep -c "/$name\.c:")
    result "finds a planted generator: $name" $([ "$found" -ge 1 ] && echo 1 || echo 0) \
        "not found in: $(sed -n 5p "$f")"
done
rm -f "$scratch"/*.c
cat >"$scratch/clean.c" <<'CLEAN'
/* A clean file: seeds and shifts that are not a generator. A random (fixed-seed) case. */
#include "tests/support/rng.h"
static uint64_t rng = 0x9E3779B97F4A7C15u, other = 0x2545F4914F6CDD1Du;
static unsigned f(unsigned h) { unsigned m = (h >> 7) & 0x7F; m |= h << 13; return m; }
static float g(void) { return rng_sym(&rng, 1.0) + (float)rng_next(&other); }
CLEAN
printf 'uint64_t z = (*s += UINT64_C(0x9E3779B97F4A7C15));\n' >"$scratch/support/rng.c"
hits=$(scan "$scratch")
result "a clean file and the one generator (support/rng.c) pass" \
    $([ -z "$hits" ] && echo 1 || echo 0) "$hits"

# ---- The tree ----------------------------------------------------------------------------

hits=$(scan "$dir")
result "no C file of $dir has a random generator of its own (use tests/support/rng.h)" \
    $([ -z "$hits" ] && echo 1 || echo 0) "
$hits"

finish
