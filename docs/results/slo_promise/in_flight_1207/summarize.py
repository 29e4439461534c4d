"""Summarize the A/B runs of this folder (`runs.sh`): per arm, what it refused, met and
admitted in vain, the refusal cost against the point's admission-off replay, output
tokens per second, and how admitted requests' measured TTFT compared with the estimate
the server answered with (its `estimated_ttft_ms`), over all and over estimates above
500 ms.

    python3 summarize.py /tmp/ab > summary.json
"""

from __future__ import annotations

import glob
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from superinfer.bench.refusal_cost import compare  # noqa: E402


def is_met(record: dict) -> bool:
    slo = record["slo"]
    return (record["outcome"] != "rejected" and bool(slo["ttft_met"]) and bool(slo["tpot_met"])
            and slo["deadline_met"] is not False)  # fmt: skip


def arm(folder: Path, replay: dict | None) -> dict:
    (path,) = glob.glob(str(folder / "rotasched_rate*.json"))
    result = json.loads(Path(path).read_text())
    records = result["records"]
    refused = [r for r in records if r["outcome"] == "rejected"]
    admitted = [r for r in records if r["outcome"] != "rejected"]
    by_class: dict[str, list[int]] = {}
    for r in records:
        counts = by_class.setdefault(r["slo_class"] or "none", [0, 0])
        counts[0] += is_met(r)
        counts[1] += 1
    ratios = sorted((r["slo"]["ttft_ms"] / max(r["estimated_ttft_ms"], 100.0), r["estimated_ttft_ms"])
                    for r in admitted if r.get("estimated_ttft_ms") and r["slo"]["ttft_ms"])  # fmt: skip
    long = [q for q, e in ratios if e > 500]
    summary = {
        "rate": result["request_rate"], "requests": len(records), "refused": len(refused),
        "met": sum(map(is_met, records)),
        "precision": round(sum(map(is_met, admitted)) / max(1, len(admitted)), 3),
        "met_by_class": {c: f"{m}/{n}" for c, (m, n) in sorted(by_class.items())},
        "output_tok_s": round(result["output_throughput"], 1),
        "ttft_over_estimate_median": round(statistics.median(q for q, _ in ratios), 2),
        "ttft_over_estimate_median_above_500ms": round(statistics.median(long), 2) if long else None,
        "num_estimates_above_500ms": len(long),
    }
    if replay is not None:
        cost = compare(result, replay)
        summary["refusal_cost"] = round(cost["refusal_cost"], 3)
        summary["refused_that_replay_met"] = round(cost["refusal_cost"] * len(refused))
    return summary


def main() -> None:
    root = Path(sys.argv[1])
    replays = {}
    for path in glob.glob(str(root / "*" / "rotasched-no-admission_rate*.json")):
        result = json.loads(Path(path).read_text())
        replays[(result["class_mix"] is not None, result["request_rate"])] = result
    out = {}
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        if not glob.glob(str(folder / "rotasched_rate*.json")):
            continue
        (path,) = glob.glob(str(folder / "rotasched_rate*.json"))
        head = json.loads(Path(path).read_text())
        replay = replays.get((head["class_mix"] is not None, head["request_rate"]))
        out[folder.name] = arm(folder, replay)
    out["replays_met"] = {f"{'classes' if k[0] else 'uniform'}@{k[1]}": sum(map(is_met, r["records"]))
                          for k, r in sorted(replays.items())}  # fmt: skip
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
