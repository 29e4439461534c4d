"""Single-request decode speed of a Q4_K_M-like GGUF: its Q6_K layers and its fused q/k/v
of mixed types (Q4_K q/k, Q6_K v) on the few-row GEMV against the same layers dense (what
superinfer ran before), and llama.cpp on the same file.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/q6k_decode.py --shape qwen3-0.6b \\
        --out docs/results/models/q6k_decode.json
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/q6k_decode.py --tiny   # checks it runs

Builds a model of --shape (transformers' classes, seeded random weights of std 0.02, norms
1; plain RoPE), writes it with tests' `write_gguf` as llama.cpp's Q4_K_M lays a file out
(`q4_k_m_types`: Q6_K for the head, here the tied embedding, and for attn_v and ffn_down
of about half the layers; Q4_K for the rest) and loads it once under `--quantization auto`
in bfloat16 as the server does (oneDNN-packed dense layers, the flat decode loop). Each
round runs, in turn:

- "gemv": the model as loaded: lm_head and the Q6_K ffn_down on the GEMV (Q6KLinear), the
  q/k/v whose v is Q6_K part by part on it (`quant_parts.MixedLinear`);
- "mixed dense": the same model with each MixedLinear replaced by the dense layer of the
  file loaded under `none` (as superinfer ran before the mixed layers ran part by part);
- "q6k+mixed dense": each Q6KLinear too (every Q6_K weight dequantized, as before the
  Q6_K GEMV).

Each run prefills --prompt-len tokens, then takes --decode-steps greedy steps (TPOT: the
forward of one token and its logits; `quantized_decode.run_once`); medians over the
rounds. With --llama-python (llama-cpp-python; `benchmarks/model_speed.py
--install-llama` installs it), llama.cpp decodes the same prompt from the same file in
its own process, after the rounds, on as many threads (its TPOT: the time between
generated tokens, greedy sampling included). Also reports whether the greedy tokens agree,
and the memory the mixed layers' quantized parts take.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from gguf import GGMLQuantizationType
from torch import nn
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from model_speed import add_tokenizer
from quantized_decode import run_once

from superinfer.model.cpu_linear import pack_linears
from superinfer.model.loader import load_gguf_model
from superinfer.model.quant import Q6KLinear
from superinfer.model.quant_parts import MixedLinear
from tests.model.gguf_tiny import q4_k_m_types, write_gguf

SHAPES = {  # the released models' shapes (vocabulary, sizes, heads); tied embeddings
    "qwen3-0.6b": (Qwen3Config, {"vocab_size": 151936, "hidden_size": 1024,
                                 "intermediate_size": 3072, "num_hidden_layers": 28,
                                 "num_attention_heads": 16, "num_key_value_heads": 8,
                                 "head_dim": 128, "rope_theta": 1e6}),
    "llama-1b": (LlamaConfig, {"vocab_size": 128256, "hidden_size": 2048,
                               "intermediate_size": 8192, "num_hidden_layers": 16,
                               "num_attention_heads": 32, "num_key_value_heads": 8,
                               "head_dim": 64, "rope_theta": 5e5}),
    # sizes that divide into K-quants' super-blocks; the default model's vocabulary, the
    # smallest that llama.cpp gets a tokenizer for (`add_tokenizer`)
    "tiny": (Qwen3Config, {"vocab_size": 49152, "hidden_size": 256, "intermediate_size": 512,
                           "num_hidden_layers": 4, "num_attention_heads": 4,
                           "num_key_value_heads": 2, "head_dim": 64, "rope_theta": 1e6}),
}  # fmt: skip
ARCHS = {Qwen3Config: "qwen3", LlamaConfig: "llama"}
LLAMA_SCRIPT = """
import json, statistics, sys, time
from llama_cpp import Llama

path, prompt, num_steps, rounds, threads = sys.argv[1], json.loads(sys.argv[2]), *map(int, sys.argv[3:])
llm = Llama(model_path=path, n_ctx=len(prompt) + num_steps + 16, n_threads=threads,
            n_threads_batch=threads, verbose=False)
tpots, tokens = [], []
for _ in range(rounds + 1):  # the first warms up
    llm.reset()
    tokens, times, last = [], [], time.perf_counter()
    for token in llm.generate(prompt, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0):
        now = time.perf_counter()
        times.append(now - last)
        last = now
        tokens.append(token)
        if len(tokens) == num_steps + 1:
            break
    tpots.append(statistics.median(times[1:]))
print("RESULT " + json.dumps({"tpot": tpots[1:], "tokens": tokens[1:]}))
"""


def build_gguf(shape: str, path: Path, seed: int) -> Path:
    """The model of `shape`, random, written as a Q4_K_M-like GGUF at `path`."""
    config_class, sizes = SHAPES[shape]
    config = config_class(**sizes, tie_word_embeddings=True, max_position_embeddings=4096,
                          bos_token_id=1, eos_token_id=2)  # fmt: skip
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.normal_(0.0, 0.02)
    types = q4_k_m_types(config.num_hidden_layers, is_tied=True)
    return write_gguf(model, path, ARCHS[config_class], GGMLQuantizationType.Q4_K,
                      lambda w: add_tokenizer(w, config.vocab_size), types=types)  # fmt: skip


VARIANTS = {"gemv": (), "mixed dense": (MixedLinear,),  # name -> the kinds put back dense
            "q6k+mixed dense": (MixedLinear, Q6KLinear)}  # fmt: skip
BASELINE = "q6k+mixed dense"


def gemv_layers(model: nn.Module) -> dict[str, Q6KLinear | MixedLinear]:
    """Each Q6KLinear and MixedLinear of `model`, by name."""
    kinds = (Q6KLinear, MixedLinear)
    return {name: m for name, m in model.named_modules() if isinstance(m, kinds)}


def use_variant(model: nn.Module, layers: dict[str, nn.Module], dense_model: nn.Module,
                dense: tuple[type, ...]) -> None:  # fmt: skip
    """Put each layer, or `dense_model`'s layer of that name where it is of a kind in `dense`,
    in its place; the flat decode loop holds the layers' methods, so it is rebuilt."""
    for name, layer in layers.items():
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child,
                dense_model.get_submodule(name) if isinstance(layer, dense) else layer)  # fmt: skip
    model.use_flat_decode()


def parts_megabytes(layers: dict[str, nn.Module]) -> float:
    """The bytes of the MixedLinear layers' quantized parts."""
    tensors = [value for layer in layers.values() if isinstance(layer, MixedLinear)
               for part in layer.parts for value in vars(part).values()
               if isinstance(value, torch.Tensor)]  # fmt: skip
    return sum(t.untyped_storage().nbytes() for t in tensors) / 1e6


def llama_cpp_run(python: str, path: Path, prompt: list[int], args) -> dict:
    done = subprocess.run([python, "-c", LLAMA_SCRIPT, str(path), json.dumps(prompt),
                           str(args.decode_steps), str(args.rounds), str(torch.get_num_threads())],
                          capture_output=True, text=True, timeout=3600, check=False)  # fmt: skip
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line.removeprefix("RESULT "))
    raise RuntimeError(f"llama.cpp failed: {done.stderr[-2000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="qwen3-0.6b", choices=[s for s in SHAPES if s != "tiny"])
    parser.add_argument("--tiny", action="store_true", help="a tiny model: checks the script")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--decode-steps", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--llama-python", default=None, help="e.g. /work/llama-venv/bin/python")
    parser.add_argument("--out", help="write the results as JSON")
    args = parser.parse_args()
    shape = "tiny" if args.tiny else args.shape
    with tempfile.TemporaryDirectory() as tmp:
        path = build_gguf(shape, Path(tmp) / f"{shape}-q4_k_m.gguf", args.seed)
        model, info = load_gguf_model(str(path), torch.bfloat16, torch.device("cpu"), "auto")
        pack_linears(model)
        dense_model, _ = load_gguf_model(str(path), torch.bfloat16, torch.device("cpu"), "none")
        pack_linears(dense_model)
        layers = gemv_layers(model)
        by_kind = {kind.__name__: [n for n, m in layers.items() if isinstance(m, kind)]
                   for kind in (Q6KLinear, MixedLinear)}  # fmt: skip
        megabytes = parts_megabytes(layers)
        print(f"{shape}: {info.num_quantized_linears} linear layers quantized, of them on the "
              f"GEMV: {by_kind}; the mixed layers' parts take {megabytes:.1f} MB; flat decode "
              f"{model.use_flat_decode()}")  # fmt: skip
        vocab = model.config.vocab_size
        prompt = [(i * 7919) % (min(vocab, 49152) - 100) + 100 for i in range(args.prompt_len)]
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in VARIANTS}
        outputs = {}
        for dense in VARIANTS.values():  # warm-up
            use_variant(model, layers, dense_model, dense)
            run_once(model, prompt, 4)
        for _ in range(args.rounds):
            for name, dense in VARIANTS.items():
                use_variant(model, layers, dense_model, dense)
                ttft, tpot, outputs[name] = run_once(model, prompt, args.decode_steps)
                results[name].append((ttft, tpot))
        theirs = None
        if args.llama_python:
            theirs = llama_cpp_run(args.llama_python, path, prompt, args)
    extra = {"layers_on_gemv": {k: len(v) for k, v in by_kind.items()},
             "mixed_parts_mb": round(megabytes, 1)}  # fmt: skip
    report(args, shape, results, outputs, theirs, extra)


def report(
    args, shape: str, results: dict, outputs: dict, theirs: dict | None, extra: dict
) -> None:
    print(f"threads={torch.get_num_threads()} prompt={args.prompt_len} "
          f"steps={args.decode_steps} rounds={args.rounds}")  # fmt: skip
    summary = {}
    for name, rows in results.items():
        tpot = statistics.median(r[1] for r in rows) * 1e3
        ttft = statistics.median(r[0] for r in rows) * 1e3
        summary[name] = {"tpot_ms": round(tpot, 3), "ttft_ms": round(ttft, 2),
                         "tpot_per_round_ms": [round(r[1] * 1e3, 3) for r in rows]}  # fmt: skip
        print(f"{name:15s} TPOT {tpot:7.3f} ms   TTFT {ttft:8.2f} ms   per round "
              f"{summary[name]['tpot_per_round_ms']}")  # fmt: skip
    if theirs is not None:
        tpot = statistics.median(theirs["tpot"]) * 1e3
        summary["llama.cpp"] = {"tpot_ms": round(tpot, 3),
                                "tpot_per_round_ms": [round(t * 1e3, 3) for t in theirs["tpot"]]}  # fmt: skip
        print(f"{'llama.cpp':15s} TPOT {tpot:7.3f} ms   per round "
              f"{summary['llama.cpp']['tpot_per_round_ms']}")  # fmt: skip
        outputs["llama.cpp"] = theirs["tokens"][: args.decode_steps]
    reference = outputs[BASELINE]
    agree = {}
    for name, tokens in outputs.items():
        step = next((i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b), None)
        agree[name] = step
        if name != BASELINE:
            verdict = "identical" if step is None else f"first differ at step {step}"
            print(f"{name:15s} greedy tokens vs {BASELINE}: {verdict}")
    if args.out:
        out = {"command": "benchmarks/q6k_decode.py " + " ".join(sys.argv[1:]), "shape": shape,
               "threads": torch.get_num_threads(), "torch": torch.__version__,
               **extra, "results": summary,
               f"first_token_differing_from_{BASELINE.replace(' ', '_')}": agree}  # fmt: skip
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
