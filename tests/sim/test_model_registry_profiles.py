"""The simulator's model profiles come from HF configs through the model registry."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from superinfer.model.registry import architectures
from superinfer.sim.config import SimConfig
from superinfer.sim.hardware import get_hardware
from superinfer.sim.models import HF_CONFIGS, MODELS, ModelProfile, get_model
from superinfer.sim.roofline import RooflinePredictor
from superinfer.sim.simulation import build_system

# the profiles as they were written by hand before they read the registry
HAND_WRITTEN = {
    "llama-3-8b": ModelProfile(
        "llama-3-8b", num_layers=32, hidden_size=4096, intermediate_size=14336,
        num_heads=32, num_kv_heads=8, head_dim=128, vocab_size=128256,
    ),
    "qwen2.5-32b": ModelProfile(
        "qwen2.5-32b", num_layers=64, hidden_size=5120, intermediate_size=27648,
        num_heads=40, num_kv_heads=8, head_dim=128, vocab_size=152064,
    ),
    "mixtral-8x7b": ModelProfile(
        "mixtral-8x7b", num_layers=32, hidden_size=4096, intermediate_size=14336,
        num_heads=32, num_kv_heads=8, head_dim=128, vocab_size=32000,
        num_experts=8, num_experts_per_token=2,
    ),
    "smollm2-135m": ModelProfile(
        "smollm2-135m", num_layers=30, hidden_size=576, intermediate_size=1536,
        num_heads=9, num_kv_heads=3, head_dim=64, vocab_size=49152,
        is_tied_embeddings=True, max_model_len=2048,
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(HAND_WRITTEN))
def test_a_registry_profile_equals_the_hand_written_one(name):
    assert get_model(name) == HAND_WRITTEN[name]


def test_every_named_profile_is_a_registered_architecture():
    known = architectures()
    for cfg, _ in HF_CONFIGS.values():
        assert cfg["architectures"][0] in known
    assert set(HAND_WRITTEN) <= set(MODELS)


def test_an_unknown_architecture_gets_the_registrys_error():
    cfg = {**HF_CONFIGS["llama-3-8b"][0], "architectures": ["GPT5ForCausalLM"]}
    with pytest.raises(ValueError, match="unsupported architecture 'GPT5ForCausalLM'") as err:
        ModelProfile.from_hf_config(cfg)
    assert "LlamaForCausalLM" in str(err.value) and "Qwen3ForCausalLM" in str(err.value)


def test_moe_profiles_count_the_active_experts():
    mixtral = get_model("mixtral-8x7b")
    assert (mixtral.num_experts, mixtral.num_experts_per_token) == (8, 2)
    assert mixtral.num_params == pytest.approx(46.7e9, rel=0.01)
    assert mixtral.num_active_params == pytest.approx(12.9e9, rel=0.01)
    qwen = get_model("qwen3-30b-a3b")
    assert qwen.intermediate_size == 768  # the experts' size, not the dense 6144
    assert qwen.num_params == pytest.approx(30.5e9, rel=0.01)
    assert qwen.num_active_params == pytest.approx(3.3e9, rel=0.02)


def test_a_shared_expert_counts_among_the_active_parameters():
    """Qwen1.5-MoE-A2.7B's config: 14.3B parameters, 2.7B active."""
    cfg = {"architectures": ["Qwen2MoeForCausalLM"], "hidden_size": 2048,
           "intermediate_size": 5632, "num_hidden_layers": 24, "num_attention_heads": 16,
           "num_key_value_heads": 16, "vocab_size": 151936, "num_experts": 60,
           "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
           "shared_expert_intermediate_size": 5632, "tie_word_embeddings": False}  # fmt: skip
    qwen = ModelProfile.from_hf_config(cfg, "qwen1.5-moe-a2.7b")
    assert qwen.num_params == pytest.approx(14.3e9, rel=0.01)
    assert qwen.num_active_params == pytest.approx(2.69e9, rel=0.01)


def test_dense_layers_of_a_moe_model_count_once_and_are_read_every_step():
    cfg = {**HF_CONFIGS["qwen3-30b-a3b"][0], "mlp_only_layers": [0, 1]}
    profile = ModelProfile.from_hf_config(cfg, "two-dense")
    all_moe = get_model("qwen3-30b-a3b")
    assert (profile.num_dense_layers, profile.dense_intermediate_size) == (2, 6144)
    per_layer_experts = 128 * all_moe.num_expert_params + 2048 * 128
    assert all_moe.num_params - profile.num_params == 2 * (per_layer_experts - 3 * 2048 * 6144)
    hardware = get_hardware("h200")
    assert (
        RooflinePredictor(profile, hardware)._dense_bytes
        > RooflinePredictor(all_moe, hardware)._dense_bytes
    )


def test_qwen3_shape_has_its_own_head_dim():
    qwen = get_model("qwen3-0.6b")
    assert qwen.head_dim == 128 and qwen.num_heads * qwen.head_dim != qwen.hidden_size
    assert qwen.num_params == pytest.approx(0.596e9, rel=0.01)
    assert qwen.kv_bytes_per_token == 28 * 2 * 8 * 128 * 2


def test_a_local_hf_directory_gives_a_profile_and_simulates(tmp_path):
    cfg = HF_CONFIGS["qwen3-0.6b"][0]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    profile = get_model(str(tmp_path))
    assert profile.name == str(tmp_path)
    assert profile.num_params == get_model("qwen3-0.6b").num_params
    assert profile.max_model_len == 40960  # the config's context
    system = build_system(SimConfig(hardware="h200", model=str(tmp_path)))
    assert system.model == profile and system.num_device_blocks > 0


def test_an_unknown_name_that_is_no_directory_names_the_profiles():
    with pytest.raises(ValueError, match="smollm2-135m"):
        get_model("/no/such/model")


def test_the_simulators_profiles_import_without_torch():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from superinfer.sim.models import get_model\n"
        "from superinfer.sim.simulation import build_system\n"
        "print(get_model('mixtral-8x7b').num_experts)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "8"
