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
@pytest.mark.parametrize(
    ("setting", "variable", "value"),
    [
        (native_memory.limit_malloc_arenas, "MALLOC_ARENA_MAX", "8"),
        (native_memory.raise_mmap_threshold, "MALLOC_MMAP_THRESHOLD_", "131072"),
    ],
)
def test_a_malloc_setting_applies_unless_the_environment_sets_it(
    setting, variable, value, monkeypatch
) -> None:
    monkeypatch.delenv(variable, raising=False)
    assert setting()
    monkeypatch.setenv(variable, value)
    assert not setting()
