"""The SLO of each benchmark request: targets from flags or a class mix, and how they travel.

A class mix (`gold=0.2,silver=0.5,bronze=0.3`) gives each class exactly its share of the
requests (largest remainder), in a seeded random order. A class's targets come from the SLO
configuration (the same file as `superinfer serve --slo-config`, or the built-in classes);
explicit `ttft_ms` / `tbt_ms` / `max_latency_ms` override them, as at the server.

Every request carries its targets explicitly, as `x-slo-*` headers and as the body's `slo`
object (`--slo-transport`; the wire form is `superinfer.slo.wire`), so the client judges
attainment against exactly the targets the server was given, whatever its class
configuration.
"""

from __future__ import annotations

import math
import random

from superinfer.slo.classes import SLOConfig
from superinfer.slo.targets import SLOTargets

SLO_TRANSPORTS = ("both", "headers", "body", "none")


def parse_class_mix(text: str) -> dict[str, float]:
    """`gold=0.2,silver=0.5,bronze=0.3` -> shares that add up to 1 (weights are normalized)."""
    mix: dict[str, float] = {}
    for part in text.split(","):
        name, sep, share = part.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ValueError(f"class mix entries look like name=share, got {part!r}")
        value = float(share)
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"class share must be a finite number >= 0, got {share!r}")
        if name in mix:
            raise ValueError(f"class {name!r} appears twice in the mix")
        mix[name] = value
    total = sum(mix.values())
    if not total > 0:
        raise ValueError("the class shares add up to 0")
    return {name: value / total for name, value in mix.items()}


def class_sequence(num_requests: int, mix: dict[str, float], seed: int = 0) -> list[str]:
    """Class names for `num_requests` requests: each class its share (largest remainder),
    shuffled with `seed`."""
    exact = {name: share * num_requests for name, share in mix.items()}
    counts = {name: math.floor(value) for name, value in exact.items()}
    by_remainder = sorted(mix, key=lambda name: exact[name] - counts[name], reverse=True)
    for name in by_remainder[: num_requests - sum(counts.values())]:
        counts[name] += 1
    names = [name for name in mix for _ in range(counts[name])]
    random.Random(seed).shuffle(names)
    return names


def request_targets(
    num_requests: int,
    mix: dict[str, float] | None,
    config: SLOConfig,
    ttft_ms: float | None = None,
    tbt_ms: float | None = None,
    max_latency_ms: float | None = None,
    seed: int = 0,
) -> list[SLOTargets]:
    """Targets of every request: its class's (or the configured default targets without a
    mix), with the explicit values overriding."""
    if mix is None:
        base = [config.default_targets] * num_requests
    else:
        unknown = [name for name in mix if config.get(name) is None]
        if unknown:
            raise ValueError(f"unknown SLO classes {unknown}; configured: {config.class_names}")
        base = [config.get(name).targets() for name in class_sequence(num_requests, mix, seed)]
    return [
        SLOTargets(
            ttft_ms=t.ttft_ms if ttft_ms is None else ttft_ms,
            tbt_ms=t.tbt_ms if tbt_ms is None else tbt_ms,
            max_latency_ms=t.max_latency_ms if max_latency_ms is None else max_latency_ms,
            slo_class=t.slo_class,
        )
        for t in base
    ]
