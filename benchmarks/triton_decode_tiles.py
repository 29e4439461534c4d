"""Decode attention on a GPU: the Triton kernel's time per layer by keys per loop step.

A decode program walks its sequence's whole context alone, one key tile per loop step, so
the tile width sets how many dependent load chains a layer waits for. This times
`unified_attention` on one layer of a paged cache for the Llama-3-8B (8 kv heads x 4, head
dim 128) and SmolLM2-135M (3 x 3, 64) shapes, batch 1 and 32, contexts 512 and 4096,
every tile width, against the KV bytes the step must read at the measured copy rate.
The width the kernel picks by itself (`_tile_sizes`) is the row marked `auto`. Each time
is one call between CUDA events, so it includes the call's Python launch (about 100 us on
the H200 machine): compare widths at 4,096 tokens, where the kernel dominates.

    python benchmarks/triton_decode_tiles.py --out $OUT/decode_tiles.json   # on a GPU
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch

from superinfer.model import triton_attention

SHAPES = {"8b": (8, 4, 128), "135m": (3, 3, 64)}  # kv heads, group, head dim
BATCHES = (1, 32)
CONTEXTS = (512, 4096)
TILES = (16, 32, 64, 128, 256)
BLOCK_SIZE = 16


def copy_rate_gb_s(device: torch.device) -> float:
    """Read + write bytes per second of a 1 GiB device copy, best of 5."""
    src = torch.ones(1 << 30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * src.numel() / min(_time(lambda: dst.copy_(src), 5)) / 1e9


def _time(fn, iters: int) -> list[float]:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return times


def decode_inputs(shape: str, batch: int, context: int, device: torch.device):
    """Queries of one decode token per sequence over shuffled blocks of one cache layer."""
    kv_heads, group, head_dim = SHAPES[shape]
    blocks_per_seq = -(-(context + 1) // BLOCK_SIZE)
    num_blocks = batch * blocks_per_seq + 1
    gen = torch.Generator(device).manual_seed(0)
    cache = torch.randn(num_blocks, 1, 2, BLOCK_SIZE, kv_heads, head_dim, device=device,
                        dtype=torch.bfloat16, generator=gen)  # fmt: skip
    blocks = list(range(1, num_blocks))
    random.Random(0).shuffle(blocks)
    tables = torch.tensor(
        [blocks[i * blocks_per_seq : (i + 1) * blocks_per_seq] for i in range(batch)],
        dtype=torch.int32,
        device=device,
    )
    q = torch.randn(batch, kv_heads * group, head_dim, device=device, dtype=torch.bfloat16)
    qsl = torch.arange(batch + 1, dtype=torch.int32, device=device)
    seq_lens = torch.full((batch,), context + 1, dtype=torch.int32, device=device)
    kv_bytes = batch * (context + 1) * 2 * kv_heads * head_dim * 2
    return q, cache, qsl, seq_lens, tables, kv_bytes


def run(tile_n: int | None, inputs) -> float:
    """Median seconds of one layer's decode attention with `tile_n` keys a step (None: auto)."""
    q, cache, qsl, seq_lens, tables, _ = inputs
    auto = triton_attention._tile_sizes
    if tile_n is not None:
        triton_attention._tile_sizes = lambda *a: (auto(*a)[0], tile_n)
    try:
        out = torch.empty_like(q)

        def step():
            triton_attention.unified_attention(
                q, cache, 0, qsl, seq_lens, tables, max_query_len=1, out=out
            )

        times = sorted(_time(step, 50))
    finally:
        triton_attention._tile_sizes = auto
    return times[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("decode_tiles.json"))
    args = parser.parse_args()
    device = torch.device("cuda")
    rate = copy_rate_gb_s(device)
    rows = []
    print(f"copy rate {rate:.0f} GB/s (read + write)")
    print(
        f"{'shape':6} {'batch':>5} {'context':>7} {'tile':>5} {'us':>8} {'GB/s':>7} {'x bound':>8}"
    )
    for shape in SHAPES:
        for batch in BATCHES:
            for context in CONTEXTS:
                inputs = decode_inputs(shape, batch, context, device)
                bound_s = inputs[-1] / (rate * 1e9)
                for tile in (*TILES, None):
                    seconds = run(tile, inputs)
                    row = {
                        "shape": shape,
                        "batch": batch,
                        "context": context,
                        "tile_n": tile or "auto",
                        "us": seconds * 1e6,
                        "kv_gb_s": inputs[-1] / seconds / 1e9,
                        "x_bound": seconds / bound_s,
                    }
                    rows.append(row)
                    print(f"{shape:6} {batch:5} {context:7} {row['tile_n']!s:>5} "
                          f"{row['us']:8.1f} {row['kv_gb_s']:7.0f} {row['x_bound']:8.1f}")  # fmt: skip
                del inputs
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"copy_gb_s": rate, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
