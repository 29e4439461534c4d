"""Simulated against real, per SLO class: replay served runs in the simulator.

Each input is a `superinfer bench serve` result of a superinfer server (the runs of
`benchmarks/slo_promise.sh`, with the server log beside it as `NAME.server.log`): a class
mix, or one set of targets for every request (class "none"). The replay takes from it
exactly what the real run had:

- the workload: every request's scheduled arrival, prompt length (the server's count, chat
  template included; for a refused request the client's), requested output length
  (ignore_eos; a refused request's too) and class;
- the server: its own `superinfer serve` command line, parsed by the CLI's own parser
  (policy, steps shaped or not, admission on or off, step limits, SLO classes), and the
  KV pool sizes its log reports;
- the step times: a fit of this machine (`superinfer calibrate`, run in the same session
  as the served runs: the machine's speed drifts by tens of percent from day to day).

It then runs the real scheduler, policy, KV manager and admission over predicted step
times (`superinfer.sim`), with the fit's measured step noise for `--noise-seeds` seeds, and
reports per class, real against the median simulated: refused share, TTFT, TPOT and
both-met attainment, and precision (met among admitted).

    .venv/bin/python benchmarks/sim_classes.py --predictor FIT.json RESULT.json... \\
        --output docs/results/slo_promise/.../sim_vs_real.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

try:
    import superinfer  # noqa: F401
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from superinfer.cli import build_parser, serve_configs_from_args
from superinfer.sim.config import SimConfig
from superinfer.sim.results import records_of
from superinfer.sim.simulation import simulate
from superinfer.sim.workload import SimRequest
from superinfer.slo.metrics import attainment_by_class, run_duration_s, slo_report

POOL_LINE = re.compile(r"device pool (\d+) blocks .* host pool (\d+) blocks")
METRICS = ("refused", "ttft", "tpot", "all_met", "precision")


def served_workload(result: dict[str, Any]) -> list[SimRequest]:
    """The requests of a served run as the client scheduled them."""
    requests = []
    for record in result["records"]:
        if "max_tokens" not in record:
            raise ValueError("the result predates per-request max_tokens; rerun bench serve")
        requests.append(SimRequest(record["scheduled_arrival_s"], record["prompt_tokens"],
                                   record["max_tokens"], record["slo_class"]))  # fmt: skip
    start = min(r.arrival_s for r in requests)
    return sorted((dataclasses.replace(r, arrival_s=r.arrival_s - start) for r in requests),
                  key=lambda r: r.arrival_s)  # fmt: skip


def sim_config_of(result: dict[str, Any], server_log: Path, predictor: str, seed: int) -> SimConfig:
    """The simulated twin of the server that produced `result`."""
    command = result["server_command"]
    args = build_parser().parse_args(command[command.index("serve") :])
    server, engine, _, _ = serve_configs_from_args(args)
    match = POOL_LINE.search(server_log.read_text())
    if match is None:
        raise ValueError(f"{server_log}: no 'device pool N blocks ... host pool M blocks' line")
    cache = dataclasses.replace(engine.cache, num_device_blocks=int(match[1]),
                                num_host_blocks=int(match[2]))  # fmt: skip
    workload = result["workload"]
    # requests without a class carry the client's targets (with classes: each class's own)
    targets = {} if workload["slo_classes"] else {"ttft_slo_ms": workload["ttft_slo_ms"],
                                                  "tbt_slo_ms": workload["tbt_slo_ms"]}  # fmt: skip
    return SimConfig(scheduler=engine.scheduler, cache=cache, hardware="cpu",
                     model="smollm2-135m", predictor=predictor, noise_seed=seed,
                     admission=server.reject_infeasible_ttft,
                     reject_infeasible_tbt=server.reject_infeasible_tbt,
                     slo_config=server.slo_config, **targets)  # fmt: skip


def shares(attainment: dict[str, Any]) -> dict[str, float | None]:
    """One class's shares this script compares, from its `Attainment.to_dict()`."""
    a = attainment
    return {"num_requests": a["num_requests"], "refused": a["num_rejected"] / a["num_requests"],
            "ttft": a["ttft"], "tpot": a["tpot"], "all_met": a["all_met"],
            "precision": a["precision"]}  # fmt: skip


def replay(path: Path, predictor: str, num_seeds: int) -> dict[str, Any]:
    """One served run against its simulated twin, per class (the median over seeds)."""
    result = json.loads(path.read_text())
    log = path.with_name(path.stem + ".server.log")
    workload = served_workload(result)
    real = {name: shares(a) for name, a in result["attainment_by_class"].items()}
    runs = []
    for seed in range(num_seeds):
        run = simulate(sim_config_of(result, log, predictor, seed), workload)
        records = records_of(run)
        classes = attainment_by_class([slo_report(r) for r in records], run_duration_s(records))
        runs.append({name or "none": shares(a.to_dict()) for name, a in classes.items()})
    sim = {name: {m: _median([r[name][m] for r in runs]) for m in METRICS} for name in runs[0]}
    return {"result": str(path), "system": result.get("label"),
            "rate": result.get("request_rate"), "real": real, "sim": sim,
            "sim_runs": runs}  # fmt: skip


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def print_table(rows: list[dict[str, Any]]) -> None:
    print("| system | rate | class | requests | " + " | ".join(
        f"{m} real / sim" for m in METRICS) + " |")  # fmt: skip
    print("|---|---|---|---|" + "---|" * len(METRICS))
    for row in rows:
        for name, real in row["real"].items():
            sim = row["sim"].get(name, {})
            cells = " | ".join(f"{_pct(real[m])} / {_pct(sim.get(m))}" for m in METRICS)
            print(
                f"| {row['system']} | {row['rate']:g} | {name} | {real['num_requests']} | {cells} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("results", nargs="+", type=Path, help="bench serve results of superinfer")
    parser.add_argument("--predictor", required=True,
                        help="a fit from `superinfer calibrate` of this machine, this session")  # fmt: skip
    parser.add_argument("--noise-seeds", type=int, default=3,
                        help="simulate each run with this many step-noise seeds; the median")  # fmt: skip
    parser.add_argument("--output", type=Path, help="write the comparison as JSON")
    args = parser.parse_args()
    rows = [replay(path, args.predictor, args.noise_seeds) for path in args.results]
    print_table(rows)
    if args.output:
        args.output.write_text(json.dumps({
            "note": "real: the served run; sim: the median over noise seeds of the simulator "
                    "replaying its workload with its server's configuration",
            "predictor": args.predictor, "rows": rows}, indent=1) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
