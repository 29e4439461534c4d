"""The CPU path's fused decode work against what it replaces, in one process, alternating,
medians of per-step times.

    HF_HUB_OFFLINE=1 python benchmarks/cpu_fused_ops.py [--what flat] [--rounds 16] [--batch 1]

--what norm-kv: the residual add + RMSNorm and KV write kernels (`model/cpu_norm.py`,
`model/cpu_attention.py`) against the PyTorch ops they replace, both through the modules.
--what flat: the flat decode loop (`model/cpu_decode.py`) against the modules, kernels on
in both.
--what silu: the gated MLP's silu(gate) * up as one C call (`model/cpu_act.py`) against
PyTorch's chunk, silu and multiply, in the flat loop.

The default model as the server loads it (`--quantization auto`, bfloat16, oneDNN-packed
dense layers). --batch 1: a 256-token prompt, then decode steps; --batch N: N sequences of
100-600 cached tokens (seeded random K/V) decoding together. Each round runs --steps steps
with each variant (the order alternates by round); decode attention runs through the C
kernel in both. Also counts the steps whose greedy token differs (a bfloat16 rounding of
the norm can move a near-tie; the flat loop must give the modules' tokens exactly).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from superinfer.model import decoder
from superinfer.model.attention import SeqEntry
from superinfer.model.attention_backend import select_backend
from superinfer.model.cpu_act import act_kernel
from superinfer.model.cpu_attention import PagedDecodeKernel, decode_kernel
from superinfer.model.cpu_norm import norm_kernel
from superinfer.model.loader import load_model

BLOCK_SIZE = 16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--what", choices=["norm-kv", "flat", "silu"], default="norm-kv")
    args = parser.parse_args()
    if decode_kernel() is None or norm_kernel() is None:
        raise SystemExit("the CPU kernels did not build here")
    model = load_model(None, torch.bfloat16).model
    backend = select_backend("auto", BLOCK_SIZE, "cpu")
    c = model.config
    rng = random.Random(0)
    lens = [256] if args.batch == 1 else [rng.randrange(100, 600) for _ in range(args.batch)]
    counts = [-(-(n + args.steps) // BLOCK_SIZE) for n in lens]
    shape = (sum(counts), c.num_layers, 2, BLOCK_SIZE, c.num_kv_heads, c.head_dim)
    # seeded random K/V stand in for the cached contexts (a zero cache makes every
    # sequence's logits alike, full of ties)
    kv = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(model.dtype)
    starts = [sum(counts[:i]) for i in range(len(counts))]
    tables = [list(range(s, s + n)) for s, n in zip(starts, counts)]
    can_write, flat = PagedDecodeKernel.can_write, model.model.flat_decode
    if args.what in ("flat", "silu") and flat is None:
        raise SystemExit(f"no flat decode loop here: {model.use_flat_decode()}")

    def use_kernels(on: bool) -> None:
        """Turn the variant measured on (the new path) or off (what it replaces)."""
        if args.what == "flat":
            model.model.flat_decode = flat if on else None
            return
        if args.what == "silu":
            decoder.act_kernel = act_kernel if on else (lambda: None)
            return
        model.model.flat_decode = None
        decoder.norm_kernel = norm_kernel if on else (lambda: None)
        PagedDecodeKernel.can_write = can_write if on else (lambda *_: False)

    def run(on: bool) -> tuple[list[float], list[int]]:
        use_kernels(on)
        times, tokens = [], []
        with torch.inference_mode():
            if args.batch == 1:  # the prompt, so decode reads 256 cached tokens
                meta = backend.build([SeqEntry(256, 0, tables[0])])
                model(torch.arange(1000, 1256), meta.positions, kv, meta)
            for i in range(args.steps):
                start = time.perf_counter()
                meta = backend.build([SeqEntry(1, n + i, t) for n, t in zip(lens, tables)])
                hidden = model(torch.full((len(lens),), 1000 + i), meta.positions, kv, meta)
                logits = model.compute_logits(hidden[meta.logits_indices])
                tokens += logits.argmax(-1).tolist()
                times.append(time.perf_counter() - start)
        return times, tokens

    times: dict[bool, list[float]] = {True: [], False: []}
    tokens: dict[bool, list[int]] = {}
    for r in range(args.rounds):
        for on in (True, False) if r % 2 else (False, True):
            t, tokens[on] = run(on)
            times[on] += t
    use_kernels(True)
    medians = {on: statistics.median(t) * 1e3 for on, t in times.items()}
    print(f"batch {args.batch}, {args.rounds} rounds of {args.steps} steps, "
          f"{torch.get_num_threads()} threads")  # fmt: skip
    old, new = {"flat": ("modules", "flat loop"), "silu": ("PyTorch ops", "silu_mul")}.get(
        args.what, ("PyTorch ops", "fused kernels")
    )
    print(f"  {old:13} {medians[False]:7.2f} ms a step")
    print(f"  {new:13} {medians[True]:7.2f} ms a step ({medians[True] / medians[False]:.2f}x)")
    differing = sum(a != b for a, b in zip(tokens[True], tokens[False]))
    print(f"  greedy tokens differing in the last round: {differing} of {len(tokens[True])}")


if __name__ == "__main__":
    main()
