"""Llama 2/3.x (and SmolLM, which is Llama) and Mistral, with its sliding window; of
Mistral 3's vision-language checkpoints, the language model."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from superinfer.model.config import ModelConfig, gguf_common, hf_common
from superinfer.model.registry import Architecture, register
from superinfer.model.vision_language import vl_text_config, vl_text_weights


def llama_config(cfg: Mapping[str, Any]) -> ModelConfig:
    return ModelConfig(**hf_common(cfg))


def mistral3_config(cfg: Mapping[str, Any]) -> ModelConfig:
    """The language model of a Mistral 3 vision-language checkpoint (Mistral Small 3.1
    and 3.2): a Mistral decoder (`vl_text_config`)."""
    return llama_config(vl_text_config(cfg, "mistral"))


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
register(Architecture(
    name="Mistral3ForConditionalGeneration", family="llama", model_types=("mistral3",),
    hf_config=mistral3_config, hf_weights=vl_text_weights,
    features="Mistral's language model (Mistral Small 3.1, 3.2); the vision tower is not "
             "loaded: text only",
    tested="greedy parity with transformers' Mistral3ForConditionalGeneration on text",
))  # fmt: skip
