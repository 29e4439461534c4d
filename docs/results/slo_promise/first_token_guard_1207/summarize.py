"""Condense the runs' `bench serve` results into runs.json (one entry per run and rate:
attainment, precision, per-class met / total, refusals, output tok/s, goodput, and each
admitted request that missed), and print the table the README quotes.

    python summarize.py /tmp/mt chg2 base2 ...   # writes runs.json next to this file
    python summarize.py                          # prints the table from runs.json
"""

import collections
import json
import sys
from pathlib import Path

HERE = Path(__file__).parent
CLASSES = ("gold", "silver", "bronze")


def summarize(path: Path) -> dict:
    d = json.loads(path.read_text())
    met, num, misses, num_refused = collections.Counter(), collections.Counter(), [], 0
    for r in d["records"]:
        num[r["slo_class"]] += 1
        slo = r.get("slo") or {}
        if r["status"] != 200:
            num_refused += 1
            continue
        is_met = bool(slo.get("ttft_met") and slo.get("tpot_met") and slo.get("deadline_met"))
        met[r["slo_class"]] += is_met
        if not is_met:
            misses.append(
                {
                    "class": r["slo_class"],
                    "prompt_tokens": r["prompt_tokens"],
                    "max_tokens": r["max_tokens"],
                    "estimated_ttft_ms": r.get("estimated_ttft_ms"),
                    "ttft_ms": slo.get("ttft_ms"),
                    "tpot_ms": slo.get("tpot_ms"),
                }
            )
    return {
        "attainment": d["slo_attainment"],
        "precision": d["precision"],
        "met": {c: met[c] for c in CLASSES},
        "num": {c: num[c] for c in CLASSES},
        "refused": num_refused,
        "output_tok_s": d["output_throughput"],
        "goodput": d["request_goodput"],
        "admitted_misses": misses,
    }


def table(runs: dict) -> None:
    for name, by_rate in runs.items():
        for rate, s in by_rate.items():
            cls = "  ".join(f"{c} {s['met'][c]}/{s['num'][c]}" for c in CLASSES)
            print(
                f"{name:6} {rate} req/s  all met {s['attainment']:.3f}  precision {s['precision']:.3f}"
                f"  {cls}  refused {s['refused']}  output {s['output_tok_s']:.0f} tok/s"
            )


if __name__ == "__main__":
    out = HERE / "runs.json"
    if len(sys.argv) > 2:
        root = Path(sys.argv[1])
        runs = {
            name: {rate: summarize(root / name / f"rotasched_rate{rate}.json") for rate in (4, 6)}
            for name in sys.argv[2:]
        }
        out.write_text(json.dumps(runs, indent=1) + "\n")
    table(json.loads(out.read_text()))
