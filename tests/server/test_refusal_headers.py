"""Every refusal says why in headers a gateway routes on (llm-d's
`x-llm-d-request-dropped-reason` and superinfer's `x-superinfer-refusal-reason`), and an
estimated refusal reports its estimated TTFT in a header and in the body."""

from __future__ import annotations

import json

import pytest

from superinfer.server.admission import Admission, Demand, Load
from superinfer.server.arrival import Arrival
from superinfer.server.config import ServerConfig
from superinfer.server.errors import APIError, estimate_headers
from superinfer.server.front import DRAINING, WARMING_UP, Front
from superinfer.server.prometheus import ServerMetrics
from superinfer.server.protocol import SLOBody
from superinfer.slo.binding import bind_slo
from superinfer.slo.classes import SLOConfig
from superinfer.slo.estimate import Queued
from superinfer.slo.record_log import SLOLog

LOAD = Load(step_time_s=0.05, prefill_s_per_token=0.002)  # 100 tokens: 0.25 s to the first


def refusal(raiser) -> APIError:
    with pytest.raises(APIError) as info:
        raiser()
    return info.value


def answered(error: APIError) -> tuple[int, dict[str, str], dict]:
    response = error.response()
    return response.status_code, dict(response.headers), json.loads(response.body)


def admit(load=LOAD, max_latency_ms=None, ttft_ms=None, elapsed_s=0.0, max_reqs=4):
    gate = Admission(max_num_queued_reqs=max_reqs, max_num_queued_tokens=10_000)
    demand = Demand(100, 10, None, 1.0, elapsed_s)
    return lambda: gate.check(load, demand, max_latency_ms, True, ttft_ms)


def test_a_deadline_the_estimate_cannot_meet():
    status, headers, body = answered(refusal(admit(max_latency_ms=600, elapsed_s=0.1)))
    assert status == 425
    assert headers["x-superinfer-refusal-reason"] == "deadline_infeasible"
    assert headers["x-llm-d-request-dropped-reason"] == "rejected-slo-infeasible"
    # 0.1 s spent before admission plus 0.25 s to the first token, from arrival
    assert headers["x-superinfer-estimated-ttft-ms"] == "350.0"
    assert body["error"]["estimated_ttft_ms"] == 350.0 and body["error"]["code"] == "slo_infeasible"


def test_a_ttft_target_the_estimate_cannot_meet():
    status, headers, body = answered(refusal(admit(ttft_ms=200)))
    assert (status, headers["x-superinfer-refusal-reason"]) == (425, "ttft_infeasible")
    assert body["error"]["estimated_ttft_ms"] == 250.0


def test_a_tbt_target_the_estimate_cannot_meet():
    gate = Admission(max_num_queued_reqs=4, max_num_queued_tokens=10_000)
    demand = Demand(100, 10, None, 1.0, 0.0, tbt_s=0.04)  # steps of 50 ms
    status, headers, body = answered(refusal(lambda: gate.check(LOAD, demand, None, True, 1000)))
    assert (status, headers["x-superinfer-refusal-reason"]) == (425, "tbt_infeasible")
    assert headers["x-llm-d-request-dropped-reason"] == "rejected-slo-infeasible"
    assert body["error"]["estimated_ttft_ms"] == 250.0


def test_a_deadline_that_passed_before_admission_or_before_arrival():
    late = refusal(admit(max_latency_ms=100, elapsed_s=0.2))
    assert (late.status, late.reason) == (425, "deadline_passed")
    arrival = Arrival(monotonic=5.0, wall=1_700_000_000.0)
    past = str(arrival.wall * 1000 - 10)
    early = refusal(lambda: bind_slo({"x-slo-deadline": past}, None, SLOConfig(), arrival))
    status, headers, body = answered(early)
    assert status == 425 and headers["x-superinfer-refusal-reason"] == "deadline_passed"
    assert headers["x-llm-d-request-dropped-reason"] == "rejected-slo-infeasible"
    assert "x-superinfer-estimated-ttft-ms" not in headers  # nothing was estimated
    assert "estimated_ttft_ms" not in body["error"]


def test_a_full_queue():
    full = Load((Queued(0.0, 10), Queued(0.0, 10)), step_time_s=0.05, prefill_s_per_token=0.002)
    status, headers, body = answered(refusal(admit(full, max_reqs=2)))
    assert status == 429 and "retry-after" in headers
    assert headers["x-superinfer-refusal-reason"] == "queue_full"
    assert headers["x-llm-d-request-dropped-reason"] == "rejected-saturated"
    assert float(headers["x-superinfer-estimated-ttft-ms"]) == body["error"]["estimated_ttft_ms"]


@pytest.mark.parametrize(
    "phase, reason, dropped",
    [(WARMING_UP, "not_ready", "rejected-no-endpoints"),
     (DRAINING, "draining", "rejected-shutting-down")],
)  # fmt: skip
def test_not_ready_and_draining(phase, reason, dropped):
    front = Front(ServerConfig(), "m", SLOLog(None), ServerMetrics("m", None, ()))
    front.phase = phase
    status, headers, _ = answered(refusal(front.check_ready))
    assert status == 503
    assert headers["x-superinfer-refusal-reason"] == reason
    assert headers["x-llm-d-request-dropped-reason"] == dropped


def test_a_bad_slo_is_the_clients_mistake_not_a_drop():
    arrival = Arrival(monotonic=5.0, wall=1_700_000_000.0)
    bad = refusal(lambda: bind_slo({}, SLOBody(ttft_ms=-1), SLOConfig(), arrival))
    status, headers, _ = answered(bad)
    assert (status, headers["x-superinfer-refusal-reason"]) == (400, "invalid_slo")
    assert "x-llm-d-request-dropped-reason" not in headers


def test_an_admitted_request_reports_its_estimate():
    assert estimate_headers(312.04) == {"x-superinfer-estimated-ttft-ms": "312.0"}
    assert estimate_headers(None) == {}
