"""Prefill on the CPU with the C prefill-attention kernel (`model/csrc/paged_prefill.c`)
against PyTorch's SDPA, in one process, alternating, medians of whole forwards.

    HF_HUB_OFFLINE=1 python benchmarks/cpu_prefill.py [--rounds 6]

The default model as the server loads it (`--quantization auto`, bfloat16), one sequence:
a chunk of --chunk tokens after each of --contexts cached tokens (the cache holds seeded
random K/V; only the time is read). Each round runs one forward per path after a
warm-up forward, the order alternating by round. The kernel runs where the CPU has
AVX-512 BF16; elsewhere both paths are SDPA and the ratio is 1.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from superinfer.model.attention import SeqEntry
from superinfer.model.attention_backend import select_backend
from superinfer.model.cpu_attention import PagedDecodeKernel
from superinfer.model.loader import load_model

BLOCK_SIZE = 16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--chunks", default="256,512", help="query tokens per forward")
    parser.add_argument("--contexts", default="0,512,1024", help="cached tokens before a chunk")
    args = parser.parse_args()
    model = load_model(None, torch.bfloat16).model
    backend = select_backend("auto", BLOCK_SIZE, "cpu")
    c = model.config
    chunks = [int(n) for n in args.chunks.split(",")]
    contexts = [int(n) for n in args.contexts.split(",")]
    num_blocks = -(-(max(chunks) + max(contexts)) // BLOCK_SIZE)
    shape = (num_blocks, c.num_layers, 2, BLOCK_SIZE, c.num_kv_heads, c.head_dim)
    kv = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(model.dtype)
    table = list(range(num_blocks))
    kernel = PagedDecodeKernel.prefill

    def forward(num_query: int, num_context: int) -> float:
        meta = backend.build([SeqEntry(num_query, num_context, table)])
        start = time.perf_counter()
        hidden = model(torch.arange(1000, 1000 + num_query), meta.positions, kv, meta)
        model.compute_logits(hidden[meta.logits_indices])
        return time.perf_counter() - start

    print(f"{args.rounds} alternating rounds, {torch.get_num_threads()} threads, medians")
    with torch.inference_mode():
        for num_query in chunks:
            for num_context in contexts:
                times: dict[bool, list[float]] = {True: [], False: []}
                for r in range(args.rounds):
                    for on in (True, False) if r % 2 else (False, True):
                        PagedDecodeKernel.prefill = kernel if on else (lambda *_a, **_k: None)
                        forward(num_query, num_context)  # warm-up
                        times[on].append(forward(num_query, num_context))
                PagedDecodeKernel.prefill = kernel
                sdpa, ours = (statistics.median(times[on]) * 1e3 for on in (False, True))
                print(f"  {num_query:4d} tokens after {num_context:4d} cached: SDPA {sdpa:7.1f} ms,"
                      f" kernel {ours:7.1f} ms ({ours / sdpa:.2f}x)")  # fmt: skip


if __name__ == "__main__":
    main()
