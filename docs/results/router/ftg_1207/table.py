"""Print the first-turn pairs of `pairs.sh` (slo routing against power-of-two, per seed)
and the mean difference in attainment with its standard error.

    python table.py 1 2 3 4 5 6             # from runs/gd_{slo,p2}_sSEED.json
    python table.py --dir /tmp/mt 1 2 3     # from where pairs.sh wrote them
"""

import argparse
import json
import statistics
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("seeds", type=int, nargs="+")
    parser.add_argument("--dir", type=Path, default=Path(__file__).parent / "runs")
    args = parser.parse_args()
    diffs, gold_diffs = [], []
    for seed in args.seeds:
        runs = {}
        for arm in ("slo", "p2"):
            path = args.dir / f"gd_{arm}_s{seed}.json"
            if path.exists():
                runs[arm] = json.loads(path.read_text())["routing_runs"][0]
        if len(runs) < 2:
            continue
        a, b = runs["slo"], runs["p2"]
        diff = a["slo_attainment"] - b["slo_attainment"]
        diffs.append(diff)
        gold_diffs.append(a["all_met_by_class"]["gold"] - b["all_met_by_class"]["gold"])
        by_class = " ".join(
            f"{c} {a['all_met_by_class'][c]:.3f}/{b['all_met_by_class'][c]:.3f}"
            for c in ("gold", "silver", "bronze")
        )
        print(
            f"seed {seed}: slo {a['slo_attainment']:.3f} p2 {b['slo_attainment']:.3f} "
            f"diff {diff:+.3f} | refused {a['rejected']}/{b['rejected']} | precision "
            f"{a['precision']:.3f}/{b['precision']:.3f} | {by_class}"
        )
    if len(diffs) > 1:
        se = statistics.stdev(diffs) / len(diffs) ** 0.5
        num_gold_ahead = sum(d > 0 for d in gold_diffs)
        print(
            f"n={len(diffs)}: slo - p2 {statistics.mean(diffs):+.3f} (se {se:.3f}); gold "
            f"{statistics.mean(gold_diffs):+.3f}, slo ahead on gold in {num_gold_ahead}"
        )


if __name__ == "__main__":
    main()
