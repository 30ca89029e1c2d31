#!/usr/bin/env bash
# build.sh - builds ggml's CPU backend and ggml_fa_bench.c, the peer that the charts of
# docs/benchmarks.md set beside attnd: ggml's CPU flash attention (ggml_flash_attn_ext).
#
#   tests/bench/ggml/build.sh GGML_SRC [OUTDIR]
#
# GGML_SRC is ggml's source, which this repository does not carry, in any of these forms:
#   - a checkout of https://github.com/ggml-org/ggml. The harness was written for and measured
#     with commit d99724f2 (d99724f2b141fed9e1a9f402213506c081433465):
#         git clone https://github.com/ggml-org/ggml && git -C ggml checkout d99724f2
#     Another commit works as long as ggml_flash_attn_ext keeps its interface; a bare git
#     folder is read at its HEAD, and a llama.cpp checkout through its ggml/ folder;
#   - an archive of such a tree (.tgz, .tar.gz, .tar.xz, .tar), for example
#     $ATTND_PEERS/ggml/ggml-src-d99724f2.tgz (ggml-org/ggml d99724f2).
# ggml is MIT-licensed (Copyright (c) 2023-2026 The ggml authors; the LICENSE file of its
# source); ggml_fa_bench links its libraries, so a binary built here carries that notice.
#
# OUTDIR (default build/ggml) receives an archive or bare folder unpacked in OUTDIR/src, ggml's
# build in OUTDIR/build (a checkout is built from where it is and left unchanged), the
# benchmark OUTDIR/ggml_fa_bench, and the logs OUTDIR/cmake_config.log and OUTDIR/build.log.
# Then run.sh runs the standard shapes. ggml is built in Release with -DGGML_NATIVE=ON (the ISA
# of this machine), CPU backend only; about a minute on 2 cores.
# Env: JOBS (default 2); GGML_COMMIT overrides the commit id the benchmark reports (read from
# the checkout, the archive's .ggml_commit or git header, or a name like ggml-src-<commit>.tgz).
# Needs cmake, gcc and g++ (Debian: cmake build-essential; as root a missing cmake is
# installed with apt-get).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../../.." && pwd)
src=${1:?usage: tests/bench/ggml/build.sh GGML_SRC [OUTDIR]  (a ggml checkout or archive)}
work=${2:-$root/build/ggml}
jobs=${JOBS:-2}
[ -e "$src" ] || { echo "build.sh: no ggml source at $src" >&2; exit 1; }
mkdir -p "$work"
work=$(cd "$work" && pwd)
src=$(cd "$(dirname "$src")" && pwd)/$(basename "$src")

# The folder under $1 that holds ggml's CMakeLists.txt and include/ggml.h: $1 itself, its
# ggml/ (llama.cpp), or its one top-level folder (an archive made with a prefix).
ggml_tree() {
    local d=$1 subs
    for t in "$d" "$d/ggml"; do
        [ -f "$t/include/ggml.h" ] && { echo "$t"; return; }
    done
    subs=$(find "$d" -mindepth 1 -maxdepth 1 -type d)
    if [ "$(printf '%s\n' "$subs" | grep -c .)" = 1 ]; then
        for t in "$subs" "$subs/ggml"; do
            [ -f "$t/include/ggml.h" ] && { echo "$t"; return; }
        done
    fi
    return 1
}

commit=unknown
if [ -f "$src" ]; then
    # An archive: unpacked afresh into OUTDIR/src.
    rm -rf "$work/src"
    mkdir -p "$work/src"
    tar -xf "$src" -C "$work/src"
    if c=$(
        set +o pipefail # git reads the first header only, and the decompressor gets SIGPIPE
        case "$src" in
            *.tgz | *.tar.gz) gzip -dc "$src" ;;
            *.tar.xz) xz -dc "$src" ;;
            *) cat "$src" ;;
        esac | git get-tar-commit-id 2>/dev/null
    ) && [ -n "$c" ]; then
        commit=$c
    elif [[ $(basename "$src") =~ ^ggml(-src)?-([0-9a-f]{7,40})\.t ]]; then
        commit=${BASH_REMATCH[2]}
    fi
    tree=$(ggml_tree "$work/src") || { echo "build.sh: no include/ggml.h in $src" >&2; exit 1; }
    [ -f "$tree/.ggml_commit" ] && commit=$(cat "$tree/.ggml_commit")
elif [ -f "$src/HEAD" ] && [ -d "$src/objects" ]; then
    # A bare git folder: its HEAD exported into OUTDIR/src.
    commit=$(git --git-dir="$src" rev-parse HEAD)
    rm -rf "$work/src"
    mkdir -p "$work/src"
    git --git-dir="$src" archive HEAD | tar -x -C "$work/src"
    tree=$(ggml_tree "$work/src") || { echo "build.sh: no include/ggml.h in $src" >&2; exit 1; }
else
    tree=$(ggml_tree "$src") || { echo "build.sh: no include/ggml.h under $src" >&2; exit 1; }
    if [ -f "$tree/.ggml_commit" ]; then
        commit=$(cat "$tree/.ggml_commit")
    elif c=$(git -C "$tree" rev-parse HEAD 2>/dev/null); then
        commit=$c
    fi
fi
commit=${GGML_COMMIT:-$commit}
echo "ggml tree: $tree  commit: $commit"
case $commit in
d99724f2*) ;;
*) echo "note: the harness was written for ggml-org/ggml d99724f2; this is $commit" >&2 ;;
esac

if ! command -v cmake >/dev/null; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update && apt-get install -y cmake
    else
        echo "build.sh: cmake is missing (Debian: apt-get install cmake, as root)" >&2
        exit 1
    fi
fi

# ggml: CPU backend only, Release, native ISA.
cmake -S "$tree" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_BLAS=OFF \
    -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF 2>&1 |
    tee "$work/cmake_config.log"
cmake --build "$work/build" -j"$jobs" >"$work/build.log" 2>&1 || {
    tail -50 "$work/build.log" >&2
    exit 1
}
grep -E "CPU backend variant|x86 detected" "$work/cmake_config.log" || true
echo "gcc -march=native resolves to:"
gcc -march=native -Q --help=target 2>/dev/null |
    grep -E "^\s+-march=|mavx512(f|bf16|fp16|vnni) |mamx-(tile|int8|bf16) " || true

# The benchmark, with the tests' one random generator (tests/support/rng.c).
libdir=$work/build/src
gcc -O2 -march=native -std=c11 -Wall -Wextra -DGGML_COMMIT_ID="\"$commit\"" \
    -I"$tree/include" -I"$root" "$here/ggml_fa_bench.c" "$root/tests/support/rng.c" \
    -o "$work/ggml_fa_bench" -L"$libdir" -lggml -lggml-cpu -lggml-base -lm -Wl,-rpath,"$libdir"
echo "built $work/ggml_fa_bench"
# A quick run (every run checks its results against a float64 reference first).
"$work/ggml_fa_bench" 1 2 128 128 64 1 f32 2 1
