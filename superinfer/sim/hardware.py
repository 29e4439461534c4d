"""Hardware profiles: compute and memory ceilings, KV pool sizes, and the host link.

Numbers are datasheet ceilings with efficiency factors for what serving kernels reach;
the `cpu` profile describes this machine and is meant to be used with the fitted predictor
that `superinfer calibrate` writes. Each profile states its sources in `notes`.

The host link moves KV blocks between the device and host tiers. A copy costs
`copy_overhead_s` (launch and DMA set-up) plus its bytes over `link_gbps_per_direction`.
A full-duplex link runs the two directions at once at full rate each; a half-duplex one
serializes them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

GB = 1e9
GIB = 1 << 30


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    peak_tflops: float  # dense bf16 matrix throughput
    hbm_gbps: float  # device memory bandwidth, GB/s
    device_memory_gb: float
    host_memory_gb: float
    link_gbps_per_direction: float
    is_full_duplex: bool = True
    copy_overhead_s: float = 3e-6  # per copy call (per run, or per piece in naive mode)
    compute_efficiency: float = 0.6  # share of peak that large GEMMs reach
    attention_efficiency: float = 0.4  # share of peak for attention FLOPs (prefill)
    memory_efficiency: float = 0.8  # share of the bandwidth that weight / KV streaming reaches
    step_overhead_s: float = 1.5e-3  # per step: scheduling, input preparation, launches
    sequence_overhead_s: float = 10e-6  # per sequence in a step: metadata and sampling
    gpu_memory_utilization: float = 0.9  # share of device memory the engine may take
    activation_reserve_gb: float = 4.0  # kept for activations, graphs and the allocator
    is_weights_on_device: bool = True  # False: device memory is a capped KV pool (the CPU)
    default_host_kv_gib: float | None = None  # host KV pool (None: the paper's 400 GiB, capped)
    fitted_profile: str | None = None  # file under sim/profiles for the fitted predictor
    fitted_model: str | None = None  # the model profile that fit was timed with
    notes: str = ""

    def num_device_kv_bytes(self, weight_bytes: int) -> float:
        """Device memory left for the KV cache after weights and activations."""
        usable = self.device_memory_gb * GB * self.gpu_memory_utilization
        if not self.is_weights_on_device:
            return usable
        free = usable - weight_bytes - self.activation_reserve_gb * GB
        if free <= 0:
            raise ValueError(
                f"{self.name}: {weight_bytes / GB:.1f} GB of weights leave no room for KV in "
                f"{self.device_memory_gb:.0f} GB"
            )
        return free

    def with_link(
        self,
        gbps: float | None = None,
        is_full_duplex: bool | None = None,
        copy_overhead_s: float | None = None,
    ) -> HardwareProfile:
        """A copy with another host link (sensitivity studies, calibrated links)."""
        return replace(
            self,
            link_gbps_per_direction=gbps if gbps is not None else self.link_gbps_per_direction,
            is_full_duplex=is_full_duplex if is_full_duplex is not None else self.is_full_duplex,
            copy_overhead_s=copy_overhead_s
            if copy_overhead_s is not None
            else self.copy_overhead_s,
        )

    def has_fit_for(self, model_name: str) -> bool:
        return self.fitted_profile is not None and self.fitted_model == model_name


_H100_NOTES = "H100 SXM: 989 TFLOP/s dense bf16"
HARDWARE: dict[str, HardwareProfile] = {
    p.name: p
    for p in (
        HardwareProfile(
            "gh200-144", peak_tflops=989, hbm_gbps=4900, device_memory_gb=144,
            host_memory_gb=480, link_gbps_per_direction=450,
            notes=f"GH200 with 144 GB HBM3e (4.9 TB/s); {_H100_NOTES}; NVLink-C2C 450 GB/s "
            "per direction, full duplex; 480 GB LPDDR5X host memory",
        ),
        HardwareProfile(
            "gh200-96", peak_tflops=989, hbm_gbps=4000, device_memory_gb=96,
            host_memory_gb=480, link_gbps_per_direction=450,
            notes=f"GH200 with 96 GB HBM3 (4.0 TB/s); {_H100_NOTES}; NVLink-C2C 450 GB/s per "
            "direction, full duplex; 480 GB LPDDR5X host memory",
        ),
        HardwareProfile(
            "h100-pcie5", peak_tflops=989, hbm_gbps=3350, device_memory_gb=80,
            host_memory_gb=512, link_gbps_per_direction=55,
            notes=f"{_H100_NOTES}, 80 GB HBM3 (3.35 TB/s); host over PCIe Gen5 x16 (64 GB/s "
            "per direction nominal, about 55 achieved with pinned memory)",
        ),
        HardwareProfile(
            "h200", peak_tflops=989, hbm_gbps=4800, device_memory_gb=141,
            host_memory_gb=512, link_gbps_per_direction=55,
            notes="H200 SXM: H100 compute, 141 GB HBM3e (4.8 TB/s); host over PCIe Gen5 x16",
        ),
        HardwareProfile(
            "cpu", peak_tflops=0.1, hbm_gbps=10, device_memory_gb=0.25 * GIB / GB,
            host_memory_gb=24.0, is_weights_on_device=False, default_host_kv_gib=1.0, link_gbps_per_direction=3.0, is_full_duplex=False,
            copy_overhead_s=20e-6, compute_efficiency=0.5, attention_efficiency=0.3,
            memory_efficiency=0.7, step_overhead_s=3e-3, sequence_overhead_s=100e-6,
            gpu_memory_utilization=1.0, activation_reserve_gb=0.0,
            fitted_profile="cpu_smollm2.json", fitted_model="smollm2-135m",
            notes="this 2-core VM (AMD EPYC, AVX2/FMA): the 'device' tier is a capped pool in "
            "host memory (the engine's defaults: 0.25 GiB device, 1 GiB host) and both lanes share one memory bus (half duplex); step times come "
            "from the fitted predictor that `superinfer calibrate` writes; the roofline "
            "numbers are rough",
        ),
    )
}  # fmt: skip
HARDWARE["gh200"] = HARDWARE["gh200-144"]  # the paper's machine


def get_hardware(name: str) -> HardwareProfile:
    try:
        return HARDWARE[name]
    except KeyError:
        raise ValueError(
            f"unknown hardware {name!r}; choose one of {', '.join(HARDWARE)}"
        ) from None
