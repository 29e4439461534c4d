"""Simulated refusal cost and precision, over several seeds: each workload run twice in
`superinfer simulate` on a CPU step-time fit, with admission and without, and every
refused request looked up in the run without (did it meet both targets there?).

The points are issue 14's: ShareGPT chat, 60 s of Poisson arrivals, 5,824 device and
5,824 host KV tokens (364 blocks each), a 512-token step budget; `un` every request at
TTFT 1 s / TPOT 200 ms, `cm` the 20/30/50 gold/silver/bronze mix on the default classes.
Seed i draws the trace and the step noise. One line per point: requests meeting both
targets per run, goodput, precision (met among admitted), refused per run, refusal cost
(the refused that the admission-off run met, over all refused).

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/sim_refusal_cost.py \\
        --predictor docs/results/slo_promise/final_1205/cpu_fit.json --out /tmp/sim_rc

Compare two checkouts with `PYTHONPATH=<checkout>` and a separate --out each.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

MIX = "gold=0.2,silver=0.3,bronze=0.5"
POINTS = {"un3": ("3", False), "un4": ("4", False), "un6": ("6", False),
          "cm4": ("4", True), "cm6": ("6", True)}  # fmt: skip


def simulate(args: argparse.Namespace, point: str, seed: int, is_admission: bool) -> dict:
    """The result JSON of one simulated run (cached in --out)."""
    rate, is_mix = POINTS[point]
    path = Path(args.out) / f"{point}_s{seed}_{'admission' if is_admission else 'off'}.json"
    if not path.exists():
        targets = (
            ["--slo-classes", MIX] if is_mix else ["--ttft-slo-ms", "1000", "--tbt-slo-ms", "200"]
        )
        subprocess.run([
            sys.executable, "-P", "-m", "superinfer.cli", "simulate", "--hardware", "cpu",
            "--model", "smollm2-135m", "--predictor", args.predictor, "--dataset", "sharegpt",
            "--duration", "60", "--request-rate", rate, "--num-device-blocks", "364",
            "--num-host-blocks", "364", "--max-model-len", "2048",
            "--max-num-batched-tokens", "512", "--seed", str(seed), "--noise-seed", str(seed),
            "--admission" if is_admission else "--no-admission", "--records", "summary",
            "--output", str(path), *targets,
        ], check=True, capture_output=True)  # fmt: skip
    return json.loads(path.read_text())


def point_summary(args: argparse.Namespace, point: str) -> dict:
    counts: Counter = Counter()
    goodput = 0.0
    for seed in range(args.seeds):
        run = simulate(args, point, seed, True)
        off = {r["request_id"]: r for r in simulate(args, point, seed, False)["records"]}
        goodput += run["goodput"]
        for record in run["records"]:
            if record["outcome"] == "rejected":
                other = off[record["request_id"]]
                counts["refused"] += 1
                counts["would_have_met"] += bool(other["ttft_met"] and other["tpot_met"])
            else:
                counts["admitted"] += 1
                counts["met"] += bool(record["ttft_met"] and record["tpot_met"])
    n = args.seeds
    return {
        "point": point, "met_per_run": counts["met"] / n, "goodput": goodput / n,
        "precision": counts["met"] / max(1, counts["admitted"]),
        "refused_per_run": counts["refused"] / n,
        "refusal_cost": counts["would_have_met"] / max(1, counts["refused"]),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--predictor", required=True, help="a `superinfer calibrate` fit")
    parser.add_argument("--out", required=True, help="folder for the runs (reused if there)")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--points", default=",".join(POINTS), help="of " + ",".join(POINTS))
    args = parser.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    for point in args.points.split(","):
        s = point_summary(args, point)
        print(f"{point}: met/run {s['met_per_run']:.1f}, goodput {s['goodput']:.3f} req/s, "
              f"precision {s['precision']:.1%}, refused/run {s['refused_per_run']:.1f}, "
              f"refusal cost {s['refusal_cost']:.1%}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
