"""The front on its own: auth, readiness (with a back end that can go away), the model
name, and the one SLO record, metric and log line of a refused request."""

from __future__ import annotations

import json
import logging
import time

import pytest
from prometheus_client import generate_latest

from superinfer.server.arrival import Arrival
from superinfer.server.config import ServerConfig
from superinfer.server.errors import APIError
from superinfer.server.front import DEAD, DRAINING, LOADING, READY, STOPPED, Front, Rejection
from superinfer.server.prometheus import ServerMetrics
from superinfer.slo import SLOTargets
from superinfer.slo.record_log import SLOLog


class Backend:
    """What `unavailable` reports: None while it can serve."""

    def __init__(self) -> None:
        self.status: str | None = None

    def __call__(self) -> str | None:
        return self.status


def make_front(tmp_path=None, **config) -> tuple[Front, Backend, list]:
    backend, reports = Backend(), []
    slo_log = SLOLog(tmp_path / "slo.jsonl" if tmp_path else None)
    metrics = ServerMetrics("m", None, ("gold",))
    front = Front(ServerConfig(**config), "m", slo_log, metrics, unavailable=backend,
                  on_report=reports.append)  # fmt: skip
    return front, backend, reports


def raised(check, *args) -> APIError:
    with pytest.raises(APIError) as info:
        check(*args)
    return info.value


def test_auth_takes_the_bearer_key_only():
    front, _, _ = make_front(api_key="k")
    front.check_auth({"authorization": "Bearer k"})
    front.check_auth({"authorization": "bearer  k "})
    for headers in ({}, {"authorization": "Bearer nope"}, {"authorization": "Basic k"}):
        error = raised(front.check_auth, headers)
        assert (error.status, error.code) == (401, "invalid_api_key")
    make_front()[0].check_auth({})  # no key configured: anyone


@pytest.mark.parametrize(
    ("phase", "code", "message"),
    [(LOADING, "not_ready", "the server is loading"),
     ("warming_up", "not_ready", "the server is warming up"),
     (DRAINING, "draining", "the server is draining"),
     (STOPPED, "draining", "the server is stopped"),
     (DEAD, "not_ready", "the server is dead")],
)  # fmt: skip
def test_only_ready_admits(phase, code, message):
    front, _, _ = make_front()
    front.phase = phase
    assert front.health == (False, phase)
    error = raised(front.check_ready)
    assert (error.status, error.code, error.message) == (503, code, message)
    assert error.headers == {"Retry-After": "1"}
    front.phase = READY
    assert front.health == (True, READY)
    front.check_ready()


def test_a_back_end_without_replicas_is_unready_until_one_is_up():
    front, backend, _ = make_front()
    front.phase = READY
    backend.status = "without_replicas"
    assert front.health == (False, "without_replicas")
    assert raised(front.check_ready).message == "the server is without replicas"
    backend.status = None
    assert front.health == (True, READY)


def test_a_dead_engine_kills_the_server_for_good():
    front, backend, _ = make_front()
    front.phase = READY
    backend.status = DEAD
    assert front.health == (False, DEAD)
    backend.status = None
    assert front.phase == DEAD and front.health == (False, DEAD)


def test_model_names():
    front, _, _ = make_front()
    assert front.model_names == ["m"]
    front.check_model(None)
    front.check_model("m")
    assert raised(front.check_model, "other").code == "model_not_found"
    aliased, _, _ = make_front(served_model_name=["a", "b"])
    aliased.check_model("b")
    assert raised(aliased.check_model, "m").status == 404


def test_a_refusal_leaves_one_record_one_metric_and_one_log_line(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="superinfer.server.front")
    front, _, reports = make_front(tmp_path)
    arrival = Arrival(time.monotonic(), time.time())
    rejection = Rejection(arrival, "r1", SLOTargets(ttft_ms=100, slo_class="gold"), 7, 2)
    error = APIError(429, "the queue is full", "queue_full", headers={"Retry-After": "3"})
    front.reject(error, rejection)
    front.slo_log.close()
    (line,) = [json.loads(text) for text in (tmp_path / "slo.jsonl").read_text().splitlines()]
    assert (line["id"], line["class"], line["outcome"]) == ("r1", "gold", "rejected")
    assert (line["status"], line["reason"], line["prompt_tokens"], line["priority"]) == (
        429, "queue_full", 7, 2
    )  # fmt: skip
    assert [r.slo_class for r in reports] == ["gold"]
    exposition = generate_latest(front.metrics.registry).decode()
    assert 'rejections_total{model_name="m",reason="queue_full",slo_class="gold"} 1.0' in exposition
    (record,) = [r for r in caplog.records if "Rejected request" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert record.getMessage() == "Rejected request r1: 429 queue_full: the queue is full"


def test_a_refusal_without_an_id_gets_one(tmp_path):
    front, _, reports = make_front(tmp_path)
    front.reject(APIError(400, "bad", "invalid_json"), Rejection(Arrival(0.0, 0.0)))
    (line,) = [json.loads(text) for text in (tmp_path / "slo.jsonl").read_text().splitlines()]
    assert line["id"].startswith("rejected-") and line["class"] is None
    assert len(reports) == 1 and not reports[0].is_slo_request
