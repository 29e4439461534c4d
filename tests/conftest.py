"""Shared fixtures. Tests that load the real model are marked `slow` (they still run in CI)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Triton reads TRITON_INTERPRET when it decorates a kernel (at import): set before any
# import of triton, so that the Triton attention backend runs in its CPU interpreter here
if os.environ.get("CUDA_VISIBLE_DEVICES", "unset") == "" or not os.path.exists("/dev/nvidia0"):
    os.environ.setdefault("TRITON_INTERPRET", "1")
