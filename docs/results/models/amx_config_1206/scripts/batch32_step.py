# Per-step times at a fixed batch: 32 prompts of 128 random tokens, prefill (+1 token) and then
# 64 decode steps at batch 32, 3 rounds:
#   PYTHONPATH=TREE HF_HUB_OFFLINE=1 python -P batch32_step.py superinfer
#   VLLM_TARGET_DEVICE=cpu VLLM_CPU_OMP_THREADS_BIND=0-1 vllm-venv/bin/python batch32_step.py vllm [HF_DIR]
import os, sys, time, random, statistics
os.environ.setdefault("HF_HUB_OFFLINE", "1")
def main():
    kind = sys.argv[1]
    global rng
    B, P, N = 32, 128, 64
    rng = random.Random(0)
    def prompts(): return [[rng.randrange(100, 40000) for _ in range(P)] for _ in range(B)]
    if kind == "superinfer":
        from superinfer import LLM, SamplingParams
        from superinfer.model.loader import default_model_path
        llm = LLM(default_model_path(), max_model_len=2048, device_kv_gib=0.1)
        def gen(ps, n):
            llm.generate([{"prompt_token_ids": p} for p in ps], [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)] * len(ps))
    else:
        from vllm import LLM, SamplingParams
        llm = LLM(sys.argv[2] if len(sys.argv) > 2 else "/work/models/smollm2-135m-instruct-hf", dtype="bfloat16", max_model_len=2048, kv_cache_memory_bytes=200 * 2**20, seed=0)
        def gen(ps, n):
            llm.generate([{"prompt_token_ids": p} for p in ps], SamplingParams(max_tokens=n, temperature=0, ignore_eos=True), use_tqdm=False)
    gen(prompts(), 4)
    res = []
    for r in range(3):
        ps = prompts()
        t = time.perf_counter(); gen(ps, 1); t1 = time.perf_counter() - t
        t = time.perf_counter(); gen(ps, N + 1); tn = time.perf_counter() - t
        res.append((t1 * 1e3, (tn - t1) / N * 1e3))
    print(kind, "prefill(32x128)+1 ms", [round(a) for a, _ in res], "decode step ms (batch 32)", [round(b, 2) for _, b in res])

if __name__ == "__main__":
    main()
