"""Unloaded figures of running servers: memory of each server's process tree, and the TTFT and
TPOT of single requests sent one at a time, alternating between the servers.

    .venv/bin/python benchmarks/vs_vllm/probe.py \
        --target superinfer=http://127.0.0.1:8000@PID --target vllm=http://127.0.0.1:8001@PID \
        --requests 5 --prompt-tokens 256 --output-tokens 64 --json probe.json

Each request is a streamed /v1/completions call with `ignore_eos` and `max_tokens`, greedy,
whose prompt starts with a number never used before (so no prefix-cache hit shortens the
prefill); TTFT is the time to the first streamed token, TPOT (vLLM's definition) is
(end-to-end latency - TTFT) / (output tokens - 1), both on this client's clock. One warm-up
request per server comes first and is not counted. Each request waits --settle-s (3 s)
first: vLLM's worker keeps busy-polling its queue for a second after each request, and on
a 2-core machine that takes a core from whichever server is asked next (without the pause,
superinfer's TTFT read 1.2 s instead of 0.2 s).

Memory is summed over the server process and all its descendants (vLLM runs an API server,
an engine core and a worker process): RSS counts shared pages once per process (an upper
bound), PSS shares them out (what the tree really costs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass

import httpx
import psutil

FILLER = (
    "The history of computing is a story of machines that became smaller, faster and cheaper "
    "while the problems they were asked to solve became larger. "
)


@dataclass
class Target:
    name: str
    url: str
    pid: int | None
    model: str = ""


def parse_target(spec: str) -> Target:
    name, sep, rest = spec.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected NAME=URL[@PID], got {spec!r}")
    url, _, pid = rest.partition("@")
    return Target(name, url.rstrip("/"), int(pid) if pid else None)


def tree_memory(pid: int) -> dict[str, float]:
    """RSS and PSS (MiB) summed over `pid` and its descendants, and the process count."""
    root = psutil.Process(pid)
    rss = pss = 0
    processes = [root, *root.children(recursive=True)]
    for process in processes:
        try:
            info = process.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        rss += info.rss
        pss += getattr(info, "pss", 0)
    return {"rss_mib": rss / 2**20, "pss_mib": pss / 2**20, "num_processes": len(processes)}


def make_prompt(index: int, num_tokens: int, tokenizer) -> str:
    """A prompt of about `num_tokens` tokens that starts with a never-repeated number."""
    text = f"Request {index}. "
    while len(tokenizer(text)["input_ids"]) < num_tokens:
        text += FILLER
    ids = tokenizer(text)["input_ids"][:num_tokens]
    return tokenizer.decode(ids)


def one_request(client: httpx.Client, target: Target, prompt: str, max_tokens: int) -> dict:
    body = {
        "model": target.model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    first = None
    usage = {}
    with client.stream("POST", target.url + "/v1/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            if first is None and any(c.get("text") for c in chunk.get("choices", [])):
                first = time.perf_counter()
    end = time.perf_counter()
    n = usage.get("completion_tokens", 0)
    ttft = (first - start) if first is not None else float("nan")
    return {
        "ttft_ms": 1000 * ttft,
        "tpot_ms": 1000 * (end - start - ttft) / (n - 1) if n > 1 else float("nan"),
        "e2e_ms": 1000 * (end - start),
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": n,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=parse_target, action="append", required=True,
                        help="NAME=URL[@PID] (repeatable; PID: the server's process)")  # fmt: skip
    parser.add_argument("--requests", type=int, default=5, help="timed requests per server")
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--tokenizer", default=None, help="HF directory (default: superinfer's)")
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--settle-s", type=float, default=3.0,
                        help="pause before each request: vLLM's worker busy-polls its "
                        "queue for 1 s after each request, taking a core from the next "
                        "server")  # fmt: skip
    args = parser.parse_args()

    if args.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    else:
        from superinfer.model.loader import default_model_path
        from superinfer.model.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(default_model_path())

    results: dict[str, dict] = {}
    with httpx.Client(timeout=300.0) as client:
        for target in args.target:
            target.model = client.get(target.url + "/v1/models").json()["data"][0]["id"]
            results[target.name] = {"url": target.url, "model": target.model, "requests": []}
        index = int(time.time())  # prompt numbers never seen by a server still running
        for target in args.target:  # warm-up, not counted
            one_request(client, target, make_prompt(index, args.prompt_tokens, tokenizer), 8)
            index += 1
        for _ in range(args.requests):
            for target in args.target:  # alternate: the same moment's noise for each
                prompt = make_prompt(index, args.prompt_tokens, tokenizer)
                index += 1
                time.sleep(args.settle_s)
                results[target.name]["requests"].append(
                    one_request(client, target, prompt, args.output_tokens)
                )
        for target in args.target:
            if target.pid is not None:
                results[target.name]["memory"] = tree_memory(target.pid)

    print(f"{'server':<16}{'TTFT ms (median, min-max)':>30}{'TPOT ms (median, min-max)':>30}"
          f"{'RSS MiB':>10}{'PSS MiB':>10}{'procs':>7}")  # fmt: skip
    for name, result in results.items():
        row = f"{name:<16}"
        for key in ("ttft_ms", "tpot_ms"):
            values = [r[key] for r in result["requests"]]
            result[f"median_{key}"] = statistics.median(values)
            row += f"{statistics.median(values):>14.1f} ({min(values):6.1f}-{max(values):6.1f})"
            row += " " * 6
        memory = result.get("memory")
        if memory:
            row += (
                f"{memory['rss_mib']:>10.0f}{memory['pss_mib']:>10.0f}{memory['num_processes']:>7}"
            )
        print(row)
        tokens = {(r["prompt_tokens"], r["completion_tokens"]) for r in result["requests"]}
        print(f"{'':<16}(prompt, output) tokens: {sorted(tokens)}")
    if args.json:
        meta = {"prompt_tokens": args.prompt_tokens, "output_tokens": args.output_tokens,
                "requests": args.requests, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}  # fmt: skip
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "servers": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
