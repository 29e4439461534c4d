"""superinfer's own router: one HTTP hop in front of N single-process servers.

`superinfer serve --replicas N` (local.py) starts N servers on loopback ports and serves
this router on the public one. It is the single server's FastAPI app (`build_app`: same
routes, auth, body and SLO checks, error bodies, arrival stamp) whose generation handler
forwards the request, body untouched, to a replica:

1. prepare the request here (tokenize, bind the SLO): bad input is a 400 at the router,
   and the router knows the request's prompt size, class and targets;
2. order the replicas: `slo` by this request's slack on each replica's own TTFT estimate
   (`router.rank_replicas` over the loads the replicas report at `GET /superinfer/load`,
   polled every `--routing-stats-period-s`, plus the requests sent since each report), or
   `power-of-two`, Ray Serve's default: the less busy of two replicas drawn at random;
3. send it to the first; a replica that refuses (425, 429) or cannot serve (503, no
   connection) moves it to the next, and only when every replica refused (or
   `--routing-attempts` did) does the client get one answer (`router.merge_rejections`),
   recorded here once;
4. pass the replica's status, headers and bytes (SSE events or body) through. A client
   that leaves closes the connection to the replica, which aborts the request there; a
   replica that dies mid-request ends it with a `replica_failed` error (SSE event, or
   502) and an SLO record written here.

The time a request spent here crosses to the replica in `x-superinfer-elapsed-ms`, so its
TTFT clock starts at the router's arrival stamp.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi import Request
from fastapi.responses import Response
from prometheus_client import generate_latest

from superinfer.cluster.calls import demand_of
from superinfer.cluster.exposition import merge_expositions
from superinfer.cluster.failure import record_replica_failure
from superinfer.cluster.router import (
    Refusal,
    ReplicaLoad,
    RoutedSince,
    merge_rejections,
    rank_replicas,
)
from superinfer.config import EngineConfig
from superinfer.server.app import ROUTER_RETRIES, prepare_request, read_body
from superinfer.server.arrival import ELAPSED_HEADER, Arrival, arrival_of
from superinfer.server.config import ServerConfig
from superinfer.server.errors import APIError
from superinfer.server.front import DEAD, DRAINING, LOADING, READY, STOPPED, Front, Rejection
from superinfer.server.generation import SSEResponse
from superinfer.server.prepare import PreparedRequest, server_preparer
from superinfer.server.prometheus import ServerMetrics
from superinfer.server.responses import DONE, sse
from superinfer.slo.classes import SLOConfig
from superinfer.slo.record_log import TaggedSLOLog

logger = logging.getLogger(__name__)
logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per poll and per request

SLO_ROUTING, POWER_OF_TWO = "slo", "power-of-two"
ROUTINGS = (SLO_ROUTING, POWER_OF_TWO)
POLL_TIMEOUT_S = 2.0
METRICS_TIMEOUT_S = 5.0
# hop-by-hop headers, and those the router sets itself, are not passed through
_NOT_FORWARDED = frozenset({"host", "content-length", "transfer-encoding", "connection",
                            "keep-alive", "expect", "upgrade", "te", ELAPSED_HEADER})  # fmt: skip
_NOT_RELAYED = frozenset({"content-length", "transfer-encoding", "connection", "keep-alive",
                          "date", "server", "content-type", "cache-control"})  # fmt: skip


@dataclass
class Replica:
    """One server behind the router, as its last poll saw it."""

    replica_id: str
    url: str
    load: ReplicaLoad | None = None  # None: not ready or unreachable at the last poll
    phase: str = LOADING
    vocab_size: int | None = None


class ReplicaSet:
    """The replica servers, their reported loads (polled) and the order a request tries
    them in. The choice itself is `order`; everything else is bookkeeping."""

    def __init__(
        self,
        urls: Sequence[str],
        client: httpx.AsyncClient,
        routing: str = SLO_ROUTING,
        period_s: float = 0.1,
        seed: int = 0,
        max_attempts: int = 0,
    ) -> None:
        if routing not in ROUTINGS:
            raise ValueError(f"unknown routing {routing!r}; choose one of {ROUTINGS}")
        self.replicas = [Replica(f"replica-{i}", url.rstrip("/")) for i, url in enumerate(urls)]
        self.client = client
        self.routing = routing
        self.period_s = period_s
        self.max_attempts = max_attempts  # refusals before the client gets one (0: no limit)
        self.routed = RoutedSince()
        self._random = random.Random(seed)

    @property
    def live(self) -> list[Replica]:
        return [replica for replica in self.replicas if replica.load is not None]

    async def poll_forever(self) -> None:
        while True:
            await asyncio.gather(*(self.poll(replica) for replica in self.replicas))
            await asyncio.sleep(self.period_s)

    async def poll(self, replica: Replica) -> None:
        """Read `replica`'s report; it is out of routing until the next good one."""
        try:
            response = await self.client.get(replica.url + "/superinfer/load",
                                             timeout=POLL_TIMEOUT_S)  # fmt: skip
            body = response.json()
        except (httpx.HTTPError, ValueError):
            replica.load, replica.phase = None, "unreachable"
            return
        replica.phase = body.get("phase", "unknown")
        if response.status_code != 200 or replica.phase != READY:
            replica.load = None
            return
        replica.load = ReplicaLoad.from_stats(replica.replica_id, body["load"])
        replica.vocab_size = body["vocab_size"]

    def order(self, demand: Any, exclude: set[str], num_refused: int = 0) -> list[Replica]:
        """The live replicas not in `exclude`, in the order the request tries them; none
        once `num_refused` refusals used up its attempts."""
        if 0 < self.max_attempts <= num_refused:
            return []
        live = [r for r in self.live if r.replica_id not in exclude]
        if self.routing == POWER_OF_TWO:
            drawn = self._random.sample(live, min(2, len(live)))
            drawn.sort(key=lambda r: self.routed.num_open(r.replica_id))
            return drawn + [r for r in live if r not in drawn]
        loads = [r.load for r in live if r.load is not None]
        by_id = {r.replica_id: r for r in live}
        order = rank_replicas(loads, demand, self.routed.unreported(loads), self.routed.prefixes)
        return [by_id[i] for i in order]

    def mark_down(self, replica: Replica) -> None:
        """Out of routing until its next poll answers (it refused a connection)."""
        replica.load, replica.phase = None, "unreachable"


class RouterState:
    """The router's `AppState`: a `Front` over the `ReplicaSet`, its own SLO log (lines
    tagged `"replica": null`: the refusals of every replica, replica failures) and its
    own metrics (no engine series). It is ready once every replica is, or has died
    (`is_replica_alive(index)`); `on_drain` runs once a drain starts (local.py stops the
    replicas there, which drain their own requests)."""

    def __init__(
        self,
        server_config: ServerConfig,
        engine_config: EngineConfig,
        slo_config: SLOConfig,
        model_name: str,
        urls: Sequence[str],
        routing: str = SLO_ROUTING,
        period_s: float = 0.1,
        max_attempts: int = 0,
        load_tokenizer: Callable[[], Any] | None = None,
        on_drain: Callable[[], None] = lambda: None,
        is_replica_alive: Callable[[int], bool] = lambda index: True,
    ) -> None:
        self.config = server_config
        self.engine_config = engine_config
        self.slo_config = slo_config
        self.slo_log = TaggedSLOLog(server_config.slo_log, None)
        self.metrics = ServerMetrics(model_name, None, slo_config.class_names, engine_config)
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=5.0), limits=limits)
        self.replicas = ReplicaSet(urls, self.client, routing, period_s, max_attempts=max_attempts)
        self.front = Front(server_config, model_name, self.slo_log, self.metrics,
                           unavailable=self._unavailable)  # fmt: skip
        self._load_tokenizer = load_tokenizer or self._model_tokenizer
        self._on_drain = on_drain
        self._is_replica_alive = is_replica_alive
        self._poller: asyncio.Task[None] | None = None
        self.num_inflight = 0
        self.on_fatal: Callable[[], None] = lambda: None  # DrainingServer's hook
        self.exit_code = 0

    def _unavailable(self) -> str | None:
        return None if self.replicas.live else "without_replicas"

    def _model_tokenizer(self) -> Any:
        from superinfer.model.loader import default_model_path, resolve_model
        from superinfer.model.tokenizer import load_tokenizer

        return load_tokenizer(resolve_model(self.engine_config.model.model or default_model_path()))

    async def boot(self) -> None:
        """Poll the replicas; ready once the tokenizer is loaded and one replica is."""
        self._poller = asyncio.create_task(self.replicas.poll_forever())
        try:
            tokenizer = await asyncio.to_thread(self._load_tokenizer)
        except Exception:
            logger.exception("the router could not load the tokenizer")
            self.front.phase, self.exit_code = DEAD, 1
            self.on_fatal()
            return
        while not self._is_booted():
            await asyncio.sleep(0.1)
        if not self.replicas.live:
            logger.error("no replica started")
            self.front.phase, self.exit_code = DEAD, 1
            self.on_fatal()
            return
        vocab_size = self.replicas.live[0].vocab_size
        self.front.preparer = server_preparer(tokenizer, vocab_size, self.config,
                                              self.engine_config, self.slo_config)  # fmt: skip
        if self.front.phase == LOADING:
            self.front.phase = READY
            logger.info("Router ready on http://%s:%d: %d of %d replicas ready, %s routing",
                        self.config.host, self.config.port, len(self.replicas.live),
                        len(self.replicas.replicas), self.replicas.routing)  # fmt: skip

    def _is_booted(self) -> bool:
        """Every replica is ready, or its process is gone."""
        return all(replica.load is not None or not self._is_replica_alive(i)
                   for i, replica in enumerate(self.replicas.replicas))  # fmt: skip

    async def drain(self, timeout_s: float) -> None:
        """Stop admitting here, stop the replicas (they drain theirs), wait for in-flight."""
        if self.front.phase != DEAD:
            self.front.phase = DRAINING
        self._on_drain()
        deadline = time.monotonic() + timeout_s + 1.0
        while self.num_inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
        self.front.phase = STOPPED if self.front.phase != DEAD else DEAD
        await self.client.aclose()
        self.slo_log.close()

    async def metrics_text(self) -> bytes:
        """Every replica's series and the router's own, each with a `replica` label."""
        own = generate_latest(self.metrics.registry)
        texts = await asyncio.gather(*(self._replica_text(r, "/metrics")
                                       for r in self.replicas.replicas))  # fmt: skip
        parts = [(r.replica_id, t) for r, t in zip(self.replicas.replicas, texts) if t]
        return merge_expositions([("router", own), *parts])

    async def _replica_text(self, replica: Replica, path: str) -> bytes | None:
        try:
            response = await self.client.get(replica.url + path, timeout=METRICS_TIMEOUT_S)
        except httpx.HTTPError:
            return None
        return response.content if response.status_code == 200 else None

    async def debug_report(self) -> dict[str, Any] | None:
        """The replicas' /debug/engine reports (served when they serve debug routes)."""
        texts = await asyncio.gather(*(self._replica_text(r, "/debug/engine")
                                       for r in self.replicas.replicas))  # fmt: skip
        return {"replicas": [json.loads(t) for t in texts if t]}

    def routing_report(self) -> dict[str, Any] | None:
        return None  # a router is not routed to


# --- the generation handler -----------------------------------------------------------------
@dataclass
class _Sent:
    """A request on its way through the router: what a relay needs to finish it."""

    state: RouterState
    prepared: PreparedRequest
    arrival: Arrival
    replica: Replica
    response: httpx.Response
    is_closed: bool = False

    def failed(self, error: BaseException) -> dict[str, Any]:
        state = self.state
        return record_replica_failure(state.slo_log, state.metrics, self.prepared, self.arrival,
                                      self.replica.replica_id, error)  # fmt: skip

    async def close(self) -> None:
        if not self.is_closed:
            self.is_closed = True
            await self.response.aclose()
            self.state.replicas.routed.remove(self.prepared.request_id, time.time())
            self.state.num_inflight -= 1


async def generate_via_router(state: RouterState, request: Request, body_type: type) -> Response:
    """The router's generation handler (see the module docstring)."""
    front = state.front
    arrival = arrival_of(request.scope)
    rejection = Rejection(arrival, request_id=request.headers.get("x-request-id"))
    try:
        raw = await read_body(request)
        prepared, expected_tokens = await prepare_request(
            front, request, body_type, rejection, raw, is_compiling_structured=False
        )
        sent = await _dispatch(state, request, raw, prepared, arrival, expected_tokens)
    except APIError as error:
        front.reject(error, rejection)
        return error.response()
    response = sent.response
    headers = {k: v for k, v in response.headers.items() if k.lower() not in _NOT_RELAYED}
    is_events = response.headers.get("content-type", "").startswith("text/event-stream")
    if prepared.stream and is_events:
        on_close = lambda: asyncio.ensure_future(sent.close())
        return SSEResponse(_relay_events(sent), on_close, headers)
    return await _relay_body(sent, request, headers)


async def _dispatch(
    state: RouterState,
    request: Request,
    raw: bytes,
    prepared: PreparedRequest,
    arrival: Arrival,
    expected_tokens: int,
) -> _Sent:
    """Send the request to the first replica in its order that takes it (raises APIError)."""
    replicas = state.replicas
    refusals: list[Refusal] = []
    exclude: set[str] = set()
    forwarded = {k: v for k, v in request.headers.items() if k.lower() not in _NOT_FORWARDED}
    forwarded["x-request-id"] = prepared.request_id
    while True:
        elapsed_s = time.monotonic() - arrival.monotonic
        demand = demand_of(prepared, expected_tokens, elapsed_s, arrival.wall)
        order = replicas.order(demand, exclude, len(refusals))
        if not order:
            break
        replica = order[0]
        exclude.add(replica.replica_id)
        forwarded[ELAPSED_HEADER] = f"{1000 * (time.monotonic() - arrival.monotonic):.3f}"
        upstream = state.client.build_request("POST", replica.url + request.url.path,
                                              content=raw, headers=forwarded)  # fmt: skip
        replicas.routed.add(prepared.request_id, replica.replica_id, demand, time.time(),
                            replica.load)  # fmt: skip
        try:
            response = await state.client.send(upstream, stream=True)
        except httpx.HTTPError as error:  # never admitted: safe to try the next one
            replicas.routed.remove(prepared.request_id, time.time(), is_refused=True)
            logger.warning("replica %s unreachable for %s: %r", replica.replica_id,
                           prepared.request_id, error)  # fmt: skip
            replicas.mark_down(replica)
            continue
        if response.status_code not in ROUTER_RETRIES:
            state.num_inflight += 1
            return _Sent(state, prepared, arrival, replica, response)
        replicas.routed.remove(prepared.request_id, time.time(), is_refused=True)
        refusal = await _refusal_of(response)
        if response.status_code != 503:  # a draining replica refused nothing
            refusals.append(refusal)
    if not refusals:
        raise APIError(503, "no replica is available", "not_ready",
                       headers={"Retry-After": "1"}, reason="without_replicas")  # fmt: skip
    merged = merge_rejections(refusals)
    raise APIError(merged.status, merged.message, merged.code, headers=dict(merged.headers),
                   reason=merged.reason, estimated_ttft_ms=merged.estimated_ttft_ms)  # fmt: skip


async def _refusal_of(response: httpx.Response) -> Refusal:
    """A replica's refusal (its error body and headers) as the router merges it."""
    try:
        body = (await response.aread()).decode()
        error = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError, httpx.HTTPError):
        error = {}
    finally:
        await response.aclose()
    headers = {k: v for k, v in response.headers.items()
               if k.lower() == "retry-after" or k.lower().startswith("x-")}  # fmt: skip
    return Refusal(
        response.status_code, str(error.get("message", "refused")),
        str(error.get("code", "refused")), headers,
        response.headers.get("x-superinfer-refusal-reason"), error.get("estimated_ttft_ms"),
    )  # fmt: skip


async def _relay_events(sent: _Sent) -> AsyncIterator[bytes]:
    try:
        async for chunk in sent.response.aiter_raw():
            yield chunk
    except httpx.HTTPError as error:
        yield sse(sent.failed(error))
        yield DONE
    finally:
        await sent.close()


async def _relay_body(sent: _Sent, request: Request, headers: dict[str, str]) -> Response:
    watcher = asyncio.create_task(_close_on_disconnect(sent, request))
    media_type = sent.response.headers.get("content-type")
    try:
        body = await sent.response.aread()
        return Response(body, sent.response.status_code, headers, media_type)
    except httpx.HTTPError as error:
        if sent.is_closed:  # the client left and the watcher closed it
            return Response(status_code=499)
        return Response(json.dumps(sent.failed(error)), 502,
                        media_type="application/json")  # fmt: skip
    finally:
        watcher.cancel()
        await sent.close()


async def _close_on_disconnect(sent: _Sent, request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    await sent.close()
