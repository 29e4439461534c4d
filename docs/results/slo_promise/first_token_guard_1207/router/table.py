"""First turns, 4 req/s, two replicas: slo routing against power-of-two (one try), per
seed, from this folder's router.py results (`ftg_{slo,p2}_s{seed}.json`)."""

import json
import statistics
from pathlib import Path

HERE = Path(__file__).parent
diffs = []
print(
    "| seed | slo | p2 | slo - p2 | refused (slo / p2) | precision (slo / p2) | gold (slo / p2) |"
)
print("|---|---|---|---|---|---|---|")
for seed in range(1, 7):
    slo, p2 = (json.loads((HERE / f"ftg_{arm}_s{seed}.json").read_text())["routing_runs"][0]
               for arm in ("slo", "p2"))  # fmt: skip
    diff = slo["slo_attainment"] - p2["slo_attainment"]
    diffs.append(diff)
    print(
        f"| {seed} | {slo['slo_attainment']:.3f} | {p2['slo_attainment']:.3f} | {diff:+.3f} | "
        f"{slo['rejected']} / {p2['rejected']} | {slo['precision']:.3f} / {p2['precision']:.3f} | "
        f"{slo['all_met_by_class']['gold']:.3f} / {p2['all_met_by_class']['gold']:.3f} |"
    )
se = statistics.stdev(diffs) / len(diffs) ** 0.5
print(f"\nmean {statistics.mean(diffs):+.3f} (standard error {se:.3f}) over {len(diffs)} seeds")
