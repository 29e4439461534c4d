"""The decoder every registered architecture runs, over a paged KV cache.

One class per layer kind; a `ModelConfig` turns on the variants of a family (q/k norms,
Gemma's norms, sandwich norms, soft-capping, sliding windows, experts). Every forward takes
the tokens of all sequences of a step packed back to back, (T,), with an
`StepMetadata` that says how they are packed (built once per step by the attention
backend, `attention_backend.py`); there is no batch padding.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from superinfer.model.attention import StepMetadata
from superinfer.model.config import ModelConfig
from superinfer.model.cpu_act import act_kernel
from superinfer.model.cpu_decode import FlatDecode
from superinfer.model.cpu_norm import norm_kernel
from superinfer.model.moe import MoE
from superinfer.model.rotary import RotaryEmbedding, apply_rotary
from superinfer.model.weights import load_hf_weights


class RMSNorm(nn.Module):
    """RMSNorm scaling by `weight` (Llama) or by `1 + weight` (Gemma: `offset` 1). On a CPU
    the C kernel of `cpu_norm.py` runs it (and the residual add before it) in one call."""

    def __init__(self, size: int, eps: float, offset: float = 0.0) -> None:
        super().__init__()
        self.eps, self.offset = eps, offset
        self.weight = nn.Parameter(torch.ones(size))
        self._kernel_weight: tuple[tuple[int, int], Tensor] | None = None

    def forward(self, x: Tensor) -> Tensor:
        """(..., C) -> (..., C), computed in float32 whatever the input dtype."""
        kernel = norm_kernel() if x.device.type == "cpu" else None
        if kernel is not None and kernel.takes(x, None):
            return kernel(x, None, self.kernel_weight(), self.eps)
        if kernel is not None and kernel.takes_heads(x):  # per-head q/k norms
            return kernel.heads(x, self.kernel_weight(), self.eps)
        if self.offset:
            weight = self.weight.float() + self.offset
            return F.rms_norm(x.float(), weight.shape, weight, self.eps).to(x.dtype)
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)

    def add_forward(self, x: Tensor, residual: Tensor) -> tuple[Tensor, Tensor]:
        """`residual += x` in place, then the norm of it: (norm, residual)."""
        kernel = norm_kernel() if x.device.type == "cpu" else None
        if kernel is not None and kernel.takes(x, residual):
            return kernel(x, residual, self.kernel_weight(), self.eps), residual
        residual.add_(x)
        return self(residual), residual

    def kernel_weight(self) -> Tensor:
        """`weight + offset` in float32, as the kernel reads it; made again whenever the
        parameter changes (loading, a dtype cast)."""
        key = (self.weight.data_ptr(), self.weight._version)
        if self._kernel_weight is None or self._kernel_weight[0] != key:
            weight = (self.weight.detach().float() + self.offset).contiguous()
            self._kernel_weight = (key, weight)
        return self._kernel_weight[1]


class Attention(nn.Module):
    """Grouped-query attention with one fused q/k/v projection."""

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.num_heads, self.num_kv_heads = config.num_heads, config.num_kv_heads
        self.head_dim = config.head_dim
        qkv_size = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        self.qkv_proj = nn.Linear(config.hidden_size, qkv_size, bias=config.attention_bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size,
                                bias=config.o_proj_bias)  # fmt: skip
        if config.qk_norm:
            eps, offset = config.rms_norm_eps, config.norm_offset
            self.q_norm = RMSNorm(self.head_dim, eps, offset)
            self.k_norm = RMSNorm(self.head_dim, eps, offset)
        self.qk_norm = config.qk_norm
        self.window = config.window(layer)
        self.is_local_rope = self.window is not None and config.local_rope_theta is not None
        self.scale, self.softcap = config.attention_scale, config.attn_logit_softcap

    def forward(
        self,
        x: Tensor,
        rotations: tuple[Tensor, Tensor],
        kv_cache: Tensor,
        meta: StepMetadata,
    ) -> Tensor:
        num_tokens, num_qk_heads = x.shape[0], self.num_heads + self.num_kv_heads
        rotation = rotations[self.is_local_rope]  # (T, 1, D/2)
        qkv = self.qkv_proj(x)  # (T, (H + 2 Hkv) D)
        qk, v = qkv.split([num_qk_heads * self.head_dim, self.num_kv_heads * self.head_dim], -1)
        qk = qk.view(num_tokens, num_qk_heads, self.head_dim)
        if self.qk_norm:
            q, k = qk.split([self.num_heads, self.num_kv_heads], 1)
            q = apply_rotary(self.q_norm(q), rotation)  # (T, H, D)
            k = apply_rotary(self.k_norm(k), rotation)  # (T, Hkv, D)
        else:
            qk = apply_rotary(qk, rotation)
            q, k = qk.split([self.num_heads, self.num_kv_heads], 1)  # (T, H, D), (T, Hkv, D)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)  # (T, Hkv, D)
        # through the step's attention backend (`attention_backend.py`)
        o = meta.attend(q, k, v, kv_cache, self.layer, window=self.window, scale=self.scale,
                        softcap=self.softcap)  # fmt: skip
        return self.o_proj(o.flatten(1))  # (T, C)


class GatedMLP(nn.Module):
    """SwiGLU (or GeGLU) with one fused gate/up projection."""

    def __init__(self, config: ModelConfig, inner: int | None = None) -> None:
        super().__init__()
        size, inner = config.hidden_size, inner or config.intermediate_size
        self.gate_up_proj = nn.Linear(size, 2 * inner, bias=config.mlp_bias)
        self.down_proj = nn.Linear(inner, size, bias=config.mlp_bias)
        self.act = activation(config.hidden_act)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self.gated(self.gate_up_proj(x)))  # (T, C)

    def gated(self, gate_up: Tensor) -> Tensor:
        """(T, 2I) [gate | up] -> (T, I) act(gate) * up; SiLU's on CPU in one C call
        (`cpu_act.py`) where the kernel takes it."""
        kernel = act_kernel() if self.act is F.silu and gate_up.device.type == "cpu" else None
        if kernel is not None and kernel.takes(gate_up):
            return kernel(gate_up)
        gate, up = gate_up.chunk(2, -1)  # (T, I) each
        return self.act(gate).mul_(up)


def activation(name: str):
    if name == "gelu_tanh":
        return lambda x: F.gelu(x, approximate="tanh")
    return F.silu


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        eps, offset, size = config.rms_norm_eps, config.norm_offset, config.hidden_size
        self.input_layernorm = RMSNorm(size, eps, offset)
        self.self_attn = Attention(config, layer)
        # pre-MLP norm (Llama); the norm of the attention output in a sandwich (Gemma 2/3)
        self.post_attention_layernorm = RMSNorm(size, eps, offset)
        self.sandwich = config.sandwich_norm
        if self.sandwich:
            self.pre_feedforward_layernorm = RMSNorm(size, eps, offset)
            self.post_feedforward_layernorm = RMSNorm(size, eps, offset)
        self.mlp = MoE(config) if config.is_moe_layer(layer) else GatedMLP(config)
        self.residual_multiplier = config.residual_multiplier
        if self.sandwich and self.residual_multiplier is not None:
            raise ValueError("residual multipliers with sandwich norms are not supported")

    def forward(
        self,
        x: Tensor,
        residual: Tensor | None,
        rotations: tuple[Tensor, Tensor],
        kv_cache: Tensor,
        meta: StepMetadata,
    ) -> tuple[Tensor, Tensor]:
        """Returns (this layer's MLP output, residual stream before adding it). Adds into
        `residual` in place: it is the stream's own buffer (the embedding output at first)."""
        if residual is None:
            residual, h = x, self.input_layernorm(x)  # (T, C)
        else:
            h, residual = self.input_layernorm.add_forward(x, residual)
        x = self.self_attn(h, rotations, kv_cache, meta)
        if not self.sandwich:
            if self.residual_multiplier is not None:  # Granite, as transformers: in the dtype
                x.mul_(self.residual_multiplier)
            h, residual = self.post_attention_layernorm.add_forward(x, residual)
            x = self.mlp(h)
            if self.residual_multiplier is not None:
                x.mul_(self.residual_multiplier)
            return x, residual
        residual.add_(self.post_attention_layernorm(x))
        x = self.mlp(self.pre_feedforward_layernorm(residual))
        return self.post_feedforward_layernorm(x), residual


class DecoderModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.embedding_scale = config.embedding_scale
        self.is_embedding_scale_rounded = config.is_embedding_scale_rounded
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_scaling,
                                      config.rotary_dim)  # fmt: skip
        self.local_rotary = None
        if config.local_rope_theta is not None:
            local = config.local_rope_theta, config.local_rope_scaling
            self.local_rotary = RotaryEmbedding(config.head_dim, *local, config.rotary_dim)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.norm_offset)
        self.flat_decode: FlatDecode | None = None  # see DecoderForCausalLM.use_flat_decode

    def forward(
        self, input_ids: Tensor, positions: Tensor, kv_cache: Tensor, meta: StepMetadata
    ) -> Tensor:
        x, residual = self.embed_tokens(input_ids), None  # (T, C)
        if self.embedding_scale is not None and self.is_embedding_scale_rounded:  # Gemma
            x = x * torch.tensor(self.embedding_scale, dtype=x.dtype)  # in the dtype, as HF
        elif self.embedding_scale is not None:  # Granite: by the float
            x = x * self.embedding_scale
        rotation = self.rotary(positions)  # (T, 1, D/2)
        if self.flat_decode is not None and self.flat_decode.takes(meta, kv_cache):
            return self.flat_decode(x, rotation, kv_cache, meta)
        local = rotation if self.local_rotary is None else self.local_rotary(positions)
        for layer in self.layers:
            x, residual = layer(x, residual, (rotation, local), kv_cache, meta)
        return self.norm.add_forward(x, residual)[0]


class DecoderForCausalLM(nn.Module):
    """Inference-only causal LM of any registered architecture (no parameter needs grad)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = DecoderModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()
        self.requires_grad_(False)

    @property
    def dtype(self) -> torch.dtype:
        return self.model.norm.weight.dtype

    def tie_weights(self) -> None:
        """Share the embedding with lm_head if the config says so (again after to_empty),
        unless lm_head was swapped for a quantized layer before loading."""
        if self.config.tie_word_embeddings and isinstance(self.lm_head, nn.Linear):
            self.lm_head.weight = self.model.embed_tokens.weight

    def fit_context(self, max_model_len: int) -> None:
        """Serve sequences of up to `max_model_len` tokens: picks LongRoPE's factors
        (`rotary.longrope_factors`); call it before the first step."""
        self.model.rotary.fit_context(max_model_len)

    def use_flat_decode(self) -> str:
        """Run decode-only CPU steps as one flat loop (`cpu_decode.py`: the same results,
        fewer calls) where it can run this model; call it once the weights are final.
        Returns what was decided, and why."""
        self.model.flat_decode, reason = FlatDecode.build(self.model)
        return f"{'on' if self.model.flat_decode else 'off'}: {reason}"

    def forward(
        self, input_ids: Tensor, positions: Tensor, kv_cache: Tensor, meta: StepMetadata
    ) -> Tensor:
        """Hidden states (T, C) of a step's packed tokens; caches their K/V in `kv_cache`
        (num_blocks, num_layers, 2, block_size, num_kv_heads, head_dim)."""
        if input_ids.shape[0] != meta.num_tokens:
            raise ValueError(f"{input_ids.shape[0]} input ids for {meta.num_tokens} positions")
        return self.model(input_ids, positions, kv_cache, meta)

    def compute_logits(self, hidden: Tensor) -> Tensor:
        """(S, C) hidden states -> (S, vocab) float32 logits."""
        logits = self.lm_head(hidden).float()
        if self.config.logits_scaling is not None:
            logits /= self.config.logits_scaling
        cap = self.config.final_logit_softcap
        return logits if cap is None else torch.tanh(logits / cap).mul_(cap)

    def load_weights(
        self,
        weights: Iterable[tuple[str, Tensor]],
        interleaved_qk: bool = False,
        held: Collection[str] = (),
    ) -> None:
        """Copy in weights named as in a Hugging Face checkpoint; see `load_hf_weights`."""
        load_hf_weights(self, weights, interleaved_qk, held)
