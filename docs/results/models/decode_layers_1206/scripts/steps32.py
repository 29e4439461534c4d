# Batch-32 offline rounds of the default model as benchmarks/model_speed.py runs them (ShareGPT
# prompts of at most 512 tokens, outputs capped at 128, ignore EOS), each step's shape and time:
#   PYTHONPATH=TREE HF_HUB_OFFLINE=1 python -P steps32.py ROUNDS   (KV=GiB of device KV, 0.3)
"""Batch-32 rounds with each step's shape and time: where the time goes."""
import os, sys, time, json, collections
os.environ.setdefault("HF_HUB_OFFLINE", "1")
from transformers import AutoTokenizer
from superinfer import LLM, SamplingParams
from superinfer.workload.datasets import sample_sharegpt
from superinfer.model.loader import default_model_path
from superinfer.engine.model_runner import ModelRunner

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
tok = AutoTokenizer.from_pretrained("/work/models/smollm2-135m-instruct-hf")
reqs, _ = sample_sharegpt(tok, 32 * (rounds + 1), seed=0, max_prompt_tokens=512)
batches = []
for b in range(0, len(reqs), 32):
    ch = reqs[b:b + 32]
    batches.append(([tok(r.prompt)["input_ids"] for r in ch], [min(r.num_output_tokens, 128) for r in ch]))
log = []
orig = ModelRunner.execute
def execute(self, output):
    t = time.perf_counter()
    r = orig(self, output)
    dt = time.perf_counter() - t
    q = [s.num_query_tokens for s in output.sequences]
    log.append((sum(x for x in q if x > 1), sum(1 for x in q if x == 1), dt))
    return r
ModelRunner.execute = execute
opts = {"max_num_batched_tokens": int(os.environ["MNBT"])} if os.environ.get("MNBT") else {}
llm = LLM(default_model_path(), max_model_len=2048, device_kv_gib=float(os.environ.get("KV", "0.3")), **opts)
def gen(p, n):
    params = [SamplingParams(max_tokens=k, temperature=0, ignore_eos=True) for k in n]
    t = time.perf_counter()
    out = llm.generate([{"prompt_token_ids": x} for x in p], params)
    return time.perf_counter() - t, sum(len(o.outputs[0].token_ids) for o in out)
gen(*batches[-1])
for r in range(rounds):
    log.clear()
    dt, c = gen(*batches[r])
    pre = [x for x in log if x[0] > 0]; dec = [x for x in log if x[0] == 0]
    hist = collections.Counter(min(x[1] // 8 * 8, 32) for x in dec)
    dec_by = collections.defaultdict(list)
    for x in dec: dec_by[x[1] // 8 * 8].append(x[2])
    print(json.dumps({"round": r, "s": round(dt, 3), "tok_s": round(c / dt, 1),
        "exec_s": round(sum(x[2] for x in log), 3),
        "prefill_steps": len(pre), "prefill_s": round(sum(x[2] for x in pre), 3),
        "prefill_tokens": sum(x[0] for x in pre),
        "decode_steps": len(dec), "decode_s": round(sum(x[2] for x in dec), 3),
        "decode_ms_by_rows": {k: [len(v), round(1000 * sum(v) / len(v), 2)] for k, v in sorted(dec_by.items())}}), flush=True)
