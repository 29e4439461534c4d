"""RotaSched: SLO-aware rotation of requests between the device and host KV tiers.

Virtual Lag Time (VLT) says how close a request is to breaking its SLO (seconds):

    waiting, no token yet:        (now - arrival)          - ttft target
    queued after a first token:   (now - last token time)  - tbt target
    running:                      -(now - running since)     (its time in this slice)

Waiting and rotary requests compete in ONE queue, largest VLT first. Victims are running
requests in the decode phase with the smallest VLT (the longest resident). When the KV
demand of all requests exceeds the device pool and free blocks fall below the rotation
budget, victims are rotated out before an allocation fails, so an urgent admission never
waits for a swap. Guards: no proactive rotation while the host tier is >= 95% used, no
brand-new admissions while it is > 90% used; with the host full, preemption falls back to
recompute (the scheduler's fallback).
"""

from __future__ import annotations

from collections.abc import Sequence

from superinfer.core.policies.base import MemoryState, SchedulingPolicy, register_policy
from superinfer.core.request import Request, RequestStatus

HOST_ROTATION_GUARD = 0.95
HOST_ADMISSION_GUARD = 0.90
DEFAULT_BUDGET_FRACTION = 0.05


def virtual_lag_time(request: Request, now: float) -> float:
    if request.status is RequestStatus.RUNNING:
        return -(now - (request.running_since if request.running_since is not None else now))
    if request.last_token_time is None:
        return (now - request.arrival_time) - request.slo.ttft_s
    return (now - request.last_token_time) - request.slo.tbt_s


@register_policy("rotasched")
class RotaSched(SchedulingPolicy):
    is_queue_by_deadline = True
    is_preempt_by_swap = True
    is_eager_writeback = True
    host_admission_guard = HOST_ADMISSION_GUARD

    def order_queue(
        self, waiting: Sequence[Request], swapped: Sequence[Request], now: float
    ) -> list[Request]:
        queue = [*waiting, *swapped]
        return sorted(queue, key=lambda r: (-virtual_lag_time(r, now), r.arrival_time))

    def pick_victim(self, running: Sequence[Request], now: float) -> Request | None:
        decoding = [r for r in running if r.is_prefill_done]
        return min(decoding, key=lambda r: virtual_lag_time(r, now), default=None)

    def may_admit(self, request: Request, memory: MemoryState) -> bool:
        is_brand_new = request.status is RequestStatus.WAITING and request.num_output_tokens == 0
        return not (is_brand_new and memory.host_usage > self.host_admission_guard)

    def rotation_target(self, memory: MemoryState) -> int:
        budget = self.rotation_budget(memory.num_device_blocks)
        is_oversubscribed = memory.num_demand_blocks > memory.num_device_blocks
        if is_oversubscribed and memory.num_free_device_blocks < budget:
            if memory.host_usage < HOST_ROTATION_GUARD:
                return budget
        return 0

    def rotation_budget(self, num_device_blocks: int) -> int:
        if self.config.rotation_budget is not None:
            return self.config.rotation_budget
        return max(1, int(num_device_blocks * DEFAULT_BUDGET_FRACTION))
