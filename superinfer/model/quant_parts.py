"""Fused GGUF projections whose parts differ in type, each part on its own kernels.

superinfer fuses q/k/v and gate/up into one layer (`quant._LAYER_SOURCES`). llama.cpp's
Q4_K_M writes attn_v (and ffn_down) of about half the layers in Q6_K and attn_q, attn_k in
Q4_K; no one set of planes holds such a layer (Q6_K's scale per 16 inputs does not fit the
int4 kernels' groups of 32; Q8_0's two planes are twice a 4-bit part's width), so it used to
stay dense. `MixedLinear` runs each part on its own weights, bias included, and
concatenates their outputs in the dense layer's row order (q and k reordered for RoPE as
`quant.swap_int4_linears` reorders them): Q4_0, Q4_1 and Q4_K parts on `cpu_q4`'s packing,
Q8_0 parts on the 8-bit layout, Q6_K parts on Q6_K's own (consecutive parts of one layout,
as Q4_K q and k, as one). Steps of up to `max_gemv_rows` rows (decode of a few sequences)
run `cpu_gemv`'s GEMV on each; larger ones (prefill, large batches) the GEMM of `cpu_q4` on
the 4-bit and Q6_K parts, and a Q8_0 part's weights unpacked to bfloat16 for that step.

Memory: no dense layer is kept; 0.625 bytes a weight for a 4-bit part (4 bits, a bfloat16
scale and zero per 32), 1.25 for a Q8_0 one (8 bits, 8 bytes of scales per 32), 0.83 for a
Q6_K one (6.625 bits), against the dense layer's 2.

A larger step computes with the weights rounded to bfloat16 (4-bit: scales and zeros
rounded, as `swap_int4_linears`' layers hold them; Q6_K and Q8_0: each product rounded),
the GEMV with the 4-bit weights the same and the Q6_K and Q8_0 ones exact: the function of
the dense layer's weights on both paths, up to that rounding.
"""

from __future__ import annotations

import torch
from gguf import GGMLQuantizationType
from torch import Tensor, nn
from torch.nn import functional as F

from superinfer.model.cpu_gemv import MAX_ROWS as GEMV_MAX_ROWS
from superinfer.model.cpu_gemv import GemvKernel, Q6KWeights, Q8Weights
from superinfer.model.cpu_q4 import Q4Kernel, Q4Weights, q4_kernel
from superinfer.model.quant import Q6_K, _interleave, replace_module, rope_ordered

PartWeights = Q4Weights | Q8Weights | Q6KWeights
# a part's GGUF type and its `quant.typed_values`: 4-bit planes, or Q6_K values, sc and d
TypedValues = tuple[GGMLQuantizationType, tuple[Tensor, ...]]


class MixedLinear(nn.Module):
    """A frozen fused linear layer whose parts differ in GGUF type: each of `parts` (GGUF
    weights, bias included, in the fused row order) runs on `gemv` for steps of up to
    `max_gemv_rows` rows and on `gemm` (or, Q8_0, unpacked) for larger ones; the outputs
    are concatenated along the features."""

    def __init__(
        self, gemv: GemvKernel, gemm: Q4Kernel, parts: list[PartWeights], max_gemv_rows: int
    ) -> None:
        super().__init__()
        if max_gemv_rows > GEMV_MAX_ROWS:
            raise ValueError(f"the GEMV takes at most {GEMV_MAX_ROWS} rows")
        self.in_features = parts[0].num_in
        self.out_features = sum(part.num_out for part in parts)
        self.gemv, self.gemm, self.parts = gemv, gemm, parts
        self.max_gemv_rows = max_gemv_rows  # a plain attribute: read on every call

    def forward(self, x: Tensor) -> Tensor:
        dtype = x.dtype
        if dtype != torch.bfloat16:
            x = x.to(torch.bfloat16)
        run = self.gemv if x.shape[0] <= self.max_gemv_rows else self._gemm
        y = torch.cat([run(x, part) for part in self.parts], -1)
        return y if dtype == torch.bfloat16 else y.to(dtype)

    def _gemm(self, x: Tensor, part: PartWeights) -> Tensor:
        if isinstance(part, Q4Weights):
            return self.gemm(x, part)
        if isinstance(part, Q6KWeights):
            return self.gemm.linear_q6k(x, part)
        bias = None if part.bias is None else part.bias.to(torch.bfloat16)
        return F.linear(x, self.gemv.unpack(part), bias)  # Q8_0: this step only

    def extra_repr(self) -> str:
        parts = " + ".join(f"{type(p).__name__.removesuffix('Weights')} x {p.num_out}"
                           for p in self.parts)  # fmt: skip
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"parts {parts}: GEMV up to {self.max_gemv_rows} rows, else GEMM")  # fmt: skip


def swap_mixed_linears(
    model: nn.Module,
    parts: dict[str, list[TypedValues]],
    interleaved_qk: bool,
    kernel: GemvKernel,
    max_gemv_rows: int,
) -> list[str]:
    """Swap each fused linear layer named in `parts` (its parts' typed values, in the fused
    parameter's row order; q/k rows reordered for RoPE unless `interleaved_qk`) for a
    MixedLinear running steps of up to `max_gemv_rows` rows on `kernel`, larger ones on
    `cpu_q4`'s GEMM (`quant.quantize_linears` swaps mixed layers only where it runs);
    returns the names swapped."""
    swapped = []
    for name, typed in parts.items():
        linear = model.get_submodule(name)
        if not isinstance(linear, nn.Linear) or max_gemv_rows < 1:
            continue
        typed = rope_ordered(name, typed, interleaved_qk,
                             lambda part: (part[0], _interleave(part[1], model.config)))  # fmt: skip
        gemm = q4_kernel()
        weights = _part_weights(kernel, gemm, _merged_runs(typed), linear)
        replace_module(model, name, MixedLinear(kernel, gemm, weights, max_gemv_rows))
        swapped.append(name)
    return swapped


def _merged_runs(typed: list[TypedValues]) -> list[TypedValues]:
    """Consecutive parts of one GEMV layout (Q4_K q and k) as one, their rows concatenated:
    one call, over more columns, where there were two."""
    runs = []
    for kind, values in typed:
        if runs and _layout(runs[-1][0]) == _layout(kind):
            runs[-1] = (runs[-1][0], tuple(torch.cat(pair) for pair in zip(runs[-1][1], values)))
        else:
            runs.append((kind, values))
    return runs


def _layout(kind: GGMLQuantizationType) -> GGMLQuantizationType | None:
    """The GEMV layout of a part's type: Q6_K's, Q8_0's, or (None) the 4-bit planes'."""
    return kind if kind in (Q6_K, GGMLQuantizationType.Q8_0) else None


def _part_weights(
    gemv: GemvKernel, gemm: Q4Kernel, typed: list[TypedValues], linear: nn.Linear
) -> list[PartWeights]:
    """Each part's weights, with its slice of `linear`'s bias."""
    sizes = [values[0].shape[0] for _, values in typed]
    biases = [None] * len(typed) if linear.bias is None else list(linear.bias.split(sizes))
    weights = []
    for (kind, values), bias in zip(typed, biases):
        if kind == Q6_K:
            weights.append(gemv.pack_q6_k(*values, bias))
        elif kind == GGMLQuantizationType.Q8_0:
            weights.append(gemv.pack_planes(values[0], values[1], linear.in_features, bias))
        else:
            weights.append(gemm.pack(*values, bias))
    return weights
