"""proxy.py without a model: the replica set's polls, its orders (slo and power-of-two),
what a refusal carries back, and the requests routed since a report (`RoutedSince`)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from superinfer.cluster.proxy import POWER_OF_TWO, SLO_ROUTING, ReplicaSet, _refusal_of
from superinfer.cluster.router import Demand, ReplicaLoad, RoutedSince
from superinfer.server.arrival import ELAPSED_HEADER, IngressStamp, arrival_of
from superinfer.slo.estimate import EngineLoad, Queued

DEMAND = Demand(num_prompt_tokens=100, max_tokens=20, ttft_s=1.0, tbt_s=0.2)


def load_stats(num_queued_tokens: int, reported_at: float = 0.0) -> dict[str, Any]:
    queued = (Queued(0.0, num_queued_tokens, None),) if num_queued_tokens else ()
    engine = EngineLoad(step_time_s=0.05, prefill_s_per_token=0.001, queued=queued)
    return ReplicaLoad("", engine, num_running=2, reported_at=reported_at).to_stats()


def replica_set(reports: dict[str, tuple[int, dict[str, Any]]], routing: str = SLO_ROUTING):
    """A set over fake servers: host -> (status, body) of its /superinfer/load."""

    def answer(request: httpx.Request) -> httpx.Response:
        status, body = reports[request.url.host]
        return httpx.Response(status, json=body)

    client = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    replicas = ReplicaSet([f"http://{host}" for host in reports], client, routing)
    asyncio.run(_poll_all(replicas))
    return replicas


async def _poll_all(replicas: ReplicaSet) -> None:
    await asyncio.gather(*(replicas.poll(r) for r in replicas.replicas))


def ready(num_queued_tokens: int = 0) -> tuple[int, dict[str, Any]]:
    return 200, {"phase": "ready", "vocab_size": 100, "load": load_stats(num_queued_tokens)}


def test_only_ready_replicas_are_routed_to() -> None:
    replicas = replica_set({"a": ready(), "b": (503, {"phase": "warming_up"}),
                            "c": (200, {"phase": "draining", "load": load_stats(0)})})  # fmt: skip
    assert [r.url for r in replicas.live] == ["http://a"]
    assert replicas.replicas[1].phase == "warming_up"
    assert [r.url for r in replicas.order(DEMAND, set())] == ["http://a"]


def test_slo_routing_prefers_the_replica_with_less_prefill_ahead() -> None:
    replicas = replica_set({"a": ready(900), "b": ready(50)})
    assert [r.url for r in replicas.order(DEMAND, set())] == ["http://b", "http://a"]
    assert [r.url for r in replicas.order(DEMAND, {"replica-1"})] == ["http://a"]


def test_slo_routing_counts_what_it_sent_since_the_last_report() -> None:
    replicas = replica_set({"a": ready(0), "b": ready(200)})
    for i in range(6):  # sent to "a" after its report (reported_at=0): its queue grows
        replicas.routed.add(f"r{i}", "replica-0", DEMAND, now=1.0)
    assert replicas.order(DEMAND, set())[0].url == "http://b"


def test_power_of_two_takes_the_one_with_fewer_open_requests() -> None:
    replicas = replica_set({"a": ready(0), "b": ready(0)}, POWER_OF_TWO)
    for i in range(3):
        replicas.routed.add(f"r{i}", "replica-0", DEMAND, now=1.0)
    firsts = {replicas.order(DEMAND, set())[0].url for _ in range(20)}
    assert firsts == {"http://b"}, "with two replicas both are drawn: the idler wins"
    # it ignores what the requests need: a long queue of prompt tokens does not count
    replicas = replica_set({"a": ready(5000), "b": ready(0)}, POWER_OF_TWO)
    replicas.routed.add("x", "replica-1", DEMAND, now=1.0)
    assert replicas.order(DEMAND, set())[0].url == "http://a"


def test_an_unreachable_replica_leaves_routing_until_it_answers() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    client = httpx.AsyncClient(transport=httpx.MockTransport(refuse))
    replicas = ReplicaSet(["http://a"], client)
    asyncio.run(_poll_all(replicas))
    assert replicas.live == [] and replicas.replicas[0].phase == "unreachable"


def test_unknown_routing_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="power-of-two"):
        ReplicaSet([], httpx.AsyncClient(), "random")


def test_a_refusal_keeps_its_status_code_reason_and_estimate() -> None:
    body = {"error": {"message": "too slow", "code": "slo_infeasible", "estimated_ttft_ms": 812}}
    headers = {"x-superinfer-refusal-reason": "ttft_infeasible", "retry-after": "2",
               "content-type": "application/json"}  # fmt: skip
    response = httpx.Response(425, content=json.dumps(body).encode(), headers=headers)
    refusal = asyncio.run(_refusal_of(response))
    assert (refusal.status, refusal.code, refusal.reason) == (425, "slo_infeasible",
                                                             "ttft_infeasible")  # fmt: skip
    assert refusal.estimated_ttft_ms == 812 and refusal.message == "too slow"
    assert refusal.headers["retry-after"] == "2" and "content-type" not in refusal.headers


def test_a_refusal_without_a_json_body_is_still_a_refusal() -> None:
    refusal = asyncio.run(_refusal_of(httpx.Response(429, content=b"<html>")))
    assert refusal.status == 429 and refusal.code == "refused"


def test_routed_requests_stop_counting_once_done_or_reported() -> None:
    routed = RoutedSince()
    routed.add("r1", "a", DEMAND, now=10.0)
    routed.add("r2", "b", DEMAND, now=10.0)
    assert routed.num_open("a") == 1
    loads = [ReplicaLoad("a", reported_at=11.0), ReplicaLoad("b", reported_at=9.0)]
    assert routed.unreported(loads) == {"b": [DEMAND.as_queued()]}  # "a" reported it
    routed.remove("r2", now=12.0)
    assert routed.unreported(loads) == {} and routed.num_open("b") == 0


@pytest.mark.parametrize(("value", "shift_s"), [("250", 0.25), ("-5", 0.0), ("1e9", 60.0),
                                                ("nan", 0.0), ("junk", 0.0)])  # fmt: skip
def test_the_routers_elapsed_time_moves_the_arrival_earlier_only(value, shift_s) -> None:
    seen = {}

    async def app(scope, receive, send):
        seen["arrival"] = arrival_of(scope)

    stamp = IngressStamp(app, clock=lambda: 100.0)
    scope = {"type": "http", "headers": [(ELAPSED_HEADER.encode(), value.encode())]}
    asyncio.run(stamp(scope, None, None))
    assert seen["arrival"].monotonic == pytest.approx(100.0 - shift_s)


class _DispatchState:
    """The part of `RouterState` `_dispatch` reads: the replica set, its client, a count."""

    def __init__(self, replicas: ReplicaSet) -> None:
        self.replicas, self.client, self.num_inflight = replicas, replicas.client, 0


@pytest.mark.parametrize(("max_attempts", "expected"), [(0, 200), (2, 200), (1, 425)])
def test_a_refused_request_tries_the_next_replica_up_to_its_attempts(max_attempts, expected):
    from types import SimpleNamespace

    from starlette.requests import Request

    from superinfer.cluster.proxy import _dispatch
    from superinfer.server.arrival import Arrival
    from superinfer.server.errors import APIError
    from superinfer.slo.targets import SLOTargets

    posted: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":  # replica "a" reports the shorter queue: tried first
            return httpx.Response(200, json=ready(0 if request.url.host == "a" else 900)[1])
        posted.append(request.url.host)
        if request.url.host == "a":
            return httpx.Response(425, json={"error": {"message": "late", "code": "slo_infeasible"}},
                                  headers={"x-superinfer-refusal-reason": "ttft_infeasible"})  # fmt: skip
        return httpx.Response(200, json={"ok": True})

    client = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    replicas = ReplicaSet(["http://a", "http://b"], client, max_attempts=max_attempts)
    asyncio.run(_poll_all(replicas))
    request = Request({"type": "http", "method": "POST", "path": "/v1/completions",
                       "headers": [], "query_string": b""})  # fmt: skip
    prepared = SimpleNamespace(request_id="r1", num_prompt_tokens=100,
                               prompt_token_ids=list(range(100)),
                               params=SimpleNamespace(prompt_logprobs=None),
                               slo=SimpleNamespace(targets=SLOTargets(1000.0, 200.0)))  # fmt: skip
    arrival = Arrival(0.0, 0.0)

    async def dispatch() -> int:
        try:
            sent = await _dispatch(_DispatchState(replicas), request, b"{}", prepared, arrival, 20)
        except APIError as error:
            assert error.reason == "ttft_infeasible"
            return error.status
        await sent.response.aclose()
        return sent.response.status_code

    assert asyncio.run(dispatch()) == expected
    assert posted == (["a"] if max_attempts == 1 else ["a", "b"])
