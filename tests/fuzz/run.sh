#!/usr/bin/env bash
# Runs the libFuzzer harnesses of build/fuzz named (every one by default) for SECONDS each
# (default 30) on a working copy of its seed corpus, and ends with "N passed, N failed": a
# harness passes when the fuzzer finds nothing (exit 0). Crash inputs land in
# build/fuzz/artifacts/.
#
#   tests/fuzz/run.sh 30                     every harness
#   tests/fuzz/run.sh 30 v2_infer safetensors  build/fuzz/fuzz_v2_infer and fuzz_safetensors
set -u
seconds=${1:-30}
shift
. "$(dirname "$0")/../support/check.sh"
mkdir -p build/fuzz/artifacts
bins=()
for name in "$@"; do
    bins+=("build/fuzz/fuzz_$name")
done
if [ "${#bins[@]}" -eq 0 ]; then
    for bin in build/fuzz/fuzz_*; do
        [ -x "$bin" ] && bins+=("$bin")
    done
fi
for bin in "${bins[@]}"; do
    name=${bin##*/fuzz_}
    if [ ! -x "$bin" ]; then
        fail "fuzz_$name: $bin is not built (make fuzz-build)"
        continue
    fi
    work=build/fuzz/corpus/$name
    mkdir -p "$work"
    cp -n tests/fuzz/corpus/"$name"/* "$work"/ 2>/dev/null
    dict=()
    [ -f tests/fuzz/"$name".dict ] && dict=(-dict=tests/fuzz/"$name".dict)
    log=build/fuzz/$name.log
    "$bin" "$work" "${dict[@]}" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
        -artifact_prefix=build/fuzz/artifacts/"$name"- -print_final_stats=1 >"$log" 2>&1
    rc=$?
    execs=$(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}')
    if [ "$rc" -eq 0 ]; then
        ok "fuzz_$name: ${execs:-?} executions in ${seconds} s, no findings"
    else
        tail -n 40 "$log"
        fail "fuzz_$name: exit $rc after ${execs:-?} executions (see $log)"
    fi
done
finish
