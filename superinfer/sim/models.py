"""Model profiles from config dimensions: parameter counts, FLOPs and KV bytes.

Only shapes matter to the simulator. A profile is built from a Hugging Face `config.json`
(a dict, or a local model directory) mapped through the model registry's config mapping
(`superinfer.model.registry`, the one the loader uses), so any registered architecture
has a profile and an unknown one is refused with the registry's error. The named profiles
(`MODELS`) are the real configs' numbers, kept here as HF-style dicts.

Parameters are counted from the dimensions (no checkpoint is read): attention (q, k, v,
o), the gated MLP (three matrices per expert), embeddings and the LM head; norms, biases
and q/k norms are too small to matter. For a mixture of experts, `num_active_params`
counts the `num_experts_per_token` experts a token goes through; all experts' weights
still occupy memory and are read by a step that routes tokens to them. Layers a MoE model
keeps dense (`num_dense_layers`) have one MLP of `dense_intermediate_size`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from superinfer.model.config import ModelConfig

NUM_KV = 2  # K and V


@dataclass(frozen=True)
class ModelProfile:
    name: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    num_experts: int = 1
    num_experts_per_token: int = 1
    is_tied_embeddings: bool = False
    bytes_per_param: int = 2  # bf16 weights
    bytes_per_kv: int = 2  # bf16 KV cache
    max_model_len: int = 8192
    num_dense_layers: int = 0  # layers of a MoE model with a dense MLP instead of experts
    dense_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0  # a shared expert in each MoE layer (Qwen2-MoE)

    @classmethod
    def from_model_config(
        cls, config: ModelConfig, name: str | None = None, max_model_len: int | None = None
    ) -> ModelProfile:
        """The profile of a registry-mapped config (max_model_len: the config's context by
        default; a serving choice, so the named profiles set their own)."""
        moe = config.num_experts > 0
        num_dense = len([i for i in range(config.num_layers) if not config.is_moe_layer(i)])
        return cls(
            name=name or config.name,
            num_layers=config.num_layers,
            hidden_size=config.hidden_size,
            intermediate_size=config.moe_intermediate_size if moe else config.intermediate_size,
            num_heads=config.num_heads,
            num_kv_heads=config.num_kv_heads,
            head_dim=config.head_dim,
            vocab_size=config.vocab_size,
            num_experts=config.num_experts if moe else 1,
            num_experts_per_token=config.num_experts_per_tok if moe else 1,
            is_tied_embeddings=config.tie_word_embeddings,
            max_model_len=max_model_len or config.max_position_embeddings,
            num_dense_layers=num_dense if moe else 0,
            dense_intermediate_size=config.intermediate_size if moe and num_dense else 0,
            shared_expert_intermediate_size=config.shared_expert_intermediate_size,
        )

    @classmethod
    def from_hf_config(
        cls, cfg: Mapping[str, Any], name: str | None = None, max_model_len: int | None = None
    ) -> ModelProfile:
        """The profile of a `config.json` dict, through the registry's mapping (a
        ValueError naming the supported architectures for an unknown one)."""
        from superinfer.model.config import ModelConfig  # torch-free, as the registry

        return cls.from_model_config(ModelConfig.from_hf_config(cfg), name, max_model_len)

    @classmethod
    def from_hf_dir(cls, path: str | Path, max_model_len: int | None = None) -> ModelProfile:
        """The profile of a local Hugging Face model directory (its `config.json`)."""
        path = Path(path)
        config_file = path if path.is_file() else path / "config.json"
        cfg = json.loads(config_file.read_text())
        return cls.from_hf_config(cfg, str(path), max_model_len)

    # --- parameters -----------------------------------------------------------------------
    @property
    def num_attention_params_per_layer(self) -> int:
        q_and_o = 2 * self.hidden_size * self.num_heads * self.head_dim
        k_and_v = 2 * self.hidden_size * self.num_kv_heads * self.head_dim
        return q_and_o + k_and_v

    @property
    def num_expert_params(self) -> int:
        """One expert's gated MLP: gate, up and down projections."""
        return 3 * self.hidden_size * self.intermediate_size

    @property
    def num_embedding_params(self) -> int:
        tables = 1 if self.is_tied_embeddings else 2
        return tables * self.vocab_size * self.hidden_size

    @property
    def num_moe_layers(self) -> int:
        """Layers whose MLP is `num_experts` experts (every layer of a dense model)."""
        return self.num_layers - self.num_dense_layers

    @property
    def num_dense_mlp_params(self) -> int:
        """What every token of a MoE model goes through besides attention: the dense MLPs of
        its dense layers and the shared experts (with their gates) of its MoE layers."""
        dense = self.num_dense_layers * 3 * self.hidden_size * self.dense_intermediate_size
        shared = 3 * self.hidden_size * self.shared_expert_intermediate_size + self.hidden_size
        return dense + (self.num_moe_layers * shared if self.shared_expert_intermediate_size else 0)

    def _num_params(self, num_experts: int) -> int:
        router = self.hidden_size * self.num_experts if self.num_experts > 1 else 0
        experts = self.num_moe_layers * (num_experts * self.num_expert_params + router)
        attention = self.num_layers * self.num_attention_params_per_layer
        return attention + experts + self.num_dense_mlp_params + self.num_embedding_params

    @property
    def num_params(self) -> int:
        """All parameters (what the weights occupy)."""
        return self._num_params(self.num_experts)

    @property
    def num_active_params(self) -> int:
        """Parameters one token goes through."""
        return self._num_params(self.num_experts_per_token)

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.bytes_per_param

    # --- compute --------------------------------------------------------------------------
    @property
    def matmul_flops_per_token(self) -> int:
        """2 x active parameters, less the input embedding (a lookup, not a matmul)."""
        return 2 * (self.num_active_params - self.vocab_size * self.hidden_size)

    @property
    def lm_head_flops_per_token(self) -> int:
        return 2 * self.vocab_size * self.hidden_size

    @property
    def attention_flops_per_pair(self) -> int:
        """FLOPs of one (query token, key token) pair over all layers: QK^T and PV."""
        return 4 * self.num_layers * self.num_heads * self.head_dim

    # --- KV cache -------------------------------------------------------------------------
    @property
    def kv_bytes_per_token(self) -> int:
        return self.num_layers * NUM_KV * self.num_kv_heads * self.head_dim * self.bytes_per_kv

    def kv_bytes_per_block(self, block_size: int) -> int:
        return self.kv_bytes_per_token * block_size

    def num_kv_pieces_per_block(self) -> int:
        """Copies a per-layer KV layout needs for one block (one per layer per K/V)."""
        return self.num_layers * NUM_KV


# The named profiles: the published config.json of each model (the fields the mapping
# reads), with the context the simulator serves them at.
HF_CONFIGS: dict[str, tuple[dict[str, Any], int]] = {
    "llama-3-8b": ({  # meta-llama/Meta-Llama-3-8B-Instruct
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
        "max_position_embeddings": 8192, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
    }, 8192),
    "qwen2.5-32b": ({  # Qwen/Qwen2.5-32B-Instruct
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
        "hidden_size": 5120, "intermediate_size": 27648, "num_hidden_layers": 64,
        "num_attention_heads": 40, "num_key_value_heads": 8, "vocab_size": 152064,
        "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
        "sliding_window": 131072, "use_sliding_window": False, "tie_word_embeddings": False,
    }, 8192),
    "mixtral-8x7b": ({  # mistralai/Mixtral-8x7B-Instruct-v0.1
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
        "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-5,
        "num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": None,
        "tie_word_embeddings": False,
    }, 8192),
    "smollm2-135m": ({  # HuggingFaceTB/SmolLM2-135M-Instruct, at the context the engine runs
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
        "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152,
        "max_position_embeddings": 8192, "rope_theta": 100000.0, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
    }, 2048),
    "qwen3-0.6b": ({  # Qwen/Qwen3-0.6B
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
        "vocab_size": 151936, "max_position_embeddings": 40960, "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6, "sliding_window": None, "use_sliding_window": False,
        "tie_word_embeddings": True,
    }, 8192),
    "qwen3-30b-a3b": ({  # Qwen/Qwen3-30B-A3B
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
        "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
        "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
        "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "num_experts": 128,
        "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "norm_topk_prob": True, "sliding_window": None, "use_sliding_window": False,
        "tie_word_embeddings": False,
    }, 8192),
}  # fmt: skip

MODELS: dict[str, ModelProfile] = {
    name: ModelProfile.from_hf_config(cfg, name, max_model_len)
    for name, (cfg, max_model_len) in HF_CONFIGS.items()
}


def get_model(name: str) -> ModelProfile:
    """A named profile, or the profile of a local Hugging Face model directory (or its
    `config.json`) of any registered architecture."""
    if name in MODELS:
        return MODELS[name]
    if Path(name).exists():
        return ModelProfile.from_hf_dir(name)
    raise ValueError(
        f"unknown model profile {name!r}; choose one of {', '.join(MODELS)}, or give a local "
        "Hugging Face model directory"
    )
