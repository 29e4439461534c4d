"""Errors raised by the KV bookkeeping."""

from __future__ import annotations


class KVInvariantError(AssertionError):
    """A KV bookkeeping invariant does not hold (a bug, never a user error)."""


class OutOfBlocksError(RuntimeError):
    """A tier has fewer free blocks than asked for; callers ask `can_*` first."""
