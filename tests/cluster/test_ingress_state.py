"""The ingress composes the single server's front over its remote replicas (no Ray cluster
needed): readiness follows the live replicas, refusals go to the shared SLO log with
`"replica": null`, and the routes find no engine here."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from superinfer.config import EngineConfig
from superinfer.server.arrival import Arrival
from superinfer.server.config import ServerConfig
from superinfer.server.errors import APIError
from superinfer.server.front import READY, STOPPED, Front, Rejection
from superinfer.slo.classes import SLOConfig

pytest.importorskip("ray")


class StubHandle:
    """The part of a `DeploymentHandle` the ingress touches when it is built."""

    deployment_name = "StubReplica"

    def options(self, **_: object) -> StubHandle:
        return self


def test_the_ingress_composes_the_front_over_its_replicas(tmp_path, monkeypatch):
    from superinfer.cluster import registry
    from superinfer.cluster.ingress import IngressState

    config = ServerConfig(slo_log=str(tmp_path / "slo.jsonl"))
    state = IngressState(config, EngineConfig(), SLOConfig(), "m", StubHandle())
    front = state.front
    assert isinstance(front, Front) and front.slo_log is state.replicas.slo_log
    assert front.metrics is state.replicas.metrics
    front.phase = READY
    assert front.health == (False, "without_replicas")
    monkeypatch.setitem(registry.LIVE, "StubReplica", ("r1",))
    assert front.health == (True, READY)

    front.reject(APIError(425, "late", "slo_infeasible"),
                 Rejection(Arrival(time.monotonic(), time.time()), "r1"))  # fmt: skip
    assert asyncio.run(state.debug_report()) is None
    asyncio.run(state.close())
    assert front.phase == STOPPED
    (line,) = [json.loads(text) for text in (tmp_path / "slo.jsonl").read_text().splitlines()]
    assert (line["id"], line["status"], line["replica"]) == ("r1", 425, None)
