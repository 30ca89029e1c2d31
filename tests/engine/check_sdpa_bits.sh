#!/usr/bin/env bash
# Compares the bits of the SDPA case matrix (tests/engine/sdpa_bits.c) with a recorded
# baseline, once per kernel set this CPU runs (and avx512 with ATTND_BF16=native): a change
# that must not alter results (a refactor) records the baseline before it and checks after.
#
#   tests/engine/check_sdpa_bits.sh record BIN DIR   writes DIR/<set>.txt
#   tests/engine/check_sdpa_bits.sh compare BIN DIR  one check per set against DIR/<set>.txt
# Ends with "N passed, N failed[, N skipped]" (tests/run.sh).
set -u
mode=$1 bin=$2 dir=$3
. "$(dirname "$0")/../support/check.sh"
mkdir -p "$dir"
for set in avx512 avx2 generic openblas avx512-native; do
    kernels=${set%-native}
    bf16=
    [ "$set" = avx512-native ] && bf16=native
    out=$(mktemp)
    if ! ATTND_KERNELS=$kernels ATTND_BF16=$bf16 "$bin" >"$out" 2>&1; then
        fail "$set: sdpa_bits failed: $(tail -n 3 "$out")"
    elif ! head -n 1 "$out" | grep -q "^# kernels $kernels "; then
        skip "$set: this CPU lacks it"
    elif [ "$mode" = record ]; then
        cp "$out" "$dir/$set.txt"
        ok "$set: $(($(wc -l <"$out") - 1)) cases recorded in $dir/$set.txt"
    elif [ ! -f "$dir/$set.txt" ]; then
        fail "$set: no baseline $dir/$set.txt (record it first)"
    elif diff -q "$dir/$set.txt" "$out" >/dev/null; then
        ok "$set: $(($(wc -l <"$out") - 1)) cases bit for bit as recorded"
    else
        diff "$dir/$set.txt" "$out" | head -n 20
        fail "$set: $(diff "$dir/$set.txt" "$out" | grep -c '^>') cases differ from the baseline"
    fi
    rm -f "$out"
done
finish
