"""Fused GGUF projections whose parts differ in type, each part on the few-row GEMV.

superinfer fuses q/k/v and gate/up into one layer (`quant._LAYER_SOURCES`). llama.cpp's
Q4_K_M writes attn_v (and ffn_down) of about half the layers in Q6_K and attn_q, attn_k in
Q4_K; no one set of planes holds such a layer (Q6_K's scale per 16 inputs does not fit the
int4 kernels' groups of 32; Q8_0's two planes are twice a 4-bit part's width), so it used to
stay dense. `MixedLinear` keeps that dense fused layer for steps of more rows than the GEMV
takes (prefill, large batches: as before), and for steps of up to `max_gemv_rows` rows
(decode of a few sequences) runs each part on `cpu_gemv`'s GEMV over its own weights, bias
included: Q4_0, Q4_1 and Q4_K parts on `cpu_q4`'s packing, Q8_0 parts on the 8-bit layout,
Q6_K parts on Q6_K's own (consecutive parts of one layout, as Q4_K q and k, as one), and
concatenates their outputs in the dense layer's row order (q and k reordered for RoPE as
`quant.swap_int4_linears` reorders them).

Memory: the dense layer stays, and the parts' quantized copies come on top of it: 0.625
bytes a weight for a 4-bit part (4 bits, a bfloat16 scale and zero per 32), 1.25 for a
Q8_0 one (8 bits, 8 bytes of scales per 32), 0.83 for a Q6_K one (6.625 bits), against the
dense layer's 2. Measured on Qwen3-0.6B's shape as a Q4_K_M-like file (benchmarks/q6k_decode.py,
docs/results/models/q6k_decode_1205/qwen3-0.6b_split.json: 14 of 28 layers' q/k/v mixed,
2 threads): 46 MB more, and a decode step of one sequence takes 18.5 ms against 22.2 ms
with those layers dense (llama.cpp: 16.7 ms).

A step computes the same function of the weights on either path, up to rounding: the dense
rows of the 4-bit and Q8_0 parts are rewritten to the weights their GEMV multiplies by
(scales and zeros rounded to bfloat16, `quant.dequantize_planes`), as `swap_int4_linears`
makes its dense copies; the Q6_K rows stay the loader's (the GEMV's scales are exact).
"""

from __future__ import annotations

import torch
from gguf import GGMLQuantizationType
from torch import Tensor, nn

from superinfer.model.cpu_gemv import MAX_ROWS as GEMV_MAX_ROWS
from superinfer.model.cpu_gemv import GemvKernel, Q6KWeights, Q8Weights
from superinfer.model.cpu_q4 import Q4Weights, q4_kernel
from superinfer.model.quant import (
    Q6_K,
    _interleave,
    dequantize_planes,
    replace_module,
    rope_ordered,
)

PartWeights = Q4Weights | Q8Weights | Q6KWeights
# a part's GGUF type and its `quant.typed_values`: 4-bit planes, or Q6_K values, sc and d
TypedValues = tuple[GGMLQuantizationType, tuple[Tensor, ...]]


class MixedLinear(nn.Module):
    """A frozen fused linear layer whose parts differ in GGUF type: steps of up to
    `max_gemv_rows` rows run each of `parts` (GEMV weights, bias included, in the fused row
    order) on `kernel` and concatenate the outputs along the features; larger steps run
    `dense`, the fused layer itself."""

    def __init__(
        self, kernel: GemvKernel, parts: list[PartWeights], dense: nn.Module, max_gemv_rows: int
    ) -> None:
        super().__init__()
        if max_gemv_rows > GEMV_MAX_ROWS:
            raise ValueError(f"the GEMV takes at most {GEMV_MAX_ROWS} rows")
        self.in_features = parts[0].num_in
        self.out_features = sum(part.num_out for part in parts)
        if (self.in_features, self.out_features) != (dense.in_features, dense.out_features):
            raise ValueError("the parts do not make up the dense layer")
        self.gemv, self.parts, self.dense = kernel, parts, dense
        self.max_gemv_rows = max_gemv_rows  # a plain attribute: read on every call

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[0] > self.max_gemv_rows:
            return self.dense(x)
        dtype = x.dtype
        if dtype != torch.bfloat16:
            x = x.to(torch.bfloat16)
        y = torch.cat([self.gemv(x, part) for part in self.parts], -1)
        return y if dtype == torch.bfloat16 else y.to(dtype)

    def extra_repr(self) -> str:
        parts = " + ".join(f"{type(p).__name__.removesuffix('Weights')} x {p.num_out}"
                           for p in self.parts)  # fmt: skip
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"GEMV parts {parts} up to {self.max_gemv_rows} rows, else dense")  # fmt: skip


def swap_mixed_linears(
    model: nn.Module,
    parts: dict[str, list[TypedValues]],
    interleaved_qk: bool,
    kernel: GemvKernel,
    max_gemv_rows: int,
) -> list[str]:
    """Swap each fused linear layer named in `parts` (its parts' typed values, in the fused
    parameter's row order; q/k rows reordered for RoPE unless `interleaved_qk`) for a
    MixedLinear running steps of up to `max_gemv_rows` rows on `kernel`, larger ones on the
    layer itself; returns the names swapped. A layer with a 4-bit part stays as it is where
    the 4-bit packing (`cpu_q4`) is missing."""
    head_dim = model.config.head_dim
    swapped = []
    for name, typed in parts.items():
        linear = model.get_submodule(name)
        if not isinstance(linear, nn.Linear) or max_gemv_rows < 1:
            continue
        typed = rope_ordered(name, typed, interleaved_qk,
                             lambda part: (part[0], _interleave(part[1], head_dim)))  # fmt: skip
        weights = _part_weights(kernel, _merged_runs(typed), linear)
        if weights is None:
            continue
        replace_module(model, name, MixedLinear(kernel, weights, linear, max_gemv_rows))
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
    kernel: GemvKernel, typed: list[TypedValues], linear: nn.Linear
) -> list[PartWeights] | None:
    """Each part's GEMV weights with its slice of `linear`'s bias, and the 4-bit and Q8_0
    parts' rows of `linear.weight` rewritten to them (module docstring); None where a
    4-bit part cannot be packed here."""
    q4 = q4_kernel()
    if q4 is None and any(_layout(kind) is None for kind, _ in typed):
        return None
    sizes = [values[0].shape[0] for _, values in typed]
    biases = [None] * len(typed) if linear.bias is None else list(linear.bias.split(sizes))
    weights = []
    for (kind, values), bias in zip(typed, biases):
        if kind == Q6_K:
            weights.append(kernel.pack_q6_k(*values, bias))
        elif kind == GGMLQuantizationType.Q8_0:
            weights.append(kernel.pack_planes(values[0], values[1], linear.in_features, bias))
        else:
            weights.append(q4.pack(*values, bias))
    with torch.no_grad():
        for (kind, values), rows in zip(typed, linear.weight.split(sizes)):
            if kind != Q6_K:
                rows.copy_(dequantize_planes(values, linear.in_features, rows.dtype))
    return weights
