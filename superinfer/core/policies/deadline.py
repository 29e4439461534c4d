"""Deadline-driven policies. A request's deadline is its TTFT deadline until its first
token, then the previous token's time plus its TBT target.

- edf: earliest deadline first; no urgency-driven preemption (when memory runs out, the
  request with the latest deadline is preempted by recompute).
- ddps: deadline-driven preemptive scheduling. Urgency exp(-slack / (scale * target))
  rises slowly while slack is large and steeply near zero, scaled by each request's own
  target. A queued request displaces the least urgent running one when its urgency is
  `ddps_margin` times larger and the running one has generated `min_residency_tokens`
  since it (re)started (hysteresis). Displaced requests keep their KV in the host tier.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from superinfer.core.policies.base import SchedulingPolicy, register_policy
from superinfer.core.request import Request

_MAX_EXPONENT = 50.0  # keeps exp() finite far past a deadline


def by_deadline(requests: Sequence[Request]) -> list[Request]:
    return sorted(requests, key=lambda r: (r.next_deadline(), r.arrival_time))


@register_policy("edf")
class EarliestDeadlineFirst(SchedulingPolicy):
    is_queue_by_deadline = True

    def order_running(self, running: Sequence[Request], now: float) -> list[Request]:
        return by_deadline(running)

    def order_queue(
        self, waiting: Sequence[Request], swapped: Sequence[Request], now: float
    ) -> list[Request]:
        return by_deadline([*waiting, *swapped])

    def pick_victim(self, running: Sequence[Request], now: float) -> Request | None:
        return max(running, key=lambda r: (r.next_deadline(), r.arrival_time), default=None)


@register_policy("ddps")
class DeadlineDrivenPreemptive(SchedulingPolicy):
    is_queue_by_deadline = True
    is_preempt_by_swap = True
    is_eager_writeback = True

    def urgency(self, request: Request, now: float) -> float:
        slack = request.next_deadline() - now
        scale = self.config.ddps_slack_scale * request.target_for_next_token()
        return math.exp(min(-slack / scale, _MAX_EXPONENT))

    def order_running(self, running: Sequence[Request], now: float) -> list[Request]:
        return sorted(running, key=lambda r: -self.urgency(r, now))

    def order_queue(
        self, waiting: Sequence[Request], swapped: Sequence[Request], now: float
    ) -> list[Request]:
        return sorted([*waiting, *swapped], key=lambda r: (-self.urgency(r, now), r.arrival_time))

    def _displaceable(self, running: Sequence[Request]) -> list[Request]:
        return [
            r for r in running
            if r.is_prefill_done and r.num_tokens_this_residency >= self.config.min_residency_tokens
        ]  # fmt: skip

    def pick_victim(self, running: Sequence[Request], now: float) -> Request | None:
        candidates = self._displaceable(running) or [r for r in running if r.is_prefill_done]
        return min(candidates, key=lambda r: self.urgency(r, now), default=None)

    def pick_admission_victim(
        self, request: Request, running: Sequence[Request], now: float
    ) -> Request | None:
        victim = min(self._displaceable(running), key=lambda r: self.urgency(r, now), default=None)
        if victim is None:
            return None
        if self.urgency(request, now) > self.config.ddps_margin * self.urgency(victim, now):
            return victim
        return None
