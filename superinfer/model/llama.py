"""Llama-family decoder (Llama, SmolLM, Mistral, Qwen2) over a paged KV cache.

Every forward takes the tokens of all sequences of a step packed back to back, (T,), with
an `AttentionMetadata` that says how they are packed; there is no batch padding.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from superinfer.model.attention import AttentionMetadata, GatherWorkspace, paged_attention
from superinfer.model.config import ModelConfig
from superinfer.model.rotary import RotaryEmbedding, apply_rotary
from superinfer.model.weights import load_hf_weights


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size))

    def forward(self, x: Tensor) -> Tensor:
        """(T, C) -> (T, C), computed in float32 whatever the input dtype."""
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


class LlamaAttention(nn.Module):
    """Grouped-query attention with one fused q/k/v projection."""

    def __init__(self, config: ModelConfig, layer: int, workspace: GatherWorkspace) -> None:
        super().__init__()
        self.layer, self.workspace = layer, workspace
        self.num_heads, self.num_kv_heads = config.num_heads, config.num_kv_heads
        self.head_dim = config.head_dim
        qkv_size = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        self.qkv_proj = nn.Linear(config.hidden_size, qkv_size, bias=config.attention_bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)

    def forward(
        self, x: Tensor, rotation: Tensor, kv_cache: Tensor, meta: AttentionMetadata
    ) -> Tensor:
        num_tokens, num_qk_heads = x.shape[0], self.num_heads + self.num_kv_heads
        qkv = self.qkv_proj(x)  # (T, (H + 2 Hkv) D)
        qk, v = qkv.split([num_qk_heads * self.head_dim, self.num_kv_heads * self.head_dim], -1)
        qk = apply_rotary(qk.view(num_tokens, num_qk_heads, self.head_dim), rotation)
        q, k = qk.split([self.num_heads, self.num_kv_heads], 1)  # (T, H, D), (T, Hkv, D)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)  # (T, Hkv, D)
        o = paged_attention(q, k, v, kv_cache, self.layer, meta, self.workspace)  # (T, H, D)
        return self.o_proj(o.flatten(1))  # (T, C)


class LlamaMLP(nn.Module):
    """SwiGLU with one fused gate/up projection."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        size, inner = config.hidden_size, config.intermediate_size
        self.gate_up_proj = nn.Linear(size, 2 * inner, bias=False)
        self.down_proj = nn.Linear(inner, size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, -1)  # (T, I) each
        return self.down_proj(F.silu(gate).mul_(up))  # (T, C)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, workspace: GatherWorkspace) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, layer, workspace)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def forward(
        self, x: Tensor, residual: Tensor | None, rotation: Tensor, kv_cache: Tensor,
        meta: AttentionMetadata,
    ) -> tuple[Tensor, Tensor]:
        """Returns (this layer's MLP output, residual stream before adding it). Adds into
        `residual` in place: it is the stream's own buffer (the embedding output at first)."""
        residual = x if residual is None else residual.add_(x)  # (T, C)
        x = self.self_attn(self.input_layernorm(residual), rotation, kv_cache, meta)
        residual.add_(x)
        return self.mlp(self.post_attention_layernorm(residual)), residual


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_scaling)
        workspace = GatherWorkspace()  # shared by all layers
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, i, workspace) for i in range(config.num_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, input_ids: Tensor, positions: Tensor, kv_cache: Tensor, meta: AttentionMetadata
    ) -> Tensor:
        x, residual = self.embed_tokens(input_ids), None  # (T, C)
        rotation = self.rotary(positions)  # (T, 1, D/2)
        for layer in self.layers:
            x, residual = layer(x, residual, rotation, kv_cache, meta)
        return self.norm(residual.add_(x))


class LlamaForCausalLM(nn.Module):
    """Inference-only Llama-family causal LM (parameters never require grad)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()
        self.requires_grad_(False)

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype

    def tie_weights(self) -> None:
        """Share the embedding with lm_head if the config says so (again after to_empty)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self, input_ids: Tensor, positions: Tensor, kv_cache: Tensor, meta: AttentionMetadata
    ) -> Tensor:
        """Hidden states (T, C) of a step's packed tokens; caches their K/V in `kv_cache`
        (num_blocks, num_layers, 2, block_size, num_kv_heads, head_dim)."""
        if input_ids.shape[0] != meta.num_tokens:
            raise ValueError(f"{input_ids.shape[0]} input ids for {meta.num_tokens} positions")
        return self.model(input_ids, positions, kv_cache, meta)

    def compute_logits(self, hidden: Tensor) -> Tensor:
        """(S, C) hidden states -> (S, vocab) float32 logits."""
        return self.lm_head(hidden).float()

    def load_weights(
        self, weights: Iterable[tuple[str, Tensor]], interleaved_qk: bool = False
    ) -> None:
        """Copy in weights named as in a Hugging Face checkpoint; see `load_hf_weights`."""
        load_hf_weights(self, weights, interleaved_qk)
