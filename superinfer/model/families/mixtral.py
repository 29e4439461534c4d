"""Mixtral: Mistral's attention with top-k routed SwiGLU experts (renormalised weights)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from superinfer.model.config import ModelConfig, hf_common
from superinfer.model.registry import Architecture, register

if TYPE_CHECKING:
    from torch import Tensor

_EXPERT = re.compile(r"\.block_sparse_moe\.experts\.(\d+)\.w([123])\.")
_PROJ = {"1": "gate_proj", "2": "down_proj", "3": "up_proj"}


def mixtral_config(cfg: Mapping[str, Any]) -> ModelConfig:
    return ModelConfig(
        **hf_common(cfg), num_experts=cfg["num_local_experts"],
        num_experts_per_tok=cfg["num_experts_per_tok"],
        moe_intermediate_size=cfg["intermediate_size"], norm_topk_prob=True,
    )  # fmt: skip


def mixtral_weights(
    weights: Iterable[tuple[str, Tensor]], config: ModelConfig
) -> Iterator[tuple[str, Tensor]]:
    """`block_sparse_moe.experts.3.w1` -> `mlp.experts.3.gate_proj` (w3 up, w2 down)."""
    for name, tensor in weights:
        name = _EXPERT.sub(lambda m: f".mlp.experts.{m[1]}.{_PROJ[m[2]]}.", name)
        yield name.replace(".block_sparse_moe.gate.", ".mlp.gate."), tensor


register(Architecture(
    name="MixtralForCausalLM", family="mixtral", model_types=("mixtral",),
    hf_config=mixtral_config, hf_weights=mixtral_weights,
    features="top-k routed experts, renormalised; sliding window if set; GGUF files are "
    "llama.cpp's `llama` with experts",
    tested="greedy parity with transformers; GGUF round trip (llama.cpp's layout, checked "
    "against llama.cpp); Q4_0/Q4_1/Q8_0 quantized experts against the dequantized file",
))  # fmt: skip
