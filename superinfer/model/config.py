"""Architecture of a Llama-family model, read from a HF `config.json` or GGUF metadata."""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

# HF model_type -> whether q/k/v projections carry a bias by default
HF_ARCHITECTURES = {"llama": False, "mistral": False, "qwen2": True}
GGUF_ARCHITECTURES = ("llama", "mistral", "qwen2")


@dataclass
class ModelConfig:
    """Shapes and constants of a Llama-family decoder (Llama, SmolLM, Mistral, Qwen2).

    `rope_scaling` is None for plain RoPE, else a dict with a "rope_type" key: "linear"
    ({"factor"}), "llama3" ({"factor", "low_freq_factor", "high_freq_factor",
    "original_max_position_embeddings"}) or "freq_factors" ({"factors": one divisor per
    frequency}, what llama.cpp stores in a GGUF's `rope_freqs` tensor).
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
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    name: str = ""

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} not a multiple of {self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")

    @property
    def eos_token_ids(self) -> list[int]:
        """The end-of-sequence ids as a list (empty when unknown)."""
        if self.eos_token_id is None:
            return []
        if isinstance(self.eos_token_id, int):
            return [self.eos_token_id]
        return list(self.eos_token_id)

    @classmethod
    def from_hf_config(cls, cfg: Mapping[str, Any]) -> ModelConfig:
        """Build from the dict of a Hugging Face `config.json` (transformers 4.x or 5.x)."""
        model_type = cfg.get("model_type", "")
        if model_type not in HF_ARCHITECTURES:
            raise ValueError(
                f"unsupported architecture {model_type!r} ({cfg.get('architectures')}); "
                f"supported model_type values: {sorted(HF_ARCHITECTURES)}"
            )
        _warn_sliding_window(cfg)
        num_heads = cfg["num_attention_heads"]
        rope_theta, rope_scaling = _hf_rope(cfg)
        return cls(
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=cfg.get("num_key_value_heads") or num_heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // num_heads,
            vocab_size=cfg["vocab_size"],
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-5),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            attention_bias=cfg.get("attention_bias", HF_ARCHITECTURES[model_type]),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_id=cfg.get("eos_token_id"),
            name=cfg.get("_name_or_path") or model_type,
        )

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
        arch = metadata.get("general.architecture")
        if arch not in GGUF_ARCHITECTURES:
            raise ValueError(
                f"unsupported GGUF architecture {arch!r}; supported: {GGUF_ARCHITECTURES}"
            )

        def get(key: str, default: Any = None) -> Any:
            return metadata.get(f"{arch}.{key}", default)

        hidden_size, num_heads = get("embedding_length"), get("attention.head_count")
        head_dim = get("attention.key_length") or hidden_size // num_heads
        return cls(
            hidden_size=hidden_size,
            intermediate_size=get("feed_forward_length"),
            num_layers=get("block_count"),
            num_heads=num_heads,
            num_kv_heads=get("attention.head_count_kv") or num_heads,
            head_dim=head_dim,
            vocab_size=get("vocab_size"),
            rms_norm_eps=get("attention.layer_norm_rms_epsilon", 1e-5),
            rope_theta=get("rope.freq_base", 10000.0),
            rope_scaling=_gguf_rope_scaling(get, rope_freq_factors),
            max_position_embeddings=get("context_length", 2048),
            tie_word_embeddings="output.weight" not in tensor_names,
            attention_bias="blk.0.attn_q.bias" in tensor_names,
            bos_token_id=metadata.get("tokenizer.ggml.bos_token_id"),
            eos_token_id=metadata.get("tokenizer.ggml.eos_token_id"),
            name=metadata.get("general.name", arch),
        )


def _hf_rope(cfg: Mapping[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling) from `rope_scaling` (4.x) or `rope_parameters` (5.x)."""
    params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    theta = params.pop("rope_theta", cfg.get("rope_theta", 10000.0))
    rope_type = params.pop("rope_type", params.pop("type", "default"))
    if rope_type == "default":
        return theta, None
    if rope_type not in ("linear", "llama3"):
        raise ValueError(f"unsupported rope scaling type {rope_type!r} (default, linear, llama3)")
    return theta, {"rope_type": rope_type, **params}


def _gguf_rope_scaling(get: Any, rope_freq_factors: Sequence[float] | None) -> dict | None:
    if rope_freq_factors is not None:
        return {"rope_type": "freq_factors", "factors": [float(f) for f in rope_freq_factors]}
    scaling_type = get("rope.scaling.type", "none")
    if scaling_type == "none":
        return None
    if scaling_type == "linear":
        return {"rope_type": "linear", "factor": float(get("rope.scaling.factor"))}
    raise ValueError(f"unsupported GGUF rope scaling type {scaling_type!r} (linear only)")


def _warn_sliding_window(cfg: Mapping[str, Any]) -> None:
    window = cfg.get("sliding_window")
    uses_window = cfg.get("use_sliding_window", cfg.get("model_type") == "mistral")
    if uses_window and window and window < cfg.get("max_position_embeddings", 0):
        logger.warning("sliding window attention (%d) is not implemented: full attention is "
                       "used, outputs differ beyond %d tokens", window, window)
