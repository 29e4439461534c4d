"""Offline throughput and decode speed: superinfer vs transformers' batched `generate`.

Same weights (the default GGUF, dequantized), same dtype, same prompts, same run; the two
systems alternate over several repetitions and the script reports medians, spreads and
the ratio superinfer / transformers.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/offline_throughput.py --help
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from superinfer import LLM, SamplingParams  # noqa: E402
from superinfer.model.loader import default_model_path  # noqa: E402
from superinfer.workload.datasets import sample_sharegpt  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    p.add_argument("--num-prompts", type=int, default=64, help="ShareGPT requests for the throughput run")
    p.add_argument("--max-prompt-tokens", type=int, default=512)
    p.add_argument("--max-output-tokens", type=int, default=128, help="cap on each reply length")
    p.add_argument("--hf-batch-size", type=int, default=32, help="transformers' batch size")
    p.add_argument("--decode-batches", default="1,8,32", help="batch sizes for the decode test")
    p.add_argument("--decode-tokens", type=int, default=64, help="tokens per sequence in the decode test")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--skip-hf", action="store_true", help="measure superinfer only")
    p.add_argument("--output", help="write the results as JSON here")
    return p.parse_args()


def load_hf(dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    path = default_model_path()
    model = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=dtype
    )
    return model.eval()


def hf_generate(model, tokenizer, prompts_ids: list[list[int]], num_new: list[int], batch_size: int) -> float:
    """Seconds for transformers to generate `num_new[i]` tokens for each prompt, batched
    (left padding; each batch runs until its longest request is done)."""
    tokenizer.padding_side = "left"
    order = sorted(range(len(prompts_ids)), key=lambda i: len(prompts_ids[i]))
    start = time.perf_counter()
    with torch.inference_mode():
        for b in range(0, len(order), batch_size):
            batch = [prompts_ids[i] for i in order[b : b + batch_size]]
            max_new = max(num_new[i] for i in order[b : b + batch_size])
            enc = tokenizer.pad({"input_ids": batch}, return_tensors="pt")
            model.generate(**enc, max_new_tokens=max_new, min_new_tokens=max_new, do_sample=False,
                           pad_token_id=tokenizer.pad_token_id)
    return time.perf_counter() - start


def superinfer_generate(llm: LLM, prompts_ids: list[list[int]], num_new: list[int]) -> float:
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in num_new]
    start = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompts_ids], params)
    elapsed = time.perf_counter() - start
    assert [len(o.outputs[0].token_ids) for o in outputs] == num_new
    return elapsed


def decode_rate(run, prompts_ids: list[list[int]], num_tokens: int) -> float:
    """Decode tokens per second: (time for num_tokens+1) - (time for 1), per generated token."""
    prefill_only = run(prompts_ids, [1] * len(prompts_ids))
    full = run(prompts_ids, [num_tokens + 1] * len(prompts_ids))
    return len(prompts_ids) * num_tokens / max(full - prefill_only, 1e-9)


def summarize(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": values}


def main() -> None:
    args = parse_args()
    dtype = DTYPES[args.dtype]
    llm = LLM(dtype=args.dtype, device="cpu", max_num_seqs=256, max_num_batched_tokens=2048,
              device_kv_gib=1.0, max_model_len=2048)
    tokenizer = llm.get_tokenizer()
    requests, num_dropped = sample_sharegpt(tokenizer, args.num_prompts, max_prompt_tokens=args.max_prompt_tokens)
    prompts = [tokenizer(r.prompt)["input_ids"] for r in requests]
    num_new = [min(r.num_output_tokens, args.max_output_tokens) for r in requests]
    hf = None if args.skip_hf else load_hf(dtype)
    hf_run = (lambda p, n: hf_generate(hf, tokenizer, p, n, args.hf_batch_size)) if hf else None
    si_run = lambda p, n: superinfer_generate(llm, p, n)  # noqa: E731

    superinfer_generate(llm, prompts[:4], [4] * 4)  # warm up both
    if hf_run:
        hf_run(prompts[:4], [4] * 4)
    results: dict = {"dtype": args.dtype, "num_prompts": len(prompts), "num_dropped": num_dropped,
                     "num_prompt_tokens": sum(map(len, prompts)), "num_output_tokens": sum(num_new),
                     "threads": torch.get_num_threads()}
    tput = {"superinfer": [], "transformers": []}
    for _ in range(args.repeats):
        tput["superinfer"].append(sum(num_new) / si_run(prompts, num_new))
        if hf_run:
            tput["transformers"].append(sum(num_new) / hf_run(prompts, num_new))
    results["output_tok_s"] = {k: summarize(v) for k, v in tput.items() if v}

    probe = prompts[0][:128] if len(prompts[0]) >= 128 else (prompts[0] * 128)[:128]
    decode = {}
    for batch in (int(b) for b in args.decode_batches.split(",")):
        rates = {"superinfer": [], "transformers": []}
        for _ in range(args.repeats):
            rates["superinfer"].append(decode_rate(si_run, [probe] * batch, args.decode_tokens))
            if hf_run:
                hf_b = lambda p, n: hf_generate(hf, tokenizer, p, n, batch)  # noqa: E731
                rates["transformers"].append(decode_rate(hf_b, [probe] * batch, args.decode_tokens))
        decode[batch] = {k: summarize(v) for k, v in rates.items() if v}
    results["decode_tok_s"] = decode
    results["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    report(results)
    if args.output:
        with open(args.output, "w") as f:
            json.dump(results, f, indent=2)


def report(results: dict) -> None:
    def ratio(entry: dict) -> str:
        if "transformers" not in entry:
            return "-"
        return f"{entry['superinfer']['median'] / entry['transformers']['median']:.2f}x"

    def cell(entry: dict, key: str) -> str:
        if key not in entry:
            return "-"
        s = entry[key]
        return f"{s['median']:.1f} [{s['min']:.1f}-{s['max']:.1f}]"

    print(f"\n{results['num_prompts']} ShareGPT prompts ({results['num_prompt_tokens']} prompt tokens, "
          f"{results['num_output_tokens']} output tokens, {results['num_dropped']} pairs dropped), "
          f"{results['dtype']}, {results['threads']} threads")
    print(f"{'test':<22}{'superinfer tok/s':>26}{'transformers tok/s':>26}{'ratio':>8}")
    rows = [("offline output", results["output_tok_s"])]
    rows += [(f"decode batch {b}", e) for b, e in results["decode_tok_s"].items()]
    for name, entry in rows:
        print(f"{name:<22}{cell(entry, 'superinfer'):>26}{cell(entry, 'transformers'):>26}{ratio(entry):>8}")
    print(f"peak resident memory: {results['peak_rss_mib']:.0f} MiB (both systems in one process)")


if __name__ == "__main__":
    main()
