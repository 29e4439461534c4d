"""`superinfer bench sweep` without servers: systems, commands, summary rows, plots, and
the Prometheus parsing behind the KV timeline."""

from __future__ import annotations

import argparse
import sys

import pytest

from superinfer.bench.plots import plot_sweep
from superinfer.bench.scrape import parse_metrics
from superinfer.bench.sweep import (
    System,
    parse_rates,
    parse_systems,
    server_command,
    summary_rows,
    summary_text,
)


def test_systems_from_flags():
    args = argparse.Namespace(system=["rotasched", "fcfs-recompute"],
                              server_commands=["vllm=vllm serve /m --port {port}"],
                              external=["peer=http://10.0.0.1:8000"])  # fmt: skip
    assert parse_systems(args) == [
        System("rotasched", policy="rotasched"), System("fcfs-recompute", policy="fcfs-recompute"),
        System("vllm", command="vllm serve /m --port {port}"),
        System("peer", url="http://10.0.0.1:8000"),
    ]  # fmt: skip
    args.external = ["rotasched=http://x"]
    with pytest.raises(ValueError, match="repeat"):
        parse_systems(args)
    args.external = ["no-url"]
    with pytest.raises(ValueError):
        parse_systems(args)
    assert parse_rates("0.5, 1,2") == [0.5, 1.0, 2.0]
    with pytest.raises(ValueError):
        parse_rates("1,0")


def test_server_commands():
    argv = server_command(System("edf", policy="edf"), 9000, "--num-device-blocks 64", "c.yaml")
    assert argv == [sys.executable, "-P", "-m", "superinfer.cli", "serve", "--port", "9000",
                    "--policy", "edf", "--num-device-blocks", "64", "--slo-config", "c.yaml"]  # fmt: skip
    assert "c.yaml" not in server_command(System("edf", policy="edf"), 1, "--slo-config o.yaml",
                                          "c.yaml")  # fmt: skip
    template = System("vllm", command="vllm serve '/my dir' --port {port} --dtype bfloat16")
    assert server_command(template, 8100, "--ignored", None) == [
        "vllm", "serve", "/my dir", "--port", "8100", "--dtype", "bfloat16"]  # fmt: skip


PROMETHEUS = """\
# HELP vllm:kv_cache_usage_perc Device KV blocks in use (1 = 100%).
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m"} 0.25
# HELP superinfer:rotations KV rotations to the host tier.
# TYPE superinfer:rotations counter
superinfer:rotations_total{model_name="m"} 7.0
# HELP superinfer:kv_transfer_bytes KV bytes moved between the tiers.
# TYPE superinfer:kv_transfer_bytes counter
superinfer:kv_transfer_bytes_total{direction="d2h"} 100.0
superinfer:kv_transfer_bytes_total{direction="h2d"} 40.0
# HELP vllm:num_requests_running Running.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="a"} 2.0
vllm:num_requests_running{model_name="b"} 3.0
"""


def test_parse_metrics():
    assert parse_metrics(PROMETHEUS) == {
        "vllm:kv_cache_usage_perc": 0.25, "superinfer:rotations_total": 7.0,
        "superinfer:kv_transfer_bytes_total{direction=d2h}": 100.0,
        "superinfer:kv_transfer_bytes_total{direction=h2d}": 40.0,
        "vllm:num_requests_running": 5.0,
    }  # fmt: skip


def point(system, rate, ttft_att, ttft_ms):
    record = {"outcome": "finished", "output_tokens": 4,
              "slo": {"ttft_ms": ttft_ms, "tpot_ms": 30.0}}  # fmt: skip
    return {"system": system, "request_rate": rate, "ttft_attainment": ttft_att,
            "tpot_attainment": 1.0, "slo_attainment": ttft_att, "goodput": rate * ttft_att,
            "output_throughput": 10.0, "median_ttft_ms": ttft_ms, "rejected": 0,
            "slo_targets": [{"class": None, "ttft_ms": 1000, "tbt_ms": 200}],
            "records": [record, {**record, "slo": {"ttft_ms": ttft_ms * 2, "tpot_ms": 40.0}}],
            "metrics_timeline": [{"t": 0.0, "vllm:kv_cache_usage_perc": 0.1,
                                  "superinfer:rotations_total": 3.0},
                                 {"t": 0.5, "vllm:kv_cache_usage_perc": 0.9,
                                  "superinfer:rotations_total": 5.0}]}  # fmt: skip


def test_summary_and_plots(tmp_path):
    points = [point("b", 2.0, 0.5, 900.0), point("a", 2.0, 1.0, 100.0), point("a", 1.0, 1.0, 80.0)]
    rows = summary_rows(points)
    assert [(r["system"], r["request_rate"]) for r in rows] == [("a", 1.0), ("a", 2.0), ("b", 2.0)]
    assert rows[2]["goodput"] == 1.0 and rows[0]["p99_ttft_ms"] is None
    text = summary_text(rows)
    assert len(text.splitlines()) == 4 and "n/a" in text
    paths = plot_sweep(points, str(tmp_path))
    assert [p.rsplit("/", 1)[1] for p in paths] == [
        "attainment_vs_rate.png", "latency_cdfs.png", "kv_timeline.png"]  # fmt: skip
    for path in paths:
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
