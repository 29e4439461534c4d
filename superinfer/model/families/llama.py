"""Llama 2/3.x (and SmolLM, which is Llama) and Mistral, with its sliding window."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from superinfer.model.config import ModelConfig, gguf_common, hf_common
from superinfer.model.registry import Architecture, register


def llama_config(cfg: Mapping[str, Any]) -> ModelConfig:
    return ModelConfig(**hf_common(cfg))


def llama_gguf_config(
    metadata: Mapping[str, Any], names: Collection[str], factors: Sequence[float] | None
) -> ModelConfig:
    fields = gguf_common(metadata, names, factors)
    arch = metadata["general.architecture"]
    name = "Mixtral" if fields["num_experts"] else arch.capitalize()  # Mixtral is llama + experts
    return ModelConfig(**fields, architecture=f"{name}ForCausalLM")


register(Architecture(
    name="LlamaForCausalLM", family="llama", model_types=("llama",), hf_config=llama_config,
    gguf_arch="llama", gguf_config=llama_gguf_config, gguf_interleaved_qk=True,
    features="RoPE with linear or llama3 scaling",
    tested="greedy parity with transformers (llama3, linear, yarn, dynamic RoPE); GGUF round "
    "trip (checked against llama.cpp); Q4_0/Q4_1/Q8_0/Q4_K quantized execution; AWQ, GPTQ "
    "and FP8 checkpoints; the default model (GGUF Q4_1)",
))  # fmt: skip
register(Architecture(
    name="MistralForCausalLM", family="llama", model_types=("mistral",), hf_config=llama_config,
    gguf_arch="mistral", gguf_config=llama_gguf_config, gguf_interleaved_qk=True,
    features="sliding-window attention (every layer) when `sliding_window` is set: blocks "
    "out of the window are skipped and freed",
    tested="greedy parity with transformers, window shorter than the sequences; with "
    "blocks freed, 72 tokens past a window of 24, also under KV pressure",
))  # fmt: skip
