"""Bind a request's SLO at ingress: headers, the body's `slo` object and the classes.

Precedence (slo-contract.md): a class supplies default targets; explicit fields override
them; where a header and the body both give a target, the stricter (smaller) one holds.
`x-slo-deadline` (absolute, Unix epoch ms) is turned into a budget relative to the
arrival stamp and competes with `x-slo-max-latency` / `max_latency_ms` the same way. When
the header and the body name different classes, the header (set by a gateway) holds.
The headers llm-d's router and the Gateway API inference extension send
(`x-llm-d-slo-ttft-ms`, `x-llm-d-slo-tpot-ms`, and the older `x-slo-tpot-ms`; `x-slo-ttft-ms`
is both superinfer's and their older name) are targets like superinfer's own: when several
give one, the stricter holds.

The one module of `superinfer.slo` that imports the server: it reads the server's parsed
body (`SLOBody`) and arrival stamp, and its refusals are the server's HTTP answers
(`APIError`: 400 for bad values, 425 for a past deadline). Nothing in `superinfer.server`
that it imports imports `superinfer.slo`, and `superinfer.slo` itself does not import it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from superinfer.server.arrival import Arrival
from superinfer.server.errors import APIError, bad_request
from superinfer.server.protocol import SLOBody
from superinfer.slo.classes import SLOClass, SLOConfig
from superinfer.slo.targets import SLOTargets
from superinfer.slo.wire import (
    HEADER_CLASS,
    HEADER_DEADLINE,
    HEADER_MAX_LATENCY,
    TBT_HEADERS,
    TTFT_HEADERS,
)


@dataclass(frozen=True)
class BoundSLO:
    """A request's resolved targets and the class they came from."""

    targets: SLOTargets  # slo_class set when the request has a class
    slo_class: SLOClass | None
    is_ttft_given: bool = False  # the request set a TTFT target (header or body)
    is_tbt_given: bool = False  # the request set a TBT target (header or body)

    @property
    def is_reject_infeasible(self) -> bool:
        return self.slo_class is None or self.slo_class.reject_infeasible

    @property
    def binding_ttft_ms(self) -> float | None:
        """The TTFT target admission holds the request to: one it gave or its class's.
        None for requests on the server's default targets, which are served best effort
        (a plain OpenAI client never gets a 425 for a target it did not ask for)."""
        if self.slo_class is None and not self.is_ttft_given:
            return None
        return self.targets.ttft_ms

    @property
    def binding_tbt_ms(self) -> float | None:
        """The TBT target admission holds the request to, on the same rule as the TTFT's."""
        if self.slo_class is None and not self.is_tbt_given:
            return None
        return self.targets.tbt_ms


def bind_slo(
    headers: Mapping[str, str], body: SLOBody | None, config: SLOConfig, arrival: Arrival
) -> BoundSLO:
    """Resolve the targets; raises APIError 400 for bad values, 425 for a past deadline."""
    body = body or SLOBody()
    slo_class = _resolve_class(headers.get(HEADER_CLASS), body.slo_class, config)
    base = slo_class.targets() if slo_class else config.default_targets
    ttft = _stricter(
        *(_header_ms(headers, name) for name in TTFT_HEADERS), _body_ms(body.ttft_ms, "slo.ttft_ms")
    )
    tbt = _stricter(
        *(_header_ms(headers, name) for name in TBT_HEADERS), _body_ms(body.tbt_ms, "slo.tbt_ms")
    )
    max_latency = _stricter(
        _header_ms(headers, HEADER_MAX_LATENCY),
        _body_ms(body.max_latency_ms, "slo.max_latency_ms"),
        _deadline_budget_ms(headers, arrival),
    )
    targets = SLOTargets(
        ttft_ms=base.ttft_ms if ttft is None else ttft,
        tbt_ms=base.tbt_ms if tbt is None else tbt,
        max_latency_ms=base.max_latency_ms if max_latency is None else max_latency,
        slo_class=slo_class.name if slo_class else None,
    )
    return BoundSLO(
        targets, slo_class, is_ttft_given=ttft is not None, is_tbt_given=tbt is not None
    )


def _resolve_class(header: str | None, body: str | None, config: SLOConfig) -> SLOClass | None:
    if header is not None:
        name, param = header.strip(), HEADER_CLASS
    elif body is not None:
        name, param = body, "slo.class"
    elif config.default_class is not None:
        return config.get(config.default_class)
    else:
        return None
    slo_class = config.get(name)
    if slo_class is None:
        known = ", ".join(config.class_names) or "none configured"
        raise bad_request(
            f"unknown SLO class {name[:64]!r} (classes: {known})", "unknown_slo_class", param
        )
    return slo_class


def _stricter(*values: float | None) -> float | None:
    given = [v for v in values if v is not None]
    return min(given) if given else None


def _header_ms(headers: Mapping[str, str], name: str) -> float | None:
    raw = headers.get(name)
    if raw is None:
        return None
    try:
        value = float(raw.strip())
    except ValueError:
        raise bad_request(
            f"header {name} must be a number of milliseconds", "invalid_slo", name
        ) from None
    return _positive(value, name)


def _body_ms(value: float | None, param: str) -> float | None:
    return None if value is None else _positive(value, param)


def _positive(value: float, param: str) -> float:
    if not math.isfinite(value) or value <= 0:
        raise bad_request(
            f"{param} must be a positive, finite number of milliseconds", "invalid_slo", param
        )
    return value


def _deadline_budget_ms(headers: Mapping[str, str], arrival: Arrival) -> float | None:
    """`x-slo-deadline` (Unix epoch ms) as milliseconds left after the arrival stamp."""
    deadline_ms = _header_ms(headers, HEADER_DEADLINE)
    if deadline_ms is None:
        return None
    budget_ms = deadline_ms - arrival.wall * 1000.0
    if budget_ms <= 0:
        raise APIError(
            425, f"the deadline passed {-budget_ms:.0f} ms before the request arrived",
            "slo_infeasible", HEADER_DEADLINE, reason="deadline_passed",
        )  # fmt: skip
    return budget_ms
