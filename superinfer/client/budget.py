"""A latency budget bound once and passed on to every sub-request, as gRPC passes deadlines.

A `Budget` is one deadline, fixed when it is bound: from a total (`Budget.of_ms(2000)`),
from an absolute deadline a parent passed on (`Budget.until(epoch_ms)`), or from the
headers of the request being served (`Budget.from_headers`). Everything after is arithmetic
on the local monotonic clock: what is left (`remaining_ms`), a share of it for a step
(`share(0.3)`), a nested budget that never outlives its parent (`child`).

What crosses processes (`headers`): the milliseconds left, measured when the call is sent
(`x-slo-max-latency`, relative to the server's arrival stamp: no clock skew), and the one
absolute deadline in Unix milliseconds (`x-slo-deadline`), the same number for every call,
fixed at binding and never re-read from the wall clock. The server holds the stricter of the
two (slo-contract.md), so a client whose wall clock runs late cannot loosen its budget by it.

A step that must not eat the rest of the budget (retrieval before the model call) runs
under a share of it with a fallback (`run_with_timeout`, `arun_with_timeout`): when the
share runs out, the caller goes on with the fallback value and the rest of the budget.

Every method takes `now` (seconds on the budget's clock) to drive the arithmetic without
sleeping; without it the budget reads its `clock` (`time.monotonic` by default).
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import math
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

from superinfer.slo.wire import HEADER_DEADLINE, HEADER_MAX_LATENCY

Clock = Callable[[], float]
T = TypeVar("T")
RETRIEVAL_SHARE = 0.3  # what retrieval gets of the remaining budget by default

_CURRENT: contextvars.ContextVar[Budget | None] = contextvars.ContextVar(
    "superinfer_budget", default=None
)


class BudgetExpired(Exception):
    """The budget ran out before the step started (raised by `check`)."""


@dataclass(frozen=True)
class Budget:
    """One deadline: `deadline` on `clock` (seconds) and the same instant in Unix ms.
    `send_deadline=False`: calls carry only the relative budget, as gRPC's `grpc-timeout`
    (for a client whose wall clock runs behind the servers')."""

    deadline: float
    deadline_epoch_ms: float
    clock: Clock = field(default=time.monotonic, compare=False, repr=False)
    send_deadline: bool = True

    # --- binding --------------------------------------------------------------------------
    @classmethod
    def of_ms(
        cls,
        total_ms: float,
        now: float | None = None,
        wall: float | None = None,
        clock: Clock = time.monotonic,
    ) -> Budget:
        """`total_ms` from now. `wall`: Unix seconds at `now` (default: `time.time()`)."""
        if not math.isfinite(total_ms) or total_ms <= 0:
            raise ValueError(f"a budget must be a positive number of ms, got {total_ms}")
        now = clock() if now is None else now
        wall = time.time() if wall is None else wall
        return cls(now + total_ms / 1000.0, wall * 1000.0 + total_ms, clock)

    @classmethod
    def until(
        cls,
        deadline_epoch_ms: float,
        now: float | None = None,
        wall: float | None = None,
        clock: Clock = time.monotonic,
    ) -> Budget:
        """Up to an absolute deadline (Unix ms) a parent passed on; it is passed on as is."""
        now = clock() if now is None else now
        wall = time.time() if wall is None else wall
        return cls(now + (deadline_epoch_ms - wall * 1000.0) / 1000.0, deadline_epoch_ms, clock)

    @classmethod
    def from_headers(
        cls,
        headers: Mapping[str, str],
        now: float | None = None,
        wall: float | None = None,
        clock: Clock = time.monotonic,
    ) -> Budget | None:
        """The budget of a request being served, from its `x-slo-*` headers: the stricter
        of the relative and the absolute one (the server's rule); None without either."""
        now = clock() if now is None else now
        wall = time.time() if wall is None else wall
        given = []
        if (relative := headers.get(HEADER_MAX_LATENCY)) is not None:
            given.append(cls.of_ms(float(relative), now, wall, clock))
        if (absolute := headers.get(HEADER_DEADLINE)) is not None:
            given.append(cls.until(float(absolute), now, wall, clock))
        return min(given, key=lambda budget: budget.deadline) if given else None

    # --- arithmetic -----------------------------------------------------------------------
    def _now(self, now: float | None) -> float:
        return self.clock() if now is None else now

    def remaining_ms(self, now: float | None = None) -> float:
        """Milliseconds left, 0 once expired."""
        return max(0.0, (self.deadline - self._now(now)) * 1000.0)

    def remaining_s(self, now: float | None = None) -> float:
        return self.remaining_ms(now) / 1000.0

    def is_expired(self, now: float | None = None) -> bool:
        return self._now(now) >= self.deadline

    def check(self, now: float | None = None) -> None:
        """Raise `BudgetExpired` if nothing is left (before starting a step)."""
        if self.is_expired(now):
            raise BudgetExpired(f"the budget expired {self._now(now) - self.deadline:.3f} s ago")

    def child(self, max_ms: float | None = None, now: float | None = None) -> Budget:
        """A nested budget: at most `max_ms` from now, and never past this one's deadline."""
        now = self._now(now)
        deadline = self.deadline if max_ms is None else min(self.deadline, now + max_ms / 1000.0)
        return self._at(deadline)

    def share(self, fraction: float = RETRIEVAL_SHARE, now: float | None = None) -> Budget:
        """A nested budget of `fraction` (0 to 1] of what is left now."""
        if not 0 < fraction <= 1:
            raise ValueError(f"a share must lie in (0, 1], got {fraction}")
        now = self._now(now)
        return self._at(now + max(0.0, self.deadline - now) * fraction)

    def _at(self, deadline: float) -> Budget:
        """The same clock and absolute time frame, another deadline (no wall clock read)."""
        epoch_ms = self.deadline_epoch_ms - (self.deadline - deadline) * 1000.0
        return Budget(deadline, epoch_ms, self.clock, self.send_deadline)

    # --- propagation ----------------------------------------------------------------------
    def headers(self, now: float | None = None) -> dict[str, str]:
        """The `x-slo-*` headers of a call sent now (module docstring)."""
        left_ms = max(1, math.floor(self.remaining_ms(now)))  # expired: 1 ms, the server's 425
        headers = {HEADER_MAX_LATENCY: str(left_ms)}
        if self.send_deadline:
            headers[HEADER_DEADLINE] = f"{self.deadline_epoch_ms:.0f}"
        return headers

    def relative_only(self) -> Budget:
        """This budget, its calls carrying only the milliseconds left (`send_deadline`)."""
        return dataclasses.replace(self, send_deadline=False)

    @contextmanager
    def active(self) -> Iterator[Budget]:
        """Make this the current budget (`current_budget`) of the calls made inside: the
        httpx and OpenAI clients of `superinfer.client.propagation` send its headers."""
        token = _CURRENT.set(self)
        try:
            yield self
        finally:
            _CURRENT.reset(token)


    # --- steps with a fallback -------------------------------------------------------------
    def run_with_timeout(
        self, fn: Callable[[Budget], T], share: float = RETRIEVAL_SHARE, fallback: T | None = None
    ) -> T | None:
        """`fn(step)` under `share` of what is left (`step`, active while it runs), or
        `fallback` when the share runs out first, or is out already (`fn` is not called).
        `fn` runs on a worker thread that is left to finish on its own (Python cannot stop
        a thread): give it the step's `remaining_s()` as its own timeout where it takes one.
        Exceptions from `fn` propagate."""
        step = self.share(share)
        if step.is_expired():
            return fallback
        context = contextvars.copy_context()
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="superinfer-step")
        try:
            future = pool.submit(context.run, _run_active, step, fn)
            return future.result(timeout=step.remaining_s())
        except FutureTimeout:
            return fallback
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    async def arun_with_timeout(
        self,
        fn: Callable[[Budget], Awaitable[T]],
        share: float = RETRIEVAL_SHARE,
        fallback: T | None = None,
    ) -> T | None:
        """The asyncio form of `run_with_timeout`: `fn(step)` is cancelled when the share
        runs out, and `fallback` returned."""
        step = self.share(share)
        if step.is_expired():
            return fallback
        with step.active():
            try:
                return await asyncio.wait_for(fn(step), step.remaining_s())
            except TimeoutError:
                return fallback


def _run_active(step: Budget, fn: Callable[[Budget], T]) -> T:
    with step.active():
        return fn(step)


def current_budget() -> Budget | None:
    """The budget made active in this context (thread, asyncio task), or None."""
    return _CURRENT.get()
