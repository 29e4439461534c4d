"""A frozen linear layer held only in the few-row GEMV's 8-bit layout (`cpu_gemv`: Q8_0
weights, 1.25 bytes a weight): a MoE's Q8_0 expert projection kept quantized (`quant_moe`)
with no dense copy. `quant.Q6KLinear` is the same layer over Q6_K's own layout, with a GEMM
of its own for the larger steps.

Steps of up to `max_gemv_rows` rows (decode) run the GEMV. A larger step (prefill, or a
batch of which many tokens chose this expert) unpacks the weights to a bfloat16 matrix
(`GemvKernel.unpack`: each value times its scale in float, rounded once, the weights
`--quantization none` dequantizes the file to) and multiplies by it (`F.linear`); the
matrix lives for that step only. Unpacking reads the weights once and writes 2 bytes a
weight, about what the dense layer's GEMM reads anyway, so a large step costs about a
dense one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from superinfer.model.cpu_gemv import MAX_ROWS as GEMV_MAX_ROWS
from superinfer.model.cpu_gemv import GemvKernel, Q6KWeights, Q8Weights
from superinfer.model.cpu_kernels import KernelCall


class GemvLinear(nn.Module):
    """A frozen linear layer over `weights` (`GemvKernel.pack_q8`, bias included): steps of
    up to `max_gemv_rows` rows on `kernel`'s GEMV, larger ones on the weights unpacked to
    bfloat16 for the step."""

    def __init__(
        self,
        kernel: GemvKernel,
        weights: Q8Weights | Q6KWeights,
        max_gemv_rows: int = GEMV_MAX_ROWS,
    ) -> None:
        super().__init__()
        if max_gemv_rows > GEMV_MAX_ROWS:
            raise ValueError(f"the GEMV takes at most {GEMV_MAX_ROWS} rows")
        self.gemv, self.weights = kernel, weights
        self.max_gemv_rows = max_gemv_rows  # a plain attribute: read on every call
        self.in_features, self.out_features = weights.num_in, weights.num_out

    def forward(self, x: Tensor) -> Tensor:
        dtype = x.dtype
        if dtype != torch.bfloat16:
            x = x.to(torch.bfloat16)
        if x.shape[0] <= self.max_gemv_rows:
            y = self.gemv(x, self.weights)
        else:
            y = self.larger_step(x)
        return y if dtype == torch.bfloat16 else y.to(dtype)

    def kernel_call(self, num_rows: int) -> KernelCall | None:
        """The C call `forward` makes for a step of `num_rows` bfloat16 rows, or None where
        it runs PyTorch (the unpacked weights)."""
        return self.gemv.call_for(self.weights) if num_rows <= self.max_gemv_rows else None

    def larger_step(self, x: Tensor) -> Tensor:
        """A step of more rows than the GEMV takes: x (rows, K) bfloat16 -> (rows, N)."""
        y = F.linear(x, self.gemv.unpack(self.weights))
        return y if self.weights.bias is None else y.add_(self.weights.bias)

    def extra_repr(self) -> str:
        kind = type(self.weights).__name__.removesuffix("Weights")
        larger = "GEMM" if kind == "Q6K" else "unpacked"
        return (f"in_features={self.in_features}, out_features={self.out_features}, {kind} "
                f"GEMV up to {self.max_gemv_rows} rows, else {larger}")  # fmt: skip
