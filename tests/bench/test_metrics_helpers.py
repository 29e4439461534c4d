"""Percentiles and distributions of `superinfer.slo.metrics`, and the client's result fields
computed from them, against hand-computed cases."""

from __future__ import annotations

import pytest

from superinfer.bench.client import RequestResult, RequestSpec, to_record
from superinfer.bench.serve import RunOutput, ServeOptions, benchmark_result
from superinfer.slo import SLOTargets
from superinfer.slo.metrics import distribution, percentile

GOLD = SLOTargets(ttft_ms=200, tbt_ms=50, slo_class="gold")
BRONZE = SLOTargets(ttft_ms=1000, tbt_ms=500, slo_class="bronze")


def test_percentile_interpolates_like_numpy():
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    assert percentile(values, 50) == pytest.approx(2.5)
    assert percentile(values, 99) == pytest.approx(3 + 0.97)  # position 2.97
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None
    with pytest.raises(ValueError):
        percentile(values, 101)


def test_distribution():
    stats = distribution([1.0, 2.0, 3.0, 4.0], (50, 90))
    assert (stats.count, stats.mean, stats.median) == (4, 2.5, 2.5)
    assert stats.std == pytest.approx(1.25**0.5)  # population standard deviation
    assert stats.percentiles == {50: 2.5, 90: pytest.approx(3.7)}
    empty = distribution([], (99,))
    assert (empty.count, empty.mean, empty.std, empty.percentiles) == (0, None, None, {99: None})


def result(request_id, targets, send, chunks, end, status=200, finish="length", usage=None,
           code=None):  # fmt: skip
    spec = RequestSpec(request_id, "p", 10, 4, targets, 0.0)
    out = RequestResult(spec, send_time=send, chunk_times=list(chunks), end_time=end,
                        status=status, error_code=code,
                        finish_reason=finish if status == 200 else None)  # fmt: skip
    if status != 200:
        out.error = f"HTTP {status}"
    if usage is not None:
        out.prompt_tokens, out.completion_tokens = usage
    return out


def run_of(*results) -> dict:
    run = RunOutput(list(results), start_time=100.0, model="m", metrics_timeline=[])
    return benchmark_result(run, ServeOptions(metric_percentiles=(50, 99)), {})


def test_run_result_by_hand():
    # a: gold, TTFT 100 ms, 3 tokens at +100, +140, +200 ms -> TPOT 50, gaps 40/60 (1 of 2 met)
    a = result("a", GOLD, 100.0, [100.1, 100.14, 100.2], 100.2, usage=(10, 3))
    # b: gold, TTFT 300 ms (missed), one token: TPOT 0 (met), no gaps
    b = result("b", GOLD, 100.5, [100.8], 100.8, usage=(12, 1))
    # c: bronze, rejected with 425: counts as not met; d: a client error (400), left out
    c = result("c", BRONZE, 101.0, [], 101.01, status=425, code="slo_infeasible")
    d = result("d", BRONZE, 101.5, [], 102.0, status=400, code="invalid_value")
    out = run_of(a, b, c, d)
    assert out["duration"] == pytest.approx(2.0)  # first send 100.0 to last end 102.0
    # failed: every request that did not finish; rejected: capacity rejections only
    assert (out["completed"], out["failed"], out["rejected"]) == (2, 2, 1)
    assert (out["total_input_tokens"], out["total_output_tokens"]) == (22, 4)
    assert out["request_throughput"] == pytest.approx(1.0)
    assert out["output_throughput"] == pytest.approx(2.0)
    assert out["total_token_throughput"] == pytest.approx(13.0)
    assert out["mean_ttft_ms"] == pytest.approx(200)
    assert out["p50_ttft_ms"] == pytest.approx(200)
    assert out["p99_ttft_ms"] == pytest.approx(100 + 200 * 0.99)
    assert out["mean_tpot_ms"] == pytest.approx(50)  # b (one token) is left out, as vLLM
    assert out["mean_itl_ms"] == pytest.approx(50)
    assert out["median_e2el_ms"] == pytest.approx(250)
    assert out["percentiles_ttft_ms"] == [[50, pytest.approx(200)], [99, pytest.approx(298)]]
    # SLO: 3 SLO requests (d left out): TTFT met by a only; TPOT met by a and b
    assert out["ttft_attainment"] == pytest.approx(1 / 3)
    assert out["tpot_attainment"] == pytest.approx(2 / 3)
    assert out["tbt_attainment"] == pytest.approx(1 / 2)
    assert out["slo_attainment"] == pytest.approx(1 / 3)
    assert out["goodput"] == out["request_goodput"] == pytest.approx(0.5)  # 1 request / 2 s
    gold, bronze = out["attainment_by_class"]["gold"], out["attainment_by_class"]["bronze"]
    assert (gold["num_requests"], gold["ttft"], gold["tpot"]) == (2, 0.5, 1.0)
    assert (bronze["num_requests"], bronze["num_rejected"], bronze["ttft"]) == (1, 1, 0.0)
    assert out["rejections"] == {"slo_infeasible": 1, "invalid_value": 1}
    assert {t["class"]: t["num_requests"] for t in out["slo_targets"]} == {"gold": 2, "bronze": 2}
    # raw records: client-clock times relative to the start of the run
    rec = out["records"][0]
    assert rec["arrival_s"] == 0.0 and rec["token_times_s"] == [0.1, 0.14, 0.2]
    assert rec["slo"]["ttft_ms"] == pytest.approx(100)


def test_output_tokens_come_from_usage_not_chunks():
    # 2 chunks carried 5 tokens: TPOT = (e2e - ttft) / 4
    out = run_of(result("a", GOLD, 100.0, [100.1, 100.3], 100.3, usage=(10, 5)))
    assert out["total_output_tokens"] == 5
    assert out["mean_tpot_ms"] == pytest.approx(50)
    # without usage the chunks are counted
    out = run_of(result("a", GOLD, 100.0, [100.1, 100.3], 100.3))
    assert out["total_output_tokens"] == 2
    assert out["mean_tpot_ms"] == pytest.approx(200)


def test_aborted_stream_is_not_met_and_not_completed():
    cut = result("a", GOLD, 100.0, [100.05], 100.1, finish=None)
    cut.error = "RemoteProtocolError"
    record = to_record(cut)
    assert record.outcome == "aborted"
    out = run_of(cut, result("b", GOLD, 100.0, [100.05, 100.09], 100.1, usage=(10, 2)))
    assert (out["completed"], out["failed"], out["rejected"]) == (1, 1, 0)
    assert out["ttft_attainment"] == pytest.approx(0.5)


def test_no_finished_request_gives_none_not_a_crash():
    out = run_of(result("c", GOLD, 100.0, [], 100.01, status=503, code="not_ready"))
    assert out["completed"] == 0 and out["mean_ttft_ms"] is None
    assert out["ttft_attainment"] == 0.0 and out["goodput"] == 0.0
