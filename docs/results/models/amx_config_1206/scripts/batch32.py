# Offline batch-32 throughput of the default model as benchmarks/model_speed.py runs it (ShareGPT
# prompts of at most 512 tokens, outputs capped at 128, ignore EOS), ROUNDS batches after a warm-up:
#   PYTHONPATH=TREE HF_HUB_OFFLINE=1 python -P batch32.py ROUNDS   (MNBT=N sets max_num_batched_tokens)
"""Batch-32 offline throughput of the default model, the model_speed way, N rounds."""
import os, sys, time, json
os.environ.setdefault("HF_HUB_OFFLINE", "1")
from transformers import AutoTokenizer
from superinfer import LLM, SamplingParams
from superinfer.workload.datasets import sample_sharegpt
from superinfer.model.loader import default_model_path

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
tok = AutoTokenizer.from_pretrained(sys.argv[2] if len(sys.argv) > 2 else "/work/models/smollm2-135m-instruct-hf")
reqs, _ = sample_sharegpt(tok, 32 * (rounds + 1), seed=0, max_prompt_tokens=512)
batches = []
for b in range(0, len(reqs), 32):
    ch = reqs[b:b + 32]
    batches.append(([tok(r.prompt)["input_ids"] for r in ch], [min(r.num_output_tokens, 128) for r in ch]))
import os
opts = {"max_num_batched_tokens": int(os.environ["MNBT"])} if os.environ.get("MNBT") else {}
llm = LLM(default_model_path(), max_model_len=2048, device_kv_gib=0.1, **opts)
def gen(p, n):
    params = [SamplingParams(max_tokens=k, temperature=0, ignore_eos=True) for k in n]
    t = time.perf_counter()
    out = llm.generate([{"prompt_token_ids": x} for x in p], params)
    dt = time.perf_counter() - t
    return dt, sum(len(o.outputs[0].token_ids) for o in out)
gen(*batches[-1])
for r in range(rounds):
    p, n = batches[r]
    dt, c = gen(p, n)
    print(json.dumps({"round": r, "s": round(dt, 3), "tokens": c, "tok_s": round(c / dt, 1),
                      "prompt_tokens": sum(map(len, p))}), flush=True)
