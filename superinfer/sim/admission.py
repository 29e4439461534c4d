"""Admission in the simulator: the server's own `Admission` (slo/estimate.py's estimate,
its learned correction, the 425 and 429 rules) over the load the simulated engine would
publish, so a simulated run refuses what `superinfer serve` would and its results carry
the same precision.

What the real server measures, the simulated one takes from its own clock and predictor:
the step time is the same moving average of steps that produced tokens, the prefill cost
starts from the predictor's for a whole 512-token prompt (the warm-up times one) and is
learned from the simulated steps as the server learns it from its own, the release rate
counts device blocks freed by ended requests over the same 20 s window, and each admitted
request's first token teaches the correction as it does in the server.
"""

from __future__ import annotations

from dataclasses import replace

from superinfer.core.outputs import SchedulerOutput
from superinfer.core.request import Request
from superinfer.core.scheduler import Scheduler
from superinfer.core.step_time import BatchShape, StepTimePredictor, step_seconds
from superinfer.engine.snapshot import (
    decode_row_cost,
    decoding_requests,
    queued_request,
    requests_by_class,
    swapped_blocks_by_class,
)
from superinfer.server.admission import Admission, Demand, Load
from superinfer.server.errors import APIError
from superinfer.slo.classes import SLOConfig
from superinfer.slo.estimate import (
    DrainRate,
    PrefillCost,
    ReleaseRate,
    TokenRate,
    num_pinned_host_blocks,
)

_EMA_WEIGHT = 0.2  # as the async engine's step-time average
_RELEASE_WINDOW_S = 20.0
_PREFILL_PROBE_TOKENS = 512


class SimAdmission:
    """Decides at each arrival; learns from each first token."""

    def __init__(self, slo: SLOConfig, predictor: StepTimePredictor, max_num_queued_reqs: int,
                 max_num_queued_tokens: int, is_reject_infeasible_tbt: bool = True,
                 ) -> None:  # fmt: skip
        self.slo = slo
        self.is_reject_infeasible_tbt = is_reject_infeasible_tbt  # as the server's flag
        self.admission = Admission(max_num_queued_reqs, max_num_queued_tokens, slo.class_names)
        num = _PREFILL_PROBE_TOKENS
        prefill = BatchShape(1, num, 0, 1, num * (num + 1) / 2, 0, 0)
        # the server's warm-up seeds: a prompt in one step, a long one's second chunk
        second = BatchShape(1, num, 0, 1, num * (num + (num + 1) / 2), 0, num)
        seeds = [(s.num_prefill_tokens, s.num_prefill_pairs, step_seconds(predictor, s))
                 for s in (prefill, second)]  # fmt: skip
        self.prefill_cost = PrefillCost(step_seconds(predictor, prefill) / num, seeds=seeds)
        self.idle_step_s = step_seconds(predictor, BatchShape(1, 0, 1, 1, 0.0, 1, 0))
        self.step_time_s = 0.0
        self.decode_step_s = 0.0  # the same average over steps without prefill tokens
        self.admitted_tokens = TokenRate(_RELEASE_WINDOW_S)
        self.admitted_requests = TokenRate(_RELEASE_WINDOW_S)
        self.release_rate = ReleaseRate(_RELEASE_WINDOW_S)
        self.release_blocks_per_s = 0.0
        self.finish_rate = ReleaseRate(_RELEASE_WINDOW_S)  # seats freed by finishing requests
        self.finished_per_s = 0.0
        self.host_drain = DrainRate(_RELEASE_WINDOW_S)
        self.host_drain_blocks_per_s = 0.0
        self._estimates: dict[str, tuple[Request, float]] = {}  # no first token yet: raw s
        self.reasons: dict[str, str] = {}  # refused request id -> the refusal's reason

    def admit(self, now: float, request: Request, scheduler: Scheduler,
              inbox: list[Request], step_left_s: float = 0.0) -> bool:  # fmt: skip
        """The server's checks for `request` arriving at `now` (`step_left_s` before the
        step in flight ends); False: refused."""
        targets = request.slo
        num_cached = scheduler.kv.num_cached_tokens(request.prompt_token_ids)
        demand = Demand(request.num_prompt_tokens, request.sampling_params.max_tokens or 1,
                        targets.slo_class, request.arrival_time + targets.ttft_s, 0.0,
                        targets.tbt_s if self.is_reject_infeasible_tbt else None,
                        targets.tbt_s, num_cached)  # fmt: skip
        slo_class = self.slo.get(targets.slo_class) if targets.slo_class else None
        is_reject = slo_class is None or slo_class.reject_infeasible
        try:
            estimate = self.admission.check(
                replace(self.load(now, scheduler, inbox), step_left_s=step_left_s), demand,
                targets.max_latency_ms, is_reject,
                targets.ttft_ms,
            )  # fmt: skip
        except APIError as error:
            self.reasons[request.request_id] = error.code
            return False
        self.admitted_tokens.add(now, targets.slo_class, request.num_prompt_tokens)
        self.admitted_requests.add(now, targets.slo_class, 1)
        self._estimates[request.request_id] = (request, estimate.raw_s)
        return True

    def load(self, now: float, scheduler: Scheduler, inbox: list[Request]) -> Load:
        kv = scheduler.kv
        waiting = [*scheduler.waiting, *inbox]
        blocks: dict[str | None, int] = {}
        for r in scheduler.running:
            blocks[r.slo.slo_class] = blocks.get(r.slo.slo_class, 0) + kv.num_device_blocks_of(r)
        is_busy = bool(scheduler.running) and self.step_time_s > 0
        return Load(
            queued=tuple(queued_request(r, scheduler.config.max_model_len) for r in waiting),
            step_time_s=self.step_time_s if is_busy else self.idle_step_s,
            prefill_s_per_token=self.prefill_cost.per_token_s,
            prefill_s_per_pair=self.prefill_cost.per_pair_s,
            num_batched_tokens=scheduler.config.max_num_batched_tokens,
            num_shaped_batched_tokens=scheduler.num_prefill_tokens_per_step(),
            shaping_class=scheduler.shaping_class(),
            first_token_headroom=scheduler.first_token_headroom(),
            is_queue_by_deadline=scheduler.policy.is_queue_by_deadline,
            is_preempt_by_swap=scheduler.policy.is_preempt_by_swap, block_size=kv.block_size,
            num_free_device_blocks=kv.device.num_free_blocks + kv.device.num_quarantined_blocks,
            num_free_host_blocks=kv.host.num_free_blocks, running_blocks_by_class=blocks,
            num_host_blocks=kv.host.num_blocks,
            num_reclaimable_host_blocks=kv.num_reclaimable_host_blocks(
                scheduler.policy.host_admission_guard),
            host_admission_guard=scheduler.policy.host_admission_guard,
            swapped_blocks_by_class=swapped_blocks_by_class(scheduler),
            release_blocks_per_s=self.release_blocks_per_s,
            max_num_seqs=scheduler.config.max_num_seqs,
            running_by_class=requests_by_class(scheduler.running),
            swapped_by_class=requests_by_class(scheduler.swapped),
            finished_per_s=self.finished_per_s,
            host_drain_blocks_per_s=self.host_drain_blocks_per_s,
            prompt_tokens_per_s_by_class=self.admitted_tokens.rates(now),
            requests_per_s_by_class=self.admitted_requests.rates(now),
            decoding=decoding_requests(scheduler),
            decode_step_s=self.decode_step_s if is_busy else self.idle_step_s, now=now,
            num_device_blocks=kv.device.num_blocks, decode_row_s=decode_row_cost(scheduler),
        )  # fmt: skip

    def on_step(self, now: float, step_s: float, output: SchedulerOutput,
                scheduler: Scheduler) -> None:  # fmt: skip
        """A step of `step_s` ended at `now`: the step-time averages, the release window
        and the first tokens it brought."""
        if not output.is_empty:
            self.step_time_s = _average(self.step_time_s, step_s)
            shape = BatchShape.of(output)
            if shape.num_prefill_tokens == 0:
                self.decode_step_s = _average(self.decode_step_s, step_s)
            else:  # as the server's engine does (`AsyncEngine._step`)
                self.prefill_cost.observe_step(shape, step_s, self.decode_step_s)
        self.release_blocks_per_s = self.release_rate.update(
            now, scheduler.stats.num_released_blocks
        )
        self.finished_per_s = self.finish_rate.update(now, scheduler.stats.num_finished)
        kv = scheduler.kv
        num_reclaimable = kv.num_reclaimable_host_blocks(scheduler.policy.host_admission_guard)
        self.host_drain_blocks_per_s = self.host_drain.update(
            now,
            num_pinned_host_blocks(kv.host.num_blocks, kv.host.num_free_blocks, num_reclaimable),
        )
        for request_id, (request, raw_s) in list(self._estimates.items()):
            first = request.first_token_time
            if first is not None:
                self.admission.observe(request.slo.slo_class, raw_s, first - request.arrival_time)
            if first is not None or request.is_finished:
                del self._estimates[request_id]


def _average(average_s: float, step_s: float) -> float:
    return step_s if not average_s else average_s + _EMA_WEIGHT * (step_s - average_s)
