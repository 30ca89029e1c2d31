#!/usr/bin/env bash
# Triton's Python clients on one large request (tritonclient_large.py): tritonclient.http with
# binary tensors against tritonclient.grpc with raw ones, model sdpa at (1, HEADS, SEQ, 64),
# against a daemon of its own on ephemeral ports. A benchmark, not a test (make
# bench-tritonclient); prints a skip line when the client cannot be had
# (tests/support/tritonclient.sh).
#
#   tests/bench/tritonclient_large.sh ATTND_BIN [SEQ] [HEADS] [REPS]
set -u
bin=${1:?usage: tritonclient_large.sh ATTND_BIN [SEQ] [HEADS] [REPS]}
seq_len=${2:-4096}
heads=${3:-8}
reps=${4:-8}
here=$(cd "$(dirname "$0")" && pwd)

tmp=$(mktemp -d)
pid=
cleanup() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT

. "$here/../support/tritonclient.sh"
if ! tritonclient_setup "$tmp" ||
    ! PYTHONPATH=$tritonclient_path "$tritonclient_py" -c 'import tritonclient.http' 2>/dev/null; then
    echo "skip tritonclient: ${tritonclient_missing:-tritonclient.http does not import (python3-geventhttpclient, python3-rapidjson)}"
    exit 0
fi

"$bin" --host 127.0.0.1 --port 0 --port-file "$tmp/port" --grpc-port 0 \
    --grpc-port-file "$tmp/grpc.port" --log-level warn >"$tmp/out" 2>"$tmp/err" &
pid=$!
for _ in $(seq 100); do
    [ -s "$tmp/port" ] && [ -s "$tmp/grpc.port" ] && break
    sleep 0.1
done
[ -s "$tmp/grpc.port" ] || { cat "$tmp/err"; exit 1; }
PYTHONPATH=$tritonclient_path "$tritonclient_py" "$here/tritonclient_large.py" \
    "$(cat "$tmp/port")" "$(cat "$tmp/grpc.port")" "$heads" "$seq_len" "$reps"
