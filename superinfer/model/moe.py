"""A mixture of SwiGLU experts with top-k routing (Mixtral, Qwen3-MoE, Qwen2-MoE with its
shared expert).

The experts' weights are stacked, (E, 2I, C) and (E, C, I); a step's (token, expert) pairs
are sorted by expert and multiplied in one grouped matmul per projection
(`torch._grouped_mm`, one GEMM per expert that received tokens, in a single call), so there
is no Python loop over tokens or experts. A GGUF's experts kept quantized replace `Experts`
with `quant_moe.QuantExperts`, which loops over the experts that received rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from superinfer.model.config import ModelConfig


class Experts(nn.Module):
    def __init__(self, num_experts: int, size: int, inner: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * inner, size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, size, inner))

    def forward(self, x: Tensor, experts: Tensor) -> Tensor:
        """x (N, C) rows sorted by `experts` (N,) -> (N, C), each row through its expert."""
        counts = torch.bincount(experts, minlength=self.gate_up_proj.shape[0])
        offsets = counts.cumsum(0).to(torch.int32)  # (E,) end row of each expert's group
        h = torch._grouped_mm(x, self.gate_up_proj.transpose(1, 2), offs=offsets)  # (N, 2I)
        gate, up = h.chunk(2, -1)
        return torch._grouped_mm(F.silu(gate) * up, self.down_proj.transpose(1, 2),
                                 offs=offsets)  # fmt: skip


class MoE(nn.Module):
    """Router `gate` (C -> E) picks `top_k` experts per token; their outputs are summed
    with the softmax weights (renormalised over the top k if `norm_topk_prob`). Qwen2-MoE
    adds a shared expert that every token goes through, its output scaled by
    sigmoid(`shared_expert_gate`)."""

    def __init__(self, config: ModelConfig) -> None:
        from superinfer.model.decoder import GatedMLP  # which builds this module

        super().__init__()
        self.top_k, self.renormalize = config.num_experts_per_tok, config.norm_topk_prob
        self.gate = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.experts = Experts(config.num_experts, config.hidden_size, config.moe_intermediate_size)
        self.shared_expert = self.shared_expert_gate = None
        if config.shared_expert_intermediate_size:
            self.shared_expert = GatedMLP(config, config.shared_expert_intermediate_size)
            self.shared_expert_gate = nn.Linear(config.hidden_size, 1, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        probs = torch.softmax(self.gate(x).float(), -1)  # (T, E)
        weights, experts = probs.topk(self.top_k, -1)  # (T, k) each
        if self.renormalize:
            weights = weights / weights.sum(-1, keepdim=True)
        experts, order = experts.flatten().sort(stable=True)  # (T k,) pairs by expert
        tokens = order // self.top_k
        y = self.experts(x[tokens], experts)  # (T k, C)
        y = y * weights.flatten()[order].unsqueeze(1).to(y.dtype)
        out = torch.zeros_like(x).index_add_(0, tokens, y)  # (T, C)
        if self.shared_expert is not None:
            out += torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out
