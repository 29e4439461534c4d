"""Throughput cost of the sampler's features (issue 17's "Measure"): the same batch with
plain sampling, with logprobs (top 5), with penalties and a logit bias, and with a JSON
schema on half of the requests; the variants alternate over the repetitions of one run,
and the script reports median output tokens/s and each variant's ratio to plain.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/sampling_overhead.py --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from superinfer import LLM, SamplingParams
from superinfer.structured import StructuredOutput

SCHEMA = {"type": "array", "items": {"type": "integer"}}  # never forced to end early


def variants(max_tokens: int, num: int) -> dict[str, list[SamplingParams]]:
    def plain(**extra) -> SamplingParams:
        return SamplingParams(
            max_tokens=max_tokens, min_tokens=max_tokens, temperature=0.8, seed=1, **extra
        )

    def schema() -> SamplingParams:
        return SamplingParams(
            max_tokens=max_tokens, temperature=0.8, seed=1, structured=StructuredOutput(json=SCHEMA)
        )

    penalties = {"presence_penalty": 0.5, "frequency_penalty": 0.5, "repetition_penalty": 1.1,
                 "logit_bias": {100: 2.0}}  # fmt: skip
    return {
        "plain": [plain() for _ in range(num)],
        "logprobs": [plain(logprobs=5) for _ in range(num)],
        "penalties": [plain(**penalties) for _ in range(num)],
        "json_half": [schema() if i % 2 else plain() for i in range(num)],
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--output", help="write the results as JSON here")
    args = p.parse_args()
    llm = LLM(device="cpu")
    prompts = [f"Write a list of numbers, item {i}:" for i in range(args.num_prompts)]
    llm.generate(prompts[:2], SamplingParams(max_tokens=4))  # warm-up
    rates: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        for name, params in variants(args.max_tokens, args.num_prompts).items():
            start = time.perf_counter()
            outputs = llm.generate(prompts, params)
            elapsed = time.perf_counter() - start
            num_tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
            rates.setdefault(name, []).append(num_tokens / elapsed)
    base = statistics.median(rates["plain"])
    result = {
        name: {"tokens_per_s": round(statistics.median(r), 1), "runs": [round(x, 1) for x in r],
               "ratio_to_plain": round(statistics.median(r) / base, 3)}
        for name, r in rates.items()
    }  # fmt: skip
    print(json.dumps(result, indent=2))
    if args.output:
        with open(args.output, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
