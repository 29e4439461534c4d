# Whole prefill forwards of the bf16 export (the issue-14 server model), medians of 7:
#   PYTHONPATH=TREE HF_HUB_OFFLINE=1 .venv/bin/python -P forward_prefill.py [MODEL_DIR]
# (SIZES=512,1024,2048 in the environment: other prompt lengths, at most 2,048)
# MODEL_DIR "default": the default model as the server loads it (the Q4_1 GGUF, quantized).
import os
import statistics
import sys
import time

import torch

from superinfer.model.attention import SeqEntry
from superinfer.model.attention_backend import select_backend
from superinfer.model.loader import load_model

BS = 16
path = sys.argv[1] if len(sys.argv) > 1 else "/work/models/smollm2-135m-instruct-hf"
path = None if path == "default" else path
model = load_model(path, torch.bfloat16).model
backend = select_backend("auto", BS, "cpu")
c = model.config
nb = 2048 // BS
kv = torch.zeros((nb, c.num_layers, 2, BS, c.num_kv_heads, c.head_dim), dtype=model.dtype)
table = list(range(nb))


def fwd(nq, nc=0):
    meta = backend.build([SeqEntry(nq, nc, table)])
    t = time.perf_counter()
    h = model(torch.arange(1000, 1000 + nq), meta.positions, kv, meta)
    model.compute_logits(h[meta.logits_indices])
    return time.perf_counter() - t


with torch.inference_mode():
    for nq in map(int, os.environ.get("SIZES", "256,512,1024").split(",")):
        fwd(nq)
        ts = [fwd(nq) for _ in range(7)]
        m = statistics.median(ts) * 1e3
        print(f"{nq} tokens: {m:.1f} ms  {m / nq:.3f} ms/token")
    if "--prof" in sys.argv:
        from torch.profiler import profile

        with profile() as p:
            for _ in range(3):
                fwd(512)
        print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
