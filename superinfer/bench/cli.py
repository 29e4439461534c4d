"""`superinfer bench serve`, `bench sweep` and `bench refusal-cost` (hooked into
`superinfer.cli`).

Flags follow `vllm bench serve` where the meaning is the same (`--base-url`, `--endpoint`,
`--model`, `--dataset-name`, `--num-prompts`, `--request-rate`, `--burstiness`, `--seed`,
`--max-concurrency`, `--save-result`, `--result-filename`, ...).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
from typing import TYPE_CHECKING, Any

from superinfer.bench.request_slo import SLO_TRANSPORTS
from superinfer.workload.config import WorkloadConfig

if TYPE_CHECKING:
    from superinfer.bench.serve import ServeOptions
    from superinfer.bench.workload import Workload


def add_bench_parser(sub: Any) -> None:
    """The `bench` command with its `serve` and `sweep` subcommands."""
    bench = sub.add_parser(
        "bench",
        help="benchmark a serving endpoint for latency SLOs (serve) or sweep rates (sweep)",
        description="SLO benchmarks of OpenAI-compatible servers. See docs/bench.md.",
    )
    commands = bench.add_subparsers(dest="bench_command", required=True, metavar="SUBCOMMAND")
    serve = commands.add_parser(
        "serve",
        help="drive one endpoint with a workload and report latency, SLO attainment, goodput",
        description="Send a workload (dataset + arrivals + SLO targets) to an OpenAI-compatible "
        "endpoint (superinfer, vLLM, ...) as streaming requests with ignore_eos and max_tokens "
        "= the dataset's output length; time every streamed chunk on the client's clock; report "
        "TTFT/TPOT/ITL/E2E percentiles, SLO attainment per kind and class, goodput and "
        "throughput (computed with superinfer/slo/metrics.py). See docs/bench.md.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_endpoint_flags(serve)
    add_workload_flags(serve)
    add_output_flags(serve)
    _add_sweep_parser(commands)
    cost = commands.add_parser(
        "refusal-cost",
        help="share of the requests a run refused that met their targets in a replay without "
        "admission",
        description="Compare two `bench serve` results of the same workload: RUN against a "
        "server with admission on, REPLAY against the same server started with "
        "--no-reject-infeasible-ttft --no-reject-infeasible-tbt. Prints the refusal cost "
        "(overall and per class) and RUN's "
        "precision as JSON. See docs/bench.md.",
    )
    cost.add_argument("run", help="result JSON of the run with admission on")
    cost.add_argument("replay", help="result JSON of the same workload with admission off")


def _add_sweep_parser(commands: Any) -> None:
    from superinfer.bench.sweep import add_sweep_flags

    sweep = commands.add_parser(
        "sweep",
        help="run bench serve over request rates for several systems or policies, then plot",
        description="For each system (a superinfer policy started as `superinfer serve`, or an "
        "external endpoint) and each request rate: start the server on a free port (or use the "
        "given URL), wait for /health, warm it, run the same request sequence (same seed), stop "
        "it, and save one JSON per point; then plot attainment vs rate, TTFT/TPOT CDFs and the "
        "KV timeline of the heaviest point. See docs/bench.md.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_sweep_flags(sweep)
    add_workload_flags(sweep, with_rate=False)
    add_endpoint_flags(sweep, for_sweep=True)


def add_endpoint_flags(parser: argparse.ArgumentParser, for_sweep: bool = False) -> None:
    group = parser.add_argument_group("endpoint")
    if not for_sweep:
        group.add_argument("--base-url", default="http://127.0.0.1:8000",
                           help="server URL without the route")  # fmt: skip
    group.add_argument("--endpoint", default="/v1/completions",
                       help="route; one ending in chat/completions sends the prompt as a user "
                       "message")  # fmt: skip
    group.add_argument("--model", default=None,
                       help="model name in the requests (default: the first of GET /v1/models)")  # fmt: skip
    group.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"),
                       help="sent as 'Authorization: Bearer KEY' (default: $OPENAI_API_KEY)")  # fmt: skip
    group.add_argument("--max-concurrency", type=int, default=None,
                       help="most requests in flight at once; later arrivals wait (default: no "
                       "limit)")  # fmt: skip
    group.add_argument("--request-timeout", type=float, default=3600.0,
                       help="seconds to wait for any byte of a response before giving up")  # fmt: skip
    group.add_argument("--num-warmups", type=int, default=0 if not for_sweep else 2,
                       help="send the first N prompts (at most 16 output tokens each) before the "
                       "run, unrecorded")  # fmt: skip
    group.add_argument("--metrics-interval", type=float, default=0.0 if not for_sweep else 0.5,
                       help="scrape the server's /metrics every this many seconds during the "
                       "run (KV usage, queues, rotations; 0: never)")  # fmt: skip
    group.add_argument("--temperature", type=float, default=0.0, help="sampling temperature")
    group.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
                       help="generate exactly max_tokens (the dataset's output length)")  # fmt: skip
    group.add_argument("--slo-transport", choices=SLO_TRANSPORTS, default="both",
                       help="send the targets as x-slo-* headers, as the body's 'slo' object, "
                       "both (the default; superinfer takes the stricter), or not at all (the "
                       "client still judges attainment against them)")  # fmt: skip
    group.add_argument("--send-priority", action="store_true",
                       help="also send the vLLM body field 'priority' = the class's rank (0 for "
                       "the first class); for vLLM with --scheduling-policy priority")  # fmt: skip


def add_workload_flags(parser: argparse.ArgumentParser, with_rate: bool = True) -> None:
    """The flags of `WorkloadConfig`; `--request-rate` only `with_rate` (a sweep has its own
    `--request-rates`)."""
    from superinfer.cli import add_config_flags

    add_config_flags(parser, WorkloadConfig, "workload")
    if with_rate:
        (rate,) = [f for f in dataclasses.fields(WorkloadConfig) if f.name == "request_rate"]
        parser.add_argument_group("arrival rate").add_argument(
            "--request-rate", type=float, default=rate.default, help=rate.metadata["help"],
            metavar="FLOAT",
        )  # fmt: skip


def add_output_flags(parser: argparse.ArgumentParser) -> None:
    out = parser.add_argument_group("output")
    out.add_argument("--save-result", action="store_true", help="write the result JSON")
    out.add_argument("--result-dir", default=".", help="folder of the result JSON")
    out.add_argument("--result-filename", default=None,
                     help="file name of the result JSON (default: "
                     "superinfer-bench-<rate>qps-<date>.json)")  # fmt: skip
    out.add_argument("--label", default=None, help="a name for this run, kept in the JSON")
    out.add_argument("--metric-percentiles", default="50,90,99",
                     help="comma-separated percentiles reported for TTFT, TPOT, ITL and E2E")  # fmt: skip
    out.add_argument("--disable-tqdm", action="store_true", help="no progress bar")


def workload_config(args: argparse.Namespace, request_rate: float | None = None) -> WorkloadConfig:
    """The workload flags as a `WorkloadConfig` (`request_rate` overrides the flag)."""
    names = [f.name for f in dataclasses.fields(WorkloadConfig)]
    values = {name: getattr(args, name) for name in names if hasattr(args, name)}
    if request_rate is not None:
        values["request_rate"] = request_rate
    if values.get("duration") is not None:
        values["num_prompts"] = None
    return WorkloadConfig(**values)


def serve_options(args: argparse.Namespace, base_url: str | None = None) -> ServeOptions:
    from superinfer.bench.serve import ServeOptions

    names = [f.name for f in dataclasses.fields(ServeOptions)]
    values = {name: getattr(args, name) for name in names if hasattr(args, name)}
    if base_url is not None:
        values["base_url"] = base_url
    values["metric_percentiles"] = parse_percentiles(args.metric_percentiles)
    return ServeOptions(**values)


def parse_percentiles(text: str) -> tuple[float, ...]:
    values = tuple(float(p) for p in text.split(",") if p.strip())
    if not values or any(not 0 <= p <= 100 for p in values):
        raise ValueError(f"percentiles must lie in [0, 100], got {text!r}")
    return values


def run_bench(args: argparse.Namespace) -> int:
    if args.bench_command == "sweep":
        from superinfer.bench.sweep import run_sweep_command

        return run_sweep_command(args)
    if args.bench_command == "refusal-cost":
        from superinfer.bench.refusal_cost import run_refusal_cost_command

        return run_refusal_cost_command(args.run, args.replay)
    return run_serve_command(args)


def run_serve_command(args: argparse.Namespace) -> int:
    from superinfer.bench.serve import benchmark_result, run_benchmark, save_result, summary_table
    from superinfer.bench.workload import build_workload
    from superinfer.workload.tokenizer import load_tokenizer

    config = workload_config(args)
    options = serve_options(args)
    workload = build_workload(config, load_tokenizer(config.tokenizer))
    print(f"{len(workload.specs)} requests ({config.dataset_name}, {workload.num_dropped} "
          f"dropped by the length limits) to {options.base_url}{options.endpoint}", file=sys.stderr)  # fmt: skip
    run = run_benchmark(workload, options, config.slo_config)
    result = benchmark_result(run, options, workload_meta(config, workload))
    print(summary_table(result))
    if args.save_result or args.result_filename:
        path = os.path.join(args.result_dir, args.result_filename or default_filename(config))
        os.makedirs(args.result_dir, exist_ok=True)
        save_result(result, path)
        print(f"saved {path}", file=sys.stderr)
    return 0


def workload_meta(config: WorkloadConfig, workload: Workload) -> dict[str, Any]:
    """What the result JSON records about the request sequence."""
    rate = "inf" if math.isinf(config.request_rate) else config.request_rate  # JSON has no inf
    return {
        "dataset_name": config.dataset_name, "num_prompts": len(workload.specs),
        "num_dropped": workload.num_dropped, "request_rate": rate,
        "burstiness": config.burstiness, "seed": config.seed,
        "trace_replay": config.trace_replay, "time_scale": config.time_scale,
        "class_mix": workload.info.get("class_mix"),
        "workload": {**dataclasses.asdict(config), "request_rate": rate},
    }  # fmt: skip


def default_filename(config: WorkloadConfig) -> str:
    from datetime import datetime

    rate = "inf" if math.isinf(config.request_rate) else f"{config.request_rate:g}"
    return f"superinfer-bench-{rate}qps-{datetime.now().strftime('%Y%m%d-%H%M%S')}.json"
