from __future__ import annotations

import pytest

from superinfer.model.config import ModelConfig

LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 100,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 512,
    "bos_token_id": 1,
    "eos_token_id": [2, 3],
}
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


def test_hf_config_with_transformers4_rope_scaling() -> None:
    c = ModelConfig.from_hf_config(LLAMA | {"rope_theta": 500000.0, "rope_scaling": LLAMA3_ROPE})
    assert (c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads) == (64, 2, 4, 2)
    assert c.head_dim == 16
    assert c.rope_theta == 500000.0 and c.rope_scaling == LLAMA3_ROPE
    assert c.eos_token_ids == [2, 3] and c.bos_token_id == 1
    assert not c.attention_bias and not c.tie_word_embeddings


def test_hf_config_with_transformers5_rope_parameters() -> None:
    params = {"rope_theta": 500000.0, **LLAMA3_ROPE}
    c = ModelConfig.from_hf_config(LLAMA | {"rope_parameters": params, "head_dim": 32})
    assert c.rope_theta == 500000.0 and c.rope_scaling == LLAMA3_ROPE and c.head_dim == 32


def test_hf_default_rope_has_no_scaling() -> None:
    old_style = ModelConfig.from_hf_config(LLAMA | {"rope_theta": 1e4, "rope_scaling": None})
    new_style = ModelConfig.from_hf_config(
        LLAMA | {"rope_parameters": {"rope_theta": 1e4, "rope_type": "default"}}
    )
    assert old_style.rope_scaling is None and new_style.rope_scaling is None
    assert old_style.rope_theta == new_style.rope_theta == 1e4


@pytest.mark.parametrize("rope_type", ["longrope", "su"])
def test_phi35_and_phi4_mini_configs_as_their_checkpoints_state_them(rope_type: str) -> None:
    """Phi-3.5-mini's and Phi-4-mini's config.json shapes (transformers 4.x): LongRoPE
    under `rope_scaling`, the original context and the partial factor at the top level."""
    phi = {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_size": 3072,
           "intermediate_size": 8192, "num_hidden_layers": 2, "num_attention_heads": 32,
           "vocab_size": 32064, "max_position_embeddings": 131072,
           "original_max_position_embeddings": 4096, "rope_theta": 10000.0,
           "rope_scaling": {"type": rope_type, "short_factor": [1.0] * 48,
                            "long_factor": [2.0] * 48}}  # fmt: skip
    c = ModelConfig.from_hf_config(phi)
    assert c.head_dim == 96 and c.num_rotary_dims == 96 and c.rotary_dim is None
    assert c.rope_scaling == {"rope_type": "longrope", "short_factor": [1.0] * 48,
                              "long_factor": [2.0] * 48, "max_position_embeddings": 131072,
                              "original_max_position_embeddings": 4096}  # fmt: skip
    phi4 = phi | {"num_attention_heads": 24, "partial_rotary_factor": 0.75}
    assert ModelConfig.from_hf_config(phi4).num_rotary_dims == 96  # of 128


def test_gemma3_4b_config_takes_transformers_defaults_for_what_it_leaves_out() -> None:
    """gemma-3-4b-it's config.json: its text_config states 6 fields."""
    gemma = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
             "eos_token_id": [1, 106], "mm_tokens_per_image": 256,
             "text_config": {"hidden_size": 2560, "intermediate_size": 10240,
                             "model_type": "gemma3_text", "num_hidden_layers": 34,
                             "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                             "sliding_window": 1024},
             "vision_config": {"model_type": "siglip_vision_model"}}  # fmt: skip
    c = ModelConfig.from_hf_config(gemma)
    assert (c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size) == (8, 4, 256, 262208)
    assert c.attention_scale == 256**-0.5 and c.qk_norm and c.tie_word_embeddings
    assert c.layer_types[:6] == ["sliding_attention"] * 5 + ["full_attention"]
    assert c.rope_theta == 1e6 and c.rope_scaling == {"rope_type": "linear", "factor": 8.0}
    assert c.local_rope_theta == 1e4 and c.eos_token_ids == [1, 106]


def test_mistral_small_31_config_is_its_mistral_language_model() -> None:
    """Mistral-Small-3.1-24B-Instruct's config.json (transformers 4.50): lm_head stored."""
    mistral = {"architectures": ["Mistral3ForConditionalGeneration"], "model_type": "mistral3",
               "text_config": {"head_dim": 128, "hidden_act": "silu", "hidden_size": 5120,
                               "intermediate_size": 32768, "max_position_embeddings": 131072,
                               "model_type": "mistral", "num_attention_heads": 32,
                               "num_hidden_layers": 40, "num_key_value_heads": 8,
                               "rms_norm_eps": 1e-05, "rope_theta": 1e9, "sliding_window": None,
                               "vocab_size": 131072},
               "vision_config": {"model_type": "pixtral"}}  # fmt: skip
    c = ModelConfig.from_hf_config(mistral)
    assert (c.num_heads, c.num_kv_heads, c.head_dim, c.num_layers) == (32, 8, 128, 40)
    assert c.rope_theta == 1e9 and c.rope_scaling is None and c.sliding_window is None
    assert not c.tie_word_embeddings


def test_qwen25_vl_config_of_transformers4_is_qwen2_with_plain_rope_on_text() -> None:
    """Qwen2.5-VL-7B-Instruct's config.json: the text fields at the top level, M-RoPE."""
    qwen = {"architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
            "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
            "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
            "rope_theta": 1000000.0, "max_position_embeddings": 128000, "eos_token_id": 151645,
            "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
            "tie_word_embeddings": False, "vision_config": {"depth": 32}}  # fmt: skip
    c = ModelConfig.from_hf_config(qwen)
    assert (c.num_heads, c.num_kv_heads, c.head_dim) == (28, 4, 128)
    assert c.rope_scaling is None and c.rope_theta == 1e6
    assert c.attention_bias and not c.o_proj_bias and c.eos_token_ids == [151645]


def test_qwen2_has_qkv_bias_and_mistral_does_not() -> None:
    assert ModelConfig.from_hf_config(LLAMA | {"model_type": "qwen2"}).attention_bias
    assert not ModelConfig.from_hf_config(LLAMA | {"model_type": "mistral"}).attention_bias


@pytest.mark.parametrize(
    "change, match",
    [
        ({"model_type": "gpt2"}, "architecture"),
        ({"rope_scaling": {"rope_type": "mrope", "factor": 4.0}}, "mrope"),
        ({"rope_scaling": {"rope_type": "longrope", "factor": 4.0}}, "LongRoPE needs"),
        ({"num_key_value_heads": 3}, "multiple"),
    ],
)
def test_unsupported_hf_configs_are_rejected(change: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ModelConfig.from_hf_config(LLAMA | change)


GGUF = {
    "general.architecture": "llama",
    "general.name": "tiny",
    "llama.embedding_length": 64,
    "llama.feed_forward_length": 128,
    "llama.block_count": 2,
    "llama.attention.head_count": 4,
    "llama.attention.head_count_kv": 2,
    "llama.vocab_size": 100,
    "llama.context_length": 512,
    "llama.rope.freq_base": 1e4,
    "llama.attention.layer_norm_rms_epsilon": 1e-5,
    "tokenizer.ggml.bos_token_id": 1,
    "tokenizer.ggml.eos_token_id": 2,
}


def test_gguf_metadata() -> None:
    c = ModelConfig.from_gguf_metadata(GGUF, ["token_embd.weight", "blk.0.attn_q.weight"])
    assert (c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads) == (64, 2, 4, 2)
    assert c.head_dim == 16
    assert c.tie_word_embeddings and not c.attention_bias and c.rope_scaling is None
    assert c.eos_token_ids == [2] and c.name == "tiny"


def test_gguf_output_bias_and_rope_variants() -> None:
    names = ["token_embd.weight", "output.weight", "blk.0.attn_q.bias"]
    c = ModelConfig.from_gguf_metadata(GGUF, names, rope_freq_factors=[1.0] * 8)
    assert not c.tie_word_embeddings and c.attention_bias
    assert c.rope_scaling == {"rope_type": "freq_factors", "factors": [1.0] * 8}
    linear = GGUF | {"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 2.0}
    assert ModelConfig.from_gguf_metadata(linear, names).rope_scaling == {
        "rope_type": "linear",
        "factor": 2.0,
    }
    with pytest.raises(ValueError, match="yarn"):
        ModelConfig.from_gguf_metadata(GGUF | {"llama.rope.scaling.type": "yarn"}, names)
    with pytest.raises(ValueError, match="architecture"):
        ModelConfig.from_gguf_metadata(GGUF | {"general.architecture": "gemma"}, names)
