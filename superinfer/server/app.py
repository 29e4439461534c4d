"""The FastAPI app: OpenAI-compatible routes, vLLM's /tokenize, /detokenize and /version,
/health, /metrics, /superinfer/load (the load a router ranks this server by), and (for
tests only) /debug/engine. Wrapped in `IngressStamp`, so every
request's arrival is stamped before its body is read.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Protocol, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from superinfer.config import EngineConfig
from superinfer.server.arrival import IngressStamp, arrival_of
from superinfer.server.errors import APIError, bad_request, error_body
from superinfer.server.front import Front, Rejection
from superinfer.server.generation import (
    Choice,
    SSEResponse,
    abort_all,
    admit_choices,
    collect_response,
    response_headers,
    stream_choices,
)
from superinfer.server.prepare import PreparedRequest, error_for_validation
from superinfer.server.protocol import ChatCompletionRequest, CompletionRequest
from superinfer.server.state import ServerState
from superinfer.server.tokenize import add_tokenizer_routes

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 16 << 20
ROUTER_RETRIES = frozenset({425, 429, 503})  # refusals a router moves to another replica


class AppState(Protocol):
    """What the routes read of a server: its `Front` and its lifecycle. `ServerState` (one
    process, server/state.py), superinfer's router's `RouterState` (cluster/proxy.py) and the
    Ray Serve ingress's `IngressState` provide it."""

    @property
    def front(self) -> Front: ...

    @property
    def engine_config(self) -> EngineConfig: ...

    async def boot(self) -> None: ...

    async def close(self) -> None: ...

    async def metrics_text(self) -> bytes: ...

    async def debug_report(self) -> dict[str, Any] | None:
        """/debug/engine's report; None without an engine in this process."""
        ...

    def routing_report(self) -> dict[str, Any] | None:
        """`GET /superinfer/load`'s body (what a router ranks this server by); None where
        this process has no engine or is not ready."""
        ...


S = TypeVar("S", bound=AppState)
GenerateHandler = Callable[[S, Request, type], Awaitable[Response]]


def build_app(state: S, generate: GenerateHandler[S]) -> IngressStamp:
    """The ASGI app serving `state`; `generate` answers the two generation routes
    (`generate_here` on this process's engine; the routers run them on replicas)."""
    front = state.front

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        boot = asyncio.create_task(state.boot())
        yield
        boot.cancel()
        await state.close()

    app = FastAPI(title="superinfer", lifespan=lifespan, docs_url=None, redoc_url=None)
    _add_error_handlers(app, front)
    _add_info_routes(app, state)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await generate(state, request, CompletionRequest)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await generate(state, request, ChatCompletionRequest)

    if front.config.enable_debug_routes:

        @app.get("/debug/engine")
        async def debug_engine() -> JSONResponse:
            report = await state.debug_report()
            if report is None:
                return JSONResponse({"phase": front.phase}, status_code=503)
            return JSONResponse({"phase": front.phase, **report})

    return IngressStamp(app)


def _add_info_routes(app: FastAPI, state: AppState) -> None:
    front = state.front
    add_tokenizer_routes(app, front, _read_json)

    @app.get("/health")
    async def health() -> JSONResponse:
        is_ready, phase = front.health
        return JSONResponse(
            {"status": "ok" if is_ready else phase}, status_code=200 if is_ready else 503
        )

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        try:
            front.check_auth(request.headers)
        except APIError as error:
            front.log_refusal(error, request.headers.get("x-request-id"))
            return error.response()
        max_model_len = state.engine_config.scheduler.max_model_len
        cards = [
            {"id": name, "object": "model", "created": 0, "owned_by": "superinfer",
             "root": front.model_name, "max_model_len": max_model_len}
            for name in front.model_names
        ]  # fmt: skip
        return JSONResponse({"object": "list", "data": cards})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(await state.metrics_text(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/superinfer/load")
    async def load() -> JSONResponse:
        report = state.routing_report()
        if report is None:
            return JSONResponse({"phase": front.health[1]}, status_code=503)
        return JSONResponse({"phase": front.health[1], **report})


def _add_error_handlers(app: FastAPI, front: Front) -> None:
    """OpenAI-style bodies for the errors raised outside the routes, each logged once."""

    @app.exception_handler(RequestValidationError)
    async def on_validation(request: Request, error: RequestValidationError) -> JSONResponse:
        api_error = error_for_validation(error)
        front.log_refusal(api_error, request.headers.get("x-request-id"))
        return api_error.response()

    @app.exception_handler(StarletteHTTPException)
    async def on_http(request: Request, error: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(error.status_code, "http_error")
        message = f"{error.detail} ({request.method} {request.url.path})"
        front.log_refusal(APIError(error.status_code, message, code), None)
        body = error_body(error.status_code, str(error.detail), code)
        return JSONResponse(body, status_code=error.status_code, headers=error.headers)

    @app.exception_handler(Exception)
    async def on_error(request: Request, error: Exception) -> JSONResponse:
        front.error_log.log(logging.ERROR, "internal_error", "500 internal_error in %s %s",
                            request.method, request.url.path, exc_info=error)  # fmt: skip
        return JSONResponse(
            error_body(500, "internal server error", "internal_error"), status_code=500
        )


async def generate_here(state: ServerState, request: Request, body_type: type) -> Response:
    """Check, admit and run one completion or chat completion request on this process's
    engine."""
    front = state.front
    arrival = arrival_of(request.scope)
    rejection = Rejection(arrival, request_id=request.headers.get("x-request-id"))
    is_chat = body_type is ChatCompletionRequest
    try:
        prepared, expected_tokens = await prepare_request(front, request, body_type, rejection)
        choices = admit_choices(state.host, prepared, arrival, expected_tokens)
    except APIError as error:
        if state.config.replica_id is None or error.status not in ROUTER_RETRIES:
            front.reject(error, rejection)
        else:  # the router tries another replica, and records the request once
            front.log_refusal(error, rejection.request_id)
        return error.response()
    if prepared.stream:
        events = stream_choices(state, choices, prepared, is_chat)
        on_close = _aborter(state, choices)
        return SSEResponse(events, on_close, response_headers(choices))
    return await collect_response(state, choices, prepared, is_chat, request)


def _aborter(state: ServerState, choices: list[Choice]) -> Callable[[], None]:
    """What a stream calls when it ends: abort what is still running (its client left)."""
    return lambda: abort_all(state, choices, "client_disconnected")


async def prepare_request(
    front: Front,
    request: Request,
    body_type: type,
    rejection: Rejection,
    raw_body: bytes | None = None,
    is_compiling_structured: bool = True,
) -> tuple[PreparedRequest, int]:
    """Auth, readiness, body, model and SLO checks (raise APIError); returns the prepared
    request and the output tokens the deadline estimate assumes. Fills `rejection` with
    what is known, for the record of a request rejected later. `raw_body`: the body, when
    the caller read it (`read_body`); a router leaves the grammar to the replica."""
    front.check_auth(request.headers)
    front.check_ready()
    raw_body = await read_body(request) if raw_body is None else raw_body
    body = _parse(body_type, _json_object(raw_body))
    rejection.request_id = body.request_id or rejection.request_id
    front.check_model(body.model)
    assert front.preparer is not None
    prepared = front.preparer.prepare(body, request.headers, rejection.arrival)
    rejection.targets, rejection.priority = prepared.slo.targets, prepared.priority
    rejection.num_prompt_tokens = prepared.num_prompt_tokens
    if is_compiling_structured and prepared.params.structured is not None:  # off the loop
        await asyncio.to_thread(front.preparer.compile_structured, prepared)
    return prepared, _expected_tokens(body, prepared)


async def _read_json(request: Request) -> dict[str, Any]:
    return _json_object(await read_body(request))


async def read_body(request: Request) -> bytes:
    """The request's body, at most MAX_BODY_BYTES (413 beyond)."""
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise APIError(413, f"the body exceeds {MAX_BODY_BYTES} bytes", "request_too_large")
    return bytes(body)


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        raise bad_request("the body is not valid JSON", "invalid_json") from None
    if not isinstance(data, dict):
        raise bad_request("the body must be a JSON object", "invalid_json")
    return data


def _parse(body_type: type, data: dict[str, Any]) -> Any:
    try:
        return body_type.model_validate(data)
    except ValidationError as error:
        raise error_for_validation(error) from None
    except RecursionError:
        raise bad_request("the body is nested too deeply", "invalid_json") from None


def _expected_tokens(body: Any, prepared: Any) -> int:
    """Output tokens the deadline estimate assumes: what the client asked for, else 1
    (without max_tokens, the length is unknown; the request may stop at once)."""
    asked = getattr(body, "max_completion_tokens", None) or body.max_tokens
    return prepared.params.max_tokens if asked is not None else 1
