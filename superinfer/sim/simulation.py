"""Build a simulated system from a `SimConfig` and run a workload through it."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from superinfer.config import CPU_DEVICE_KV_GIB, CacheConfig
from superinfer.core.factory import build_scheduler
from superinfer.core.request import Request
from superinfer.sampling_params import SamplingParams
from superinfer.sim.admission import SimAdmission
from superinfer.sim.config import SimConfig
from superinfer.sim.engine import SimEngine
from superinfer.sim.event_loop import EventLoop
from superinfer.sim.events import Arrival, TransferDone
from superinfer.sim.fitted import FittedPredictor
from superinfer.sim.hardware import GIB, HardwareProfile, get_hardware
from superinfer.sim.models import ModelProfile, get_model
from superinfer.sim.noise import NoiseParams, NoisyStepModel, StepNoise
from superinfer.sim.predictor import StepTimePredictor
from superinfer.sim.profile_targets import resolve_targets
from superinfer.sim.roofline import RooflinePredictor
from superinfer.sim.runner import SimModelRunner
from superinfer.sim.transfer import LinkModel, SimTransferEngine
from superinfer.sim.workload import SimRequest
from superinfer.slo import SLOTargets
from superinfer.slo.classes import SLOConfig, load_slo_config

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
    slo: SLOConfig = field(default_factory=SLOConfig)  # the classes of --slo-config


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
    cache = config.cache
    block_bytes = model.kv_bytes_per_block(cache.block_size)
    num_device = cache.num_device_blocks
    if num_device is None:
        num_device = int(device_pool_bytes(cache, hardware, model.weight_bytes) // block_bytes)
    num_host = cache.num_host_blocks
    if num_host is None:
        num_host = int(cache.host_kv_gib * GIB // block_bytes)
    return SimSystem(
        config, hardware, model, predictor,
        resolve_targets(model, hardware, config.ttft_slo_ms, config.tbt_slo_ms),
        num_device, num_host, config.scheduler.max_model_len, step_noise(config, predictor),
        load_slo_config(config.slo_config),
    )  # fmt: skip


def device_pool_bytes(cache: CacheConfig, hardware: HardwareProfile, weight_bytes: int) -> float:
    """The engine's precedence: --kv-cache-memory-bytes, else what the weights and activations
    leave of --gpu-memory-utilization of the device memory, else --device-kv-gib."""
    if cache.kv_cache_memory_bytes is not None:
        return cache.kv_cache_memory_bytes
    if cache.gpu_memory_utilization is not None:
        share = cache.gpu_memory_utilization
        return replace(hardware, gpu_memory_utilization=share).num_device_kv_bytes(weight_bytes)
    return (CPU_DEVICE_KV_GIB if cache.device_kv_gib is None else cache.device_kv_gib) * GIB


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
    # steps are shaped by the simulated machine's own step times, as the real engine's
    # are by the model it fits to its own steps
    step_model = system.predictor
    if not system.noise.is_exact:  # the real model's late factor is its steps' scatter
        step_model = NoisyStepModel(system.predictor, system.noise)
    scheduler = build_scheduler(
        replace(config.scheduler, pipeline=pipeline), config.cache, system.num_device_blocks,
        system.num_host_blocks, step_model=step_model,
    )  # fmt: skip
    hardware, model = system.hardware, system.model
    link = LinkModel(
        hardware.link_gbps_per_direction, hardware.is_full_duplex, hardware.copy_overhead_s,
        model.kv_bytes_per_block(config.cache.block_size), model.num_kv_pieces_per_block(),
    )  # fmt: skip
    transfer = SimTransferEngine(
        link, config.cache.transfer_mode, lambda: loop.now,
        lambda transfer_id, end: loop.post(TransferDone(end, transfer_id)),
    )  # fmt: skip
    noise = None if system.noise.is_exact else StepNoise(system.noise, config.noise_seed)
    admission = None
    if config.admission:  # the server's bounds on the waiting queue (ServerConfig's defaults)
        admission = SimAdmission(system.slo, system.predictor, 1024, 1 << 20,
                                 config.reject_infeasible_tbt)  # fmt: skip
    return SimEngine(
        scheduler, SimModelRunner(system.predictor, noise), transfer, pipeline,
        config.check_invariants_every, config.timeline_interval_s, admission,
    )  # fmt: skip


def make_request(index: int, spec: SimRequest, targets: SLOTargets, priority: int = 0) -> Request:
    """The engine's request for `spec`; `priority` is its class's, as the server sets it
    (`SLOConfig.priority_of`: the class's rank unless the config gives one)."""
    base = index * TOKEN_STRIDE
    return Request(
        request_id=str(index),
        prompt_token_ids=list(range(base, base + spec.num_prompt_tokens)),
        sampling_params=SamplingParams(
            max_tokens=spec.num_output_tokens, temperature=0.0, ignore_eos=True
        ),
        arrival_time=spec.arrival_s,
        priority=priority,
        slo=targets,
    )


def class_targets(system: SimSystem) -> dict[str | None, SLOTargets]:
    """Each class's targets, --ttft-slo-ms / --tbt-slo-ms overriding them as at a benchmark's
    client; None (a request without a class): the profile's targets."""
    config = system.config
    targets: dict[str | None, SLOTargets] = {None: system.targets}
    for slo_class in system.slo.classes:
        t = slo_class.targets()
        targets[slo_class.name] = replace(
            t, ttft_ms=t.ttft_ms if config.ttft_slo_ms is None else config.ttft_slo_ms,
            tbt_ms=t.tbt_ms if config.tbt_slo_ms is None else config.tbt_slo_ms,
        )  # fmt: skip
    return targets


def simulate(
    config: SimConfig, workload: Sequence[SimRequest], predictor: StepTimePredictor | None = None
) -> SimRun:
    """Run `workload` through the system `config` describes; deterministic."""
    started = time.perf_counter()
    system = build_system(config, predictor)
    loop = EventLoop()
    engine = build_engine(system, loop)
    targets = class_targets(system)
    requests = []
    for i, spec in enumerate(workload):
        if spec.slo_class not in targets:
            raise ValueError(
                f"unknown SLO class {spec.slo_class!r}; configured: {system.slo.class_names}"
            )
        priority = system.slo.priority_of(spec.slo_class)
        requests.append(make_request(i, spec, targets[spec.slo_class], priority))
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
