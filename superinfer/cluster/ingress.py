"""The OpenAI-compatible ingress in front of the engine replicas (a Ray Serve deployment).

It serves the single-process server's FastAPI app (`server.app.build_app`: same routes,
auth, body and SLO checks, error bodies, arrival stamp) with a generation handler that
runs each request on a replica instead of a local engine:

1. prepare the request here (tokenize, bind the SLO): bad input is a 400 at ingress;
2. send it to the replica the router ranks best by slack on the replicas' own estimates
   (their TTFT estimates, `router.py`); the replica's own
   admission decides; a refusal (425/429) moves it to the next replica, and only when every
   replica refused does the client get one answer (`router.merge_rejections`);
3. pass the replica's SSE events or body through; a client that leaves cancels the call,
   which aborts the request on its replica; a replica that dies mid-request ends it with a
   `replica_failed` error (SSE error event, or 502) and an SLO record written here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import generate_latest
from ray import serve
from ray.exceptions import RayError
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator

from superinfer.cluster.calls import ReplicaCall, Verdict, demand_of
from superinfer.cluster.exposition import merge_expositions
from superinfer.cluster.failure import record_replica_failure
from superinfer.cluster.registry import live_replicas
from superinfer.cluster.router import merge_rejections
from superinfer.config import EngineConfig
from superinfer.server.app import build_app, prepare_request
from superinfer.server.arrival import Arrival, IngressStamp, arrival_of
from superinfer.server.config import ServerConfig
from superinfer.server.errors import APIError, estimate_headers
from superinfer.server.front import DEAD, LOADING, READY, STOPPED, Front, Rejection
from superinfer.server.generation import SSEResponse
from superinfer.server.prepare import PreparedRequest, server_preparer
from superinfer.server.prometheus import ServerMetrics
from superinfer.server.protocol import ChatCompletionRequest
from superinfer.server.responses import DONE, sse
from superinfer.slo.classes import SLOConfig
from superinfer.slo.record_log import SLOLog, TaggedSLOLog

logger = logging.getLogger(__name__)

VERDICT_TIMEOUT_S = 60.0  # routing plus admission; longer only when no replica is up
METRICS_TIMEOUT_S = 5.0


class RemoteReplicas:
    """The engines of the ingress: the replicas behind `handle`. They give the tokenizer
    requests are prepared with, run the requests (`dispatch`), report their metrics, and
    a request whose replica died gets its SLO record (into `slo_log`, `metrics`) here."""

    def __init__(self, handle: DeploymentHandle, slo_log: SLOLog, metrics: ServerMetrics,
                 max_attempts: int = 0) -> None:  # fmt: skip
        self.handle = handle
        self.slo_log = slo_log
        self.metrics = metrics
        self.max_attempts = max_attempts  # refusals before the client gets one (0: no limit)
        # one handle per method, made once: each handle owns its router (and its state)
        self._generate = handle.options(method_name="generate", stream=True)

    async def preparer_parts(self) -> tuple[Any, int, int]:
        """(tokenizer, vocab size, max model length) of one replica (raises if none answers)."""
        return await self.handle.preparer_parts.remote()

    @property
    def live_replicas(self) -> tuple[str, ...]:
        return live_replicas(self.handle.deployment_name)

    def unavailable(self) -> str | None:
        """Why the ingress cannot serve now (for the front's readiness), or None."""
        return None if self.live_replicas else "without_replicas"

    async def metrics_text(self, own: bytes) -> bytes:
        """Every replica's series and the ingress's `own`, each with a `replica` label."""
        broadcast = self.handle.broadcast("metrics_text")
        try:
            results = await broadcast.results_async(
                timeout_s=METRICS_TIMEOUT_S, return_exceptions=True
            )
        except TimeoutError:
            logger.warning("no replica metrics within %.0f s", METRICS_TIMEOUT_S)
            results = []
        parts = [part for part in results if isinstance(part, tuple)]
        return merge_expositions([("ingress", own), *parts])

    async def dispatch(
        self, prepared: PreparedRequest, arrival: Arrival, expected_tokens: int, is_chat: bool
    ) -> tuple[DeploymentResponseGenerator, Verdict]:
        """Start the request on the best replica that admits it (raises APIError)."""
        refusals, exclude = [], set()
        for _ in range(2 * max(1, len(self.live_replicas)) + 1):
            live = set(self.live_replicas)
            if not live or live <= exclude or 0 < self.max_attempts <= len(refusals):
                break
            elapsed_s = time.monotonic() - arrival.monotonic
            demand = demand_of(prepared, expected_tokens, elapsed_s, arrival.wall)
            call = ReplicaCall(prepared, arrival.wall, elapsed_s, expected_tokens, is_chat,
                               demand, frozenset(exclude))  # fmt: skip
            responses = self._generate.remote(call)
            try:
                verdict = await asyncio.wait_for(responses.__anext__(), VERDICT_TIMEOUT_S)
            except (RayError, TimeoutError) as error:  # never admitted: safe to try again
                logger.warning("a replica failed before admitting %s: %r", prepared.request_id,
                               error)  # fmt: skip
                responses.cancel()
                continue
            if verdict.is_admitted:
                return responses, verdict
            refusals.append(verdict.refusal)
            exclude.add(verdict.replica_id)
        if not refusals:
            raise APIError(503, "no replica is available", "not_ready",
                           headers={"Retry-After": "1"}, reason="without_replicas")  # fmt: skip
        merged = merge_rejections(refusals)
        raise APIError(merged.status, merged.message, merged.code, headers=dict(merged.headers),
                       reason=merged.reason, estimated_ttft_ms=merged.estimated_ttft_ms)  # fmt: skip

    def on_replica_failed(
        self, prepared: PreparedRequest, arrival: Arrival, replica_id: str, error: BaseException
    ) -> dict[str, Any]:
        """Record a request whose replica died (its own record died with it); the error body."""
        return record_replica_failure(self.slo_log, self.metrics, prepared, arrival,
                                      replica_id, error)  # fmt: skip


class IngressState:
    """The ingress: the single server's `Front` over `RemoteReplicas`, sharing one SLO log
    (lines tagged `"replica": null`) and the ingress's own metrics (no engine series)."""

    def __init__(
        self,
        server_config: ServerConfig,
        engine_config: EngineConfig,
        slo_config: SLOConfig,
        model_name: str,
        replicas: DeploymentHandle,
        max_attempts: int = 0,
    ) -> None:
        self.config = server_config
        self.engine_config = engine_config
        self.slo_config = slo_config
        self.slo_log = TaggedSLOLog(server_config.slo_log, None)
        self.metrics = ServerMetrics(model_name, None, slo_config.class_names, engine_config)
        self.replicas = RemoteReplicas(replicas, self.slo_log, self.metrics, max_attempts)
        self.front = Front(server_config, model_name, self.slo_log, self.metrics,
                           unavailable=self.replicas.unavailable)  # fmt: skip

    async def boot(self) -> None:
        """Validate against the replicas' tokenizer; ready once one replica answered."""
        try:
            tokenizer, vocab_size, _ = await self.replicas.preparer_parts()  # same max length
        except Exception:
            logger.exception("the ingress could not reach a replica")
            self.front.phase = DEAD
            return
        self.front.preparer = server_preparer(tokenizer, vocab_size, self.config,
                                              self.engine_config, self.slo_config)  # fmt: skip
        if self.front.phase == LOADING:
            self.front.phase = READY

    async def close(self) -> None:
        self.front.phase = STOPPED if self.front.phase != DEAD else DEAD
        self.slo_log.close()

    async def metrics_text(self) -> bytes:
        """Every replica's series and the ingress's own, each with a `replica` label."""
        return await self.replicas.metrics_text(generate_latest(self.metrics.registry))

    async def debug_report(self) -> dict[str, Any] | None:
        return None  # no engine here: tests read the replicas' reports through Ray

    def routing_report(self) -> dict[str, Any] | None:
        return None  # an ingress is not routed to


async def generate_on_replicas(state: IngressState, request: Request, body_type: type) -> Response:
    """The generation handler of the ingress app (see the module docstring)."""
    front, replicas = state.front, state.replicas
    arrival = arrival_of(request.scope)
    rejection = Rejection(arrival, request_id=request.headers.get("x-request-id"))
    is_chat = body_type is ChatCompletionRequest
    try:
        prepared, expected_tokens = await prepare_request(front, request, body_type, rejection)
        responses, verdict = await replicas.dispatch(prepared, arrival, expected_tokens, is_chat)
    except APIError as error:
        front.reject(error, rejection)
        return error.response()
    failed = _FailureReport(replicas, prepared, arrival, verdict.replica_id)
    headers = estimate_headers(verdict.estimated_ttft_ms)
    if prepared.stream:
        return SSEResponse(_relay_events(responses, failed), responses.cancel, headers)
    return await _relay_body(responses, failed, request, headers)


@dataclasses.dataclass
class _FailureReport:
    replicas: RemoteReplicas
    prepared: PreparedRequest
    arrival: Arrival
    replica_id: str

    def __call__(self, error: BaseException) -> dict[str, Any]:
        return self.replicas.on_replica_failed(self.prepared, self.arrival, self.replica_id,
                                               error)  # fmt: skip


async def _relay_events(
    responses: DeploymentResponseGenerator, failed: _FailureReport
) -> AsyncIterator[bytes]:
    try:
        async for event in responses:
            yield event
    except RayError as error:
        yield sse(failed(error))
        yield DONE


async def _relay_body(
    responses: DeploymentResponseGenerator,
    failed: _FailureReport,
    request: Request,
    headers: dict[str, str],
) -> JSONResponse:
    watcher = asyncio.create_task(_cancel_on_disconnect(responses, request))
    try:
        status, body = await responses.__anext__()
    except RayError as error:
        return JSONResponse(failed(error), status_code=502)
    finally:
        watcher.cancel()
    return JSONResponse(body, status_code=status, headers=headers)


async def _cancel_on_disconnect(responses: DeploymentResponseGenerator, request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    responses.cancel()


@serve.ingress()
class ClusterIngress:
    """The ingress deployment: `build_app` with `generate_on_replicas`."""

    def __init__(
        self,
        replicas: DeploymentHandle,
        server_config: ServerConfig,
        engine_config: EngineConfig,
        slo_config: SLOConfig,
        model_name: str,
        routing_attempts: int = 0,
    ) -> None:
        self.state = IngressState(server_config, engine_config, slo_config, model_name, replicas,
                                  routing_attempts)  # fmt: skip

    def __serve_build_asgi_app__(self) -> IngressStamp:
        return build_app(self.state, generate_on_replicas)
