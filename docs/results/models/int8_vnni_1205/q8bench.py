import ctypes, time, statistics, torch
from superinfer.model.cpu_kernels import load_library
from superinfer.model.cpu_q4 import q4_kernel
lib = load_library()
P, I64, INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
lib.pack_q4_q8.argtypes = [P, P, P, I64, I64, P, P]; lib.pack_q4_q8.restype = None
lib.q4_q8_linear.argtypes = [P, I64, I64, I64, P, P, P, P, I64, INT]; lib.q4_q8_linear.restype = INT
k4 = q4_kernel()
def fq(x):
    xf = x.double().view(x.shape[0], -1, 32)
    d = (xf.abs().amax(-1, keepdim=True) / 127).float().double()
    q = torch.where(d > 0, torch.round(xf / torch.where(d > 0, d, 1)), 0)
    return (q * d).view(x.shape)
def run(N, K, rows, reps=30):
    g = torch.Generator().manual_seed(N + K)
    q = torch.randint(0, 16, (N, K), generator=g, dtype=torch.uint8)
    d = (torch.rand(N, K // 32, generator=g) * 0.02 + 0.001).half().float()
    m = (-torch.rand(N, K // 32, generator=g) * 0.1).half().float()
    z = m + 8 * d
    ns = -(-N // 16)
    packed = torch.empty(ns * K * 8, dtype=torch.uint8); sm = torch.empty(ns * (K // 32) * 32)
    lib.pack_q4_q8(q.data_ptr(), d.contiguous().data_ptr(), m.contiguous().data_ptr(), N, K, packed.data_ptr(), sm.data_ptr())
    w4 = k4.pack(q, d, z)
    x = torch.randn(rows, K, generator=g).to(torch.bfloat16)
    y = torch.empty(rows, N, dtype=torch.bfloat16)
    def q8():
        assert lib.q4_q8_linear(x.data_ptr(), K, rows, K, packed.data_ptr(), sm.data_ptr(), None, y.data_ptr(), N, torch.get_num_threads()) == 0
        return y
    W = (q.double() * d.double().repeat_interleave(32, 1) + m.double().repeat_interleave(32, 1))
    ref = fq(x) @ W.t()
    err = (q8().double() - ref).abs().max().item() / ref.abs().max().item()
    t8, t4 = [], []
    for i in range(reps):
        t = time.perf_counter(); q8(); t8.append(time.perf_counter() - t)
        t = time.perf_counter(); w4(x); t4.append(time.perf_counter() - t)
    a, b = statistics.median(t4[3:]) * 1e3, statistics.median(t8[3:]) * 1e3
    print(f"N={N} K={K} rows={rows}: bf16 GEMM {a:.3f} ms, q8 {b:.3f} ms ({a/b:.2f}x), max rel err vs fake-quant ref {err:.2e}")
for rows in (16, 32, 64, 256):
    for N, K in ((960, 576), (576, 576), (3072, 576), (576, 1536)):
        run(N, K, rows)
