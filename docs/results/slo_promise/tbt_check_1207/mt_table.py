"""Print the multi-turn runs of the README (two replicas, slo routing unless said), one line
per seed and arm, from `benchmarks/router.py`'s results in multiturn/.

    python mt_table.py 0 1 2
"""

import argparse
import json
from pathlib import Path

ARMS = {"mg_slo": "slo, default", "mc_chk": "slo, TBT check", "mg_p2": "power-of-two, default",
        "md_slo": "slo, new default", "md_p2": "power-of-two, new default"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("seeds", type=int, nargs="+")
    parser.add_argument("--dir", type=Path, default=Path(__file__).parent / "multiturn")
    args = parser.parse_args()
    print("| seed | replicas | attainment | precision | gold | silver | bronze | goodput | refused | output tok/s |")
    print("|---" * 10 + "|")
    for seed in args.seeds:
        for prefix, name in ARMS.items():
            path = args.dir / f"{prefix}_s{seed}.json"
            if not path.exists():
                continue
            run = json.loads(path.read_text())["routing_runs"][0]
            met = run["all_met_by_class"]
            print(f"| {seed} | {name} | {run['slo_attainment']:.3f} | {run['precision']:.3f} | "
                  f"{met['gold']:.3f} | {met['silver']:.3f} | {met['bronze']:.3f} | "
                  f"{run['goodput']:.2f} | {run['rejected']}/{run['num_prompts']} | "
                  f"{run['output_throughput']:.0f} |")


if __name__ == "__main__":
    main()
