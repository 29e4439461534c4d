"""Prefill attention alone: one layer of `paged_attention` through the C kernel
(`model/csrc/paged_prefill.c`) on SmolLM2's heads (9 query, 3 KV, head_dim 64), one
sequence, seeded random Q/K/V, medians. For A/B runs of two checkouts, alternating:

    for tree in ../base .; do PYTHONPATH=$tree HF_HUB_OFFLINE=1 .venv/bin/python -P \\
        benchmarks/prefill_attention.py; done

Where the CPU has no AVX-512 BF16 the kernel declines and SDPA runs: compare like with like.
Where it has AMX (and the 4-bit GEMM turned it on), each shape runs both ways, alternating:
`amx` (q.k and p.V on tiles) and `avx512` (the same kernel's rows on `vdpbf16ps`).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from superinfer.model.attention import AttentionMetadata, GatherWorkspace, SeqEntry, paged_attention
from superinfer.model.cpu_q4 import q4_kernel

BLOCK_SIZE = 16
NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 9, 3, 64


def layer_ms(num_query: int, num_context: int, reps: int) -> float:
    """Median ms of one layer's attention for a chunk of `num_query` tokens after
    `num_context` cached ones."""
    num_blocks = -(-(num_query + num_context) // BLOCK_SIZE)
    gen = torch.Generator().manual_seed(0)
    cache = torch.randn(num_blocks, 2, 2, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, generator=gen)
    cache = cache.to(torch.bfloat16)
    meta = AttentionMetadata.build([SeqEntry(num_query, num_context, list(range(num_blocks)))],
                                   BLOCK_SIZE, "cpu")  # fmt: skip
    qkv = torch.randn(num_query, NUM_HEADS + 2 * NUM_KV_HEADS, HEAD_DIM, generator=gen)
    q, k, v = qkv.to(torch.bfloat16).split([NUM_HEADS, NUM_KV_HEADS, NUM_KV_HEADS], 1)
    workspace, times = GatherWorkspace(), []
    with torch.inference_mode():
        for _ in range(reps + 3):  # 3 warm-ups
            start = time.perf_counter()
            paged_attention(q, k, v, cache, 1, meta, workspace, use_kernel=True)
            times.append(time.perf_counter() - start)
    return statistics.median(times[3:]) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--shapes", default="256+0,512+0,512+512,1024+0",
                        help="query+context token counts")  # fmt: skip
    args = parser.parse_args()
    q4 = q4_kernel()
    ways = ("avx512", "amx") if q4 is not None and q4.use_amx() else ("default",)
    for shape in args.shapes.split(","):
        num_query, num_context = (int(n) for n in shape.split("+"))
        rounds: dict[str, list[float]] = {way: [] for way in ways}
        for _ in range(3):
            for way in ways:
                if way != "default":
                    q4.use_amx(way == "amx")
                rounds[way].append(layer_ms(num_query, num_context, args.reps))
        ms = {way: statistics.median(times) for way, times in rounds.items()}
        line = ", ".join(f"{way} {t:.3f} ms" for way, t in ms.items())
        ratio = f" (amx/avx512 {ms['amx'] / ms['avx512']:.2f})" if "amx" in ms else ""
        print(f"{num_query:5d} tokens after {num_context:5d} cached: {line}{ratio}", flush=True)
    if "amx" in ways:
        q4.use_amx(True)


if __name__ == "__main__":
    main()
