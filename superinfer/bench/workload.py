"""The request sequence of a benchmark run: prompts and output lengths from a dataset,
arrival times, and each request's SLO targets.

Everything is drawn from `seed`, so the same flags give the same sequence for every system
and policy. ShareGPT sampling and Poisson arrivals are the simulator's
(`superinfer.workload`), so the same seed and limits give the same lengths and times.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from superinfer.bench.client import RequestSpec
from superinfer.bench.request_slo import parse_class_mix, request_targets
from superinfer.slo.classes import load_slo_config
from superinfer.workload import datasets
from superinfer.workload.arrivals import arrivals_within, generated_arrivals, replayed_arrivals
from superinfer.workload.config import WorkloadConfig


@dataclass
class Workload:
    """The requests in send order, and what was dropped to make them."""

    specs: list[RequestSpec]
    num_dropped: int
    info: dict[str, Any] = field(default_factory=dict)


def build_workload(config: WorkloadConfig, tokenizer) -> Workload:
    """Sample the requests, their arrival times and their targets."""
    turn_ids: list[tuple[int, int] | None] = []
    if config.trace_replay:
        arrivals, requests, num_dropped = _replay(config, tokenizer)
    elif config.dataset_name == "sharegpt-multiturn":
        (arrivals, requests, turn_ids), num_dropped = _sessions(config, tokenizer), 0
    else:
        arrivals = _arrivals(config)
        requests, num_dropped = _sample(config, tokenizer, len(arrivals))
    turn_ids = turn_ids or [None] * len(requests)
    requests = datasets.cap_outputs(requests, config.max_output_tokens)
    mix = parse_class_mix(config.slo_classes) if config.slo_classes else None
    targets = request_targets(len(requests), mix, load_slo_config(config.slo_config),
                              config.ttft_slo_ms, config.tbt_slo_ms, config.max_latency_slo_ms,
                              seed=config.seed)  # fmt: skip
    specs = [_spec(i, r, t, at, turn, config.turn_gap)
             for i, (r, t, at, turn) in enumerate(zip(requests, targets, arrivals, turn_ids))]  # fmt: skip
    return Workload(specs, num_dropped, {"class_mix": mix})


def _spec(index: int, request: datasets.SampledRequest, targets, arrival_s: float,
          turn: tuple[int, int] | None, turn_gap: float) -> RequestSpec:  # fmt: skip
    think_s = turn_gap if turn is not None and turn[1] > 0 else None  # a later turn's wait
    return RequestSpec(f"bench-{index}", request.prompt, request.num_prompt_tokens,
                       request.num_output_tokens, targets, arrival_s, request.turns, turn,
                       think_s)  # fmt: skip


def _arrivals(config: WorkloadConfig) -> list[float]:
    if config.duration is not None:
        return arrivals_within(config.duration, config.request_rate, config.burstiness,
                               config.seed)  # fmt: skip
    return generated_arrivals(config.num_prompts, config.request_rate, config.burstiness,
                              config.seed)  # fmt: skip


def _sessions(config: WorkloadConfig, tokenizer) -> tuple[list[float], list, list]:
    """Conversations starting at Poisson (or --burstiness) times at `request_rate` / mean
    turns, so that turns come at `request_rate` on average. Turn k > 0 is sent
    `turn_gap` after turn k-1 ended (the client's closed loop, `think_s`); its arrival
    here, `turn_gap` after turn k-1's, orders the list and is the earliest it can come.
    Every turn of a conversation that starts within --duration is sent (the run goes on
    until the last ends); with --num-prompts, the first that many turns by that order.
    Each comes with its (conversation, turn) numbers."""
    num_requests = len(_arrivals(config))
    sessions = datasets.sample_sharegpt_sessions(tokenizer, num_requests, config.seed,
                                                 config.limits)  # fmt: skip
    mean_turns = sum(len(s.turns) for s in sessions) / len(sessions)
    per_session = dataclasses.replace(config, request_rate=config.request_rate / mean_turns)
    starts = _arrivals(per_session)[: len(sessions)]
    timed = sorted((start + k * config.turn_gap, i, k)
                   for i, start in enumerate(starts) for k in range(len(sessions[i].turns)))  # fmt: skip
    if config.duration is None:
        timed = timed[: config.num_prompts]
    return ([at for at, _, _ in timed], [sessions[i].turns[k] for _, i, k in timed],
            [(i, k) for _, i, k in timed])  # fmt: skip


def _replay(config: WorkloadConfig, tokenizer) -> tuple[list[float], list, int]:
    trace = datasets.load_azure_trace(config.dataset_name)
    end = (
        None
        if config.duration is None
        else config.trace_start + config.duration / config.time_scale
    )
    rows, num_dropped = datasets.replay_window(trace, config.limits, config.trace_start,
                                               None if end is not None else config.num_prompts, end)  # fmt: skip
    arrivals = replayed_arrivals([r.arrival_s for r in rows], config.time_scale)
    lengths = [(r.num_prompt_tokens, r.num_output_tokens) for r in rows]
    return arrivals, datasets.synthesize_requests(tokenizer, lengths, config.seed), num_dropped


def _sample(config: WorkloadConfig, tokenizer, num_requests: int) -> tuple[list, int]:
    limits, seed, name = config.limits, config.seed, config.dataset_name
    if name == "sharegpt":
        return datasets.sample_sharegpt(tokenizer, num_requests, seed, limits.max_prompt_tokens,
                                        limits.max_total_tokens, limits.min_tokens)  # fmt: skip
    if name == "custom":
        return datasets.load_custom(config.dataset_path, tokenizer, num_requests,
                                    config.custom_output_len, limits)  # fmt: skip
    if name == "random":
        lengths = datasets.random_lengths(num_requests, config.random_input_len,
                                          config.random_output_len, config.random_range_ratio,
                                          seed)  # fmt: skip
        return datasets.synthesize_requests(tokenizer, lengths, seed), 0
    rows, num_dropped = datasets.sample_trace(datasets.load_azure_trace(name), limits,
                                              num_requests, seed)  # fmt: skip
    lengths = [(r.num_prompt_tokens, r.num_output_tokens) for r in rows]
    return datasets.synthesize_requests(tokenizer, lengths, seed), num_dropped
