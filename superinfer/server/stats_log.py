"""The periodic stats line, vLLM's plus the SLO figures since the last line:

    Avg prompt throughput: 210.4 tokens/s, Avg generation throughput: 48.0 tokens/s,
    Running: 3 reqs, Waiting: 1 reqs, Rotated: 0 reqs, GPU KV cache usage: 4.1%,
    Host KV cache usage: 0.0%, Prefix cache hit rate: 12.5%, SLO: 9 ended (8 finished,
    1 rejected, 0 aborted), all met 88.9%, TTFT 88.9%, TPOT 100.0%

(one line). `stats_line` is a pure function of two engine snapshots and the SLO reports of
the requests that ended between them; `StatsLogger` reads them and logs the line. "GPU KV
cache" is vLLM's name for the device tier, kept on a CPU too so the same greps work.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from superinfer.engine.snapshot import EngineSnapshot
from superinfer.slo.metrics import SLOReport, attainment

logger = logging.getLogger(__name__)


def stats_line(
    previous: EngineSnapshot, current: EngineSnapshot, elapsed_s: float,
    reports: Sequence[SLOReport],
) -> str:  # fmt: skip
    """The stats of the `elapsed_s` seconds from `previous` to `current`; `reports` are
    those of the requests that ended (finished, aborted, rejected) meanwhile."""
    elapsed_s = max(elapsed_s, 1e-9)
    num_prompt = current.num_prompt_tokens - previous.num_prompt_tokens
    num_generation = current.num_generation_tokens - previous.num_generation_tokens
    num_queried = current.prefix_cache_queries - previous.prefix_cache_queries
    num_hit = current.prefix_cache_hits - previous.prefix_cache_hits
    return (
        f"Avg prompt throughput: {num_prompt / elapsed_s:.1f} tokens/s, "
        f"Avg generation throughput: {num_generation / elapsed_s:.1f} tokens/s, "
        f"Running: {current.num_running} reqs, Waiting: {current.num_waiting} reqs, "
        f"Rotated: {current.num_swapped} reqs, "
        f"GPU KV cache usage: {current.device_kv_usage:.1%}, "
        f"Host KV cache usage: {current.host_kv_usage:.1%}, "
        f"Prefix cache hit rate: {num_hit / num_queried if num_queried else 0.0:.1%}, "
        f"SLO: {slo_summary(reports)}"
    )


def slo_summary(reports: Sequence[SLOReport]) -> str:
    """'N ended (F finished, R rejected, A aborted), all met X%, TTFT Y%, TPOT Z%'; client
    errors (a bad body, a wrong key) are not SLO requests and are left out."""
    stats = attainment(reports)
    if not stats.num_requests:
        return "no requests ended"
    return (
        f"{stats.num_requests} ended ({stats.num_finished} finished, {stats.num_rejected} "
        f"rejected, {stats.num_aborted} aborted), all met {_percent(stats.all_met)}, "
        f"TTFT {_percent(stats.ttft)}, TPOT {_percent(stats.tpot)}"
    )


def is_idle(
    previous: EngineSnapshot, current: EngineSnapshot, reports: Sequence[SLOReport]
) -> bool:
    """Nothing ran, waited or ended between the two snapshots."""
    num_steps = current.num_steps - previous.num_steps
    num_requests = current.num_running + current.num_waiting + current.num_swapped
    return not (num_steps or num_requests or reports)


def _percent(share: float | None) -> str:
    return "n/a" if share is None else f"{share:.1%}"


class StatsLogger:
    """Logs `stats_line` every `interval_s`: at info, or at debug while the server stays
    idle (the first idle interval after work is still logged at info)."""

    def __init__(
        self,
        read_snapshot: Callable[[], EngineSnapshot | None],
        take_reports: Callable[[], list[SLOReport]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.read_snapshot = read_snapshot
        self.take_reports = take_reports
        self.clock = clock
        self._previous = read_snapshot() or EngineSnapshot()
        self._previous_time = clock()
        self._was_idle = True

    def log_once(self) -> None:
        """Log the stats since the previous call (or since construction)."""
        current, now = self.read_snapshot() or EngineSnapshot(), self.clock()
        reports = self.take_reports()
        idle = is_idle(self._previous, current, reports)
        level = logging.DEBUG if idle and self._was_idle else logging.INFO
        line = stats_line(self._previous, current, now - self._previous_time, reports)
        logger.log(level, "%s", line)
        self._previous, self._previous_time, self._was_idle = current, now, idle
