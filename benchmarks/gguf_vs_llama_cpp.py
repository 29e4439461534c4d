"""Is a GGUF file written by tests/model/gguf_tiny.py laid out as llama.cpp expects, and does
superinfer read it as llama.cpp does? Greedy tokens of transformers, llama.cpp and superinfer
on one tiny random model.

Builds a tiny model of --arch (seeded random weights, transformers' own classes, the
default model's vocabulary so that llama.cpp gets a real tokenizer), writes it as a float32
GGUF with `write_gguf` (llama.cpp's tensor names and conventions), then takes --new-tokens
greedy tokens after each of a few prompts from transformers (the reference), from
llama.cpp (llama-cpp-python run by --llama-python, `benchmarks/model_speed.py
--install-llama` installs it) and from superinfer loading the file.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/gguf_vs_llama_cpp.py --arch gemma3
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from gguf import GGMLQuantizationType
from transformers import AutoModelForCausalLM, LlamaConfig, MixtralConfig, Phi3Config, Qwen3Config

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from model_speed import add_tokenizer

from superinfer.model.loader import load_model
from tests.model.gguf_tiny import (
    tiny_gemma2_gguf_config,
    tiny_gemma3_gguf_config,
    tiny_qwen2_moe_gguf_config,
    tiny_qwen3_moe_gguf_config,
    write_gguf,
)
from tests.model.paged import PagedRun
from tests.model.tiny import TINY, tiny_phi3_longrope_config

ARCHS = ("gemma2", "gemma3", "llama", "mixtral", "phi3", "phi3-longrope", "qwen3", "qwen3moe",
         "qwen2moe")  # fmt: skip
VOCAB_SIZE = 49152  # the default model's tokenizer, which the GGUF carries for llama.cpp
PROMPTS = [[1, 1717, 2222, 3333, 444, 5555, 66, 7777, 8888, 999, 10000, 11, 12121],
           [1, 42, 4242, 424, 24, 2424], [1, 300, 30000, 3, 33, 333, 3333, 33333]]  # fmt: skip
LLAMA_SCRIPT = """
import json, sys
from llama_cpp import Llama

path, prompts, num_tokens = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
llm = Llama(model_path=path, n_ctx=256, n_threads=2, verbose=False)
out = []
for prompt in prompts:
    llm.reset()
    tokens = []
    for token in llm.generate(prompt, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0):
        tokens.append(token)
        if len(tokens) == num_tokens:
            break
    out.append(tokens)
print("TOKENS " + json.dumps(out))
"""


def tiny_config(arch: str):
    small = {**TINY, "vocab_size": VOCAB_SIZE, "bos_token_id": 1, "eos_token_id": 2}
    if arch in ("gemma2", "gemma3"):
        make = tiny_gemma2_gguf_config if arch == "gemma2" else tiny_gemma3_gguf_config
        config = make(VOCAB_SIZE)
        config.bos_token_id, config.eos_token_id = 1, 2
        return config
    if arch == "qwen3":
        return Qwen3Config(**small, head_dim=16, tie_word_embeddings=True)
    if arch == "phi3":
        return Phi3Config(**small, pad_token_id=0)
    if arch == "phi3-longrope":  # Phi-4-mini's RoPE: LongRoPE (long factors), partial
        return tiny_phi3_longrope_config(**small)
    if arch in ("qwen3moe", "qwen2moe"):
        make = tiny_qwen3_moe_gguf_config if arch == "qwen3moe" else tiny_qwen2_moe_gguf_config
        config = make(VOCAB_SIZE)
        config.bos_token_id, config.eos_token_id = 1, 2
        return config
    if arch == "mixtral":  # llama.cpp's llama with experts
        return MixtralConfig(**small, num_local_experts=4, num_experts_per_tok=2)
    return LlamaConfig(**small)


def llama_cpp_tokens(python: str, path: Path, num_tokens: int) -> list[list[int]]:
    done = subprocess.run([python, "-c", LLAMA_SCRIPT, str(path), json.dumps(PROMPTS),
                           str(num_tokens)], capture_output=True, text=True, timeout=600,
                          check=False)  # fmt: skip
    for line in done.stdout.splitlines():
        if line.startswith("TOKENS "):
            return json.loads(line.removeprefix("TOKENS "))
    raise RuntimeError(f"llama.cpp failed: {done.stderr[-2000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--arch",
        default="gemma3",
        choices=ARCHS,
    )
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--llama-python", default="/work/llama-venv/bin/python")
    parser.add_argument("--out", help="write the tokens and the verdicts as JSON")
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_config(tiny_config(args.arch)).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.15)  # logits far from uniform: no near ties
    with tempfile.TemporaryDirectory() as tmp:
        gguf_arch = {"mixtral": "llama", "phi3-longrope": "phi3"}.get(args.arch, args.arch)
        path = write_gguf(model, Path(tmp) / f"{args.arch}.gguf", gguf_arch,
                          GGMLQuantizationType.F32, lambda w: add_tokenizer(w, VOCAB_SIZE))  # fmt: skip
        reference = []
        for prompt in PROMPTS:
            with torch.inference_mode():
                tokens = model.generate(torch.tensor([prompt]), max_new_tokens=args.new_tokens,
                                        min_new_tokens=args.new_tokens, do_sample=False,
                                        pad_token_id=0)  # fmt: skip
            reference.append(tokens[0, len(prompt) :].tolist())
        ours_model = load_model(str(path), torch.float32, "cpu", quantization="none").model
        ours = [PagedRun(ours_model, 64, 4).greedy(p, args.new_tokens) for p in PROMPTS]
        theirs = llama_cpp_tokens(args.llama_python, path, args.new_tokens)
    result = {"arch": args.arch, "new_tokens": args.new_tokens, "prompts": PROMPTS,
              "transformers": reference, "llama.cpp": theirs, "superinfer": ours,
              "llama.cpp_equals_transformers": [a == b for a, b in zip(theirs, reference)],
              "superinfer_equals_transformers": [a == b for a, b in zip(ours, reference)]}  # fmt: skip
    for key in ("llama.cpp_equals_transformers", "superinfer_equals_transformers"):
        print(f"{key}: {result[key]}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
