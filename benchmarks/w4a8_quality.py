"""What `--quantization gguf-w4a8` (8-bit activations in batched steps) costs in quality on
the default model, against `auto` (bfloat16 activations) and float32 (the GGUF dequantized,
`--quantization none --dtype float32`), each mode in its own engine, one after the other:

1. perplexity over --num-texts ShareGPT texts of 512 tokens (prompt log-probabilities;
   prefill steps of 512 rows, so every 4-bit layer runs its batched kernel);
2. greedy replies of 48 tokens to --num-chats ShareGPT chats, generated together (decode
   steps of that many rows): how many are identical to `auto`'s, and where the others part.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/w4a8_quality.py --out /tmp/w4a8_quality.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from superinfer import LLM, SamplingParams
from superinfer.workload.datasets import sample_sharegpt

MODES = {"auto": {}, "gguf-w4a8": {"quantization": "gguf-w4a8"},
         "float32": {"quantization": "none", "dtype": "float32"}}  # fmt: skip


def texts_of(tokenizer, num_texts: int, length: int = 512) -> list[list[int]]:
    """ShareGPT first turns, concatenated and cut into `num_texts` runs of `length` tokens."""
    sampled, _ = sample_sharegpt(tokenizer, 50 * num_texts, seed=7, max_prompt_tokens=1024)
    texts, current = [], []
    for request in sampled:
        current += tokenizer(request.prompt)["input_ids"]
        if len(current) >= length:
            texts.append(current[:length])
            current = []
        if len(texts) == num_texts:
            break
    return texts


def measure(mode: str, args: argparse.Namespace) -> dict:
    llm = LLM(num_device_blocks=2048, enable_prefix_caching=False, **MODES[mode])
    tokenizer = llm.get_tokenizer()
    texts = texts_of(tokenizer, args.num_texts)
    outputs = llm.generate([{"prompt_token_ids": t} for t in texts],
                           SamplingParams(max_tokens=1, prompt_logprobs=0))  # fmt: skip
    logprobs = [lp.logprob for o in outputs for lp in o.prompt_logprobs[1:]]
    chats, _ = sample_sharegpt(tokenizer, args.num_chats, seed=3, max_prompt_tokens=400)
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": c.prompt}],
                                             tokenize=False, add_generation_prompt=True)
               for c in chats]  # fmt: skip
    greedy = llm.generate(prompts, SamplingParams(max_tokens=48, temperature=0, ignore_eos=True))
    del llm  # one engine at a time
    return {"perplexity": math.exp(-sum(logprobs) / len(logprobs)),
            "num_scored_tokens": len(logprobs),
            "greedy": [list(g.outputs[0].token_ids) for g in greedy]}  # fmt: skip


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-texts", type=int, default=24)
    parser.add_argument("--num-chats", type=int, default=16)
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    results = {mode: measure(mode, args) for mode in MODES}
    base = results["auto"]
    for mode, result in results.items():
        parted = [first_difference(a, b) for a, b in zip(base["greedy"], result["greedy"],
                                                           strict=True)]  # fmt: skip
        result["greedy_parts_from_auto_at"] = parted
        change = result["perplexity"] / base["perplexity"] - 1
        print(f"{mode:10s} perplexity {result['perplexity']:.4f} ({change:+.3%} against auto, "
              f"{result['num_scored_tokens']} tokens); greedy replies identical to auto's: "
              f"{parted.count(None)} of {len(parted)}; the others part at tokens "
              f"{sorted(p for p in parted if p is not None)}")  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
