"""Stamp each HTTP request's arrival before anything else reads it (the body included).

A raw ASGI wrapper, so the stamp is taken when the request line and headers arrive, on
the engine's monotonic clock, together with the wall clock for reports and absolute
deadlines.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ARRIVAL_KEY = "superinfer.arrival"
# set by superinfer's router on the requests it forwards: the time they spent there, so a
# replica's clock starts at the router's arrival (only ever earlier, so only ever stricter)
ELAPSED_HEADER = "x-superinfer-elapsed-ms"
_ELAPSED_KEY = ELAPSED_HEADER.encode()
MAX_ELAPSED_S = 60.0


@dataclass(frozen=True)
class Arrival:
    monotonic: float  # the engine's clock (time.monotonic), seconds
    wall: float  # Unix time, seconds

    def to_wall(self, monotonic: float) -> float:
        """Convert a time on the engine's clock to Unix time."""
        return self.wall + (monotonic - self.monotonic)


class IngressStamp:
    """ASGI middleware: puts an `Arrival` in `scope["state"]` of every HTTP request."""

    def __init__(
        self, app: Callable[..., Any], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.app = app
        self.clock = clock

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            elapsed_s = _elapsed_s(scope["headers"])
            arrival = Arrival(self.clock() - elapsed_s, time.time() - elapsed_s)
            scope.setdefault("state", {})[ARRIVAL_KEY] = arrival
        await self.app(scope, receive, send)


def arrival_of(scope: dict[str, Any]) -> Arrival:
    """The stamp `IngressStamp` left (now, if the request bypassed it)."""
    arrival = scope.get("state", {}).get(ARRIVAL_KEY)
    return arrival if arrival is not None else Arrival(time.monotonic(), time.time())


def _elapsed_s(headers: list[tuple[bytes, bytes]]) -> float:
    """The router's elapsed time in `headers`, clipped to [0, MAX_ELAPSED_S]; else 0."""
    for key, value in headers:
        if key == _ELAPSED_KEY:
            try:
                return min(MAX_ELAPSED_S, max(0.0, float(value) / 1000))
            except ValueError:
                return 0.0
    return 0.0
