"""The SLO contract's data: a request's latency targets (all times in milliseconds).

Pure Python. Resolution from headers, body and classes happens at the server's ingress
(`binding.py`); the scheduler and the policies only read the resolved `SLOTargets`.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_TTFT_MS = 1000.0
DEFAULT_TBT_MS = 200.0


@dataclass(frozen=True)
class SLOTargets:
    ttft_ms: float = DEFAULT_TTFT_MS  # arrival to first token
    tbt_ms: float = DEFAULT_TBT_MS  # between tokens (TPOT is judged against it)
    max_latency_ms: float | None = None  # end-to-end budget from arrival
    slo_class: str | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_ms", "tbt_ms", "max_latency_ms"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be a positive number of milliseconds, got {value}")

    @property
    def ttft_s(self) -> float:
        return self.ttft_ms / 1000.0

    @property
    def tbt_s(self) -> float:
        return self.tbt_ms / 1000.0
