# see ../README.md; BATCHES (default /tmp/batches.json): the batches dump_batches.py writes
import os, sys, time, json
os.environ.setdefault("HF_HUB_OFFLINE", "1")
def main():
    from superinfer import LLM, SamplingParams
    from superinfer.model.loader import default_model_path
    reqs = json.load(open(os.environ.get("BATCHES", "/tmp/batches.json")))
    batches = [reqs[i:i+32] for i in range(0, 96, 32)]
    llm = LLM(default_model_path(), max_model_len=2048, device_kv_gib=0.2, enable_prefix_caching=False, max_num_batched_tokens=int(os.environ.get("MNBT", "512")))
    for rep in range(2):
      for bi, b in enumerate(batches):
        prompts = [r["p"] for r in b]; nn = [r["n"] for r in b]
        t = time.perf_counter()
        llm.generate([{"prompt_token_ids": p} for p in prompts], [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in nn])
        print(f"si batch {bi}: {time.perf_counter() - t:.2f}s out {sum(nn)}", flush=True)
        t = time.perf_counter()
        llm.generate([{"prompt_token_ids": p} for p in prompts], [SamplingParams(max_tokens=1, temperature=0) for n in nn])
        print(f"   prefill only: {time.perf_counter() - t:.2f}s", flush=True)
if __name__ == "__main__":
    main()
