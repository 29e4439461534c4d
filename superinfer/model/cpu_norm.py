"""Residual add and RMSNorm as one C call on CPU (`csrc/rms_norm.c`).

A decode step of a small model spends more time dispatching PyTorch's composite rms_norm
(about ten ops per call, 2 * num_layers + 1 calls) than computing it. `RMSNorm` in
`decoder.py` calls `add_rms_norm` where the kernel takes its tensors and PyTorch
otherwise; both compute the same formula in float32 and round once. Per-head q/k norms
(Qwen3, Gemma 3) go through `rms_norm_heads` on the heads of the fused projection: through
PyTorch they took 60 us a call on Qwen3-0.6B's shape, 3.4 ms of a 20 ms decode step.
"""

from __future__ import annotations

import ctypes
import functools

import torch
from torch import Tensor

from superinfer.model.cpu_kernels import KERNEL_DTYPES as _DTYPES
from superinfer.model.cpu_kernels import load_kernel

_PTR, _INT, _I64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64


class NormKernel:
    """The loaded `add_rms_norm` and `rms_norm_heads`."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._fn = library.add_rms_norm
        self._fn.restype = _INT
        self._fn.argtypes = [_PTR, _I64, _PTR, _I64, _PTR, _PTR, _I64, _INT, _INT,
                             ctypes.c_float, _INT]  # fmt: skip
        self._heads = library.rms_norm_heads
        self._heads.restype = _INT
        self._heads.argtypes = [_PTR, _I64, _PTR, _I64, _I64, _INT, _INT, _PTR, _INT,
                                ctypes.c_float, _INT]  # fmt: skip

    @staticmethod
    def takes(x: Tensor, residual: Tensor | None) -> bool:
        """Whether `__call__` handles these: 2-D CPU rows of float32 or bfloat16, each row
        contiguous, the residual (if any) of the same shape and dtype."""
        ok = x.device.type == "cpu" and x.dtype in _DTYPES and x.dim() == 2 and x.stride(1) == 1
        if residual is None or not ok:
            return ok
        return residual.shape == x.shape and residual.dtype == x.dtype and residual.stride(1) == 1

    def __call__(self, x: Tensor, residual: Tensor | None, weight: Tensor, eps: float) -> Tensor:
        """residual += x (when given), then RMSNorm of the residual (or of x) times `weight`
        (float32, contiguous, offset included) -> a new (T, C) tensor of x's dtype."""
        num_rows, hidden = x.shape
        out = torch.empty((num_rows, hidden), dtype=x.dtype)
        status = self._fn(
            x.data_ptr(), x.stride(0),
            None if residual is None else residual.data_ptr(),
            0 if residual is None else residual.stride(0),
            weight.data_ptr(), out.data_ptr(), num_rows, hidden, _DTYPES[x.dtype], eps,
            torch.get_num_threads(),
        )  # fmt: skip
        if status != 0:
            raise ValueError(f"add_rms_norm does not take rows of {hidden} numbers")
        return out

    @staticmethod
    def takes_heads(x: Tensor) -> bool:
        """Whether `heads` handles x: (T, H, D) CPU float32 or bfloat16, each token's heads
        contiguous (as a view of the fused q/k/v projection has them)."""
        return (x.device.type == "cpu" and x.dtype in _DTYPES and x.dim() == 3
                and x.stride(2) == 1 and x.stride(1) == x.shape[2])  # fmt: skip

    def heads(self, x: Tensor, weight: Tensor, eps: float, out: Tensor | None = None) -> Tensor:
        """RMSNorm of each head of x (T, H, D) times `weight` (float32, D, offset included)
        -> `out` (T, H, D), a new contiguous tensor unless given (x itself: in place)."""
        num_tokens, num_heads, head_dim = x.shape
        if out is None:
            out = torch.empty((num_tokens, num_heads, head_dim), dtype=x.dtype)
        status = self._heads(
            x.data_ptr(), x.stride(0), out.data_ptr(), out.stride(0), num_tokens, num_heads,
            head_dim, weight.data_ptr(), _DTYPES[x.dtype], eps, torch.get_num_threads(),
        )  # fmt: skip
        if status != 0:
            raise ValueError(f"rms_norm_heads does not take heads of {head_dim} numbers")
        return out


@functools.cache
def norm_kernel() -> NormKernel | None:
    """The compiled kernel, or None where it cannot be built here (logged once)."""
    return load_kernel(NormKernel, "RMSNorm", "using PyTorch's")
