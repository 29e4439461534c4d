"""`build_scheduler`: the one place a scheduler, its KV manager and its policy are built."""

from __future__ import annotations

import pathlib
import re

import pytest

from superinfer.config import CacheConfig, SchedulerConfig
from superinfer.core.factory import build_scheduler
from superinfer.core.policies import available_policies
from tests.factories import make_request, make_scheduler, run_to_completion

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("policy", available_policies())
def test_the_configs_reach_the_kv_manager_and_the_policy(policy):
    config = SchedulerConfig(
        policy=policy, rotation_budget=3, ddps_margin=4.0, min_residency_tokens=9,
        class_reservations={"gold": (0.25, 0.5)},
    )  # fmt: skip
    cache = CacheConfig(block_size=8, enable_prefix_caching=False)
    scheduler = build_scheduler(config, cache, 40, 100)
    kv = scheduler.kv
    assert (kv.device.num_blocks, kv.host.num_blocks, kv.block_size) == (40, 100, 8)
    assert not kv.device.is_caching
    assert scheduler.policy.name == policy and scheduler.policy.config is config
    assert kv.is_eager_writeback == scheduler.policy.is_eager_writeback
    assert scheduler.reservations.reserved_blocks == {"gold": 10}  # a quarter of 40 blocks
    assert scheduler.reservations.reserved_tokens == {"gold": 256}  # half of 512


def test_an_unknown_policy_is_named_in_the_error():
    with pytest.raises(ValueError, match="rotasched"):
        build_scheduler(SchedulerConfig(policy="nope"), CacheConfig(), 16, 16)


def test_the_test_factory_builds_through_it_and_runs():
    scheduler = make_scheduler("ddps", num_device_blocks=12, block_size=4, min_residency_tokens=2)
    for i in range(6):
        scheduler.add_request(make_request(10, max_tokens=6, arrival_time=i * 0.01))
    run_to_completion(scheduler)
    assert scheduler.policy.config.min_residency_tokens == 2


def test_no_other_module_builds_a_scheduler_or_kv_manager():
    # the engine (engine/llm_engine.py), the simulator (sim/simulation.py) and the tests
    # (tests/factories.py) all call build_scheduler
    built = re.compile(r"(?<![\w.])(Scheduler|TwoTierKVManager)\(")
    builders = set()
    for path in [*(ROOT / "superinfer").rglob("*.py"), ROOT / "tests" / "factories.py"]:
        for line in path.read_text().splitlines():
            if built.search(line) and not line.lstrip().startswith("class "):
                builders.add(path.relative_to(ROOT).as_posix())
    assert builders == {"superinfer/core/factory.py"}
