"""Keep a long-running CPU engine's native heap from creeping up.

glibc malloc gives each thread that allocates (OpenMP workers, the engine thread, transfer
threads, the server's) an arena of its own, up to 8 per core, and keeps the free memory of
each for reuse. Varied batch shapes leave that free memory fragmented across arenas, so
the resident memory creeps up under sustained load while the live memory stays the same.
Two arenas and a trim now and then (free pages returned to the OS) keep it level; neither
slows a step measurably. The bigger source of growth, oneDNN building code per input shape,
is handled where the shapes are made (`superinfer.model.cpu_linear`).

`MALLOC_ARENA_MAX` in the environment wins over the arena cap.
"""

from __future__ import annotations

import ctypes
import os

_M_ARENA_MAX = -8  # mallopt parameter (glibc's malloc.h)
NUM_ARENAS = 2


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


def release_free_memory() -> None:
    """Return the heap's free pages to the OS (glibc's malloc_trim); a no-op elsewhere."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
