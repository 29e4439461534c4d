"""GGUF weights times the few rows of a decode step on the CPU (`csrc/q_gemv.c`), in
bfloat16 activations: what `--quantization auto` runs for steps of up to 8 rows.

A decode step of a few sequences is bound by reading the weights. PyTorch's int4 kernel
(`aten._weight_int4pack_mm_for_cpu`), which ran these steps before, dequantizes every
weight to float with its scale and zero; here each block's 4-bit values go to `vdpbf16ps`
as the small integers they are (exact in bfloat16), and the block's scale and zero are
applied once per row: sum w x = scale sum (q - 8) x + zero sum x. Q8_0 layers (the default
model's lm_head, tied to its Q8_0 embedding) multiply their 8-bit values in float, where
the int4 kernel ran them as two 4-bit planes. Q6_K layers (a scale per 16 inputs, which the
int4 kernels' groups of 32 cannot hold) read their own layout, 6.625 bits a weight
(`pack_q6_k`: 4-bit and 2-bit planes, int8 scales, a float d per 256 inputs), their values
turned into bfloat16 by a table lookup and multiplied as the 4-bit ones are, as are a MoE's
Q6_K experts (`quant.Q6KLinear`). A MoE's Q8_0 experts (`gemv_linear`) are held only in the
8-bit layout, which `unpack` writes back for larger steps. Over the default model's layers
(`benchmarks/int4_rows.py`, docs/results/models/gemv_1205/) that is 0.68x the int4
kernel's time at one row and 0.67x at 8, faster than the 4-bit GEMM up to 8 rows; lm_head
takes 0.59x at one row, and beats oneDNN's dense bfloat16 GEMM up to 4.

It computes the int4 kernel's function of the same weights (bfloat16 scales and zeros;
Q8_0 values times their scale), rounded in another order, and each row on its own. The
4-bit layers read the packed weights of `cpu_q4` (no copy of their own); Q8_0 layers read
`cpu_w4a8`'s 8-bit layout, packed here, Q6_K layers their own.
"""

from __future__ import annotations

import ctypes
import functools

import torch
from torch import Tensor

from superinfer.model.cpu_kernels import KernelCall, load_kernel
from superinfer.model.cpu_q4 import Q4Weights
from superinfer.model.cpu_w4a8 import pack_q8_blocks, q8_plane_values

_PTR, _INT, _I64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
MAX_ROWS = 8  # the most rows a call takes (q_gemv.c's MAX_ROWS)
BLOCK = 32
Q6K_SUPER = 256  # inputs of a Q6_K super-block: one d per column
Q6K_RECORD = 416  # bytes of a Q6_K record: 16 columns, 32 inputs (q_gemv.c)


class Q8Weights:
    """A Q8_0 layer in the 8-bit layout (`GemvKernel.pack_q8`): its int8 values and a float
    scale per 32 inputs, and its bias."""

    def __init__(self, packed: Tensor, scales: Tensor, num_out: int, num_in: int,
                 bias: Tensor | None) -> None:  # fmt: skip
        self.packed, self.scales, self.num_out, self.num_in = packed, scales, num_out, num_in
        self.bias = None if bias is None else bias.detach().float().contiguous()


class Q6KWeights:
    """A Q6_K layer in its own layout (`GemvKernel.pack_q6_k`, 6.625 bits a weight): per
    16 columns and 32 inputs a record of the 6-bit values' planes and int8 scales `packed`,
    per 256 inputs the 16 columns' float `d`; and its bias."""

    def __init__(self, packed: Tensor, d: Tensor, num_out: int, num_in: int,
                 bias: Tensor | None) -> None:  # fmt: skip
        self.packed, self.d, self.num_out, self.num_in = packed, d, num_out, num_in
        self.bias = None if bias is None else bias.detach().float().contiguous()


class GemvKernel:
    """The loaded `q4_gemv`, `q8_gemv`, `q6k_gemv`, `pack_q8_q8`, `pack_q6_k` and
    `unpack_q8_bf16`."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._q4, self._q8, self._q6k = library.q4_gemv, library.q8_gemv, library.q6k_gemv
        for fn in (self._q4, self._q8, self._q6k):
            fn.restype = _INT
            fn.argtypes = [_PTR, _I64, _I64, _I64, _PTR, _PTR, _PTR, _PTR, _I64, _INT]
        self._pack_q6k = library.pack_q6_k
        self._pack_q6k.restype = None
        self._pack_q6k.argtypes = [_PTR, _PTR, _PTR, _I64, _I64, _PTR, _PTR]
        self._pack_q8 = library.pack_q8_q8
        self._pack_q8.restype = None
        self._pack_q8.argtypes = [_PTR, _PTR, _I64, _I64, _PTR, _PTR]
        self._unpack = library.unpack_q8_bf16
        self._unpack.restype = _INT
        self._unpack.argtypes = [_PTR, _PTR, _I64, _I64, _I64, _I64, _PTR, _INT]

    def pack_q8(self, values: Tensor, scales: Tensor, bias: Tensor | None = None) -> Q8Weights:
        """values (N, K) int8 and scales (N, K / 32) of Q8_0 weights, w = d q; K a multiple
        of 32."""
        packed, scales_offsets = pack_q8_blocks(self._pack_q8, values, scales)
        num_out, num_in = values.shape
        return Q8Weights(packed, scales_offsets, num_out, num_in, bias)

    def pack_q6_k(self, values: Tensor, sc: Tensor, d: Tensor,
                  bias: Tensor | None = None) -> Q6KWeights:  # fmt: skip
        """values (N, K) in -32..31, int8 sc (N, K / 16) and float d (N, K / 256) of Q6_K
        weights, w = d sc value (`quant.q6_k_parts`); K a multiple of 256."""
        num_out, num_in = values.shape
        if (
            num_in % Q6K_SUPER
            or sc.shape != (num_out, num_in // 16)
            or d.shape != (num_out, num_in // Q6K_SUPER)
        ):
            raise ValueError(f"Q6_K weights {tuple(values.shape)} need K a multiple of 256")
        num_strips = -(-num_out // 16)
        packed = torch.empty(num_strips * (num_in // BLOCK) * Q6K_RECORD, dtype=torch.uint8)
        d_out = torch.empty(num_strips * (num_in // Q6K_SUPER) * 16)
        values, sc = values.to(torch.int8).contiguous(), sc.to(torch.int8).contiguous()
        d = d.float().contiguous()
        self._pack_q6k(values.data_ptr(), sc.data_ptr(), d.data_ptr(), num_out, num_in,
                       packed.data_ptr(), d_out.data_ptr())  # fmt: skip
        return Q6KWeights(packed, d_out, num_out, num_in, bias)

    def __call__(self, x: Tensor, weights: Q4Weights | Q8Weights | Q6KWeights) -> Tensor:
        """x (rows <= MAX_ROWS, K) bfloat16, each row contiguous -> (rows, N) bfloat16."""
        if x.stride(-1) != 1 or x.stride(0) % 2:
            x = x.contiguous()
        y = torch.empty((x.shape[0], weights.num_out), dtype=torch.bfloat16)
        if x.shape[0] == 0:
            return y
        gemv, scales = self._function(weights)
        status = gemv(
            x.data_ptr(), x.stride(0), x.shape[0], weights.num_in, weights.packed.data_ptr(),
            scales.data_ptr(),
            None if weights.bias is None else weights.bias.data_ptr(), y.data_ptr(),
            weights.num_out, torch.get_num_threads(),
        )  # fmt: skip
        if status != 0:
            raise RuntimeError(f"the few-row GEMV failed ({status})")
        return y

    def call_for(self, weights: Q4Weights | Q8Weights | Q6KWeights) -> KernelCall:
        """The C call `__call__` makes for `weights`."""
        gemv, scales = self._function(weights)
        return KernelCall.of(gemv, weights.packed, scales, weights.bias, weights.num_in,
                             weights.num_out)  # fmt: skip

    def _function(
        self, weights: Q4Weights | Q8Weights | Q6KWeights
    ) -> tuple[ctypes._CFuncPtr, Tensor]:
        """The C function that multiplies by `weights`, and the scales it reads."""
        if isinstance(weights, Q4Weights):
            return self._q4, weights.scales_zeros
        if isinstance(weights, Q6KWeights):
            return self._q6k, weights.d
        return self._q8, weights.scales

    def unpack(self, weights: Q8Weights, rows: slice = slice(None)) -> Tensor:
        """The bfloat16 weights (n, K) of `weights`' output rows `rows` (a step of 1): each
        value times its scale in float, rounded to nearest even (the bias is not added)."""
        start, stop, step = rows.indices(weights.num_out)
        if step != 1:
            raise ValueError("rows must be a contiguous range")
        stop = max(start, stop)
        w = torch.empty((stop - start, weights.num_in), dtype=torch.bfloat16)
        status = self._unpack(
            weights.packed.data_ptr(), weights.scales.data_ptr(), weights.num_out,
            weights.num_in, start, stop, w.data_ptr(), torch.get_num_threads(),
        )  # fmt: skip
        if status != 0:
            raise RuntimeError(f"unpacking the 8-bit weights failed ({status})")
        return w

    def pack_planes(self, nibbles: Tensor, scales: Tensor, num_in: int,
                    bias: Tensor | None = None) -> Q8Weights:  # fmt: skip
        """A Q8_0 layer from the two 4-bit planes `quant.int4_planes` gives it, its scales
        rounded to bfloat16 as the int4 kernel and the dense copy hold them."""
        num_blocks = num_in // BLOCK  # scales [d | 16 d]
        d = scales[:, :num_blocks].to(torch.bfloat16).float()
        return self.pack_q8(q8_plane_values(nibbles, num_in), d, bias)


@functools.cache
def gemv_kernel() -> GemvKernel | None:
    """The compiled kernel where it runs here (AVX-512 BF16), else None (logged once)."""
    return load_kernel(_probed, "few-row GEMV", "keeping torch's int4 kernel")


def _probed(library: ctypes.CDLL) -> GemvKernel:
    """The kernel, once it has computed small products exactly (sums of multiples of 1/4,
    exact in float); RuntimeError where this CPU has no AVX-512 BF16."""
    from superinfer.model.cpu_q4 import Q4Kernel

    kernel = GemvKernel(library)
    nibbles = torch.arange(64 * 40).remainder(13).view(40, 64)
    scales, zeros = torch.full((40, 2), 0.5), torch.full((40, 2), 0.25)
    x = (torch.arange(3 * 64).remainder(7) - 3).view(3, 64).to(torch.bfloat16)
    values = (torch.arange(64 * 40).remainder(255) - 127).view(40, 64)
    values6k = (torch.arange(256 * 40).remainder(63) - 32).view(40, 256)
    sc6k = (torch.arange(40 * 16).remainder(255) - 128).view(40, 16)
    d6k = (torch.arange(40).remainder(3) - 1).view(40, 1) * 0.25
    x6k = (torch.arange(3 * 256).remainder(5) - 2).view(3, 256).to(torch.bfloat16)
    q4 = Q4Kernel(library).pack(nibbles, scales, zeros)
    q8 = kernel.pack_q8(values, torch.full((40, 2), 0.25))
    q6k = kernel.pack_q6_k(values6k, sc6k, d6k)
    try:
        y4, y8, y6k = kernel(x, q4), kernel(x, q8), kernel(x6k, q6k)
    except RuntimeError as error:
        raise RuntimeError("no AVX-512 BF16 on this CPU") from error
    expected4 = x.float() @ ((nibbles.float() - 8) * 0.5 + 0.25).t()
    expected8 = x.float() @ (values.float() * 0.25).t()
    w6k = values6k.float() * (d6k * sc6k).repeat_interleave(16, 1)
    expected6k = x6k.float() @ w6k.t()
    if not (torch.equal(y4, expected4.to(torch.bfloat16))
            and torch.equal(y8, expected8.to(torch.bfloat16))
            and torch.equal(y6k, expected6k.to(torch.bfloat16))):  # fmt: skip
        raise RuntimeError("the few-row GEMV computed a wrong product")
    return kernel
