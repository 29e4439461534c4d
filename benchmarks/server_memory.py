"""Resident memory of `superinfer serve` under sustained, varied load.

Starts the server with its defaults (the default model, default pools) on a free port,
then sends rounds of `superinfer bench serve` traffic with varied prompt and output lengths
(the azure-conv trace's lengths, a new seed each round) and samples the server's RSS from
/proc every few seconds. Flat means: the RSS after the last round is within a few percent of
the RSS after the first one.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/server_memory.py --rounds 6 \
        --out docs/results/server/memory.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    """The process's resident memory (VmRSS), or its peak so far (VmHWM), in MB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field}")


def wait_healthy(url: str, process: subprocess.Popen, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise TimeoutError("server did not become healthy")


def sample_rss(pid: int, samples: list, stop: threading.Event, period_s: float) -> None:
    start = time.monotonic()
    while not stop.wait(period_s):
        samples.append((round(time.monotonic() - start, 1), round(rss_mb(pid), 1)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6, help="bench rounds of traffic")
    parser.add_argument("--num-prompts", type=int, default=60, help="requests per round")
    parser.add_argument("--request-rate", type=float, default=4.0, help="req/s within a round")
    parser.add_argument("--max-output-tokens", type=int, default=32)
    parser.add_argument("--period-s", type=float, default=2.0, help="RSS sampling period")
    parser.add_argument("--server-args", default="", help="more `superinfer serve` arguments")
    parser.add_argument("--out", default=None, help="write the trace as JSON here")
    args = parser.parse_args()

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [str(BIN / "superinfer"), "serve", "--port", str(port), *args.server_args.split()],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO,
    )  # fmt: skip
    samples: list[tuple[float, float]] = []
    stop = threading.Event()
    rounds = []
    try:
        wait_healthy(url, server)
        ready_mb = rss_mb(server.pid)
        sampler = threading.Thread(
            target=sample_rss, args=(server.pid, samples, stop, args.period_s)
        )
        sampler.start()
        for round_index in range(args.rounds):
            subprocess.run(
                [str(BIN / "superinfer"), "bench", "serve", "--base-url", url,
                 "--dataset-name", "azure-conv", "--num-prompts", str(args.num_prompts),
                 "--request-rate", str(args.request_rate), "--seed", str(round_index),
                 "--max-output-tokens", str(args.max_output_tokens), "--disable-tqdm"],
                check=True, stdout=subprocess.DEVNULL, cwd=REPO,
            )  # fmt: skip
            rounds.append(round(rss_mb(server.pid), 1))
            print(f"round {round_index + 1}: RSS {rounds[-1]:.0f} MB", flush=True)
        high_water_mb = rss_mb(server.pid, "VmHWM")  # the load's peak too, between samples
    finally:
        stop.set()
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=120)
    result = {
        "command": " ".join(sys.argv),
        "server_args": args.server_args,
        "ready_rss_mb": round(ready_mb, 1),
        "rss_after_each_round_mb": rounds,
        "peak_rss_mb": max(mb for _, mb in samples) if samples else None,
        "high_water_rss_mb": round(high_water_mb, 1),
        "growth_first_to_last_round_mb": round(rounds[-1] - rounds[0], 1),
        "samples": samples,
        "load_average": os.getloadavg(),
    }
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=1))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
