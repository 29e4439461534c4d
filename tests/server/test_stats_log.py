"""The periodic stats line, from plain snapshots and SLO reports (no engine, no sleeping)."""

from __future__ import annotations

import logging

from superinfer.engine.async_engine import EngineSnapshot
from superinfer.server.stats_log import StatsLogger, slo_summary, stats_line
from superinfer.slo import SLOTargets
from superinfer.slo.metrics import ABORTED, FINISHED, REJECTED, RequestRecord, slo_report

TARGETS = SLOTargets(ttft_ms=500, tbt_ms=100)


def report(outcome: str = FINISHED, ttft_s: float = 0.1, gap_s: float = 0.05, reason=None):
    token_times = () if outcome != FINISHED else (ttft_s, ttft_s + gap_s, ttft_s + 2 * gap_s)
    record = RequestRecord("r", TARGETS, 0.0, token_times, outcome=outcome,
                           rejection_reason=reason)  # fmt: skip
    return slo_report(record)


def test_stats_line_from_two_snapshots():
    previous = EngineSnapshot(
        num_steps=10, num_prompt_tokens=100, num_generation_tokens=50,
        prefix_cache_queries=400, prefix_cache_hits=100,
    )  # fmt: skip
    current = EngineSnapshot(
        num_running=3, num_waiting=2, num_swapped=1, device_kv_usage=0.4125,
        host_kv_usage=0.05, num_steps=30, num_prompt_tokens=1100, num_generation_tokens=250,
        prefix_cache_queries=1200, prefix_cache_hits=300,
    )  # fmt: skip
    reports = [report(), report(ttft_s=0.9), report(REJECTED, reason="queue_full")]
    assert stats_line(previous, current, 10.0, reports) == (
        "Avg prompt throughput: 100.0 tokens/s, Avg generation throughput: 20.0 tokens/s, "
        "Running: 3 reqs, Waiting: 2 reqs, Rotated: 1 reqs, GPU KV cache usage: 41.2%, "
        "Host KV cache usage: 5.0%, Prefix cache hit rate: 25.0%, "
        "SLO: 3 ended (2 finished, 1 rejected, 0 aborted), all met 33.3%, TTFT 33.3%, "
        "TPOT 66.7%"
    )


def test_idle_interval_reads_zero_and_no_slo_figures():
    snapshot = EngineSnapshot(num_prompt_tokens=7, prefix_cache_queries=5)
    line = stats_line(snapshot, snapshot, 60.0, [])
    assert line.startswith("Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0")
    assert "Prefix cache hit rate: 0.0%" in line and line.endswith("SLO: no requests ended")


def test_slo_summary_leaves_client_errors_out():
    reports = [report(ABORTED), report(REJECTED, reason="invalid_json")]
    assert slo_summary(reports) == (
        "1 ended (0 finished, 0 rejected, 1 aborted), all met 0.0%, TTFT 0.0%, TPOT 0.0%"
    )
    assert slo_summary([report(REJECTED, reason="invalid_json")]) == "no requests ended"


def test_stats_logger_logs_deltas_and_goes_quiet_when_idle(caplog):
    snapshots = [EngineSnapshot(), EngineSnapshot(num_steps=5, num_generation_tokens=30)]
    now = [0.0]
    ended = [[report()]]
    stats = StatsLogger(lambda: snapshots[0], lambda: ended.pop() if ended else [], lambda: now[0])
    snapshots[0], now[0] = snapshots[1], 10.0
    with caplog.at_level(logging.DEBUG, logger="superinfer.server.stats_log"):
        stats.log_once()  # work: info
        now[0] = 20.0
        stats.log_once()  # the first idle interval: still info
        now[0] = 30.0
        stats.log_once()  # idle again: debug
    levels = [record.levelno for record in caplog.records]
    assert levels == [logging.INFO, logging.INFO, logging.DEBUG]
    first, second = caplog.records[0].getMessage(), caplog.records[1].getMessage()
    assert "Avg generation throughput: 3.0 tokens/s" in first and "SLO: 1 ended" in first
    assert "Avg generation throughput: 0.0 tokens/s" in second and "no requests ended" in second
