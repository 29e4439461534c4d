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

from superinfer.slo.classes import SLOConfig, class_sequence
from superinfer.slo.classes import parse_class_mix as parse_class_mix  # bench's name too
from superinfer.slo.targets import SLOTargets

SLO_TRANSPORTS = ("both", "headers", "body", "none")


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
