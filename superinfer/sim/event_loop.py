"""The event loop: a heap of events keyed by (time, rank, sequence number), so equal
keys never fall back to comparing objects and every run with the same inputs repeats
exactly."""

from __future__ import annotations

import heapq
import itertools
from typing import TYPE_CHECKING

from superinfer.sim.events import Event

if TYPE_CHECKING:
    from superinfer.sim.engine import SimEngine


class EventLoop:
    def __init__(self) -> None:
        self.now = 0.0
        self.num_events = 0
        self._heap: list[tuple[float, int, int, Event]] = []
        self._seq = itertools.count()

    def post(self, event: Event) -> None:
        if event.time < self.now:
            raise ValueError(
                f"event {type(event).__name__} at {event.time} is in the past ({self.now})"
            )
        heapq.heappush(self._heap, (event.time, event.rank, next(self._seq), event))

    def run(self, engine: SimEngine, until: float = float("inf")) -> None:
        """Handle events in order until none is left or the next is after `until`."""
        heap, post = self._heap, self.post
        while heap and heap[0][0] <= until:
            time, _, _, event = heapq.heappop(heap)
            self.now = time
            self.num_events += 1
            for caused in event.handle(engine):
                post(caused)

    @property
    def is_empty(self) -> bool:
        return not self._heap
