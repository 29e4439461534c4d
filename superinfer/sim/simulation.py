"""Build a simulated system from a `SimConfig` and run a workload through it."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from superinfer.config import SchedulerConfig
from superinfer.core.kv.manager import TwoTierKVManager
from superinfer.core.policies import create_policy
from superinfer.core.request import Request
from superinfer.core.scheduler import Scheduler
from superinfer.sampling_params import SamplingParams
from superinfer.sim.config import SimConfig
from superinfer.sim.engine import SimEngine
from superinfer.sim.event_loop import EventLoop
from superinfer.sim.events import Arrival, TransferDone
from superinfer.sim.fitted import FittedPredictor
from superinfer.sim.hardware import GIB, HardwareProfile, get_hardware
from superinfer.sim.models import ModelProfile, get_model
from superinfer.sim.noise import NoiseParams, StepNoise
from superinfer.sim.predictor import StepTimePredictor
from superinfer.sim.profile_targets import resolve_targets
from superinfer.sim.roofline import RooflinePredictor
from superinfer.sim.runner import SimModelRunner
from superinfer.sim.transfer import LinkModel, SimTransferEngine
from superinfer.sim.workload import SimRequest
from superinfer.slo import SLOTargets

PAPER_HOST_POOL_GIB = 400.0
TOKEN_STRIDE = 1 << 20  # prompt token ids of request i start at i * stride: no shared prefixes


@dataclass
class SimSystem:
    """Everything one simulated run needs, built from a `SimConfig`."""

    config: SimConfig
    hardware: HardwareProfile
    model: ModelProfile
    predictor: StepTimePredictor
    targets: SLOTargets
    num_device_blocks: int
    num_host_blocks: int
    max_model_len: int
    noise: NoiseParams  # step-time noise (exact: none)


@dataclass
class SimRun:
    """The outcome of a run: the requests (with their timestamps) and the engine."""

    system: SimSystem
    requests: list[Request]
    rejected: list[Request]
    aborted: list[Request]
    engine: SimEngine
    loop: EventLoop
    end_time: float
    wall_s: float
    extra: dict = field(default_factory=dict)


def build_system(config: SimConfig, predictor: StepTimePredictor | None = None) -> SimSystem:
    """The profiles, predictor, targets and pool sizes `config` asks for (`predictor`
    replaces the configured one: tests, custom predictors)."""
    hardware, model = get_hardware(config.hardware), get_model(config.model)
    predictor = predictor or make_predictor(config.predictor, model, hardware)
    hardware = calibrated_link(hardware, predictor)
    if config.link_gbps is not None or config.half_duplex:
        hardware = hardware.with_link(config.link_gbps, False if config.half_duplex else None)
    block_bytes = model.kv_bytes_per_block(config.block_size)
    num_device = config.num_device_blocks
    if num_device is None:
        num_device = int(hardware.num_device_kv_bytes(model.weight_bytes) // block_bytes)
    host_gib = config.host_kv_gib
    if host_gib is None:
        host_gib = hardware.default_host_kv_gib
    if host_gib is None:
        host_gib = min(PAPER_HOST_POOL_GIB, 0.9 * hardware.host_memory_gb * 1e9 / GIB)
    return SimSystem(
        config, hardware, model, predictor,
        resolve_targets(model, hardware, config.ttft_slo_ms, config.tbt_slo_ms),
        num_device, int(host_gib * GIB // block_bytes), config.max_model_len or model.max_model_len,
        step_noise(config, predictor),
    )  # fmt: skip


def step_noise(config: SimConfig, predictor: StepTimePredictor) -> NoiseParams:
    """The configured noise, else what the fit measured, else none."""
    measured = predictor.meta.get("step_noise") if isinstance(predictor, FittedPredictor) else None
    measured = measured or {"sigma": 0.0, "lag1": 0.0}
    sigma = measured["sigma"] if config.step_noise_sigma is None else config.step_noise_sigma
    lag1 = measured["lag1"] if config.step_noise_lag1 is None else config.step_noise_lag1
    return NoiseParams(sigma, lag1)


def make_predictor(name: str, model: ModelProfile, hardware: HardwareProfile) -> StepTimePredictor:
    """roofline, fitted (the hardware's calibrated fit), auto, or a path to a saved fit."""
    if name == "auto":
        name = "fitted" if hardware.has_fit_for(model.name) else "roofline"
    if name == "roofline":
        return RooflinePredictor(model, hardware)
    if name == "fitted":
        if not hardware.has_fit_for(model.name):
            raise ValueError(
                f"hardware {hardware.name!r} has no calibrated fit for {model.name!r}; "
                "use --predictor roofline or a fit written by `superinfer calibrate`"
            )
        return FittedPredictor.load(hardware.fitted_profile)
    return FittedPredictor.load(name)


def calibrated_link(hardware: HardwareProfile, predictor: StepTimePredictor) -> HardwareProfile:
    """The host link a fit measured, in place of the profile's (the fit's machine)."""
    link = predictor.meta.get("link") if isinstance(predictor, FittedPredictor) else None
    if not link or hardware.fitted_profile is None:
        return hardware
    return hardware.with_link(
        link["gbps_per_direction"], link["is_full_duplex"], link["copy_overhead_s"]
    )


def is_pipelined(system: SimSystem) -> bool:
    """The engine's default: the pipeline pays off where the forward is asynchronous (GPUs)."""
    if system.config.pipeline is not None:
        return system.config.pipeline
    return system.hardware.name != "cpu"


def build_engine(system: SimSystem, loop: EventLoop) -> SimEngine:
    config = system.config
    pipeline = is_pipelined(system)
    scheduler_config = SchedulerConfig(
        max_num_seqs=config.max_num_seqs, max_num_batched_tokens=config.max_num_batched_tokens,
        max_model_len=system.max_model_len, policy=config.policy,
        rotation_budget=config.rotation_budget, pipeline=pipeline,
    )  # fmt: skip
    kv = TwoTierKVManager(
        system.num_device_blocks, system.num_host_blocks, config.block_size,
        config.enable_prefix_caching,
    )  # fmt: skip
    scheduler = Scheduler(scheduler_config, kv, create_policy(config.policy, scheduler_config))
    hardware, model = system.hardware, system.model
    link = LinkModel(
        hardware.link_gbps_per_direction, hardware.is_full_duplex, hardware.copy_overhead_s,
        model.kv_bytes_per_block(config.block_size), model.num_kv_pieces_per_block(),
    )  # fmt: skip
    transfer = SimTransferEngine(
        link, config.transfer_mode, lambda: loop.now,
        lambda transfer_id, end: loop.post(TransferDone(end, transfer_id)),
    )  # fmt: skip
    noise = None if system.noise.is_exact else StepNoise(system.noise, config.noise_seed)
    return SimEngine(
        scheduler, SimModelRunner(system.predictor, noise), transfer, pipeline,
        config.check_invariants_every, config.timeline_interval_s,
    )  # fmt: skip


def make_request(index: int, spec: SimRequest, targets: SLOTargets) -> Request:
    base = index * TOKEN_STRIDE
    return Request(
        request_id=str(index),
        prompt_token_ids=list(range(base, base + spec.num_prompt_tokens)),
        sampling_params=SamplingParams(
            max_tokens=spec.num_output_tokens, temperature=0.0, ignore_eos=True
        ),
        arrival_time=spec.arrival_s,
        slo=targets,
    )


def simulate(
    config: SimConfig, workload: Sequence[SimRequest], predictor: StepTimePredictor | None = None
) -> SimRun:
    """Run `workload` through the system `config` describes; deterministic."""
    started = time.perf_counter()
    system = build_system(config, predictor)
    loop = EventLoop()
    engine = build_engine(system, loop)
    requests = [make_request(i, spec, system.targets) for i, spec in enumerate(workload)]
    for request in requests:
        loop.post(Arrival(request.arrival_time, request))
    last_arrival = max((r.arrival_time for r in requests), default=0.0)
    loop.run(engine, until=last_arrival + config.drain_timeout_s)
    end_time = loop.now
    aborted = engine.abort_all(end_time) if engine.has_work else []
    return SimRun(
        system, requests, list(engine.rejected), aborted, engine, loop, end_time,
        time.perf_counter() - started,
    )  # fmt: skip
