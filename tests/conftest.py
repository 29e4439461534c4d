"""Shared fixtures. Tests that load the real model are marked `slow` (they still run in CI)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
