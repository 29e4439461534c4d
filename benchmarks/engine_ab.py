"""A/B speed check of the CPU engine: this checkout against an earlier commit, same run.

For a change that must not change speed (a refactoring), this measures both trees one
after the other, alternating their order over several repeats (the machine is shared and
drifts), and reports the medians and the ratio this tree / base:

- offline throughput: `LLM.generate` over a fixed batch of prompts, output tokens/s;
- single-request decode: one request alone, milliseconds per output token (TPOT).

Each measurement runs in a fresh process whose `superinfer` is that tree's (checked), on
the public API only (`LLM`, `SamplingParams`), so both trees run the same probe.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/engine_ab.py --base b6e7b2c --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# runs inside each tree; prints one JSON line
PROBE = r"""
import json, os, sys, time
from superinfer import LLM, SamplingParams
assert os.path.realpath(__import__("superinfer").__file__).startswith(os.path.realpath(sys.argv[1]))
num_prompts, num_tokens = int(sys.argv[2]), int(sys.argv[3])
llm = LLM(dtype="bfloat16", device="cpu", max_num_seqs=num_prompts)
topics = ["the sea", "a city at night", "mountains", "an old library", "the first computer",
          "bread", "a long train journey", "winter birds"]
prompts = [f"Write a detailed story about {topics[i % len(topics)]}, part {i}." for i in range(num_prompts)]
params = SamplingParams(max_tokens=num_tokens, temperature=0, ignore_eos=True)
llm.generate(prompts[:2], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))  # warm
start = time.perf_counter()
outputs = llm.generate(prompts, params)
elapsed = time.perf_counter() - start
num_out = sum(len(o.outputs[0].token_ids) for o in outputs)
start = time.perf_counter()
(single,) = llm.generate([prompts[0]], SamplingParams(max_tokens=num_tokens, temperature=0, ignore_eos=True))
m = single.metrics
tpot_ms = (m.last_token_time - m.first_token_time) / (len(single.outputs[0].token_ids) - 1) * 1e3
print(json.dumps({"throughput_tok_s": num_out / elapsed, "tpot_ms": tpot_ms}))
llm.engine.close()
"""


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, help="the commit to compare against")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--num-prompts", type=int, default=32, help="requests of the throughput run")
    p.add_argument("--num-tokens", type=int, default=64, help="output tokens of each request")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    return p.parse_args()


def worktree(rev: str) -> Path:
    """A checkout of `rev` beside the repository (made once)."""
    sha = subprocess.check_output(["git", "-C", str(ROOT), "rev-parse", "--short", rev], text=True).strip()
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"superinfer-ab-{sha}"
    if not path.exists():
        subprocess.check_call(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), sha])
    return path


def measure(tree: Path, num_prompts: int, num_tokens: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(tree), str(num_prompts), str(num_tokens)],
        cwd=tree, env=env, capture_output=True, text=True, check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    args = parse_args()
    trees = {"base": worktree(args.base), "head": ROOT}
    runs: dict[str, list[dict[str, float]]] = {"base": [], "head": []}
    for repeat in range(args.repeats):
        order = ("base", "head") if repeat % 2 == 0 else ("head", "base")
        for name in order:
            runs[name].append(measure(trees[name], args.num_prompts, args.num_tokens))
            print(f"repeat {repeat + 1} {name}: {runs[name][-1]}", flush=True)
    summary = {}
    for key in ("throughput_tok_s", "tpot_ms"):
        base = statistics.median(r[key] for r in runs["base"])
        head = statistics.median(r[key] for r in runs["head"])
        summary[key] = {"base": base, "head": head, "head_over_base": head / base,
                        "base_runs": [r[key] for r in runs["base"]],
                        "head_runs": [r[key] for r in runs["head"]]}  # fmt: skip
        print(f"{key}: base {base:.2f}, head {head:.2f}, head/base {head / base:.3f}")
    if args.out:
        Path(args.out).write_text(json.dumps({"base": args.base, **summary}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
