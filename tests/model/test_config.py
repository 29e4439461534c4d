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


def test_qwen2_has_qkv_bias_and_mistral_does_not() -> None:
    assert ModelConfig.from_hf_config(LLAMA | {"model_type": "qwen2"}).attention_bias
    assert not ModelConfig.from_hf_config(LLAMA | {"model_type": "mistral"}).attention_bias


@pytest.mark.parametrize(
    "change, match",
    [
        ({"model_type": "gpt2"}, "architecture"),
        ({"rope_scaling": {"rope_type": "longrope", "factor": 4.0}}, "longrope"),
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
