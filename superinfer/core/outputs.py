"""Plain data exchanged between the scheduler and the model runner (no tensors)."""

from __future__ import annotations

from dataclasses import dataclass, field

from superinfer.core.kv.transfer import TransferSpec
from superinfer.sampling_params import SamplingParams


@dataclass
class ScheduledSequence:
    """One request's share of a step: compute the KV of `token_ids`, which sit at positions
    `num_context_tokens ..`; sample a next token when `is_sampling`."""

    request_id: str
    token_ids: list[int]
    num_context_tokens: int  # tokens whose KV is already in the device tier
    block_table: list[int]
    is_sampling: bool
    sampling_params: SamplingParams
    num_output_tokens: int  # generated so far (for min_tokens)
    prompt_token_ids: list[int] | None = None  # set on a request's first step (penalties, seeds)

    @property
    def num_query_tokens(self) -> int:
        return len(self.token_ids)


@dataclass
class SchedulerOutput:
    step_id: int
    sequences: list[ScheduledSequence]
    transfers: list[TransferSpec] = field(default_factory=list)
    swap_in_transfer_ids: list[int] = field(default_factory=list)  # finish before the forward
    finished_request_ids: list[str] = field(default_factory=list)  # since the last step
    preempted_request_ids: list[str] = field(default_factory=list)
    swapped_out_request_ids: list[str] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(seq.num_query_tokens for seq in self.sequences)

    @property
    def is_empty(self) -> bool:
        return not self.sequences


@dataclass
class TokenLogprobs:
    """Log-probabilities at one position: the chosen (sampled or prompt) token's, its rank
    among all tokens (1: the most likely), and the `top` most likely, best first."""

    token_id: int
    logprob: float
    rank: int
    top: list[tuple[int, float]] = field(default_factory=list)  # (token id, logprob)


@dataclass
class ModelOutput:
    """The runner's answer: the sampled token of every sequence with `is_sampling`; for
    requests that asked, the log-probabilities of that token and (with the first token)
    of their prompt, position 0 without one."""

    sampled_token_ids: dict[str, int]
    logprobs: dict[str, TokenLogprobs] = field(default_factory=dict)
    prompt_logprobs: dict[str, list[TokenLogprobs | None]] = field(default_factory=dict)


@dataclass
class RequestUpdate:
    """What changed for one request in a step, for the engine's output processing."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None  # "stop" / "length" / "abort" once finished
    stop_reason: int | str | None = None
