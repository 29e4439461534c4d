"""Scale-out figures, all in one run on this machine (docs/scale-out.md):

1. the router's added latency: the same tiny request, one at a time, sent to a direct
   single-process server and to the Ray Serve application with one replica (proxy ->
   ingress -> replica); medians of the client-side latency;
2. SLO attainment and throughput with 1 and 2 replicas at 1x and 2x load (Poisson
   arrivals of the same seeded request list).

Every engine process runs with OMP_NUM_THREADS=1 (Ray sets it from the replica's one CPU;
the direct server gets it from the environment), so two replicas on two cores do not
oversubscribe them. Writes a JSON summary.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/replicas.py --out benchmarks/results/replicas.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
WORDS = [
    "the",
    "river",
    "runs",
    "past",
    "old",
    "stone",
    "walls",
    "and",
    "quiet",
    "fields",
    "toward",
    "a",
    "distant",
    "town",
]


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_healthy(url: str, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} not healthy")


def tiny_latencies(url: str, n: int) -> list[float]:
    body = {"prompt": "Hello", "max_tokens": 1, "temperature": 0}
    out = []
    with httpx.Client(timeout=60) as client:
        client.post(url + "/v1/completions", json=body)  # warm the connection path
        for _ in range(n):
            start = time.perf_counter()
            response = client.post(url + "/v1/completions", json=body)
            out.append(time.perf_counter() - start)
            assert response.status_code == 200, response.text
    return out


def workload(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [{"prompt": " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 60))),
             "max_tokens": rng.randint(16, 48), "ignore_eos": True, "temperature": 0}
            for _ in range(n)]  # fmt: skip


async def run_load(url: str, bodies: list[dict], rate: float, seed: int, slo: dict) -> dict:
    rng = random.Random(seed)
    headers = {"x-slo-ttft-ms": str(slo["ttft_ms"]), "x-slo-tbt-ms": str(slo["tbt_ms"])}
    results: list[tuple[int, dict | None]] = []

    async def one(client: httpx.AsyncClient, body: dict) -> None:
        response = await client.post(url + "/v1/completions", json=body, headers=headers)
        data = response.json()
        results.append((response.status_code, data if response.status_code == 200 else None))

    start = time.perf_counter()
    async with httpx.AsyncClient(timeout=600) as client:
        tasks = []
        for body in bodies:
            tasks.append(asyncio.create_task(one(client, body)))
            await asyncio.sleep(rng.expovariate(rate))
        await asyncio.gather(*tasks)
    wall = time.perf_counter() - start
    ok = [data for status, data in results if status == 200]
    met = [d for d in ok if d["slo"]["ttft_met"] and d["slo"]["tpot_met"]]
    tokens = sum(d["usage"]["completion_tokens"] for d in ok)
    return {
        "rate_rps": rate, "requests": len(bodies), "ok": len(ok),
        "rejected": len(bodies) - len(ok), "attainment": round(len(met) / len(bodies), 3),
        "ttft_attainment": round(sum(d["slo"]["ttft_met"] for d in ok) / len(bodies), 3),
        "tpot_attainment": round(sum(d["slo"]["tpot_met"] for d in ok) / len(bodies), 3),
        "throughput_tok_s": round(tokens / wall, 1), "goodput_rps": round(len(met) / wall, 3),
        "median_ttft_ms": round(statistics.median(d["slo"]["ttft_ms"] for d in ok), 1),
        "median_tpot_ms": round(statistics.median(d["slo"]["tpot_ms"] for d in ok), 1),
        "wall_s": round(wall, 1),
    }  # fmt: skip


def start_direct(port: int) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    args = [sys.executable, "-m", "superinfer.cli", "serve", "--port", str(port), "--device", "cpu"]
    return subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip


def deploy(replicas: int) -> None:
    from ray import serve

    from superinfer.cluster.app import ClusterConfig, build_application
    from superinfer.config import EngineConfig
    from superinfer.server.config import ServerConfig
    from superinfer.slo.classes import load_slo_config

    app = build_application(ServerConfig(), EngineConfig.from_flat(device="cpu"),
                            load_slo_config(None), ClusterConfig(replicas=replicas))  # fmt: skip
    serve.run(app, name="superinfer", route_prefix="/")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=1.0, help="1x load, requests per second")
    parser.add_argument("--requests", type=int, default=30, help="requests per load run")
    parser.add_argument("--tiny", type=int, default=20, help="tiny requests per latency probe")
    parser.add_argument("--ttft-ms", type=float, default=2000)
    parser.add_argument("--tbt-ms", type=float, default=250)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    import ray
    from ray import serve

    summary: dict[str, Any] = {"cpus": os.cpu_count(), "omp_num_threads_per_engine": 1}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1"}})  # fmt: skip
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    cluster_url = f"http://127.0.0.1:{port}"
    slo = {"ttft_ms": args.ttft_ms, "tbt_ms": args.tbt_ms}
    bodies = workload(args.requests, seed=1)
    try:
        deploy(1)
        wait_healthy(cluster_url)
        direct_port = free_port()
        direct = start_direct(direct_port)
        try:
            direct_url = f"http://127.0.0.1:{direct_port}"
            wait_healthy(direct_url)
            via_direct = tiny_latencies(direct_url, args.tiny)
            via_router = tiny_latencies(cluster_url, args.tiny)
        finally:
            direct.terminate()
            direct.wait(60)
        summary["router_overhead"] = {
            "direct_median_ms": round(statistics.median(via_direct) * 1000, 1),
            "router_median_ms": round(statistics.median(via_router) * 1000, 1),
            "added_ms": round((statistics.median(via_router) - statistics.median(via_direct))
                              * 1000, 1),
        }  # fmt: skip
        print(json.dumps(summary["router_overhead"]), flush=True)
        for replicas in (1, 2):
            if replicas == 2:
                deploy(2)
                wait_healthy(cluster_url)
            for factor in (1, 2):
                rate = args.rate * factor
                result = asyncio.run(run_load(cluster_url, bodies, rate, seed=factor, slo=slo))
                summary[f"replicas{replicas}_load{factor}x"] = result
                print(replicas, f"{factor}x", json.dumps(result), flush=True)
    finally:
        serve.shutdown()
        ray.shutdown()
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
