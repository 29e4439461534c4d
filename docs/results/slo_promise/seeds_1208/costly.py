"""The refusals that cost (the admission-off replay met them), one line each: the point, the
check that refused it (TTFT or KV), its arrival in the run, its estimate against the TTFT
the replay measured, and the correction's learned factor at the time (from the server's
log: x1.00 until 20 admitted requests have been measured).

    python3 costly.py /tmp/seeds
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from superinfer.bench.refusal_cost import report_of


def is_met(record: dict) -> bool:
    """Finished and met every target it had (the project's own judgement of a record)."""
    return report_of(record).is_all_met


def learned_factor(log: str, message: str) -> str:
    for line in log.splitlines():
        if "[admission] refused" in line and message in line:
            found = re.search(r"x([\d.]+) learned", line)
            return found.group(1) if found else "?"
    return "?"


def main() -> None:
    root = Path(sys.argv[1])
    print(
        "| seed | rate | request | prompt / output tokens | check | arrival (s) | estimate (ms) | replay TTFT (ms) | learned |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for seed in sorted(root.glob("seed*")):
        for sub, rate in (("uniform", 1), ("uniform_over", 2), ("uniform_over", 3)):
            run_path = seed / sub / f"rotasched_rate{rate}.json"
            replay_path = seed / sub / f"rotasched-no-admission_rate{rate}.json"
            if not (run_path.exists() and replay_path.exists()):
                continue
            run, replay = json.loads(run_path.read_text()), json.loads(replay_path.read_text())
            log = (seed / sub / f"rotasched_rate{rate}.server.log").read_text()
            for ours, theirs in zip(run["records"], replay["records"]):
                if ours["outcome"] != "rejected" or not is_met(theirs):
                    continue
                body = json.loads(ours["error"].split(": ", 1)[1])["error"]
                check = "KV" if "KV cache is committed" in body["message"] else "TTFT"
                factor = learned_factor(log, body["message"])
                print(
                    f"| {seed.name[4:]} | {rate} | {ours['request_id']} | {ours['prompt_tokens']} / {ours['max_tokens']} | "
                    f"{check} | {ours['arrival_s']:.1f} | {ours['estimated_ttft_ms']:.0f} | {theirs['slo']['ttft_ms']:.0f} | {factor} |"
                )


if __name__ == "__main__":
    main()
