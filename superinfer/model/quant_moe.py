"""A GGUF mixture of experts kept quantized on the CPU.

llama.cpp stacks each MoE layer's experts in three tensors, `blk.N.ffn_{gate,up,down}_exps`
of (experts, rows, columns) (its dims innermost first). Where they are Q4_0, Q4_1, Q8_0 or
Q4_K, each expert's matrices become Int4Linear layers on the kernels of the dense quantized
layers (`quant.int4_linear`: the same exact block conversion, the few-row GEMV, the 4-bit
GEMM, the int4 kernel or `cpu_w4a8`'s GEMM), gate and up rows concatenated as the dense
`gate_up_proj` fuses them; none keeps a dense copy. A projection of another type (Q6_K in
Q4_K_M files) stays a stacked float tensor. Qwen3-30B-A3B has 29 billion expert weights:
58 GB in bfloat16, about 18 GB as 4-bit planes (0.625 bytes a weight: 4 bits, and a
bfloat16 scale and zero per 32).

`quantize_experts` swaps the modules on the model before its parameters are allocated, and
the loader leaves the swapped tensors out of the weights it dequantizes (`GGUFCheckpoint.
weights(skip=...)`): the float experts are never materialised, and each expert's planes are
converted, packed and freed one expert at a time.

A step multiplies each expert that received rows by its contiguous group of rows (the rows
come sorted by expert), as llama.cpp's `mul_mat_id` does: a loop over the active experts,
never over tokens.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType, ReaderTensor
from torch import Tensor, nn

from superinfer.model.config import ModelConfig
from superinfer.model.moe import MoE
from superinfer.model.quant import INT4_TYPES, Int4Linear, int4_linear, rows_planes

# a projection: one Int4Linear per expert, or the experts' stacked float weights (E, N, K)
Projection = nn.ModuleList | nn.Parameter


class QuantExperts(nn.Module):
    """`moe.Experts` with projections kept quantized (see the module docstring)."""

    def __init__(self, gate_up_proj: Projection, down_proj: Projection) -> None:
        """gate_up_proj: (2I, C) per expert, gate rows then up rows; down_proj: (C, I)."""
        super().__init__()
        self.gate_up_proj, self.down_proj = gate_up_proj, down_proj
        self.num_experts = len(gate_up_proj)

    def forward(self, x: Tensor, experts: Tensor) -> Tensor:
        """x (N, C) rows sorted by `experts` (N,) -> (N, C), each row through its expert."""
        counts = torch.bincount(experts, minlength=self.num_experts).tolist()
        out = torch.empty_like(x)
        start = 0
        for expert, count in enumerate(counts):
            if count == 0:
                continue
            rows = slice(start, start + count)
            gate, up = _project(self.gate_up_proj, expert, x[rows]).chunk(2, -1)
            out[rows] = _project(self.down_proj, expert, F.silu(gate) * up)
            start += count
        return out

    def extra_repr(self) -> str:
        kinds = ["quantized" if isinstance(p, nn.ModuleList) else "dense"
                 for p in (self.gate_up_proj, self.down_proj)]  # fmt: skip
        return f"num_experts={self.num_experts}, gate_up {kinds[0]}, down {kinds[1]}"


def _project(projection: Projection, expert: int, x: Tensor) -> Tensor:
    if isinstance(projection, nn.ModuleList):
        return projection[expert](x)
    return F.linear(x, projection[expert])


def expert_tensor_names(layer: int) -> dict[str, tuple[str, ...]]:
    """The GGUF tensors of a layer's experts, by the projection they make."""
    gate, up, down = (f"blk.{layer}.ffn_{proj}_exps.weight" for proj in ("gate", "up", "down"))
    return {"gate_up_proj": (gate, up), "down_proj": (down,)}


def quantized_expert_tensors(tensors: Mapping[str, ReaderTensor], config: ModelConfig) -> set[str]:
    """The stacked expert tensors that `quantize_experts` keeps quantized: a projection's
    when all its tensors are Q4_0, Q4_1, Q8_0 or Q4_K of one plane width (as
    `quant.swap_int4_linears` requires of a fused layer)."""
    names: set[str] = set()
    for layer in range(config.num_layers):
        if not config.is_moe_layer(layer):
            continue
        for parts in expert_tensor_names(layer).values():
            if _quantizable([tensors.get(name) for name in parts]):
                names.update(parts)
    return names


def _quantizable(found: list[ReaderTensor | None]) -> bool:
    if not all(t is not None and t.tensor_type in INT4_TYPES for t in found):
        return False
    return len({t.tensor_type == GGMLQuantizationType.Q8_0 for t in found}) == 1  # one width


def quantize_experts(
    model: nn.Module,
    tensors: Mapping[str, ReaderTensor],
    names: set[str],
    max_int4_rows: int | None,
    is_w4a8: bool = False,
) -> int:
    """Swap the experts of each MoE layer whose projections' tensors are in `names`
    (`quantized_expert_tensors`) for QuantExperts; returns how many layers were swapped.
    Call it on the model before its parameters are allocated (on the meta device): a
    projection kept quantized is then never allocated in float; one that is not stays
    the Experts' parameter, to be allocated and loaded as before. `max_int4_rows` and
    `is_w4a8` choose the kernels as for the dense layers (`quant.swap_int4_linears`)."""
    num_swapped = 0
    for layer, block in enumerate(model.model.layers):
        if not isinstance(block.mlp, MoE):
            continue
        experts, projections = block.mlp.experts, {}
        for attr, parts in expert_tensor_names(layer).items():
            projections[attr] = getattr(experts, attr)
            if all(name in names for name in parts):
                stacked = [tensors[name] for name in parts]
                projections[attr] = _expert_linears(stacked, max_int4_rows, is_w4a8)
        if any(isinstance(p, nn.ModuleList) for p in projections.values()):
            block.mlp.experts = QuantExperts(**projections)
            num_swapped += 1
    return num_swapped


def _expert_linears(
    stacked: list[ReaderTensor], max_int4_rows: int | None, is_w4a8: bool
) -> nn.ModuleList:
    """One Int4Linear per expert over its rows of `stacked` (concatenated in order)."""
    raws = [np.asarray(t.data).reshape(int(t.shape[-1]), int(t.shape[-2]), -1) for t in stacked]
    in_features = int(stacked[0].shape[0])
    linears: list[Int4Linear] = []
    for expert in range(raws[0].shape[0]):
        parts = [rows_planes(raw[expert], t.tensor_type) for raw, t in zip(raws, stacked)]
        planes = tuple(torch.cat([p[i] for p in parts]) for i in range(3))
        linears.append(int4_linear(planes, in_features, max_int4_rows, is_w4a8))
    return nn.ModuleList(linears)
