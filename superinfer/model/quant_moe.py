"""A GGUF mixture of experts kept quantized on the CPU.

llama.cpp stacks each MoE layer's experts in three tensors, `blk.N.ffn_{gate,up,down}_exps`
of (experts, rows, columns) (its dims innermost first). Each expert's projection (gate and
up rows concatenated, as the dense `gate_up_proj` fuses them) is kept in one quantized
representation, never beside a dense copy:

- Q6_K (Q4_K_M files write about half the layers' `ffn_down_exps` so): a
  `quant.Q6KLinear` over Q6_K's own bits (0.83 bytes a weight), the few-row GEMV for steps
  of up to 8 rows and the GEMM of `cpu_q4` for larger ones. Under `gguf-w4a8` Q6_K experts
  run so too (not on 8-bit activations; the dense Q6_K layers there stay dense): float
  experts would cost 2.4x the bytes. Where those kernels do not run (no AVX-512 BF16),
  Q6_K projections stay stacked float tensors;
- Q8_0, except under `gguf-w4a8`: a `gemv_linear.GemvLinear` over the few-row GEMV's
  8-bit layout (1.25 bytes a weight), for steps of up to 8 rows; larger steps unpack the
  expert's weights to a transient bfloat16 matrix. Where the GEMV does not run, they go as
  the 4-bit types do;
- Q4_0, Q4_1, Q4_K (and Q8_0, above): Int4Linear layers on the kernels of the dense
  quantized layers (`quant.int4_linear`: the same exact block conversion, the few-row
  GEMV, the 4-bit GEMM, the int4 kernel or `cpu_w4a8`'s GEMM), 0.625 bytes a weight for a
  4-bit type (4 bits, and a bfloat16 scale and zero per 32).

A projection whose parts differ in type, or of another type, stays a stacked float tensor.
Qwen3-30B-A3B has 29 billion expert weights: 58 GB in bfloat16, about 18 GB as 4-bit
planes; its Q4_K_M file's Q6_K `ffn_down_exps` (4.8 billion weights) take 4 GB where they
took 9.7 GB in bfloat16.

`quantize_experts` swaps the modules on the model before its parameters are allocated, and
the loader leaves the swapped tensors out of the weights it dequantizes (`GGUFCheckpoint.
weights(skip=...)`): the float experts are never materialised, and each expert's weights
are converted, packed and freed one expert at a time.

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
from superinfer.model.cpu_gemv import MAX_ROWS as GEMV_MAX_ROWS
from superinfer.model.cpu_gemv import GemvKernel, gemv_kernel
from superinfer.model.cpu_q4 import q4_kernel
from superinfer.model.gemv_linear import GemvLinear
from superinfer.model.moe import MoE
from superinfer.model.quant import (
    INT4_TYPES,
    Q6_K,
    Int4Linear,
    Q6KLinear,
    _q8_0_split,
    int4_linear,
    q6_k_row_parts,
    rows_planes,
)

Q8_0 = GGMLQuantizationType.Q8_0
# a projection: one Int4Linear, Q6KLinear or GemvLinear per expert, or the experts' stacked float
# weights (E, N, K)
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


def quantized_expert_tensors(
    tensors: Mapping[str, ReaderTensor], config: ModelConfig, has_gemv: bool
) -> set[str]:
    """The stacked expert tensors that `quantize_experts` keeps quantized: a projection's
    when all its tensors are Q4_0, Q4_1, Q8_0 or Q4_K of one plane width (as
    `quant.swap_int4_linears` requires of a fused layer), or, where the few-row GEMV and the
    GEMM run (`has_gemv`), all Q6_K."""
    names: set[str] = set()
    for layer in range(config.num_layers):
        if not config.is_moe_layer(layer):
            continue
        for parts in expert_tensor_names(layer).values():
            if _quantizable([tensors.get(name) for name in parts], has_gemv):
                names.update(parts)
    return names


def _quantizable(found: list[ReaderTensor | None], has_gemv: bool) -> bool:
    if any(t is None for t in found):
        return False
    kinds = {t.tensor_type for t in found}
    if kinds == {Q6_K}:
        return has_gemv
    return kinds <= INT4_TYPES.keys() and (Q8_0 not in kinds or len(kinds) == 1)  # one width


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
    the Experts' parameter, to be allocated and loaded as before. Q6_K projections run on
    Q6_K's own layout (`Q6KLinear`), Q8_0 ones unless `is_w4a8` on the few-row GEMV's
    8-bit layout where it runs (`GemvLinear`); the others on the kernels `max_int4_rows`
    and `is_w4a8` choose for the dense layers (`quant.swap_int4_linears`)."""
    gemv = gemv_kernel()
    num_swapped = 0
    for layer, block in enumerate(model.model.layers):
        if not isinstance(block.mlp, MoE):
            continue
        experts, projections = block.mlp.experts, {}
        for attr, parts in expert_tensor_names(layer).items():
            projections[attr] = getattr(experts, attr)
            if all(name in names for name in parts):
                stacked = [tensors[name] for name in parts]
                kinds = {t.tensor_type for t in stacked}
                if kinds == {Q6_K}:  # only where both kernels run (`has_gemv`)
                    projections[attr] = _q6k_linears(stacked, gemv)
                elif gemv is not None and kinds == {Q8_0} and not is_w4a8:
                    projections[attr] = _gemv_linears(stacked, gemv)
                else:
                    projections[attr] = _expert_linears(stacked, max_int4_rows, is_w4a8)
        if any(isinstance(p, nn.ModuleList) for p in projections.values()):
            block.mlp.experts = QuantExperts(**projections)
            num_swapped += 1
    return num_swapped


def _stacked_rows(stacked: list[ReaderTensor]) -> list[np.ndarray]:
    """Each tensor's raw blocks as (experts, rows, row bytes)."""
    return [np.asarray(t.data).reshape(int(t.shape[-1]), int(t.shape[-2]), -1) for t in stacked]


def _expert_linears(
    stacked: list[ReaderTensor], max_int4_rows: int | None, is_w4a8: bool
) -> nn.ModuleList:
    """One Int4Linear per expert over its rows of `stacked` (concatenated in order)."""
    raws = _stacked_rows(stacked)
    in_features = int(stacked[0].shape[0])
    linears: list[Int4Linear] = []
    for expert in range(raws[0].shape[0]):
        parts = [rows_planes(raw[expert], t.tensor_type) for raw, t in zip(raws, stacked)]
        planes = tuple(torch.cat([p[i] for p in parts]) for i in range(3))
        linears.append(int4_linear(planes, in_features, max_int4_rows, is_w4a8))
    return nn.ModuleList(linears)


def _q6k_linears(stacked: list[ReaderTensor], kernel: GemvKernel) -> nn.ModuleList:
    """One Q6KLinear per expert over its rows of `stacked` (all Q6_K, concatenated in
    order)."""
    raws, gemm = _stacked_rows(stacked), q4_kernel()
    linears: list[Q6KLinear] = []
    for expert in range(raws[0].shape[0]):
        parts = [q6_k_row_parts(raw[expert]) for raw in raws]
        values, sc, d = (torch.cat([p[i] for p in parts]) for i in range(3))
        linears.append(Q6KLinear(kernel, gemm, kernel.pack_q6_k(values, sc, d), GEMV_MAX_ROWS))
    return nn.ModuleList(linears)


def _gemv_linears(stacked: list[ReaderTensor], kernel: GemvKernel) -> nn.ModuleList:
    """One GemvLinear per expert over its rows of `stacked` (all Q8_0, concatenated in
    order)."""
    raws = _stacked_rows(stacked)
    linears: list[GemvLinear] = []
    for expert in range(raws[0].shape[0]):
        parts = [_q8_0_rows(raw[expert]) for raw in raws]
        values, scales = (torch.cat([p[i] for p in parts]) for i in range(2))
        linears.append(GemvLinear(kernel, kernel.pack_q8(values, scales)))
    return nn.ModuleList(linears)


def _q8_0_rows(raw: np.ndarray) -> tuple[Tensor, Tensor]:
    """(values (N, K) int8, scales float32 per 32) of rows (N, row bytes) of Q8_0 blocks:
    w = value scale, as gguf dequantizes them."""
    scales, blocks = _q8_0_split(raw)
    values = np.ascontiguousarray(blocks).view(np.int8).reshape(raw.shape[0], -1)
    return torch.from_numpy(values), torch.from_numpy(scales)
