"""The scheduling-policy interface and its registry.

A policy only orders requests and picks victims; the scheduler's shared loop enforces
the token budget, `max_num_seqs` and memory, and does all allocation.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from superinfer.config import SchedulerConfig
from superinfer.core.request import Request

_REGISTRY: dict[str, type[SchedulingPolicy]] = {}


@dataclass(frozen=True)
class MemoryState:
    """What the loop tells a policy about memory at the start of a step."""

    num_device_blocks: int
    num_free_device_blocks: int  # free now or once in-flight copies land
    num_demand_blocks: int  # blocks all unfinished requests need for their next token
    host_usage: float  # fraction of host blocks in use, reclaimable shadows not counted
    num_swapped_requests: int = 0


class SchedulingPolicy(ABC):
    name: ClassVar[str]
    is_preempt_by_swap: ClassVar[bool] = False  # victims go to the host tier, else recompute
    # host-tier usage past which brand-new requests wait (1: never); admission's estimate
    # counts that wait too (slo/estimate.py). A policy's other host guards lie at or above
    # it: below it MemoryState.host_usage is the raw usage (reclaimable shadows are only
    # counted past it, Scheduler.memory_state).
    host_admission_guard: ClassVar[float] = 1.0
    is_eager_writeback: ClassVar[bool] = False  # copy full blocks to host shadows early
    # waiting requests are admitted earliest next deadline first (as VLT and slack orders
    # do), so a newcomer waits only for those due before it; else for the whole queue
    is_queue_by_deadline: ClassVar[bool] = False

    def __init__(self, config: SchedulerConfig | None = None) -> None:
        self.config = config or SchedulerConfig()

    def order_running(self, running: Sequence[Request], now: float) -> list[Request]:
        """Order in which running requests get this step's tokens (default: admission)."""
        return sorted(running, key=lambda r: r.admission_seq)

    @abstractmethod
    def order_queue(
        self, waiting: Sequence[Request], swapped: Sequence[Request], now: float
    ) -> list[Request]:
        """Admission order over waiting and swapped requests; the loop stops at the first
        one that does not fit."""

    @abstractmethod
    def pick_victim(self, running: Sequence[Request], now: float) -> Request | None:
        """The running request to preempt when memory runs short (None: none eligible)."""

    def pick_admission_victim(
        self, request: Request, running: Sequence[Request], now: float
    ) -> Request | None:
        """A running request that queued `request` may displace when it does not fit
        (None, the default: it waits)."""
        return None

    def may_admit(self, request: Request, memory: MemoryState) -> bool:
        """False holds `request` back this step while others may still be admitted."""
        return True

    def rotation_target(self, memory: MemoryState) -> int:
        """Free device blocks to reach by rotating victims to the host tier before anything
        else is scheduled (proactive rotation); 0, the default, rotates nothing."""
        return 0


def register_policy(name: str) -> Callable[[type[SchedulingPolicy]], type[SchedulingPolicy]]:
    def wrap(cls: type[SchedulingPolicy]) -> type[SchedulingPolicy]:
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return wrap


def available_policies() -> list[str]:
    return sorted(_REGISTRY)


def create_policy(name: str, config: SchedulerConfig | None = None) -> SchedulingPolicy:
    try:
        return _REGISTRY[name](config)
    except KeyError:
        raise ValueError(
            f"unknown scheduling policy {name!r}; choose one of {', '.join(available_policies())}"
        ) from None
