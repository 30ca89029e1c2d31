# tritonclient.sh - makes Triton's Python client importable, for the scripts that source it
# (tests/server/check_grpc_tritonclient.sh, tests/bench/tritonclient_large.sh): the tritonclient
# package that python3 imports (pip install 'tritonclient[all]'; the checks need only its gRPC
# half), or else the client's sources in $ATTND_PEERS/tritonclient, whose gRPC stubs are made
# from Triton's protos with Debian's python3-grpc-tools, as the client's own build does.
#
#   . tests/support/tritonclient.sh
#   tritonclient_setup "$tmp" || { echo "skip: $tritonclient_missing"; exit 0; }
#   PYTHONPATH=$tritonclient_path python3 script.py
#
# tritonclient_setup DIR returns 0 with $tritonclient_path set (DIR when it unpacked the sources
# there, else empty), or 1 with $tritonclient_missing saying what is missing.

tritonclient_py=/usr/bin/python3
tritonclient_path=
tritonclient_missing=

tritonclient_setup() {
    local dir=$1 peer=${ATTND_PEERS:+$ATTND_PEERS/tritonclient} g
    tritonclient_path=
    if ! "$tritonclient_py" -c 'import grpc, grpc_tools, google.protobuf, numpy' 2>/dev/null; then
        tritonclient_missing="python3-grpcio, python3-grpc-tools, python3-protobuf or python3-numpy missing"
        return 1
    fi
    "$tritonclient_py" -c 'import tritonclient.grpc' 2>/dev/null && return 0
    if [ -z "$peer" ] || [ ! -f "$peer/tritonclient-58a44ca.tgz" ] ||
        [ ! -f "$peer/triton-protos-83adf7c.tgz" ]; then
        tritonclient_missing="no Triton client: pip install 'tritonclient[all]', or set ATTND_PEERS to a folder with tritonclient/"
        return 1
    fi
    tar -xzf "$peer/tritonclient-58a44ca.tgz" -C "$dir" &&
        tar -xzf "$peer/triton-protos-83adf7c.tgz" -C "$dir" && mkdir -p "$dir/gen" || {
        tritonclient_missing="the client's archives in $peer do not unpack"
        return 1
    }
    if ! "$tritonclient_py" -m grpc_tools.protoc -I "$dir/protos" --python_out="$dir/gen" \
        --grpc_python_out="$dir/gen" grpc_service.proto model_config.proto; then
        tritonclient_missing="grpc_tools.protoc failed"
        return 1
    fi
    g=$dir/tritonclient/grpc
    sed 's/^import model_config_pb2 as/from tritonclient.grpc import model_config_pb2 as/' \
        "$dir/gen/grpc_service_pb2.py" >"$g/service_pb2.py"
    sed 's/^import grpc_service_pb2 as/from tritonclient.grpc import service_pb2 as/' \
        "$dir/gen/grpc_service_pb2_grpc.py" >"$g/service_pb2_grpc.py"
    cp "$dir/gen/model_config_pb2.py" "$g/"
    if ! PYTHONPATH=$dir "$tritonclient_py" -c 'import tritonclient.grpc' 2>/dev/null; then
        tritonclient_missing="tritonclient.grpc does not import"
        return 1
    fi
    tritonclient_path=$dir
}
