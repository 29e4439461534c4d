"""Where an SLO run's misses come from, per class: refused, admitted and met, admitted and
late on TTFT or on TPOT; and how the class did on the requests an idle engine could have
served in time at all (prompt x the warm-up's prefill cost + one decode step within the
TTFT target), which bounds what any scheduler can reach on this machine; and the most of
a class's first tokens any schedule could have delivered in time had the class had the
engine to itself (`most_in_time_alone`), which also counts the class's own queueing.

    benchmarks/slo_promise_breakdown.py RESULT.json [RESULT.json ...]

Reads `superinfer bench serve` results (benchmarks/vs_vllm/run.py writes them with the
server log beside, `NAME.server.log`, whose warm-up line gives the idle costs; for a
vLLM result, superinfer's log in the same folder is used).
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path

_WARMUP = re.compile(r"prefill ([\d.]+) ms/token, decode step ([\d.]+) ms")


def idle_costs(result: Path) -> tuple[float, float] | None:
    """(prefill s per token, decode step s) from a superinfer server log in the folder."""
    logs = [result.with_suffix(".server.log"), *sorted(result.parent.glob("*.server.log"))]
    for log in logs:
        match = log.exists() and _WARMUP.search(log.read_text(errors="replace"))
        if match:
            return float(match.group(1)) / 1000, float(match.group(2)) / 1000
    return None


def outcome(record: dict) -> str:
    if record["status"] != 200:
        return f"refused {record.get('error_code') or record['status']}"
    slo = record["slo"]
    if slo["ttft_met"] and slo["tpot_met"] and slo["deadline_met"]:
        return "met"
    return "late " + "+".join(name for name in ("ttft", "tpot", "deadline")
                              if not slo[f"{name}_met"])  # fmt: skip


def is_feasible_idle(record: dict, costs: tuple[float, float] | None) -> bool:
    if costs is None:
        return True
    prefill_s, step_s = costs
    return record["prompt_tokens"] * prefill_s + step_s <= record["targets"]["ttft_ms"] / 1000


def most_in_time_alone(records: list[dict], costs: tuple[float, float] | None) -> int | None:
    """The most of `records` (one class, one TTFT target) whose first tokens any schedule
    could deliver within the target had the class the engine to itself at the idle costs:
    a first token needs its prompt's prefill and one decode step, nothing else (attention
    pairs, later tokens and the other classes are left out: an upper bound). With one
    target for all, earliest-deadline-first serves them in arrival order, so the best set
    is exact by dynamic programming over arrivals: for each number served in time, the
    earliest the engine is free. None without costs or with mixed targets."""
    targets = {record["targets"]["ttft_ms"] for record in records}
    if costs is None or len(targets) != 1:
        return None
    prefill_s, step_s = costs
    ttft_s = targets.pop() / 1000
    free_at = [0.0]  # free_at[k]: the earliest the engine is free having served k in time
    for record in sorted(records, key=lambda r: r["arrival_s"]):
        arrival = record["arrival_s"]
        work_s = record["prompt_tokens"] * prefill_s + step_s
        next_free_at = free_at + [float("inf")]
        for k, free in enumerate(free_at):
            end = max(arrival, free) + work_s
            if end <= arrival + ttft_s:
                next_free_at[k + 1] = min(next_free_at[k + 1], end)
        free_at = [t for t in next_free_at if t != float("inf")]
    return len(free_at) - 1


def breakdown(path: Path) -> dict:
    result = json.loads(path.read_text())
    costs = idle_costs(path)
    by_class: dict[str, Counter] = {}
    for record in result["records"]:
        counts = by_class.setdefault(record.get("slo_class") or "none", Counter())
        kind = outcome(record)
        counts[kind] += 1
        counts["requests"] += 1
        if is_feasible_idle(record, costs):
            counts["feasible"] += 1
            counts["feasible met"] += kind == "met"
    summary = {}
    for name, counts in by_class.items():
        records = [r for r in result["records"] if (r.get("slo_class") or "none") == name]
        num_admitted = sum(v for k, v in counts.items() if k == "met" or k.startswith("late"))
        summary[name] = {
            **dict(sorted(counts.items())),
            "precision": counts["met"] / num_admitted if num_admitted else None,
            "met_of_feasible": counts["feasible met"] / counts["feasible"]
            if counts["feasible"]
            else None,
            "most_in_time_alone": most_in_time_alone(records, costs),
        }
    return {"result": str(path), "idle_costs_s": costs, "by_class": summary}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", type=Path)
    print(json.dumps([breakdown(path) for path in parser.parse_args().results], indent=1))


if __name__ == "__main__":
    main()
