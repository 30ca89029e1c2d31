#!/usr/bin/env bash
# Profiles attnd with Triton's load tester, perf_analyzer (HTTP, binary tensors), as KServe and
# Triton users do: model sdpa on (1, H, L, 64) self-attention and a registered layer (the
# built-in demo, E = 64) on (1, L, E), each over a concurrency sweep; then small requests at
# concurrency 8 over HTTP and over gRPC (--grpc-port), with their ratio. A benchmark, not a test
# (make bench-perf-analyzer); docs/benchmarks.md, "Load testing with perf_analyzer", explains
# the flags.
#
#   tests/bench/perf_analyzer.sh ATTND_BIN [SEQ_LEN] [HEADS] [CONCURRENCY]
#
# perf_analyzer is the one on PATH (Triton's SDK image, or pip install perf-analyzer), or else
# is built once from $ATTND_PEERS/perf_analyzer into build/pa (its build.sh installs what it
# needs with apt-get, as root), and with its gRPC backend into build/pa-grpc
# (build_perf_analyzer_grpc.sh). The input data files are made here: the
# optional inputs (masks, lengths, a layer's memory) are left out, which the models' configs
# allow; attnd listens on an ephemeral port of 127.0.0.1 and is stopped at the end.
set -euo pipefail
bin=${1:?usage: perf_analyzer.sh ATTND_BIN [SEQ_LEN] [HEADS] [CONCURRENCY]}
seq_len=${2:-2048}
heads=${3:-8}
concurrency=${4:-1:4}
here=$(cd "$(dirname "$0")/../.." && pwd)
work=$here/build/pa
pa=$work/build/perf_analyzer

if command -v perf_analyzer >/dev/null; then
    pa=$(command -v perf_analyzer)
elif [ ! -x "$pa" ]; then
    peer=${ATTND_PEERS:+$ATTND_PEERS/perf_analyzer}
    if [ -z "$peer" ] || [ ! -d "$peer" ]; then
        echo "skip: no perf_analyzer on PATH (Triton's SDK image, or pip install perf-analyzer)"
        echo "and no \$ATTND_PEERS/perf_analyzer to build it from"
        exit 0
    fi
    WORK=$work bash "$peer/build.sh"
fi

# {"data": [{NAME: {"shape": [...], "content": [...]}, ...}]}: perf_analyzer's --input-data.
# Values in [-1, 1) from awk's generator with a fixed seed, three decimals each.
tensors_json() { # out, then name:shape-with-x pairs, e.g. query:1x8x2048x64
    local out=$1
    shift
    awk -v specs="$*" 'BEGIN {
        srand(7); n = split(specs, spec, " "); printf "{\"data\":[{"
        for (t = 1; t <= n; t++) {
            split(spec[t], parts, ":"); rank = split(parts[2], dims, "x"); count = 1
            printf "%s\"%s\":{\"shape\":[", (t > 1 ? "," : ""), parts[1]
            for (d = 1; d <= rank; d++) { printf "%s%d", (d > 1 ? "," : ""), dims[d]; count *= dims[d] }
            printf "],\"content\":["
            for (i = 0; i < count; i++) printf "%s%.3f", (i ? "," : ""), rand() * 2 - 1
            printf "]}"
        }
        printf "}]}\n" }' >"$out"
}
mkdir -p "$work/data"
sdpa=$work/data/sdpa_${heads}x${seq_len}.json
layer=$work/data/demo_${seq_len}.json
shape=1x${heads}x${seq_len}x64
[ -s "$sdpa" ] || tensors_json "$sdpa" "query:$shape" "key:$shape" "value:$shape"
[ -s "$layer" ] || tensors_json "$layer" "input:1x${seq_len}x64"

port_file=$work/attnd.port
grpc_port_file=$work/attnd.grpc.port
rm -f "$port_file" "$grpc_port_file"
"$bin" --host 127.0.0.1 --port 0 --port-file "$port_file" --grpc-port 0 \
    --grpc-port-file "$grpc_port_file" --log-level warn >"$work/attnd.log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null' EXIT
for _ in $(seq 100); do
    [ -s "$port_file" ] && break
    sleep 0.1
done
url=127.0.0.1:$(cat "$port_file")

# A shared machine's throughput drifts: windows of 5 s, stable within 30%.
for model in sdpa demo; do
    data=$sdpa
    [ "$model" = demo ] && data=$layer
    echo "== perf_analyzer -m $model ($(basename "$data" .json)), concurrency $concurrency"
    "$pa" -m "$model" -u "$url" -i http --input-data "$data" --concurrency-range "$concurrency" \
        --measurement-interval 5000 --stability-percentage 30 --max-trials 6
done

# The protocols side by side: small requests (the README's 3-token example as model sdpa's
# (1, 1, 3, 2)) at concurrency 8, HTTP then gRPC, from the one binary built with both backends.
small=$work/data/sdpa_small.json
[ -s "$small" ] || tensors_json "$small" "query:1x1x3x2" "key:1x1x3x2" "value:1x1x3x2"
if "$here/tests/bench/build_perf_analyzer_grpc.sh"; then
    pa_both=$here/build/pa-grpc/build/perf_analyzer
    rate() { # protocol, port: infer/sec at concurrency 8
        "$pa_both" -m sdpa -u "127.0.0.1:$2" -i "$1" --input-data "$small" --concurrency-range 8 \
            --measurement-interval 3000 --stability-percentage 30 --max-trials 6 |
            sed -n 's/^Concurrency: 8, throughput: \([0-9.]*\) infer\/sec.*/\1/p'
    }
    http_rate=$(rate http "$(cat "$port_file")")
    grpc_rate=$(rate grpc "$(cat "$grpc_port_file")")
    awk -v h="$http_rate" -v g="$grpc_rate" 'BEGIN {
        if (h > 0 && g > 0)
            printf "perf_analyzer small c8: http %.0f infer/s, grpc %.0f infer/s, grpc/http %.2f\n", h, g, g / h
        else
            printf "perf_analyzer small c8: no rate (http \"%s\", grpc \"%s\")\n", h, g }'
else
    echo "perf_analyzer small c8: skipped, the gRPC build is missing a piece (above)"
fi
