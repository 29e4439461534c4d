"""Simulator fidelity: replay recorded real-engine runs in the simulator and compare.

Step 1 (slow, the real engine): record runs with `benchmarks/policies_overload.py`, one
file per rate and repeat (`rate_R_runK.json`), e.g.

    .venv/bin/python benchmarks/sim_fidelity.py record --rates 1,2 --repeats 3 --systems rotasched,fcfs-recompute

Step 2 (fast): simulate each recorded run's exact workload (its arrivals, prompt and output
lengths) on the `cpu` profile with the same engine configuration and the calibrated
predictor, with the step-time noise `calibrate` measured (median of 5 seeds; also without
noise, for reference), and compare p50/p90 TTFT and mean TPOT per rate:

    .venv/bin/python benchmarks/sim_fidelity.py compare

Every repeat replays the same requests, so the real runs of a rate differ only by the
engine's own timing noise; in overload that noise alone moves the percentiles by tens of
percent (the scheduler's choices depend on the clock). The simulator is therefore judged
against the median of the repeats, and the spread of the repeats is reported beside it.
The steps the real engine ran are recorded too (batch shape, forward and host seconds),
which checks the predictor on the served batches apart from any scheduling difference.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

try:
    import superinfer  # noqa: F401
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from superinfer.config import CacheConfig
from superinfer.sim.config import SimConfig
from superinfer.sim.fitted import FittedPredictor, StepSample
from superinfer.sim.predictor import BatchShape, StepTimePredictor
from superinfer.sim.results import records_of, summarize
from superinfer.sim.simulation import build_system, simulate
from superinfer.sim.workload import workload_from_records
from superinfer.slo import SLOTargets
from superinfer.slo.metrics import RequestRecord

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


def sim_config_for(args: dict, system: str, predictor: str = "fitted", **noise) -> SimConfig:
    """The cpu profile with the engine configuration `policies_overload.py` ran."""
    policy, _, variant = system.partition("/")
    return SimConfig(**noise,
        hardware="cpu", model="smollm2-135m", policy=policy, predictor=predictor,
        num_device_blocks=args["num_device_blocks"], block_size=args["block_size"],
        host_kv_gib=CacheConfig().host_kv_gib, max_num_seqs=64, max_num_batched_tokens=512, max_model_len=1024,
        pipeline=PIPELINE_VARIANTS[variant], ttft_slo_ms=args["ttft_slo_ms"],
        tbt_slo_ms=args["tbt_slo_ms"],
    )  # fmt: skip


def served_step_error(result: dict, predictor: FittedPredictor) -> float | None:
    """(predicted - measured) / measured total time of the steps the real engine ran."""
    steps = [StepSample(BatchShape(*row[:-2]), row[-2], row[-1]) for row in result.get("steps", [])]
    if not steps:
        return None
    measured = sum(s.forward_s + s.host_s for s in steps)
    predicted = sum(predictor.forward_time(s.batch) + predictor.host_time(s.batch) for s in steps)
    return (predicted - measured) / measured


class ScaledPredictor(StepTimePredictor):
    """Another predictor's times, scaled: the fit at the speed the machine ran a recorded
    run (`--normalize-speed`)."""

    name = "scaled"

    def __init__(self, inner: FittedPredictor, scale: float) -> None:
        self.inner, self.scale = inner, scale

    def forward_time(self, batch: BatchShape) -> float:
        return self.scale * self.inner.forward_time(batch)

    def host_time(self, batch: BatchShape) -> float:
        return self.scale * self.inner.host_time(batch)


def compare_one(
    args: dict, result: dict, num_seeds: int, predictor: str, is_speed_normalized: bool
) -> dict:
    """The simulator on one recorded run: the median over `num_seeds` noise seeds (the
    fit's measured step-time noise), and without noise for reference. Normalized, the
    fit is first scaled to the time the run's own steps took (one factor per run)."""
    real = summarize(real_records(result["records"]))
    workload = workload_from_records(result["records"])
    system = result["system"]
    fit = build_system(sim_config_for(args, system, predictor)).predictor
    # passed explicitly: a scaled predictor carries no fit metadata to read it from
    measured = fit.meta.get("step_noise", {})
    noise = {
        "step_noise_sigma": measured.get("sigma", 0.0),
        "step_noise_lag1": measured.get("lag1", 0.0),
    }
    error = served_step_error(result, fit)
    used = (
        ScaledPredictor(fit, 1 / (1 + error)) if is_speed_normalized and error is not None else fit
    )

    def run(seed: int, **override):
        config = sim_config_for(args, system, predictor, noise_seed=seed, **{**noise, **override})
        return simulate(config, workload, used)

    runs = [run(seed) for seed in range(num_seeds)]
    exact = run(0, step_noise_sigma=0.0)
    summaries = [summarize(records_of(run)) for run in runs]
    keys = (*METRICS, "ttft_attainment", "tpot_attainment", "output_throughput")
    sim = {m: statistics.median(s[m] for s in summaries) for m in keys}
    sim_exact = summarize(records_of(exact))
    counters = [run.engine.runner.counters for run in runs]
    return {
        "policy": result["system"], "rate": args["request_rate"], "num_requests": real["num_requests"],
        "real": {m: real[m] for m in keys}, "sim": sim, "sim_exact": {m: sim_exact[m] for m in keys},
        "relative_error": {m: (sim[m] - real[m]) / real[m] for m in METRICS},
        "real_mean_step_ms": result.get("mean_step_ms"),
        "sim_mean_step_ms": statistics.median(1000 * c.busy_s / max(1, c.num_steps) for c in counters),
        "served_step_error": error, "is_speed_normalized": is_speed_normalized,
        "step_noise": runs[0].system.noise.to_dict(), "num_seeds": num_seeds,
        "real_swap_outs": result.get("swap_outs"),
        "sim_swap_outs": statistics.median(r.engine.scheduler.stats.num_swap_outs for r in runs),
        "real_preemptions": result.get("preemptions"),
        "sim_preemptions": statistics.median(r.engine.scheduler.stats.num_preemptions for r in runs),
    }  # fmt: skip


def summarize_repeats(rows: list[dict]) -> list[dict]:
    """Per (policy, rate): the real runs' median and range, the simulator (the median of
    its per-run values: they differ only when normalized for speed) against that median,
    and, as the noise floor, each real run against the median of the others."""
    groups: dict[tuple[str, float], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["policy"], row["rate"]), []).append(row)
    summary = []
    for (policy, rate), group in sorted(groups.items()):
        cells = {}
        for m in METRICS:
            values = [r["real"][m] for r in group]
            median = statistics.median(values)
            sim = statistics.median(r["sim"][m] for r in group)
            exact = statistics.median(r["sim_exact"][m] for r in group)
            others = [statistics.median(values[:i] + values[i + 1 :]) for i in range(len(values))]
            cells[m] = {"real_median": median, "real_min": min(values), "real_max": max(values),
                        "sim": sim, "error_vs_median": (sim - median) / median,
                        "sim_exact": exact, "exact_error_vs_median": (exact - median) / median,
                        "real_errors_vs_others": [(v - o) / o for v, o in zip(values, others)]
                        if len(values) > 1 else []}  # fmt: skip
        served = [r["served_step_error"] for r in group if r["served_step_error"] is not None]
        summary.append({
            "policy": policy, "rate": rate, "num_runs": len(group), "metrics": cells,
            "served_step_error": statistics.median(served) if served else None,
            "real_preemptions": [r["real_preemptions"] for r in group],
            "real_swap_outs": [r["real_swap_outs"] for r in group],
            "sim_preemptions": [r["sim_preemptions"] for r in group],
            "sim_swap_outs": [r["sim_swap_outs"] for r in group],
        })  # fmt: skip
    return summary


def print_summary(summary: list[dict]) -> None:
    print(f"\n{'policy':>16}{'rate':>6}{'runs':>6}"
          + "".join(f"{m + ' real [range] / sim':>40}" for m in METRICS) + f"{'steps':>8}")  # fmt: skip
    for s in summary:
        cells = ""
        for m in METRICS:
            c = s["metrics"][m]
            cells += (f"{c['real_median']:>9.0f} [{c['real_min']:.0f}-{c['real_max']:.0f}]"
                      f" {c['sim']:>6.0f} {100 * c['error_vs_median']:>+6.1f}%").rjust(40)  # fmt: skip
        steps = s["served_step_error"]
        steps = f"{100 * steps:+.1f}%" if steps is not None else "-"
        print(f"{s['policy']:>16}{s['rate']:>6g}{s['num_runs']:>6}{cells}{steps:>8}")
    for key, label in (("error_vs_median", "simulator"), ("exact_error_vs_median",
                                                         "simulator without noise")):  # fmt: skip
        errors = [s["metrics"][m][key] for s in summary for m in METRICS]
        print(f"{label}: {sum(abs(e) <= 0.15 for e in errors)} of {len(errors)} within 15% "
              "of the real median")  # fmt: skip
    errors = [e for s in summary for m in METRICS for e in s["metrics"][m]["real_errors_vs_others"]]
    if errors:
        print(f"real runs against the median of the others: {sum(abs(e) <= 0.15 for e in errors)} "
              f"of {len(errors)} within 15%")  # fmt: skip


def run_name(path: str) -> str:
    return os.path.basename(path).removesuffix(".json")


def compare(
    record_dir: str, output: str, num_seeds: int, predictor: str, is_speed_normalized: bool
) -> None:
    rows = []
    for path in sorted(glob.glob(os.path.join(record_dir, "*.json"))):
        with open(path) as f:
            data = json.load(f)
        rows += [{"run": run_name(path),
                  **compare_one(data["args"], r, num_seeds, predictor, is_speed_normalized)}
                 for r in data["results"]]  # fmt: skip
    rows.sort(key=lambda r: (r["policy"], r["rate"], r["run"]))
    print(f"{'policy':>16}{'run':>14}" + "".join(f"{m:>26}" for m in METRICS) + f"{'steps':>8}")
    for r in rows:
        cells = "".join(
            f"{r['real'][m]:>9.0f} {r['sim'][m]:>7.0f} {100 * r['relative_error'][m]:>+7.1f}%"
            for m in METRICS
        )
        steps = r["served_step_error"]
        steps = f"{100 * steps:+.1f}%" if steps is not None else "-"
        print(f"{r['policy']:>16}{r['run']:>14}{cells}{steps:>8}")
    summary = summarize_repeats(rows)
    print_summary(summary)
    with open(output, "w") as f:
        json.dump({"note": "error = (sim - real) / real; summary: against the median of the repeats; "
                           "served_step_error: the predictor on the steps the real engine ran",
                   "summary": summary, "results": rows}, f, indent=1)  # fmt: skip
        f.write("\n")


def record(
    rates: list[float], systems: str, record_dir: str, num_prompts: int, repeats: int
) -> None:
    """Each repeat goes over every rate before the next begins, so a slow spell of the
    machine lands on one repeat of several rates rather than on every repeat of one."""
    os.makedirs(record_dir, exist_ok=True)
    for repeat in range(1, repeats + 1):
        for rate in rates:
            output = os.path.join(record_dir, f"rate_{rate:g}_run{repeat}.json")
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
    rec.add_argument("--repeats", type=int, default=3, help="runs of every rate (same requests)")
    rec.add_argument("--dir", default=RECORD_DIR)
    cmp_ = sub.add_parser("compare", help="simulate the recorded runs and compare")
    cmp_.add_argument("--dir", default=RECORD_DIR)
    cmp_.add_argument("--output", default="docs/results/sim/fidelity.json")
    cmp_.add_argument(
        "--noise-seeds",
        type=int,
        default=5,
        help="simulate each run with this many step-noise seeds; report the median",
    )
    cmp_.add_argument(
        "--predictor",
        default="fitted",
        help="the committed cpu fit, or a path to another `calibrate` output",
    )
    cmp_.add_argument("--normalize-speed", action="store_true",
                      help="scale the fit to each run's own step times first (one factor per "
                           "run): what is left is the queueing and scheduling, not the speed "
                           "the machine had that day")  # fmt: skip
    args = parser.parse_args()
    if args.command == "record":
        rates = [float(r) for r in args.rates.split(",")]
        record(rates, args.systems, args.dir, args.num_prompts, args.repeats)
    else:
        compare(args.dir, args.output, args.noise_seeds, args.predictor, args.normalize_speed)


if __name__ == "__main__":
    main()
