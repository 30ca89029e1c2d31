"""One large sdpa request through Triton's Python clients, unmodified: tritonclient.http with
binary tensors against tritonclient.grpc with raw tensors, alternated so that the machine's
drift weighs on both alike, the outputs compared bit for bit. One line: the median and the
fastest of each, in milliseconds, and their ratio (grpc over http; under 1 is gRPC faster).

    python3 tritonclient_large.py HTTP_PORT GRPC_PORT HEADS SEQ REPS
"""
import statistics
import sys
import time

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient


def inputs(module, tensors):
    out = []
    for name, t in tensors:
        i = module.InferInput(name, list(t.shape), "FP32")
        if module is httpclient:
            i.set_data_from_numpy(t, binary_data=True)
        else:
            i.set_data_from_numpy(t)
        out.append(i)
    return out


def main():
    http_port, grpc_port, heads, seq, reps = sys.argv[1:6]
    heads, seq, reps = int(heads), int(seq), int(reps)
    rng = np.random.default_rng(7)
    tensors = [(n, rng.standard_normal((1, heads, seq, 64), dtype=np.float32))
               for n in ("query", "key", "value")]
    http = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}", connection_timeout=600,
                                            network_timeout=600)
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    http_out = [httpclient.InferRequestedOutput("output", binary_data=True)]
    grpc_out = [grpcclient.InferRequestedOutput("output")]
    times = {"http": [], "grpc": []}
    for rep in range(reps + 1):  # the first of each is a warm-up
        t = time.perf_counter()
        a = http.infer("sdpa", inputs(httpclient, tensors), outputs=http_out).as_numpy("output")
        times["http"].append(time.perf_counter() - t)
        t = time.perf_counter()
        b = grpc.infer("sdpa", inputs(grpcclient, tensors), outputs=grpc_out,
                       client_timeout=600).as_numpy("output")
        times["grpc"].append(time.perf_counter() - t)
        if not np.array_equal(a, b):
            print("tritonclient: the http and grpc outputs differ")
            return 1
    h, g = times["http"][1:], times["grpc"][1:]
    mb = 3 * heads * seq * 64 * 4 / 1048576
    print(f"tritonclient sdpa b=1 h={heads} l={seq} d=64 request_mb={mb:.1f} reps={reps} "
          f"http_binary_ms={statistics.median(h) * 1e3:.1f} "
          f"grpc_raw_ms={statistics.median(g) * 1e3:.1f} "
          f"http_binary_min_ms={min(h) * 1e3:.1f} grpc_raw_min_ms={min(g) * 1e3:.1f} "
          f"grpc_http_ratio={statistics.median(g) / statistics.median(h):.2f} output=equal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
