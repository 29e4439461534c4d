"""A 4-bit linear layer on CUDA, multiplied by PyTorch's own int4 kernel (tinygemm,
`aten._weight_int4pack_mm`, bfloat16 activations).

The kernel computes w = (q - 8) * scale + zero with one (scale, zero) per group of inputs,
the function `quant.Int4Linear` runs on the CPU; the planes come from the same converters
(GGUF blocks, AWQ and GPTQ groups: `quant_checkpoint`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

GROUP = 32


def cuda_int4_available() -> bool:
    return torch.cuda.is_available() and hasattr(torch.ops.aten, "_weight_int4pack_mm")


def inner_k_tiles(in_features: int, out_features: int) -> int | None:
    """The kernel's K tiling for this shape (8, 4 or 2); None when it cannot take it."""
    if out_features % 8:
        return None
    for tiles in (8, 4, 2):
        if in_features % (tiles * 16) == 0:
            return tiles
    return None


class CudaInt4Linear(nn.Module):
    """A frozen linear layer over 4-bit values with a (scale, zero) per 32 inputs."""

    def __init__(self, nibbles: Tensor, scales: Tensor, zeros: Tensor, bias: Tensor | None) -> None:
        """nibbles (N, K) integers in 0..15 (one plane: K is `in_features`); scales, zeros
        (N, K / 32) float32; tensors on the CUDA device the layer runs on."""
        super().__init__()
        self.out_features, self.in_features = nibbles.shape
        tiles = inner_k_tiles(self.in_features, self.out_features)
        if tiles is None:
            raise ValueError(f"the int4 kernel cannot take a {tuple(nibbles.shape)} weight")
        q = nibbles.to(torch.uint8)
        pairs = (q[:, ::2] << 4) | q[:, 1::2]  # (N, K / 2): the packing op's input since 2.5
        self.register_buffer(
            "packed", torch.ops.aten._convert_weight_to_int4pack(pairs, tiles), persistent=False
        )
        sz = torch.stack([scales.t(), zeros.t()], -1)  # (K / 32, N, 2)
        self.register_buffer("scales_zeros", sz.to(torch.bfloat16).contiguous(), persistent=False)
        self.bias = bias

    def forward(self, x: Tensor) -> Tensor:
        shape, dtype = x.shape, x.dtype
        x = x.reshape(-1, self.in_features).to(torch.bfloat16).contiguous()  # the kernel needs it
        y = torch.ops.aten._weight_int4pack_mm(x, self.packed, GROUP, self.scales_zeros)
        if self.bias is not None:
            y = y.add_(self.bias)
        return y.to(dtype).view(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int4 (tinygemm)"
