"""Small simulated systems for the simulator's tests: tiny pools, so memory runs short."""

from __future__ import annotations

from superinfer.sim.config import SimConfig
from superinfer.sim.predictor import ConstantPredictor
from superinfer.sim.simulation import SimRun, simulate
from superinfer.sim.workload import SimRequest, synthetic_workload


def small_config(**overrides) -> SimConfig:
    """SmolLM2 on the cpu profile with a 48-block device pool: an overloaded system."""
    options = {
        "hardware": "cpu", "model": "smollm2-135m", "policy": "rotasched",
        "num_device_blocks": 48, "host_kv_gib": 0.05, "max_num_seqs": 16,
        "max_num_batched_tokens": 256, "max_model_len": 512, "check_invariants_every": 1,
        "drain_timeout_s": 300.0,
    }  # fmt: skip
    options.update(overrides)
    return SimConfig(**options)


def small_workload(num_requests: int = 40, rate: float = 8.0, seed: int = 0) -> list[SimRequest]:
    return synthetic_workload(rate, num_requests, (16, 160), (4, 48), seed)


def run_small(workload: list[SimRequest] | None = None, **overrides) -> SimRun:
    predictor = ConstantPredictor(step_s=0.02, token_s=2e-4, host_s=1e-3)
    return simulate(small_config(**overrides), workload or small_workload(), predictor)
