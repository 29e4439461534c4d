"""A Q4_K_M-like GGUF under `--quantization auto` on two checkouts, one fresh process each,
alternating: memory, TTFT, TPOT and a batched decode step (32 sequences, or --batch-size).

    git worktree add --detach ../base 95d7976
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/q4_k_m_ab.py --base-tree ../base \\
        --out docs/results/models/q6k_gemm_1205/ab.json

Writes the model of --shape (seeded random weights, `q6k_decode.build_gguf`: Q6_K for the
tied head and embedding and for attn_v and ffn_down of half the layers, Q4_K for the rest,
as llama.cpp lays out Q4_K_M) once, then for --rounds rounds runs each checkout in its own
process (PYTHONPATH=<tree>; the order alternates round by round), which loads the file in
bfloat16 as the server does (`load_model`: the CPU's packed dense layers, the flat decode
loop) and reports:
- resident memory after the load, and its peak (VmHWM), in MB;
- TTFT of one --prompt-len prompt (the prefill forward and its logits) and TPOT over
  --decode-steps greedy steps (`quantized_decode.run_once`), and the greedy tokens;
- the median decode step of --batch-size sequences after a --batch-prompt-len prefill each.
Medians over the rounds; the processes run one after the other (run it on an idle machine).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from q6k_decode import SHAPES, build_gguf

MEASURE = """
import json, os, statistics, sys, time
import torch
sys.path.insert(0, {benchmarks!r})
from quantized_decode import batch_step_ms, run_once
from superinfer.model.loader import load_model

path, prompt_len, steps, batch_prompt_len, batch_size = sys.argv[1], *map(int, sys.argv[2:])
loaded = load_model(path, torch.bfloat16, "cpu", quantization="auto")
model = loaded.model
rss_mb = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
# VmHWM, this process's own peak: ru_maxrss keeps the parent's (the file's build) across
# fork and exec
status = open("/proc/self/status").read().splitlines()
peak_mb = next(int(line.split()[1]) for line in status if line.startswith("VmHWM")) / 1024
prompt = [(i * 7919) % 40000 + 100 for i in range(prompt_len)]
run_once(model, prompt, 4)  # warm-up
ttft, tpot, tokens = run_once(model, prompt, steps)
batch = batch_step_ms(model, batch_size, batch_prompt_len, 8)
print("RESULT " + json.dumps({{"rss_after_load_mb": round(rss_mb), "peak_rss_mb": round(peak_mb),
      "ttft_ms": round(ttft * 1e3, 2), "tpot_ms": round(tpot * 1e3, 3),
      "batch_step_ms": round(batch, 2), "tokens": tokens,
      "quantized_linears": loaded.checkpoint.num_quantized_linears}}))
"""


def measure(tree: Path, path: Path, args: argparse.Namespace) -> dict:
    """One fresh process of checkout `tree` on the file at `path`."""
    script = MEASURE.format(benchmarks=str(REPO / "benchmarks"))
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, "-c", script, str(path), str(args.prompt_len),
                           str(args.decode_steps), str(args.batch_prompt_len),
                           str(args.batch_size)],
                          cwd=tree, env=env, capture_output=True, text=True, check=False)  # fmt: skip
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line.removeprefix("RESULT "))
    raise RuntimeError(f"{tree} failed: {done.stderr[-2000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-tree", required=True, help="the checkout to compare against")
    parser.add_argument("--shape", default="qwen3-0.6b", choices=list(SHAPES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--decode-steps", type=int, default=64)
    parser.add_argument("--batch-prompt-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32, help="sequences of the batched step")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="write the results as JSON")
    args = parser.parse_args()
    trees = {"base": Path(args.base_tree).resolve(), "change": REPO}
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory() as tmp:
        path = build_gguf(args.shape, Path(tmp) / f"{args.shape}-q4_k_m.gguf", args.seed)
        for i in range(args.rounds):
            order = list(trees) if i % 2 == 0 else list(reversed(trees))
            for name in order:
                runs[name].append(measure(trees[name], path, args))
                print(f"round {i + 1} {name}: " + json.dumps(
                    {k: v for k, v in runs[name][-1].items() if k != "tokens"}), flush=True)  # fmt: skip
    keys = ("rss_after_load_mb", "peak_rss_mb", "ttft_ms", "tpot_ms", "batch_step_ms")
    summary = {name: {k: statistics.median(r[k] for r in rows) for k in keys}
               for name, rows in runs.items()}  # fmt: skip
    for key in keys:
        base, change = summary["base"][key], summary["change"][key]
        print(f"{key:18s} base {base:9.2f}  change {change:9.2f}  ratio {change / base:.3f}")
    tokens = [runs[name][0]["tokens"] for name in trees]
    first = next((i for i, (a, b) in enumerate(zip(*tokens)) if a != b), None)
    print("greedy tokens: " + ("identical" if first is None else f"first differ at step {first}"))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(
            {"command": "benchmarks/q4_k_m_ab.py " + " ".join(sys.argv[1:]), "args": vars(args),
             "summary": summary, "first_token_difference": first, "runs": runs}, indent=1) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
