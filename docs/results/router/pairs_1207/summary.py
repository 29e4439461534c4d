"""Per-run summary of `benchmarks/router.py --keep DIR` runs from their SLO logs: requests
sent, admitted, met; attainment and precision; per class; the admitted requests' misses.

usage: python summary.py DIR [DIR ...]
"""

import json
import sys
from collections import Counter
from pathlib import Path


def summarize(keep: Path) -> dict:
    records = [json.loads(line) for log in keep.glob("*.slo.jsonl") for line in log.open()]
    admitted = [r for r in records if r["outcome"] == "finished"]
    num_met = sum(r["all_met"] for r in admitted)
    by_class = {}
    for name in ("gold", "silver", "bronze"):
        sent = [r for r in records if r["class"] == name]
        by_class[name] = {
            "sent": len(sent),
            "met": sum(r["all_met"] for r in sent),
            "refused": sum(r["outcome"] != "finished" for r in sent),
        }
    misses = Counter(
        f"{r['class']} {'ttft' if not r['ttft_met'] else 'tpot'}"
        for r in admitted
        if not r["all_met"]
    )
    return {
        "run": keep.name,
        "sent": len(records),
        "admitted": len(admitted),
        "met": num_met,
        "attainment": round(num_met / max(1, len(records)), 3),
        "precision": round(num_met / max(1, len(admitted)), 3),
        "by_class": by_class,
        "admitted_misses": dict(misses),
    }


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(json.dumps(summarize(Path(arg))))
