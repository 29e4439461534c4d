# The default model's four projection shapes at M rows: the 4-bit GEMM (csrc/q4_linear.c, random
# weights) against a dense bfloat16 linear (oneDNN), 2 threads, medians of 7 x 20 calls:
#   PYTHONPATH=TREE python -P gemm_shapes.py ROWS
import time, torch, statistics, sys, json
from superinfer.model.cpu_q4 import q4_kernel
k = q4_kernel()
torch.manual_seed(0)
torch.set_num_threads(2)
shapes = {"qkv": (576, 960), "o": (576, 576), "gate_up": (576, 3072), "down": (1536, 576)}
rows = int(sys.argv[1]) if len(sys.argv) > 1 else 512
for n, (K, N) in shapes.items():
    w = k.pack(torch.randint(0, 16, (N, K)), torch.rand(N, K // 32) * 0.01, torch.rand(N, K // 32) * 0.01)
    wd = torch.randn(N, K).to(torch.bfloat16)
    x = torch.randn(rows, K).to(torch.bfloat16)
    res = {}
    for name, f in (("q4", lambda: k(x, w)), ("dense", lambda: torch.nn.functional.linear(x, wd))):
        for _ in range(5): f()
        ts = []
        for _ in range(7):
            t = time.perf_counter()
            for _ in range(20): f()
            ts.append((time.perf_counter() - t) / 20)
        res[name] = statistics.median(ts)
    gf = 2 * rows * K * N / 1e9
    print(f"{n:8s} M={rows} K={K} N={N}: q4 {res['q4']*1e3:.3f} ms ({gf/res['q4']:.0f} GF/s)  dense {res['dense']*1e3:.3f} ms ({gf/res['dense']:.0f} GF/s)  ratio {res['q4']/res['dense']:.2f}")
