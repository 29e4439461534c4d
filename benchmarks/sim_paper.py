"""Reproduce the SuperInfer paper's experiments in simulation, plus sensitivity studies.

Every system replays the same ShareGPT request sequence (Poisson arrivals, fixed seed) on
the simulated hardware; the scheduler, policies and KV manager are the real ones. Results
(summaries, no per-request records) and plots go to --output-dir.

    .venv/bin/python benchmarks/sim_paper.py --suite llama       # Llama-3-8B, 35-60 req/s
    .venv/bin/python benchmarks/sim_paper.py --suite all --jobs 2

Suites:
    llama        Llama-3-8B on one GH200-144, 35..60 req/s (the paper's sweep)
    qwen         Qwen2.5-32B on one GH200-144, 5..20 req/s
    llama-1024   Llama-3-8B with max_num_seqs 1024 (vLLM v1's default on H100-class GPUs)
    qwen-96      Qwen2.5-32B on a GH200-96: the KV pool is short, rotation matters
    sensitivity  rotation budget, host pool size and link bandwidth, on qwen-96 at 17.5 req/s
                 (--sensitivity-rate: another rate; the file is sensitivity_RATE.json)
    timeline     KV usage and rotations over time, one rotasched run on qwen-96 at 25 req/s
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

try:
    import superinfer  # noqa: F401
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from superinfer.sim.config import SimConfig
from superinfer.sim.results import result_json
from superinfer.sim.simulation import simulate
from superinfer.sim.workload import sharegpt_workload

# name -> (policy, transfer mode, extra SimConfig options)
SYSTEMS = {
    "vllm-v1 (fcfs-recompute)": ("fcfs-recompute", "duplex", {}),
    "vllm-v0 (fcfs-swap, per-layer copies)": ("fcfs-swap", "naive", {}),
    "rotasched + DuplexKV": ("rotasched", "duplex", {}),
    "rotasched, per-layer copies": ("rotasched", "naive", {}),
    "ddps + DuplexKV": ("ddps", "duplex", {}),
}
PAPER = {"rotation_budget": 2400, "block_size": 16, "max_num_batched_tokens": 16384,
         "host_kv_gib": 400.0}  # fmt: skip
LLAMA_RATES = [35, 40, 45, 50, 55, 60, 70, 80]  # the paper's 35-60, and beyond
QWEN_RATES = [5, 7.5, 10, 12.5, 15, 17.5, 20, 25, 30]  # the paper's 5-20, and beyond
SUITES = {
    "llama": {"hardware": "gh200", "model": "llama-3-8b", "rates": LLAMA_RATES, "options": PAPER},
    "qwen": {"hardware": "gh200", "model": "qwen2.5-32b", "rates": QWEN_RATES, "options": PAPER},
    "llama-1024": {"hardware": "gh200", "model": "llama-3-8b", "rates": LLAMA_RATES,
                       "options": {**PAPER, "max_num_seqs": 1024}},
    # a 4,000-block KV pool: 2400 blocks would be 60% of it, so the default 5% budget
    "qwen-96": {"hardware": "gh200-96", "model": "qwen2.5-32b", "rates": QWEN_RATES,
                    "options": {**PAPER, "rotation_budget": None}},
}  # fmt: skip
SENSITIVITY_BASE = {"hardware": "gh200-96", "model": "qwen2.5-32b", "rate": 17.5, "policy": "rotasched",
                        "options": {**PAPER, "rotation_budget": None}}  # fmt: skip
TIMELINE_RATE = 25.0
SENSITIVITY = {
    "rotation_budget": [0, 50, 100, 200, 400, 800, 1600, 2400],
    "host_kv_gib": [1, 2, 5, 10, 20, 50, 400],
    "link_gbps": [5, 10, 25, 55, 120, 250, 450, 900],
}
SUMMARY_FIELDS = (
    "ttft_attainment", "tpot_attainment", "tbt_token_attainment", "slo_attainment", "goodput",
    "output_throughput", "p50_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "mean_ttft_ms",
    "p50_tpot_ms", "p90_tpot_ms", "mean_tpot_ms", "num_requests", "num_finished",
    "num_aborted", "num_preemptions", "num_swap_outs", "num_proactive_rotations", "kv_gb_d2h",
    "kv_gb_h2d", "link_busy_s_d2h", "link_busy_s_h2d", "num_steps", "mean_step_ms", "sim_wall_s",
    "duration_s",
)  # fmt: skip


def run_one(job: dict) -> dict:
    """One simulated run; returns its summary row."""
    config = SimConfig(**job["config"])
    workload = sharegpt_workload(job["rate"], duration_s=job["duration"], seed=job["seed"])
    result = result_json(simulate(config, workload), is_records=False)
    row = {k: result[k] for k in SUMMARY_FIELDS}
    row.update(system=job["system"], rate=job["rate"], targets=result["targets"],
               num_device_blocks=result["system"]["num_device_blocks"],
               num_host_blocks=result["system"]["num_host_blocks"])  # fmt: skip
    row.update(job.get("row", {}), suite=job["suite"])
    print(f"  {job['system']:40s} rate {job['rate']:5.1f}: TTFT {row['ttft_attainment']:.3f} "
          f"TPOT {row['tpot_attainment']:.3f} out {row['output_throughput']:.0f} tok/s "
          f"({row['sim_wall_s']:.1f} s)", flush=True)  # fmt: skip
    return row


def suite_jobs(name: str, args: argparse.Namespace) -> list[dict]:
    suite = SUITES[name]
    jobs = []
    for system, (policy, mode, extra) in SYSTEMS.items():
        for rate in suite["rates"]:
            config = dict(suite["options"], hardware=suite["hardware"], model=suite["model"],
                          policy=policy, transfer_mode=mode, **extra)  # fmt: skip
            jobs.append({"suite": name, "system": system, "rate": rate, "config": config,
                             "duration": args.duration, "seed": args.seed})  # fmt: skip
    return jobs


def sensitivity_jobs(args: argparse.Namespace) -> list[dict]:
    base = dict(SENSITIVITY_BASE, rate=args.sensitivity_rate)
    jobs = []
    for knob, values in SENSITIVITY.items():
        for mode in ("duplex", "naive") if knob == "link_gbps" else ("duplex",):
            for value in values:
                config = dict(base["options"], hardware=base["hardware"], model=base["model"],
                              policy=base["policy"], transfer_mode=mode)  # fmt: skip
                config[knob] = value
                jobs.append({"suite": f"sensitivity_{base['rate']:g}", "system": f"{knob}/{mode}", "rate": base["rate"],
                                 "config": config, "duration": args.duration, "seed": args.seed,
                                 "row": {"knob": knob, "value": value, "transfer_mode": mode}})  # fmt: skip
    return jobs


def run_timeline(args: argparse.Namespace) -> dict:
    base = dict(SENSITIVITY_BASE, rate=TIMELINE_RATE)
    config = SimConfig(**base["options"], hardware=base["hardware"], model=base["model"],
                       policy=base["policy"], timeline_interval_s=0.5)  # fmt: skip
    workload = sharegpt_workload(base["rate"], duration_s=args.duration, seed=args.seed)
    result = result_json(simulate(config, workload), is_records=False)
    label = f"{base['policy']}, {base['model']} on {base['hardware']}, {base['rate']} req/s"
    return {"label": label, "summary": {k: result[k] for k in SUMMARY_FIELDS},
            "targets": result["targets"], "timeline": result["timeline"]}  # fmt: skip


def run_jobs(jobs: list[dict], num_jobs: int, log_path: str) -> list[dict]:
    """Run `jobs` (the costliest first), appending each row to `log_path` as it lands."""
    jobs = sorted(jobs, key=lambda j: -j["rate"] * (4 if "qwen" in j["config"]["model"] else 1))
    rows = []
    with open(log_path, "a") as log:
        if num_jobs <= 1:
            finished = map(run_one, jobs)
        else:
            pool = ProcessPoolExecutor(num_jobs)
            finished = pool.map(run_one, jobs)
        for row in finished:
            rows.append(row)
            log.write(json.dumps(row) + "\n")
            log.flush()
    return rows


def save(name: str, rows: list[dict], meta: dict, output_dir: str) -> str:
    path = os.path.join(output_dir, f"{name}.json")
    with open(path, "w") as f:
        json.dump({"suite": name, **meta, "results": rows}, f, indent=1)
        f.write("\n")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--suite",
        default="all",
        help=f"comma-separated: {', '.join([*SUITES, 'sensitivity', 'timeline'])}, or all",
    )
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of arrivals")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=1, help="parallel simulations")
    parser.add_argument("--output-dir", default="docs/results/sim")
    parser.add_argument("--sensitivity-rate", type=float, default=SENSITIVITY_BASE["rate"])
    args = parser.parse_args()
    os.makedirs(args.output_dir, exist_ok=True)
    names = [*SUITES, "sensitivity", "timeline"] if args.suite == "all" else args.suite.split(",")
    meta = {"duration_s": args.duration, "seed": args.seed, "dataset": "sharegpt",
            "systems": {k: {"policy": v[0], "transfer_mode": v[1]} for k, v in SYSTEMS.items()},
            "note": "simulated; sim_wall_s measured on whatever machine ran the script"}  # fmt: skip
    started = time.perf_counter()
    if "timeline" in names:
        with open(os.path.join(args.output_dir, "timeline.json"), "w") as f:
            json.dump({**meta, **run_timeline(args)}, f, indent=1)
    jobs = [job for name in names if name in SUITES for job in suite_jobs(name, args)]
    if "sensitivity" in names:
        jobs += sensitivity_jobs(args)
    rows = run_jobs(jobs, args.jobs, os.path.join(args.output_dir, "rows.jsonl"))
    assemble(rows, meta, args.output_dir)
    print(f"{len(rows)} runs in {time.perf_counter() - started:.0f} s", flush=True)


def assemble(rows: list[dict], meta: dict, output_dir: str) -> None:
    """One JSON per suite, rows in (system, rate) order."""
    for name in dict.fromkeys(r["suite"] for r in rows):
        suite_rows = sorted((r for r in rows if r["suite"] == name),
                            key=lambda r: (r["system"], r.get("value", 0), r["rate"]))  # fmt: skip
        if name.startswith("sensitivity"):
            base = {k: v for k, v in SENSITIVITY_BASE.items() if k != "options"}
            base["rate"] = next(r["rate"] for r in rows if r["suite"] == name)
            extra = {"base": base, "options": SENSITIVITY_BASE["options"]}
        else:
            extra = {k: v for k, v in SUITES[name].items() if k != "rates"}
        save(name, suite_rows, {**meta, **extra}, output_dir)


if __name__ == "__main__":
    main()
