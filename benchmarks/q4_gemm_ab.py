"""The 4-bit GEMM against the dense bfloat16 copies it replaced, in one process.

Two offline engines on the default model (`--quantization auto`): one as loaded today (the
4-bit layers run steps of more than 8 rows on `cpu_q4`'s GEMM), one loaded with that
kernel hidden (each layer keeps a dense bfloat16 copy for steps of more than 8 rows, as
before). Each round, in alternating order: the batch-32 offline run of model_speed.py (32
ShareGPT prompts of at most 512 tokens, the reply's length capped at 128 tokens, ignore
EOS; a new sample every round, the same for both) and a 256-token prefill (TTFT).

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/q4_gemm_ab.py --rounds 8 \\
        --out docs/results/models/q4_gemm_1205/ab_inproc.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

from batch32 import NUM_DEVICE_BLOCKS, batch_round  # benchmarks/, this script's folder

from superinfer.engine.llm import LLM
from superinfer.model import quant
from superinfer.sampling_params import SamplingParams


def load_arms() -> dict[str, LLM]:
    kernel = quant.q4_kernel
    quant.q4_kernel = lambda: None  # what a CPU without AVX-512 BF16 gets: dense copies
    try:
        dense = LLM(num_device_blocks=NUM_DEVICE_BLOCKS)
    finally:
        quant.q4_kernel = kernel
    return {"dense copies": dense, "4-bit GEMM": LLM(num_device_blocks=NUM_DEVICE_BLOCKS)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--out", default=None, help="write every round as JSON")
    args = parser.parse_args()
    arms = load_arms()
    tokenizer = arms["4-bit GEMM"].get_tokenizer()
    rng = random.Random(0)
    results: dict = {"throughput_tok_s": {a: [] for a in arms}, "ttft_ms": {a: [] for a in arms}}
    for i in range(args.rounds):
        prompts, params = batch_round(tokenizer, i, temperature=1.0)
        prefill = [{"prompt_token_ids": [rng.randrange(100, 40000) for _ in range(256)]}]
        order = list(arms) if i % 2 else list(arms)[::-1]
        for name in order:
            start = time.perf_counter()
            outputs = arms[name].generate(prompts, params)
            num_tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
            results["throughput_tok_s"][name].append(num_tokens / (time.perf_counter() - start))
        for name in order:
            start = time.perf_counter()
            arms[name].generate(prefill, SamplingParams(max_tokens=1))
            results["ttft_ms"][name].append((time.perf_counter() - start) * 1e3)
        print(f"round {i + 1}: " + "; ".join(
            f"{name} {results['throughput_tok_s'][name][-1]:.0f} tok/s, "
            f"TTFT {results['ttft_ms'][name][-1]:.1f} ms" for name in arms), flush=True)  # fmt: skip
    for metric, per_arm in list(results.items()):
        ratios = [new / old for old, new in zip(*per_arm.values())]
        results[f"{metric}_ratios"] = ratios
        print(f"{metric}: 4-bit GEMM / dense copies, median {statistics.median(ratios):.3f} "
              f"({', '.join(f'{r:.2f}' for r in ratios)})")  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
