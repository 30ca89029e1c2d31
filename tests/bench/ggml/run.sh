#!/usr/bin/env bash
# run.sh - the standard shapes of the ggml peer (docs/benchmarks.md): ggml_fa_bench, built by
# tests/bench/ggml/build.sh, on (1, 8, 2048, 2048, 64) causal and not with f32 and f16 keys and
# values, and on (1, 8, 8192, 8192, 64) f32; one JSON line each, between two "# uptime" lines.
# A benchmark (seconds to minutes): run it on a quiet machine, right after make bench.
#
#   tests/bench/ggml/run.sh [BIN] [THREADS]   (default build/ggml/ggml_fa_bench, 2 threads)
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
BIN=${1:-$root/build/ggml/ggml_fa_bench}
T=${2:-2}
echo "# uptime before: $(uptime)"
for c in 0 1; do for kv in f32 f16; do "$BIN" 1 8 2048 2048 64 $c $kv "$T"; done; done
"$BIN" 1 8 8192 8192 64 0 f32 "$T"
echo "# uptime after: $(uptime)"
