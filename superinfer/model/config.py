"""Architecture of a decoder-only model: the shapes and layer variants the shared decoder
(`superinfer.model.decoder`) is built from.

Each architecture family (`superinfer.model.families`) maps a Hugging Face `config.json` or
GGUF metadata onto this one dataclass; `superinfer.model.registry` picks the family.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

SLIDING = "sliding_attention"
FULL = "full_attention"


@dataclass
class ModelConfig:
    """Shapes and constants of a decoder (Llama, Mistral, Qwen2/3, Phi-3, Gemma 2/3, MoE).

    `rope_scaling` is None for plain RoPE, else a dict with a "rope_type" key: "linear"
    ({"factor"}), "llama3" ({"factor", "low_freq_factor", "high_freq_factor",
    "original_max_position_embeddings"}), "yarn", "dynamic", "longrope" (Phi-3's LongRoPE:
    {"short_factor", "long_factor", "original_max_position_embeddings",
    "max_position_embeddings"}, as transformers) or "freq_factors" ({"factors": one divisor
    per frequency}, what llama.cpp stores in a GGUF's `rope_freqs` tensor). RoPE rotates the
    first `rotary_dim` dims of each q/k head (None: all of them; fewer under a
    `partial_rotary_factor`, Phi-4-mini) and passes the others through.

    Layer variants, all off by default (Llama): `qk_norm` (RMSNorm of each q/k head, Qwen3,
    Gemma 3), `norm_offset` (norms scale by 1 + weight, Gemma), `sandwich_norm` (norms after
    attention and MLP too, Gemma 2/3), `hidden_act` ("silu" or "gelu_tanh"),
    `embedding_scale`, `attention_scale` (else 1/sqrt(head_dim)), logit soft-capping,
    Granite's multipliers (`residual_multiplier`, `logits_scaling`),
    sliding-window layers (`layer_types[i] == "sliding_attention"`, with their own RoPE base
    `local_rope_theta` if set) and a mixture of experts (`num_experts` > 0).
    """

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    rotary_dim: int | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v projections
    o_proj_bias: bool = False  # the attention output projection
    mlp_bias: bool = False  # gate/up and down projections
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    name: str = ""
    architecture: str = "LlamaForCausalLM"  # the registry's key
    qk_norm: bool = False
    norm_offset: float = 0.0
    sandwich_norm: bool = False
    hidden_act: str = "silu"
    embedding_scale: float | None = None
    is_embedding_scale_rounded: bool = True  # to the dtype first (Gemma), or not (Granite)
    attention_scale: float | None = None
    attn_logit_softcap: float | None = None
    final_logit_softcap: float | None = None
    residual_multiplier: float | None = None  # scales attention and MLP outputs (Granite)
    logits_scaling: float | None = None  # divides the logits (Granite)
    sliding_window: int | None = None
    layer_types: list[str] | None = None
    local_rope_theta: float | None = None
    local_rope_scaling: dict[str, Any] | None = None
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    shared_expert_intermediate_size: int = 0  # a gated shared expert beside them (Qwen2-MoE)
    dense_layers: list[int] = field(default_factory=list)  # MLP, not MoE, in a MoE model

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} not a multiple of {self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.num_rotary_dims % 2 or not 0 < self.num_rotary_dims <= self.head_dim:
            raise ValueError(f"RoPE cannot rotate {self.rotary_dim} of {self.head_dim} dims")
        if self.hidden_act not in ("silu", "gelu_tanh"):
            raise ValueError(f"unsupported activation {self.hidden_act!r} (silu, gelu_tanh)")
        if self.layer_types is not None and len(self.layer_types) != self.num_layers:
            raise ValueError(f"{len(self.layer_types)} layer types for {self.num_layers} layers")

    @property
    def num_rotary_dims(self) -> int:
        """The dims of each q/k head RoPE rotates (the first ones)."""
        return self.head_dim if self.rotary_dim is None else self.rotary_dim

    @property
    def eos_token_ids(self) -> list[int]:
        """The end-of-sequence ids as a list (empty when unknown)."""
        if self.eos_token_id is None:
            return []
        if isinstance(self.eos_token_id, int):
            return [self.eos_token_id]
        return list(self.eos_token_id)

    def window(self, layer: int) -> int | None:
        """The sliding window of `layer`, None where it attends to the whole context."""
        if self.sliding_window is None:
            return None
        if self.layer_types is None or self.layer_types[layer] == SLIDING:
            return self.sliding_window
        return None

    def is_moe_layer(self, layer: int) -> bool:
        return self.num_experts > 0 and layer not in self.dense_layers

    @classmethod
    def from_hf_config(cls, cfg: Mapping[str, Any]) -> ModelConfig:
        """Build from the dict of a Hugging Face `config.json` (transformers 4.x or 5.x),
        through the family the registry finds for its `architectures`."""
        from superinfer.model.registry import hf_architecture

        return hf_architecture(cfg).hf_config(cfg)

    @classmethod
    def from_gguf_metadata(
        cls,
        metadata: Mapping[str, Any],
        tensor_names: Collection[str],
        rope_freq_factors: Sequence[float] | None = None,
    ) -> ModelConfig:
        """Build from GGUF key/values (plain Python values) and the file's tensor names.

        `rope_freq_factors` are the values of a `rope_freqs.weight` tensor, if the file has one.
        """
        from superinfer.model.registry import gguf_architecture

        arch = gguf_architecture(metadata.get("general.architecture"))
        return arch.gguf_config(metadata, tensor_names, rope_freq_factors)


# --- helpers the families share -------------------------------------------------------------

# llama.cpp stores LongRoPE's factors as tensors (rope_factors_long / _short.weight);
# `gguf_checkpoint` hands their values to the config under these metadata keys
GGUF_LONG_FACTOR, GGUF_SHORT_FACTOR = "rope.scaling.long_factor", "rope.scaling.short_factor"
LONGROPE_KEYS = ("short_factor", "long_factor", "original_max_position_embeddings")
ROPE_TYPES = ("default", "linear", "llama3", "yarn", "dynamic", "longrope")
# names Phi-3's early configs gave LongRoPE (transformers reads them as "longrope")
_LONGROPE_ALIASES = ("su", "longrope")


def hf_rope(params: Mapping[str, Any] | None, theta: float) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling) from a `rope_scaling` (4.x) or `rope_parameters` (5.x)."""
    params = dict(params or {})
    theta = params.pop("rope_theta", theta)
    params.pop("partial_rotary_factor", None)  # see `hf_rotary_dim`
    rope_type = params.pop("rope_type", params.pop("type", "default"))
    if rope_type in _LONGROPE_ALIASES:
        rope_type = "longrope"
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"unsupported rope scaling type {rope_type!r} {ROPE_TYPES}")
    if rope_type == "default":
        return theta, None
    return theta, {"rope_type": rope_type, **params}


def hf_rotary_dim(cfg: Mapping[str, Any], head_dim: int) -> int | None:
    """The dims RoPE rotates, from a `partial_rotary_factor` (top level, or in the RoPE
    parameters of transformers 5.x), as transformers rounds it; None: all."""
    rope_params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    factor = cfg.get("partial_rotary_factor", rope_params.get("partial_rotary_factor", 1.0))
    return None if factor == 1.0 else int(head_dim * factor)


def hf_common(cfg: Mapping[str, Any], attention_bias: bool = False) -> dict[str, Any]:
    """The ModelConfig fields every HF config states the same way."""
    num_heads = cfg["num_attention_heads"]
    rope_params = cfg.get("rope_parameters") or cfg.get("rope_scaling")
    if rope_params and FULL in rope_params:  # per layer type (Gemma 3)
        rope_params = rope_params[FULL]
    rope_theta, rope_scaling = hf_rope(rope_params, cfg.get("rope_theta", 10000.0))
    if rope_scaling and rope_scaling["rope_type"] in ("yarn", "dynamic", "longrope"):
        rope_scaling.setdefault("max_position_embeddings", cfg.get("max_position_embeddings"))
    if rope_scaling and rope_scaling["rope_type"] == "longrope":  # Phi-3: at the top level
        rope_scaling.setdefault("original_max_position_embeddings",
                                cfg.get("original_max_position_embeddings"))  # fmt: skip
        missing = [k for k in LONGROPE_KEYS if rope_scaling.get(k) is None]
        if missing:
            raise ValueError(f"LongRoPE needs {missing} in the config")
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // num_heads
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None
    layer_types = cfg.get("layer_types")
    return {
        "hidden_size": cfg["hidden_size"],
        "intermediate_size": cfg["intermediate_size"],
        "num_layers": cfg["num_hidden_layers"],
        "num_heads": num_heads,
        "num_kv_heads": cfg.get("num_key_value_heads") or num_heads,
        "head_dim": head_dim,
        "vocab_size": cfg["vocab_size"],
        "rms_norm_eps": cfg.get("rms_norm_eps", 1e-5),
        "rope_theta": rope_theta,
        "rope_scaling": rope_scaling,
        "rotary_dim": hf_rotary_dim(cfg, head_dim),
        "max_position_embeddings": cfg.get("max_position_embeddings", 2048),
        "tie_word_embeddings": cfg.get("tie_word_embeddings", False),
        "attention_bias": cfg.get("attention_bias", attention_bias),
        # transformers: `attention_bias` gives o_proj a bias too (Qwen2's q/k/v bias does not)
        "o_proj_bias": bool(cfg.get("attention_bias", False)),
        "mlp_bias": bool(cfg.get("mlp_bias", False)),
        "bos_token_id": cfg.get("bos_token_id"),
        "eos_token_id": cfg.get("eos_token_id"),
        "name": cfg.get("_name_or_path") or cfg.get("model_type", ""),
        "architecture": (cfg.get("architectures") or [""])[0],
        "sliding_window": window,
        "layer_types": list(layer_types) if window and layer_types else None,
    }


def gguf_common(
    metadata: Mapping[str, Any],
    tensor_names: Collection[str],
    rope_freq_factors: Sequence[float] | None,
) -> dict[str, Any]:
    """The ModelConfig fields llama.cpp states the same way for every architecture."""
    arch = metadata["general.architecture"]

    def get(key: str, default: Any = None) -> Any:
        return metadata.get(f"{arch}.{key}", default)

    hidden_size, num_heads = get("embedding_length"), get("attention.head_count")
    head_dim = get("attention.key_length") or hidden_size // num_heads
    rope_dims = get("rope.dimension_count")
    return {
        "hidden_size": hidden_size,
        "intermediate_size": get("feed_forward_length"),
        "num_layers": get("block_count"),
        "num_heads": num_heads,
        "num_kv_heads": get("attention.head_count_kv") or num_heads,
        "head_dim": head_dim,
        "vocab_size": get("vocab_size"),
        "rms_norm_eps": get("attention.layer_norm_rms_epsilon", 1e-5),
        "rope_theta": get("rope.freq_base", 10000.0),
        "rope_scaling": _gguf_rope_scaling(get, rope_freq_factors),
        "rotary_dim": rope_dims if rope_dims and rope_dims < head_dim else None,
        "max_position_embeddings": get("context_length", 2048),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "attention_bias": "blk.0.attn_q.bias" in tensor_names,
        "o_proj_bias": "blk.0.attn_output.bias" in tensor_names,
        "mlp_bias": "blk.0.ffn_down.bias" in tensor_names,
        "bos_token_id": metadata.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": metadata.get("tokenizer.ggml.eos_token_id"),
        "name": metadata.get("general.name", arch),
        "sliding_window": get("attention.sliding_window"),
        # experts (Mixtral as llama, qwen3moe): llama.cpp renormalises the top-k weights
        # unless the file says otherwise
        "num_experts": get("expert_count", 0) or 0,
        "num_experts_per_tok": get("expert_used_count", 0) or 0,
        "moe_intermediate_size": get("expert_feed_forward_length") or get("feed_forward_length"),
        "norm_topk_prob": bool(get("expert_weights_norm", True)),
    }


def _gguf_rope_scaling(get: Any, rope_freq_factors: Sequence[float] | None) -> dict | None:
    if rope_freq_factors is not None:
        return {"rope_type": "freq_factors", "factors": [float(f) for f in rope_freq_factors]}
    if get(GGUF_LONG_FACTOR) is not None:  # LongRoPE (Phi-3 128k, Phi-3.5, Phi-4-mini)
        return {"rope_type": "longrope", "long_factor": get(GGUF_LONG_FACTOR),
                "short_factor": get(GGUF_SHORT_FACTOR),
                "original_max_position_embeddings": get("rope.scaling.original_context_length"),
                "max_position_embeddings": get("context_length"),
                "attention_factor": get("rope.scaling.attn_factor")}  # fmt: skip
    scaling_type = get("rope.scaling.type", "none")
    if scaling_type == "none":
        return None
    if scaling_type == "linear":
        return {"rope_type": "linear", "factor": float(get("rope.scaling.factor"))}
    raise ValueError(f"unsupported GGUF rope scaling type {scaling_type!r} (linear only)")
