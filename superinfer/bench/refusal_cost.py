"""`superinfer bench refusal-cost RUN REPLAY`: what admission's refusals cost.

RUN is a `bench serve` result of a server with admission on; REPLAY the same workload
(same seed, same flags) against the same server started with admission off
(`superinfer serve --no-reject-infeasible-ttft --no-reject-infeasible-tbt`). The refusal
cost is the share of the requests RUN refused that met all their targets in REPLAY (`slo/metrics.py`), overall and
per class; with the precision of RUN beside it, it judges admission from both sides.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from superinfer.slo.metrics import SLOReport, refusal_cost
from superinfer.slo.targets import SLOTargets


def report_of(record: dict[str, Any]) -> SLOReport:
    """The SLO report a result record carries (the client's judgement of it)."""
    slo, targets = record["slo"], record["targets"]
    return SLOReport(
        record["slo_class"], SLOTargets(targets["ttft_ms"], targets["tbt_ms"],
                                        targets["max_latency_ms"], record["slo_class"]),
        record["outcome"], slo["ttft_ms"], slo["tpot_ms"], slo["max_tbt_ms"], slo["e2e_ms"],
        slo["queue_ms"], slo["ttft_met"], slo["tpot_met"], slo["deadline_met"], 0, 0,
        rejection_reason=record["error_code"],
    )  # fmt: skip


def compare(run: dict[str, Any], replay: dict[str, Any]) -> dict[str, Any]:
    """Refusal cost overall and per class, with the run's precision."""
    run_records, replay_records = run["records"], replay["records"]
    _check_same_workload(run_records, replay_records)
    admitted = [report_of(r) for r in run_records]
    served = [report_of(r) for r in replay_records]
    classes = sorted({r.slo_class for r in admitted}, key=lambda c: (c is None, c or ""))
    by_class = {}
    for name in classes:
        index = [i for i, r in enumerate(admitted) if r.slo_class == name]
        by_class[name or "none"] = refusal_cost(
            [admitted[i] for i in index], [served[i] for i in index]
        )
    return {
        "refusal_cost": refusal_cost(admitted, served),
        "refusal_cost_by_class": by_class,
        "num_refused": sum(1 for r in admitted if r.outcome == "rejected"),
        "precision": run.get("precision"),
    }


def _check_same_workload(run: Sequence[dict], replay: Sequence[dict]) -> None:
    if len(run) != len(replay) or any(
        a["slo_class"] != b["slo_class"] or a["scheduled_arrival_s"] != b["scheduled_arrival_s"]
        for a, b in zip(run, replay)
    ):
        raise ValueError(
            f"the two results are not the same workload ({len(run)} vs {len(replay)} "
            "requests, or their classes or arrival times differ): replay with the same seed "
            "and flags"
        )


def run_refusal_cost_command(run_path: str, replay_path: str) -> int:
    with open(run_path, encoding="utf-8") as f:
        run = json.load(f)
    with open(replay_path, encoding="utf-8") as f:
        replay = json.load(f)
    print(json.dumps(compare(run, replay), indent=1))
    return 0
