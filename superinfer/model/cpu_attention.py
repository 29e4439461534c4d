"""Paged decode attention on CPU with a small C kernel (`csrc/paged_decode.c`).

The portable path gathers every decode sequence's K/V blocks into a batch padded to the
longest sequence and runs SDPA on it, so a step reads the cache, writes the copy, and reads
it again, padding included. Under serving load (ShareGPT, 10-20 sequences of very
different lengths) that was 40-50% of a step. The kernel reads each sequence's blocks in
place instead.

The kernel is compiled on first use with the system C compiler (`cc`, or `$CC`) into a
cache directory and loaded with ctypes; it uses torch's OpenMP runtime, so the engine
thread keeps one thread team. Where there is no compiler, the build fails, or
SUPERINFER_CPU_KERNELS=0 is set, `decode_kernel()` returns None and attention keeps the
portable path; the reason is logged once.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import math
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch
from torch import Tensor

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("csrc") / "paged_decode.c"
# vectorize the float reductions without -ffast-math (see the source's header)
CFLAGS = ["-O3", "-march=native", "-fPIC", "-shared", "-fopenmp", "-fno-math-errno",
          "-fno-trapping-math", "-fassociative-math", "-fno-signed-zeros"]  # fmt: skip
MAX_HEAD_DIM, MAX_GROUP = 256, 16  # as in the source
_DTYPES = {torch.float32: 0, torch.bfloat16: 1}
_PTR, _I64P = ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64)


class PagedDecodeKernel:
    """The loaded kernel; `__call__` mirrors the C function's contract."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._fn = library.paged_decode_attention
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = (
            [_PTR, _PTR, _PTR, ctypes.c_int, _I64P, _I64P, _I64P]
            + [ctypes.c_int] * 8
            + [ctypes.c_float, ctypes.c_int]
        )

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
        starts_ptr = None if key_starts is None else ctypes.cast(key_starts.data_ptr(), _I64P)
        out = torch.empty_like(q)
        status = self._fn(
            q.data_ptr(), kv_cache.data_ptr(), out.data_ptr(), _DTYPES[kv_cache.dtype],
            ctypes.cast(block_tables.data_ptr(), _I64P), ctypes.cast(seq_lens.data_ptr(), _I64P),
            starts_ptr, num_seqs, block_tables.shape[1], num_layers, layer, block_size, num_heads,
            num_kv_heads, head_dim, scale or 1.0 / math.sqrt(head_dim), torch.get_num_threads(),
        )  # fmt: skip
        if status != 0:
            raise RuntimeError(f"paged_decode_attention failed with status {status}")
        return out


@functools.cache
def decode_kernel() -> PagedDecodeKernel | None:
    """The compiled kernel, or None where it cannot be built here (logged once)."""
    if os.environ.get("SUPERINFER_CPU_KERNELS", "1") == "0":
        logger.info("CPU attention kernel disabled by SUPERINFER_CPU_KERNELS=0")
        return None
    try:
        return PagedDecodeKernel(ctypes.CDLL(str(_build())))
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:
        logger.warning("CPU attention kernel unavailable, gathering K/V instead: %s", error)
        return None


def _build() -> Path:
    """Compile the kernel once per source, flags, compiler and CPU; reuse it afterwards."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler found (set CC)")
    source = SOURCE.read_bytes()
    key = hashlib.sha256(
        b"\0".join([source, " ".join(CFLAGS).encode(), compiler.encode(), _cpu_signature()])
    ).hexdigest()[:16]
    target = _cache_dir() / f"paged_decode-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # build next to the target and rename: concurrent processes never see half a file
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        result = subprocess.run(
            [compiler, *CFLAGS, str(SOURCE), "-o", str(built), "-lm"], check=False,
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        if result.returncode != 0:
            raise RuntimeError(f"{compiler} failed: {result.stderr.strip()[-2000:]}")
        os.replace(built, target)
    logger.info("built the CPU attention kernel: %s", target)
    return target


def _cache_dir() -> Path:
    if "SUPERINFER_KERNEL_CACHE" in os.environ:
        return Path(os.environ["SUPERINFER_KERNEL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "superinfer" / "kernels"


def _cpu_signature() -> bytes:
    """What -march=native depends on: a cache shared between machines must not mix them."""
    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                flags = line
                break
    except OSError:
        pass
    return f"{platform.machine()} {flags}".encode()
