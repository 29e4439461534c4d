"""`superinfer bench serve --help` / `sweep --help` explain every flag, docs/bench.md names
every flag, and the flags map onto the workload and endpoint options."""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

import pytest

from superinfer.bench.cli import serve_options, workload_config
from superinfer.cli import build_parser

DOC = Path(__file__).resolve().parents[2] / "docs" / "bench.md"


def bench_parser(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    (bench,) = [
        a for a in sub.choices["bench"]._actions if isinstance(a, argparse._SubParsersAction)
    ]
    return bench.choices[name]


@pytest.mark.parametrize("name", ["serve", "sweep"])
def test_every_flag_is_explained_and_documented(name):
    text = DOC.read_text()
    for action in bench_parser(name)._actions:
        if not action.option_strings or action.dest == "help":
            continue
        flag = action.option_strings[0]
        assert action.help and len(action.help) > 10, flag
        assert re.search(re.escape(flag) + r"(?![\w-])", text), f"{flag} not in docs/bench.md"


def test_flags_to_options():
    args = bench_parser("serve").parse_args(
        ["--duration", "30", "--request-rate", "2", "--metric-percentiles", "50,99.9"]
    )
    config, options = workload_config(args), serve_options(args)
    assert (config.duration, config.num_prompts, config.request_rate) == (30.0, None, 2.0)
    assert options.metric_percentiles == (50.0, 99.9)
    assert math.isinf(workload_config(bench_parser("serve").parse_args([])).request_rate)
    sweep = bench_parser("sweep").parse_args(["--output-dir", "x", "--system", "edf"])
    assert workload_config(sweep, request_rate=3.0).request_rate == 3.0
    assert (sweep.num_warmups, sweep.metrics_interval) == (2, 0.5)


def test_refusal_cost_compares_a_run_with_its_replay(tmp_path, capsys):
    import json

    from superinfer.cli import main

    def rec(i, outcome, met, code=None):
        slo = {"ttft_ms": 1.0, "tpot_ms": 1.0, "max_tbt_ms": 1.0, "e2e_ms": 1.0, "queue_ms": 0.0,
               "ttft_met": met, "tpot_met": met, "deadline_met": True}  # fmt: skip
        return {"slo_class": "gold" if i % 2 else "bronze", "scheduled_arrival_s": i * 0.1,
                "targets": {"ttft_ms": 500, "tbt_ms": 100, "max_latency_ms": None},
                "outcome": outcome, "error_code": code, "prompt_tokens": 5, "slo": slo}  # fmt: skip

    refused = [rec(i, "rejected", False, "slo_infeasible") for i in range(4)]
    run = {"precision": 1.0, "records": refused + [rec(4, "finished", True)]}
    replay = {"records": [rec(i, "finished", i < 3) for i in range(5)]}
    paths = [tmp_path / "run.json", tmp_path / "replay.json"]
    for path, data in zip(paths, (run, replay)):
        path.write_text(json.dumps(data))
    assert main(["bench", "refusal-cost", *map(str, paths)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["refusal_cost"] == 0.75 and out["num_refused"] == 4
    assert out["refusal_cost_by_class"] == {"bronze": 1.0, "gold": 0.5}
    replay["records"][0]["slo_class"] = "gold"
    paths[1].write_text(json.dumps(replay))
    assert main(["bench", "refusal-cost", *map(str, paths)]) != 0
    assert "not the same workload" in capsys.readouterr().err
