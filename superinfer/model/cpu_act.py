"""The gated MLP's activation, silu(gate) * up, as one C call on CPU (`csrc/gated_act.c`).

`GatedMLP` in `decoder.py` and the flat decode loop (`cpu_decode.py`) call `silu_mul` on
the fused gate/up projection's bfloat16 output where the kernel takes it, and PyTorch's
chunk, silu and multiply otherwise (float32, GeLU, no AVX-512). Both round as PyTorch
rounds a bfloat16 silu and multiply; the kernel's exp may differ from PyTorch's by an ulp
in float, so a bfloat16 result differs only where that ulp crosses a rounding boundary.
"""

from __future__ import annotations

import ctypes
import functools

import torch
from torch import Tensor

from superinfer.model.cpu_kernels import load_kernel

_PTR, _INT, _I64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64


class ActKernel:
    """The loaded `silu_mul`."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._fn = library.silu_mul
        self._fn.restype = _INT
        self._fn.argtypes = [_PTR, _I64, _PTR, _I64, _I64, _INT]
        probe = torch.zeros(1, 32, dtype=torch.bfloat16)
        if self._fn(probe.data_ptr(), 32, probe.data_ptr(), 1, 16, 1) != 0:
            raise RuntimeError("this CPU has no AVX-512")

    @staticmethod
    def takes(gate_up: Tensor) -> bool:
        """Whether `__call__` handles this: 2-D CPU bfloat16 rows, each contiguous."""
        return (gate_up.dtype == torch.bfloat16 and gate_up.device.type == "cpu"
                and gate_up.dim() == 2 and gate_up.stride(1) == 1
                and gate_up.shape[1] % 2 == 0)  # fmt: skip

    def __call__(self, gate_up: Tensor) -> Tensor:
        """(T, 2I) [gate | up] -> (T, I) silu(gate) * up, a new tensor."""
        num_rows, inner = gate_up.shape[0], gate_up.shape[1] // 2
        out = torch.empty((num_rows, inner), dtype=torch.bfloat16)
        status = self._fn(gate_up.data_ptr(), gate_up.stride(0), out.data_ptr(), num_rows,
                          inner, torch.get_num_threads())  # fmt: skip
        if status != 0:
            raise RuntimeError(f"silu_mul failed with status {status}")
        return out


@functools.cache
def act_kernel() -> ActKernel | None:
    """The compiled kernel, or None where it cannot run here (logged once)."""
    return load_kernel(ActKernel, "silu-and-multiply", "using PyTorch's")
