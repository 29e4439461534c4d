"""Admission at ingress, before a request touches the queue (slo-contract.md, Admission):

- 425 `slo_infeasible`: the end-to-end deadline passed, or the server's own estimate
  (queue ahead + prefill + decode at the current step time) says it cannot be met;
- 425 `slo_infeasible` too when the request binds a TTFT target (it gave one, or its class
  rejects infeasible requests) and the estimate of its first token (the prompt tokens
  queued ahead and its own, at the measured prefill cost, plus a decode step per step's
  worth of them) is past that target. Under overload this keeps the queue to what can
  still start in time: requests queued behind a backlog would miss their TTFT anyway,
  and serving them late would make the requests after them late as well;
- 429 `queue_full` with Retry-After: the waiting queue is full by count or by tokens.

Readiness (503) and input validation (400) are checked before this.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from superinfer.server.errors import APIError


@dataclass(frozen=True)
class Load:
    """What admission reads about the engine at this moment."""

    num_queued: int  # requests waiting for admission (added or about to be)
    num_queued_tokens: int  # their prompt tokens still to prefill
    step_time_s: float  # current time of one step (decode at the current batch)
    prefill_s_per_token: float  # measured prefill cost per prompt token
    num_batched_tokens: int = 512  # token budget of one step


@dataclass(frozen=True)
class Admission:
    max_num_queued_reqs: int
    max_num_queued_tokens: int

    def check(
        self,
        load: Load,
        num_prompt_tokens: int,
        max_tokens: int,
        max_latency_ms: float | None,
        elapsed_s: float,
        is_reject_infeasible: bool = True,
    ) -> None:
        """Raise APIError 425 or 429, or return if the request may enter the queue."""
        if max_latency_ms is not None:
            self._check_deadline(load, num_prompt_tokens, max_tokens, max_latency_ms, elapsed_s,
                                 is_reject_infeasible)  # fmt: skip
        self._check_queue(load, num_prompt_tokens)

    @staticmethod
    def estimate_s(load: Load, num_prompt_tokens: int, max_tokens: int) -> float:
        """Seconds from now to the last token: queue ahead + prefill + decode."""
        num_prefill = load.num_queued_tokens + num_prompt_tokens
        return num_prefill * load.prefill_s_per_token + (max_tokens - 1) * load.step_time_s

    @staticmethod
    def estimate_ttft_s(load: Load, num_prompt_tokens: int) -> float:
        """Seconds from now to the first token: the queued prompt tokens and this one's,
        at the prefill cost, plus one decode step for every step they take."""
        num_prefill = load.num_queued_tokens + num_prompt_tokens
        num_steps = -(-num_prefill // max(1, load.num_batched_tokens))
        return num_prefill * load.prefill_s_per_token + num_steps * load.step_time_s

    def check_first_token(
        self, load: Load, num_prompt_tokens: int, ttft_ms: float, elapsed_s: float
    ) -> None:
        """Raise APIError 425 if the first token cannot come within `ttft_ms` of arrival;
        `load` counts the queue that will be served before this request."""
        budget_s = ttft_ms / 1000.0 - elapsed_s
        estimate_s = self.estimate_ttft_s(load, num_prompt_tokens)
        if estimate_s > budget_s:
            raise APIError(
                425,
                f"the TTFT target cannot be met: the first token is estimated in "
                f"{estimate_s * 1000:.0f} ms, {max(0.0, budget_s) * 1000:.0f} ms are left",
                "slo_infeasible",
            )

    def _check_deadline(
        self,
        load: Load,
        num_prompt_tokens: int,
        max_tokens: int,
        max_latency_ms: float,
        elapsed_s: float,
        is_reject_infeasible: bool,
    ) -> None:
        budget_s = max_latency_ms / 1000.0 - elapsed_s
        if budget_s <= 0:
            raise APIError(
                425, "the deadline passed before the request was admitted", "slo_infeasible"
            )
        estimate_s = self.estimate_s(load, num_prompt_tokens, max_tokens)
        if is_reject_infeasible and estimate_s > budget_s:
            raise APIError(
                425,
                f"the deadline cannot be met: the estimate is {estimate_s * 1000:.0f} ms, "
                f"{budget_s * 1000:.0f} ms are left",
                "slo_infeasible",
            )

    def _check_queue(self, load: Load, num_prompt_tokens: int) -> None:
        is_full = load.num_queued + 1 > self.max_num_queued_reqs
        if load.num_queued:  # a lone request is never too big for an empty queue
            is_full |= load.num_queued_tokens + num_prompt_tokens > self.max_num_queued_tokens
        if is_full:
            raise APIError(
                429,
                f"the queue is full ({load.num_queued} requests, {load.num_queued_tokens} "
                "tokens waiting); retry later",
                "queue_full",
                headers={"Retry-After": str(retry_after_s(load))},
            )


def retry_after_s(load: Load) -> int:
    """Whole seconds until the queue has likely drained by a request's worth, 1 to 60."""
    drain_s = load.num_queued_tokens * load.prefill_s_per_token + load.step_time_s
    return int(min(60, max(1, math.ceil(drain_s))))
