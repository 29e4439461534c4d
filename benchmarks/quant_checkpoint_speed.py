"""AWQ and GPTQ checkpoints run quantized against the bfloat16 checkpoint they were made
from, one request at a time, on the CPU.

Writes an AWQ and a GPTQ (v1) copy of --hf-dir (4-bit, groups of --group-size, each linear
layer quantized by min/max; tests/model/quant_tiny.py's packers), loads the three with
their defaults (the 4-bit ones: `--quantization auto`, PyTorch's int4 kernels and
superinfer's GEMV), and alternates them round by round: TTFT of a --prompt-len prompt
(seeded random ids, a new one each round, the same for all) and TPOT over --new-tokens
tokens (greedy, EOS ignored), from the engine's own timestamps. Also: where the AWQ
model's greedy tokens first part from those of the same checkpoint dequantized to bfloat16
(`--quantization none`), and how much resident memory each load added. Medians over
--rounds.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/quant_checkpoint_speed.py \\
        --hf-dir /tmp/superinfer_model_speed/qwen3-0.6b-shape-seed0-full/hf

(model_speed.py builds that directory: Qwen3-0.6B's shape with seeded weights.)
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import random
import shutil
import statistics
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from superinfer import LLM, SamplingParams
from tests.model.quant_tiny import LINEARS, int4_tensors


def write_quantized(hf_dir: Path, out: Path, method: str, group_size: int) -> Path:
    """A 4-bit copy of `hf_dir` in `method`'s format (reused when already written)."""
    if (out / "config.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for shard in sorted(hf_dir.glob("*.safetensors")):
        tensors.update(load_file(shard))
    quantized = {}
    for name, t in tensors.items():
        module = name.removesuffix(".weight")
        if name.endswith(".weight") and module.endswith(LINEARS):
            parts, _ = int4_tensors(t.float(), method, group_size)
            quantized.update({f"{module}.{k}": v for k, v in parts.items()})
        else:
            quantized[name] = t
    save_file(quantized, out / "model.safetensors")
    for f in hf_dir.iterdir():
        if not f.name.startswith(("model", "config")):
            shutil.copy(f, out / f.name)
    config = json.loads((hf_dir / "config.json").read_text())
    config["quantization_config"] = {"quant_method": method, "bits": 4, "group_size": group_size,
                                     "version": "gemm", "desc_act": False, "sym": False,
                                     "checkpoint_format": "gptq"}  # fmt: skip
    (out / "config.json").write_text(json.dumps(config))
    return out


def rss_mb() -> float:
    """Resident memory after returning freed heap pages to the system."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def timed(llm: LLM, prompt: list[int], num_new: int) -> tuple[float, float]:
    """(TTFT, TPOT) in ms of one greedy request, from the engine's own timestamps."""
    params = SamplingParams(max_tokens=num_new + 1, ignore_eos=True, temperature=0.0)
    metrics = llm.generate([{"prompt_token_ids": prompt}], params)[0].metrics
    ttft = metrics.first_token_time - metrics.arrival_time
    return ttft * 1e3, (metrics.last_token_time - metrics.first_token_time) / num_new * 1e3


def first_divergence(engines: dict[str, LLM], prompt: list[int], num_tokens: int) -> dict:
    """Where the AWQ model's greedy tokens first part from its dequantized model's, and the
    dequantized model's log-probability gap there between its choice and AWQ's (a near
    tie when small)."""
    params = SamplingParams(max_tokens=num_tokens, ignore_eos=True, temperature=0.0, logprobs=5)
    runs = {name: engines[name].generate([{"prompt_token_ids": prompt}], params)[0].outputs[0]
            for name in ("awq", "awq-dequantized")}  # fmt: skip
    quantized, dense = runs["awq"], runs["awq-dequantized"]
    for i, (a, b) in enumerate(zip(quantized.token_ids, dense.token_ids)):
        if a != b:
            top = dict(dense.logprobs[i].top)
            gap = top[b] - top[a] if a in top else None
            return {"at_token": i, "of": num_tokens, "dequantized_logprob_gap": gap}
    return {"at_token": None, "of": num_tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hf-dir", required=True, help="a bfloat16 Hugging Face directory")
    parser.add_argument("--work-dir", default="/tmp/superinfer_quant_checkpoint")
    parser.add_argument("--group-size", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--out", help="write the results as JSON")
    args = parser.parse_args()
    hf_dir = Path(args.hf_dir)
    models = {"bf16": (hf_dir, "auto")}
    for method in ("awq", "gptq"):
        out = Path(args.work_dir) / f"{hf_dir.parent.name}-{method}-g{args.group_size}"
        models[method] = (write_quantized(hf_dir, out, method, args.group_size), "auto")
    models["awq-dequantized"] = (models["awq"][0], "none")
    engines, load_mb = {}, {}
    for name, (path, quantization) in models.items():
        before = rss_mb()
        engines[name] = LLM(str(path), device="cpu", max_model_len=1024, quantization=quantization)
        load_mb[name] = rss_mb() - before
    rng = random.Random(0)
    vocab = min(engines["bf16"].engine.model_config.vocab_size, 49152)  # the tokenizer's
    samples = {name: {"ttft_ms": [], "tpot_ms": []} for name in engines}
    for r in range(args.rounds):
        # a new prompt each round (the same for every model): no prefix-cache hits
        prompt = [rng.randrange(3, vocab) for _ in range(args.prompt_len)]
        order = list(engines) if r % 2 == 0 else list(reversed(engines))
        for name in order:
            ttft, tpot = timed(engines[name], prompt, args.new_tokens)
            samples[name]["ttft_ms"].append(ttft)
            samples[name]["tpot_ms"].append(tpot)
        print(f"round {r}: " + ", ".join(
            f"{n} TTFT {s['ttft_ms'][-1]:.1f} TPOT {s['tpot_ms'][-1]:.2f} ms"
            for n, s in samples.items()), flush=True)  # fmt: skip
    result = {"args": vars(args), "threads": torch.get_num_threads(),
              "awq_vs_dequantized": first_divergence(engines, prompt, args.new_tokens + 1),
              "models": {}}  # fmt: skip
    bf16_tpot = statistics.median(samples["bf16"]["tpot_ms"])
    for name, s in samples.items():
        result["models"][name] = {
            "ttft_ms": statistics.median(s["ttft_ms"]), "tpot_ms": statistics.median(s["tpot_ms"]),
            "tpot_vs_bf16": statistics.median(s["tpot_ms"]) / bf16_tpot,
            "load_rss_mb": load_mb[name],
            "quantized_linears": engines[name].engine.checkpoint.num_quantized_linears,
            "samples": s,
        }  # fmt: skip
        summary = {k: v for k, v in result["models"][name].items() if k != "samples"}
        print(f"{name}: {json.dumps(summary)}")
    print(f"AWQ against its dequantized model: {result['awq_vs_dequantized']}")
    for llm in engines.values():
        llm.engine.close()
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
