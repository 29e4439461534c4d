"""Simulator configuration: one dataclass for the simulated system, one for its workload.
CLI flags are derived from the fields (`superinfer simulate --help`)."""

from __future__ import annotations

from dataclasses import dataclass

from superinfer.config import opt
from superinfer.workload.datasets import LengthLimits


@dataclass
class SimConfig:
    hardware: str = opt(
        "gh200", "Hardware profile: gh200 (= gh200-144), gh200-96, h100-pcie5, h200, cpu."
    )
    model: str = opt(
        "llama-3-8b", "Model profile: llama-3-8b, qwen2.5-32b, mixtral-8x7b, smollm2-135m."
    )
    policy: str = opt("rotasched", "Scheduling policy (as `superinfer serve --policy`).")
    predictor: str = opt(
        "auto",
        "Step-time predictor: roofline, fitted (the hardware's calibrated profile), a path "
        "to a fit written by `superinfer calibrate`, or auto (fitted where the hardware has "
        "a calibrated profile, else roofline).",
    )
    transfer_mode: str = opt(
        "duplex",
        "KV copies: duplex (block-first layout, one copy per run of blocks, one lane per "
        "direction) or naive (per-layer layout: one copy per layer, K/V and block; one lane).",
        choices=["duplex", "naive"],
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
    block_size: int = opt(16, "Tokens per KV block.")
    num_device_blocks: int | None = opt(
        None, "Device KV pool in blocks (default: what the device memory leaves after weights)."
    )
    host_kv_gib: float | None = opt(
        None, "Host KV pool in GiB (default: 400 GiB, the paper's, capped at 90%% of host memory)."
    )
    max_num_seqs: int = opt(256, "Most requests in the running batch (vLLM 0.6's default).")
    max_num_batched_tokens: int = opt(16384, "Token budget of one step (the paper's).")
    max_model_len: int | None = opt(None, "Longest sequence (default: the model profile's).")
    rotation_budget: int | None = opt(
        None,
        "rotasched: free device blocks kept by proactive rotation (paper: 2400; "
        "default: 5%% of the device pool).",
    )
    enable_prefix_caching: bool = opt(True, "Reuse the KV of full, computed prompt blocks.")
    pipeline: bool | None = opt(
        None,
        "Schedule step k+1 while step k computes (default: as the engine, on for GPU "
        "profiles, off for the cpu profile).",
    )
    ttft_slo_ms: float | None = opt(
        None, "TTFT target (default: the profile's, see docs/simulator.md)."
    )
    tbt_slo_ms: float | None = opt(None, "TBT/TPOT target (default: the profile's).")
    drain_timeout_s: float = opt(
        600.0, "Virtual seconds after the last arrival before unfinished requests are aborted."
    )
    check_invariants_every: int = opt(0, "Check scheduler invariants every N steps (0: never).")
    timeline_interval_s: float | None = opt(None, "Sample KV usage every N virtual seconds.")

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("block_size, max_num_seqs and max_num_batched_tokens must be >= 1")
        if self.transfer_mode not in ("duplex", "naive"):
            raise ValueError(f"transfer_mode must be duplex or naive, got {self.transfer_mode!r}")
        if self.step_noise_sigma is not None and self.step_noise_sigma < 0:
            raise ValueError(f"step_noise_sigma must be >= 0, got {self.step_noise_sigma}")
        if self.step_noise_lag1 is not None and not 0 <= self.step_noise_lag1 < 1:
            raise ValueError(f"step_noise_lag1 must be in [0, 1), got {self.step_noise_lag1}")


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

    def __post_init__(self) -> None:
        if self.request_rate <= 0:
            raise ValueError("request_rate must be > 0")
        if self.duration is None and self.num_requests is None:
            raise ValueError("give --duration or --num-requests")

    @property
    def limits(self) -> LengthLimits:
        return LengthLimits(self.max_prompt_tokens, self.max_total_tokens,
                            max_output_tokens=self.max_output_tokens)  # fmt: skip
