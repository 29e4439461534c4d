"""The scheduling-policy interface and its registry.

A policy only orders requests and picks victims; the scheduler's shared loop enforces
the token budget, `max_num_seqs` and memory, and does all allocation.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import ClassVar

from superinfer.core.request import Request

_REGISTRY: dict[str, type[SchedulingPolicy]] = {}


class SchedulingPolicy(ABC):
    name: ClassVar[str]
    is_preempt_by_swap: ClassVar[bool] = False  # victims go to the host tier, else recompute
    is_eager_writeback: ClassVar[bool] = False  # copy full blocks to host shadows early

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


def register_policy(name: str) -> Callable[[type[SchedulingPolicy]], type[SchedulingPolicy]]:
    def wrap(cls: type[SchedulingPolicy]) -> type[SchedulingPolicy]:
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return wrap


def available_policies() -> list[str]:
    return sorted(_REGISTRY)


def create_policy(name: str) -> SchedulingPolicy:
    try:
        return _REGISTRY[name]()
    except KeyError:
        raise ValueError(
            f"unknown scheduling policy {name!r}; choose one of {', '.join(available_policies())}"
        ) from None
