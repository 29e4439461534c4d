"""Llama-family models over a paged, block-first KV cache, and their loaders."""

from __future__ import annotations

from typing import Any

from superinfer.model.attention import AttentionMetadata, SeqEntry
from superinfer.model.config import ModelConfig
from superinfer.model.llama import LlamaForCausalLM

__all__ = [
    "AttentionMetadata",
    "LlamaForCausalLM",
    "LoadedModel",
    "ModelConfig",
    "SeqEntry",
    "default_model_path",
    "load_model",
]


def __getattr__(name: str) -> Any:
    # the loader imports transformers (slow): only when asked for
    if name in ("LoadedModel", "default_model_path", "load_model"):
        from superinfer.model import loader

        return getattr(loader, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
