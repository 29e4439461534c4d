"""The few-row GEMV over Q6_K weights: the 8-bit layout (`q6_gemv`, 10 bits a weight)
against Q6_K's own (`q6k_gemv`, 6.625 bits), on Qwen3-0.6B's head (151,936 x 1,024) and an
ffn_down (1,024 x 3,072), at 1 and 4 rows.

    .venv/bin/python benchmarks/q6k_gemv.py \\
        --out docs/results/models/q6k_decode_1205/q6k_gemv.json

Seeded random Q6_K weights (values, int8 sc, fp16 d); each kernel's median time over
--calls calls after a warm-up, on --threads threads, alternating the two kernels.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from superinfer.model.cpu_gemv import GemvKernel, gemv_kernel

SHAPES = {"lm_head": (151_936, 1_024), "ffn_down": (1_024, 3_072)}


def random_q6_k(num_out: int, num_in: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q6_K-like values in -32..31, int8 sc per 16 inputs and fp16 d per 256."""
    g = torch.Generator().manual_seed(num_out + num_in)
    values = torch.randint(-32, 32, (num_out, num_in), generator=g, dtype=torch.int8)
    sc = torch.randint(-128, 128, (num_out, num_in // 16), generator=g, dtype=torch.int8)
    d = (torch.rand(num_out, num_in // 256, generator=g) * 1e-3).half().float()
    return values, sc, d


def nbytes(tensor: torch.Tensor) -> int:
    """The bytes `tensor` holds."""
    return tensor.numel() * tensor.element_size()


def median_ms(kernel: GemvKernel, x: torch.Tensor, weights: object, calls: int) -> float:
    """The median time of one call, in ms."""
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        kernel(x, weights)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def measure(kernel: GemvKernel, name: str, calls: int) -> list[dict]:
    """Old and new kernel times on one shape at 1 and 4 rows."""
    num_out, num_in = SHAPES[name]
    values, sc, d = random_q6_k(num_out, num_in)
    old = kernel.pack_q6(values, d.repeat_interleave(16, 1) * sc.float())
    new = kernel.pack_q6_k(values, sc, d)
    results = []
    for rows in (1, 4):
        x = torch.randn(rows, num_in).to(torch.bfloat16)
        for weights in (old, new):
            median_ms(kernel, x, weights, 3)  # warm-up
        old_ms, new_ms = [], []
        for _ in range(5):  # alternate, so drift affects both
            old_ms.append(median_ms(kernel, x, old, calls))
            new_ms.append(median_ms(kernel, x, new, calls))
        row = {"shape": name, "num_out": num_out, "num_in": num_in, "rows": rows,
               "q6_gemv_ms": statistics.median(old_ms), "q6k_gemv_ms": statistics.median(new_ms),
               "q6_gemv_bytes": nbytes(old.packed) + nbytes(old.scales),
               "q6k_gemv_bytes": nbytes(new.packed) + nbytes(new.d)}  # fmt: skip
        row["ratio"] = row["q6k_gemv_ms"] / row["q6_gemv_ms"]
        print(f"{name} ({num_out} x {num_in}), {rows} row(s): q6_gemv {row['q6_gemv_ms']:.3f} ms,"
              f" q6k_gemv {row['q6k_gemv_ms']:.3f} ms, ratio {row['ratio']:.2f}"
              f" (bits a weight {8 * row['q6_gemv_bytes'] / num_out / num_in:.2f} ->"
              f" {8 * row['q6k_gemv_bytes'] / num_out / num_in:.2f})", flush=True)  # fmt: skip
        results.append(row)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    kernel = gemv_kernel()
    if kernel is None:
        raise SystemExit("the few-row GEMV does not run here")
    results = [row for name in SHAPES for row in measure(kernel, name, args.calls)]
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        report = {"threads": args.threads, "calls": args.calls, "results": results}
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
