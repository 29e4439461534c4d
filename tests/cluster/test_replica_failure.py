"""A replica killed mid-run (ray.kill of its actor): its in-flight request ends with a clear
error, new requests go to the survivor, the application keeps answering."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from tests.cluster.conftest import replica_actor_name, replica_reports

pytestmark = pytest.mark.slow


def test_killed_replica_fails_its_requests_and_the_survivor_serves(cluster):
    import ray

    events: list[str] = []
    body = {"prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True, "stream": True,
            "request_id": "doomed"}  # fmt: skip
    first_token = threading.Event()

    def stream() -> None:
        with httpx.stream("POST", cluster.url + "/v1/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line:
                    events.append(line)
                    first_token.set()

    reader = threading.Thread(target=stream)
    reader.start()
    assert first_token.wait(120)
    (busy,) = [r["replica"] for r in replica_reports() if r["num_inflight"] > 0]
    ray.kill(ray.get_actor(replica_actor_name(busy), namespace="serve"), no_restart=True)
    reader.join(60)
    assert not reader.is_alive()

    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2][len("data: ") :])["error"]
    assert error["code"] == "replica_failed" and "retry" in error["message"]
    doomed = [x for x in cluster.log_lines() if x["id"] == "doomed"]
    assert [(x["reason"], x["status"], x["replica"]) for x in doomed] == [
        ("replica_failed", 502, None)
    ]

    served_by = []
    for i in range(3):
        response = cluster.post("/v1/completions", {"prompt": "Hi", "max_tokens": 4,
                                                    "request_id": f"after-{i}"})  # fmt: skip
        assert response.status_code == 200, response.text
        served_by += [x["replica"] for x in cluster.log_lines() if x["id"] == f"after-{i}"]
    assert len(served_by) == 3 and busy not in served_by
    assert httpx.get(cluster.url + "/health", timeout=10).status_code == 200
    time.sleep(0.1)
