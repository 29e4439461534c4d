"""Building blocks against transformers' implementations of the same formulas."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import (
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

from superinfer.model.cpu_linear import (
    PackedLinear,
    onednn_linear_available,
    pack_linears,
    padded_num_rows,
)
from superinfer.model.llama import RMSNorm
from superinfer.model.rotary import RotaryEmbedding, apply_rotary, rope_inv_freq
from superinfer.model.weights import interleave_rope_rows

LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def _hf_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    params = {"rope_theta": theta, "rope_type": "default", **(scaling or {})}
    config = LlamaConfig(
        hidden_size=head_dim * 4,
        num_attention_heads=4,
        rope_parameters=params,
        max_position_embeddings=131072,
    )
    if params["rope_type"] == "default":
        return LlamaRotaryEmbedding.compute_default_rope_parameters(config)[0]
    return ROPE_INIT_FUNCTIONS[params["rope_type"]](config, "cpu")[0]


@pytest.mark.parametrize("scaling", [None, {"rope_type": "linear", "factor": 4.0}, LLAMA3_SCALING])
def test_rope_frequencies_match_transformers(scaling: dict | None) -> None:
    ours = rope_inv_freq(128, 500000.0, scaling)
    torch.testing.assert_close(ours, _hf_inv_freq(128, 500000.0, scaling), rtol=1e-6, atol=0)


def test_llama3_scaling_keeps_high_and_slows_low_frequencies() -> None:
    plain, scaled = rope_inv_freq(128, 500000.0), rope_inv_freq(128, 500000.0, LLAMA3_SCALING)
    assert torch.equal(scaled[:8], plain[:8])  # short wavelengths untouched
    torch.testing.assert_close(scaled[-8:], plain[-8:] / 8.0)  # long ones divided by factor


def test_gguf_frequency_factors_divide() -> None:
    factors = torch.linspace(1, 4, 32)
    ours = rope_inv_freq(64, 10000.0, {"rope_type": "freq_factors", "factors": factors.tolist()})
    torch.testing.assert_close(ours, rope_inv_freq(64, 10000.0) / factors)


def test_unknown_rope_type_is_rejected() -> None:
    with pytest.raises(ValueError, match="mrope"):
        rope_inv_freq(64, 10000.0, {"rope_type": "mrope", "factor": 4.0})


def _interleave_last_dim(x: torch.Tensor) -> torch.Tensor:
    """Halves (i, i + D/2) -> pairs (2i, 2i + 1), along the last dim."""
    return x.unflatten(-1, (2, -1)).transpose(-1, -2).flatten(-2)


def test_interleaved_rotation_equals_rotate_half_on_permuted_dims() -> None:
    num_tokens, num_heads, head_dim = 5, 3, 16
    x = torch.randn(num_tokens, num_heads, head_dim)  # rotate-half layout, as in HF
    positions = torch.tensor([0, 1, 7, 100, 4095])
    scaling = LLAMA3_SCALING | {"original_max_position_embeddings": 64}
    rope = RotaryEmbedding(head_dim, 10000.0, scaling)
    angles = positions[:, None].float() * rope.inv_freq  # (T, D/2)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    expected, _ = apply_rotary_pos_emb(x, x, cos[:, None], sin[:, None], unsqueeze_dim=0)
    ours = apply_rotary(_interleave_last_dim(x), rope(positions))
    torch.testing.assert_close(ours, _interleave_last_dim(expected[0]), rtol=1e-5, atol=1e-5)
    w = torch.randn(num_heads * head_dim, 4)  # the same permutation, applied to weight rows
    torch.testing.assert_close(
        interleave_rope_rows(w, head_dim).view(num_heads, head_dim, 4),
        _interleave_last_dim(w.view(num_heads, head_dim, 4).transpose(1, 2)).transpose(1, 2),
    )


def test_interleaving_is_llama_cpp_row_permutation() -> None:
    num_heads, head_dim = 3, 16
    w = torch.randn(num_heads * head_dim, 10)
    # llama.cpp's converter: per head, view rows as (2, D/2) and swap the two axes
    expected = w.reshape(num_heads, 2, head_dim // 2, 10).swapaxes(1, 2).reshape(w.shape)
    assert torch.equal(interleave_rope_rows(w, head_dim), expected)
    bias = torch.arange(num_heads * head_dim, dtype=torch.float32)
    assert interleave_rope_rows(bias, head_dim)[:4].tolist() == [0, 8, 1, 9]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_matches_transformers(dtype: torch.dtype) -> None:
    x = (torch.randn(7, 64) * 3).to(dtype)
    ours, theirs = RMSNorm(64, 1e-6).to(dtype), LlamaRMSNorm(64, eps=1e-6).to(dtype)
    with torch.no_grad():
        ours.weight.normal_()
        theirs.weight.copy_(ours.weight)
    tolerance = 1e-6 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(ours(x), theirs(x), rtol=tolerance, atol=tolerance)


def _onednn_bf16() -> bool:
    """Whether this CPU runs oneDNN's bf16 kernels (AVX-512 BW/VL/DQ or AVX-NE-CONVERT)."""
    return onednn_linear_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


@pytest.mark.skipif(not onednn_linear_available(), reason="needs oneDNN")
@pytest.mark.parametrize(
    "dtype",
    [
        torch.float32,
        pytest.param(
            torch.bfloat16,
            marks=pytest.mark.skipif(not _onednn_bf16(), reason="CPU without oneDNN bf16"),
        ),
    ],
)
def test_packed_linear_matches_f_linear(dtype: torch.dtype) -> None:
    linear = nn.Linear(64, 96, bias=True).to(dtype)
    x = torch.randn(5, 64, dtype=dtype)
    with torch.inference_mode():
        expected = F.linear(x, linear.weight, linear.bias)
        got = PackedLinear(linear)(x)
        got_strided = PackedLinear(linear)(torch.randn(5, 80, dtype=dtype)[:, :64].copy_(x))
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, expected, rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(got_strided, expected, rtol=tolerance, atol=tolerance)


def test_padded_num_rows_buckets_are_few_and_tight() -> None:
    buckets = {padded_num_rows(n) for n in range(1, 2049)}
    assert all(padded_num_rows(n) == n for n in range(1, 17))
    assert all(n <= padded_num_rows(n) <= n * 1.125 for n in range(1, 5000))
    assert all(padded_num_rows(b) == b for b in buckets)  # a bucket is its own bucket
    assert len(buckets) == 16 + 8 * 7  # 8 sizes per doubling from 16 to 2048


@pytest.mark.skipif(not onednn_linear_available(), reason="needs oneDNN")
@pytest.mark.parametrize("num_rows", [17, 100, 3 * 257])
def test_packed_linear_pads_rows_to_a_bucket_and_returns_only_real_rows(num_rows: int) -> None:
    linear = nn.Linear(32, 48, bias=True)
    x = torch.randn(num_rows, 32)
    with torch.inference_mode():
        got = PackedLinear(linear)(x)
        expected = F.linear(x, linear.weight, linear.bias)
    assert padded_num_rows(num_rows) > num_rows
    assert got.shape == (num_rows, 48) and got.is_contiguous()
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pack_linears_keeps_f_linears_result_on_any_cpu(dtype: torch.dtype) -> None:
    """Packed where oneDNN runs this dtype here, left as nn.Linear where it does not (bf16
    on a CPU without AVX-512): never an error at load, never a different result."""
    model = nn.Sequential(nn.Linear(64, 96), nn.Linear(96, 32)).to(dtype)
    x = torch.randn(5, 64, dtype=dtype)
    with torch.inference_mode():
        expected = model(x)
        num_packed = pack_linears(model)
        got = model(x)
    is_packable = onednn_linear_available() and (dtype == torch.float32 or _onednn_bf16())
    assert num_packed == (2 if is_packable else 0)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, expected, rtol=tolerance, atol=tolerance)


@pytest.mark.skipif(not onednn_linear_available(), reason="needs oneDNN")
def test_pack_linears_swaps_every_linear_and_keeps_shared_weights() -> None:
    model = nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 8), nn.Linear(8, 10, bias=False))
    model[2].weight = model[0].weight  # tied
    assert pack_linears(model) == 2
    assert all(isinstance(m, PackedLinear) for m in model[1:])
    assert model[0].weight.shape == (10, 8)


PHI3_LONGROPE = {"rope_type": "longrope", "short_factor": [1.0, 1.2, 1.5, 2.0],
                 "long_factor": [1.0, 2.0, 4.0, 8.0], "original_max_position_embeddings": 64,
                 "max_position_embeddings": 256}  # fmt: skip


@pytest.mark.parametrize("context_len", [64, 65, None])
def test_longrope_frequencies_and_factor_match_transformers(context_len: int | None) -> None:
    from transformers import Phi3Config

    config = Phi3Config(hidden_size=64, num_attention_heads=4, max_position_embeddings=256,
                        original_max_position_embeddings=64, partial_rotary_factor=0.5,
                        rope_parameters={"rope_theta": 10000.0, **PHI3_LONGROPE})  # fmt: skip
    # transformers picks by the sequence: long past the original context (as superinfer
    # does for every sequence once max_model_len is past it; unset: 256)
    seq_len = 65 if context_len is None or context_len > 64 else 64
    expected, factor = ROPE_INIT_FUNCTIONS["longrope"](config, "cpu", seq_len=seq_len)
    scaling = {**PHI3_LONGROPE, "context_len": context_len}
    assert torch.equal(rope_inv_freq(8, 10000.0, scaling), expected)
    rope = RotaryEmbedding(16, 10000.0, scaling, rotary_dim=8)
    assert rope.magnitudes[:4].tolist() == pytest.approx([factor] * 4)
    assert factor == pytest.approx((1 + math.log(4) / math.log(64)) ** 0.5)


def test_partial_rotation_passes_the_last_dims_through() -> None:
    from transformers.models.phi3.modeling_phi3 import apply_rotary_pos_emb as phi3_rotary

    num_tokens, num_heads, head_dim, rotary_dim = 5, 3, 16, 12
    x = torch.randn(num_tokens, num_heads, head_dim)  # HF's layout: rotate-half of 12 dims
    positions = torch.tensor([0, 1, 7, 100, 4095])
    rope = RotaryEmbedding(head_dim, 10000.0, None, rotary_dim=rotary_dim)
    angles = positions[:, None].float() * rope.inv_freq  # (T, R/2)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    expected, _ = phi3_rotary(x, x, cos, sin, unsqueeze_dim=1)
    rows = interleave_rope_rows(torch.arange(head_dim), head_dim, rotary_dim)
    assert rows[rotary_dim:].tolist() == list(range(rotary_dim, head_dim))  # not moved
    ours = apply_rotary(x[..., rows], rope(positions))
    torch.testing.assert_close(ours, expected[..., rows], rtol=1e-5, atol=1e-5)
    assert torch.equal(ours[..., rotary_dim:], x[..., rotary_dim:])  # exactly
