"""Model profiles from config dimensions: parameter counts, FLOPs and KV bytes.

Only shapes matter to the simulator. Parameters are counted from the dimensions (no
checkpoint is read): attention (q, k, v, o), the gated MLP (three matrices per expert),
embeddings and the LM head. For a mixture of experts, `num_active_params` counts the
`num_experts_per_token` experts a token goes through; all experts' weights still occupy
memory and are read by a step that routes tokens to them.
"""

from __future__ import annotations

from dataclasses import dataclass

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

    def _num_params(self, num_experts: int) -> int:
        router = self.hidden_size * self.num_experts if self.num_experts > 1 else 0
        per_layer = self.num_attention_params_per_layer + num_experts * self.num_expert_params
        return self.num_layers * (per_layer + router) + self.num_embedding_params

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


MODELS: dict[str, ModelProfile] = {
    profile.name: profile
    for profile in (
        ModelProfile(  # meta-llama/Meta-Llama-3-8B-Instruct
            "llama-3-8b", num_layers=32, hidden_size=4096, intermediate_size=14336,
            num_heads=32, num_kv_heads=8, head_dim=128, vocab_size=128256,
        ),
        ModelProfile(  # Qwen/Qwen2.5-32B-Instruct
            "qwen2.5-32b", num_layers=64, hidden_size=5120, intermediate_size=27648,
            num_heads=40, num_kv_heads=8, head_dim=128, vocab_size=152064,
        ),
        ModelProfile(  # mistralai/Mixtral-8x7B-Instruct-v0.1
            "mixtral-8x7b", num_layers=32, hidden_size=4096, intermediate_size=14336,
            num_heads=32, num_kv_heads=8, head_dim=128, vocab_size=32000,
            num_experts=8, num_experts_per_token=2,
        ),
        ModelProfile(  # HuggingFaceTB/SmolLM2-135M-Instruct, as the engine runs it here
            "smollm2-135m", num_layers=30, hidden_size=576, intermediate_size=1536,
            num_heads=9, num_kv_heads=3, head_dim=64, vocab_size=49152,
            is_tied_embeddings=True, max_model_len=2048,
        ),
    )
}  # fmt: skip


def get_model(name: str) -> ModelProfile:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(
            f"unknown model profile {name!r}; choose one of {', '.join(MODELS)}"
        ) from None
