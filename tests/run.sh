#!/usr/bin/env bash
# Runs each test command in its own process under a timeout, adds up the "N passed, N failed"
# line each one ends with, and ends with the total in the same form. A command that crashes,
# times out or prints no such line counts as one failed test.
#
#   tests/run.sh [-j N] CMD... [--alone CMD...]
#
# The commands before --alone run up to N at a time (default 1), in the order given: put the
# longest first. Those after --alone run one at a time with nothing beside them, for suites
# whose results depend on having the machine to themselves (they measure a capacity). Each
# command's output is printed whole when it ends (failures in full, passes as one line), so
# that parallel suites never interleave.
#
#   tests/run.sh -j 3 build/tests/engine/test_sdpa "build/asan/tests/engine/test_sdpa --quick"
set -u
limit=${TEST_TIMEOUT:-600}
jobs=1
shared=()
alone=()
target=shared
while [ $# -gt 0 ]; do
    case $1 in
    -j)
        jobs=$2
        shift 2
        continue
        ;;
    --alone) target=alone ;;
    *) if [ "$target" = shared ]; then shared+=("$1"); else alone+=("$1"); fi ;;
    esac
    shift
done
case $jobs in
'' | *[!0-9]* | 0)
    echo "tests/run.sh: -j takes a positive number of jobs, not '$jobs'"
    exit 2
    ;;
esac

# Suites that share the machine run without CAP_SYS_NICE. A daemon under test then keeps its
# long requests' fan-out at its workers' priority, as it does wherever it may not use
# SCHED_IDLE: at SCHED_IDLE (docs/goodput.md) every runnable thread of a neighbour suite would
# hold it up, for as long as that suite runs. The suites after --alone keep the capability.
beside=()
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
    beside=(setpriv --bounding-set=-sys_nice)
fi

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
passed=0
failed=0

# Runs command $2 under the timeout, after the words of $3 (a prefix: none, or beside's), with
# its output in $scratch/$1.log, and leaves its exit status, the seconds it took and the CPU
# seconds it used (user and system, its processes included) in $scratch/$1.rc.
run_one() {
    local TIMEFORMAT='%R %U %S' rc prefix
    read -r -a prefix <<<"${3:-}"
    { time timeout -k 10 "$limit" "${prefix[@]}" bash -c "$2" >"$scratch/$1.log" 2>&1; } \
        2>"$scratch/$1.time"
    rc=$?
    echo "$rc $(awk '{ printf "%.1f %.1f", $1, $2 + $3 }' "$scratch/$1.time")" >"$scratch/$1.rc"
}

# Reads the result of command $2 (number $1) and adds it to the totals.
report() {
    local log=$scratch/$1.log rc secs cpu line p f
    read -r rc secs cpu <"$scratch/$1.rc"
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
        echo "== $2: exit $rc"
    fi
    echo "== $2: $p passed, $f failed (${secs} s, cpu ${cpu} s)"
    passed=$((passed + p))
    failed=$((failed + f))
    rm -f "$log" "$scratch/$1.rc" "$scratch/$1.time"
}

declare -A running=() # pid -> command number
n=0
for cmd in "${shared[@]}"; do
    while [ "${#running[@]}" -ge "$jobs" ]; do
        wait -n -p done_pid
        report "${running[$done_pid]}" "${shared[${running[$done_pid]}]}"
        unset "running[$done_pid]"
    done
    run_one "$n" "$cmd" "${beside[*]}" &
    running[$!]=$n
    n=$((n + 1))
done
while [ "${#running[@]}" -gt 0 ]; do
    wait -n -p done_pid
    report "${running[$done_pid]}" "${shared[${running[$done_pid]}]}"
    unset "running[$done_pid]"
done

i=0
for cmd in "${alone[@]}"; do
    run_one "alone$i" "$cmd"
    report "alone$i" "$cmd"
    i=$((i + 1))
done

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
