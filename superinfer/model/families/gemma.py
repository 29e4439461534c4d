"""Gemma, Gemma 2 and Gemma 3 (text; of Gemma 3's vision-language checkpoints, the
language model): norms that scale by 1 + weight, a scaled embedding,
GELU (tanh) MLP, tied embeddings; Gemma 2/3 add norms after attention and MLP, interleaved
sliding/global layers and a query scale of `query_pre_attn_scalar`; Gemma 2 soft-caps
attention and final logits, Gemma 3 normalises q/k heads and gives local layers their own
RoPE base."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from superinfer.model.config import FULL, SLIDING, ModelConfig, gguf_common, hf_common, hf_rope
from superinfer.model.registry import Architecture, register
from superinfer.model.vision_language import vl_text_config, vl_text_weights


def _gemma_fields(cfg: Mapping[str, Any]) -> dict[str, Any]:
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in ("gelu_pytorch_tanh", "gelu"):  # transformers runs Gemma's "gelu" as tanh
        raise ValueError(f"unsupported Gemma activation {act!r}")
    return dict(
        hf_common(cfg),
        tie_word_embeddings=cfg.get("tie_word_embeddings", True),
        norm_offset=1.0,
        hidden_act="gelu_tanh",
        embedding_scale=cfg["hidden_size"] ** 0.5,
    )


def gemma_config(cfg: Mapping[str, Any]) -> ModelConfig:
    return ModelConfig(**_gemma_fields(cfg))


def gemma2_config(cfg: Mapping[str, Any]) -> ModelConfig:
    fields = _gemma_fields(cfg)
    if fields["sliding_window"] and fields["layer_types"] is None:  # 4.x: even layers local
        fields["layer_types"] = [
            SLIDING if i % 2 == 0 else FULL for i in range(fields["num_layers"])
        ]
    return ModelConfig(
        **fields, sandwich_norm=True,
        attention_scale=cfg.get("query_pre_attn_scalar", fields["head_dim"]) ** -0.5,
        attn_logit_softcap=cfg.get("attn_logit_softcapping"),
        final_logit_softcap=cfg.get("final_logit_softcapping"),
    )  # fmt: skip


def gemma3_config(cfg: Mapping[str, Any]) -> ModelConfig:
    config = gemma2_config(cfg)
    if config.sliding_window and cfg.get("layer_types") is None:  # 4.x: 5 local, 1 global
        pattern = cfg.get("sliding_window_pattern", 6)
        config.layer_types = [
            FULL if (i + 1) % pattern == 0 else SLIDING for i in range(config.num_layers)
        ]
    rope = cfg.get("rope_parameters") or {}
    if SLIDING in rope:
        local_theta, local_scaling = hf_rope(rope[SLIDING], 10000.0)
    else:
        local_theta, local_scaling = cfg.get("rope_local_base_freq", 10000.0), None
    config.qk_norm = True
    config.local_rope_theta, config.local_rope_scaling = local_theta, local_scaling
    return config


def gemma3_vl_config(cfg: Mapping[str, Any]) -> ModelConfig:
    """The language model of a Gemma 3 vision-language checkpoint (4B and up);
    gemma-3-4b-it's `text_config` states 6 fields and leaves heads, head_dim, vocabulary
    and RoPE bases to transformers' defaults (`vl_text_config`)."""
    return gemma3_config(vl_text_config(cfg, "gemma3_text"))


# llama.cpp's names for Gemma 2/3's layer tensors (its `ffn_norm` is the pre-MLP norm)
GEMMA_GGUF_NAMES = {
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}  # fmt: skip
# llama.cpp's constants, which the files do not state: Gemma 2 alternates local and global
# layers, Gemma 3 has five local layers then a global one, whose RoPE base is 10,000
GGUF_SWA_PATTERN = {"gemma2": 2, "gemma3": 6}
GEMMA3_GGUF_LOCAL_ROPE_THETA = 10000.0
GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}


def gemma_gguf_config(
    metadata: Mapping[str, Any], names: Collection[str], factors: Sequence[float] | None
) -> ModelConfig:
    """A llama.cpp `gemma2` or `gemma3` file, with llama.cpp's conventions: its converter
    stores every norm weight as 1 + weight (so no offset here); the local layers' pattern
    (and Gemma 3's local RoPE base) are its constants; the query scale is 1/sqrt(head_dim),
    or 1/sqrt(hidden / heads) for the 27B models, as llama.cpp sets it (the file does not
    state it). Gemma 2 soft-caps as the file says."""
    fields = gguf_common(metadata, names, factors)
    arch = metadata["general.architecture"]
    pattern = int(metadata.get(f"{arch}.attention.sliding_window_pattern", GGUF_SWA_PATTERN[arch]))
    num_layers, hidden = fields["num_layers"], fields["hidden_size"]
    is_27b = num_layers == GEMMA_27B_LAYERS[arch]
    query_dim = hidden // fields["num_heads"] if is_27b else fields["head_dim"]
    is_gemma3 = arch == "gemma3"
    return ModelConfig(
        **fields,
        architecture="Gemma3ForCausalLM" if is_gemma3 else "Gemma2ForCausalLM",
        hidden_act="gelu_tanh",
        embedding_scale=hidden**0.5,
        sandwich_norm=True,
        qk_norm=is_gemma3,
        attention_scale=query_dim**-0.5,
        attn_logit_softcap=metadata.get(f"{arch}.attn_logit_softcapping"),
        final_logit_softcap=metadata.get(f"{arch}.final_logit_softcapping"),
        layer_types=[FULL if (i + 1) % pattern == 0 else SLIDING for i in range(num_layers)],
        local_rope_theta=GEMMA3_GGUF_LOCAL_ROPE_THETA if is_gemma3 else None,
    )


register(Architecture(
    name="GemmaForCausalLM", family="gemma", model_types=("gemma",), hf_config=gemma_config,
    features="norms scale by 1 + weight; embedding scaled by sqrt(hidden); GELU (tanh)",
    tested="greedy parity with transformers",
))  # fmt: skip
register(Architecture(
    name="Gemma2ForCausalLM", family="gemma", model_types=("gemma2",),
    hf_config=gemma2_config,
    gguf_arch="gemma2", gguf_config=gemma_gguf_config, gguf_tensor_names=GEMMA_GGUF_NAMES,
    features="Gemma's norms, plus norms after attention and MLP; sliding/global layers; "
             "attention and final logit soft-capping; query scale query_pre_attn_scalar",
    tested="greedy parity with transformers, window shorter than the sequences; GGUF "
    "round trip (llama.cpp's layout, checked against llama.cpp)",
))  # fmt: skip
register(Architecture(
    name="Gemma3ForCausalLM", family="gemma", model_types=("gemma3_text",),
    hf_config=gemma3_config,
    gguf_arch="gemma3", gguf_config=gemma_gguf_config, gguf_tensor_names=GEMMA_GGUF_NAMES,
    features="Gemma 2's layers without soft-capping, with q/k norms; local layers have "
             "their own RoPE base (text only)",
    tested="greedy parity with transformers, window shorter than the sequences; GGUF "
    "round trip (llama.cpp's layout, checked against llama.cpp)",
))  # fmt: skip
register(Architecture(
    name="Gemma3ForConditionalGeneration", family="gemma", model_types=("gemma3",),
    hf_config=gemma3_vl_config, hf_weights=vl_text_weights,
    features="Gemma 3's language model (4B and up); the vision tower is not loaded: text "
             "only",
    tested="greedy parity with transformers' Gemma3ForConditionalGeneration on text; "
    "gemma-3-4b-it's config.json as stated",
))  # fmt: skip
