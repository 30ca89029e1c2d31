#!/usr/bin/env python3
"""torch_case.py - PyTorch's CPU attention on one bench_sdpa shape, the peer of its lines.

    python3 tests/bench/torch_case.py B H L S D CAUSAL DTYPE THREADS

DTYPE is float32 or bfloat16. Prints one line: the best seconds of a call, then the API used:
torch.nn.functional.scaled_dot_product_attention where this torch has it (2.0 and later),
else (1.13, Debian's python3-torch) softmax(Q K^T / sqrt(D)) V with matmul, which is what that
version offers, named as such so that nobody mistakes it for the fused kernel.
"""
import math
import sys
import time

import torch


def main():
    b, h, l, s, d, causal = (int(x) for x in sys.argv[1:7])
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[sys.argv[7]]
    torch.set_num_threads(int(sys.argv[8]))
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.rand(b, h, n, d, generator=gen).to(dtype) for n in (l, s, s))
    fused = hasattr(torch.nn.functional, "scaled_dot_product_attention")
    mask = torch.ones(l, s, dtype=torch.bool).tril() if causal else None

    def call():
        with torch.no_grad():
            if fused:
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
            w = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d)
            if mask is not None:
                w = w.masked_fill(~mask, float("-inf"))
            return torch.matmul(torch.softmax(w, dim=-1), v)

    call()
    best, total, runs = 1e30, 0.0, 0
    while runs < 3 or (total < 2.0 and runs < 20):
        t0 = time.perf_counter()
        call()
        t = time.perf_counter() - t0
        best, total, runs = min(best, t), total + t, runs + 1
    api = "scaled_dot_product_attention" if fused else "matmul_softmax"
    print(f"{best:.9f} {api} {torch.__version__}")


if __name__ == "__main__":
    main()
