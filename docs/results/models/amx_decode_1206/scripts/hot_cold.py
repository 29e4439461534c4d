# see ../README.md; BATCHES (default /tmp/batches.json): the batches dump_batches.py writes
import sys, time, statistics, torch
sys.argv = ["x"]
from superinfer.model.cpu_attention import decode_kernel
kernel = decode_kernel()
NUM_LAYERS, BS, KVH, D, H = 30, 16, 3, 64, 9
gen = torch.Generator().manual_seed(0)
nb = 1400
cache = torch.randn((nb, NUM_LAYERS, 2, BS, KVH, D), generator=gen).to(torch.bfloat16)
for threads in (2, 1, 2):
    torch.set_num_threads(threads)
    for name, lengths in {"32x250": [250]*32, "32x600": [600]*32}.items():
        mb = max(-(-n // BS) for n in lengths)
        tables = torch.randperm(nb, generator=gen)[: len(lengths) * mb].view(len(lengths), mb).contiguous()
        sl = torch.tensor(lengths); q = torch.randn(len(lengths), H, D, generator=gen).to(torch.bfloat16)
        ts = []
        for _ in range(5):
            t = time.perf_counter()
            for c in range(60): kernel(q, cache, c % 30, tables, sl)
            ts.append((time.perf_counter() - t) / 60 * 1e3)
        ms = statistics.median(ts); mb_ = sum(lengths) * KVH * D * 2 * 2 / 1e6
        print(f"threads {threads} {name}: {ms:.3f} ms  {mb_ / ms:.1f} GB/s")
print("hot (every sequence reads the same blocks):")
for threads in (2, 1):
    torch.set_num_threads(threads)
    for name, lengths in {"32x250": [250]*32, "32x600": [600]*32}.items():
        mb = max(-(-n // BS) for n in lengths)
        tables = torch.arange(mb).repeat(len(lengths), 1).contiguous()
        sl = torch.tensor(lengths); q = torch.randn(len(lengths), H, D, generator=gen).to(torch.bfloat16)
        ts = []
        for _ in range(5):
            t = time.perf_counter()
            for c in range(60): kernel(q, cache, 0, tables, sl)
            ts.append((time.perf_counter() - t) / 60 * 1e3)
        ms = statistics.median(ts)
        print(f"threads {threads} {name}: {ms:.3f} ms")
