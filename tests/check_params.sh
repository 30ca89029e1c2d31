#!/usr/bin/env bash
# Fails when a function of engine/, api/ or server/ outside the micro-kernels (engine/kernels/:
# gemm*.c, vmath*.c, amx*.c, tile_*.h, and the eng__tile_* register tiles) takes more
# than 8 parameters: past that, the arguments are a value that wants a name (a struct, or an enum
# in place of flags tested together). Reads the definitions and prototypes ctags finds, and
# counts the commas at the top level of each parameter list (a function pointer's own list is
# one parameter). First checks that it catches a planted 9-parameter function.
#
#   tests/check_params.sh [MAX]   (default 8)
# Ends with "N passed, N failed" like every suite (tests/run.sh).
set -u

max=${1:-8}
. "$(dirname "$0")/support/check.sh"

# Universal Ctags (Debian's universal-ctags): its --_xformat prints each signature.
ctags=$(command -v ctags-universal || command -v ctags)
if [ -z "$ctags" ]; then
    fail "universal-ctags is not installed (make deps)"
    finish
fi

# Prints "FILE:LINE NAME COUNT" for each function of files $@ with more than $max parameters.
wide_functions() {
    "$ctags" -x --c-kinds=fp --_xformat='%F:%n %N %S' "$@" 2>/dev/null | awk -v max="$max" '{
        loc = $1; name = $2
        sig = $0; sub(/^[^ ]+ [^ ]+ /, "", sig)
        sig = substr(sig, 2, length(sig) - 2)
        if (sig == "" || sig == "void") next
        n = 1; depth = 0
        for (i = 1; i <= length(sig); i++) {
            c = substr(sig, i, 1)
            if (c == "(" || c == "[") depth++
            else if (c == ")" || c == "]") depth--
            else if (c == "," && depth == 0) n++
        }
        if (n > max && name !~ /^eng__tile_/) print loc, name, n
    }'
}

planted=$(mktemp -d)
trap 'rm -rf "$planted"' EXIT
cat >"$planted/wide.c" <<'C'
static int wide(int a, int b, int c, int d, int e, int f, int g, int h, void (*cb)(int, int))
{
    return a + b + c + d + e + f + g + h + (cb != 0);
}
static int narrow(int a, int b, int c, int d, int e, int f, int g, void (*cb)(int, int, int))
{
    return a + b + c + d + e + f + g + (cb != 0);
}
C
found=$(wide_functions "$planted/wide.c")
if [ "$(echo "$found" | awk '{print $2}')" = wide ]; then
    ok "the check finds a planted function of 9 parameters and not one of 8"
else
    fail "the check missed a planted 9-parameter function (found: $found)"
fi

files=$(find engine api server -name '*.[ch]' ! -name 'gemm*' ! -name 'vmath*' ! -name 'amx*' ! -name 'tile_*' | sort)
wide=$(wide_functions $files)
if [ -z "$wide" ]; then
    ok "no function of engine/, api/ or server/ outside the micro-kernels has over $max parameters"
else
    fail "functions with more than $max parameters (file:line name count):
$wide"
fi
finish
