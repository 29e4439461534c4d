"""Rotary position embedding (RoPE) with the scaling variants of the Llama family.

Rotation is applied to *interleaved* pairs (dims 2i, 2i+1) as one complex multiply, which
is the cheapest form on CPU. Hugging Face checkpoints rotate half-split pairs (i, i + D/2);
`superinfer.model.weights` permutes the q/k projection rows so that both give the
same attention scores (q.k is unchanged when q and k are permuted alike).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn


def rope_inv_freq(
    head_dim: int, theta: float, scaling: dict[str, Any] | None = None
) -> Tensor:
    """Inverse frequencies (head_dim // 2,) in float32 (as transformers computes them)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float32, device="cpu") / head_dim
    inv_freq = 1.0 / theta**exponents
    rope_type = (scaling or {}).get("rope_type", "default")
    if rope_type == "default":
        pass
    elif rope_type == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif rope_type == "llama3":
        inv_freq = _llama3_inv_freq(inv_freq, scaling)
    elif rope_type == "freq_factors":
        inv_freq = inv_freq / torch.tensor(scaling["factors"], device="cpu")
    else:
        raise ValueError(f"unsupported rope scaling type {rope_type!r}")
    return inv_freq


def _llama3_inv_freq(inv_freq: Tensor, scaling: dict[str, Any]) -> Tensor:
    """Llama 3.1: slow down low frequencies by `factor`, keep high ones, blend in between."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    smooth = ((old_context / wavelen - low) / (high - low)).clamp(0.0, 1.0)
    # smooth is 0 for wavelen > old_context / low and 1 for wavelen < old_context / high
    return (1 - smooth) * inv_freq / factor + smooth * inv_freq


class RotaryEmbedding(nn.Module):
    """Computes the rotations e^(i * pos * freq) of a step's positions."""

    def __init__(self, head_dim: int, theta: float, scaling: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.head_dim = head_dim
        # a plain attribute, not a buffer: model.to(bfloat16) must not round the frequencies
        self.inv_freq = rope_inv_freq(head_dim, theta, scaling)  # (D/2,)

    def forward(self, positions: Tensor) -> Tensor:
        """(T,) positions -> (T, 1, D/2) complex64 rotations, broadcastable over heads."""
        if self.inv_freq.device != positions.device:
            self.inv_freq = self.inv_freq.to(positions.device)
        angles = positions.unsqueeze(1).float() * self.inv_freq  # (T, D/2)
        return torch.polar(torch.ones_like(angles), angles).unsqueeze(1)


def apply_rotary(x: Tensor, rotation: Tensor) -> Tensor:
    """Rotate interleaved pairs of x (T, n, D) by rotation (T, 1, D/2); returns (T, n, D)."""
    pairs = x.float().unflatten(-1, (-1, 2))  # (T, n, D/2, 2)
    rotated = torch.view_as_complex(pairs) * rotation  # (T, n, D/2)
    return torch.view_as_real(rotated).flatten(-2).to(x.dtype)
