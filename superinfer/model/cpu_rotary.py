"""The rotary embedding of many tokens' heads as one C call on CPU (`csrc/rotary_decode.c`'s
`rotary_rows`).

`rotary.apply_rotary` calls it for a step's q and k where the kernel takes them. PyTorch runs
the rotation as three passes (upcast to float, a complex multiply against the broadcast
rotation, the downcast): 123 us a layer for a 512-token chunk of the default model, against
35 us here, about 3% of the chunk's step. The arithmetic is PyTorch's complex multiply, (a + ib)(c + id) =
(ac - bd) + i(ad + bc) with every product rounded to float before the sum, rounded to
bfloat16 as PyTorch rounds (nearest even, denormals kept): the same results bit for bit,
but for a NaN's payload (`tests/model/test_cpu_rotary.py`).
"""

from __future__ import annotations

import ctypes
import functools

import torch
from torch import Tensor

from superinfer.model.cpu_kernels import KERNEL_DTYPES as _DTYPES
from superinfer.model.cpu_kernels import load_kernel

_PTR, _INT, _I64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64


class RotaryKernel:
    """The loaded `rotary_rows`."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._fn = library.rotary_rows
        self._fn.restype = _INT
        self._fn.argtypes = [_PTR, _I64, _PTR, _I64, _INT, _INT, _INT, _PTR, _INT]

    @staticmethod
    def takes(x: Tensor, rotation: Tensor) -> bool:
        """Whether `__call__` handles these: x (T, n, D) CPU float32 or bfloat16 with each
        token's heads contiguous, rotation (T, 1, D / 2) complex64, contiguous, and D a
        multiple of 16. PyTorch multiplies runs of 8 complex numbers with vector
        instructions and the rest in scalar code compiled with fused multiply-adds, whose
        last bit differs: with D / 2 a multiple of 8 every product is a vector one."""
        return (
            x.device.type == "cpu" and x.dtype in _DTYPES and x.dim() == 3
            and x.stride(2) == 1 and x.stride(1) == x.shape[2] and x.shape[2] % 16 == 0
            and rotation.dtype == torch.complex64 and rotation.is_contiguous()
            and rotation.shape == (x.shape[0], 1, x.shape[2] // 2)
        )  # fmt: skip

    def __call__(self, x: Tensor, rotation: Tensor) -> Tensor:
        """x (T, n, D) rotated by rotation (T, 1, D / 2) -> a new contiguous (T, n, D)."""
        num_tokens, num_heads, head_dim = x.shape
        out = torch.empty((num_tokens, num_heads, head_dim), dtype=x.dtype)
        self._fn(x.data_ptr(), x.stride(0), rotation.data_ptr(), num_tokens, num_heads,
                 head_dim, _DTYPES[x.dtype], out.data_ptr(), torch.get_num_threads())  # fmt: skip
        return out


@functools.cache
def rotary_kernel() -> RotaryKernel | None:
    """The compiled kernel, or None where it cannot be built here (logged once)."""
    return load_kernel(RotaryKernel, "rotary", "using PyTorch's")
