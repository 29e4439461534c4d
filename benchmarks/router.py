"""superinfer's router (`superinfer serve --replicas 2`), measured in one run on this machine:

1. added latency: the same 1-token request, one at a time, sent alternately straight to
   one replica's own port and through the router (which sends it to a replica of the two);
   medians and p90 of the client-side latency, same processes, same moment;
2. routing: the same seeded ShareGPT trace with the gold/silver/bronze mix at --rate
   (default 4 req/s: 2x the 2 req/s knee of one engine on this machine's two cores, which
   two one-thread replicas share), with `--routing slo` and `--routing power-of-two`
   (Ray Serve's default rule), alternating which goes first, --repeats times; attainment,
   goodput, precision and per-class all-met from `superinfer bench serve`;
3. shutdown: after each routing run has drained, the time from SIGTERM to the router's exit
   (replicas included).

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/router.py --out docs/results/router/router.json

`--ray` adds the Ray Serve application's added latency (a separate direct server as its
baseline, since a Ray replica has no port of its own), in the same run. `--replica-args`
passes the same `superinfer serve` flags to both rules' servers (the TBT lanes need
`--tbt-shaped-steps`), and `--keep DIR` keeps each run's bench result, SLO log and server
log; each run's summary says how many requests of each class each replica served.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from clients.common import free_port, offline_env

REPO = Path(__file__).resolve().parents[1]
SUPERINFER = [sys.executable, "-m", "superinfer.cli"]
MIX = "gold=0.2,silver=0.3,bronze=0.5"
TINY = {"prompt": "Hello", "max_tokens": 1, "temperature": 0}
PORTS_LINE = re.compile(r"Started \d+ replicas on [\d.]+ ports ([\d, ]+)")


class Server:
    """A `superinfer serve` process and its log."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str] | None = None,
                 cwd: Path = REPO) -> None:  # fmt: skip
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        with open(log, "wb") as out:
            self.process = subprocess.Popen([*SUPERINFER, "serve", "--port", str(self.port),
                                             *args], cwd=cwd, env=env or offline_env(),
                                            stdout=out, stderr=out)  # fmt: skip

    def wait_ready(self, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited:\n{self.log.read_text()[-3000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"{self.url} not healthy in {timeout_s} s")

    def replica_urls(self) -> list[str]:
        match = PORTS_LINE.search(self.log.read_text())
        assert match, "the router did not log its replicas' ports"
        return [f"http://127.0.0.1:{p.strip()}" for p in match.group(1).split(",")]

    def stop(self) -> float:
        """SIGTERM; seconds until the process (and its replicas) exited."""
        start = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(120)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        return time.monotonic() - start


def latency_ms(client: httpx.Client, url: str) -> float:
    start = time.perf_counter()
    response = client.post(url + "/v1/completions", json=TINY)
    elapsed = time.perf_counter() - start
    assert response.status_code == 200, response.text
    return 1000 * elapsed


def alternate(direct_url: str, routed_url: str, num_requests: int) -> dict[str, Any]:
    """Alternating tiny requests; one keep-alive client per path, as a real client has."""
    direct, routed = [], []
    with httpx.Client(timeout=60) as a, httpx.Client(timeout=60) as b:
        for _ in range(3):  # warm both paths and connections
            latency_ms(a, direct_url), latency_ms(b, routed_url)
        for i in range(num_requests):
            pair = [(direct, a, direct_url), (routed, b, routed_url)]
            for samples, client, url in pair if i % 2 == 0 else pair[::-1]:
                samples.append(latency_ms(client, url))
    return summarize(direct, routed)


def summarize(direct: list[float], routed: list[float]) -> dict[str, Any]:
    def p90(values: list[float]) -> float:
        return statistics.quantiles(values, n=10)[-1]

    return {
        "num_requests": len(direct),
        "direct_median_ms": round(statistics.median(direct), 2),
        "routed_median_ms": round(statistics.median(routed), 2),
        "added_median_ms": round(statistics.median(routed) - statistics.median(direct), 2),
        "direct_p90_ms": round(p90(direct), 2),
        "routed_p90_ms": round(p90(routed), 2),
    }


def overhead(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    server = Server(["--replicas", "2", "--device", "cpu"], tmp / "overhead.log")
    try:
        server.wait_ready()
        result = alternate(server.replica_urls()[0], server.url, args.tiny)
    finally:
        result_stop = server.stop()
    return {**result, "shutdown_s_idle": round(result_stop, 2)}


def ray_overhead(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    env = offline_env(OMP_NUM_THREADS="1")
    direct = Server(["--device", "cpu"], tmp / "direct.log", env)
    ray = Server(["--replicas", "1", "--router", "ray", "--device", "cpu"], tmp / "ray.log", env)
    try:
        direct.wait_ready()
        ray.wait_ready(600)
        result = alternate(direct.url, ray.url, args.tiny)
    finally:
        direct.stop()
        result_stop = ray.stop()
    return {**result, "shutdown_s_idle": round(result_stop, 2)}


def routing_run(args: argparse.Namespace, routing: str, repeat: int, tmp: Path) -> dict[str, Any]:
    keep = Path(args.keep) if args.keep else tmp
    keep.mkdir(parents=True, exist_ok=True)
    rule, _, attempts = routing.partition(":")  # "power-of-two:1": one replica, no retry
    name = f"{routing.replace(':', '-')}_{repeat}"
    server = Server(["--replicas", "2", "--device", "cpu", "--routing", rule,
                     "--routing-attempts", attempts or "0",
                     "--slo-log", str(keep / f"{name}.slo.jsonl"), *args.replica_args],
                    keep / f"{name}.log", cwd=args.repo)  # fmt: skip
    out = keep / f"{name}.json"
    try:
        server.wait_ready()
        subprocess.run([*SUPERINFER, "bench", "serve", "--base-url", server.url,
                        "--endpoint", "/v1/chat/completions", "--dataset-name", args.dataset,
                        "--request-rate", str(args.rate), "--duration", str(args.duration),
                        "--seed", str(args.seed), *targets_args(args), "--num-warmups", "2",
                        "--save-result", "--result-dir", str(keep), "--result-filename",
                        out.name, "--label", routing, "--disable-tqdm"],
                       cwd=args.repo, env=offline_env(), check=True, stdout=subprocess.DEVNULL)  # fmt: skip
        prefix = prefix_cache(server.url)
    finally:
        shutdown_s = server.stop()
    result = json.loads(out.read_text())
    by_class = {name: round(c["all_met"], 3) if isinstance(c, dict) and "all_met" in c else c
                for name, c in (result.get("attainment_by_class") or {}).items()}  # fmt: skip
    keys = ("num_prompts", "completed", "rejected", "slo_attainment", "goodput", "precision",
            "output_throughput", "median_ttft_ms", "p90_ttft_ms", "median_tpot_ms")  # fmt: skip
    return {"routing": routing, "repeat": repeat, "shutdown_s": round(shutdown_s, 2),
            **{k: result.get(k) for k in keys}, "all_met_by_class": by_class,
            "served_by_replica": served_by_replica(keep / f"{name}.slo.jsonl"),
            "prefix_cache": prefix}  # fmt: skip


def prefix_cache(url: str) -> dict[str, float]:
    """Prompt tokens looked up in the replicas' prefix caches and found there (warm-ups
    included), from the router's /metrics (every replica's counters, summed)."""
    text = httpx.get(url + "/metrics", timeout=30).text
    totals = {"queries": 0.0, "hits": 0.0}
    for line in text.splitlines():
        for key in totals:
            if line.startswith(f"vllm:prefix_cache_{key}_total"):
                totals[key] += float(line.rsplit(" ", 1)[1])
    totals["hit_rate"] = round(totals["hits"] / totals["queries"], 3) if totals["queries"] else 0.0
    return totals


def served_by_replica(slo_log: Path) -> dict[str, dict[str, int]]:
    """Per class, how many requests each replica served (where the lanes formed), from
    the SLO log every replica appends to."""
    served: dict[str, dict[str, int]] = {}
    for line in slo_log.read_text().splitlines():
        record = json.loads(line)
        if record["outcome"] == "finished" and record["replica"] is not None:
            by_replica = served.setdefault(str(record["class"]), {})
            by_replica[record["replica"]] = by_replica.get(record["replica"], 0) + 1
    return served


def targets_args(args: argparse.Namespace) -> list[str]:
    """The bench client's SLO flags: the class mix, or one target pair for every request."""
    if args.uniform:
        return ["--ttft-slo-ms", "1000", "--tbt-slo-ms", "200"]
    return ["--slo-classes", MIX]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", type=int, default=60, help="tiny requests per path")
    parser.add_argument("--rate", type=float, default=4.0, help="req/s of the routing runs")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dataset", default="sharegpt", choices=("sharegpt", "sharegpt-multiturn"),
                        help="the routing runs' requests: ShareGPT's first turns, or its "
                        "conversations, each turn resending the history with the answers "
                        "10 s after the last answer (what a replica's prefix cache can "
                        "hold)")  # fmt: skip
    parser.add_argument("--uniform", action="store_true", help="every request TTFT 1 s / TBT "
                        "200 ms instead of the gold/silver/bronze mix")  # fmt: skip
    parser.add_argument("--skip-overhead", action="store_true")
    parser.add_argument("--ray", action="store_true", help="also Ray Serve's added latency")
    parser.add_argument("--skip-routing", action="store_true")
    parser.add_argument("--out", default=None, help="JSON summary path")
    parser.add_argument("--keep", default=None, help="folder for each run's bench result, "
                        "SLO log (every replica's records) and server log")  # fmt: skip
    parser.add_argument("--repo", type=Path, default=REPO, help="checkout whose code the "
                        "servers and the client run (they start in it, so `python -m` imports "
                        "it first): another commit's `git worktree` for a before/after pair")  # fmt: skip
    parser.add_argument("--routings", default="slo,power-of-two", help="the rules to run, "
                        "comma-separated, each RULE[:ATTEMPTS] (`power-of-two:1`: Ray Serve's "
                        "own router, which gives the client the first replica's refusal); "
                        "each repeat alternates their order")  # fmt: skip
    parser.add_argument("--replica-args", default="", help="extra `superinfer serve` flags "
                        "for both rules' servers (one string, split on spaces; write "
                        "--replica-args='--tbt-shaped-steps': argparse takes a separate "
                        "value that starts with -- for an option)")  # fmt: skip
    args = parser.parse_args()
    args.replica_args = args.replica_args.split()
    mix = "uniform: TTFT 1 s, TBT 200 ms" if args.uniform else MIX
    summary: dict[str, Any] = {"cpus": os.cpu_count(), "rate": args.rate, "mix": mix,
                               "dataset": args.dataset,
                               "duration": args.duration, "seed": args.seed,
                               "replica_args": args.replica_args,
                               "repo": str(args.repo)}  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        if not args.skip_overhead:
            summary["overhead"] = overhead(args, tmp)
            print("overhead", json.dumps(summary["overhead"]), flush=True)
        if args.ray:
            summary["ray_overhead"] = ray_overhead(args, tmp)
            print("ray overhead", json.dumps(summary["ray_overhead"]), flush=True)
        runs = []
        for repeat in range(0 if args.skip_routing else args.repeats):
            rules = args.routings.split(",")
            for routing in rules if repeat % 2 == 0 else rules[::-1]:
                runs.append(routing_run(args, routing, repeat, tmp))
                print("routing", json.dumps(runs[-1]), flush=True)
        summary["routing_runs"] = runs
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
