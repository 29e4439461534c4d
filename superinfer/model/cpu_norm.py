"""Residual add and RMSNorm as one C call on CPU (`csrc/rms_norm.c`).

A decode step of a small model spends more time dispatching PyTorch's composite rms_norm
(about ten ops per call, 2 * num_layers + 1 calls) than computing it. `RMSNorm` in
`decoder.py` calls `add_rms_norm` where the kernel takes its tensors and PyTorch
otherwise; both compute the same formula in float32 and round once.
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
    """The loaded `add_rms_norm`."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._fn = library.add_rms_norm
        self._fn.restype = _INT
        self._fn.argtypes = [_PTR, _I64, _PTR, _I64, _PTR, _PTR, _I64, _INT, _INT,
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


@functools.cache
def norm_kernel() -> NormKernel | None:
    """The compiled kernel, or None where it cannot be built here (logged once)."""
    return load_kernel(NormKernel, "RMSNorm", "using PyTorch's")
