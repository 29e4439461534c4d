"""Rotary position embedding (RoPE) with the scaling variants of the Llama family and
Phi-3's LongRoPE, over all of a head's dims or (partial RoPE) the first `rotary_dim`.

Rotation is applied to *interleaved* pairs (dims 2i, 2i+1) as one complex multiply, which
is the cheapest form on CPU. Hugging Face checkpoints rotate half-split pairs (i, i + R/2)
of the R rotated dims; `superinfer.model.weights` permutes the q/k projection rows so that
both give the same attention scores (q.k is unchanged when q and k are permuted alike).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from superinfer.model.cpu_rotary import rotary_kernel


def rope_inv_freq(head_dim: int, theta: float, scaling: dict[str, Any] | None = None) -> Tensor:
    """Inverse frequencies (head_dim // 2,) in float32 (as transformers computes them);
    `head_dim`: the dims RoPE rotates.

    For "dynamic" these are the frequencies within the original context; see
    `dynamic_inv_freq` beyond it."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float32, device="cpu") / head_dim
    inv_freq = 1.0 / theta**exponents
    rope_type = (scaling or {}).get("rope_type", "default")
    if rope_type in ("default", "dynamic"):
        pass
    elif rope_type == "longrope":  # transformers' order of operations, to the bit
        factors = torch.tensor(longrope_factors(scaling), dtype=torch.float32, device="cpu")
        inv_freq = 1.0 / (factors * theta**exponents)
    elif rope_type == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif rope_type == "llama3":
        inv_freq = _llama3_inv_freq(inv_freq, scaling)
    elif rope_type == "yarn":
        inv_freq = _yarn_inv_freq(inv_freq, head_dim, theta, scaling)
    elif rope_type == "freq_factors":
        inv_freq = inv_freq / torch.tensor(scaling["factors"], device="cpu")
    else:
        raise ValueError(f"unsupported rope scaling type {rope_type!r}")
    return inv_freq


def longrope_is_long(scaling: dict[str, Any]) -> bool:
    """Whether LongRoPE takes its long factors: where the engine serves sequences longer
    than the original context (`context_len`, its max_model_len; unset:
    `max_position_embeddings`, vLLM's default). As in vLLM and llama.cpp, one choice for
    every sequence and step, so a request's tokens depend neither on what shares its steps
    nor on how its prompt is chunked (transformers switches per forward, by the longest
    sequence in it: the same tokens while every sequence stays on one side of the original
    context)."""
    context = scaling.get("context_len") or scaling["max_position_embeddings"]
    return context > scaling["original_max_position_embeddings"]


def longrope_factors(scaling: dict[str, Any]) -> list[float]:
    """LongRoPE's divisors of the frequencies (`longrope_is_long` picks the set)."""
    return scaling["long_factor" if longrope_is_long(scaling) else "short_factor"]


def rope_attention_factor(scaling: dict[str, Any] | None) -> float:
    """How much RoPE scales q and k (YaRN's and LongRoPE's attention factor; 1 for the
    other types)."""
    rope_type = (scaling or {}).get("rope_type")
    if rope_type == "longrope":
        return _longrope_attention_factor(scaling)
    if rope_type != "yarn":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor = _yarn_factor(scaling)
    mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        return _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
    return _yarn_mscale(factor)


def dynamic_inv_freq(head_dim: int, theta: float, scaling: dict[str, Any], seq_len: int) -> Tensor:
    """Dynamic NTK: past `max_position_embeddings`, a larger base for `seq_len` positions."""
    factor, max_len = scaling["factor"], scaling["max_position_embeddings"]
    seq_len = max(seq_len, max_len)
    base = theta * ((factor * seq_len / max_len) - (factor - 1)) ** (head_dim / (head_dim - 2))
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
    return 1.0 / base**exponents


def _longrope_attention_factor(scaling: dict[str, Any]) -> float:
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    old_context = scaling["original_max_position_embeddings"]
    factor = scaling.get("factor") or scaling["max_position_embeddings"] / old_context
    return 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(old_context))


def _yarn_factor(scaling: dict[str, Any]) -> float:
    if scaling.get("factor") is not None:
        return scaling["factor"]
    return scaling["max_position_embeddings"] / scaling["original_max_position_embeddings"]


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_inv_freq(inv_freq: Tensor, head_dim: int, theta: float, scaling: dict) -> Tensor:
    """YaRN: interpolate (divide by `factor`) the low frequencies, keep the high ones, with a
    linear ramp over the dims between beta_slow and beta_fast rotations in the old context."""
    factor = _yarn_factor(scaling)
    old_context = scaling.get("original_max_position_embeddings")
    old_context = old_context or scaling["max_position_embeddings"]
    beta_fast, beta_slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

    def dim_of(num_rotations: float) -> float:  # the dim that turns num_rotations times
        return (
            head_dim * math.log(old_context / (num_rotations * 2 * math.pi)) / (2 * math.log(theta))
        )

    low, high = dim_of(beta_fast), dim_of(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    high = high + 0.001 if low == high else high
    ramp = (
        (torch.arange(head_dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low)
    ).clamp(0, 1)
    keep = 1 - ramp  # 1: extrapolate (keep), 0: interpolate
    return inv_freq / factor * (1 - keep) + inv_freq * keep


def _llama3_inv_freq(inv_freq: Tensor, scaling: dict[str, Any]) -> Tensor:
    """Llama 3.1: slow down low frequencies by `factor`, keep high ones, blend in between."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    smooth = ((old_context / wavelen - low) / (high - low)).clamp(0.0, 1.0)
    # smooth is 0 for wavelen > old_context / low and 1 for wavelen < old_context / high
    return (1 - smooth) * inv_freq / factor + smooth * inv_freq


class RotaryEmbedding(nn.Module):
    """Computes the rotations e^(i * pos * freq) of a step's positions.

    Under partial RoPE (`rotary_dim` < `head_dim`) the pairs past `rotary_dim` get the
    rotation 1 (angle 0, magnitude 1): an exact identity, so every consumer of the
    rotations (`apply_rotary`, the CPU decode kernel) passes those dims through."""

    def __init__(self, head_dim: int, theta: float, scaling: dict[str, Any] | None = None,
                 rotary_dim: int | None = None) -> None:  # fmt: skip
        super().__init__()
        self.head_dim, self.theta = head_dim, theta
        self.rotary_dim = rotary_dim or head_dim
        self.is_dynamic = (scaling or {}).get("rope_type") == "dynamic"
        self._use(scaling)

    def _use(self, scaling: dict[str, Any] | None) -> None:
        self.scaling = scaling
        # plain attributes, not buffers: model.to(bfloat16) must not round the frequencies
        self.inv_freq = rope_inv_freq(self.rotary_dim, self.theta, scaling)  # (R/2,)
        self.num_passed = (self.head_dim - self.rotary_dim) // 2
        magnitude = torch.full((self.rotary_dim // 2,), rope_attention_factor(scaling),
                               device="cpu")  # fmt: skip
        self.magnitudes = torch.cat([magnitude, torch.ones(self.num_passed, device="cpu")])

    def fit_context(self, max_model_len: int) -> None:
        """Serve sequences of up to `max_model_len` tokens: LongRoPE's factors are chosen
        by it (`longrope_factors`); the other types do not depend on it."""
        if (self.scaling or {}).get("rope_type") == "longrope":
            self._use({**self.scaling, "context_len": max_model_len})

    def forward(self, positions: Tensor) -> Tensor:
        """(T,) positions -> (T, 1, D/2) complex64 rotations, broadcastable over heads."""
        if self.inv_freq.device != positions.device:
            self.inv_freq = self.inv_freq.to(positions.device)
            self.magnitudes = self.magnitudes.to(positions.device)
        inv_freq = self.inv_freq
        if self.is_dynamic:  # as transformers: from the step's longest sequence
            seq_len = int(positions.max()) + 1
            if seq_len > self.scaling["max_position_embeddings"]:
                inv_freq = dynamic_inv_freq(self.rotary_dim, self.theta, self.scaling, seq_len)
                inv_freq = inv_freq.to(positions.device)
        angles = positions.unsqueeze(1).float() * inv_freq  # (T, R/2)
        if self.num_passed:
            angles = torch.nn.functional.pad(angles, (0, self.num_passed))  # (T, D/2)
        return torch.polar(self.magnitudes.expand_as(angles), angles).unsqueeze(1)


def apply_rotary(x: Tensor, rotation: Tensor) -> Tensor:
    """Rotate interleaved pairs of x (T, n, D) by rotation (T, 1, D/2); returns (T, n, D).
    On CPU one C call where the kernel takes them (`cpu_rotary`, the same bits)."""
    kernel = rotary_kernel() if x.device.type == "cpu" else None
    if kernel is not None and kernel.takes(x, rotation):
        return kernel(x, rotation)
    pairs = x.float().unflatten(-1, (-1, 2))  # (T, n, D/2, 2)
    rotated = torch.view_as_complex(pairs) * rotation  # (T, n, D/2)
    return torch.view_as_real(rotated).flatten(-2).to(x.dtype)
