"""The periodic log keeps the SLO reports of ended requests only while its stats line runs."""

from __future__ import annotations

import asyncio
import logging

from superinfer.server.config import ServerConfig
from superinfer.server.log_limit import RateLimitedLog
from superinfer.server.periodic_log import PeriodicLog
from superinfer.slo import SLOTargets
from superinfer.slo.metrics import REJECTED, RequestRecord, slo_report

REPORT = slo_report(RequestRecord("r", SLOTargets(), 0.0, finished_time=1.0, outcome=REJECTED))


def make(**config) -> PeriodicLog:
    return PeriodicLog(ServerConfig(**config), lambda: None, RateLimitedLog(logging.getLogger()))


def test_reports_are_kept_once_started_and_taken_once():
    async def run() -> tuple[list, list]:
        log = make()
        log.keep(REPORT)  # not started: dropped
        log.start()
        log.keep(REPORT)
        taken = log._take_ended_reports(), log._take_ended_reports()
        log.close()
        return taken

    assert asyncio.run(run()) == ([REPORT], [])


def test_without_the_stats_line_nothing_is_kept():
    async def run() -> list:
        log = make(disable_log_stats=True)
        log.start()
        log.keep(REPORT)
        taken = log._take_ended_reports()
        log.close()
        return taken

    assert asyncio.run(run()) == []
