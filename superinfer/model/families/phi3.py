"""Phi-3 / Phi-3.5 (mini, medium) and Phi-4-mini: checkpoints with q/k/v and gate/up
already fused; LongRoPE on the 128k-context ones, partial RoPE on Phi-4-mini."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from superinfer.model.config import ModelConfig, gguf_common, hf_common
from superinfer.model.registry import Architecture, register

if TYPE_CHECKING:
    from torch import Tensor


def phi3_config(cfg: Mapping[str, Any]) -> ModelConfig:
    return ModelConfig(**hf_common(cfg))


def phi3_weights(
    weights: Iterable[tuple[str, Tensor]], config: ModelConfig
) -> Iterator[tuple[str, Tensor]]:
    """Split the fused projections into the canonical q/k/v and gate/up names (the loader
    fuses them again, permuting q/k rows for RoPE on the way)."""
    q_size = config.num_heads * config.head_dim
    kv_size = config.num_kv_heads * config.head_dim
    for name, tensor in weights:
        stem, _, kind = name.rpartition(".")
        if stem.endswith("self_attn.qkv_proj"):
            parts = tensor.split([q_size, kv_size, kv_size])
            prefix = stem.removesuffix("qkv_proj")
            yield from ((f"{prefix}{p}_proj.{kind}", t) for p, t in zip("qkv", parts))
        elif stem.endswith("mlp.gate_up_proj"):
            gate, up = tensor.chunk(2)
            prefix = stem.removesuffix("gate_up_proj")
            yield f"{prefix}gate_proj.{kind}", gate
            yield f"{prefix}up_proj.{kind}", up
        else:
            yield name, tensor


def phi3_gguf_config(
    metadata: Mapping[str, Any], names: Collection[str], factors: Sequence[float] | None
) -> ModelConfig:
    return ModelConfig(**gguf_common(metadata, names, factors), architecture="Phi3ForCausalLM")


register(Architecture(
    name="Phi3ForCausalLM", family="phi3", model_types=("phi3",), hf_config=phi3_config,
    hf_weights=phi3_weights,
    gguf_arch="phi3", gguf_config=phi3_gguf_config,
    gguf_tensor_names={"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
    features="fused qkv_proj and gate_up_proj in the checkpoint; sliding window if set; "
    "LongRoPE (Phi-3 128k, Phi-3.5), RoPE on part of each head (Phi-4-mini)",
    tested="greedy parity with transformers (also with LongRoPE on 3/4 of each head, its "
    "factors chosen by --max-model-len); GGUF round trip (llama.cpp's layout, LongRoPE's "
    "factor tensors; checked against llama.cpp); Q4_0/Q4_1/Q8_0 quantized execution",
))  # fmt: skip
