"""Roofline step times: each part of a step takes the longer of its compute time and its
memory time, at ceilings scaled by efficiency factors, plus fixed overheads.

    linear layers   max(FLOPs / (peak x eff_c),  weight bytes / (bw x eff_m))
    attention       max(pair FLOPs / (peak x eff_a),  KV bytes read+written / (bw x eff_m))
    LM head         sampled tokens only (its weights are read every step)
    overheads       per step + per sequence

For a mixture of experts, a step reads the weights of the experts its tokens reach: with
T tokens each routed to k of E experts, E x (1 - (1 - k/E)^T) experts per layer.
"""

from __future__ import annotations

from superinfer.sim.hardware import HardwareProfile
from superinfer.sim.models import ModelProfile
from superinfer.sim.predictor import BatchShape, StepTimePredictor


class RooflinePredictor(StepTimePredictor):
    name = "roofline"

    def __init__(self, model: ModelProfile, hardware: HardwareProfile) -> None:
        self.model, self.hardware = model, hardware
        self._flops_per_s = hardware.peak_tflops * 1e12 * hardware.compute_efficiency
        self._attn_flops_per_s = hardware.peak_tflops * 1e12 * hardware.attention_efficiency
        self._bytes_per_s = hardware.hbm_gbps * 1e9 * hardware.memory_efficiency
        m = model
        self._lm_head_bytes = m.vocab_size * m.hidden_size * m.bytes_per_param
        dense_params = m.num_layers * m.num_attention_params_per_layer + m.num_dense_mlp_params
        self._dense_bytes = dense_params * m.bytes_per_param
        self._expert_bytes = m.num_expert_params * m.bytes_per_param * m.num_moe_layers
        self._linear_flops = 2 * (
            dense_params + m.num_moe_layers * m.num_experts_per_token * m.num_expert_params
        )

    def num_experts_reached(self, num_tokens: int) -> float:
        m = self.model
        if m.num_experts == 1:
            return 1.0
        return m.num_experts * (1 - (1 - m.num_experts_per_token / m.num_experts) ** num_tokens)

    def forward_time(self, batch: BatchShape) -> float:
        if batch.num_seqs == 0:
            return 0.0
        return (
            self._linear_time(batch.num_tokens)
            + self._attention_time(batch)
            + self._lm_head_time(batch.num_sampled)
            + self.hardware.step_overhead_s
            + self.hardware.sequence_overhead_s * batch.num_seqs
        )

    def _linear_time(self, num_tokens: int) -> float:
        weight_bytes = self._dense_bytes + self._expert_bytes * self.num_experts_reached(num_tokens)
        return max(
            num_tokens * self._linear_flops / self._flops_per_s, weight_bytes / self._bytes_per_s
        )

    def _attention_time(self, batch: BatchShape) -> float:
        m = self.model
        pairs = batch.num_prefill_pairs + batch.num_decode_context
        flops = pairs * m.attention_flops_per_pair
        kv_tokens = batch.num_decode_context + batch.num_prefill_context + batch.num_tokens
        return max(
            flops / self._attn_flops_per_s, kv_tokens * m.kv_bytes_per_token / self._bytes_per_s
        )

    def _lm_head_time(self, num_sampled: int) -> float:
        if num_sampled == 0:
            return 0.0
        flops = num_sampled * self.model.lm_head_flops_per_token
        return max(flops / self._flops_per_s, self._lm_head_bytes / self._bytes_per_s)

    def describe(self) -> dict:
        h = self.hardware
        return {
            "name": self.name, "model": self.model.name, "hardware": h.name,
            "compute_efficiency": h.compute_efficiency, "attention_efficiency": h.attention_efficiency,
            "memory_efficiency": h.memory_efficiency, "step_overhead_s": h.step_overhead_s,
            "sequence_overhead_s": h.sequence_overhead_s,
        }  # fmt: skip
