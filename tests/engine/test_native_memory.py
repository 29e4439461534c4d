"""The CPU engine's native-heap settings: glibc's arena cap and mmap threshold, left to the
user when set."""

from __future__ import annotations

import ctypes

import pytest

from superinfer.engine import native_memory


def _is_glibc() -> bool:
    try:
        ctypes.CDLL("libc.so.6").mallopt  # noqa: B018
        return True
    except (OSError, AttributeError):
        return False


@pytest.mark.skipif(not _is_glibc(), reason="glibc only")
def test_the_arena_cap_applies_unless_the_environment_sets_one(monkeypatch) -> None:
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert native_memory.limit_malloc_arenas()
    monkeypatch.setenv("MALLOC_ARENA_MAX", "8")
    assert not native_memory.limit_malloc_arenas()


@pytest.mark.skipif(not _is_glibc(), reason="glibc only")
def test_the_mmap_threshold_rises_unless_the_environment_sets_one(monkeypatch) -> None:
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    assert native_memory.raise_mmap_threshold()
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    assert not native_memory.raise_mmap_threshold()
