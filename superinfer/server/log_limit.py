"""Rate-limited logging: at most a few lines per reason per interval, so a flood of
refusals (a client retrying a 429 in a loop) leaves a handful of lines and one summary
`<reason>: suppressed K similar lines in the last N s` instead of one line per request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class _Window:
    start: float
    level: int
    num_logged: int = 0
    num_suppressed: int = 0


class RateLimitedLog:
    """Lines of `logger` limited per reason: `max_lines` per `interval_s` (on `clock`)."""

    def __init__(
        self,
        logger: logging.Logger,
        max_lines: int = 10,
        interval_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.max_lines = max_lines
        self.interval_s = interval_s
        self.clock = clock
        self._windows: dict[str, _Window] = {}

    def log(
        self, level: int, reason: str, message: str, *args: object,
        exc_info: BaseException | None = None,
    ) -> bool:  # fmt: skip
        """Log `message % args` (with `exc_info`'s traceback) unless `reason` used up its
        lines this interval (then it is counted for the summary); True if it was logged."""
        now = self.clock()
        window = self._windows.get(reason)
        if window is None or now - window.start >= self.interval_s:
            if window is not None:
                self._summarize(reason, window, now)
            window = self._windows[reason] = _Window(now, level)
        if window.num_logged >= self.max_lines:
            window.num_suppressed += 1
            window.level = max(window.level, level)
            return False
        window.num_logged += 1
        self.logger.log(level, message, *args, exc_info=exc_info, stacklevel=2)  # the caller's
        return True

    def flush(self, is_final: bool = False) -> None:
        """Summarize and forget the windows that ended (all of them when `is_final`)."""
        now = self.clock()
        for reason, window in list(self._windows.items()):
            if is_final or now - window.start >= self.interval_s:
                self._summarize(reason, window, now)
                del self._windows[reason]

    def _summarize(self, reason: str, window: _Window, now: float) -> None:
        if window.num_suppressed:
            self.logger.log(window.level, "%s: suppressed %d similar lines in the last %.0f s",
                            reason, window.num_suppressed, now - window.start)  # fmt: skip
