"""A real Ray Serve application on a local Ray (num_cpus=2): the ingress in front of two
engine replicas of the default 135M model, on a free port, driven over HTTP.

Skipped when the `ray` extra is not installed (pip install -e '.[ray]').
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.conftest import SLO_YAML, free_port

BOOT_TIMEOUT_S = 300
APP = "superinfer"


@dataclass
class Cluster:
    url: str
    log_path: Path

    def post(self, path: str, body: dict[str, Any], **kwargs: Any) -> httpx.Response:
        return httpx.post(self.url + path, json=body, timeout=kwargs.pop("timeout", 120), **kwargs)

    def log_lines(self) -> list[dict[str, Any]]:
        text = self.log_path.read_text() if self.log_path.exists() else ""
        assert text == "" or text.endswith("\n"), "the SLO log ends in a partial line"
        return [json.loads(line) for line in text.splitlines()]

    def wait_healthy(self, timeout_s: float = BOOT_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"the application is not healthy after {timeout_s} s")


def replica_actor_name(replica_id: str) -> str:
    return f"SERVE_REPLICA::{APP}#EngineReplica#{replica_id}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    ray = pytest.importorskip("ray")
    from ray import serve

    from superinfer.cluster.app import ClusterConfig, build_application
    from superinfer.config import EngineConfig
    from superinfer.server.config import ServerConfig
    from superinfer.slo.classes import load_slo_config

    tmp = tmp_path_factory.mktemp("cluster")
    (tmp / "slo.yaml").write_text(SLO_YAML)
    port = free_port()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1"}})  # fmt: skip
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        server = ServerConfig(slo_log=str(tmp / "slo.jsonl"), slo_config=str(tmp / "slo.yaml"),
                              max_num_queued_reqs=8)  # fmt: skip
        app = build_application(server, EngineConfig.from_flat(device="cpu"),
                                load_slo_config(server.slo_config), ClusterConfig(replicas=2))  # fmt: skip
        serve.run(app, name=APP, route_prefix="/")
        handle = Cluster(f"http://127.0.0.1:{port}", tmp / "slo.jsonl")
        handle.wait_healthy()
        yield handle
    finally:
        serve.shutdown()
        ray.shutdown()


def replica_reports() -> list[dict[str, Any]]:
    """/debug-style engine reports of every live replica (through Ray, from the test)."""
    from ray import serve

    handle = serve.get_deployment_handle("EngineReplica", app_name=APP)
    return handle.broadcast("debug").results(timeout_s=60)
