"""Decode attention on CPU: the C kernel (reads the paged cache in place) against the
portable path (gather the blocks, pad to the longest sequence, SDPA), same run.

A SmolLM2-135M-shaped cache (30 layers, 3 KV heads of 64, 9 query heads, 16-token blocks,
bf16) much larger than the CPU caches, block tables drawn at random from it, one layer per
call as the model does. Each case alternates the paths over --repeats rounds and
reports the median time per call and the ratio. --baseline-commit REV adds the kernel as
it was at REV (its csrc/ built with today's flags), for a before/after in the same run.

    .venv/bin/python benchmarks/decode_attention.py \
        --output docs/results/engine/decode_attention.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from superinfer.model.attention import GatherWorkspace, _gather
from superinfer.model.cpu_attention import PagedDecodeKernel, decode_kernel
from superinfer.model.cpu_kernels import CFLAGS

NUM_LAYERS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, NUM_HEADS = 30, 16, 3, 64, 9
# (sequences, their lengths): uniform batches, and a ShareGPT-like mix of lengths
CASES = {
    "1 x 256": [256],
    "1 x 1500": [1500],
    "16 x 400": [400] * 16,
    "32 x 600": [600] * 32,
    "32 x 250": [250] * 32,
    "12 mixed 60-1900": [60, 90, 150, 220, 300, 380, 450, 600, 800, 1100, 1500, 1900],
}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--num-blocks", type=int, default=4096,
                   help="cache size in blocks (1.1 GiB bf16)")  # fmt: skip
    p.add_argument("--calls", type=int, default=60, help="calls per timed burst (layers cycle)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--baseline-commit", metavar="REV",
                   help="also time the kernel of this git revision (built here)")  # fmt: skip
    p.add_argument("--output", help="write the results as JSON here")
    return p.parse_args()


def kernel_at(rev: str, build_dir: Path) -> PagedDecodeKernel:
    """The decode kernel of git revision `rev`: its model/csrc/ built with today's flags."""
    repo = Path(__file__).resolve().parent.parent
    listing = subprocess.run(["git", "ls-tree", "--name-only", f"{rev}:superinfer/model/csrc"],
                             cwd=repo, check=True, capture_output=True, text=True)  # fmt: skip
    sources = []
    for name in listing.stdout.split():
        blob = subprocess.run(["git", "show", f"{rev}:superinfer/model/csrc/{name}"], cwd=repo,
                              check=True, capture_output=True).stdout  # fmt: skip
        (build_dir / name).write_bytes(blob)
        if name.endswith(".c"):
            sources.append(str(build_dir / name))
    library = build_dir / "baseline.so"
    subprocess.run(["cc", *CFLAGS, f"-I{build_dir}", *sources, "-o", str(library), "-lm"],
                   check=True)  # fmt: skip
    return PagedDecodeKernel(ctypes.CDLL(str(library)))


def main() -> None:
    args = parse_args()
    kernel = decode_kernel()
    if kernel is None:
        raise SystemExit("the kernel could not be built here (see the log)")
    gen = torch.Generator().manual_seed(0)
    shape = (args.num_blocks, NUM_LAYERS, 2, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    cache = torch.randn(shape, generator=gen).to(torch.bfloat16)
    baseline = None
    if args.baseline_commit:
        baseline = kernel_at(args.baseline_commit, Path(tempfile.mkdtemp()))
    results = {}
    for name, lengths in CASES.items():
        num_seqs, max_blocks = len(lengths), max(-(-n // BLOCK_SIZE) for n in lengths)
        picks = torch.randperm(args.num_blocks, generator=gen)[: num_seqs * max_blocks]
        tables = picks.view(num_seqs, max_blocks).contiguous()
        seq_lens = torch.tensor(lengths)
        q = torch.randn(num_seqs, NUM_HEADS, HEAD_DIM, generator=gen).to(torch.bfloat16)
        mask = torch.arange(max_blocks * BLOCK_SIZE) < seq_lens[:, None]
        bias = torch.zeros(num_seqs, 1, 1, max_blocks * BLOCK_SIZE, dtype=torch.bfloat16)
        bias.masked_fill_(~mask.view(num_seqs, 1, 1, -1), float("-inf"))
        workspace = GatherWorkspace()

        def run_kernel(layer: int) -> None:
            kernel(q, cache, layer, tables, seq_lens)

        def run_gather(layer: int) -> None:
            k, v = _gather(cache, layer, tables.view(-1), num_seqs, workspace)
            grouped = q.view(num_seqs, NUM_KV_HEADS, -1, HEAD_DIM)
            F.scaled_dot_product_attention(grouped, k, v, attn_mask=bias)

        def run_baseline(layer: int) -> None:
            baseline(q, cache, layer, tables, seq_lens)

        paths = [("kernel", run_kernel), ("gather_sdpa", run_gather)]
        if baseline is not None:
            paths.append(("baseline", run_baseline))
        times = {label: [] for label, _ in paths}
        for _ in range(args.repeats):
            for label, fn in paths:
                fn(0)
                start = time.perf_counter()
                for call in range(args.calls):
                    fn(call % NUM_LAYERS)
                times[label].append((time.perf_counter() - start) / args.calls * 1e3)
        kernel_ms, gather_ms = (statistics.median(times[k]) for k in ("kernel", "gather_sdpa"))
        results[name] = {
            "num_tokens": sum(lengths), "kernel_ms": kernel_ms, "gather_sdpa_ms": gather_ms,
            "speedup": gather_ms / kernel_ms, "kernel_ms_all": times["kernel"],
            "gather_sdpa_ms_all": times["gather_sdpa"],
        }  # fmt: skip
        line = (f"{name:>18}: kernel {kernel_ms:6.3f} ms  gather+SDPA {gather_ms:6.3f} ms  "
                f"{gather_ms / kernel_ms:4.2f}x")  # fmt: skip
        if baseline is not None:
            baseline_ms = statistics.median(times["baseline"])
            results[name].update(baseline_ms=baseline_ms, baseline_ms_all=times["baseline"],
                                 speedup_vs_baseline=baseline_ms / kernel_ms)  # fmt: skip
            line += (
                f"  {args.baseline_commit} {baseline_ms:6.3f} ms {baseline_ms / kernel_ms:4.2f}x"
            )
        print(f"{line}  (medians of {args.repeats})")
    if args.output:
        meta = {"torch": torch.__version__, "threads": torch.get_num_threads(), **vars(args)}
        with open(args.output, "w") as f:
            json.dump({"meta": meta, "cases": results}, f, indent=1)


if __name__ == "__main__":
    main()
