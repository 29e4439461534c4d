"""A linear layer over FP8 (e4m3) weights, multiplied by `torch._scaled_mm` on FP8 inputs.

The weight holds one scale per output row (a per-tensor scale is repeated over the rows).
Each step rounds its activations to FP8 with one scale per row (dynamic, as vLLM does for
FP8 checkpoints without activation scales) or with the checkpoint's static `input_scale`,
and `torch._scaled_mm` multiplies the two with row-wise scales into `out_dtype`.

This is the GPU path (Hopper and later run `_scaled_mm` natively). PyTorch's CPU
`_scaled_mm` computes the same function about 30x slower than a bfloat16 GEMM (1,536 x 576,
1-256 rows, measured on a Zen 4 host), so on a CPU the loader dequantizes FP8 checkpoints
instead (`quant_checkpoint`); the tests run this module on the CPU.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # 448


class Fp8Linear(nn.Module):
    """A frozen linear layer: y = (x_fp8 * x_scale) @ (w_fp8 * w_scale).T + bias."""

    def __init__(
        self,
        weight: Tensor,
        weight_scale: Tensor,
        input_scale: Tensor | None,
        bias: Tensor | None,
        out_dtype: torch.dtype,
    ) -> None:
        """weight (N, K) float8_e4m3fn; weight_scale (N,) float32; input_scale a float32
        scalar (static activation scale) or None (one scale per row, computed each step)."""
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.register_buffer("weight", weight, persistent=False)
        self.register_buffer("weight_scale", weight_scale.float().view(1, -1), persistent=False)
        self.register_buffer(
            "input_scale", None if input_scale is None else input_scale.float().view(1, 1),
            persistent=False,
        )  # fmt: skip
        self.bias = bias
        self.out_dtype = out_dtype

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        x = x.reshape(-1, self.in_features)
        x_fp8, x_scale = quantize_rows(x, self.input_scale)
        y = torch._scaled_mm(x_fp8, self.weight.t(), scale_a=x_scale, scale_b=self.weight_scale,
                             out_dtype=self.out_dtype)  # fmt: skip
        if self.bias is not None:
            y = y.add_(self.bias)
        return y.view(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        scheme = "dynamic" if self.input_scale is None else "static"
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8 ({scheme})"


def quantize_rows(x: Tensor, input_scale: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(x rounded to FP8, its scales (rows, 1) float32): one scale per row, amax / 448, or
    the static `input_scale` (values beyond its range saturate)."""
    x = x.float()
    if input_scale is None:
        scale = x.abs().amax(-1, keepdim=True).clamp_(min=1e-12).div_(FP8_MAX)
    else:
        scale = input_scale.expand(x.shape[0], 1)
    x_fp8 = (x / scale).clamp_(-FP8_MAX, FP8_MAX).to(FP8)
    return x_fp8, scale.contiguous()
