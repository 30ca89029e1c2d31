#!/usr/bin/env bash
# Builds Triton's perf_analyzer with its gRPC client backend (-i grpc, and -i http too) into
# build/pa-grpc/build/perf_analyzer: the sources of $ATTND_PEERS/perf_analyzer (triton-src.tgz)
# without its HTTP-only patch, the C++ messages and stubs of Triton's protos
# ($ATTND_PEERS/tritonclient) made with Debian's protoc and grpc_cpp_plugin, and the peer's
# Makefile with the gRPC client library added. Nothing is done when the binary was built from
# the same inputs: the two archives, the peer's Makefile, this script, and the versions of
# protoc, gRPC and protobuf (a checksum beside the binary, so a checkout that only touches a
# file does not cost a rebuild).
#
#   tests/bench/build_perf_analyzer_grpc.sh        (make deps installs libgrpc++-dev,
#                                                   protobuf-compiler-grpc, rapidjson-dev, ...)
#
# Exits 2 with the reason when a piece is missing (a skip for make test), else the build's status.
set -euo pipefail
# make and tar fail with status 2 too, which would read as a missing piece.
trap 'exit 1' ERR
here=$(cd "$(dirname "$0")/../.." && pwd)
peers=${ATTND_PEERS:-}
work=$here/build/pa-grpc
bin=$work/build/perf_analyzer

missing() {
    echo "perf_analyzer (gRPC): $1" >&2
    exit 2
}
[ -n "$peers" ] || missing "ATTND_PEERS is not set (a folder with perf_analyzer/ and tritonclient/)"
{ [ -f "$peers/perf_analyzer/triton-src.tgz" ] && [ -f "$peers/perf_analyzer/Makefile" ]; } ||
    missing "no $peers/perf_analyzer/triton-src.tgz or its Makefile"
[ -f "$peers/tritonclient/triton-protos-83adf7c.tgz" ] || missing "no Triton protos in $peers"
plugin=$(command -v grpc_cpp_plugin) || missing "grpc_cpp_plugin missing (protobuf-compiler-grpc)"
command -v protoc >/dev/null || missing "protoc missing (protobuf-compiler)"
pkg-config --exists grpc++ protobuf || missing "grpc++ or protobuf missing (libgrpc++-dev)"
[ -f /usr/include/rapidjson/rapidjson.h ] || missing "rapidjson missing (rapidjson-dev)"
[ -f /usr/include/b64/cencode.h ] || missing "libb64 missing (libb64-dev)"

stamp=$work/build/inputs.sha256
sum=$(
    for f in "$peers/perf_analyzer/triton-src.tgz" "$peers/tritonclient/triton-protos-83adf7c.tgz" \
        "$peers/perf_analyzer/Makefile" "${BASH_SOURCE[0]}"; do
        sha256sum <"$f"
    done
    protoc --version
    pkg-config --modversion grpc++ protobuf
)
sum=$(sha256sum <<<"$sum")
if [ -x "$bin" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$sum" ]; then
    exit 0
fi

# tar keeps the archive's times, so objects of older sources would look current to make: a
# rebuild starts from nothing.
rm -rf "$work/src" "$work/build"
mkdir -p "$work/src/gen"
tar -xzf "$peers/perf_analyzer/triton-src.tgz" -C "$work/src"
tar -xzf "$peers/tritonclient/triton-protos-83adf7c.tgz" -C "$work/src"
protoc -I "$work/src/protos" --cpp_out="$work/src/gen" --grpc_out="$work/src/gen" \
    --plugin=protoc-gen-grpc="$plugin" grpc_service.proto model_config.proto

lib=src/client/src/c++/library
gen=src/gen
# The peer's Makefile, with the gRPC client and the messages it speaks, and without
# PERF_ANALYZER_HTTP_ONLY (its CPPFLAGS are replaced whole).
echo "perf_analyzer (gRPC): building into $work"
make -s -C "$work" -f "$peers/perf_analyzer/Makefile" -j"$(nproc)" \
    PA=src/perf_analyzer CLIENT=src/client COMMON=src/common BUILD=build GIT_SHA=263c5f6 \
    CXXFLAGS="-O1 -g0 -std=c++20 -pthread -fPIC" \
    CPPFLAGS="-DTRITON_ENABLE_ZLIB=1 -DDOCTEST_CONFIG_DISABLE -DPERF_ANALYZER_VERSION=0.0.0 \
-DGIT_SHA=263c5f6 -Isrc/perf_analyzer/src -Isrc/perf_analyzer/src/session_concurrency \
-I$lib -Isrc/common/include -I$gen $(pkg-config --cflags grpc++ protobuf)" \
    LIB_SRCS="$lib/http_client.cc $lib/grpc_client.cc $lib/common.cc $lib/cencode.cc \
$lib/json_utils.cc $lib/shm_utils.cc $gen/grpc_service.pb.cc $gen/grpc_service.grpc.pb.cc \
$gen/model_config.pb.cc" \
    LDLIBS="-lcurl -lz -lb64 -ldl -pthread $(pkg-config --libs grpc++ protobuf)"
"$bin" --version
echo "$sum" >"$stamp"
