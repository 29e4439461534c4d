"""Llama-family models over a paged, block-first KV cache, and their loaders."""

from __future__ import annotations

from typing import Any

from superinfer.model.config import ModelConfig

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
    # torch and transformers only when asked for: the registry and the config mapping stay
    # importable without them (the simulator's profiles read them)
    if name in ("AttentionMetadata", "SeqEntry"):
        from superinfer.model import attention

        return getattr(attention, name)
    if name == "LlamaForCausalLM":
        from superinfer.model.llama import LlamaForCausalLM

        return LlamaForCausalLM
    if name in ("LoadedModel", "default_model_path", "load_model"):
        from superinfer.model import loader

        return getattr(loader, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
