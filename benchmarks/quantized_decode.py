"""Single-request decode speed of the default GGUF model: quantized (int4 kernel) against
dense bfloat16 and float32, in the same process, alternating, medians over several rounds.

    HF_HUB_OFFLINE=1 python benchmarks/quantized_decode.py [--rounds 5] [--prompt-len 256]

Each round runs every variant once: prefill a prompt of --prompt-len tokens (TTFT, the
forward and the logits of its last token), then --decode-steps greedy steps (TPOT: forward
of one token plus its logits). The model's forward only: no server, no sampling overhead.
It also reports whether the greedy tokens of the variants agree.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from superinfer.model.attention import AttentionMetadata, SeqEntry
from superinfer.model.loader import default_model_path, load_gguf_model

BLOCK_SIZE = 16
VARIANTS = {  # name -> (dtype, --quantization)
    "int4 (gguf)": (torch.bfloat16, "gguf"),
    "auto (int4 decode)": (torch.bfloat16, "auto"),
    "bf16 (none)": (torch.bfloat16, "none"),
    "fp32 (none)": (torch.float32, "none"),
}


def run_once(model, prompt: list[int], num_steps: int) -> tuple[float, float, list[int]]:
    c = model.config
    num_blocks = -(-(len(prompt) + num_steps + 1) // BLOCK_SIZE)
    kv = torch.zeros(num_blocks, c.num_layers, 2, BLOCK_SIZE, c.num_kv_heads, c.head_dim,
                     dtype=model.dtype)  # fmt: skip
    table = list(range(num_blocks))
    tokens, times, margins = list(prompt), [], []
    with torch.inference_mode():
        num_cached, num_query = 0, len(prompt)
        for _ in range(num_steps + 1):
            start = time.perf_counter()
            meta = AttentionMetadata.build([SeqEntry(num_query, num_cached, table)], BLOCK_SIZE,
                                           "cpu")  # fmt: skip
            ids = torch.tensor(tokens[num_cached:])
            hidden = model(ids, meta.positions, kv, meta)
            logits = model.compute_logits(hidden[meta.logits_indices])[0]
            token = int(logits.argmax())
            times.append(time.perf_counter() - start)
            top2 = logits.topk(2).values
            margins.append(float(top2[0] - top2[1]))
            tokens.append(token)
            num_cached, num_query = len(tokens) - 1, 1
    run_once.margins = margins  # top-1 minus top-2 logit of each step, for the last run
    return times[0], statistics.median(times[1:]), tokens[len(prompt) :]


def batch_step_ms(model, batch: int, prompt_len: int, num_steps: int) -> float:
    """The median time of a decode step of `batch` sequences (each after a `prompt_len`
    prefill, in one step), greedy, over `num_steps` steps."""
    c = model.config
    num_blocks = -(-(prompt_len + num_steps + 1) // BLOCK_SIZE)
    kv = torch.zeros(batch * num_blocks, c.num_layers, 2, BLOCK_SIZE, c.num_kv_heads,
                     c.head_dim, dtype=model.dtype)  # fmt: skip
    tables = [list(range(i * num_blocks, (i + 1) * num_blocks)) for i in range(batch)]
    seqs = [[(i * 31 + j * 7919) % 1000 + 10 for j in range(prompt_len)] for i in range(batch)]
    times, num_cached, num_query = [], 0, prompt_len
    with torch.inference_mode():
        for _ in range(num_steps + 1):
            entries = [SeqEntry(num_query, num_cached, t) for t in tables]
            meta = AttentionMetadata.build(entries, BLOCK_SIZE, "cpu")
            ids = torch.tensor([token for s in seqs for token in s[num_cached:]])
            start = time.perf_counter()
            hidden = model(ids, meta.positions, kv, meta)
            logits = model.compute_logits(hidden[meta.logits_indices])
            times.append(time.perf_counter() - start)
            for s, token in zip(seqs, logits.argmax(-1).tolist()):
                s.append(token)
            num_cached, num_query = num_cached + num_query, 1
    return statistics.median(times[1:]) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--decode-steps", type=int, default=32)
    args = parser.parse_args()
    path = default_model_path()
    models = {name: load_gguf_model(path, dtype, torch.device("cpu"), q)[0]
              for name, (dtype, q) in VARIANTS.items()}  # fmt: skip
    prompt = [(i * 7919) % 40000 + 100 for i in range(args.prompt_len)]
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in models}
    outputs, margins = {}, {}
    for name, model in models.items():  # warm-up
        run_once(model, prompt, 4)
    for _ in range(args.rounds):
        for name, model in models.items():
            ttft, tpot, outputs[name] = run_once(model, prompt, args.decode_steps)
            margins[name] = run_once.margins
            results[name].append((ttft, tpot))
    print(f"threads={torch.get_num_threads()} prompt={args.prompt_len} "
          f"steps={args.decode_steps} rounds={args.rounds}")  # fmt: skip
    for name, rows in results.items():
        ttft = statistics.median(r[0] for r in rows) * 1e3
        tpot = statistics.median(r[1] for r in rows) * 1e3
        spread = [round(r[1] * 1e3, 2) for r in rows]
        print(f"{name:18s} TTFT {ttft:7.1f} ms   TPOT {tpot:6.2f} ms   TPOT per round {spread}")
    for ref_name in ("fp32 (none)", "bf16 (none)"):
        reference = outputs[ref_name]
        for name, tokens in outputs.items():
            if name == ref_name:
                continue
            step = next((i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b), None)
            verdict = "identical" if step is None else (
                f"first divergence at step {step}: top-2 logit gap there {margins[ref_name][step]:.4f}"
                f" ({ref_name}), {margins[name][step]:.4f} ({name})")  # fmt: skip
            print(f"{name:18s} greedy tokens vs {ref_name}: {verdict}")


if __name__ == "__main__":
    main()
