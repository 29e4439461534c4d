"""The C kernels of the CPU path (`csrc/*.c`), built into one library at first use.

The library is compiled with the system C compiler (`cc`, or `$CC`) into a cache directory
keyed by the sources, flags, compiler and CPU, and loaded with ctypes; it uses torch's
OpenMP runtime, so the engine thread keeps one thread team. Each user
(`cpu_attention.decode_kernel`, `cpu_norm.norm_kernel`) loads it once and logs why not
where it cannot: no compiler, a failed build, or SUPERINFER_CPU_KERNELS=0. Every kernel has
a PyTorch path that is used instead.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch

logger = logging.getLogger(__name__)
T = TypeVar("T")

SOURCE_DIR = Path(__file__).with_name("csrc")
# the dtypes the kernels take, as the code they pass (is_bf16)
KERNEL_DTYPES = {torch.float32: 0, torch.bfloat16: 1}
# vectorize the float reductions without -ffast-math (see paged_decode.c's header)
CFLAGS = ["-O3", "-march=native", "-fPIC", "-shared", "-fopenmp", "-fno-math-errno",
          "-fno-trapping-math", "-fassociative-math", "-fno-signed-zeros"]  # fmt: skip


@dataclass(frozen=True)
class KernelCall:
    """A linear layer as one call of a C GEMV or GEMM, all of which take
    (x, x_stride, num_rows, num_in, packed, scales, bias, y, num_out, num_threads): the
    function's address and the addresses of the weights it reads (`bias` 0: none). Valid
    while the layer holding those weights lives (`csrc/decode_layers.c` calls it)."""

    fn: int
    packed: int
    scales: int
    bias: int
    num_in: int
    num_out: int

    @classmethod
    def of(cls, fn: ctypes._CFuncPtr, packed: torch.Tensor, scales: torch.Tensor,
           bias: torch.Tensor | None, num_in: int, num_out: int) -> KernelCall:  # fmt: skip
        address = ctypes.cast(fn, ctypes.c_void_p).value
        return cls(address, packed.data_ptr(), scales.data_ptr(),
                   0 if bias is None else bias.data_ptr(), num_in, num_out)  # fmt: skip


class KernelsDisabled(RuntimeError):
    """SUPERINFER_CPU_KERNELS=0 is set."""


def load_library() -> ctypes.CDLL:
    """The built library. Raises KernelsDisabled under SUPERINFER_CPU_KERNELS=0; OSError,
    RuntimeError or SubprocessError when it cannot be built or loaded."""
    if os.environ.get("SUPERINFER_CPU_KERNELS", "1") == "0":
        raise KernelsDisabled("disabled by SUPERINFER_CPU_KERNELS=0")
    return ctypes.CDLL(str(_build()))


def load_kernel(wrap: Callable[[ctypes.CDLL], T], what: str, instead: str) -> T | None:
    """`wrap(library)`, or None where the library cannot be had here, with the reason
    logged (`what` names the kernel, `instead` the PyTorch path used in its place)."""
    try:
        return wrap(load_library())
    except KernelsDisabled as reason:
        logger.info("CPU %s kernel off: %s", what, reason)
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:
        logger.warning("CPU %s kernel unavailable, %s: %s", what, instead, error)
    return None


def _build() -> Path:
    """Compile the kernels once per sources, flags, compiler and CPU; reuse them afterwards."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler found (set CC)")
    sources = sorted(SOURCE_DIR.glob("*.c"))
    headers = sorted(SOURCE_DIR.glob("*.h"))
    parts = [p.read_bytes() for p in sources + headers]
    parts += [" ".join(CFLAGS).encode(), compiler.encode(), _cpu_signature()]
    key = hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]
    target = _cache_dir() / f"superinfer_cpu-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # build next to the target and rename: concurrent processes never see half a file
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        result = subprocess.run(
            [compiler, *CFLAGS, f"-I{SOURCE_DIR}", *map(str, sources), "-o", str(built), "-lm"],
            check=False, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        if result.returncode != 0:
            raise RuntimeError(f"{compiler} failed: {result.stderr.strip()[-2000:]}")
        os.replace(built, target)
    logger.info("built the CPU kernels: %s", target)
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
