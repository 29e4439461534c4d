"""AWQ and GPTQ checkpoints run quantized against the bfloat16 checkpoint they were made
from, one request at a time, on the CPU.

Writes an AWQ and a GPTQ (v1) copy of --hf-dir (4-bit, groups of --group-size; AWQ by each
group's min and max, GPTQ symmetric by its largest |w|; tests/model/quant_tiny.py's
packers), loads them and the original with their defaults (the 4-bit ones:
`--quantization auto`, PyTorch's int4 kernels and superinfer's GEMV), plus the AWQ copy
dequantized, and alternates the four round by round: TTFT of a --prompt-len prompt
(seeded random ids, a new one each round, the same for all) and TPOT over --new-tokens
tokens (greedy, EOS ignored), from the engine's own timestamps. Also: where the AWQ
model's greedy tokens first part from those of the same checkpoint dequantized to bfloat16
(`--quantization none`), and how much resident memory each load added. Medians over
--rounds. With --vllm-python, also whether vLLM's CPU build, on the same two checkpoints,
gives the same greedy tokens (the GPTQ copy is symmetric, which vLLM's CPU path needs).

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/quant_checkpoint_speed.py \\
        --hf-dir /tmp/superinfer_model_speed/qwen3-0.6b-shape-seed0-full/hf

(model_speed.py builds that directory: Qwen3-0.6B's shape with seeded weights.)
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from superinfer import LLM, SamplingParams
from tests.model.quant_tiny import int4_tensors, quantize_checkpoint, write_checkpoint

# as AutoAWQ and AutoGPTQ write them (vLLM reads both)
QUANTIZATION_CONFIGS = {
    "awq": {"quant_method": "awq", "bits": 4, "version": "gemm", "zero_point": True},
    "gptq": {"quant_method": "gptq", "bits": 4, "desc_act": False, "sym": True,
             "checkpoint_format": "gptq"},
}  # fmt: skip


def write_quantized(hf_dir: Path, out: Path, method: str, group_size: int) -> Path:
    """A 4-bit copy of `hf_dir` in `method`'s format (reused when already written)."""
    if (out / "config.json").exists():
        return out

    def make_layer(_name: str, w: torch.Tensor):
        return int4_tensors(w.float(), method, group_size, is_symmetric=method == "gptq")

    quantized, _ = quantize_checkpoint(hf_dir, make_layer)
    config = QUANTIZATION_CONFIGS[method] | {"group_size": group_size}
    return write_checkpoint(hf_dir, out, quantized, config)


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


VLLM_SCRIPT = """
import json, sys

def main():
    from vllm import LLM, SamplingParams
    path, prompts, num_tokens = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    llm = LLM(model=path, dtype="bfloat16", enforce_eager=True, max_model_len=1024)
    params = SamplingParams(max_tokens=num_tokens, temperature=0, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    print("TOKENS " + json.dumps([list(o.outputs[0].token_ids) for o in outs]))

if __name__ == "__main__":
    main()
"""


def vllm_tokens(python: str, path: Path, prompts: list[list[int]], num_tokens: int) -> list:
    """vLLM's greedy tokens for `prompts` on the checkpoint at `path` (its CPU build, in
    bfloat16, in a subprocess)."""
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_OMP_THREADS_BIND": "0-1",
           "VLLM_USE_AOT_COMPILE": "0", "VLLM_CPU_KVCACHE_SPACE": "1",
           "HF_HUB_OFFLINE": "1"}  # fmt: skip
    with tempfile.NamedTemporaryFile("w", suffix=".py") as script:
        script.write(VLLM_SCRIPT)
        script.flush()
        done = subprocess.run([python, script.name, str(path), json.dumps(prompts),
                               str(num_tokens)], capture_output=True, text=True, env=env,
                              timeout=900, check=False)  # fmt: skip
    for line in done.stdout.splitlines():
        if line.startswith("TOKENS "):
            return json.loads(line.removeprefix("TOKENS "))
    errors = [line for line in done.stderr.splitlines() if "Error" in line]
    raise RuntimeError(f"vLLM failed on {path}: " + "\n".join(errors[-10:]))


def compare_with_vllm(args: argparse.Namespace, models: dict, prompts: list[list[int]]) -> dict:
    """For the AWQ and GPTQ checkpoints: are superinfer's greedy tokens (its defaults)
    vLLM's, prompt by prompt? Where they part, superinfer's log-probability gap between its
    token and vLLM's (a near tie when small)."""
    out = {}
    params = SamplingParams(max_tokens=args.new_tokens, ignore_eos=True, temperature=0.0,
                            logprobs=20)  # fmt: skip
    for method in ("awq", "gptq"):
        path = models[method][0]
        llm = LLM(str(path), device="cpu", max_model_len=1024)
        ours = [o.outputs[0] for o in llm.generate([{"prompt_token_ids": p} for p in prompts],
                                                   params)]  # fmt: skip
        llm.engine.close()
        theirs = vllm_tokens(args.vllm_python, path, prompts, args.new_tokens)
        rows = []
        for mine, other in zip(ours, theirs):
            at = next((i for i, (a, b) in enumerate(zip(mine.token_ids, other)) if a != b), None)
            gap = None
            if at is not None:
                top = dict(mine.logprobs[at].top)
                gap = top[mine.token_ids[at]] - top[other[at]] if other[at] in top else None
            rows.append({"equal": at is None, "first_divergence": at, "logprob_gap": gap})
        out[method] = rows
        print(f"{method} against vLLM: {rows}", flush=True)
    return out


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
    parser.add_argument("--vllm-python", help="also compare greedy tokens with vLLM's CPU "
                        "build run by this interpreter (benchmarks/vs_vllm/install_vllm.sh)")  # fmt: skip
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
    engines.clear()  # their memory, before vLLM sizes its own
    gc.collect()
    if args.vllm_python:
        prompts = [[rng.randrange(3, vocab) for _ in range(n)] for n in (8, 64, args.prompt_len)]
        result["vs_vllm"] = compare_with_vllm(args, models, prompts)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
