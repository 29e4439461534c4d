# One layer set (qkv, o, gate_up, down) of the default model's shapes through the 4-bit GEMM
# (superinfer/model/csrc/q4_linear.c), random weights, 2 threads, median of 5 timings per row count:
#   PYTHONPATH=TREE python -P gemm_rows.py 32,512   -> {"32": microseconds, "512": ...}
import time, torch, statistics, sys, json
from superinfer.model.cpu_q4 import q4_kernel
k = q4_kernel()
torch.manual_seed(0)
shapes = {"qkv": (576, 960), "o": (576, 576), "gate_up": (576, 3072), "down": (1536, 576)}
rows_list = [int(r) for r in sys.argv[1].split(",")]
torch.set_num_threads(2)
out = {}
for rows in rows_list:
    ws = {n: k.pack(torch.randint(0, 16, (N, K)), torch.rand(N, K // 32) * 0.01, torch.rand(N, K // 32) * 0.01) for n, (K, N) in shapes.items()}
    xs = {n: torch.randn(rows, K).to(torch.bfloat16) for n, (K, N) in shapes.items()}
    def layer():
        for n in shapes: k(xs[n], ws[n])
    reps = max(3, 3000 // rows)
    for _ in range(3): layer()
    ts = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(reps): layer()
        ts.append((time.perf_counter() - t) / reps * 1e6)
    out[rows] = statistics.median(ts)
print(json.dumps(out))
