"""The tokenizer that counts a workload's prompt tokens and synthesizes its prompts."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def load_tokenizer(path: str | None = None) -> PreTrainedTokenizerBase:
    """The tokenizer of a Hugging Face directory or hub name or of a .gguf file (None: the
    default model's), loaded as the engine loads it, so a workload counts tokens as the
    server does (a GGUF file's converted vocabulary is cached on disk)."""
    from superinfer.model.tokenizer import load_tokenizer as load_model_tokenizer

    if path is None:
        from superinfer.model.loader import default_model_path

        path = default_model_path()
    return load_model_tokenizer(path)
