"""4-bit GGUF weights multiplied by many rows at once on the CPU (`csrc/q4_linear.c`).

PyTorch's int4 kernel was the fastest for a few rows (decode of a few sequences; now
`cpu_gemv`'s GEMV, on these same packed weights) but dequantizes each weight once per row: from about 8 rows on, a dense bfloat16 GEMM beat it,
so each quantized layer used to keep a bfloat16 copy of its weights for prefill and
batched decode (202 MB of the default model). This kernel dequantizes each strip of 32
output columns once per call and runs every row against it with AVX-512 BF16 dot
products: on the default model's shapes it beat oneDNN's bfloat16 GEMM from 4 rows to 256
(0.78x its time at 32 rows, 0.91x at 256; `benchmarks/int4_rows.py`), from 4 bits a
weight. It computes with the very weights the dense copy held (same bfloat16 rounding),
so it replaces that copy where it runs.

On CPUs with AMX (Sapphire Rapids and later) the rows run on AMX tiles instead: 16 rows
by 32 inputs against a strip's 16 columns in one instruction, on the same dequantized
strip (its layout is AMX's), 3-6x faster from 16 rows on this model's shapes and faster
than the GEMV from 4 rows (docs/results/models/amx_1206/). `use_amx` turns it off and on;
`SUPERINFER_AMX=0` keeps the AVX-512 rows.

Where it runs on AMX, Q8_0 layers (the default model's lm_head, tied to its Q8_0
embedding) take it too, on the GEMV's 8-bit weights (`Q8Gemm`), each strip dequantized to
the weights the dense copy they replace held. Q6_K layers (`cpu_gemv.Q6KWeights`, Q6_K's
own bits) take the same GEMM (`linear_q6k`), each strip dequantized from those bits into
the scratch: for up to `Q6K_SCALED_MAX_ROWS` rows to q - 32 with each 16 inputs' d sc
applied to the rows' sums (as the GEMV does), beyond (and on AMX, for every step) to the
weights the dequantized file holds, rounded to bfloat16. So a Q4_K_M file's Q6_K layers
keep no dense copy either, and a Q6_K embedding looks its rows up in them (`q6k_rows`).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from superinfer.model.cpu_kernels import KernelCall, load_kernel

if TYPE_CHECKING:
    from superinfer.model.cpu_gemv import Q6KWeights, Q8Weights  # cpu_gemv imports this module

logger = logging.getLogger(__name__)
_PTR, _INT, _I64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
STRIP = 32  # output columns per packed strip
BLOCK = 32  # inputs per (scale, zero): GGUF's block
Q6K_SCALED_MAX_ROWS = 24  # q4_linear.c's: the most rows whose Q6_K weights are not rounded


class Q4Weights:
    """One layer's weights packed for the kernel (see `csrc/q4_linear.c`), and its bias;
    calling it multiplies: x (rows, K) bfloat16 -> (rows, N) bfloat16."""

    def __init__(self, kernel: Q4Kernel, packed: Tensor, scales_zeros: Tensor, num_out: int,
                 num_in: int, bias: Tensor | None) -> None:  # fmt: skip
        self.kernel, self.packed, self.scales_zeros = kernel, packed, scales_zeros
        self.num_out, self.num_in = num_out, num_in
        self.bias = None if bias is None else bias.detach().float().contiguous()

    def __call__(self, x: Tensor) -> Tensor:
        return self.kernel(x, self)

    def kernel_call(self) -> KernelCall:
        """The C call `__call__` makes."""
        return self.kernel.call_for(self)


class Q8Gemm:
    """A Q8_0 layer's 8-bit weights (`cpu_gemv.Q8Weights`, the few-row GEMV's own: no copy)
    on the GEMM; calling it multiplies: x (rows, K) bfloat16 -> (rows, N) bfloat16, with
    the weights a dense bfloat16 copy would hold (d q rounded once)."""

    def __init__(self, kernel: Q4Kernel, weights: Q8Weights) -> None:
        self.kernel, self.weights = kernel, weights
        self.num_out, self.num_in = weights.num_out, weights.num_in

    def __call__(self, x: Tensor) -> Tensor:
        return self.kernel.linear_q8(x, self.weights)

    def kernel_call(self) -> KernelCall:
        """The C call `__call__` makes."""
        return self.kernel.call_for(self.weights)


class Q4Kernel:
    """The loaded `pack_q4`, `q4_linear`, `q6k_linear`, `q8_linear` and `q6k_rows`."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._pack, self._linear = library.pack_q4, library.q4_linear
        self._pack.restype = None
        self._pack.argtypes = [_PTR, _PTR, _PTR, _I64, _I64, _PTR, _PTR]
        self._q6k, self._q8 = library.q6k_linear, library.q8_linear
        for fn in (self._linear, self._q6k, self._q8):
            fn.restype = _INT
            fn.argtypes = [_PTR, _I64, _I64, _I64, _PTR, _PTR, _PTR, _PTR, _I64, _INT]
        self._q6k_rows = library.q6k_rows
        self._q6k_rows.restype = _INT
        self._q6k_rows.argtypes = [_PTR, _PTR, _I64, _I64, _PTR, _I64, _PTR]
        self._use_amx = library.q4_use_amx
        self._use_amx.restype = _INT
        self._use_amx.argtypes = [_INT]

    def use_amx(self, is_on: bool | None = None) -> bool:
        """Run the GEMMs' rows on AMX (True: where this CPU, kernel and OS allow it) or on
        AVX-512 (False); None only asks. Returns whether AMX is on."""
        return bool(self._use_amx(-1 if is_on is None else int(is_on)))

    def pack(self, nibbles: Tensor, scales: Tensor, zeros: Tensor,
             bias: Tensor | None = None) -> Q4Weights:  # fmt: skip
        """nibbles (N, K) integers 0..15; scales, zeros (N, K / 32), rounded to bfloat16
        here (the weights are w = (q - 8) * scale + zero); K a multiple of 32."""
        num_out, num_in = nibbles.shape
        if num_in % BLOCK or scales.shape != (num_out, num_in // BLOCK) != zeros.shape:
            raise ValueError(f"4-bit weights {tuple(nibbles.shape)} need one scale per {BLOCK}")
        q = nibbles.to(torch.uint8).contiguous()
        s = scales.to(torch.bfloat16).contiguous()
        z = zeros.to(torch.bfloat16).contiguous()
        num_strips = -(-num_out // STRIP)
        packed = torch.empty(num_strips * num_in * STRIP // 2, dtype=torch.uint8)
        scales_zeros = torch.empty(num_strips * num_in // BLOCK * 2 * STRIP, dtype=torch.bfloat16)
        self._pack(q.data_ptr(), s.data_ptr(), z.data_ptr(), num_out, num_in,
                   packed.data_ptr(), scales_zeros.data_ptr())  # fmt: skip
        return Q4Weights(self, packed, scales_zeros, num_out, num_in, bias)

    def __call__(self, x: Tensor, weights: Q4Weights) -> Tensor:
        """x (rows, K) bfloat16, each row contiguous -> (rows, N) bfloat16."""
        return self._run(self._linear, x, weights, weights.scales_zeros)

    def linear_q6k(self, x: Tensor, weights: Q6KWeights) -> Tensor:
        """The same for Q6_K weights in their own layout (K a multiple of 256)."""
        return self._run(self._q6k, x, weights, weights.d)

    def linear_q8(self, x: Tensor, weights: Q8Weights) -> Tensor:
        """The same for Q8_0 weights in the few-row GEMV's 8-bit layout (`cpu_gemv`)."""
        return self._run(self._q8, x, weights, weights.scales)

    def call_for(self, weights: Q4Weights | Q6KWeights | Q8Weights) -> KernelCall:
        """The C call that multiplies by `weights` (as `__call__`, `linear_q6k`, `linear_q8`)."""
        from superinfer.model.cpu_gemv import Q6KWeights  # cpu_gemv imports this module

        if isinstance(weights, Q4Weights):
            fn, scales = self._linear, weights.scales_zeros
        elif isinstance(weights, Q6KWeights):
            fn, scales = self._q6k, weights.d
        else:
            fn, scales = self._q8, weights.scales
        return KernelCall.of(fn, weights.packed, scales, weights.bias, weights.num_in,
                             weights.num_out)  # fmt: skip

    def q6k_rows(self, weights: Q6KWeights, ids: Tensor) -> Tensor:
        """Output rows `ids` (any shape) of Q6_K `weights` as float32, (*ids.shape, K): each
        weight d sc (q - 32), the dequantized file's value."""
        flat = ids.reshape(-1).to(torch.int64).contiguous()
        out = torch.empty((flat.shape[0], weights.num_in))
        status = self._q6k_rows(weights.packed.data_ptr(), weights.d.data_ptr(),
                                weights.num_out, weights.num_in, flat.data_ptr(),
                                flat.shape[0], out.data_ptr())  # fmt: skip
        if status != 0:
            raise IndexError(f"token ids out of range for {weights.num_out} embeddings")
        return out.view(*ids.shape, weights.num_in)

    def _run(self, fn: ctypes._CFuncPtr, x: Tensor,
             weights: Q4Weights | Q6KWeights | Q8Weights, scales: Tensor) -> Tensor:  # fmt: skip
        if x.dim() != 2 or x.shape[1] != weights.num_in:
            raise ValueError(f"x {tuple(x.shape)}: the layer takes {weights.num_in} inputs")
        if x.stride(-1) != 1 or x.stride(0) % 2:
            x = x.contiguous()
        y = torch.empty((x.shape[0], weights.num_out), dtype=torch.bfloat16)
        status = fn(
            x.data_ptr(), x.stride(0), x.shape[0], weights.num_in, weights.packed.data_ptr(),
            scales.data_ptr(), None if weights.bias is None else weights.bias.data_ptr(),
            y.data_ptr(), weights.num_out, torch.get_num_threads(),
        )  # fmt: skip
        if status != 0:
            raise RuntimeError(f"the GEMM over GGUF blocks failed ({status})")
        return y


@functools.cache
def q4_kernel() -> Q4Kernel | None:
    """The compiled kernel where it runs here (AVX-512 BF16), else None (logged once)."""
    return load_kernel(_probed, "4-bit GEMM", "keeping dense bfloat16 copies")


def _probed(library: ctypes.CDLL) -> Q4Kernel:
    """The kernel, once it has computed a small product right (sums of multiples of 1/4,
    exact in float, then rounded to bfloat16 as PyTorch rounds); RuntimeError where this CPU
    has no AVX-512 BF16."""
    kernel = Q4Kernel(library)
    nibbles = torch.arange(64 * 40).remainder(13).view(40, 64)
    scales, zeros = torch.full((40, 2), 0.5), torch.full((40, 2), 0.25)
    x = (torch.arange(3 * 64).remainder(7) - 3).view(3, 64).to(torch.bfloat16)
    weights = kernel.pack(nibbles, scales, zeros)
    try:
        y = weights(x)
    except RuntimeError as error:
        raise RuntimeError("no AVX-512 BF16 on this CPU") from error
    expected = (x.float() @ ((nibbles.float() - 8) * 0.5 + 0.25).t()).to(torch.bfloat16)
    if not torch.equal(y, expected):
        raise RuntimeError("the 4-bit GEMM computed a wrong product")
    if kernel.use_amx(os.environ.get("SUPERINFER_AMX", "1") != "0") and not torch.equal(
        weights(x), expected
    ):
        kernel.use_amx(False)
        logger.warning("the 4-bit GEMM on AMX computed a wrong product: AVX-512 instead")
    return kernel
