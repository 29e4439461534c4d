# The three prefill suspects of a py-spy profile, each alone (random data, 2 threads, medians):
# the Q8_0 embedding lookup, the mixed step's row copies, and the rotary embedding, PyTorch vs C:
#   PYTHONPATH=TREE python -P micro_prefill.py
import time, torch, statistics
torch.manual_seed(0)
def bench(f, n=50):
    for _ in range(5): f()
    ts = []
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(n): f()
        ts.append((time.perf_counter() - t) / n)
    return statistics.median(ts) * 1e6
values = torch.randint(-128, 127, (49152, 576), dtype=torch.int8)
scales = torch.rand(49152, 18)
ids = torch.randint(0, 49152, (512,))
old = lambda: values[ids].unflatten(-1, (-1, 32)).float().mul_(scales[ids].unsqueeze(-1)).flatten(-2).to(torch.bfloat16)
new = lambda: values.index_select(0, ids).unflatten(-1, (-1, 32)).float().mul_(scales.index_select(0, ids).unsqueeze(-1)).flatten(-2).to(torch.bfloat16)
assert torch.equal(old(), new())
print("embedding 512: index", round(bench(old)), "us, index_select", round(bench(new)), "us")
out = torch.empty(542, 9, 64, dtype=torch.bfloat16); o = torch.randn(30, 9, 64).to(torch.bfloat16)
tok = torch.tensor(sorted(torch.randperm(542)[:30].tolist()))
def a(): out[tok] = o
def b(): out.index_copy_(0, tok, o)
print("rows 30: setitem", round(bench(a)), "us, index_copy_", round(bench(b)), "us")
p = torch.randn(512, 9, 64).to(torch.bfloat16)
def c(): out[0:512] = p
print("slice 512 rows copy", round(bench(c)), "us")
from superinfer.model.rotary import apply_rotary
from superinfer.model.cpu_rotary import rotary_kernel
qkv = torch.randn(512, 15 * 64).to(torch.bfloat16)
x = qkv[:, : 12 * 64].view(512, 12, 64)
rot = torch.polar(torch.ones(512, 1, 32), torch.rand(512, 1, 32))
def torch_rot():
    pairs = x.float().unflatten(-1, (-1, 2))
    return torch.view_as_real(torch.view_as_complex(pairs) * rot).flatten(-2).to(x.dtype)
k = rotary_kernel()
print("rotary 512x12x64: torch", round(bench(torch_rot)), "us, C", round(bench(lambda: k(x, rot))), "us")
