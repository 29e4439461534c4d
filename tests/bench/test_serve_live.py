"""`superinfer bench serve` against a real `superinfer serve` process: a short run whose
client-side figures agree with the server's own `slo` reports."""

from __future__ import annotations

import json

import pytest

from superinfer.cli import main
from tests.server.conftest import API_KEY, ServerProcess

pytestmark = pytest.mark.slow

# targets far from anything this machine measures: loose is always met, tight never is,
# doomed (a 1 ms end-to-end budget) is rejected with 425 at ingress
SLO_YAML = """
classes:
  - name: loose
    ttft_ms: 600000
    tbt_ms: 600000
  - name: tight
    ttft_ms: 1
    tbt_ms: 0.001
    reject_infeasible: false
  - name: doomed
    ttft_ms: 600000
    tbt_ms: 600000
    max_latency_ms: 1
"""
NUM_PROMPTS, OUTPUT_LEN = 8, 6
TOLERANCE_MS = 5.0  # the server stamps arrival after the client sends; clocks differ a little


@pytest.fixture(scope="module")
def bench_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench_server")
    proc = ServerProcess(tmp, api_key=API_KEY, slo_yaml=SLO_YAML)
    proc.start()
    yield proc
    assert proc.stop() == 0, proc.stderr_tail()


@pytest.fixture(scope="module")
def result(bench_server, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench_out")
    code = main([
        "bench", "serve", "--base-url", bench_server.url, "--api-key", API_KEY,
        "--dataset-name", "random", "--random-input-len", "24",
        "--random-output-len", str(OUTPUT_LEN), "--num-prompts", str(NUM_PROMPTS),
        "--request-rate", "4", "--seed", "3", "--slo-classes", "loose=3,tight=3,doomed=2",
        "--slo-config", str(bench_server.tmp / "slo.yaml"), "--metrics-interval", "0.2",
        "--disable-tqdm", "--result-dir", str(out), "--result-filename", "result.json",
    ])  # fmt: skip
    assert code == 0
    return json.loads((out / "result.json").read_text())


def test_counts_and_rejections(result):
    assert result["num_prompts"] == NUM_PROMPTS
    assert (result["completed"], result["failed"], result["rejected"]) == (6, 2, 2)
    assert result["rejections"] == {"slo_infeasible": 2}
    assert result["total_output_tokens"] == 6 * OUTPUT_LEN  # ignore_eos + max_tokens
    doomed = [r for r in result["records"] if r["slo_class"] == "doomed"]
    assert [(r["status"], r["outcome"], r["error_code"]) for r in doomed] == [
        (425, "rejected", "slo_infeasible")] * 2  # fmt: skip


def test_client_latencies_agree_with_the_servers_reports(result):
    finished = [r for r in result["records"] if r["outcome"] == "finished"]
    for record in finished:
        client, server = record["slo"], record["server_slo"]
        assert server is not None, record
        assert server["targets"] == record["targets"]  # the server bound what was sent
        assert record["output_tokens"] == record["max_tokens"] == OUTPUT_LEN
        assert record["estimated_ttft_ms"] > 0  # admission's estimate, from the response
        # the client's clock starts before the server's arrival stamp and ends after
        assert client["ttft_ms"] >= server["ttft_ms"] - TOLERANCE_MS
        assert client["e2e_ms"] >= server["e2e_ms"] - TOLERANCE_MS
        assert client["ttft_ms"] - server["ttft_ms"] < 1000, "most of TTFT is the server's"
        for kind in ("ttft_met", "tpot_met"):
            assert client[kind] == server[kind], (kind, record)
        assert client["ttft_met"] is (record["slo_class"] == "loose")


def test_attainment_per_class(result):
    by_class = result["attainment_by_class"]
    assert (by_class["loose"]["ttft"], by_class["loose"]["tpot"], by_class["loose"]["all_met"]) \
        == (1.0, 1.0, 1.0)  # fmt: skip
    assert (by_class["tight"]["ttft"], by_class["tight"]["all_met"]) == (0.0, 0.0)
    assert (by_class["doomed"]["num_rejected"], by_class["doomed"]["all_met"]) == (2, 0.0)
    assert result["ttft_attainment"] == pytest.approx(3 / 8)
    assert result["slo_attainment"] == pytest.approx(3 / 8)
    assert result["goodput"] == pytest.approx(3 / result["duration"])
    assert result["mean_ttft_ms"] > 0 and result["p99_itl_ms"] >= result["median_itl_ms"]


def test_metrics_timeline_was_scraped(result):
    timeline = result["metrics_timeline"]
    assert timeline and all("vllm:kv_cache_usage_perc" in point for point in timeline)
    assert all("vllm:num_requests_running" in point for point in timeline)
    # the last scrape follows the run, so it counts every request that finished in it
    assert timeline[-1]["vllm:request_success_total"] >= 6
    assert "superinfer:rotations_total" in timeline[-1]


def test_sweep_against_an_external_server(bench_server, tmp_path):
    """One point through `bench sweep --external`: JSON per point, summary and plots."""
    code = main([
        "bench", "sweep", "--external", f"local={bench_server.url}", "--api-key", API_KEY,
        "--request-rates", "4", "--dataset-name", "random", "--random-input-len", "16",
        "--random-output-len", "4", "--num-prompts", "4", "--num-warmups", "1",
        "--slo-classes", "loose=1", "--slo-config", str(bench_server.tmp / "slo.yaml"),
        "--metrics-interval", "0.2", "--disable-tqdm", "--output-dir", str(tmp_path),
    ])  # fmt: skip
    assert code == 0
    point = json.loads((tmp_path / "local_rate4.json").read_text())
    assert (point["system"], point["request_rate"], point["completed"]) == ("local", 4.0, 4)
    assert point["slo_attainment"] == 1.0 and point["metrics_timeline"]
    summary = json.loads((tmp_path / "sweep.json").read_text())
    assert [(p["system"], p["completed"]) for p in summary["points"]] == [("local", 4)]
    for name in ("attainment_vs_rate.png", "latency_cdfs.png", "kv_timeline.png"):
        assert (tmp_path / name).stat().st_size > 1000
