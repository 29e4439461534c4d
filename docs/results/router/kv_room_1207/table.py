"""Print the three arms of `runs.sh` per seed (slo routing with the KV room, slo routing
before it, power-of-two) and each slo arm's mean difference from power-of-two, overall and
by class, with its standard error.

    python table.py 1 2 3 4 5 6             # from runs/kr_{new,old,p2}_sSEED.json
    python table.py --dir /tmp/mt 1 2 3     # from where runs.sh wrote them
    python table.py --dir /tmp/mt --prefix fd --arms slo,p2 0 1 2   # other runs' files
"""

import argparse
import json
import statistics
from pathlib import Path

ARMS = {"new": "slo, KV room", "old": "slo before", "slo": "slo", "p2": "power-of-two"}
CLASSES = ("gold", "silver", "bronze")


def _row(run: dict) -> dict[str, float]:
    row = {"all": run["slo_attainment"], "refused": run["rejected"]}
    row.update({c: run["all_met_by_class"][c] for c in CLASSES})
    return row


def _mean_se(values: list[float]) -> str:
    se = statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else float("nan")
    return f"{statistics.mean(values):+.3f} (se {se:.3f})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("seeds", type=int, nargs="+")
    parser.add_argument("--dir", type=Path, default=Path(__file__).parent / "runs")
    parser.add_argument(
        "--prefix", default="kr", help="the runs' file names: PREFIX_ARM_sSEED.json"
    )
    parser.add_argument(
        "--arms", default="new,old,p2", help="comma-separated, power-of-two (p2) last"
    )
    args = parser.parse_args()
    arms = {arm: ARMS[arm] for arm in args.arms.split(",")}
    rows: dict[str, list[dict[str, float]]] = {arm: [] for arm in arms}
    print("| seed | " + " | ".join(arms.values()) + " | refused | gold | silver | bronze |")
    print("|---" * (len(arms) + 5) + "|")
    for seed in args.seeds:
        paths = {arm: args.dir / f"{args.prefix}_{arm}_s{seed}.json" for arm in arms}
        if not all(path.exists() for path in paths.values()):
            continue
        seed_rows = {arm: _row(json.loads(p.read_text())["routing_runs"][0])
                     for arm, p in paths.items()}  # fmt: skip
        for arm, row in seed_rows.items():
            rows[arm].append(row)
        cells = [f"{seed_rows[arm]['all']:.3f}" for arm in arms]
        cells.append(" / ".join(f"{seed_rows[arm]['refused']:.0f}" for arm in arms))
        cells += [" / ".join(f"{seed_rows[arm][c]:.3f}" for arm in arms) for c in CLASSES]
        print(f"| {seed} | " + " | ".join(cells) + " |")
    for arm in (a for a in arms if a != "p2"):
        pairs = list(zip(rows[arm], rows.get("p2", [])))
        if not pairs:
            continue
        parts = [f"{key} {_mean_se([a[key] - b[key] for a, b in pairs])}"
                 for key in ("all", *CLASSES)]  # fmt: skip
        ahead = sum(a["all"] > b["all"] for a, b in pairs)
        refused = statistics.mean(a["refused"] - b["refused"] for a, b in pairs)
        print(
            f"{ARMS[arm]} - power-of-two, n={len(pairs)}: "
            + "; ".join(parts)
            + f"; ahead in {ahead}; refused {refused:+.1f} a run"
        )
    pairs = list(zip(rows.get("new", []), rows.get("old", [])))
    if pairs:
        print(
            f"KV room - before, n={len(pairs)}: all {_mean_se([a['all'] - b['all'] for a, b in pairs])}"
        )


if __name__ == "__main__":
    main()
