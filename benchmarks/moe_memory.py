"""Memory and single-request decode of a GGUF mixture of experts: its experts kept quantized
(`--quantization auto`, `superinfer/model/quant_moe.py`) against dequantized (`none`).

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/moe_memory.py \\
        --out docs/results/models/moe_quant_1205/moe_memory.json
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/moe_memory.py --expert-types q4_k_m \\
        --out docs/results/models/moe_quant_1205/moe_memory_q4_k_m.json

Writes a synthetic Qwen3-MoE GGUF (seeded random weights, every matrix Q4_0, the router in
float; --layers, --experts of --expert-size inputs, 4 of them a token; the experts in
--expert-types: q4_0, q8_0, or q4_k_m as llama.cpp's Q4_K_M writes them, gate and up Q4_K
and down Q6_K in every other layer, Q4_K in the others, which needs --hidden and
--expert-size multiples of 256), then for each
quantization loads it in a fresh process (bfloat16, as the server does) and reports:
- peak resident memory of the load (VmHWM), and resident memory after it;
- the bytes the experts hold (their parameters, buffers and kernels' packed weights, as
  `tests/model/test_quant_moe.py` counts them);
- TPOT of one request (`quantized_decode.run_once`: --prompt-len tokens, then
  --decode-steps greedy steps; median over --rounds runs) and its greedy tokens, so the
  two can be compared (with each step's top-1 minus top-2 logit: random weights give
  near-ties, where the two roundings may choose differently);
- the median time of a decode step of 32 sequences (each after a --prompt-len prefill;
  8 steps, median of 3 runs), where the loop over active experts meets `none`'s grouped
  matmul.
The processes run one after the other; memory numbers do not depend on the machine's load,
the TPOTs do (run it on an idle machine).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

REPO = Path(__file__).resolve().parent.parent
HEAD_DIM, NUM_HEADS, VOCAB = 128, 8, 1024
Q4_0, Q8_0 = GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q8_0
Q4_K, Q6_K = GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q6_K
EXPERT_TYPES = ("q4_0", "q8_0", "q4_k_m")

MEASURE = """
import json, os, statistics, sys, time
import torch
sys.path.insert(0, {benchmarks!r})
from quantized_decode import batch_step_ms, run_once
from superinfer.model.loader import load_gguf_model

path, quantization, rounds, prompt_len, steps = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
model, info = load_gguf_model(path, torch.bfloat16, torch.device("cpu"), quantization)
rss_mb = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
# VmHWM, this process's own peak: ru_maxrss keeps the parent's (the file's build) across
# fork and exec
status = open("/proc/self/status").read().splitlines()
peak_mb = next(int(line.split()[1]) for line in status if line.startswith("VmHWM")) / 1024
sys.path.insert(0, {repo!r})
from tests.model.test_quant_moe import _held_bytes
held = sum(_held_bytes(layer.mlp.experts) for layer in model.model.layers)
prompt = [(i * 7919) % 1000 + 10 for i in range(prompt_len)]
run_once(model, prompt, 4)  # warm-up
tpots = []
for _ in range(rounds):
    _, tpot, tokens = run_once(model, prompt, steps)
    tpots.append(tpot * 1e3)

batch_ms = [batch_step_ms(model, 32, prompt_len, 8) for _ in range(3)]
print("RESULT " + json.dumps({{"batch32_step_ms": round(statistics.median(batch_ms), 2),"quantization": quantization, "peak_rss_mb": round(peak_mb),
      "rss_after_load_mb": round(rss_mb), "expert_bytes": held,
      "quantized_expert_layers": info.num_quantized_expert_layers,
      "tpot_ms": round(statistics.median(tpots), 3), "tpot_ms_runs": [round(t, 3) for t in tpots],
      "tokens": tokens, "margins": [round(m, 4) for m in run_once.margins]}}))
"""


def expert_qtypes(expert_types: str, layer: int) -> dict[str, GGMLQuantizationType]:
    """The type of each of a layer's expert projections (gate, up, down)."""
    if expert_types == "q4_k_m":
        return {"gate": Q4_K, "up": Q4_K, "down": Q6_K if layer % 2 == 0 else Q4_K}
    kind = Q8_0 if expert_types == "q8_0" else Q4_0
    return dict.fromkeys(("gate", "up", "down"), kind)


def quantized(data: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """GGUF bytes of (..., K) float32: gguf-py's quantizer, or the tests' for Q4_K and Q6_K
    (which gguf-py does not write)."""
    if qtype not in (Q4_K, Q6_K):
        return quantize(data, qtype)
    sys.path.insert(0, str(REPO))
    from tests.model.gguf_tiny import quantize_q4_k, quantize_q6_k

    pack = quantize_q4_k if qtype == Q4_K else quantize_q6_k
    return pack(data.reshape(-1, data.shape[-1])).reshape(*data.shape[:-1], -1)


def write_moe(path: Path, num_layers: int, size: int, num_experts: int, inner: int,
              expert_types: str = "q4_0") -> int:  # fmt: skip
    """A Qwen3-MoE GGUF of Q4_0 matrices and experts in `expert_types` (seed 0); returns its
    number of expert weights."""
    rng = np.random.default_rng(0)
    writer = GGUFWriter(str(path), "qwen3moe")
    writer.add_block_count(num_layers)
    writer.add_embedding_length(size)
    writer.add_feed_forward_length(inner)
    writer.add_head_count(NUM_HEADS)
    writer.add_head_count_kv(NUM_HEADS // 2)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_context_length(4096)
    writer.add_rope_freq_base(1e6)
    writer.add_expert_count(num_experts)
    writer.add_expert_used_count(4)
    writer.add_expert_feed_forward_length(inner)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_vocab_size(VOCAB)

    def matrix(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape, dtype=np.float32) * 0.05

    def q4(name: str, *shape: int, qtype: GGMLQuantizationType = Q4_0) -> None:
        writer.add_tensor(name, quantized(matrix(*shape), qtype), raw_dtype=qtype)

    q4("token_embd.weight", VOCAB, size)
    q4("output.weight", VOCAB, size)
    writer.add_tensor("output_norm.weight", np.ones(size, np.float32))
    for i in range(num_layers):
        b = f"blk.{i}."
        for norm, width in (("attn_norm", size), ("ffn_norm", size), ("attn_q_norm", HEAD_DIM),
                            ("attn_k_norm", HEAD_DIM)):  # fmt: skip
            writer.add_tensor(b + norm + ".weight", np.ones(width, np.float32))
        q4(b + "attn_q.weight", NUM_HEADS * HEAD_DIM, size)
        q4(b + "attn_k.weight", NUM_HEADS // 2 * HEAD_DIM, size)
        q4(b + "attn_v.weight", NUM_HEADS // 2 * HEAD_DIM, size)
        q4(b + "attn_output.weight", size, NUM_HEADS * HEAD_DIM)
        writer.add_tensor(b + "ffn_gate_inp.weight", matrix(num_experts, size))
        kinds = expert_qtypes(expert_types, i)
        q4(b + "ffn_gate_exps.weight", num_experts, inner, size, qtype=kinds["gate"])
        q4(b + "ffn_up_exps.weight", num_experts, inner, size, qtype=kinds["up"])
        q4(b + "ffn_down_exps.weight", num_experts, size, inner, qtype=kinds["down"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return num_layers * num_experts * 3 * inner * size


def measure(path: Path, quantization: str, args: argparse.Namespace) -> dict:
    script = MEASURE.format(benchmarks=str(REPO / "benchmarks"), repo=str(REPO))
    done = subprocess.run([sys.executable, "-c", script, str(path), quantization, str(args.rounds),
                           str(args.prompt_len), str(args.decode_steps)],
                          cwd=REPO, capture_output=True, text=True, check=False)  # fmt: skip
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line.removeprefix("RESULT "))
    raise RuntimeError(f"--quantization {quantization} failed: {done.stderr[-2000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument("--expert-size", type=int, default=768, help="each expert's inner size")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--decode-steps", type=int, default=32)
    parser.add_argument(
        "--expert-types",
        choices=EXPERT_TYPES,
        default="q4_0",
        help="the experts' GGUF types (q4_k_m: Q4_K, down Q6_K every other layer)",
    )
    parser.add_argument("--out", help="write the results as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"moe-{args.expert_types}.gguf"
        num_weights = write_moe(path, args.layers, args.hidden, args.experts, args.expert_size,
                                args.expert_types)  # fmt: skip
        results = [measure(path, q, args) for q in ("none", "auto")]
    none, auto = results
    for r in results:
        print(f"{r['quantization']:5s} peak RSS {r['peak_rss_mb']:6d} MB  after load "
              f"{r['rss_after_load_mb']:6d} MB  experts {r['expert_bytes'] / 2**20:8.1f} MiB  "
              f"TPOT {r['tpot_ms']:.2f} ms  batch-32 step {r['batch32_step_ms']:.1f} ms")  # fmt: skip
    first = next(
        (i for i, (a, b) in enumerate(zip(none["tokens"], auto["tokens"])) if a != b), None
    )
    # margins[i]: top-1 minus top-2 logit at the step that chose tokens[i]
    where = (
        "identical"
        if first is None
        else (
            f"first differ at step {first}, where none's top-2 logits were "
            f"{none['margins'][first]} apart (logits up to {max(none['margins']):.2f} apart)"
        )
    )
    print(f"expert weights {num_weights:,}; greedy tokens auto vs none: {where}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"args": vars(args), "expert_weights": num_weights,
                                              "first_token_difference": first,
                                              "results": results}, indent=2) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
