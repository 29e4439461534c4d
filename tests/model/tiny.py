"""Tiny randomly initialised Hugging Face checkpoints (Llama with llama3 RoPE, Qwen2, Phi-3
with LongRoPE, and one of each registered architecture)."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    LlamaConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

VOCAB_SIZE = 128
TINY = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}
TINY_SIGLIP = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
               "num_attention_heads": 2, "image_size": 28, "patch_size": 14}  # fmt: skip
TINY_PIXTRAL = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                "num_attention_heads": 2, "image_size": 28, "patch_size": 14, "head_dim": 16}  # fmt: skip
MROPE = {"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0}
TINY_QWEN2_VISION = {"depth": 1, "embed_dim": 32, "hidden_size": 64, "num_heads": 2,
                     "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2}  # fmt: skip
TINY_QWEN25_VISION = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
                      "out_hidden_size": 64, "fullatt_block_indexes": [0], "window_size": 112}  # fmt: skip
PROMPT = [1, 17, 42, 99, 5, 63, 8, 120, 33, 71, 2, 64, 90]


def tiny_llama_config() -> LlamaConfig:
    return LlamaConfig(**TINY, rope_parameters=LLAMA3_ROPE, tie_word_embeddings=False)


def tiny_qwen2_config() -> Qwen2Config:
    return Qwen2Config(**TINY, tie_word_embeddings=True)


def tiny_phi3_longrope_config(original_context: int = 4, **overrides):
    """Phi-4-mini's RoPE in small: LongRoPE over the first 3/4 of each head's dims. With
    the original context (4) shorter than every test prompt, transformers takes the long
    factors from the prefill on, as superinfer does for any max_model_len above it."""
    import transformers as hf

    return hf.Phi3Config(
        **{**TINY, **overrides}, pad_token_id=0, partial_rotary_factor=0.75,
        original_max_position_embeddings=original_context,
        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                         "short_factor": [1.0, 1.1, 1.3, 1.7, 2.0, 2.5],
                         "long_factor": [1.0, 1.5, 3.0, 6.0, 12.0, 20.0]},
    )  # fmt: skip


def hf_auto_class(config):
    """transformers' auto class for `config`: causal LM, or image-text-to-text for the
    vision-language models that are not also causal LMs there (Mistral 3)."""
    if type(config) in AutoModelForCausalLM._model_mapping:
        return AutoModelForCausalLM
    return AutoModelForImageTextToText


def save_tiny(directory: Path, config, seed: int) -> Path:
    """Random weights (std 0.15: logits far from uniform) in several safetensors shards, and
    a word-level tokenizer 'w0' .. 'w127'."""
    torch.manual_seed(seed)
    model = hf_auto_class(config).from_config(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.15)
    model.save_pretrained(directory, max_shard_size="100KB")
    vocab = {f"w{i}": i for i in range(VOCAB_SIZE)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="w0").save_pretrained(directory)
    return directory


def tiny_configs() -> dict:
    """One tiny config per registered architecture (and RoPE variant), built with
    transformers' own config classes; windows (8) shorter than the test sequences."""
    import transformers as hf

    small = {**TINY, "head_dim": 16}
    window = {"sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"]}
    rope = {"rope_theta": 10000.0}
    return {
        "llama": tiny_llama_config(),
        "llama-linear": hf.LlamaConfig(
            **TINY, rope_parameters={**rope, "rope_type": "linear", "factor": 2.0}
        ),
        "llama-yarn": hf.LlamaConfig(
            **TINY,
            rope_parameters={
                **rope,
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        ),
        "llama-dynamic": hf.LlamaConfig(
            **{**TINY, "max_position_embeddings": 24},
            rope_parameters={**rope, "rope_type": "dynamic", "factor": 2.0},
        ),
        "llama-bias": hf.LlamaConfig(**TINY, attention_bias=True, mlp_bias=True),  # every layer
        "mistral": hf.MistralConfig(**TINY, sliding_window=8),
        "granite": hf.GraniteConfig(
            **TINY,
            embedding_multiplier=12.0,
            attention_multiplier=0.2,
            residual_multiplier=0.22,
            logits_scaling=4.0,
        ),
        "qwen2": tiny_qwen2_config(),
        "qwen3": hf.Qwen3Config(**small, tie_word_embeddings=False),
        "phi3": hf.Phi3Config(**TINY, pad_token_id=0),
        "phi3-longrope": tiny_phi3_longrope_config(),
        "gemma": hf.GemmaConfig(**small),
        "gemma2": hf.Gemma2Config(
            **small,
            **window,
            query_pre_attn_scalar=24,
            attn_logit_softcapping=3.0,
            final_logit_softcapping=4.0,
        ),
        "gemma3": hf.Gemma3TextConfig(
            **small,
            **window,
            query_pre_attn_scalar=24,
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            },
        ),
        "gemma3-vl": hf.Gemma3Config(  # a SigLIP tower beside, not loaded
            text_config={**small, **window, "query_pre_attn_scalar": 24},
            vision_config=TINY_SIGLIP,
            mm_tokens_per_image=4,
        ),
        "mistral3-vl": hf.Mistral3Config(  # a Pixtral tower beside, not loaded
            text_config={**TINY, "model_type": "mistral", "sliding_window": None},
            vision_config=TINY_PIXTRAL,
        ),
        "mixtral": hf.MixtralConfig(**TINY, num_local_experts=4, num_experts_per_tok=2),
        "qwen2-vl": hf.Qwen2VLConfig(  # a vision tower beside, not loaded
            text_config={**TINY, "rope_parameters": MROPE}, vision_config=TINY_QWEN2_VISION
        ),
        "qwen2.5-vl": hf.Qwen2_5_VLConfig(
            text_config={**TINY, "rope_parameters": MROPE}, vision_config=TINY_QWEN25_VISION
        ),
        "qwen2_moe": hf.Qwen2MoeConfig(
            **TINY,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=48,
            shared_expert_intermediate_size=80,
            decoder_sparse_step=2,
        ),
        "qwen3_moe": hf.Qwen3MoeConfig(
            **small,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=48,
            norm_topk_prob=False,
            mlp_only_layers=[1],
        ),
    }
