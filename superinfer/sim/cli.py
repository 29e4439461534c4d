"""The `simulate` and `calibrate` subcommands (hooked into `superinfer.cli`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from superinfer.config import CacheConfig, SchedulerConfig
from superinfer.sim.config import SIM_FLAG_OVERRIDES, SimConfig, WorkloadConfig

DEFAULT_CALIBRATION_PATH = "superinfer/sim/profiles/cpu_smollm2.json"


def add_simulate_parser(sub: Any) -> None:
    from superinfer.cli import add_config_flags

    parser = sub.add_parser(
        "simulate",
        help="simulate the scheduler at scale (GH200, H100, H200, this CPU) in virtual time",
        description="Discrete-event simulation that runs the real scheduler, policies and KV "
        "manager with predicted step and copy times. Deterministic: the same flags give the "
        "same result. See docs/simulator.md.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_config_flags(parser, SimConfig, "simulated system")
    add_config_flags(parser, SchedulerConfig, "scheduler (the engine's)", SIM_FLAG_OVERRIDES)
    add_config_flags(parser, CacheConfig, "KV cache (the engine's)", SIM_FLAG_OVERRIDES)
    add_config_flags(parser, WorkloadConfig, "workload")
    parser.add_argument("--output", help="write the result JSON here")
    parser.add_argument(
        "--records", choices=["summary", "full", "none"], default="summary",
        help="per-request records in the JSON: summary (latencies), full (with token times), none",
    )  # fmt: skip


def add_calibrate_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "calibrate",
        help="time the real engine's steps and fit the simulator's step-time predictor",
        description="Run the real engine over a grid of batches (prefill, mixed and decode "
        "steps), time each step's forward and host work and the KV link, and save a fitted "
        "predictor as JSON for `superinfer simulate --predictor PATH` (the cpu hardware "
        "profile loads superinfer/sim/profiles/cpu_smollm2.json).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--output", default=DEFAULT_CALIBRATION_PATH, help="where to save the fit")
    parser.add_argument("--model", default=None, help="model path (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--repeats", type=int, default=3, help="passes over the batch grid")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=512)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument(
        "--pipeline", action=argparse.BooleanOptionalAction, default=None,
        help="time steps with the step pipeline on or off (default: the engine's default, "
        "on with CUDA, off on a CPU)",
    )  # fmt: skip
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")


def _config(config_type: type, args: argparse.Namespace) -> Any:
    return config_type(**{f.name: getattr(args, f.name) for f in dataclasses.fields(config_type)})


def sim_config_from_args(args: argparse.Namespace) -> SimConfig:
    """The simulated system of `superinfer simulate`'s flags, the nested configs' included."""
    names = [
        f.name for config_type in (SimConfig, SchedulerConfig, CacheConfig)
        for f in dataclasses.fields(config_type) if f.metadata.get("is_cli", True)
    ]  # fmt: skip
    return SimConfig(**{name: getattr(args, name) for name in names})


def build_workload(workload: WorkloadConfig):
    from superinfer.sim.workload import sharegpt_workload, synthetic_workload
    from superinfer.slo.classes import class_sequence, parse_class_mix

    if workload.dataset == "synthetic":
        count = workload.num_requests or round(workload.request_rate * workload.duration)
        requests = synthetic_workload(
            workload.request_rate, count, _range(workload.synthetic_prompt_tokens),
            _range(workload.synthetic_output_tokens), workload.seed,
        )  # fmt: skip
    else:
        requests = sharegpt_workload(
            workload.request_rate, workload.duration, workload.num_requests, workload.seed,
            workload.limits,
        )  # fmt: skip
    if workload.slo_classes is None:
        return requests
    names = class_sequence(len(requests), parse_class_mix(workload.slo_classes), workload.seed)
    return [dataclasses.replace(r, slo_class=name) for r, name in zip(requests, names)]


def _range(text: str) -> tuple[int, int]:
    low, _, high = text.partition("-")
    return int(low), int(high or low)


def run_simulate(args: argparse.Namespace) -> int:
    from superinfer.sim.results import result_json
    from superinfer.sim.simulation import simulate

    config, workload = sim_config_from_args(args), _config(WorkloadConfig, args)
    run = simulate(config, build_workload(workload))
    result = result_json(
        run, dataclasses.asdict(workload), is_token_times=args.records == "full",
        is_records=args.records != "none",
    )  # fmt: skip
    print(summary_line(result))
    if args.output:
        with open(args.output, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    return 0


def summary_line(result: dict) -> str:
    def pct(value: float | None) -> str:
        return "n/a" if value is None else f"{100 * value:.1f}%"

    t = result["targets"]
    return (
        f"{result['hardware']} {result['model']} {result['policy']} ({result['transfer_mode']}): "
        f"{result['num_requests']} requests, TTFT attainment {pct(result['ttft_attainment'])} "
        f"(<= {t['ttft_ms']:.0f} ms), TPOT attainment {pct(result['tpot_attainment'])} "
        f"(<= {t['tbt_ms']:.0f} ms), goodput {result['goodput'] or 0:.2f} req/s, output "
        f"{result['output_throughput'] or 0:.0f} tok/s, p50/p90 TTFT "
        f"{result['p50_ttft_ms'] or 0:.0f}/{result['p90_ttft_ms'] or 0:.0f} ms, mean TPOT "
        f"{result['mean_tpot_ms'] or 0:.1f} ms; simulated in {result['sim_wall_s']:.1f} s"
    )


def run_calibrate(args: argparse.Namespace) -> int:
    from superinfer.sim.calibrate import CalibrationOptions, calibrate

    options = CalibrationOptions(
        model=args.model, dtype=args.dtype, device=args.device, repeats=args.repeats,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len, pipeline=args.pipeline,
    )  # fmt: skip
    fit = calibrate(options)
    fit.save(args.output)
    meta = fit.meta
    print(
        f"{meta['num_samples']} steps timed in {meta['calibration_s']} s; mean relative error "
        f"forward {meta['forward_mean_rel_error']:.1%}, host {meta['host_mean_rel_error']:.1%}; "
        f"link {meta['link']['gbps_per_direction']} GB/s per direction; saved {args.output}",
        file=sys.stderr,
    )
    return 0
