"""The request sequence of a benchmark run: prompts and output lengths from a dataset,
arrival times, and each request's SLO targets.

Everything is drawn from `seed`, so the same flags give the same sequence for every system
and policy. ShareGPT sampling and Poisson arrivals replay the simulator's
(`superinfer.sim.workload`) with the same seed and limits.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

from superinfer.bench import datasets
from superinfer.bench.arrivals import arrivals_within, generated_arrivals, replayed_arrivals
from superinfer.bench.client import RequestSpec
from superinfer.bench.datasets import DATASETS
from superinfer.bench.slo_targets import parse_class_mix, request_targets
from superinfer.sim.workload import LengthLimits
from superinfer.slo_config import load_slo_config


@dataclass
class WorkloadConfig:
    """Flags of the request sequence (see `superinfer bench serve --help`)."""

    dataset_name: str = "sharegpt"
    dataset_path: str | None = None  # the custom JSONL file
    num_prompts: int | None = 100
    duration: float | None = None  # seconds of arrivals instead of a count
    request_rate: float = math.inf
    burstiness: float = 1.0
    seed: int = 0
    trace_replay: bool = False  # Azure: replay the trace's arrival times
    time_scale: float = 1.0
    trace_start: float = 0.0
    random_input_len: int = 256
    random_output_len: int = 64
    random_range_ratio: float = 0.0
    custom_output_len: int = 128
    max_prompt_tokens: int = 1024
    max_total_tokens: int = 2048
    min_tokens: int = 4
    max_output_tokens: int | None = None
    slo_classes: str | None = None
    slo_config: str | None = None
    ttft_slo_ms: float | None = None
    tbt_slo_ms: float | None = None
    max_latency_slo_ms: float | None = None
    tokenizer: str | None = None

    def __post_init__(self) -> None:
        if self.dataset_name not in DATASETS:
            raise ValueError(f"unknown dataset {self.dataset_name!r}; choose one of {DATASETS}")
        if self.trace_replay and not self.dataset_name.startswith("azure"):
            raise ValueError("--trace-replay needs an Azure trace (azure-conv or azure-code)")
        if self.dataset_name == "custom" and not self.dataset_path:
            raise ValueError("the custom dataset needs --dataset-path FILE.jsonl")
        if self.duration is None and self.num_prompts is None:
            raise ValueError("give --num-prompts or --duration")

    @property
    def limits(self) -> LengthLimits:
        return LengthLimits(self.max_prompt_tokens, self.max_total_tokens, self.min_tokens,
                            self.max_output_tokens)  # fmt: skip


@dataclass
class Workload:
    """The requests in send order, and what was dropped to make them."""

    specs: list[RequestSpec]
    num_dropped: int
    info: dict[str, Any] = field(default_factory=dict)


def load_tokenizer(path: str | None = None):
    """A Hugging Face tokenizer from a directory, a hub name or a GGUF file (None: the
    default model's)."""
    from transformers import AutoTokenizer

    if path is None:
        from superinfer.sim.workload import load_default_tokenizer

        return load_default_tokenizer()
    if path.endswith(".gguf"):
        directory, filename = os.path.split(os.path.abspath(path))
        return AutoTokenizer.from_pretrained(directory, gguf_file=filename)
    return AutoTokenizer.from_pretrained(path)


def build_workload(config: WorkloadConfig, tokenizer) -> Workload:
    """Sample the requests, their arrival times and their targets."""
    if config.trace_replay:
        arrivals, requests, num_dropped = _replay(config, tokenizer)
    else:
        arrivals = _arrivals(config)
        requests, num_dropped = _sample(config, tokenizer, len(arrivals))
    requests = datasets.cap_outputs(requests, config.max_output_tokens)
    mix = parse_class_mix(config.slo_classes) if config.slo_classes else None
    targets = request_targets(len(requests), mix, load_slo_config(config.slo_config),
                              config.ttft_slo_ms, config.tbt_slo_ms, config.max_latency_slo_ms,
                              seed=config.seed)  # fmt: skip
    specs = [
        RequestSpec(f"bench-{i}", r.prompt, r.num_prompt_tokens, r.num_output_tokens, t, at)
        for i, (r, t, at) in enumerate(zip(requests, targets, arrivals))
    ]
    return Workload(specs, num_dropped, {"class_mix": mix})


def _arrivals(config: WorkloadConfig) -> list[float]:
    if config.duration is not None:
        return arrivals_within(config.duration, config.request_rate, config.burstiness,
                               config.seed)  # fmt: skip
    return generated_arrivals(config.num_prompts, config.request_rate, config.burstiness,
                              config.seed)  # fmt: skip


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
