#!/usr/bin/env bash
# Triton's perf_analyzer, built with its gRPC client backend (tests/bench/build_perf_analyzer_grpc.sh,
# unmodified sources), profiles model sdpa on a daemon's --grpc-port as a Triton user would:
# metadata and config over gRPC, then ModelInfer at concurrency 1 and 2. Checks that it ran
# without an error, that each concurrency served requests, and that the daemon counted every
# inference perf_analyzer says it made. Prints a skip line (and "0 passed, 0 failed") when the
# build lacks a piece, as when not root on a machine without the packages.
#
#   tests/server/check_perf_analyzer_grpc.sh build/attnd
set -u
bin=${1:-${ATTND_BIN:-build/attnd}}
here=$(cd "$(dirname "$0")/../.." && pwd)
pa=$here/build/pa-grpc/build/perf_analyzer

# A missing package or peer (status 2) is a skip; a build that fails with everything present
# is a failure, as under make test, whose deps install the packages.
"$here/tests/bench/build_perf_analyzer_grpc.sh" >/tmp/attnd-pa-grpc-build.$$ 2>&1
rc=$?
if [ "$rc" -ne 0 ]; then
    tail -20 /tmp/attnd-pa-grpc-build.$$
    rm -f /tmp/attnd-pa-grpc-build.$$
    if [ "$rc" -eq 2 ]; then
        echo "skip: perf_analyzer with its gRPC backend could not be built (above)"
        echo "0 passed, 0 failed"
        exit 0
    fi
    echo "FAIL perf_analyzer with its gRPC backend does not build (status $rc, above)"
    echo "0 passed, 1 failed"
    exit 1
fi
rm -f /tmp/attnd-pa-grpc-build.$$

tmp=$(mktemp -d)
pid=
cleanup() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT

passed=0
failed=0
check() { # name, then a command whose status decides
    local name=$1
    shift
    if "$@"; then
        echo "ok   $name"
        passed=$((passed + 1))
    else
        echo "FAIL $name"
        failed=$((failed + 1))
    fi
}

# (1, 2, 16, 8) query, key and value: 256 values each in [-1, 1).
awk 'BEGIN {
    srand(11); printf "{\"data\":[{"
    split("query key value", names, " ")
    for (t = 1; t <= 3; t++) {
        printf "%s\"%s\":{\"shape\":[1,2,16,8],\"content\":[", (t > 1 ? "," : ""), names[t]
        for (i = 0; i < 256; i++) printf "%s%.3f", (i ? "," : ""), rand() * 2 - 1
        printf "]}"
    }
    printf "}]}\n" }' >"$tmp/in.json"

"$bin" --host 127.0.0.1 --port 0 --port-file "$tmp/port" --grpc-port 0 \
    --grpc-port-file "$tmp/grpc.port" --threads 2 --log-level warn >"$tmp/out" 2>"$tmp/err" &
pid=$!
for _ in $(seq 100); do
    [ -s "$tmp/port" ] && [ -s "$tmp/grpc.port" ] && break
    sleep 0.1
done
if ! [ -s "$tmp/grpc.port" ]; then
    cat "$tmp/err"
    echo "FAIL the daemon did not start"
    echo "0 passed, 1 failed"
    exit 1
fi

# The daemon's count of model sdpa's successful inferences.
served() {
    curl -s "http://127.0.0.1:$(cat "$tmp/port")/metrics" |
        sed -n 's/^nv_inference_request_success{model="sdpa",version="1"} \([0-9]*\)$/\1/p'
}

before=$(served)
timeout 120 "$pa" -m sdpa -u "127.0.0.1:$(cat "$tmp/grpc.port")" -i grpc \
    --input-data "$tmp/in.json" --concurrency-range 1:2 --measurement-interval 1000 \
    --stability-percentage 50 --max-trials 4 >"$tmp/pa.out" 2>&1
rc=$?
after=$(served)
sed -n '/^Inferences\/Second vs/,$p' "$tmp/pa.out"

check "perf_analyzer -i grpc exits 0 (it was $rc)" test "$rc" -eq 0
for c in 1 2; do
    rate=$(sed -n "s/^Concurrency: $c, throughput: \([0-9.]*\) infer\/sec.*/\1/p" "$tmp/pa.out")
    check "concurrency $c serves requests (${rate:-no line} infer/sec)" \
        awk -v r="${rate:-0}" 'BEGIN { exit !(r > 0) }'
done
# perf_analyzer's own count of the inferences it made in the measured windows (the stable
# passes of each concurrency; the daemon also served the passes before them).
made=$(awk '/^  Client:/ { client = 1 } client && /Request count:/ { n += $3; client = 0 }
            END { print n + 0 }' "$tmp/pa.out")
check "the daemon counted at least the $made inferences of the measured windows ($before -> $after)" \
    test "$((${after:-0} - ${before:-0}))" -ge "$made" -a "$made" -gt 0
# The same windows as the daemon's ModelStatistics over gRPC told perf_analyzer; requests in
# flight at a window's edges make the two differ by a few.
stats=$(awk '/^  Server:/ { server = 1 } server && /Inference count:/ { n += $3; server = 0 }
             END { print n + 0 }' "$tmp/pa.out")
check "ModelStatistics over gRPC counts the windows' inferences ($stats, client $made)" \
    awk -v s="$stats" -v m="$made" 'BEGIN { d = s - m; exit !(m > 0 && d * d <= (m / 100) ^ 2) }'
check "no error line from perf_analyzer" test -z "$(grep -i 'error\|failed' "$tmp/pa.out")"

kill "$pid"
wait "$pid"
rc=$?
pid=
check "the daemon exits 0 after SIGTERM (it was $rc)" test "$rc" -eq 0
if [ "$failed" -gt 0 ]; then
    tail -30 "$tmp/pa.out"
    tail -20 "$tmp/err"
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
