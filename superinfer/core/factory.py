"""The one place a scheduler is built: the engine, the simulator and the tests call it."""

from __future__ import annotations

from superinfer.config import CacheConfig, SchedulerConfig
from superinfer.core.kv.manager import TwoTierKVManager
from superinfer.core.policies import create_policy
from superinfer.core.scheduler import Scheduler
from superinfer.core.step_time import StepTimePredictor


def build_scheduler(
    scheduler_config: SchedulerConfig,
    cache_config: CacheConfig,
    num_device_blocks: int,
    num_host_blocks: int,
    step_model: StepTimePredictor | None = None,
    sliding_window: int | None = None,
) -> Scheduler:
    """A scheduler over a two-tier KV manager of the given pool sizes (each caller sizes the
    pools its own way: the engine from memory, the simulator from a profile) and the policy
    `scheduler_config.policy` names. `step_model` is what steps are shaped by (the
    engine's `OnlineStepModel`, the simulator's predictor); None: steps are not shaped.
    `sliding_window`: the window of EVERY layer of the model (the engine works it out from
    the model's config), so blocks out of it are freed; None: no block is freed early."""
    kv = TwoTierKVManager(
        num_device_blocks, num_host_blocks, cache_config.block_size,
        cache_config.enable_prefix_caching, sliding_window=sliding_window,
    )  # fmt: skip
    policy = create_policy(scheduler_config.policy, scheduler_config)
    return Scheduler(scheduler_config, kv, policy, step_model)
