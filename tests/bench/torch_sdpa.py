#!/usr/bin/env python3
"""PyTorch's attention on CPU as a peer of attnd, for make bench-report (make bench-peers).

    tests/bench/torch_sdpa.py [THREADS [REPS]]           the shapes of ggml's run.sh
    tests/bench/torch_sdpa.py THREADS REPS B H L S D CAUSAL   one case

Prints one JSON line per case in the form of ggml_fa_bench's (impl, B, H, LQ, LK, D, causal,
threads, reps, median_ms, min_ms, gflops_dense, gflops_useful), float32 throughout. The impl is
torch.nn.functional.scaled_dot_product_attention where this torch has it (2.0 and later), else
the softmax(Q Kᵀ / sqrt(D)) V a user of torch 1.x writes. Without an importable torch module it
prints a skip line and exits 0.
"""
import json
import statistics
import sys
import time

CASES = [(1, 8, 2048, 2048, 64, 0), (1, 8, 2048, 2048, 64, 1), (1, 8, 8192, 8192, 64, 0)]


def attention_fn(torch):
    sdpa = getattr(torch.nn.functional, "scaled_dot_product_attention", None)
    if sdpa is not None:
        return "torch_sdpa", lambda q, k, v, causal: sdpa(q, k, v, is_causal=bool(causal))

    def explicit(q, k, v, causal):
        s = q @ k.transpose(-2, -1) / (q.shape[-1] ** 0.5)
        if causal:
            lq, lk = s.shape[-2], s.shape[-1]
            s = s.masked_fill(torch.ones(lq, lk, dtype=torch.bool).triu(1), float("-inf"))
        return torch.softmax(s, dim=-1) @ v

    return "torch_matmul_softmax", explicit


def run_case(torch, impl, fn, case, threads, reps):
    b, h, lq, lk, d, causal = case
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, h, lq, d, generator=g)
    k = torch.randn(b, h, lk, d, generator=g)
    v = torch.randn(b, h, lk, d, generator=g)
    with torch.inference_mode():
        fn(q, k, v, causal)  # warm-up
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn(q, k, v, causal)
            times.append((time.perf_counter() - t0) * 1e3)
    med = statistics.median(times)
    dense = 4.0 * b * h * lq * lk * d
    useful = dense / 2 if causal and lq == lk else dense
    return {"impl": impl, "torch": torch.__version__, "B": b, "H": h, "LQ": lq, "LK": lk, "D": d,
            "causal": causal, "kv_type": "f32", "threads": threads, "reps": reps,
            "median_ms": round(med, 3), "min_ms": round(min(times), 3),
            "gflops_dense": round(dense / (med * 1e6), 2),
            "gflops_useful": round(useful / (med * 1e6), 2)}


def main(argv):
    try:
        import torch
    except ImportError as e:
        print(f"# skip torch peer: the torch module is not importable ({e})")
        return 0
    args = [int(a) for a in argv[1:]]
    threads = args[0] if args else 2
    reps = args[1] if len(args) > 1 else 5
    cases = [tuple(args[2:8])] if len(args) >= 8 else CASES
    torch.set_num_threads(threads)
    impl, fn = attention_fn(torch)
    for case in cases:
        print(json.dumps(run_case(torch, impl, fn, case, threads, reps)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
