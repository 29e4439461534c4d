"""The targets' wire form: `x-slo-*` headers and the body's `slo` object (slo-contract.md)."""

from __future__ import annotations

from superinfer.slo import SLOTargets
from superinfer.slo.wire import slo_body, slo_headers


def test_wire_form():
    targets = SLOTargets(500, 100, 2000, "gold")
    assert slo_headers(targets) == {"x-slo-ttft-ms": "500", "x-slo-tbt-ms": "100",
                                    "x-slo-max-latency": "2000", "x-slo-class": "gold"}  # fmt: skip
    assert slo_body(targets) == {"ttft_ms": 500, "tbt_ms": 100, "max_latency_ms": 2000,
                                 "class": "gold"}  # fmt: skip
    assert slo_headers(SLOTargets(250, 50)) == {"x-slo-ttft-ms": "250", "x-slo-tbt-ms": "50"}
    assert slo_body(SLOTargets(250.5, 50)) == {"ttft_ms": 250.5, "tbt_ms": 50}
