"""Default SLO targets per (hardware, model) profile.

Rule (benchmarks.md): targets scale with the unloaded latency of the profile, computed
with the roofline predictor and rounded up to a step of the ladder 1, 1.5, 2, 2.5, 3, 4,
5, 6, 8 x 10^k ms:

    TTFT target = 10 x the unloaded prefill of a 1024-token prompt (ShareGPT's longest kept)
    TBT target  = 5 x the unloaded decode step of 32 requests with 1024 tokens of context

`cpu` uses the targets of `benchmarks/policies_overload.py` (2000 ms / 250 ms), so the
simulated and real runs on this machine are judged alike. `--ttft-slo-ms` and
`--tbt-slo-ms` override either. `docs/simulator.md` lists the resulting table.
"""

from __future__ import annotations

import math

from superinfer.sim.hardware import HardwareProfile
from superinfer.sim.models import ModelProfile
from superinfer.sim.predictor import BatchShape
from superinfer.sim.roofline import RooflinePredictor
from superinfer.slo import SLOTargets

TTFT_FACTOR = 10.0
TBT_FACTOR = 5.0
PROMPT_TOKENS = 1024
DECODE_BATCH = 32
DECODE_CONTEXT = 1024
FIXED_TARGETS = {"cpu": SLOTargets(ttft_ms=2000.0, tbt_ms=250.0)}


LADDER = (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10)


def round_up_nice(ms: float) -> float:
    """The smallest step of `LADDER` x 10^k that is >= `ms`."""
    exponent = 10 ** math.floor(math.log10(ms))
    for step in LADDER:
        if step * exponent >= ms - 1e-9:
            return float(step * exponent)
    return float(10 * exponent)


def unloaded_latencies_ms(model: ModelProfile, hardware: HardwareProfile) -> tuple[float, float]:
    """(prefill of a 1024-token prompt, decode step of 32 x 1024-token contexts), in ms."""
    roofline = RooflinePredictor(model, hardware)
    prefill = BatchShape.of_lists([PROMPT_TOKENS], [0])
    decode = BatchShape.of_lists([1] * DECODE_BATCH, [DECODE_CONTEXT] * DECODE_BATCH)
    return 1000 * roofline.forward_time(prefill), 1000 * roofline.forward_time(decode)


def default_targets(model: ModelProfile, hardware: HardwareProfile) -> SLOTargets:
    if hardware.name in FIXED_TARGETS:
        return FIXED_TARGETS[hardware.name]
    prefill_ms, decode_ms = unloaded_latencies_ms(model, hardware)
    return SLOTargets(
        ttft_ms=round_up_nice(TTFT_FACTOR * prefill_ms),
        tbt_ms=round_up_nice(TBT_FACTOR * decode_ms),
    )


def resolve_targets(
    model: ModelProfile,
    hardware: HardwareProfile,
    ttft_ms: float | None = None,
    tbt_ms: float | None = None,
) -> SLOTargets:
    """The profile's defaults with any explicit target put in their place."""
    default = default_targets(model, hardware)
    return SLOTargets(
        ttft_ms=ttft_ms if ttft_ms is not None else default.ttft_ms,
        tbt_ms=tbt_ms if tbt_ms is not None else default.tbt_ms,
    )
