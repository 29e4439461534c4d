"""GGUF Q4_0, Q4_1, Q8_0 and Q4_K weights kept quantized on the CPU, multiplied by PyTorch's own
int4 weight-only kernel (`aten._weight_int4pack_mm_for_cpu`, bfloat16 activations), and Q6_K
weights multiplied by the few-row GEMV of `cpu_gemv` (below).

The kernel computes w = (q - 8) * scale + zero for 4-bit q with one (scale, zero) per group
of 32 inputs, which is GGUF's block of 32, so the blocks convert exactly (their fp16 scales
are then rounded to bfloat16, the kernel's dtype):

- Q4_0: w = d (q - 8): scale d, zero 0;
- Q4_1: w = d q + m: scale d, zero m + 8 d;
- Q8_0: w = d q8, q8 = q + 128 - 128 split into nibbles q + 128 = 16 hi + lo:
  w = (lo - 8) d + 8 d + (hi - 8) 16 d, two 4-bit planes side by side along the inputs
  (the input is repeated once), the same bytes as the int8 values;
- Q4_K: super-blocks of 256 with fp16 d and dmin, and per block of 32 a 6-bit scale sc and
  min m: w = d sc q - dmin m, so scale d sc, zero 8 d sc - dmin m.

Q6_K (super-blocks of 256, fp16 d, an int8 scale sc per block of 16, 6-bit q: w = d sc
(q - 32)) does not fit the groups of 32. Its layers (`Q6KLinear`: Q4_K_M files hold
lm_head and some layers' ffn_down and attn_v as Q6_K) are held in Q6_K's own bits (6.625 a
weight: `q6_k_parts`, `pack_q6_k`) and run steps of a few rows on the GEMV of `cpu_gemv`
(each 16 inputs scaled by the float32 d sc, exact), larger steps on the GEMM of `cpu_q4`
(the weights rounded to bfloat16, as a dense copy held them); a Q6_K token embedding
(`Q6KEmbedding`) looks its rows up in the same bits. Where those kernels cannot run, and
under `gguf-w4a8`, they stay dense (dequantized at load).

Fused projections (q/k/v, gate/up) concatenate their GGUF tensors' rows, which is exact. A
fused layer whose parts differ in type (Q4_K q/k with a Q6_K v, as llama.cpp's Q4_K_M
writes about half its layers; 4-bit parts with a Q8_0 one) runs, where the GEMV runs (not
under `gguf-w4a8`), each part on its own kernels (`quant_parts.MixedLinear`); elsewhere,
or with a part of another type, it stays dense.

Under `auto`, steps of a few rows run the few-row GEMV of `cpu_gemv` where it runs (the
same function of the same weights, faster; the int4 kernel's copy is then freed). Steps of
more rows than that (prefill, batched decode) run, for the 4-bit layers, the 4-bit GEMM of
`cpu_q4` on the same weights, and for Q8_0 layers (and where that kernel cannot run) on a
dense copy of the weights. Under `--quantization
gguf-w4a8` every step of the 4-bit and Q8_0 layers runs the GEMM of `cpu_w4a8` instead
(llama.cpp's arithmetic: activations rounded to 8 bits per block of 32).

What runs quantized: the linear layers (q/k/v, o, gate/up, down, lm_head) whose tensors
are all of these types (`quantize_linears`; mixed ones part by part, above), the token
embedding (`Q8Embedding`, `Q6KEmbedding`, or, for the other quantized types,
`gguf_embedding.GGUFEmbedding`), and a mixture of experts' stacked expert tensors (`quant_moe`, one layer per expert and projection, never a dense copy: `int4_linear` on
these kernels, `Q6KLinear` for Q6_K experts, or, for Q8_0 experts where the GEMV runs,
`gemv_linear`). The loader swaps them in before the model's parameters are allocated: the
GGUF tensors they take (`quantized_linear_tensors`) are never dequantized, nor their dense
layers allocated.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import numpy as np
import torch
from gguf import GGMLQuantizationType, ReaderTensor
from gguf.quants import Q4_K
from torch import Tensor, nn

from superinfer.model.config import ModelConfig
from superinfer.model.cpu_gemv import MAX_ROWS as GEMV_MAX_ROWS
from superinfer.model.cpu_gemv import GemvKernel, Q6KWeights, Q8Weights, gemv_kernel
from superinfer.model.cpu_kernels import KernelCall
from superinfer.model.cpu_q4 import Q4Kernel, Q4Weights, Q8Gemm, q4_kernel
from superinfer.model.cpu_w4a8 import W4A8Kernel, W4A8Weights, w4a8_kernel
from superinfer.model.gemv_linear import GemvLinear
from superinfer.model.gguf_checkpoint import float_tensor
from superinfer.model.gguf_embedding import FLOAT_TYPES, GGUFEmbedding
from superinfer.model.weights import interleave_rope_rows

GROUP = 32
# measured on the default model (benchmarks/int4_rows.py): the int4 lm_head is faster at
# 1-2 rows (2.0 against 2.6 ms at 1), the dense one from 3 (2.6 against 4.3 ms at 4)
LM_HEAD_MAX_INT4_ROWS = 2
# the GEMV's lm_head (Q8_0) is faster up to 4 rows (1.2 against 1.8 ms at 4), the dense
# one from 6 (2.1 against 2.4 ms; docs/results/models/gemv_1205/)
LM_HEAD_GEMV_MAX_ROWS = 4
# where the 4-bit GEMM runs on AMX (cpu_q4), it beats the GEMV from 4 rows on the default
# model's layers (7.8 against 9.6 ms at 4, 8.1 against 17.5 at 8; they tie at 3, 8.2 ms:
# docs/results/models/amx_1206/)
AMX_GEMV_MAX_ROWS = 3
_DEQUANT_ROWS = 4096
Q6_K = GGMLQuantizationType.Q6_K
INT4_TYPES = {  # run as the int4 kernel's planes (`int4_planes`)
    GGMLQuantizationType.Q4_0: "Q4_0",
    GGMLQuantizationType.Q4_1: "Q4_1",
    GGMLQuantizationType.Q8_0: "Q8_0",
    GGMLQuantizationType.Q4_K: "Q4_K",
}
QUANT_TYPES = {**INT4_TYPES, Q6_K: "Q6_K"}  # Q6_K: on the GEMV only (`Q6KLinear`)
Planes = tuple[Tensor, Tensor, Tensor]  # nibbles (N, K'), scales and zeros (N, K' / 32)


def int4_kernel_available() -> bool:
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")


def gguf_kernels(is_w4a8: bool) -> str:
    """What runs a GGUF's quantized layers here, for the startup log."""
    if is_w4a8:
        return "8-bit activations (gguf-w4a8: csrc/q4_q8_linear.c)"
    if has_gguf_kernels():
        q4 = q4_kernel()
        gemm, q8 = "its GEMM beyond", "Q8_0 layers: a dense copy beyond"
        if q4 is not None and q4.use_amx():
            gemm = f"its GEMM on AMX beyond (4-bit layers: beyond {AMX_GEMV_MAX_ROWS})"
            q8 = "Q8_0 layers too"
        return (f"superinfer's GEMV for steps of up to {GEMV_MAX_ROWS} rows and {gemm}, on the "
                f"GGUF blocks (csrc/q_gemv.c, csrc/q4_linear.c; {q8})")  # fmt: skip
    return "PyTorch's int4 kernel, dense copies for larger steps (no AVX-512 BF16 here)"


class Int4Linear(nn.Module):
    """A frozen linear layer over 4-bit planes (see the module docstring); no bias."""

    def __init__(
        self,
        nibbles: Tensor,
        scales: Tensor,
        zeros: Tensor,
        in_features: int,
        bias: Tensor | None = None,
    ) -> None:
        """nibbles (N, K') integers in 0..15; scales, zeros (N, K' / 32) float32; K' is
        `in_features` (Q4) or twice it (Q8_0 planes)."""
        super().__init__()
        self.bias = bias
        self.dense: nn.Module | None = None  # see `keep_dense`
        self.q4: Q4Weights | Q8Gemm | W4A8Weights | None = None  # see `keep_q4`
        self.gemv: GemvKernel | None = None  # see `keep_gemv`
        self.gemv_weights: Q4Weights | Q8Weights | None = None
        self.max_int4_rows = sys.maxsize  # a plain attribute: read on every call
        self.in_features, self.out_features = in_features, nibbles.shape[0]
        self.num_planes = nibbles.shape[1] // in_features
        int32 = nibbles.to(torch.int32)  # what the packing op takes: 4 bytes a weight
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(int32, 1)
        del int32
        # copied into the int32 copy's freed space: made while that lived, the packed bytes
        # sat above it in glibc's heap, and a model of many such layers (a MoE's experts)
        # kept a hole per layer (a 4-layer, 32-expert Q4_0 MoE under `gguf`: 1044 MB
        # resident after loading, 588 MB with the copy)
        self.packed = packed.clone()
        del packed
        sz = torch.stack([scales.t(), zeros.t()], -1)  # (K' / 32, N, 2)
        self.scales_zeros = sz.to(torch.bfloat16).contiguous()

    def dequantized(
        self, nibbles: Tensor, scales: Tensor, zeros: Tensor, dtype: torch.dtype
    ) -> Tensor:
        """(N, in_features) in `dtype`: the weights this layer multiplies by
        (`dequantize_planes` of its planes)."""
        return dequantize_planes((nibbles, scales, zeros), self.in_features, dtype)

    def keep_dense(self, linear: nn.Linear, max_int4_rows: int) -> None:
        """Run steps of more than `max_int4_rows` rows (prefill chunks, large batches) on
        `linear`, a dense layer (holding the `dequantized` weights): the int4 kernel reads
        fewer bytes, which wins while a step is bound by reading the weights (decode), and
        loses to a dense GEMM beyond a few rows (benchmarks/int4_rows.py: faster up to 8
        rows on the default model, 1.8x slower at 32)."""
        self.dense, self.max_int4_rows = linear, max_int4_rows

    def keep_q4(self, weights: Q4Weights | Q8Gemm | W4A8Weights, max_int4_rows: int) -> None:
        """Run steps of more than `max_int4_rows` rows on the 4-bit GEMM (`cpu_q4`; its
        Q8_0 form for Q8_0 planes; or `cpu_w4a8`'s with 8-bit activations) over `weights`,
        this layer's own packed for it: no dense copy. At 0, every step does, and the int4
        kernel's copy is freed."""
        self.q4, self.max_int4_rows = weights, max_int4_rows
        if max_int4_rows == 0:  # every step, an empty one too
            self.packed = self.scales_zeros = None
            self.max_int4_rows = -1

    def keep_gemv(self, kernel: GemvKernel, weights: Q4Weights | Q8Weights) -> None:
        """Run steps of up to `max_int4_rows` rows (at most `cpu_gemv.MAX_ROWS`) on the
        few-row GEMV of `cpu_gemv` over `weights` (this layer's, bias included) instead of
        the int4 kernel, whose copy is freed. Call it after `keep_q4` or `keep_dense`."""
        if self.max_int4_rows > GEMV_MAX_ROWS:
            raise ValueError(f"the GEMV takes at most {GEMV_MAX_ROWS} rows")
        self.gemv, self.gemv_weights = kernel, weights
        self.packed = self.scales_zeros = None

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[0] > self.max_int4_rows:  # only once `keep_dense` or `keep_q4` ran
            if self.q4 is None:
                return self.dense(x)
            y = self.q4(x if x.dtype == torch.bfloat16 else x.to(torch.bfloat16))
            return y if y.dtype == x.dtype else y.to(x.dtype)
        dtype = x.dtype  # conversions only where needed: a decode step makes 120 calls
        if dtype != torch.bfloat16:
            x = x.to(torch.bfloat16)
        if self.gemv is not None:
            y = self.gemv(x, self.gemv_weights)
            return y if dtype == torch.bfloat16 else y.to(dtype)
        if self.num_planes == 2:
            x = torch.cat([x, x], -1)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, GROUP, self.scales_zeros)
        if dtype != torch.bfloat16:
            y = y.to(dtype)
        return y if self.bias is None else y.add_(self.bias)

    def kernel_call(self, num_rows: int) -> KernelCall | None:
        """The C call `forward` makes for a step of `num_rows` bfloat16 rows, or None where
        that step runs PyTorch (the int4 kernel, a dense copy)."""
        if num_rows > self.max_int4_rows:
            return None if self.q4 is None else self.q4.kernel_call()
        return None if self.gemv is None else self.gemv.call_for(self.gemv_weights)

    def extra_repr(self) -> str:
        small = "GEMV" if self.gemv is not None else "int4"
        more = ", 4-bit GEMM" if self.q4 is not None else ", dense" if self.dense else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, {small}{more}"


def dequantize_planes(planes: Planes, in_features: int, dtype: torch.dtype) -> Tensor:
    """(N, in_features) in `dtype`: the weights of 4-bit planes, with the scales and zeros
    rounded to bfloat16 as the int4 kernel, the 4-bit GEMM and the GEMV hold them (planes
    summed; in float32, a few thousand rows at a time, then rounded once)."""
    nibbles, scales, zeros = planes
    num_out, groups = nibbles.shape[0], nibbles.shape[1] // GROUP
    out = torch.empty(num_out, in_features, dtype=dtype)
    for start in range(0, num_out, _DEQUANT_ROWS):
        rows = slice(start, start + _DEQUANT_ROWS)
        s = scales[rows].to(torch.bfloat16).float().unsqueeze(-1)  # (n, groups, 1)
        z = zeros[rows].to(torch.bfloat16).float().unsqueeze(-1)
        w = nibbles[rows].float().view(-1, groups, GROUP).sub_(8).mul_(s).add_(z)
        out[rows] = w.view(-1, nibbles.shape[1] // in_features, in_features).sum(1)
    return out


class Q6KLinear(GemvLinear):
    """A frozen linear layer over GGUF Q6_K weights in Q6_K's own layout (`q6_k_parts` packed
    by `GemvKernel.pack_q6_k`, 6.625 bits a weight, bias included): steps of up to
    `max_gemv_rows` rows run the few-row GEMV of `cpu_gemv` (exact weights), larger steps
    the GEMM of `cpu_q4` (`Q4Kernel.linear_q6k`: the weights rounded to bfloat16, as a dense
    copy held them). No dense copy is kept."""

    def __init__(
        self, gemv: GemvKernel, gemm: Q4Kernel, weights: Q6KWeights, max_gemv_rows: int
    ) -> None:
        super().__init__(gemv, weights, max_gemv_rows)
        self.gemm = gemm

    def larger_step(self, x: Tensor) -> Tensor:
        return self.gemm.linear_q6k(x, self.weights)

    def kernel_call(self, num_rows: int) -> KernelCall | None:
        if num_rows <= self.max_gemv_rows:
            return self.gemv.call_for(self.weights)
        return self.gemm.call_for(self.weights)


class Q6KEmbedding(nn.Module):
    """A frozen embedding table kept as Q6_K weights in Q6_K's own layout (those of a tied
    lm_head's Q6KLinear where there is one): a lookup dequantizes only the rows it reads
    (`Q4Kernel.q6k_rows`), to the values the dense table would hold (d sc (q - 32) in float,
    rounded to `dtype`), in 0.41x the memory of a bfloat16 table."""

    def __init__(self, gemm: Q4Kernel, weights: Q6KWeights, dtype: torch.dtype) -> None:
        super().__init__()
        self.gemm, self.weights, self.dtype = gemm, weights, dtype
        self.num_embeddings, self.embedding_dim = weights.num_out, weights.num_in

    def forward(self, ids: Tensor) -> Tensor:
        return self.gemm.q6k_rows(self.weights, ids).to(self.dtype)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, Q6_K"


class Q8Embedding(nn.Module):
    """A frozen embedding table kept as its GGUF Q8_0 blocks (int8 values, one scale per 32):
    a lookup dequantizes only the rows it reads, to the values the dense table would hold
    (the float32 product d * q, rounded to `dtype`), in about half the memory (bfloat16)."""

    def __init__(self, tensor: ReaderTensor, dtype: torch.dtype) -> None:
        super().__init__()
        scales, blocks = q8_0_blocks(tensor)
        values = np.ascontiguousarray(blocks).view(np.int8).reshape(blocks.shape[0], -1)
        self.register_buffer("values", torch.from_numpy(values), persistent=False)  # (V, C)
        self.register_buffer("scales", torch.from_numpy(scales), persistent=False)  # (V, C/32)
        self.num_embeddings, self.embedding_dim = values.shape
        self.dtype = dtype

    def forward(self, ids: Tensor) -> Tensor:
        q = self.values[ids].unflatten(-1, (-1, GROUP)).float()  # (T, C/32, 32)
        return q.mul_(self.scales[ids].unsqueeze(-1)).flatten(-2).to(self.dtype)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, Q8_0"


def quantize_embedding(model: nn.Module, tensors: dict[str, ReaderTensor]) -> bool:
    """Swap the model's token embedding for a Q8Embedding when the GGUF table is Q8_0, a
    Q6KEmbedding when it is Q6_K and the Q6_K kernels run here (sharing a tied lm_head's
    Q6KLinear weights), else a GGUFEmbedding when it is of another quantized type (Q4_K_M
    files' untied Q4_K tables); returns whether it did. Call it after `quantize_linears`, before
    the parameters are allocated where `quantized_linear_tensors` names token_embd.weight,
    else after loading: a tied lm_head that stayed dense then keeps its own reference to
    the dense weight."""
    tensor = tensors.get("token_embd.weight")
    if tensor is None or not _swaps_embedding(tensor):
        return False
    if tensor.tensor_type == GGMLQuantizationType.Q8_0:
        model.model.embed_tokens = Q8Embedding(tensor, model.dtype)
        return True
    if not has_gguf_kernels() or tensor.tensor_type != Q6_K:
        model.model.embed_tokens = GGUFEmbedding(tensor, model.dtype)
        return True
    head = model.lm_head
    if "output.weight" not in tensors and isinstance(head, Q6KLinear):
        weights = head.weights  # tied: the same Q6_K rows
    else:
        weights = gemv_kernel().pack_q6_k(*q6_k_parts(tensor))
    model.model.embed_tokens = Q6KEmbedding(q4_kernel(), weights, model.dtype)
    return True


def _swaps_embedding(table: ReaderTensor) -> bool:
    """Whether `quantize_embedding` keeps a token embedding of this GGUF tensor quantized."""
    return table.tensor_type not in FLOAT_TYPES


def has_gguf_kernels() -> bool:
    """Whether superinfer's GEMV and GEMM over GGUF blocks run here (AVX-512 BF16): what
    Q6_K layers, embeddings and experts need."""
    return gemv_kernel() is not None and q4_kernel() is not None


def q8_0_blocks(tensor: ReaderTensor) -> tuple[np.ndarray, np.ndarray]:
    """A Q8_0 tensor's (scales (N, nb) float32, values (N, nb, 32) uint8 holding int8
    bits): each block of 32 is an fp16 scale then 32 int8 values."""
    return _q8_0_split(np.asarray(tensor.data).reshape(int(tensor.shape[-1]), -1))


def _q8_0_split(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`q8_0_blocks` of Q8_0 rows (N, row bytes)."""
    blocks = raw.reshape(raw.shape[0], -1, 34)
    return blocks[..., :2].copy().view(np.float16)[..., 0].astype(np.float32), blocks[..., 2:]


def int4_planes(tensor: ReaderTensor) -> Planes:
    """(nibbles (N, K') uint8, scales and zeros (N, K'/32) float32) of a Q4_0, Q4_1, Q8_0
    or Q4_K matrix."""
    raw = np.asarray(tensor.data).reshape(int(tensor.shape[-1]), -1)
    return rows_planes(raw, tensor.tensor_type)


def rows_planes(raw: np.ndarray, kind: GGMLQuantizationType) -> Planes:
    """`int4_planes` of rows (N, row bytes) of GGUF blocks of type `kind`: a matrix, or
    one expert's of a stacked (experts, rows, columns) tensor."""
    num_rows = raw.shape[0]
    if kind == GGMLQuantizationType.Q4_K:
        return _q4_k_planes(raw)
    if kind == GGMLQuantizationType.Q8_0:
        d, values = _q8_0_split(raw)
        u = values ^ np.uint8(0x80)  # q + 128 as uint8, (N, nb, 32)
        lo, hi = u & 15, u >> 4
        nibbles = np.concatenate([lo.reshape(num_rows, -1), hi.reshape(num_rows, -1)], 1)
        scales = np.concatenate([d, 16 * d], 1)
        zeros = np.concatenate([8 * d, np.zeros_like(d)], 1)
    else:
        width = 18 if kind == GGMLQuantizationType.Q4_0 else 20
        blocks = raw.reshape(num_rows, -1, width)
        d = blocks[..., :2].copy().view(np.float16)[..., 0].astype(np.float32)
        qs = blocks[..., width - 16 :]  # (N, nb, 16) uint8
        nibbles = np.concatenate([qs & 15, qs >> 4], -1).reshape(num_rows, -1)
        if kind == GGMLQuantizationType.Q4_0:
            scales, zeros = d, np.zeros_like(d)
        else:
            m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
            scales, zeros = d, m + 8 * d
    return tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in (nibbles, scales, zeros))


def q6_k_parts(tensor: ReaderTensor) -> tuple[Tensor, Tensor, Tensor]:
    """(values (N, K) int8 in -32..31, sc (N, K / 16) int8, d (N, K / 256) float32) of a
    Q6_K tensor: gguf dequantizes weight k of a row to (d sc) value in float32. Its rows are
    210-byte super-blocks of 256 weights: 128 bytes of low nibbles (ql), 64 of high bit pairs
    (qh), 16 int8 scales sc and an fp16 d. In each half h of 128 weights, weight 32 i + j
    (i in 0..3) has its low 4 bits in nibble i // 2 of ql[64 h + 32 (i % 2) + j], its high 2
    in bits 2 i of qh[32 h + j]."""
    return q6_k_row_parts(np.asarray(tensor.data).reshape(int(tensor.shape[-1]), -1))


def q6_k_row_parts(raw: np.ndarray) -> tuple[Tensor, Tensor, Tensor]:
    """`q6_k_parts` of rows (N, row bytes) of Q6_K super-blocks: a matrix, or one expert's
    of a stacked (experts, rows, columns) tensor."""
    num_rows = raw.shape[0]
    blocks = raw.reshape(-1, 210)
    ql = blocks[:, :128].reshape(-1, 2, 1, 64)
    low = np.concatenate([ql & 15, ql >> 4], 2).reshape(-1, 2, 128)
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    high = (blocks[:, 128:192].reshape(-1, 2, 1, 32) >> shifts) & 3  # (n, 2, 4, 32)
    values = (low | (high.reshape(-1, 2, 128) << 4)).view(np.int8) - np.int8(32)
    d = blocks[:, 208:].copy().view(np.float16).astype(np.float32)  # (n, 1)
    sc = blocks[:, 192:208].view(np.int8)
    out = (values.reshape(num_rows, -1), sc.reshape(num_rows, -1), d.reshape(num_rows, -1))
    return tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in out)


def _q4_k_planes(raw: np.ndarray) -> tuple[Tensor, Tensor, Tensor]:
    """`int4_planes` of a Q4_K tensor's rows of 144-byte super-blocks: fp16 d and dmin,
    12 bytes of 6-bit scales and mins (gguf's `Q4_K.get_scale_min` unpacks them), then 128
    bytes holding blocks 2i and 2i + 1 in the low and high nibbles of bytes 32i .. 32i + 31."""
    num_rows = raw.shape[0]
    blocks = raw.reshape(-1, 144)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)  # (n, 1)
    dmin = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    sc, m = Q4_K.get_scale_min(blocks[:, 4:16])  # (n, 8) each
    scales = d * sc.astype(np.float32)
    zeros = 8 * scales - dmin * m.astype(np.float32)
    qs = blocks[:, 16:].reshape(-1, 4, 1, 32)
    nibbles = np.concatenate([qs & 15, qs >> 4], 2)  # (n, 4 pairs, 2, 32)
    out = (nibbles.reshape(num_rows, -1), scales.reshape(num_rows, -1), zeros.reshape(num_rows, -1))
    return tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in out)


# module of each decoder layer -> its GGUF tensors, in the fused parameter's row order
_LAYER_SOURCES = {
    "self_attn.qkv_proj": ("attn_q", "attn_k", "attn_v"),
    "self_attn.o_proj": ("attn_output",),
    "mlp.gate_up_proj": ("ffn_gate", "ffn_up"),
    "mlp.down_proj": ("ffn_down",),
    "mlp.shared_expert.gate_up_proj": ("ffn_gate_shexp", "ffn_up_shexp"),  # Qwen2-MoE's
    "mlp.shared_expert.down_proj": ("ffn_down_shexp",),
}
# files whose projections llama.cpp keeps fused (Phi-3): q/k/v in one tensor, gate and up
# in `ffn_up`
_FUSED_LAYER_SOURCES = {**_LAYER_SOURCES, "self_attn.qkv_proj": ("attn_qkv",),
                        "mlp.gate_up_proj": ("ffn_up",)}  # fmt: skip


def quantized_linear_tensors(
    tensors: dict[str, ReaderTensor], config: ModelConfig, is_w4a8: bool = False
) -> set[str]:
    """The GGUF tensors that `quantize_linears` and `quantize_embedding`, run on the model
    before its parameters are allocated, hold quantized (the loader then leaves them out of
    the weights it dequantizes): the weights and biases of the layers `quantize_linears`
    swaps, and token_embd.weight where `quantize_embedding` swaps the embedding and no dense
    lm_head shares it (then the embedding is swapped after loading)."""
    layers = _quantized_layers(tensors, config, is_w4a8)
    names = {f"{stem}.{kind}" for stems in layers.values() for stem in stems[1]
             for kind in ("weight", "bias")} & tensors.keys()  # fmt: skip
    names.discard("token_embd.weight")  # a tied lm_head's: the embedding may still need it
    table = tensors.get("token_embd.weight")
    is_shared = "output.weight" not in tensors and "lm_head" not in layers  # by a dense head
    if table is not None and _swaps_embedding(table) and not is_shared:
        names.add("token_embd.weight")
    return names


def quantize_linears(
    model: nn.Module,
    tensors: dict[str, ReaderTensor],
    interleaved_qk: bool,
    max_int4_rows: int | None = None,
    is_w4a8: bool = False,
) -> list[str]:
    """Swap the model's linear layers whose GGUF tensors are all Q4_0, Q4_1, Q8_0 or Q4_K (the
    same planes' width) for Int4Linear (`swap_int4_linears`), those whose tensors are all
    Q6_K for Q6KLinear where the GEMV runs (`swap_q6_k_linears`; not under `is_w4a8`), and
    fused ones whose tensors mix these types for MixedLinear, there too
    (`quant_parts.swap_mixed_linears`); returns the names swapped.

    Call it on the model before its parameters are allocated (on the meta device): the
    swapped layers' weights are then never allocated dense, and their biases are read
    from the GGUF file (`quantized_linear_tensors` names both). On a loaded model it swaps
    the same layers, keeping their loaded biases."""
    from superinfer.model.quant_parts import swap_mixed_linears  # builds on this module

    gemv = _layer_gemv(is_w4a8)
    rows = GEMV_MAX_ROWS if max_int4_rows is None else min(max_int4_rows, GEMV_MAX_ROWS)
    swaps = {  # kind of layer -> (how its tensors unpack, the swap)
        "int4": (int4_planes, lambda m, v: swap_int4_linears(m, v, interleaved_qk,
                                                             max_int4_rows, is_w4a8)),
        "q6_k": (q6_k_parts, lambda m, v: swap_q6_k_linears(m, v, interleaved_qk, gemv, rows)),
        "mixed": (typed_values, lambda m, v: swap_mixed_linears(m, v, interleaved_qk, gemv,
                                                                rows)),
    }  # fmt: skip
    swapped = []
    for name, (kind, stems) in _quantized_layers(tensors, model.config, is_w4a8).items():
        unpack, swap = swaps[kind]  # one layer at a time: its unpacked values then go
        values = [unpack(tensors[f"{stem}.weight"]) for stem in stems]
        if len(stems) == 1 and name.endswith(("qkv_proj", "gate_up_proj")):  # fused file
            values = _split_rows(values[0], _part_rows(model.config, name))
        _load_bias(model, name, stems, tensors, interleaved_qk)
        swapped += swap(model, {name: values})
    return swapped


def _layer_gemv(is_w4a8: bool) -> GemvKernel | None:
    """The GEMV of the Q6_K and mixed layers: they need both kernels, the GEMV for a few
    rows, the GEMM for more."""
    return gemv_kernel() if not is_w4a8 and has_gguf_kernels() else None


def _quantized_layers(
    tensors: dict[str, ReaderTensor], config: ModelConfig, is_w4a8: bool
) -> dict[str, tuple[str, tuple[str, ...]]]:
    """The linear layers `quantize_linears` swaps: name -> (kind of swap, its GGUF tensors'
    stems in the fused parameter's row order)."""
    is_fused = "blk.0.attn_qkv.weight" in tensors
    sources = {"lm_head": ("output" if "output.weight" in tensors else "token_embd",)}
    for i in range(config.num_layers):
        for module, parts in (_FUSED_LAYER_SOURCES if is_fused else _LAYER_SOURCES).items():
            sources[f"model.layers.{i}.{module}"] = tuple(f"blk.{i}.{p}" for p in parts)
    has_gemv = _layer_gemv(is_w4a8) is not None
    layers = {}
    for name, stems in sources.items():
        found = [tensors.get(f"{stem}.weight") for stem in stems]
        if any(t is None for t in found):
            continue
        kinds = {t.tensor_type for t in found}
        if kinds <= INT4_TYPES.keys() and not _mixes_widths(kinds):
            layers[name] = ("int4", stems)
        elif kinds == {Q6_K} and has_gemv:
            layers[name] = ("q6_k", stems)
        elif len(kinds) > 1 and kinds <= QUANT_TYPES.keys() and has_gemv:
            layers[name] = ("mixed", stems)
    return layers


def _load_bias(
    model: nn.Module,
    name: str,
    stems: tuple[str, ...],
    tensors: dict[str, ReaderTensor],
    interleaved_qk: bool,
) -> None:
    """Give layer `name`, if its bias is not allocated yet, the bias of its GGUF tensors
    as `load_hf_weights` would have loaded it (q/k rows in RoPE order, in the model's
    dtype): the swaps read `linear.bias`."""
    linear = model.get_submodule(name)
    if linear.bias is None or not linear.bias.is_meta:
        return
    parts = [float_tensor(tensors[f"{stem}.bias"]) for stem in stems]
    parts = rope_ordered(name, parts, interleaved_qk,
                         lambda b: interleave_rope_rows(b, model.config.head_dim,
                                                         model.config.rotary_dim))  # fmt: skip
    bias = torch.cat(parts).to(linear.bias.dtype)
    linear.bias = nn.Parameter(bias, requires_grad=False)


def _mixes_widths(kinds: set[GGMLQuantizationType]) -> bool:
    """Whether 4-bit and Q8_0 parts (one plane and two) share a layer."""
    return GGMLQuantizationType.Q8_0 in kinds and len(kinds) > 1


def typed_values(tensor: ReaderTensor) -> tuple[GGMLQuantizationType, tuple[Tensor, ...]]:
    """A tensor's type and its `q6_k_parts` (Q6_K) or `int4_planes` (the other types)."""
    kind = tensor.tensor_type
    return kind, q6_k_parts(tensor) if kind == Q6_K else int4_planes(tensor)


def _part_rows(config: ModelConfig, name: str) -> list[int]:
    """The rows of each part of a fused projection: q, k, v or gate, up."""
    if name.endswith("qkv_proj"):
        kv_rows = config.num_kv_heads * config.head_dim
        return [config.num_heads * config.head_dim, kv_rows, kv_rows]
    return [config.intermediate_size] * 2


def _split_rows(planes: tuple[Tensor, ...], sizes: list[int]) -> list[tuple[Tensor, ...]]:
    """One fused tensor's planes (or Q6_K values, sc and d) as its parts' (so q/k rows can
    be reordered for RoPE)."""
    return [tuple(parts) for parts in zip(*(p.split(sizes) for p in planes))]


def swap_int4_linears(
    model: nn.Module,
    planes: dict[str, list[Planes]],
    interleaved_qk: bool,
    max_int4_rows: int | None = None,
    is_w4a8: bool = False,
) -> list[str]:
    """Swap each linear layer named in `planes` for an Int4Linear over its parts' planes
    (q/k/v or gate/up concatenated by rows, as the fused parameter holds them; q/k rows
    reordered for RoPE unless `interleaved_qk`); returns the names swapped. A layer whose
    parts differ in width (Q4 and Q8_0 planes) is left as it is.

    With `max_int4_rows`, larger steps run a 4-bit layer on the 4-bit GEMM
    (`Int4Linear.keep_q4`) where it runs here, other layers on a dense copy
    (`Int4Linear.keep_dense`). The 4-bit GEMM is faster from 5 rows, but it rounds its
    weights to bfloat16 as the dense copy did, and the int4 kernel does not: keeping steps
    of up to 8 rows on the int4 kernel, as before, keeps short prefills and small batches on
    one kernel whether they run alone or together (a seeded request then samples the same
    tokens). Those steps run the few-row GEMV (`Int4Linear.keep_gemv`) where it runs here,
    which computes each row on its own. Where the 4-bit GEMM runs on AMX, it is faster
    than the GEMV from 4 rows, and 4-bit layers take it from there (AMX_GEMV_MAX_ROWS):
    there, only steps of up to 3 rows keep that property. lm_head leaves them sooner, after
    LM_HEAD_GEMV_MAX_ROWS (LM_HEAD_MAX_INT4_ROWS on the int4 kernel): on one (vocab,
    hidden) matrix oneDNN's bfloat16 GEMM reads at full bandwidth (benchmarks/int4_rows.py).
    Where the GEMM runs on AMX, Q8_0 layers (lm_head) take its Q8_0 form over the GEMV's
    8-bit weights instead of a dense copy: the same bfloat16 weights, 56 MB less on the
    default model's lm_head, within noise of the copy's time up to 32 rows and 1.5x it at
    64 (docs/results/models/amx_attention_1206/); on AVX-512 rows it was 2-4x slower, so
    the dense copy stays there. With `is_w4a8` (and `max_int4_rows`), the larger steps of
    every swapped layer (4-bit and Q8_0) run `cpu_w4a8`'s GEMM instead, which rounds their
    activations to 8 bits."""
    swapped = []
    for name, parts in planes.items():
        linear = model.get_submodule(name)
        if not isinstance(linear, nn.Linear) or len({p[0].shape[1] for p in parts}) != 1:
            continue  # Q4 and Q8_0 parts in one fused layer
        parts = rope_ordered(name, parts, interleaved_qk, lambda p: _interleave(p, model.config))
        fused = [torch.cat([p[i] for p in parts]) for i in range(3)]
        int4 = Int4Linear(*fused, linear.in_features, linear.bias)
        if max_int4_rows is not None:
            _keep_larger_steps(int4, name, linear, fused, max_int4_rows, is_w4a8)
        replace_module(model, name, int4)
        swapped.append(name)
    return swapped


def int4_linear(planes: Planes, in_features: int, max_int4_rows: int | None,
                is_w4a8: bool = False) -> Int4Linear:  # fmt: skip
    """An Int4Linear over `planes` (no bias) on the kernels `swap_int4_linears` gives a
    layer, except that it never keeps a dense copy: where a layer would (Q8_0 planes, or no
    4-bit GEMM here, under `max_int4_rows`), every step runs the int4 kernel. For weights
    kept quantized to save memory (the experts of `quant_moe`)."""
    int4 = Int4Linear(*planes, in_features)
    if max_int4_rows is not None:
        _keep_larger_steps(int4, "", None, list(planes), max_int4_rows, is_w4a8)
    return int4


def _keep_larger_steps(
    int4: Int4Linear,
    name: str,
    linear: nn.Linear | None,
    fused: list[Tensor],
    max_int4_rows: int,
    is_w4a8: bool,
) -> None:
    """The kernels of `swap_int4_linears`' hybrid: the larger steps compute with the int4
    kernel's weights (same rounded scales), so a request's tokens do not depend on how many
    rows shared its steps (is_w4a8: the loader passes 0, so that every step runs one kernel,
    row by row). Without `linear` (no dense copy allowed), a layer that would need one
    stays on the int4 kernel."""
    gemv = gemv_kernel() if not is_w4a8 and max_int4_rows <= GEMV_MAX_ROWS else None
    rows = max_int4_rows
    if name == "lm_head":
        rows = min(max_int4_rows, LM_HEAD_MAX_INT4_ROWS if gemv is None else LM_HEAD_GEMV_MAX_ROWS)
    if is_w4a8:  # 4-bit and Q8_0 layers alike
        weights = _w4a8_kernel().pack_planes(*fused, int4.in_features, int4.bias)
    else:
        q4, weights = q4_kernel(), None
        is_amx = q4 is not None and q4.use_amx()
        if q4 is not None and int4.num_planes == 1:
            weights = q4.pack(*fused, int4.bias)
        elif is_amx and gemv is not None:  # Q8_0: the GEMV's 8-bit weights, no dense copy
            q8 = gemv.pack_planes(fused[0], fused[1], int4.in_features, int4.bias)
            weights = Q8Gemm(q4, q8)
        if is_amx and int4.num_planes == 1:
            rows = min(rows, AMX_GEMV_MAX_ROWS)
    if weights is not None:
        int4.keep_q4(weights, rows)
    elif linear is None:
        return  # the int4 kernel's packed weights serve every step
    else:
        weight = int4.dequantized(*fused, linear.weight.dtype)
        int4.keep_dense(_dense_linear(weight, linear.bias), rows)
    if gemv is not None and rows > 0:
        if int4.num_planes == 1 and isinstance(weights, Q4Weights):
            int4.keep_gemv(gemv, weights)
        elif isinstance(weights, Q8Gemm):
            int4.keep_gemv(gemv, weights.weights)
        elif int4.num_planes == 2:
            int4.keep_gemv(gemv, gemv.pack_planes(fused[0], fused[1], int4.in_features,
                                                  int4.bias))  # fmt: skip


def _dense_linear(weight: Tensor, bias: Tensor | None) -> nn.Linear:
    """An nn.Linear holding `weight` and `bias`: a swapped layer's dense copy, never the
    layer it replaces (whose weight may not be allocated, or be a tied embedding's)."""
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
    linear.weight = nn.Parameter(weight, requires_grad=False)
    linear.bias = bias
    return linear


def swap_q6_k_linears(
    model: nn.Module,
    values: dict[str, list[tuple[Tensor, Tensor, Tensor]]],
    interleaved_qk: bool,
    kernel: GemvKernel,
    max_gemv_rows: int,
) -> list[str]:
    """Swap each linear layer named in `values` for a Q6KLinear over its parts' Q6_K values,
    sc and d (`q6_k_parts`; concatenated and reordered as `swap_int4_linears` does) that
    runs steps of up to `max_gemv_rows` rows on `kernel` and larger ones on `cpu_q4`'s GEMM;
    returns the names swapped. The dense layer goes (a tied embedding keeps its own until
    `quantize_embedding`). lm_head too takes the GEMV up to `max_gemv_rows`, not
    LM_HEAD_GEMV_MAX_ROWS: what it would run instead is the Q6_K GEMM, not a dense copy, and
    on Qwen3-0.6B's head the GEMV takes 0.81-0.83x its time at 5-8 rows
    (docs/results/models/q6k_scaled_1206/)."""
    swapped = []
    for name, parts in values.items():
        linear = model.get_submodule(name)
        if not isinstance(linear, nn.Linear) or max_gemv_rows < 1:
            continue
        parts = rope_ordered(name, parts, interleaved_qk, lambda p: _interleave(p, model.config))
        q, sc, d = (torch.cat([p[i] for p in parts]) for i in range(3))
        weights = kernel.pack_q6_k(q, sc, d, linear.bias)
        layer = Q6KLinear(kernel, q4_kernel(), weights, max_gemv_rows)
        replace_module(model, name, layer)
        swapped.append(name)
    return swapped


def rope_ordered(name: str, parts: list, interleaved_qk: bool, reorder: Callable) -> list:
    """The parts of layer `name`, its q and k parts (the first two of a `qkv_proj`) passed
    through `reorder` into the dense model's RoPE row order, unless the file already holds
    them that way (`interleaved_qk`)."""
    if interleaved_qk or not name.endswith("qkv_proj"):
        return list(parts)
    return [reorder(p) for p in parts[:2]] + list(parts[2:])


def replace_module(model: nn.Module, name: str, module: nn.Module) -> None:
    """Put `module` in the place of `model`'s submodule `name`."""
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent), child, module)


def _w4a8_kernel() -> W4A8Kernel:
    kernel = w4a8_kernel()
    if kernel is None:
        raise ValueError("--quantization gguf-w4a8 needs a CPU with AVX-512 VNNI and BF16 and "
                         "the CPU kernels built (see the log); use auto")  # fmt: skip
    return kernel


def _interleave(planes: tuple[Tensor, ...], config: ModelConfig) -> tuple[Tensor, ...]:
    """The row order `weights.interleave_rope_rows` gives the dense q/k projections."""
    rows = torch.arange(planes[0].shape[0])
    order = interleave_rope_rows(rows, config.head_dim, config.rotary_dim)
    return tuple(p[order] for p in planes)
