"""The C rotary embedding (`cpu_rotary.py`) against PyTorch's complex multiply, bit for bit."""

from __future__ import annotations

import pytest
import torch

from superinfer.model.cpu_rotary import rotary_kernel
from superinfer.model.rotary import apply_rotary

kernel = rotary_kernel()
pytestmark = pytest.mark.skipif(kernel is None, reason="needs a C compiler")


def _torch_rotary(x: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
    """`apply_rotary`'s PyTorch form."""
    pairs = x.float().unflatten(-1, (-1, 2))
    return torch.view_as_real(torch.view_as_complex(pairs) * rotation).flatten(-2).to(x.dtype)


def _assert_same(out: torch.Tensor, expected: torch.Tensor) -> None:
    """The same bits, but for NaN's payload (PyTorch's vectorized bfloat16 rounding keeps
    the sign of x86's default NaN, its scalar one and the kernel give 0x7FC0)."""
    is_nan = expected.isnan()
    assert torch.equal(out.isnan(), is_nan)
    bits = torch.int16 if out.dtype == torch.bfloat16 else torch.int32
    assert torch.equal(out[~is_nan].view(bits), expected[~is_nan].view(bits))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128, 48, 16])  # bfloat16: 48 and 16 in scalar code
@pytest.mark.parametrize("num_tokens", [1, 7, 300])  # 300: split between threads
def test_same_bits_as_pytorch(dtype, head_dim, num_tokens):
    """q/k as views of a fused projection's rows (heads contiguous, tokens strided), a
    rotation of any magnitude, and NaN, infinities and denormals among the values."""
    g = torch.Generator().manual_seed(head_dim + num_tokens)
    num_heads = 5
    fused = torch.randn(num_tokens, (num_heads + 3) * head_dim, generator=g).to(dtype)
    flat = fused.view(-1)
    flat[::97] = float("nan")
    flat[5::131] = float("inf")
    flat[7::151] = 1e-39 if dtype == torch.float32 else 1e-40  # below float's normal range
    x = fused[:, : num_heads * head_dim].view(num_tokens, num_heads, head_dim)
    angles = torch.rand(num_tokens, 1, head_dim // 2, generator=g) * 6.3
    magnitudes = 0.5 + torch.rand(num_tokens, 1, head_dim // 2, generator=g)
    rotation = torch.polar(magnitudes, angles)
    assert kernel.takes(x, rotation)
    out = kernel(x, rotation)
    assert out.is_contiguous() and out.dtype == dtype
    _assert_same(out, _torch_rotary(x, rotation))
    _assert_same(apply_rotary(x, rotation), out)


def test_leaves_what_it_does_not_take_to_pytorch():
    x = torch.randn(4, 2, 16)
    rotation = torch.polar(torch.ones(4, 1, 8), torch.rand(4, 1, 8))
    assert kernel.takes(x, rotation)
    odd = torch.polar(torch.ones(4, 1, 3), torch.rand(4, 1, 3))
    assert not kernel.takes(torch.randn(4, 2, 6), odd), "heads of 6: PyTorch rounds otherwise"
    assert not kernel.takes(x.to(torch.float16), rotation), "a dtype the kernels do not take"
    assert not kernel.takes(x.transpose(0, 1), rotation.transpose(0, 1)), "heads not contiguous"
    assert not kernel.takes(x, rotation.expand(4, 2, 8)), "one rotation a token"
    assert not kernel.takes(x, rotation.to(torch.complex128))
    half = x.to(torch.float16)
    assert torch.equal(apply_rotary(half, rotation), _torch_rotary(half, rotation))
