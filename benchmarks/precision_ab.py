"""Admission's precision, A against B: interleaved pairs of served runs of two checkouts.

Precision (the share of admitted requests that met every target) moves by several points
between runs of the same code here: the machine's speed drifts within minutes, and one
long prompt admitted or refused near its TTFT target decides a run's first misses. A
change to admission is judged on pairs run one after the other, base then change, each
pair on the same workload (`benchmarks/vs_vllm/run.py`, superinfer alone, the client's
TTFT and TBT targets on every request), pooled over the pairs:

    git worktree add /tmp/base BASE_COMMIT
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/precision_ab.py --base /tmp/base \\
        --rates 6,3 --pairs 3 --out docs/results/slo_promise/NAME

Each run is `OUT/{base,change}_rRATE_PAIR/`; `OUT/summary.json` has, per arm and rate,
the runs' admitted, met, precision, goodput and output throughput, the pooled precision,
and every missed request (its arrival in the run, prompt, the TTFT admission estimated
when the server's responses carry it, measured TTFT and TPOT). `--summarize` rebuilds the
summary from runs already there.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
ARMS = ("base", "change")


def run_point(arm: str, base: Path, rate: float, out: Path, duration: int) -> None:
    """One served run of `arm` (base: the checkout at `base`; change: this one)."""
    env = {**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")}
    if arm == "base":  # the sweep hands its environment to the server it starts
        env["PYTHONPATH"] = str(base)
    command = [sys.executable, str(REPO / "benchmarks" / "vs_vllm" / "run.py"), "--no-probe",
               "--duration", str(duration), "--systems", "rotasched", "--rates", f"{rate:g}",
               "--out", str(out)]  # fmt: skip
    with open(out.with_suffix(".log"), "w") as log:
        subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT, check=True)


def run_summary(path: Path) -> dict[str, Any]:
    """One run's admission figures and its misses."""
    result = json.loads(path.read_text())
    records = result["records"]
    start = min(r["scheduled_arrival_s"] for r in records)
    admitted = [r for r in records if r["outcome"] == "finished"]
    missed = [
        r for r in admitted if not (r["server_slo"]["ttft_met"] and r["server_slo"]["tpot_met"])
    ]
    return {
        "result": str(path), "num_requests": len(records), "num_admitted": len(admitted),
        "num_met": len(admitted) - len(missed),
        "precision": round((len(admitted) - len(missed)) / max(1, len(admitted)), 4),
        "goodput_req_s": round(result["goodput"], 4),
        "output_tok_s": round(result["output_throughput"], 1),
        "missed": [{
            "id": r["request_id"], "arrival_s": round(r["scheduled_arrival_s"] - start, 2),
            "prompt_tokens": r["prompt_tokens"], "estimated_ttft_ms": r.get("estimated_ttft_ms"),
            "ttft_ms": r["server_slo"]["ttft_ms"], "tpot_ms": r["server_slo"]["tpot_ms"],
        } for r in missed],
    }  # fmt: skip


def summarize(out: Path) -> dict[str, Any]:
    """Every `ARM_rRATE_PAIR/` run folder in `out`, by arm and rate."""
    summary: dict[str, Any] = {}
    for folder in sorted(out.glob("*_r*_*")):
        arm, rate, _ = folder.name.rsplit("_", 2)
        if not folder.is_dir() or not rate.startswith("r"):
            continue
        for path in folder.glob("rotasched_rate*.json"):
            summary.setdefault(arm, {}).setdefault(rate[1:], {"runs": []})["runs"].append(
                run_summary(path))  # fmt: skip
    for rates in summary.values():
        for point in rates.values():
            runs = point["runs"]
            num_admitted = sum(r["num_admitted"] for r in runs)
            num_met = sum(r["num_met"] for r in runs)
            point.update(num_admitted=num_admitted, num_met=num_met,
                         precision=round(num_met / max(1, num_admitted), 4),
                         mean_goodput_req_s=round(sum(r["goodput_req_s"] for r in runs) / len(runs), 4))  # fmt: skip
    return summary


def print_summary(summary: dict[str, Any]) -> None:
    print("| arm | rate | runs | admitted | met | precision | mean goodput req/s |")
    print("|---|---|---|---|---|---|---|")
    for arm, rates in summary.items():
        for rate, p in sorted(rates.items(), key=lambda kv: float(kv[0])):
            print(f"| {arm} | {rate} | {len(p['runs'])} | {p['num_admitted']} | {p['num_met']} | "
                  f"{100 * p['precision']:.1f}% | {p['mean_goodput_req_s']:.3f} |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", type=Path, required=True, help="a checkout of the base commit")
    parser.add_argument("--rates", default="6", help="comma-separated request rates")
    parser.add_argument("--pairs", type=int, default=3, help="interleaved pairs per rate")
    parser.add_argument("--duration", type=int, default=60, help="seconds of arrivals per run")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--summarize", action="store_true", help="only rebuild the summary")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.summarize:
        for rate in (float(r) for r in args.rates.split(",")):
            for pair in range(1, args.pairs + 1):
                for arm in ARMS:
                    run_point(arm, args.base, rate, args.out / f"{arm}_r{rate:g}_{pair}",
                              args.duration)  # fmt: skip
    summary = summarize(args.out)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print_summary(summary)


if __name__ == "__main__":
    main()
