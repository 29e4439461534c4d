"""`superinfer bench sweep`: every (system, request rate) point on the same request sequence.

A system is one of:
- a superinfer policy (`--system rotasched`): `superinfer serve --policy P` started on a
  free port with `--server-args`, per point;
- a command template (`--command vllm='vllm serve DIR --port {port}'`): started per point
  with `{port}` filled in, for any OpenAI-compatible server;
- an external URL (`--external vllm=http://127.0.0.1:8000`): already running, used as is.

For each rate, systems take turns (alternating, as benchmarks.md asks): start, wait for
`--health-path` to answer 200, warm up, run `bench serve` with the same seed (so the same
requests at the same times), stop with SIGTERM. One JSON per point in `--output-dir`, a
`sweep.json` summary, and the plots of `superinfer.bench.plots`.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

SUMMARY_KEYS = ("ttft_attainment", "tpot_attainment", "tbt_attainment", "slo_attainment",
                "goodput", "output_throughput", "request_throughput", "completed", "rejected",
                "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms")  # fmt: skip


@dataclass(frozen=True)
class System:
    """One system of a sweep: a superinfer policy, a command template, or a URL."""

    name: str
    policy: str | None = None
    command: str | None = None  # template with {port}
    url: str | None = None

    @property
    def is_started_here(self) -> bool:
        return self.url is None


def add_sweep_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("sweep")
    group.add_argument("--system", action="append", default=[], metavar="POLICY",
                       help="a superinfer policy to start as `superinfer serve --policy POLICY` "
                       "(repeatable)")  # fmt: skip
    group.add_argument("--command", action="append", default=[], metavar="NAME=TEMPLATE",
                       dest="server_commands",
                       help="a server command started per point, {port} filled in, e.g. "
                       "vllm='vllm serve DIR --port {port}' (repeatable)")  # fmt: skip
    group.add_argument("--external", action="append", default=[], metavar="NAME=URL",
                       help="an already running OpenAI-compatible server (repeatable)")  # fmt: skip
    group.add_argument("--request-rates", required=False, default="1,2,4",
                       help="comma-separated request rates (req/s) to sweep")  # fmt: skip
    group.add_argument("--server-args", default="",
                       help="extra arguments of every `superinfer serve` (one string, shell "
                       "quoting), e.g. '--num-device-blocks 64 --dtype bfloat16'")  # fmt: skip
    group.add_argument("--health-path", default="/health", help="route that answers 200 when ready")
    group.add_argument("--health-timeout", type=float, default=600.0,
                       help="seconds to wait for a started server to be healthy")  # fmt: skip
    group.add_argument("--output-dir", required=True, help="where the JSONs and plots go")
    group.add_argument("--plot-only", action="store_true",
                       help="run nothing: re-plot the point JSONs already in --output-dir (e.g. "
                       "after adding points of another system)")  # fmt: skip
    group.add_argument("--metric-percentiles", default="50,90,99",
                       help="percentiles reported for TTFT, TPOT, ITL and E2E")  # fmt: skip
    group.add_argument("--disable-tqdm", action="store_true", help="no progress bar")


def parse_systems(args: argparse.Namespace) -> list[System]:
    systems = [System(policy, policy=policy) for policy in args.system]
    for spec in args.server_commands:
        name, template = _split_named(spec, "--command")
        systems.append(System(name, command=template))
    for spec in args.external:
        name, url = _split_named(spec, "--external")
        systems.append(System(name, url=url))
    names = [s.name for s in systems]
    if len(set(names)) != len(names):
        raise ValueError(f"system names repeat: {names}")
    return systems


def _split_named(spec: str, flag: str) -> tuple[str, str]:
    name, sep, value = spec.partition("=")
    if not sep or not name.strip() or not value.strip():
        raise ValueError(f"{flag} takes NAME=VALUE, got {spec!r}")
    return name.strip(), value.strip()


def parse_rates(text: str) -> list[float]:
    rates = [float(r) for r in text.split(",") if r.strip()]
    if not rates or any(not r > 0 for r in rates):
        raise ValueError(f"request rates must be > 0, got {text!r}")
    return rates


# --- servers ------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def server_command(system: System, port: int, server_args: str, slo_config: str | None
                   ) -> list[str]:  # fmt: skip
    """The argv that starts `system` on `port`."""
    if system.command is not None:
        return shlex.split(system.command.replace("{port}", str(port)))
    extra = shlex.split(server_args)
    # -P: the server imports the superinfer this process imported (PYTHONPATH, else the
    # install), not one that `-m` would find in the working directory first; an A/B that
    # points PYTHONPATH at a baseline checkout otherwise serves the current one in both arms
    argv = [sys.executable, "-P", "-m", "superinfer.cli", "serve", "--port", str(port),
            "--policy", system.policy, *extra]  # fmt: skip
    if slo_config and "--slo-config" not in extra:
        argv += ["--slo-config", slo_config]  # the client judges by the same classes
    return argv


class ManagedServer:
    """A server process started for one point: healthy on `start`, SIGTERM on `stop`."""

    def __init__(self, argv: list[str], url: str, log_path: str, health_path: str) -> None:
        self.argv, self.url, self.log_path, self.health_path = argv, url, log_path, health_path
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float) -> None:
        env = {**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")}
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(self.argv, stdout=log, stderr=log, env=env)
        wait_healthy(self.url + self.health_path, timeout_s, self.process)

    def stop(self, timeout_s: float = 90.0) -> int | None:
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def wait_healthy(url: str, timeout_s: float, process: subprocess.Popen[bytes] | None = None
                 ) -> None:  # fmt: skip
    """Poll `url` until it answers 200; raise if the process exits or time runs out."""
    import httpx

    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=5.0) as client:
        while time.monotonic() < deadline:
            if process is not None and process.poll() is not None:
                raise RuntimeError(f"the server exited with {process.returncode} while starting")
            try:
                if client.get(url).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.5)
    raise RuntimeError(f"{url} did not answer 200 within {timeout_s:.0f} s")


# --- the sweep ----------------------------------------------------------------------------
def point_filename(system: str, rate: float) -> str:
    return f"{system.replace('/', '_')}_rate{rate:g}.json"


def run_point(system: System, rate: float, args: argparse.Namespace) -> dict[str, Any]:
    """Start (or reach) `system`, run the workload at `rate`, stop it; the result JSON."""
    from superinfer.bench.cli import serve_options, workload_config, workload_meta
    from superinfer.bench.serve import benchmark_result, run_benchmark
    from superinfer.bench.workload import build_workload
    from superinfer.workload.tokenizer import load_tokenizer

    config = workload_config(args, request_rate=rate)
    workload = build_workload(config, load_tokenizer(config.tokenizer))
    server, url = None, system.url
    if system.is_started_here:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        argv = server_command(system, port, args.server_args, config.slo_config)
        log = os.path.join(args.output_dir, point_filename(system.name, rate)[:-5] + ".server.log")
        server = ManagedServer(argv, url, log, args.health_path)
    options = serve_options(args, base_url=url)
    options.label = system.name
    try:
        if server is not None:
            server.start(args.health_timeout)
        run = run_benchmark(workload, options, config.slo_config)
    finally:
        exit_code = server.stop() if server is not None else None
    result = benchmark_result(run, options, workload_meta(config, workload))
    result.update(system=system.name, server_command=server and server.argv,
                  server_exit_code=exit_code)  # fmt: skip
    return result


def run_sweep(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every point, rates outer and systems alternating inner; saves each JSON at once."""
    from superinfer.bench.serve import save_result

    systems, rates = parse_systems(args), parse_rates(args.request_rates)
    if not systems:
        raise ValueError("give at least one --system, --command or --external")
    points = []
    for rate in rates:
        for system in systems:
            print(f"sweep: {system.name} at {rate:g} req/s", file=sys.stderr)
            result = run_point(system, rate, args)
            save_result(result, os.path.join(args.output_dir, point_filename(system.name, rate)))
            points.append(result)
    return points


def load_points(output_dir: str) -> list[dict[str, Any]]:
    """The point JSONs of a sweep folder (every *_rate*.json)."""
    points = []
    for path in sorted(glob.glob(os.path.join(output_dir, "*_rate*.json"))):
        with open(path, encoding="utf-8") as f:
            points.append(json.load(f))
    return points


def summary_rows(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per point: system, rate and the headline figures, sorted by system and rate."""
    rows = [{"system": p.get("system") or p.get("label"), "request_rate": p["request_rate"],
             **{key: p.get(key) for key in SUMMARY_KEYS}} for p in points]  # fmt: skip
    return sorted(rows, key=lambda r: (str(r["system"]), _rate(r["request_rate"])))


def _rate(value: Any) -> float:
    return math.inf if value == "inf" else float(value)


def summary_text(rows: list[dict[str, Any]]) -> str:
    head = ("system", "rate", "TTFT att", "TPOT att", "all att", "goodput", "out tok/s",
            "p50 TTFT", "p99 TTFT", "p50 TPOT", "rejected")  # fmt: skip
    keys = ("ttft_attainment", "tpot_attainment", "slo_attainment", "goodput",
            "output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "rejected")  # fmt: skip
    lines = ["".join(f"{h:>11}" for h in head)]
    for row in rows:
        cells = [str(row["system"])[:11], f"{_rate(row['request_rate']):g}"]
        cells += [_cell(row[key]) for key in keys]
        lines.append("".join(f"{c:>11}" for c in cells))
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "n/a"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def run_sweep_command(args: argparse.Namespace) -> int:
    from superinfer.bench.plots import plot_sweep

    os.makedirs(args.output_dir, exist_ok=True)
    points = load_points(args.output_dir) if args.plot_only else run_sweep(args)
    if not points:
        raise ValueError(f"no point JSONs in {args.output_dir}")
    rows = summary_rows(points)
    with open(os.path.join(args.output_dir, "sweep.json"), "w", encoding="utf-8") as f:
        json.dump({"argv": sys.argv, "points": rows}, f, indent=1)
    print(summary_text(rows))
    for path in plot_sweep(points, args.output_dir):
        print(f"plot: {path}", file=sys.stderr)
    return 0
