"""vLLM's priority policy: lower `priority` first, then arrival. A queued request that
does not fit preempts (by recompute) the running request of the lowest priority, when
that priority is strictly lower than its own."""

from __future__ import annotations

from collections.abc import Sequence

from superinfer.core.policies.base import SchedulingPolicy, register_policy
from superinfer.core.request import Request


def rank(request: Request) -> tuple[int, float, str]:
    return (request.priority, request.arrival_time, request.request_id)


@register_policy("priority")
class Priority(SchedulingPolicy):
    def order_running(self, running: Sequence[Request], now: float) -> list[Request]:
        return sorted(running, key=rank)

    def order_queue(
        self, waiting: Sequence[Request], swapped: Sequence[Request], now: float
    ) -> list[Request]:
        return sorted([*waiting, *swapped], key=rank)

    def pick_victim(self, running: Sequence[Request], now: float) -> Request | None:
        return max(running, key=rank, default=None)

    def pick_admission_victim(
        self, request: Request, running: Sequence[Request], now: float
    ) -> Request | None:
        victim = self.pick_victim(running, now)
        if victim is not None and victim.priority > request.priority:
            return victim
        return None
