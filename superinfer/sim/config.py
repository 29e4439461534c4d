"""Simulator configuration: the simulated system (its profiles and predictor, and the
engine's own `SchedulerConfig` and `CacheConfig`, nested) and its workload. CLI flags are
derived from the fields (`superinfer simulate --help`), the nested configs' included."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from superinfer.config import CPU_DEVICE_KV_GIB, CacheConfig, SchedulerConfig, opt
from superinfer.sim.hardware import GIB, HardwareProfile, get_hardware
from superinfer.sim.models import get_model
from superinfer.slo.classes import load_slo_config
from superinfer.workload.datasets import LengthLimits

PAPER_HOST_POOL_GIB = 400.0

# The simulator's defaults and help where they are not the engine's: the paper's batch
# limits, and pools and model length sized by the profiles (None, resolved by `SimConfig`).
SIM_FLAG_OVERRIDES: dict[str, dict[str, Any]] = {
    "max_num_seqs": {"default": 256, "help": "Most requests in the running batch (vLLM 0.6's "
                     "default)."},
    "max_num_batched_tokens": {"default": 16384, "help": "Token budget of one step (the "
                               "paper's)."},
    "max_model_len": {"default": None, "help": "Longest sequence (default: the model "
                      "profile's)."},
    "pipeline": {"help": "Schedule step k+1 while step k computes (default: as the engine, on "
                 "for GPU profiles, off for the cpu profile)."},
    "device_kv_gib": {"default": None, "help": "Device KV pool in GiB (default: what the "
                      "device memory leaves after weights and activations)."},
    "gpu_memory_utilization": {"help": "Share of the device memory the engine may use; the "
                               "device KV pool gets what the weights and activations leave "
                               "(default: the hardware profile's, 0.9 on GPUs)."},
    "host_kv_gib": {"default": None, "help": "Host KV pool in GiB (default: the hardware "
                    "profile's, else 400 GiB, the paper's, capped at 90%% of host memory)."},
}  # fmt: skip
SIM_DEFAULTS = {name: o["default"] for name, o in SIM_FLAG_OVERRIDES.items() if "default" in o}
_PARTS = {"scheduler": SchedulerConfig, "cache": CacheConfig}
_OWNERS = {f.name: part for part, config_type in _PARTS.items() for f in fields(config_type)}
_FROM_PROFILES = ("max_model_len", "device_kv_gib", "host_kv_gib")
_DEVICE_POOL_SIZES = ("num_device_blocks", "kv_cache_memory_bytes", "gpu_memory_utilization")


@dataclass(init=False)
class SimConfig:
    """The simulated system. Built with the nested configs (`scheduler=SchedulerConfig(...)`)
    or flat, their fields by name (`SimConfig(policy="ddps", max_num_seqs=16)`), set on the
    given nested config or else on the simulator's defaults (`SIM_DEFAULTS`); a model length
    or KV pool given as None is resolved from the profiles, and `slo_config` sets the
    scheduler's class reservations (as `superinfer serve --slo-config`)."""

    hardware: str = opt(
        "gh200", "Hardware profile: gh200 (= gh200-144), gh200-96, h100-pcie5, h200, cpu."
    )
    model: str = opt(
        "llama-3-8b",
        "Model profile: llama-3-8b, qwen2.5-32b, mixtral-8x7b, smollm2-135m, qwen3-0.6b, "
        "qwen3-30b-a3b, or a local Hugging Face model directory of any supported "
        "architecture (its config.json, through the model registry).",
    )
    predictor: str = opt(
        "auto",
        "Step-time predictor: roofline, fitted (the hardware's calibrated profile), a path "
        "to a fit written by `superinfer calibrate`, or auto (fitted where the hardware has "
        "a calibrated profile, else roofline).",
    )
    link_gbps: float | None = opt(None, "Override the host link's GB/s per direction.")
    half_duplex: bool = opt(False, "Model the host link as half duplex (directions take turns).")
    step_noise_sigma: float | None = opt(
        None,
        "Step-time noise: standard deviation of each step's log time factor (mean 1), "
        "consecutive steps correlated by --step-noise-lag1 (default: what `calibrate` "
        "measured for a fitted predictor, none for the roofline; 0: exact predicted times).",
    )
    step_noise_lag1: float | None = opt(
        None, "Correlation of consecutive steps' noise (default: the fit's, else 0)."
    )
    noise_seed: int = opt(0, "Seed of the step-time noise.")
    ttft_slo_ms: float | None = opt(
        None, "TTFT target (default: the profile's, see docs/simulator.md; overrides a class's)."
    )
    tbt_slo_ms: float | None = opt(
        None, "TBT/TPOT target (default: the profile's; overrides a class's)."
    )
    slo_config: str | None = opt(
        None,
        "SLO class file (YAML/JSON, as `superinfer serve --slo-config`): its reservations "
        "reach the scheduler, its targets the requests --slo-classes puts in its classes "
        "(default: the built-in classes, which reserve nothing).",
    )
    admission: bool = opt(
        False,
        "Refuse at arrival as `superinfer serve` does (425 when the shared estimate says a "
        "request's TTFT target or deadline cannot be met, 429 on a full queue), learning the "
        "estimate's correction from each first token; off: every servable request is served.",
    )
    reject_infeasible_tbt: bool = opt(
        True,
        "With --admission, also refuse (425) a request whose TBT target the estimate says "
        "cannot be kept, or that would make admitted requests miss theirs, as `superinfer "
        "serve --reject-infeasible-tbt` does (its default).",
    )
    drain_timeout_s: float = opt(
        600.0, "Virtual seconds after the last arrival before unfinished requests are aborted."
    )
    check_invariants_every: int = opt(0, "Check scheduler invariants every N steps (0: never).")
    timeline_interval_s: float | None = opt(None, "Sample KV usage every N virtual seconds.")
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig, metadata={"is_cli": False})
    cache: CacheConfig = field(default_factory=CacheConfig, metadata={"is_cli": False})

    def __init__(
        self,
        scheduler: SchedulerConfig | None = None,
        cache: CacheConfig | None = None,
        **options: Any,
    ) -> None:
        own = [f for f in fields(self) if f.name not in _PARTS]
        unknown = set(options) - {f.name for f in own} - set(_OWNERS)
        if unknown:
            raise TypeError(f"unknown simulator options {sorted(unknown)}")
        for f in own:
            setattr(self, f.name, options.get(f.name, f.default))
        flat = {part: {k: v for k, v in options.items() if _OWNERS.get(k) == part}
                for part in _PARTS}  # fmt: skip
        slo_config = load_slo_config(self.slo_config)  # the default classes without a file
        if self.slo_config is not None and "class_reservations" not in options:
            flat["scheduler"]["class_reservations"] = slo_config.reservations()
        if "class_order" not in options:
            flat["scheduler"]["class_order"] = tuple(slo_config.class_names)
        self.scheduler = self._nested(SchedulerConfig, scheduler, flat["scheduler"])
        self.cache = self._nested(CacheConfig, cache, flat["cache"])
        self._check()

    def _nested(self, config_type: type, given: Any, values: dict[str, Any]) -> Any:
        if given is None:
            names = {f.name for f in fields(config_type)}
            values = {**{k: v for k, v in SIM_DEFAULTS.items() if k in names}, **values}
        pool = {k: values.get(k, getattr(given, k, None)) for k in _DEVICE_POOL_SIZES}
        for name in _FROM_PROFILES:
            if name in values and values[name] is None:
                values[name] = self._from_profiles(name, pool)
        return config_type(**values) if given is None else replace(given, **values)

    def _from_profiles(self, name: str, pool: dict[str, Any]) -> Any:
        hardware, model = get_hardware(self.hardware), get_model(self.model)
        if name == "max_model_len":
            return model.max_model_len
        if name == "host_kv_gib":
            return profile_host_kv_gib(hardware)
        if any(value is not None for value in pool.values()):  # the engine's precedence
            return CPU_DEVICE_KV_GIB
        return hardware.num_device_kv_bytes(model.weight_bytes) / GIB  # exact: GIB is 2**30

    def _check(self) -> None:
        if self.step_noise_sigma is not None and self.step_noise_sigma < 0:
            raise ValueError(f"step_noise_sigma must be >= 0, got {self.step_noise_sigma}")
        if self.step_noise_lag1 is not None and not 0 <= self.step_noise_lag1 < 1:
            raise ValueError(f"step_noise_lag1 must be in [0, 1), got {self.step_noise_lag1}")

    @property
    def pipeline(self) -> bool | None:
        """The configured step pipeline (None: the engine's default for the hardware)."""
        return self.scheduler.pipeline

    def to_flat(self) -> dict[str, Any]:
        """Every option by name, the nested configs' too: `SimConfig(**c.to_flat()) == c`."""
        own = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _PARTS}
        return {**own, **asdict(self.scheduler), **asdict(self.cache)}


def profile_host_kv_gib(hardware: HardwareProfile) -> float:
    """The host pool of a profile: its own, else the paper's, capped at 90% of host memory."""
    if hardware.default_host_kv_gib is not None:
        return hardware.default_host_kv_gib
    return min(PAPER_HOST_POOL_GIB, 0.9 * hardware.host_memory_gb * 1e9 / GIB)


@dataclass
class WorkloadConfig:
    """The workload flags of `superinfer simulate`: token lengths (ShareGPT's or uniform) and
    Poisson arrivals, no text. The benchmark's request sequence, with prompts, is
    `superinfer.workload.config.WorkloadConfig`; both sample with `superinfer.workload`."""

    dataset: str = opt(
        "sharegpt", "Request lengths: sharegpt or synthetic.", choices=["sharegpt", "synthetic"]
    )
    request_rate: float = opt(10.0, "Poisson arrivals per second.")
    duration: float | None = opt(120.0, "Seconds of arrivals (requests = rate x duration).")
    num_requests: int | None = opt(None, "Number of requests (overrides --duration).")
    seed: int = opt(0, "Seed of the request sample and the arrival times.")
    max_prompt_tokens: int = opt(1024, "ShareGPT: drop pairs with longer prompts (vLLM's filter).")
    max_total_tokens: int = opt(2048, "ShareGPT: drop pairs longer than this in all (vLLM's).")
    max_output_tokens: int | None = opt(None, "Cap each request's output length.")
    synthetic_prompt_tokens: str = opt("128-512", "synthetic: prompt length range LO-HI.")
    synthetic_output_tokens: str = opt("32-256", "synthetic: output length range LO-HI.")
    slo_classes: str | None = opt(
        None,
        "Class mix, e.g. gold=0.2,silver=0.5,bronze=0.3 (as `superinfer bench serve`): each "
        "class gets exactly its share of the requests (order drawn with --seed) and its targets "
        "and reservations from --slo-config (default: no classes, the profile's targets).",
    )

    def __post_init__(self) -> None:
        if self.request_rate <= 0:
            raise ValueError("request_rate must be > 0")
        if self.duration is None and self.num_requests is None:
            raise ValueError("give --duration or --num-requests")

    @property
    def limits(self) -> LengthLimits:
        return LengthLimits(self.max_prompt_tokens, self.max_total_tokens,
                            max_output_tokens=self.max_output_tokens)  # fmt: skip
