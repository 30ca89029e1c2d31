#!/usr/bin/env bash
# Runs each test command in its own process under a timeout, adds up the "N passed, N failed"
# line each one ends with, and ends with the total in the same form. A command that crashes,
# times out or prints no such line counts as one failed test.
#
#   tests/run.sh build/tests/engine/test_sdpa "build/asan/tests/engine/test_sdpa --quick"
set -u
limit=${TEST_TIMEOUT:-600}
passed=0
failed=0
for cmd in "$@"; do
    log=$(mktemp)
    start=$(date +%s.%N)
    timeout -k 10 "$limit" bash -c "$cmd" >"$log" 2>&1
    rc=$?
    secs=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
    if [ -n "$line" ]; then
        p=${line%% passed*}
        f=${line#*passed, }
        f=${f%% failed*}
    else
        p=0
        f=0
    fi
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        # Crashed, timed out (124) or failed without saying so.
        f=1
    fi
    if [ "$f" -ne 0 ]; then
        grep -v '^ok ' "$log" | tail -n 60
        echo "== $cmd: exit $rc"
    fi
    echo "== $cmd: $p passed, $f failed (${secs} s)"
    passed=$((passed + p))
    failed=$((failed + f))
    rm -f "$log"
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
