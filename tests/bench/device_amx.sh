#!/bin/sh
# device_amx.sh - the AMX path on a machine whose CPU has the tiles: the engine's AMX
# suites, then bench_sdpa's fp32 and bf16 comparison shapes at 2 and 16 threads with PyTorch's
# attention beside them (bench_sdpa prints the torch lines when python3 imports torch).
#
#     tests/bench/device_amx.sh [BUILD]      # BUILD: the folder of a build made elsewhere (build)
#     THREADS="16" tests/bench/device_amx.sh # only some of the thread counts (default "2 16")
#
# Run from the repository root. Everything goes to stdout; nothing is written outside /tmp.
# Expects 16 usable CPUs; each bench_sdpa run takes a few minutes (the 2-thread one longest).
set -u
BUILD=${1:-build}
THREADS=${THREADS:-2 16}

section() { printf '\n==== %s\n' "$*"; }

section machine
grep -m1 'model name' /proc/cpuinfo
grep -m1 -o 'amx[a-z0-9_ ]*' /proc/cpuinfo || echo "cpuinfo lists no amx flags"
nproc
python3 -c 'import torch; print("torch", torch.__version__, "threads", torch.get_num_threads())' 2>&1 | tail -n 1

section "engine AMX suites (hardware tiles where granted)"
ATTND_BF16=amx "$BUILD/tests/engine/test_amx"
for t in test_mha test_layer16 test_mha_session; do
    echo "-- $t (ATTND_BF16=amx: hardware tiles)"
    ATTND_BF16=amx "$BUILD/tests/engine/$t" | grep -v '^ok'
    echo "-- $t (ATTND_BF16=amx-emulated)"
    ATTND_BF16=amx-emulated "$BUILD/tests/engine/$t" | grep -v '^ok'
done
for t in test_sdpa_amx test_sdpa_bf16 test_sdpa_bf16_views; do
    echo "-- $t (ATTND_BF16=amx: hardware tiles)"
    ATTND_BF16=amx "$BUILD/tests/engine/$t" | grep -v '^ok'
done
echo "-- test_sdpa_amx (ATTND_BF16=amx-emulated)"
ATTND_BF16=amx-emulated "$BUILD/tests/engine/test_sdpa_amx" | grep -v '^ok'
echo "-- test_kernels"
"$BUILD/tests/engine/test_kernels" | grep -v '^ok'


for n in $THREADS; do
    last=$((n - 1))
    section "bench_sdpa comparison shapes, $n threads (CPUs 0-$last), fp32 and bf16, with PyTorch"
    ATTND_BF16=amx ATTND_BENCH_ONLY=comparison taskset -c "0-$last" "$BUILD/tests/bench/bench_sdpa"
done

section "bench_mha at 16 threads (bf16 projections on the tiles)"
ATTND_BF16=amx taskset -c 0-15 "$BUILD/tests/bench/bench_mha"
