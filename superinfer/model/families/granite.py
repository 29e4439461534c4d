"""IBM Granite 3.x: Llama's layers with four multipliers (embedding, attention scale,
residual branches, logits)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from superinfer.model.config import ModelConfig, hf_common
from superinfer.model.registry import Architecture, register


def granite_config(cfg: Mapping[str, Any]) -> ModelConfig:
    return ModelConfig(
        **hf_common(cfg),
        embedding_scale=cfg.get("embedding_multiplier", 1.0),
        is_embedding_scale_rounded=False,
        attention_scale=cfg.get("attention_multiplier", 1.0),
        residual_multiplier=cfg.get("residual_multiplier", 1.0),
        logits_scaling=cfg.get("logits_scaling", 1.0),
    )


register(Architecture(
    name="GraniteForCausalLM", family="granite", model_types=("granite",),
    hf_config=granite_config,
    features="embedding, attention, residual and logit multipliers (no GGUF: transformers "
             "reads no tokenizer of a `granite` GGUF)",
    tested="greedy parity with transformers, also through the flat CPU decode loop",
))  # fmt: skip
