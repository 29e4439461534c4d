"""The contract's Definitions as pure functions: per-request report and run attainment."""

from __future__ import annotations

import pytest

from superinfer.slo import SLOTargets
from superinfer.slo.metrics import (
    ABORTED,
    FINISHED,
    REJECTED,
    RequestRecord,
    attainment,
    attainment_by_class,
    refusal_cost,
    run_duration_s,
    slo_report,
    tbt_gaps,
)

TARGETS = SLOTargets(ttft_ms=200, tbt_ms=50, max_latency_ms=None, slo_class="gold")


def record(token_times, arrival=10.0, targets=TARGETS, **kwargs) -> RequestRecord:
    return RequestRecord("r", targets, arrival, tuple(token_times), **kwargs)


def test_ttft_tpot_and_max_tbt():
    # first token 0.15 s after arrival, then gaps of 0.03, 0.04, 0.08 s
    report = slo_report(record([10.15, 10.18, 10.22, 10.30], first_scheduled_time=10.01))
    assert report.ttft_ms == pytest.approx(150)
    assert report.e2e_ms == pytest.approx(300)
    assert report.tpot_ms == pytest.approx((300 - 150) / 3)  # (e2e - ttft) / (n - 1)
    assert report.max_tbt_ms == pytest.approx(80)
    assert report.queue_ms == pytest.approx(10)
    assert report.ttft_met and report.tpot_met and report.deadline_met and report.is_all_met
    assert (report.num_tbt_gaps, report.num_tbt_gaps_met) == (3, 2)  # 80 ms > 50 ms target
    assert report.tbt_attainment == pytest.approx(2 / 3)


def test_tpot_is_zero_for_one_token_and_uses_the_end_of_the_response():
    assert slo_report(record([10.1])).tpot_ms == 0.0
    # e2e runs to the end of the response, not only to the last token
    report = slo_report(record([10.1, 10.2], finished_time=10.5))
    assert report.e2e_ms == pytest.approx(500)
    assert report.tpot_ms == pytest.approx(400)
    assert not report.tpot_met


def test_tpot_counts_output_tokens_not_chunks():
    # a streaming client that saw 2 chunks carrying 5 tokens in all
    report = slo_report(record([10.1, 10.3], num_output_tokens=5))
    assert report.tpot_ms == pytest.approx(200 / 4)
    assert report.tpot_met


@pytest.mark.parametrize("ttft_s, is_met", [(0.2, True), (0.2001, False)])
def test_ttft_met_is_inclusive(ttft_s, is_met):
    assert slo_report(record([10.0 + ttft_s], arrival=10.0)).ttft_met is is_met


def test_deadline():
    targets = SLOTargets(ttft_ms=1000, tbt_ms=1000, max_latency_ms=400)
    assert slo_report(record([10.1, 10.4], targets=targets)).deadline_met
    late = slo_report(record([10.1, 10.41], targets=targets))
    assert not late.deadline_met and late.ttft_met and not late.is_all_met
    # without a deadline there is nothing to miss
    assert slo_report(record([10.1, 50.0], targets=SLOTargets(1000, 1e6))).deadline_met


def test_rejected_and_aborted_never_count_as_met():
    rejected = slo_report(record([], outcome=REJECTED, finished_time=10.01))
    assert rejected.ttft_ms is None and rejected.tpot_ms is None
    assert not (rejected.ttft_met or rejected.tpot_met or rejected.deadline_met)
    aborted = slo_report(record([10.05, 10.06], outcome=ABORTED))
    assert aborted.ttft_met  # what was observed
    assert not aborted.is_all_met  # but it was not served
    run = attainment([aborted, rejected])
    assert run.ttft == 0.0 and run.all_met == 0.0 and run.num_finished == 0


def test_client_errors_are_not_slo_requests():
    capacity = slo_report(record([], outcome=REJECTED, rejection_reason="queue_full"))
    malformed = slo_report(record([], outcome=REJECTED, rejection_reason="invalid_json"))
    served = slo_report(record([10.1, 10.12]))
    assert capacity.is_slo_request and not malformed.is_slo_request
    run = attainment([capacity, malformed, served])
    assert run.num_requests == 2 and run.all_met == 0.5 and run.num_rejected == 1


def test_run_attainment_and_goodput():
    reports = [
        slo_report(record([10.1, 10.12, 10.14])),  # all met
        slo_report(record([10.3, 10.32])),  # ttft missed
        slo_report(record([10.1, 10.2, 10.3])),  # tpot missed; both gaps over target
        slo_report(record([], outcome=REJECTED, rejection_reason="slo_infeasible")),
    ]
    run = attainment(reports, duration_s=2.0)
    assert run.num_requests == 4 and run.num_rejected == 1
    assert run.ttft == pytest.approx(2 / 4)
    assert run.tpot == pytest.approx(2 / 4)
    assert run.all_met == pytest.approx(1 / 4)
    assert run.deadline is None  # nobody gave a deadline
    assert run.tbt_token == pytest.approx(3 / 5)  # pooled gaps: 2 + 1 + 0 met of 5
    assert run.goodput_rps == pytest.approx(0.5)
    assert run.precision == pytest.approx(1 / 3)  # of the three admitted, one met all


def test_refusal_cost_counts_refused_requests_the_replay_served_in_time():
    refused = slo_report(record([], outcome=REJECTED, rejection_reason="slo_infeasible"))
    met, missed = slo_report(record([10.1, 10.12])), slo_report(record([10.3, 10.32]))
    run = [refused, met, refused, refused]
    replay = [met, met, missed, met]  # the same requests, admission off
    assert refusal_cost(run, replay) == pytest.approx(2 / 3)
    assert refusal_cost([met], [missed]) is None  # nothing refused
    with pytest.raises(ValueError):
        refusal_cost(run, replay[:2])


def test_deadline_attainment_counts_only_requests_with_a_deadline():
    with_deadline = SLOTargets(1000, 1000, max_latency_ms=100)
    reports = [
        slo_report(record([10.05], targets=with_deadline)),
        slo_report(record([10.5], targets=with_deadline)),
        slo_report(record([10.05])),
    ]
    assert attainment(reports).deadline == 0.5


def test_by_class_and_duration():
    silver = SLOTargets(1000, 200, slo_class="silver")
    records = [record([10.1], arrival=10.0), record([12.5], arrival=11.0, targets=silver)]
    by_class = attainment_by_class([slo_report(r) for r in records])
    assert set(by_class) == {"gold", "silver"}
    assert by_class["gold"].all_met == 1.0 and by_class["silver"].all_met == 0.0
    assert run_duration_s(records) == pytest.approx(2.5)
    assert tbt_gaps([1.0, 1.5, 3.0]) == [0.5, 1.5]


def test_report_dict_is_the_contract_object():
    report = slo_report(record([10.15, 10.18], first_scheduled_time=10.0125)).to_dict()
    assert set(report) >= {
        "class", "targets", "ttft_ms", "tpot_ms", "max_tbt_ms", "e2e_ms", "ttft_met",
        "tpot_met", "deadline_met", "preemptions", "rotations", "queue_ms",
    }  # fmt: skip
    assert report["class"] == "gold"
    assert report["targets"] == {"ttft_ms": 200, "tbt_ms": 50, "max_latency_ms": None}


def test_unknown_outcome_is_refused():
    with pytest.raises(ValueError):
        record([], outcome="lost")
    assert FINISHED == "finished"
