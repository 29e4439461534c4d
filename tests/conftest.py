"""Shared fixtures. Tests that load the real model are marked `slow` (they still run in CI)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

# Triton reads TRITON_INTERPRET when it decorates a kernel (at import): set before any
# import of triton, so that without a GPU the Triton backend runs in its CPU interpreter
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
