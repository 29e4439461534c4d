"""Simulation events. Each is a small object whose `handle` acts at its time and returns
the events it causes. The heap orders them by (time, rank, sequence number): at equal
times, copies that finish come first, then arrivals, then the engine's own events, so an
engine step at time t sees everything that happened at t.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from superinfer.core.outputs import SchedulerOutput
    from superinfer.core.request import Request
    from superinfer.sim.engine import SimEngine


class Event:
    """Something that happens at `time` (seconds of virtual time)."""

    rank: ClassVar[int]
    __slots__ = ("time",)

    def __init__(self, time: float) -> None:
        self.time = time

    def handle(self, engine: SimEngine) -> Iterable[Event]:
        """Act on the engine at `self.time`; return the events this causes."""
        raise NotImplementedError


class TransferDone(Event):
    """A KV copy has landed."""

    rank = 0
    __slots__ = ("transfer_id",)

    def __init__(self, time: float, transfer_id: int) -> None:
        super().__init__(time)
        self.transfer_id = transfer_id

    def handle(self, engine: SimEngine) -> Iterable[Event]:
        return engine.on_transfer_done(self.time, self.transfer_id)


class Arrival(Event):
    """A request reaches the engine."""

    rank = 1
    __slots__ = ("request",)

    def __init__(self, time: float, request: Request) -> None:
        super().__init__(time)
        self.request = request

    def handle(self, engine: SimEngine) -> Iterable[Event]:
        return engine.on_arrival(self.time, self.request)


class StepDone(Event):
    """Without the pipeline: the step's forward is over; update the scheduler."""

    rank = 2
    __slots__ = ("output",)

    def __init__(self, time: float, output: SchedulerOutput) -> None:
        super().__init__(time)
        self.output = output

    def handle(self, engine: SimEngine) -> Iterable[Event]:
        return engine.finish_step(self.time, self.output)


class StepLaunch(Event):
    """With the pipeline: the previous forward was filled in at `fill_time`; launch the
    step scheduled ahead (its swap-ins have landed)."""

    rank = 3
    __slots__ = ("fill_time", "output")

    def __init__(self, time: float, output: SchedulerOutput, fill_time: float) -> None:
        super().__init__(time)
        self.output, self.fill_time = output, fill_time

    def handle(self, engine: SimEngine) -> Iterable[Event]:
        return engine.launch(self.time, self.output, self.fill_time)


class EngineStep(Event):
    """The engine's step loop comes round: take arrivals and copies, schedule."""

    rank = 4
    __slots__ = ()

    def handle(self, engine: SimEngine) -> Iterable[Event]:
        return engine.step(self.time)
