"""Summarize ab.sh's runs: per arm and repeat the attainment, refusals, precision, gold's
all-met and the prefix cache's hit rate; then per repeat the index arm minus each other."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def main(folder: Path) -> None:
    runs: dict[tuple[str, int], dict] = {}
    for path in sorted(folder.glob("*_*.json")):
        arm, _, repeat = path.stem.rpartition("_")
        runs[arm, int(repeat)] = json.loads(path.read_text())["routing_runs"][0]
    arms = sorted({arm for arm, _ in runs})
    repeats = sorted({repeat for _, repeat in runs})
    print("| arm | repeat | attainment | refused | precision | gold all met | hit rate |")
    print("|---|---|---|---|---|---|---|")
    for arm in arms:
        for repeat in repeats:
            if (arm, repeat) not in runs:
                continue
            r = runs[arm, repeat]
            print(f"| {arm} | {repeat} | {r['slo_attainment']:.3f} | {r['rejected']} | "
                  f"{r['precision']:.3f} | {r['all_met_by_class'].get('gold', 0):.3f} | "
                  f"{r['prefix_cache']['hit_rate']:.3f} |")  # fmt: skip
    for other in (a for a in arms if a != "index"):
        diffs = [runs["index", k]["slo_attainment"] - runs[other, k]["slo_attainment"]
                 for k in repeats if ("index", k) in runs and (other, k) in runs]  # fmt: skip
        if len(diffs) > 1:
            error = statistics.stdev(diffs) / len(diffs) ** 0.5
            print(f"index - {other}: mean {statistics.mean(diffs):+.3f} (standard error "
                  f"{error:.3f}), per repeat {', '.join(f'{d:+.3f}' for d in diffs)}")  # fmt: skip


if __name__ == "__main__":
    main(Path(sys.argv[1]))
