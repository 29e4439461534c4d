# One-sequence decode of the default model (256-token prompts, 200 new tokens, 3 runs): the
# median step (ModelRunner.execute), the flat loop's mean time a step, and the time inside the
# GEMV calls Python still makes (the lm_head's, once the loop runs in C):
#   PYTHONPATH=TREE HF_HUB_OFFLINE=1 python -P tpot_parts.py [NUM_SEQS]
"""One-row decode: the step against the time inside each kind of kernel call."""
import os, sys, time, json, statistics, collections, random
os.environ.setdefault("HF_HUB_OFFLINE", "1")
from superinfer import LLM, SamplingParams
from superinfer.model.loader import default_model_path
from superinfer.engine.model_runner import ModelRunner
import superinfer.model.cpu_gemv as cg, superinfer.model.cpu_decode as cd, superinfer.model.cpu_norm as cn
acc = collections.Counter(); cnt = collections.Counter()
def wrap(cls, name, label):
    f = getattr(cls, name)
    def g(*a, **k):
        t = time.perf_counter(); r = f(*a, **k); acc[label] += time.perf_counter() - t; cnt[label] += 1; return r
    setattr(cls, name, g)
wrap(cg.GemvKernel, "__call__", "gemv")
wrap(cn.NormKernel, "__call__", "norm")
steps = []
orig = ModelRunner.execute
def execute(self, output):
    t = time.perf_counter(); r = orig(self, output); steps.append(time.perf_counter() - t); return r
ModelRunner.execute = execute
orig_fd = cd.FlatDecode.__call__
fd = []
def fdcall(self, *a):
    t = time.perf_counter(); r = orig_fd(self, *a); fd.append(time.perf_counter() - t); return r
cd.FlatDecode.__call__ = fdcall
llm = LLM(default_model_path(), max_model_len=2048, device_kv_gib=0.1)
rng = random.Random(0)
n = int(sys.argv[1]) if len(sys.argv) > 1 else 1
for rep in range(3):
    acc.clear(); cnt.clear(); steps.clear(); fd.clear()
    p = [{"prompt_token_ids": [rng.randrange(100, 40000) for _ in range(256)]} for _ in range(n)]
    llm.generate(p, [SamplingParams(max_tokens=200, temperature=0, ignore_eos=True)] * n)
ns = len(fd)
print(json.dumps({"step_ms": round(1000 * statistics.median(steps), 3), "flat_ms": round(1000 * sum(fd) / ns, 3),
                  **{k + "_ms": round(1000 * v / ns, 3) for k, v in acc.items()}, **{k + "_calls": cnt[k] / ns for k in cnt}}))
