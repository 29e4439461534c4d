"""First-come-first-served baselines: vLLM v1 (recompute) and vLLM v0's swap mode."""

from __future__ import annotations

from collections.abc import Sequence

from superinfer.core.policies.base import MemoryState, SchedulingPolicy, register_policy
from superinfer.core.request import Request, RequestStatus


def by_arrival(requests: Sequence[Request]) -> list[Request]:
    return sorted(requests, key=lambda r: (r.arrival_time, r.request_id))


def last_admitted(running: Sequence[Request]) -> Request | None:
    return max(running, key=lambda r: r.admission_seq, default=None)


@register_policy("fcfs-recompute")
class FcfsRecompute(SchedulingPolicy):
    """Admit in arrival order; when memory runs out, preempt the most recently admitted
    request and drop its KV (it is recomputed when it runs again)."""

    def order_queue(
        self, waiting: Sequence[Request], swapped: Sequence[Request], now: float
    ) -> list[Request]:
        return by_arrival([*waiting, *swapped])

    def pick_victim(self, running: Sequence[Request], now: float) -> Request | None:
        return last_admitted(running)


@register_policy("fcfs-swap")
class FcfsSwap(SchedulingPolicy):
    """Like fcfs-recompute, but a victim's KV moves to the host tier (reactive swap) and
    swapped requests resume before any new one is admitted."""

    is_preempt_by_swap = True

    def order_queue(
        self, waiting: Sequence[Request], swapped: Sequence[Request], now: float
    ) -> list[Request]:
        return by_arrival(swapped) + by_arrival(waiting)

    def may_admit(self, request: Request, memory: MemoryState) -> bool:
        return request.status is RequestStatus.SWAPPED or memory.num_swapped_requests == 0

    def pick_victim(self, running: Sequence[Request], now: float) -> Request | None:
        return last_admitted(running)
