# see ../README.md; BATCHES (default /tmp/batches.json): the batches dump_batches.py writes
import os, sys, time
os.environ.setdefault("HF_HUB_OFFLINE", "1")
def main():
    import json
    reqs = json.load(open(os.environ.get("BATCHES", "/tmp/batches.json")))
    batches = [reqs[i:i+32] for i in range(0, 96, 32)]
    from vllm import LLM, SamplingParams
    llm = LLM("/work/models/smollm2-135m-instruct-hf", dtype="bfloat16", max_model_len=2048, kv_cache_memory_bytes=400 * 2**20, seed=0, enable_prefix_caching=False)
    for rep in range(2):
      for bi, b in enumerate(batches):
        prompts = [r["p"] for r in b]
        nn = [r["n"] for r in b]
        ps = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in nn]
        t = time.perf_counter()
        llm.generate([{"prompt_token_ids": p} for p in prompts], ps, use_tqdm=False)
        print(f"vllm batch {bi}: {time.perf_counter() - t:.2f}s out {sum(nn)}", flush=True)
        t = time.perf_counter()
        llm.generate([{"prompt_token_ids": p} for p in prompts], [SamplingParams(max_tokens=1, temperature=0) for n in nn], use_tqdm=False)
        print(f"   prefill only: {time.perf_counter() - t:.2f}s", flush=True)
if __name__ == "__main__":
    main()
