"""The load the host's admission estimates from, built from the engine's published snapshot
(a stand-in engine: no model)."""

from __future__ import annotations

import logging
from dataclasses import replace
from types import SimpleNamespace

import pytest

from superinfer.config import EngineConfig
from superinfer.engine.snapshot import EngineSnapshot
from superinfer.server.config import ServerConfig
from superinfer.server.engine_host import EngineHost
from superinfer.server.log_limit import RateLimitedLog
from superinfer.server.prometheus import ServerMetrics
from superinfer.slo.record_log import SLOLog


def host_over(snapshot: EngineSnapshot, tmp_path) -> EngineHost:
    host = EngineHost(ServerConfig(), EngineConfig(), SLOLog(tmp_path / "slo.jsonl"),
                      ServerMetrics("m", None), RateLimitedLog(logging.getLogger(__name__)))  # fmt: skip
    host.engine = SimpleNamespace(snapshot=snapshot, queued=lambda: (),
                                  step_left_s=lambda: 0.0)  # fmt: skip
    host.warmup_prefill_s_per_token = 0.5e-3
    return host


@pytest.mark.parametrize(
    ("per_token_s", "per_pair_s", "expected_per_token_s"),
    [
        (0.0, 0.0, 0.5e-3),  # nothing learned yet: the warm-up's
        (0.3e-3, 0.4e-6, 0.3e-3),  # learned
        (0.0, 0.9e-6, 0.0),  # learned, all on pairs: not the warm-up's on top of it
    ],
)
def test_the_prefill_costs_are_the_engines_once_learned(
    per_token_s: float, per_pair_s: float, expected_per_token_s: float, tmp_path
) -> None:
    snapshot = replace(EngineSnapshot(), prefill_s_per_token=per_token_s,
                       prefill_s_per_pair=per_pair_s)  # fmt: skip
    load = host_over(snapshot, tmp_path).load()
    assert load.prefill_s_per_token == expected_per_token_s
    assert load.prefill_s_per_pair == per_pair_s
