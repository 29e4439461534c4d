"""/metrics against vLLM: names, types, labels and bucket boundaries, from a real
`ServerMetrics` fed SLO records and an engine snapshot, parsed back from its exposition."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from superinfer.config import CacheConfig, EngineConfig, SchedulerConfig
from superinfer.engine.async_engine import EngineSnapshot
from superinfer.server.prometheus import ServerMetrics
from superinfer.slo import SLOTargets
from superinfer.slo.estimate import Correction
from superinfer.slo.metrics import ABORTED, FINISHED, RequestRecord, slo_report, tbt_gaps

MODEL = "test-model"
DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "superinfer-dashboard.json"

# --- taken from vLLM ----------------------------------------------------------------------
# vllm/v1/metrics/loggers.py (PrometheusStatLogger.__init__) and docs/design/metrics.md,
# "v1 Metrics" and "Cache Config Info": the metric names (counters are declared without
# `_total`, prometheus_client appends it), their types, the label names every series
# carries, and the bucket boundaries of each histogram.
VLLM_LABELS = {"model_name", "engine"}
VLLM_ENGINE_INDEX = "0"  # make_per_engine: str(engine index); one engine per server
VLLM_TYPES = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:cache_config_info": "gauge",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:num_preemptions": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
    "vllm:request_prefill_time_seconds": "histogram",
    "vllm:request_decode_time_seconds": "histogram",
    "vllm:request_prompt_tokens": "histogram",
    "vllm:request_generation_tokens": "histogram",
}
VLLM_TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                     2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]  # fmt: skip
VLLM_ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                    5.0, 7.5, 10.0, 20.0, 40.0, 80.0]  # fmt: skip
VLLM_REQUEST_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
                                30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0,
                                7680.0]  # fmt: skip
# build_1_2_5_buckets(max_model_len): for the test's max_model_len of 4096
VLLM_TOKEN_BUCKETS_4096 = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000]
# build_1_2_5_buckets(100), the example in its docstring
VLLM_TOKEN_BUCKETS_100 = [1, 2, 5, 10, 20, 50, 100]
VLLM_BUCKETS = {
    "vllm:time_to_first_token_seconds": VLLM_TTFT_BUCKETS,
    "vllm:inter_token_latency_seconds": VLLM_ITL_BUCKETS,
    "vllm:e2e_request_latency_seconds": VLLM_REQUEST_LATENCY_BUCKETS,
    "vllm:request_queue_time_seconds": VLLM_REQUEST_LATENCY_BUCKETS,
    "vllm:request_prefill_time_seconds": VLLM_REQUEST_LATENCY_BUCKETS,
    "vllm:request_decode_time_seconds": VLLM_REQUEST_LATENCY_BUCKETS,
    "vllm:request_prompt_tokens": VLLM_TOKEN_BUCKETS_4096,
    "vllm:request_generation_tokens": VLLM_TOKEN_BUCKETS_4096,
}
# the labels of vllm:cache_config_info that gateways read (KV capacity = blocks x size)
VLLM_CACHE_INFO_LABELS = {"engine", "block_size", "num_gpu_blocks", "num_cpu_blocks",
                          "enable_prefix_caching", "cache_dtype"}  # fmt: skip
# -------------------------------------------------------------------------------------------

SNAPSHOT = EngineSnapshot(
    num_running=3, num_waiting=2, device_kv_usage=0.25, num_device_blocks=640,
    num_host_blocks=2048, prefix_cache_queries=900, prefix_cache_hits=320,
    num_preemptions=1, num_swap_outs=4, transfer_bytes={"d2h": 1024, "h2d": 512},
)  # fmt: skip


def engine_config(max_model_len: int = 4096) -> EngineConfig:
    return EngineConfig(
        cache=CacheConfig(block_size=32, enable_prefix_caching=True),
        scheduler=SchedulerConfig(max_model_len=max_model_len),
    )


def make_metrics(
    snapshot: EngineSnapshot | None = SNAPSHOT, max_model_len: int = 4096
) -> ServerMetrics:
    return ServerMetrics(MODEL, lambda: snapshot, ["gold"], engine_config(max_model_len))


def scrape(metrics: ServerMetrics) -> dict[str, object]:
    text = generate_latest(metrics.registry).decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def finish(metrics: ServerMetrics, record: RequestRecord) -> None:
    """What ServerState does when the engine reports a request done."""
    metrics.on_ended(slo_report(record), record.num_prompt_tokens, record.num_tokens_out,
                     record.finish_reason or "abort", tbt_gaps(record.token_times))  # fmt: skip


def record(outcome: str = FINISHED, **fields) -> RequestRecord:
    """Arrives at 10 s, scheduled at 10.5, tokens at 11, 11.125 and 11.375, when it ends."""
    base = {
        "request_id": "r", "targets": SLOTargets(ttft_ms=2000, tbt_ms=200, slo_class="gold"),
        "arrival_time": 10.0, "token_times": (11.0, 11.125, 11.375), "finished_time": 11.375,
        "first_scheduled_time": 10.5, "outcome": outcome, "num_prompt_tokens": 7,
        "finish_reason": "length" if outcome == FINISHED else "abort",
    }  # fmt: skip
    return RequestRecord(**{**base, **fields})


def buckets_of(family) -> dict[float, float]:
    """Upper bound -> cumulative count, without +Inf."""
    return {float(s.labels["le"]): s.value for s in family.samples
            if s.name.endswith("_bucket") and s.labels["le"] != "+Inf"}  # fmt: skip


def value(family, suffix: str = "", **labels: str) -> float:
    (sample,) = [s for s in family.samples if s.name == family.name + suffix
                 and labels.items() <= s.labels.items()]  # fmt: skip
    return sample.value


def test_names_types_and_labels_are_vllms():
    families = scrape(make_metrics())
    for name, kind in VLLM_TYPES.items():
        assert name in families, f"{name} is not exported"
        assert families[name].type == kind, name
        for sample in families[name].samples:
            assert sample.labels["engine"] == VLLM_ENGINE_INDEX, name
            if name != "vllm:cache_config_info":  # vLLM's info gauge has no model label
                assert VLLM_LABELS <= sample.labels.keys(), (name, sample.labels)
                assert sample.labels["model_name"] == MODEL
    assert {s.labels["finished_reason"] for s in families["vllm:request_success"].samples} >= {
        "stop", "length", "abort"
    }  # fmt: skip


@pytest.mark.parametrize("name", sorted(VLLM_BUCKETS))
def test_histogram_buckets_are_vllms(name):
    family = scrape(make_metrics())[name]
    assert sorted(buckets_of(family)) == [float(b) for b in VLLM_BUCKETS[name]]


def test_token_buckets_follow_max_model_len_as_vllms():
    family = scrape(make_metrics(max_model_len=100))["vllm:request_prompt_tokens"]
    assert sorted(buckets_of(family)) == [float(b) for b in VLLM_TOKEN_BUCKETS_100]


def test_a_finished_request_fills_the_request_histograms():
    metrics = make_metrics()
    finish(metrics, record())
    families = scrape(metrics)
    assert value(families["vllm:time_to_first_token_seconds"], "_sum") == pytest.approx(1.0)
    assert value(families["vllm:request_queue_time_seconds"], "_sum") == pytest.approx(0.5)
    # vLLM's intervals: first scheduled -> first token; first token -> last token
    assert value(families["vllm:request_prefill_time_seconds"], "_sum") == pytest.approx(0.5)
    assert value(families["vllm:request_decode_time_seconds"], "_sum") == pytest.approx(0.375)
    assert value(families["vllm:e2e_request_latency_seconds"], "_sum") == pytest.approx(1.375)
    itl = buckets_of(families["vllm:inter_token_latency_seconds"])  # gaps of 0.125 and 0.25
    assert (itl[0.1], itl[0.15], itl[0.2], itl[0.3]) == (0, 1, 1, 2)
    prompt = buckets_of(families["vllm:request_prompt_tokens"])
    assert prompt[5] == 0 and prompt[10] == 1  # 7 prompt tokens
    generated = buckets_of(families["vllm:request_generation_tokens"])
    assert generated[2] == 0 and generated[5] == 1  # 3 tokens
    assert value(families["vllm:request_success"], "_total", finished_reason="length") == 1
    assert value(families["vllm:prompt_tokens"], "_total") == 7
    assert value(families["vllm:generation_tokens"], "_total") == 3


def test_an_aborted_request_counts_but_stays_out_of_the_finished_histograms():
    metrics = make_metrics()
    finish(metrics, record(ABORTED, token_times=(11.0,), finished_time=11.2))
    families = scrape(metrics)
    assert value(families["vllm:request_success"], "_total", finished_reason="abort") == 1
    assert value(families["vllm:time_to_first_token_seconds"], "_count") == 1
    for name in ("vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
                 "vllm:e2e_request_latency_seconds", "vllm:request_prompt_tokens",
                 "vllm:request_generation_tokens"):  # fmt: skip
        assert value(families[name], "_count") == 0, name


def test_engine_series_come_from_the_snapshot():
    families = scrape(make_metrics())
    assert value(families["vllm:prefix_cache_queries"], "_total") == 900
    assert value(families["vllm:prefix_cache_hits"], "_total") == 320
    assert value(families["vllm:num_requests_running"]) == 3
    assert value(families["vllm:num_preemptions"], "_total") == 5  # recompute + swap
    (info,) = families["vllm:cache_config_info"].samples
    assert info.value == 1 and VLLM_CACHE_INFO_LABELS <= info.labels.keys()
    assert info.labels["num_gpu_blocks"] == "640" and info.labels["num_cpu_blocks"] == "2048"
    assert info.labels["block_size"] == "32" and info.labels["enable_prefix_caching"] == "True"


def test_cache_config_info_waits_for_the_engine():
    families = scrape(make_metrics(snapshot=None))
    assert "vllm:cache_config_info" not in families
    assert value(families["vllm:prefix_cache_queries"], "_total") == 0


def test_every_superinfer_series_carries_the_model_name():
    metrics = make_metrics()
    finish(metrics, record())
    metrics.on_rejected("gold", "queue_full", True)
    families = scrape(metrics)
    superinfer = [f for name, f in families.items() if name.startswith("superinfer:")]
    assert {f.name for f in superinfer} >= {
        "superinfer:slo_requests", "superinfer:rejections", "superinfer:tbt_gaps",
        "superinfer:slo_slack_seconds", "superinfer:rotations", "superinfer:swap_ins",
        "superinfer:kv_transfer_bytes", "superinfer:kv_transfer_seconds",
        "superinfer:step_time_seconds",
    }  # fmt: skip
    for family in superinfer:
        assert family.samples, family.name
        for sample in family.samples:
            assert sample.labels.get("model_name") == MODEL, (family.name, sample.labels)
    slo = families["superinfer:slo_requests"]
    assert value(slo, "_total", slo_class="gold", kind="all", outcome="met") == 1
    assert value(slo, "_total", slo_class="gold", kind="all", outcome="violated") == 1


def test_the_learned_ttft_correction_is_a_gauge_per_class():
    factors: dict[str, float] = {}
    metrics = ServerMetrics(MODEL, lambda: SNAPSHOT, ["gold"], engine_config(4096),
                            lambda: factors)  # fmt: skip
    assert not scrape(metrics)["superinfer:admission_ttft_correction"].samples  # none yet
    correction = Correction(min_samples=2)
    for _ in range(2):
        correction.observe("gold", 0.4, 0.6)  # 1.5x slower than estimated
    correction.observe(None, 0.4, 0.4)  # one sample: "none" borrows the pooled factor
    factors.update(correction.applied(["gold", "silver"]))
    family = scrape(metrics)["superinfer:admission_ttft_correction"]
    assert family.type == "gauge"
    assert value(family, slo_class="gold") == pytest.approx(1.5)
    assert value(family, slo_class="silver") == pytest.approx(1.5)  # pooled: 90th pct of 3
    assert value(family, slo_class="none") == pytest.approx(1.5)
    assert {s.labels["slo_class"] for s in family.samples} == {"gold", "silver", "none"}
    assert {s.labels["model_name"] for s in family.samples} == {MODEL}


def test_grafana_dashboard_filters_by_model_and_reads_exported_series():
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    selectors = [m for e in exprs for m in re.finditer(r"((?:vllm|superinfer):\w+)(\{[^}]*\})?", e)]
    for selector in selectors:
        assert 'model_name=~"$model"' in (selector.group(2) or ""), selector.group(0)
    metrics = make_metrics()
    finish(metrics, record())
    text = generate_latest(metrics.registry).decode()
    exported = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    used = {selector.group(1) for selector in selectors}
    assert used and used <= exported, used - exported
