"""GGUF weights times 8-bit activations on the CPU (`csrc/q4_q8_linear.c`), for
`--quantization gguf-w4a8`: llama.cpp's own arithmetic for its Q4 and Q8_0 formats.

ggml quantizes the activations of a quantized matmul to 8 bits per block of 32 (its Q8_1,
Q8_0) and multiplies integers. On AVX-512 VNNI, `vpdpbusd` does 64 multiply-adds an
instruction where bfloat16's `vdpbf16ps` does 32, at the same rate on Zen 4
(`benchmarks/csrc/dot_peak.c`: 937 G int8 ops/s against 468 GFLOP/s on 2 cores), and the
4-bit values need no dequantization. Over the default model's layers
(`benchmarks/int4_rows.py`) it takes 0.72x the time of PyTorch's int4 kernel at one row,
and 0.63-0.80x that of the bfloat16 4-bit GEMM (`cpu_q4`) from 16 to 256 rows; Q8_0
layers (the default model's lm_head, tied to its Q8_0 embedding) run on their 8-bit values
instead of a dense bfloat16 copy, in 0.64-0.79x its time from 16 rows. Under
`gguf-w4a8` every step runs it (docs/results/models/w4a8_1205/).

The price is the activations' rounding (half a step in 127 of each block's largest
value). On the default model (`benchmarks/w4a8_quality.py`) perplexity rises 0.27% against
`auto` (float32 is 0.02% below it), and greedy replies part from `auto`'s as often as
float32's do (8 and 6 of 16 identical over 48 tokens). It is opt-in for that reason:
`auto` keeps the bfloat16 arithmetic.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable

import torch
from torch import Tensor

from superinfer.model.cpu_kernels import KernelCall, load_kernel

_PTR, _INT, _I64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
STRIP = 16  # output columns per packed strip
BLOCK = 32  # inputs per GGUF block, and per activation scale


class W4A8Weights:
    """One layer's weights packed for the kernel (4-bit, or Q8_0's 8-bit with `is_q8`), and
    its bias; calling it multiplies: x (rows, K) bfloat16 -> (rows, N) bfloat16."""

    def __init__(self, kernel: W4A8Kernel, packed: Tensor, scales: Tensor, num_out: int,
                 num_in: int, bias: Tensor | None, is_q8: bool = False) -> None:  # fmt: skip
        self.kernel, self.packed, self.scales = kernel, packed, scales
        self.num_out, self.num_in, self.is_q8 = num_out, num_in, is_q8
        self.bias = None if bias is None else bias.detach().float().contiguous()

    def __call__(self, x: Tensor) -> Tensor:
        return self.kernel(x, self)

    def kernel_call(self) -> KernelCall:
        """The C call `__call__` makes."""
        return self.kernel.call_for(self)


class W4A8Kernel:
    """The loaded `pack_q4_q8`, `pack_q8_q8`, `q4_q8_linear` and `q8_q8_linear`."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._pack, self._pack_q8 = library.pack_q4_q8, library.pack_q8_q8
        self._pack.restype = self._pack_q8.restype = None
        self._pack.argtypes = [_PTR, _PTR, _PTR, _I64, _I64, _PTR, _PTR]
        self._pack_q8.argtypes = [_PTR, _PTR, _I64, _I64, _PTR, _PTR]
        self._linear = {False: library.q4_q8_linear, True: library.q8_q8_linear}
        for fn in self._linear.values():
            fn.restype = _INT
            fn.argtypes = [_PTR, _I64, _I64, _I64, _PTR, _PTR, _PTR, _PTR, _I64, _INT]

    def pack(self, nibbles: Tensor, scales: Tensor, zeros: Tensor,
             bias: Tensor | None = None) -> W4A8Weights:  # fmt: skip
        """nibbles (N, K) integers 0..15; scales, zeros (N, K / 32) float32, the weights
        being w = (q - 8) * scale + zero as `quant.int4_planes` gives them (GGUF's fp16
        scales, exact in float32: no rounding here); K a multiple of 32."""
        num_out, num_in = nibbles.shape
        if num_in % BLOCK or scales.shape != (num_out, num_in // BLOCK) != zeros.shape:
            raise ValueError(f"4-bit weights {tuple(nibbles.shape)} need one scale per {BLOCK}")
        q = nibbles.to(torch.uint8).contiguous()
        d = scales.float().contiguous()
        m = (zeros.float() - 8 * d).contiguous()  # w = d q + m
        num_strips = -(-num_out // STRIP)
        packed = torch.empty(num_strips * num_in * STRIP // 2, dtype=torch.uint8)
        scales_mins = torch.empty(num_strips * num_in // BLOCK * 2 * STRIP)
        self._pack(q.data_ptr(), d.data_ptr(), m.data_ptr(), num_out, num_in,
                   packed.data_ptr(), scales_mins.data_ptr())  # fmt: skip
        return W4A8Weights(self, packed, scales_mins, num_out, num_in, bias)

    def pack_q8(self, values: Tensor, scales: Tensor, bias: Tensor | None = None) -> W4A8Weights:
        """values (N, K) int8 and scales (N, K / 32) float32 of Q8_0 weights, w = d q (exact in
        float32); K a multiple of 32."""
        packed, scales_offsets = pack_q8_blocks(self._pack_q8, values, scales)
        num_out, num_in = values.shape
        return W4A8Weights(self, packed, scales_offsets, num_out, num_in, bias, is_q8=True)

    def pack_planes(self, nibbles: Tensor, scales: Tensor, zeros: Tensor, num_in: int,
                    bias: Tensor | None = None) -> W4A8Weights:  # fmt: skip
        """The weights of `quant.int4_planes` (one 4-bit plane, or Q8_0's two): packed as
        4-bit, or as the 8-bit values the two planes hold."""
        if nibbles.shape[1] == num_in:
            return self.pack(nibbles, scales, zeros, bias)
        num_blocks = num_in // BLOCK  # scales [d | 16 d]
        return self.pack_q8(q8_plane_values(nibbles, num_in), scales[:, :num_blocks], bias)

    def call_for(self, weights: W4A8Weights) -> KernelCall:
        """The C call `__call__` makes for `weights`."""
        return KernelCall.of(self._linear[weights.is_q8], weights.packed, weights.scales,
                             weights.bias, weights.num_in, weights.num_out)  # fmt: skip

    def __call__(self, x: Tensor, weights: W4A8Weights) -> Tensor:
        """x (rows, K) bfloat16, each row contiguous -> (rows, N) bfloat16."""
        if x.stride(-1) != 1:
            x = x.contiguous()
        y = torch.empty((x.shape[0], weights.num_out), dtype=torch.bfloat16)
        if x.shape[0] == 0:
            return y
        status = self._linear[weights.is_q8](
            x.data_ptr(), x.stride(0), x.shape[0], weights.num_in, weights.packed.data_ptr(),
            weights.scales.data_ptr(),
            None if weights.bias is None else weights.bias.data_ptr(), y.data_ptr(),
            weights.num_out, torch.get_num_threads(),
        )  # fmt: skip
        if status != 0:
            raise RuntimeError(f"the 8-bit-activation GEMM failed ({status})")
        return y


def pack_q8_blocks(
    pack: Callable[..., None], values: Tensor, scales: Tensor
) -> tuple[Tensor, Tensor]:
    """(packed, scales_offsets): values (N, K) int8 and scales (N, K / 32) of Q8_0 weights
    (w = d q; K a multiple of 32) in the 8-bit layout, by the library's `pack_q8_q8`
    (`pack`). This GEMM and `cpu_gemv`'s read it."""
    num_out, num_in = values.shape
    if num_in % BLOCK or scales.shape != (num_out, num_in // BLOCK):
        raise ValueError(f"8-bit weights {tuple(values.shape)} need one scale per {BLOCK}")
    q = values.to(torch.int8).contiguous()
    d = scales.float().contiguous()
    num_strips = -(-num_out // STRIP)
    packed = torch.empty(num_strips * num_in * STRIP, dtype=torch.int8)
    scales_offsets = torch.empty(num_strips * num_in // BLOCK * 128, dtype=torch.uint8)
    pack(q.data_ptr(), d.data_ptr(), num_out, num_in, packed.data_ptr(),
         scales_offsets.data_ptr())  # fmt: skip
    return packed, scales_offsets


def q8_plane_values(nibbles: Tensor, num_in: int) -> Tensor:
    """The int8 values (N, num_in) of a Q8_0 layer's two 4-bit planes (`quant.int4_planes`:
    q + 128 = 16 hi + lo, side by side), in bytes only: the lm_head of a large vocabulary
    has tens of millions of weights."""
    unsigned = nibbles[:, :num_in].to(torch.uint8) | (nibbles[:, num_in:].to(torch.uint8) << 4)
    return (unsigned ^ 0x80).view(torch.int8)  # q + 128 with its top bit flipped: q


@functools.cache
def w4a8_kernel() -> W4A8Kernel | None:
    """The compiled kernel where it runs here (AVX-512 VNNI and BF16), else None."""
    return load_kernel(_probed, "4-bit x 8-bit GEMM", "--quantization gguf-w4a8 is refused")


def _probed(library: ctypes.CDLL) -> W4A8Kernel:
    """The kernel, once it has computed a small product exactly: activations that are
    whole multiples of their blocks' scale (|x| <= 127, the largest 127) quantize without
    rounding, and weights in quarters keep every sum exact in float."""
    kernel = W4A8Kernel(library)
    nibbles = torch.arange(64 * 40).remainder(13).view(40, 64)
    scales, zeros = torch.full((40, 2), 0.5), torch.full((40, 2), 0.25)
    x = (torch.arange(3 * 64).remainder(7) - 3).view(3, 64).float()
    x[:, 0::32] = 127  # each block's largest: the scale is exactly 1
    weights = kernel.pack(nibbles, scales, zeros)
    try:
        y = weights(x.to(torch.bfloat16))
    except RuntimeError as error:
        raise RuntimeError("no AVX-512 VNNI and BF16 on this CPU") from error
    expected = x @ ((nibbles.float() - 8) * 0.5 + 0.25).t()
    if not torch.equal(y, expected.to(torch.bfloat16)):
        raise RuntimeError("the 4-bit x 8-bit GEMM computed a wrong product")
    return kernel
