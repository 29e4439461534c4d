"""Keep a long-running CPU engine's native heap from creeping up.

glibc malloc gives each thread that allocates (OpenMP workers, the engine thread, transfer
threads, the server's) an arena of its own, up to 8 per core, and keeps the free memory of
each for reuse. Varied batch shapes leave that free memory fragmented across arenas, so
the resident memory creeps up under sustained load while the live memory stays the same.
Two arenas and a trim now and then (free pages returned to the OS) keep it level; neither
slows a step measurably. The bigger source of growth, oneDNN building code per input shape,
is handled where the shapes are made (`superinfer.model.cpu_linear`).

`MALLOC_ARENA_MAX` in the environment wins over the arena cap.

The engine also serves allocations of up to 32 MiB from the heap rather than each from a
mapping of its own (`raise_mmap_threshold`). glibc starts by mapping anything over 128 KiB
separately, page-aligned, and raises that threshold only once such a block is freed. The
loader now swaps quantized layers in before the model exists (`model/quant.py`), so their
packed weights came first, each page-aligned, and the default model's single-request
decode step took about 5% longer (docs/results/models/q6k_gemm_1205/). Before, the freed
dense weights had raised the threshold first. The likely cause is many arrays at the same
offset in a page, read together by one GEMV, contending for the same cache sets.

`MALLOC_MMAP_THRESHOLD_` in the environment wins over that.
"""

from __future__ import annotations

import ctypes
import os

_M_ARENA_MAX = -8  # mallopt parameters (glibc's malloc.h)
_M_MMAP_THRESHOLD = -3
NUM_ARENAS = 2
MMAP_THRESHOLD = 32 << 20  # the most glibc's own dynamic threshold reaches on 64-bit


def _glibc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc
        return None


def limit_malloc_arenas() -> bool:
    """Cap glibc's malloc arenas (call early, before threads allocate). False off glibc."""
    libc = _glibc()
    if libc is None or "MALLOC_ARENA_MAX" in os.environ:
        return False
    return bool(libc.mallopt(_M_ARENA_MAX, NUM_ARENAS))


def raise_mmap_threshold() -> bool:
    """Serve allocations of up to MMAP_THRESHOLD bytes from the heap (call early, before
    the model is loaded). False off glibc."""
    libc = _glibc()
    if libc is None or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))


def release_free_memory() -> None:
    """Return the heap's free pages to the OS (glibc's malloc_trim); a no-op elsewhere."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
