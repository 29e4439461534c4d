"""The names the Llama-only model had: every architecture now runs `superinfer.model.decoder`."""

from __future__ import annotations

from superinfer.model import decoder

RMSNorm = decoder.RMSNorm
LlamaAttention = decoder.Attention
LlamaMLP = decoder.GatedMLP
LlamaDecoderLayer = decoder.DecoderLayer
LlamaModel = decoder.DecoderModel
LlamaForCausalLM = decoder.DecoderForCausalLM
