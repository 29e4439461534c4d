"""How a request's targets travel (slo-contract.md): `x-slo-*` headers and the body's `slo`
object. The server reads them (`binding.py`); the benchmark client writes them.

Pure Python, no server imports, so a client can use it without the server's stack.
"""

from __future__ import annotations

from typing import Any

from superinfer.slo.targets import SLOTargets

HEADER_TTFT = "x-slo-ttft-ms"
HEADER_TBT = "x-slo-tbt-ms"
HEADER_MAX_LATENCY = "x-slo-max-latency"
HEADER_DEADLINE = "x-slo-deadline"
HEADER_CLASS = "x-slo-class"

# What llm-d's router and the Gateway API inference extension send (docs/slo.md, "Gateway
# headers"): llm-d/llm-d-router pkg/epp/metadata/consts.go, TTFTSLOHeaderKey and
# TPOTSLOHeaderKey; the older names are its deprecated aliases (OldTTFTSLOHeaderKey is
# superinfer's own HEADER_TTFT), the names the inference extension's EPP read until it moved
# to llm-d. TPOT (time per output token) is judged against the TBT target.
HEADER_GATEWAY_TTFT = "x-llm-d-slo-ttft-ms"
HEADER_GATEWAY_TPOT = "x-llm-d-slo-tpot-ms"
HEADER_GATEWAY_TPOT_OLD = "x-slo-tpot-ms"
TTFT_HEADERS = (HEADER_TTFT, HEADER_GATEWAY_TTFT)
TBT_HEADERS = (HEADER_TBT, HEADER_GATEWAY_TPOT, HEADER_GATEWAY_TPOT_OLD)
# The server's answer: admission's estimate of the first token, in ms from arrival, on
# every admitted response and every refusal that estimated it
HEADER_ESTIMATED_TTFT = "x-superinfer-estimated-ttft-ms"


def slo_headers(targets: SLOTargets) -> dict[str, str]:
    """The `x-slo-*` headers that carry `targets`."""
    headers = {HEADER_TTFT: f"{targets.ttft_ms:g}", HEADER_TBT: f"{targets.tbt_ms:g}"}
    if targets.max_latency_ms is not None:
        headers[HEADER_MAX_LATENCY] = f"{targets.max_latency_ms:g}"
    if targets.slo_class is not None:
        headers[HEADER_CLASS] = targets.slo_class
    return headers


def slo_body(targets: SLOTargets) -> dict[str, Any]:
    """The body's `slo` object that carries `targets`."""
    body: dict[str, Any] = {"ttft_ms": targets.ttft_ms, "tbt_ms": targets.tbt_ms}
    if targets.max_latency_ms is not None:
        body["max_latency_ms"] = targets.max_latency_ms
    if targets.slo_class is not None:
        body["class"] = targets.slo_class
    return body
