"""Summarize `run.sh`'s runs: per seed and pooled over the seeds, for the class mix at 2x
each class's met count under superinfer and vLLM's priority scheduler; for every request at
TTFT 1 s / TPOT 200 ms the precision, the refusals and how many of them the admission-off
replay met (refusal cost), and at 0.5x the goodput against vLLM's.

    python3 summarize.py /tmp/seeds > summary.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from superinfer.bench.refusal_cost import compare, report_of


def is_met(record: dict) -> bool:
    """Finished and met every target it had (the project's own judgement of a record)."""
    return report_of(record).is_all_met


def load(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def class_counts(result: dict) -> dict[str, list[int]]:
    """{class: [met, requests]}."""
    counts: dict[str, list[int]] = {}
    for record in result["records"]:
        met_and_total = counts.setdefault(record["slo_class"] or "none", [0, 0])
        met_and_total[0] += is_met(record)
        met_and_total[1] += 1
    return counts


def admission(result: dict, replay: dict) -> dict[str, int]:
    """Admitted, admitted that met, refused, refused that the replay met."""
    admitted = [r for r in result["records"] if r["outcome"] != "rejected"]
    num_refused = len(result["records"]) - len(admitted)
    cost = compare(result, replay)["refusal_cost"] if num_refused else 0.0
    return {"admitted": len(admitted), "admitted_met": sum(map(is_met, admitted)),
            "refused": num_refused, "refused_replay_met": round(cost * num_refused)}  # fmt: skip


def pct(num: int, den: int) -> str:
    return f"{100 * num / den:.1f}%" if den else "-"


def main() -> None:
    root = Path(sys.argv[1])
    seeds = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("seed"))
    print("## Class mix at 4 req/s (2x): met / requests\n")
    print("| seed | system | gold | silver | bronze | all | precision (vLLM admits all) |")
    print("|---|---|---|---|---|---|---|")
    pooled: dict[str, dict[str, list[int]]] = {}
    for seed in seeds:
        for system in ("rotasched", "vllm"):
            result = load(seed / "classes" / f"{system}_rate4.json")
            if result is None:
                continue
            counts = class_counts(result)
            for name, (met, total) in counts.items():
                acc = pooled.setdefault(system, {}).setdefault(name, [0, 0])
                acc[0] += met
                acc[1] += total
            cells = [
                f"{counts.get(c, [0, 0])[0]}/{counts.get(c, [0, 0])[1]}"
                for c in ("gold", "silver", "bronze")
            ]
            all_met = sum(m for m, _ in counts.values())
            precision = f"{100 * result['precision']:.1f}%" if system == "rotasched" else ""
            print(
                f"| {seed.name[4:]} | {system} | {' | '.join(cells)} | {all_met}/{len(result['records'])} | {precision} |"
            )
    for system, counts in pooled.items():
        cells = [
            f"**{counts[c][0]}/{counts[c][1]}**"
            for c in ("gold", "silver", "bronze")
            if c in counts
        ]
        print(f"| all | {system} | {' | '.join(cells)} | | |")
    print("\n## Every request at TTFT 1 s / TPOT 200 ms\n")
    print(
        "| rate | seed | precision | refused | refused that the replay met | goodput (req/s) | vLLM goodput |"
    )
    print("|---|---|---|---|---|---|---|")
    for rate, sub in ((1, "uniform"), (2, "uniform_over"), (3, "uniform_over")):
        total = {"admitted": 0, "admitted_met": 0, "refused": 0, "refused_replay_met": 0}
        goodputs: list[tuple[float, float | None]] = []
        for seed in seeds:
            result = load(seed / sub / f"rotasched_rate{rate}.json")
            replay = load(seed / sub / f"rotasched-no-admission_rate{rate}.json")
            if result is None or replay is None:
                continue
            row = admission(result, replay)
            for key in total:
                total[key] += row[key]
            vllm = load(seed / sub / f"vllm_rate{rate}.json")
            vllm_goodput = vllm["goodput"] if vllm else None
            goodputs.append((result["goodput"], vllm_goodput))
            print(
                f"| {rate} | {seed.name[4:]} | {pct(row['admitted_met'], row['admitted'])} | {row['refused']} | "
                f"{row['refused_replay_met']} ({pct(row['refused_replay_met'], row['refused'])}) | "
                f"{result['goodput']:.2f} | {'' if vllm_goodput is None else f'{vllm_goodput:.2f}'} |"
            )
        if goodputs:
            ours = sum(g for g, _ in goodputs)
            theirs = [v for _, v in goodputs if v is not None]
            ratio = (
                f"{ours / sum(theirs):.2f}x"
                if theirs and sum(theirs) and len(theirs) == len(goodputs)
                else ""
            )
            print(
                f"| {rate} | all | **{pct(total['admitted_met'], total['admitted'])}** | {total['refused']} | "
                f"**{total['refused_replay_met']} ({pct(total['refused_replay_met'], total['refused'])})** | "
                f"{ours / len(goodputs):.2f} | {ratio} |"
            )


if __name__ == "__main__":
    main()
