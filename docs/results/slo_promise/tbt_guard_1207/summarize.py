"""Condense `benchmarks/vs_vllm/run.py` result folders into runs.json (per run, system and
rate: attainment, precision, per-class met / total, refusals, output tok/s, goodput, each
admitted request that missed) and print the table the README quotes, with the admitted
misses split into late first tokens and slow means (TPOT).

    python summarize.py /tmp/mt r1 r2 ...   # every SYSTEM_rateR.json in /tmp/mt/r1, ...
    python summarize.py                     # prints the table from runs.json
"""

import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "first_token_guard_1207"))
from summarize import CLASSES, summarize


def arm(run: str, system: str) -> str:
    """Which arm a result is: `rounds.sh` ran the guard as the plain system ("rotasched")
    in odd rounds (with "base" the variant without it) and as the variant "tbt" in even
    ones (r1 ran an earlier version of the guard, and "both" had the first-token guard on)."""
    if system == "rotasched":
        return "guard" if int(run[1:]) % 2 else "base"
    return {"tbt": "guard"}.get(system, system)


def averages(runs: dict) -> None:
    """Per workload, rate and arm, the mean over the rounds (r1's earlier version left out)."""
    groups: dict[tuple[str, str, str], list[dict]] = {}
    for key, s in runs.items():
        run, system, rate = key.split()
        if run != "r1":
            groups.setdefault((run[0], rate, arm(run, system)), []).append(s)
    for (workload, rate, name), group in sorted(groups.items()):
        mean = {k: sum(s[k] for s in group) / len(group)
                for k in ("attainment", "precision", "refused", "goodput", "output_tok_s")}  # fmt: skip
        met = {c: sum(s["met"][c] for s in group) / len(group) for c in CLASSES}
        num_misses = sum(len(s["admitted_misses"]) for s in group) / len(group)
        cls = "  ".join(f"{c} {met[c]:.1f}/{group[0]['num'][c]}" for c in CLASSES
                        if group[0]["num"][c])  # fmt: skip
        print(
            f"{workload} {rate} req/s {name:6} ({len(group)} runs)  all met "
            f"{mean['attainment']:.3f}  precision {mean['precision']:.3f}  {cls}  refused "
            f"{mean['refused']:.1f}  admitted misses {num_misses:.1f}  goodput "
            f"{mean['goodput']:.2f}  output {mean['output_tok_s']:.0f} tok/s"
        )


def table(runs: dict) -> None:
    for key, s in runs.items():
        cls = "  ".join(f"{c} {s['met'][c]}/{s['num'][c]}" for c in CLASSES if s["num"][c])
        misses = s["admitted_misses"]
        num_ttft = sum(m["ttft_ms"] > _TTFT_MS.get(m["class"], 1000) for m in misses)
        print(
            f"{key:20} {arm(key.split()[0], key.split()[1]):5} all met {s['attainment']:.3f}  precision {s['precision']:.3f}  {cls}"
            f"  refused {s['refused']}  output {s['output_tok_s']:.0f} tok/s"
            f"  misses {len(misses)} (ttft {num_ttft}, tpot {len(misses) - num_ttft})"
        )


_TTFT_MS = {"gold": 500, "silver": 1000, "bronze": 5000}  # the default classes; uniform: 1 s


def main(out: Path) -> None:
    """`python summarize.py ROOT RUN...` rewrites `out` from ROOT/RUN/*_rate*.json; both
    forms print the tables from it (the folders that import this one call it too).
    `--runs PATH` first: PATH instead of `out`."""
    args = sys.argv[1:]
    if args[:1] == ["--runs"]:
        out, args = Path(args[1]), args[2:]
    if len(args) > 1:
        root = Path(args[0])
        runs = {}
        for name in args[1:]:
            for path in sorted((root / name).glob("*_rate*.json")):
                match = re.fullmatch(r"(.+)_rate([\d.]+)\.json", path.name)
                if match:
                    runs[f"{name} {match[1]} {match[2]}"] = summarize(path)
        out.write_text(json.dumps(runs, indent=1) + "\n")
    runs = json.loads(out.read_text())
    table(runs)
    print()
    averages(runs)


if __name__ == "__main__":
    main(HERE / "runs.json")
