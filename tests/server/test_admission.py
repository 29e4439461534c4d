"""Admission arithmetic: the deadline estimate (425) and the bounded queue (429)."""

from __future__ import annotations

import pytest

from superinfer.server.admission import Admission, Load, retry_after_s
from superinfer.server.errors import APIError

ADMISSION = Admission(max_num_queued_reqs=4, max_num_queued_tokens=1000)
IDLE = Load(num_queued=0, num_queued_tokens=0, step_time_s=0.05, prefill_s_per_token=0.002)


def check(load=IDLE, prompt=100, max_tokens=10, max_latency_ms=None, elapsed_s=0.0, reject=True):
    ADMISSION.check(load, prompt, max_tokens, max_latency_ms, elapsed_s, reject)


def test_estimate_is_queue_plus_prefill_plus_decode():
    load = Load(2, 400, 0.05, 0.002)
    assert Admission.estimate_s(load, 100, 11) == pytest.approx(500 * 0.002 + 10 * 0.05)


def test_feasible_deadline_is_admitted_and_infeasible_is_425():
    check(max_latency_ms=1000)  # 0.2 + 0.45 = 0.65 s
    with pytest.raises(APIError) as info:
        check(max_latency_ms=600)
    assert info.value.status == 425 and info.value.code == "slo_infeasible"


def test_time_already_spent_counts_and_a_past_deadline_is_always_425():
    with pytest.raises(APIError):
        check(max_latency_ms=1000, elapsed_s=0.5)
    with pytest.raises(APIError) as info:
        check(max_latency_ms=100, elapsed_s=0.2, reject=False)
    assert info.value.status == 425


def test_best_effort_class_is_not_rejected_on_the_estimate():
    check(max_latency_ms=300, reject=False)


def test_queue_full_by_count_and_by_tokens():
    with pytest.raises(APIError) as info:
        check(Load(4, 10, 0.05, 0.002))
    assert info.value.status == 429 and info.value.code == "queue_full"
    assert 1 <= int(info.value.headers["Retry-After"]) <= 60
    with pytest.raises(APIError):
        check(Load(1, 950, 0.05, 0.002))
    check(Load(0, 0, 0.05, 0.002), prompt=5000)  # an empty queue takes any single prompt


def test_retry_after_is_bounded():
    assert retry_after_s(Load(0, 0, 0.0, 0.0)) == 1
    assert retry_after_s(Load(10, 10**9, 1.0, 1.0)) == 60


def check_ttft(load, prompt, ttft_ms, elapsed_s=0.0):
    ADMISSION.check_first_token(load, prompt, ttft_ms, elapsed_s)


def test_ttft_estimate_is_queued_prefill_plus_a_decode_step_per_step_of_it():
    load = Load(2, 900, 0.05, 0.002, num_batched_tokens=512)
    # 1,000 prompt tokens at 2 ms, over two steps of 512 tokens, each with a 50 ms decode
    assert Admission.estimate_ttft_s(load, 100) == pytest.approx(1000 * 0.002 + 2 * 0.05)


def test_a_first_token_that_cannot_come_in_time_is_425():
    backlog = Load(3, 900, 0.05, 0.002, num_batched_tokens=512)  # 2.1 s to this one's token
    check_ttft(backlog, 100, ttft_ms=3000)
    with pytest.raises(APIError) as info:
        check_ttft(backlog, 100, ttft_ms=2000)
    assert info.value.status == 425 and info.value.code == "slo_infeasible"
    assert "TTFT" in str(info.value)
    with pytest.raises(APIError):  # time spent before admission counts
        check_ttft(backlog, 100, ttft_ms=3000, elapsed_s=1.0)
