"""The GEMM over Q6_K's own bits (`Q4Kernel.linear_q6k`, csrc/q4_linear.c) against the dense
bfloat16 layer it replaced (oneDNN, prepacked as the server packs its dense layers), and up
to 8 rows against the few-row GEMV (`cpu_gemv`) too, by rows in a step, on Qwen3-0.6B's Q6_K
shapes in a Q4_K_M file: lm_head (151936 x 1024), and ffn_down (1024 x 3072) and attn_v
(1024 x 1024) in 14 layers each.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/q6k_gemm.py \\
        --out docs/results/models/q6k_gemm_1205/kernel.json

Seeded random Q6_K values, sc and d. Each measurement is a sweep over every layer of a
shape (distinct weights, so they stream from memory as in a model's step); rounds
alternate which kernels go first; medians over the rounds. The dense weights are the
dequantized values rounded to bfloat16; the GEMV, and the GEMM up to 24 rows, scale their
sums by d sc instead, so they compute the same function up to that rounding.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from torch import nn

from superinfer.model.cpu_gemv import MAX_ROWS, gemv_kernel
from superinfer.model.cpu_linear import pack_linears
from superinfer.model.cpu_q4 import q4_kernel

SHAPES = {"lm_head": (151936, 1024, 1), "ffn_down": (1024, 3072, 14), "attn_v": (1024, 1024, 14)}


def random_q6_k(num_out: int, num_in: int, seed: int) -> tuple[torch.Tensor, ...]:
    """Q6_K values in -32..31, int8 sc per 16 inputs, float d per 256 (an fp16 value)."""
    g = torch.Generator().manual_seed(seed)
    values = torch.randint(-32, 32, (num_out, num_in), generator=g, dtype=torch.int8)
    sc = torch.randint(-128, 128, (num_out, num_in // 16), generator=g, dtype=torch.int8)
    d = (torch.rand(num_out, num_in // 256, generator=g) * 1e-4).half().float()
    return values, sc, d


def layers_of(num_out: int, num_in: int, count: int) -> tuple[list, nn.Module]:
    """`count` layers of a shape: packed for the GEMM, and as prepacked dense layers."""
    packed, dense = [], nn.ModuleList()
    for i in range(count):
        values, sc, d = random_q6_k(num_out, num_in, seed=i)
        packed.append(gemv_kernel().pack_q6_k(values, sc, d))
        weight = values.float() * (
            d.repeat_interleave(256, 1) * sc.float().repeat_interleave(16, 1)
        )
        linear = nn.Linear(num_in, num_out, bias=False, dtype=torch.bfloat16)
        linear.weight = nn.Parameter(weight.to(torch.bfloat16), requires_grad=False)
        dense.append(linear)
    pack_linears(dense)
    return packed, dense


def sweep_ms(run, layers, x: torch.Tensor) -> float:
    start = time.perf_counter()
    with torch.inference_mode():
        for layer in layers:
            run(layer, x)
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="4,6,8,9,16,24,32,64,256")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", help="write the results as JSON")
    args = parser.parse_args()
    gemm, gemv = q4_kernel(), gemv_kernel()
    every = {"q6k_gemm": lambda w, x: gemm.linear_q6k(x, w), "dense": lambda m, x: m(x),
             "gemv": lambda w, x: gemv(x, w)}  # fmt: skip
    results = []
    for name, (num_out, num_in, count) in SHAPES.items():
        packed, dense = layers_of(num_out, num_in, count)
        weights = {"q6k_gemm": packed, "dense": list(dense), "gemv": packed}
        for num_rows in map(int, args.rows.split(",")):
            # the few-row GEMV too, where it runs (up to 8 rows: what a step of up to
            # Q6KLinear.max_gemv_rows takes instead of the GEMM)
            kernels = {k: v for k, v in every.items() if k != "gemv" or num_rows <= MAX_ROWS}
            x = torch.randn(num_rows, num_in, dtype=torch.bfloat16)
            times: dict[str, list[float]] = {k: [] for k in kernels}
            for kernel, run in kernels.items():  # warm-up
                sweep_ms(run, weights[kernel], x)
            for i in range(args.rounds):
                for kernel in list(kernels)[:: 1 if i % 2 == 0 else -1]:
                    times[kernel].append(sweep_ms(kernels[kernel], weights[kernel], x))
            row = {"shape": name, "layers": count, "rows": num_rows,
                   **{f"{k}_ms": round(statistics.median(v), 3) for k, v in times.items()}}  # fmt: skip
            row["ratio"] = round(row["q6k_gemm_ms"] / row["dense_ms"], 3)
            results.append(row)
            also = f", GEMV {row['gemv_ms']:.2f} ms" if "gemv_ms" in row else ""
            print(f"{name} x{count}, {num_rows} rows: Q6_K GEMM {row['q6k_gemm_ms']:.2f} ms, "
                  f"dense {row['dense_ms']:.2f} ms, ratio {row['ratio']:.2f}{also}", flush=True)  # fmt: skip
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"args": vars(args), "threads":
                                              torch.get_num_threads(), "results": results},
                                             indent=1) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
