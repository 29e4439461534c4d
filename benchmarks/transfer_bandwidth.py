"""KV transfer bandwidth: the DuplexKV engine against a plain copy and the naive ablation.

Moves `--num-blocks` random blocks (no two consecutive, shuffled, so every block is its own
run) device->host alone, host->device alone, and both at once, with the "duplex" engine and
the "naive" one (one copy per block, layer and K/V, one lane), and compares each with a
plain `copy_` of one contiguous tensor of the same bytes (the ceiling) measured in the
same run. Cases are interleaved within each repeat so machine noise hits them alike.

    .venv/bin/python benchmarks/transfer_bandwidth.py --device cpu --num-blocks 1000
    python benchmarks/transfer_bandwidth.py --device cuda --layout llama-3-8b --output bw.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

try:
    import superinfer  # noqa: F401
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from superinfer.core.kv.transfer import Direction, TransferSpec
from superinfer.engine.kv_cache import KVCacheTiers
from superinfer.engine.transfer import KVTransferEngine, create_transfer_engine

# (num_layers, num_kv_heads, head_dim)
LAYOUTS = {"smollm2-135m": (30, 3, 64), "llama-3-8b": (32, 8, 128)}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DIRECTIONS = ("d2h", "h2d", "both")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where the device tier lives (cpu: both tiers in RAM)")
    parser.add_argument("--num-blocks", type=int, default=1000,
                        help="blocks moved per direction per transfer (default 1000)")
    parser.add_argument("--repeats", type=int, default=5,
                        help="timed repeats per case, after one warm-up (default 5)")
    parser.add_argument("--layout", choices=sorted(LAYOUTS), default="smollm2-135m",
                        help="model KV dims: smollm2-135m (30 layers, 3 kv heads, head_dim "
                        "64) or llama-3-8b (32, 8, 128; 2 MiB blocks, meant for a GPU)")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per block")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--tier-factor", type=int, default=6,
                        help="each tier holds tier-factor x num-blocks blocks, so the random "
                        "blocks are spread out (default 6)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, help="also write the raw samples as JSON here")
    return parser.parse_args(argv)


@dataclass(frozen=True)
class Blocks:
    """Disjoint random block lists: D2H reads out_src, writes out_dst; H2D likewise."""

    out_src: list[int]
    out_dst: list[int]
    in_src: list[int]
    in_dst: list[int]


def non_adjacent_blocks(num_tier_blocks: int, num_blocks: int, rng: random.Random) -> list[int]:
    """`num_blocks` distinct block ids, no two consecutive, in random order."""
    picks = sorted(rng.sample(range(num_tier_blocks - num_blocks + 1), num_blocks))
    blocks = [pick + i for i, pick in enumerate(picks)]  # gaps of at least 2
    rng.shuffle(blocks)
    return blocks


def pick_blocks(num_tier_blocks: int, num_blocks: int, seed: int) -> Blocks:
    rng = random.Random(seed)
    device = non_adjacent_blocks(num_tier_blocks, 2 * num_blocks, rng)
    host = non_adjacent_blocks(num_tier_blocks, 2 * num_blocks, rng)
    n = num_blocks
    return Blocks(device[:n], host[:n], host[n:], device[n:])


def sync(kv: KVCacheTiers) -> None:
    if kv.device.is_cuda:
        torch.cuda.synchronize(kv.device.device)


def run_concurrently(fns: list[Callable[[], None]]) -> None:
    threads = [threading.Thread(target=fn) for fn in fns]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


class PlainCopy:
    """The ceiling: one contiguous `copy_` per direction (blocks [0, n) out, [n, 2n) in)."""

    def __init__(self, kv: KVCacheTiers, num_blocks: int) -> None:
        n = num_blocks
        self.copies = {
            "d2h": lambda: kv.host[:n].copy_(kv.device[:n], non_blocking=True),
            "h2d": lambda: kv.device[n : 2 * n].copy_(kv.host[n : 2 * n], non_blocking=True),
        }
        self.streams = None
        if kv.device.is_cuda:  # one stream per direction, as the engine has
            self.streams = {d: torch.cuda.Stream(kv.device.device) for d in self.copies}

    def __call__(self, direction: str) -> None:
        chosen = list(self.copies) if direction == "both" else [direction]
        if self.streams is not None:
            for d in chosen:
                with torch.cuda.stream(self.streams[d]):
                    self.copies[d]()
        elif len(chosen) == 1:
            self.copies[direction]()
        else:
            run_concurrently([self.copies[d] for d in chosen])


def engine_copy(engine: KVTransferEngine, blocks: Blocks, direction: str) -> None:
    specs = []
    if direction in ("d2h", "both"):
        specs.append(TransferSpec(Direction.D2H, tuple(blocks.out_src), tuple(blocks.out_dst)))
    if direction in ("h2d", "both"):
        specs.append(TransferSpec(Direction.H2D, tuple(blocks.in_src), tuple(blocks.in_dst)))
    for spec in specs:
        engine.submit(spec)
    engine.synchronize([spec.transfer_id for spec in specs])
    engine.poll_finished()


def time_once(kv: KVCacheTiers, fn: Callable[[], None]) -> float:
    sync(kv)
    start = time.perf_counter()
    fn()
    sync(kv)
    return time.perf_counter() - start


def measure(args: argparse.Namespace, kv: KVCacheTiers, blocks: Blocks) -> dict[str, dict]:
    """Seconds per repeat of every (case, direction), cases interleaved within a repeat."""
    engines = {mode: create_transfer_engine(kv, mode) for mode in ("duplex", "naive")}
    plain = PlainCopy(kv, args.num_blocks)
    cases: dict[tuple[str, str], Callable[[], None]] = {}
    for direction in DIRECTIONS:
        cases["plain", direction] = lambda d=direction: plain(d)
        for mode, engine in engines.items():
            cases[mode, direction] = lambda e=engine, d=direction: engine_copy(e, blocks, d)
    samples: dict[tuple[str, str], list[float]] = {key: [] for key in cases}
    try:
        for repeat in range(args.repeats + 1):
            for key, fn in cases.items():
                seconds = time_once(kv, fn)
                if repeat > 0:  # repeat 0 warms up
                    samples[key].append(seconds)
        calls = {mode: engine.stats.num_copy_calls for mode, engine in engines.items()}
    finally:
        for engine in engines.values():
            engine.close()
    num_transfers = (args.repeats + 1) * 4  # d2h, h2d, both (two) per repeat
    calls_per_transfer = {mode: num / num_transfers for mode, num in calls.items()}
    return {"samples": samples, "calls_per_transfer": calls_per_transfer}


def summarize(samples: list[float], num_bytes: int) -> dict[str, float]:
    """GB/s (1e9 bytes/s) median and spread of timed samples: a pure function."""
    rates = sorted(num_bytes / s / 1e9 for s in samples)
    return {"median": statistics.median(rates), "min": rates[0], "max": rates[-1]}


def build_rows(measured: dict, num_bytes_one_way: int) -> list[dict]:
    rows = []
    for (case, direction), seconds in measured["samples"].items():
        num_bytes = num_bytes_one_way * (2 if direction == "both" else 1)
        rate = summarize(seconds, num_bytes)
        calls = measured["calls_per_transfer"].get(case)
        rows.append({"case": case, "direction": direction, "num_bytes": num_bytes,
                     "seconds": seconds, "gb_per_s": rate, "copy_calls_per_transfer": calls})
    plain = {r["direction"]: r["gb_per_s"]["median"] for r in rows if r["case"] == "plain"}
    for row in rows:
        row["vs_plain"] = row["gb_per_s"]["median"] / plain[row["direction"]]
    order = {"plain": 0, "duplex": 1, "naive": 2}
    return sorted(rows, key=lambda r: (order[r["case"]], DIRECTIONS.index(r["direction"])))


def print_table(rows: list[dict]) -> None:
    header = f"{'case':<8}{'direction':<11}{'GB/s median':>12}  {'[min, max]':<16}"
    print(header + f"{'vs plain':>9}{'copies/transfer':>17}")
    for row in rows:
        rate, calls = row["gb_per_s"], row["copy_calls_per_transfer"]
        spread = f"[{rate['min']:.2f}, {rate['max']:.2f}]"
        calls_text = "1" if calls is None else f"{calls:.0f}"
        print(f"{row['case']:<8}{row['direction']:<11}{rate['median']:>12.2f}  {spread:<16}"
              f"{row['vs_plain']:>8.0%}{calls_text:>17}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    num_layers, num_kv_heads, head_dim = LAYOUTS[args.layout]
    num_tier_blocks = args.tier_factor * args.num_blocks
    kv = KVCacheTiers.allocate(num_tier_blocks, num_tier_blocks, num_layers, args.block_size,
                               num_kv_heads, head_dim, DTYPES[args.dtype], args.device)
    blocks = pick_blocks(num_tier_blocks, args.num_blocks, args.seed)
    num_bytes = args.num_blocks * kv.bytes_per_block
    print(f"{args.layout} {args.dtype} on {args.device}: {args.num_blocks} blocks of "
          f"{kv.bytes_per_block / 2**10:.0f} KiB = {num_bytes / 1e6:.0f} MB per direction, "
          f"{args.repeats} repeats, torch threads {torch.get_num_threads()}")
    rows = build_rows(measure(args, kv, blocks), num_bytes)
    print_table(rows)
    if args.output:
        config = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        args.output.write_text(json.dumps({"config": config, "results": rows}, indent=2))


if __name__ == "__main__":
    main()
