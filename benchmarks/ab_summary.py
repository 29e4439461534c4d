"""Summarize interleaved A/B runs of `docs/results/slo_promise/gold_1205/ab.sh`.

Each run folder (`KIND_ARM_pN/`, as ab.sh names them) holds one `rotasched_rate*.json` of
`superinfer bench serve`. Prints one JSON object per run: goodput, precision, admitted
requests and the admitted ones that missed (arrival s, prompt tokens, estimated and measured
TTFT ms, TPOT ms), output tok/s, the all-met share per class, gold's losses and the refusals
by class and reason. The means per arm go to stderr.

    python benchmarks/ab_summary.py OUT/un > runs.json
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

REASONS = {"TTFT target": "ttft", "KV cache is committed": "kv", "deadline": "deadline"}


def refusal_reason(error: str) -> str:
    return next((kind for text, kind in REASONS.items() if text in error), "other")


def is_met(record: dict[str, Any]) -> bool:
    slo = record["slo"]
    return record["outcome"] != "rejected" and all(
        slo[k] for k in ("ttft_met", "tpot_met", "deadline_met")
    )


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    records = result["records"]
    admitted = [r for r in records if r["outcome"] != "rejected"]
    missed = [r for r in admitted if not is_met(r)]
    met_by_class: dict[str, list[bool]] = defaultdict(list)
    for r in records:
        met_by_class[r["slo_class"] or "none"].append(is_met(r))
    refused = [r for r in records if r["outcome"] == "rejected"]
    gold_lost = [r for r in records if r["slo_class"] == "gold" and not is_met(r)]
    return {
        "goodput": round(result["goodput"], 4),
        "precision": round(result["precision"], 4),
        "num_requests": len(records),
        "num_admitted": len(admitted),
        "output_tok_s": round(result["output_throughput"], 1),
        "all_met": {c: round(sum(v) / len(v), 4) for c, v in met_by_class.items()},
        "num_admitted_missed": len(missed),
        "missed": [
            (
                round(r["arrival_s"], 1),
                r["prompt_tokens"],
                r["estimated_ttft_ms"],
                r["slo"]["ttft_ms"],
                r["slo"]["tpot_ms"],
            )
            for r in missed
        ],
        "gold_losses": dict(
            Counter(
                "late" if r["outcome"] != "rejected" else f"refused/{refusal_reason(r['error'])}"
                for r in gold_lost
            )
        ),
        "refusals": dict(
            Counter(f"{r['slo_class']}/{refusal_reason(r['error'])}" for r in refused)
        ),
    }


def main() -> None:
    runs = {}
    for folder in sys.argv[1:]:
        for path in sorted(Path(folder).glob("*/rotasched_rate*.json")):
            runs[path.parent.name] = summarize(json.loads(path.read_text()))
    print(json.dumps(runs, indent=1))
    arms: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for name, run in runs.items():
        arms[name.rsplit("_p", 1)[0]].append(run)
    for arm, arm_runs in sorted(arms.items()):

        def mean(key: str, runs: list = arm_runs) -> float:
            return round(statistics.mean(r[key] for r in runs), 4)

        classes = sorted({c for r in arm_runs for c in r["all_met"]})
        per_class = {c: round(statistics.mean(r["all_met"].get(c, 0.0) for r in arm_runs), 4)
                     for c in classes}  # fmt: skip
        print(f"{arm}: {len(arm_runs)} runs, goodput {mean('goodput')}, precision "
              f"{mean('precision')}, admitted misses "
              f"{sum(r['num_admitted_missed'] for r in arm_runs)}, output tok/s "
              f"{mean('output_tok_s')}, all met {per_class}", file=sys.stderr)  # fmt: skip


if __name__ == "__main__":
    main()
