"""Run an admitted request and answer it: as server-sent events or as one JSON body.

A client that goes away aborts its request (its KV blocks are released in both tiers): a
stream when its response ends before the request did (`SSEResponse`), a non-stream request
through a watcher of the connection.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from superinfer.engine.async_engine import RequestStream
from superinfer.outputs import RequestOutput
from superinfer.server.errors import error_body
from superinfer.server.prepare import PreparedRequest
from superinfer.server.responses import DONE, ResponseShape, sse, stable_end, usage_of
from superinfer.server.state import Inflight, ServerState

logger = logging.getLogger(__name__)


class SSEResponse(StreamingResponse):
    """A stream of server-sent events that calls `on_close` however it ends (also when the
    client left before the first event, so the stream's generator never ran)."""

    def __init__(self, events: AsyncIterator[bytes], on_close: Callable[[], None]) -> None:
        super().__init__(
            events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )
        self.on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


def _shape(state: ServerState, prepared: PreparedRequest, is_chat: bool) -> ResponseShape:
    prefix = "chatcmpl-" if is_chat else "cmpl-"
    return ResponseShape(is_chat, prefix + prepared.request_id, state.model_name)


async def stream_response(
    state: ServerState, stream: RequestStream, inflight: Inflight, is_chat: bool
) -> AsyncIterator[bytes]:
    """The SSE events of one request (`SSEResponse` aborts it if the client leaves)."""
    prepared = inflight.prepared
    shape = _shape(state, prepared, is_chat)
    stop = prepared.params.stop
    num_sent = 0
    try:
        if is_chat:
            yield sse(_with_usage(shape.chunk("", is_first=True), prepared, None))
        async for output in stream:
            completion = output.outputs[0]
            if completion.finish_reason == "abort":
                break
            end = stable_end(completion.text, stop, output.finished)
            if end > num_sent:
                chunk = shape.chunk(completion.text[num_sent:end])
                yield sse(_with_usage(chunk, prepared, output))
                num_sent = end
        final = stream.final
        usage = usage_of(len(prepared.prompt_token_ids), _num_output(final))
        slo = inflight.report.to_dict() if inflight.report is not None else None
        completion = final.outputs[0] if final is not None else None
        last = shape.chunk(None if is_chat else "", completion and completion.finish_reason,
                           completion and completion.stop_reason)  # fmt: skip
        if prepared.include_usage:
            yield sse(_with_usage(last, prepared, final))
            yield sse({**shape.usage_chunk(usage), "slo": slo})
        else:
            yield sse({**last, "slo": slo})
        yield DONE
    except Exception as error:  # the engine failed this request
        if stream.error is None:
            raise
        yield sse(error_body(500, f"the engine failed: {error}", "engine_error"))
        yield DONE


def _with_usage(
    chunk: dict[str, Any], prepared: PreparedRequest, output: RequestOutput | None
) -> dict[str, Any]:
    if prepared.continuous_usage and output is not None:
        chunk["usage"] = usage_of(len(prepared.prompt_token_ids), _num_output(output))
    elif prepared.include_usage:
        chunk["usage"] = None
    return chunk


def _num_output(output: RequestOutput | None) -> int:
    """Output tokens so far (an engine output never holds a token still being sampled)."""
    if output is None:
        return 0
    return len(output.outputs[0].token_ids)


async def collect_response(
    state: ServerState,
    stream: RequestStream,
    inflight: Inflight,
    is_chat: bool,
    request: Request,
) -> JSONResponse:
    """The whole answer as one body; aborts the request if the client disconnects."""
    watcher = asyncio.create_task(_abort_on_disconnect(state, inflight, request))
    try:
        status, body = await collect_body(state, stream, inflight, is_chat)
    finally:
        watcher.cancel()
    return JSONResponse(body, status_code=status)


async def collect_body(
    state: ServerState, stream: RequestStream, inflight: Inflight, is_chat: bool
) -> tuple[int, dict[str, Any]]:
    """(status, body) of the whole answer; aborts the request if the caller is cancelled
    before it ended."""
    prepared = inflight.prepared
    final, text = None, ""
    try:
        async for output in stream:
            final = output
            if output.outputs[0].finish_reason != "abort":
                text = output.outputs[0].text  # an aborted output carries no text
    except Exception as error:
        if stream.error is None:
            raise
        return 500, error_body(500, f"the engine failed: {error}", "engine_error")
    finally:
        if stream.final is None and stream.error is None:
            state.abort(inflight, "client_disconnected")
    completion = final.outputs[0]
    usage = usage_of(len(prepared.prompt_token_ids), len(completion.token_ids))
    slo = inflight.report.to_dict() if inflight.report is not None else None
    shape = _shape(state, prepared, is_chat)
    return 200, shape.full(text, completion.finish_reason, completion.stop_reason, usage, slo)


async def _abort_on_disconnect(state: ServerState, inflight: Inflight, request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            state.abort(inflight, "client_disconnected")
            return
