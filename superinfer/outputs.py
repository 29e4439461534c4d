"""What the offline API returns (mirrors vLLM's `RequestOutput`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from superinfer.core.outputs import TokenLogprobs
from superinfer.slo import SLOTargets


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop", "length" or "abort"
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it
    logprobs: list[TokenLogprobs] | None = None  # one per token id, when asked for
    cumulative_logprob: float | None = None  # sum of the sampled tokens' log-probabilities


@dataclass
class RequestMetrics:
    """Timestamps on the engine's clock (seconds) and counters of one request."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    num_preemptions: int = 0
    num_swap_outs: int = 0
    num_cached_prompt_tokens: int = 0
    token_times: list[float] = field(default_factory=list)  # when each output token was made
    slo: SLOTargets = field(default_factory=SLOTargets)


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics = field(default_factory=lambda: RequestMetrics(0.0))
    new_text: str = ""  # text added by this step (streaming)
    new_token_ids: list[int] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprobs | None] | None = None  # position 0 has none
