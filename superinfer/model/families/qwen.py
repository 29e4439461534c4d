"""Qwen2/2.5 (q/k/v bias), Qwen3 (q/k norms), Qwen3-MoE (top-k routed experts) and
Qwen2-MoE (routed and shared experts)."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from superinfer.model.config import ModelConfig, gguf_common, hf_common
from superinfer.model.registry import Architecture, register
from superinfer.model.vision_language import vl_text_weights

if TYPE_CHECKING:  # the registry is read without torch (the simulator's profiles)
    from torch import Tensor


def qwen2_config(cfg: Mapping[str, Any]) -> ModelConfig:
    return ModelConfig(**{**hf_common(cfg, attention_bias=True), "o_proj_bias": False})


def qwen3_config(cfg: Mapping[str, Any]) -> ModelConfig:
    return ModelConfig(**hf_common(cfg), qk_norm=True)


def _qwen_moe_fields(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The experts of Qwen2-MoE and Qwen3-MoE, and their dense layers: those
    `mlp_only_layers` names, and all but every `decoder_sparse_step`-th."""
    num_layers, step = cfg["num_hidden_layers"], cfg.get("decoder_sparse_step", 1)
    only_mlp = cfg.get("mlp_only_layers") or []
    return {
        "num_experts": cfg.get("num_experts") or cfg["num_local_experts"],
        "num_experts_per_tok": cfg["num_experts_per_tok"],
        "moe_intermediate_size": cfg["moe_intermediate_size"],
        "norm_topk_prob": cfg.get("norm_topk_prob", False),
        "dense_layers": [i for i in range(num_layers) if i in only_mlp or (i + 1) % step],
    }


def qwen3_moe_config(cfg: Mapping[str, Any]) -> ModelConfig:
    return ModelConfig(**hf_common(cfg), qk_norm=True, **_qwen_moe_fields(cfg))


def qwen2_moe_config(cfg: Mapping[str, Any]) -> ModelConfig:
    """Qwen1.5-MoE, Qwen2-57B-A14B: Qwen2's attention (q/k/v bias: `qkv_bias`), routed
    experts and a gated shared expert."""
    fields = hf_common(cfg, attention_bias=cfg.get("qkv_bias", True))
    return ModelConfig(
        **{**fields, "o_proj_bias": False}, **_qwen_moe_fields(cfg),
        shared_expert_intermediate_size=cfg["shared_expert_intermediate_size"],
    )  # fmt: skip


def qwen2_vl_config(cfg: Mapping[str, Any]) -> ModelConfig:
    """The language model of Qwen2-VL / Qwen2.5-VL (text only): Qwen2 with M-RoPE, which on
    text alone (one position on all three axes, as transformers gives text) is plain RoPE.
    transformers 4.x states it at the top level, 5.x under `text_config`."""
    text = dict(cfg.get("text_config") or {k: v for k, v in cfg.items() if k != "vision_config"})
    key = "rope_parameters" if text.get("rope_parameters") else "rope_scaling"
    rope = dict(text.get(key) or {})
    rope.pop("mrope_section", None)
    if rope.pop("type", None) == "mrope" or rope.get("rope_type") == "mrope":
        rope["rope_type"] = "default"
    return qwen2_config({**text, key: rope, "architectures": cfg.get("architectures")})


def qwen_gguf_config(
    metadata: Mapping[str, Any], names: Collection[str], factors: Sequence[float] | None
) -> ModelConfig:
    arch = metadata["general.architecture"]
    names_by_arch = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                     "qwen3moe": "Qwen3MoeForCausalLM",
                     "qwen2moe": "Qwen2MoeForCausalLM"}  # fmt: skip
    fields = gguf_common(metadata, names, factors)
    if arch == "qwen2moe":  # llama.cpp's graph: every layer routed, top-k weights as they are
        shared = metadata.get("qwen2moe.expert_shared_feed_forward_length")
        shared = shared or fields["intermediate_size"]
        fields.update(norm_topk_prob=False, shared_expert_intermediate_size=shared)
    return ModelConfig(**fields, qk_norm=arch.startswith("qwen3"), architecture=names_by_arch[arch])


def qwen2_moe_weights(weights: Iterator[tuple[str, Tensor]], _config: ModelConfig):
    """llama.cpp stores the shared expert's gate (1, hidden) as a vector: a row again."""
    for name, tensor in weights:
        is_vector = tensor.ndim == 1 and name.endswith("shared_expert_gate.weight")
        yield name, tensor[None] if is_vector else tensor


# llama.cpp's names of Qwen2-MoE's shared expert
QWEN2_MOE_GGUF_NAMES = {"ffn_gate_inp_shexp": "mlp.shared_expert_gate",
                        "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
                        "ffn_up_shexp": "mlp.shared_expert.up_proj",
                        "ffn_down_shexp": "mlp.shared_expert.down_proj"}  # fmt: skip


register(Architecture(
    name="Qwen2ForCausalLM", family="qwen", model_types=("qwen2",), hf_config=qwen2_config,
    gguf_arch="qwen2", gguf_config=qwen_gguf_config,
    features="q/k/v projection bias; sliding window on the layers `layer_types` names",
    tested="greedy parity with transformers (tied embeddings); an AWQ checkpoint",
))  # fmt: skip
register(Architecture(
    name="Qwen3ForCausalLM", family="qwen", model_types=("qwen3",), hf_config=qwen3_config,
    gguf_arch="qwen3", gguf_config=qwen_gguf_config,
    gguf_tensor_names={"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"},
    features="RMSNorm of each query and key head before RoPE",
    tested="greedy parity with transformers; GGUF round trip (checked against llama.cpp); "
    "Q4_0/Q4_1/Q8_0 quantized execution",
))  # fmt: skip
register(Architecture(
    name="Qwen3MoeForCausalLM", family="qwen", model_types=("qwen3_moe",),
    hf_config=qwen3_moe_config,
    gguf_arch="qwen3moe", gguf_config=qwen_gguf_config,
    gguf_tensor_names={"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"},
    features="q/k norms; top-k routed experts (softmax, optional renormalisation), "
             "dense MLP on `mlp_only_layers`",
    tested="greedy parity with transformers; GGUF round trip (llama.cpp's layout, checked "
    "against llama.cpp); Q4_0/Q4_1/Q8_0/Q4_K quantized experts against the "
    "dequantized file, and through the engine",
))  # fmt: skip
register(Architecture(
    name="Qwen2MoeForCausalLM", family="qwen", model_types=("qwen2_moe",),
    hf_config=qwen2_moe_config, hf_weights=qwen2_moe_weights,
    gguf_arch="qwen2moe", gguf_config=qwen_gguf_config,
    gguf_tensor_names=QWEN2_MOE_GGUF_NAMES,
    features="q/k/v bias; top-k routed experts (softmax, optional renormalisation) and a "
             "shared expert gated by a sigmoid; dense MLP on `mlp_only_layers`",
    tested="greedy parity with transformers; GGUF round trip (llama.cpp's layout, checked "
    "against llama.cpp); Q4_0/Q4_1/Q8_0 quantized experts and shared expert against the "
    "dequantized file",
))  # fmt: skip
for _name in ("Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration"):
    register(Architecture(
        name=_name, family="qwen", model_types=(), hf_config=qwen2_vl_config,
        hf_weights=vl_text_weights,
        features="Qwen2's language model with M-RoPE, plain RoPE on text; the vision tower "
                 "is not loaded: text only",
        tested="greedy parity with transformers' own class on text",
    ))  # fmt: skip
