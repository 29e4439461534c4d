"""The SLO contract in one package (slo-contract.md):

- `targets`: a request's latency targets (`SLOTargets`) and the default targets;
- `classes`: SLO classes, their reservations and rejection rule (`--slo-config`);
- `wire`: how targets travel (`x-slo-*` headers, the body's `slo` object);
- `binding`: resolving a request's targets at the server's ingress;
- `metrics`: the SLO definitions as pure functions over raw per-request records;
- `record_log`: the SLO record log, one JSON line per request.

Only the targets are re-exported here (`from superinfer.slo import SLOTargets`); the other
modules are imported by their own path.
"""

from __future__ import annotations

from superinfer.slo.targets import DEFAULT_TBT_MS, DEFAULT_TTFT_MS, SLOTargets

__all__ = ["DEFAULT_TBT_MS", "DEFAULT_TTFT_MS", "SLOTargets"]
