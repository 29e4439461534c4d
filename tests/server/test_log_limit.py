"""Rate-limited refusal logging, driven by a fake clock."""

from __future__ import annotations

import logging

import pytest

from superinfer.server.log_limit import RateLimitedLog

LOGGER = "tests.log_limit"


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def limited(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock = FakeClock()
    return RateLimitedLog(logging.getLogger(LOGGER), max_lines=2, interval_s=60, clock=clock), clock


def messages(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records]


def test_at_most_n_lines_per_reason_then_one_summary(limited, caplog):
    log, clock = limited
    logged = [log.log(logging.WARNING, "queue_full", "Rejected request %s", i) for i in range(5)]
    assert logged == [True, True, False, False, False]
    assert log.log(logging.INFO, "invalid_json", "Rejected request bad")  # its own budget
    clock.now += 59
    assert not log.log(logging.WARNING, "queue_full", "Rejected request late")
    clock.now += 1  # the window ended: the summary, then a fresh budget
    assert log.log(logging.WARNING, "queue_full", "Rejected request again")
    assert messages(caplog) == [
        "Rejected request 0", "Rejected request 1", "Rejected request bad",
        "queue_full: suppressed 4 similar lines in the last 60 s", "Rejected request again",
    ]  # fmt: skip
    assert caplog.records[3].levelno == logging.WARNING


def test_flush_summarizes_ended_windows_and_final_flush_all(limited, caplog):
    log, clock = limited
    for i in range(3):
        log.log(logging.ERROR, "engine_error", "Request %d failed", i)
    log.log(logging.INFO, "not_found", "404")
    log.flush()  # nothing ended yet
    assert len(caplog.records) == 3
    clock.now += 61
    log.flush()
    assert messages(caplog)[-1] == "engine_error: suppressed 1 similar lines in the last 61 s"
    assert caplog.records[-1].levelno == logging.ERROR
    for i in range(4):
        log.log(logging.WARNING, "slo_infeasible", "425 %d", i)
    clock.now += 5
    log.flush(is_final=True)  # at shutdown: every pending summary, ended or not
    assert messages(caplog)[-1] == "slo_infeasible: suppressed 2 similar lines in the last 5 s"
    log.flush(is_final=True)
    assert messages(caplog)[-1].startswith("slo_infeasible: suppressed 2")  # said once
