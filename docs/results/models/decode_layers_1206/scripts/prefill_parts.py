# A 512-token prefill step of the default model (8 prompts, the first 2 dropped): the median step
# and the median time a step spends in the linears, the rotary embedding, the norms and the activation:
#   PYTHONPATH=TREE HF_HUB_OFFLINE=1 python -P prefill_parts.py
"""A 512-token prefill step of the default model: the forward against the time inside each kind of call."""
import os, time, json, statistics, collections, random
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch
from superinfer import LLM, SamplingParams
from superinfer.model.loader import default_model_path
from superinfer.engine.model_runner import ModelRunner
import superinfer.model.quant as q, superinfer.model.attention as att, superinfer.model.rotary as rot
import superinfer.model.cpu_norm as cn, superinfer.model.cpu_act as ca, superinfer.model.decoder as dec
acc = collections.Counter()
def wrap(obj, name, label):
    f = getattr(obj, name)
    def g(*a, **k):
        t = time.perf_counter(); r = f(*a, **k); acc[label] += time.perf_counter() - t; return r
    setattr(obj, name, g)
wrap(q.Int4Linear, "forward", "linear")
wrap(att, "paged_attention", "attention")
wrap(dec, "apply_rotary", "rotary")
wrap(cn.NormKernel, "__call__", "norm")
wrap(ca.ActKernel, "__call__", "act")
steps = []
orig = ModelRunner.execute
def execute(self, output):
    t = time.perf_counter(); r = orig(self, output); dt = time.perf_counter() - t
    if any(s.num_query_tokens > 1 for s in output.sequences): steps.append((dt, dict(acc)))
    acc.clear(); return r
ModelRunner.execute = execute
llm = LLM(default_model_path(), max_model_len=2048, device_kv_gib=0.1)
rng = random.Random(0)
for rep in range(8):
    llm.generate([{"prompt_token_ids": [rng.randrange(100, 40000) for _ in range(512)]}], [SamplingParams(max_tokens=1)])
    steps.append(None)
rows = [s for s in steps if s]
ms = lambda xs: round(1000 * statistics.median(xs), 2)
print(json.dumps({"step_ms": ms([s[0] for s in rows[2:]]), **{k: ms([s[1].get(k, 0) for s in rows[2:]]) for k in ("linear", "attention", "rotary", "norm", "act")}}))
