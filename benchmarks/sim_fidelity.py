"""Simulator fidelity: replay recorded real-engine runs in the simulator and compare.

Step 1 (slow, the real engine): record runs with `benchmarks/policies_overload.py`, one
file per rate, e.g.

    .venv/bin/python benchmarks/sim_fidelity.py record --rates 1,2,3 --systems rotasched,fcfs-recompute

Step 2 (fast): simulate each recorded run's exact workload (its arrivals, prompt and output
lengths) on the `cpu` profile with the same engine configuration and the calibrated
predictor, and compare p50/p90 TTFT and mean TPOT per rate:

    .venv/bin/python benchmarks/sim_fidelity.py compare
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
from pathlib import Path

try:
    import superinfer  # noqa: F401
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from superinfer.config import CacheConfig
from superinfer.metrics import RequestRecord
from superinfer.sim.config import SimConfig
from superinfer.sim.results import records_of, summarize
from superinfer.sim.simulation import simulate
from superinfer.sim.workload import workload_from_records
from superinfer.slo import SLOTargets

METRICS = ("p50_ttft_ms", "p90_ttft_ms", "mean_tpot_ms")
RECORD_DIR = "docs/results/sim/real"
# a system is POLICY or POLICY/pipeline or POLICY/no-pipeline; plain: the engine's default
PIPELINE_VARIANTS = {"": None, "pipeline": True, "no-pipeline": False}


def real_records(rows: list[dict]) -> list[RequestRecord]:
    records = []
    for row in rows:
        row = dict(row)
        row["targets"] = SLOTargets(**row["targets"])
        row["token_times"] = tuple(row["token_times"])
        records.append(RequestRecord(**row))
    return records


def sim_config_for(args: dict, system: str) -> SimConfig:
    """The cpu profile with the engine configuration `policies_overload.py` ran."""
    policy, _, variant = system.partition("/")
    return SimConfig(
        hardware="cpu", model="smollm2-135m", policy=policy, predictor="fitted",
        num_device_blocks=args["num_device_blocks"], block_size=args["block_size"],
        host_kv_gib=CacheConfig().host_kv_gib, max_num_seqs=64, max_num_batched_tokens=512, max_model_len=1024,
        pipeline=PIPELINE_VARIANTS[variant], ttft_slo_ms=args["ttft_slo_ms"],
        tbt_slo_ms=args["tbt_slo_ms"],
    )  # fmt: skip


def compare_one(args: dict, result: dict) -> dict:
    real = summarize(real_records(result["records"]))
    run = simulate(sim_config_for(args, result["system"]), workload_from_records(result["records"]))
    sim = summarize(records_of(run))
    errors = {m: (sim[m] - real[m]) / real[m] for m in METRICS}
    return {
        "policy": result["system"], "rate": args["request_rate"], "num_requests": real["num_requests"],
        "real": {m: real[m] for m in (*METRICS, "ttft_attainment", "tpot_attainment", "output_throughput")},
        "sim": {m: sim[m] for m in (*METRICS, "ttft_attainment", "tpot_attainment", "output_throughput")},
        "relative_error": errors, "real_mean_step_ms": result.get("mean_step_ms"),
        "sim_mean_step_ms": 1000 * run.engine.runner.counters.busy_s / max(1, run.engine.runner.counters.num_steps),
        "real_swap_outs": result.get("swap_outs"), "sim_swap_outs": run.engine.scheduler.stats.num_swap_outs,
        "real_preemptions": result.get("preemptions"), "sim_preemptions": run.engine.scheduler.stats.num_preemptions,
    }  # fmt: skip


def compare(record_dir: str, output: str) -> None:
    rows = []
    for path in sorted(glob.glob(os.path.join(record_dir, "*.json"))):
        with open(path) as f:
            data = json.load(f)
        run = os.path.basename(path).removesuffix(".json")
        rows += [{"run": run, **compare_one(data["args"], r)} for r in data["results"]]
    rows.sort(key=lambda r: (r["policy"], r["rate"], r["run"]))
    print(f"{'policy':>16}{'run':>14}" + "".join(f"{m:>26}" for m in METRICS))
    for r in rows:
        cells = "".join(
            f"{r['real'][m]:>9.0f} {r['sim'][m]:>7.0f} {100 * r['relative_error'][m]:>+7.1f}%"
            for m in METRICS
        )
        print(f"{r['policy']:>16}{r['run']:>14}{cells}")
    with open(output, "w") as f:
        json.dump({"note": "real runs and simulation on a shared 2-core machine; error = (sim - real) / real",
                   "results": rows}, f, indent=1)  # fmt: skip
        f.write("\n")


def record(rates: list[float], systems: str, record_dir: str, num_prompts: int) -> None:
    os.makedirs(record_dir, exist_ok=True)
    for rate in rates:
        output = os.path.join(record_dir, f"rate_{rate:g}.json")
        subprocess.run([sys.executable, "benchmarks/policies_overload.py", "--systems", systems,
                        "--num-prompts", str(num_prompts), "--request-rate", str(rate),
                        "--output", output], check=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="run the real engine (slow)")
    rec.add_argument("--rates", default="1,2,3")
    rec.add_argument("--systems", default="rotasched,fcfs-recompute")
    rec.add_argument("--num-prompts", type=int, default=60)
    rec.add_argument("--dir", default=RECORD_DIR)
    cmp_ = sub.add_parser("compare", help="simulate the recorded runs and compare")
    cmp_.add_argument("--dir", default=RECORD_DIR)
    cmp_.add_argument("--output", default="docs/results/sim/fidelity.json")
    args = parser.parse_args()
    if args.command == "record":
        record([float(r) for r in args.rates.split(",")], args.systems, args.dir, args.num_prompts)
    else:
        compare(args.dir, args.output)


if __name__ == "__main__":
    main()
