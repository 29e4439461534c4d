"""Paged attention on CPU with small C kernels (`csrc/paged_decode.c`,
`csrc/paged_prefill.c`, `csrc/write_kv.c`).

The portable path gathers every decode sequence's K/V blocks into a batch padded to the
longest sequence and runs SDPA on it, so a step reads the cache, writes the copy, and reads
it again, padding included. Under serving load (ShareGPT, 10-20 sequences of very
different lengths) that was 40-50% of a step. The kernel reads each sequence's blocks in
place instead. The KV write copies each token's rows straight into their slots. Prefill
chunks of a bfloat16 cache, on a CPU with AVX-512 BF16, read their keys in place too
(`prefill`): PyTorch's CPU flash attention over gathered blocks was 1.3-1.5x slower per
forward for chunks of 512 tokens. Where the 4-bit GEMM runs on AMX (`cpu_q4`, which
decides it for the process), the prefill kernel's q.k and p.V run on AMX tiles too.

`cpu_kernels.py` builds the library; where it cannot (no compiler, a failed build,
SUPERINFER_CPU_KERNELS=0), `decode_kernel()` returns None and attention keeps the portable
path; the reason is logged once.
"""

from __future__ import annotations

import ctypes
import functools
import math

import torch
from torch import Tensor

from superinfer.model.cpu_kernels import KERNEL_DTYPES as _DTYPES
from superinfer.model.cpu_kernels import load_kernel
from superinfer.model.cpu_q4 import q4_kernel

MAX_HEAD_DIM, MAX_GROUP = 256, 16  # as in the source
_PTR, _INT, _I64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64  # pointers passed as ints


class PagedDecodeKernel:
    """The loaded kernels: `__call__` (decode attention) and `write_kv` mirror the C
    functions' contracts."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._fn = library.paged_decode_attention
        self._fn.restype = _INT
        self._fn.argtypes = [_PTR] * 3 + [_INT] + [_PTR] * 3 + [_INT] * 8 + [ctypes.c_float, _INT]
        self._write = library.write_kv
        self._write.restype = _INT
        self._write.argtypes = [_PTR, _I64, _PTR, _I64] + [_PTR] * 3 + [_I64] * 2 + [_INT] * 5
        self._prefill = library.paged_prefill_attention
        self._prefill.restype = _INT
        self._prefill.argtypes = ([_PTR, _I64, _PTR, _PTR, _INT, _PTR, _I64] + [_INT] * 9
                                  + [ctypes.c_float, _INT])  # fmt: skip
        self._prefill_declined: set[tuple[torch.dtype, int, int]] = set()

    def supports(self, kv_cache: Tensor, num_heads: int) -> bool:
        num_kv_heads, head_dim = kv_cache.shape[-2], kv_cache.shape[-1]
        return (
            kv_cache.device.type == "cpu"
            and kv_cache.dtype in _DTYPES
            and kv_cache.is_contiguous()
            and head_dim <= MAX_HEAD_DIM
            and num_heads % num_kv_heads == 0
            and num_heads // num_kv_heads <= MAX_GROUP
        )

    def __call__(
        self,
        q: Tensor,
        kv_cache: Tensor,
        layer: int,
        block_tables: Tensor,
        seq_lens: Tensor,
        scale: float | None = None,
        key_starts: Tensor | None = None,
    ) -> Tensor:
        """q (B, H, D) -> (B, H, D). block_tables (B, max_blocks) and seq_lens (B,) int64;
        `scale` multiplies q.k (default 1/sqrt(D)); `key_starts` (B,) int64: the first
        token each sequence attends to (a sliding window; the blocks before are not read)."""
        _num_blocks, num_layers, _, block_size, num_kv_heads, head_dim = kv_cache.shape
        q = q.contiguous()
        num_seqs, num_heads = q.shape[0], q.shape[1]
        if q.dtype != kv_cache.dtype or block_tables.dtype != torch.int64:
            raise TypeError("q must have the cache's dtype and block tables must be int64")
        starts = key_starts if key_starts is not None else seq_lens
        if starts.dtype != torch.int64 or seq_lens.dtype != torch.int64:
            raise TypeError("sequence lengths and key starts must be int64")
        if not (block_tables.is_contiguous() and seq_lens.is_contiguous()
                and starts.is_contiguous()):  # fmt: skip
            raise ValueError("block tables, sequence lengths and key starts must be contiguous")
        starts_ptr = None if key_starts is None else key_starts.data_ptr()
        out = torch.empty_like(q)
        status = self._fn(
            q.data_ptr(), kv_cache.data_ptr(), out.data_ptr(), _DTYPES[kv_cache.dtype],
            block_tables.data_ptr(), seq_lens.data_ptr(), starts_ptr, num_seqs,
            block_tables.shape[1], num_layers, layer, block_size, num_heads, num_kv_heads, head_dim, scale or 1.0 / math.sqrt(head_dim), torch.get_num_threads(),
        )  # fmt: skip
        if status != 0:
            raise RuntimeError(f"paged_decode_attention failed with status {status}")
        return out

    def prefill(
        self,
        q: Tensor,
        kv_cache: Tensor,
        layer: int,
        block_table: Tensor,
        first_position: int,
        num_context: int,
        window: int | None = None,
        scale: float | None = None,
    ) -> Tensor | None:
        """Causal attention of one sequence's chunk, q (Tq, H, D) at positions num_context
        .., over its keys in the cache (the chunk's own written first): (Tq, H, D), or None
        where the kernel does not run (`csrc/paged_prefill.c`: a bfloat16 cache, head size a
        multiple of 32, a CPU with AVX-512 BF16). block_table (int64, contiguous): the
        sequence's blocks from the one holding `first_position` (0 unless windowed)."""
        num_layers, block_size, num_kv_heads, head_dim = (kv_cache.shape[1], *kv_cache.shape[3:])
        num_query, num_heads = q.shape[0], q.shape[1]
        key = (kv_cache.dtype, head_dim, num_heads // num_kv_heads)
        if key in self._prefill_declined or q.dtype != kv_cache.dtype:
            return None
        if q.stride(2) != 1 or q.stride(1) != head_dim or not kv_cache.is_contiguous():
            return None
        out = q.new_empty(num_query, num_heads, head_dim)
        status = self._prefill(
            q.data_ptr(), q.stride(0), kv_cache.data_ptr(), out.data_ptr(),
            _DTYPES.get(kv_cache.dtype, -1), block_table.data_ptr(), first_position,
            num_context, num_query, window or 0, num_layers, layer, block_size, num_heads,
            num_kv_heads, head_dim, scale or 1.0 / math.sqrt(head_dim), torch.get_num_threads(),
        )  # fmt: skip
        if status == -1:
            self._prefill_declined.add(key)
            return None
        if status != 0:
            raise RuntimeError(f"paged_prefill_attention failed with status {status}")
        return out

    def can_write(self, kv_cache: Tensor, k: Tensor, v: Tensor) -> bool:
        """Whether `write_kv` takes these tensors: the cache's dtype, on the CPU, each
        token's heads contiguous (a row of a fused q/k/v projection is)."""
        row = k.shape[1] * k.shape[2]
        return (
            kv_cache.device.type == "cpu"
            and kv_cache.is_contiguous()
            and k.dtype == v.dtype == kv_cache.dtype
            and k.device.type == v.device.type == "cpu"
            and k.shape[1:] == v.shape[1:] == kv_cache.shape[-2:]
            and k.stride(2) == v.stride(2) == 1
            and k.stride(1) == v.stride(1) == k.shape[2]
            and min(k.stride(0), v.stride(0)) >= row
        )

    def write_kv(
        self,
        kv_cache: Tensor,
        layer: int,
        k: Tensor,
        v: Tensor,
        slot_blocks: Tensor,
        slot_offsets: Tensor,
    ) -> None:
        """Store k/v (T, Hkv, D) of each token at (slot_blocks[t], slot_offsets[t]) of
        `layer` (int64, contiguous); `can_write` must hold."""
        if slot_blocks.dtype != torch.int64 or slot_offsets.dtype != torch.int64:
            raise TypeError("slots must be int64")
        slot_blocks, slot_offsets = slot_blocks.contiguous(), slot_offsets.contiguous()
        num_blocks, num_layers, _, block_size = kv_cache.shape[:4]
        status = self._write(
            k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0), kv_cache.data_ptr(),
            slot_blocks.data_ptr(), slot_offsets.data_ptr(), k.shape[0], num_blocks, num_layers,
            layer, block_size, k.shape[1] * k.shape[2], kv_cache.element_size(),
        )  # fmt: skip
        if status != 0:
            raise IndexError("a KV slot lies outside the cache")


@functools.cache
def decode_kernel() -> PagedDecodeKernel | None:
    """The compiled kernel, or None where it cannot be built here (logged once)."""
    q4_kernel()  # its probe turns AMX on for the process where it runs (prefill's tiles)
    return load_kernel(PagedDecodeKernel, "attention", "gathering K/V instead")
