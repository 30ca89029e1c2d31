#!/usr/bin/env bash
# Triton's Python gRPC client, unmodified, against a daemon on --grpc-port (made importable by
# tests/support/tritonclient.sh): runs grpc_tritonclient.py. Prints a skip line (and "0 passed,
# 0 failed") when a piece is missing.
#
#   tests/server/check_grpc_tritonclient.sh build/attnd
set -u
bin=${1:-${ATTND_BIN:-build/attnd}}
py=/usr/bin/python3
here=$(cd "$(dirname "$0")" && pwd)

skip() {
    echo "skip: $1"
    echo "0 passed, 0 failed"
    exit 0
}

tmp=$(mktemp -d)
pid=
cleanup() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT

. "$here/../support/tritonclient.sh"
tritonclient_setup "$tmp" || skip "$tritonclient_missing"

# Starts the daemon with `$@` added; its ports in $tmp/port and $tmp/grpc.port.
start() {
    rm -f "$tmp/port" "$tmp/grpc.port"
    "$bin" --host 127.0.0.1 --port 0 --port-file "$tmp/port" --grpc-port 0 \
        --grpc-port-file "$tmp/grpc.port" --threads 2 --kv-cache-bytes 64M --log-level warn \
        "$@" >"$tmp/out" 2>"$tmp/err" &
    pid=$!
    for _ in $(seq 100); do
        [ -s "$tmp/port" ] && return 0
        sleep 0.1
    done
    cat "$tmp/err"
    return 1
}

# SIGTERM; fails when the daemon does not exit 0 (a leak under ASan, a crash).
stop() {
    kill "$pid"
    wait "$pid"
    local rc=$?
    pid=
    if [ "$rc" -ne 0 ]; then
        echo "FAIL the daemon exited $rc after SIGTERM"
        tail -20 "$tmp/err"
        return 1
    fi
}

run() {
    PYTHONPATH=$tritonclient_path${PYTHONPATH:+:$PYTHONPATH} timeout 300 "$py" "$here/grpc_tritonclient.py" "$(cat "$tmp/grpc.port")" \
        "$(cat "$tmp/port")" "$@"
}

failed=0
passed=0
count() {
    local line
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$tmp/result" | tail -1)
    passed=$((passed + ${line%% passed*}))
    local f=${line#*passed, }
    failed=$((failed + ${f%% failed*}))
    [ -n "$line" ] || failed=$((failed + 1))
}

start || { echo "0 passed, 1 failed"; exit 1; }
run | tee "$tmp/result" | grep -v '^[0-9]* passed'
count
stop || failed=$((failed + 1))

# TLS with ALPN h2 on the gRPC port (the HTTPS certificate) and bearer tokens.
if (cd "$tmp" && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
        -keyout ca.key -out ca.pem -days 2 -subj '/CN=attnd grpc test CA' &&
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout server.key \
        -out server.csr -subj '/CN=127.0.0.1' &&
    printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' >server.ext &&
    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
        -out server.pem -extfile server.ext) >"$tmp/openssl.log" 2>&1; then
    token=grpc-test-token-$$
    echo "$token" >"$tmp/tokens"
    start --tls-cert "$tmp/server.pem" --tls-key "$tmp/server.key" \
        --auth-token-file "$tmp/tokens" || { echo "0 passed, 1 failed"; exit 1; }
    run "$tmp/ca.pem" "$token" | tee "$tmp/result" | grep -v '^[0-9]* passed'
    count
    stop || failed=$((failed + 1))
else
    echo "skip: TLS checks (openssl could not make a certificate)"
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
