from __future__ import annotations

import pytest

from superinfer.sim.config import SimConfig
from superinfer.sim.hardware import get_hardware
from superinfer.sim.models import get_model
from superinfer.sim.profile_targets import default_targets, resolve_targets, round_up_nice
from superinfer.sim.simulation import build_system


def test_parameter_counts_match_the_published_sizes():
    assert get_model("llama-3-8b").num_params == pytest.approx(8.03e9, rel=0.01)
    assert get_model("qwen2.5-32b").num_params == pytest.approx(32.8e9, rel=0.02)
    mixtral = get_model("mixtral-8x7b")
    assert mixtral.num_params == pytest.approx(46.7e9, rel=0.01)
    assert mixtral.num_active_params == pytest.approx(12.9e9, rel=0.01)
    assert get_model("smollm2-135m").num_params == pytest.approx(134.5e6, rel=0.01)


def test_kv_bytes_follow_the_config_dimensions():
    # 32 layers x K,V x 8 kv heads x 128 x 2 bytes = 128 KiB a token; 2 MiB a 16-token block
    assert get_model("llama-3-8b").kv_bytes_per_block(16) == 2 * 2**20
    assert get_model("smollm2-135m").kv_bytes_per_token == 23040  # benchmarks.md's figure
    assert get_model("llama-3-8b").num_kv_pieces_per_block() == 64


def test_device_pool_is_what_the_weights_leave():
    system = build_system(SimConfig(hardware="gh200-144", model="llama-3-8b"))
    kv_bytes = 144e9 * 0.9 - 8.03e9 * 2 - 4e9
    assert system.num_device_blocks == pytest.approx(kv_bytes / 2**21, rel=0.01)
    small = build_system(SimConfig(hardware="gh200-96", model="qwen2.5-32b"))
    assert small.num_device_blocks < system.num_device_blocks / 2
    assert system.num_host_blocks == 400 * 2**30 // 2**21  # the paper's 400 GiB host pool


def test_unknown_profiles_are_named_in_the_error():
    with pytest.raises(ValueError, match="gh200"):
        get_hardware("tpu")
    with pytest.raises(ValueError, match="llama-3-8b"):
        get_model("gpt-5")


def test_default_targets_follow_the_rule_and_flags_override_them():
    targets = default_targets(get_model("llama-3-8b"), get_hardware("gh200"))
    assert targets.ttft_ms > targets.tbt_ms > 0
    slower = default_targets(get_model("qwen2.5-32b"), get_hardware("gh200"))
    assert slower.ttft_ms > targets.ttft_ms and slower.tbt_ms > targets.tbt_ms
    assert default_targets(get_model("smollm2-135m"), get_hardware("cpu")).ttft_ms == 2000
    resolved = resolve_targets(get_model("llama-3-8b"), get_hardware("gh200"), tbt_ms=77.0)
    assert resolved.tbt_ms == 77.0 and resolved.ttft_ms == targets.ttft_ms


@pytest.mark.parametrize(("ms", "nice"), [(33.5, 40.0), (266, 300.0), (1000, 1000.0), (101, 150.0)])
def test_targets_round_up_to_the_ladder(ms, nice):
    assert round_up_nice(ms) == nice
