# The few-row GEMV over 30 layers of the default model's 4-bit shapes (random weights, 60 MB,
# beyond the caches), 1 and 2 threads, medians of 15 passes; the checksum shows equal results:
#   PYTHONPATH=TREE python -P gemv_layers.py [ROWS]
import time, torch, statistics, sys
from superinfer.model.cpu_q4 import q4_kernel
from superinfer.model.cpu_gemv import gemv_kernel
k = q4_kernel(); g = gemv_kernel()
torch.manual_seed(0)
shapes = [(576, 960), (576, 576), (576, 3072), (1536, 576)]
layers = [[k.pack(torch.randint(0, 16, (N, K)), torch.rand(N, K // 32) * 0.01, torch.rand(N, K // 32) * 0.01) for K, N in shapes] for _ in range(30)]
rows = int(sys.argv[1]) if len(sys.argv) > 1 else 1
out = {}
for th in (1, 2):
    torch.set_num_threads(th)
    xs = {K: torch.randn(rows, K).to(torch.bfloat16) for K in (576, 1536)}
    ref = [g(xs[w.num_in], w) for w in layers[0]]
    for _ in range(3):
        for ws in layers:
            for w in ws: g(xs[w.num_in], w)
    ts = []
    for _ in range(15):
        t = time.perf_counter()
        for ws in layers:
            for w in ws: g(xs[w.num_in], w)
        ts.append(time.perf_counter() - t)
    out[th] = round(statistics.median(ts) * 1e3, 3)
print("rows", rows, "ms for 30 layers by threads", out, "checksum", float(sum(r.float().sum() for r in ref)))
