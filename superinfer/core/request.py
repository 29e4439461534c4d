"""A request's scheduling state: its tokens, progress, status and timestamps.

There is no prefill or decode phase: `num_computed_tokens` (tokens whose KV is in the
cache) catches up with `num_tokens` (prompt + output so far). When it has caught up the
model samples the next token. Everything derivable is a property.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from superinfer.sampling_params import SamplingParams
from superinfer.slo import SLOTargets

PLACEHOLDER = -1  # an output token whose value is still being sampled (pipelined steps)


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # never ran, or preempted by recompute (KV dropped)
    RUNNING = "running"  # KV in the device tier
    SWAPPED = "swapped"  # KV parked in the host tier (rotary)
    FINISHED_STOPPED = "finished_stopped"  # eos, stop token or stop string
    FINISHED_LENGTH = "finished_length"  # max_tokens or max model length
    FINISHED_ABORTED = "finished_aborted"

    @property
    def is_finished(self) -> bool:
        return self.value.startswith("finished")

    @property
    def finish_reason(self) -> str | None:
        return {
            RequestStatus.FINISHED_STOPPED: "stop",
            RequestStatus.FINISHED_LENGTH: "length",
            RequestStatus.FINISHED_ABORTED: "abort",
        }.get(self)


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float
    eos_token_ids: tuple[int, ...] = ()
    priority: int = 0  # lower is served earlier (vLLM's convention)
    slo: SLOTargets = field(default_factory=SLOTargets)

    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_prompt_tokens: int = 0  # prefix-cache hit at first admission
    stop_reason: int | str | None = None

    # timestamps (the caller's clock)
    first_scheduled_time: float | None = None
    output_token_times: list[float] = field(default_factory=list)
    running_since: float | None = None  # start of the current residency in the device tier
    finished_time: float | None = None

    num_preemptions: int = 0  # recompute preemptions
    num_swap_outs: int = 0  # rotations to the host tier
    admission_seq: int = -1  # order of the latest admission to the running set
    num_output_tokens_at_admission: int = 0  # outputs when it last (re)entered the running set

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError(f"request {self.request_id}: the prompt must have at least 1 token")

    # --- derived counts -------------------------------------------------------------------
    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def is_prefill_done(self) -> bool:
        """True once the whole prompt is computed (the request decodes from here on)."""
        return self.num_computed_tokens >= self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def num_tokens_this_residency(self) -> int:
        """Tokens generated since the request last entered the running set."""
        return self.num_output_tokens - self.num_output_tokens_at_admission

    def next_deadline(self) -> float:
        """When its next token is due: the TTFT deadline before the first token, then the
        previous token's time plus the TBT target."""
        if self.last_token_time is None:
            return self.arrival_time + self.slo.ttft_s
        return self.last_token_time + self.slo.tbt_s

    def target_for_next_token(self) -> float:
        """The SLO (seconds) that governs the next token: TTFT first, TBT afterwards."""
        return self.slo.ttft_s if self.last_token_time is None else self.slo.tbt_s

    @property
    def first_token_time(self) -> float | None:
        return self.output_token_times[0] if self.output_token_times else None

    @property
    def last_token_time(self) -> float | None:
        return self.output_token_times[-1] if self.output_token_times else None

    def token_id_at(self, index: int) -> int:
        if index < self.num_prompt_tokens:
            return self.prompt_token_ids[index]
        return self.output_token_ids[index - self.num_prompt_tokens]

    def token_ids_slice(self, start: int, stop: int) -> list[int]:
        num_prompt = self.num_prompt_tokens
        if stop <= num_prompt:
            return self.prompt_token_ids[start:stop]
        if start >= num_prompt:
            return self.output_token_ids[start - num_prompt : stop - num_prompt]
        return self.prompt_token_ids[start:] + self.output_token_ids[: stop - num_prompt]
