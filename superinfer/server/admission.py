"""Admission at ingress, before a request touches the queue (slo-contract.md, Admission):

- 425 `slo_infeasible`: the end-to-end deadline passed, or the estimate (its first token,
  then a step per output token) says it cannot be met;
- 425 `slo_infeasible` too when the request binds a TTFT target (it gave one, or its class
  rejects infeasible requests) and the estimate of its first token is past that target.
  Under overload this keeps the queue to what can still start in time: requests queued
  behind a backlog would miss their TTFT anyway, and serving them late would make the
  requests after them late as well;
- 425 `slo_infeasible` (reason `tbt_infeasible`) when such a request's mean gap between
  tokens would exceed its TBT target, or its prompt would push a decoding request of its
  class or above past its TPOT budget, or the KV the admitted requests of its class and
  above will hold when done (each for the share of steps its TBT needs it on the device)
  would not fit the device pool (slo/estimate.py, `Estimator.tpot`): an admitted
  request keeps its TPOT as well as its first token, and a promise already made is not
  broken to make a new one;
- 425 `slo_infeasible` (reason `kv_infeasible`) when such a request's KV, with what every
  admitted request will hold at the same time (each growing to its final size until its
  kept promise ends it, `slo/kv_peak.py`), would not fit the device pool and half the host
  tier (up to the policy's guard; the rest is room to rotate in), less 10% for each class
  above its own that is arriving lately: room for it could only come from dropping an
  admitted request's KV for recompute, breaking a promise already made, and the classes
  above keep room to be admitted first;
- 429 `queue_full` with Retry-After: the waiting queue is full by count or by tokens.

The estimate is `slo/estimate.py`'s (queue ahead in class order, prefill, the wait for
device KV memory), scaled by what it learned from the TTFT each admitted request measured
against its estimate (`observe`). Readiness (503) and input validation (400) are checked
before this.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

from superinfer.server.errors import APIError
from superinfer.slo.estimate import (
    Correction,
    EngineLoad,
    Estimator,
    FirstTokenEstimate,
    TokenRate,
    TpotEstimate,
    kv_holds,
)

logger = logging.getLogger(__name__)

Load = EngineLoad  # what admission reads about the engine (`slo/estimate.py`)
# The share of a TPOT budget admission plans to use: the step-time average and the prefill
# cost are averages, and a step's time varies around them.
TPOT_HEADROOM = 0.9


@dataclass(frozen=True)
class Demand:
    """One request as admission sees it (times on the engine clock, seconds)."""

    num_prompt_tokens: int
    max_tokens: int = 1  # output tokens the deadline check assumes
    slo_class: str | None = None
    ttft_deadline: float = math.inf  # arrival + its TTFT target (its place in the queue)
    elapsed_s: float = 0.0  # spent since arrival, before admission
    tbt_s: float | None = None  # its TBT target (None: not checked)
    promised_tbt_s: float = 0.0  # its TBT target, checked or not (0: none)
    num_cached_tokens: int = 0  # its prompt's prefix the device's prefix cache holds


@dataclass
class Admission:
    max_num_queued_reqs: int
    max_num_queued_tokens: int
    class_order: tuple[str, ...] = ()
    correction: Correction = field(default_factory=Correction)

    def __post_init__(self) -> None:
        self.estimator = Estimator(self.class_order)
        if not self.correction.class_order:  # a class borrows from the classes above it
            self.correction.class_order = tuple(self.class_order)
        self.offered = TokenRate()  # the classes asking lately, admitted or not

    # --- estimates ------------------------------------------------------------------------
    def estimate(self, load: Load, demand: Demand) -> FirstTokenEstimate:
        """The raw estimate of `demand`'s first token, from now."""
        return self.estimator.first_token(load, demand.num_prompt_tokens, demand.slo_class,
                                          demand.ttft_deadline, demand.num_cached_tokens)  # fmt: skip

    def tpot(self, load: Load, demand: Demand) -> TpotEstimate:
        """`demand`'s mean gap between tokens, and the promises its prompt would break."""
        return self.estimator.tpot(
            load, demand.num_prompt_tokens, demand.max_tokens, demand.slo_class,
            demand.ttft_deadline, demand.tbt_s or 0.0, TPOT_HEADROOM, demand.num_cached_tokens,
        )  # fmt: skip

    def expected_ttft_s(self, demand: Demand, estimate: FirstTokenEstimate) -> float:
        """Seconds from now to the first token as the learned correction expects it."""
        return estimate.expected_s(
            lambda raw_s: self.correction.corrected_s(demand.slo_class, raw_s)
        )

    def observe(self, slo_class: str | None, raw_estimate_s: float, measured_s: float) -> None:
        """An admitted request's first token came `measured_s` after admission; its raw
        estimate was `raw_estimate_s`."""
        self.correction.observe(slo_class, raw_estimate_s, measured_s)

    # --- checks ---------------------------------------------------------------------------
    def check(
        self,
        load: Load,
        demand: Demand,
        max_latency_ms: float | None = None,
        is_reject_infeasible: bool = True,
        binding_ttft_ms: float | None = None,
    ) -> FirstTokenEstimate:
        """Raise APIError 425 or 429, or return the estimate of a request that may enter
        the queue. `binding_ttft_ms`: the TTFT target the request is refused against;
        `demand.tbt_s`, the TBT target."""
        self.offered.add(load.now, demand.slo_class, demand.num_prompt_tokens)
        estimate = self.estimate(load, demand)
        ttft_s = self.expected_ttft_s(demand, estimate)
        try:
            if max_latency_ms is not None:
                self._check_deadline(load, demand, ttft_s, max_latency_ms, is_reject_infeasible)
            self._check_queue(load, demand)
            if binding_ttft_ms is not None and is_reject_infeasible:
                self._check_first_token(ttft_s, binding_ttft_ms, demand.elapsed_s)
                self._check_kv(load, demand)
            if demand.tbt_s is not None and is_reject_infeasible:
                self._check_tpot(self.tpot(load, demand), demand.tbt_s, load.num_device_blocks)
        except APIError as error:  # the refusal reports the estimate (errors.py)
            error.estimated_ttft_ms = estimated_ttft_ms(demand, ttft_s)
            logger.debug("refused (%s): %d prompt tokens, class %s; first token: compute "
                         "%.0f ms + memory or seat %.0f ms, x%.2f for classes above, x%.2f learned; %s",
                         error.reason, demand.num_prompt_tokens, demand.slo_class,
                         estimate.compute_s * 1e3, estimate.memory_s * 1e3, estimate.stretch,
                         ttft_s / max(estimate.raw_s, 1e-9), error.message)  # fmt: skip
            raise
        return estimate

    @staticmethod
    def _check_first_token(ttft_s: float, ttft_ms: float, elapsed_s: float) -> None:
        budget_s = ttft_ms / 1000.0 - elapsed_s
        if ttft_s > budget_s:
            raise APIError(
                425,
                f"the TTFT target cannot be met: the first token is estimated in "
                f"{ttft_s * 1000:.0f} ms, {max(0.0, budget_s) * 1000:.0f} ms are left",
                "slo_infeasible", reason="ttft_infeasible",
            )  # fmt: skip

    def _check_kv(self, load: Load, demand: Demand) -> None:
        if not load.num_device_blocks:  # the pool's size is not known
            return
        num_committed, num_capacity = self.estimator.kv_commitment(
            load, demand.num_prompt_tokens, demand.max_tokens, demand.slo_class,
            self.offered.rates(load.now), demand.promised_tbt_s, demand.ttft_deadline,
        )  # fmt: skip
        if num_committed > num_capacity:
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug("KV check of a %s request: %s", demand.slo_class, kv_parts(load))
            raise APIError(
                425,
                f"the KV cache is committed: the admitted requests and this one would hold "
                f"{num_committed} KV blocks at once, the device and host tiers hold "
                f"{num_capacity} for its class",
                "slo_infeasible", reason="kv_infeasible",
            )  # fmt: skip

    @staticmethod
    def _check_tpot(estimate: TpotEstimate, tbt_s: float, num_device_blocks: int) -> None:
        if estimate.tpot_s > TPOT_HEADROOM * tbt_s:
            raise APIError(
                425,
                f"the TBT target cannot be met: a token is estimated every "
                f"{estimate.tpot_s * 1000:.0f} ms, the target is {tbt_s * 1000:.0f} ms",
                "slo_infeasible", reason="tbt_infeasible",
            )  # fmt: skip
        if estimate.num_broken:
            raise APIError(
                425,
                f"admitting this prompt would make {estimate.num_broken} running request(s) "
                "miss the TBT target they were admitted with",
                "slo_infeasible", reason="tbt_infeasible",
            )  # fmt: skip
        if num_device_blocks and estimate.num_committed_blocks > num_device_blocks:
            raise APIError(
                425,
                f"the TBT target cannot be kept: with this request the admitted requests "
                f"would need {estimate.num_committed_blocks:.0f} of the "
                f"{num_device_blocks} device KV blocks on the device at once (each for the "
                "share of steps its TBT target needs it there)",
                "slo_infeasible", reason="tbt_infeasible",
            )  # fmt: skip

    def _check_deadline(
        self,
        load: Load,
        demand: Demand,
        ttft_s: float,
        max_latency_ms: float,
        is_reject_infeasible: bool,
    ) -> None:
        budget_s = max_latency_ms / 1000.0 - demand.elapsed_s
        if budget_s <= 0:
            raise APIError(
                425, "the deadline passed before the request was admitted", "slo_infeasible",
                reason="deadline_passed",
            )  # fmt: skip
        estimate_s = self.estimator.finish_s(load, ttft_s, demand.max_tokens)
        if is_reject_infeasible and estimate_s > budget_s:
            raise APIError(
                425,
                f"the deadline cannot be met: the estimate is {estimate_s * 1000:.0f} ms, "
                f"{budget_s * 1000:.0f} ms are left",
                "slo_infeasible", reason="deadline_infeasible",
            )  # fmt: skip

    def _check_queue(self, load: Load, demand: Demand) -> None:
        """The queue of this request's class and those above it is full: lower classes
        waiting never make a higher one wait outside (each class can fill the bounds)."""
        ahead = self.estimator.queue_ahead(load, demand.slo_class, math.inf)
        num_queued, num_tokens = len(ahead), sum(q.num_tokens for q in ahead)
        is_full = num_queued + 1 > self.max_num_queued_reqs
        if num_queued:  # a lone request is never too big for an empty queue
            is_full |= num_tokens + demand.num_prompt_tokens > self.max_num_queued_tokens
        if is_full:
            raise APIError(
                429,
                f"the queue is full ({num_queued} requests, {num_tokens} tokens waiting at "
                "this class or above); retry later",
                "queue_full",
                headers={"Retry-After": str(retry_after_s(load))},
            )


def kv_parts(load: Load) -> str:
    """What the KV check counted, by part, for the debug log: blocks the decoding requests
    hold now and will at their final sizes, by class; how many of them a kept promise
    frees within 5 s; the queued prompts; the tiers."""

    def blocks(num_tokens: int) -> int:
        return math.ceil(num_tokens / max(1, load.block_size))

    now: dict[str | None, int] = {}
    final: dict[str | None, int] = {}
    for d in load.decoding:
        now[d.slo_class] = now.get(d.slo_class, 0) + blocks(d.num_final_tokens - d.num_remaining)
        final[d.slo_class] = final.get(d.slo_class, 0) + blocks(d.num_final_tokens)
    num_soon = sum(1 for h in kv_holds(load, ()) if h.finish_s <= 5.0)
    num_queued = sum(blocks(q.num_tokens) for q in load.queued)
    return (f"decoding {len(load.decoding)} hold {now} now, {final} when done, {num_soon} "
            f"freed within 5 s; {load.num_queued} queued hold {num_queued}; device "
            f"{load.num_device_blocks} ({load.num_free_device_blocks} free), host "
            f"{load.num_host_blocks} ({load.num_free_host_blocks} free)")  # fmt: skip


def estimated_ttft_ms(demand: Demand, expected_ttft_s: float) -> float:
    """The first token as admission expects it, in ms from the request's arrival (what
    responses and refusals report, comparable to the TTFT target)."""
    return (demand.elapsed_s + expected_ttft_s) * 1000.0


def retry_after_s(load: Load) -> int:
    """Whole seconds until the queue has likely drained by a request's worth, 1 to 60."""
    drain_s = load.num_queued_tokens * load.prefill_s_per_token + load.step_time_s
    return int(min(60, max(1, math.ceil(drain_s))))
