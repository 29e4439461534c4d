"""How close a batch-32 run of `model_speed.py` comes to this CPU's arithmetic peak.

For each offline-throughput round of a `model_speed.py` result (its --out JSON), counts the
arithmetic the round needs (the same for every engine: the linear layers for every prompt
and decode token, lm_head for every sampled token, causal attention over each sequence),
divides it by each engine's time for the round, and compares it with two peaks measured
here and now:
- `gemm`: PyTorch's bfloat16 matmul (oneDNN) of 2048 x 2048 x 2048, a large GEMM at its best;
- `vdpbf16ps` / `vpdpbusd`: the instruction rates of AVX-512 BF16 and VNNI dot products
  (`csrc/dot_peak.c`: independent chains, nothing else), 64 FLOP and 128 OP an instruction.

Prints each round's FLOP rate and share of the bfloat16 peaks, and the throughput a round
would reach at the peak (its ceiling); --out writes it all as JSON. The arithmetic is
counted the same for every engine whatever its number format: for one that multiplies in
8 bits (`superinfer-w4a8`) the share is of bfloat16's peak, and can pass 100%. The prompts are rebuilt
from the result's own arguments (ShareGPT sample and seed), so the count is for the very
rounds that were timed.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/roofline.py \\
        docs/results/models/model_speed_row1_2026-12-05c.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from superinfer.sim.models import ModelProfile

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def round_flops(profile: ModelProfile, prompts: list[list[int]],
                num_new: list[int]) -> dict[str, float]:  # fmt: skip
    """Arithmetic of one round, by part, as the simulator's roofline counts it
    (`superinfer.sim.models.ModelProfile`: 2 FLOP a multiply-add)."""
    layer_flops = 2 * (profile.num_active_params - profile.num_embedding_params)
    num_prompt = sum(len(p) for p in prompts)
    num_decode = sum(n - 1 for n in num_new)  # the first token comes out of the prefill
    pairs = 0  # (query, key) pairs, causal
    for prompt, n in zip(prompts, num_new, strict=True):
        length = len(prompt)
        pairs += length * (length + 1) // 2  # prefill
        pairs += sum(length + i + 1 for i in range(1, n))  # each decode token
    return {
        "linear": float(layer_flops * (num_prompt + num_decode)),
        "lm_head": float(profile.lm_head_flops_per_token * sum(num_new)),
        "attention": float(profile.attention_flops_per_pair * pairs),
        "num_prompt_tokens": num_prompt,
        "num_output_tokens": sum(num_new),
    }


def gemm_peak(num_threads: int, seconds: float = 2.0) -> float:
    """GFLOP/s of PyTorch's bfloat16 2048^3 matmul: the median of calls over `seconds`."""
    import torch

    torch.set_num_threads(num_threads)
    a = torch.randn(2048, 2048).bfloat16()
    b = torch.randn(2048, 2048).bfloat16()
    for _ in range(3):
        a @ b
    times, deadline = [], time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return 2 * 2048**3 / statistics.median(times) / 1e9


def instruction_peaks(num_threads: int) -> dict[str, float]:
    """{"vdpbf16ps": GFLOP/s, "vpdpbusd": GOP/s} from `csrc/dot_peak.c`; {} without a
    compiler or on a CPU without these instructions."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return {}
    with tempfile.TemporaryDirectory() as tmp:
        binary = Path(tmp) / "dot_peak"
        build = subprocess.run([compiler, "-O2", "-march=native", "-fopenmp",
                                str(HERE / "csrc" / "dot_peak.c"), "-o", str(binary)],
                               check=False, capture_output=True, text=True)  # fmt: skip
        if build.returncode != 0:
            return {}
        env = {**os.environ, "OMP_NUM_THREADS": str(num_threads)}
        run = subprocess.run([str(binary)], check=False, capture_output=True, text=True, env=env)
        if run.returncode != 0:
            return {}
    return {
        name: float(value) for name, value in (line.split() for line in run.stdout.splitlines())
    }


def host_cpu() -> dict[str, str]:
    """The CPU as /proc/cpuinfo names it (vendor, family, model, name): sessions may land on
    hosts of different generations, and a result is comparable only with its own host's."""
    keys = {"vendor_id": "vendor", "cpu family": "family", "model": "model",
            "model name": "name"}  # fmt: skip
    info: dict[str, str] = {}
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return info
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() in keys and keys[key.strip()] not in info:
            info[keys[key.strip()]] = value.strip()
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("result", help="a model_speed.py --out JSON with a throughput section")
    parser.add_argument("--out", help="write the table as JSON here")
    args = parser.parse_args()
    import model_speed

    result = json.loads(Path(args.result).read_text())
    run_args = argparse.Namespace(**result["args"])
    row = result["rows"][0]
    profile = ModelProfile.from_hf_dir(row["model"]["hf_dir"])
    batches, _ = model_speed.sharegpt_batches(run_args)
    works = [round_flops(profile, b["prompts"], b["num_new"]) for b in batches[: run_args.rounds]]

    threads = run_args.threads
    peaks = {"gemm": gemm_peak(threads), **instruction_peaks(threads)}
    host = host_cpu()
    if result.get("host", {}).get("cpu") not in (None, host):
        print(f"warning: the result was measured on {result['host']['cpu']}, this is {host}: "
              "its shares of these peaks mean nothing")  # fmt: skip
    print(f"{host}")
    print(f"peaks at {threads} threads: " + ", ".join(f"{k} {v:.0f}" for k, v in peaks.items())
          + "  (G(FL)OP/s)")  # fmt: skip
    bf16_peaks = {k: v for k, v in peaks.items() if k in ("gemm", "vdpbf16ps")}
    table = []
    for r, work in enumerate(works):
        total = work["linear"] + work["lm_head"] + work["attention"]
        entry = {"round": r + 1, **work, "gflop": total / 1e9, "engines": {}}
        line = (
            f"round {r + 1}: {total / 1e9:6.0f} GFLOP ({work['num_prompt_tokens']} prompt, "
            f"{work['num_output_tokens']} output tokens)"
        )
        for engine, rounds in row["throughput"].items():
            seconds = rounds["rounds"][r]["seconds"]
            rate = total / seconds / 1e9
            shares = {k: rate / v for k, v in bf16_peaks.items()}
            ceilings = {k: work["num_output_tokens"] / (total / (v * 1e9))
                        for k, v in bf16_peaks.items()}  # fmt: skip
            entry["engines"][engine] = {"seconds": seconds, "gflop_s": rate, "share": shares,
                                        "ceiling_tok_s": ceilings}  # fmt: skip
            line += f"\n  {engine:16s} {rate:4.0f} GFLOP/s = " + ", ".join(
                f"{s:.0%} of {k}" for k, s in shares.items()
            )
        line += "\n  ceiling " + ", ".join(
            f"{work['num_output_tokens'] / (total / (v * 1e9)):.0f} tok/s at {k}"
            for k, v in bf16_peaks.items())  # fmt: skip
        print(line)
        table.append(entry)
    if args.out:
        Path(args.out).write_text(json.dumps({"source": args.result, "threads": threads, "cpu": host,
                                              "peaks": peaks, "rounds": table}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
