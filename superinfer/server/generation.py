"""Run an admitted request and answer it: as server-sent events or as one JSON body.

A request asking for several sequences (`n`, `best_of`) runs as that many engine requests,
`{id}-0`, `{id}-1`, ... (`admit_choices`): each is admitted, scheduled, SLO-tracked and
logged like any other, and they share the prompt's KV blocks (`AsyncEngine.share_prompt`).
With `best_of` > `n`, the `n` sequences with the highest cumulative log-probability are
returned; usage counts the prompt once and the output tokens of every sequence, as OpenAI
does. A completions request with several prompts runs each as a request of its own,
`{id}-{p}` (its sequences `{id}-{p}-{j}`); choice `p * n + j` is prompt p's j-th, as vLLM
and OpenAI index them, and usage sums the prompts.

A client that goes away aborts its request (its KV blocks are released in both tiers): a
stream when its response ends before the request did (`SSEResponse`), a non-stream request
through a watcher of the connection.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from superinfer.engine.async_engine import RequestStream
from superinfer.outputs import CompletionOutput, RequestOutput
from superinfer.sampling_params import SamplingParams
from superinfer.server.arrival import Arrival
from superinfer.server.errors import APIError, error_body, estimate_headers
from superinfer.server.logprobs import (
    TokenTexts,
    chat_logprobs,
    completion_logprobs,
    prompt_logprobs_json,
)
from superinfer.server.prepare import PreparedRequest, Prompt
from superinfer.server.responses import DONE, ResponseShape, sse, stable_end, usage_of
from superinfer.server.state import Inflight, ServerState
from superinfer.server.tools import DeltaMessage, ToolCall
from superinfer.server.tools.streaming import TaggedCallStream
from superinfer.structured import StructuredOutput

if TYPE_CHECKING:
    from superinfer.server.engine_host import EngineHost

logger = logging.getLogger(__name__)


@dataclass
class Choice:
    """One sequence of a request: its output stream and its admitted engine request."""

    stream: RequestStream
    inflight: Inflight


def admit_choices(
    host: EngineHost, prepared: PreparedRequest, arrival: Arrival, expected_tokens: int
) -> list[Choice]:
    """Admit every sequence of every prompt `prepared` asks for, prompt-major (raises
    APIError; then none runs)."""
    choices: list[Choice] = []
    try:
        for group in prompt_groups(prepared):
            choices += _admit_sequences(host, group, arrival, expected_tokens)
    except APIError:
        for choice in choices:
            host.abort(choice.inflight, "sibling_rejected")
        raise
    return choices


def prompt_groups(prepared: PreparedRequest) -> list[PreparedRequest]:
    """One request per prompt: `prepared` itself when it has one."""
    if not prepared.more_prompts:
        return [prepared]
    prompts = [Prompt(prepared.prompt, prepared.prompt_token_ids, prepared.params.max_tokens or 1),
               *prepared.more_prompts]  # fmt: skip
    groups = []
    for index, prompt in enumerate(prompts):
        params = dataclasses.replace(
            prepared.params, max_tokens=prompt.max_tokens, structured=_fork(prepared.params)
        )
        groups.append(dataclasses.replace(
            prepared, request_id=f"{prepared.request_id}-{index}", prompt=prompt.text,
            prompt_token_ids=prompt.token_ids, params=params, more_prompts=[],
        ))  # fmt: skip
    return groups


def _admit_sequences(
    host: EngineHost, prepared: PreparedRequest, arrival: Arrival, expected_tokens: int
) -> list[Choice]:
    """Admit the sequences of one prompt (they share its KV blocks)."""
    if prepared.num_sequences == 1:
        return [Choice(*host.admit(prepared, arrival, expected_tokens))]
    children = [_child(prepared, i) for i in range(prepared.num_sequences)]
    assert host.engine is not None
    leader = children[0].request_id
    host.engine.share_prompt(leader, [c.request_id for c in children[1:]])
    choices: list[Choice] = []
    try:
        for child in children:
            choices.append(Choice(*host.admit(child, arrival, expected_tokens)))
    except APIError:
        for choice in choices:
            host.abort(choice.inflight, "sibling_rejected")
        if not choices:
            host.engine.release_prompt(leader)
        raise
    return choices


def _fork(params: SamplingParams) -> StructuredOutput | None:
    return params.structured.fork() if params.structured is not None else None


def _child(prepared: PreparedRequest, index: int) -> PreparedRequest:
    seed = prepared.params.seed
    params = dataclasses.replace(
        prepared.params, seed=None if seed is None else seed + index,
        structured=_fork(prepared.params),
    )  # fmt: skip
    return dataclasses.replace(
        prepared, request_id=f"{prepared.request_id}-{index}", params=params, n=1, best_of=1
    )


class SSEResponse(StreamingResponse):
    """A stream of server-sent events that calls `on_close` however it ends (also when the
    client left before the first event, so the stream's generator never ran)."""

    def __init__(
        self,
        events: AsyncIterator[bytes],
        on_close: Callable[[], None],
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(
            events, media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", **(headers or {})},
        )  # fmt: skip
        self.on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


def response_headers(choices: list[Choice]) -> dict[str, str]:
    """The estimated TTFT of an admitted request (its first sequence's, from admission)."""
    return estimate_headers(choices[0].inflight.estimated_ttft_ms)


def abort_all(state: ServerState, choices: list[Choice], reason: str) -> None:
    for choice in choices:
        state.abort(choice.inflight, reason)


# --- rendering ----------------------------------------------------------------------------
@dataclass
class _Progress:
    """What a stream has sent of one choice."""

    num_chars: int = 0
    num_tokens: int = 0  # tokens whose logprobs went out
    text_offset: int = 0  # completions' logprobs: characters of those tokens
    is_started: bool = False
    num_output_tokens: int = 0
    tools: TaggedCallStream | None = None  # the tool-call parse of its text so far


class _Render:
    """Texts and logprobs of one response's choices."""

    def __init__(self, state: ServerState, prepared: PreparedRequest, is_chat: bool) -> None:
        self.prepared = prepared
        self.is_chat = is_chat
        prefix = "chatcmpl-" if is_chat else "cmpl-"
        self.shape = ResponseShape(is_chat, prefix + prepared.request_id, state.model_name)
        preparer = state.front.preparer
        assert preparer is not None
        self.texts: TokenTexts = preparer.token_texts
        self.echo = prepared.echo and not is_chat

    def progress(self) -> _Progress:
        parser = self.prepared.tool_parser if self.is_chat else None
        return _Progress(tools=parser.stream() if parser is not None else None)

    def prompt_text(self, output: RequestOutput) -> str:
        """The prompt of `output`'s request, for echo (its text, else its decoded ids)."""
        if output.prompt is not None:
            return output.prompt
        return self.texts.tokenizer.decode(output.prompt_token_ids)

    def logprobs(
        self, output: RequestOutput, start: int, end: int, progress: _Progress | None = None,
        with_prompt: bool = False,
    ) -> dict[str, Any] | None:  # fmt: skip
        """The logprobs of output tokens start..end-1 (and, for echo, the prompt's)."""
        num_top = self.prepared.num_top_logprobs
        entries = (output.outputs[0].logprobs or [])[start:end]
        if num_top is None or not (entries or with_prompt):
            return None
        if self.is_chat:
            return chat_logprobs(entries, num_top, self.texts)
        prompt = list(output.prompt_logprobs or []) if with_prompt else []
        offset = progress.text_offset if progress is not None else 0
        result = completion_logprobs(
            prompt + list(entries), num_top, self.texts, offset, output.prompt_token_ids[:1]
        )
        if progress is not None and result["tokens"]:
            progress.text_offset = result["text_offset"][-1] + len(result["tokens"][-1])
        return result

    def full_choice(self, index: int, output: RequestOutput, text: str) -> dict[str, Any]:
        completion = output.outputs[0]
        num_tokens = len(completion.token_ids)
        if self.echo:
            text = self.prompt_text(output) + text
        logprobs = self.logprobs(output, 0, num_tokens, with_prompt=self.echo)
        finish_reason, calls = completion.finish_reason, None
        parser = self.prepared.tool_parser if self.is_chat else None
        if parser is not None:
            parsed = parser.parse(text)
            text, calls = parsed.content or "", [c.to_dict() for c in parsed.tool_calls]
            finish_reason = _finish_reason(finish_reason, parsed.tool_calls)
        choice = self.shape.choice(
            index, text, finish_reason, completion.stop_reason, logprobs, calls
        )
        if self.prepared.num_prompt_logprobs is not None and not self.is_chat:
            choice["prompt_logprobs"] = self._prompt_logprobs(output)
        return choice

    def _prompt_logprobs(self, output: RequestOutput) -> list[dict[str, Any] | None] | None:
        if output.prompt_logprobs is None:
            return None
        num_top = self.prepared.num_prompt_logprobs or 0
        entries = [
            e if e is None else dataclasses.replace(e, top=e.top[:num_top])
            for e in output.prompt_logprobs
        ]
        return prompt_logprobs_json(entries, self.texts)

    def extra(self, output: RequestOutput) -> dict[str, Any]:
        """Top-level fields: vLLM puts a chat's prompt_logprobs there."""
        if self.prepared.num_prompt_logprobs is None or not self.is_chat:
            return {}
        return {"prompt_logprobs": self._prompt_logprobs(output)}

    # --- stream chunks --------------------------------------------------------------------
    def text_chunk(
        self, index: int, progress: _Progress, output: RequestOutput, end: int
    ) -> dict[str, Any] | None:
        """The chunk of the text up to `end`; None when it has nothing to send (the tool
        parser holds all of it, and it is not the choice's first chunk)."""
        completion = output.outputs[0]
        delta: str | None = completion.text[progress.num_chars : end]
        is_first = not progress.is_started
        with_prompt = self.echo and is_first
        if with_prompt:
            delta = self.prompt_text(output) + delta
        num_tokens = len(completion.token_ids)
        logprobs = self.logprobs(output, progress.num_tokens, num_tokens, progress, with_prompt)
        progress.num_chars, progress.num_tokens, progress.is_started = end, num_tokens, True
        calls = None
        if progress.tools is not None:
            delta, calls = _tool_delta(progress.tools.feed(delta or ""), is_first)
            if delta is None and not calls and logprobs is None:
                return None
        return self.shape.chunk(
            delta, is_first=is_first, index=index, logprobs=logprobs, tool_calls=calls
        )

    def last_chunk(self, index: int, progress: _Progress, output: RequestOutput) -> dict[str, Any]:
        completion = output.outputs[0]
        num_tokens = len(completion.token_ids)
        logprobs = None
        if completion.finish_reason != "abort":
            logprobs = self.logprobs(output, progress.num_tokens, num_tokens, progress)
        delta, calls, finish_reason = None if self.is_chat else "", None, completion.finish_reason
        if progress.tools is not None:
            delta, calls = _tool_delta(progress.tools.finish(), False)
            finish_reason = _finish_reason(finish_reason, progress.tools.calls)
        chunk = self.shape.chunk(
            delta, finish_reason, completion.stop_reason, is_first=not progress.is_started,
            index=index, logprobs=logprobs, tool_calls=calls,
        )  # fmt: skip
        progress.is_started = True
        return chunk


def _tool_delta(
    delta: DeltaMessage, is_first: bool
) -> tuple[str | None, list[dict[str, Any]] | None]:
    """(content, tool_calls) of a chunk's delta: content only when there is some (a
    first chunk always has it, so the role goes out with the first token)."""
    calls = [piece.to_dict() for piece in delta.tool_calls] or None
    content = delta.content if delta.content or (is_first and not calls) else None
    return content, calls


def _finish_reason(reason: str | None, calls: list[ToolCall]) -> str | None:
    """OpenAI's "tool_calls" for an output that ended by itself after calling tools."""
    return "tool_calls" if calls and reason == "stop" else reason


async def _merged(choices: list[Choice]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(choice index, output) of all choices' streams, as they come."""
    if len(choices) == 1:
        async for output in choices[0].stream:
            yield 0, output
        return
    queue: asyncio.Queue[tuple[int, RequestOutput | None, Exception | None]] = asyncio.Queue()

    async def pump(index: int, stream: RequestStream) -> None:
        try:
            async for output in stream:
                queue.put_nowait((index, output, None))
        except Exception as error:  # noqa: BLE001 - the reader raises it
            queue.put_nowait((index, None, error))
        queue.put_nowait((index, None, None))

    tasks = [asyncio.create_task(pump(i, c.stream)) for i, c in enumerate(choices)]
    try:
        remaining = len(choices)
        while remaining:
            index, output, error = await queue.get()
            if error is not None:
                raise error
            if output is None:
                remaining -= 1
                continue
            yield index, output
    finally:
        for task in tasks:
            task.cancel()


def _engine_failed(choices: list[Choice]) -> bool:
    return any(c.stream.error is not None for c in choices)


# --- streams ------------------------------------------------------------------------------
async def stream_choices(
    state: ServerState, choices: list[Choice], prepared: PreparedRequest, is_chat: bool
) -> AsyncIterator[bytes]:
    """The SSE events of a request's choices, interleaved as their tokens come."""
    render = _Render(state, prepared, is_chat)
    progress = [render.progress() for _ in choices]
    stop = prepared.params.stop
    is_single = len(choices) == 1
    try:
        async for index, output in _merged(choices):
            done = progress[index]
            completion = output.outputs[0]
            if completion.finish_reason != "abort":
                done.num_output_tokens = len(completion.token_ids)
                end = stable_end(completion.text, stop, output.finished)
                if end > done.num_chars or (render.echo and not done.is_started):
                    chunk = render.text_chunk(index, done, output, end)
                    if chunk is not None:
                        usage = _usage(prepared, progress, output)
                        yield sse(_with_usage(chunk, prepared, usage))
            if not output.finished:
                continue
            last = render.last_chunk(index, done, output)
            report = choices[index].inflight.report
            slo = report.to_dict() if report is not None else None
            if prepared.include_usage:
                yield sse(_with_usage(last, prepared, _usage(prepared, progress, output)))
                if not is_single:
                    last["slo"] = slo
            else:
                yield sse({**last, "slo": slo})
        if prepared.include_usage:
            usage = usage_of(prepared.num_prompt_tokens, sum(p.num_output_tokens for p in progress))
            report = choices[0].inflight.report
            slo = report.to_dict() if report is not None and is_single else None
            yield sse({**render.shape.usage_chunk(usage), "slo": slo})
        yield DONE
    except Exception as error:  # the engine failed this request
        if not _engine_failed(choices):
            raise
        yield sse(error_body(500, f"the engine failed: {error}", "engine_error"))
        yield DONE


def _usage(
    prepared: PreparedRequest, progress: list[_Progress], output: RequestOutput
) -> dict[str, int] | None:
    if not prepared.continuous_usage:
        return None
    return usage_of(prepared.num_prompt_tokens, sum(p.num_output_tokens for p in progress))


def _with_usage(
    chunk: dict[str, Any], prepared: PreparedRequest, usage: dict[str, int] | None
) -> dict[str, Any]:
    if prepared.continuous_usage and usage is not None:
        chunk["usage"] = usage
    elif prepared.include_usage:
        chunk["usage"] = None
    return chunk


# --- whole bodies -------------------------------------------------------------------------
async def collect_response(
    state: ServerState,
    choices: list[Choice],
    prepared: PreparedRequest,
    is_chat: bool,
    request: Request,
) -> JSONResponse:
    """The whole answer as one body; aborts the request if the client disconnects."""
    watcher = asyncio.create_task(_abort_on_disconnect(state, choices, request))
    try:
        status, body = await collect_choices(state, choices, prepared, is_chat)
    finally:
        watcher.cancel()
    return JSONResponse(body, status_code=status, headers=response_headers(choices))


async def collect_choices(
    state: ServerState, choices: list[Choice], prepared: PreparedRequest, is_chat: bool
) -> tuple[int, dict[str, Any]]:
    """(status, body) of the whole answer; aborts the request if the caller is cancelled
    before it ended."""
    finals: dict[int, RequestOutput] = {}
    texts = [""] * len(choices)
    try:
        async for index, output in _merged(choices):
            if output.outputs[0].finish_reason != "abort":
                texts[index] = output.outputs[0].text  # an aborted output carries no text
            if output.finished:
                finals[index] = output
    except Exception as error:
        if not _engine_failed(choices):
            raise
        return 500, error_body(500, f"the engine failed: {error}", "engine_error")
    finally:
        for choice in choices:
            if choice.stream.final is None and choice.stream.error is None:
                state.abort(choice.inflight, "client_disconnected")
    render = _Render(state, prepared, is_chat)
    chosen = _chosen(finals, prepared.n, prepared.num_sequences)
    bodies = [render.full_choice(i, finals[k], texts[k]) for i, k in enumerate(chosen)]
    reports = [choices[k].inflight.report for k in chosen]
    slos = [r.to_dict() if r is not None else None for r in reports]
    if len(choices) > 1:
        for body, slo in zip(bodies, slos):
            body["slo"] = slo
    num_output = sum(len(f.outputs[0].token_ids) for f in finals.values())
    usage = usage_of(prepared.num_prompt_tokens, num_output)
    extra = render.extra(finals[chosen[0]])
    return 200, render.shape.full(bodies, usage, slos[0], **extra)


def _chosen(finals: dict[int, RequestOutput], n: int, per_prompt: int) -> list[int]:
    """The choices returned, prompt by prompt (each prompt's `per_prompt` sequences are
    consecutive)."""
    indices = sorted(finals)
    groups = [indices[i : i + per_prompt] for i in range(0, len(indices), per_prompt)]
    return [k for group in groups for k in _best({k: finals[k] for k in group}, n)]


def _best(finals: dict[int, RequestOutput], n: int) -> list[int]:
    """The choices returned: all of them, or (best_of) the n most likely sequences."""
    indices = sorted(finals)
    if len(indices) <= n:
        return indices

    def likelihood(index: int) -> float:
        completion: CompletionOutput = finals[index].outputs[0]
        return (
            completion.cumulative_logprob
            if completion.cumulative_logprob is not None
            else float("-inf")
        )

    return sorted(indices, key=likelihood, reverse=True)[:n]


async def _abort_on_disconnect(state: ServerState, choices: list[Choice], request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            abort_all(state, choices, "client_disconnected")
            return
