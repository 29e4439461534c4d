"""What a server with an engine logs each --log-stats-interval: the stats line (unless
--disable-log-stats; stats_log.py) and the summaries of the lines the rate-limited log held
back (log_limit.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from superinfer.engine.snapshot import EngineSnapshot
from superinfer.server.config import ServerConfig
from superinfer.server.log_limit import RateLimitedLog
from superinfer.server.stats_log import StatsLogger
from superinfer.slo.metrics import SLOReport


class PeriodicLog:
    """The periodic lines over `snapshot` and the SLO reports `keep` receives."""

    def __init__(
        self,
        config: ServerConfig,
        snapshot: Callable[[], EngineSnapshot | None],
        error_log: RateLimitedLog,
    ) -> None:
        self.config = config
        self.snapshot = snapshot
        self.error_log = error_log
        self._ended_reports: list[SLOReport] = []  # since the last stats line
        self._task: asyncio.Task[None] | None = None

    def keep(self, report: SLOReport) -> None:
        """The report of a request that ended (finished, aborted, rejected), for the next
        stats line; dropped unless that line is logged."""
        if not self.config.disable_log_stats and self._task is not None:
            self._ended_reports.append(report)

    def start(self) -> None:
        self._task = asyncio.create_task(self._log_periodically())

    def close(self) -> None:
        """Stop, and summarize every line still held back."""
        if self._task is not None:
            self._task.cancel()
        self.error_log.flush(is_final=True)

    async def _log_periodically(self) -> None:
        stats = None
        if not self.config.disable_log_stats:
            stats = StatsLogger(self.snapshot, self._take_ended_reports)
        while True:
            await asyncio.sleep(self.config.log_stats_interval)
            if stats is not None:
                stats.log_once()
            self.error_log.flush()

    def _take_ended_reports(self) -> list[SLOReport]:
        reports, self._ended_reports = self._ended_reports, []
        return reports
