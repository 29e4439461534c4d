from __future__ import annotations

import pytest

from superinfer.sim.event_loop import EventLoop
from superinfer.sim.events import Event


class Mark(Event):
    """Records its handling order; may cause one follow-up event."""

    def __init__(self, time: float, rank: int, name: str, log: list, then: Event | None = None):
        super().__init__(time)
        self.rank, self.name, self.log, self.then = rank, name, log, then

    def handle(self, engine):
        self.log.append(self.name)
        return [self.then] if self.then else []


def test_events_run_by_time_then_rank_then_posting_order():
    log: list[str] = []
    loop = EventLoop()
    for event in (
        Mark(2.0, 0, "late", log), Mark(1.0, 4, "step", log), Mark(1.0, 1, "arrival-a", log),
        Mark(1.0, 1, "arrival-b", log), Mark(1.0, 0, "copy", log),
    ):  # fmt: skip
        loop.post(event)
    loop.run(engine=None)
    assert log == ["copy", "arrival-a", "arrival-b", "step", "late"]
    assert loop.now == 2.0 and loop.num_events == 5


def test_caused_events_join_the_heap_and_until_stops_early():
    log: list[str] = []
    loop = EventLoop()
    loop.post(Mark(1.0, 0, "first", log, then=Mark(3.0, 0, "caused", log)))
    loop.post(Mark(2.0, 0, "second", log))
    loop.run(engine=None, until=2.5)
    assert log == ["first", "second"] and not loop.is_empty
    loop.run(engine=None)
    assert log == ["first", "second", "caused"]


def test_an_event_in_the_past_is_refused():
    loop = EventLoop()
    loop.post(Mark(5.0, 0, "x", []))
    loop.run(engine=None)
    with pytest.raises(ValueError, match="past"):
        loop.post(Mark(4.0, 0, "y", []))
