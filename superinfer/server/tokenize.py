"""vLLM's /tokenize, /detokenize and /version routes.

- `POST /tokenize` `{"prompt": ...}` or `{"messages": [...]}` (+ `add_special_tokens`,
  `add_generation_prompt`, `chat_template_kwargs`, `tools`, `return_token_strs`) ->
  `{"count", "max_model_len", "tokens", "token_strs"}`; messages are rendered through the
  chat template exactly as a chat completion renders them;
- `POST /detokenize` `{"tokens": [...]}` -> `{"prompt": ...}`;
- `GET /version` -> `{"version": superinfer.__version__}`.

Like the /v1 routes, the first two need the API key (when one is set), a ready server and
a served model name.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

import superinfer
from superinfer.server.chat_template import conversation_of, render_chat
from superinfer.server.errors import APIError, bad_request
from superinfer.server.front import Front
from superinfer.server.prepare import RequestPreparer, error_for_validation
from superinfer.server.protocol import DetokenizeRequest, TokenizeRequest

ReadBody = Callable[[Request], Awaitable[dict[str, Any]]]


def add_tokenizer_routes(app: FastAPI, front: Front, read_body: ReadBody) -> None:
    """Serve /tokenize, /detokenize and /version on `app`."""

    @app.post("/tokenize")
    async def tokenize_route(request: Request) -> JSONResponse:
        return await _answer(front, request, read_body, TokenizeRequest, tokenize)

    @app.post("/detokenize")
    async def detokenize_route(request: Request) -> JSONResponse:
        return await _answer(front, request, read_body, DetokenizeRequest, detokenize)

    @app.get("/version")
    async def version() -> JSONResponse:
        return JSONResponse({"version": superinfer.__version__})


async def _answer(
    front: Front, request: Request, read_body: ReadBody, body_type: type[BaseModel],
    handler: Callable[[RequestPreparer, Any], dict[str, Any]],
) -> JSONResponse:  # fmt: skip
    try:
        front.check_auth(request.headers)
        front.check_ready()
        try:
            body = body_type.model_validate(await read_body(request))
        except ValidationError as error:
            raise error_for_validation(error) from None
        front.check_model(body.model)  # type: ignore[attr-defined]
        assert front.preparer is not None
        return JSONResponse(handler(front.preparer, body))
    except APIError as error:
        front.log_refusal(error, request.headers.get("x-request-id"))
        return error.response()


def tokenize(preparer: RequestPreparer, body: TokenizeRequest) -> dict[str, Any]:
    """vLLM's tokenize response for a prompt or for chat messages."""
    if (body.prompt is None) == (body.messages is None):
        raise bad_request("give prompt or messages", "invalid_value", "prompt")
    tokenizer = preparer.tokenizer
    if body.messages is not None:
        tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
        text = render_chat(
            tokenizer, conversation_of(body.messages), body.add_generation_prompt, tools,
            preparer.tool_parser, body.chat_template_kwargs,
        )  # fmt: skip
        special = bool(body.add_special_tokens)
    else:
        assert body.prompt is not None
        text = body.prompt
        special = body.add_special_tokens is not False
    tokens = tokenizer.encode(text, add_special_tokens=special)
    strs = tokenizer.convert_ids_to_tokens(tokens) if body.return_token_strs else None
    return {"count": len(tokens), "max_model_len": preparer.max_model_len, "tokens": tokens,
            "token_strs": strs}  # fmt: skip


def detokenize(preparer: RequestPreparer, body: DetokenizeRequest) -> dict[str, Any]:
    """vLLM's detokenize response: the text of the token ids (special tokens kept)."""
    if any(not 0 <= t < preparer.vocab_size for t in body.tokens):
        raise bad_request(
            f"token ids must lie in [0, {preparer.vocab_size})", "invalid_value", "tokens"
        )
    return {"prompt": preparer.tokenizer.decode(body.tokens)}
