"""The batch-32 offline run of model_speed.py on the checkout it runs from, at a chosen
temperature: for A/B runs of two checkouts (`PYTHONPATH=<checkout>`), alternating.

32 ShareGPT prompts of at most 512 tokens submitted at once, each reply's length capped at
128 tokens, ignore EOS; round i samples with seed i, so two checkouts see the same prompts
round by round. Prints output tokens/s per round; --out writes them as JSON.

    for tree in ../base .; do PYTHONPATH=$tree HF_HUB_OFFLINE=1 .venv/bin/python \\
        benchmarks/batch32.py --temperature 0.8 --out /tmp/$(basename $tree).json; done
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from superinfer import LLM, SamplingParams
from superinfer.workload.datasets import sample_sharegpt

NUM_DEVICE_BLOCKS = 2048  # the whole batch fits: no preemption


def batch_round(
    tokenizer, round_index: int, temperature: float, top_p: float = 1.0
) -> tuple[list[dict], list[SamplingParams]]:
    """Round `round_index`'s 32 prompts (token ids) and their sampling parameters."""
    sampled, _ = sample_sharegpt(tokenizer, 32, seed=round_index, max_prompt_tokens=512)
    prompts = [{"prompt_token_ids": tokenizer(r.prompt)["input_ids"]} for r in sampled]
    params = [SamplingParams(max_tokens=min(r.num_output_tokens, 128), ignore_eos=True,
                             temperature=temperature, top_p=top_p)
              for r in sampled]  # fmt: skip
    return prompts, params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--quantization", default="auto", help="as `superinfer serve`'s")
    parser.add_argument("--out", default=None, help="write the rounds as JSON")
    args = parser.parse_args()
    llm = LLM(num_device_blocks=NUM_DEVICE_BLOCKS, quantization=args.quantization)
    tokenizer = llm.get_tokenizer()
    llm.generate(["warm-up"], SamplingParams(max_tokens=4))
    rounds = []
    for i in range(args.rounds):
        prompts, params = batch_round(tokenizer, i, args.temperature, args.top_p)
        start = time.perf_counter()
        outputs = llm.generate(prompts, params)
        seconds = time.perf_counter() - start
        num_tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
        rounds.append({"output_tokens": num_tokens, "seconds": seconds,
                       "tok_s": num_tokens / seconds})  # fmt: skip
        print(f"round {i + 1}: {num_tokens / seconds:.1f} output tok/s", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "rounds": rounds}, indent=1))


if __name__ == "__main__":
    main()
