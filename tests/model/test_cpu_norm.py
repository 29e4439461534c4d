"""The C residual-add + RMSNorm kernel against PyTorch's rms_norm, and RMSNorm's use of it."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F

from superinfer.model import decoder
from superinfer.model.cpu_norm import norm_kernel
from superinfer.model.decoder import RMSNorm

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None, reason="needs a C compiler"
)

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def _rows(num_rows: int, hidden: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(num_rows, hidden, generator=gen) * 3).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_rows", [1, 3, 300])  # 300 rows run on several threads
def test_add_then_norm_matches_pytorch(dtype, num_rows):
    kernel = norm_kernel()
    assert kernel is not None, "a compiler is here, so the kernel must build"
    x, residual = _rows(num_rows, 576, dtype, 0), _rows(num_rows, 576, dtype, 1)
    weight = torch.rand(576) + 0.5
    expected_residual = residual + x  # rounded to the dtype, as residual.add_(x)
    expected = F.rms_norm(expected_residual, (576,), weight.to(dtype), 1e-5)
    out = kernel(x, residual, weight, 1e-5)
    assert torch.equal(residual, expected_residual), "the stored sum is PyTorch's, bit for bit"
    assert out.dtype == dtype and out.shape == x.shape
    torch.testing.assert_close(out.float(), expected.float(), rtol=TOLERANCE[dtype],
                               atol=TOLERANCE[dtype])  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_alone_reads_strided_rows(dtype):
    kernel = norm_kernel()
    assert kernel is not None
    wide = _rows(5, 1000, dtype, 2)
    x = wide[:, 100:676]  # rows 1000 apart, each contiguous
    assert kernel.takes(x, None) and not x.is_contiguous()
    weight = torch.rand(576)
    expected = F.rms_norm(x.float(), (576,), weight, 1e-6)
    torch.testing.assert_close(kernel(x, None, weight, 1e-6).float(), expected,
                               rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_tokens", [1, 5, 300])  # 300 tokens run on several threads
def test_per_head_norms_of_a_fused_projection(dtype, num_tokens):
    """Qwen3's q/k norms: each head of the q (or k) part of q/k/v rows, out of place (the
    modules) and in place (the flat decode loop), against PyTorch's rms_norm."""
    kernel = norm_kernel()
    qkv = _rows(num_tokens, (16 + 2 * 8) * 128, dtype, 4)
    k = qkv[:, 16 * 128 : 24 * 128].view(num_tokens, 8, 128)  # tokens 4096 apart
    weight = torch.rand(128) + 0.5
    expected = F.rms_norm(k.float(), (128,), weight, 1e-6)
    v_before = qkv[:, 24 * 128 :].clone()
    assert kernel.takes_heads(k) and (num_tokens == 1 or not k.is_contiguous())
    out = kernel.heads(k, weight, 1e-6)
    assert out.is_contiguous() and out.shape == k.shape and out.dtype == dtype
    torch.testing.assert_close(out.float(), expected, rtol=TOLERANCE[dtype],
                               atol=TOLERANCE[dtype])  # fmt: skip
    kernel.heads(k, weight, 1e-6, out=k)
    assert torch.equal(k, out), "in place, the same numbers"
    assert torch.equal(qkv[:, 24 * 128 :], v_before), "nothing outside the heads is written"
    norm = RMSNorm(128, 1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(weight)
    assert torch.equal(norm(qkv[:, :2048].view(num_tokens, 16, 128)),
                       kernel.heads(qkv[:, :2048].view(num_tokens, 16, 128), weight.to(dtype).float(),
                                    1e-6))  # fmt: skip


def test_declines_what_it_does_not_take():
    kernel = norm_kernel()
    assert kernel is not None
    x = _rows(4, 64, torch.float32, 3)
    assert not kernel.takes(x.to(torch.float16), None)
    assert not kernel.takes(x.view(4, 2, 32), None)  # 3-D (q/k norms) stay PyTorch's
    assert not kernel.takes(x.t(), None)
    assert not kernel.takes(x, x.to(torch.bfloat16))


@pytest.mark.parametrize("offset", [0.0, 1.0])  # Llama, Gemma
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_module_matches_its_pytorch_path(monkeypatch, offset, dtype):
    norm = RMSNorm(576, 1e-6, offset).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(576))
    x, residual = _rows(7, 576, dtype, 4), _rows(7, 576, dtype, 5)
    with torch.inference_mode():
        fused_out, fused_residual = norm.add_forward(x, residual.clone())
        plain = norm(x)
        monkeypatch.setattr(decoder, "norm_kernel", lambda: None)
        expected_out, expected_residual = norm.add_forward(x, residual.clone())
        expected_plain = norm(x)
    assert torch.equal(fused_residual, expected_residual)
    tolerance = TOLERANCE[dtype]
    torch.testing.assert_close(fused_out, expected_out, rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(plain, expected_plain, rtol=tolerance, atol=tolerance)


def test_module_follows_a_changed_weight():
    norm = RMSNorm(64, 1e-6)
    x = _rows(2, 64, torch.float32, 6)
    with torch.inference_mode():
        before = norm(x)
    with torch.no_grad():
        norm.weight.mul_(2)
    with torch.inference_mode():
        torch.testing.assert_close(norm(x), before * 2)
