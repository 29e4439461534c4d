"""The table of `run.sh`'s results: one line per simulated run.

python summarize.py /tmp/gh200_classes
"""

import argparse
import json
import re
from pathlib import Path

CLASSES = ("gold", "silver", "bronze")


def _rate(path: Path) -> float:
    return float(re.search(r"rate([\d.]+)\.json$", path.name).group(1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder", type=Path)
    folder = parser.parse_args().folder
    print(
        "| run | rate (req/s) | all met | precision | gold | silver | bronze | refused | output tok/s |"
    )
    print("|---" * 9 + "|")
    for path in sorted(folder.glob("*_rate*.json"), key=lambda p: (p.name.split("_")[0], _rate(p))):
        run = json.loads(path.read_text())
        by_class = run.get("classes") or {}
        cells = [f"{by_class[c]['slo_attainment']:.3f}" if c in by_class else "" for c in CLASSES]
        print(
            f"| {path.name.split('_rate')[0]} | {_rate(path):g} | {run['slo_attainment']:.3f} | "
            f"{run['precision']:.3f} | "
            + " | ".join(cells)
            + f" | {run['num_rejected']} | {run['output_throughput']:.0f} |"
        )


if __name__ == "__main__":
    main()
